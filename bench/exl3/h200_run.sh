#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One H200 session for the EXL3 kernels: build, GPU tests, bench (args after the mode), optional ncu
# profiles and SASS. Run from the repository root with TESSERA_SHARED_DIR set; logs go to $OUT (or ./out).
# Usage: bench/exl3/h200_run.sh {test|bench|profile|all} [exl3_bench args...]
set -uo pipefail
mode=${1:-all}; shift || true
out=${OUT:-out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader | tee "$out/device.txt"
if [ ! -f build-gpu/build.ninja ]; then
  meson setup build-gpu --wrap-mode=nodownload -Dcuda=enabled -Dshared_dir="$TESSERA_SHARED_DIR" >"$out/setup.log" 2>&1 ||
    { tail -30 "$out/setup.log"; exit 1; }
fi
t0=$(date +%s)
meson compile -C build-gpu verify/exl3/verify_exl3_gpu bench/exl3/exl3_bench >"$out/build.log" 2>&1 ||
  { grep -E "error|Error" -A3 "$out/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
if [ "$mode" = test ] || [ "$mode" = all ]; then
  build-gpu/verify/exl3/verify_exl3_gpu 2>&1 | tee "$out/gpu-tests.log" | tail -25 || rc=1
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  build-gpu/bench/exl3/exl3_bench "$@" 2>&1 | tee "$out/exl3-bench.log" || rc=1
fi
if [ "$mode" = profile ]; then
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats"
  for spec in "head 4 1" "5120x2304 4 1" "5120x2304 2 1"; do
    set -- $spec
    "$ncu" --clock-control none -k regex:'exl3_(gemv|epilogue|input)' --launch-count 3 $sec \
      build-gpu/bench/exl3/exl3_bench --decode --shape "$1" --bits "$2" --batch "$3" --iters 1 >>"$out/ncu-decode.txt" 2>&1
  done
  "$ncu" --clock-control none -k regex:'exl3_gemm' --launch-count 1 $sec \
    build-gpu/bench/exl3/exl3_bench --prefill --shape wo_b --batch 2048 --iters 1 >"$out/ncu-gemm.txt" 2>&1
  obj=$(ls build-gpu/kernels/libtessera_kernels.a.p/*exl3_inst_k4_cb2.cu.o)
  cuobjdump -sass "$obj" >"$out/sass-k4-cb2.txt" 2>&1
  obj=$(ls build-gpu/kernels/libtessera_kernels.a.p/*exl3_inst_k2_cb2.cu.o)
  cuobjdump -sass "$obj" >"$out/sass-k2-cb2.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Block Limit|^  exl3|^  void|Theoretical Occ" "$out/ncu-decode.txt" "$out/ncu-gemm.txt" | cut -c1-150
fi
exit $rc

#!/bin/bash
# MoeExperts on the tensor cores (ops::MoeTcPath kSkinny / kGemm) on the H200: builds the MoE and linear_tc tests
# and tc_bench, runs verify_gpu_moe_tc (every path == the CPU op bit for bit, row invariance), verify_gpu_moe_engram
# and verify_gpu_moe_prune (the existing MoE suites; bf16/bf16 now runs kSkinny), verify_gpu_linear_tc (the linear
# kernels on the refactored main loops), then tc_bench --moe (MoeExperts µs and weight GB/s at tokens 1, 4, 16, 64
# on the Flash expert shape, per path) and tc_bench --decode --quick (the linear decode rows, for regressions).
# Last, while the run is under 7 minutes, compute-sanitizer memcheck and racecheck on the small-dims MoE case.
# Logs under $OUT. Usage (repository root): TESSERA_SHARED_DIR=$PWD/.gpu-shared OUT=/some/dir bash scripts/device/moe_tc.sh
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$PWD/.gpu-shared}
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
START=$(date +%s)
B=build-gpu
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader 2>&1 | head -1
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
SECONDS=0
T="verify/gpu_ops/verify_gpu_moe_tc verify/gpu_ops/verify_gpu_moe_engram verify/gpu_ops/verify_gpu_moe_prune"
T="$T verify/gpu_ops/verify_gpu_linear_tc bench/linear/tc_bench"
ninja -C $B $T > $OUT/build.log 2>&1 || { grep -B2 -A8 "error" $OUT/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
grep -i "spill" $OUT/build.log | grep -i -E "moe|linear_tc"

rc=0
for t in moe_tc moe_engram moe_prune linear_tc; do
  SECONDS=0
  r=0
  timeout 400 $B/verify/gpu_ops/verify_gpu_$t > $OUT/${t}_test.log 2>&1 || r=$?
  [ $r -ne 0 ] && rc=$r
  echo "verify_gpu_$t rc=$r ${SECONDS}s: $(grep -E 'No errors|failure|error' $OUT/${t}_test.log | tail -1)"
done
grep -E "^moe_tc |^moe_experts " $OUT/moe_tc_test.log $OUT/moe_engram_test.log | grep -v " 0/" | head -20
echo "moe_tc lines with 0 differing outputs: $(grep -c ': 0/' $OUT/moe_tc_test.log)"

SECONDS=0
timeout 300 $B/bench/linear/tc_bench --moe > $OUT/tc_bench_moe.log 2>&1
brc=$?
echo "tc_bench --moe rc=$brc ${SECONDS}s"
cat $OUT/tc_bench_moe.log
timeout 200 $B/bench/linear/tc_bench --decode --quick > $OUT/tc_bench_decode.log 2>&1
echo "tc_bench --decode --quick rc=$?"
cat $OUT/tc_bench_decode.log

CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  if [ -z "$CS" ] || [ $(( $(date +%s) - START )) -gt 420 ]; then echo "compute-sanitizer $tool: skipped"; continue; fi
  timeout 90 $CS --tool $tool --error-exitcode 9 $B/verify/gpu_ops/verify_gpu_moe_tc \
    --run_test=moe_tc_skewed_assignments_bitwise > $OUT/sanitizer_$tool.log 2>&1
  echo "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Hazard' $OUT/sanitizer_$tool.log | tail -1)"
done
echo "total $(( $(date +%s) - START ))s"
[ $rc -eq 0 ] && [ $brc -eq 0 ]

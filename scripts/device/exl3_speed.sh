#!/bin/bash
# EXL3 speed on the H200 (issue #4): the decode-once prefill path (W' decoded to fp16 scratch once, product on
# cuBLASLt) and the GEMV with its epilogue fused into one launch. Runs the EXL3 GPU suite (bitwise W', xh and
# epilogue; fused == unfused GEMV bit for bit, dense and MoE; the product within the spec §7.4 bounds on the
# golden fixtures and random layers; row invariance: a row alone == the same row inside m = 2048), then
# exl3_bench: the decode GEMV table (batch 1, 2, 4, 8; K 2, 3, 4) and the prefill table (M 512..8192), each
# beside cuBLAS bf16 in the same run. Markdown tables on stdout; logs in $OUT.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/exl3_speed.sh [test|bench|all]
cd "$(dirname "$0")/../.." || exit 1
mode=${1:-all}
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH
B=build-gpu; R=$OUT
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/exl3/verify_exl3_gpu bench/exl3/exl3_bench > $R/build.log 2>&1 \
  || { grep -B2 -A12 "error" $R/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
grep -o "spilled .* in function '[^']*'" $R/build.log | sort -u | head -5
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
rc=0
if [ "$mode" != bench ]; then
  t0=$SECONDS
  timeout 420 $B/verify/exl3/verify_exl3_gpu --log_level=test_suite > $R/exl3_gpu.log 2>&1; t=$?
  echo "verify_exl3_gpu rc=$t $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/exl3_gpu.log | tail -1)"
  grep -E "error: |Leaving test case" $R/exl3_gpu.log | cut -c1-400 | head -40
  [ $t = 0 ] || rc=1
fi
if [ "$mode" != test ]; then
  t0=$SECONDS
  timeout 300 $B/bench/exl3/exl3_bench --iters 10 > $R/bench.log 2>&1; t=$?
  echo "exl3_bench rc=$t $((SECONDS - t0))s"
  grep -E "^\||^###|^device|^Timing|^path|^unfused|row\(s\)" $R/bench.log
  [ $t = 0 ] || rc=1
fi
exit $rc

#!/bin/bash
# Block-scaled FP8 / FP4 weights on the tensor cores (kernels/linear/linear_tc_quant.cuh) and the skinny tile's
# K-slab variants, on the H200: verify_gpu_linear_scaled (fused tile == ref::dot_tc, ops::Linear<kCuda> == CPU),
# verify_gpu_moe_scaled (block-scaled routed experts == CPU op), verify_gpu_linear_tc, verify_gpu_linear, verify_gpu_moe_tc;
# tc_bench --quant (block-scaled vs bf16), --moe (with FP4 routed experts) and --slabs.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/scaled.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_ops/verify_gpu_linear_scaled verify/gpu_ops/verify_gpu_linear_tc verify/gpu_ops/verify_gpu_linear \
  verify/gpu_ops/verify_gpu_moe_scaled verify/gpu_ops/verify_gpu_moe_tc \
  bench/linear/tc_bench > $R/build.log 2>&1 || { grep -B2 -A12 "error" $R/build.log | head -80; exit 1; }
echo "build ${SECONDS}s"
for t in linear_scaled moe_scaled linear linear_tc moe_tc; do
  SECONDS=0
  timeout 240 $B/verify/gpu_ops/verify_gpu_$t --log_level=message > $R/$t.log 2>&1
  echo "verify_gpu_$t rc=$? ${SECONDS}s: $(grep -E 'No errors|failure' $R/$t.log | tail -1)"
  grep -E "error:|mismatches [1-9]|: [1-9][0-9]* of" $R/$t.log | head -8
done
grep -E "^Linear|outputs compared" $R/linear_scaled.log | tail -17
grep -E "^moe " $R/moe_scaled.log | tail -30
echo "moe_tc lines with 0 differing outputs: $(grep -c ": 0/" $R/moe_tc.log)"
timeout 200 $B/bench/linear/tc_bench --quant ${QUANT_ARGS:---quick} > $R/quant.log 2>&1; echo "tc_bench --quant rc=$?"; grep "^|" $R/quant.log
timeout 120 $B/bench/linear/tc_bench --moe --quick > $R/moe.log 2>&1; echo "tc_bench --moe rc=$?"; grep "^|" $R/moe.log
test -n "$SKIP_SLABS" || { timeout 150 $B/bench/linear/tc_bench --slabs --quick > $R/slabs.log 2>&1; echo "tc_bench --slabs rc=$?"; grep "^|" $R/slabs.log; }

#!/bin/bash
# The block-scaled suites on the H200 (fused FP8 and FP4 linears, routed experts, the one-hot K-position probe:
# bit for bit against the CPU), then tc_bench --quant (FP8 and FP4 beside bf16). First run (d941487, with the
# tile then behind TESSERA_TC_FP8_FUSED=1): every suite passed, and ops::tc_quant_format_fused took FP8.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/fp8_fused.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_ops/verify_gpu_linear_scaled verify/gpu_ops/verify_gpu_moe_scaled bench/linear/tc_bench > $R/build.log 2>&1 \
  || { grep -B2 -A12 "error" $R/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
for t in linear_scaled moe_scaled; do
  t0=$SECONDS
  timeout 150 $B/verify/gpu_ops/verify_gpu_$t --log_level=message > $R/$t.log 2>&1
  echo "$t rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/$t.log | tail -1)"
  grep -E "error:|  fp8 k" $R/$t.log | head -10
done
grep -E "outputs compared|^Linear fp8" $R/linear_scaled.log
timeout 120 $B/bench/linear/tc_bench --quant --quick > $R/quant.log 2>&1; echo "tc_bench --quant rc=$?"; grep "^|" $R/quant.log

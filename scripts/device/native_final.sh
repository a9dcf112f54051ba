#!/bin/bash
# One device call after the FP8 fused tile was switched off: the block-scaled suites (FP4 fused, FP8 refused and
# exact through the decode-to-bf16 path), the one-hot K-position probe with the FP8 tile forced on (diagnosis),
# the GPU model suites, then bench_model on 1- and 3-layer synthetic v41-flash fp8 checkpoints (FP4 routed
# experts as stored, FP8 projections held as bf16).
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/native_final.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_ops/verify_gpu_linear_scaled verify/gpu_ops/verify_gpu_moe_scaled verify/gpu_model/verify_gpu_model \
  tessera bench/model/bench_model > $R/build.log 2>&1 || { grep -B2 -A12 "error" $R/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
run_test() {
  local name=$1 bin=$2; shift 2; local t0=$SECONDS
  timeout 120 $bin --log_level=message "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/$name.log | tail -1)"
  grep -E "error:|mismatches [1-9]|: [1-9][0-9]* of|[1-9][0-9]*/[0-9]* outputs differ" $R/$name.log | head -6
}
run_test linear_scaled $B/verify/gpu_ops/verify_gpu_linear_scaled
grep -E "outputs compared|^Linear" $R/linear_scaled.log | tail -16
TESSERA_TC_FP8_FUSED=1 timeout 60 $B/verify/gpu_ops/verify_gpu_linear_scaled --run_test=linear_scaled/fused_tile_k_positions > $R/probe.log 2>&1
echo "fp8 probe rc=$?"; grep -E "  fp8 k|  fp4 k" $R/probe.log | head -70
run_test moe_scaled $B/verify/gpu_ops/verify_gpu_moe_scaled
echo "moe_scaled lines with 0 differing outputs: $(grep -c " 0/[0-9]* outputs differ" $R/moe_scaled.log)"
run_test gpu_model $B/verify/gpu_model/verify_gpu_model
for spec in "flash1e32 1 32" "flash3e32 3 32"; do
  set -- $spec
  test -f $S/$1/config.json || $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts $3 --format fp8 \
    > $R/make_$1.log 2>&1 || { tail -5 $R/make_$1.log; exit 1; }
done
echo "synthetic ${SECONDS}s"
timeout 120 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 \
  --prefill 1024 --batches 1,4,16,64 --context 128 --steps 8 > $R/bench_native.jsonl 2> $R/bench_native.err
echo "bench_model native rc=$? ${SECONDS}s"; cat $R/bench_native.jsonl; tail -2 $R/bench_native.err

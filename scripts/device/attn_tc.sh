#!/bin/bash
# bf16 attention on the tensor cores, the staged RMSNorm, FP8 projections kept as stored, and EXL3 checkpoints in
# the GPU model, on the H200: the attention suite (tensor-core kernel == CUDA-core kernel bit for bit; CPU within
# tolerance), the pointwise suite (RMSNorm bitwise), the GPU model suites (GPU == CPU model, batched == alone;
# EXL3), verify golden --device cuda (fp32, bf16), then bench_model on synthetic v41-flash fp8 checkpoints (FP8
# projections and FP4 experts as stored) and exl3:2.8 checkpoints.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/attn_tc.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; G=$TESSERA_SHARED_DIR/golden/v41-tiny; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_attn/verify_gpu_attn verify/gpu_ops/verify_gpu_pointwise verify/gpu_model/verify_gpu_model \
  tessera bench/model/bench_model > $R/build.log 2>&1 || { grep -B2 -A12 "error" $R/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
run_test() {
  local name=$1 limit=$2 bin=$3; shift 3; local t0=$SECONDS
  timeout $limit $bin --log_level=message "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/$name.log | tail -1)"
  grep -E "error:" $R/$name.log | head -8
}
run_test gpu_attn 150 $B/verify/gpu_attn/verify_gpu_attn
grep -E "tensor cores, heads" $R/gpu_attn.log
run_test pointwise 120 $B/verify/gpu_ops/verify_gpu_pointwise
run_test gpu_model 200 $B/verify/gpu_model/verify_gpu_model
grep -E "relative RMS" $R/gpu_model.log | head -8
for p in fp32 bf16; do
  timeout 120 $B/tessera verify golden --model $G/$p --golden $G/$p --device cuda > $R/golden_$p.log 2>&1
  echo "golden $p rc=$?: $(grep -E '^golden:' $R/golden_$p.log)"
done
for spec in "flash1e32 1 fp8" "flash3e32 3 fp8" "flash1x 1 exl3:2.8" "flash3x 3 exl3:2.8"; do
  set -- $spec
  test -f $S/$1/config.json || timeout 200 $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts 32 \
    --format $3 > $R/make_$1.log 2>&1 || { echo "make $1 failed"; tail -5 $R/make_$1.log; }
done
echo "synthetic ${SECONDS}s"
bench() {
  local name=$1; shift
  timeout 150 $B/bench/model/bench_model --device cuda --dtype bf16 --prefill 1024 --batches 1,4,16,64 --context 128 \
    --steps 8 "$@" > $R/bench_$name.jsonl 2> $R/bench_$name.err
  echo "bench_model $name rc=$? ${SECONDS}s"; cat $R/bench_$name.jsonl; tail -2 $R/bench_$name.err
}
bench native --model $S/flash1e32 --model $S/flash3e32

bench exl3 --model $S/flash1x --model $S/flash3x

#!/bin/bash
# The packed, paged decode state of the GPU model on the H200, plus the block-scaled suites.
#   test:  the QAT suite (packed rows byte-equal to the CPU, QatUnpack contiguous / gathered / paged), the GPU
#          model suite (GPU == CPU model, batched == alone, chunked == one-shot, clone / truncate; the wide model
#          in 512-byte pages), the block-scaled linear and MoE suites (ring, direct and auto paths), and
#          verify golden --device cuda in fp32 and bf16.
#   bench: bench_model on synthetic v41-flash fp8 checkpoints (1 and 3 layers, 32 experts): decode at batches
#          1, 4, 16, 64 (context 128) and prefill of 1K, 8K and 32K prompts; then decode at context 8192
#          (batches 1, 16), where the attention pool holds each row's selections only.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/state.sh test|bench
cd "$(dirname "$0")/../.." || exit 1
mode=${1:-test}
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
G=$TESSERA_SHARED_DIR/golden/v41-tiny
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_ops/verify_gpu_pointwise verify/gpu_model/verify_gpu_model verify/gpu_ops/verify_gpu_linear_scaled \
  verify/gpu_ops/verify_gpu_moe_scaled tessera bench/model/bench_model > $R/build_$mode.log 2>&1 \
  || { grep -B2 -A12 "error" $R/build_$mode.log | head -60; exit 1; }
echo "build ${SECONDS}s"
run_test() {
  local name=$1 limit=$2 bin=$3; shift 3; local t0=$SECONDS
  timeout $limit $bin --log_level=message "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/$name.log | tail -1)"
  grep -E "error:" $R/$name.log | head -8
}
if [ "$mode" = test ]; then
  run_test pointwise 120 $B/verify/gpu_ops/verify_gpu_pointwise
  run_test gpu_model 240 $B/verify/gpu_model/verify_gpu_model
  grep -E "mixed batch of|relative RMS" $R/gpu_model.log | head -8
  run_test linear_scaled 150 $B/verify/gpu_ops/verify_gpu_linear_scaled
  echo "direct problems: $(grep -c ' direct M ' $R/linear_scaled.log), with mismatches: $(grep ' direct M ' $R/linear_scaled.log | grep -vc 'mismatches 0$')"
  run_test moe_scaled 150 $B/verify/gpu_ops/verify_gpu_moe_scaled
  grep -E "ring path|path=auto" $R/moe_scaled.log | head -6
  for p in fp32 bf16; do
    timeout 120 $B/tessera verify golden --model $G/$p --golden $G/$p --device cuda > $R/golden_$p.log 2>&1
    echo "golden $p rc=$?: $(grep -E '^golden:' $R/golden_$p.log)"
  done
  exit 0
fi
for spec in "flash1e32 1" "flash3e32 3"; do
  set -- $spec
  test -f $S/$1/config.json || timeout 200 $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts 32 \
    --format fp8 > $R/make_$1.log 2>&1 || { echo "make $1 failed"; tail -5 $R/make_$1.log; }
done
echo "synthetic ${SECONDS}s"
timeout 280 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 \
  --prefill 1024,8192,32768 --batches 1,4,16,64 --context 128 --steps 8 > $R/bench_state.jsonl 2> $R/bench_state.err
echo "bench_model rc=$? ${SECONDS}s"; cat $R/bench_state.jsonl | grep -v '"bench":"\(decode\|prefill\)"'; tail -2 $R/bench_state.err
timeout 150 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 \
  --prefill "" --batches 1,16 --context 8192 --steps 8 > $R/bench_long.jsonl 2> $R/bench_long.err
echo "bench_model context 8192 rc=$? ${SECONDS}s"; grep -E '"decode_full"|"bench":"decode"' $R/bench_long.jsonl; tail -2 $R/bench_long.err

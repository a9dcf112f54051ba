#!/bin/bash
# Prefill on the H200 after the key-list scan and the expert decode fixes: the GPU model suite (with the key
# lists against a plain construction up to 2,600 rows), the block-scaled MoE and Linear suites, the router suite
# (scores 4 rows a warp: a row alone == in its batch), verify golden
# --device cuda (fp32, bf16), then bench_model on synthetic v41-flash fp8 checkpoints (1 and 3 layers, 32
# experts): prefill 1K, 8K, 32K and decode at batches 1, 4, 16, 64 (context 128).
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/prefill.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
G=$TESSERA_SHARED_DIR/golden/v41-tiny
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_model/verify_gpu_model verify/gpu_ops/verify_gpu_moe_scaled verify/gpu_ops/verify_gpu_linear_scaled \
  verify/gpu_ops/verify_gpu_moe_engram tessera bench/model/bench_model > $R/build_prefill.log 2>&1 || { grep -B2 -A12 "error" $R/build_prefill.log | head -60; exit 1; }
echo "build ${SECONDS}s"
run_test() {
  local name=$1 limit=$2 bin=$3; shift 3; local t0=$SECONDS
  timeout $limit $bin --log_level=message "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/$name.log | tail -1)"
  grep -E "error:" $R/$name.log | head -8
}
run_test gpu_model 240 $B/verify/gpu_model/verify_gpu_model
run_test moe_scaled 200 $B/verify/gpu_ops/verify_gpu_moe_scaled
grep -E "differ from the CPU" $R/moe_scaled.log | grep -vc " 0/" | sed 's/^/moe_scaled lines with differences: /'
run_test linear_scaled 150 $B/verify/gpu_ops/verify_gpu_linear_scaled
run_test moe_engram 150 $B/verify/gpu_ops/verify_gpu_moe_engram
for p in fp32 bf16; do
  timeout 120 $B/tessera verify golden --model $G/$p --golden $G/$p --device cuda > $R/golden_$p.log 2>&1
  echo "golden $p rc=$?: $(grep -E '^golden:' $R/golden_$p.log)"
done
for spec in "flash1e32 1" "flash3e32 3"; do
  set -- $spec
  test -f $S/$1/config.json || timeout 200 $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts 32 \
    --format fp8 > $R/make_$1.log 2>&1 || { echo "make $1 failed"; tail -5 $R/make_$1.log; }
done
echo "synthetic ${SECONDS}s"
timeout 200 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 \
  --prefill 1024,8192,32768 --batches 1,4,16,64 --context 128 --steps 8 > $R/bench_prefill.jsonl 2> $R/bench_prefill.err
echo "bench_model rc=$? ${SECONDS}s"; grep -E '"decode_full"|"prefill_full"|"bench":"prefill"' $R/bench_prefill.jsonl; tail -2 $R/bench_prefill.err

#!/bin/bash
# Block-scaled codes loaded into registers (ops::TcQuantPath::kDirect) on the H200: the block-scaled suites (both
# paths against ref::dot_tc / the CPU op), the GPU model suite, tc_bench --quant with the direct and the ring path
# and --moe (FP4 routed experts), then bench_model on the synthetic v41-flash fp8 checkpoints.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/direct.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_ops/verify_gpu_linear_scaled verify/gpu_ops/verify_gpu_moe_scaled verify/gpu_model/verify_gpu_model \
  bench/linear/tc_bench tessera bench/model/bench_model > $R/build_direct.log 2>&1 || { grep -B2 -A12 "error" $R/build_direct.log | head -60; exit 1; }
echo "build ${SECONDS}s"
run_test() {
  local name=$1 limit=$2 bin=$3; shift 3; local t0=$SECONDS
  timeout $limit $bin --log_level=message "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/$name.log | tail -1)"
  grep -E "error:" $R/$name.log | head -8
}
run_test linear_scaled 150 $B/verify/gpu_ops/verify_gpu_linear_scaled
echo "direct problems: $(grep -c ' direct M ' $R/linear_scaled.log), with mismatches: $(grep ' direct M ' $R/linear_scaled.log | grep -vc 'mismatches 0$')"
grep -E "outputs compared|^Linear" $R/linear_scaled.log | head -4
run_test moe_scaled 150 $B/verify/gpu_ops/verify_gpu_moe_scaled
grep -E "ring path|path=auto" $R/moe_scaled.log | head -12
run_test gpu_model 200 $B/verify/gpu_model/verify_gpu_model
for qp in auto ring; do
  timeout 100 $B/bench/linear/tc_bench --quant --quick --quant-path $qp > $R/quant_$qp.log 2>&1; echo "tc_bench --quant --quant-path $qp rc=$?"
  grep "^|" $R/quant_$qp.log
done
timeout 100 $B/bench/linear/tc_bench --moe --quick > $R/moe.log 2>&1; echo "tc_bench --moe rc=$?"; grep "^|" $R/moe.log | tail -12
for spec in "flash1e32 1" "flash3e32 3"; do
  set -- $spec
  test -f $S/$1/config.json || timeout 200 $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts 32 \
    --format fp8 > $R/make_$1.log 2>&1 || { echo "make $1 failed"; tail -5 $R/make_$1.log; }
done
timeout 150 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 --prefill 1024 \
  --batches 1,4,16,64 --context 128 --steps 8 > $R/bench_direct.jsonl 2> $R/bench_direct.err
echo "bench_model rc=$? ${SECONDS}s"; grep -E '"decode_full"|"prefill_full"|"load"' $R/bench_direct.jsonl; tail -2 $R/bench_direct.err

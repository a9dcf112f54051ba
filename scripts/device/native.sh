#!/bin/bash
# Native FP8 / FP4 weights on the H200, in two calls that each fit a 10-minute device slot:
#   PHASE=a  build; verify_gpu_linear_scaled, verify_gpu_moe_scaled, verify_gpu_model gpu_model_scaled (stored ==
#            dequantised == CPU model); bench_model on 1- and 3-layer synthetic v41-flash fp8 checkpoints with the
#            weights as stored and dequantised (--dequantize-weights); tc_bench --quant and --moe
#   PHASE=b  regressions of the bf16 paths (verify_gpu_linear, linear_tc, moe_tc, model, golden --device cuda) and
#            tc_bench --slabs
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir PHASE=a bash scripts/device/native.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
run_test() {  # name, binary, extra args
  local name=$1 bin=$2; shift 2; SECONDS=0
  timeout ${TT:-200} $bin --log_level=message "$@" > $R/$name.log 2>&1
  echo "$name rc=$? ${SECONDS}s: $(grep -E 'No errors|failure' $R/$name.log | tail -1)"
  grep -E "error:|mismatches [1-9]|: [1-9][0-9]* of|[1-9][0-9]*/[0-9]* outputs differ" $R/$name.log | head -8
}
SECONDS=0
if [ "${PHASE:-a}" = a ]; then
ninja -C $B verify/gpu_ops/verify_gpu_linear_scaled verify/gpu_ops/verify_gpu_moe_scaled verify/gpu_model/verify_gpu_model \
  verify/gpu_ops/verify_gpu_moe_tc tessera bench/model/bench_model bench/linear/tc_bench > $R/build.log 2>&1 \
  || { grep -B2 -A12 "error" $R/build.log | head -80; exit 1; }
echo "build ${SECONDS}s"
run_test linear_scaled $B/verify/gpu_ops/verify_gpu_linear_scaled
grep -E "outputs compared|^Linear" $R/linear_scaled.log | tail -16
run_test moe_scaled $B/verify/gpu_ops/verify_gpu_moe_scaled
echo "moe_scaled lines with 0 differing outputs: $(grep -c " 0/[0-9]* outputs differ" $R/moe_scaled.log)"
run_test gpu_model $B/verify/gpu_model/verify_gpu_model
run_test moe_tc $B/verify/gpu_ops/verify_gpu_moe_tc
echo "moe_tc lines with 0 differing outputs: $(grep -c ': 0/' $R/moe_tc.log)"
G=$TESSERA_SHARED_DIR/golden/v41-tiny
for v in fp32 bf16; do
  timeout 90 $B/tessera verify golden --model $G/$v --golden $G/$v --device cuda > $R/golden_$v.log 2>&1
  echo "verify golden $v --device cuda rc=$?: $(grep -E '^golden:' $R/golden_$v.log)"
done
for spec in "flash1e32 1 32" "flash3e32 3 32"; do
  set -- $spec
  test -f $S/$1/config.json || $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts $3 --format fp8 \
    > $R/make_$1.log 2>&1 || { tail -5 $R/make_$1.log; exit 1; }
done
echo "synthetic ${SECONDS}s"
for mode in ${MODES:-native dequant}; do
  extra=""; test $mode = dequant && extra=--dequantize-weights
  timeout 150 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 $extra \
    --prefill ${PREFILL:-1024} --batches ${BATCHES:-1,4,16,64} --context 128 --steps 8 > $R/bench_$mode.jsonl 2> $R/bench_$mode.err
  echo "bench_model $mode rc=$? ${SECONDS}s"; cat $R/bench_$mode.jsonl; tail -2 $R/bench_$mode.err
done
timeout 100 $B/bench/linear/tc_bench --quant --quick > $R/quant.log 2>&1; echo "tc_bench --quant rc=$?"; grep "^|" $R/quant.log
timeout 60 $B/bench/linear/tc_bench --moe --quick > $R/moe.log 2>&1; echo "tc_bench --moe rc=$?"; grep "^|" $R/moe.log
else
ninja -C $B verify/gpu_ops/verify_gpu_linear verify/gpu_ops/verify_gpu_linear_tc verify/gpu_ops/verify_gpu_moe_tc \
  verify/gpu_model/verify_gpu_model tessera bench/linear/tc_bench > $R/build.log 2>&1 || { grep -B2 -A12 "error" $R/build.log | head -80; exit 1; }
echo "build ${SECONDS}s"
run_test moe_tc $B/verify/gpu_ops/verify_gpu_moe_tc
echo "moe_tc lines with 0 differing outputs: $(grep -c ': 0/' $R/moe_tc.log)"
run_test linear $B/verify/gpu_ops/verify_gpu_linear
run_test gpu_model $B/verify/gpu_model/verify_gpu_model
G=$TESSERA_SHARED_DIR/golden/v41-tiny
for v in fp32 bf16; do
  timeout 90 $B/tessera verify golden --model $G/$v --golden $G/$v --device cuda > $R/golden_$v.log 2>&1
  echo "verify golden $v --device cuda rc=$?: $(grep -E '^golden:' $R/golden_$v.log)"
done
run_test linear_tc $B/verify/gpu_ops/verify_gpu_linear_tc
timeout 100 $B/bench/linear/tc_bench --slabs --quick > $R/slabs.log 2>&1; echo "tc_bench --slabs rc=$?"; grep "^|" $R/slabs.log
fi

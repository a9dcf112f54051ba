#!/bin/bash
# Issue 5's table at one tree, in one call: the gates first (the GPU op and model suites, verify golden
# --device cuda fp32 / bf16, verify invariance, generate --device cuda on the golden and synthetic checkpoints),
# then bench_model decode at batch 1 / 4 / 16 / 64 (context 128) and prefill at 1K / 8K / 32K on synthetic v41-flash
# checkpoints of each format in FORMATS (1 and 3 layers, EXPERTS routed experts: the 40-layer fit), and the PyTorch
# eager layer (bench/model/torch_layer.py) in the same run. Results: $OUT/issue5_table/ (logs, jsonl) and stdout.
# Usage (repository root on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared [PREBUILT=pack.tar.xz] bash scripts/device/issue5_table.sh
# PREBUILT: binaries from scripts/device/pack_prebuilt.sh (SUITES="linear_scaled moe_scaled linear_tc moe_tc"
# EXTRA="verify/exl3/verify_exl3_gpu"); without it the tree is built here (-Dgpu_arch=90a).
# Knobs: FORMATS (default "fp8 exl3:2.8"), EXPERTS (routed experts, default 32; 384 is the release's: by the shapes
# ~10 GB for the 1-layer and ~24 GB for the 3-layer fp8 checkpoint, ~7.6 / ~17 GB in exl3:2.8, so CLEAN=1 removes
# a format's pair after its bench and the next is made then), GATES=0 skips the gates, TORCH=0 the PyTorch layer,
# BENCH_TIMEOUT (s, default 200). The first format's pair is made while the gates run.
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
B=build-gpu; S=${SYN_DIR:-/tmp/syn}; R=${OUT:-/tmp}/issue5_table; mkdir -p $B $S $R
FORMATS=${FORMATS:-fp8 exl3:2.8}
if [ -n "${PREBUILT:-}" ]; then tar xJf "$PREBUILT" -C $B
else
  test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled -Dgpu_arch=90a \
    > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
  ninja -C $B > $R/build.log 2>&1 || { grep -B2 -A8 "error" $R/build.log | head -60; exit 1; }
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
st() { sed 's/\x1b\[[0-9;]*m//g' $1 | grep -E 'No errors|failure|passed|failed' | tail -1; }
tag() { echo "${1%%:*}"; }  # fp8 → fp8, exl3:2.8 → exl3
make_pair() {  # format: $S/<tag>1 and $S/<tag>3
  local t; t=$(tag $1)
  for L in 1 3; do
    [ -f $S/$t$L/config.json ] || timeout 600 $B/tessera make-synthetic --out $S/$t$L --preset v41-flash --layers $L \
      --experts ${EXPERTS:-32} --format $1 > $R/make_$t$L.log 2>&1 || tail -3 $R/make_$t$L.log
  done
  echo "[make] $1: $(du -sh $S/${t}1 $S/${t}3 2>/dev/null | awk '{print $1}' | paste -sd/) t=$SECONDS"
}
set -- $FORMATS; make_pair $1 & MAKER=$!
if [ "${GATES:-1}" != 0 ]; then
( timeout 400 $B/verify/gpu_ops/verify_gpu_linear_scaled --log_level=message > $R/linear_scaled.log 2>&1
  echo "[bg] verify_gpu_linear_scaled rc=$? t=$SECONDS: $(st $R/linear_scaled.log)" ) & LS=$!
G=$TESSERA_SHARED_DIR/golden/v41-tiny
timeout 150 $B/verify/gpu_model/verify_gpu_model --log_level=message > $R/gpu_model.log 2>&1
echo "verify_gpu_model rc=$? t=$SECONDS: $(st $R/gpu_model.log)"
for v in fp32 bf16; do
  timeout 90 $B/tessera verify golden --model $G/$v --golden $G/$v --device cuda > $R/golden_$v.log 2>&1
  echo "verify golden --device cuda $v rc=$?: $(grep -E '^golden:' $R/golden_$v.log) t=$SECONDS"
done
timeout 120 $B/tessera verify invariance --model $G/bf16 --numerics bf16 --device cuda --decode-tokens 8 \
  --prompt-lengths 5,37,130 > $R/invariance.log 2>&1
echo "verify invariance bf16 rc=$? t=$SECONDS: $(grep -E 'passed,' $R/invariance.log | tail -1)"
timeout 60 $B/tessera generate --model $G/fp32 --device cuda --prompt-ids 1,2,3,4,5 --max-new-tokens 8 --ignore-eos \
  > $R/generate_golden.log 2>&1
echo "generate --device cuda golden fp32 rc=$?: $(tail -1 $R/generate_golden.log | cut -c1-120)"
for s in verify/exl3/verify_exl3_gpu verify/gpu_ops/verify_gpu_linear_tc verify/gpu_ops/verify_gpu_moe_tc \
         verify/gpu_ops/verify_gpu_moe_scaled; do
  [ -x $B/$s ] || continue
  timeout 200 $B/$s --log_level=message > $R/$(basename $s).log 2>&1
  echo "$(basename $s) rc=$? t=$SECONDS: $(st $R/$(basename $s).log)"
done
wait $LS
fi
wait $MAKER
first=1
for f in $FORMATS; do
  t=$(tag $f)
  [ $first = 1 ] || make_pair $f; first=0
  if [ "${GATES:-1}" != 0 ]; then
    timeout 60 $B/tessera generate --model $S/${t}1 --device cuda --prompt-ids 1,2,3,4,5 --max-new-tokens 8 \
      --ignore-eos > $R/generate_$t.log 2>&1
    echo "generate --device cuda ${t}1 rc=$?: $(tail -1 $R/generate_$t.log | cut -c1-120)"
  fi
  timeout ${BENCH_TIMEOUT:-200} $B/bench/model/bench_model --device cuda --dtype bf16 --model $S/${t}1 --model $S/${t}3 \
    --prefill 1024,8192,32768 --batches 1,4,16,64 --context 128 --steps 8 > $R/bench_$t.jsonl 2> $R/bench_$t.err
  echo "[$f] rc=$? t=$SECONDS"; grep -E '"(decode|prefill)_full"' $R/bench_$t.jsonl; tail -2 $R/bench_$t.err
  [ "${CLEAN:-0}" = 0 ] || rm -rf $S/${t}1 $S/${t}3
done
if [ "${TORCH:-1}" != 0 ]; then
  timeout 150 python3 bench/model/torch_layer.py --batches 1,4,16,64 --prefill 1024,8192,32768 --steps 8 \
    > $R/torch.jsonl 2> $R/torch.err
  echo "[torch] rc=$? t=$SECONDS"; cat $R/torch.jsonl; tail -2 $R/torch.err
fi

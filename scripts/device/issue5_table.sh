#!/bin/bash
# Issue 5's table at one tree, in one call: the gates first (the GPU op and model suites, verify golden
# --device cuda fp32 / bf16, verify invariance, generate --device cuda on the golden and synthetic checkpoints),
# then bench_model decode at batch 1 / 4 / 16 / 64 (context 128) and prefill at 1K / 8K / 32K on synthetic v41-flash
# fp8 and exl3:2.8 checkpoints (1 and 3 layers, EXPERTS routed experts: the 40-layer fit), and the PyTorch eager layer
# (bench/model/torch_layer.py) in the same run. Results: $OUT/issue5_table/ (logs, jsonl) and stdout.
# Usage (repository root on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared [PREBUILT=pack.tar.xz] bash scripts/device/issue5_table.sh
# PREBUILT: binaries from scripts/device/pack_prebuilt.sh (SUITES="linear_scaled moe_scaled linear_tc moe_tc"
# EXTRA="verify/exl3/verify_exl3_gpu"); without it the tree is built here (-Dgpu_arch=90a).
# EXPERTS: routed experts of the synthetic checkpoints (default 32; 384 is the release's: by the shapes ~10 GB a
# layer in fp8 and ~5 GB in exl3:2.8, ~60 GB for the four checkpoints, so SYN_DIR needs that much free disk).
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
B=build-gpu; S=${SYN_DIR:-/tmp/syn}; R=${OUT:-/tmp}/issue5_table; mkdir -p $B $S $R
if [ -n "${PREBUILT:-}" ]; then tar xJf "$PREBUILT" -C $B
else
  test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled -Dgpu_arch=90a \
    > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
  ninja -C $B > $R/build.log 2>&1 || { grep -B2 -A8 "error" $R/build.log | head -60; exit 1; }
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
st() { sed 's/\x1b\[[0-9;]*m//g' $1 | grep -E 'No errors|failure|passed|failed' | tail -1; }
( timeout 400 $B/verify/gpu_ops/verify_gpu_linear_scaled --log_level=message > $R/linear_scaled.log 2>&1
  echo "[bg] verify_gpu_linear_scaled rc=$? t=$SECONDS: $(st $R/linear_scaled.log)" ) &
( for spec in "f1 1 fp8" "f3 3 fp8" "e1 1 exl3:2.8" "e3 3 exl3:2.8"; do set -- $spec
    [ -f $S/$1/config.json ] || timeout 600 $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 \
      --experts ${EXPERTS:-32} --format $3 > $R/make_$1.log 2>&1 || tail -3 $R/make_$1.log
  done; echo "[bg] synthetic checkpoints t=$SECONDS" ) &
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
for s in verify/exl3/verify_exl3_gpu verify/gpu_ops/verify_gpu_linear_tc verify/gpu_ops/verify_gpu_moe_tc \
         verify/gpu_ops/verify_gpu_moe_scaled; do
  [ -x $B/$s ] || continue
  timeout 200 $B/$s --log_level=message > $R/$(basename $s).log 2>&1
  echo "$(basename $s) rc=$? t=$SECONDS: $(st $R/$(basename $s).log)"
done
wait
for m in $G/fp32 $S/f1 $S/e1; do
  timeout 60 $B/tessera generate --model $m --device cuda --prompt-ids 1,2,3,4,5 --max-new-tokens 8 --ignore-eos \
    > $R/generate.log 2>&1
  echo "generate --device cuda $(basename $m) rc=$?: $(tail -1 $R/generate.log | cut -c1-120)"
done
for m in "fp8 f1 f3" "exl3 e1 e3"; do set -- $m
  timeout 200 $B/bench/model/bench_model --device cuda --dtype bf16 --model $S/$2 --model $S/$3 \
    --prefill 1024,8192,32768 --batches 1,4,16,64 --context 128 --steps 8 > $R/bench_$1.jsonl 2> $R/bench_$1.err
  echo "[$1] rc=$? t=$SECONDS"; grep -E '"(decode|prefill)_full"' $R/bench_$1.jsonl; tail -2 $R/bench_$1.err
done
timeout 150 python3 bench/model/torch_layer.py --batches 1,4,16,64 --prefill 1024,8192,32768 --steps 8 \
  > $R/torch.jsonl 2> $R/torch.err
echo "[torch] rc=$? t=$SECONDS"; cat $R/torch.jsonl; tail -2 $R/torch.err

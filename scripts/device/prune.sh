#!/bin/bash
# Routed-expert pruning on the H200 (docs/pruning.md): the CUDA pruned router against the reference, the GPU
# model's pruning against the CPU model's (bitwise), generate / serve of pruned models on --device cuda, then
# bench_prune: decode tok/s on a synthetic v41-flash checkpoint, unpruned vs per-token top_p vs static
# pruning (tessera calibrate + prune), next to the tiny model's retention for the same settings.
#
# Usage: TESSERA_SHARED_DIR=$PWD/.gpu-shared bash scripts/device/prune.sh [all|tests|make|bench]
#   tests  build, GPU op and model tests, the CLI round trips on --device cuda
#   make   the synthetic checkpoint, calibration stats, the pruned checkpoints (in $SCRATCH, kept for bench)
#   bench  bench_prune --device cuda (results: $OUT/prune_bench.txt, .json)
# Knobs: LAYERS (2), EXPERTS (128), VOCAB (16384), DTYPE (bf16), STEPS (32), REPEATS (3), SCRATCH.
# Host memory: the fp8 checkpoint is dequantised on load, fp32 on the host (about 4 bytes a parameter:
# 2 layers x 128 experts ~ 38 GB, peak RSS printed), then bf16 on the device (~19 GB).
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
OUT=${OUT:-/tmp}
PHASE=${1:-all}
B=build-gpu
LAYERS=${LAYERS:-2} EXPERTS=${EXPERTS:-128} VOCAB=${VOCAB:-16384} DTYPE=${DTYPE:-bf16}
STEPS=${STEPS:-32} REPEATS=${REPEATS:-3}
S=${SCRATCH:-/tmp/tessera-prune}
phase() { [ "$PHASE" = all ] || [ "$PHASE" = "$1" ]; }

test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
SECONDS=0
ninja -C $B tessera bench/prune/bench_prune verify/gpu_ops/verify_gpu_moe_prune verify/gpu_ops/verify_gpu_moe_engram \
  verify/gpu_model/verify_gpu_model > $OUT/build.log 2>&1 || { grep -B2 -A8 "error" $OUT/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"

if phase tests; then
  for t in gpu_ops/verify_gpu_moe_prune gpu_ops/verify_gpu_moe_engram gpu_model/verify_gpu_model; do
    log=$OUT/$(basename $t).log
    SECONDS=0
    timeout 300 $B/verify/$t --log_level=message > "$log" 2>&1
    echo "$t rc=$? ${SECONDS}s: $(grep -E 'No errors|failure' "$log" | tail -1)"
    grep -E "error|GPU vs CPU" "$log" | head -8
  done
  # calibrate / prune / inspect / retention (CPU), generate and serve of the pruned models on the GPU model.
  SECONDS=0
  TESSERA_PRUNE_DEVICE=cuda timeout 300 python3 verify/prune/cli_prune_test.py $B/tessera $TESSERA_SHARED_DIR/golden \
    > $OUT/cli_prune_cuda.log 2>&1
  echo "cli_prune (serve/generate --device cuda) rc=$? ${SECONDS}s: $(tail -1 $OUT/cli_prune_cuda.log)"
  grep FAIL $OUT/cli_prune_cuda.log | head
fi

if phase make; then
  mkdir -p $S
  SECONDS=0
  if [ ! -f $S/base/config.json ]; then
    $B/tessera make-synthetic --out $S/base --preset v41-flash --layers $LAYERS --experts $EXPERTS \
      --vocab-size $VOCAB --format fp8 > $OUT/make_synthetic.log 2>&1 || { tail -5 $OUT/make_synthetic.log; exit 1; }
  fi
  echo "make-synthetic (v41-flash, $LAYERS layers, $EXPERTS experts, vocab $VOCAB, fp8) ${SECONDS}s: $(du -sh $S/base | cut -f1)"
  # Calibration prompts: 8 x 32 random ids (the weights are random, so any ids exercise the router alike).
  python3 -c "
import random; random.seed(11)
print('\n'.join(str([random.randrange($VOCAB) for _ in range(32)]) for _ in range(8)))" > $S/prompts.jsonl
  SECONDS=0
  TIME=; [ -x /usr/bin/time ] && TIME="/usr/bin/time -v"
  $TIME $B/tessera calibrate --model $S/base --prompts $S/prompts.jsonl --out $OUT/prune_stats.json \
    > $OUT/calibrate.log 2>&1 || { tail -20 $OUT/calibrate.log; exit 1; }
  echo "calibrate (CPU model) ${SECONDS}s, $(grep -E 'Maximum resident' $OUT/calibrate.log | sed 's/^\s*//')"
  for k in 0.75 0.5; do
    SECONDS=0
    rm -rf $S/keep$k
    $B/tessera prune --model $S/base --stats $OUT/prune_stats.json --keep $k --out $S/keep$k || exit 1
    echo "prune --keep $k ${SECONDS}s: $(du -sh $S/keep$k | cut -f1)"
  done
fi

if phase bench; then
  SECONDS=0
  $B/bench/prune/bench_prune --device cuda --model $S/base --dtype $DTYPE --static 0.75=$S/keep0.75 \
    --static 0.5=$S/keep0.5 --steps $STEPS --repeats $REPEATS --json $OUT/prune_bench.json 2>&1 | tee $OUT/prune_bench.txt
  echo "bench_prune rc=${PIPESTATUS[0]} ${SECONDS}s"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
fi

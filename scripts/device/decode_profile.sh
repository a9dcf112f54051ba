#!/bin/bash
# Where a batch-1 decode step's time goes (1 layer + the 129,280-row head), for a v41-flash fp8 checkpoint (FP8
# projections + FP4 experts as stored) and an exl3:2.8 one: ncu kernel durations of 5 steps minus 1 step, over 4,
# per kernel, beside bench_model's step time (the difference is launch gaps and host work).
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/decode_profile.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B tessera bench/model/bench_model > $R/build_profile.log 2>&1 || { grep -B2 -A12 "error" $R/build_profile.log | head -40; exit 1; }
echo "build ${SECONDS}s"
for spec in "flash1e32 fp8" "flash1x exl3:2.8"; do
  set -- $spec
  test -f $S/$1/config.json || timeout 200 $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers 1 --experts 32 \
    --format $2 > $R/make_$1.log 2>&1 || { echo "make $1 failed"; tail -5 $R/make_$1.log; }
  timeout 60 $B/bench/model/bench_model --model $S/$1 --device cuda --dtype bf16 --prefill 16 --batches 1 --context 128 \
    --steps 8 2>/dev/null | grep '"decode"'
  for st in 1 5; do
    timeout 150 ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv $B/bench/model/bench_model \
      --model $S/$1 --device cuda --dtype bf16 --prefill 16 --batches 1 --context 128 --steps $st > $R/ncu_$1_$st.csv 2> $R/ncu_$1_$st.err
  done
  python3 scripts/device/ncu_diff.py "$R/ncu_$1_1.csv" "$R/ncu_$1_5.csv" --per 4 --top 24 \
    --title "$1: ncu decode batch 1, 1 layer + head, context 128, per step"
done
echo "profile ${SECONDS}s"

#!/bin/bash
# Where a 1,024-token prefill's time goes on one v41-flash fp8 layer (FP8 projections + FP4 experts as stored,
# 32 experts) plus the head: ncu kernel durations of bench_model --prefill 1024 (two prefills) minus the same run
# without prefills, halved, per kernel, beside bench_model's own prefill time (the rest is launch gaps and
# host work). Usage (repository root, GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/dir bash scripts/device/prefill_profile.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B tessera bench/model/bench_model > $R/build_profile.log 2>&1 || { grep -B2 -A12 "error" $R/build_profile.log | head -40; exit 1; }
echo "build ${SECONDS}s; ncu: $(command -v ncu || echo none)"
M=$S/${MODEL:-flash1e32}; P=${PREFILL:-1024}
test -f $M/config.json || timeout 200 $B/tessera make-synthetic --out $M --preset v41-flash --layers 1 --experts 32 \
  --format fp8 > $R/make.log 2>&1 || { echo "make failed"; tail -5 $R/make.log; exit 1; }
args="--model $M --device cuda --dtype bf16 --batches 1 --context 16 --steps 1"
timeout 60 $B/bench/model/bench_model $args --prefill $P 2>/dev/null | grep '"bench":"prefill"'
for p in 0 $P; do
  pf=$p; [ $p = 0 ] && pf=""
  timeout 200 ncu --metrics gpu__time_duration.sum --print-units base --print-summary per-kernel --csv $B/bench/model/bench_model $args \
    --prefill "$pf" > $R/ncu_prefill_$p.csv 2> $R/ncu_prefill_$p.err
  echo "ncu prefill $p rc=$? ${SECONDS}s"
done
python3 scripts/device/ncu_diff.py "$R/ncu_prefill_0.csv" "$R/ncu_prefill_$P.csv" --per 2 --unit ms --top 28 \
  --title "ncu prefill 1024, 1 layer + head, per prefill"
echo "profile ${SECONDS}s"

#!/bin/bash
# The model benchmark on the H200 (bench/model): synthetic v41-flash checkpoints (fp8 native layout,
# dequantised to bf16 on load), the GPU model's prefill and decode against the rooflines, and the PyTorch
# eager layer (bench/model/torch_layer.py) in the same run. Results: $OUT/model_bench/*.jsonl.
# Usage on a GPU machine: bash scripts/device/model_bench.sh
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp}; R=$OUT/model_bench; mkdir -p $R
B=build-gpu
S=${SYN_DIR:-/tmp/tessera-syn}; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled \
  > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B tessera bench/model/bench_model > $R/build.log 2>&1 || { grep -B2 -A8 "error" $R/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
# 1 and 3 layers with 32 experts (the per-layer fit), 1 layer with the released 384 experts.
for spec in "flash1e32 1 32" "flash3e32 3 32" "flash1e384 1 384"; do
  set -- $spec
  SECONDS=0
  test -f $S/$1/config.json || $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts $3 --format fp8 \
    > $R/make_$1.log 2>&1 || { tail -5 $R/make_$1.log; exit 1; }
  echo "make-synthetic $1 ${SECONDS}s $(du -sh $S/$1 | cut -f1)"
done
run() { local name=$1; shift; SECONDS=0; timeout ${T:-240} "$@" > $R/$name.jsonl 2> $R/$name.err; echo "$name rc=$? ${SECONDS}s"; cat $R/$name.jsonl; tail -3 $R/$name.err; }
T=300 run fit_e32 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 \
  --prefill 1024,8192 --batches 1,4,16,64 --context 128 --steps 4
T=240 run e384 $B/bench/model/bench_model --model $S/flash1e384 --device cuda --dtype bf16 \
  --prefill 1024 --batches 1,16,64 --context 128 --steps 4
T=200 run torch python3 bench/model/torch_layer.py --batches 1,4,16,64 --prefill 1024,8192 --steps 8

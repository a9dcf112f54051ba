#!/bin/bash
# Programmatic dependent launch A/B in one binary (TESSERA_PDL=0 / 1, alternating): the tiny golden model, whose
# decode step is launch-bound (7 layers of ~40 launches each), under CUDA graphs and eager, 64 steps at batch 1 and 4;
# then, with SYN=DIR (a make-synthetic checkpoint), the same at one v41-flash layer + head. Prints min / mean ms per
# step. Usage on a GPU machine, from a build (PREBUILT: a pack_prebuilt.sh tarball instead of building):
#   TESSERA_SHARED_DIR=/path/to/shared [PREBUILT=pb.tar.xz] [SYN=/tmp/syn/fp81] bash scripts/device/pdl_ab.sh
cd "$(dirname "$0")/../.." || exit 1
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
OUT=${OUT:-/tmp}; R=$OUT/pdl_ab; mkdir -p $R
B=build-gpu; mkdir -p $B
if [ -n "${PREBUILT:-}" ]; then
  tar xJf "$PREBUILT" -C $B || { echo "unpack failed"; exit 1; }
else
  test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled > $R/setup.log 2>&1 ||
    { tail -30 $R/setup.log; exit 1; }
  ninja -C $B bench/model/bench_model > $R/build.log 2>&1 || { grep -A8 error $R/build.log | head -40; exit 1; }
fi
BM=$B/bench/model/bench_model
summary() {
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: d = json.loads(l)
    except Exception: continue
    if d.get("bench") == "decode": print("b%s %.4f/%.4f" % (d["batch"], d["step_ms_min"], d["step_ms_mean"]), end="  ")' "$1"
}
run() {  # name graphs pdl model steps
  TESSERA_CUDA_GRAPHS=$2 TESSERA_PDL=$3 timeout 60 $BM --model $4 --device cuda --dtype bf16 --prefill "" --batches 1,4 \
    --context 64 --steps $5 > $R/$1.jsonl 2> $R/$1.err
  echo "$1 rc=$?: $(summary $R/$1.jsonl)"
}
G=$TESSERA_SHARED_DIR/golden/v41-tiny/bf16
for r in 1 2 3 4; do run tiny_graph_pdl0_$r 1 0 $G 64; run tiny_graph_pdl1_$r 1 1 $G 64; done
for r in 1 2; do run tiny_eager_pdl0_$r 0 0 $G 64; run tiny_eager_pdl1_$r 0 1 $G 64; done
[ -n "${SYN:-}" ] || exit 0
for r in 1 2 3 4; do run syn_pdl0_$r 1 0 $SYN 32; run syn_pdl1_$r 1 1 $SYN 32; done

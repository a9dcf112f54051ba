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
  python3 - "$R/ncu_$1_1.csv" "$R/ncu_$1_5.csv" "$1" <<'PY'
import csv, sys
def load(f):
    rows = list(csv.reader(open(f)))
    hi = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
    h = rows[hi]; ki, ni, ai = h.index('Kernel Name'), h.index('Invocations'), h.index('Average')
    agg = {}
    for r in rows[hi + 1:]:
        if len(r) <= max(ki, ni, ai): continue
        name = r[ki].split('(')[0].split('<')[0].strip()
        n = float(r[ni]); t = float(r[ai].replace(',', '')) * n
        a = agg.setdefault(name, [0.0, 0.0]); a[0] += n; a[1] += t
    return agg
a, b = load(sys.argv[1]), load(sys.argv[2])
d = {k: [b[k][0] - a.get(k, [0, 0])[0], b[k][1] - a.get(k, [0, 0])[1]] for k in b}
tot = sum(v[1] for v in d.values()); n = sum(v[0] for v in d.values())
print(f"{sys.argv[3]}: ncu decode batch 1, 1 layer + head, context 128: {tot/4e3:.1f} us/step of kernels in {n/4:.0f} launches")
for k, v in sorted(d.items(), key=lambda kv: -kv[1][1])[:24]:
    print(f"  {v[1]/4e3:9.1f} us/step  {v[0]/4:5.1f}x  {k}")
PY
done
echo "profile ${SECONDS}s"

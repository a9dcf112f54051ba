#!/bin/bash
# After a kernel change on the decode path: the op suites and the GPU model (bitwise GPU == CPU), the golden
# gate on --device cuda, then bench_model's per-layer fit on two small v41-flash checkpoints and a per-kernel
# time profile (ncu) of one decode step. Usage on a GPU machine:
#   TESSERA_SHARED_DIR=/path/to/shared bash scripts/device/perf_check.sh
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
OUT=${OUT:-/tmp}; R=$OUT/perf; mkdir -p $R
B=build-gpu
S=${SYN_DIR:-/tmp/tessera-syn}; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
T="verify/gpu_ops/verify_gpu_pointwise verify/gpu_ops/verify_gpu_moe_engram verify/gpu_ops/verify_gpu_linear
   verify/gpu_attn/verify_gpu_attn verify/gpu_model/verify_gpu_model tessera bench/model/bench_model"
ninja -C $B $T > $R/build.log 2>&1 || { grep -B2 -A8 "error" $R/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
for t in gpu_ops/verify_gpu_pointwise gpu_ops/verify_gpu_moe_engram gpu_ops/verify_gpu_linear gpu_attn/verify_gpu_attn \
         gpu_model/verify_gpu_model; do
  SECONDS=0
  timeout 200 $B/verify/$t --log_level=message > $R/$(basename $t).log 2>&1
  echo "$t rc=$? ${SECONDS}s: $(grep -E 'No errors|failure|error' $R/$(basename $t).log | tail -1)"
  grep -E "GPU vs CPU|differ|mismatch" $R/$(basename $t).log | head -6
done
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
SECONDS=0
timeout 240 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 \
  --prefill ${PREFILL:-1024} --batches ${BATCHES:-1,4} --context 128 --steps 8 > $R/bench.jsonl 2> $R/bench.err
echo "bench_model rc=$? ${SECONDS}s"; cat $R/bench.jsonl; tail -3 $R/bench.err
if command -v ncu > /dev/null && [ -z "$NO_NCU" ]; then
  timeout 120 ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv $B/bench/model/bench_model \
    --model $S/flash1e32 --device cuda --dtype bf16 --prefill 16 --batches 1 --context 8 --steps 1 > $R/ncu.csv 2> $R/ncu.err
  python3 - "$R/ncu.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hi = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hi]; ki, ni, ai = h.index('Kernel Name'), h.index('Invocations'), h.index('Average')
agg = {}
for r in rows[hi + 1:]:
    if len(r) < len(h): continue
    name = r[ki].split('(')[0].replace('void ', '')
    n = int(r[ni]); avg = float(r[ai].replace(',', ''))
    a = agg.setdefault(name, [0, 0.0]); a[0] += n; a[1] += n * avg
tot = sum(v[1] for v in agg.values())
print(f"ncu (warm-up, prefills of 16 and 8, 2 decode steps; base clocks): {tot/1e3:.1f} us over {sum(v[0] for v in agg.values())} launches")
for k, v in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"  {v[1]/1e3:10.1f} us  {v[0]:5d}x  {k}")
PY
fi

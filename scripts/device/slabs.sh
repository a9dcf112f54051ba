#!/bin/bash
# The skinny tensor-core tile's K-slab variants on the H200: verify_gpu_linear_tc (every variant against
# ref::dot_tc), tc_bench --slabs (GB/s per variant and shape), then bench_model decode (batch 1, 4) on 1- and
# 3-layer synthetic v41-flash checkpoints once per TESSERA_TC_SLAB value.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/slabs.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_ops/verify_gpu_linear_tc tessera bench/model/bench_model bench/linear/tc_bench > $R/build.log 2>&1 \
  || { grep -B2 -A12 "error" $R/build.log | head -80; exit 1; }
echo "build ${SECONDS}s"
timeout 200 $B/verify/gpu_ops/verify_gpu_linear_tc --log_level=message > $R/linear_tc.log 2>&1
echo "verify_gpu_linear_tc rc=$?: $(grep -E 'No errors|failure' $R/linear_tc.log | tail -1)"
timeout 150 $B/bench/linear/tc_bench --slabs --quick > $R/slabs.log 2>&1; echo "tc_bench --slabs rc=$?"; grep "^|" $R/slabs.log
for spec in "flash1e32 1 32" "flash3e32 3 32"; do
  set -- $spec
  test -f $S/$1/config.json || $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts $3 --format fp8 \
    > $R/make_$1.log 2>&1 || { tail -5 $R/make_$1.log; exit 1; }
done
for slab in ${SLABS:-256x8 512x4 1024x3 512x6}; do
  TESSERA_TC_SLAB=$slab timeout 120 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 \
    --prefill 16 --batches ${BATCHES:-1,4} --context 128 --steps 8 > $R/bench_$slab.jsonl 2> $R/bench_$slab.err
  echo "slab $slab rc=$?"; grep -E '"decode_full"|"decode"' $R/bench_$slab.jsonl
done

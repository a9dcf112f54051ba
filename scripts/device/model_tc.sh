#!/bin/bash
# The bf16 model on the tensor cores, as measured for bench/RESULTS.md ("session 7"), in two calls that each fit a
# 10-minute device slot:
#   PHASE=a  build; verify_gpu_{linear,attn,moe_tc,moe_engram,moe_prune,pointwise,model,linear_tc}; verify golden
#            --device cuda (fp32, bf16); mhc_bench; tc_bench --decode --quick            (~3 min on a fresh machine)
#   PHASE=b  bench_model on 1- and 3-layer synthetic v41-flash checkpoints (decode 1/4/16/64, prefill 1K/8K), the
#            per-kernel decode-step profile (ncu, steps 5 minus steps 1), ncu sections of the skinny tensor-core,
#            attention and expert kernels                                                 (~2 min, after PHASE=a)
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir PHASE=a bash scripts/device/model_tc.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
if [ "${PHASE:-a}" = a ]; then
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
T="verify/gpu_ops/verify_gpu_pointwise verify/gpu_ops/verify_gpu_moe_engram verify/gpu_ops/verify_gpu_moe_tc verify/gpu_ops/verify_gpu_moe_prune
   verify/gpu_ops/verify_gpu_linear verify/gpu_ops/verify_gpu_linear_tc verify/gpu_attn/verify_gpu_attn verify/gpu_model/verify_gpu_model tessera
   bench/model/bench_model bench/mhc/mhc_bench bench/linear/tc_bench"
ninja -C $B $T > $R/build.log 2>&1 || { grep -B2 -A12 "error" $R/build.log | head -80; exit 1; }
echo "build ${SECONDS}s"; grep -i "spill" $R/build.log | grep -i -E "moe|mhc|linear_tc" | head
for t in gpu_ops/verify_gpu_linear gpu_attn/verify_gpu_attn gpu_ops/verify_gpu_moe_tc gpu_ops/verify_gpu_moe_engram gpu_ops/verify_gpu_moe_prune gpu_ops/verify_gpu_pointwise gpu_model/verify_gpu_model gpu_ops/verify_gpu_linear_tc; do
  SECONDS=0
  timeout 240 $B/verify/$t --log_level=message > $R/$(basename $t).log 2>&1
  echo "$t rc=$? ${SECONDS}s: $(grep -E 'No errors|failure|error' $R/$(basename $t).log | tail -1)"
  grep -E "error:|GPU vs CPU|mismatch" $R/$(basename $t).log | grep -v " 0 bit mismatches\|mismatches pre 0 post 0 comb 0" | head -8
done
echo "moe_tc lines with 0 differing outputs: $(grep -c ': 0/' $R/verify_gpu_moe_tc.log)"
G=$TESSERA_SHARED_DIR/golden/v41-tiny
for v in fp32 bf16; do
  timeout 90 $B/tessera verify golden --model $G/$v --golden $G/$v --device cuda > $R/golden_$v.log 2>&1
  echo "verify golden $v --device cuda rc=$?: $(grep -E '^golden:' $R/golden_$v.log)"
done
timeout 60 $B/bench/mhc/mhc_bench > $R/mhc_bench.log 2>&1; echo "mhc_bench rc=$?"; tail -6 $R/mhc_bench.log
timeout 100 $B/bench/linear/tc_bench --decode --quick > $R/tc_bench_dec.log 2>&1; echo "tc_bench --decode rc=$?"; tail -25 $R/tc_bench_dec.log
else
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
ninja -C $B tessera bench/model/bench_model > $R/build2.log 2>&1 || { tail -30 $R/build2.log; exit 1; }
for spec in "flash1e32 1 32" "flash3e32 3 32"; do
  set -- $spec
  test -f $S/$1/config.json || $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts $3 --format fp8 \
    > $R/make_$1.log 2>&1 || { tail -5 $R/make_$1.log; exit 1; }
done
SECONDS=0
timeout 200 $B/bench/model/bench_model --model $S/flash1e32 --model $S/flash3e32 --device cuda --dtype bf16 \
  --prefill ${PREFILL:-1024,8192} --batches ${BATCHES:-1,4,16,64} --context 128 --steps 8 > $R/bench.jsonl 2> $R/bench.err
echo "bench_model rc=$? ${SECONDS}s"; cat $R/bench.jsonl; tail -3 $R/bench.err
for st in 1 5; do
timeout 120 ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv $B/bench/model/bench_model \
    --model $S/flash1e32 --device cuda --dtype bf16 --prefill 16 --batches 1 --context 8 --steps $st > $R/ncu$st.csv 2> $R/ncu$st.err
done
python3 scripts/device/ncu_diff.py "$R/ncu1.csv" "$R/ncu5.csv" --per 4 --top 22 \
  --title "ncu decode, 4 steps (steps 5 minus steps 1), batch 1, 1 layer + head; base clocks, per step"
timeout 150 ncu --kernel-name regex:"linear_tc_skinny_kernel|attention_kernel|moe_tc_act_skinny" --launch-skip 20 --launch-count 6 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
  $B/bench/model/bench_model --model $S/flash1e32 --device cuda --dtype bf16 --prefill 16 --batches 1 --context 8 --steps 3 > $R/ncu_detail.txt 2>&1
echo "ncu detail rc=$?"
grep -E "^  [a-z_:<>A-Z0-9, ]+\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Shared Memory Config|Block Limit|Warp Cycles Per Issued|Stall|One or More Eligible|Grid Size|Dynamic Shared" $R/ncu_detail.txt | head -120
fi

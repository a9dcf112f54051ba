#!/bin/bash
# The EXL3 MoE routing grouped on the device (gpu::moe_group; no stream synchronisation in Forward::moe_exl3):
# the grouped-GEMM case of the EXL3 op suite (num_assignments as a capacity past expert_offsets[E]), the GPU
# model's EXL3 suite (moe_group kernel == the plain grouping, pruned routing, CUDA vs CPU model, batched ==
# alone), then bench_model decode (batches 1, 4, 16, 64) and prefill 1K on synthetic v41-flash exl3:2.8
# checkpoints of 1 and 3 layers with 32 experts, as scripts/device/exl3_model.sh: the per-layer cost is
# (3-layer − 1-layer) / 2, to set against that script's numbers on the host-grouped build.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/exl3_moe.sh
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/exl3/verify_exl3_gpu verify/gpu_model/verify_gpu_model tessera bench/model/bench_model \
  > $R/build.log 2>&1 || { grep -B2 -A12 "error" $R/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
t0=$SECONDS
timeout 180 $B/verify/exl3/verify_exl3_gpu --run_test=exl3_gpu/moe_grouped_equals_dense_per_expert \
  --log_level=message > $R/exl3_grouped.log 2>&1
echo "exl3_gpu grouped rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/exl3_grouped.log | tail -1)"
grep -E "error" $R/exl3_grouped.log | head -8
t0=$SECONDS
timeout 240 $B/verify/gpu_model/verify_gpu_model --run_test=gpu_model_exl3 --log_level=message > $R/gpu_model_exl3.log 2>&1
echo "gpu_model_exl3 rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/gpu_model_exl3.log | tail -1)"
grep -E "relative RMS|error" $R/gpu_model_exl3.log | head -16
for spec in "flash1x 1" "flash3x 3"; do
  set -- $spec
  test -f $S/$1/config.json || $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 --experts 32 \
    --format exl3:2.8 > $R/make_$1.log 2>&1 || { tail -5 $R/make_$1.log; exit 1; }
done
echo "synthetic ${SECONDS}s"
timeout 240 $B/bench/model/bench_model --model $S/flash1x --model $S/flash3x --device cuda --dtype bf16 \
  --prefill 1024 --batches 1,4,16,64 --context 128 --steps 8 > $R/bench_exl3.jsonl 2> $R/bench_exl3.err
echo "bench_model exl3 rc=$? ${SECONDS}s"; cat $R/bench_exl3.jsonl; tail -3 $R/bench_exl3.err

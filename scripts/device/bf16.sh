#!/bin/bash
# The golden engine's bf16 numerics on the H200: the device's own expf/log1pf/sinf/cosf against their CPU replays,
# cuBLAS bf16 GEMMs against the tensor-core model (ref::dot_tc), the op families whose bf16 arithmetic follows them
# (linear, attention, mHC, MoE, compressor, Engram, RoPE) against the CPU, the GPU model against the CPU model bit
# for bit, and the golden gate on --device cuda for fp32 and bf16.
# Usage (repository root): TESSERA_SHARED_DIR=$PWD/.gpu-shared OUT=/some/dir bash scripts/device/bf16.sh
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$PWD/.gpu-shared}
OUT=${OUT:-/tmp}
B=build-gpu
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
SECONDS=0
T="verify/gpu_ops/verify_gpu_device_math verify/gpu_ops/verify_gpu_tensor_core verify/gpu_ops/verify_gpu_linear
   verify/gpu_ops/verify_gpu_pointwise verify/gpu_ops/verify_gpu_moe_engram verify/gpu_attn/verify_gpu_attn
   verify/gpu_model/verify_gpu_model tessera"
ninja -C $B $T > $OUT/build.log 2>&1 || { grep -B2 -A8 "error" $OUT/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
for t in gpu_ops/verify_gpu_device_math gpu_ops/verify_gpu_tensor_core gpu_ops/verify_gpu_linear gpu_ops/verify_gpu_pointwise \
         gpu_ops/verify_gpu_moe_engram gpu_attn/verify_gpu_attn gpu_model/verify_gpu_model; do
  SECONDS=0
  timeout 300 $B/verify/$t --log_level=message > $OUT/$(basename $t).log 2>&1
  echo "$t rc=$? ${SECONDS}s: $(grep -E 'No errors|failure|error' $OUT/$(basename $t).log | tail -1)"
  grep -E "differ|GPU vs CPU|GPU model:|CPU model:|bit mismatches" $OUT/$(basename $t).log | head -40
done
G=$TESSERA_SHARED_DIR/golden/v41-tiny
for v in fp32 bf16; do
  for dev in cpu cuda; do
    timeout 120 $B/tessera verify golden --model $G/$v --golden $G/$v --device $dev > $OUT/golden_${v}_$dev.log 2>&1
    echo "verify golden $v --device $dev rc=$?: $(grep -E '^golden:' $OUT/golden_${v}_$dev.log)"
  done
done

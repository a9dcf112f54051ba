#!/bin/bash
# GPU == CPU on the H200: the op suites, the device math, the GPU model against the CPU model, the golden
# gate on --device cuda, NCCL at world size 1. Usage: TESSERA_SHARED_DIR=/path/to/shared bash scripts/device/exactness.sh
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
OUT=${OUT:-/tmp}
B=build-gpu
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
SECONDS=0
T="verify/gpu_ops/verify_gpu_device_math verify/gpu_ops/verify_gpu_pointwise verify/gpu_ops/verify_gpu_moe_engram
   verify/gpu_ops/verify_gpu_linear verify/gpu_ops/verify_gpu_sampling verify/gpu_attn/verify_gpu_attn
   verify/gpu_model/verify_gpu_model verify/dist/verify_dist_nccl tessera"
ninja -C $B $T > $OUT/build.log 2>&1 || { grep -B2 -A8 "error" $OUT/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
for t in gpu_ops/verify_gpu_device_math gpu_ops/verify_gpu_pointwise gpu_ops/verify_gpu_moe_engram gpu_ops/verify_gpu_linear \
         gpu_ops/verify_gpu_sampling gpu_attn/verify_gpu_attn gpu_model/verify_gpu_model dist/verify_dist_nccl; do
  SECONDS=0
  timeout 200 $B/verify/$t --log_level=message > $OUT/$(basename $t).log 2>&1
  echo "$t rc=$? ${SECONDS}s: $(grep -E 'No errors|failure|error' $OUT/$(basename $t).log | tail -1)"
  grep -E "GPU vs CPU|GPU model:|CPU model:|differ" $OUT/$(basename $t).log | head -8
done
G=$TESSERA_SHARED_DIR/golden/v41-tiny
for v in fp32 bf16; do
  timeout 90 $B/tessera verify golden --model $G/$v --golden $G/$v --device cuda > $OUT/golden_$v.log 2>&1
  echo "verify golden $v --device cuda rc=$?: $(grep -E '^golden:' $OUT/golden_$v.log)"
done

#!/bin/bash
# Device checks of the CPU math replays (ref::cuda_expf, fmath::log1p against the H200) and the NCCL
# communicator at world size 1. Usage on a GPU machine: TESSERA_SHARED_DIR=/path/to/shared bash scripts/device/math_nccl.sh
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp}
B=build-gpu
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared} > $OUT/setup_math.log 2>&1 || { tail -30 $OUT/setup_math.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_ops/verify_gpu_device_math verify/dist/verify_dist_nccl > $OUT/build_math.log 2>&1 \
  || { grep -B2 -A8 "error" $OUT/build_math.log | head -60; exit 1; }
echo "build ${SECONDS}s"
timeout 120 $B/verify/gpu_ops/verify_gpu_device_math --log_level=message > $OUT/device_math.log 2>&1
echo "device_math rc=$?"; tail -4 $OUT/device_math.log
timeout 120 $B/verify/dist/verify_dist_nccl --log_level=test_suite > $OUT/dist_nccl.log 2>&1
echo "dist_nccl (world 1) rc=$?"; grep -E "Leaving test case|error|passed|failed|skipped" $OUT/dist_nccl.log | tail -15

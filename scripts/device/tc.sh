#!/bin/bash
# Tensor-core bf16 linear on the H200: builds the test and the bench, lists the HMMA instructions ptxas made of
# each mma.sync variant (is m16n8k16 one HMMA.16816 on sm_90a?), runs verify_gpu_linear_tc (every output of the
# m16n8k16 kernels == ref::dot_tc bit for bit; mismatch counts of the diagnostic 2 × m16n8k8 kernels), then
# tc_bench (TFLOP/s at M = 512..8192 and decode GB/s at M = 1..16 on the DeepSeek-V4.1 shapes, beside cuBLAS).
# Last, while the run is under 6 minutes, compute-sanitizer memcheck and racecheck on the test's small case.
# Logs under $OUT: setup.log build.log sass_hmma.txt linear_tc_test.log tc_bench.log sanitizer_*.log.
# About 3-6 minutes (build 2-3, test under 1, bench 1-2).
# Usage (repository root): TESSERA_SHARED_DIR=$PWD/.gpu-shared OUT=/some/dir bash scripts/device/tc.sh [--quick]
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$PWD/.gpu-shared}
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
START=$(date +%s)
B=build-gpu
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader 2>&1 | head -1
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_ops/verify_gpu_linear_tc bench/linear/tc_bench > $OUT/build.log 2>&1 ||
  { grep -B2 -A8 "error" $OUT/build.log | head -60; exit 1; }
echo "build ${SECONDS}s"
grep -i "spill" $OUT/build.log | grep -i linear_tc

# SASS: HMMA opcodes per kernel of the linear_tc object.
obj=$(ls $B/kernels/libtessera_kernels.a.p/*linear_tc_cuda.cu.o 2>/dev/null | head -1)
if command -v cuobjdump > /dev/null && [ -n "$obj" ]; then
  cuobjdump -sass "$obj" | awk '/Function :/ { f = $3 } /HMMA/ { for (i = 1; i <= NF; ++i) if ($i ~ /^HMMA/) print f, $i }' |
    sort | uniq -c | c++filt > $OUT/sass_hmma.txt
  sed 's/tessera::kernels::tc_linear:://; s/(tessera::kernels::tc_linear::TcLinearParams)//' $OUT/sass_hmma.txt
else
  echo "cuobjdump or the object not found: no SASS listing"
fi

rc=0
SECONDS=0
timeout 300 $B/verify/gpu_ops/verify_gpu_linear_tc > $OUT/linear_tc_test.log 2>&1 || rc=$?
echo "verify_gpu_linear_tc rc=$rc ${SECONDS}s: $(grep -E 'No errors|failure|error' $OUT/linear_tc_test.log | tail -1)"
sed -n '/^### linear_tc vs ref::dot_tc/,$p' $OUT/linear_tc_test.log | head -120

SECONDS=0
timeout 300 $B/bench/linear/tc_bench "$@" > $OUT/tc_bench.log 2>&1
brc=$?
echo "tc_bench rc=$brc ${SECONDS}s"
cat $OUT/tc_bench.log

CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  if [ -z "$CS" ] || [ $(( $(date +%s) - START )) -gt 360 ]; then echo "compute-sanitizer $tool: skipped"; continue; fi
  timeout 60 $CS --tool $tool --error-exitcode 9 $B/verify/gpu_ops/verify_gpu_linear_tc \
    --run_test=linear_tc/output_modes_agree > $OUT/sanitizer_$tool.log 2>&1
  echo "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Hazard' $OUT/sanitizer_$tool.log | tail -1)"
done
echo "total $(( $(date +%s) - START ))s"
[ $rc -eq 0 ] && [ $brc -eq 0 ]

#!/bin/bash
# Device run of the GPU model checks (build the two targets, GPU suite, golden gate fp32/bf16 on --device
# cuda, generate on the tiny golden model, an fp8 tiny and a 3-layer v41-flash fp8 synthetic).
# Usage on a GPU machine: TESSERA_SHARED_DIR=/path/to/shared bash scripts/gpu_model_device_run.sh
cd "$(dirname "$0")/.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
B=build-gpu
OUT=${OUT:-/tmp}
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
SECONDS=0
ninja -C $B verify/gpu_model/verify_gpu_model tessera verify/gpu_attn/verify_gpu_attn verify/gpu_ops/verify_gpu_linear > $OUT/build.log 2>&1 || { grep -B2 -A8 "error" $OUT/build.log | head -80; exit 1; }
echo "build ${SECONDS}s"
SECONDS=0
timeout 150 $B/verify/gpu_model/verify_gpu_model --log_level=message > $OUT/gpu_model_test.log 2>&1
echo "gpu_model test rc=$? ${SECONDS}s"; tail -30 $OUT/gpu_model_test.log
G=$TESSERA_SHARED_DIR/golden/v41-tiny
for v in fp32 bf16; do
  SECONDS=0
  timeout 60 $B/tessera verify golden --model $G/$v --golden $G/$v --device cuda > $OUT/golden_$v.log 2>&1
  echo "verify golden $v --device cuda: rc=$? ${SECONDS}s"; grep -E "FAIL|^golden:|^model" $OUT/golden_$v.log
done
timeout 30 $B/tessera generate --model $G/fp32 --prompt-ids 1,2,3,4 --max-new-tokens 8 --device cuda
echo "generate rc=$?"
timeout 30 $B/tessera generate --model $G/fp32 --prompt-ids 1,2,3,4 --max-new-tokens 8 --device cpu
# The native FP8/FP4 layout (tiny dimensions; Engram hash data from the golden fixture): CPU and GPU tokens.
S=$OUT/syn; mkdir -p $S
$B/tessera make-synthetic --out $S/tiny_fp8 --preset tiny --format fp8 && cp $G/fp32/golden.safetensors $S/tiny_fp8/
for d in cpu cuda; do timeout 30 $B/tessera generate --model $S/tiny_fp8 --prompt-ids 5,6,7,8,9 --max-new-tokens 12 --device $d; done
# Real v41-flash dimensions, 3 layers (window, window + Engram, ratio-2 KV/index source), 8 experts.
SECONDS=0
$B/tessera make-synthetic --out $S/flash3 --preset v41-flash --layers 3 --experts 8 --vocab-size 2048 --format fp8
echo "make-synthetic ${SECONDS}s"; SECONDS=0
timeout 90 $B/tessera generate --model $S/flash3 --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 16 --device cuda --ignore-eos
echo "flash3 generate --device cuda rc=$? ${SECONDS}s"; SECONDS=0
TESSERA_GPU_MODEL_CHECKPOINT=$S/flash3 timeout 120 $B/verify/gpu_model/verify_gpu_model \
  --run_test=gpu_model_suite/checkpoint_from_env --log_level=message 2>&1 | tail -5
echo "flash3 GPU vs CPU ${SECONDS}s"
rm -rf $S

#!/bin/bash
# kAuto thresholds at the released 384 experts, one call: one layer + head of synthetic v41-flash checkpoints,
# prefill at 128 … 2K tokens (0.33 … 32 assignments per expert) and decode b32 / b64, with the MoE tile threshold
# (TESSERA_MOE_GEMM_MIN, fp8 checkpoint: kSkinny below, kGemm from it) and the EXL3 grouped-GEMM threshold
# (TESSERA_EXL3_GEMM_MIN, exl3:2.8 checkpoint: GEMV + chunk partials below, grouped GEMM from it) swept; 0 = the
# built-in value (MoE 1, EXL3 16). Every path gives the same bits; only the time differs.
# The fp8 sweep runs with TESSERA_MOE_WG_SKIP=0 and =1 (1, the default: the wgmma kGemm tile's idle warpgroup
# issues no wgmma); where the MoE suites were packed, they run first with it on (the switch's exactness gate).
# Usage (repository root on the GPU machine): [PREBUILT=pack.tar.xz] bash scripts/device/thresholds.sh
# TESSERA_MOE_GEMM_MIN_ROWS (fp8: kGemm from that many assignments whatever the expert count; 0 = built-in 32) is
# swept over MOE_ROWS, e.g. MOE_ROWS="0 1 48" BATCHES=4,6,8,16 PREFILLS="" for the decode sizes.
# Results: stdout and $OUT/thresholds/*.jsonl. Knobs: MOE_MINS, EXL3_MINS, WG_SKIPS, MOE_ROWS (lists), BATCHES,
# PREFILLS (bench_model lists), FORMATS ("fp8 exl3:2.8").
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
B=build-gpu; S=${SYN_DIR:-/tmp/syn}; R=${OUT:-/tmp}/thresholds; mkdir -p $B $S $R
if [ -n "${PREBUILT:-}" ]; then tar xJf "$PREBUILT" -C $B
else
  test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled -Dgpu_arch=90a \
    > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
  ninja -C $B tessera bench/model/bench_model > $R/build.log 2>&1 || { grep -B2 -A8 "error" $R/build.log | head -60; exit 1; }
fi
nvidia-smi --query-gpu=name --format=csv,noheader
for t in moe_scaled moe_tc; do
  x=$B/verify/gpu_ops/verify_gpu_$t; [ -x $x ] || continue
  TESSERA_MOE_WG_SKIP=1 timeout 300 $x --log_level=message > $R/$t.log 2>&1
  echo "verify_gpu_$t TESSERA_MOE_WG_SKIP=1 rc=$?: $(grep -E 'No errors|failure' $R/$t.log | tail -1)"
done
for f in ${FORMATS:-fp8 exl3:2.8}; do
  t=${f%%:*}
  [ -f $S/${t}384/config.json ] || timeout 400 $B/tessera make-synthetic --out $S/${t}384 --preset v41-flash --layers 1 \
    --experts 384 --format $f > $R/make_$t.log 2>&1 || { tail -3 $R/make_$t.log; continue; }
  var=TESSERA_MOE_GEMM_MIN mins=${MOE_MINS:-1 2 4 32} skips=${WG_SKIPS:-0 1}
  [ $t = exl3 ] && var=TESSERA_EXL3_GEMM_MIN mins=${EXL3_MINS:-32 16 8 4 2 1} skips=0
  rowss=${MOE_ROWS:-0}; [ $t = exl3 ] && rowss=0
  for a in $rowss; do
  for w in $skips; do
    for m in $mins; do
      echo "== $f $var=$m TESSERA_MOE_GEMM_MIN_ROWS=$a TESSERA_MOE_WG_SKIP=$w t=$SECONDS"
      env $var=$m TESSERA_MOE_GEMM_MIN_ROWS=$a TESSERA_MOE_WG_SKIP=$w timeout 120 $B/bench/model/bench_model \
        --device cuda --dtype bf16 --model $S/${t}384 --prefill ${PREFILLS-128,256,512,1024,2048} \
        --batches ${BATCHES:-32,64} --steps 8 > $R/${t}_${m}_${a}_$w.jsonl 2>> $R/bench.err
      grep -E '"(prefill|decode)"' $R/${t}_${m}_${a}_$w.jsonl |
        sed -E 's/.*"(tokens|batch)":([0-9]+).*"(s|step_ms_min)":([0-9.]+).*/\1 \2: \3 \4/' | paste -sd' '
    done
  done
  done
done

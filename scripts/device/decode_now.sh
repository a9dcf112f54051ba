#!/bin/bash
# The decode step at the current tree on the H100 / H200.
#   bench:   bench_model decode on synthetic v41-flash checkpoints (fp8 at 1 and 3 layers, 32 experts: batches 1, 4,
#            16, 64 at context 128 and 1, 16 at context 8192; exl3:2.8 at 1 and 3 layers: batches 1, 4, 16, 64 at
#            context 128), once per variant: VARIANTS="build[+ENV=VALUE] ..." (builds: cur, and base with
#            BASE_PATCH; default: every build and cur+TESSERA_MOE_WS=0, the one-warp routed tiles).
#   detail:  ncu SpeedOfLight / WarpStateStats / Occupancy of the kernels matching KERNELS (fp8, 1 layer, batch 1).
#   profile: ncu kernel durations of a decode step (5 steps − 1 step, over 4; 1 layer + head), fp8 at batches 1
#            and 4 and exl3:2.8 at batch 1, beside bench_model's step time for the same run (the difference is
#            launch gaps and host work).
#   stalls:  ncu SpeedOfLight / WarpStateStats / Occupancy / Launch / Scheduler / MemoryWorkload tables (all details)
#            of every kernel of one decode step (MODEL, default flash1e32; BATCH, default 1; the step's launches are
#            counted from runs of 1 and 2 steps).
#   source:  ncu --set full with source import of the last decode step's first launch matching each of KERNELS
#            (space-separated regexes), then its SASS view with per-instruction stall samples as CSV
#            (src_<kernel>.csv, the report src_<kernel>.ncu-rep beside it). SAMPLING: ncu's --warp-sampling-interval
#            (default 0: every 2^5 cycles; the default "auto" gave 28 samples for a 30 µs kernel).
#   prefill: bench_model prefill at PREFILL (default 1024,8192) on fp8 1- and 3-layer checkpoints per build (or per
#            VARIANTS="build[+ENV=VALUE] ...", e.g. cur+TESSERA_ATTN_MTILES=1 cur+TESSERA_MHC_TOTALS=0), then the
#            ncu kernel time of one PREFILL_PROFILE-token prefill (default 1024) of MODEL (default flash3e32).
#   check:   the GPU op suites (pointwise, moe_engram, linear, linear_scaled, moe_scaled), the GPU model suite,
#            verify golden --device cuda (GOLDEN, default "fp32 bf16"), and tc_bench --quant per block-scaled path
#            (PATHS, default "ring ws direct"; PATHS="" skips it).
# FP8_ONLY=1: bench runs the fp8 context-128 set only (profile: no exl3 checkpoint either).
# PREBUILT=file.tar.xz: binaries built elsewhere (scripts/device/pack_prebuilt.sh), at their paths under the build
# directory (bench_model_base: the base build's bench_model); nothing is built here and check runs the suites present.
# BASE_PATCH=file (a diff of kernels/ from the base to this tree): bench and profile also time the base, built
# first with the diff reversed (then the tree is restored and rebuilt incrementally), in the same run.
# Usage (repository root, on the GPU machine): TESSERA_SHARED_DIR=/path/to/shared OUT=/some/dir bash scripts/device/decode_now.sh check|bench|detail|profile|stalls|source|prefill
cd "$(dirname "$0")/../.." || exit 1
mode=${1:-bench}
OUT=${OUT:-/tmp}; mkdir -p "$OUT"
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
B=build-gpu; R=$OUT; S=/tmp/tessera-syn; mkdir -p $S
if [ -n "${PREBUILT:-}" ]; then  # binaries built elsewhere for sm_90a, at their paths under the build directory
  mkdir -p $B && { tar xJf "$PREBUILT" -C $B 2>/dev/null ||
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PREBUILT" $B; } \
    || { echo "PREBUILT: cannot unpack $PREBUILT"; exit 1; }
fi
[ -n "${PREBUILT:-}" ] || test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=disabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
SECONDS=0
builds=cur
[ -n "${PREBUILT:-}" ] && [ -x $B/bench_model_base ] && [ "$mode" != check ] && builds="base cur"
[ -n "${PREBUILT:-}" ] && [ -n "${BUILDS:-}" ] && builds=$BUILDS  # e.g. BUILDS=cur: profile the current tree alone
if [ -z "${PREBUILT:-}" ] && [ -n "${BASE_PATCH:-}" ] && [ "$mode" != check ]; then
  patch -s -R -p1 < "$BASE_PATCH" || exit 1
  ninja -C $B bench/model/bench_model > $R/build_base.log 2>&1 || { grep -B2 -A12 "error" $R/build_base.log | head -40; exit 1; }
  cp $B/bench/model/bench_model $B/bench_model_base; patch -s -p1 < "$BASE_PATCH" || exit 1
  builds="base cur"; echo "base build ${SECONDS}s"
fi
T="verify/gpu_model/verify_gpu_model tessera bench/model/bench_model"
SUITES=${SUITES:-pointwise moe_engram linear linear_scaled moe_scaled}
[ "$mode" = check ] && T="$T $(printf 'verify/gpu_ops/verify_gpu_%s ' $SUITES) bench/linear/tc_bench"
[ -n "${PREBUILT:-}" ] || ninja -C $B $T > $R/build_$mode.log 2>&1 || { grep -B2 -A12 "error" $R/build_$mode.log | head -60; exit 1; }
echo "build ${SECONDS}s"
bm() { [ "$1" = base ] && echo $B/bench_model_base || echo $B/bench/model/bench_model; }
if [ "$mode" = check ]; then
  for t in $SUITES; do
    [ -x $B/verify/gpu_ops/verify_gpu_$t ] || { echo "gpu_ops $t: not built"; continue; }
    t0=$SECONDS; timeout 240 $B/verify/gpu_ops/verify_gpu_$t --log_level=message > $R/gpu_$t.log 2>&1
    echo "gpu_ops $t rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/gpu_$t.log | tail -1)"
    grep -E "error:" $R/gpu_$t.log | head -6
  done
  t0=$SECONDS; timeout 240 $B/verify/gpu_model/verify_gpu_model --log_level=message > $R/gpu_model.log 2>&1
  echo "gpu_model rc=$? $((SECONDS - t0))s: $(grep -E 'No errors|failure' $R/gpu_model.log | tail -1)"
  grep -E "error:" $R/gpu_model.log | head -8
  G=$TESSERA_SHARED_DIR/golden/v41-tiny
  for v in ${GOLDEN-fp32 bf16}; do
    timeout 120 $B/tessera verify golden --model $G/$v --golden $G/$v --device cuda > $R/golden_$v.log 2>&1
    echo "verify golden $v --device cuda rc=$?: $(grep -E '^golden:' $R/golden_$v.log)"
  done
  # The block-scaled skinny tile per path on the release's decode shapes (M = 1, 4, 16).
  for path in ${PATHS-ring ws direct}; do  # PATHS="": none
    timeout 150 $B/bench/linear/tc_bench --quant --quick --iters 20 --quant-path $path > $R/tc_quant_$path.md 2>&1
    echo "tc_bench --quant --quant-path $path rc=$?"; grep -E '^\| (w|head)' $R/tc_quant_$path.md
  done
  exit 0
fi
make_syn() {  # name layers format
  test -f $S/$1/config.json || timeout 200 $B/tessera make-synthetic --out $S/$1 --preset v41-flash --layers $2 \
    --experts 32 --format $3 > $R/make_$1.log 2>&1 || { echo "make $1 failed"; tail -5 $R/make_$1.log; }
}
if [ "$mode" = bench ]; then
  make_syn flash1e32 1 fp8; make_syn flash3e32 3 fp8
  [ "${FP8_ONLY:-0}" = 1 ] || { make_syn flash1x 1 exl3:2.8; make_syn flash3x 3 exl3:2.8; }
  echo "synthetic ${SECONDS}s"
  # Variants: build[+ENV=VALUE]; TESSERA_MOE_WS=0 / 1 forces the one-warp / warp-specialised routed tiles.
  for v in ${VARIANTS:-$builds cur+TESSERA_MOE_WS=0}; do
    b=${v%%+*}; e=""; [ "$v" != "$b" ] && e=${v#*+}
    BM="env $e $(bm $b) --device cuda --dtype bf16"
    timeout 120 $BM --model $S/flash1e32 --model $S/flash3e32 --prefill "" --batches 1,4,16,64 --context 128 --steps 8 \
      > $R/bench_fp8_$v.jsonl 2> $R/bench_fp8_$v.err
    echo "[$v] fp8 ctx128 rc=$? ${SECONDS}s"; grep -E '"decode_full"' $R/bench_fp8_$v.jsonl; tail -2 $R/bench_fp8_$v.err
    [ "$v" != "$b" ] || [ "${FP8_ONLY:-0}" = 1 ] && continue
    timeout 120 $BM --model $S/flash1e32 --model $S/flash3e32 --prefill "" --batches 1,16 --context 8192 --steps 8 \
      > $R/bench_long_$v.jsonl 2> $R/bench_long_$v.err
    echo "[$v] fp8 ctx8192 rc=$? ${SECONDS}s"; grep -E '"decode_full"' $R/bench_long_$v.jsonl; tail -2 $R/bench_long_$v.err
    timeout 120 $BM --model $S/flash1x --model $S/flash3x --prefill "" --batches 1,4,16,64 --context 128 --steps 8 \
      > $R/bench_exl3_$v.jsonl 2> $R/bench_exl3_$v.err
    echo "[$v] exl3 ctx128 rc=$? ${SECONDS}s"; grep -E '"decode_full"' $R/bench_exl3_$v.jsonl; tail -2 $R/bench_exl3_$v.err
  done
  exit 0
fi
make_syn flash1e32 1 fp8
# BM for one decode step of MODEL at BATCH, and every launch of runs of 1 and 2 steps (launches_1 / _2.csv): the
# step's launches are the difference.
step_launches() {
  BM="$(bm cur) --device cuda --dtype bf16 --model $S/${MODEL:-flash1e32} --prefill 16 --batches ${BATCH:-1} --context 128"
  for st in 1 2; do
    timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv $BM --steps $st > $R/launches_$st.csv 2>/dev/null
  done
}
if [ "$mode" = stalls ]; then  # every kernel of the last decode step: ncu sections with their full tables
  step_launches
  t1=$(grep -c '"gpu__time_duration.sum"' $R/launches_1.csv); t2=$(grep -c '"gpu__time_duration.sum"' $R/launches_2.csv)
  per=$((t2 - t1)); echo "launches: steps 1 → $t1, steps 2 → $t2: $per a step (${SECONDS}s)"
  [ $per -gt 0 ] || exit 1
  timeout 420 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis --print-details all \
    --launch-skip $((t1 - per)) --launch-count $per $BM --steps 1 > $R/ncu_stalls.txt 2> $R/ncu_stalls.err
  echo "ncu stalls rc=$? (${SECONDS}s)"; grep -cE "^  [A-Za-z_].*\(" $R/ncu_stalls.txt; tail -3 $R/ncu_stalls.err
  exit 0
fi
if [ "$mode" = source ]; then  # SASS lines of a decode step's first launch matching each KERNELS regex, with stall samples
  step_launches
  for k in ${KERNELS:-mhc_mix_finish attention_tc moe_tc_act_skinny_q}; do
    # With a kernel filter ncu counts matching launches only: skip those before the last step.
    m1=$(grep '"gpu__time_duration.sum"' $R/launches_1.csv | grep -cE "$k"); m2=$(grep '"gpu__time_duration.sum"' $R/launches_2.csv | grep -cE "$k")
    skip=$((2 * m1 - m2)); [ $((m2 - m1)) -gt 0 ] && [ $skip -ge 0 ] || { echo "source $k: no launch per step"; continue; }
    timeout 200 ncu --clock-control none --set full --import-source yes --warp-sampling-interval ${SAMPLING:-0} \
      -k "regex:$k" --launch-skip $skip --launch-count 1 \
      -o $R/src_$k $BM --steps 1 > $R/src_$k.log 2>&1
    timeout 60 ncu --import $R/src_$k.ncu-rep --page source --print-source sass --csv > $R/src_$k.csv 2>&1
    echo "source $k (skip $skip) rc=$? lines=$(wc -l < $R/src_$k.csv) (${SECONDS}s)"
  done
  exit 0
fi
if [ "$mode" = prefill ]; then  # prefill tok/s at PREFILL lengths, then ncu kernel time of one PREFILL_PROFILE prefill
  make_syn flash3e32 3 fp8
  for v in ${VARIANTS:-$builds}; do  # build[+ENV=VALUE], as for bench (e.g. cur+TESSERA_ATTN_MTILES=1)
    b=${v%%+*}; e=""; [ "$v" != "$b" ] && e=${v#*+}
    timeout 200 env $e $(bm $b) --device cuda --dtype bf16 --model $S/flash1e32 --model $S/flash3e32 --prefill ${PREFILL:-1024,8192} \
      --batches "" > $R/prefill_$v.jsonl 2> $R/prefill_$v.err
    echo "[$v] prefill rc=$? ${SECONDS}s"; grep -E '"prefill' $R/prefill_$v.jsonl; tail -2 $R/prefill_$v.err
  done
  # Two timed prefills of PREFILL_PROFILE tokens minus the warm-up-only run, over 2 (PREFILL_PROFILE=0: none).
  [ "${PREFILL_PROFILE:-1024}" = 0 ] && exit 0
  for L in "" ${PREFILL_PROFILE:-1024}; do
    timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
      $(bm cur) --device cuda --dtype bf16 --model $S/${MODEL:-flash3e32} --batches "" --prefill "$L" \
      > $R/ncu_prefill_${L:-0}.csv 2> $R/ncu_prefill_${L:-0}.err
  done
  python3 scripts/device/ncu_diff.py $R/ncu_prefill_0.csv $R/ncu_prefill_${PREFILL_PROFILE:-1024}.csv --per 2 --unit ms --top 40 \
    --title "${MODEL:-flash3e32}: ncu prefill of ${PREFILL_PROFILE:-1024} tokens, one chunk"
  echo "  (${SECONDS}s)"
  exit 0
fi
[ "${FP8_ONLY:-0}" = 1 ] || make_syn flash1x 1 exl3:2.8
if [ "$mode" = detail ]; then  # stall reasons of the named kernels (KERNELS: ncu regex), fp8 1 layer, batch 1
  timeout 300 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section LaunchStats -k "regex:${KERNELS:-mhc_mix_finish|mhc_mix_partial|rms_norm|skinny_ws|skinny_q|moe_score}" \
    --launch-skip ${SKIP:-0} --launch-count ${COUNT:-16} $(bm cur) --device cuda --dtype bf16 --model $S/flash1e32 \
    --prefill 16 --batches 1 --context 128 --steps 1 > $R/ncu_detail.txt 2> $R/ncu_detail.err
  echo "ncu detail rc=$?"
  grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Stall|Memory Throughput|Compute \(SM\)|Block Size|Grid Size|Dynamic Shared" $R/ncu_detail.txt | head -${LINES_MAX:-200}
  exit 0
fi
default_specs="flash1e32:1 flash1e32:4 flash1x:1"; [ "${FP8_ONLY:-0}" = 1 ] && default_specs="flash1e32:1 flash1e32:4"
for spec in ${PROFILE_SPECS:-$default_specs}; do for b in $builds; do
  set -- ${spec/:/ }; BM="$(bm $b) --device cuda --dtype bf16"
  [ "$1" = flash3e32 ] && make_syn flash3e32 3 fp8
  echo "[$b] $1 b$2"
  timeout 60 $BM --model $S/$1 --prefill 16 --batches $2 --context 128 --steps 8 2>/dev/null | grep '"decode"'
  for st in 1 5; do
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel --csv $BM \
      --model $S/$1 --prefill 16 --batches $2 --context 128 --steps $st > $R/ncu_${b}_$1_b$2_$st.csv 2> $R/ncu_${b}_$1_b$2_$st.err
  done
  python3 scripts/device/ncu_diff.py "$R/ncu_${b}_$1_b$2_1.csv" "$R/ncu_${b}_$1_b$2_5.csv" --per 4 \
    --title "$1 b$2: ncu decode, 1 layer + head, context 128, per step"
  echo "  (${SECONDS}s)"
done; done

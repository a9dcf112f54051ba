#!/bin/bash
# Packs stripped GPU binaries of a local CUDA build for decode_now.sh's PREBUILT (no build on the device machine:
# its start is paid once, and its minutes go to runs). Usage (repository root):
#   bash scripts/device/pack_prebuilt.sh BUILD_DIR OUT.tar.xz [BASE_BENCH_MODEL]
# BUILD_DIR: a meson build with -Dcuda=enabled -Dgpu_arch=90a (the device's sm_90a); BASE_BENCH_MODEL: a bench_model
# of the base tree, packed as bench_model_base. SUITES: the verify_gpu_<suite> binaries to pack (default
# "linear_scaled moe_scaled"; each is ~3 MB packed); EXTRA: more build-relative paths (e.g.
# verify/gpu_attn/verify_gpu_attn), run on the device as build-gpu/<path>. Packs whichever of these targets exist.
set -e
B=$1; OUTF=$2; BASE=${3:-}
[ -d "$B" ] && [ -n "$OUTF" ] || { echo "usage: pack_prebuilt.sh BUILD_DIR OUT.tar.xz [BASE_BENCH_MODEL]"; exit 1; }
T=$(mktemp -d); trap 'rm -rf $T' EXIT
for f in tessera bench/model/bench_model bench/linear/tc_bench verify/gpu_model/verify_gpu_model \
         $(printf 'verify/gpu_ops/verify_gpu_%s ' ${SUITES:-linear_scaled moe_scaled}) ${EXTRA:-}; do
  [ -x "$B/$f" ] || continue
  mkdir -p "$T/$(dirname "$f")"; strip -o "$T/$f" "$B/$f"
done
[ -z "$BASE" ] || strip -o "$T/bench_model_base" "$BASE"
# -9: a 64 MiB dictionary spans several of the binaries, which share most of their code (260 MB of stripped binaries
# packed to 18.6 MB, against 44.6 MB at -6, whose 24 MiB blocks see one binary at a time; the carry limit is 64 MiB).
tar cf - -C "$T" . | xz -T2 -9e > "$OUTF"
ls -la "$OUTF"

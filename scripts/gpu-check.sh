#!/usr/bin/env bash
# Builds Tessera on a GPU machine (CUDA, no PCRE2 or compiled Boost needed) and runs the gpu suite.
# Usage: scripts/gpu-check.sh [extra meson test args]. Build dir: build-gpu/.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ ! -f build-gpu/build.ninja ]; then
  meson setup build-gpu --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=auto -Dserver=auto \
    -Dshared_dir="${TESSERA_SHARED_DIR:-}" || exit 1
fi
meson compile -C build-gpu || exit 1
meson test -C build-gpu --suite gpu --print-errorlogs --num-processes 1 "$@"
rc=$?
python3 scripts/test_summary.py build-gpu/meson-logs/testlog.json || rc=1
exit $rc

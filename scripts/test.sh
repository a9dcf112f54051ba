#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (cpu, compile, and gpu, which reports
# SKIP without a device). Ends with the line "N passed, N failed, N skipped" from Meson's test log;
# exits non-zero if any test failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh || exit 1
bash scripts/build.sh || exit 1
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
meson test -C build --print-errorlogs --num-processes "${TESSERA_TEST_JOBS:-$(nproc)}" "$@"
rc=$?
python3 scripts/test_summary.py build/meson-logs/testlog.json || rc=1
exit $rc

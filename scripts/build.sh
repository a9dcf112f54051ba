#!/usr/bin/env bash
# Configures (once) and builds Tessera into build/. CUDA is used when nvcc is found (PATH or
# /usr/local/cuda/bin); extra `meson setup` options can be passed as arguments on the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if [ ! -f build/build.ninja ]; then
  meson setup build --wrap-mode=nodownload "$@"
fi
# The compile log is kept; ptxas info C7520 means a kernel's wgmma run one at a time (a wgmma under a condition
# ptxas takes for divergent: docs/architecture-notes.md note 34). TESSERA_BUILD_STRICT=1 (CI) fails on it; otherwise
# it is a warning.
log=build/meson-logs/compile.log
meson compile -C build 2>&1 | tee "$log"
if grep -q "C7520" "$log"; then
  grep "C7520" "$log" | sed 's/^/  /' >&2
  echo "build: ptxas serialised wgmma instructions (C7520) in the kernels above" >&2
  if [ "${TESSERA_BUILD_STRICT:-0}" = 1 ]; then exit 1; fi
fi

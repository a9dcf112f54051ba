#!/usr/bin/env bash
# Configures (once) and builds Tessera into build/. CUDA is used when nvcc is found (PATH or
# /usr/local/cuda/bin); extra `meson setup` options can be passed as arguments on the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if [ ! -f build/build.ninja ]; then
  meson setup build --wrap-mode=nodownload "$@"
fi
meson compile -C build

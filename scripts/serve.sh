#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs Tessera on its embedded default: a tiny
# synthetic DeepSeek-V4.1 checkpoint (spec/deepseek-v41.md §6 dimensions), generated once into the cache
# folder and then inspected (config, tensors, weight layout).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
model_dir="${TESSERA_TINY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/tiny}"
if [ ! -f "$model_dir/model.safetensors" ] || [ ! -f "$model_dir/config.json" ]; then
  build/tessera make-synthetic --out "$model_dir" --preset tiny --seed 0
fi
exec build/tessera inspect "$model_dir"

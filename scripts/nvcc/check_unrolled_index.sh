#!/bin/bash
# Compiles unrolled_index_repro.cu to PTX and reports whether the first shared load's address adds both
# (tid·16 & 0x1F0) and (tid·16 & 0xF0) — the wrong lane·16 + c·16 of nvcc 13.0.88 — or not.
# Usage: bash scripts/nvcc/check_unrolled_index.sh [extra nvcc flags]
set -e
dir=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
nvcc -arch=sm_90a -ptx "$@" "$dir/unrolled_index_repro.cu" -o "$tmp/r.ptx"
nvcc --version | tail -1
body=$(awk '/ld.shared.v4/ {exit} {print}' "$tmp/r.ptx")
if echo "$body" | grep -q "and.b32.*496" && echo "$body" | grep -q "and.b32.*240"; then
  echo "address = lane*16 + c*16: this nvcc miscompiles the unrolled index (see unrolled_index_repro.cu)"
  exit 1
fi
echo "address computed without the extra c*16: not reproduced"

#!/bin/sh
# `tessera generate` prints the same ids with --draft none and --draft lookup (fixed and adaptive depth),
# greedy and keyed T > 0, on the tiny golden model; --draft dspark fails with a clear message there (no
# mtp.* weights); on a make-synthetic --mtp tiny model --draft dspark prints the --draft none ids.
set -eu
tessera="$1"
model="$TESSERA_SHARED_DIR/golden/v41-tiny/fp32"
p=5,9,5,9,5,9,5,9,17,33,5,9,5,9
for samp in "" "--temperature 0.8 --top-p 0.9 --seed 42"; do
  # shellcheck disable=SC2086
  want=$("$tessera" generate --model "$model" --prompt-ids $p --max-new-tokens 32 --ignore-eos $samp --draft none)
  [ -n "$want" ] || { echo "no ids from --draft none"; exit 1; }
  for k in "--draft-k 1" "--draft-k 4" ""; do
    # shellcheck disable=SC2086
    got=$("$tessera" generate --model "$model" --prompt-ids $p --max-new-tokens 32 --ignore-eos $samp --draft lookup $k 2>/dev/null)
    if [ "$got" != "$want" ]; then echo "lookup $k $samp: $got != $want"; exit 1; fi
  done
done
if "$tessera" generate --model "$model" --prompt-ids $p --draft dspark 2>/tmp/dspark_err.$$; then
  echo "--draft dspark should fail"; exit 1
fi
grep -q "has no DSpark weights" /tmp/dspark_err.$$ || { cat /tmp/dspark_err.$$; exit 1; }
rm -f /tmp/dspark_err.$$
# A synthetic tiny model with DSpark blocks; the Engram hash data comes from the golden fixture.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$tessera" make-synthetic --out "$dir" --preset tiny --mtp --seed 3 >/dev/null
ln -s "$TESSERA_SHARED_DIR/golden/v41-tiny/fp32/golden.safetensors" "$dir/golden.safetensors"
for samp in "" "--temperature 0.8 --top-p 0.9 --seed 42"; do
  # shellcheck disable=SC2086
  want=$("$tessera" generate --model "$dir" --prompt-ids $p --max-new-tokens 24 --ignore-eos $samp --draft none)
  for k in "--draft-k 5" "--draft-k 2" ""; do
    # shellcheck disable=SC2086
    got=$("$tessera" generate --model "$dir" --prompt-ids $p --max-new-tokens 24 --ignore-eos $samp --draft dspark $k 2>"$dir/err")
    if [ "$got" != "$want" ]; then echo "dspark $k $samp: $got != $want"; cat "$dir/err"; exit 1; fi
    grep -q "draft=dspark" "$dir/err" || { cat "$dir/err"; exit 1; }
  done
done
echo "cli drafted == serial: 6 lookup runs and 6 dspark runs equal"

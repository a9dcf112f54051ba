#!/bin/sh
# `tessera generate` prints the same ids with --draft none and --draft lookup (fixed and adaptive depth),
# greedy and keyed T > 0, on the tiny golden model; and --draft dspark fails with a clear message.
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
grep -q "DSpark drafter is not implemented" /tmp/dspark_err.$$ || { cat /tmp/dspark_err.$$; exit 1; }
rm -f /tmp/dspark_err.$$
echo "cli drafted == serial: 6 runs equal"

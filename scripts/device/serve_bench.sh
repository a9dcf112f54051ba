#!/bin/bash
# HTTP serving benchmark on the H200: `tessera serve --device cuda` (the GPU model) driven by
# bench/server/bench_http.py — TTFT, per-stream and aggregate tok/s at 1/4/16/64 concurrent streams, plain
# and JSON-schema constrained (mask µs per constrained token from the server's /metrics) — on the golden
# tiny model and on a small make-synthetic checkpoint (v41-flash dimensions, 3 layers, 8 experts, vocab
# 2048, fp8). Results: $OUT/serve_bench.jsonl (one JSON object per level), $OUT/serve_bench_*.log.
#
#   TESSERA_SHARED_DIR=$PWD/.gpu-shared bash scripts/device/serve_bench.sh [build|tiny|flash|all]
#
# Each phase fits one 10-minute device command; run `build`, then `tiny`, then `flash` (the build folder
# persists on a warm machine; `tiny` and `flash` build first if needed). Without PCRE2 headers the build
# cannot load a BPE tokenizer.json, so the server runs the byte-level stand-in tokenizer (ids 0–255 bytes +
# the DeepSeek special tokens): one token per byte, and the grammar vocabulary is that small one — the
# 129,280-token mask cost is the CPU measurement of bench/grammar (bench/RESULTS.md).
# Knobs: LEVELS (1,4,16,64), MAX_TOKENS (32), REQS (requests per stream, 1), BENCH_TIMEOUT (s per run, 170);
# DEVICE=cpu B=build runs the same phases on a CPU build (a dry run of this script off the device).
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
OUT=${OUT:-/tmp}
PHASE=${1:-all}
B=${B:-build-gpu}
DEVICE=${DEVICE:-cuda}
LEVELS=${LEVELS:-1,4,16,64}
MAX_TOKENS=${MAX_TOKENS:-32}
REQS=${REQS:-1}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-170}
G=$TESSERA_SHARED_DIR/golden/v41-tiny/fp32
mkdir -p "$OUT"

build() {
  nvidia-smi -L > "$OUT/gpu.txt" 2>&1
  git log -1 --format='%H %s' > "$OUT/commit.txt" 2>/dev/null
  # The same configuration as scripts/device/exactness.sh, so both share build-gpu.
  test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dnccl=enabled -Dpcre2=disabled \
    -Dshared_dir="$TESSERA_SHARED_DIR" > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
  SECONDS=0
  ninja -C $B tessera > "$OUT/build.log" 2>&1 || { grep -B2 -A8 "error" "$OUT/build.log" | head -60; exit 1; }
  echo "build tessera ${SECONDS}s"
}

# bench LABEL MODEL_DIR RESPONSE_FORMAT [serve flags…]
bench() {
  local label=$1 model=$2 rf=$3
  shift 3
  SECONDS=0
  # SIGINT first: bench_http.py then stops its server (which drains for at most 2 s).
  timeout --signal=INT -k 40 "$BENCH_TIMEOUT" python3 bench/server/bench_http.py --exe $B/tessera --levels "$LEVELS" --max-tokens "$MAX_TOKENS" \
    --requests-per-stream "$REQS" --response-format "$rf" --label "$label $rf" --json "$OUT/serve_bench.jsonl" \
    -- --model "$model" --device "$DEVICE" --max-batch 64 --drain-timeout 2 "$@" > "$OUT/serve_bench_${label}_${rf}.log" 2>&1
  echo "== $label $rf: rc=$? ${SECONDS}s"
  cat "$OUT/serve_bench_${label}_${rf}.log"
}

# A server that answers at all on --device cuda: one constrained reply, its /metrics mask series.
smoke() {
  local model=$1 pf=$OUT/smoke.port
  rm -f "$pf"
  $B/tessera serve --model "$model" --device "$DEVICE" --port 0 --port-file "$pf" > "$OUT/smoke_serve.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do [ -f "$pf" ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if [ ! -f "$pf" ]; then echo "serve --device $DEVICE did not start:"; tail -20 "$OUT/smoke_serve.log"; kill $pid 2>/dev/null; return 1; fi
  local port; port=$(cat "$pf")
  curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d '{"messages":[{"role":"user",
    "content":"Hello"}],"thinking":{"type":"disabled"},"temperature":0,"max_tokens":40,"response_format":{"type":"json_schema",
    "json_schema":{"name":"x","schema":{"type":"object","properties":{"zz":{"type":"string"}}}}}}' > "$OUT/smoke_reply.json"
  echo "smoke reply: $(head -c 600 "$OUT/smoke_reply.json")"
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^tessera:grammar_mask' | sed 's/^/smoke metrics: /'
  kill -TERM $pid; wait $pid
  echo "smoke server exit code $?"
}

tiny() {
  test -x $B/tessera || build
  smoke "$G" || exit 1
  bench tiny "$G" text
  bench tiny "$G" json_schema
}

flash() {
  test -x $B/tessera || build
  local S; S=$(mktemp -d)
  SECONDS=0
  $B/tessera make-synthetic --out "$S/flash3" --preset v41-flash --layers 3 --experts 8 --vocab-size 2048 --format fp8 \
    > "$OUT/make_synthetic.log" 2>&1 || { cat "$OUT/make_synthetic.log"; exit 1; }
  echo "make-synthetic flash3 ${SECONDS}s: $(tail -1 "$OUT/make_synthetic.log")"
  bench flash3 "$S/flash3" text --max-context 4096
  bench flash3 "$S/flash3" json_schema --max-context 4096
  rm -rf "$S"
}

case "$PHASE" in
  build) build ;;
  tiny) tiny ;;
  flash) flash ;;
  all) build; tiny; flash ;;
  *) echo "usage: $0 [build|tiny|flash|all]"; exit 2 ;;
esac

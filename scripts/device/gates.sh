#!/bin/bash
# The harness gates on the GPU backend (H200): the invariance suite (--device cuda, fp32 and bf16, with
# drafted == serial), a CPU server and a GPU server on golden/v41-tiny compared by `verify engines` (all
# replies equal: the GPU model equals the CPU model bit for bit), drafted == serial over HTTP on the GPU
# server (lookup drafts at depth 3; the same server with "draft": false), and a short soak of the GPU server.
# Usage on a GPU machine: TESSERA_SHARED_DIR=/path/to/shared bash scripts/device/gates.sh
# Knobs: REQUESTS (request file for verify engines; default verify/harness/requests/default.jsonl, the 106-request
# verify/harness/requests/drafting.jsonl for the drafting gate), INVARIANCE (dtypes, "" skips), SOAK_MINUTES (0 skips).
cd "$(dirname "$0")/../.." || exit 1
export PATH=/usr/local/cuda/bin:$PATH
export TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-$(cd .. && pwd)/shared}
OUT=${OUT:-/tmp}; R=$OUT/gates; mkdir -p $R
B=${BUILD:-build-gpu}; GD=${GPU_DEVICE:-cuda}
test -f $B/build.ninja || meson setup $B --wrap-mode=nodownload -Dcuda=enabled -Dpcre2=disabled \
  -Dshared_dir=$TESSERA_SHARED_DIR > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
ninja -C $B tessera > $R/build.log 2>&1 || { grep -B2 -A8 "error" $R/build.log | head -60; exit 1; }
G=$TESSERA_SHARED_DIR/golden/v41-tiny
for v in ${INVARIANCE-fp32 bf16}; do
  SECONDS=0
  timeout 150 $B/tessera verify invariance --model $G/$v --numerics $v --device $GD > $R/invariance_$v.log 2>&1
  echo "verify invariance --device $GD $v rc=$? ${SECONDS}s: $(tail -1 $R/invariance_$v.log)"
  grep -E "^(PASS|FAIL|SKIP)" $R/invariance_$v.log
  grep -E "in all:" $R/invariance_$v.log
done
# The servers take chat requests whose byte-level prompts exceed the tiny model's 512 positions: serve a
# linked copy of the folder whose config allows 2048 (RoPE and every cache are position-general).
M=$R/tiny2048; rm -rf $M; mkdir -p $M
for f in $G/fp32/*; do [ "$(basename $f)" = config.json ] || ln -s $f $M/; done
python3 - $G/fp32/config.json $M/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for d in (c, c.get("text_config", {}), c.get("golden", {}).get("text_config_used", {})):
    if "max_position_embeddings" in d:
        d["max_position_embeddings"] = 2048
json.dump(c, open(sys.argv[2], "w"))
PY
serve() {  # name device extra...
  local name=$1 dev=$2; shift 2
  rm -f $R/$name.port
  $B/tessera serve --model $M --device $dev --port 0 --port-file $R/$name.port "$@" > $R/serve_$name.log 2>&1 &
  for i in $(seq 1 120); do [ -s $R/$name.port ] && break; sleep 0.5; done
  echo "http://127.0.0.1:$(cat $R/$name.port)"
}
CPU=$(serve cpu cpu --draft none); GPU=$(serve gpu $GD --draft lookup --draft-k 3)
echo "servers: cpu $CPU gpu $GPU"
Q=${REQUESTS:-verify/harness/requests/default.jsonl}
SECONDS=0
timeout ${ENGINES_TIMEOUT:-200} $B/tessera verify engines --a $CPU --b $GPU --requests $Q --b-extra '{"draft": false}' > $R/engines_cpu_gpu.log 2>&1
echo "verify engines CPU vs GPU rc=$? ${SECONDS}s: $(grep -E 'replies equal' $R/engines_cpu_gpu.log | tail -1)"
SECONDS=0
timeout ${ENGINES_TIMEOUT:-200} $B/tessera verify engines --a $GPU --b $GPU --requests $Q --b-extra '{"draft": false}' > $R/engines_drafted.log 2>&1
echo "verify engines GPU drafted vs serial rc=$? ${SECONDS}s: $(grep -E 'replies equal' $R/engines_drafted.log | tail -1)"
curl -s $GPU/metrics | grep -E "^(vllm:)?spec_decode_num_(draft|accepted)_tokens_total" | head -4
[ "${SOAK_MINUTES:-1}" = 0 ] || {
SECONDS=0
timeout 150 $B/tessera verify soak --url $GPU --minutes ${SOAK_MINUTES:-1} > $R/soak.log 2>&1
echo "verify soak (GPU server) rc=$? ${SECONDS}s"; tail -12 $R/soak.log
}
kill %1 %2 2>/dev/null; wait 2>/dev/null

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""HTTP benchmark of `tessera serve`: time to first token (TTFT), per-stream decode tok/s and aggregate
tok/s at 1/4/16/64 concurrent streams (stdlib only).

Every request streams a chat completion with a fixed reply length (ignore_eos, greedy) so all levels
generate the same token counts. TTFT = request sent → first chunk carrying reply text; per-stream tok/s =
(completion_tokens − 1) / (last chunk − first text chunk); aggregate tok/s = all completion tokens / wall
time of the level. Starts its own server (`--exe build/tessera`, extra server flags after `--`) or uses a
running one (`--url http://127.0.0.1:8000`).

`--response-format json_schema|json_object` constrains every request (json_schema: an object whose one
required property is a long string, so replies run to max_tokens); the mask cost per constrained token is
read from the server's /metrics (tessera:grammar_mask_seconds_total / tessera:grammar_masks_total over
the level). A constrained reply that completes its value stops early, so its token count can be smaller.

  python3 bench/server/bench_http.py --exe build/tessera -- --model stub --max-batch 64
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse


def one_stream(host, port, body):
    c = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    first = last = None
    usage = None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                continue
            obj = json.loads(data)
            now = time.perf_counter()
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices", []):
                d = ch.get("delta", {})
                if d.get("content") or d.get("reasoning_content"):
                    first = first or now
                    last = now
    c.close()
    return {"ttft": (first or time.perf_counter()) - t0, "decode_s": (last - first) if first else 0.0,
            "tokens": usage["completion_tokens"] if usage else 0}


STORY_SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"],
                "additionalProperties": False}


def grammar_counters(host, port):
    """(masks, seconds) from /metrics; (0, 0) when the server has no such series."""
    c = http.client.HTTPConnection(host, port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    vals = {}
    for line in text.splitlines():
        for name in ("tessera:grammar_masks_total", "tessera:grammar_mask_seconds_total"):
            if line.startswith(name + "{"):
                vals[name] = float(line.split()[-1])
    return vals.get("tessera:grammar_masks_total", 0.0), vals.get("tessera:grammar_mask_seconds_total", 0.0)


def run_level(host, port, streams, requests_per_stream, max_tokens, response_format=None):
    results, errors = [], []
    lock = threading.Lock()
    masks0, mask_s0 = grammar_counters(host, port)

    def worker(i):
        for j in range(requests_per_stream):
            body = {"messages": [{"role": "user", "content": f"benchmark stream {i} request {j}: tell a long story"}],
                    "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}, "thinking": {"type": "disabled"}}
            if response_format == "json_schema":
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "story", "schema": STORY_SCHEMA}}
            elif response_format == "json_object":
                body["response_format"] = {"type": "json_object"}
            try:
                r = one_stream(host, port, body)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft"] for r in results)
    per_stream = [(r["tokens"] - 1) / r["decode_s"] for r in results if r["decode_s"] > 0]
    total = sum(r["tokens"] for r in results)
    masks1, mask_s1 = grammar_counters(host, port)
    masks = masks1 - masks0
    return {"streams": streams, "requests": len(results), "errors": len(errors), "response_format": response_format or "text",
            "ttft_p50_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
            "ttft_p90_ms": 1e3 * ttfts[min(len(ttfts) - 1, round(0.9 * (len(ttfts) - 1)))] if ttfts else None,
            "per_stream_tok_s": statistics.median(per_stream) if per_stream else None,
            "aggregate_tok_s": total / wall, "wall_s": wall, "tokens": total,
            "masks": int(masks), "mask_us_per_token": 1e6 * (mask_s1 - mask_s0) / masks if masks else None,
            "error_sample": errors[:3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--exe", default="build/tessera", help="tessera binary to start when --url is not given")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--response-format", choices=["text", "json_object", "json_schema"], default="text",
                    help="constrain every request (mask cost per token from /metrics)")
    ap.add_argument("--label", default="", help="copied into every JSON line (e.g. the model and device)")
    ap.add_argument("--json", help="also write the results here (JSON lines)")
    ap.add_argument("server_args", nargs="*", help="flags for `tessera serve` (after --)")
    a = ap.parse_args()
    proc = None
    if a.url:
        u = urllib.parse.urlparse(a.url)
        host, port = u.hostname, u.port or 80
    else:
        tmp = tempfile.mkdtemp(prefix="tessera-bench-")
        pf = os.path.join(tmp, "port")
        proc = subprocess.Popen([a.exe, "serve", "--port", "0", "--port-file", pf] + a.server_args,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while not os.path.exists(pf):
            if proc.poll() is not None or time.time() > deadline:
                sys.exit("the server did not start")
            time.sleep(0.05)
        host, port = "127.0.0.1", int(open(pf).read())
    try:
        one_stream(host, port, {"messages": [{"role": "user", "content": "warm-up"}], "max_tokens": 4, "stream": True})
        rf = None if a.response_format == "text" else a.response_format
        print(f"{'streams':>7} {'reqs':>5} {'err':>4} {'TTFT p50 ms':>12} {'TTFT p90 ms':>12} {'tok/s/stream':>13} "
              f"{'aggregate tok/s':>16} {'tokens':>7} {'mask us/tok':>12}")
        for lv in [int(x) for x in a.levels.split(",")]:
            r = run_level(host, port, lv, a.requests_per_stream, a.max_tokens, rf)
            r["label"] = a.label
            fmt = lambda v, w: f"{v:>{w}.1f}" if v is not None else f"{'n/a':>{w}}"  # noqa: E731
            print(f"{r['streams']:>7} {r['requests']:>5} {r['errors']:>4} {fmt(r['ttft_p50_ms'], 12)} {fmt(r['ttft_p90_ms'], 12)} "
                  f"{fmt(r['per_stream_tok_s'], 13)} {fmt(r['aggregate_tok_s'], 16)} {r['tokens']:>7} {fmt(r['mask_us_per_token'], 12)}",
                  flush=True)
            if r["errors"]:
                print("   errors:", r["error_sample"], flush=True)
            if a.json:  # per level, so a run cut short keeps the levels it finished
                with open(a.json, "a") as f:
                    f.write(json.dumps(r) + "\n")
    finally:
        if proc:
            proc.terminate()  # drains; a server stuck in a long forward step is killed after 30 s
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

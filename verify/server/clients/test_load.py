# SPDX-License-Identifier: Apache-2.0
"""Bounded load test: 64 concurrent streaming clients send a fixed number of requests (greedy and seeded)
to `tessera serve` (16 slots); no errors, every reply identical to the same request run alone, all slots
free and /health idle afterwards. Usage: python3 test_load.py PATH/TO/tessera
"""
import http.client
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

EXE = harness.exe_from_argv()
CLIENTS = 64
REQUESTS_PER_CLIENT = 3
PROMPTS = [f"load prompt {i}: " + "lorem ipsum " * (i * 7) for i in range(8)]


def body(i):
    b = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "max_tokens": 48, "stream": True,
         "stream_options": {"include_usage": True}}
    if i % 2:
        b.update(temperature=0.9, seed=1000 + i % len(PROMPTS))
    else:
        b.update(temperature=0)
    return b


def stream_reply(port, b):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions", body=json.dumps(b), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise AssertionError(f"status {r.status}: {data[:300]!r}")
    events = harness.sse_events(data)
    assert events[-1] == "[DONE]"
    reasoning, content, finish, usage = "", "", None, None
    for e in events[:-1]:
        ch = json.loads(e)
        assert "error" not in ch, ch
        if ch.get("usage"):
            usage = ch["usage"]
        for c in ch["choices"]:
            reasoning += c["delta"].get("reasoning_content", "")
            content += c["delta"].get("content", "")
            finish = c["finish_reason"] or finish
    return reasoning, content, finish, usage["completion_tokens"]


def test_concurrent_streams_equal_solo(srv):
    keys = list(range(2 * len(PROMPTS)))
    solo = {k: stream_reply(srv.port, body(k)) for k in keys}
    srv.wait_idle()
    errors, results = [], []
    lock = threading.Lock()

    def client(cid):
        for j in range(REQUESTS_PER_CLIENT):
            k = (cid * REQUESTS_PER_CLIENT + j) % len(keys)
            try:
                got = stream_reply(srv.port, body(k))
                with lock:
                    results.append((k, got))
            except Exception as e:  # noqa: BLE001 - every failure is collected and reported
                with lock:
                    errors.append(f"client {cid} request {j}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "clients still running"
    assert not errors, errors[:5]
    assert len(results) == CLIENTS * REQUESTS_PER_CLIENT
    mismatched = [k for k, got in results if got != solo[k]]
    assert not mismatched, f"{len(mismatched)} replies differ from their solo run, e.g. key {mismatched[0]}"
    h = srv.wait_idle()
    assert h["slots_busy"] == 0 and h["queue"] == 0 and h["requests_running"] == 0
    print(f"   {len(results)} streamed replies, all equal to their solo runs; health: {h['status']}, "
          f"prefix-cache entries {h['prefix_cache_entries']}, cached tokens {h['cached_tokens_total']}")


if __name__ == "__main__":
    sys.exit(harness.run_tests(dict(globals()), lambda: harness.Server(EXE, "--max-batch", "16", "--prefill-chunk", "64", "--stub-step-delay-us", "300")))

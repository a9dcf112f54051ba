# SPDX-License-Identifier: Apache-2.0
"""Raw-HTTP tests of `tessera serve` (Python stdlib only): SSE framing and chunk shapes, keep-alive, a
robustness suite of bad requests (each → an OpenAI error object with the right 4xx, and the server keeps
serving), a seeded fuzz of request bodies (fixed count), client-disconnect cancellation, capacity
refusals (503 + Retry-After), an error event after the 200, and drain on SIGTERM.
Usage: python3 test_http_robustness.py PATH/TO/tessera
"""
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import http.client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

EXE = harness.exe_from_argv()
CHAT = "/v1/chat/completions"


def msgs(text="hi"):
    return [{"role": "user", "content": text}]


def assert_error(status, headers, body, want_status, what):
    assert status == want_status, f"{what}: status {status}, want {want_status}: {body[:300]!r}"
    assert headers.get("content-type", "").startswith("application/json"), f"{what}: content-type {headers.get('content-type')}"
    e = json.loads(body)["error"]
    assert isinstance(e["message"], str) and e["message"], what
    assert isinstance(e["type"], str) and "param" in e and "code" in e, what


def test_sse_framing_and_chunk_shapes(srv):
    s, h, b = srv.request("POST", CHAT, {"messages": msgs("[[tool]] x"), "stream": True, "max_tokens": 300,
                                         "stream_options": {"include_usage": True},
                                         "tools": [{"type": "function", "function": {"name": "get_weather"}}]})
    assert s == 200 and h["content-type"] == "text/event-stream"
    assert "access-control-allow-origin" not in h  # no CORS unless asked
    events = harness.sse_events(b)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(isinstance(c["created"], int) and c["model"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + usage["usage"]["completion_tokens"]
    assert all(c["usage"] is None for c in chunks[:-1])
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "tool_calls"
    tool_deltas = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert tool_deltas[0]["id"].startswith("call_") and tool_deltas[0]["type"] == "function"
    assert tool_deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert all(isinstance(t["index"], int) and "function" in t for t in tool_deltas)
    args = "".join(t["function"].get("arguments", "") for t in tool_deltas)
    assert json.loads(args) == {"location": "Beijing", "days": 3}
    text = "".join(json.dumps(c) for c in chunks)
    assert "DSML" not in text  # no markup leaks into any chunk


def test_keep_alive_connection(srv):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    for i in range(3):
        body = {"messages": msgs(f"keep {i}"), "max_tokens": 5, "stream": i == 1}
        c.request("POST", CHAT, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        assert r.status == 200, data
    c.request("GET", "/health")
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    c.close()


BAD_REQUESTS = [
    # (method, path, body, want status, what)
    ("POST", CHAT, "{not json", 400, "invalid JSON"),
    ("POST", CHAT, "", 400, "empty body"),
    ("POST", CHAT, "[1, 2]", 400, "array body"),
    ("POST", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "invalid UTF-8"),
    ("POST", CHAT, "[" * 5000 + "]" * 5000, 400, "deep nesting"),
    ("POST", CHAT, {"model": "tessera-stub-smoke-test"}, 400, "missing messages"),
    ("POST", CHAT, {"messages": []}, 400, "empty messages"),
    ("POST", CHAT, {"messages": [{"role": "pirate", "content": "arr"}]}, 400, "unknown role"),
    ("POST", CHAT, {"messages": [{"role": "user"}]}, 400, "missing content"),
    ("POST", CHAT, {"messages": [{"role": "user", "content": {"a": 1}}]}, 400, "content object"),
    ("POST", CHAT, {"messages": "hello"}, 400, "messages string"),
    ("POST", CHAT, {"messages": msgs(), "max_tokens": -1}, 400, "negative max_tokens"),
    ("POST", CHAT, {"messages": msgs(), "max_tokens": 10**15}, 400, "absurd max_tokens"),
    ("POST", CHAT, {"messages": msgs(), "max_tokens": "10"}, 400, "string max_tokens"),
    ("POST", CHAT, {"messages": msgs(), "temperature": -1}, 400, "negative temperature"),
    ("POST", CHAT, {"messages": msgs(), "temperature": 1e308 * 10}, 400, "infinite temperature"),
    ("POST", CHAT, {"messages": msgs(), "top_p": 0}, 400, "top_p 0"),
    ("POST", CHAT, {"messages": msgs(), "n": 3}, 400, "n 3"),
    ("POST", CHAT, {"messages": msgs(), "stop": [1, 2]}, 400, "stop ints"),
    ("POST", CHAT, {"messages": msgs(), "logprobs": "yes"}, 400, "logprobs string"),
    ("POST", CHAT, {"messages": msgs(), "top_logprobs": 50}, 400, "top_logprobs 50"),
    ("POST", CHAT, {"messages": msgs(), "stream": 1}, 400, "stream int"),
    ("POST", CHAT, {"messages": msgs(), "reasoning_effort": "turbo"}, 400, "unknown effort"),
    ("POST", CHAT, {"messages": msgs(), "reasoning_effort": 0}, 400, "effort 0"),
    ("POST", CHAT, {"messages": msgs(), "tools": "all"}, 400, "tools string"),
    ("POST", CHAT, {"messages": msgs(), "tool_choice": "sometimes"}, 400, "tool_choice unknown"),
    ("POST", CHAT, {"messages": msgs(), "response_format": {"type": "yaml"}}, 400, "response_format yaml"),
    ("POST", CHAT, {"messages": msgs(), "model": "gpt-9"}, 404, "unknown model"),
    ("POST", CHAT, {"messages": msgs("y" * 9000), "max_tokens": 4}, 400, "context overflow"),
    ("POST", CHAT, {"messages": msgs(), "max_tokens": 8190}, 400, "prompt + max_tokens over context"),
    ("POST", CHAT, {"messages": [{"role": "user", "content": "x"}] * 5000}, 400, "too many messages"),
    ("POST", "/v1/completions", {"prompt": [999999]}, 400, "token id outside vocabulary"),
    ("POST", "/v1/completions", {"prompt": []}, 400, "empty prompt"),
    ("POST", "/v1/completions", {"prompt": {"a": 1}}, 400, "prompt object"),
    ("POST", "/detokenize", {"tokens": [-1]}, 400, "negative token"),
    ("POST", "/tokenize", {"nothing": 1}, 400, "tokenize without prompt"),
    ("GET", "/v1/nope", None, 404, "unknown path"),
    ("GET", CHAT, None, 405, "GET on chat"),
    ("DELETE", "/v1/models", None, 405, "DELETE models"),
]


def test_bad_requests_get_openai_errors(srv):
    for method, path, body, want, what in BAD_REQUESTS:
        s, h, b = srv.request(method, path, body)
        assert_error(s, h, b, want, what)
        if what == "context overflow":
            assert json.loads(b)["error"]["code"] == "context_length_exceeded"
        assert srv.health()["status"] == "ok", f"server unhealthy after {what}"
    s, _, b = srv.request("POST", CHAT, {"messages": msgs(), "max_tokens": 3})
    assert s == 200, b


def raw_exchange(port, data: bytes, timeout=5):
    sk = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sk.sendall(data)
    out = b""
    try:
        while True:
            chunk = sk.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    sk.close()
    return out


def test_malformed_http(srv):
    out = raw_exchange(srv.port, b"THIS IS NOT HTTP\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400"), out[:100]
    out = raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431"), out[:100]
    # A body over the 8 MiB limit is refused from its Content-Length, before it is read.
    out = raw_exchange(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 9437184\r\n\r\n{\"messages\": [")
    assert out.startswith(b"HTTP/1.1 413"), out[:100]
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_too_large"
    out = raw_exchange(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mess", timeout=0.5)
    assert out == b"" or out.startswith(b"HTTP/1.1 4"), out[:100]
    assert srv.health()["status"] == "ok"


def mutate(rng, value, depth=0):
    """A random structural mutation of a JSON value."""
    pool = [None, True, False, 0, -1, 1.5, 10**20, -10**20, "", "x" * rng.randint(0, 50), "\u0000\ud7ff", [], {}, [1, "a"], {"k": None}]
    r = rng.random()
    if isinstance(value, dict) and value and r < 0.6 and depth < 4:
        v = dict(value)
        k = rng.choice(list(v))
        if rng.random() < 0.2:
            del v[k]
        else:
            v[k] = mutate(rng, v[k], depth + 1)
        if rng.random() < 0.1:
            v[rng.choice(["n", "stop", "seed", "top_k", "logprobs", "tools", "tool_choice", "response_format", "thinking"])] = rng.choice(pool)
        return v
    if isinstance(value, list) and value and r < 0.6 and depth < 4:
        v = list(value)
        i = rng.randrange(len(v))
        v[i] = mutate(rng, v[i], depth + 1)
        return v
    return rng.choice(pool)


def test_seeded_fuzz(srv):
    rng = random.Random(20261202)
    base = {"model": "tessera-stub-smoke-test", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "fuzz"}],
            "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "stop": ["zz"], "stream": False, "seed": 3,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "response_format": {"type": "json_object"}, "stream_options": {"include_usage": True}}
    statuses = {}
    for i in range(300):
        body = mutate(rng, base)
        if isinstance(body, dict) and isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 64:
            body["max_tokens"] = 64  # keep the run short; range errors are covered above
        raw = json.dumps(body) if rng.random() < 0.9 else json.dumps(body)[: rng.randint(0, 40)]
        s, h, b = srv.request("POST", CHAT, raw)
        statuses[s] = statuses.get(s, 0) + 1
        assert s in (200, 400, 404), f"fuzz case {i}: status {s} for {raw[:200]}"
        if s != 200:
            assert_error(s, h, b, s, f"fuzz case {i}")
        elif isinstance(body, dict) and body.get("stream") is True:
            assert harness.sse_events(b)[-1] == "[DONE]"
        else:
            assert json.loads(b)["object"] == "chat.completion"
    assert statuses.get(200, 0) > 10 and statuses.get(400, 0) > 10, statuses
    assert srv.health()["status"] == "ok"
    print("   fuzz statuses:", statuses)


def open_stream(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", CHAT, body=json.dumps(dict(body, stream=True)), headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def test_slow_server_disconnect_capacity_timeout(srv):
    # 2 ms per engine step: a 2000-token reply takes ~4 s; one slot, a queue of one, 0.3 s queue timeout.
    with harness.Server(EXE, "--stub-step-delay-us", "2000", "--max-batch", "1", "--max-queue", "1",
                        "--queue-timeout", "0.3", "--request-timeout", "1.5", "--drain-timeout", "5") as slow:
        long_req = {"messages": msgs("long"), "max_tokens": 2000, "ignore_eos": True}
        # 1. Disconnect: read a few chunks, drop the socket, the slot frees.
        c, r = open_stream(slow.port, long_req)
        assert r.status == 200
        r.read(20)
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        slow.wait_idle(3.0)
        # 2. Capacity: A runs, B waits then gets 503 (queue timeout), C gets 503 at once (queue full).
        c, r = open_stream(slow.port, long_req)
        assert r.status == 200
        res = {}
        tb = threading.Thread(target=lambda: res.setdefault("b", slow.request("POST", CHAT, {"messages": msgs("b"), "max_tokens": 4})))
        tb.start()
        time.sleep(0.1)
        sc, hc, bc = slow.request("POST", CHAT, {"messages": msgs("c"), "max_tokens": 4})
        assert_error(sc, hc, bc, 503, "queue full")
        assert int(hc["retry-after"]) > 0
        tb.join()
        sb, hb, bb = res["b"]
        assert_error(sb, hb, bb, 503, "queue timeout")
        assert "retry-after" in hb
        # 3. The running stream hits the 1.5 s request timeout: an error event after the 200, then [DONE].
        events = harness.sse_events(r.read())
        c.close()
        assert events[-1] == "[DONE]" and "error" in json.loads(events[-2]), events[-3:]
        slow.wait_idle(3.0)
        # 4. Drain: SIGTERM while a stream runs; new requests get 503, the stream finishes, exit code 0.
        c, r = open_stream(slow.port, {"messages": msgs("drain"), "max_tokens": 200, "ignore_eos": True})
        assert r.status == 200
        head = r.read(20)
        slow.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        s, h, b = slow.request("POST", CHAT, {"messages": msgs("late"), "max_tokens": 4})
        assert_error(s, h, b, 503, "request during drain")
        hs, _, hb = slow.request("GET", "/health")
        assert hs == 503 and json.loads(hb)["status"] == "draining"
        events = harness.sse_events(head + r.read())
        c.close()
        final = [json.loads(e) for e in events[:-1]][-1]
        assert final["choices"][0]["finish_reason"] == "length", final
        assert slow.proc.wait(timeout=10) == 0


def test_keepalive_comments_during_prefill(srv):
    # 3 ms per prompt token: a ~100-token prefill takes ~0.3 s, with a keep-alive comment every 50 ms.
    with harness.Server(EXE, "--stub-token-delay-us", "3000", "--keepalive", "0.05") as slow:
        c, r = open_stream(slow.port, {"messages": msgs("k" * 60), "max_tokens": 2})
        raw = r.read().decode()
        c.close()
        first_data = raw.index("data: ", raw.index("data: ") + 1)  # after the role chunk
        assert raw[:first_data].count(": keep-alive\n\n") >= 2, raw[:400]
        assert harness.sse_events(raw.encode())[-1] == "[DONE]"


def test_real_tokenizer_wiring(srv):
    # The DeepSeek BPE tokenizer behind /tokenize and /detokenize gives the Hugging Face reference ids
    # (texts with special-token spellings are left out: the server overlays the V4.1 special table on this
    # V3 file, so `<think>` and `｜…｜` tokens legitimately differ from the V3 reference).
    shared = os.environ.get("TESSERA_SHARED_DIR", os.path.join(os.path.dirname(__file__), "../../../../shared"))
    tok_dir = os.path.join(shared, "golden", "tokenizer")
    ref = json.load(open(os.path.join(tok_dir, "reference-encodings.json"), encoding="utf-8"))["cases"]
    with harness.Server(EXE, "--tokenizer", os.path.join(tok_dir, "deepseek-v3-tokenizer.json")) as real:
        checked = 0
        for case in ref:
            if not case["text"] or "think>" in case["text"] or "\uff5c" in case["text"]:
                continue
            s, _, b = real.request("POST", "/tokenize", {"prompt": case["text"]})
            assert s == 200 and json.loads(b)["tokens"] == case["ids"], case["text"][:60]
            s, _, b = real.request("POST", "/detokenize", {"tokens": case["ids"]})
            assert s == 200 and json.loads(b)["prompt"] == case["decoded"], case["text"][:60]
            checked += 1
        assert checked >= 60, checked
        s, _, b = real.request("POST", CHAT, {"messages": msgs("hello"), "max_tokens": 8, "ignore_eos": True})
        assert s == 200 and json.loads(b)["usage"]["completion_tokens"] == 8


def test_golden_tiny_model(srv):
    # The real DeepSeek-V4.1 tiny model (golden fixture weights) behind the engine: greedy replies to
    # token-id prompts are the same alone and under concurrency.
    shared = os.environ.get("TESSERA_SHARED_DIR", os.path.join(os.path.dirname(__file__), "../../../../shared"))
    with harness.Server(EXE, "--model", os.path.join(shared, "golden", "v41-tiny", "fp32"), scripts=False) as tiny:
        body = lambda i: {"prompt": [1, 2 + i, 3, 4, 5], "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        solo = [json.loads(tiny.request("POST", "/v1/completions", body(i))[2])["choices"][0]["token_ids"] for i in range(4)]
        assert all(len(x) == 6 for x in solo)
        out = [None] * 8
        ts = [threading.Thread(target=lambda k=k: out.__setitem__(k, json.loads(tiny.request("POST", "/v1/completions", body(k % 4))[2])))
              for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert [o["choices"][0]["token_ids"] for o in out] == [solo[k % 4] for k in range(8)]


def test_cors_only_when_asked(srv):
    _, h, _ = srv.request("GET", "/v1/models")
    assert "access-control-allow-origin" not in h, h
    s, _, _ = srv.request("OPTIONS", CHAT)
    assert s in (404, 405), s
    with harness.Server(EXE, "--cors") as cors:
        s, h, _ = cors.request("GET", "/v1/models")
        assert s == 200 and h.get("access-control-allow-origin") == "*", h
        s, h, _ = cors.request("OPTIONS", CHAT, headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"})
        assert s == 204 and "POST" in h.get("access-control-allow-methods", ""), (s, h)


def test_metrics_and_health(srv):
    s, _, b = srv.request("POST", CHAT, {"messages": msgs("json"), "max_tokens": 8, "response_format": {"type": "json_object"},
                                         "thinking": {"type": "disabled"}})
    assert s == 200, b
    s, h, b = srv.request("GET", "/metrics")
    text = b.decode()
    assert s == 200 and h["content-type"].startswith("text/plain")
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_sum",
                 "tessera:http_requests_total", "vllm:request_success_total"]:
        assert name in text, name
    gen = [l for l in text.splitlines() if l.startswith("vllm:generation_tokens_total{")]
    assert float(gen[0].split()[-1]) > 0
    series = {l.split("{")[0]: float(l.split()[-1]) for l in text.splitlines() if l.startswith("tessera:grammar_mask")}
    assert series["tessera:grammar_masks_total"] >= 1 and series["tessera:grammar_mask_seconds_total"] > 0, series
    hl = srv.health()
    for k in ["status", "slots_total", "slots_busy", "queue", "requests_running", "requests_total"]:
        assert k in hl, k


if __name__ == "__main__":
    sys.exit(harness.run_tests(dict(globals()), lambda: harness.Server(EXE)))

# SPDX-License-Identifier: Apache-2.0
"""Constrained decoding end to end on real DeepSeek-V4.1 weights whose config.json names no EOS (as the
embedded default's): the tiny golden model (byte-level stand-in tokenizer) and a make-synthetic tiny model
with the real 129,280-token vocabulary (golden/tokenizer fixture). Greedy and sampled requests with the
issue's json_schema (an optional string property), seeded random schemas and random tool sets (tool_choice
required / named) always get a 200 — never "every token is masked" — and every reply that finishes is valid:
content parses and validates against the schema, tool-call arguments against the tool's parameters.
Unsupported schema keywords are 400s before any token.
Usage: python3 test_constrained_tiny.py PATH/TO/tessera   (TESSERA_SHARED_DIR names the fixtures)
"""
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import schemas  # noqa: E402

EXE = harness.exe_from_argv()
SHARED = os.environ.get("TESSERA_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared"))
GOLDEN_TINY = os.path.join(SHARED, "golden", "v41-tiny", "fp32")
TOKENIZER = os.path.join(SHARED, "golden", "tokenizer", "deepseek-v3-tokenizer.json")
ENGRAM = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "engram_hash_data.py")
ISSUE_SCHEMA = {"type": "object", "properties": {"zz": {"type": "string"}}}
NO_THINK = {"thinking": {"type": "disabled"}}


def real_vocab_model(folder):
    """make-synthetic tiny at the V4.1 vocabulary + the tokenizer fixture + Engram hash data.

    The V3 fixture's table ends at id 128814 (the server overlays the V4.1 table up to 129279 at load); the
    Engram token map must cover all 129,280 ids, so it is computed from a copy whose missing ids are
    distinct placeholder tokens. For random weights only the map's size matters."""
    subprocess.run([EXE, "make-synthetic", "--out", folder, "--preset", "tiny", "--vocab-size", "129280", "--seed", "0"],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.copy(TOKENIZER, os.path.join(folder, "tokenizer.json"))
    with open(TOKENIZER, encoding="utf-8") as f:
        tok = json.load(f)
    top = max(a["id"] for a in tok["added_tokens"])
    tok["added_tokens"] += [{"id": i, "content": f"<|tessera_test_placeholder_{i}|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for i in range(top + 1, 129280)]
    padded = os.path.join(os.path.dirname(folder), "engram-tokenizer.json")
    with open(padded, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    subprocess.run([sys.executable, ENGRAM, folder, "--tokenizer", padded, "--set-compressed-vocab"], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f).get("eos_token_id") is None, "the model must not name an EOS (the bug's precondition)"
    return folder


def chat(srv, body, timeout=300):
    s, _, b = srv.request("POST", "/v1/chat/completions", body, timeout=timeout)
    return s, json.loads(b)


def json_schema(schema, name="x"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def check_json_reply(srv, schema, **kw):
    """One constrained request → finish_reason; asserts 200 and, when finished, a valid value."""
    body = {"messages": [{"role": "user", "content": "Fill the schema."}], "response_format": json_schema(schema), **kw}
    status, r = chat(srv, body)
    assert status == 200, f"{status} {r} for schema {json.dumps(schema)}"
    choice = r["choices"][0]
    if choice["finish_reason"] == "stop":
        text = choice["message"]["content"]
        value = json.loads(text)
        err = schemas.validate(value, schema)
        assert not err, f"{err}: {text!r} for schema {json.dumps(schema)}"
    else:
        assert choice["finish_reason"] == "length", choice
    return choice["finish_reason"]


def parallel(fn, jobs, workers=8):
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, jobs))


def test_issue_request(srv):
    # The request of the bug report: greedy, thinking off, no max_tokens (up to the context).
    finishes = [check_json_reply(srv, ISSUE_SCHEMA, temperature=0, **NO_THINK)]
    finishes += parallel(lambda seed: check_json_reply(srv, ISSUE_SCHEMA, temperature=1, seed=seed, **NO_THINK), range(6))
    # Thinking on: free reasoning up to </think> first; a short budget ends in "length" or a valid value.
    check_json_reply(srv, ISSUE_SCHEMA, temperature=0, max_tokens=48)
    assert "stop" in finishes, f"no reply reached complete JSON and EOS: {finishes}"


def test_issue_request_streamed_equals_plain(srv):
    body = {"messages": [{"role": "user", "content": "Fill the schema."}], "response_format": json_schema(ISSUE_SCHEMA),
            "temperature": 0, "max_tokens": 64, **NO_THINK}
    status, plain = chat(srv, body)
    assert status == 200, plain
    s, _, raw = srv.request("POST", "/v1/chat/completions", dict(body, stream=True), timeout=300)
    assert s == 200
    events = harness.sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks), chunks
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == plain["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]


def test_small_schemas(srv):
    # Values that complete in a few tokens: the accepting state (EOS only, or EOS and whitespace) is
    # reached in every reply, which is where the missing EOS emptied the mask.
    small = [{"type": "boolean"}, {"enum": ["a", "b", 3]}, {"type": "null"}, {"const": "x"},
             {"type": "object", "additionalProperties": False}, {"type": "integer", "minimum": 0, "maximum": 9},
             {"type": "array", "maxItems": 0}]
    jobs = [(s, t) for s in small for t in (0, 1)]
    finishes = parallel(lambda j: check_json_reply(srv, j[0], temperature=j[1], seed=7, max_tokens=60, **NO_THINK), jobs)
    assert finishes.count("stop") == len(finishes), finishes


def test_fuzzed_schemas(srv):
    rng = random.Random(424242)
    jobs = []
    for i in range(24):
        gen = schemas.SchemaGen(rng)
        jobs.append((gen.root(1 + i % 3), i % 2, 1000 + i))
    finishes = parallel(lambda j: check_json_reply(srv, j[0], temperature=j[1], seed=j[2], max_tokens=200, **NO_THINK), jobs)
    print(f"     fuzzed schemas: {finishes.count('stop')} complete, {finishes.count('length')} cut at max_tokens")
    assert finishes.count("stop") >= len(finishes) // 3, finishes


def check_tool_reply(srv, tools, choice, parallel_calls, temperature, seed):
    body = {"messages": [{"role": "user", "content": "Use a tool."}], "tools": tools, "tool_choice": choice,
            "parallel_tool_calls": parallel_calls, "temperature": temperature, "seed": seed, **NO_THINK}  # up to the context
    status, r = chat(srv, body)
    assert status == 200, f"{status} {r} for tools {json.dumps(tools)}"
    c = r["choices"][0]
    if c["finish_reason"] == "length":
        return "length"
    assert c["finish_reason"] == "tool_calls", c
    calls = c["message"]["tool_calls"]
    assert calls and (parallel_calls or len(calls) == 1), calls
    params = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    for call in calls:
        name = call["function"]["name"]
        assert name in params, name
        if isinstance(choice, dict):
            assert name == choice["function"]["name"]
        args = json.loads(call["function"]["arguments"])
        assert isinstance(args, dict)
        if params[name] is None:
            assert args == {}, args
        else:
            err = schemas.validate(args, params[name])
            assert not err, f"{err}: {args} for {json.dumps(params[name])}"
    assert not c["message"].get("content"), c["message"]  # markup never leaks into content
    return "tool_calls"


def test_fuzzed_tool_calls(srv):
    rng = random.Random(515151)
    jobs = []
    for i in range(12):
        gen = schemas.SchemaGen(rng, dsml_keys=True)
        names = rng.sample(["get_weather", "search", "lookup", "t0"], 1 + i % 2)
        tools = [{"type": "function", "function": {"name": n, **({"parameters": gen.object_root(1)} if rng.random() < 0.85 else {})}}
                 for n in names]
        choice = "required" if i % 2 == 0 else {"type": "function", "function": {"name": rng.choice(names)}}
        jobs.append((tools, choice, i % 3 != 0, i % 2, 2000 + i))
    finishes = parallel(lambda j: check_tool_reply(srv, *j), jobs)
    print(f"     fuzzed tools: {finishes.count('tool_calls')} complete calls, {finishes.count('length')} cut at max_tokens")
    # Raw string parameters end only on the model spelling `</｜DSML｜ parameter>`, which random weights seldom
    # do within the context; the seeded set below completes 4 of 12 (deterministic: replies are a function
    # of seed, prompt and position).
    assert finishes.count("tool_calls") >= 2, finishes


def test_unsupported_schemas_are_400(srv):
    for schema, kw in [({"type": "string", "pattern": "^a"}, "pattern"),
                       ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}, "uniqueItems"),
                       ({"type": "integer", "minimum": 5, "maximum": 4}, "admits no integer")]:
        status, r = chat(srv, {"messages": [{"role": "user", "content": "x"}], "response_format": json_schema(schema)})
        assert status == 400, r
        assert kw in r["error"]["message"] and r["error"]["param"] == "response_format.json_schema.schema", r
    tools = [{"type": "function", "function": {"name": "t", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"required": ["a"]}]}}}]
    status, r = chat(srv, {"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": "required"})
    assert status == 400 and "anyOf" in r["error"]["message"] and r["error"]["param"] == "tools", r
    srv.wait_idle()


def main():
    if not os.path.isdir(GOLDEN_TINY) or not os.path.isfile(TOKENIZER):
        print(f"golden fixtures not found under {SHARED}; skipping")
        return 77
    rc = 0
    tmp = tempfile.mkdtemp(prefix="tessera-constrained-")
    try:
        every = {k: v for k, v in globals().items() if k.startswith("test_")}
        # Fuzzed schemas and tool sets overflow the golden model's 512 positions at one byte per token.
        short = {k: v for k, v in every.items() if not k.startswith("test_fuzzed_")}
        models = [("golden tiny (byte-level stand-in tokenizer)", GOLDEN_TINY, short),
                  ("synthetic tiny, DeepSeek vocabulary", real_vocab_model(os.path.join(tmp, "tiny")), every)]
        for label, folder, tests in models:
            print(f"== {label}: {folder}")
            rc |= harness.run_tests(tests, lambda folder=folder: harness.Server(EXE, "--model", folder, "--max-batch", "8",
                                                                                  scripts=False))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())

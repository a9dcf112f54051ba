# SPDX-License-Identifier: Apache-2.0
"""Conformance with the official `openai` Python SDK (spec/chat-format.md §5.3) against `tessera serve`
on the stub model: plain and streamed chat, the `.stream()` accumulator, reasoning on/off, tool calls
(streamed and not, parallel off), a tool loop sending reasoning back, json_schema, stop strings, logprobs,
usage, seeds, completions, token ids, and the errors the SDK maps to exception classes.
Usage: python3 test_openai_sdk.py PATH/TO/tessera
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

try:
    import openai
except ImportError:
    print("the openai package is not installed (scripts/install_deps.sh installs it); skipping")
    sys.exit(77)

EXE = harness.exe_from_argv()
MODEL = "tessera-stub-smoke-test"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                      "parameters": {"type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}},
                                                     "required": ["location"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}},
]


def client(srv, **kw):
    kw.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=srv.base, api_key=kw.pop("api_key", "sk-test"), **kw)


def user(text):
    return [{"role": "user", "content": text}]


def collect_stream(stream):
    """Raw chunks → (reasoning, content, tool calls by index, finish_reason, usage, chunks)."""
    reasoning, content, calls, finish, usage, chunks = "", "", {}, None, None, []
    for ch in stream:
        chunks.append(ch)
        assert ch.object == "chat.completion.chunk"
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            assert c.index == 0
            d = c.delta
            extra = d.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
            content += d.content or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                assert tc.function is not None, "every tool-call delta carries a function object"
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
            if c.finish_reason:
                finish = c.finish_reason
    assert len({ch.id for ch in chunks}) == 1, "every chunk has the same id"
    assert chunks[0].choices[0].delta.role == "assistant", "the first chunk carries the role"
    return reasoning, content, calls, finish, usage, chunks


def test_models(srv):
    ids = [m.id for m in client(srv).models.list()]
    assert MODEL in ids, ids


def test_plain_and_streamed_equal(srv):
    c = client(srv)
    kw = dict(model=MODEL, messages=user("Say something."), max_tokens=40, temperature=0, extra_body={"thinking": {"type": "disabled"}})
    r = c.chat.completions.create(**kw)
    ch = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert ch.message.role == "assistant" and isinstance(ch.message.content, str)
    assert ch.finish_reason in ("stop", "length")
    u = r.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens and u.completion_tokens >= 1
    reasoning, content, calls, finish, usage, _ = collect_stream(c.chat.completions.create(stream=True, **kw))
    assert content == ch.message.content, (content, ch.message.content)
    assert finish == ch.finish_reason and reasoning == "" and not calls and usage is None


def test_include_usage_last(srv):
    s = client(srv).chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    *_, usage, chunks = collect_stream(s)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert usage.completion_tokens == 8 and usage.total_tokens == usage.prompt_tokens + 8


def test_reasoning_on_off(srv):
    c = client(srv)
    r = c.chat.completions.create(model=MODEL, messages=user("[[think]] What is 17*23?"), max_tokens=100)
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] == "Let me think about it.", m
    assert m.content == "The answer is 391." and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens_details.reasoning_tokens > 0
    reasoning, content, *_ = collect_stream(c.chat.completions.create(model=MODEL, messages=user("[[think]] again"), max_tokens=100, stream=True))
    assert (reasoning, content) == ("Let me think about it.", "The answer is 391.")
    # The .stream() wrapper accumulates reasoning_content by concatenation.
    with c.chat.completions.stream(model=MODEL, messages=user("[[think]] wrapped"), max_tokens=100) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == "The answer is 391."
    # Thinking off: the prompt ends in </think>; no reasoning_content key; the stray </think> is swallowed.
    off = c.chat.completions.create(model=MODEL, messages=user("[[think]] off"), max_tokens=100, reasoning_effort="none")
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})
    assert off.choices[0].message.content == "Let me think about it.The answer is 391."


def test_reasoning_field_alias(srv):
    # --reasoning-field: the reasoning text also as `reasoning` (message and deltas); off by default.
    plain = client(srv).chat.completions.create(model=MODEL, messages=user("[[think]] alias off"), max_tokens=100)
    assert "reasoning" not in (plain.choices[0].message.model_extra or {})
    with harness.Server(EXE, "--reasoning-field") as aliased:
        c = client(aliased)
        m = c.chat.completions.create(model=MODEL, messages=user("[[think]] alias"), max_tokens=100).choices[0].message
        assert m.model_extra["reasoning"] == m.model_extra["reasoning_content"] == "Let me think about it.", m
        streamed = ""
        for ch in c.chat.completions.create(model=MODEL, messages=user("[[think]] alias stream"), max_tokens=100, stream=True):
            for choice in ch.choices:
                extra = choice.delta.model_extra or {}
                assert extra.get("reasoning") == extra.get("reasoning_content"), extra
                streamed += extra.get("reasoning") or ""
        assert streamed == "Let me think about it."


def test_tool_calls_non_streamed(srv):
    r = client(srv).chat.completions.create(model=MODEL, messages=user("[[tool]] weather in Beijing?"), tools=TOOLS, max_tokens=300)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content == "Checking."
    assert ch.message.model_extra["reasoning_content"] == "I should call get_weather."
    (tc,) = ch.message.tool_calls
    assert tc.id.startswith("call_") and tc.type == "function" and tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"location": "Beijing", "days": 3}


def test_tool_calls_streamed(srv):
    c = client(srv)
    reasoning, content, calls, finish, *_ = collect_stream(
        c.chat.completions.create(model=MODEL, messages=user("[[tool]] stream"), tools=TOOLS, max_tokens=300, stream=True))
    assert finish == "tool_calls" and content == "Checking." and reasoning == "I should call get_weather."
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"location": "Beijing", "days": 3}
    with c.chat.completions.stream(model=MODEL, messages=user("[[tool2]] both"), tools=TOOLS, max_tokens=300) as s:
        final = s.get_final_completion()
    tcs = final.choices[0].message.tool_calls
    assert [t.function.name for t in tcs] == ["get_weather", "get_time"]
    assert [json.loads(t.function.arguments) for t in tcs] == [{"location": "Paris"}, {"tz": "CET"}]


def test_parallel_tool_calls_off(srv):
    r = client(srv).chat.completions.create(model=MODEL, messages=user("[[tool2]] one only"), tools=TOOLS, max_tokens=300,
                                            parallel_tool_calls=False)
    assert [t.function.name for t in r.choices[0].message.tool_calls] == ["get_weather"]


def test_tool_loop_sends_reasoning_back(srv):
    c = client(srv)
    first = c.chat.completions.create(model=MODEL, messages=user("[[tool]] loop"), tools=TOOLS, max_tokens=300)
    m = first.choices[0].message
    history = user("[[tool]] loop") + [
        {"role": "assistant", "content": m.content, "reasoning_content": m.model_extra["reasoning_content"],
         "tool_calls": [t.model_dump() for t in m.tool_calls]},
        {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "{\"temperature\": 22}"},
        {"role": "user", "content": "[[think]] and now?"},
    ]
    r = c.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=100)
    assert r.choices[0].message.content == "The answer is 391."


def test_json_schema(srv):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    r = client(srv).chat.completions.create(model=MODEL, messages=user("[[json]] who?"), response_format=rf, max_tokens=100)
    assert json.loads(r.choices[0].message.content) == {"name": "Ada", "age": 36}
    # The schema is injected into the prompt as DeepSeek's "## Response Format" section.
    s, _, b = srv.request("POST", "/tokenize", {"messages": user("who?"), "response_format": rf})
    s2, _, b2 = srv.request("POST", "/detokenize", {"tokens": json.loads(b)["tokens"]})
    assert s == 200 and s2 == 200
    text = json.loads(b2)["prompt"]
    assert "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{\"type\": \"object\"" in text, text


def test_grammar_constrains_unscripted_replies(srv):
    # No script: the stub's random logits are masked by the grammar, so the reply must still match.
    c = client(srv)
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}, "n": {"type": "boolean"}},
              "required": ["colour", "n"], "additionalProperties": False}
    for seed in range(3):
        r = c.chat.completions.create(model=MODEL, messages=user(f"pick {seed}"), max_tokens=200, seed=seed,
                                      response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
                                      extra_body={"thinking": {"type": "disabled"}})
        v = json.loads(r.choices[0].message.content)
        assert r.choices[0].finish_reason == "stop" and v["colour"] in ("red", "green") and isinstance(v["n"], bool), v
    unit_tools = [{"type": "function", "function": {"name": "set_unit", "parameters": {
                      "type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}}},
                  {"type": "function", "function": {"name": "toggle", "parameters": {
                      "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}]
    named = c.chat.completions.create(model=MODEL, messages=user("units"), tools=unit_tools, max_tokens=300, temperature=0,
                                      tool_choice={"type": "function", "function": {"name": "set_unit"}},
                                      extra_body={"thinking": {"type": "disabled"}})
    (tc,) = named.choices[0].message.tool_calls
    assert named.choices[0].finish_reason == "tool_calls" and tc.function.name == "set_unit"
    assert json.loads(tc.function.arguments)["unit"] in ("c", "f")
    _, _, calls, finish, *_ = collect_stream(c.chat.completions.create(
        model=MODEL, messages=user("any tool"), tools=unit_tools, max_tokens=300, temperature=0, tool_choice="required",
        parallel_tool_calls=False, stream=True, extra_body={"thinking": {"type": "disabled"}}))
    assert finish == "tool_calls" and len(calls) == 1 and calls[0]["name"] in ("set_unit", "toggle")
    json.loads(calls[0]["arguments"])
    try:
        c.chat.completions.create(model=MODEL, messages=user("x"), max_tokens=5,
                                  response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}})
        raise AssertionError("an invalid schema must be a 400")
    except openai.BadRequestError as e:
        assert e.param == "response_format.json_schema.schema", e.body


def test_stop_strings(srv):
    c = client(srv)
    r = c.chat.completions.create(model=MODEL, messages=user("[[stop]]"), stop=["STOP"], max_tokens=100)
    assert r.choices[0].message.content == "alpha beta " and r.choices[0].finish_reason == "stop"
    _, content, _, finish, *_ = collect_stream(c.chat.completions.create(model=MODEL, messages=user("[[stop]]"), stop="STOP",
                                                                        max_tokens=100, stream=True))
    assert (content, finish) == ("alpha beta ", "stop")
    r2 = c.chat.completions.create(model=MODEL, messages=user("[[stop]]"), stop=["nothing-matches"], max_tokens=100)
    assert r2.choices[0].message.content == "alpha beta STOP gamma delta"


def test_utf8_across_tokens(srv):
    _, content, *_ = collect_stream(client(srv).chat.completions.create(model=MODEL, messages=user("[[utf8]]"), max_tokens=100, stream=True))
    assert content == "héllo 北京 😀 done"


def test_logprobs(srv):
    r = client(srv).chat.completions.create(model=MODEL, messages=user("lp"), max_tokens=12, temperature=0, logprobs=True,
                                            top_logprobs=3, extra_body={"ignore_eos": True, "thinking": {"type": "disabled"}})
    lp = r.choices[0].logprobs.content
    assert len(lp) == 12 == r.usage.completion_tokens
    for e in lp:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6  # greedy = argmax
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
    assert "".join(e.token for e in lp if e.token != "<｜end▁of▁sentence｜>") == r.choices[0].message.content


def test_seed_and_token_ids(srv):
    c = client(srv)
    kw = dict(model=MODEL, messages=user("seeded"), max_tokens=30, temperature=1.0, seed=1234,
              extra_body={"return_token_ids": True, "ignore_eos": True})
    a, b = c.chat.completions.create(**kw), c.chat.completions.create(**kw)
    ia, ib = a.choices[0].model_extra["token_ids"], b.choices[0].model_extra["token_ids"]
    assert ia == ib and len(ia) == 30
    other = c.chat.completions.create(**dict(kw, seed=4321)).choices[0].model_extra["token_ids"]
    assert other != ia
    assert a.usage.prompt_tokens_details.cached_tokens == 0 or b.usage.prompt_tokens_details.cached_tokens > 0
    assert b.usage.prompt_tokens_details.cached_tokens == a.usage.prompt_tokens - 1  # prefix cache hit


def test_length_finish(srv):
    r = client(srv).chat.completions.create(model=MODEL, messages=user("long"), max_completion_tokens=5, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5


def test_completions(srv):
    c = client(srv)
    r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 10
    ids = [ord(ch) for ch in "Once upon a time"]
    r2 = c.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    assert r2.choices[0].text == r.choices[0].text  # text and token-id prompts agree (byte-level stub codec)
    text = "".join(ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0, stream=True,
                                                                      extra_body={"ignore_eos": True}) if ch.choices)
    assert text == r.choices[0].text
    lp = c.completions.create(model=MODEL, prompt="x", max_tokens=4, logprobs=2, extra_body={"ignore_eos": True}).choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.top_logprobs[0]) == 2


def test_errors_map_to_sdk_exceptions(srv):
    c = client(srv)
    for kw, exc, status in [
        (dict(n=2), openai.BadRequestError, 400),
        (dict(model="no-such-model"), openai.NotFoundError, 404),
        (dict(temperature=7), openai.BadRequestError, 400),
        (dict(max_tokens=10_000_000), openai.BadRequestError, 400),
    ]:
        args = dict(model=MODEL, messages=user("x"), max_tokens=4)
        args.update(kw)
        try:
            c.chat.completions.create(**args)
        except exc as e:
            assert e.status_code == status and e.body.get("message"), e
        else:
            raise AssertionError(f"{kw} should raise {exc.__name__}")
    try:
        c.chat.completions.create(model=MODEL, messages=user("x" * 9000), max_tokens=4)
    except openai.BadRequestError as e:
        assert e.code == "context_length_exceeded", e.body
    else:
        raise AssertionError("context overflow should be a 400")


def test_api_keys(srv):
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
        f.write("# keys\nalice: sk-alice-0123456789\nsk-bob-9876543210\n")
    os.chmod(f.name, 0o600)
    try:
        with harness.Server(EXE, "--api-key-file", f.name) as keyed:
            ok = client(keyed, api_key="sk-bob-9876543210").chat.completions.create(model=MODEL, messages=user("k"), max_tokens=3)
            assert ok.choices[0].message is not None
            client(keyed, api_key="sk-alice-0123456789").models.list()
            try:
                client(keyed, api_key="sk-wrong-000000000").models.list()
                raise AssertionError("a wrong key must be refused")
            except openai.AuthenticationError as e:
                assert e.status_code == 401
            s, h, _ = keyed.request("GET", "/v1/models")
            assert s == 401 and h.get("www-authenticate") == "Bearer"
            s, _, b = keyed.request("GET", "/health")  # /health stays open (reduced body)
            assert s == 200 and json.loads(b) == {"status": "ok"}
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    sys.exit(harness.run_tests(dict(globals()), lambda: harness.Server(EXE)))

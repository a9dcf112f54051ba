# SPDX-License-Identifier: Apache-2.0
"""Writes drafting.jsonl: the request set of the drafted == serial gate over HTTP.

    python3 verify/harness/requests/make_drafting.py [OUT]      (default: drafting.jsonl next to this file)

Run it against one server with drafting on, once drafted and once with "draft": false:

    tessera verify engines --a URL --b URL --requests drafting.jsonl --b-extra '{"draft": false}'

Every reply must be equal. The set mixes greedy and seeded T > 0 requests (top-p, top-k, min-p and
penalties on some), thinking on and off, tool calls (auto and required, with tool results and a
follow-up turn), multi-turn conversations, json_schema and json_object replies, stop strings, streamed
chat and completions, and long prompts built from repeated phrases, so a prompt-lookup drafter has
n-grams to copy. The output is deterministic (seeded); edit the generator, not the file.
Replies are at most 40 tokens so the CPU tiny model answers the whole set in well under a minute.
"""
import json
import os
import random
import sys

SEED = 20261203
TOPICS = ["the sea", "a lighthouse", "winter", "a red bicycle", "tea", "the moon", "bread", "a library",
          "a river", "rain", "a clock", "mountains", "a garden", "a train station", "an old map", "bees"]
PHRASES = ["the quick brown fox jumps over the lazy dog", "one two three four five six seven",
           "to be or not to be that is the question", "red green blue red green blue",
           "alpha beta gamma delta epsilon", "all work and no play makes jack a dull boy",
           "lorem ipsum dolor sit amet consectetur", "north south east west"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time in a time zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                         "required": ["query", "limit"]}}}
TOOLS = [WEATHER, TIME, SEARCH]
# Schemas with every property required (an object schema with only optional properties is avoided:
# see the note in docs/verify.md).
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}}, "required": ["city", "sunny"]},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}},
     "required": ["colour", "count"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
     "required": ["tags"]},
]


def thinking(rng, on):
    """Thinking on or off, spelled the ways clients spell it."""
    if on:
        return rng.choice([{"reasoning_effort": "high"}, {"chat_template_kwargs": {"thinking": True}},
                           {"reasoning_effort": "low"}])
    return rng.choice([{"reasoning_effort": "none"}, {"chat_template_kwargs": {"thinking": False}}])


def sampling(rng, i):
    """Seeded T > 0 with a varying sampler."""
    s = {"temperature": rng.choice([0.6, 0.7, 0.8, 0.9, 1.0]), "seed": 1000 + i}
    extra = rng.choice([{}, {"top_p": 0.9}, {"top_k": 40}, {"min_p": 0.05}, {"top_p": 0.95, "top_k": 50}])
    s.update(extra)
    return s


def repeated(rng, words=None, times=(5, 10)):
    phrase = words or rng.choice(PHRASES)
    return " ".join([phrase + "."] * rng.randint(*times))


def build():
    rng = random.Random(SEED)
    out = []

    def add(name, body, greedy=True, i=0):
        r = {"name": name}
        r.update(body)
        if not greedy:
            r.update(sampling(rng, i))
        r.setdefault("max_tokens", rng.choice([16, 24, 32]))
        out.append(r)

    # Plain chat, thinking off and on, greedy and sampled.
    for i, t in enumerate(TOPICS):
        for greedy in (True, False):
            on = (i + greedy) % 3 == 0
            add(f"chat-{'greedy' if greedy else 'sampled'}-{'think' if on else 'nothink'}-{i}",
                dict({"messages": [{"role": "user", "content": f"Write two sentences about {t}."}]}, **thinking(rng, on)),
                greedy, i)
    # A system prompt.
    for i in range(4):
        add(f"chat-system-{i}", dict({"messages": [{"role": "system", "content": "You are terse. Repeat key words."},
                                                   {"role": "user", "content": f"Describe {TOPICS[i + 4]} in five words."}]},
                                     **thinking(rng, i % 2 == 1)), i % 2 == 0, 100 + i)
    # Long prompts of repeated phrases: lookup drafts copy from them.
    for i in range(12):
        words = PHRASES[i % len(PHRASES)]
        add(f"chat-repetitive-{i}", dict({"messages": [{"role": "user", "content": "Continue the pattern: " + repeated(rng, words)}]},
                                         **thinking(rng, i % 4 == 3)), i % 2 == 0, 200 + i)
    for i in range(4):
        add(f"completion-repetitive-{i}", {"prompt": repeated(rng)}, i % 2 == 0, 300 + i)
    # Tool calls: auto and required, greedy and sampled, thinking off and on. The tool prompts are long
    # (the rendered tool block), so they share two rendered prompts (the sampler and tool_choice do not
    # change the prompt): each is prefilled once and then served from the prefix cache.
    for i in range(8):
        on = i >= 5
        body = {"messages": [{"role": "user", "content": "Look up the time in Tokyo." if on else "What is the weather in Paris for 3 days?"}],
                "tools": TOOLS, "tool_choice": "required" if i % 2 == 0 else "auto", "max_tokens": 40,
                "chat_template_kwargs": {"thinking": on}}
        add(f"chat-tools-{'think' if on else 'nothink'}-{i}", body, i % 4 < 2, 400 + i)
    # Tool round trips: a tool result answers each call, then a follow-up turn.
    for i in range(2):
        body = {"messages": [{"role": "user", "content": "Check the weather in Oslo, then summarise it."}],
                "tools": TOOLS, "tool_choice": "required", "max_tokens": 40,
                "tool_results": ['{"temp_c": 4, "sky": "rain"}'], "followups": ["Thanks. Now in one word?"],
                "chat_template_kwargs": {"thinking": False}}
        add(f"chat-tool-roundtrip-{i}", body, i % 2 == 0, 500 + i)
    # Multi-turn conversations.
    for i in range(10):
        body = {"messages": [{"role": "user", "content": f"Let us talk about {TOPICS[i]}. Say one thing."}],
                "followups": ["Say it again, with more words.", "And once more, the same way."][: 1 + i % 2], "max_tokens": 24}
        body.update(thinking(rng, i % 3 == 0))
        add(f"chat-multiturn-{i}", body, i % 2 == 0, 600 + i)
    # Structured output.
    for i in range(8):
        body = {"messages": [{"role": "user", "content": "Answer in JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i % len(SCHEMAS)]}},
                "max_tokens": 24}
        body.update(thinking(rng, False))
        add(f"chat-json-schema-{i}", body, i % 2 == 0, 700 + i)
    for i in range(2):
        add(f"chat-json-object-{i}", dict({"messages": [{"role": "user", "content": "Any JSON object."}],
                                           "response_format": {"type": "json_object"}, "max_tokens": 32}, **thinking(rng, False)),
            i == 0, 750 + i)
    # Stop strings and penalties.
    for i in range(4):
        add(f"chat-stop-{i}", dict({"messages": [{"role": "user", "content": "List words, one a line: " + repeated(rng, times=(2, 4))}],
                                    "stop": ["\n", "e"][i % 2: i % 2 + 1]}, **thinking(rng, False)), i % 2 == 0, 800 + i)
    for i in range(6):
        pen = [{"frequency_penalty": 0.5}, {"presence_penalty": 0.8}, {"repetition_penalty": 1.2}][i % 3]
        body = {"messages": [{"role": "user", "content": "Repeat after me: " + repeated(rng, times=(2, 4))}]}
        body.update(pen)
        body.update(thinking(rng, False))
        add(f"chat-penalty-{i}", body, i < 3, 850 + i)
    # Streaming.
    for i in range(6):
        body = {"messages": [{"role": "user", "content": f"Tell a story about {TOPICS[-1 - i]}."}], "stream": True}
        body.update(thinking(rng, i % 2 == 1))
        add(f"chat-stream-{i}", body, i % 3 != 2, 900 + i)
    # Completions: text, ids (periodic), streamed.
    for i in range(8):
        if i % 3 == 0:
            prompt = [rng.randrange(32, 127) for _ in range(rng.randint(3, 6))] * rng.randint(4, 10)
        else:
            prompt = f"Once upon a time there was {TOPICS[i]}."
        body = {"prompt": prompt}
        if i % 4 == 3:
            body["stream"] = True
        add(f"completion-{i}", body, i % 2 == 0, 950 + i)
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "drafting.jsonl")
    reqs = build()
    with open(path, "w", encoding="utf-8") as f:
        f.write("# drafted == serial over HTTP: generated by make_drafting.py (do not edit). "
                f"{len(reqs)} requests; run with --b-extra '{{\"draft\": false}}'.\n")
        for r in reqs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    greedy = sum(1 for r in reqs if "temperature" not in r)
    print(f"{path}: {len(reqs)} requests ({greedy} greedy, {len(reqs) - greedy} seeded T > 0)")


if __name__ == "__main__":
    main()

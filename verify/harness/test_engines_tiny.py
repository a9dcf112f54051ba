# SPDX-License-Identifier: Apache-2.0
"""`tessera verify engines` on the real tiny DeepSeek-V4.1 model (golden fixture v41-tiny/fp32, CPU backend).

1. Two `tessera serve` processes on the same folder (distinct free loopback ports) → every greedy reply
   (chat, streamed chat, completions from text and from ids) equal, exit 0.
2. B serves a copy of the folder with one weight changed (lm_head row kToken scaled by 1 + kScale in
   model.safetensors; nothing else differs) → exit 1, and every reply's first differing token is where the
   two models' greedy decodes part, computed independently with `tessera generate` (the model API through
   the serial Generator, no server) on the prompt ids each server's /tokenize reports. Server A's replies
   must also equal `tessera generate` on the unperturbed folder token for token."""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server", "clients"))
from harness import Server  # noqa: E402

SHARED = os.environ.get("TESSERA_SHARED_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared"))
TINY = os.path.join(SHARED, "golden", "v41-tiny", "fp32")
MAX_TOKENS = 24
kTensor, kToken, kScale = "lm_head.weight", 353, 0.3  # the planted weight change

REQUESTS = [
    {"name": "chat", "messages": [{"role": "user", "content": "Write one sentence about the sea."}], "max_tokens": MAX_TOKENS,
     "reasoning_effort": "none", "ignore_eos": True},
    {"name": "chat-stream", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": MAX_TOKENS,
     "reasoning_effort": "none", "ignore_eos": True, "stream": True},
    {"name": "completion-text", "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "ignore_eos": True},
    {"name": "completion-ids", "prompt": [1, 5, 9, 13, 17, 21], "max_tokens": MAX_TOKENS, "ignore_eos": True},
]


def perturbed_copy(src, dst):
    """dst/ = src/ with row kToken of kTensor (F32) scaled by 1 + kScale; other files linked."""
    for f in os.listdir(src):
        if f != "model.safetensors":
            os.symlink(os.path.join(src, f), os.path.join(dst, f))
    data = bytearray(open(os.path.join(src, "model.safetensors"), "rb").read())
    n = struct.unpack("<Q", data[:8])[0]
    meta = json.loads(data[8:8 + n])[kTensor]
    assert meta["dtype"] == "F32" and len(meta["shape"]) == 2, meta
    cols = meta["shape"][1]
    base = 8 + n + meta["data_offsets"][0] + kToken * cols * 4
    row = struct.unpack_from(f"<{cols}f", data, base)
    struct.pack_into(f"<{cols}f", data, base, *[x * (1 + kScale) for x in row])
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(data)


def prompt_ids(srv, req):
    if isinstance(req.get("prompt"), list):
        return req["prompt"]
    body = {k: req[k] for k in ("messages", "prompt", "reasoning_effort") if k in req}
    s, _, data = srv.request("POST", "/tokenize", body)
    assert s == 200, data
    return json.loads(data)["tokens"]


def generate(exe, model, ids):
    cmd = [exe, "generate", "--model", model, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(MAX_TOKENS), "--ignore-eos"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [int(x) for x in p.stdout.strip().split(",")]


def verify(exe, a, b, reqs, tmp):
    rj = os.path.join(tmp, "r.jsonl")
    cmd = [exe, "verify", "engines", "--a", a.base, "--b", b.base, "--requests", reqs, "--report-json", rj, "--concurrency", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    print("$ tessera " + " ".join(cmd[1:]) + f"  → exit {p.returncode}\n" + p.stdout[-4000:] + p.stderr[-2000:])
    lines = [json.loads(l) for l in open(rj, encoding="utf-8")]
    return p.returncode, p.stdout, {r["name"]: r for r in lines[:-1]}, lines[-1]


def main():
    exe = sys.argv[1]
    failures = []

    def check(cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            failures.append(msg)

    with tempfile.TemporaryDirectory(prefix="tessera-engines-tiny-") as tmp:
        rpath = os.path.join(tmp, "requests.jsonl")
        with open(rpath, "w", encoding="utf-8") as f:
            for r in REQUESTS:
                f.write(json.dumps(r) + "\n")
        pert = os.path.join(tmp, "perturbed")
        os.mkdir(pert)
        perturbed_copy(TINY, pert)
        serve = lambda model: Server(exe, "--model", model, "--max-batch", "4", scripts=False)
        want = len(REQUESTS)

        with serve(TINY) as a, serve(TINY) as b:
            check(a.port != b.port, f"two servers on distinct ports ({a.port}, {b.port})")
            rc, out, rows, summ = verify(exe, a, b, rpath, tmp)
            check(rc == 0 and summ["equal"] == want == summ["replies"], f"same model twice: {summ['equal']}/{summ['replies']} equal, exit {rc}")
            check(f"{want}/{want} replies equal" in out, "text report prints N/M replies equal")
            check(all(r["a_source"] == "token_ids" and r["a_tokens"] == MAX_TOKENS for r in rows.values()),
                  f"every reply compared by token_ids, {MAX_TOKENS} tokens each")
            ids = {r["name"]: prompt_ids(a, r) for r in REQUESTS}

        # Independent reference: greedy decode of both folders through the model API (no server).
        expect = {}
        for r in REQUESTS:
            ref, alt = generate(exe, TINY, ids[r["name"]]), generate(exe, pert, ids[r["name"]])
            expect[r["name"]] = next((i for i in range(MAX_TOKENS) if ref[i] != alt[i]), None)
            print(f"{r['name']}: prompt {len(ids[r['name']])} ids; generate ref {ref}\n{'':>{len(r['name'])}}  perturbed {alt}"
                  f" → first difference at {expect[r['name']]}")
            r["ref"], r["alt"] = ref, alt
        diverging = [n for n, e in expect.items() if e is not None]
        check(len(diverging) >= 2 and all(expect[n] > 0 for n in diverging) and len(diverging) < want,
              f"the planted weight moves greedy decoding mid-reply in {len(diverging)} of {want} replies ({expect})")

        with serve(TINY) as a, serve(pert) as b:
            rc, out, rows, summ = verify(exe, a, b, rpath, tmp)
            check(rc == 1, f"perturbed weight: exit {rc}, want 1")
            check(summ["equal"] == want - len(diverging), f"summary {summ['equal']}/{summ['replies']} equal, want {want - len(diverging)}")
            for r in REQUESTS:
                n, row, e = r["name"], rows.get(r["name"], {}), expect[r["name"]]
                if e is None:
                    check(row.get("equal") is True, f"{n}: the models agree on this reply → equal")
                    continue
                check(not row.get("equal", True) and row.get("first_diff") == e,
                      f"{n}: first differing token at reply index {row.get('first_diff')}, generate says {e}")
                check(row.get("a_id") == r["ref"][e] and row.get("b_id") == r["alt"][e],
                      f"{n}: ids at the divergence A {row.get('a_id')} / B {row.get('b_id')}, generate {r['ref'][e]} / {r['alt'][e]}")
                check(f"first differing token at reply index {e}" in out, f"{n}: text report names index {e}")
            # Server A (unperturbed) == the model API, token for token, on the whole reply.
            for r in REQUESTS:
                body = {k: v for k, v in r.items() if k not in ("name", "stream")}
                body["return_token_ids"], body["temperature"] = True, 0
                path = "/v1/chat/completions" if "messages" in r else "/v1/completions"
                s, _, data = a.request("POST", path, body)
                got = json.loads(data)["choices"][0].get("token_ids") if s == 200 else data
                check(got == r["ref"], f"{r['name']}: server A reply == tessera generate on the same prompt ids")
            a.wait_idle()
            b.wait_idle()
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

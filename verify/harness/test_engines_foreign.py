# SPDX-License-Identifier: Apache-2.0
"""`tessera verify engines` against servers that are not Tessera: a stdlib mock of an OpenAI-compatible
server (vLLM-like) on loopback. Without `token_ids` the replies are compared by their logprobs tokens;
a mock with `prompt_logprobs` (vLLM shape: per prompt position {id: {logprob, rank, decoded_token}}) is
teacher-forced in one request; a mock without ids says clearly why teacher forcing did not run."""
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lam", "mu"]
V = len(WORDS)


def top1(prefix, perturb_at):
    t = (sum((i + 1) * x for i, x in enumerate(prefix)) * 7 + len(prefix)) % V
    return (t + 1) % V if len(prefix) == perturb_at else t


def dist(prefix, perturb_at):
    """Top-3 ids with logprobs: the top-1 then its two neighbours."""
    t = top1(prefix, perturb_at)
    return [(t, -0.2), ((t + 1) % V, -2.0), ((t + 2) % V, -3.0)]


def make_server(ids, perturb_at=-1):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self.path.endswith("/completions"):  # no /detokenize, /tokenize: the harness falls back
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            chat = self.path.endswith("/chat/completions")
            if chat:
                text = " ".join(m.get("content") or "" for m in body["messages"])
                prompt = [len(w) % V for w in text.split()] or [0]
            else:
                prompt = body["prompt"] if isinstance(body["prompt"], list) else [len(w) % V for w in body["prompt"].split()]
            seq = list(prompt)
            for _ in range(body.get("max_tokens", 8)):
                seq.append(top1(seq, perturb_at))
            reply = seq[len(prompt):]
            words = [WORDS[t] + " " for t in reply]
            choice = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": "".join(words)}
                choice["logprobs"] = {"content": [{"token": w, "logprob": -0.2, "bytes": list(w.encode()), "top_logprobs": []} for w in words]}
            else:
                choice["text"] = "".join(words)
                choice["logprobs"] = {"tokens": words, "token_logprobs": [-0.2] * len(words), "top_logprobs": None, "text_offset": []}
            out = {"id": "x", "object": "chat.completion" if chat else "text_completion", "choices": [choice]}
            if ids:
                choice["token_ids"] = reply
                out["prompt_token_ids"] = prompt
                if body.get("prompt_logprobs"):
                    pl = [None]
                    for p in range(1, len(prompt)):
                        pl.append({str(t): {"logprob": lp, "rank": r + 1, "decoded_token": WORDS[t]}
                                   for r, (t, lp) in enumerate(dist(prompt[:p], perturb_at))})
                    out["prompt_logprobs"] = pl
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i, w in enumerate(words):
                    c = {"index": 0, "finish_reason": None}
                    if chat:
                        c["delta"] = {"content": w}
                        c["logprobs"] = {"content": [{"token": w, "logprob": -0.2, "bytes": list(w.encode()), "top_logprobs": []}]}
                    else:
                        c["text"] = w
                        c["logprobs"] = {"tokens": [w], "token_logprobs": [-0.2]}
                    if ids:
                        c["token_ids"] = [reply[i]]
                    self.wfile.write(b"data: " + json.dumps({"choices": [c]}).encode() + b"\n\n")
                end = {"index": 0, "finish_reason": "length"}
                end["delta" if chat else "text"] = {} if chat else ""
                self.wfile.write(b"data: " + json.dumps({"choices": [end]}).encode() + b"\n\ndata: [DONE]\n\n")
                return
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main():
    exe = sys.argv[1]
    failures = []

    def check(cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            failures.append(msg)

    def run(a, b, reqs, *extra):
        with tempfile.TemporaryDirectory() as tmp:
            path, rj = os.path.join(tmp, "r.jsonl"), os.path.join(tmp, "out.jsonl")
            with open(path, "w") as f:
                f.write("".join(json.dumps(r) + "\n" for r in reqs))
            cmd = [exe, "verify", "engines", "--a", f"http://127.0.0.1:{a.server_port}", "--b",
                   f"http://127.0.0.1:{b.server_port}/v1", "--requests", path, "--report-json", rj, *extra]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            print(p.stdout + p.stderr)
            rows = [json.loads(l) for l in open(rj)]
            return p.returncode, p.stdout, rows[:-1], rows[-1]

    reqs = [{"name": "chat", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 10},
            {"name": "chat-stream", "messages": [{"role": "user", "content": "five six"}], "max_tokens": 10, "stream": True},
            {"name": "completion", "prompt": "a bb ccc", "max_tokens": 10}]
    servers = [make_server(False), make_server(False), make_server(False, perturb_at=6)]
    try:
        a, b, c = servers
        rc, out, rows, summ = run(a, b, reqs)
        check(rc == 0 and summ["equal"] == 3, "no token ids: identical mocks, 3/3 equal")
        check(all(r["a_source"] == "logprobs tokens" for r in rows), "compared by logprobs tokens")
        rc, out, rows, summ = run(a, c, reqs, "--teacher-forced")
        # Prompt lengths 4, 2, 3 words → the planted position 6 is reply index 2, 4, 3.
        want = {"chat": 2, "chat-stream": 4, "completion": 3}
        for r in rows:
            check(r.get("first_diff") == want[r["name"]], f"{r['name']}: first difference at {want[r['name']]} (got {r.get('first_diff')})")
        check(rc == 1 and "0/3 replies equal" in out, "planted divergence without ids: exit 1, 0/3 equal")
        check("not run: server A returned no token_ids" in out, "teacher forcing explains why it did not run")
    finally:
        for s in servers:
            s.shutdown()

    # Token ids and prompt_logprobs: teacher forcing in one request per side.
    servers = [make_server(True), make_server(True, perturb_at=7)]
    try:
        a, c = servers
        reqs = [{"name": "ids", "prompt": [1, 2, 3, 4, 5], "max_tokens": 8}]
        rc, out, rows, summ = run(a, c, reqs, "--teacher-forced")
        r = rows[0]
        check(rc == 1 and r["a_source"] == "token_ids" and r["first_diff"] == 2, "ids: first difference at reply index 2")
        check(summ.get("tf_mode_b", "").startswith("prompt_logprobs"), "teacher forcing used prompt_logprobs")
        check(r["tf_positions"] == 8 and r["tf_top1_agree"] == 7 and r["tf_first_disagree"] == 2,
              f"teacher-forced top-1 7/8, first disagreement at 2 (got {r.get('tf_top1_agree')}/{r.get('tf_positions')}, {r.get('tf_first_disagree')})")
        check(r["tf_kl_max"] > 1.0, f"KL at the planted position is large ({r['tf_kl_max']:.3f})")
    finally:
        for s in servers:
            s.shutdown()
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

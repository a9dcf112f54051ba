# SPDX-License-Identifier: Apache-2.0
"""`tessera verify engines` end to end: two stub servers on loopback ports → every reply equal (exit 0);
then a server with a planted divergence (`--perturb-position P`: greedy picks the runner-up at absolute
position P) → the report names reply index P − prompt length for every reply that reaches P, exit 1;
teacher-forced mode finds the same position. Servers are always stopped (context managers)."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server", "clients"))
from harness import Server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "requests", "default.jsonl")
P = 40  # perturbed absolute position


def verify(exe, a, b, reqs, tmp, *extra):
    rj, rh = os.path.join(tmp, "r.jsonl"), os.path.join(tmp, "r.html")
    cmd = [exe, "verify", "engines", "--a", a.base, "--b", b.base, "--requests", reqs, "--report-json", rj, "--report-html", rh, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    print("$ " + " ".join(cmd[1:]) + f"  → exit {p.returncode}\n" + p.stdout[-4000:] + p.stderr[-2000:])
    lines = [json.loads(l) for l in open(rj, encoding="utf-8")]
    html = open(rh, encoding="utf-8").read()
    return p.returncode, p.stdout, lines[:-1], lines[-1], html


def count_requests(path):
    n = 0
    for l in open(path, encoding="utf-8"):
        if l.strip() and not l.lstrip().startswith("#"):
            n += 1 + len(json.loads(l).get("followups", []))
    return n


def prompt_len(srv, req):
    if isinstance(req.get("prompt"), list):
        return len(req["prompt"])
    body = {"messages": req["messages"]} if "messages" in req else {"prompt": req["prompt"]}
    for k in ("reasoning_effort", "tools", "response_format", "chat_template_kwargs"):
        if k in req:
            body[k] = req[k]
    s, _, data = srv.request("POST", "/tokenize", body)
    assert s == 200, data
    return json.loads(data)["count"]


def main():
    exe = sys.argv[1]
    failures = []

    def check(cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            failures.append(msg)

    with tempfile.TemporaryDirectory(prefix="tessera-verify-") as tmp:
        with Server(exe) as a, Server(exe) as b:
            rc, out, rows, summ, html = verify(exe, a, b, DEFAULT, tmp, "--concurrency", "4")
            want = count_requests(DEFAULT)
            check(rc == 0, "identical servers: exit 0")
            check(summ["replies"] == want and summ["equal"] == want, f"identical servers: {summ['equal']}/{summ['replies']} equal, want {want}/{want}")
            check(f"{want}/{want} replies equal" in out, "text report prints N/M replies equal")
            check(all(r["a_source"] == "token_ids" and r["b_source"] == "token_ids" for r in rows), "every reply compared by token_ids")
            # The stub's greedy replies are short (EOS is often near the top), but most are not empty.
            ntok = sum(r["a_tokens"] for r in rows)
            check(ntok >= 50 and sum(r["a_tokens"] > 0 for r in rows) >= want // 2, f"replies carry tokens ({ntok} in all)")
            check(any(r["name"].endswith("#3") for r in rows), "multi-turn followups compared as their own replies")
            check(html.startswith("<!DOCTYPE html>") and f"{want}/{want} replies equal" in html, "HTML report written")
            # One server against itself, B's requests with "draft": false (drafted == serial at HTTP level).
            rc, out, rows, summ, html = verify(exe, a, a, DEFAULT, tmp, "--concurrency", "2", "--b-extra", '{"draft": false}')
            check(rc == 0 and summ["equal"] == want, "same server, B with draft=false: all equal")
            # --b-extra really reaches B: a shorter max_tokens ends B's reply at index 3.
            short = os.path.join(tmp, "short.jsonl")
            with open(short, "w") as f:
                f.write(json.dumps({"name": "long", "prompt": [65, 66, 67], "max_tokens": 20, "ignore_eos": True}) + "\n")
            rc, out, rows, summ, html = verify(exe, a, b, short, tmp, "--b-extra", '{"max_tokens": 3}')
            check(rc == 1 and rows[0].get("first_diff") == 3 and rows[0]["b_token"].startswith("<end: finish_reason length"),
                  "--b-extra max_tokens 3: B ends at index 3 (finish_reason length)")
            a.wait_idle()
            b.wait_idle()

        # Planted divergence.
        reqs = [
            {"name": "ids9", "prompt": list(range(65, 74)), "max_tokens": 48, "ignore_eos": True},
            {"name": "ids30", "prompt": list(range(70, 100)), "max_tokens": 24, "ignore_eos": True},
            {"name": "ids60", "prompt": list(range(40, 100)), "max_tokens": 16},
            {"name": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 48, "reasoning_effort": "none", "ignore_eos": True},
            {"name": "chat-stream", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 48, "reasoning_effort": "none",
             "ignore_eos": True, "stream": True},
            {"name": "completion-stream", "prompt": "abcdefghij", "max_tokens": 48, "ignore_eos": True, "stream": True},
        ]
        rpath = os.path.join(tmp, "perturb.jsonl")
        with open(rpath, "w", encoding="utf-8") as f:
            for r in reqs:
                f.write(json.dumps(r) + "\n")
        with Server(exe) as a, Server(exe, "--perturb-position", str(P)) as b:
            lens = {r["name"]: prompt_len(a, r) for r in reqs}
            print("prompt lengths:", lens)
            rc, out, rows, summ, html = verify(exe, a, b, rpath, tmp, "--concurrency", "3")
            check(rc == 1, "planted divergence: exit 1")
            diverging = 0
            for r in rows:
                n = lens[r["name"]]
                expect = P - n if 0 <= P - n < r["a_tokens"] else None
                if expect is None:
                    check(r["equal"], f"{r['name']}: prompt {n}, position {P} not in the reply → equal")
                else:
                    diverging += 1
                    check(not r["equal"] and r.get("first_diff") == expect,
                          f"{r['name']}: prompt {n} → first differing token at reply index {expect} (got {r.get('first_diff')})")
                    check(r.get("a_id", -1) >= 0 and r.get("b_id", -1) >= 0 and r["a_id"] != r["b_id"], f"{r['name']}: ids on both sides differ")
                    check(f"first differing token at reply index {expect}" in out, f"{r['name']}: text report names index {expect}")
            check(diverging >= 4, f"at least 4 replies reach the planted position ({diverging})")
            check(summ["equal"] == len(rows) - diverging, f"summary: {summ['equal']}/{summ['replies']} equal")
            check("different at" in html, "HTML report shows the divergence")

            # Teacher forcing on the first two (token-id prompts): top-1 disagrees exactly at the planted position.
            tpath = os.path.join(tmp, "tf.jsonl")
            with open(tpath, "w", encoding="utf-8") as f:
                for r in reqs[:2]:
                    f.write(json.dumps(r) + "\n")
            rc, out, rows, summ, html = verify(exe, a, b, tpath, tmp, "--teacher-forced", "--tf-max-positions", "48")
            check("no prompt_logprobs: step-wise" in summ.get("tf_mode_b", ""), "teacher forcing says the server has no prompt_logprobs")
            for r in rows:
                n = lens[r["name"]]
                check(r.get("tf_first_disagree") == P - n and r["tf_top1_agree"] == r["tf_positions"] - 1,
                      f"{r['name']}: teacher-forced top-1 {r.get('tf_top1_agree')}/{r.get('tf_positions')}, first disagreement "
                      f"{r.get('tf_first_disagree')} (want {P - n})")
                check(r.get("tf_kl_max", 0) > 0, f"{r['name']}: KL > 0 at the planted position")
            a.wait_idle()
            b.wait_idle()

        # Bad requests file: a clear error, exit 2.
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"name": "x", "max_tokens": 3}\n')
        p = subprocess.run([exe, "verify", "engines", "--a", "http://127.0.0.1:1", "--b", "http://127.0.0.1:1", "--requests", bad],
                           capture_output=True, text=True, timeout=30)
        check(p.returncode == 2 and "line 1" in p.stderr and "messages" in p.stderr, "malformed requests file → exit 2 naming line and field")
        # The invariance suite through the CLI on the stub model.
        ij = os.path.join(tmp, "inv.jsonl")
        p = subprocess.run([exe, "verify", "invariance", "--model", "stub", "--decode-tokens", "8", "--report-json", ij],
                           capture_output=True, text=True, timeout=60)
        gates = [json.loads(l) for l in open(ij)]
        check([g["verdict"] for g in gates] == ["PASS"] * 5 + ["SKIP"] and all(g["evidence"] for g in gates),
              "invariance JSON report: 5 PASS then 1 SKIP, each with evidence")
        print(p.stdout[-3000:] + p.stderr[-1000:])
        check(p.returncode == 0 and "5 passed, 0 failed, 1 skipped" in p.stdout and "PASS  drafted == serial" in p.stdout
              and "SKIP  graph == eager" in p.stdout, "verify invariance --model stub: 5 PASS, graph SKIP, exit 0")
        p = subprocess.run([exe, "verify", "invariance", "--model", os.path.join(tmp, "missing")], capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and "missing" in p.stderr, "verify invariance on a missing folder: exit 2 naming it")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

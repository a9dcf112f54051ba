# SPDX-License-Identifier: Apache-2.0
"""drafted == serial through the server (issue 7 gate, CPU half): one `tessera serve` on the tiny golden
model (fp32, CPU) with prompt-lookup drafting at a fixed depth, and `tessera verify engines` sending every
request of verify/harness/requests/drafting.jsonl to it twice — as is (drafted) and with
`--b-extra '{"draft": false}'` (serial) — with 4 requests in flight, so drafted rows share batched steps
with other sequences. Every reply (every turn of the multi-turn and tool round-trip requests) must be equal
token for token and in text. /metrics must show drafts verified, some kept and some rejected, and no draft
for a "draft": false request.

The fixture model is a folder built at test time: the golden files linked, config.json copied with
max_position_embeddings 4096 (the golden 512 is shorter than the tool prompts, which the byte-level
stand-in tokenizer renders one byte a token). The committed request file must equal what
make_drafting.py writes.

Usage: test_drafting_http.py TESSERA [--draft-k K] [--device cpu|cuda]   (--device cuda: the GPU model, on a GPU machine)"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server", "clients"))
from harness import Server  # noqa: E402

SHARED = os.environ.get("TESSERA_SHARED_DIR", os.path.join(HERE, "../../../shared"))
TINY = os.path.join(SHARED, "golden", "v41-tiny", "fp32")
REQUESTS = os.path.join(HERE, "requests", "drafting.jsonl")
GENERATOR = os.path.join(HERE, "requests", "make_drafting.py")
CONTEXT = 4096


def long_context_copy(src, dst):
    """dst/ = src/ with every file linked except config.json, whose max_position_embeddings becomes CONTEXT
    (in every text configuration the loader may pick: golden.text_config_used, text_config)."""
    for f in os.listdir(src):
        if f != "config.json":
            os.symlink(os.path.join(src, f), os.path.join(dst, f))
    cfg = json.load(open(os.path.join(src, "config.json"), encoding="utf-8"))
    touched = 0
    for holder in (cfg.get("golden", {}).get("text_config_used"), cfg.get("text_config"), cfg):
        if isinstance(holder, dict) and "max_position_embeddings" in holder:
            holder["max_position_embeddings"] = CONTEXT
            touched += 1
    assert touched, "config.json has no max_position_embeddings"
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w", encoding="utf-8"), indent=1)


def metrics(srv):
    s, _, body = srv.request("GET", "/metrics")
    assert s == 200, body
    out = {}
    for line in body.decode().splitlines():
        m = re.match(r"tessera:(spec_decode_num_\w+_total)\{[^}]*\} ([0-9.e+]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def main():
    exe = sys.argv[1]
    draft_k = sys.argv[sys.argv.index("--draft-k") + 1] if "--draft-k" in sys.argv else "3"
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
    failures = []

    def check(cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            failures.append(msg)

    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="tessera-drafting-http-") as tmp:
        regenerated = os.path.join(tmp, "drafting.jsonl")
        subprocess.run([sys.executable, GENERATOR, regenerated], check=True, capture_output=True)
        check(open(regenerated, "rb").read() == open(REQUESTS, "rb").read(),
              "verify/harness/requests/drafting.jsonl equals make_drafting.py's output")
        reqs = [json.loads(l) for l in open(REQUESTS, encoding="utf-8") if l.strip() and not l.startswith("#")]
        turns = sum(1 + len(r.get("followups", [])) for r in reqs)
        kinds = {
            "seeded T > 0": sum("temperature" in r for r in reqs),
            "thinking on": sum(r.get("reasoning_effort") in ("low", "high") or r.get("chat_template_kwargs", {}).get("thinking") is True for r in reqs),
            "tools": sum("tools" in r for r in reqs),
            "multi-turn": sum("followups" in r for r in reqs),
            "json_schema": sum(r.get("response_format", {}).get("type") == "json_schema" for r in reqs),
            "streamed": sum(bool(r.get("stream")) for r in reqs),
            "completions": sum("prompt" in r for r in reqs),
        }
        print(f"{len(reqs)} requests, {turns} replies: " + ", ".join(f"{v} {k}" for k, v in kinds.items()))
        check(len(reqs) >= 100 and all(v > 0 for v in kinds.values()), "100+ requests covering every kind")

        model = os.path.join(tmp, "tiny-4k")
        os.mkdir(model)
        long_context_copy(TINY, model)
        with Server(exe, "--model", model, "--device", device, "--draft", "lookup", "--draft-k", draft_k, "--max-batch", "4",
                    scripts=False) as srv:
            log = srv.read_log()
            check(f"context {CONTEXT}" in log and "drafting: lookup" in log, f"server: context {CONTEXT}, drafting: lookup")
            # "draft": false drafts nothing (so side B below is serial decoding).
            before = metrics(srv)
            for body in ({"messages": [{"role": "user", "content": "one two one two one two one two"}], "max_tokens": 24, "draft": False},
                         {"prompt": "ab ab ab ab ab ab ab ab", "max_tokens": 24, "draft": False}):
                path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                s, _, data = srv.request("POST", path, body, timeout=120)
                check(s == 200, f"serial request {path}: HTTP {s}")
            after = metrics(srv)
            check(after.get("spec_decode_num_draft_tokens_total", -1) == before.get("spec_decode_num_draft_tokens_total", -2),
                  f"\"draft\": false requests drafted nothing ({before.get('spec_decode_num_draft_tokens_total')} → "
                  f"{after.get('spec_decode_num_draft_tokens_total')} draft tokens)")

            report = os.path.join(tmp, "report.jsonl")
            cmd = [exe, "verify", "engines", "--a", srv.base, "--b", srv.base, "--requests", REQUESTS, "--concurrency", "4",
                   "--b-extra", '{"draft": false}', "--report-json", report, "--timeout", "300"]
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            print(f"$ tessera {' '.join(cmd[1:])}  → exit {p.returncode} in {time.time() - t0:.1f}s")
            print("\n".join(l for l in p.stdout.splitlines() if not l.startswith("equal")) + p.stderr[-2000:])
            rows = [json.loads(l) for l in open(report, encoding="utf-8")]
            summary, rows = rows[-1], rows[:-1]
            check(p.returncode == 0 and summary.get("all_equal") is True, f"verify engines: {summary.get('equal')}/{summary.get('replies')} equal, exit {p.returncode}")
            check(len(rows) == turns, f"{len(rows)} replies compared, want {turns} (every turn)")
            check(all(r["equal"] and r["text_equal"] for r in rows), "every reply equal in tokens and text")
            check(all(r["a_source"] == r["b_source"] == "token_ids" for r in rows), "every reply compared by token_ids")
            check(all(r["a_finish"] == r["b_finish"] for r in rows), "every finish reason equal")
            n_tokens = sum(r["a_tokens"] for r in rows)
            final = metrics(srv)
            drafted = final.get("spec_decode_num_draft_tokens_total", 0) - after.get("spec_decode_num_draft_tokens_total", 0)
            accepted = final.get("spec_decode_num_accepted_tokens_total", 0) - after.get("spec_decode_num_accepted_tokens_total", 0)
            rounds = final.get("spec_decode_num_drafts_total", 0) - after.get("spec_decode_num_drafts_total", 0)
            print(f"drafted side: {n_tokens} reply tokens, {rounds:.0f} verifying rounds, {drafted:.0f} draft tokens, "
                  f"{accepted:.0f} accepted, {drafted - accepted:.0f} rejected")
            check(drafted > 0 and 0 < accepted < drafted, "drafts were verified, some kept and some rolled back")
            srv.wait_idle(timeout=30)
    print(f"{len(failures)} failed in {time.time() - t_start:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

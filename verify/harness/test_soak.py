# SPDX-License-Identifier: Apache-2.0
"""`tessera verify soak` end to end (≤ 20 s): a short bounded soak against a stub server passes with no
finding (cancels and disconnects included, the server idle afterwards, one reply per greedy body); a soak
against a port where nothing listens fails with findings and exit 1. Servers are always stopped."""
import os
import re
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server", "clients"))
from harness import Server  # noqa: E402


def faulty_server(faulty=True):
    import itertools
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    counter = itertools.count()

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, status, data, ctype="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.startswith("/health"):
                self.reply(200, json.dumps({"status": "ok", "slots_busy": 1, "queue": 0}).encode() if faulty else b"")
            elif self.path.startswith("/metrics"):
                self.reply(200, b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 0.0\n'
                                b'vllm:num_requests_waiting{model_name="m"} 0.0\n', "text/plain")
            else:
                self.reply(200, json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode())

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = next(counter) if faulty else 0
            if faulty and n % 7 == 3:
                self.reply(500, b'{"error": {"message": "boom", "type": "server_error"}}')
                return
            chat = "messages" in body
            text = f"reply {n}"
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                c = {"index": 0, "finish_reason": None, "token_ids": [n % 50]}
                c["delta" if chat else "text"] = {"content": text} if chat else text
                self.wfile.write(b"data: " + json.dumps({"choices": [c]}).encode() + b"\n\n")
                if not faulty or n % 5 != 1:
                    self.wfile.write(b'data: {"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
                return
            c = {"index": 0, "finish_reason": "stop", "token_ids": [n % 50]}
            if chat:
                c["message"] = {"role": "assistant", "content": text}
            else:
                c["text"] = text
            self.reply(200, json.dumps({"choices": [c]}).encode())

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

    with Server(exe) as srv:
        rj = os.path.join(srv.dir.name, "soak.jsonl")
        cmd = [exe, "verify", "soak", "--url", srv.base, "--minutes", "0.2", "--max-requests", "240", "--workers", "4", "--seed", "7",
               "--report-json", rj]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        print("$ " + " ".join(cmd[1:]) + f"  → exit {p.returncode}\n" + p.stdout + p.stderr[-2000:])
        out = p.stdout
        check(p.returncode == 0 and "PASS in" in out and "finding:" not in out, "soak against a stub server: PASS, no finding")
        total = re.search(r"^total\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", out, re.M)
        check(total is not None, "summary table has a total row")
        if total:
            sent, ok, cancelled, s5, herr = map(int, total.groups())
            check(sent >= 40, f"at least 40 requests sent ({sent})")
            check(cancelled >= 1, f"some streams were dropped mid-reply ({cancelled})")
            check(s5 == 0 and herr == 0 and ok + cancelled == sent, "no errors; every request ok or cancelled")
        for kind in ("greedy", "greedy-stream", "tools", "json_schema", "thinking", "long", "completions", "sampled", "cancel"):
            check(re.search(r"^" + re.escape(kind) + r"\s", out, re.M) is not None, f"kind {kind} ran")
        m = re.search(r"exactly one reply hash: (\d+)/(\d+)", out)
        check(m is not None and m.group(1) == m.group(2) and int(m.group(2)) >= 3, "every repeated greedy body gave one reply hash")
        check("after: idle" in out, "/health idle after the soak")
        import json
        rows = [json.loads(l) for l in open(rj)]
        check(rows[-1].get("summary") and rows[-1]["pass"] and rows[-1]["idle"] and rows[-1]["findings"] == []
              and sum(r["sent"] for r in rows[:-1]) == sent, "JSON report: per-kind rows and a passing summary")
        srv.wait_idle()

    # Nothing listening: every request is an error → FAIL, exit 1.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.run([exe, "verify", "soak", "--url", f"http://127.0.0.1:{port}", "--minutes", "0.05", "--max-requests", "6",
                        "--workers", "2", "--idle-wait", "0.2"], capture_output=True, text=True, timeout=60)
    print(p.stdout[-1500:])
    check(p.returncode == 1 and "FAIL in" in p.stdout and "connect" in p.stdout, "soak against a dead port: findings, exit 1")
    # A faulty server: every 7th request a 500, streams cut without [DONE], greedy replies that change from
    # call to call, and a /health that never frees its slot → each is a finding.
    mock = faulty_server()
    try:
        p = subprocess.run([exe, "verify", "soak", "--url", f"http://127.0.0.1:{mock.server_port}", "--minutes", "0.1", "--max-requests",
                            "80", "--workers", "2", "--idle-wait", "0.3"], capture_output=True, text=True, timeout=60)
        print(p.stdout[-3000:])
        out = p.stdout
        check(p.returncode == 1 and "FAIL in" in out, "faulty server: FAIL, exit 1")
        check("server error: HTTP 500" in out, "faulty server: the 500s are findings")
        check("SSE stream ended without [DONE]" in out, "faulty server: a stream without [DONE] is a finding")
        check("different replies" in out, "faulty server: a greedy body with several replies is a finding")
        check("server not idle" in out and "after: NOT idle" in out, "faulty server: a busy slot after the soak is a finding")
    finally:
        mock.shutdown()

    # A well-behaved foreign server whose /health is empty: slot release is read from vLLM's /metrics gauges.
    mock = faulty_server(faulty=False)
    try:
        p = subprocess.run([exe, "verify", "soak", "--url", f"http://127.0.0.1:{mock.server_port}", "--minutes", "0.1", "--max-requests",
                            "40", "--workers", "2", "--idle-wait", "1"], capture_output=True, text=True, timeout=60)
        print(p.stdout[-2000:])
        check(p.returncode == 0 and "PASS in" in p.stdout and "after: idle" in p.stdout, "foreign server: idle read from /metrics, PASS")
    finally:
        mock.shutdown()
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

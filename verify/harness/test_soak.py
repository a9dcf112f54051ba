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


def main():
    exe = sys.argv[1]
    failures = []

    def check(cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            failures.append(msg)

    with Server(exe) as srv:
        cmd = [exe, "verify", "soak", "--url", srv.base, "--minutes", "0.2", "--max-requests", "240", "--workers", "4", "--seed", "7"]
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
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

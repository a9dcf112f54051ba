# SPDX-License-Identifier: Apache-2.0
"""Starts `tessera serve` (stub model) on a free loopback port, waits for /health, stops it with SIGTERM.

Also: scripted stub replies (a trigger in the last user turn forces the reply, see stub_model.hpp), a raw
HTTP helper (http.client) and a tiny test runner (no pytest needed): every `test_*` function of a module
runs once; the process exits non-zero if any failed.
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

# Scripted replies of the stub model: trigger text → reply (special tokens written literally).
SCRIPTS = {
    "[[think]]": "Let me think about it.</think>The answer is 391.",
    "[[tool]]": ("I should call get_weather.</think>Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
                 "<｜DSML｜ parameter name=\"location\" string=\"true\">Beijing</｜DSML｜ parameter>\n"
                 "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"),
    "[[tool2]]": ("Two calls.</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
                  "<｜DSML｜ parameter name=\"location\" string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
                  "<｜DSML｜ invoke name=\"get_time\">\n<｜DSML｜ parameter name=\"tz\" string=\"true\">CET</｜DSML｜ parameter>\n"
                  "</｜DSML｜ invoke>\n</｜DSML｜ calls>"),
    "[[json]]": "Fill the schema.</think>{\"name\": \"Ada\", \"age\": 36}",
    "[[stop]]": "</think>alpha beta STOP gamma delta",
    "[[utf8]]": "</think>héllo 北京 😀 done",
}


class Server:
    def __init__(self, exe, *extra, scripts=True):
        self.dir = tempfile.TemporaryDirectory(prefix="tessera-serve-")
        port_file = os.path.join(self.dir.name, "port")
        args = [exe, "serve", "--model", "stub", "--host", "127.0.0.1", "--port", "0", "--port-file", port_file]
        if scripts:
            sf = os.path.join(self.dir.name, "scripts.json")
            with open(sf, "w", encoding="utf-8") as f:
                json.dump([{"trigger": k, "reply": v} for k, v in SCRIPTS.items()], f, ensure_ascii=False)
            args += ["--stub-scripts", sf]
        args += list(extra)
        self.log_path = os.path.join(self.dir.name, "log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("tessera serve did not start:\n" + self.read_log())
            time.sleep(0.02)
        self.port = int(open(port_file).read())
        self.base = f"http://127.0.0.1:{self.port}/v1"

    def read_log(self):
        self.log.flush()
        return open(self.log_path).read()

    def request(self, method, path, body=None, headers=None, timeout=30):
        """One request on a fresh connection → (status, headers dict, body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def health(self):
        s, _, b = self.request("GET", "/health")
        return json.loads(b)

    def wait_idle(self, timeout=5.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            h = self.health()
            if h["slots_busy"] == 0 and h["queue"] == 0 and h["requests_in_flight"] == 0:
                return h
            time.sleep(0.02)
        raise AssertionError(f"server not idle: {self.health()}")

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("tessera serve did not stop within %ss of SIGTERM" % timeout)
        self.log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.stop()
        self.dir.cleanup()
        if exc[0] is None:
            assert rc == 0, f"tessera serve exited with {rc}"


def sse_events(raw: bytes):
    """SSE body → list of data payloads (strings); asserts the framing rules of spec §5.2."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), "stream must end with a blank line"
    out = []
    for event in text.split("\n\n")[:-1]:
        lines = event.split("\n")
        if all(l.startswith(":") for l in lines):
            continue  # keep-alive comment
        assert all(l.startswith("data: ") for l in lines), f"unexpected SSE lines: {lines!r}"
        out.append("\n".join(l[6:] for l in lines))
    return out


def run_tests(namespace, server_factory):
    """Runs every test_* in `namespace` against one server; prints a summary; returns the exit code."""
    tests = sorted((k, v) for k, v in namespace.items() if k.startswith("test_") and callable(v))
    failed = []
    t0 = time.time()
    with server_factory() as srv:
        for name, fn in tests:
            t = time.time()
            try:
                fn(srv)
                print(f"ok   {name} ({time.time() - t:.2f}s)")
            except Exception:
                failed.append(name)
                print(f"FAIL {name}\n{traceback.format_exc()}")
                print("---- server log ----\n" + srv.read_log()[-3000:])
        srv.wait_idle()
    print(f"{len(tests) - len(failed)} passed, {len(failed)} failed in {time.time() - t0:.1f}s")
    return 1 if failed else 0


def exe_from_argv():
    if len(sys.argv) < 2:
        sys.exit("usage: %s PATH/TO/tessera" % sys.argv[0])
    return sys.argv[1]

#!/usr/bin/env python3
"""Prints 'N passed, N failed, N skipped' from a Meson testlog.json; exit 1 if any failed or none ran."""
import json
import sys

counts = {"passed": 0, "failed": 0, "skipped": 0}
failed = []
with open(sys.argv[1]) as f:
    for line in f:
        if not line.strip():
            continue
        r = json.loads(line)
        res = r.get("result", "")
        if res in ("OK", "EXPECTEDFAIL"):
            counts["passed"] += 1
        elif res == "SKIP":
            counts["skipped"] += 1
        else:
            counts["failed"] += 1
            failed.append(f'{r.get("name")} ({res})')
for name in failed:
    print(f"FAILED: {name}")
print(f'{counts["passed"]} passed, {counts["failed"]} failed, {counts["skipped"]} skipped')
sys.exit(1 if counts["failed"] or counts["passed"] == 0 else 0)

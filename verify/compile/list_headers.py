#!/usr/bin/env python3
"""Lists public headers under include/ with a given extension, relative to include/, one per line."""
import os
import sys

root, ext = sys.argv[1], sys.argv[2]
skip = set(sys.argv[3:])  # top-level subfolders of include/tessera to leave out
out = []
for d, _, files in os.walk(os.path.join(root, "tessera")):
    rel_dir = os.path.relpath(d, root)
    parts = rel_dir.split(os.sep)
    if len(parts) > 1 and parts[1] in skip:
        continue
    for f in files:
        if f.endswith("." + ext):
            out.append(os.path.join(rel_dir, f).replace(os.sep, "/"))
print("\n".join(sorted(out)))

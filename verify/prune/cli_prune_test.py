#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The built `tessera calibrate / prune / verify retention / generate` on golden/v41-tiny/fp32: calibration
counts sum to tokens·k per layer; the pruned checkpoint inspects with n_routed_experts = kept, generates,
and scores zero KL against the base run under the equivalent pruning when pruned to everything; the
retention JSON carries the documented fields and the PNG decodes (CRC32 per chunk, zlib stream)."""
import json, os, struct, subprocess, sys, tempfile, zlib

exe, golden = sys.argv[1], sys.argv[2]
base = os.path.join(golden, "v41-tiny", "fp32")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args, ok=True):
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"tessera {' '.join(args)} exited {p.returncode}")
    return p


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


with tempfile.TemporaryDirectory() as tmp:
    h, off = safetensors_header(os.path.join(base, "golden.safetensors"))
    prompts = []
    with open(os.path.join(base, "golden.safetensors"), "rb") as f:
        for i in (2, 3, 4):
            t = h[f"prompt.{i}"]
            f.seek(off + t["data_offsets"][0])
            b = f.read(t["data_offsets"][1] - t["data_offsets"][0])
            prompts.append(list(struct.unpack(f"<{len(b) // 8}q", b))[:40])
    pf = os.path.join(tmp, "prompts.jsonl")
    with open(pf, "w") as f:
        f.write("# golden prompts\n\n")
        f.write(json.dumps(prompts[0]) + "\n")
        f.write(json.dumps({"ids": prompts[1]}) + "\n")
        f.write(json.dumps(prompts[2]) + "\n")
    tokens = sum(len(p) for p in prompts)

    stats_f = os.path.join(tmp, "stats.json")
    run("calibrate", "--model", base, "--prompts", pf, "--out", stats_f)
    stats = json.load(open(stats_f))
    check(stats["tokens"] == tokens, "calibration token count")
    for l, row in enumerate(stats["count"]):
        check(sum(row) == tokens * stats["top_k"], f"layer {l} selections sum to tokens*k")

    for keep, n_kept in ((1.0, 8), (0.75, 6)):
        out = os.path.join(tmp, f"pruned{n_kept}")
        run("prune", "--model", base, "--stats", stats_f, "--keep", str(keep), "--out", out)
        insp = run("inspect", out).stdout
        check(any(l.split()[:2] == ["n_routed_experts", str(n_kept)] for l in insp.splitlines()),
              f"inspect shows n_routed_experts {n_kept}")
        check(f"model.layers.0.ffn.experts.{n_kept - 1}.w1.weight" in insp, "renumbered experts listed")
        check(f"model.layers.0.ffn.experts.{n_kept}.w1.weight" not in insp, "dropped experts absent")
        gen = run("generate", "--model", out, "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--ignore-eos").stdout
        check(len(gen.strip().split(",")) == 4, "pruned checkpoint generates 4 tokens")
        jf, pngf = os.path.join(tmp, f"r{n_kept}.json"), os.path.join(tmp, f"r{n_kept}.png")
        txt = run("verify", "retention", "--base", base, "--candidate", out, "--prompts", pf, "--json", jf, "--png", pngf).stdout
        r = json.load(open(jf))
        check(r["positions"] == tokens and len(r["kl_per_position"]) == tokens, "retention positions")
        check(set(r["kl"]) == {"mean", "p50", "p99", "max"}, "retention KL fields")
        check(len(r["routing_overlap"]) == len(stats["count"]), "routing overlap per layer")
        check("top1_agreement" in txt, "text report")
        if n_kept == 8:
            check(r["kl"]["max"] == 0.0 and r["top1_agreement"] == 1.0, "keep-all checkpoint has zero KL")
            check(all(o == 1.0 for o in r["routing_overlap"]), "keep-all routing overlap 1")
        png = open(pngf, "rb").read()
        check(png[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature")
        i, idat, w, hgt = 8, b"", 0, 0
        while i < len(png):
            n = struct.unpack(">I", png[i:i + 4])[0]
            t, d = png[i + 4:i + 8], png[i + 8:i + 8 + n]
            check(zlib.crc32(t + d) == struct.unpack(">I", png[i + 8 + n:i + 12 + n])[0], f"PNG {t} CRC")
            if t == b"IHDR":
                w, hgt = struct.unpack(">II", d[:8])
            if t == b"IDAT":
                idat += d
            i += 12 + n
        check(len(zlib.decompress(idat)) == hgt * (w + 1), "PNG scanlines decode")

    # Flag handling: on-the-fly pruning runs; bad values are named.
    g = run("generate", "--model", base, "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--prune-top-p", "0.5",
            "--prune-min-k", "1", "--prune-renorm", "orig", "--prune-scope", "all")
    check(len(g.stdout.strip().split(",")) >= 1, "generate with pruning flags")
    bad = run("generate", "--model", base, "--prompt-ids", "1", "--prune-scope", "prefill", ok=False)
    check(bad.returncode != 0 and "--prune-scope" in bad.stderr, "bad --prune-scope named")
    bad = run("serve", "--model", "stub", "--prune-top-p", "0.8", ok=False)
    check(bad.returncode == 2 and "need a DeepSeek-V4.1 model" in bad.stderr, "serve rejects pruning of the stub")
    bad = run("prune", "--model", base, "--stats", stats_f, "--keep", "0.1", "--out", os.path.join(tmp, "x"), ok=False)
    check(bad.returncode != 0 and "fewer than num_experts_per_tok" in bad.stderr, "too small --keep named")

print("failures:", len(failures))
sys.exit(1 if failures else 0)

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The built `tessera calibrate / prune / verify retention / generate / serve` on golden/v41-tiny/fp32:
calibration counts sum to tokens·k per layer; the pruned checkpoint inspects with n_routed_experts = kept,
generates, serves (greedy replies == `generate` token for token), and scores zero KL against the base run
when pruned to everything; the retention JSON carries the documented fields and the PNG decodes (CRC32
per chunk, zlib stream); `serve --prune-*` serves `generate --prune-*`'s tokens, which differ from the
unpruned ones; decode-scope pruning with an explicit drafter is refused. TESSERA_PRUNE_DEVICE=cuda serves and
generates the pruned models on the GPU model (the device run, scripts/device/prune.sh), where the tokens must
equal the CPU model's."""
import json, os, struct, subprocess, sys, tempfile, zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server", "clients"))
from harness import Server  # noqa: E402

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


SERVE_PROMPT, SERVE_TOKENS = [1, 5, 9, 13, 17, 21], 8
DEVICE = os.environ.get("TESSERA_PRUNE_DEVICE", "cpu")


def generate_ids(model, *flags, device="cpu"):
    out = run("generate", "--model", model, "--prompt-ids", ",".join(map(str, SERVE_PROMPT)), "--max-new-tokens",
              str(SERVE_TOKENS), "--ignore-eos", "--device", device, *flags).stdout
    return [int(x) for x in out.strip().split(",")]


def served_ids(model, *flags):
    """Greedy completion of SERVE_PROMPT by `tessera serve --model model --device DEVICE flags` (reply token ids)."""
    with Server(exe, "--model", model, "--device", DEVICE, *flags, scripts=False) as srv:
        body = {"prompt": SERVE_PROMPT, "max_tokens": SERVE_TOKENS, "ignore_eos": True, "temperature": 0,
                "return_token_ids": True}
        status, _, data = srv.request("POST", "/v1/completions", body)
        log = srv.read_log()
    if status != 200:
        return f"HTTP {status}: {data[:200]!r}", log
    return json.loads(data)["choices"][0].get("token_ids"), log


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
        want = generate_ids(out)
        got, log = served_ids(out)
        check(got == want, f"pruned checkpoint ({n_kept} experts) serves generate's tokens on {DEVICE}: {got} vs {want}")
        if DEVICE != "cpu":
            got = generate_ids(out, device=DEVICE)
            check(got == want, f"pruned checkpoint generates the CPU model's tokens on {DEVICE}: {got} vs {want}")
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
    # serve --prune-* runs the pruned model: the replies are generate --prune-*'s, not the unpruned ones.
    flags = ("--prune-top-p", "0.5", "--prune-min-k", "1", "--prune-scope", "all")
    pruned_want, unpruned = generate_ids(base, *flags), generate_ids(base)
    got, log = served_ids(base, *flags)
    check(got == pruned_want, f"serve --prune-top-p 0.5 on {DEVICE} replies with generate's pruned tokens: {got} vs {pruned_want}")
    if DEVICE != "cpu":
        got = generate_ids(base, *flags, device=DEVICE)
        check(got == pruned_want, f"generate --prune-top-p 0.5 on {DEVICE} gives the CPU model's tokens: {got} vs {pruned_want}")
    check(pruned_want != unpruned, f"top_p 0.5 changes the greedy tokens ({pruned_want} vs {unpruned})")
    check("expert pruning (lossy): top_p 0.5" in log, "serve names the pruning in its start line")
    bad = run("serve", "--model", base, "--port", "0", "--prune-top-p", "0.8", "--draft", "lookup", ok=False)
    check(bad.returncode == 2 and "not exact" in bad.stderr, "serve refuses decode-scope pruning with a drafter")
    bad = run("generate", "--model", base, "--prompt-ids", "1", "--prune-scope", "prefill", ok=False)
    check(bad.returncode != 0 and "--prune-scope" in bad.stderr, "bad --prune-scope named")
    bad = run("serve", "--model", "stub", "--prune-top-p", "0.8", ok=False)
    check(bad.returncode == 2 and "need a DeepSeek-V4.1 model" in bad.stderr, "serve rejects pruning of the stub")
    bad = run("prune", "--model", base, "--stats", stats_f, "--keep", "0.1", "--out", os.path.join(tmp, "x"), ok=False)
    check(bad.returncode != 0 and "fewer than num_experts_per_tok" in bad.stderr, "too small --keep named")

print("failures:", len(failures))
sys.exit(1 if failures else 0)

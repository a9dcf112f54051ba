#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs the built `tessera inspect` and `tessera make-synthetic` and checks what they print.

usage: cli_inspect_test.py TESSERA_EXE GOLDEN_DIR

* inspect on golden/v41-tiny/fp32 (folder), v41-tiny/bf16, and every golden/exl3/*.safetensors, in text and
  --json: the config values of spec/deepseek-v41.md §6, the tensor list read independently from the
  safetensors headers here, the layout, and each EXL3 group's K against golden/exl3/manifest.json;
* make-synthetic --preset tiny → inspect --json: config and (name, shape) set identical to the golden tiny
  fp32 checkpoint; bf16 keeps the golden's fp32 islands; the same seed gives identical bytes;
* bad input: a missing path and a truncated file fail with a message naming the file.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

EXE, GOLDEN = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args, expect_rc=0):
    p = subprocess.run([EXE, *args], capture_output=True, text=True)
    check(p.returncode == expect_rc, f"{args}: exit {p.returncode} (want {expect_rc}); stderr: {p.stderr.strip()}")
    return p


def header(path):
    """The tensors of a safetensors file, read directly (name -> (dtype, shape, nbytes))."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], v["data_offsets"][1] - v["data_offsets"][0]) for k, v in h.items()}


def inspect_json(path):
    p = run("inspect", path, "--json")
    return json.loads(p.stdout)


# --- golden v41-tiny -------------------------------------------------------------------------------------------
for variant in ("fp32", "bf16"):
    d = os.path.join(GOLDEN, "v41-tiny", variant)
    doc = inspect_json(d)
    want = header(os.path.join(d, "model.safetensors"))
    got = {t["name"]: (t["dtype"], t["shape"], t["bytes"]) for t in doc["tensors"]}
    check(got == want, f"{variant}: inspect's tensor list differs from the file header")
    check(doc["layout"] == "dense", f"{variant}: layout {doc['layout']}")
    check(all(t["kind"] == "dense" for t in doc["tensors"]), f"{variant}: non-dense kinds")
    cfg = doc["config"]
    check(cfg is not None, f"{variant}: no config")
    if cfg:
        for k, v in dict(vocab_size=512, hidden_size=64, num_hidden_layers=7, compress_ratios=[0, 2, 2, 2, 1, 1, 1],
                         kv_source_layer_ids=[1, 4], index_source_layer_ids=[1, 3, 4, 5], candidate_source_layer_id=4,
                         engram_layer_ids=[1, 5], engram_num_embeddings=[462, 630], swiglu_limit=0.6,
                         dspark_target_layer_ids=[3, 5, 6]).items():
            check(cfg.get(k) == v, f"{variant}: config {k} = {cfg.get(k)}, want {v}")
        check(cfg["rope_parameters"]["compress"]["factor"] == 4.0, f"{variant}: compress rope factor")
    totals = doc["totals"]
    check(totals["tensors"] == 352, f"{variant}: {totals['tensors']} tensors")
    want_dtypes = {"f32": 352} if variant == "fp32" else {"bf16": 289, "f32": 63}
    check(totals["dense_dtypes"] == want_dtypes, f"{variant}: dense dtypes {totals['dense_dtypes']}")
    text = run("inspect", d).stdout
    for needle in ("layout: dense", "model.layers.1.attn.compressor.wgate.weight", "kv_source_layer_ids",
                   "totals: 352 tensors", "[462, 630]"):
        check(needle in text, f"{variant}: text output lacks {needle!r}")

# --- golden EXL3 files ---------------------------------------------------------------------------------------------
manifest = json.load(open(os.path.join(GOLDEN, "exl3", "manifest.json")))
for fname, info in manifest["files"].items():
    path = os.path.join(GOLDEN, "exl3", fname)
    doc = inspect_json(path)
    fixtures = info["fixtures"]
    check(doc["config"] is None, f"{fname}: unexpected config")
    check(doc["layout"] == ("exl3" if fixtures else "dense"), f"{fname}: layout {doc['layout']}")
    groups = {g["prefix"]: g for g in doc["exl3_groups"]}
    check(len(groups) == len(fixtures), f"{fname}: {len(groups)} groups, manifest has {len(fixtures)}")
    for fx in fixtures:
        g = groups.get(fx["prefix"])
        check(g is not None and g["K"] == fx["bits"] and g["codebook"] == fx["codebook"]
              and g["in_features"] == fx["k"] and g["out_features"] == fx["n"]
              and g["half_rate_unverified"] == fx["half_rate_unverified"], f"{fname}: group {fx['prefix']} = {g}")
    if fixtures:
        ks = [fx["bits"] * fx["k"] * fx["n"] for fx in fixtures]
        avg = sum(ks) / sum(fx["k"] * fx["n"] for fx in fixtures)
        check(abs(doc["totals"]["exl3_avg_bits"] - avg) < 1e-12, f"{fname}: average bits {doc['totals']['exl3_avg_bits']}")
    text = run("inspect", path).stdout
    check(f"layout: {doc['layout']}" in text, f"{fname}: text layout line")
    if fixtures:
        check("exl3 groups: %d" % len(fixtures) in text, f"{fname}: text group count")
        check("exl3-trellis K=" in text, f"{fname}: text trellis kind")

# --- make-synthetic ------------------------------------------------------------------------------------------------
with tempfile.TemporaryDirectory() as tmp:
    gold = inspect_json(os.path.join(GOLDEN, "v41-tiny", "fp32"))
    out = os.path.join(tmp, "tiny")
    p = run("make-synthetic", "--out", out, "--preset", "tiny", "--seed", "3")
    check("352 tensors" in p.stdout, f"make-synthetic summary: {p.stdout.strip()}")
    mine = inspect_json(out)
    check({(t["name"], tuple(t["shape"])) for t in mine["tensors"]} ==
          {(t["name"], tuple(t["shape"])) for t in gold["tensors"]}, "synthetic tiny: (name, shape) set differs")
    check(mine["config"] == gold["config"], "synthetic tiny: config differs from the golden's")
    out_b = os.path.join(tmp, "tiny_bf16")
    run("make-synthetic", "--out", out_b, "--preset", "tiny", "--dtype", "bf16", "--seed", "3")
    gb = header(os.path.join(GOLDEN, "v41-tiny", "bf16", "model.safetensors"))
    mb = header(os.path.join(out_b, "model.safetensors"))
    check({k: v[0] for k, v in mb.items()} == {k: v[0] for k, v in gb.items()}, "synthetic bf16: dtypes differ")
    out_c = os.path.join(tmp, "tiny_again")
    run("make-synthetic", "--out", out_c, "--preset", "tiny", "--seed", "3")
    check(open(os.path.join(out, "model.safetensors"), "rb").read() ==
          open(os.path.join(out_c, "model.safetensors"), "rb").read(), "make-synthetic is not deterministic")
    big = os.path.join(tmp, "tiny_vocab")
    run("make-synthetic", "--out", big, "--preset", "tiny", "--vocab-size", "1000")
    check(inspect_json(big)["config"]["vocab_size"] == 1000, "--vocab-size ignored")
    run("make-synthetic", "--out", big, "--preset", "nope", expect_rc=2)
    run("make-synthetic", "--out", big, "--preset", "tiny", "--layers", "3", expect_rc=2)
    run("make-synthetic", "--preset", "tiny", expect_rc=2)

    # Quantized formats: tiny in the native FP8/FP4 layout; a scaled-down v41-flash (2 layers, 6 experts,
    # vocabulary 256) in EXL3 at 2.8 bpw: the layout is detected, and every tensor is where it belongs.
    q8 = os.path.join(tmp, "tiny_fp8")
    run("make-synthetic", "--out", q8, "--preset", "tiny", "--format", "fp8", "--seed", "3")
    j8 = inspect_json(q8)
    check(j8["layout"] == "native-fp8", f"fp8 layout: {j8['layout']}")
    k8 = {t["name"]: t["kind"] for t in j8["tensors"]}
    check(k8.get("model.layers.3.attn.wq_b.weight") == "fp8-weight", "fp8: wq_b not FP8")
    check(k8.get("model.layers.3.ffn.experts.5.w2.weight") == "fp4-weight", "fp8: experts not FP4")
    check(k8.get("model.layers.1.engram.embed.weight") == "engram-fp8-table", f"fp8: engram table {k8.get('model.layers.1.engram.embed.weight')}")
    check(j8["config"]["quantization_config"]["quant_method"] == "fp8", "fp8: quantization_config missing")
    qx = os.path.join(tmp, "flash_exl3")
    p = run("make-synthetic", "--out", qx, "--preset", "v41-flash", "--layers", "2", "--experts", "6",
            "--vocab-size", "256", "--format", "exl3:2.8")
    jx = inspect_json(qx)
    check(jx["layout"] == "exl3", f"exl3 layout: {jx['layout']}")
    ks = {g["prefix"]: g["K"] for g in jx["exl3_groups"]}
    check(ks.get("lm_head") == 6, "exl3: head K != 6")
    check(ks.get("model.layers.0.attn.wq_b") == 6 and ks.get("model.layers.1.attn.wq_b") == 5, "exl3: attention K")
    check(ks.get("model.layers.0.ffn.experts.5.w2") == 3, "exl3: layer-0 experts K != 3 at 2.8 bpw")
    check("model.layers.1.engram.wkv" in ks and "model.layers.0.ffn.gate" not in ks, "exl3: engram wkv / router")
    check(len(ks) == 2 * (5 + 3 * 7) + 1 + 1, f"exl3: {len(ks)} groups")
    check(jx["config"]["hidden_size"] == 5120 and jx["config"]["n_routed_experts"] == 6, "exl3: config")
    names = {t["name"] for t in jx["tensors"]}
    check({"engram_hash.multipliers", "engram_hash.token_map"} <= names, "v41-flash: Engram hash data missing")
    run("make-synthetic", "--out", qx, "--preset", "v41-flash", "--format", "exl3:9", expect_rc=2)
    run("make-synthetic", "--out", qx, "--preset", "v41-flash", "--format", "int4", expect_rc=2)
    run("make-synthetic", "--out", qx, "--preset", "tiny", "--experts", "6", expect_rc=2)

    # --- bad input ----------------------------------------------------------------------------------------------
    p = run("inspect", os.path.join(tmp, "missing"), expect_rc=1)
    check("missing" in p.stderr, "missing path not named")
    bad = os.path.join(tmp, "bad.safetensors")
    with open(os.path.join(GOLDEN, "exl3", "exl3_tables.safetensors"), "rb") as f:
        data = f.read()
    open(bad, "wb").write(data[:5000])
    p = run("inspect", bad, expect_rc=1)
    check("bad.safetensors" in p.stderr and "data section" in p.stderr, f"truncated file: {p.stderr.strip()}")
    run("inspect", expect_rc=2)

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)

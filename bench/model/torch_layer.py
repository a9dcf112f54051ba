#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch eager peer of bench_model: one DeepSeek-V4.1-Flash layer at the released shapes, in bf16,
written the way a Hugging Face eager implementation runs it (one kernel per torch op, experts looped).

Per layer: mHC pre-mix (unweighted RMS, the (2+n)·n mix projection, sigmoids, 20 Sinkhorn iterations,
collapse) for the attention and the FFN sites; RMSNorm; wq_a → q_norm → wq_b; wkv → kv_norm; RoPE on the
trailing 64 channels; attention of 64 query heads over one 512-wide K=V latent with per-head sinks over the
last W = 128 positions plus `index_topk` = 512 compressed entries (sparse attention over a gathered
set); the grouped output projection (8 groups of 1024) and wo_b; the mHC expand; the sqrt-softplus router
with bias, top-6 of 384, renormalised and scaled; 6 routed SwiGLU experts with the clamp and the shared
expert. Not included: the compressors, the indexer scoring and top-k, Engram, the FP8/FP4 quantisers
(their weights are < 3% of a layer's decode bytes). Random weights, fixed seed.

Prints one JSON object per line: decode step time per batch size (min of N steps, after warm-up, with
CUDA synchronisation) and prefill time per prompt length (attention over the window only, causal).
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

D, H, HD, QR, R, G, RO = 5120, 64, 512, 1280, 64, 8, 1024
E, K, I, N_HC, W, TOPK_C = 384, 6, 2304, 4, 128, 512
SINKHORN, SCALE, LIMIT = 20, 1.5, 10.0


def rms(x, w=None, eps=1e-20):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float() if w is not None else y).to(x.dtype)


class Layer:
    def __init__(self, dev):
        g = torch.Generator(device=dev).manual_seed(0)

        def p(*shape, std=0.02, dtype=torch.bfloat16):
            return (torch.randn(*shape, generator=g, device=dev) * std).to(dtype)

        self.hc = {s: (p((2 + N_HC) * N_HC, N_HC * D, dtype=torch.float32), p((2 + N_HC) * N_HC, std=0.5, dtype=torch.float32))
                   for s in ("attn", "ffn")}
        self.attn_norm, self.ffn_norm = p(D, std=0.1) + 1, p(D, std=0.1) + 1
        self.wq_a, self.q_norm, self.wq_b = p(QR, D), p(QR, std=0.1) + 1, p(H * HD, QR)
        self.wkv, self.kv_norm = p(HD, D), p(HD, std=0.1) + 1
        self.sink = p(H, std=1.0, dtype=torch.float32)
        self.wo_a, self.wo_b = p(G, RO, H * HD // G), p(D, G * RO)
        self.gate, self.bias = p(E, D, dtype=torch.float32), p(E, std=0.1, dtype=torch.float32)
        # Experts as one [E, I, D] tensor per projection: an eager implementation indexes one expert at a time.
        self.w1, self.w3, self.w2 = p(E, I, D), p(E, I, D), p(E, D, I)
        self.s1, self.s3, self.s2 = p(I, D), p(I, D), p(D, I)
        inv = 1.0 / (10000 ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
        self.inv_freq = inv.to(dev)

    def hc_pre(self, x, site):  # x [T, n, D] -> collapsed [T, D], post [T, n], res [T, n, n]
        fn, base = self.hc[site]
        flat = x.float().reshape(x.shape[0], -1)
        flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-20)
        mix = flat @ fn.t() + base
        pre = torch.sigmoid(mix[:, :N_HC]) + 1e-6
        post = 2 * torch.sigmoid(mix[:, N_HC:2 * N_HC])
        res = torch.softmax(mix[:, 2 * N_HC:].reshape(-1, N_HC, N_HC), -1) + 1e-6
        for _ in range(SINKHORN):
            res = res / res.sum(-1, keepdim=True)
            res = res / res.sum(-2, keepdim=True)
        h = (pre.unsqueeze(-1) * x.float()).sum(1)
        return h.to(x.dtype), post, res

    def hc_post(self, x, y, post, res):
        return (torch.einsum("tij,tjd->tid", res, x.float()) + post.unsqueeze(-1) * y.float().unsqueeze(1)).to(x.dtype)

    def rope(self, t, pos):  # t [..., T, R] interleaved pairs
        ang = pos.float().unsqueeze(-1) * self.inv_freq
        c, s = torch.cos(ang), torch.sin(ang)
        a, b = t[..., 0::2].float(), t[..., 1::2].float()
        out = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)
        return out.to(t.dtype)

    def attention(self, h, kv_cache, pos):
        # h [T, D]; kv_cache [S, HD] (window + gathered compressed entries), the new rows appended.
        T = h.shape[0]
        q = F.linear(rms(F.linear(h, self.wq_a), self.q_norm), self.wq_b).view(T, H, HD)
        kv = rms(F.linear(h, self.wkv), self.kv_norm)
        q = torch.cat((q[..., :-R], self.rope(q[..., -R:], pos.unsqueeze(-1).expand(T, H))), -1)
        kv = torch.cat((kv[..., :-R], self.rope(kv[..., -R:], pos)), -1)
        keys = torch.cat((kv_cache, kv), 0)  # [S+T, HD]
        scores = torch.einsum("thd,sd->ths", q.float(), keys.float()) / HD ** 0.5
        S = keys.shape[0]
        if T > 1:  # causal over the new rows (prefill)
            cols = torch.arange(S, device=h.device)
            mask = cols.unsqueeze(0) > (S - T + torch.arange(T, device=h.device)).unsqueeze(1)
            scores = scores.masked_fill(mask.unsqueeze(1), float("-inf"))
        scores = torch.cat((scores, self.sink.view(1, H, 1).expand(T, H, 1)), -1)
        p = torch.softmax(scores, -1)[..., :-1]
        o = torch.einsum("ths,sd->thd", p, keys.float()).to(h.dtype)
        o = torch.cat((o[..., :-R], self.rope(o[..., -R:], -pos.unsqueeze(-1).expand(T, H))), -1)
        o = torch.einsum("tgc,grc->tgr", o.reshape(T, G, -1), self.wo_a)
        return F.linear(o.reshape(T, G * RO), self.wo_b)

    def moe(self, h):
        logits = h.float() @ self.gate.t()
        scores = torch.sqrt(F.softplus(logits))
        idx = torch.topk(scores + self.bias, K, -1).indices
        w = scores.gather(-1, idx)
        w = w / w.sum(-1, keepdim=True) * SCALE
        out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        for e in torch.unique(idx).tolist():  # HF eager: loop over the experts hit
            rows, slot = torch.where(idx == e)
            x = h[rows]
            g = F.linear(x, self.w1[e]).clamp(max=LIMIT)
            u = F.linear(x, self.w3[e]).clamp(-LIMIT, LIMIT)
            y = F.linear(F.silu(g) * u, self.w2[e])
            out.index_add_(0, rows, y.float() * w[rows, slot].unsqueeze(-1))
        sh = F.linear(F.silu(F.linear(h, self.s1)) * F.linear(h, self.s3), self.s2)
        return (out + sh.float()).to(h.dtype)

    def forward(self, x, kv_cache, pos):  # x [T, n, D]
        h, post, res = self.hc_pre(x, "attn")
        y = self.attention(rms(h, self.attn_norm), kv_cache, pos)
        x = self.hc_post(x, y, post, res)
        h, post, res = self.hc_pre(x, "ffn")
        y = self.moe(rms(h, self.ffn_norm))
        return self.hc_post(x, y, post, res)


def timed(fn, reps):
    best = float("inf")
    for i in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i > 0:
            best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--prefill", default="1024,8192")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    layer = Layer(dev)
    with torch.no_grad():
        for B in [int(b) for b in args.batches.split(",")]:
            # Each sequence attends W − 1 window rows + TOPK_C gathered compressed entries: one cache each.
            caches = [torch.randn(W - 1 + TOPK_C, HD, device=dev).to(torch.bfloat16) for _ in range(B)]
            x = torch.randn(B, N_HC, D, device=dev).to(torch.bfloat16)
            pos = torch.full((1,), 4096, device=dev)

            def step():  # eager engines batch the dense parts; attention per sequence (its own cache)
                h, post, res = layer.hc_pre(x, "attn")
                hn = rms(h, layer.attn_norm)
                ys = [layer.attention(hn[b:b + 1], caches[b], pos) for b in range(B)]
                y = torch.cat(ys, 0)
                x2 = layer.hc_post(x, y, post, res)
                h, post, res = layer.hc_pre(x2, "ffn")
                return layer.hc_post(x2, layer.moe(rms(h, layer.ffn_norm)), post, res)

            t = timed(step, args.steps)
            print(json.dumps({"bench": "torch_decode_layer", "batch": B, "layer_ms": round(t * 1e3, 3),
                              "tok_s_40_layers": round(B / (t * 40), 2)}), flush=True)
        for L in [int(v) for v in args.prefill.split(",")]:
            x = torch.randn(L, N_HC, D, device=dev).to(torch.bfloat16)
            pos = torch.arange(L, device=dev)
            empty = torch.zeros(0, HD, device=dev, dtype=torch.bfloat16)
            try:
                t = timed(lambda: layer.forward(x, empty, pos), 2)
            except torch.cuda.OutOfMemoryError:
                print(json.dumps({"bench": "torch_prefill_layer", "tokens": L, "error": "out of memory"}), flush=True)
                torch.cuda.empty_cache()
                continue
            print(json.dumps({"bench": "torch_prefill_layer", "tokens": L, "layer_ms": round(t * 1e3, 2),
                              "tok_s_40_layers": round(L / (t * 40), 1),
                              "note": "prefill attention is full causal over the prompt (no window/sparsity)"}),
                  flush=True)


if __name__ == "__main__":
    main()

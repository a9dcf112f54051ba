#!/usr/bin/env python3
"""Measures CUDA's rsqrtf (the hardware reciprocal square root torch.rsqrt uses on the GPU) on every fp32 in
[1, 4) and writes, per input, its offset in ulps from the correctly rounded 1/sqrt(x) as int8, zlib level 9:
ops/core/cuda_rsqrtf_sm90.i8.zlib. rsqrtf(x·4^k) = rsqrtf(x)·2^-k exactly (checked here for k in ±20), so
the table covers every positive normal input. Run on a GPU machine with PyTorch: the table Tessera ships was
measured on an NVIDIA H200 (sm_90, CUDA 13.0, torch 2.11.0+cu130)."""
import hashlib
import sys
import zlib

import numpy as np
import torch

out = sys.argv[1] if len(sys.argv) > 1 else "ops/core/cuda_rsqrtf_sm90.i8.zlib"
x = (torch.arange(0, 1 << 24, dtype=torch.int64, device="cuda") + (127 << 23)).to(torch.int32).view(torch.float32)
y = torch.rsqrt(x)
exact = (1.0 / torch.sqrt(x.double())).float()
off = y.view(torch.int32) - exact.view(torch.int32)
assert int(off.abs().max()) < 128
for k in (-20, -3, 1, 5, 20):
    assert bool((torch.rsqrt(x * 4.0**k) == y * 2.0**-k).all()), f"rsqrtf is not 4^k-invariant at k={k}"
raw = off.to(torch.int8).cpu().numpy().tobytes()
open(out, "wb").write(zlib.compress(raw, 9))
print(f"{torch.cuda.get_device_name()}: {int((off != 0).sum())} of {1 << 24} inputs differ from the correctly rounded "
      f"value, offsets {int(off.min())}..{int(off.max())} ulp; sha256(raw) {hashlib.sha256(raw).hexdigest()}")

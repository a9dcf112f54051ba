#!/usr/bin/env python3
"""The table behind ref::cuda_expf (ops/core/cuda_expf.cpp): CUDA's expf on the CPU, bit for bit.

CUDA's expf reduces x to r = x·log2(e) − j with IEEE fma steps, evaluates 2^r with the hardware approximation
ex2.approx.ftz.f32 (MUFU.EX2) and scales by 2^j. Only MUFU.EX2 is not plain IEEE arithmetic. On sm_90 its result
depends on r only through q = trunc(|r|·2^23) (properties P1–P3 of scripts/cuda_ex2_measure.cu, checked on every
fp32 input by the measurement), so two grids of 2^23 values — y+[i] = ex2(i·2^-23) and y-[i] = ex2(−i·2^-23) —
determine it everywhere.

  measure (GPU machine):  gen_cuda_expf_table.py measure DIR   → DIR/ex2_pos.u32, DIR/ex2_neg.u32 (raw grids)
  build   (any machine):  gen_cuda_expf_table.py build DIR [OUT] → OUT (default ops/core/cuda_ex2_sm90.bin.zlib)

Table layout (zlib level 9 over): b"TSEX2v1\\0"; uint64 FNV-1a-64 of the raw grids (y+ then y-, uint32 LE);
uint32 E; E × (uint32 key = sign<<31 | i, uint32 y bits); 2^23 int8 offsets of y+[i] from float(exp2(i·2^-23));
2^23 int8 offsets of y-[i] from float(exp2(−i·2^-23)). exp2 is the C library's double exp2, rounded once to fp32.
The E exceptions are the grid points whose double exp2 lies within 2^-20 fp32 ulp of an fp32 rounding midpoint,
where a C library's last-bit error could change the rounded base; they are stored verbatim. The library checks the
FNV hash against its own reconstruction in verify/ref (cuda_expf_test).
"""
import math
import os
import struct
import subprocess
import sys
import zlib

N = 1 << 23


def fnv1a64_fast(arr) -> int:
    # Byte-serial FNV-1a is inherently sequential; this compiled helper keeps the build step at seconds.
    import ctypes
    import tempfile
    src = r"""
    #include <stdint.h>
    #include <stddef.h>
    uint64_t fnv(const uint8_t* p, size_t n){ uint64_t h=0xcbf29ce484222325ull; for(size_t i=0;i<n;++i){ h^=p[i]; h*=0x100000001b3ull; } return h; }
    """
    d = tempfile.mkdtemp()
    c, so = os.path.join(d, "f.c"), os.path.join(d, "f.so")
    open(c, "w").write(src)
    subprocess.check_call(["cc", "-O2", "-shared", "-fPIC", "-o", so, c])
    lib = ctypes.CDLL(so)
    lib.fnv.restype = ctypes.c_uint64
    lib.fnv.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib.fnv(arr.ctypes.data, arr.size)


def measure(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    exe = os.path.join(out_dir, "cuda_ex2_measure")
    subprocess.check_call(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O2", "-o", exe,
                           os.path.join(here, "cuda_ex2_measure.cu")])
    rc = subprocess.call([exe, os.path.join(out_dir, "ex2_pos.u32"), os.path.join(out_dir, "ex2_neg.u32")])
    if rc != 0:
        sys.exit(f"measurement failed or a property does not hold (exit {rc})")


def build(raw_dir, out):
    import numpy as np
    pos = np.fromfile(os.path.join(raw_dir, "ex2_pos.u32"), dtype="<u4")
    neg = np.fromfile(os.path.join(raw_dir, "ex2_neg.u32"), dtype="<u4")
    assert pos.size == N and neg.size == N
    digest = fnv1a64_fast(np.concatenate([pos, neg]).view(np.uint8))
    exceptions, offsets = [], []
    for sign, raw in ((0, pos), (1, neg)):
        # The C library's double exp2 (what the runtime calls), rounded once to fp32 by numpy's IEEE cast.
        e = np.array([math.exp2(-i / N if sign else i / N) for i in range(N)], dtype=np.float64)
        c = e.astype(np.float32)
        ulp = np.ldexp(1.0, np.frexp(c.astype(np.float64))[1] - 24)
        mid = c.astype(np.float64) + np.where(e > c, 0.5, -0.5) * ulp
        near = np.abs(e - mid) < np.ldexp(ulp, -20)
        d = raw.astype(np.int64) - c.view(np.uint32).astype(np.int64)
        d[near] = 0
        assert np.abs(d).max() <= 127
        exceptions += [(sign << 31 | int(i), int(raw[i])) for i in np.nonzero(near)[0]]
        offsets.append(d.astype(np.int8))
    blob = b"TSEX2v1\0" + struct.pack("<QI", digest, len(exceptions))
    blob += b"".join(struct.pack("<II", k, y) for k, y in exceptions)
    blob += offsets[0].tobytes() + offsets[1].tobytes()
    open(out, "wb").write(zlib.compress(blob, 9))
    nz = [int((o != 0).sum()) for o in offsets]
    print(f"{out}: {os.path.getsize(out)} bytes; exceptions {len(exceptions)}; offsets ≠ 0: y+ {nz[0]}, y- {nz[1]} "
          f"of {N}; FNV-1a-64 of the raw grids {digest:016x}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "measure":
        measure(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "ops/core/cuda_ex2_sm90.bin.zlib")
    else:
        sys.exit(__doc__)

// SPDX-License-Identifier: Apache-2.0
/// Device arithmetic that mirrors the CPU references bit for bit (include/tessera/ref/common_ref.hpp):
/// dot_step acc ← rn(acc + rn(a·b)) for the references' separately rounded sums (elementwise product then
/// reduction in the golden engine), fma_step for their FMA chains, dot_chunk32 for ref::dot.
#pragma once

#include <cstdint>

namespace tessera::dev {
__device__ __forceinline__ float dot_step(float acc, float a, float b) { return __fadd_rn(acc, __fmul_rn(a, b)); }

/// One fused multiply-add step acc ← rn(a·b + acc): the step of ref::dot's chunk chains and of
/// ref::dot_fma_seq (the golden engine's GEMM orders, include/tessera/ref/common_ref.hpp).
__device__ __forceinline__ float fma_step(float acc, float a, float b) { return __fmaf_rn(a, b, acc); }

/// ref::dot: Σ a[i]·b[i·sb] with K cut into chunks of 32, each a sequential FMA chain from 0, the chunk sums
/// added in order. One thread computes one dot product.
__device__ __forceinline__ float dot_chunk32(float const* a, float const* b, int64_t n, int64_t sb = 1) {
  float total = 0.f;
  for (int64_t c0 = 0; c0 < n; c0 += 32) {
    int64_t const c1 = c0 + 32 < n ? c0 + 32 : n;
    float acc = 0.f;
    for (int64_t i = c0; i < c1; ++i) acc = __fmaf_rn(a[i], b[i * sb], acc);
    total = c0 == 0 ? acc : __fadd_rn(total, acc);
  }
  return total;
}
}  // namespace tessera::dev

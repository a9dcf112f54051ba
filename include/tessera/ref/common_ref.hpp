// SPDX-License-Identifier: Apache-2.0
/// Shared scalar helpers of the CPU references: the model-dtype rounding "→md" of
/// spec/deepseek-v41.md §2 (identity for fp32, RNE to bf16 for bf16), the sequential dot product every
/// reference uses (row invariance: a row's result never depends on other rows), and the fp32 activation
/// functions in the form the golden engine evaluates them (torch CUDA elementwise kernels).
#pragma once

#include <cmath>
#include <cstdint>

#include "tessera/core/dtype.hpp"
#include "tessera/core/fmath.hpp"

namespace tessera::ref {

/// "→md": the cast to the model dtype (fp32: exact; bf16: round to nearest even).
inline float round_md(float x, DType md) { return md == DType::kBf16 ? round_to_bf16(x) : x; }

/// Σ_i a[i]·b[i] in fp32 in the golden engine's GEMM order: the index range is cut into chunks of
/// kDotChunk = 32 consecutive elements; each chunk is a sequential fused multiply-add chain in index order
/// starting from 0 (one rounding per step), and the chunk sums are added in chunk order. This is the order
/// cuBLAS's fp32 GEMM (H200, CUDA 13) takes for every multi-row linear of golden/v41-tiny (K = 32, 64, 256;
/// verified bitwise on the reference's own intermediate tensors). The order depends only on n, so every row
/// is bit-identical whatever the batch or chunk around it, and a GPU kernel that walks K in 32-wide tiles
/// with one FMA accumulator per tile reproduces it exactly.
inline constexpr int64_t kDotChunk = 32;
inline float dot(float const* a, float const* b, int64_t n) {
  float total = 0.f;
  for (int64_t c0 = 0; c0 < n; c0 += kDotChunk) {
    int64_t const c1 = c0 + kDotChunk < n ? c0 + kDotChunk : n;
    float acc = 0.f;
    for (int64_t i = c0; i < c1; ++i) acc = std::fma(a[i], b[i], acc);
    total = c0 == 0 ? acc : total + acc;
  }
  return total;
}

/// Σ_i a[i]·b[i] as one sequential fused multiply-add chain in index order: the order of the golden engine's
/// batched matrix products (torch.matmul / einsum → cuBLAS batched GEMM: attention scores, probabilities
/// times values, the mHC mixing), verified bitwise on its intermediate tensors. `stride_b` walks b.
inline float dot_fma_seq(float const* a, float const* b, int64_t n, int64_t stride_b = 1) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(a[i], b[i * stride_b], acc);
  return acc;
}

/// linear_row in the batched-GEMM order (one FMA chain per output): the grouped output projection, a bmm
/// in the golden engine.
inline void linear_row_fma_seq(float const* x, float const* w, int64_t in, int64_t out, float* y, DType md) {
  for (int64_t o = 0; o < out; ++o) y[o] = round_md(dot_fma_seq(x, w + o * in, in), md);
}

/// y[o] = →md(Σ_i x[i]·W[o, i]) for o < out: one row of a bias-free linear layer, W row-major [out, in].
inline void linear_row(float const* x, float const* w, int64_t in, int64_t out, float* y, DType md) {
  for (int64_t o = 0; o < out; ++o) y[o] = round_md(dot(x, w + o * in, in), md);
}

/// exp(x) as the golden engine evaluates it on the GPU: CUDA's expf (behind torch.exp, softmax, sigmoid, SiLU and
/// softplus), which is not correctly rounded. Replayed bit for bit from its IEEE range reduction and the measured
/// grids of the hardware ex2.approx (ops/core/cuda_expf.cpp).
float cuda_expf(float x);
/// CUDA's ex2.approx.ftz.f32: the hardware 2^r inside expf.
float cuda_ex2(float r);
/// FNV-1a-64 of the ex2 grids as the table generator measured them, and of this library's reconstruction of them;
/// equal on every platform where the replay is exact (verify/ref/cuda_expf_test.cpp).
uint64_t cuda_ex2_table_digest();
uint64_t cuda_ex2_grid_digest();

inline float sigmoid(float x) { return 1.f / (1.f + fmath::exp_rn(-x)); }
inline float silu(float x) { return x / (1.f + fmath::exp_rn(-x)); }
/// torch softplus with β = 1 and threshold 20: x itself above the threshold.
inline float softplus(float x) { return x > 20.f ? x : fmath::log1p_rn(fmath::exp_rn(x)); }
/// rsqrt(x) as the golden engine evaluates it: CUDA's rsqrtf (torch.rsqrt on the GPU), which is not
/// correctly rounded (on an H200 it differs from 1/√x rounded once on 21.7% of inputs, by −2…+1 ulp). The
/// measured per-input offsets for [1, 4) ship with the library (ops/core/cuda_rsqrtf.cpp); rsqrtf(x·4^k) =
/// rsqrtf(x)·2^−k extends them to every positive normal x. Zero, negative, subnormal, infinite and NaN
/// inputs take 1/√x rounded once, which is what rsqrtf returns there too.
float rsqrt(float x);
/// 1/√x rounded once to fp32 (through fp64: the double-rounding error is below 2⁻²⁹ ulp).
inline float rsqrt_correctly_rounded(float x) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(x))); }

}  // namespace tessera::ref

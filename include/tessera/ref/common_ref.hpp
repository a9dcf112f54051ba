// SPDX-License-Identifier: Apache-2.0
/// Shared scalar helpers of the CPU references: the model-dtype rounding "→md" of
/// spec/deepseek-v41.md §2 (identity for fp32, RNE to bf16 for bf16), the sequential dot product every
/// reference uses (row invariance: a row's result never depends on other rows), and the fp32 activation
/// functions in the form the golden engine evaluates them (torch CUDA elementwise kernels).
#pragma once

#include <cmath>
#include <cstdint>

#include "tessera/core/dtype.hpp"
#include "tessera/core/cuda_math.hpp"
#include "tessera/core/fmath.hpp"
#include "tessera/core/tensor_core.hpp"

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

/// Σ_i a[i]·b[i·stride_b] of bf16 values in the order of the golden engine's bf16 GEMMs, which run on tensor
/// cores: K in blocks of 16 products, each block added exactly to the aligned fp32 accumulator and the sum
/// truncated toward zero (tc::BlockAcc, core/tensor_core.hpp).
inline float dot_tc(float const* a, float const* b, int64_t n, int64_t stride_b = 1) {
  tc::BlockAcc acc;
  for (int64_t i = 0; i < n; ++i) acc.step(a[i], b[i * stride_b]);
  return acc.value();
}

/// The dot product behind one output of a GEMM whose result is →md (nn.Linear, F.linear): the tensor-core order
/// when md is bf16 (both operands bf16), cuBLAS SGEMM's chunked order when it is fp32.
inline float gemm_dot(float const* a, float const* b, int64_t n, DType md) {
  return md == DType::kBf16 ? dot_tc(a, b, n) : dot(a, b, n);
}

/// The same for a batched product (torch.bmm, torch.matmul of batched operands, einsum): the tensor-core order
/// for bf16, one FMA chain for fp32.
inline float bmm_dot(float const* a, float const* b, int64_t n, DType md, int64_t stride_b = 1) {
  return md == DType::kBf16 ? dot_tc(a, b, n, stride_b) : dot_fma_seq(a, b, n, stride_b);
}

/// linear_row in the batched-GEMM order (bmm_dot): the grouped output projection, a bmm in the golden engine.
inline void linear_row_fma_seq(float const* x, float const* w, int64_t in, int64_t out, float* y, DType md) {
  for (int64_t o = 0; o < out; ++o) y[o] = round_md(bmm_dot(x, w + o * in, in, md), md);
}

/// y[o] = →md(Σ_i x[i]·W[o, i]) for o < out in gemm_dot's order: one row of a bias-free linear layer, W
/// row-major [out, in].
inline void linear_row(float const* x, float const* w, int64_t in, int64_t out, float* y, DType md) {
  for (int64_t o = 0; o < out; ++o) y[o] = round_md(gemm_dot(x, w + o * in, in, md), md);
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

/// e^x and ln(1 + x) of the model dtype's arithmetic. bf16: the golden engine's own CUDA math library
/// (cuda_expf, cuda_math::log1pf), with which the bf16 model reproduces the golden's one-shot forward bit for bit.
/// fp32: correctly rounded (fmath::exp_rn / log1p_rn): the golden's fp32 GEMM orders change with the row count,
/// so the fp32 model cannot be bitwise, and CUDA's expf measurably moves it further from the golden logits
/// (docs/deepseek-v41-cpu.md "Numerics").
inline float exp_md(float x, DType md) { return md == DType::kBf16 ? cuda_expf(x) : fmath::exp_rn(x); }
inline float log1p_md(float x, DType md) { return md == DType::kBf16 ? cuda_math::log1pf(x) : fmath::log1p_rn(x); }

/// torch's sigmoid, SiLU and softplus (β = 1, threshold 20: x itself above it) on exp_md / log1p_md.
inline float sigmoid(float x, DType md) { return 1.f / (1.f + exp_md(-x, md)); }
inline float silu(float x, DType md) { return x / (1.f + exp_md(-x, md)); }
inline float softplus(float x, DType md) { return x > 20.f ? x : log1p_md(exp_md(x, md), md); }
/// The fp32 forms (correctly rounded exp and ln(1 + ·)).
inline float sigmoid(float x) { return sigmoid(x, DType::kF32); }
inline float silu(float x) { return silu(x, DType::kF32); }
inline float softplus(float x) { return softplus(x, DType::kF32); }

/// Σ_i v[i] in the order of torch's warp-per-row softmax (softmax_warp_forward, rows of at most 1024 columns; the
/// golden engine's F.softmax over the last dimension): the value in column c joins lane c mod 32, each lane adds
/// its values in increasing column order starting from 0, and the 32 lane sums are folded by halving (lane t +=
/// lane t + h for h = 16, 8, 4, 2, 1). Masked columns hold exp(−∞) = 0 there and change nothing, so only the
/// listed values are needed; col(i) is the column of v(i), increasing in i.
template <class Val, class Col>
inline float warp_softmax_sum(int64_t n, Val&& v, Col&& col) {
  float lane[32] = {};
  for (int64_t i = 0; i < n; ++i) {
    float& l = lane[col(i) & 31];
    l = l + v(i);
  }
  for (int h = 16; h > 0; h /= 2)
    for (int t = 0; t < h; ++t) lane[t] = lane[t] + lane[t + h];
  return lane[0];
}
/// rsqrt(x) as the golden engine evaluates it: CUDA's rsqrtf (torch.rsqrt on the GPU), which is not
/// correctly rounded (on an H200 it differs from 1/√x rounded once on 21.7% of inputs, by −2…+1 ulp). The
/// measured per-input offsets for [1, 4) ship with the library (ops/core/cuda_rsqrtf.cpp); rsqrtf(x·4^k) =
/// rsqrtf(x)·2^−k extends them to every positive normal x. Zero, negative, subnormal, infinite and NaN
/// inputs take 1/√x rounded once, which is what rsqrtf returns there too.
float rsqrt(float x);
/// 1/√x rounded once to fp32 (through fp64: the double-rounding error is below 2⁻²⁹ ulp).
inline float rsqrt_correctly_rounded(float x) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(x))); }

}  // namespace tessera::ref

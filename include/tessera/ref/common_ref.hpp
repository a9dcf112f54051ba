// SPDX-License-Identifier: Apache-2.0
/// Shared scalar helpers of the CPU references: the model-dtype rounding "→md" of
/// spec/deepseek-v41.md §2 (identity for fp32, RNE to bf16 for bf16), the sequential dot product every
/// reference uses (row invariance: a row's result never depends on other rows), and the fp32 activation
/// functions in the form the golden engine evaluates them (torch CUDA elementwise kernels).
#pragma once

#include <cmath>
#include <cstdint>

#include "tessera/core/dtype.hpp"

namespace tessera::ref {

/// "→md": the cast to the model dtype (fp32: exact; bf16: round to nearest even).
inline float round_md(float x, DType md) { return md == DType::kBf16 ? round_to_bf16(x) : x; }

/// Σ_i a[i]·b[i] in fp32, accumulated sequentially in index order with a rounding after every product
/// and every addition (no FMA contraction: the build is ISO C++ without -ffp-contract=fast). The order
/// depends only on n, so every row computed with it is bit-identical whatever the batch or chunk around
/// it. Of the orders tried (8 interleaved partial sums, sequential FMA, fp64), this one lands closest to
/// the golden's cached-decode logits on golden/v41-tiny.
inline float dot(float const* a, float const* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

/// y[o] = →md(Σ_i x[i]·W[o, i]) for o < out: one row of a bias-free linear layer, W row-major [out, in].
inline void linear_row(float const* x, float const* w, int64_t in, int64_t out, float* y, DType md) {
  for (int64_t o = 0; o < out; ++o) y[o] = round_md(dot(x, w + o * in, in), md);
}

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu(float x) { return x / (1.f + std::exp(-x)); }
/// torch softplus with β = 1 and threshold 20: x itself above the threshold.
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }
inline float rsqrt(float x) { return 1.f / std::sqrt(x); }

}  // namespace tessera::ref

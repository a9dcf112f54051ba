// SPDX-License-Identifier: Apache-2.0
/// Manifold-constrained hyper-connections, single pass (spec/deepseek-v41.md §2.3), all fp32:
///   f = x·rsqrt(mean(x²)+eps) over the flattened n·D streams (stream-major); m = f·fnᵀ [(2+n)n];
///   pre_k = σ(m_k·s0 + b_k) + hc_eps; post_k = 2σ(m_{n+k}·s1 + b_{n+k});
///   C⁰[j,k] = m_{2n+jn+k}·s2 + b_{2n+jn+k}; C = softmax_k(C⁰) + hc_eps; C /= (Σ_j C + hc_eps); then
///   (iters−1)× { C /= (Σ_k C + hc_eps); C /= (Σ_j C + hc_eps) }: one softmax, iters−1 row and iters
///   column normalisations, ending on a column normalisation.
///   Sums in the golden engine's torch orders: the softmax denominator as torch's warp softmax
///   (warp_softmax_sum: lane k, halving fold), the row sums Σ_k as its innermost-dimension reduction (lane_sum),
///   the column sums Σ_j sequentially in j (a strided reduction, one thread per output). exp and sigmoid in the
///   model dtype's arithmetic (exp_md); md never rounds anything here (the mix is an fp32 island).
///   collapse(X, p) = →md(Σ_k p_k·X_k); expand_k = →md(post_k·y + Σ_j C[j,k]·X_j) (the Σ_j formed first,
///   as a sequential FMA chain over j: the golden engine's einsum → batched GEMM order).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/ref/norm_ref.hpp"

namespace tessera::ref {

/// x [n·D] fp32 (stream-major), fn [(2+n)n, n·D], base [(2+n)n], scale [3] → pre [n], post [n], comb [n·n]
/// (row j = input stream, column k = output stream). `scratch` holds n·D + (2+n)n floats.
inline void mhc_mix_row(float const* x, float const* fn, float const* base, float const* scale, int64_t n,
                        int64_t d, int iters, float hc_eps, float norm_eps, DType md, float* pre, float* post,
                        float* comb, float* scratch) {
  int64_t nd = n * d, nm = (2 + n) * n;
  float* f = scratch;
  float* m = scratch + nd;
  rms_norm_row(x, nullptr, nd, norm_eps, DType::kF32, f);
  for (int64_t o = 0; o < nm; ++o) m[o] = dot(f, fn + o * nd, nd);
  for (int64_t k = 0; k < n; ++k) {
    float a = m[k] * scale[0];
    pre[k] = sigmoid(a + base[k], md) + hc_eps;
    float b = m[n + k] * scale[1];
    post[k] = 2.f * sigmoid(b + base[n + k], md);
  }
  for (int64_t j = 0; j < n; ++j) {
    float* row = comb + j * n;
    float mx = -INFINITY;
    for (int64_t k = 0; k < n; ++k) {
      float c = m[2 * n + j * n + k] * scale[2];
      row[k] = c + base[2 * n + j * n + k];
      mx = std::max(mx, row[k]);
    }
    for (int64_t k = 0; k < n; ++k) row[k] = exp_md(row[k] - mx, md);
    float const s = warp_softmax_sum(n, [row](int64_t k) { return row[k]; }, [](int64_t k) { return k; });
    for (int64_t k = 0; k < n; ++k) row[k] = row[k] / s + hc_eps;
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < n; ++k) {
      float s = 0.f;
      for (int64_t j = 0; j < n; ++j) s += comb[j * n + k];
      float den = s + hc_eps;
      for (int64_t j = 0; j < n; ++j) comb[j * n + k] /= den;
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float const s = lane_sum(n, [row = comb + j * n](int64_t k) { return row[k]; });
      float den = s + hc_eps;
      for (int64_t k = 0; k < n; ++k) comb[j * n + k] /= den;
    }
  };
  col_norm();
  for (int it = 0; it < iters - 1; ++it) { row_norm(); col_norm(); }
}

/// out [D] = →md(Σ_k pre_k·x_k), x [n, D].
inline void mhc_collapse_row(float const* x, float const* pre, int64_t n, int64_t d, DType md, float* out) {
  for (int64_t i = 0; i < d; ++i) {
    float s = 0.f;
    for (int64_t k = 0; k < n; ++k) s += pre[k] * x[k * d + i];
    out[i] = round_md(s, md);
  }
}

/// out [n, D]: out_k = →md(post_k·y + Σ_j comb[j,k]·x_j). `out` must not alias `x`.
inline void mhc_expand_row(float const* y, float const* x, float const* post, float const* comb, int64_t n,
                           int64_t d, DType md, float* out) {
  for (int64_t k = 0; k < n; ++k)
    for (int64_t i = 0; i < d; ++i) {
      float mixed = 0.f;
      for (int64_t j = 0; j < n; ++j) mixed = std::fma(comb[j * n + k], x[j * d + i], mixed);
      float py = post[k] * y[i];
      out[k * d + i] = round_md(py + mixed, md);
    }
}

}  // namespace tessera::ref

// SPDX-License-Identifier: Apache-2.0
/// Shared K=V latent attention with per-head sinks for one query row (spec/deepseek-v41.md §2.5.5).
/// The caller passes only the keys the row may attend (the visible window entries in position order,
/// then the compressed entries its top-k selected, in entry order): every masked key of the reference
/// contributes exp(min − m) = 0 exactly, so leaving it out changes nothing.
///   l_u = →md(→md(q_h·k_u)·hd^(−1/2));  m = max(max_u l_u, σ_h);
///   p_u = →md(exp(l_u − m) / (Σ_v exp(l_v − m) + exp(σ_h − m)));  o_h = →md(Σ_u p_u·k_u).
/// q_h·k_u and Σ_u p_u·k_u are sequential FMA chains (the golden engine's batched-GEMM order).
/// A row with no keys gives o = 0 (the sink takes all the mass).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

/// q [H, hd]; keys: nk pointers to rows of hd; sinks [H]; out [H, hd]; `scratch` ≥ nk floats; `probs`
/// (optional) receives p of head h at probs[h·probs_stride + u].
inline void attention_row(float const* q, float const* const* keys, int64_t nk, float const* sinks, int64_t heads,
                          int64_t hd, float scale, DType md, float* out, float* scratch, float* probs = nullptr,
                          int64_t probs_stride = 0) {
  for (int64_t h = 0; h < heads; ++h) {
    float const* qh = q + h * hd;
    float* l = scratch;
    float mx = sinks[h];
    for (int64_t u = 0; u < nk; ++u) {
      l[u] = round_md(round_md(dot_fma_seq(qh, keys[u], hd), md) * scale, md);
      mx = std::max(mx, l[u]);
    }
    float sum = 0.f;
    for (int64_t u = 0; u < nk; ++u) { l[u] = fmath::exp_rn(l[u] - mx); sum += l[u]; }
    sum += fmath::exp_rn(sinks[h] - mx);
    for (int64_t u = 0; u < nk; ++u) l[u] = round_md(l[u] / sum, md);
    if (probs)
      for (int64_t u = 0; u < nk; ++u) probs[h * probs_stride + u] = l[u];
    float* oh = out + h * hd;
    for (int64_t i = 0; i < hd; ++i) {
      float acc = 0.f;
      for (int64_t u = 0; u < nk; ++u) acc = std::fma(l[u], keys[u][i], acc);
      oh[i] = round_md(acc, md);
    }
  }
}

}  // namespace tessera::ref

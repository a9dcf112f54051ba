// SPDX-License-Identifier: Apache-2.0
/// Shared K=V latent attention with per-head sinks for one query row (spec/deepseek-v41.md §2.5.5).
/// The caller passes only the keys the row may attend (the visible window entries in position order,
/// then the compressed entries its top-k selected, in entry order): every masked key of the reference
/// contributes exp(min − m) = 0 exactly, so leaving it out changes nothing.
///   l_u = →md(→md(q_h·k_u)·hd^(−1/2));  m = max(max_u l_u, σ_h);
///   p_u = →md(exp(l_u − m) / (Σ_v exp(l_v − m) + exp(σ_h − m)));  o_h = →md(Σ_u p_u·k_u).
/// fp32: q_h·k_u and Σ_u p_u·k_u are sequential FMA chains (the golden engine's fp32 batched GEMMs), the
/// denominator is summed in listed order with the sink last, exp is correctly rounded.
/// bf16: the golden engine's bf16 path. Both products are tensor-core GEMMs (ref::dot_tc); exp is CUDA's expf
/// (exp_md); the denominator is torch's warp softmax over the row's columns (warp_softmax_sum), and P·V walks
/// the key axis in 16-column blocks (tc::BlockAcc::step_at), both on the key's column in the golden engine's
/// logit row: cols[u] for the listed keys and sink_col for the sink (its last column). Without cols the listed
/// order is the column order (key u in column u, the sink in column nk). q and the keys enter both bf16 products
/// as bf16 values (→bf16 first; the model's already are), the operands a tensor-core GEMM takes.
/// A row with no keys gives o = 0 (the sink takes all the mass).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

/// q [H, hd]; keys: nk pointers to rows of hd; sinks [H]; out [H, hd]; `scratch` ≥ nk floats; `probs`
/// (optional) receives p of head h at probs[h·probs_stride + u]; cols / sink_col as above (bf16 only).
inline void attention_row(float const* q, float const* const* keys, int64_t nk, float const* sinks, int64_t heads,
                          int64_t hd, float scale, DType md, float* out, float* scratch, float* probs = nullptr,
                          int64_t probs_stride = 0, int32_t const* cols = nullptr, int64_t sink_col = -1) {
  bool const bf16 = md == DType::kBf16;
  std::vector<float> q_bf, keys_bf;
  std::vector<float const*> key_rows_bf;
  if (bf16) {
    q_bf.resize(static_cast<size_t>(heads * hd));
    for (size_t i = 0; i < q_bf.size(); ++i) q_bf[i] = round_to_bf16(q[i]);
    keys_bf.resize(static_cast<size_t>(nk * hd));
    key_rows_bf.resize(static_cast<size_t>(nk));
    for (int64_t u = 0; u < nk; ++u) {
      for (int64_t i = 0; i < hd; ++i) keys_bf[static_cast<size_t>(u * hd + i)] = round_to_bf16(keys[u][i]);
      key_rows_bf[static_cast<size_t>(u)] = keys_bf.data() + u * hd;
    }
    q = q_bf.data();
    keys = key_rows_bf.data();
  }
  auto col = [cols](int64_t u) { return cols ? static_cast<int64_t>(cols[u]) : u; };
  int64_t const sink_at = cols ? sink_col : nk;
  for (int64_t h = 0; h < heads; ++h) {
    float const* qh = q + h * hd;
    float* l = scratch;
    float mx = sinks[h];
    for (int64_t u = 0; u < nk; ++u) {
      l[u] = round_md(round_md(bmm_dot(qh, keys[u], hd, md), md) * scale, md);
      mx = std::max(mx, l[u]);
    }
    for (int64_t u = 0; u < nk; ++u) l[u] = exp_md(l[u] - mx, md);
    float const es = exp_md(sinks[h] - mx, md);
    float sum = 0.f;
    if (bf16) {
      sum = warp_softmax_sum(nk + 1, [&](int64_t u) { return u < nk ? l[u] : es; },
                             [&](int64_t u) { return u < nk ? col(u) : sink_at; });
    } else {
      for (int64_t u = 0; u < nk; ++u) sum += l[u];
      sum += es;
    }
    for (int64_t u = 0; u < nk; ++u) l[u] = round_md(l[u] / sum, md);
    if (probs)
      for (int64_t u = 0; u < nk; ++u) probs[h * probs_stride + u] = l[u];
    float* oh = out + h * hd;
    for (int64_t i = 0; i < hd; ++i) {
      if (bf16) {
        tc::BlockAcc acc;
        for (int64_t u = 0; u < nk; ++u) acc.step_at(col(u), l[u], keys[u][i]);
        oh[i] = round_md(acc.value(), md);
      } else {
        float acc = 0.f;
        for (int64_t u = 0; u < nk; ++u) acc = std::fma(l[u], keys[u][i], acc);
        oh[i] = acc;
      }
    }
  }
}

}  // namespace tessera::ref

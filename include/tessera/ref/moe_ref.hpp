// SPDX-License-Identifier: Apache-2.0
/// MoE routing and experts (spec/deepseek-v41.md §2.6).
/// Router (fp32): s_e = sqrt(softplus(x·W_eᵀ / temp)) (x·W_eᵀ in ref::dot's SGEMM order, softplus on exp_md /
///   log1p_md); sel = top-k of s + b (descending, ties → lower id);
///   w_i = s[sel_i]; if norm and k > 1: w_i /= (Σ_i w_i + 1e-20) (sum in sel order); w_i ·= routed_scale.
/// Expert (clamped SwiGLU; w1·x, w3·x, w2·a in ref::gemm_dot's order, silu on exp_md):
///   g = f32(→md(w1·x)), u = f32(→md(w3·x)); u = clamp(u, ±L), g = min(g, L) (L > 0);
///   a = →md(w·(silu(g)·u)); y = f32(→md(w2·a)).
/// Static mask: experts with mask_e ≠ 0 get biased score −∞ before top-k (never selected).
/// Per-token prune (seed-notes §5): order the k slots by weight descending (ties → lower slot), keep the
///   shortest prefix with kept ≥ max(1, min_k) and Σ kept ≥ top_p · Σ all (fp32, in that order); dropped
///   slots get id −1, weight 0; renorm: kept w ·= Σ all / Σ kept (only when something was dropped).
/// Block: out = →md(Σ_{selected e ascending} y_e + y_shared), accumulated in fp32 from zero.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/ref/indexer_ref.hpp"

namespace tessera::ref {

/// x [D], gate [E, D], bias [E] → ids [k] (descending biased score), weights [k]; returns the cutoff tie.
inline bool moe_route_row(float const* x, float const* gate, float const* bias, int64_t experts, int64_t d,
                          int64_t k, float temp, bool norm, float routed_scale, int32_t* ids, float* weights,
                          uint8_t const* mask = nullptr, DType md = DType::kF32) {
  std::vector<float> s(static_cast<size_t>(experts)), biased(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    s[e] = std::sqrt(softplus(dot(x, gate + e * d, d) / temp, md));
    biased[e] = (mask && mask[e]) ? -INFINITY : s[e] + (bias ? bias[e] : 0.f);
  }
  std::vector<int32_t> sel;
  bool tie = false;
  topk_select(biased.data(), experts, k, sel, &tie);
  float sum = 0.f;
  for (int64_t i = 0; i < k; ++i) { ids[i] = sel[i]; weights[i] = s[sel[i]]; sum += weights[i]; }
  if (norm && k > 1)
    for (int64_t i = 0; i < k; ++i) weights[i] = weights[i] / (sum + 1e-20f);
  for (int64_t i = 0; i < k; ++i) weights[i] = weights[i] * routed_scale;
  return tie;
}

/// Per-token top-p pruning of one row's k slots in place; returns the number kept.
inline int64_t moe_prune_row(int32_t* ids, float* weights, int64_t k, float top_p, int64_t min_k, bool renorm) {
  std::vector<int64_t> order(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
  float total = 0.f;
  for (int64_t i = 0; i < k; ++i) total += weights[i];
  float const need = top_p * total;
  int64_t const floor_k = std::max<int64_t>(1, min_k);
  float cum = 0.f;
  int64_t keep = 0;
  while (keep < k && (keep < floor_k || cum < need)) cum += weights[order[keep++]];
  if (keep == k) return k;
  for (int64_t j = keep; j < k; ++j) { ids[order[j]] = -1; weights[order[j]] = 0.f; }
  if (renorm) {
    float const scale = total / cum;
    for (int64_t j = 0; j < keep; ++j) weights[order[j]] = weights[order[j]] * scale;
  }
  return keep;
}

/// One expert on one token: x [D], w1/w3 [I, D], w2 [D, I]; `weight` < 0 means unweighted (shared
/// expert). Adds f32(y) to acc [D]. `scratch` ≥ 2·I floats.
/// The same with the weight rows given by accessors: row1(i) / row3(i) return row i of w1 / w3 ([D] floats),
/// row2(o) row o of w2 ([I] floats); each pointer is read before the next call (an accessor may widen a stored
/// row into one buffer).
template <class Row1, class Row3, class Row2>
void moe_expert_row_accumulate_rows(float const* x, Row1&& row1, Row3&& row3, Row2&& row2, int64_t d, int64_t inter,
                                    float limit, bool weighted, float weight, DType md, float* acc, float* scratch) {
  float* a = scratch;
  for (int64_t i = 0; i < inter; ++i) {
    float g = round_md(gemm_dot(x, row1(i), d, md), md);
    float u = round_md(gemm_dot(x, row3(i), d, md), md);
    if (limit > 0.f) { u = std::clamp(u, -limit, limit); g = std::min(g, limit); }
    float y = silu(g, md) * u;
    if (weighted) y = weight * y;
    a[i] = round_md(y, md);
  }
  for (int64_t o = 0; o < d; ++o) acc[o] += round_md(gemm_dot(a, row2(o), inter, md), md);
}

inline void moe_expert_row_accumulate(float const* x, float const* w1, float const* w3, float const* w2, int64_t d,
                                      int64_t inter, float limit, bool weighted, float weight, DType md, float* acc,
                                      float* scratch) {
  moe_expert_row_accumulate_rows(
      x, [&](int64_t i) { return w1 + i * d; }, [&](int64_t i) { return w3 + i * d; },
      [&](int64_t o) { return w2 + o * inter; }, d, inter, limit, weighted, weight, md, acc, scratch);
}

}  // namespace tessera::ref

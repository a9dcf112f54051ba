// SPDX-License-Identifier: Apache-2.0
/// CPU reference of the keyed sampler (include/tessera/ops/sampling.hpp): plain per-row loops in
/// the order penalties → mask → temperature → min-p → top-k → top-p → inverse-CDF draw, in double
/// precision.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <unordered_map>
#include <vector>

#include "tessera/ops/sampling.hpp"

namespace tessera::ref {

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// Logits after penalties and the mask (stages 1–2), in double; NaN → −∞.
/// \param mask ceil(V/32) words or nullptr
inline std::vector<double> penalized_logits(std::span<float const> logits,
                                            ops::SamplingRowParams const& p, uint32_t const* mask,
                                            std::span<int32_t const> prompt,
                                            std::span<int32_t const> output) {
  int64_t const v_size = static_cast<int64_t>(logits.size());
  std::vector<double> l(logits.size());
  for (int64_t v = 0; v < v_size; ++v) l[v] = std::isnan(logits[v]) ? kNegInf : double(logits[v]);
  if (p.repetition_penalty != 1.f) {
    std::vector<bool> seen(logits.size(), false);
    for (int32_t t : prompt)
      if (t >= 0 && t < v_size) seen[t] = true;
    for (int32_t t : output)
      if (t >= 0 && t < v_size) seen[t] = true;
    double const rho = p.repetition_penalty;
    for (int64_t v = 0; v < v_size; ++v)
      if (seen[v]) l[v] = l[v] > 0 ? l[v] / rho : l[v] * rho;
  }
  if (p.frequency_penalty != 0.f || p.presence_penalty != 0.f) {
    std::unordered_map<int32_t, int64_t> count;
    for (int32_t t : output)
      if (t >= 0 && t < v_size) ++count[t];
    for (auto const& [t, c] : count)
      l[t] -= double(p.frequency_penalty) * double(c) + double(p.presence_penalty);
  }
  if (mask)
    for (int64_t v = 0; v < v_size; ++v)
      if (!((mask[v >> 5] >> (v & 31)) & 1u)) l[v] = kNegInf;
  return l;
}

/// Greedy pick: the first index of the maximum; −1 when every logit is −∞.
inline int32_t argmax_first(std::span<double const> l) {
  int32_t best = -1;
  for (size_t v = 0; v < l.size(); ++v)
    if (l[v] != kNegInf && (best < 0 || l[v] > l[best])) best = static_cast<int32_t>(v);
  return best;
}

/// Unnormalised kept weights w_v = exp(z_v − max z) after min-p, top-k and top-p (0 = removed), for
/// T > 0.
inline std::vector<double> kept_weights(std::span<double const> l,
                                        ops::SamplingRowParams const& p) {
  size_t const n = l.size();
  std::vector<double> w(n, 0.0);
  double m = kNegInf;
  for (double x : l) m = std::max(m, x);
  if (m == kNegInf) return w;
  double const t = p.temperature;
  for (size_t v = 0; v < n; ++v) w[v] = l[v] == kNegInf ? 0.0 : std::exp((l[v] - m) / t);
  if (p.min_p > 0.f)  // max w = 1
    for (auto& x : w)
      if (x < double(p.min_p)) x = 0.0;
  bool const use_k = p.top_k > 0 && static_cast<size_t>(p.top_k) < n;
  bool const use_p = p.top_p < 1.f;
  if (use_k || use_p) {
    std::vector<int32_t> order;
    for (size_t v = 0; v < n; ++v)
      if (w[v] > 0) order.push_back(static_cast<int32_t>(v));
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return w[a] != w[b] ? w[a] > w[b] : a < b; });
    size_t keep = order.size();
    if (use_k) keep = std::min(keep, static_cast<size_t>(p.top_k));
    if (use_p) {
      double total = 0;
      for (size_t j = 0; j < keep; ++j) total += w[order[j]];
      double before = 0;
      size_t j = 0;
      for (; j < keep; ++j) {
        if (!(before < double(p.top_p) * total)) break;
        before += w[order[j]];
      }
      keep = std::max<size_t>(j, 1);
    }
    for (size_t j = keep; j < order.size(); ++j) w[order[j]] = 0.0;
  }
  return w;
}

/// Inverse-CDF draw over the kept weights in ascending id order; −1 when nothing is kept.
inline int32_t draw(std::span<double const> w, double u) {
  double total = 0;
  for (double x : w) total += x;
  if (!(total > 0)) return -1;
  double const target = u * total;
  double cum = 0;
  int32_t last = -1;
  for (size_t v = 0; v < w.size(); ++v) {
    if (w[v] <= 0) continue;
    cum += w[v];
    last = static_cast<int32_t>(v);
    if (cum > target) return last;
  }
  return last;  // rounding: u·total ≥ the summed mass
}

/// log-softmax of a row; −∞ stays −∞.
inline std::vector<double> log_softmax(std::span<double const> l) {
  double m = kNegInf;
  for (double x : l) m = std::max(m, x);
  std::vector<double> out(l.size(), kNegInf);
  if (m == kNegInf) return out;
  double s = 0;
  for (double x : l)
    if (x != kNegInf) s += std::exp(x - m);
  double const lse = m + std::log(s);
  for (size_t v = 0; v < l.size(); ++v)
    if (l[v] != kNegInf) out[v] = l[v] - lse;
  return out;
}

/// The sampled token of one row (−1 when every token is masked).
inline int32_t sample_row(std::span<float const> logits, ops::SamplingRowParams const& p,
                          uint32_t const* mask, std::span<int32_t const> prompt,
                          std::span<int32_t const> output) {
  std::vector<double> const l = penalized_logits(logits, p, mask, prompt, output);
  if (!(p.temperature > 0.f)) return argmax_first(l);
  std::vector<double> const w = kept_weights(l, p);
  return draw(w, keyed_uniform(p.seed, p.stream_key, p.position));
}

}  // namespace tessera::ref

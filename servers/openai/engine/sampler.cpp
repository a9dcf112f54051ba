// SPDX-License-Identifier: Apache-2.0
/// Keyed sampling: see sampler.hpp for the transform order and the determinism contract.
#include "servers/openai/engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace tessera::server {

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double keyed_uniform(uint64_t seed, int64_t position) {
  uint64_t h = splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(position) * 0xd6e8feb86659fd93ull);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

int32_t sample_token(std::span<float> logits, SamplingParams const& p, int64_t position,
                     std::span<int32_t const> reply, std::vector<uint8_t> const* allowed) {
  float const kNegInf = -std::numeric_limits<float>::infinity();
  int64_t const n = static_cast<int64_t>(logits.size());
  if (p.presence_penalty != 0 || p.frequency_penalty != 0 || p.repetition_penalty != 1.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : reply) ++counts[t];
    for (auto [t, c] : counts) {
      if (t < 0 || t >= n) continue;
      float& l = logits[t];
      if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
      l -= p.frequency_penalty * static_cast<float>(c) + p.presence_penalty;
    }
  }
  if (allowed) {
    for (int64_t v = 0; v < n; ++v) if (!(*allowed)[v]) logits[v] = kNegInf;
  }
  auto argmax = [&] {
    int64_t best = 0;
    for (int64_t v = 1; v < n; ++v) if (logits[v] > logits[best]) best = v;
    return static_cast<int32_t>(best);
  };
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax();

  // Candidates sorted by logit desc, id asc.
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = n;
  while (keep > 0 && logits[idx[keep - 1]] == kNegInf) --keep;
  if (keep == 0) return argmax();
  if (p.top_k > 0) keep = std::min<int64_t>(keep, p.top_k);
  std::vector<double> prob(keep);
  double const mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  for (auto& q : prob) q /= sum;
  if (p.top_p < 1.0f) {
    double c = 0;
    int64_t k = 0;
    while (k < keep) { c += prob[k++]; if (c >= p.top_p) break; }
    keep = std::max<int64_t>(k, 1);
  }
  if (p.min_p > 0.0f) {
    int64_t k = 1;
    while (k < keep && prob[k] >= p.min_p * prob[0]) ++k;
    keep = k;
  }
  // Draw in token-id order so the result depends on the set, not on the sort's tie order.
  std::vector<std::pair<int32_t, double>> cand(keep);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) { cand[i] = {idx[i], prob[i]}; total += prob[i]; }
  std::sort(cand.begin(), cand.end());
  double u = keyed_uniform(p.seed, position) * total, c = 0;
  for (auto const& [t, q] : cand) {
    c += q;
    if (u < c) return t;
  }
  return cand.back().first;
}

void token_logprobs(std::span<float const> logits, int32_t token, int32_t k, float& logprob,
                    std::vector<TopLogprob>& top) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float l : logits) mx = std::max<double>(mx, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(l - mx);
  double const lse = mx + std::log(sum);
  logprob = static_cast<float>(logits[token] - lse);
  top.clear();
  if (k <= 0) return;
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  int64_t kk = std::min<int64_t>(k, static_cast<int64_t>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (int64_t i = 0; i < kk; ++i) top.push_back({idx[i], static_cast<float>(logits[idx[i]] - lse)});
}

}  // namespace tessera::server

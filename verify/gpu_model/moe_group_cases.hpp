// SPDX-License-Identifier: Apache-2.0
/// gpu::moe_group test cases shared by the CPU test (host twin vs the reference below) and the GPU model test
/// (CUDA kernel vs the reference): routings of N tokens × K slots over E experts, and the grouping written
/// out the plain way (count, prefix sum, fill in slot order, sort each token's (expert, assignment) pairs).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace tessera::verify::moe_group {

struct Case {
  std::string name;
  int64_t tokens = 0, top_k = 0, experts = 0;
  std::vector<int32_t> ids;     // [N, K]
  std::vector<float> weights;   // [N, K]
};

/// The grouping of one case: the assignments [0, A) only.
struct Grouping {
  std::vector<int32_t> offsets, token, list, slot_assignment;
  std::vector<float> weight;
  std::vector<int64_t> toff;
};

/// Expert ids are kept when in [0, E); anything else (−1 pruned, or out of range) is skipped.
inline Grouping reference(Case const& c) {
  int64_t const N = c.tokens, K = c.top_k, E = c.experts;
  auto kept = [&](int32_t id) { return id >= 0 && id < E; };
  Grouping g;
  g.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int32_t id : c.ids)
    if (kept(id)) ++g.offsets[static_cast<size_t>(id) + 1];
  for (int64_t e = 0; e < E; ++e) g.offsets[e + 1] += g.offsets[e];
  int64_t const A = g.offsets[E];
  g.token.resize(static_cast<size_t>(A));
  g.weight.resize(static_cast<size_t>(A));
  g.slot_assignment.assign(static_cast<size_t>(N * K), -1);
  std::vector<int32_t> fill(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t i = 0; i < K; ++i) {
      int32_t const id = c.ids[r * K + i];
      if (!kept(id)) continue;
      int32_t const a = fill[static_cast<size_t>(id)]++;
      g.token[a] = static_cast<int32_t>(r);
      g.weight[a] = c.weights[r * K + i];
      g.slot_assignment[r * K + i] = a;
    }
  g.toff.assign(static_cast<size_t>(N + 1), 0);
  std::vector<std::pair<int32_t, int32_t>> order;
  for (int64_t r = 0; r < N; ++r) {
    order.clear();
    for (int64_t i = 0; i < K; ++i)
      if (kept(c.ids[r * K + i])) order.emplace_back(c.ids[r * K + i], g.slot_assignment[r * K + i]);
    std::sort(order.begin(), order.end());
    for (auto const& [id, a] : order) g.list.push_back(a);
    g.toff[r + 1] = static_cast<int64_t>(g.list.size());
  }
  return g;
}

/// Router-like rows: K distinct experts of E per token, each slot pruned (−1) with probability p_pruned.
inline Case random_case(std::string name, int64_t N, int64_t K, int64_t E, double p_pruned, uint32_t seed) {
  Case c{std::move(name), N, K, E, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> w(0.f, 1.f);
  std::bernoulli_distribution pruned(p_pruned);
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) all[e] = static_cast<int32_t>(e);
  for (int64_t r = 0; r < N; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t i = 0; i < K; ++i) {
      c.ids.push_back(pruned(rng) ? -1 : all[static_cast<size_t>(i)]);
      c.weights.push_back(w(rng));
    }
  }
  return c;
}

inline std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back(random_case("N=1 K=6 E=384", 1, 6, 384, 0.0, 1));
  v.push_back(random_case("N=1 pruned", 1, 6, 384, 0.5, 2));
  v.push_back(random_case("N=1 all pruned", 1, 6, 384, 1.0, 3));
  v.push_back(random_case("decode N=4", 4, 6, 384, 0.2, 4));
  v.push_back(random_case("decode N=64", 64, 6, 384, 0.3, 5));
  v.push_back(random_case("small E=8", 37, 6, 8, 0.25, 6));
  v.push_back(random_case("prefill N=3000 E=384", 3000, 6, 384, 0.1, 7));   // several tiles of slots and tokens
  v.push_back(random_case("E=512 (the limit) N=700 K=8", 700, 8, 512, 0.15, 8));
  v.push_back(random_case("E=1 K=1", 600, 1, 1, 0.3, 9));
  {
    Case c = random_case("all tokens on expert 5 (K=1)", 1500, 1, 384, 0.0, 10);
    for (auto& id : c.ids) id = 5;
    v.push_back(std::move(c));
  }
  {
    // Every token routes slot 2 to expert 200 and its other slots to experts 0..4: experts 5..199 and 201..383
    // are empty; some slots pruned.
    Case c = random_case("empty experts", 900, 6, 384, 0.0, 11);
    std::mt19937 rng(12);
    for (int64_t r = 0; r < c.tokens; ++r)
      for (int64_t i = 0; i < 6; ++i) {
        int32_t& id = c.ids[r * 6 + i];
        id = i == 2 ? 200 : static_cast<int32_t>(i < 2 ? i : i - 1);
        if (rng() % 7 == 0) id = -1;
      }
    v.push_back(std::move(c));
  }
  {
    // Repeated experts within a row and out-of-range ids (skipped like −1): ties keep slot order.
    Case c = random_case("repeats and out-of-range ids", 513, 6, 16, 0.1, 13);
    std::mt19937 rng(14);
    for (auto& id : c.ids) {
      uint32_t const u = rng() % 10;
      if (u == 0) id = 16;
      else if (u == 1) id = -7;
      else if (u < 5) id = static_cast<int32_t>(rng() % 3);
    }
    v.push_back(std::move(c));
  }
  v.push_back(Case{"N=0", 0, 6, 384, {}, {}});
  return v;
}

/// What moe_group wrote, copied to the host: every array at its full capacity (S = N·K).
struct Output {
  std::vector<int32_t> offsets, slot_assignment, token_idx, identity, combine_list;
  std::vector<float> route_weight;
  std::vector<int64_t> combine_offsets;
  explicit Output(Case const& c)
      : offsets(static_cast<size_t>(c.experts + 1), -9), slot_assignment(c.ids.size(), -9),
        token_idx(c.ids.size(), -9), identity(c.ids.size(), -9), combine_list(c.ids.size(), -9),
        route_weight(c.ids.size(), -9.f), combine_offsets(static_cast<size_t>(c.tokens + 1), -9) {}
};

/// The first difference between `o` and the reference grouping of `c` (MoeGroupParams' contract: the reference
/// below A, padding token 0 / weight +0 / list entry 0 from A to S, identity everywhere), or "" when none.
inline std::string first_difference(Case const& c, Output const& o) {
  Grouping const g = reference(c);
  size_t const A = g.token.size(), S = c.ids.size();
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  if (o.offsets != g.offsets) return "offsets";
  if (o.slot_assignment != g.slot_assignment) return "slot_assignment";
  if (o.combine_offsets != g.toff) return "combine_offsets";
  for (size_t a = 0; a < S; ++a) {
    std::string const at = " at a = " + std::to_string(a) + " (A = " + std::to_string(A) + ")";
    if (o.identity[a] != static_cast<int32_t>(a)) return "identity" + at;
    if (o.token_idx[a] != (a < A ? g.token[a] : 0)) return "token_idx" + at;
    if (bits(o.route_weight[a]) != (a < A ? bits(g.weight[a]) : 0u)) return "route_weight" + at;
    if (o.combine_list[a] != (a < A ? g.list[a] : 0)) return "combine_list" + at;
  }
  return "";
}

}  // namespace tessera::verify::moe_group

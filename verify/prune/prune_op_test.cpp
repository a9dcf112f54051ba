// SPDX-License-Identifier: Apache-2.0
/// Expert pruning at the op level (ops/moe.hpp, spec/seed-notes.md §5) against plainly formulated
/// checks: a static mask equals routing over the unmasked experts' sub-gate with ids mapped back; per-token
/// top-p keeps slot i iff its weight rank is below max(1, min_k) or the weights ranked before it sum to
/// less than top_p · Σ; defaults are bit-identical to no pruning; MoeExperts skips id −1 slots exactly.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "tessera/ops/moe.hpp"
#include "tessera/ref/moe_ref.hpp"
#include "verify/common/random.hpp"

using namespace tessera;

namespace {

struct Router {
  int64_t rows = 37, experts = 12, dim = 24, k = 5;
  std::vector<float> x, gate, bias;
  explicit Router(uint64_t seed) {
    uint64_t s0 = verify::test_seed(seed);
    x = verify::randn(rows * dim, s0, 1.f);
    gate = verify::randn(experts * dim, s0 + 1, 0.3f);
    bias = verify::randn(experts, s0 + 2, 0.05f);
  }
  struct Out { std::vector<float> w; std::vector<int32_t> ids; };
  Out route(ops::MoeRouteDesc d, std::vector<uint8_t> const* mask = nullptr) const {
    Out o{std::vector<float>(rows * k), std::vector<int32_t>(rows * k)};
    std::vector<uint8_t> tie(rows);
    ops::MoeRouteArgs a{TensorView<float const, 2>(x.data(), {rows, dim}), TensorView<float const, 2>(gate.data(), {experts, dim}),
                        TensorView<float const, 1>(bias.data(), {experts}), TensorView<float, 2>(o.w.data(), {rows, k}),
                        TensorView<int32_t, 2>(o.ids.data(), {rows, k}), TensorView<uint8_t, 1>(tie.data(), {rows})};
    if (mask) a.expert_mask = TensorView<uint8_t const, 1>(mask->data(), {experts});
    ExecContext ctx;
    throw_if_error(ops::moe_route(ctx, d, a));
    return o;
  }
  ops::MoeRouteDesc desc() const { return {rows, experts, dim, k, 1.3f, 2.5f, true}; }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(prune_op)

BOOST_AUTO_TEST_CASE(keep_all_settings_are_bit_identical) {
  Router r(11);
  auto base = r.route(r.desc());
  std::vector<uint8_t> none(r.experts, 0);
  for (auto [p, mk] : {std::pair{1.f, int64_t{0}}, {1.f, r.k}, {0.3f, r.k}, {0.01f, r.k + 3}}) {
    auto d = r.desc();
    d.prune_top_p = p;
    d.prune_min_k = mk;
    auto got = r.route(d, &none);
    BOOST_TEST((std::memcmp(got.w.data(), base.w.data(), base.w.size() * 4) == 0), "top_p " << p << " min_k " << mk);
    BOOST_TEST((got.ids == base.ids));
  }
}

BOOST_AUTO_TEST_CASE(static_mask_equals_sub_gate_routing) {
  Router r(12);
  std::vector<uint8_t> mask(r.experts, 0);
  for (int e : {0, 3, 4, 9}) mask[e] = 1;
  auto got = r.route(r.desc(), &mask);
  // Plain reference: drop the masked rows of gate and bias, route, map ids back.
  std::vector<int32_t> keep;
  for (int64_t e = 0; e < r.experts; ++e) if (!mask[e]) keep.push_back(static_cast<int32_t>(e));
  int64_t E2 = static_cast<int64_t>(keep.size());
  std::vector<float> g2, b2;
  for (int32_t e : keep) { g2.insert(g2.end(), r.gate.begin() + e * r.dim, r.gate.begin() + (e + 1) * r.dim); b2.push_back(r.bias[e]); }
  int64_t used = 0;
  for (int64_t row = 0; row < r.rows; ++row) {
    std::vector<int32_t> ids(r.k);
    std::vector<float> w(r.k);
    ref::moe_route_row(&r.x[row * r.dim], g2.data(), b2.data(), E2, r.dim, r.k, 1.3f, true, 2.5f, ids.data(), w.data());
    for (int64_t i = 0; i < r.k; ++i) {
      BOOST_TEST(got.ids[row * r.k + i] == keep[ids[i]]);
      BOOST_TEST(got.w[row * r.k + i] == w[i]);
      used += mask[got.ids[row * r.k + i]];
    }
  }
  BOOST_TEST(used == 0);
  std::vector<uint8_t> too_many(r.experts, 1);
  too_many[0] = too_many[1] = 0;
  BOOST_CHECK_THROW(r.route(r.desc(), &too_many), Error);
}

BOOST_AUTO_TEST_CASE(top_p_matches_rank_formulation) {
  Router r(13);
  auto base = r.route(r.desc());
  int64_t dropped_total = 0;
  for (float p : {0.95f, 0.8f, 0.6f, 0.4f}) {
    for (int64_t mk : {0, 1, 3}) {
      for (bool renorm : {true, false}) {
        auto d = r.desc();
        d.prune_top_p = p; d.prune_min_k = mk; d.prune_renorm = renorm;
        auto got = r.route(d);
        for (int64_t row = 0; row < r.rows; ++row) {
          float const* w = &base.w[row * r.k];
          float total = 0.f;
          for (int64_t i = 0; i < r.k; ++i) total += w[i];
          std::vector<bool> kept(r.k);
          float kept_sum = 0.f;
          int64_t nk = 0;
          for (int64_t i = 0; i < r.k; ++i) {
            // rank of slot i: slots with larger weight, or equal weight and lower index, come first.
            int64_t rank = 0;
            float before = 0.f;
            for (int64_t j = 0; j < r.k; ++j)
              if (w[j] > w[i] || (w[j] == w[i] && j < i)) ++rank;
            // Σ of the weights ranked before i, summed in rank order (same fp32 order as the op).
            std::vector<std::pair<int64_t, float>> prior;
            for (int64_t j = 0; j < r.k; ++j) {
              int64_t rj = 0;
              for (int64_t q = 0; q < r.k; ++q) if (w[q] > w[j] || (w[q] == w[j] && q < j)) ++rj;
              if (rj < rank) prior.push_back({rj, w[j]});
            }
            std::sort(prior.begin(), prior.end());
            for (auto const& pr : prior) before += pr.second;
            kept[i] = rank < std::max<int64_t>(1, mk) || before < p * total;
            if (kept[i]) { kept_sum += w[i]; ++nk; }
          }
          if (nk < r.k) ++dropped_total;
          for (int64_t i = 0; i < r.k; ++i) {
            int32_t gid = got.ids[row * r.k + i];
            float gw = got.w[row * r.k + i];
            if (!kept[i]) { BOOST_TEST(gid == -1); BOOST_TEST(gw == 0.f); continue; }
            BOOST_TEST(gid == base.ids[row * r.k + i]);
            float want = (renorm && nk < r.k) ? w[i] * (total / kept_sum) : w[i];
            BOOST_TEST(std::abs(gw - want) <= 1e-6f * std::abs(want), "row " << row << " slot " << i);
          }
        }
      }
    }
  }
  BOOST_TEST(dropped_total > 0);  // the settings actually prune
}

BOOST_AUTO_TEST_CASE(experts_skip_dropped_slots_exactly) {
  uint64_t seed = verify::test_seed(14), n = 0;
  auto rnd = [&](int64_t count, float sd) { return verify::randn(static_cast<size_t>(count), seed + n++, sd); };
  int64_t rows = 9, E = 6, D = 16, I = 8, K = 3;
  auto x = rnd(rows * D, 1.f);
  std::vector<std::vector<float>> w1(E), w3(E), w2(E);
  for (int64_t e = 0; e < E; ++e) {
    w1[e] = rnd(I * D, 0.3f);
    w3[e] = rnd(I * D, 0.3f);
    w2[e] = rnd(D * I, 0.3f);
  }
  auto s1 = rnd(I * D, 0.3f), s3 = rnd(I * D, 0.3f),
       s2 = rnd(D * I, 0.3f);
  std::vector<TensorView<float const, 2>> v1, v3, v2;
  for (int64_t e = 0; e < E; ++e) {
    v1.emplace_back(w1[e].data(), std::array<int64_t, 2>{I, D});
    v3.emplace_back(w3[e].data(), std::array<int64_t, 2>{I, D});
    v2.emplace_back(w2[e].data(), std::array<int64_t, 2>{D, I});
  }
  // Slots with −1 (weight 0) vs the same rows routed to K−1 experts only.
  std::vector<int32_t> ids(rows * K), ids2(rows * (K - 1));
  std::vector<float> w(rows * K), wt2(rows * (K - 1));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < K; ++i) {
      ids[r * K + i] = static_cast<int32_t>((r + 2 * i) % E);
      w[r * K + i] = 0.2f + 0.1f * static_cast<float>(i);
    }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t drop = r % K, j = 0;
    for (int64_t i = 0; i < K; ++i) {
      if (i == drop) continue;
      ids2[r * (K - 1) + j] = ids[r * K + i];
      wt2[r * (K - 1) + j++] = w[r * K + i];
    }
    ids[r * K + drop] = -1;
    w[r * K + drop] = 0.f;
  }
  auto run = [&](std::vector<int32_t> const& id, std::vector<float> const& wt, int64_t k) {
    std::vector<float> out(rows * D);
    ops::MoeExpertsArgs a{TensorView<float const, 2>(x.data(), {rows, D}), TensorView<int32_t const, 2>(id.data(), {rows, k}),
                          TensorView<float const, 2>(wt.data(), {rows, k}), v1, v3, v2,
                          TensorView<float const, 2>(s1.data(), {I, D}), TensorView<float const, 2>(s3.data(), {I, D}),
                          TensorView<float const, 2>(s2.data(), {D, I}), TensorView<float, 2>(out.data(), {rows, D})};
    ExecContext ctx;
    throw_if_error(ops::moe_experts(ctx, {rows, E, D, I, k, 7.f, true, DType::kF32}, a));
    return out;
  };
  auto a = run(ids, w, K), b = run(ids2, wt2, K - 1);
  BOOST_TEST((std::memcmp(a.data(), b.data(), a.size() * 4) == 0));
}

BOOST_AUTO_TEST_SUITE_END()

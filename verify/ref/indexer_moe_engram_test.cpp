// SPDX-License-Identifier: Apache-2.0
/// Indexer, MoE and Engram ops against independent formulations: per-query scoring loops in double,
/// sort-based selection (value desc, index asc) with ties and empty visible sets, block maxima with the
/// forced newest block, a per-token router/expert loop with the clamp biting, block-scaled routed experts against
/// their decoded values, and a direct hash.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "tessera/ops/engram.hpp"
#include "tessera/ops/indexer.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ref/engram_ref.hpp"
#include "verify/common/random.hpp"

using namespace tessera;

namespace {
std::vector<int32_t> sort_select(std::vector<float> const& v, int64_t k) {
  std::vector<int32_t> idx;
  for (size_t j = 0; j < v.size(); ++j)
    if (v[j] > -INFINITY) idx.push_back(static_cast<int32_t>(j));
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });  // stable: index asc
  idx.resize(std::min<size_t>(idx.size(), static_cast<size_t>(k)));
  return idx;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(indexer)

BOOST_AUTO_TEST_CASE(scores_visibility_vs_double) {
  int64_t rows = 6, Hi = 4, di = 32, T = 10, ratio = 2;
  auto q = verify::randn(rows * Hi * di, verify::test_seed(71));
  auto w = verify::randn(rows * Hi, verify::test_seed(72));
  auto k = verify::randn(T * di, verify::test_seed(73));
  std::vector<int64_t> pos = {0, 1, 2, 7, 18, 19};
  std::vector<float> s(rows * T);
  ExecContext ctx;
  float scale = 1.f / std::sqrt(32.f);
  BOOST_REQUIRE(ops::index_score(ctx, {rows, Hi, di, T, ratio, scale},
                                 {TensorView<float const, 2>(q.data(), {rows, Hi * di}), TensorView<float const, 2>(w.data(), {rows, Hi}),
                                  TensorView<float const, 2>(k.data(), {T, di}), TensorView<int64_t const, 1>(pos.data(), {rows}),
                                  TensorView<float, 2>(s.data(), {rows, T})}).ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < T; ++j) {
      if (j >= (pos[r] + 1) / ratio) { BOOST_TEST(std::isinf(s[r * T + j])); continue; }  // pos 0: nothing visible
      double acc = 0;
      for (int64_t h = 0; h < Hi; ++h) {
        double d = 0;
        for (int64_t i = 0; i < di; ++i) d += static_cast<double>(q[(r * Hi + h) * di + i]) * k[j * di + i];
        acc += w[r * Hi + h] * std::max(d, 0.0) * scale;
      }
      BOOST_TEST(std::fabs(s[r * T + j] - acc) <= 1e-5 * (1 + std::fabs(acc)));
    }
}

// Rows of several sequences in one call (key_base into their keys back to back, scores as long as the longest
// sequence's): each row's scores equal its sequence's call alone on its first T_i columns, −inf past them; a row
// whose visible keys would leave the buffer is refused before any score is written.
BOOST_AUTO_TEST_CASE(scores_of_several_sequences_through_key_base) {
  int64_t const Hi = 4, di = 32, ratio = 2;
  float const scale = 1.f / std::sqrt(32.f);
  std::vector<int64_t> const T = {10, 3, 0, 17};           // keys per sequence (one without any)
  std::vector<int64_t> const pos = {19, 6, 0, 33, 34};     // rows: one per sequence, two for the last
  std::vector<int64_t> const seq = {0, 1, 2, 3, 3};
  int64_t const rows = 5, Tmax = 17;
  std::vector<int64_t> first(T.size(), 0);
  for (size_t i = 1; i < T.size(); ++i) first[i] = first[i - 1] + T[i - 1];
  int64_t const key_rows = first.back() + T.back();
  auto q = verify::randn(rows * Hi * di, verify::test_seed(74));
  auto w = verify::randn(rows * Hi, verify::test_seed(75));
  auto k = verify::randn(key_rows * di, verify::test_seed(76));
  std::vector<int64_t> base(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) base[r] = first[seq[r]];
  std::vector<float> s(rows * Tmax, 7.f);
  ExecContext ctx;
  ops::IndexScoreArgs a{TensorView<float const, 2>(q.data(), {rows, Hi * di}), TensorView<float const, 2>(w.data(), {rows, Hi}),
                        TensorView<float const, 2>(k.data(), {key_rows, di}), TensorView<int64_t const, 1>(pos.data(), {rows}),
                        TensorView<float, 2>(s.data(), {rows, Tmax}), TensorView<int64_t const, 1>(base.data(), {rows})};
  BOOST_REQUIRE(ops::index_score(ctx, {rows, Hi, di, Tmax, ratio, scale}, a).ok());
  int64_t compared = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t const Ti = T[seq[r]];
    std::vector<float> alone(static_cast<size_t>(std::max<int64_t>(Ti, 1)), 7.f);
    if (Ti > 0)
      BOOST_REQUIRE(ops::index_score(ctx, {1, Hi, di, Ti, ratio, scale},
                                     {TensorView<float const, 2>(q.data() + r * Hi * di, {1, Hi * di}),
                                      TensorView<float const, 2>(w.data() + r * Hi, {1, Hi}),
                                      TensorView<float const, 2>(k.data() + first[seq[r]] * di, {Ti, di}),
                                      TensorView<int64_t const, 1>(pos.data() + r, {1}),
                                      TensorView<float, 2>(alone.data(), {1, Ti})}).ok());
    for (int64_t j = 0; j < Tmax; ++j) {
      float const got = s[r * Tmax + j];
      if (j < Ti) {
        BOOST_TEST(std::memcmp(&got, &alone[j], 4) == 0, "row " << r << " entry " << j);
        compared += std::isfinite(got) ? 1 : 0;
      } else {
        BOOST_TEST((std::isinf(got) && got < 0), "row " << r << " entry " << j << " past its keys");
      }
    }
  }
  BOOST_TEST(compared > 20);
  // Row 1 (visible 3) pointed at the last key: its keys would run past the buffer.
  base[1] = key_rows - 1;
  std::fill(s.begin(), s.end(), 7.f);
  Status const st = ops::index_score(ctx, {rows, Hi, di, Tmax, ratio, scale}, a);
  BOOST_TEST(!st.ok());
  BOOST_TEST(std::all_of(s.begin(), s.end(), [](float v) { return v == 7.f; }));
}

BOOST_AUTO_TEST_CASE(topk_ties_lower_index_and_empty_rows) {
  // Row 0: many exact zeros at the cutoff (ReLU); row 1: fewer finite entries than k; row 2: empty.
  int64_t T = 9, K = 4;
  std::vector<float> s = {0.f, 0.5f, 0.f, -0.2f, 0.f, 0.f, 0.7f, 0.f, -INFINITY,
                          0.3f, -INFINITY, 0.1f, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                          -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  std::vector<uint8_t> mask(3 * T, 1);
  mask[1] = 0;  // candidate mask removes entry 1 of row 0
  std::vector<int32_t> sel(3 * K);
  std::vector<uint8_t> tie(3);
  auto s_orig = s;
  ExecContext ctx;
  BOOST_REQUIRE(ops::index_topk(ctx, {3, T, K},
                                {TensorView<float, 2>(s.data(), {3, T}), TensorView<uint8_t const, 2>(mask.data(), {3, T}),
                                 TensorView<int32_t, 2>(sel.data(), {3, K}), TensorView<uint8_t, 1>(tie.data(), {3})}).ok());
  std::vector<int32_t> r0(sel.begin(), sel.begin() + K);
  BOOST_TEST((r0 == std::vector<int32_t>{6, 0, 2, 4}));  // 0.7 then the three lowest-index zeros
  BOOST_TEST(tie[0] == 1);
  BOOST_TEST((std::vector<int32_t>(sel.begin() + K, sel.begin() + 2 * K) == std::vector<int32_t>{9 - 9, 2, -1, -1}));
  BOOST_TEST(tie[1] == 0);
  BOOST_TEST((std::vector<int32_t>(sel.begin() + 2 * K, sel.end()) == std::vector<int32_t>{-1, -1, -1, -1}));
  // Random rows agree with a stable sort.
  int64_t rows = 20, T2 = 37;
  auto v = verify::randn(rows * T2, verify::test_seed(74));
  for (auto& x : v) x = std::round(x * 2) / 2;  // quantised: many exact ties
  std::vector<int32_t> sel2(rows * 6);
  std::vector<uint8_t> tie2(rows);
  auto v2 = v;
  BOOST_REQUIRE(ops::index_topk(ctx, {rows, T2, 6},
                                {TensorView<float, 2>(v2.data(), {rows, T2}), {}, TensorView<int32_t, 2>(sel2.data(), {rows, 6}),
                                 TensorView<uint8_t, 1>(tie2.data(), {rows})}).ok());
  for (int64_t r = 0; r < rows; ++r) {
    auto expect = sort_select(std::vector<float>(v.begin() + r * T2, v.begin() + (r + 1) * T2), 6);
    BOOST_TEST((std::vector<int32_t>(sel2.begin() + r * 6, sel2.begin() + (r + 1) * 6) == expect));
  }
}

BOOST_AUTO_TEST_CASE(candidate_blocks_forced_newest_block) {
  int64_t T = 14, Bc = 4, topb = 2, ratio = 1;
  // Query at position 9: visible entries 0..9, blocks 0..2 visible, block 2 (entries 8..11) forced.
  std::vector<float> s(T, -INFINITY);
  float vals[10] = {0.9f, 0.1f, 0.f, 0.f, 0.95f, 0.f, 0.f, 0.f, -0.5f, -0.6f};
  std::copy(vals, vals + 10, s.begin());
  std::vector<int64_t> pos = {9};
  std::vector<uint8_t> mask(T), tie(1);
  ExecContext ctx;
  BOOST_REQUIRE(ops::candidate_blocks(ctx, {1, T, ratio, Bc, topb},
                                      {TensorView<float const, 2>(s.data(), {1, T}), TensorView<int64_t const, 1>(pos.data(), {1}),
                                       TensorView<uint8_t, 2>(mask.data(), {1, T}), TensorView<uint8_t, 1>(tie.data(), {1})}).ok());
  // Block maxima: b0 = 0.9, b1 = 0.95, b2 = +inf (forced); keep b2 and b1.
  for (int64_t j = 0; j < T; ++j) BOOST_TEST(mask[j] == ((j >= 4 && j < 12) ? 1 : 0));
  // Position 0 with ratio 2: nothing visible, no block forced, nothing kept.
  std::vector<float> none(T, -INFINITY);
  std::vector<int64_t> p0 = {0};
  BOOST_REQUIRE(ops::candidate_blocks(ctx, {1, T, 2, Bc, topb},
                                      {TensorView<float const, 2>(none.data(), {1, T}), TensorView<int64_t const, 1>(p0.data(), {1}),
                                       TensorView<uint8_t, 2>(mask.data(), {1, T}), TensorView<uint8_t, 1>(tie.data(), {1})}).ok());
  BOOST_TEST(std::accumulate(mask.begin(), mask.end(), 0) == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(moe)

BOOST_AUTO_TEST_CASE(route_and_experts_vs_token_loop_with_clamp) {
  int64_t rows = 9, E = 8, D = 32, I = 16, K = 2;
  float limit = 0.6f, rs = 1.5f;
  auto x = verify::randn(rows * D, verify::test_seed(81));
  auto gate = verify::randn(E * D, verify::test_seed(82), 0.3f);
  auto bias = verify::randn(E, verify::test_seed(83), 0.1f);
  x[3 * D] = 40.f;  // a large logit: softplus passes x > 20 through
  std::vector<float> w(rows * K);
  std::vector<int32_t> ids(rows * K);
  std::vector<uint8_t> tie(rows);
  ExecContext ctx;
  BOOST_REQUIRE(ops::moe_route(ctx, {rows, E, D, K, 1.f, rs, true},
                               {TensorView<float const, 2>(x.data(), {rows, D}), TensorView<float const, 2>(gate.data(), {E, D}),
                                TensorView<float const, 1>(bias.data(), {E}), TensorView<float, 2>(w.data(), {rows, K}),
                                TensorView<int32_t, 2>(ids.data(), {rows, K}), TensorView<uint8_t, 1>(tie.data(), {rows})}).ok());
  std::vector<std::vector<float>> w1(E), w3(E), w2(E);
  std::vector<TensorView<float const, 2>> v1, v3, v2;
  for (int64_t e = 0; e < E; ++e) {
    w1[e] = verify::randn(I * D, verify::test_seed(100 + e), 0.4f);
    w3[e] = verify::randn(I * D, verify::test_seed(200 + e), 0.4f);
    w2[e] = verify::randn(D * I, verify::test_seed(300 + e), 0.3f);
    v1.emplace_back(w1[e].data(), std::array<int64_t, 2>{I, D});
    v3.emplace_back(w3[e].data(), std::array<int64_t, 2>{I, D});
    v2.emplace_back(w2[e].data(), std::array<int64_t, 2>{D, I});
  }
  auto s1 = verify::randn(I * D, verify::test_seed(401), 0.4f), s3 = verify::randn(I * D, verify::test_seed(402), 0.4f),
       s2 = verify::randn(D * I, verify::test_seed(403), 0.3f);
  std::vector<float> out(rows * D);
  ops::MoeExpertsArgs ma{TensorView<float const, 2>(x.data(), {rows, D}), TensorView<int32_t const, 2>(ids.data(), {rows, K}),
                         TensorView<float const, 2>(w.data(), {rows, K}), v1, v3, v2,
                         TensorView<float const, 2>(s1.data(), {I, D}), TensorView<float const, 2>(s3.data(), {I, D}),
                         TensorView<float const, 2>(s2.data(), {D, I}), TensorView<float, 2>(out.data(), {rows, D})};
  BOOST_REQUIRE(ops::moe_experts(ctx, {rows, E, D, I, K, limit, true, DType::kF32}, ma).ok());
  int clamp_bites = 0;
  auto expert = [&](float const* xr, float const* a1, float const* a3, float const* a2, double wt, std::vector<double>& y) {
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < D; ++c) { g += static_cast<double>(a1[i * D + c]) * xr[c]; u += static_cast<double>(a3[i * D + c]) * xr[c]; }
      if (u > limit || u < -limit || g > limit) ++clamp_bites;
      u = std::clamp(u, -static_cast<double>(limit), static_cast<double>(limit));
      g = std::min(g, static_cast<double>(limit));
      double act = wt * g / (1 + std::exp(-g)) * u;
      for (int64_t o = 0; o < D; ++o) y[o] += static_cast<double>(a2[o * I + i]) * act;
    }
  };
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> sc(E), biased(E);
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t c = 0; c < D; ++c) l += static_cast<double>(x[r * D + c]) * gate[e * D + c];
      sc[e] = std::sqrt(l > 20 ? l : std::log1p(std::exp(l)));
      biased[e] = sc[e] + bias[e];
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return biased[a] > biased[b]; });
    double sum = sc[order[0]] + sc[order[1]];
    for (int i = 0; i < K; ++i) {
      BOOST_TEST(ids[r * K + i] == order[i]);
      BOOST_TEST(std::fabs(w[r * K + i] - sc[order[i]] / (sum + 1e-20) * rs) <= 1e-5);
    }
    std::vector<double> y(D, 0.0);
    for (int e = 0; e < E; ++e)  // ascending expert id
      for (int i = 0; i < K; ++i)
        if (ids[r * K + i] == e) expert(&x[r * D], w1[e].data(), w3[e].data(), w2[e].data(), w[r * K + i], y);
    expert(&x[r * D], s1.data(), s3.data(), s2.data(), 1.0, y);
    for (int64_t o = 0; o < D; ++o) BOOST_TEST(std::fabs(out[r * D + o] - y[o]) <= 1e-5 * (1 + std::fabs(y[o])));
  }
  BOOST_TEST(clamp_bites > 0);
}

// Block-scaled routed experts on the CPU (MoeExpertsDesc::routed_scaled, MoeExpertsArgs::w*_scaled): bit for bit the
// op on fp32 views of the decoded values (ops::scaled_weight), FP8 32×32 blocks and FP4 per-row-per-32 scales, in
// fp32 and bf16 numerics, with a pruned slot; bad view shapes are refused. Then the shared expert block-scaled too
// (MoeExpertsDesc::shared_scaled, either format): bit for bit the op on its decoded values.
BOOST_AUTO_TEST_CASE(block_scaled_routed_experts_equal_their_decoded_values) {
  int64_t const rows = 5, E = 4, D = 64, I = 96, K = 2;
  for (DType fmt : {DType::kF8E4m3, DType::kF4E2m1x2})
    for (DType md : {DType::kF32, DType::kBf16}) {
      // Codes and scales of one [r, c] matrix; e4m3 NaN codes avoided; scales near 2^-7 (FP8) / 2^-5 (FP4).
      struct Q {
        std::vector<uint8_t> q, s;
        std::vector<float> w;
        ops::BlockScaledView view;
      };
      uint64_t state = verify::test_seed(501);
      auto next = [&] { state = state * 6364136223846793005ull + 1442695040888963407ull; return static_cast<uint8_t>(state >> 56); };
      auto make_as = [&](DType mf, int64_t r, int64_t c) {
        bool const fp4 = mf == DType::kF4E2m1x2;
        Q m;
        int64_t const qc = fp4 ? c / 2 : c, kb = (c + 31) / 32, sr = fp4 ? r : (r + 31) / 32;
        m.q.resize(static_cast<size_t>(r * qc));
        for (auto& b : m.q) { b = next(); if (!fp4 && (b & 0x7F) == 0x7F) b &= 0xFE; }
        m.s.resize(static_cast<size_t>(sr * kb));
        for (auto& b : m.s) b = static_cast<uint8_t>((fp4 ? 122 : 120) + next() % 3);
        m.w.resize(static_cast<size_t>(r * c));
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < c; ++j) m.w[i * c + j] = ops::scaled_weight(mf, m.q.data(), qc, m.s.data(), kb, i, j);
        m.view = {TensorView<uint8_t const, 2>(m.q.data(), {r, qc}), TensorView<uint8_t const, 2>(m.s.data(), {sr, kb})};
        return m;
      };
      auto make = [&](int64_t r, int64_t c) { return make_as(fmt, r, c); };
      std::vector<Q> q1, q3, q2;
      for (int64_t e = 0; e < E; ++e) { q1.push_back(make(I, D)); q3.push_back(make(I, D)); q2.push_back(make(D, I)); }
      std::vector<TensorView<float const, 2>> v1, v3, v2;
      std::vector<ops::BlockScaledView> b1, b3, b2;
      for (int64_t e = 0; e < E; ++e) {
        v1.emplace_back(q1[e].w.data(), std::array<int64_t, 2>{I, D});
        v3.emplace_back(q3[e].w.data(), std::array<int64_t, 2>{I, D});
        v2.emplace_back(q2[e].w.data(), std::array<int64_t, 2>{D, I});
        b1.push_back(q1[e].view);
        b3.push_back(q3[e].view);
        b2.push_back(q2[e].view);
      }
      auto x = verify::randn(rows * D, verify::test_seed(502));
      for (auto& v : x) v = round_to_bf16(v);
      auto s1 = verify::randn(I * D, verify::test_seed(503), 0.1f), s3 = verify::randn(I * D, verify::test_seed(504), 0.1f),
           s2 = verify::randn(D * I, verify::test_seed(505), 0.1f);
      std::vector<int32_t> ids{0, 3, 2, 1, 1, -1, 3, 0, 2, 3};
      std::vector<float> wts{0.7f, 0.3f, 0.5f, 0.5f, 1.f, 0.f, 0.25f, 0.75f, 0.6f, 0.4f};
      std::vector<float> want(rows * D), got(rows * D);
      ops::MoeExpertsArgs a{TensorView<float const, 2>(x.data(), {rows, D}), TensorView<int32_t const, 2>(ids.data(), {rows, K}),
                            TensorView<float const, 2>(wts.data(), {rows, K}), v1, v3, v2,
                            TensorView<float const, 2>(s1.data(), {I, D}), TensorView<float const, 2>(s3.data(), {I, D}),
                            TensorView<float const, 2>(s2.data(), {D, I}), TensorView<float, 2>(want.data(), {rows, D})};
      ops::MoeExpertsDesc d{rows, E, D, I, K, 0.6f, true, md};
      ExecContext ctx;
      BOOST_REQUIRE(ops::moe_experts(ctx, d, a).ok());
      ops::MoeExpertsArgs as = a;
      as.w1 = {};
      as.w3 = {};
      as.w2 = {};
      as.w1_scaled = b1;
      as.w3_scaled = b3;
      as.w2_scaled = b2;
      as.out = TensorView<float, 2>(got.data(), {rows, D});
      ops::MoeExpertsDesc ds = d;
      ds.routed_scaled = fmt;
      BOOST_REQUIRE(ops::moe_experts(ctx, ds, as).ok());
      BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
                 dtype_name(fmt) << " md " << dtype_name(md));
      float amax = 0.f;
      for (float v : want) amax = std::max(amax, std::fabs(v));
      BOOST_TEST(amax > 0.f);  // the experts contribute
      // A w2 view with the w1 shape is refused.
      std::vector<ops::BlockScaledView> bad = b2;
      bad[1] = b1[1];
      as.w2_scaled = bad;
      BOOST_TEST(!ops::moe_experts(ctx, ds, as).ok());
      as.w2_scaled = b2;
      // The shared expert block-scaled as well, in either format: the op on its decoded values.
      for (DType sfmt : {DType::kF8E4m3, DType::kF4E2m1x2}) {
        Q const h1 = make_as(sfmt, I, D), h3 = make_as(sfmt, I, D), h2 = make_as(sfmt, D, I);
        ops::MoeExpertsArgs ad = a;
        std::vector<float> want_s(rows * D), got_s(rows * D);
        ad.shared_w1 = TensorView<float const, 2>(h1.w.data(), {I, D});
        ad.shared_w3 = TensorView<float const, 2>(h3.w.data(), {I, D});
        ad.shared_w2 = TensorView<float const, 2>(h2.w.data(), {D, I});
        ad.out = TensorView<float, 2>(want_s.data(), {rows, D});
        BOOST_REQUIRE(ops::moe_experts(ctx, d, ad).ok());
        ops::MoeExpertsArgs ah = as;
        ah.shared_w1 = {};
        ah.shared_w3 = {};
        ah.shared_w2 = {};
        ah.shared_w1_scaled = h1.view;
        ah.shared_w3_scaled = h3.view;
        ah.shared_w2_scaled = h2.view;
        ah.out = TensorView<float, 2>(got_s.data(), {rows, D});
        ops::MoeExpertsDesc dh = ds;
        dh.shared_scaled = sfmt;
        BOOST_REQUIRE(ops::moe_experts(ctx, dh, ah).ok());
        BOOST_TEST(std::memcmp(got_s.data(), want_s.data(), got_s.size() * sizeof(float)) == 0,
                   "routed " << dtype_name(fmt) << " shared " << dtype_name(sfmt) << " md " << dtype_name(md));
        BOOST_TEST(std::memcmp(want_s.data(), want.data(), want.size() * sizeof(float)) != 0);  // the shared expert counts
        ah.shared_w2_scaled = h1.view;  // the w1 shape where w2 belongs: refused
        BOOST_TEST(!ops::moe_experts(ctx, dh, ah).ok());
      }
    }
}

// kAuto's tile choice (the same values on every path; this pins which one runs): kGemm from
// min(kMoeTcGemmMinPerExpert · experts, kMoeTcGemmMinAssignments) assignments, kEmulated unless weights and md are
// bf16, an explicit path as given.
BOOST_AUTO_TEST_CASE(tensor_core_path_rule) {
  using ops::MoeTcPath;
  auto desc = [](int64_t rows, int64_t experts) {
    ops::MoeExpertsDesc d;
    d.rows = rows, d.experts = experts, d.dim = 5120, d.inter = 2304, d.top_k = 6;
    d.md = DType::kBf16, d.weight_dtype = DType::kBf16;
    return d;
  };
  BOOST_TEST_REQUIRE(ops::kMoeTcGemmMinAssignments == 32);
  BOOST_TEST_REQUIRE(ops::kMoeTcGemmMinPerExpert == 1);
  // 384 experts: 30 assignments (b5) kSkinny, 36 (b6) kGemm; 32 experts: the per-expert bound, also 32.
  BOOST_TEST((ops::moe_tc_path_for(desc(5, 384)) == MoeTcPath::kSkinny));
  BOOST_TEST((ops::moe_tc_path_for(desc(6, 384)) == MoeTcPath::kGemm));
  BOOST_TEST((ops::moe_tc_path_for(desc(1, 384)) == MoeTcPath::kSkinny));
  BOOST_TEST((ops::moe_tc_path_for(desc(5, 32)) == MoeTcPath::kSkinny));
  BOOST_TEST((ops::moe_tc_path_for(desc(6, 32)) == MoeTcPath::kGemm));
  // 4 experts top-6: the per-expert bound (4 assignments) is the smaller one.
  auto small = desc(1, 4);
  small.top_k = 4;
  BOOST_TEST((ops::moe_tc_path_for(small) == MoeTcPath::kGemm));
  small.top_k = 3;
  BOOST_TEST((ops::moe_tc_path_for(small) == MoeTcPath::kSkinny));
  // The thresholds as arguments (TESSERA_MOE_GEMM_MIN / _MIN_ROWS on CUDA).
  BOOST_TEST((ops::moe_tc_path_for(desc(8, 384), 1, 49) == MoeTcPath::kSkinny));
  BOOST_TEST((ops::moe_tc_path_for(desc(8, 384), 1, 48) == MoeTcPath::kGemm));
  BOOST_TEST((ops::moe_tc_path_for(desc(8, 384), 2, 1'000'000) == MoeTcPath::kSkinny));
  BOOST_TEST((ops::moe_tc_path_for(desc(128, 384), 2, 1'000'000) == MoeTcPath::kGemm));
  // An explicit path is kept; fp32 weights or md take the emulated order.
  auto forced = desc(1, 384);
  forced.tc_path = MoeTcPath::kGemm;
  BOOST_TEST((ops::moe_tc_path_for(forced) == MoeTcPath::kGemm));
  auto f32 = desc(64, 384);
  f32.weight_dtype = DType::kF32;
  BOOST_TEST((ops::moe_tc_path_for(f32) == MoeTcPath::kEmulated));
  f32 = desc(64, 384);
  f32.md = DType::kF32;
  BOOST_TEST((ops::moe_tc_path_for(f32) == MoeTcPath::kEmulated));
}

// Block-scaled routed experts whose tiles fit the direct tile: kGemm from kMoeTcDirectGemmMinPerExpert assignments
// per expert; where the direct tile is excluded (a ring or warp-specialised choice, x rows too long for it,
// bf16 experts) the rule above.
BOOST_AUTO_TEST_CASE(tensor_core_path_rule_direct_tiles) {
  using ops::MoeTcPath;
  auto desc = [](int64_t rows, int64_t experts, DType routed) {
    ops::MoeExpertsDesc d;
    d.rows = rows, d.experts = experts, d.dim = 5120, d.inter = 2304, d.top_k = 6;
    d.md = DType::kBf16, d.weight_dtype = DType::kBf16, d.routed_scaled = routed;
    return d;
  };
  BOOST_TEST_REQUIRE(ops::kMoeTcDirectGemmMinPerExpert == 3);
  for (DType const f : {DType::kF4E2m1x2, DType::kF8E4m3}) {
    BOOST_TEST(ops::moe_direct_tiles_fit(desc(1, 384, f)));
    BOOST_TEST(ops::moe_direct_tiles_fit(desc(4096, 384, f)));  // 4 x rows a tile at any row count
    // 384 experts: 1,146 assignments (b191) kSkinny, 1,152 (b192) kGemm; 32 experts: 90 (b15) / 96 (b16).
    BOOST_TEST((ops::moe_tc_path_for(desc(6, 384, f)) == MoeTcPath::kSkinny));
    BOOST_TEST((ops::moe_tc_path_for(desc(128, 384, f)) == MoeTcPath::kSkinny));
    BOOST_TEST((ops::moe_tc_path_for(desc(191, 384, f)) == MoeTcPath::kSkinny));
    BOOST_TEST((ops::moe_tc_path_for(desc(192, 384, f)) == MoeTcPath::kGemm));
    BOOST_TEST((ops::moe_tc_path_for(desc(15, 32, f)) == MoeTcPath::kSkinny));
    BOOST_TEST((ops::moe_tc_path_for(desc(16, 32, f)) == MoeTcPath::kGemm));
    // The threshold as an argument (TESSERA_MOE_GEMM_MIN_DIRECT on CUDA).
    BOOST_TEST((ops::moe_tc_path_for(desc(64, 384, f), 1, 32, 1) == MoeTcPath::kGemm));
    BOOST_TEST((ops::moe_tc_path_for(desc(63, 384, f), 1, 32, 1) == MoeTcPath::kSkinny));
    // A ring or warp-specialised choice: the bf16 rule (kGemm from 32 assignments).
    for (ops::TcQuantPath const q : {ops::TcQuantPath::kRing, ops::TcQuantPath::kWarpSpec}) {
      auto d = desc(6, 384, f);
      d.routed_quant_path = q;
      BOOST_TEST(!ops::moe_direct_tiles_fit(d));
      BOOST_TEST((ops::moe_tc_path_for(d) == MoeTcPath::kGemm));
    }
    auto direct = desc(64, 384, f);
    direct.routed_quant_path = ops::TcQuantPath::kDirect;
    BOOST_TEST((ops::moe_tc_path_for(direct) == MoeTcPath::kSkinny));
    // x rows past the direct tile's budget: 4 · (6144 + 16) · 2 > 48 KiB.
    auto wide = desc(6, 384, f);
    wide.dim = 6144;
    BOOST_TEST(!ops::moe_direct_tiles_fit(wide));
    BOOST_TEST((ops::moe_tc_path_for(wide) == MoeTcPath::kGemm));
    wide.rows = 2;  // two x rows fit
    BOOST_TEST(ops::moe_direct_tiles_fit(wide));
  }
  BOOST_TEST(!ops::moe_direct_tiles_fit(desc(6, 384, DType::kBf16)));
  BOOST_TEST((ops::moe_tc_path_for(desc(6, 384, DType::kBf16)) == MoeTcPath::kGemm));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(engram)

BOOST_AUTO_TEST_CASE(hash_gather_gate_vs_direct) {
  // Tiny layer-1 constants (spec §6, Appendix A).
  std::vector<int64_t> primes = {67, 71, 73, 79, 83, 89}, offs = {0, 67, 138, 211, 290, 373};
  std::vector<int64_t> mult = {29662608052400909, 1873410163432121, 13919202536988139, 28638879857136817};
  int64_t N = 4, He = 2, C = 6, pad = 1;
  // Look-back rows, including blocked slots (pad) from the sequence start.
  std::vector<int64_t> look = {5, pad, pad, pad, 7, 5, pad, pad, 9, 7, 5, pad, 255, 9, 7, 5};
  int64_t rows = 4;
  std::vector<int64_t> ids(rows * C);
  ExecContext ctx;
  BOOST_REQUIRE(ops::engram_hash(ctx, {rows, N, He},
                                 {TensorView<int64_t const, 2>(look.data(), {rows, N}), TensorView<int64_t const, 1>(mult.data(), {N}),
                                  TensorView<int64_t const, 1>(primes.data(), {C}), TensorView<int64_t const, 1>(offs.data(), {C}),
                                  TensorView<int64_t, 2>(ids.data(), {rows, C})}).ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 1; g < N; ++g) {
      uint64_t h = 0;
      for (int64_t i = 0; i <= g; ++i) h ^= static_cast<uint64_t>(look[r * N + i]) * static_cast<uint64_t>(mult[i]);
      for (int64_t hd = 0; hd < He; ++hd) {
        int64_t c = (g - 1) * He + hd;
        BOOST_TEST(ids[r * C + c] == static_cast<int64_t>(h % static_cast<uint64_t>(primes[c])) + offs[c]);
        BOOST_TEST((ids[r * C + c] >= offs[c] && ids[r * C + c] < offs[c] + primes[c]));
      }
    }
  // Gate: out_k = h_k + σ(signed sqrt of the normalised dot)·v.
  int64_t n = 4, D = 64;
  auto x = verify::randn(rows * n * D, verify::test_seed(91), 0.5f);
  auto kv = verify::randn(rows * (n + 1) * D, verify::test_seed(92));
  auto wq = verify::randn(n * D, verify::test_seed(93), 0.2f, 1.f);
  for (int64_t i = 0; i < n * D; ++i) kv[i] = -x[i];  // row 0: keys opposite to the streams → dot < 0
  std::vector<float> out(rows * n * D);
  BOOST_REQUIRE(ops::engram_gate(ctx, {rows, n, D, 1e-20f, DType::kF32},
                                 {TensorView<float const, 2>(x.data(), {rows, n * D}), TensorView<float const, 2>(kv.data(), {rows, (n + 1) * D}),
                                  TensorView<float const, 1>(wq.data(), {n * D}), TensorView<float, 2>(out.data(), {rows, n * D})}).ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < n; ++k) {
      double hh = 0, kk = 0, dt = 0;
      for (int64_t i = 0; i < D; ++i) {
        double h = x[(r * n + k) * D + i], key = kv[r * (n + 1) * D + k * D + i];
        hh += h * h; kk += key * key; dt += h * wq[k * D + i] * key;
      }
      dt = dt / std::sqrt(hh / D + 1e-20) / std::sqrt(kk / D + 1e-20) / std::sqrt(static_cast<double>(D));
      double g = 1 / (1 + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(dt), 1e-6)), dt)));
      if (r == 0) BOOST_TEST(g < 0.5);
      for (int64_t i = 0; i < D; ++i) {
        double e = x[(r * n + k) * D + i] + g * kv[r * (n + 1) * D + n * D + i];
        BOOST_TEST(std::fabs(out[(r * n + k) * D + i] - e) <= 1e-5 * (1 + std::fabs(e)));
      }
    }
}

BOOST_AUTO_TEST_CASE(lookback_blocks_at_start_and_dead_positions) {
  // Compressed ids by position; position 3 is DEAD (a pad). pad_c = 1.
  std::vector<int64_t> hist = {10, 11, 12, ref::kEngramDead, 14, 15, 16};
  auto h = [&](int64_t p) { return hist[static_cast<size_t>(p)]; };
  int64_t tok[4];
  ref::engram_lookback(h, 1, 4, 1, tok);  // t = 1: shifts 2, 3 fall before the start
  BOOST_TEST((std::vector<int64_t>(tok, tok + 4) == std::vector<int64_t>{11, 10, 1, 1}));
  ref::engram_lookback(h, 5, 4, 1, tok);  // shift 2 reaches the DEAD position: it and every longer one pad
  BOOST_TEST((std::vector<int64_t>(tok, tok + 4) == std::vector<int64_t>{15, 14, 1, 1}));
  ref::engram_lookback(h, 3, 4, 1, tok);  // the DEAD position itself blocks everything
  BOOST_TEST((std::vector<int64_t>(tok, tok + 4) == std::vector<int64_t>{1, 1, 1, 1}));
  ref::engram_lookback(h, 6, 4, 1, tok);
  BOOST_TEST((std::vector<int64_t>(tok, tok + 4) == std::vector<int64_t>{16, 15, 14, 1}));
}

BOOST_AUTO_TEST_SUITE_END()

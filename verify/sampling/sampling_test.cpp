// SPDX-License-Identifier: Apache-2.0
/// Keyed sampler tests: Philox known answers, greedy ties, each filter against a brute-force
/// formulation, chi-square goodness of fit with fixed seeds, penalties, logprobs, reproducibility
/// and independence from batch composition.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "tessera/ops/sampling.hpp"
#include "tessera/ref/sampling_ref.hpp"
#include "verify/common/random.hpp"

using namespace tessera;
using ops::SamplingRowParams;

namespace {

struct Batch {
  int64_t rows, vocab;
  std::vector<float> logits;
  std::vector<SamplingRowParams> params;
  std::vector<uint32_t> mask;  // empty = none
  std::vector<int64_t> out_off;
  std::vector<int32_t> out_tok;
  std::vector<int32_t> tokens;
  std::vector<float> lp;
  std::vector<int32_t> top_ids;
  std::vector<float> top_lp;
};

Status run_batch(Batch& b, int32_t top_n = 0, ops::LogprobMode mode = ops::LogprobMode::kRaw) {
  ops::SampleDesc d{b.rows, b.vocab, top_n, mode};
  ops::SampleArgs a;
  a.logits = {b.logits.data(), {b.rows, b.vocab}};
  a.params = {b.params.data(), {b.rows}};
  int64_t const words = (b.vocab + 31) / 32;
  if (!b.mask.empty()) a.mask = {b.mask.data(), {b.rows, words}};
  if (!b.out_off.empty()) {
    a.output_offsets = {b.out_off.data(), {b.rows + 1}};
    a.output_tokens = {b.out_tok.data(), {static_cast<int64_t>(b.out_tok.size())}};
  }
  b.tokens.assign(b.rows, -7);
  b.lp.assign(b.rows, 0.f);
  a.tokens = {b.tokens.data(), {b.rows}};
  a.logprobs = {b.lp.data(), {b.rows}};
  if (top_n > 0) {
    b.top_ids.assign(b.rows * top_n, -1);
    b.top_lp.assign(b.rows * top_n, 0.f);
    a.top_ids = {b.top_ids.data(), {b.rows, top_n}};
    a.top_logprobs = {b.top_lp.data(), {b.rows, top_n}};
  }
  ExecContext ctx;
  return ops::sample(ctx, d, a);
}

/// Samples one row at positions 0..n-1 and returns the histogram.
std::vector<int64_t> histogram(std::vector<float> const& logits, SamplingRowParams p, int64_t n) {
  int64_t const v = static_cast<int64_t>(logits.size());
  Batch b{n, v};
  b.logits.reserve(n * v);
  for (int64_t i = 0; i < n; ++i) {
    b.logits.insert(b.logits.end(), logits.begin(), logits.end());
    p.position = i;
    b.params.push_back(p);
  }
  BOOST_REQUIRE(run_batch(b).ok());
  std::vector<int64_t> h(v, 0);
  for (int32_t t : b.tokens) {
    BOOST_REQUIRE(t >= 0 && t < v);
    ++h[t];
  }
  return h;
}

/// Pearson chi-square of counts against probabilities (cells with p = 0 must be empty).
double chi_square(std::vector<int64_t> const& h, std::vector<double> const& prob, int* dof) {
  int64_t n = std::accumulate(h.begin(), h.end(), int64_t{0});
  double chi = 0;
  *dof = -1;
  for (size_t i = 0; i < h.size(); ++i) {
    if (prob[i] == 0) {
      BOOST_TEST(h[i] == 0, "token " << i << " was removed but sampled " << h[i] << " times");
      continue;
    }
    double const e = prob[i] * double(n);
    chi += (h[i] - e) * (h[i] - e) / e;
    ++*dof;
  }
  return chi;
}

/// Upper bound of chi-square at p ≈ 1e-4 (Wilson–Hilferty), used as a fixed-seed gate.
double chi_bound(int dof) {
  double const z = 3.72, k = dof;
  double const t = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * t * t * t;
}

/// Brute-force kept set (min-p, top-k, top-p), written from the definitions with O(V²) ranks.
std::vector<double> brute_kept_prob(std::vector<float> const& logits, SamplingRowParams const& p) {
  size_t const n = logits.size();
  std::vector<double> prob(n);
  double m = -1e300;
  for (float x : logits) m = std::max(m, double(x) / p.temperature);
  for (size_t i = 0; i < n; ++i) prob[i] = std::exp(double(logits[i]) / p.temperature - m);
  double pmax = *std::max_element(prob.begin(), prob.end());
  std::vector<bool> keep(n, true);
  for (size_t i = 0; i < n; ++i)
    if (p.min_p > 0 && prob[i] < p.min_p * pmax) keep[i] = false;
  auto rank = [&](size_t i) {  // tokens ranked strictly before i among the kept
    size_t r = 0;
    for (size_t j = 0; j < n; ++j)
      if (keep[j] && (prob[j] > prob[i] || (prob[j] == prob[i] && j < i))) ++r;
    return r;
  };
  if (p.top_k > 0) {
    std::vector<bool> k2 = keep;
    for (size_t i = 0; i < n; ++i)
      if (keep[i] && rank(i) >= size_t(p.top_k)) k2[i] = false;
    keep = k2;
  }
  if (p.top_p < 1) {
    double total = 0;
    for (size_t i = 0; i < n; ++i)
      if (keep[i]) total += prob[i];
    std::vector<bool> k2 = keep;
    for (size_t i = 0; i < n; ++i) {
      if (!keep[i]) continue;
      double before = 0;
      for (size_t j = 0; j < n; ++j)
        if (keep[j] && (prob[j] > prob[i] || (prob[j] == prob[i] && j < i))) before += prob[j];
      if (!(before < p.top_p * total) && rank(i) > 0) k2[i] = false;
    }
    keep = k2;
  }
  double s = 0;
  for (size_t i = 0; i < n; ++i)
    if (keep[i])
      s += prob[i];
    else
      prob[i] = 0;
  for (auto& x : prob) x /= s;
  return prob;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sampling)

BOOST_AUTO_TEST_CASE(philox_known_answers) {
  // Random123 kat_vectors for philox4x32_10.
  auto b = Philox4x32::generate({{0, 0, 0, 0}}, 0, 0);
  BOOST_TEST((b.v[0] == 0x6627e8d5u && b.v[1] == 0xe169c58du && b.v[2] == 0xbc57ac4cu &&
              b.v[3] == 0x9b00dbd8u));
  b = Philox4x32::generate({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
                           0xffffffffu);
  BOOST_TEST((b.v[0] == 0x408f276du && b.v[1] == 0x41c83b0eu && b.v[2] == 0xa20bc7c6u &&
              b.v[3] == 0x6d5451fdu));
  b = Philox4x32::generate({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                           0x299f31d0u);
  BOOST_TEST((b.v[0] == 0xd16cfe09u && b.v[1] == 0x94fdccebu && b.v[2] == 0x5001e420u &&
              b.v[3] == 0x24126ea1u));
  static_assert(keyed_uniform(1, 2, 3) >= 0.0 && keyed_uniform(1, 2, 3) < 1.0,
                "constexpr-evaluable draw");
}

BOOST_AUTO_TEST_CASE(uniform_draws_are_uniform_and_keyed) {
  // 64 bins over 64k positions: chi-square with 63 dof; keys and seeds give different streams.
  std::vector<int64_t> h(64, 0);
  for (int64_t i = 0; i < 65536; ++i) ++h[static_cast<int>(keyed_uniform(42, 7, i) * 64)];
  int dof;
  double const chi = chi_square(h, std::vector<double>(64, 1.0 / 64), &dof);
  BOOST_TEST(chi < chi_bound(dof));
  BOOST_TEST(keyed_uniform(42, 7, 5) == keyed_uniform(42, 7, 5));
  BOOST_TEST(keyed_uniform(42, 7, 5) != keyed_uniform(42, 8, 5));
  BOOST_TEST(keyed_uniform(42, 7, 5) != keyed_uniform(43, 7, 5));
  BOOST_TEST(keyed_uniform(42, 7, 5) != keyed_uniform(42, 7, 6));
}

BOOST_AUTO_TEST_CASE(greedy_lowest_index_wins_ties) {
  Batch b{3, 40};
  auto base = verify::randn(40, verify::test_seed(11));
  for (int r = 0; r < 3; ++r) b.logits.insert(b.logits.end(), base.begin(), base.end());
  for (int r = 0; r < 3; ++r) {
    b.logits[r * 40 + 33] = 9.f;
    b.logits[r * 40 + 35] = 9.f;
  }
  b.logits[2 * 40 + 5] = 9.f;  // row 2: an earlier tie
  SamplingRowParams p;
  p.temperature = 0.f;
  b.params.assign(3, p);
  b.mask.assign(3 * 2, 0xffffffffu);
  b.mask[1 * 2 + 1] &= ~(1u << (33 - 32));  // row 1: mask 33 → 35 wins
  BOOST_REQUIRE(run_batch(b).ok());
  BOOST_TEST(b.tokens[0] == 33);
  BOOST_TEST(b.tokens[1] == 35);
  BOOST_TEST(b.tokens[2] == 5);
  // top_k = 1 at T > 0 is greedy too.
  b.params.assign(3, SamplingRowParams{.temperature = 0.8f, .top_k = 1});
  BOOST_REQUIRE(run_batch(b).ok());
  BOOST_TEST(b.tokens[0] == 33);
  BOOST_TEST(b.tokens[1] == 35);
}

BOOST_AUTO_TEST_CASE(temperature_distribution_chi_square) {
  auto logits = verify::randn(12, verify::test_seed(21), 1.5f);
  SamplingRowParams p;
  p.temperature = 0.7f;
  p.seed = 1234;
  p.stream_key = 99;
  auto const h = histogram(logits, p, 40000);
  int dof;
  double const chi = chi_square(h, brute_kept_prob(logits, p), &dof);
  BOOST_TEST_MESSAGE("chi2 = " << chi << " dof = " << dof);
  BOOST_TEST(chi < chi_bound(dof));
}

BOOST_AUTO_TEST_CASE(filters_match_brute_force) {
  uint64_t const seed = verify::test_seed(31);
  std::mt19937_64 g(seed);
  for (int trial = 0; trial < 60; ++trial) {
    int const v = 5 + trial % 40;
    auto logits = verify::randn(v, seed + trial);
    for (auto& x : logits) x = std::round(x * 4) / 4;  // quarter steps: ties happen
    SamplingRowParams p;
    p.temperature = 0.5f + 0.1f * (trial % 10);
    p.top_k = trial % 3 == 0 ? 0 : 1 + int(g() % v);
    p.top_p = trial % 4 == 0 ? 1.f : 0.3f + 0.1f * (trial % 7);
    p.min_p = trial % 5 == 0 ? 0.f : 0.05f * (trial % 6);
    std::vector<double> l(logits.begin(), logits.end());
    auto const w = ref::kept_weights(l, p);
    auto const want = brute_kept_prob(logits, p);
    double s = std::accumulate(w.begin(), w.end(), 0.0);
    for (int i = 0; i < v; ++i) {
      BOOST_TEST((w[i] > 0) == (want[i] > 0), "trial " << trial << " token " << i);
      BOOST_TEST(std::abs(w[i] / s - want[i]) < 1e-12);
    }
  }
  // One filtered configuration end to end through the op: chi-square and support.
  auto logits = verify::randn(30, seed + 999, 1.2f);
  SamplingRowParams p{.temperature = 1.1f, .top_k = 9, .top_p = 0.8f, .min_p = 0.02f, .seed = 5};
  auto const h = histogram(logits, p, 30000);
  int dof;
  double const chi = chi_square(h, brute_kept_prob(logits, p), &dof);
  BOOST_TEST_MESSAGE("filtered chi2 = " << chi << " dof = " << dof);
  BOOST_TEST(dof >= 2);
  BOOST_TEST(chi < chi_bound(dof));
}

BOOST_AUTO_TEST_CASE(penalties_follow_openai_and_vllm) {
  std::vector<float> logits = {2.f, -1.f, 0.5f, 3.f, -2.f, 1.f};
  SamplingRowParams p{.temperature = 0.f,
                      .presence_penalty = 0.5f,
                      .frequency_penalty = 0.25f,
                      .repetition_penalty = 2.f};
  std::vector<int32_t> prompt = {4};
  std::vector<int32_t> output = {3, 3, 1, 3};
  auto const l = ref::penalized_logits(logits, p, nullptr, prompt, output);
  // token 3: 3/2 − (0.25·3 + 0.5) = 0.25; token 1: −1·2 − (0.25 + 0.5) = −2.75; token 4 (prompt
  // only): −4.
  std::vector<double> want = {2.0, -2.75, 0.5, 0.25, -4.0, 1.0};
  for (size_t i = 0; i < want.size(); ++i) BOOST_TEST(l[i] == want[i]);
  Batch b{1, 6, logits, {p}};
  b.out_off = {0, 4};
  b.out_tok = output;
  BOOST_REQUIRE(run_batch(b).ok());
  BOOST_TEST(b.tokens[0] == 0);  // 3.0 fell to 0.25; 2.0 is now the max
}

BOOST_AUTO_TEST_CASE(logprobs_raw_and_processed) {
  auto logits = verify::randn(50, verify::test_seed(41));
  SamplingRowParams p{.temperature = 0.5f, .seed = 77};
  Batch b{1, 50, logits, {p}};
  BOOST_REQUIRE(run_batch(b, 5).ok());
  double m = *std::max_element(logits.begin(), logits.end()), s = 0;
  for (float x : logits) s += std::exp(double(x) - m);
  auto raw = [&](int i) { return double(logits[i]) - m - std::log(s); };
  BOOST_TEST(std::abs(b.lp[0] - raw(b.tokens[0])) < 1e-6);
  std::vector<int> order(50);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int x, int y) { return logits[x] > logits[y]; });
  for (int j = 0; j < 5; ++j) {
    BOOST_TEST(b.top_ids[j] == order[j]);
    BOOST_TEST(std::abs(b.top_lp[j] - raw(order[j])) < 1e-6);
  }
  BOOST_REQUIRE(run_batch(b, 5, ops::LogprobMode::kProcessed).ok());
  double s2 = 0;
  for (float x : logits) s2 += std::exp((double(x) - m) / 0.5);
  BOOST_TEST(std::abs(b.top_lp[0] - (0.0 - std::log(s2))) < 1e-6);
}

BOOST_AUTO_TEST_CASE(reproducible_and_batch_independent) {
  int const v = 300, rows = 6;
  std::vector<Batch> alone;
  Batch all{rows, v};
  for (int r = 0; r < rows; ++r) {
    auto lg = verify::randn(v, 500 + r, 2.f);
    SamplingRowParams p{.temperature = 0.3f + 0.2f * r,
                        .top_k = r % 2 ? 50 : 0,
                        .top_p = r % 3 ? 0.9f : 1.f,
                        .seed = 1000u + r % 2,
                        .stream_key = uint64_t(r),
                        .position = 17 + r};
    all.logits.insert(all.logits.end(), lg.begin(), lg.end());
    all.params.push_back(p);
    alone.push_back(Batch{1, v, lg, {p}});
  }
  BOOST_REQUIRE(run_batch(all).ok());
  auto first = all.tokens;
  BOOST_REQUIRE(run_batch(all).ok());
  BOOST_TEST(all.tokens == first);
  for (int r = 0; r < rows; ++r) {
    BOOST_REQUIRE(run_batch(alone[r]).ok());
    BOOST_TEST(alone[r].tokens[0] == first[r]);
  }
  // Reversed batch order: each row keeps its token.
  Batch rev{rows, v};
  for (int r = rows - 1; r >= 0; --r) {
    rev.logits.insert(rev.logits.end(), alone[r].logits.begin(), alone[r].logits.end());
    rev.params.push_back(alone[r].params[0]);
  }
  BOOST_REQUIRE(run_batch(rev).ok());
  for (int r = 0; r < rows; ++r) BOOST_TEST(rev.tokens[rows - 1 - r] == first[r]);
  // A different seed changes the sequence of a flat distribution.
  std::vector<float> flat(64, 0.f);
  auto h1 = histogram(flat, {.seed = 1}, 32), h2 = histogram(flat, {.seed = 2}, 32);
  BOOST_TEST(h1 != h2);
}

BOOST_AUTO_TEST_CASE(bad_input_gives_clear_errors) {
  Batch b{1, 8, std::vector<float>(8, 1.f), {SamplingRowParams{.top_p = 0.f}}};
  Status s = run_batch(b);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("top_p") != std::string::npos);
  b.params[0] = SamplingRowParams{};
  b.mask = {0u};
  s = run_batch(b);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("masked") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

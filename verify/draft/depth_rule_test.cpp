// SPDX-License-Identifier: Apache-2.0
/// The depth rule (DepthRule, drafter.hpp) on synthetic verify-cost tables: its choice equals a brute-force
/// maximisation of E[tokens | k] / cost(k) written here independently; k = 0 where drafting does not pay
/// (a cost linear in the rows, as on the CPU reference); the running acceptance and the confidence
/// calibration (an over-confident drafter whose drafts fail is driven to k = 0); the cost EMA; the
/// measured table on the tiny model.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <random>

#include "tessera/models/common/drafter.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using model::DepthPolicy;
using model::DepthRule;

namespace {

/// argmax_k (1 + Σ_{j≤k} Π_{i<j} p_i) / cost[k], ties to the smaller k; k = 0 unless strictly better.
int64_t brute_force(std::vector<double> const& p, std::vector<double> const& cost, int64_t cap) {
  int64_t best_k = 0;
  double best = 1.0 / cost[0];
  for (int64_t k = 1; k <= cap; ++k) {
    double e = 1.0;
    for (int64_t j = 1; j <= k; ++j) {
      double prod = 1.0;
      for (int64_t i = 0; i < j; ++i) prod *= p[i];
      e += prod;
    }
    if (e / cost[k] > best) best = e / cost[k], best_k = k;
  }
  return best_k;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(depth_rule)

BOOST_AUTO_TEST_CASE(choice_matches_brute_force_on_synthetic_costs) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(0, 1);
  int nonzero = 0, zero = 0;
  for (int t = 0; t < 400; ++t) {
    DepthPolicy pol;
    pol.calibrate_confidence = false;
    DepthRule rule(pol);
    // Cost profiles: row cost from 0 (bandwidth-bound GPU decode) to 1 (compute-bound CPU) a row.
    double per_row = t % 4 == 0 ? 1.0 : u(rng) * 0.6;
    std::vector<double> cost(6);
    for (int k = 0; k <= 5; ++k) cost[k] = 1.0 + per_row * k * (0.8 + 0.4 * u(rng));
    std::sort(cost.begin(), cost.end());
    rule.set_cost(cost);
    std::vector<float> conf(5);
    std::vector<double> p(5);
    for (int i = 0; i < 5; ++i) p[i] = conf[i] = static_cast<float>(u(rng));
    int64_t cap = 1 + t % 5;
    int64_t got = rule.choose(conf, cap), want = brute_force(p, cost, cap);
    BOOST_TEST(got == want, "case " << t);
    (got ? nonzero : zero) += 1;
  }
  BOOST_TEST(nonzero > 50);
  BOOST_TEST(zero > 50);
}

BOOST_AUTO_TEST_CASE(drafting_does_not_pay_on_a_linear_cost) {
  DepthRule rule;
  rule.set_cost({1, 2, 3, 4, 5, 6});  // CPU reference: a (k+1)-row forward costs k+1 rows
  std::vector<float> conf(5, 0.99f);
  BOOST_TEST(rule.choose(conf, 5) == 0);
  // The measured H200 profile of spec/seed-notes.md §8.3: 21.8 ms a 1-row window, + 4.62 ms a row.
  std::vector<double> gpu;
  for (int k = 0; k <= 5; ++k) gpu.push_back(21.8 + 4.62 * k);
  rule.set_cost(gpu);
  BOOST_TEST(rule.choose(conf, 5) == 5);
  std::vector<float> low(5, 0.15f);  // E[1] = 1.15 < 26.42 / 21.8 = 1.212: not worth a row
  BOOST_TEST(rule.choose(low, 5) == 0);
  std::vector<float> mid(5, 0.25f);  // 1.25 > 1.212 → k ≥ 1; E[2] / cost 1.3125 / 31.04 < 1.25 / 26.42 → 1
  BOOST_TEST(rule.choose(mid, 5) == 1);
  // No cost measured yet → no drafts; fixed_k bypasses the rule, clamped to what is available.
  DepthRule fresh;
  BOOST_TEST(fresh.choose(conf, 5) == 0);
  DepthPolicy fixed;
  fixed.fixed_k = 3;
  BOOST_TEST(DepthRule(fixed).choose(conf, 2) == 2);
  BOOST_TEST(DepthRule(fixed).choose(conf, 5) == 3);
}

BOOST_AUTO_TEST_CASE(acceptance_and_confidence_calibration) {
  DepthPolicy pol;
  pol.prior_acceptance = 0.5;
  pol.ema = 0.25;
  DepthRule rule(pol);
  // Round with k = 5, a = 2: positions 0, 1 accepted, 2 rejected, 3-4 never reached.
  rule.observe_round(5, 2);
  double a = 0.5;
  for (double x : {1.0, 1.0, 0.0}) a = 0.75 * a + 0.25 * x;
  BOOST_TEST(std::abs(rule.acceptance() - a) < 1e-12);
  // Unknown confidence uses α.
  BOOST_TEST(std::abs(rule.reach_probability(-1.f) - a) < 1e-12);

  // An over-confident drafter (confidence 0.9, every draft rejected) is calibrated down to k = 0.
  std::vector<double> gpu;
  for (int k = 0; k <= 5; ++k) gpu.push_back(21.8 + 4.62 * k);
  DepthRule over;
  over.set_cost(gpu);
  std::vector<float> conf(5, 0.9f);
  BOOST_TEST(over.choose(conf, 5) == 5);
  for (int r = 0; r < 30; ++r) over.observe_round(5, 0, conf);
  BOOST_TEST(over.acceptance() < 0.01);
  BOOST_TEST(over.choose(conf, 5) == 0);
  // A drafter whose confidence matches its acceptance keeps its confidence (α / ĉ ≈ 1).
  DepthPolicy slow;
  slow.ema = 0.02;  // a long memory, so the estimate is tight (sd ≈ 0.04 at p = 0.8)
  DepthRule honest(slow);
  honest.set_cost(gpu);
  std::mt19937_64 rng(5);
  for (int r = 0; r < 1000; ++r) {
    int64_t acc = 0;
    while (acc < 5 && std::uniform_real_distribution<double>(0, 1)(rng) < 0.8) ++acc;
    honest.observe_round(5, acc, std::vector<float>(5, 0.8f));
  }
  double const p8 = honest.reach_probability(0.8f);
  BOOST_TEST(std::abs(p8 - 0.8) < 0.15);
  std::vector<float> c8(5, 0.8f);
  BOOST_TEST(honest.choose(c8, 5) == brute_force(std::vector<double>(5, p8), gpu, 5));
  BOOST_TEST(honest.choose(c8, 5) >= 3);
}

BOOST_AUTO_TEST_CASE(cost_table_updates_and_measurement) {
  DepthPolicy pol;
  pol.ema = 0.5;
  DepthRule rule(pol);
  rule.set_cost({2, 4}, false);  // shorter tables repeat their last entry
  BOOST_TEST(rule.cost().size() == 6u);
  BOOST_TEST(rule.cost()[5] == 4.0);
  rule.observe_cost(1, 8);
  BOOST_TEST(rule.cost()[1] == 6.0);
  rule.set_cost({2, 4}, true);
  rule.observe_cost(1, 8);
  BOOST_TEST(rule.cost()[1] == 4.0);  // frozen
  auto& m = verify::tiny_model("fp32");
  std::vector<int32_t> warm = {1, 2, 3, 4, 5, 6, 7};
  auto cost = model::measure_verify_cost(m, warm, 5).value_or_throw();
  BOOST_TEST(cost.size() == 6u);
  for (double c : cost) BOOST_TEST(c > 0.0);
  BOOST_TEST_MESSAGE("tiny fp32 verify cost (s) by rows 1..6: " << cost[0] << " " << cost[1] << " " << cost[2] << " "
                     << cost[3] << " " << cost[4] << " " << cost[5]);
}

BOOST_AUTO_TEST_SUITE_END()

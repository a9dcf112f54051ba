// SPDX-License-Identifier: Apache-2.0
/// The depth rule of drafter.hpp: k maximising E[tokens | k] / cost(k) with
/// E[tokens | k] = 1 + Σ_{j=1..k} Π_{i<j} p_i, the running per-position acceptance α, the confidence
/// calibration p = clamp(c · α / ĉ, 0, 1), and the verify-cost measurement on a scratch sequence.
#include <algorithm>
#include <chrono>

#include "tessera/models/common/drafter.hpp"

namespace tessera::model {

DepthRule::DepthRule(DepthPolicy policy)
    : policy_(policy), cost_(static_cast<size_t>(std::max<int64_t>(policy.max_k, 0) + 1), 0.0),
      alpha_(policy.prior_acceptance) {}

double DepthRule::reach_probability(float c) const {
  if (c < 0.f) return alpha_;
  double p = c;
  if (policy_.calibrate_confidence && conf_seen_ >= policy_.calibration_min && conf_mean_ > 0)
    p = std::clamp(p * alpha_ / conf_mean_, 0.0, 1.0);
  return p;
}

int64_t DepthRule::choose(std::span<float const> confidence, int64_t available) const {
  int64_t const cap = std::min(available, policy_.max_k);
  if (policy_.fixed_k >= 0) return std::clamp<int64_t>(policy_.fixed_k, 0, std::max<int64_t>(cap, 0));
  if (cap <= 0 || cost_[0] <= 0) return 0;
  int64_t best_k = 0;
  double best = 1.0 / cost_[0], expected = 1.0, reach = 1.0;
  for (int64_t j = 1; j <= cap; ++j) {
    float const c = j - 1 < static_cast<int64_t>(confidence.size()) ? confidence[j - 1] : -1.f;
    reach *= reach_probability(c);
    expected += reach;
    if (cost_[j] > 0 && expected / cost_[j] > best) {
      best = expected / cost_[j];
      best_k = j;
    }
  }
  return best_k;
}

void DepthRule::observe_round(int64_t k, int64_t a, std::span<float const> confidence) {
  double const e = policy_.ema;
  // Positions 0 … a−1 accepted, position a rejected (if a < k); later positions were never reached.
  for (int64_t i = 0; i < std::min(k, a + 1); ++i) {
    alpha_ = (1 - e) * alpha_ + e * (i < a ? 1.0 : 0.0);
    if (i < static_cast<int64_t>(confidence.size()) && confidence[i] >= 0.f) {
      conf_mean_ = conf_seen_ == 0 ? double(confidence[i]) : (1 - e) * conf_mean_ + e * double(confidence[i]);
      ++conf_seen_;
    }
  }
}

void DepthRule::observe_cost(int64_t k, double seconds) {
  if (frozen_ || k < 0 || k >= static_cast<int64_t>(cost_.size())) return;
  cost_[k] = cost_[k] > 0 ? (1 - policy_.ema) * cost_[k] + policy_.ema * seconds : seconds;
}

void DepthRule::set_cost(std::vector<double> cost, bool frozen) {
  double const last = cost.empty() ? 0.0 : cost.back();
  cost.resize(cost_.size(), last);
  cost_ = std::move(cost);
  frozen_ = frozen;
}

Result<std::vector<double>> measure_verify_cost(LanguageModel& model, std::span<int32_t const> warm_in, int64_t max_k) {
  using Clock = std::chrono::steady_clock;
  if (warm_in.empty()) return invalid_argument("measure_verify_cost: no warm-up tokens");
  int64_t const V = model.info().vocab_size;
  auto scratch = model.new_sequence();
  std::vector<int32_t> warm(warm_in.begin(), warm_in.begin() + std::min<size_t>(warm_in.size(), 16));
  std::vector<float> lg(static_cast<size_t>((max_k + 1) * V));
  SequenceStep s0{scratch.get(), warm, 1, lg.data()};
  TESSERA_TRY(model.forward({&s0, 1}));
  int64_t const base = scratch->length();
  std::vector<int32_t> win(static_cast<size_t>(max_k + 1), warm.back());
  std::vector<double> cost(static_cast<size_t>(max_k + 1), 0.0);
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t k = 0; k <= max_k; ++k) {
      SequenceStep s{scratch.get(), std::span<int32_t const>(win.data(), static_cast<size_t>(k + 1)), k + 1, lg.data()};
      auto t0 = Clock::now();
      TESSERA_TRY(model.forward({&s, 1}));
      double const dt = std::chrono::duration<double>(Clock::now() - t0).count();
      cost[k] = rep == 0 ? dt : std::min(cost[k], dt);
      TESSERA_TRY(model.truncate(*scratch, base));
    }
  return cost;
}

}  // namespace tessera::model

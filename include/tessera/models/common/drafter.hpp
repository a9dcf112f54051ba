// SPDX-License-Identifier: Apache-2.0
/// Drafters and the exact speculative decode loop (spec/seed-notes.md §4, design/ARCHITECTURE.md §13.3).
///
/// A Drafter proposes up to k tokens that may follow the committed sequence; the target verifies them
/// in one forward over [pending ; drafts] (ops/spec_verify.hpp) and the Generator rolls every piece of
/// state back to the accepted prefix (LanguageModel::truncate; the sampler is keyed by absolute
/// position, so it needs no rollback; a grammar matcher is never advanced on drafts). The output is the
/// serial output whatever the drafter proposes: drafts only change how many forwards it takes.
///
/// Round r with pending tokens x (the prompt, then the last emitted token) and drafts d₀ … d_{k−1}:
///   forward(x ++ d, num_logit_rows = k + 1) → logits [k+1, V];
///   spec_verify → a accepted, choices c₀ … c_a emitted;
///   truncate(state, L + |x| + a)   (L = length before the round);
///   pending ← c_a.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/status.hpp"
#include "tessera/models/common/language_model.hpp"
#include "tessera/ops/sampling.hpp"

namespace tessera::model {

class GrammarMatcher;

/// A drafter's proposal: tokens and, per token, an estimate of P(accepted | previous accepted) in
/// [0, 1] (negative = unknown; the depth policy then uses the measured acceptance rate).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<float> confidence;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  /// Up to `max_k` tokens that may follow `committed` (prompt ++ every emitted token, the last one
  /// included).
  virtual Draft propose(std::span<int32_t const> committed, int64_t max_k) = 0;
  /// Feedback after a round: `drafted` proposed tokens were verified and `accepted` kept.
  virtual void observe(int64_t /*drafted*/, int64_t /*accepted*/) {}
};

/// Prompt-lookup / n-gram copy drafts: the longest suffix of `committed` of n ∈ [min_ngram, max_ngram]
/// tokens that also occurs earlier (the latest earlier occurrence wins) proposes the tokens that
/// followed that occurrence. No weights; works with every checkpoint.
struct LookupOptions {
  int64_t min_ngram = 2, max_ngram = 4;
};
std::unique_ptr<Drafter> make_lookup_drafter(LookupOptions opts = {});

/// Acceptance and cost counters of a generation.
struct DraftStats {
  int64_t rounds = 0;        // target forwards in the decode loop (prefill round included)
  int64_t drafted = 0;       // draft tokens verified
  int64_t accepted = 0;      // draft tokens kept
  int64_t emitted = 0;       // tokens emitted (= accepted + rounds before the stop trim)
  int64_t rollbacks = 0;     // truncate calls that dropped at least one token
  double forward_s = 0, verify_s = 0, draft_s = 0, rollback_s = 0;
  double tokens_per_round() const { return rounds ? double(emitted) / double(rounds) : 0.0; }
  double acceptance() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  void add(DraftStats const& o);
};

/// The depth rule: k per round maximises expected tokens per second,
///   E[tokens | k] = 1 + Σ_{j=1..k} Π_{i<j} p_i,   cost(k) = measured seconds of a (k+1)-row verify forward,
/// with p_i the drafter's confidence (or, when unknown, the running acceptance rate α of the drafter);
/// k = 0 when no k > 0 beats 1 / cost(0). `fixed_k ≥ 0` bypasses the rule (tests, --draft-k).
/// With `calibrate_confidence`, once `calibration_min` drafted positions were verified, a confidence is
/// scaled by α / ĉ (ĉ = the running mean confidence of the verified positions, same EMA as α), so an
/// over-confident head whose drafts keep failing drives k to 0.
struct DepthPolicy {
  int64_t max_k = 5;
  int64_t fixed_k = -1;
  double prior_acceptance = 0.5;  // α before anything was measured
  double ema = 0.2;               // weight of a new round in α and in the cost averages
  bool calibrate_confidence = true;
  int64_t calibration_min = 8;
};

/// The state of the depth rule for one drafter: the verify-cost table (shared by every sequence of a
/// model: one may copy it between rules) and the running acceptance.
class DepthRule {
 public:
  explicit DepthRule(DepthPolicy policy = {});
  DepthPolicy const& policy() const { return policy_; }
  /// The depth for a proposal with these confidences (negative = unknown), at most `available`.
  int64_t choose(std::span<float const> confidence, int64_t available) const;
  /// A verified round: `drafted` tokens with these confidences, `accepted` kept; positions 0 … accepted
  /// (the first rejected one included) update α (and ĉ).
  void observe_round(int64_t drafted, int64_t accepted, std::span<float const> confidence = {});
  /// A measured (k + 1)-row verify forward (EMA; ignored when the table is frozen).
  void observe_cost(int64_t k, double seconds);
  /// Replaces the cost table (k + 1 entries, any unit); frozen = no online updates.
  void set_cost(std::vector<double> cost, bool frozen = true);
  std::vector<double> const& cost() const { return cost_; }
  bool calibrated() const { return !cost_.empty() && cost_[0] > 0; }
  double acceptance() const { return alpha_; }
  /// p_i the rule uses for a confidence c (negative = unknown → α).
  double reach_probability(float c) const;

 private:
  DepthPolicy policy_;
  std::vector<double> cost_;  // [max_k + 1]; 0 = not measured yet
  double alpha_;
  double conf_mean_ = 0;
  int64_t conf_seen_ = 0;
  bool frozen_ = false;
};

/// Seconds of verify forwards of 1 … max_k + 1 rows on a scratch sequence primed with `warm` (≤ 16
/// tokens used): the minimum of 3 timings each. The model's own sequences are not touched.
Result<std::vector<double>> measure_verify_cost(LanguageModel& model, std::span<int32_t const> warm, int64_t max_k);

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  bool ignore_eos = false;
  ops::SamplingRowParams sampling{0.f};  // temperature 0 → greedy; `position` is set by the loop
  GrammarMatcher* grammar = nullptr;      // constrained decoding (advanced only on emitted tokens)
};

/// The decode loop, with or without a drafter. `state` is a fresh sequence or one holding a prefix
/// (then `prompt` is appended to it). After `generate` the state holds prompt ++ out[0 .. n−1) —
/// exactly the state serial decoding leaves (the last token is emitted, not yet fed).
class Generator {
 public:
  Generator(LanguageModel& model, Drafter* drafter, DepthPolicy policy = {});
  Result<std::vector<int32_t>> generate(SequenceState& state, std::span<int32_t const> prompt,
                                        GenerateOptions const& opts, DraftStats* stats = nullptr);
  /// Depth the policy picks for a proposal with these confidences (exposed for tests and benches).
  int64_t choose_depth(std::span<float const> confidence, int64_t available) const { return rule_.choose(confidence, available); }
  /// Measured (or seeded) seconds of a verify forward of k + 1 rows, k ≤ max_k.
  std::vector<double> const& verify_cost() const { return rule_.cost(); }
  /// Replaces the cost table (k + 1 entries, any unit); frozen = no online updates (tests, benches).
  void set_verify_cost(std::vector<double> cost, bool frozen = true) { rule_.set_cost(std::move(cost), frozen); }
  double acceptance_estimate() const { return rule_.acceptance(); }
  DepthRule& depth_rule() { return rule_; }

 private:
  LanguageModel& model_;
  Drafter* drafter_;
  DepthPolicy policy_;
  DepthRule rule_;
};

}  // namespace tessera::model

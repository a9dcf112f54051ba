// SPDX-License-Identifier: Apache-2.0
/// The golden parity gate on golden/v41-tiny (design/ARCHITECTURE.md §13.2 steps 3-5). Per prompt:
///  (a) free-running greedy (prefill + 31 cached single-token steps) against `gen_manual`;
///  (b) teacher-forced logits (one forward over prompt + gen_manual[0..30]; Tessera's one-shot and cached
///      paths are bit-identical) against every `step_logits` row, with the argmax against the golden token.
/// A disagreement is a certified near-tie when the two tokens are each other's runner-up on the golden
/// side and the golden top-1/top-2 gap is at most the variant's tie bound:
///   fp32: 1e-3, the absolute logit-error floor of the gate (every golden fp32 gap must exceed it: checked);
///   bf16: one bf16 ulp at the top-1 logit's magnitude (two logits that round to the same bf16 value or to
///         neighbours cannot be ordered by a bf16 engine).
/// Tolerances are derived from the fixtures themselves: the golden's self-consistency (its one-shot
/// `full_logits` vs its cached `step_logits`: max |Δlogit| and argmax agreement).
///   fp32: every greedy token equal, every teacher-forced argmax equal, max |Δlogit| ≤ max(1e-3, 2·sc_fp32).
///   bf16: teacher-forced agreement ≥ the golden's own, every disagreement certified, max |Δlogit| ≤ the
///         golden's own prefill-vs-decode difference; free-running equal up to the first certified near-tie.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::model::dsv41 {

struct GoldenPromptReport {
  int index = 0;
  int64_t length = 0;
  int steps = 0, exact = 0, near_ties = 0, failures = 0;
  int greedy_first_divergence = -1;          // −1 = every free-running token equal
  bool greedy_divergence_certified = false;
  double max_abs_err = 0, max_rel_err = 0;   // vs step_logits; rel = max |Δ| / max |golden| per row
  double max_abs_err_full = 0;               // vs full_logits (the golden's one-shot path)
  int64_t cutoff_ties = 0;                   // exact top-k cutoff ties met in the teacher-forced pass
  std::string tie_list;                      // "indexer L1@12 …; candidate L4@40 …; router …"
  std::string boundary_list;                 // quantiser decisions within 2 ulps (block absmax) of a boundary
  int64_t first_boundary_position = -1;      // earliest such position (−1: none)
  std::vector<std::string> notes;            // one line per disagreement
};

struct GoldenReport {
  bool bf16 = false;
  std::vector<GoldenPromptReport> prompts;
  int exact = 0, total = 0, near_ties = 0, failures = 0;
  double max_abs_err = 0, max_rel_err = 0;
  double self_consistency_max_abs = 0;  // golden full vs step
  int self_consistency_agree = 0;       // golden argmax agreement full vs step
  double logit_tolerance = 0, tie_bound_desc = 0;
  int64_t cutoff_ties = 0;
  bool pass = false;
  std::vector<std::string> reasons;     // why it failed
  /// "golden: <exact>/<total> steps exact, <ties> near-ties, max_abs_err <x>, max_rel_err <y>, …"
  std::string summary_line() const;
};

/// What the gate needs of a model beyond LanguageModel: quantiser-boundary recording and the per-sequence
/// tie and boundary records (the CPU model's Dsv41State, the GPU model's state).
struct GoldenGateHooks {
  std::function<void(int)> set_boundary_ulps;
  std::function<TieCounts const*(SequenceState const&)> ties;
  std::function<std::vector<QuantBoundary> const*(SequenceState const&)> boundaries;
};

/// The gate on any DeepSeek-V4.1 LanguageModel (`bf16`: the model computes in bf16).
Result<GoldenReport> run_golden_gate(LanguageModel& model, bool bf16, GoldenGateHooks const& hooks,
                                     WeightSource const& golden, std::function<void(std::string const&)> const& log);

/// Reads `prompt.i`, `gen_manual.i`, `step_logits.i`, `full_logits.i` for i = 0.. from `golden` and runs
/// the gate. `log` receives one line per prompt and per disagreement (may be empty).
Result<GoldenReport> run_golden_gate(Dsv41Model& model, WeightSource const& golden,
                                     std::function<void(std::string const&)> const& log);

/// First index of the maximum (greedy argmax; the lowest index wins ties).
int64_t argmax_first(float const* v, int64_t n);

}  // namespace tessera::model::dsv41

// SPDX-License-Identifier: Apache-2.0
/// The exactness gates of ARCHITECTURE.md §13.3 as one suite over `model::LanguageModel`, compared
/// bitwise (token ids and every logits row a decode uses):
///   prefill chunking: prompts prefilled in chunks of 1, 7, 64, 512 and all at once give the same first
///                     token, reply hash (SHA-256 of the greedy reply ids) and logits rows;
///   batched == alone: all prompts in one batch, and staggered (one prefills while others decode),
///                     equal each prompt run alone;
///   snapshot/restore: clone() mid-prompt and mid-reply, each copy continued, equals a fresh run; a
///                     rollback with truncate() after extra tokens equals a fresh run (SKIP if unsupported);
///   keyed sampling:   T > 0 with the keyed sampler (ops::sample): the same seed twice, and batched, give
///                     the same reply; another seed is reported for contrast;
///   drafted == serial: speculative decoding (model::Generator) with lookup drafts at fixed and adaptive
///                     depths, DSpark when given, and always-right / always-wrong / random oracle drafters
///                     gives the serial reply and the serial state (next-step logits bitwise), greedy and
///                     T > 0 (invariance_draft.cpp);
///   graph == eager:   with the model's CUDA-graph mode on (InvarianceOptions::set_graphs), each prompt alone and
///                     all of them staggered equal the eager references bitwise, with executable graphs replayed
///                     (updated in place) across steps; SKIP when the model has no such mode — a gate is never PASS
///                     unless run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tessera/models/common/drafter.hpp"
#include "tessera/models/common/language_model.hpp"

namespace tessera::harness {

enum class Verdict { kPass, kFail, kSkip };
char const* to_string(Verdict v);
inline std::ostream& operator<<(std::ostream& os, Verdict v) { return os << to_string(v); }

struct GateResult {
  std::string name;
  Verdict verdict = Verdict::kSkip;
  std::vector<std::string> evidence;
};

struct InvarianceOptions {
  std::vector<int64_t> prompt_lengths = {5, 37, 130, 600};  // clipped to the model's context
  std::vector<int64_t> chunk_sizes = {1, 7, 64, 512, 0};    // 0 = the whole prompt in one forward
  int64_t decode_tokens = 16;
  uint64_t prompt_seed = 20261202;                          // prompts are seeded random ids
  uint64_t sample_seed = 1234;
  float temperature = 0.8f, top_p = 0.95f;
  /// The model's own drafter for a sequence (DSpark); empty when the model has none.
  std::function<std::unique_ptr<model::Drafter>(model::SequenceState&)> dspark;
  /// Switches the model's CUDA-graph mode (GpuDsv41Model::set_cuda_graphs); empty, or an error on true, makes
  /// graph == eager SKIP with its message.
  std::function<Status(bool)> set_graphs;
  /// Describes the graph counters (launched, updated in place, instantiated) for the gate's evidence; the gate
  /// fails unless some executable was replayed after an update (`replayed` true).
  std::function<std::string(bool* replayed)> graph_counts;
};

std::vector<GateResult> run_invariance(model::LanguageModel& m, InvarianceOptions const& opt);
/// The drafted == serial gate alone over these prompts (plus a repetitive one it adds).
GateResult drafted_serial_gate(model::LanguageModel& m, std::vector<std::vector<int32_t>> prompts,
                               InvarianceOptions const& opt);

/// One line per gate ("PASS batched == alone") followed by its evidence, indented.
std::string invariance_text(std::vector<GateResult> const& gates);
/// One JSON object per gate: {"gate", "verdict", "evidence": [...]}.
std::string invariance_jsonl(std::vector<GateResult> const& gates);

}  // namespace tessera::harness

// SPDX-License-Identifier: Apache-2.0
/// A `LanguageModel` wrapper that plants a known, deterministic fault for testing the verification
/// tools (`tessera serve --perturb-position P`, the invariance suite's self-tests):
///   kPosition: the logits row that predicts absolute position P (a sequence of length P before the
///              token) has its largest logit set just below its runner-up, so greedy decoding picks the
///              runner-up there and nowhere else: replies diverge exactly at token P − prompt length;
///   kBatch:    every logit gets + 1e-3 · (sequences in the forward − 1): batched ≠ alone;
///   kChunk:    every logit gets + 1e-3 · (tokens fed with the row − 1): chunked prefill ≠ one-shot;
///   kClone:    clone() returns a fresh, empty sequence: restored ≠ fresh;
///   kRollback: truncate() reports success and keeps the state: a rejected draft stays in the history
///              (drafted ≠ serial).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tessera/models/common/language_model.hpp"

namespace tessera::harness {

class PerturbedModel final : public model::LanguageModel {
 public:
  enum class Fault { kPosition, kBatch, kChunk, kClone, kRollback };
  PerturbedModel(model::LanguageModel& inner, Fault fault, int64_t position = -1)
      : inner_(inner), fault_(fault), position_(position) {}

  model::ModelInfo const& info() const override { return inner_.info(); }
  std::unique_ptr<model::SequenceState> new_sequence() override { return inner_.new_sequence(); }
  Result<std::unique_ptr<model::SequenceState>> clone(model::SequenceState const& s) override {
    if (fault_ == Fault::kClone) return inner_.new_sequence();
    return inner_.clone(s);
  }
  Status truncate(model::SequenceState& s, int64_t length) override {
    if (fault_ == Fault::kRollback) return {};
    return inner_.truncate(s, length);
  }
  size_t state_bytes_for(int64_t n) const override { return inner_.state_bytes_for(n); }

  Status forward(std::span<model::SequenceStep> batch) override {
    std::vector<int64_t> before(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) before[i] = batch[i].state ? batch[i].state->length() : 0;
    if (Status s = inner_.forward(batch); !s.ok()) return s;
    int64_t const v = inner_.info().vocab_size;
    for (size_t i = 0; i < batch.size(); ++i) {
      auto const& st = batch[i];
      int64_t const fed = static_cast<int64_t>(st.tokens.size());
      for (int64_t r = 0; r < st.num_logit_rows; ++r) {
        float* row = st.logits + r * v;
        // This row follows token index fed - num_logit_rows + r: the history then holds `len` tokens.
        int64_t const len = before[i] + fed - st.num_logit_rows + r + 1;
        if (fault_ == Fault::kPosition && len == position_) demote_top(row, v);
        if (fault_ == Fault::kBatch) for (int64_t k = 0; k < v; ++k) row[k] += 1e-3f * static_cast<float>(batch.size() - 1);
        if (fault_ == Fault::kChunk) for (int64_t k = 0; k < v; ++k) row[k] += 1e-3f * static_cast<float>(fed - 1);
      }
    }
    return {};
  }

 private:
  // Sets the largest logit (lowest id on ties) just below the runner-up.
  static void demote_top(float* row, int64_t v) {
    int64_t top = 0;
    for (int64_t k = 1; k < v; ++k) if (row[k] > row[top]) top = k;
    float second = -3.0e38f;
    for (int64_t k = 0; k < v; ++k) if (k != top) second = std::max(second, row[k]);
    row[top] = second - std::max(1e-3f, 1e-3f * std::abs(second));
  }
  model::LanguageModel& inner_;
  Fault fault_;
  int64_t position_;
};

}  // namespace tessera::harness

// SPDX-License-Identifier: Apache-2.0
/// The interface between a model module and whatever drives it (the server's engine, the verification
/// tools, drafting). A model owns its weights; each sequence owns its decode state. `forward` appends
/// tokens to sequences and returns logits for the last rows of each; it must be row-invariant: a row's
/// logits do not depend on the other sequences in the batch, or on how the tokens were chunked.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/status.hpp"

namespace tessera::model {

struct ModelInfo {
  std::string name;                  // shown in /v1/models
  std::string model_type;            // config.json model_type
  int64_t vocab_size = 0;            // logits width
  int64_t max_context = 0;           // positions a sequence may reach
  std::vector<int32_t> eos_token_ids;
  std::string device = "cpu";
  std::string dtype = "fp32";
};

/// Opaque per-sequence state (caches, rings, buffers); created by the model that uses it.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  /// Tokens consumed so far.
  virtual int64_t length() const = 0;
  /// Approximate bytes this state holds (admission control prices requests with it).
  virtual size_t memory_bytes() const = 0;
};

/// One sequence's part of a batched forward.
struct SequenceStep {
  SequenceState* state = nullptr;
  std::span<int32_t const> tokens;   // appended to the sequence, in order
  int64_t num_logit_rows = 1;        // logits for the last this-many appended tokens (≤ tokens.size())
  float* logits = nullptr;           // [num_logit_rows, vocab_size] fp32, written by forward
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual ModelInfo const& info() const = 0;
  virtual std::unique_ptr<SequenceState> new_sequence() = 0;
  /// Runs every step of the batch; on failure no state is advanced.
  virtual Status forward(std::span<SequenceStep> batch) = 0;
  /// A deep copy of a sequence's state (prefix cache, snapshots); kNotSupported if the model can't.
  virtual Result<std::unique_ptr<SequenceState>> clone(SequenceState const& state) = 0;
  /// Rolls a sequence back to its first `length` tokens (speculative rejection); kNotSupported if the
  /// model keeps no history to roll back to.
  virtual Status truncate(SequenceState& state, int64_t length) = 0;
  /// Predicted bytes of state for a sequence of `num_tokens` tokens.
  virtual size_t state_bytes_for(int64_t num_tokens) const = 0;
};

/// Whether every state of `batch` stays within `max_positions` tokens after it (a state named by several steps
/// adds their tokens up). Models check it before running any step, so a batch refused for its length advances
/// no state.
Status check_batch_positions(std::span<SequenceStep const> batch, int64_t max_positions);

}  // namespace tessera::model

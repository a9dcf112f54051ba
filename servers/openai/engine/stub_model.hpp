// SPDX-License-Identifier: Apache-2.0
/// A deterministic stand-in `LanguageModel` for tests and for serving without weights. Row r of a
/// sequence with history t[0..p] gets logits[v] = L(h_p, v), where h_p is a 64-bit rolling hash of the
/// history (h_{-1} = seed, h_p = mix(h_{p-1}, t[p])) and L maps (h, v) to [-4, 4) for "allowed" tokens and
/// -30 for the rest. So logits depend only on the history: the model is row-invariant by construction
/// (batching, chunking, clone and truncate cannot change a reply), which is what the engine's tests check.
///
/// Scripts: if the history contains a trigger sequence and then an `assistant` marker token, the k-th
/// token after the last such marker is forced to reply[k] (then EOS): tests script tool calls, reasoning
/// and stop strings through the real HTTP path.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/models/common/language_model.hpp"

namespace tessera::server {

struct StubModelConfig {
  std::string name = "tessera-stub";
  int64_t vocab_size = 512;
  int64_t max_context = 4096;
  std::vector<int32_t> eos_token_ids = {1};
  std::vector<int32_t> allowed_tokens;  // tokens with random logits (empty = all); others get -30
  float eos_bias = -1.0f;               // added to EOS logits: lower → longer replies
  int32_t assistant_token = -1;         // marker that opens a reply (scripts count from it)
  std::vector<int32_t> reply_prefix_tokens;  // one of these right after the marker is still prompt (<think>)
  size_t bytes_per_token = 4096;        // what state_bytes_for prices a position at
  uint64_t seed = 0x7e55e7a;
  int64_t step_delay_us = 0;            // simulated compute per forward call (benchmarks)
  int64_t token_delay_us = 0;           // simulated compute per fed token
  struct Script {
    std::vector<int32_t> trigger;
    std::vector<int32_t> reply;
  };
  std::vector<Script> scripts;
};

class StubModel final : public model::LanguageModel {
 public:
  explicit StubModel(StubModelConfig config);
  model::ModelInfo const& info() const override { return info_; }
  std::unique_ptr<model::SequenceState> new_sequence() override;
  Status forward(std::span<model::SequenceStep> batch) override;
  Result<std::unique_ptr<model::SequenceState>> clone(model::SequenceState const& state) override;
  Status truncate(model::SequenceState& state, int64_t length) override;
  size_t state_bytes_for(int64_t num_tokens) const override;

  /// The logits row for a history (tests compare engine output with this directly).
  void logits_for(std::vector<int32_t> const& history, float* out) const;

 private:
  void row(std::vector<int32_t> const& tokens, size_t end, uint64_t h, float* out) const;
  StubModelConfig cfg_;
  model::ModelInfo info_;
  std::vector<uint8_t> allowed_;
};

}  // namespace tessera::server

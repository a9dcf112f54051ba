// SPDX-License-Identifier: Apache-2.0
/// Batch checks shared by the LanguageModel implementations (language_model.hpp).
#include <string>
#include <utility>
#include <vector>

#include "tessera/models/common/language_model.hpp"

namespace tessera::model {

Status check_batch_positions(std::span<SequenceStep const> batch, int64_t max_positions) {
  std::vector<std::pair<SequenceState const*, int64_t>> reach;  // state → its length after the batch
  for (SequenceStep const& step : batch) {
    if (!step.state) return invalid_argument("forward: a step has no state");
    auto it = reach.begin();
    while (it != reach.end() && it->first != step.state) ++it;
    if (it == reach.end()) it = reach.insert(reach.end(), {step.state, step.state->length()});
    it->second += static_cast<int64_t>(step.tokens.size());
    if (it->second > max_positions)
      return invalid_argument("forward: sequence would reach " + std::to_string(it->second) +
                              " positions, beyond max_position_embeddings " + std::to_string(max_positions));
  }
  return {};
}

}  // namespace tessera::model

// SPDX-License-Identifier: Apache-2.0
/// Grammar-constrained decoding for requests: `response_format` (json_object, json_schema) and
/// `tool_choice` required / named (a DSML tool-call block calling the allowed tools) compiled with the
/// model module's grammar (models/common/grammar) into a per-request `TokenConstraint`. In thinking mode
/// the grammar starts with free reasoning up to `</think>`.
#pragma once

#include <memory>
#include <optional>

#include "servers/openai/engine/types.hpp"
#include "servers/openai/routes/request.hpp"
#include "servers/openai/routes/text.hpp"
#include "tessera/models/common/grammar.hpp"

namespace tessera::server {

/// True when the request asks for constrained decoding: a chat request with response_format json_object /
/// json_schema or tool_choice required / named.
bool wants_constraint(ApiRequest const& r);

class ConstraintFactory {
 public:
  /// Builds the byte trie of the vocabulary once. Special tokens are never allowed in constrained text
  /// except `<think>`-closing `</think>` and `｜DSML｜`, which the grammars spell.
  static Result<std::shared_ptr<ConstraintFactory const>> create(TextCodec const& codec, std::vector<int32_t> const& eos_ids);
  /// The request's constraint, nullptr when it needs none, or a 400 for a schema the grammar rejects.
  std::variant<std::shared_ptr<TokenConstraint>, ApiError> for_request(ApiRequest const& r) const;

 private:
  std::shared_ptr<model::GrammarVocabulary const> vocab_;
  bool has_eos_ = false;  // the model has an end-of-sequence id (else a complete text ends by exhaustion)
};

}  // namespace tessera::server

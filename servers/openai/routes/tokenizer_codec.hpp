// SPDX-License-Identifier: Apache-2.0
/// Loads a Hugging Face tokenizer.json for DeepSeek-V4.1 use (the V4.1 special-token overlay of
/// spec/chat-format.md §1.4 when the file is a V3/V4 one) as the routes' `TextCodec`.
#pragma once

#include <memory>
#include <string>

#include "servers/openai/routes/text.hpp"
#include "tessera/models/common/tokenizer.hpp"

namespace tessera::server {

struct LoadedTokenizer {
  std::shared_ptr<models::Tokenizer const> tokenizer;
  std::unique_ptr<TextCodec> codec;  // refers to *tokenizer
};

Result<LoadedTokenizer> load_v41_tokenizer(std::string const& path);

}  // namespace tessera::server

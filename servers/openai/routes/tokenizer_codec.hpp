// SPDX-License-Identifier: Apache-2.0
/// Loads a Hugging Face tokenizer.json as the routes' `TextCodec`.
#pragma once

#include <memory>
#include <string>

#include "servers/openai/routes/text.hpp"
#include "tessera/models/common/tokenizer.hpp"

namespace tessera::server {

Result<std::unique_ptr<TextCodec>> load_tokenizer_codec(std::string const& path, models::TokenizerOptions const& options = {});

}  // namespace tessera::server

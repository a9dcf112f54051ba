// SPDX-License-Identifier: Apache-2.0
/// The DeepSeek-V4.1 chat format of the model module (models/deepseek_v41/chat) as the routes'
/// `ChatFormat` and `OutputParser`.
#pragma once

#include <memory>
#include <vector>

#include "servers/openai/routes/text.hpp"
#include "tessera/models/deepseek_v41/chat.hpp"

namespace tessera::server {

/// `tok` (may be null): tokenize prompts in safe mode with it; null = through the codec passed to encode().
std::unique_ptr<ChatFormat> make_deepseek_chat_format(models::Tokenizer const* tok);
std::unique_ptr<OutputParser> make_deepseek_output_parser(bool thinking, bool parse_tools);
/// The stop tokens the chat format ends every assistant turn with: `<｜end▁of▁sentence｜>` (id 1 in the
/// DeepSeek tokenizers, spec/chat-format.md §1.4) when `codec` has it; empty otherwise.
std::vector<int32_t> tokenizer_eos_ids(TextCodec const& codec);

}  // namespace tessera::server

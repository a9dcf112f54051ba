// SPDX-License-Identifier: Apache-2.0
/// OpenAI request bodies → native structs, with every check done before any token is generated
/// (spec/chat-format.md §5.5, seed-notes §2.2). Errors carry OpenAI's error fields and the HTTP status.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/json/object.hpp>

#include "servers/openai/engine/types.hpp"
#include "servers/openai/routes/text.hpp"

namespace tessera::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;   // empty → null
  std::string code;    // empty → null
};

struct RequestLimits {
  size_t max_json_depth = 64;
  size_t max_messages = 4096;
  size_t max_stop = 16;
  size_t max_tools = 256;
  int64_t max_tokens_cap = 1 << 30;
};

struct ApiRequest {
  bool chat = true;
  std::string model;                      // empty = not given
  // chat
  std::vector<ChatMessage> messages;
  ChatRenderOptions render;
  std::string tool_choice = "auto";       // none | auto | required | function
  std::string tool_choice_name;
  bool parallel_tool_calls = true;
  std::vector<std::string> tool_names;
  std::string response_format = "text";   // text | json_object | json_schema
  // completions
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  bool echo = false;
  // both
  std::optional<int64_t> max_tokens;
  SamplingParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool ignore_eos = false;
  bool return_token_ids = false;
  bool draft = true;
  bool background = false;                // priority "background" (or a vLLM-style integer > 0)
};

using ParsedBody = std::variant<boost::json::object, ApiError>;
using ParsedRequest = std::variant<ApiRequest, ApiError>;

/// JSON text → object: invalid JSON, invalid UTF-8, nesting deeper than the limit and non-object bodies
/// are 400s naming the problem.
ParsedBody parse_body(std::string_view body, RequestLimits const& limits);
ParsedRequest parse_chat_request(boost::json::object const& body, RequestLimits const& limits);
ParsedRequest parse_completion_request(boost::json::object const& body, RequestLimits const& limits);

/// reasoning_effort value → (thinking, effort) per spec/chat-format.md §2.6; nullopt = invalid.
struct Effort { bool thinking; int value; };
std::optional<Effort> map_effort(boost::json::value const& v);

}  // namespace tessera::server

// SPDX-License-Identifier: Apache-2.0
/// The text side of a served model, as the routes see it: a tokenizer (`TextCodec`), the chat encoding
/// (`ChatFormat`: OpenAI messages → prompt text, spec/chat-format.md §2) and a streaming output parser
/// (`OutputParser`: reply text → reasoning / content / tool-call deltas, §3). Plus two pieces of wire
/// plumbing every route uses: incremental UTF-8 assembly of token bytes and stop-string hold-back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/value.hpp>

#include "tessera/core/status.hpp"

namespace tessera::server {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  /// Special tokens written literally in `text` become their ids when `special` is true.
  virtual std::vector<int32_t> encode(std::string_view text, bool special) const = 0;
  /// The raw bytes of one token (may be a partial UTF-8 sequence).
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual std::optional<int32_t> special_id(std::string_view token) const = 0;
  std::string decode(std::span<int32_t const> ids) const {
    std::string s;
    for (int32_t t : ids) s += token_bytes(t);
    return s;
  }
};

struct ToolCallRef {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

struct ChatMessage {
  std::string role;       // system (developer mapped here), user, assistant, tool
  std::string content;
  std::optional<std::string> reasoning;
  std::vector<ToolCallRef> tool_calls;
  std::string tool_call_id;
};

/// Everything the chat encoding needs besides the messages.
struct ChatRenderOptions {
  bool thinking = true;
  int effort = 75;                               // 1..100, rendered only in thinking mode
  std::vector<boost::json::value> tools;         // each tool's `function` object, client key order
  std::optional<boost::json::value> response_schema;  // injected as "## Response Format"
  bool drop_thinking = true;
};

class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  virtual Result<std::string> render(std::vector<ChatMessage> const& messages, ChatRenderOptions const& opt) const = 0;
};

/// What a piece of reply text adds to the OpenAI message.
struct OutputDelta {
  std::string reasoning;
  std::string content;
  struct Tool {
    int index = 0;
    bool begin = false;       // first delta of this call: carries id and name
    std::string id, name;
    std::string arguments;    // fragment; fragments concatenate to the final arguments text
  };
  std::vector<Tool> tools;
  bool empty() const { return reasoning.empty() && content.empty() && tools.empty(); }
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  virtual void feed(std::string_view text, OutputDelta& out) = 0;
  /// End of reply: releases held-back text.
  virtual void finish(OutputDelta& out) = 0;
  virtual int tool_call_count() const = 0;
};

/// Starts a parser for one reply. `thinking`: the reply begins inside reasoning.
using OutputParserFactory = std::unique_ptr<OutputParser> (*)(bool thinking, bool parse_tools);

/// Bytes → the longest complete UTF-8 prefix; invalid sequences become U+FFFD; flush() ends the stream.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;
};

/// Cuts text at the first stop string, holding back any tail that could start one.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  /// Returns text safe to emit; sets stopped() once a stop string completed (the stop itself is dropped).
  std::string push(std::string_view text);
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

/// True if `s` is valid UTF-8 (no overlongs, no surrogates, ≤ U+10FFFF).
bool valid_utf8(std::string_view s);

/// Python json.dumps(v, ensure_ascii=False) (separators ", " and ": "), as the DeepSeek encoder writes
/// JSON into prompts (spec/chat-format.md §2.2).
std::string python_json_dumps(boost::json::value const& v);

// Adapters used until the model module's tokenizer / encoder / parser are wired in.
/// Byte-level codec: ids 0..255 are bytes, then the DeepSeek special tokens (stub model vocabulary).
std::unique_ptr<TextCodec> make_byte_codec();
/// The V4.1 encoder of spec/chat-format.md §2 (system/user/assistant/tool, tools, effort, response format).
std::unique_ptr<ChatFormat> make_v41_chat_format();
/// The tolerant streaming parser of §3.3/§3.4.
std::unique_ptr<OutputParser> make_v41_output_parser(bool thinking, bool parse_tools);

}  // namespace tessera::server

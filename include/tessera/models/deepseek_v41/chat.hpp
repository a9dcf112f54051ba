// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 chat format (spec/chat-format.md §1.4, §2, §3): the special-token table, the prompt
/// encoder (byte-exact with DeepSeek's reference `encoding.py`, rev dba1be0, text path), the reasoning-effort
/// mapping, and the output parsers (an exact reference parser and a streaming, tolerant state machine that
/// splits generated text into reasoning, content and DSML tool calls).
///
/// Prompt skeleton (thinking mode):
///   <｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: N (…)\n\n[system][\n\n## Tools…]<｜User｜>u<｜Assistant｜><think>
/// chat mode: no effort line, `<｜System｜>` only before a system message, and `</think>` after `<｜Assistant｜>`.
/// Tool results are folded into the user turn as `<tool_result>…</tool_result>` blocks; assistant tool calls
/// are rendered as the DSML block of §2.1.
///
/// Typical use (the server converts the OpenAI request into these structs):
///   auto tok = chat::load_tokenizer(path).value_or_throw();
///   chat::EncodeOptions o; o.thinking = true; o.reasoning_effort = 75;
///   auto prompt = chat::encode_conversation(messages, tools, o);          // Result<Prompt>
///   auto ids = prompt->token_ids(tok, chat::TokenizeMode::kSafe);          // Result<std::vector<TokenId>>
///   chat::OutputParser p({.thinking = true});
///   for each decoded chunk: auto d = p.feed(chunk);  …  auto last = p.finish();
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tessera/core/status.hpp"
#include "tessera/models/common/tokenizer.hpp"

namespace tessera::models::deepseek_v41::chat {

// ---------------------------------------------------------------------------------------------------------
// Special tokens (§1.4, §2.1). The bar is U+FF5C, the word separator U+2581.

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";            // id 0
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";              // id 1, the only stop token
inline constexpr std::string_view kSystem = "<｜System｜>";                   // 128799
inline constexpr std::string_view kUser = "<｜User｜>";                       // 128803
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";             // 128804
inline constexpr std::string_view kThinkStart = "<think>";                   // 128821
inline constexpr std::string_view kThinkEnd = "</think>";                    // 128822
inline constexpr std::string_view kDsml = "｜DSML｜";                        // 128825
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";  // 128828
inline constexpr std::string_view kImagePlaceholder = "<｜deepseek_image｜>"; // 129264

/// The complete V4.1 added-token table: ids 0, 1, 2 and 128000‥129279 without gaps, in id order, with the
/// `special` flags of §1.3 (true for BOS/EOS/pad/placeholders/grounding; false for the chat, think, DSML,
/// FIM, tool, task and image tokens). Used to overlay a V3 or V4 tokenizer.json (§1.5).
std::vector<AddedToken> v41_added_tokens();

enum class Overlay {
  kAuto,     // overlay when id 128799 is not `<｜System｜>` (a V3/V4 file); keep a real V4.1 file's table
  kAlways,   // always replace added_tokens by v41_added_tokens()
  kNever,    // use the file as is
};
/// Loads a tokenizer.json for V4.1 use (see Overlay).
Result<Tokenizer> load_tokenizer(std::string const& path, Overlay overlay = Overlay::kAuto);

/// Ids of the tokens the encoder and the parser care about; an error names the first missing one.
struct SpecialIds {
  TokenId bos, eos, system, user, assistant, think_start, think_end, dsml, latest_reminder, image;
};
Result<SpecialIds> special_ids(Tokenizer const& tok);

// ---------------------------------------------------------------------------------------------------------
// Conversation (native structs; the server converts OpenAI JSON into these)

/// One part of an array `content`: text, or something the text path cannot render.
struct ContentPart {
  std::string type = "text";   // "text", "image_url", "image", "input_image", or any other part type
  std::string text;            // for type "text"
};

struct ToolCall {
  std::string id;          // OpenAI tool_call id (orders tool results, §2.3 step 3)
  std::string name;
  std::string arguments;   // JSON text as sent (an object, a double-encoded string, or another value)
};

struct Message {
  /// "system", "developer" (rendered as system, §2.4), "user", "assistant", "tool", "latest_reminder".
  std::string role;
  std::optional<std::string> content;      // null content renders as ""
  std::vector<ContentPart> parts;          // used instead of `content` when non-empty (array content)
  std::optional<std::string> reasoning_content;   // assistant
  std::vector<ToolCall> tool_calls;        // assistant
  std::string tool_call_id;                // tool
  bool wo_eos = false;                     // assistant: render without the closing EOS (prefix continuation)
};

struct Tool {
  /// The OpenAI `function` object as JSON text ({"name", "description", "parameters", …}); it is rendered
  /// with Python `json.dumps(…, ensure_ascii=False)` rules in the client's key order (§2.2).
  std::string function_json;
};

struct EncodeOptions {
  bool thinking = true;             // thinking mode (`<think>` opens the reply) vs chat mode
  int reasoning_effort = 75;        // 1‥100, rendered at index 0 in thinking mode only (§2.6)
  bool drop_thinking = true;        // drop reasoning of turns before the last user turn (off when tools exist)
  bool add_bos = true;              // false when continuing an already-encoded context
  bool add_generation_prompt = true;   // `<｜Assistant｜><think>` / `</think>` after the last user turn
  /// JSON text rendered as the `## Response Format` section of the system turn (§2.1); empty = none.
  std::string response_format_json;
};

/// The rendered prompt as segments: special-token spellings produced by the encoder (`special = true`)
/// and text (`special = false`), in order. text() is the reference string.
struct Prompt {
  struct Segment {
    bool special;
    std::string text;
  };
  std::vector<Segment> segments;
  std::string text() const;
};

enum class TokenizeMode {
  kExact,   // tokenize text() with added-token matching: parity with the Python reference (§1.3)
  kSafe,    // encoder tokens as ids; user text never turns into special tokens (server default)
};

/// Renders `messages` (top-level `tools` attach to messages[0] when it is a system message, else to a
/// synthetic empty system message inserted at index 0; for `tool_choice: "none"` pass no tools). Errors:
/// unknown role, invalid effort, an image part or a literal `<｜deepseek_image｜>` in text (text-only path),
/// invalid tool JSON; each names the message or field.
Result<Prompt> encode_conversation(std::vector<Message> const& messages, std::vector<Tool> const& tools,
                                   EncodeOptions const& options);
/// Token ids of a rendered prompt (no BOS added beyond what the prompt holds).
Result<std::vector<TokenId>> tokenize_prompt(Prompt const& prompt, Tokenizer const& tok,
                                             TokenizeMode mode = TokenizeMode::kSafe);

// ---------------------------------------------------------------------------------------------------------
// Reasoning effort (§2.6)

struct ThinkingSetting {
  bool thinking = true;
  int effort = 75;
};
/// Maps an OpenAI `reasoning_effort` name: none → thinking off; minimal/low → 50; medium/high/xhigh → 75
/// (DeepSeek hosted-API aliases onto the dba1be0 table low 50 / high 75 / max 100); ultra/max → 100.
/// Anything else → invalid_argument (HTTP 400).
Result<ThinkingSetting> effort_from_name(std::string_view name);
/// An integer effort 1‥100 (thinking on); anything else → invalid_argument.
Result<ThinkingSetting> effort_from_int(int64_t value);

// ---------------------------------------------------------------------------------------------------------
// JSON in Python's `json.dumps(value, ensure_ascii=False)` form (§2.2)

/// Re-serializes JSON text with separators ", " / ": ", insertion key order, raw non-ASCII, Python float
/// repr (1.0, 1e-05, 1e+100). Invalid JSON → malformed naming `what`.
Result<std::string> python_json_dumps(std::string_view json_text, std::string_view what);
/// A string as a JSON string literal, Python-style escaping (\" \\ \n \r \t \b \f, \u00XX for other C0).
std::string python_json_string(std::string_view s);

// ---------------------------------------------------------------------------------------------------------
// Output parsing (§3)

struct ParsedToolCall {
  std::string name;
  std::string arguments;   // JSON object text: {"k": "string value", "n": raw non-string value}
  bool complete = true;    // false when the output ended inside this call (truncation)
};

struct ParsedMessage {
  std::string reasoning;   // reasoning_content (thinking mode)
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool saw_eos = false;
  int stop_index = -1;     // OutputParser: index of the Options::stop string that ended the reply, else -1
};

/// The reference parser (`parse_message_from_completion_text`, strict, §3.2) on the whole completion text
/// (everything after the prompt, EOS included if generated). Malformed output → malformed with the reason.
Result<ParsedMessage> parse_completion_exact(std::string_view text, bool thinking);

/// One streamed piece of a tool call. The first delta of a call has `begin` set, carries `name` and empty
/// `arguments`; later ones carry argument fragments that concatenate to the final `arguments`.
struct ToolCallDelta {
  int index = 0;
  bool begin = false;
  std::string name;
  std::string arguments;
};

struct ParseDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

/// Streaming, tolerant parser (§3.3 Tessera's choice, §3.4). Feed decoded text (special tokens kept, i.e.
/// decoded with skip_special = false) in any chunking; the concatenation of all deltas is independent of
/// the chunking and equals parse_completion_exact on well-formed output. Tolerant rules: DSML inside
/// reasoning ends the reasoning; a stray `</think>` in content and a repeated `<think>` in reasoning are
/// dropped; V4 spellings (`<｜DSML｜tool_calls>`, `<｜DSML｜invoke`, `<｜DSML｜parameter`) are accepted; a bare
/// `<｜DSML｜ invoke` opens a call block; any other `｜DSML｜` markup is removed from content; text after EOS
/// is ignored; every tool name is surfaced (no check against the declared tools); removed markup never
/// splices the halves of a `｜DSML｜` or EOS spelling together in reasoning or content.
class OutputParser {
 public:
  struct Options {
    bool thinking = true;            // the reply starts inside reasoning (the prompt ended with `<think>`)
    std::vector<std::string> stop;   // OpenAI `stop` strings: matched in reasoning and content, held back
                                     // while partial; a match ends the reply (message().stop_index)
  };
  explicit OutputParser(Options options);
  /// Consumes `text`; returns what became definite. Text that may be the start of a marker is held back.
  ParseDelta feed(std::string_view text);
  /// End of generation: releases held-back text, closes an unterminated call (complete = false).
  ParseDelta finish();
  /// Everything parsed so far (after finish(): the whole reply).
  ParsedMessage const& message() const { return msg_; }
  bool finished() const { return state_ == State::kDone; }

 private:
  enum class State { kReasoning, kContent, kCallsOpen, kInvokeHead, kInvokeName, kInvokeHeadEnd, kInvokeBody,
                     kParamHead, kParamName, kParamAttrs, kParamValue, kDone };
  bool step(ParseDelta& d, bool final);
  bool step_text(ParseDelta& d, bool final);
  bool step_calls(ParseDelta& d, bool final);
  void emit_text(ParseDelta& d, std::string_view s);
  void emit_args(ParseDelta& d, std::string_view s);
  void close_call(ParseDelta& d, bool complete);

  Options options_;
  State state_;
  std::string buf_;        // unconsumed input
  bool gap_ = false;       // input was consumed without being emitted since the last text emission
  std::array<bool, 256> first_byte_{};   // bytes that can start a text-state marker or stop string
  std::vector<std::string> junctions_;   // after a gap: rests of markup spellings whose start ends the text
  std::string field_;      // tool name / parameter key being read
  bool param_is_string_ = true;
  bool call_has_params_ = false;
  ParsedMessage msg_;
};

}  // namespace tessera::models::deepseek_v41::chat

// SPDX-License-Identifier: Apache-2.0
/// The DeepSeek-V4.1 prompt encoder (spec/chat-format.md §2.3–§2.4), byte-exact with the reference
/// `encode_messages(messages, thinking_mode, drop_thinking, add_default_bos_token, reasoning_effort)`:
///  1. developer → system; top-level tools / response format attach to messages[0] if it is a system
///     message, else to a synthetic empty system message inserted at index 0;
///  2. tool messages become `tool_result` blocks of a user turn (appended to a preceding merged user turn);
///     a user message right after such a turn joins it as a text block;
///  3. tool_result blocks are reordered to the previous assistant's tool_calls[].id order (stable);
///  4. thinking mode with drop_thinking and no tools anywhere: assistant turns before the last user-like
///     turn (user, or system at index > 0) lose their reasoning;
///  5. each message renders as §2.4 prescribes, followed by `<｜Assistant｜><think>` / `</think>` after a
///     user-like turn that the next message does not continue.
#include <algorithm>
#include <map>

#include <boost/json.hpp>

#include "tessera/models/deepseek_v41/chat.hpp"

namespace tessera::models::deepseek_v41::chat {

std::string python_json_dumps_value(boost::json::value const& v);   // json_py.cpp

namespace {

namespace json = boost::json;

constexpr std::string_view kEffortHead = "Reasoning Effort: ";
constexpr std::string_view kEffortTail = " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

constexpr std::string_view kToolsHead =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" "
    "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n<｜DSML｜ invoke "
    "name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString parameters should be specified "
    "as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value "
    "in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST "
    "output your complete reasoning inside <think>...</think> BEFORE any tool calls or final "
    "response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available "
    "Tool Schemas\n\n";
constexpr std::string_view kToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

/// Builds Prompt segments. Encoder-made text goes through template(), which turns the special spellings
/// it contains (｜DSML｜, <think>, </think>) into special segments; caller text goes through text() as is.
class Builder {
 public:
  void special(std::string_view s) { p_.segments.push_back({true, std::string(s)}); }
  void text(std::string_view s) {
    if (s.empty()) return;
    if (!p_.segments.empty() && !p_.segments.back().special) p_.segments.back().text += s;
    else p_.segments.push_back({false, std::string(s)});
  }
  void templ(std::string_view s) {
    static constexpr std::string_view kSpecials[] = {kDsml, kThinkStart, kThinkEnd};
    while (!s.empty()) {
      size_t best = std::string_view::npos, len = 0;
      for (auto sp : kSpecials) {
        size_t at = s.find(sp);
        if (at < best) best = at, len = sp.size();
      }
      if (best == std::string_view::npos) {
        text(s);
        return;
      }
      text(s.substr(0, best));
      special(s.substr(best, len));
      s.remove_prefix(best + len);
    }
  }
  Prompt take() { return std::move(p_); }

 private:
  Prompt p_;
};

struct Block {
  enum Kind { kText, kToolResult } kind;
  std::string text;          // text, or the tool result content
  std::string tool_use_id;
};

struct Msg {
  std::string role;          // system | user | assistant | latest_reminder
  std::string content;
  bool has_blocks = false;
  std::vector<Block> blocks;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<Tool> const* tools = nullptr;
  std::string response_format;
  bool wo_eos = false;
};

Status check_no_image(std::string_view s, std::string const& where) {
  if (s.find(kImagePlaceholder) != std::string_view::npos)
    return invalid_argument(where + ": the image placeholder " + std::string(kImagePlaceholder) +
                            " may not appear in text");
  return {};
}

/// Text of a message's content: the string, or the text parts joined by "\n\n". Image parts are rejected
/// (text-only path); other part types are rejected too (the reference would paste a Python dict repr).
Result<std::string> content_text(Message const& m, std::string const& where) {
  if (m.parts.empty()) {
    std::string s = m.content.value_or("");
    TESSERA_TRY(check_no_image(s, where));
    return s;
  }
  std::string out;
  for (size_t i = 0; i < m.parts.size(); ++i) {
    auto const& p = m.parts[i];
    if (p.type != "text")
      return invalid_argument(where + ".content[" + std::to_string(i) + "]: part type \"" + p.type +
                              "\" is not supported by the text-only prompt encoder");
    if (i) out += "\n\n";
    out += p.text;
  }
  TESSERA_TRY(check_no_image(out, where));
  return out;
}

/// Tool-result content: the string, or text parts joined by "\n\n" with other parts as "[Unsupported X]".
std::string tool_result_text(Message const& m) {
  if (m.parts.empty()) return m.content.value_or("");
  std::string out;
  for (size_t i = 0; i < m.parts.size(); ++i) {
    if (i) out += "\n\n";
    out += m.parts[i].type == "text" ? m.parts[i].text : "[Unsupported " + m.parts[i].type + "]";
  }
  return out;
}

/// `<｜DSML｜ parameter …>` lines of one historical call (§2.2): arguments parsed as JSON (twice when
/// double-encoded); a non-object becomes {"arguments": <the raw text>}.
void render_call_arguments(ToolCall const& call, Builder& b) {
  json::value v;
  bool is_object = false;
  std::string s = call.arguments;
  for (int round = 0; round < 2; ++round) {
    std::error_code ec;
    json::value parsed = json::parse(s, ec);
    if (ec) break;
    if (parsed.is_object()) {
      v = std::move(parsed);
      is_object = true;
      break;
    }
    if (!parsed.is_string()) break;
    s = std::string(parsed.get_string());
  }
  if (!is_object) {
    json::object o;
    o["arguments"] = call.arguments;
    v = std::move(o);
  }
  bool first = true;
  for (auto const& kv : v.get_object()) {
    if (!first) b.text("\n");
    first = false;
    bool is_str = kv.value().is_string();
    b.text("<");
    b.special(kDsml);
    b.text(" parameter name=\"");
    b.text(kv.key());
    b.text(is_str ? "\" string=\"true\">" : "\" string=\"false\">");
    b.text(is_str ? std::string(kv.value().get_string()) : python_json_dumps_value(kv.value()));
    b.text("</");
    b.special(kDsml);
    b.text(" parameter>");
  }
}

void render_tool_calls(std::vector<ToolCall> const& calls, Builder& b) {
  b.text("\n\n<");
  b.special(kDsml);
  b.text(" calls>\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) b.text("\n");
    b.text("<");
    b.special(kDsml);
    b.text(" invoke name=\"");
    b.text(calls[i].name);
    b.text("\">\n");
    render_call_arguments(calls[i], b);
    b.text("\n</");
    b.special(kDsml);
    b.text(" invoke>");
  }
  b.text("\n</");
  b.special(kDsml);
  b.text(" calls>");
}

int last_user_index(std::vector<Msg> const& ms) {
  for (int i = static_cast<int>(ms.size()) - 1; i >= 0; --i)
    if (ms[i].role == "user" || (ms[i].role == "system" && i > 0)) return i;
  return -1;
}

}  // namespace

std::string Prompt::text() const {
  std::string out;
  for (auto const& s : segments) out += s.text;
  return out;
}

Result<Prompt> encode_conversation(std::vector<Message> const& messages, std::vector<Tool> const& tools,
                                   EncodeOptions const& o) {
  if (o.thinking && (o.reasoning_effort < 1 || o.reasoning_effort > 100))
    return invalid_argument("reasoning_effort: " + std::to_string(o.reasoning_effort) + " is not in 1..100");
  // Tool schema lines first: invalid JSON is a request error.
  std::vector<std::string> schema_lines;
  for (size_t i = 0; i < tools.size(); ++i) {
    auto line = python_json_dumps(tools[i].function_json, "tools[" + std::to_string(i) + "].function");
    if (!line) return line.status();
    schema_lines.push_back(std::move(*line));
  }
  std::string response_format;
  if (!o.response_format_json.empty()) {
    auto rf = python_json_dumps(o.response_format_json, "response_format");
    if (!rf) return rf.status();
    response_format = std::move(*rf);
  }

  // 1 + 2: convert, attach tools, fold tool results into user turns.
  std::vector<Msg> ms;
  bool attach = !tools.empty() || !response_format.empty();
  bool first_is_system = !messages.empty() && (messages[0].role == "system" || messages[0].role == "developer");
  if (attach && !first_is_system) ms.push_back(Msg{.role = "system"});
  for (size_t i = 0; i < messages.size(); ++i) {
    auto const& m = messages[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    std::string role = m.role == "developer" ? "system" : m.role;
    if (role == "tool") {
      Block blk{Block::kToolResult, tool_result_text(m), m.tool_call_id};
      TESSERA_TRY(check_no_image(blk.text, where));
      if (!ms.empty() && ms.back().role == "user" && ms.back().has_blocks) {
        ms.back().blocks.push_back(std::move(blk));
      } else {
        Msg u{.role = "user", .has_blocks = true};
        u.blocks.push_back(std::move(blk));
        ms.push_back(std::move(u));
      }
      continue;
    }
    if (role != "system" && role != "user" && role != "assistant" && role != "latest_reminder")
      return invalid_argument(where + ".role: unknown role \"" + m.role + "\"");
    auto text = content_text(m, where);
    if (!text) return text.status();
    if (role == "user") {
      Block blk{Block::kText, std::move(*text), {}};
      if (!ms.empty() && ms.back().role == "user" && ms.back().has_blocks) {
        ms.back().blocks.push_back(std::move(blk));
      } else {
        Msg u{.role = "user", .has_blocks = true};
        u.blocks.push_back(std::move(blk));
        ms.push_back(std::move(u));
      }
      continue;
    }
    Msg x{.role = role, .content = std::move(*text)};
    if (role == "assistant") {
      x.reasoning = m.reasoning_content.value_or("");
      TESSERA_TRY(check_no_image(x.reasoning, where + ".reasoning_content"));
      x.tool_calls = m.tool_calls;
      x.wo_eos = m.wo_eos;
    }
    ms.push_back(std::move(x));
  }
  if (attach) {
    ms[0].tools = tools.empty() ? nullptr : &tools;
    ms[0].response_format = response_format;
  }

  // 3: tool results in the previous assistant's call order (ids not found sort as 0; stable).
  std::map<std::string, int> order;
  for (auto& m : ms) {
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i)
        if (!m.tool_calls[i].id.empty()) order.emplace(m.tool_calls[i].id, static_cast<int>(i));
    } else if (m.role == "user" && m.has_blocks) {
      std::vector<Block> results;
      for (auto const& blk : m.blocks)
        if (blk.kind == Block::kToolResult) results.push_back(blk);
      if (results.size() < 2 || order.empty()) continue;
      auto key = [&](Block const& blk) {
        auto it = order.find(blk.tool_use_id);
        return it == order.end() ? 0 : it->second;
      };
      std::stable_sort(results.begin(), results.end(), [&](auto const& a, auto const& b) { return key(a) < key(b); });
      size_t k = 0;
      for (auto& blk : m.blocks)
        if (blk.kind == Block::kToolResult) blk = results[k++];
    }
  }

  // 4: thinking retention.
  bool any_tools = std::any_of(ms.begin(), ms.end(), [](Msg const& m) { return m.tools && !m.tools->empty(); });
  bool drop = o.drop_thinking && !any_tools;
  if (o.thinking && drop) {
    int lu = last_user_index(ms);
    for (int i = 0; i < lu; ++i)
      if (ms[i].role == "assistant") ms[i].reasoning.clear();
  }

  // 5: render.
  Builder b;
  if (o.add_bos) b.special(kBos);
  int const lu = last_user_index(ms);
  for (int i = 0; i < static_cast<int>(ms.size()); ++i) {
    Msg const& m = ms[i];
    if (i == 0 && (o.thinking || m.role == "system")) b.special(kSystem);
    if (i == 0 && o.thinking) {
      b.text(kEffortHead);
      b.text(std::to_string(o.reasoning_effort));
      b.text(kEffortTail);
    }
    if (m.role == "system") {
      if (i > 0) b.special(kSystem);
      b.text(m.content);
      if (m.tools && !m.tools->empty()) {
        b.text("\n\n");
        b.templ(kToolsHead);
        for (size_t k = 0; k < schema_lines.size(); ++k) {
          if (k) b.text("\n");
          b.text(schema_lines[k]);
        }
        b.templ(kToolsTail);
      }
      if (!m.response_format.empty()) {
        b.text("\n\n");
        b.text(kResponseFormatHead);
        b.text(m.response_format);
      }
    } else if (m.role == "user") {
      b.special(kUser);
      for (size_t k = 0; k < m.blocks.size(); ++k) {
        if (k) b.text("\n\n");
        if (m.blocks[k].kind == Block::kText) {
          b.text(m.blocks[k].text);
        } else {
          b.text("<tool_result>");
          b.text(m.blocks[k].text);
          b.text("</tool_result>");
        }
      }
    } else if (m.role == "latest_reminder") {
      b.special(kLatestReminder);
      b.text(m.content);
    } else {   // assistant
      if (o.thinking && (!drop || i > lu)) {
        b.text(m.reasoning);
        b.special(kThinkEnd);
      }
      b.text(m.content);
      if (!m.tool_calls.empty()) render_tool_calls(m.tool_calls, b);
      if (!m.wo_eos) b.special(kEos);
    }
    bool has_next = i + 1 < static_cast<int>(ms.size());
    if (has_next && ms[i + 1].role != "assistant" && ms[i + 1].role != "latest_reminder") continue;
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      if (o.add_generation_prompt || has_next) {
        b.special(kAssistant);
        b.special(o.thinking && (!drop || i >= lu) ? kThinkStart : kThinkEnd);
      }
    }
  }
  return b.take();
}

Result<std::vector<TokenId>> tokenize_prompt(Prompt const& prompt, Tokenizer const& tok, TokenizeMode mode) {
  if (mode == TokenizeMode::kExact) return tok.encode(prompt.text(), true);
  std::vector<TokenId> ids;
  for (auto const& s : prompt.segments) {
    if (s.special) {
      auto id = tok.token_id(s.text);
      if (!id || !tok.added_token(*id))
        return not_found("tokenizer has no added token \"" + s.text + "\" (load it with chat::load_tokenizer)");
      ids.push_back(*id);
    } else {
      auto part = tok.encode(s.text, false);
      if (!part) return part.status();
      ids.insert(ids.end(), part->begin(), part->end());
    }
  }
  return ids;
}

Result<ThinkingSetting> effort_from_name(std::string_view name) {
  if (name == "none") return ThinkingSetting{false, 75};
  if (name == "minimal" || name == "low") return ThinkingSetting{true, 50};
  if (name == "medium" || name == "high" || name == "xhigh") return ThinkingSetting{true, 75};
  if (name == "max" || name == "ultra") return ThinkingSetting{true, 100};
  return invalid_argument("reasoning_effort: unknown value \"" + std::string(name) +
                          "\" (expected none, minimal, low, medium, high, xhigh, max, ultra, or an integer 1..100)");
}

Result<ThinkingSetting> effort_from_int(int64_t value) {
  if (value < 1 || value > 100)
    return invalid_argument("reasoning_effort: " + std::to_string(value) + " is not in 1..100");
  return ThinkingSetting{true, static_cast<int>(value)};
}

}  // namespace tessera::models::deepseek_v41::chat

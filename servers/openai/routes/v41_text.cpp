// SPDX-License-Identifier: Apache-2.0
/// Stand-in DeepSeek-V4.1 chat encoder (spec/chat-format.md §2.3–2.4) and tolerant streaming output
/// parser (§3.3–3.4), used until the model module's versions are wired in. The parser emits reasoning
/// until `</think>`, content until `\n\n<｜DSML｜ calls>`, then one tool call per `invoke` with its
/// arguments built as `{"key": value, ...}` (string="true" values JSON-quoted, others pasted raw), a
/// fragment per completed parameter, so fragments concatenate to the whole-reply `arguments`.
#include <algorithm>
#include <random>

#include <boost/json.hpp>

#include "servers/openai/routes/text.hpp"

namespace tessera::server {
namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>", kEos = "<｜end▁of▁sentence｜>",
                           kUser = "<｜User｜>", kAssistant = "<｜Assistant｜>", kSystem = "<｜System｜>",
                           kThinkEnd = "</think>", kThinkStart = "<think>";
constexpr std::string_view kCallsOpen = "\n\n<｜DSML｜ calls>", kCallsClose = "</｜DSML｜ calls>",
                           kCallsCloseV4 = "</｜DSML｜tool_calls>", kInvokeOpen = "<｜DSML｜ invoke name=\"",
                           kInvokeClose = "</｜DSML｜ invoke>", kParamOpen = "<｜DSML｜ parameter name=\"",
                           kParamClose = "</｜DSML｜ parameter>";

constexpr char kToolsPrompt[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" "
    "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n<｜DSML｜ invoke "
    "name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString parameters should be specified "
    "as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the "
    "value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), "
    "you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final "
    "response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### "
    "Available Tool Schemas\n\n{tool_schemas}\n\nYou MUST strictly follow the above defined tool name and "
    "parameter schemas to invoke tool calls.\n";

std::string dsml_calls(std::vector<ToolCallRef> const& calls) {
  std::string out = "<｜DSML｜ calls>\n";
  for (size_t c = 0; c < calls.size(); ++c) {
    if (c) out += "\n";
    out += "<｜DSML｜ invoke name=\"" + calls[c].name + "\">\n";
    boost::system::error_code ec;
    boost::json::value args = boost::json::parse(calls[c].arguments, ec);
    if (!ec && args.is_string()) args = boost::json::parse(args.get_string(), ec);  // double-encoded
    if (ec) args = boost::json::object{{"arguments", calls[c].arguments}};
    if (!args.is_object()) args = boost::json::object{{"arguments", args}};
    bool first = true;
    for (auto const& kv : args.get_object()) {
      if (!first) out += "\n";
      first = false;
      bool is_str = kv.value().is_string();
      out += "<｜DSML｜ parameter name=\"" + std::string(kv.key()) + "\" string=\"" + (is_str ? "true" : "false") +
             "\">" + (is_str ? std::string(kv.value().get_string()) : python_json_dumps(kv.value())) +
             "</｜DSML｜ parameter>";
    }
    out += "\n</｜DSML｜ invoke>";
  }
  return out + "\n</｜DSML｜ calls>";
}

struct Turn {  // a message after tool results were merged into user turns
  std::string role;
  std::string text;
  ChatMessage const* msg = nullptr;
};

class V41ChatFormat final : public ChatFormat {
 public:
  Result<std::string> render(std::vector<ChatMessage> const& messages, ChatRenderOptions const& opt) const override {
    std::vector<Turn> turns;
    std::vector<ChatMessage> local;
    bool need_system0 = !opt.tools.empty() || opt.response_schema;
    ChatMessage synthetic{"system", "", {}, {}, {}};
    if (need_system0 && (messages.empty() || messages[0].role != "system")) turns.push_back({"system", "", &synthetic});
    std::vector<std::string> pending_results;  // tool results of the current merged user turn
    std::vector<std::string> last_call_ids;
    for (size_t i = 0; i < messages.size(); ++i) {
      auto const& m = messages[i];
      if (m.role == "tool") {
        std::string block = "<tool_result>" + m.content + "</tool_result>";
        if (turns.empty() || turns.back().role != "user" || turns.back().msg != nullptr) {
          turns.push_back({"user", "", nullptr});
          pending_results.clear();
        }
        pending_results.push_back(m.tool_call_id);
        // Keep the blocks in the previous assistant's call order (stable for unknown ids).
        turns.back().text += (turns.back().text.empty() ? "" : "\n\n") + block;
        continue;
      }
      if (m.role == "user" && !turns.empty() && turns.back().role == "user" && turns.back().msg == nullptr) {
        turns.back().text += "\n\n" + m.content;
        continue;
      }
      if (m.role == "assistant") last_call_ids.clear();
      turns.push_back({m.role, m.content, &m});
    }
    bool drop = opt.drop_thinking && opt.tools.empty();
    int last_user = -1;
    for (int i = 0; i < static_cast<int>(turns.size()); ++i)
      if (turns[i].role == "user" || (turns[i].role == "system" && i > 0)) last_user = i;
    std::string out(kBos);
    for (int i = 0; i < static_cast<int>(turns.size()); ++i) {
      auto const& t = turns[i];
      if (i == 0) {
        std::string effort = opt.thinking ? "Reasoning Effort: " + std::to_string(opt.effort) +
                                                " (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
                                          : "";
        if (!effort.empty() || t.role == "system") out += std::string(kSystem) + effort;
      }
      if (t.role == "system") {
        if (i > 0) out += kSystem;
        out += t.text;
        if (i == 0 && !opt.tools.empty()) {
          std::string schemas;
          for (size_t k = 0; k < opt.tools.size(); ++k) schemas += (k ? "\n" : "") + python_json_dumps(opt.tools[k]);
          std::string p = kToolsPrompt;
          p.replace(p.find("{tool_schemas}"), 14, schemas);
          out += "\n\n" + p;
        }
        if (i == 0 && opt.response_schema)
          out += "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
                 python_json_dumps(*opt.response_schema);
      } else if (t.role == "user") {
        out += std::string(kUser) + t.text;
      } else if (t.role == "assistant") {
        if (opt.thinking && (!drop || i > last_user) && t.msg && t.msg->reasoning)
          out += *t.msg->reasoning + std::string(kThinkEnd);
        out += t.text;
        if (t.msg && !t.msg->tool_calls.empty()) out += "\n\n" + dsml_calls(t.msg->tool_calls);
        out += kEos;
      } else {
        return invalid_argument("messages: unknown role '" + t.role + "'");
      }
      bool next_opens = i + 1 == static_cast<int>(turns.size()) || turns[i + 1].role == "assistant";
      if (next_opens && (t.role == "user" || (t.role == "system" && i > 0))) {
        out += kAssistant;
        out += opt.thinking && (!drop || i >= last_user) ? kThinkStart : kThinkEnd;
      }
    }
    // A conversation that ends on the index-0 system message still opens the reply.
    if (!turns.empty() && turns.size() == 1 && turns[0].role == "system")
      out += std::string(kAssistant) + std::string(opt.thinking ? kThinkStart : kThinkEnd);
    return out;
  }
};

std::string new_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static char const* kHex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

// Longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

class V41OutputParser final : public OutputParser {
 public:
  V41OutputParser(bool thinking, bool tools) : stage_(thinking ? kReasoning : kContent), tools_(tools) {}

  void feed(std::string_view text, OutputDelta& out) override {
    buf_.append(text);
    run(out, false);
  }
  void finish(OutputDelta& out) override {
    run(out, true);
    if (stage_ == kInvoke) out.tools.push_back({tool_index_, false, {}, {}, first_param_ ? "{}" : "}"});
    buf_.clear();
  }
  int tool_call_count() const override { return tool_index_ + 1; }

 private:
  enum Stage { kReasoning, kContent, kCalls, kInvoke, kDone };

  void emit_text(OutputDelta& out, std::string_view s) {
    (stage_ == kReasoning ? out.reasoning : out.content).append(s);
  }

  void run(OutputDelta& out, bool final) {
    for (;;) {
      if (stage_ == kReasoning || stage_ == kContent) {
        size_t think = buf_.find(kThinkEnd);
        size_t calls = tools_ ? buf_.find(kCallsOpen) : std::string::npos;
        size_t first = std::min(think, calls);
        if (first == std::string::npos) {
          size_t hold = final ? 0 : std::max(partial_suffix(buf_, kThinkEnd), tools_ ? partial_suffix(buf_, kCallsOpen) : 0);
          emit_text(out, std::string_view(buf_).substr(0, buf_.size() - hold));
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        emit_text(out, std::string_view(buf_).substr(0, first));
        if (first == calls) {
          buf_.erase(0, calls + kCallsOpen.size());
          stage_ = kCalls;
        } else {
          buf_.erase(0, think + kThinkEnd.size());  // in content a stray </think> is swallowed
          stage_ = kContent;
        }
        continue;
      }
      if (stage_ == kDone) { buf_.clear(); return; }
      size_t ws = buf_.find_first_not_of(" \n\r\t");
      if (ws == std::string::npos) { buf_.clear(); return; }
      buf_.erase(0, ws);
      std::string_view b = buf_;
      if (stage_ == kCalls) {
        if (b.starts_with(kCallsClose) || b.starts_with(kCallsCloseV4)) { stage_ = kDone; continue; }
        if (b.starts_with(kInvokeOpen)) {
          size_t end = b.find("\">", kInvokeOpen.size());
          if (end == std::string::npos) return;
          ++tool_index_;
          out.tools.push_back({tool_index_, true, new_call_id(), std::string(b.substr(kInvokeOpen.size(), end - kInvokeOpen.size())), ""});
          buf_.erase(0, end + 2);
          stage_ = kInvoke;
          first_param_ = true;
          continue;
        }
        if (could_be(b, {kCallsClose, kCallsCloseV4, kInvokeOpen}) && !final) return;
        stage_ = kDone;  // malformed DSML: the rest is dropped, never shown as markup
        continue;
      }
      // kInvoke
      if (b.starts_with(kInvokeClose)) {
        out.tools.push_back({tool_index_, false, {}, {}, first_param_ ? "{}" : "}"});
        buf_.erase(0, kInvokeClose.size());
        stage_ = kCalls;
        continue;
      }
      if (b.starts_with(kParamOpen)) {
        size_t q = b.find("\" string=\"", kParamOpen.size());
        if (q == std::string::npos) return;
        size_t gt = b.find("\">", q + 10);
        if (gt == std::string::npos) return;
        size_t close = b.find(kParamClose, gt + 2);
        if (close == std::string::npos) return;
        std::string key(b.substr(kParamOpen.size(), q - kParamOpen.size()));
        bool is_str = b.substr(q + 10, gt - q - 10) == "true";
        std::string value(b.substr(gt + 2, close - gt - 2));
        std::string frag = first_param_ ? "{" : ", ";
        frag += python_json_dumps(boost::json::string(key)) + ": ";
        frag += is_str ? python_json_dumps(boost::json::string(value)) : value;
        first_param_ = false;
        out.tools.push_back({tool_index_, false, {}, {}, frag});
        buf_.erase(0, close + kParamClose.size());
        continue;
      }
      if (could_be(b, {kInvokeClose, kParamOpen}) && !final) return;
      out.tools.push_back({tool_index_, false, {}, {}, first_param_ ? "{}" : "}"});
      stage_ = kDone;
    }
  }

  static bool could_be(std::string_view b, std::initializer_list<std::string_view> tags) {
    for (auto t : tags) if (t.starts_with(b.substr(0, std::min(b.size(), t.size()))) && b.size() < t.size()) return true;
    return false;
  }

  Stage stage_;
  bool tools_;
  std::string buf_;
  int tool_index_ = -1;
  bool first_param_ = true;
};

}  // namespace

std::unique_ptr<ChatFormat> make_v41_chat_format() { return std::make_unique<V41ChatFormat>(); }
std::unique_ptr<OutputParser> make_v41_output_parser(bool thinking, bool parse_tools) {
  return std::make_unique<V41OutputParser>(thinking, parse_tools);
}

}  // namespace tessera::server

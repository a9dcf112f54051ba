// SPDX-License-Identifier: Apache-2.0
/// The reference output parser (spec/chat-format.md §3.1–§3.2), strict: reasoning up to the first `</think>`
/// (thinking mode; a DSML block first is "missing </think>"), content up to EOS or `\n\n<｜DSML｜ calls`,
/// then the DSML block with exactly `>\n` between tags, invoke heads matching `^\s*name="(.*?)">\n\n?$`,
/// parameters matching `^ name="(.*?)" string="(true|false)">(.*?)$` up to `</｜DSML｜ parameter>`, no
/// duplicate keys, and only EOS after `</｜DSML｜ calls>`. Arguments are rebuilt as
/// "{" + ", ".join(dumps(key) + ": " + (dumps(value) if string else value)) + "}".
#include <set>

#include "tessera/models/deepseek_v41/chat.hpp"

namespace tessera::models::deepseek_v41::chat {

namespace {

constexpr std::string_view kCallsStart = "\n\n<｜DSML｜ calls";
constexpr std::string_view kCallsOpenTag = "<｜DSML｜ calls>\n";
constexpr std::string_view kCallsCloseTag = "</｜DSML｜ calls>";
constexpr std::string_view kInvokeOpen = "<｜DSML｜ invoke";
constexpr std::string_view kInvokeClose = "</｜DSML｜ invoke>\n";
constexpr std::string_view kParamOpen = "<｜DSML｜ parameter";
constexpr std::string_view kParamClose = "</｜DSML｜ parameter>\n";

Status forbid_markup(std::string_view s, char const* what) {
  for (std::string_view bad : {kBos, kEos, kThinkStart, kThinkEnd, kDsml})
    if (s.find(bad) != std::string_view::npos)
      return malformed(std::string(what) + " contains \"" + std::string(bad) + "\"");
  return {};
}

}  // namespace

Result<ParsedMessage> parse_completion_exact(std::string_view text, bool thinking) {
  ParsedMessage m;
  size_t pos = 0;
  if (thinking) {
    size_t end = text.find(kThinkEnd), calls = text.find(kCallsStart);
    if (end == std::string_view::npos || calls < end) return malformed("completion: missing </think>");
    m.reasoning = text.substr(0, end);
    pos = end + kThinkEnd.size();
  }
  size_t eos = text.find(kEos, pos), calls = text.find(kCallsStart, pos);
  bool has_calls = calls != std::string_view::npos && (eos == std::string_view::npos || calls < eos);
  size_t content_end = has_calls ? calls : (eos == std::string_view::npos ? text.size() : eos);
  m.content = text.substr(pos, content_end - pos);
  TESSERA_TRY(forbid_markup(m.reasoning, "reasoning"));
  TESSERA_TRY(forbid_markup(m.content, "content"));
  pos = content_end;
  if (has_calls) {
    pos += 2;   // the "\n\n" separator is not content
    auto expect = [&](std::string_view lit, char const* what) -> Status {
      if (text.substr(pos, lit.size()) != lit)
        return malformed(std::string("tool calls: expected ") + what + " at byte " + std::to_string(pos));
      pos += lit.size();
      return {};
    };
    TESSERA_TRY(expect(kCallsOpenTag, "\"<｜DSML｜ calls>\\n\""));
    while (true) {
      if (text.substr(pos, kCallsCloseTag.size()) == kCallsCloseTag) {
        pos += kCallsCloseTag.size();
        break;
      }
      TESSERA_TRY(expect(kInvokeOpen, "an invoke or the end of the calls block"));
      // Invoke head: the segment up to the next DSML tag.
      size_t next = text.find("<", pos);
      while (next != std::string_view::npos && text.substr(next, kDsml.size() + 1) != std::string("<").append(kDsml) &&
             text.substr(next, kDsml.size() + 2) != std::string("</").append(kDsml))
        next = text.find("<", next + 1);
      if (next == std::string_view::npos) return malformed("tool calls: unterminated invoke");
      std::string_view head = text.substr(pos, next - pos);
      size_t k = 0;
      while (k < head.size() && (head[k] == ' ' || head[k] == '\t' || head[k] == '\n' || head[k] == '\r')) ++k;
      head.remove_prefix(k);
      std::string_view suffix = head.ends_with("\">\n\n") ? "\">\n\n" : "\">\n";
      if (!head.starts_with("name=\"") || !head.ends_with(suffix) || head.size() < 6 + suffix.size())
        return malformed("tool calls: malformed invoke head at byte " + std::to_string(pos));
      ParsedToolCall call;
      call.name = head.substr(6, head.size() - 6 - suffix.size());
      pos = next;
      std::set<std::string> keys;
      std::string args = "{";
      while (text.substr(pos, kParamOpen.size()) == kParamOpen) {
        pos += kParamOpen.size();
        size_t close = text.find(kParamClose.substr(0, kParamClose.size() - 1), pos);
        if (close == std::string_view::npos) return malformed("tool calls: unterminated parameter");
        std::string_view seg = text.substr(pos, close - pos);
        if (!seg.starts_with(" name=\"")) return malformed("tool calls: malformed parameter at byte " + std::to_string(pos));
        size_t t = seg.find("\" string=\"true\">"), f = seg.find("\" string=\"false\">");
        bool is_str = t != std::string_view::npos && (f == std::string_view::npos || t < f);
        size_t q = is_str ? t : f;
        if (q == std::string_view::npos || q < 7)
          return malformed("tool calls: parameter without string=\"true|false\" at byte " + std::to_string(pos));
        std::string key(seg.substr(7, q - 7));
        std::string_view value = seg.substr(q + (is_str ? 16 : 17));
        if (!keys.insert(key).second) return malformed("tool calls: duplicate parameter \"" + key + "\"");
        if (args.size() > 1) args += ", ";
        args += python_json_string(key) + ": " + (is_str ? python_json_string(value) : std::string(value));
        pos = close;
        TESSERA_TRY(expect(kParamClose, "\"</｜DSML｜ parameter>\\n\""));
      }
      TESSERA_TRY(expect(kInvokeClose, "\"</｜DSML｜ invoke>\\n\""));
      call.arguments = args + "}";
      m.tool_calls.push_back(std::move(call));
    }
    std::string_view rest = text.substr(pos);
    if (!rest.empty() && rest != kEos) return malformed("tool calls: text after </｜DSML｜ calls>");
    m.saw_eos = rest == kEos;
    return m;
  }
  if (eos != std::string_view::npos) {
    if (eos + kEos.size() != text.size()) return malformed("completion: text after EOS");
    m.saw_eos = true;
  }
  return m;
}

}  // namespace tessera::models::deepseek_v41::chat

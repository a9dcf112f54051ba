// SPDX-License-Identifier: Apache-2.0
/// Output parsing against spec/chat-format.md §3: the strict reference parser on well-formed and malformed
/// completions, the streaming parser fed whole, split in two at every byte boundary, byte by byte and
/// character by character (all must agree with each other and with the reference parser on well-formed
/// output), the tolerant rules of §3.3, and a seeded fuzz of the DSML state machine (fixed count).
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <random>

#include "tessera/models/deepseek_v41/chat.hpp"
#include "verify/common/random.hpp"

namespace chat = tessera::models::deepseek_v41::chat;

namespace {

std::string const kEos = "<｜end▁of▁sentence｜>";

std::string call_block(std::string const& invokes) {
  return "\n\n<｜DSML｜ calls>\n" + invokes + "</｜DSML｜ calls>";
}
std::string invoke(std::string const& name, std::string const& params) {
  return "<｜DSML｜ invoke name=\"" + name + "\">\n" + (params.empty() ? "\n" : params) + "</｜DSML｜ invoke>\n";
}
std::string param(std::string const& k, bool str, std::string const& v) {
  return "<｜DSML｜ parameter name=\"" + k + "\" string=\"" + (str ? "true" : "false") + "\">" + v +
         "</｜DSML｜ parameter>\n";
}

/// Streaming parse of `chunks`; also checks the delta invariants (deltas concatenate to the message, one
/// header per call with empty arguments, fragments concatenate to the final arguments).
chat::ParsedMessage stream(std::vector<std::string> const& chunks, bool thinking,
                           std::vector<std::string> const& stop = {}) {
  chat::OutputParser p({.thinking = thinking, .stop = stop});
  std::string reasoning, content;
  std::vector<std::string> names, args;
  auto take = [&](chat::ParseDelta const& d) {
    reasoning += d.reasoning;
    content += d.content;
    for (auto const& t : d.tool_calls) {
      if (t.begin) {
        BOOST_TEST(t.index == static_cast<int>(names.size()));
        BOOST_TEST(t.arguments.empty());
        names.push_back(t.name);
        args.emplace_back();
      } else {
        BOOST_REQUIRE(t.index >= 0);
        BOOST_REQUIRE(static_cast<size_t>(t.index) < args.size());
        args[t.index] += t.arguments;
      }
    }
  };
  for (auto const& c : chunks) take(p.feed(c));
  take(p.finish());
  auto const& m = p.message();
  BOOST_TEST(reasoning == m.reasoning);
  BOOST_TEST(content == m.content);
  BOOST_REQUIRE(names.size() == m.tool_calls.size());
  for (size_t i = 0; i < names.size(); ++i) {
    BOOST_TEST(names[i] == m.tool_calls[i].name);
    BOOST_TEST(args[i] == m.tool_calls[i].arguments);
  }
  return m;
}

bool same(chat::ParsedMessage const& a, chat::ParsedMessage const& b) {
  if (a.reasoning != b.reasoning || a.content != b.content || a.saw_eos != b.saw_eos || a.stop_index != b.stop_index ||
      a.tool_calls.size() != b.tool_calls.size())
    return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].arguments != b.tool_calls[i].arguments ||
        a.tool_calls[i].complete != b.tool_calls[i].complete)
      return false;
  return true;
}

/// Whole, every two-chunk split, byte by byte and UTF-8 character by character all give the same message.
chat::ParsedMessage check_split_invariance(std::string const& text, bool thinking,
                                           std::vector<std::string> const& stop = {}) {
  auto whole = stream({text}, thinking, stop);
  bool all_same = true;
  for (size_t cut = 0; cut <= text.size(); ++cut)
    all_same = all_same && same(whole, stream({text.substr(0, cut), text.substr(cut)}, thinking, stop));
  std::vector<std::string> bytes, chars;
  for (char c : text) bytes.emplace_back(1, c);
  for (size_t i = 0; i < text.size();) {
    size_t j = i + 1;
    while (j < text.size() && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) ++j;
    chars.push_back(text.substr(i, j - i));
    i = j;
  }
  all_same = all_same && same(whole, stream(bytes, thinking, stop)) && same(whole, stream(chars, thinking, stop));
  BOOST_TEST(all_same, "split invariance for: " << text);
  return whole;
}

/// Printable form of bytes for failure messages.
std::string esc(std::string_view s) {
  std::string o;
  for (unsigned char c : s) {
    if (c >= 32 && c < 127 && c != '\\') {
      o += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    }
  }
  return o;
}

std::string describe(chat::ParsedMessage const& m) {
  std::string o = "reasoning=[" + esc(m.reasoning) + "] content=[" + esc(m.content) + "]";
  for (auto const& t : m.tool_calls) o += " call " + esc(t.name) + " " + esc(t.arguments) + (t.complete ? "" : " (incomplete)");
  return o;
}

bool valid_json(std::string const& s) {
  std::error_code ec;
  auto v = boost::json::parse(s, ec);
  return !ec && v.is_object();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(chat_parser)

BOOST_AUTO_TEST_CASE(exact_well_formed) {
  std::string t = "I should use get_weather.</think>" +
                  call_block(invoke("get_weather", param("location", true, "Beijing") + param("days", false, "3"))) + kEos;
  auto m = chat::parse_completion_exact(t, true);
  BOOST_REQUIRE_MESSAGE(m.ok(), m.status().to_string());
  BOOST_TEST(m->reasoning == "I should use get_weather.");
  BOOST_TEST(m->content == "");
  BOOST_TEST(m->saw_eos);
  BOOST_REQUIRE(m->tool_calls.size() == 1u);
  BOOST_TEST(m->tool_calls[0].name == "get_weather");
  BOOST_TEST(m->tool_calls[0].arguments == R"({"location": "Beijing", "days": 3})");

  auto plain = chat::parse_completion_exact("Hello\n\nworld" + kEos, false);
  BOOST_REQUIRE(plain.ok());
  BOOST_TEST(plain->content == "Hello\n\nworld");
  BOOST_TEST(plain->tool_calls.empty());

  auto empty_invoke = chat::parse_completion_exact("ok" + call_block(invoke("t1", "") + invoke("t2", param("q", true, "a\"b\n中"))), false);
  BOOST_REQUIRE_MESSAGE(empty_invoke.ok(), empty_invoke.status().to_string());
  BOOST_TEST(empty_invoke->content == "ok");
  BOOST_REQUIRE(empty_invoke->tool_calls.size() == 2u);
  BOOST_TEST(empty_invoke->tool_calls[0].arguments == "{}");
  BOOST_TEST(empty_invoke->tool_calls[1].arguments == "{\"q\": \"a\\\"b\\n中\"}");
  BOOST_TEST(!empty_invoke->saw_eos);
}

BOOST_AUTO_TEST_CASE(exact_malformed) {
  auto calls = call_block(invoke("f", param("a", true, "1")));
  BOOST_TEST(!chat::parse_completion_exact("no end of thinking" + kEos, true).ok());
  BOOST_TEST(!chat::parse_completion_exact("r" + calls + kEos, true).ok());   // DSML before </think>
  BOOST_TEST(!chat::parse_completion_exact(call_block(invoke("f", param("a", true, "1") + param("a", true, "2"))), false).ok());
  BOOST_TEST(!chat::parse_completion_exact(calls + "tail", false).ok());
  BOOST_TEST(!chat::parse_completion_exact("a <think> b" + kEos, false).ok());
  BOOST_TEST(!chat::parse_completion_exact("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter "
                                           "name=\"a\">x</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
                                           false).ok());   // no string attribute
  BOOST_TEST(!chat::parse_completion_exact("x" + kEos + "y", false).ok());
}

BOOST_AUTO_TEST_CASE(streaming_equals_exact_on_well_formed) {
  struct Case {
    std::string text;
    bool thinking;
  };
  std::vector<Case> cases{
      {"Let me think</think>The answer is 391." + kEos, true},
      {"plain answer" + kEos, false},
      {"</think>" + kEos, true},
      {"r\n\n</think>c\n\nd\n" + kEos, true},
      {"I'll check.</think>I'll check." +
           call_block(invoke("get_weather", param("location", true, "Beijing"))) + kEos, true},
      {"" + call_block(invoke("t1", "") + invoke("t2", param("x", false, "[1, 2]") + param("y", false, "{\"a\": null}"))) + kEos, false},
      // Keys with spaces, `string=` inside key names, an empty key, CJK and newlines in values (§3.4).
      {"r</think>" + call_block(invoke("odd", param("a key", true, "v") + param("k string=x", true, "w") +
                                                  param("", true, "empty key") + param("cjk", true, "北京\n第二行\t\"q\"") +
                                                  param("lt", true, "a < b </ c")))
           + kEos, true},
      {"no eos at all", false},
      {"reasoning only, truncated", true},
  };
  for (auto const& c : cases) {
    auto m = check_split_invariance(c.text, c.thinking);
    if (c.text == "reasoning only, truncated") {
      BOOST_TEST(m.reasoning == c.text);   // tolerant: reasoning without </think>
      continue;
    }
    auto ref = chat::parse_completion_exact(c.text, c.thinking);
    BOOST_REQUIRE_MESSAGE(ref.ok(), ref.status().to_string() << " for " << c.text);
    BOOST_TEST(same(m, *ref), "stream vs exact for: " << c.text);
    for (auto const& tc : m.tool_calls) BOOST_TEST(valid_json(tc.arguments), tc.arguments);
  }
}

BOOST_AUTO_TEST_CASE(tolerant_rules) {
  // DSML inside reasoning ends the reasoning.
  auto a = check_split_invariance("thinking..." + call_block(invoke("f", param("a", true, "1"))) + kEos, true);
  BOOST_TEST(a.reasoning == "thinking...");
  BOOST_REQUIRE(a.tool_calls.size() == 1u);
  BOOST_TEST(a.tool_calls[0].arguments == R"({"a": "1"})");
  // Repeated <think> in reasoning and a stray </think> in content are dropped.
  auto b = check_split_invariance("<think>r</think>c</think>d" + kEos, true);
  BOOST_TEST(b.reasoning == "r");
  BOOST_TEST(b.content == "cd");
  // V4 spellings.
  auto c = check_split_invariance(
      "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"false\">2"
      "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + kEos, false);
  BOOST_TEST(c.content == "x");
  BOOST_REQUIRE(c.tool_calls.size() == 1u);
  BOOST_TEST(c.tool_calls[0].arguments == R"({"a": 2})");
  // A bare invoke (no calls block) is still a call; markup never reaches content.
  auto d = check_split_invariance("see <｜DSML｜ invoke name=\"g\">\n" + param("q", true, "z") + "</｜DSML｜ invoke>" + kEos, false);
  BOOST_REQUIRE(d.tool_calls.size() == 1u);
  BOOST_TEST(d.tool_calls[0].name == "g");
  BOOST_TEST(d.content.find("DSML") == std::string::npos);
  // Unparseable markup in content is removed; text after EOS is ignored.
  auto e = check_split_invariance("hello <｜DSML｜ weird> world ｜DSML｜!" + kEos + "ignored", false);
  BOOST_TEST(e.content.find("｜DSML｜") == std::string::npos);
  BOOST_TEST(e.content.find("ignored") == std::string::npos);
  BOOST_TEST(e.saw_eos);
  // Truncation inside a string value: the call is closed (valid JSON) and marked incomplete.
  auto f = check_split_invariance("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"w\">\n<｜DSML｜ parameter name=\"k\" "
                                  "string=\"true\">partial va", false);
  BOOST_REQUIRE(f.tool_calls.size() == 1u);
  BOOST_TEST(!f.tool_calls[0].complete);
  BOOST_TEST(f.tool_calls[0].arguments == R"({"k": "partial va"})");
  // Truncation inside the name: no call at all (no ghost call).
  auto g = check_split_invariance("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"wea", false);
  BOOST_TEST(g.tool_calls.empty());
  BOOST_TEST(g.content.empty());
  // EOS inside a value closes it.
  auto h = check_split_invariance("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"w\">\n<｜DSML｜ parameter name=\"k\" "
                                  "string=\"false\">12" + kEos, false);
  BOOST_REQUIRE(h.tool_calls.size() == 1u);
  BOOST_TEST(h.tool_calls[0].arguments == R"({"k": 12})");
  BOOST_TEST(h.saw_eos);
  // Hold-back: a partial "</think>" or DSML start is not emitted before it is decided.
  chat::OutputParser p({.thinking = true});
  auto d1 = p.feed("abc</thi");
  BOOST_TEST(d1.reasoning == "abc");
  auto d2 = p.feed("nk>x\n\n");
  BOOST_TEST(d2.content == "x");
  auto d3 = p.feed("<｜DSML｜ ca");
  BOOST_TEST(d3.content.empty());
  auto d4 = p.feed("lls>\n");
  BOOST_TEST(d4.content.empty());
  BOOST_TEST(p.message().content == "x");
}

BOOST_AUTO_TEST_CASE(stop_strings) {
  // A stop string ends the reply in reasoning or content; partial matches are held back; the earliest wins.
  auto a = check_split_invariance("let me see STOP more</think>x" + kEos, true, {"STOP"});
  BOOST_TEST(a.reasoning == "let me see ");
  BOOST_TEST(a.content.empty());
  BOOST_TEST(a.stop_index == 0);
  auto b = check_split_invariance("r</think>one\ntwo\n\nthree" + kEos, true, {"\n\n", "two"});
  BOOST_TEST(b.content == "one\n");
  BOOST_TEST(b.stop_index == 1);
  auto c = check_split_invariance("no stop here" + kEos, false, {"stop!", ""});
  BOOST_TEST(c.content == "no stop here");
  BOOST_TEST(c.stop_index == -1);
  BOOST_TEST(c.saw_eos);
  // A stop string that is a prefix of a DSML marker still stops (the longer marker does not complete).
  auto d = check_split_invariance("ab\n\nc" + kEos, false, {"\n\n"});
  BOOST_TEST(d.content == "ab");
  BOOST_TEST(d.stop_index == 0);
  chat::OutputParser p({.thinking = false, .stop = {"END"}});
  BOOST_TEST(p.feed("abcEN").content == "abc");
  BOOST_TEST(p.feed("D tail").content.empty());
  BOOST_TEST(p.finished());
  BOOST_TEST(p.message().stop_index == 0);
}

BOOST_AUTO_TEST_CASE(fuzz_dsml_parser) {
  // Mutations of well-formed completions plus random fragments; fixed count, seeded.
  std::mt19937_64 g(tessera::verify::test_seed(4242));
  std::vector<std::string> seeds{
      "r</think>c" + call_block(invoke("f", param("a", true, "x") + param("b", false, "[1]"))) + kEos,
      "c" + call_block(invoke("t1", "") + invoke("t2", param("k", true, "中\n"))) + kEos,
      "<think>a</think>b</think>" + kEos,
  };
  std::vector<std::string> frags{"<", "</", "｜DSML｜", " calls>", " invoke", " parameter", " name=\"", "\"",
                                 " string=\"true\">", " string=\"false\">", ">", "\n", "\n\n", "</think>", "<think>",
                                 kEos, "tool_calls>", "invoke>", "x", "中", "\\", "{", "}", " "};
  int const kIterations = 4000;
  for (int it = 0; it < kIterations; ++it) {
    std::string s = seeds[g() % seeds.size()];
    int edits = 1 + static_cast<int>(g() % 6);
    for (int e = 0; e < edits; ++e) {
      size_t at = s.empty() ? 0 : g() % (s.size() + 1);
      switch (g() % 3) {
        case 0: s.insert(at, frags[g() % frags.size()]); break;
        case 1: if (at < s.size()) s.erase(at, 1 + g() % 8); break;
        default: s.insert(at, 1, static_cast<char>(g() % 256)); break;
      }
    }
    bool thinking = g() % 2;
    std::vector<std::string> stop;
    if (g() % 4 == 0) stop.push_back(frags[g() % frags.size()]);
    auto whole = stream({s}, thinking, stop);
    // Random chunking must give the same result.
    std::vector<std::string> chunks;
    for (size_t i = 0; i < s.size();) {
      size_t n = 1 + g() % 7;
      chunks.push_back(s.substr(i, n));
      i += n;
    }
    auto chunked = stream(chunks, thinking, stop);
    BOOST_TEST(same(whole, chunked), "iteration " << it << " thinking " << thinking << " input [" << esc(s)
                                                  << "]\n whole:   " << describe(whole)
                                                  << "\n chunked: " << describe(chunked));
    BOOST_TEST(whole.content.find("｜DSML｜") == std::string::npos, "input [" << esc(s) << "] " << describe(whole));
    BOOST_TEST(whole.content.find(kEos) == std::string::npos);
    BOOST_TEST(whole.reasoning.find("｜DSML｜") == std::string::npos);
    for (auto const& tc : whole.tool_calls) {
      BOOST_TEST(!tc.arguments.empty());
      BOOST_TEST(tc.arguments.front() == '{');
      BOOST_TEST(tc.arguments.back() == '}');
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// The server's stand-in V4.1 chat encoder against the worked examples of spec/chat-format.md §2.5, and
/// its streaming output parser: the reply parsed whole, split at every byte boundary into two pieces,
/// and fed one byte at a time must give the same reasoning, content, tool names and arguments.
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include "servers/openai/routes/text.hpp"

using namespace tessera::server;
namespace json = boost::json;

namespace {

std::string const kEffort75 = "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

std::string render(std::vector<ChatMessage> const& m, ChatRenderOptions const& o) {
  auto r = make_v41_chat_format()->render(m, o);
  BOOST_REQUIRE(r.ok());
  return *r;
}
ChatMessage msg(std::string role, std::string content) { return ChatMessage{std::move(role), std::move(content), {}, {}, {}}; }

struct Parsed {
  std::string reasoning, content;
  std::vector<std::string> names, args;
};

Parsed parse_pieces(std::vector<std::string> const& pieces, bool thinking, bool tools) {
  auto p = make_v41_output_parser(thinking, tools);
  Parsed out;
  auto take = [&](OutputDelta const& d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (auto const& t : d.tools) {
      if (t.begin) { out.names.push_back(t.name); out.args.emplace_back(); BOOST_TEST(t.id.rfind("call_", 0) == 0u); }
      BOOST_REQUIRE(t.index < static_cast<int>(out.args.size()));
      out.args[t.index] += t.arguments;
    }
  };
  for (auto const& s : pieces) { OutputDelta d; p->feed(s, d); take(d); }
  OutputDelta d;
  p->finish(d);
  take(d);
  return out;
}

void check_all_splits(std::string const& reply, bool thinking, bool tools, Parsed const& want) {
  auto same = [&](Parsed const& got, std::string const& how) {
    BOOST_TEST(got.reasoning == want.reasoning, how);
    BOOST_TEST(got.content == want.content, how);
    BOOST_TEST(got.names == want.names, how);
    BOOST_TEST(got.args == want.args, how);
  };
  same(parse_pieces({reply}, thinking, tools), "whole");
  for (size_t k = 1; k < reply.size(); ++k) same(parse_pieces({reply.substr(0, k), reply.substr(k)}, thinking, tools), "split at " + std::to_string(k));
  std::vector<std::string> bytes;
  for (char c : reply) bytes.emplace_back(1, c);
  same(parse_pieces(bytes, thinking, tools), "byte by byte");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(chat_encoding_examples)

BOOST_AUTO_TEST_CASE(example_a_chat_mode_system_user) {
  ChatRenderOptions o;
  o.thinking = false;
  BOOST_TEST(render({msg("system", "S"), msg("user", "U")}, o) == "<｜begin▁of▁sentence｜><｜System｜>S<｜User｜>U<｜Assistant｜></think>");
}

BOOST_AUTO_TEST_CASE(example_b_c_thinking_default_effort) {
  ChatRenderOptions o;
  BOOST_TEST(render({msg("user", "What is 2+2?")}, o) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 + "<｜User｜>What is 2+2?<｜Assistant｜><think>");
  BOOST_TEST(render({msg("system", "You are a helpful assistant."), msg("user", "What is 2+2?")}, o) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 + "You are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>");
}

BOOST_AUTO_TEST_CASE(example_d_history_reasoning_dropped) {
  ChatRenderOptions o;
  ChatMessage a1 = msg("assistant", "a1");
  a1.reasoning = "secret";
  BOOST_TEST(render({msg("user", "u1"), a1, msg("user", "u2")}, o) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 +
                 "<｜User｜>u1<｜Assistant｜></think>a1<｜end▁of▁sentence｜><｜User｜>u2<｜Assistant｜><think>");
}

BOOST_AUTO_TEST_CASE(example_f_tool_round_trip) {
  ChatRenderOptions o;
  o.thinking = false;
  ChatMessage a = msg("assistant", "reading");
  a.tool_calls.push_back({"call_1", "read", R"({"filePath": "/x", "limit": 10, "nested": {"a": 1}})"});
  ChatMessage t = msg("tool", "FILE");
  t.tool_call_id = "call_1";
  BOOST_TEST(render({msg("user", "u1"), a, t, msg("user", "u2")}, o) ==
             "<｜begin▁of▁sentence｜><｜User｜>u1<｜Assistant｜></think>reading\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"read\">\n"
             "<｜DSML｜ parameter name=\"filePath\" string=\"true\">/x</｜DSML｜ parameter>\n"
             "<｜DSML｜ parameter name=\"limit\" string=\"false\">10</｜DSML｜ parameter>\n"
             "<｜DSML｜ parameter name=\"nested\" string=\"false\">{\"a\": 1}</｜DSML｜ parameter>\n"
             "</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜><｜User｜><tool_result>FILE</tool_result>\n\nu2<｜Assistant｜></think>");
}

BOOST_AUTO_TEST_CASE(tools_go_on_a_synthetic_system_turn) {
  ChatRenderOptions o;
  o.thinking = false;
  o.tools.push_back(json::parse(R"({"name": "get_weather", "parameters": {"type": "object"}})"));
  std::string s = render({msg("user", "w?")}, o);
  BOOST_TEST(s.rfind("<｜begin▁of▁sentence｜><｜System｜>\n\n## Tools\n\n", 0) == 0u);
  BOOST_TEST(s.find("### Available Tool Schemas\n\n{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}\n\nYou MUST") != std::string::npos);
  BOOST_TEST(s.find("invoke tool calls.\n<｜User｜>w?<｜Assistant｜></think>") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(output_parser)

BOOST_AUTO_TEST_CASE(reasoning_then_content) {
  check_all_splits("Let me think.</think>The answer is 4.", true, false, {"Let me think.", "The answer is 4.", {}, {}});
  check_all_splits("no tags here < / >", false, false, {"", "no tags here < / >", {}, {}});
  check_all_splits("r</think>c</think>d", true, false, {"r", "cd", {}, {}});  // stray </think> in content swallowed
}

BOOST_AUTO_TEST_CASE(tool_calls_every_split) {
  std::string reply =
      "I should call.</think>Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
      "<｜DSML｜ parameter name=\"location\" string=\"true\">Bei \"jing\"\n北京</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
      "<｜DSML｜ invoke name=\"t1\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  Parsed want{"I should call.", "Checking.", {"get_weather", "t1"},
              {"{\"location\": \"Bei \\\"jing\\\"\\n北京\", \"days\": 3}", "{}"}};
  check_all_splits(reply, true, true, want);
  // The arguments are JSON.
  BOOST_TEST(json::parse(want.args[0]).at("days").as_int64() == 3);
}

BOOST_AUTO_TEST_CASE(dsml_inside_reasoning_ends_it) {
  std::string reply = "thinking\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  check_all_splits(reply, true, true, {"thinking", "", {"f"}, {"{}"}});
}

BOOST_AUTO_TEST_CASE(markup_never_reaches_content) {
  Parsed p = parse_pieces({"ok\n\n<｜DSML｜ calls>\n<｜DSML｜ garbage"}, false, true);
  BOOST_TEST(p.content == "ok");
  BOOST_TEST(p.content.find("DSML") == std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

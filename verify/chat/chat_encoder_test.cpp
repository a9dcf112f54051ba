// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 chat encoding against spec/chat-format.md: the §2.5 worked examples A–H byte for byte,
/// the §1.7 token vectors on the V3 tokenizer.json with the V4.1 added-token overlay (§1.4/§1.6), exact vs
/// safe tokenization, effort mapping (§2.6), Python-style JSON (§2.2) and request errors.
#include <boost/test/unit_test.hpp>

#include <cstdlib>

#include "tessera/models/deepseek_v41/chat.hpp"
#include "verify/common/golden.hpp"

namespace chat = tessera::models::deepseek_v41::chat;
using tessera::models::TokenId;
using tessera::models::Tokenizer;

namespace {

/// The V3 fixture with the V4.1 overlay; TESSERA_V41_TOKENIZER_JSON points the suite at another file (e.g. the
/// V4 tokenizer.json that scripts/fetch_tokenizer.sh caches) to check it gives the same ids.
std::string tokenizer_path() {
  if (char const* p = std::getenv("TESSERA_V41_TOKENIZER_JSON")) return p;
  return tessera::verify::golden_dir() + "/tokenizer/deepseek-v3-tokenizer.json";
}

Tokenizer const& v41() {
  static Tokenizer t = chat::load_tokenizer(tokenizer_path()).value_or_throw();
  return t;
}

std::vector<TokenId> ids_of(std::string_view s) { return v41().encode(s, true).value_or_throw(); }

chat::Message msg(std::string role, std::string content) {
  chat::Message m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

std::string render(std::vector<chat::Message> const& ms, chat::EncodeOptions const& o, std::vector<chat::Tool> const& tools = {}) {
  auto p = chat::encode_conversation(ms, tools, o);
  BOOST_REQUIRE_MESSAGE(p.ok(), p.status().to_string());
  // Exact and safe tokenization agree whenever no caller text spells a special token.
  auto exact = chat::tokenize_prompt(*p, v41(), chat::TokenizeMode::kExact);
  auto safe = chat::tokenize_prompt(*p, v41(), chat::TokenizeMode::kSafe);
  BOOST_REQUIRE(exact.ok());
  BOOST_REQUIRE(safe.ok());
  BOOST_TEST(*exact == *safe);
  return p->text();
}

chat::EncodeOptions chat_mode() {
  chat::EncodeOptions o;
  o.thinking = false;
  return o;
}

std::string const kEffort75 =
    "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

// The tools prompt of §2.1, transcribed from the spec (placeholder {tool_schemas} split out).
std::string const kToolsPromptHead = R"(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜ calls>" block like the following:

<｜DSML｜ calls>
<｜DSML｜ invoke name="$TOOL_NAME">
<｜DSML｜ parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜ parameter>
...
</｜DSML｜ invoke>
<｜DSML｜ invoke name="$TOOL_NAME2">
...
</｜DSML｜ invoke>
</｜DSML｜ calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)";
std::string const kToolsPromptTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

}  // namespace

BOOST_AUTO_TEST_SUITE(chat_encoder)

BOOST_AUTO_TEST_CASE(v41_table_overlay) {
  BOOST_TEST(v41().vocab_size() == 129280u);
  auto ids = chat::special_ids(v41());
  BOOST_REQUIRE(ids.ok());
  BOOST_TEST(ids->bos == 0);
  BOOST_TEST(ids->eos == 1);
  BOOST_TEST(ids->system == 128799);
  BOOST_TEST(ids->user == 128803);
  BOOST_TEST(ids->assistant == 128804);
  BOOST_TEST(ids->think_start == 128821);
  BOOST_TEST(ids->think_end == 128822);
  BOOST_TEST(ids->dsml == 128825);
  BOOST_TEST(ids->latest_reminder == 128828);
  BOOST_TEST(ids->image == 129264);
  auto table = chat::v41_added_tokens();
  BOOST_TEST(table.size() == 3u + 1280u);
  for (size_t i = 3; i < table.size(); ++i) BOOST_TEST(table[i].id == static_cast<TokenId>(128000 + i - 3));
  BOOST_TEST(v41().token_bytes(128830) == "<｜query｜>");
  BOOST_TEST(v41().token_bytes(129261) == "<|place_holder_mm_span_0435|>");
  BOOST_TEST(v41().token_bytes(129279) == "<|place_holder_mm_span_0442|>");
  BOOST_TEST(v41().token_bytes(129271) == "<｜/polygon｜>");
  // Without the overlay the V3 file lacks <｜System｜>.
  auto plain = chat::load_tokenizer(tokenizer_path(), chat::Overlay::kNever);
  BOOST_REQUIRE(plain.ok());
  BOOST_TEST(!chat::special_ids(*plain).ok());
}

BOOST_AUTO_TEST_CASE(token_vectors_1_7) {
  BOOST_TEST(ids_of("<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>") ==
             (std::vector<TokenId>{128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}));
  BOOST_TEST(ids_of("<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜></think>") ==
             (std::vector<TokenId>{0, 128803, 3085, 344, 223, 20, 13, 20, 33, 128804, 128822}));
  BOOST_TEST(ids_of("<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 + "<｜User｜>What is 2+2?<｜Assistant｜><think>") ==
             (std::vector<TokenId>{0, 128799, 77666, 288, 9504, 482, 28, 223, 2402, 343, 16801, 223, 19, 15, 1457, 14,
                                   270, 4077, 270, 1990, 14, 270, 850, 15146, 270, 22805, 868, 128803, 3085, 344, 223,
                                   20, 13, 20, 33, 128804, 128821}));
  BOOST_TEST(ids_of("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"location\" "
                    "string=\"true\">Beijing</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>") ==
             (std::vector<TokenId>{271, 30, 128825, 10699, 1018, 30, 128825, 34756, 2329, 1281, 1133, 65, 50219, 3816,
                                   30, 128825, 10767, 2329, 1281, 33182, 4, 3418, 1281, 11476, 3320, 121458, 1718,
                                   128825, 10767, 1018, 1718, 128825, 34756, 1018, 1718, 128825, 10699, 32, 1}));
  BOOST_TEST(ids_of("<tool_result>FILE</tool_result>") ==
             (std::vector<TokenId>{30, 72461, 46148, 32, 52318, 1718, 72461, 46148, 32}));
  BOOST_TEST(ids_of("<｜deepseek_image｜>") == (std::vector<TokenId>{129264}));
  // §1.3: skip_special keeps the non-special chat and think tokens.
  std::vector<TokenId> d{0, 128803, 3085, 128804, 128821, 36101, 128822, 1};
  BOOST_TEST(*v41().decode(d, true) == "<｜User｜>What<｜Assistant｜><think>推理</think>");
}

BOOST_AUTO_TEST_CASE(example_a_chat_system_user) {
  BOOST_TEST(render({msg("system", "S"), msg("user", "U")}, chat_mode()) ==
             "<｜begin▁of▁sentence｜><｜System｜>S<｜User｜>U<｜Assistant｜></think>");
}

BOOST_AUTO_TEST_CASE(example_b_c_thinking) {
  chat::EncodeOptions o;
  BOOST_TEST(render({msg("user", "What is 2+2?")}, o) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 + "<｜User｜>What is 2+2?<｜Assistant｜><think>");
  BOOST_TEST(render({msg("system", "You are a helpful assistant."), msg("user", "What is 2+2?")}, o) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 +
                 "You are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>");
  // developer is rendered as system (§2.4).
  BOOST_TEST(render({msg("developer", "You are a helpful assistant."), msg("user", "What is 2+2?")}, o) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 +
                 "You are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>");
}

BOOST_AUTO_TEST_CASE(example_d_history_reasoning_dropped) {
  auto a1 = msg("assistant", "a1");
  a1.reasoning_content = "r1 must not appear";
  std::string const want = "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 +
                           "<｜User｜>u1<｜Assistant｜></think>a1<｜end▁of▁sentence｜><｜User｜>u2<｜Assistant｜><think>";
  BOOST_TEST(render({msg("user", "u1"), a1, msg("user", "u2")}, chat::EncodeOptions{}) == want);
  // drop_thinking = false keeps it and opens every turn with <think>.
  chat::EncodeOptions keep;
  keep.drop_thinking = false;
  BOOST_TEST(render({msg("user", "u1"), a1, msg("user", "u2")}, keep) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 +
                 "<｜User｜>u1<｜Assistant｜><think>r1 must not appear</think>a1<｜end▁of▁sentence｜><｜User｜>u2"
                 "<｜Assistant｜><think>");
}

BOOST_AUTO_TEST_CASE(example_e_mid_conversation_system) {
  auto old_answer = msg("assistant", "old answer");
  old_answer.wo_eos = true;
  BOOST_TEST(render({msg("user", "old"), old_answer, msg("system", "new policy"), msg("user", "now")},
                    chat::EncodeOptions{}) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 +
                 "<｜User｜>old<｜Assistant｜></think>old answer<｜System｜>new policy<｜User｜>now<｜Assistant｜><think>");
}

BOOST_AUTO_TEST_CASE(example_f_chat_tool_round_trip) {
  auto a = msg("assistant", "reading");
  a.tool_calls.push_back({"call_1", "read", R"({"filePath":"/x","limit":10,"nested":{"a":1}})"});
  auto t = msg("tool", "FILE");
  t.tool_call_id = "call_1";
  BOOST_TEST(render({msg("user", "u1"), a, t, msg("user", "u2")}, chat_mode()) ==
             "<｜begin▁of▁sentence｜><｜User｜>u1<｜Assistant｜></think>reading\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
             "name=\"read\">\n<｜DSML｜ parameter name=\"filePath\" string=\"true\">/x</｜DSML｜ parameter>\n<｜DSML｜ "
             "parameter name=\"limit\" string=\"false\">10</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"nested\" "
             "string=\"false\">{\"a\": 1}</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ "
             "calls><｜end▁of▁sentence｜><｜User｜><tool_result>FILE</tool_result>\n\nu2<｜Assistant｜></think>");
}

BOOST_AUTO_TEST_CASE(example_g_thinking_tools) {
  std::vector<chat::Tool> tools{
      {R"({"name":"get_weather","description":"Get weather","parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}})"},
      {R"({"name": "search", "description": "Search the web", "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer", "default": 5.0}}}})"}};
  auto a = msg("assistant", "");
  a.reasoning_content = "I should use get_weather.";
  a.tool_calls.push_back({"call_w", "get_weather", R"({"location": "Beijing"})"});
  auto t = msg("tool", R"({"temperature": 22})");
  t.tool_call_id = "call_w";
  std::string const schemas =
      R"({"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}})"
      "\n"
      R"({"name": "search", "description": "Search the web", "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer", "default": 5.0}}}})";
  BOOST_TEST(render({msg("system", "SYS"), msg("user", "What's the weather in Beijing?"), a, t},
                    chat::EncodeOptions{}, tools) ==
             "<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 + "SYS\n\n" + kToolsPromptHead + schemas +
                 kToolsPromptTail +
                 "<｜User｜>What's the weather in Beijing?<｜Assistant｜><think>I should use get_weather.</think>\n\n"
                 "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"location\" "
                 "string=\"true\">Beijing</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>"
                 "<｜User｜><tool_result>{\"temperature\": 22}</tool_result><｜Assistant｜><think>");
  // No system message: a synthetic empty one carries the tools (four newlines after the effort line).
  auto p = render({msg("user", "hi")}, chat::EncodeOptions{}, tools);
  BOOST_TEST(p.starts_with("<｜begin▁of▁sentence｜><｜System｜>" + kEffort75 + "\n\n## Tools\n\n"));
  BOOST_TEST(p.ends_with(kToolsPromptTail + "<｜User｜>hi<｜Assistant｜><think>"));
}

BOOST_AUTO_TEST_CASE(example_h_results_sorted_and_empty_invoke) {
  auto a = msg("assistant", "");
  a.tool_calls.push_back({"ca", "t1", "{}"});
  a.tool_calls.push_back({"cb", "t2", R"({"x": [1, 2.5, "s"], "y": null, "z": "q\"<\n"})"});
  auto rb = msg("tool", "RB");
  rb.tool_call_id = "cb";
  auto ra = msg("tool", "RA");
  ra.tool_call_id = "ca";
  BOOST_TEST(render({msg("user", "go"), a, rb, ra}, chat_mode()) ==
             "<｜begin▁of▁sentence｜><｜User｜>go<｜Assistant｜></think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
             "name=\"t1\">\n\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"t2\">\n<｜DSML｜ parameter name=\"x\" "
             "string=\"false\">[1, 2.5, \"s\"]</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"y\" "
             "string=\"false\">null</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"z\" string=\"true\">q\"<\n</｜DSML｜ "
             "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜><｜User｜><tool_result>RA</tool_result>"
             "\n\n<tool_result>RB</tool_result><｜Assistant｜></think>");
}

BOOST_AUTO_TEST_CASE(arguments_variants) {
  // Double-encoded JSON and a non-object (wrapped as {"arguments": raw}).
  auto a = msg("assistant", "");
  a.tool_calls.push_back({"c1", "f", R"("{\"k\": 1}")"});
  a.tool_calls.push_back({"c2", "g", "not json"});
  auto p = render({msg("user", "u"), a}, chat_mode());
  BOOST_TEST(p.find("<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"k\" string=\"false\">1</｜DSML｜ parameter>") !=
             std::string::npos);
  BOOST_TEST(p.find("<｜DSML｜ invoke name=\"g\">\n<｜DSML｜ parameter name=\"arguments\" string=\"true\">not json</｜DSML｜ "
                    "parameter>") != std::string::npos);
  BOOST_TEST(p.ends_with("</｜DSML｜ calls><｜end▁of▁sentence｜>"));   // last message is the assistant: no header
}

BOOST_AUTO_TEST_CASE(parts_reminder_and_response_format) {
  chat::Message u;
  u.role = "user";
  u.parts = {{"text", "part one"}, {"text", "part two"}};
  chat::EncodeOptions o = chat_mode();
  o.response_format_json = R"({"type":"object","properties":{"a":{"type":"number"}}})";
  BOOST_TEST(render({u, msg("latest_reminder", "date: Wed")}, o) ==
             "<｜begin▁of▁sentence｜><｜System｜>\n\n## Response Format:\n\nYou MUST strictly adhere to the following "
             "schema to reply:\n{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}}}<｜User｜>part "
             "one\n\npart two<｜Assistant｜></think><｜latest_reminder｜>date: Wed");
}

BOOST_AUTO_TEST_CASE(effort_values) {
  chat::EncodeOptions o;
  for (int e : {1, 42, 100}) {
    o.reasoning_effort = e;
    BOOST_TEST(render({msg("user", "x")}, o).find("Reasoning Effort: " + std::to_string(e) + " (range") !=
               std::string::npos);
  }
  for (int e : {0, 101, -5}) {
    o.reasoning_effort = e;
    BOOST_TEST(!chat::encode_conversation({msg("user", "x")}, {}, o).ok());
  }
  // In chat mode the effort is not rendered (and not checked).
  BOOST_TEST(render({msg("user", "x")}, chat_mode()).find("Reasoning") == std::string::npos);
  struct Case { char const* name; bool thinking; int effort; };
  for (auto c : {Case{"none", false, 75}, Case{"minimal", true, 50}, Case{"low", true, 50}, Case{"medium", true, 75},
                 Case{"high", true, 75}, Case{"xhigh", true, 75}, Case{"max", true, 100}, Case{"ultra", true, 100}}) {
    auto r = chat::effort_from_name(c.name);
    BOOST_REQUIRE(r.ok());
    BOOST_TEST(r->thinking == c.thinking);
    if (c.thinking) BOOST_TEST(r->effort == c.effort);
  }
  BOOST_TEST(!chat::effort_from_name("extreme").ok());
  BOOST_TEST(!chat::effort_from_name("").ok());
  BOOST_TEST(!chat::effort_from_int(0).ok());
  BOOST_TEST(!chat::effort_from_int(101).ok());
  BOOST_TEST(chat::effort_from_int(42)->effort == 42);
}

BOOST_AUTO_TEST_CASE(python_json) {
  auto r = chat::python_json_dumps(
      R"({"a":1.0,"b":1e100,"c":0.1,"d":1e-5,"e":"x\"\n\u0001é/\u007f","f":[true,false,null],"g":{},"h":12345678901234567890,"i":-0.0,"j":1e16,"k":123456789012345.6,"l":1.5e-7,"m":1e15,"n":0.0001,"o":-2.5})",
      "t");
  BOOST_REQUIRE(r.ok());
  // Reference output of Python 3.11 json.dumps(json.loads(...), ensure_ascii=False).
  BOOST_TEST(*r ==
             "{\"a\": 1.0, \"b\": 1e+100, \"c\": 0.1, \"d\": 1e-05, \"e\": \"x\\\"\\n\\u0001é/\x7f\", \"f\": [true, "
             "false, null], \"g\": {}, \"h\": 12345678901234567890, \"i\": -0.0, \"j\": 1e+16, \"k\": "
             "123456789012345.6, \"l\": 1.5e-07, \"m\": 1000000000000000.0, \"n\": 0.0001, \"o\": -2.5}");
  BOOST_TEST(!chat::python_json_dumps("{", "tools[0].function").ok());
  BOOST_TEST(chat::python_json_dumps("{", "tools[0].function").status().message().find("tools[0].function") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(safe_mode_keeps_typed_specials_as_text) {
  auto p = chat::encode_conversation({msg("user", "say <｜User｜> and </think>")}, {}, chat_mode());
  BOOST_REQUIRE(p.ok());
  auto exact = *chat::tokenize_prompt(*p, v41(), chat::TokenizeMode::kExact);
  auto safe = *chat::tokenize_prompt(*p, v41(), chat::TokenizeMode::kSafe);
  auto count = [](std::vector<TokenId> const& v, TokenId id) { return std::count(v.begin(), v.end(), id); };
  BOOST_TEST(count(exact, 128803) == 2);   // the typed <｜User｜> became the token
  BOOST_TEST(count(safe, 128803) == 1);    // only the encoder's own
  BOOST_TEST(count(safe, 128822) == 1);
  BOOST_TEST(*v41().decode(safe) == p->text());
}

BOOST_AUTO_TEST_CASE(token_stream_to_parser) {
  // A reply tokenized, then detokenized one token at a time into the streaming parser, equals the reference
  // parse of its text (the path the server takes: ids → StreamingDetokenizer → OutputParser).
  std::string const reply =
      "先想一想：北京 22°C</think>好的。\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter "
      "name=\"location\" string=\"true\">北京 \"市\"</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"days\" "
      "string=\"false\">[1, 2]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>";
  auto ids = v41().encode(reply, true).value_or_throw();
  tessera::models::StreamingDetokenizer detok(v41());
  chat::OutputParser parser({.thinking = true});
  std::string args;
  for (auto id : ids) {
    auto d = parser.feed(detok.feed(id).value_or_throw());
    for (auto const& t : d.tool_calls) args += t.arguments;
  }
  parser.feed(detok.flush());
  parser.finish();
  auto ref = chat::parse_completion_exact(reply, true);
  BOOST_REQUIRE(ref.ok());
  auto const& m = parser.message();
  BOOST_TEST(m.reasoning == ref->reasoning);
  BOOST_TEST(m.content == ref->content);
  BOOST_TEST(m.content == "好的。");
  BOOST_REQUIRE(m.tool_calls.size() == 1u);
  BOOST_TEST(m.tool_calls[0].name == "get_weather");
  BOOST_TEST(m.tool_calls[0].arguments == ref->tool_calls[0].arguments);
  BOOST_TEST(m.tool_calls[0].arguments == "{\"location\": \"北京 \\\"市\\\"\", \"days\": [1, 2]}");
  BOOST_TEST(args == m.tool_calls[0].arguments);
  BOOST_TEST(m.saw_eos);
}

BOOST_AUTO_TEST_CASE(request_errors) {
  BOOST_TEST(!chat::encode_conversation({msg("wizard", "x")}, {}, chat_mode()).ok());
  BOOST_TEST(!chat::encode_conversation({msg("user", "look <｜deepseek_image｜>")}, {}, chat_mode()).ok());
  chat::Message img;
  img.role = "user";
  img.parts = {{"text", "see"}, {"image_url", ""}};
  auto r = chat::encode_conversation({img}, {}, chat_mode());
  BOOST_TEST(!r.ok());
  BOOST_TEST(r.status().message().find("messages[0].content[1]") != std::string::npos);
  BOOST_TEST(!chat::encode_conversation({msg("user", "x")}, {chat::Tool{"{bad"}}, chat_mode()).ok());
}

BOOST_AUTO_TEST_SUITE_END()

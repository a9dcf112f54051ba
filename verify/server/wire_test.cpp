// SPDX-License-Identifier: Apache-2.0
/// Server wire-level units: SHA-256 known answers (FIPS 180-2 appendix vectors), SSE framing, UTF-8
/// assembly, stop-string hold-back, request validation and OpenAI error shapes.
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include "servers/openai/http/sha256.hpp"
#include "servers/openai/http/sse.hpp"
#include "servers/openai/routes/api.hpp"
#include "servers/openai/routes/request.hpp"
#include "servers/openai/routes/text.hpp"

using namespace tessera::server;
namespace json = boost::json;

BOOST_AUTO_TEST_SUITE(sha256_known_answers)

BOOST_AUTO_TEST_CASE(fips_vectors) {
  BOOST_TEST(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  BOOST_TEST(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  BOOST_TEST(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
             "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  BOOST_TEST(to_hex(sha256(std::string(1000000, 'a'))) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

BOOST_AUTO_TEST_CASE(incremental_equals_one_shot) {
  std::string msg;
  for (int i = 0; i < 300; ++i) msg += static_cast<char>((i * 37 + 11) & 0xFF);
  for (size_t split : {0, 1, 55, 56, 63, 64, 65, 128, 299}) {
    Sha256 s;
    s.update(msg.data(), split);
    s.update(msg.data() + split, msg.size() - split);
    BOOST_TEST(to_hex(s.final()) == to_hex(sha256(msg)));
  }
}

BOOST_AUTO_TEST_CASE(digest_compare) {
  auto a = sha256("key-one-123"), b = sha256("key-one-123"), c = sha256("key-one-124");
  BOOST_TEST(digests_equal(a, b));
  BOOST_TEST(!digests_equal(a, c));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(sse_and_text)

BOOST_AUTO_TEST_CASE(sse_framing) {
  BOOST_TEST(sse_data("{\"a\":1}") == "data: {\"a\":1}\n\n");
  BOOST_TEST(sse_data("x\ny") == "data: x\ndata: y\n\n");
  BOOST_TEST(sse_done() == "data: [DONE]\n\n");
  BOOST_TEST(sse_comment("keep-alive") == ": keep-alive\n\n");
}

BOOST_AUTO_TEST_CASE(utf8_assembly) {
  std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes, fed one byte per token
  Utf8Stream u;
  BOOST_TEST(u.push(euro.substr(0, 1)) == "");
  BOOST_TEST(u.push(euro.substr(1, 1)) == "");
  BOOST_TEST(u.push(euro.substr(2, 1)) == euro);
  BOOST_TEST(u.push("a\xFF" "b") == "a\xEF\xBF\xBD" "b");  // invalid byte → U+FFFD
  BOOST_TEST(u.push("\xE2\x82") == "");
  BOOST_TEST(u.flush() == "\xEF\xBF\xBD");                  // truncated at the end → U+FFFD
}

BOOST_AUTO_TEST_CASE(utf8_validation) {
  BOOST_TEST(valid_utf8("plain ascii"));
  BOOST_TEST(valid_utf8("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
  BOOST_TEST(!valid_utf8("\xC0\x80"));          // overlong NUL
  BOOST_TEST(!valid_utf8("\xED\xA0\x80"));      // UTF-16 surrogate
  BOOST_TEST(!valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  BOOST_TEST(!valid_utf8("\xE4\xB8"));          // truncated
  BOOST_TEST(!valid_utf8("\x80"));              // lone continuation
}

BOOST_AUTO_TEST_CASE(stop_strings_hold_back) {
  StopMatcher m({"STOP", "xy"});
  std::string out = m.push("abcST");
  BOOST_TEST(out == "abc");          // "ST" could begin "STOP"
  out += m.push("OR");
  BOOST_TEST(out == "abcSTOR");      // "STOR" cannot: released
  out += m.push("x");
  BOOST_TEST(out == "abcSTOR");
  out += m.push("yzzz");
  BOOST_TEST(m.stopped());
  BOOST_TEST(out == "abcSTOR");      // the stop string and what follows are cut
  BOOST_TEST(m.push("more") == "");
  StopMatcher n({"END"});
  std::string t = n.push("E");
  t += n.flush();
  BOOST_TEST(t == "E");              // a partial match at the end is released
  BOOST_TEST(!n.stopped());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(request_validation)

static ParsedRequest chat(std::string const& body) {
  RequestLimits lim;
  auto b = parse_body(body, lim);
  if (auto* e = std::get_if<ApiError>(&b)) return *e;
  return parse_chat_request(std::get<json::object>(b), lim);
}
static ApiError chat_error(std::string const& body) {
  auto r = chat(body);
  BOOST_REQUIRE_MESSAGE(std::holds_alternative<ApiError>(r), "expected an error for " + body);
  return std::get<ApiError>(r);
}
static ApiRequest chat_ok(std::string const& body) {
  auto r = chat(body);
  if (auto* e = std::get_if<ApiError>(&r)) BOOST_FAIL("unexpected error for " + body + ": " + e->message);
  return std::get<ApiRequest>(r);
}
static std::string const kMsg = R"("messages":[{"role":"user","content":"hi"}])";

BOOST_AUTO_TEST_CASE(valid_request_fields) {
  auto r = chat_ok("{" + kMsg + R"(,"model":"m","temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"max_tokens":12,
      "seed":7,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3,
      "ignore_eos":true,"return_token_ids":true,"draft":false,"n":1,"priority":"background"})");
  BOOST_TEST(r.model == "m");
  BOOST_TEST(r.sampling.temperature == 0.5f);
  BOOST_TEST(r.sampling.top_k == 40);
  BOOST_TEST(*r.max_tokens == 12);
  BOOST_TEST(r.sampling.seed == 7u);
  BOOST_TEST(r.stop.size() == 2u);
  BOOST_TEST(r.stream);
  BOOST_TEST(r.include_usage);
  BOOST_TEST(r.top_logprobs == 3);
  BOOST_TEST(r.ignore_eos);
  BOOST_TEST(r.return_token_ids);
  BOOST_TEST(!r.draft);
  BOOST_TEST(r.background);
  BOOST_TEST(!chat_ok("{" + kMsg + R"(,"priority":"interactive"})").background);
  BOOST_TEST(!chat_ok("{" + kMsg + R"(,"priority":-1})").background);
  BOOST_TEST(chat_ok("{" + kMsg + R"(,"priority":3})").background);
  BOOST_TEST(r.render.thinking);       // thinking defaults to on
  BOOST_TEST(r.render.effort == 75);
  auto d = chat_ok(R"({"messages":[{"role":"developer","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})");
  BOOST_TEST(d.messages[0].role == "system");
  BOOST_TEST(d.messages[1].content == "a\n\nb");
}

BOOST_AUTO_TEST_CASE(bad_requests_name_the_field) {
  struct Case { char const* body; char const* param; };
  std::string m = kMsg;
  Case const cases[] = {
      {"{}", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", "messages[0].content[0]"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-5})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":2})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":5})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":0})", "reasoning_effort"},
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":101})", "reasoning_effort"},
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":true})", "reasoning_effort"},
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"extreme"})", "reasoning_effort"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"thinking":"yes"}})", "chat_template_kwargs.thinking"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]})", "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"nope"}}})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})", "response_format.type"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":"abc"})", "seed"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":42})", "model"},
      {R"({"messages":[{"role":"user","content":"x"}],"priority":"urgent"})", "priority"},
  };
  for (auto const& c : cases) {
    ApiError e = chat_error(c.body);
    BOOST_TEST(e.status == 400, c.body);
    BOOST_TEST(e.param == c.param, c.body << " → param '" << e.param << "' (" << e.message << ")");
    BOOST_TEST(!e.message.empty());
  }
}

BOOST_AUTO_TEST_CASE(body_level_errors) {
  RequestLimits lim;
  lim.max_json_depth = 16;
  for (std::string body : {std::string("{bad json"), std::string("[1,2]"), std::string("\"s\""), std::string("{\"a\":\"\xFF\"}"),
                           std::string(40, '[') + std::string(40, ']')}) {
    auto r = parse_body(body, lim);
    BOOST_REQUIRE(std::holds_alternative<ApiError>(r));
    BOOST_TEST(std::get<ApiError>(r).status == 400);
  }
}

BOOST_AUTO_TEST_CASE(effort_and_thinking) {
  BOOST_TEST(chat_ok("{" + kMsg + R"(,"reasoning_effort":"low"})").render.effort == 50);
  BOOST_TEST(chat_ok("{" + kMsg + R"(,"reasoning_effort":"max"})").render.effort == 100);
  BOOST_TEST(chat_ok("{" + kMsg + R"(,"reasoning_effort":"medium"})").render.effort == 75);
  BOOST_TEST(chat_ok("{" + kMsg + R"(,"reasoning_effort":42})").render.effort == 42);
  BOOST_TEST(!chat_ok("{" + kMsg + R"(,"reasoning_effort":"none"})").render.thinking);
  BOOST_TEST(!chat_ok("{" + kMsg + R"(,"thinking":{"type":"disabled"}})").render.thinking);
  BOOST_TEST(!chat_ok("{" + kMsg + R"(,"chat_template_kwargs":{"enable_thinking":false}})").render.thinking);
  // kwargs win over top-level fields.
  auto r = chat_ok("{" + kMsg + R"(,"thinking":{"type":"disabled"},"chat_template_kwargs":{"thinking":true,"reasoning_effort":"low"}})");
  BOOST_TEST(r.render.thinking);
  BOOST_TEST(r.render.effort == 50);
  BOOST_TEST(chat_ok("{" + kMsg + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"})").render.tools.empty());
}

BOOST_AUTO_TEST_CASE(completion_prompts) {
  RequestLimits lim;
  auto parse = [&](std::string const& s) {
    return parse_completion_request(std::get<json::object>(parse_body(s, lim)), lim);
  };
  auto a = std::get<ApiRequest>(parse(R"({"prompt":"hello"})"));
  BOOST_TEST(*a.prompt_text == "hello");
  BOOST_TEST(*a.max_tokens == 16);
  auto b = std::get<ApiRequest>(parse(R"({"prompt":[1,2,3],"logprobs":2})"));
  BOOST_TEST(b.prompt_ids.size() == 3u);
  BOOST_TEST(b.top_logprobs == 2);
  BOOST_TEST(std::get<ApiError>(parse(R"({"prompt":""})")).param == "prompt");
  BOOST_TEST(std::get<ApiError>(parse(R"({"prompt":[-1]})")).param == "prompt");
  BOOST_TEST(std::get<ApiError>(parse(R"({"prompt":["a","b"]})")).param == "prompt");
  BOOST_TEST(std::get<ApiError>(parse(R"({})")).param == "prompt");
}

BOOST_AUTO_TEST_CASE(error_shape) {
  HttpResponse r = Api::error_response(ApiError{400, "bad thing", "invalid_request_error", "", ""});
  BOOST_TEST(r.status == 400);
  json::value v = json::parse(r.body);
  auto const& e = v.at("error").as_object();
  BOOST_TEST(e.at("message").as_string() == "bad thing");
  BOOST_TEST(e.at("type").as_string() == "invalid_request_error");
  BOOST_TEST(e.at("param").is_null());
  BOOST_TEST(e.at("code").is_null());
  HttpResponse c = Api::error_response(ApiError{400, "m", "invalid_request_error", "messages", "context_length_exceeded"});
  BOOST_TEST(json::parse(c.body).at("error").at("code").as_string() == "context_length_exceeded");
}

BOOST_AUTO_TEST_SUITE_END()

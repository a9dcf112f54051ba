// SPDX-License-Identifier: Apache-2.0
/// Drafting in the server (docs/drafting.md): the routes and engine of `tessera serve` in process, on the
/// tiny DeepSeek-V4.1 model with DSpark blocks (verify/draft/dspark_fixture.hpp) and the byte-level chat
/// codec. Greedy and seeded chat requests, a forced tool call (grammar-constrained) and a thinking
/// request, each sent with drafting on (DSpark, fixed depths; lookup) and with "draft": false, alone and
/// concurrently: the replies are byte-identical (id, created, tool-call ids and prefix-cache counts aside). /metrics and /health count the
/// drafted and accepted tokens under the vLLM spec_decode names; "draft": false requests draft nothing.
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <regex>
#include <thread>

#include "servers/openai/routes/api.hpp"
#include "servers/openai/routes/deepseek_chat.hpp"
#include "servers/openai/routes/tokenizer_codec.hpp"
#include "servers/openai/serve.hpp"
#include "verify/draft/dspark_fixture.hpp"

using namespace tessera;
using namespace tessera::server;
namespace json = boost::json;

namespace {

class NullConnection final : public Connection {
 public:
  bool client_gone() override { return false; }
  bool begin_stream() override { return true; }
  bool write(std::string_view d) override { out += d; return true; }
  void end_stream() override {}
  std::string out;
};

/// One server: engine + routes over the shared tiny DSpark model.
struct Server {
  std::unique_ptr<TextCodec> codec = make_byte_codec();
  std::unique_ptr<ChatFormat> chat = make_deepseek_chat_format(nullptr);
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Api> api;
  Server(model::LanguageModel& m, std::string const& draft, int64_t k) {
    EngineOptions eo;
    eo.max_batch = 4;
    throw_if_error(configure_drafting(eo, m, draft, k));
    engine = std::make_unique<Engine>(m, eo);
    ServedModel sm;
    sm.id = "tiny-dspark";
    sm.codec = codec.get();
    sm.chat = chat.get();
    sm.parser = &make_deepseek_output_parser;
    sm.constraints = ConstraintFactory::create(*codec, m.info().eos_token_ids).value_or_throw();
    sm.engine = engine.get();
    api = std::make_unique<Api>(sm, ApiOptions{});
  }
  ~Server() { engine->stop(); }
  HttpResponse call(std::string const& method, std::string const& target, std::string const& body = {}) {
    HttpRequest r;
    r.method = method;
    r.target = target;
    r.body = body;
    r.headers = {{"content-type", "application/json"}};
    NullConnection c;
    auto resp = api->handle(r, c);
    BOOST_REQUIRE(resp.has_value());
    return *resp;
  }
  /// The reply without its per-request id and timestamp.
  std::string chat_reply(std::string const& body) {
    HttpResponse r = call("POST", "/v1/chat/completions", body);
    BOOST_REQUIRE_MESSAGE(r.status == 200, r.body);
    json::object o = json::parse(r.body).as_object();
    o.erase("id");
    o.erase("created");
    if (auto* u = o.if_contains("usage"); u && u->is_object())  // prefix-cache hits differ between runs
      if (auto* d = u->as_object().if_contains("prompt_tokens_details"); d && d->is_object()) d->as_object().erase("cached_tokens");
    // Tool-call ids are random per reply.
    return std::regex_replace(json::serialize(o), std::regex("\"call_[0-9a-f]+\""), "\"call_\"");
  }
};

std::vector<std::string> request_bodies() {
  std::string const tools = R"("tools": [{"type": "function", "function": {"name": "get_weather",
      "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}}, "required": ["city"]}}}], "tool_choice": "required",
      "chat_template_kwargs": {"thinking": false})";
  std::vector<std::string> v;
  for (int i = 0; i < 4; ++i) {
    std::string msg = R"({"role": "user", "content": "Tell me about number )" + std::to_string(i) + R"( twice, then again."})";
    v.push_back(R"({"model": "tiny-dspark", "messages": [)" + msg + R"(], "max_tokens": 40, "temperature": 0)");
    v.push_back(R"({"model": "tiny-dspark", "messages": [)" + msg + R"(], "max_tokens": 40, "temperature": 0.8, "top_p": 0.9, "seed": )" +
                std::to_string(11 + i));
  }
  v.push_back(R"({"model": "tiny-dspark", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 160,
      "temperature": 0, )" + tools);
  v.push_back(R"({"model": "tiny-dspark", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 160,
      "temperature": 0.7, "seed": 5, )" + tools);
  v.push_back(R"({"model": "tiny-dspark", "messages": [{"role": "user", "content": "Think first."}], "max_tokens": 48,
      "temperature": 0, "chat_template_kwargs": {"thinking": true})");
  v.push_back(R"({"model": "tiny-dspark", "messages": [{"role": "user", "content": "Think, sampled."}], "max_tokens": 48,
      "temperature": 0.9, "seed": 8, "chat_template_kwargs": {"thinking": true, "reasoning_effort": "high"})");
  return v;
}

std::string with_draft(std::string body, bool on) { return body + (on ? "}" : R"(, "draft": false})"); }

double metric(std::string const& text, std::string const& name) {
  std::smatch m;
  std::regex re("\n" + std::regex_replace(name, std::regex(R"([.:])"), R"(\$&)") + R"(\{[^}]*\} ([0-9.e+]+))");
  if (!std::regex_search(text, m, re)) return -1;
  return std::stod(m[1]);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(server_drafting)

BOOST_AUTO_TEST_CASE(drafted_replies_equal_serial_replies) {
  auto owned = verify::make_dspark_tiny("fp32", 4096);  // room for the tool prompt (~1,200 byte tokens)
  model::dsv41::Dsv41Model& m = *owned;
  auto bodies = request_bodies();
  Server dspark(m, "auto", 4);  // DSpark by default (the model has mtp.* weights), depth 4
  std::vector<std::string> serial;
  for (auto const& b : bodies) serial.push_back(dspark.chat_reply(with_draft(b, false)));
  // "draft": false drafts nothing.
  std::string met = dspark.call("GET", "/metrics").body;
  BOOST_TEST(metric(met, "vllm:spec_decode_num_draft_tokens_total") == 0.0);
  int tool_calls = 0, reasoning = 0;
  for (auto const& s : serial) {
    tool_calls += s.find("\"tool_calls\":[{") != std::string::npos;
    reasoning += s.find("\"reasoning_content\":\"") != std::string::npos;
  }
  BOOST_TEST(tool_calls == 2, serial[8] << "\n" << serial[9]);
  BOOST_TEST(reasoning >= 1);

  // Drafting on: one at a time, then all at once (batched with drafts of different depths).
  for (size_t i = 0; i < bodies.size(); ++i) {
    std::string got = dspark.chat_reply(with_draft(bodies[i], true));
    BOOST_TEST(got == serial[i], "request " << i << "\n" << got << "\n" << serial[i]);
  }
  std::vector<std::string> conc(bodies.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < bodies.size(); ++i) th.emplace_back([&, i] { conc[i] = dspark.chat_reply(with_draft(bodies[i], true)); });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < bodies.size(); ++i) BOOST_TEST(conc[i] == serial[i], "concurrent request " << i);

  met = dspark.call("GET", "/metrics").body;
  double drafted = metric(met, "vllm:spec_decode_num_draft_tokens_total");
  double accepted = metric(met, "vllm:spec_decode_num_accepted_tokens_total");
  BOOST_TEST(drafted > 0.0);
  BOOST_TEST(accepted >= 0.0);
  BOOST_TEST(metric(met, "tessera:spec_decode_num_draft_tokens_total") == drafted);
  BOOST_TEST(metric(met, "vllm:spec_decode_num_drafts_total") > 0.0);
  BOOST_TEST(met.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tiny-dspark\",position=\"0\"}") != std::string::npos);
  BOOST_TEST(met.find("tessera:spec_decode_accepted_per_round_bucket") != std::string::npos);
  json::object h = json::parse(dspark.call("GET", "/health").body).as_object();
  BOOST_TEST(h.at("drafted_total").to_number<double>() == drafted);
  BOOST_TEST(h.at("drafter").as_string() == "dspark");
  BOOST_TEST_MESSAGE("server DSpark (random mtp weights): drafted " << drafted << " accepted " << accepted);

  // Lookup drafts (by option), depth 3: the same replies.
  Server lookup(m, "lookup", 3);
  for (size_t i = 0; i < bodies.size(); ++i) BOOST_TEST(lookup.chat_reply(with_draft(bodies[i], true)) == serial[i], "lookup request " << i);
  met = lookup.call("GET", "/metrics").body;
  BOOST_TEST(metric(met, "vllm:spec_decode_num_draft_tokens_total") > 0.0);
  BOOST_TEST_MESSAGE("server lookup: drafted " << metric(met, "vllm:spec_decode_num_draft_tokens_total") << " accepted "
                     << metric(met, "vllm:spec_decode_num_accepted_tokens_total"));

  // No drafter: no spec_decode series at all (never faked as 0); "dspark" without weights is refused.
  Server none(m, "none", -1);
  BOOST_TEST(none.chat_reply(with_draft(bodies[0], true)) == serial[0]);
  BOOST_TEST(none.call("GET", "/metrics").body.find("spec_decode") == std::string::npos);
  EngineOptions eo;
  BOOST_TEST(!configure_drafting(eo, verify::tiny_model("fp32"), "dspark", -1).ok());
  BOOST_TEST(configure_drafting(eo, verify::tiny_model("fp32"), "auto", -1).ok());
  BOOST_TEST(!eo.make_drafter);
  BOOST_TEST(!configure_drafting(eo, m, "medusa", -1).ok());
}

BOOST_AUTO_TEST_SUITE_END()

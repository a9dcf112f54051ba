// SPDX-License-Identifier: Apache-2.0
/// The OpenAI routes and engine of `tessera serve` over rank 0's RankDriver (models/common/rank_driver.hpp),
/// the other ranks following as threads over the in-process communicator: golden/v41-tiny fp32 at TP = EP = 2,
/// the byte-level chat codec. Greedy chat and completion requests, one at a time and four at once (continuous
/// batching, prefix-cache clones), give the replies the single-rank model gives through the same server; the
/// group shuts down cleanly after the engine stops.
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <thread>

#include "servers/openai/routes/api.hpp"
#include "servers/openai/routes/deepseek_chat.hpp"
#include "servers/openai/routes/tokenizer_codec.hpp"
#include "servers/openai/serve.hpp"
#include "verify/dist/rank_group.hpp"
#include "verify/model/fixture.hpp"

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

struct Server {
  std::unique_ptr<TextCodec> codec = make_byte_codec();
  std::unique_ptr<ChatFormat> chat = make_deepseek_chat_format(nullptr);
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Api> api;
  explicit Server(model::LanguageModel& m) {
    EngineOptions eo;
    eo.max_batch = 4;
    eo.step_token_budget = 24;  // prompts prefill in several chunks, beside other slots' decode rows
    eo.extra_eos_token_ids = tokenizer_eos_ids(*codec);
    engine = std::make_unique<Engine>(m, eo);
    ServedModel sm;
    sm.id = "tiny";
    sm.codec = codec.get();
    sm.chat = chat.get();
    sm.parser = &make_deepseek_output_parser;
    sm.engine = engine.get();
    api = std::make_unique<Api>(sm, ApiOptions{});
  }
  ~Server() { engine->stop(); }
  /// The reply body without its per-request id, timestamp and prefix-cache count.
  std::string post(std::string const& target, std::string const& body) {
    HttpRequest r;
    r.method = "POST";
    r.target = target;
    r.body = body;
    r.headers = {{"content-type", "application/json"}};
    NullConnection c;
    auto resp = api->handle(r, c);
    if (!resp || resp->status != 200) return "HTTP error: " + (resp ? resp->body : std::string("no response"));
    json::object o = json::parse(resp->body).as_object();
    o.erase("id");
    o.erase("created");
    if (auto* u = o.if_contains("usage"); u && u->is_object()) u->as_object().erase("prompt_tokens_details");
    return json::serialize(o);
  }
};

std::vector<std::pair<std::string, std::string>> requests() {
  std::vector<std::pair<std::string, std::string>> v;
  for (int i = 0; i < 4; ++i) {
    v.push_back({"/v1/chat/completions", R"({"model": "tiny", "max_tokens": 24, "temperature": 0, "messages": [{"role": "user", "content": "Count to )" +
                                             std::to_string(i + 3) + R"( and tell me about the number, please."}]})"});
    v.push_back({"/v1/completions", R"({"model": "tiny", "max_tokens": 16, "temperature": 0, "prompt": "Once upon a time )" +
                                        std::to_string(i) + R"("})"});
  }
  return v;
}

std::vector<std::string> replies(Server& s, bool concurrent) {
  auto reqs = requests();
  std::vector<std::string> out(reqs.size());
  if (!concurrent) {
    for (size_t i = 0; i < reqs.size(); ++i) out[i] = s.post(reqs[i].first, reqs[i].second);
    return out;
  }
  std::vector<std::thread> th;
  for (size_t i = 0; i < reqs.size(); ++i) th.emplace_back([&, i] { out[i] = s.post(reqs[i].first, reqs[i].second); });
  for (auto& t : th) t.join();
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_rank_driver_server)

BOOST_AUTO_TEST_CASE(server_over_driver_equals_single_rank) {
  model::dsv41::Dsv41Model& one = verify::tiny_model("fp32");
  std::vector<std::string> want;
  {
    Server s(one);
    want = replies(s, false);
  }
  for (auto const& w : want) BOOST_TEST_REQUIRE(w.find("HTTP error") == std::string::npos, w);
  dist::ParallelConfig c;
  c.tp = 2;
  c.ep = 2;
  verify::RankGroup g(one, c);
  {
    Server s(*g.driver);
    for (bool concurrent : {false, true}) {
      auto got = replies(s, concurrent);
      for (size_t i = 0; i < want.size(); ++i) BOOST_TEST(got[i] == want[i], (concurrent ? "concurrent " : "") << "request " << i);
    }
  }
  BOOST_TEST(g.driver->commands_sent() > 20u);
  Status st = g.stop();
  BOOST_TEST(st.ok(), st.message());
}

BOOST_AUTO_TEST_SUITE_END()

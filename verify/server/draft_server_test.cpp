// SPDX-License-Identifier: Apache-2.0
/// Drafting in the server (docs/drafting.md): the routes and engine of `tessera serve` in process, on the
/// tiny DeepSeek-V4.1 model with DSpark blocks (verify/draft/dspark_fixture.hpp) and the byte-level chat
/// codec. Greedy and seeded chat requests, a forced tool call (grammar-constrained) and a thinking
/// request, each sent with drafting on (DSpark, fixed depths; lookup) and with "draft": false, alone and
/// concurrently: the replies are byte-identical (id, created, tool-call ids and prefix-cache counts aside). /metrics and /health count the
/// drafted and accepted tokens under the vLLM spec_decode names; "draft": false requests draft nothing.
/// In the engine alone, on the stub model: always-right, always-wrong and random drafters at fixed depths
/// give the serial replies and finish reasons (replies ending by EOS, stop ids and max_tokens inside draft
/// windows), with the counters showing what was kept.
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <random>
#include <regex>
#include <thread>

#include "servers/openai/engine/stub_model.hpp"
#include "servers/openai/routes/api.hpp"
#include "servers/openai/routes/deepseek_chat.hpp"
#include "servers/openai/routes/tokenizer_codec.hpp"
#include "servers/openai/serve.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
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
    eo.extra_eos_token_ids = tokenizer_eos_ids(*codec);
    engine = std::make_unique<Engine>(m, eo);
    ServedModel sm;
    sm.id = "tiny-dspark";
    sm.codec = codec.get();
    sm.chat = chat.get();
    sm.parser = &make_deepseek_output_parser;
    sm.constraints = ConstraintFactory::create(*codec, engine->info().eos_token_ids).value_or_throw();
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

/// Knows the serial sequences (prompt ++ reply ++ stop token) of every request; proposes their
/// continuation of `committed` (kRight), (t + 1) mod V (kWrong), or each token right with probability
/// 1/2 (kRandom). Past the end of a sequence it proposes token 2.
class OracleDrafter final : public model::Drafter {
 public:
  enum class Mode { kRight, kWrong, kRandom };
  OracleDrafter(std::shared_ptr<std::vector<std::vector<int32_t>> const> truth, Mode mode, int64_t vocab, uint64_t seed)
      : truth_(std::move(truth)), mode_(mode), vocab_(vocab), rng_(seed) {}
  std::string name() const override { return "oracle"; }
  model::Draft propose(std::span<int32_t const> committed, int64_t max_k) override {
    model::Draft d;
    for (auto const& t : *truth_) {
      if (t.size() < committed.size() || !std::equal(committed.begin(), committed.end(), t.begin())) continue;
      for (int64_t i = 0; i < max_k; ++i) {
        size_t at = committed.size() + static_cast<size_t>(i);
        int32_t x = at < t.size() ? t[at] : 2;
        if (mode_ == Mode::kWrong) x = static_cast<int32_t>((x + 1) % vocab_);
        if (mode_ == Mode::kRandom && rng_() % 2) x = static_cast<int32_t>(32 + rng_() % 95);
        d.tokens.push_back(x);
      }
      break;
    }
    return d;
  }

 private:
  std::shared_ptr<std::vector<std::vector<int32_t>> const> truth_;
  Mode mode_;
  int64_t vocab_;
  std::mt19937_64 rng_;
};

struct EngineReply {
  std::vector<int32_t> tokens;  // the stop token included (flagged by `stopped`)
  FinishReason finish = FinishReason::kNone;
  bool operator==(EngineReply const&) const = default;
};

EngineReply collect(std::shared_ptr<RequestHandle> const& h) {
  EngineReply r;
  for (int i = 0; i < 4000; ++i) {
    std::vector<TokenEvent> ev;
    h->wait(ev, std::chrono::milliseconds(20));
    for (auto const& e : ev) r.tokens.push_back(e.token);
    if (h->finish_reason() != FinishReason::kNone) {
      ev.clear();
      h->wait(ev, std::chrono::milliseconds(0));
      for (auto const& e : ev) r.tokens.push_back(e.token);
      r.finish = h->finish_reason();
      return r;
    }
  }
  BOOST_FAIL("request did not finish");
  return r;
}

std::vector<EngineReply> run_all(Engine& e, std::vector<GenerationRequest> const& rqs) {
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (auto const& rq : rqs) hs.push_back(e.submit(rq).value_or_throw());
  std::vector<EngineReply> out;
  for (auto const& h : hs) out.push_back(collect(h));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(server_drafting)

BOOST_AUTO_TEST_CASE(forced_drafters_give_the_serial_replies_in_the_engine) {
  // The stub model (row-invariant by construction, EOS likely at every position), 4 slots, 32 requests:
  // greedy and seeded, max_tokens 7 / 23 / 60, a stop id on some, so replies end inside draft windows.
  StubModelConfig sc;
  sc.vocab_size = 300;
  sc.eos_token_ids = {1};
  for (int t = 32; t < 127; ++t) sc.allowed_tokens.push_back(t);
  sc.allowed_tokens.push_back(1);
  sc.eos_bias = -1.5f;
  StubModel stub(sc);
  std::mt19937_64 g(321);
  std::vector<GenerationRequest> rqs;
  for (int i = 0; i < 32; ++i) {
    GenerationRequest rq;
    for (size_t j = 0, n = 5 + g() % 36; j < n; ++j) rq.prompt.push_back(static_cast<int32_t>(32 + g() % 95));
    rq.max_tokens = std::array<int64_t, 3>{7, 23, 60}[i % 3];
    rq.sampling.temperature = i % 2 ? 0.9f : 0.f;
    rq.sampling.seed = 900 + static_cast<uint64_t>(i);
    if (i % 4 == 3) rq.stop_token_ids = {static_cast<int32_t>(32 + i)};
    rqs.push_back(rq);
  }
  EngineOptions serial_opts;
  serial_opts.max_batch = 4;
  Engine serial(stub, serial_opts);
  auto want = run_all(serial, rqs);
  serial.stop();
  auto truth = std::make_shared<std::vector<std::vector<int32_t>>>();
  int ended_by_stop = 0;
  for (size_t i = 0; i < rqs.size(); ++i) {
    std::vector<int32_t> t = rqs[i].prompt;
    t.insert(t.end(), want[i].tokens.begin(), want[i].tokens.end());
    truth->push_back(t);
    ended_by_stop += want[i].finish == FinishReason::kStop;
  }
  BOOST_TEST(ended_by_stop > 4);
  using Mode = OracleDrafter::Mode;
  struct Case { Mode mode; int64_t k; };
  for (Case c : {Case{Mode::kRight, 5}, Case{Mode::kRight, 2}, Case{Mode::kWrong, 3}, Case{Mode::kRandom, 4}}) {
    EngineOptions eo = serial_opts;
    uint64_t seed = 1;
    eo.make_drafter = [&](model::SequenceState&) { return std::make_unique<OracleDrafter>(truth, c.mode, 300, seed++); };
    eo.drafter_name = "oracle";
    eo.draft_policy.fixed_k = c.k;
    Engine e(stub, eo);
    auto got = run_all(e, rqs);
    for (size_t i = 0; i < rqs.size(); ++i)
      BOOST_TEST((got[i] == want[i]), "mode " << int(c.mode) << " k " << c.k << " request " << i);
    EngineStats st = e.stats();
    e.stop();
    BOOST_TEST(st.draft_tokens_total > 0u);
    uint64_t generated = 0;
    for (auto const& w : want) generated += w.tokens.size();
    if (c.mode == Mode::kRight) {
      // Every round keeps its drafts up to a finish: ≥ k + 1 tokens a round but for the last ones.
      BOOST_TEST(st.accepted_tokens_total + st.draft_rounds_total >= generated - rqs.size());
      BOOST_TEST(st.rounds_by_accepted[static_cast<size_t>(c.k)] > 0u);  // whole windows kept
    }
    if (c.mode == Mode::kWrong) BOOST_TEST(st.accepted_tokens_total == 0u);
    if (c.mode == Mode::kRandom) {
      BOOST_TEST(st.accepted_tokens_total > 0u);
      BOOST_TEST(st.accepted_tokens_total < st.draft_tokens_total);
    }
    uint64_t per_pos0 = st.accepted_per_position.empty() ? 0 : st.accepted_per_position[0];
    BOOST_TEST(per_pos0 <= st.draft_rounds_total);
    BOOST_TEST_MESSAGE("oracle mode " << int(c.mode) << " k " << c.k << ": rounds " << st.draft_rounds_total << " drafted "
                       << st.draft_tokens_total << " accepted " << st.accepted_tokens_total << " of " << generated << " tokens");
  }
}


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

  // DSpark with the depth rule (cost table measured on the engine thread at the first drafting step).
  Server adaptive(m, "auto", -1);
  for (size_t i : {0u, 1u, 10u}) BOOST_TEST(adaptive.chat_reply(with_draft(bodies[i], true)) == serial[i], "adaptive request " << i);
  BOOST_TEST(adaptive.engine->stats().drafter == "dspark");
  // No drafter: no spec_decode series at all (never faked as 0); "dspark" without weights is refused.
  Server none(m, "none", -1);
  BOOST_TEST(none.chat_reply(with_draft(bodies[0], true)) == serial[0]);
  BOOST_TEST(none.call("GET", "/metrics").body.find("spec_decode") == std::string::npos);
  EngineOptions eo;
  BOOST_TEST(!configure_drafting(eo, verify::tiny_model("fp32"), "dspark", -1).ok());
  BOOST_TEST(configure_drafting(eo, verify::tiny_model("fp32"), "auto", -1).ok());
  BOOST_TEST(!eo.make_drafter);
  BOOST_TEST(!configure_drafting(eo, m, "medusa", -1).ok());
  // The same weights as a sharded model (the model `serve --tp/--ep` runs): its states are not the CPU model's,
  // so DSpark is refused with the reason, "auto" configures no drafter (none is advertised), lookup works.
  auto sharded = model::dsv41::ShardedModel::create(m, {2, 2}).value_or_throw();
  Status const ds = configure_drafting(eo, *sharded, "dspark", -1);
  BOOST_TEST(!ds.ok());
  BOOST_TEST(ds.message().find("single-rank CPU model") != std::string::npos, ds.message());
  BOOST_TEST(configure_drafting(eo, *sharded, "auto", -1).ok());
  BOOST_TEST(!eo.make_drafter);
  BOOST_TEST(eo.drafter_name.empty());
  BOOST_TEST(configure_drafting(eo, *sharded, "lookup", -1).ok());
  BOOST_TEST(eo.drafter_name == "lookup");
}

BOOST_AUTO_TEST_SUITE_END()

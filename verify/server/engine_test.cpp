// SPDX-License-Identifier: Apache-2.0
/// Engine invariants with the stub model: replies equal an independent token-by-token reference loop
/// (full-history logits + argmax / keyed sampling), whatever the batching, the prefill chunk budget or
/// prefix-cache hits; admission refuses what can never fit, queues what must wait; cancellation and
/// completion free every slot; logprobs are the log-softmax of the model's logits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "servers/openai/engine/engine.hpp"
#include "tessera/ops/sampling.hpp"
#include "servers/openai/engine/stub_model.hpp"
#include "verify/common/random.hpp"

using namespace tessera;
using namespace tessera::server;

namespace {

StubModelConfig stub_config() {
  StubModelConfig c;
  c.vocab_size = 300;
  c.max_context = 2048;
  c.eos_token_ids = {1};
  for (int t = 32; t < 127; ++t) c.allowed_tokens.push_back(t);
  c.eos_bias = 0.0f;
  c.bytes_per_token = 1000;
  return c;
}

struct Reply {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  int64_t cached = 0;
};

Reply collect(std::shared_ptr<RequestHandle> const& h) {
  Reply r;
  std::vector<TokenEvent> ev;
  for (int i = 0; i < 2000; ++i) {  // bounded: 2000 × 50 ms
    ev.clear();
    h->wait(ev, std::chrono::milliseconds(50));
    for (auto const& e : ev) if (!e.is_stop_token) r.tokens.push_back(e.token);
    if (h->finish_reason() != FinishReason::kNone) {
      ev.clear();
      h->wait(ev, std::chrono::milliseconds(0));
      for (auto const& e : ev) if (!e.is_stop_token) r.tokens.push_back(e.token);
      r.finish = h->finish_reason();
      r.cached = h->cached_tokens();
      return r;
    }
  }
  BOOST_FAIL("request did not finish");
  return r;
}

// One keyed draw of ops::sample for a row (the sampler itself is tested in verify/sampling).
int32_t keyed_sample(std::vector<float> const& logits, SamplingParams const& sp, int64_t position,
                     std::vector<int32_t> const& reply) {
  ops::SamplingRowParams p;
  p.temperature = sp.temperature;
  p.top_p = sp.top_p;
  p.top_k = sp.top_k;
  p.min_p = sp.min_p;
  p.seed = sp.seed;
  p.position = position;
  int64_t off[2] = {0, static_cast<int64_t>(reply.size())};
  int32_t token = -1;
  ops::SampleArgs a;
  a.logits = TensorView<float const, 2>(logits.data(), {1, static_cast<int64_t>(logits.size())});
  a.params = TensorView<ops::SamplingRowParams const, 1>(&p, {1});
  a.output_offsets = TensorView<int64_t const, 1>(off, {2});
  a.output_tokens = TensorView<int32_t const, 1>(reply.data(), {off[1]});
  a.tokens = TensorView<int32_t, 1>(&token, {1});
  ExecContext ctx;
  BOOST_REQUIRE(ops::sample(ctx, ops::SampleDesc{1, static_cast<int64_t>(logits.size()), 0}, a).ok());
  return token;
}

// The reference: feed the whole history every step, take argmax (or the keyed sample).
Reply reference(StubModel const& m, std::vector<int32_t> prompt, int64_t max_tokens, SamplingParams const& sp) {
  Reply r;
  std::vector<float> logits(m.info().vocab_size);
  std::vector<int32_t> hist = prompt;
  for (int64_t k = 0; k < max_tokens; ++k) {
    m.logits_for(hist, logits.data());
    int32_t t;
    if (sp.temperature == 0) t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    else t = keyed_sample(logits, sp, static_cast<int64_t>(hist.size()), r.tokens);
    if (t == m.info().eos_token_ids[0]) { r.finish = FinishReason::kStop; return r; }
    r.tokens.push_back(t);
    hist.push_back(t);
  }
  r.finish = FinishReason::kLength;
  return r;
}

std::vector<int32_t> random_prompt(std::mt19937_64& g, size_t n) {
  std::vector<int32_t> p(n);
  for (auto& t : p) t = 32 + static_cast<int32_t>(g() % 95);
  return p;
}

void wait_idle(Engine& e) {
  for (int i = 0; i < 200 && !(e.idle() && e.stats().slots_busy == 0); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  BOOST_TEST(e.idle());
  BOOST_TEST(e.stats().slots_busy == 0);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(engine)

BOOST_AUTO_TEST_CASE(batched_chunked_cached_equal_reference) {
  std::mt19937_64 g(verify::test_seed(11));
  StubModel model(stub_config());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(random_prompt(g, 1 + g() % 300));
  prompts.push_back(prompts[3]);  // exact repeat → prefix-cache hit
  auto ext = prompts[5];
  ext.push_back(77);
  prompts.push_back(ext);         // extension of a cached prompt
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  sampled.top_p = 0.9f;
  sampled.seed = 1234;
  std::vector<Reply> want_g, want_s;
  for (auto const& p : prompts) {
    want_g.push_back(reference(model, p, 40, greedy));
    want_s.push_back(reference(model, p, 40, sampled));
  }
  // Chunk budgets 7 (many prefill steps) and 4096 (one step); batch 1 (serial) and 6.
  for (auto [batch, budget] : {std::pair{1, 4096}, std::pair{6, 7}, std::pair{6, 4096}}) {
    EngineOptions o;
    o.max_batch = batch;
    o.step_token_budget = budget;
    o.memory_budget_bytes = size_t(1) << 30;  // room to keep every prompt's snapshot
    Engine e(model, o);
    for (int pass = 0; pass < 2; ++pass) {  // pass 1 runs with a warm prefix cache
      std::vector<std::shared_ptr<RequestHandle>> hs;
      for (size_t i = 0; i < prompts.size(); ++i) {
        GenerationRequest rq;
        rq.prompt = prompts[i];
        rq.max_tokens = 40;
        rq.sampling = i % 2 ? sampled : greedy;
        hs.push_back(*e.submit(rq));
      }
      for (size_t i = 0; i < prompts.size(); ++i) {
        Reply got = collect(hs[i]);
        Reply const& want = i % 2 ? want_s[i] : want_g[i];
        BOOST_TEST(got.tokens == want.tokens, "batch " << batch << " budget " << budget << " prompt " << i);
        BOOST_TEST((got.finish == want.finish));
        if (pass == 1 && prompts[i].size() > 9) BOOST_TEST(got.cached >= static_cast<int64_t>(prompts[i].size()) - 1);
      }
    }
    wait_idle(e);
    BOOST_TEST(e.stats().prefix_cache_hits > 0u);
  }
}

BOOST_AUTO_TEST_CASE(limits_stop_ids_and_ignore_eos) {
  StubModel model(stub_config());
  Engine e(model, {});
  std::mt19937_64 g(verify::test_seed(12));
  auto p = random_prompt(g, 20);
  GenerationRequest rq;
  rq.prompt = p;
  rq.sampling.temperature = 0;
  rq.max_tokens = 5;
  Reply r = collect(*e.submit(rq));
  Reply ref = reference(model, p, 5, rq.sampling);
  BOOST_TEST(r.tokens == ref.tokens);
  BOOST_TEST((r.finish == ref.finish));
  // A stop id equal to the reference's 3rd token ends the reply before it.
  Reply longer = reference(model, p, 40, rq.sampling);
  BOOST_REQUIRE(longer.tokens.size() >= 3u);
  rq.max_tokens = 40;
  rq.stop_token_ids = {longer.tokens[2]};
  Reply s = collect(*e.submit(rq));
  BOOST_TEST((s.finish == FinishReason::kStop));
  size_t first = std::find(longer.tokens.begin(), longer.tokens.end(), longer.tokens[2]) - longer.tokens.begin();
  BOOST_TEST(s.tokens == std::vector<int32_t>(longer.tokens.begin(), longer.tokens.begin() + first));
  // ignore_eos always runs to max_tokens.
  rq.stop_token_ids.clear();
  rq.ignore_eos = true;
  rq.max_tokens = 300;
  Reply ie = collect(*e.submit(rq));
  BOOST_TEST(ie.tokens.size() == 300u);
  BOOST_TEST((ie.finish == FinishReason::kLength));
  // Refusals at submit.
  GenerationRequest bad = rq;
  bad.max_tokens = 5000;
  BOOST_TEST((e.submit(bad).status().code() == StatusCode::kInvalidArgument));  // over the context
  bad.max_tokens = 5;
  bad.prompt = {1000};
  BOOST_TEST((e.submit(bad).status().code() == StatusCode::kInvalidArgument));  // id outside the vocabulary
  bad.prompt.clear();
  BOOST_TEST((e.submit(bad).status().code() == StatusCode::kInvalidArgument));  // empty
  wait_idle(e);
}

BOOST_AUTO_TEST_CASE(admission_queue_and_capacity) {
  StubModelConfig c = stub_config();
  c.step_delay_us = 2000;
  StubModel model(c);
  EngineOptions o;
  o.max_batch = 4;
  o.memory_budget_bytes = model.state_bytes_for(250);  // one 100+100-token request at a time
  o.max_queue = 5;
  o.queue_timeout_s = 30;
  o.prefix_cache_entries = 0;
  Engine e(model, o);
  std::mt19937_64 g(verify::test_seed(13));
  GenerationRequest rq;
  rq.sampling.temperature = 0;
  rq.ignore_eos = true;
  rq.max_tokens = 100;
  rq.prompt = random_prompt(g, 100);
  GenerationRequest huge = rq;
  huge.max_tokens = 200;
  BOOST_TEST((e.submit(huge).status().code() == StatusCode::kOutOfMemory));  // can never fit the budget
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 3; ++i) hs.push_back(*e.submit(rq));
  // Wait for the engine to admit the first (a fixed sleep flaked on a loaded host).
  for (int i = 0; i < 500 && e.stats().slots_busy == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto st = e.stats();
  BOOST_TEST(st.slots_busy == 1);       // memory, not slots, limits admission
  BOOST_TEST(st.queue_length == 2);
  BOOST_TEST(st.memory_used_bytes <= st.memory_budget_bytes);
  for (int i = 0; i < 3; ++i) hs.push_back(*e.submit(rq));
  auto over = e.submit(rq);             // queue (5) full
  BOOST_TEST((over.status().code() == StatusCode::kOutOfMemory));
  hs[4]->cancel();                      // a queued request cancelled before it ran
  hs[0]->cancel();                      // a running one
  for (size_t i = 0; i < hs.size(); ++i) {
    Reply r = collect(hs[i]);
    if (i == 0 || i == 4) BOOST_TEST((r.finish == FinishReason::kCancelled));
    else BOOST_TEST(r.tokens.size() == 100u);
  }
  wait_idle(e);
  BOOST_TEST(e.stats().requests_refused >= 1u);
}

BOOST_AUTO_TEST_CASE(background_requests_yield_to_interactive_ones) {
  // One slot: while A runs, background B then interactive C queue up; C is admitted first, and B's reply
  // equals its reply alone.
  StubModelConfig c = stub_config();
  c.step_delay_us = 1000;
  StubModel model(c);
  EngineOptions o;
  o.max_batch = 1;
  o.prefix_cache_entries = 0;
  Engine e(model, o);
  std::mt19937_64 g(verify::test_seed(17));
  GenerationRequest rq;
  rq.sampling.temperature = 0;
  rq.ignore_eos = true;
  rq.max_tokens = 30;
  GenerationRequest a = rq, b = rq, cr = rq;
  a.prompt = random_prompt(g, 20);
  b.prompt = random_prompt(g, 20);
  cr.prompt = random_prompt(g, 20);
  a.max_tokens = 300;  // A runs ≥ 300 ms, so B and C both queue behind it
  b.background = true;
  Reply const b_alone = collect(*e.submit(b));
  auto ha = *e.submit(a);
  BOOST_REQUIRE(ha->wait_admitted(std::chrono::milliseconds(2000)));
  auto hb = *e.submit(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto hc = *e.submit(cr);
  Reply const rc = collect(hc);
  BOOST_TEST(rc.tokens.size() == 30u);
  Reply const rb = collect(hb);
  BOOST_TEST(rb.tokens == b_alone.tokens);
  // One slot: whichever request was admitted first produced its first token first.
  auto first_token = [](std::shared_ptr<RequestHandle> const& h) {
    return h->submitted_ + std::chrono::duration_cast<RequestHandle::Clock::duration>(std::chrono::duration<double>(h->ttft_s()));
  };
  BOOST_TEST((first_token(hc) < first_token(hb)), "the background request was admitted before the interactive one");
  collect(ha);
  wait_idle(e);
}

BOOST_AUTO_TEST_CASE(queue_timeout_and_drain) {
  StubModelConfig c = stub_config();
  c.step_delay_us = 5000;
  StubModel model(c);
  EngineOptions o;
  o.max_batch = 1;
  o.queue_timeout_s = 0.05;
  Engine e(model, o);
  std::mt19937_64 g(verify::test_seed(14));
  GenerationRequest rq;
  rq.prompt = random_prompt(g, 10);
  rq.max_tokens = 40;
  rq.ignore_eos = true;
  auto a = *e.submit(rq);
  // a must be running before b queues: on a loaded host a itself could otherwise wait out the 50 ms.
  BOOST_REQUIRE(a->wait_admitted(std::chrono::milliseconds(5000)));
  BOOST_REQUIRE(a->admitted());
  auto b = *e.submit(rq);
  BOOST_TEST((collect(b).finish == FinishReason::kOverCapacity));  // waited > 50 ms behind a 200 ms request
  BOOST_TEST(collect(a).tokens.size() == 40u);
  e.begin_drain();
  BOOST_TEST((e.submit(rq).status().code() == StatusCode::kOutOfMemory));
  wait_idle(e);
}

BOOST_AUTO_TEST_CASE(engine_logprobs_are_log_softmax_of_the_model) {
  StubModel model(stub_config());
  Engine e(model, {});
  std::mt19937_64 g(verify::test_seed(15));
  GenerationRequest rq;
  rq.prompt = random_prompt(g, 30);
  rq.max_tokens = 6;
  rq.ignore_eos = true;
  rq.sampling.temperature = 0;
  rq.top_logprobs = 3;
  auto h = *e.submit(rq);
  std::vector<TokenEvent> ev;
  for (int i = 0; i < 200 && h->finish_reason() == FinishReason::kNone; ++i) h->wait(ev, std::chrono::milliseconds(20));
  h->wait(ev, std::chrono::milliseconds(0));
  BOOST_REQUIRE(ev.size() == 6u);
  std::vector<int32_t> hist = rq.prompt;
  std::vector<float> logits(model.info().vocab_size);
  for (auto const& x : ev) {
    model.logits_for(hist, logits.data());
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (float l : logits) sum += std::exp(l - mx);
    double lse = mx + std::log(sum);
    BOOST_TEST(std::fabs(x.logprob - (logits[x.token] - lse)) < 1e-4);
    BOOST_REQUIRE(x.top.size() == 3u);
    BOOST_TEST(x.top[0].token == x.token);  // greedy: the chosen token is the best
    BOOST_TEST(x.top[0].logprob >= x.top[1].logprob);
    BOOST_TEST(x.top[1].logprob >= x.top[2].logprob);
    hist.push_back(x.token);
  }
  wait_idle(e);
}

BOOST_AUTO_TEST_SUITE_END()

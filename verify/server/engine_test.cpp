// SPDX-License-Identifier: Apache-2.0
/// Engine invariants with the stub model: replies equal an independent token-by-token reference loop
/// (full-history logits + argmax / keyed sampling), whatever the batching, the prefill chunk budget or
/// prefix-cache hits; admission refuses what can never fit, queues what must wait; cancellation and
/// completion free every slot; the sampler is keyed and follows its transform order.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "servers/openai/engine/engine.hpp"
#include "servers/openai/engine/sampler.hpp"
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

// The reference: feed the whole history every step, take argmax (or the keyed sample).
Reply reference(StubModel const& m, std::vector<int32_t> prompt, int64_t max_tokens, SamplingParams const& sp) {
  Reply r;
  std::vector<float> logits(m.info().vocab_size);
  std::vector<int32_t> hist = prompt;
  for (int64_t k = 0; k < max_tokens; ++k) {
    m.logits_for(hist, logits.data());
    int32_t t;
    if (sp.temperature == 0) t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    else t = sample_token(logits, sp, k, std::span<int32_t const>(hist.data() + prompt.size(), hist.size() - prompt.size()), nullptr);
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
  auto b = *e.submit(rq);
  BOOST_TEST((collect(b).finish == FinishReason::kOverCapacity));  // waited > 50 ms behind a 200 ms request
  BOOST_TEST(collect(a).tokens.size() == 40u);
  e.begin_drain();
  BOOST_TEST((e.submit(rq).status().code() == StatusCode::kOutOfMemory));
  wait_idle(e);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(sampler)

BOOST_AUTO_TEST_CASE(greedy_and_keyed) {
  auto base = verify::randn(500, verify::test_seed(21));
  SamplingParams p;
  p.temperature = 0;
  auto l = base;
  int32_t am = static_cast<int32_t>(std::max_element(base.begin(), base.end()) - base.begin());
  BOOST_TEST(sample_token(l, p, 0, {}, nullptr) == am);
  p.temperature = 1;
  p.top_k = 1;
  l = base;
  BOOST_TEST(sample_token(l, p, 3, {}, nullptr) == am);
  p.top_k = 0;
  p.seed = 99;
  for (int64_t pos = 0; pos < 20; ++pos) {
    auto l1 = base, l2 = base;
    BOOST_TEST(sample_token(l1, p, pos, {}, nullptr) == sample_token(l2, p, pos, {}, nullptr));
  }
  std::vector<uint8_t> allowed(500, 0);
  allowed[7] = allowed[300] = 1;
  for (int64_t pos = 0; pos < 20; ++pos) {
    l = base;
    int32_t t = sample_token(l, p, pos, {}, &allowed);
    BOOST_TEST((t == 7 || t == 300));
  }
}

BOOST_AUTO_TEST_CASE(frequencies_follow_softmax) {
  // Three tokens with probabilities 0.5 / 0.3 / 0.2; 4000 keyed draws; each frequency within 4σ.
  std::vector<float> base = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p;
  p.seed = verify::test_seed(22);
  int counts[3] = {0, 0, 0};
  int const n = 4000;
  for (int64_t pos = 0; pos < n; ++pos) { auto l = base; ++counts[sample_token(l, p, pos, {}, nullptr)]; }
  double const want[3] = {0.5, 0.3, 0.2};
  for (int i = 0; i < 3; ++i) {
    double sigma = std::sqrt(want[i] * (1 - want[i]) / n);
    BOOST_TEST(std::fabs(counts[i] / double(n) - want[i]) < 4 * sigma, "token " << i << ": " << counts[i]);
  }
  // top_p 0.6 keeps tokens 0 and 1 only (0.5 < 0.6 ≤ 0.8); min_p 0.7 keeps token 0 only.
  p.top_p = 0.6f;
  for (int64_t pos = 0; pos < 200; ++pos) { auto l = base; BOOST_TEST(sample_token(l, p, pos, {}, nullptr) != 2); }
  p.top_p = 1;
  p.min_p = 0.7f;
  for (int64_t pos = 0; pos < 200; ++pos) { auto l = base; BOOST_TEST(sample_token(l, p, pos, {}, nullptr) == 0); }
}

BOOST_AUTO_TEST_CASE(logprobs_are_log_softmax) {
  std::vector<float> l = {1.0f, 2.0f, 3.0f, 3.0f};
  float lp;
  std::vector<TopLogprob> top;
  token_logprobs(l, 1, 3, lp, top);
  double lse = std::log(std::exp(1.0) + std::exp(2.0) + 2 * std::exp(3.0));
  BOOST_TEST(std::fabs(lp - (2.0 - lse)) < 1e-6);
  BOOST_REQUIRE(top.size() == 3u);
  BOOST_TEST(top[0].token == 2);  // ties: lower id first
  BOOST_TEST(top[1].token == 3);
  BOOST_TEST(top[2].token == 1);
}

BOOST_AUTO_TEST_SUITE_END()

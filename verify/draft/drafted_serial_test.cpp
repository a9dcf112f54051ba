// SPDX-License-Identifier: Apache-2.0
/// drafted == serial on the tiny golden model (design/ARCHITECTURE.md §13.3): for 104 prompts, greedy and
/// keyed T > 0 (with top-p/top-k and penalties on some), the Generator without drafts, with the lookup
/// drafter at a fixed depth, and in turn with the adaptive depth rule or a forced drafter (always right,
/// always wrong, random) emits exactly the ids of the plain serial loop; the state it leaves continues bit for bit like the
/// serial state (logits of 24 further tokens, crossing compressor groups and the window); and the
/// acceptance counters show the drafts were really verified (always right → k + 1 tokens a round,
/// always wrong → 1).
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "tessera/models/common/drafter.hpp"
#include "verify/draft/draft_fixture.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using model::DepthPolicy;
using model::DraftStats;
using model::GenerateOptions;
using model::Generator;
using verify::ForcedDrafter;

namespace {

constexpr int kPrompts = 104;
constexpr int64_t kNew = 12;

ops::SamplingRowParams sampling_for(int i, bool sampled) {
  ops::SamplingRowParams p;
  p.temperature = sampled ? 0.7f + 0.1f * float(i % 5) : 0.f;
  p.top_p = sampled && i % 3 == 0 ? 0.9f : 1.f;
  p.top_k = sampled && i % 4 == 1 ? 40 : 0;
  p.frequency_penalty = i % 7 == 2 ? 0.5f : 0.f;
  p.repetition_penalty = i % 9 == 4 ? 1.2f : 1.f;
  p.seed = 1000 + static_cast<uint64_t>(i);
  p.stream_key = static_cast<uint64_t>(i) * 7;
  return p;
}

/// Logits of `n` further tokens fed one at a time (a continuation probe of the state).
std::vector<float> probe(model::LanguageModel& m, model::SequenceState& st, int64_t n, int32_t seed_tok) {
  int64_t V = m.info().vocab_size;
  std::vector<float> out(static_cast<size_t>(n * V));
  for (int64_t i = 0; i < n; ++i) {
    int32_t t = static_cast<int32_t>((seed_tok * 31 + i * 17) % V);
    model::SequenceStep s{&st, std::span<int32_t const>(&t, 1), 1, out.data() + i * V};
    throw_if_error(m.forward({&s, 1}));
  }
  return out;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(drafted_equals_serial)

BOOST_AUTO_TEST_CASE(every_drafter_gives_the_serial_ids) {
  auto& m = verify::tiny_model("fp32");
  int64_t V = m.info().vocab_size;
  int64_t generations = 0, mismatches = 0, state_checks = 0;
  DraftStats lookup_total, right_total, wrong_total, random_total, adaptive_total;
  for (bool sampled : {false, true}) {
    for (int i = 0; i < kPrompts; ++i) {
      auto prompt = verify::corpus_prompt(i, V);
      GenerateOptions go;
      go.max_new_tokens = kNew;
      go.ignore_eos = i % 2 == 0;
      go.sampling = sampling_for(i, sampled);
      auto ref_state = m.new_sequence();
      auto want = verify::serial_decode(m, *ref_state, prompt, kNew, go.sampling, go.ignore_eos);
      bool check_state = i % 8 == 0;
      std::vector<float> ref_probe;
      if (check_state) {
        auto c = m.clone(*ref_state).value_or_throw();
        ref_probe = probe(m, *c, 24, i);
      }

      auto lookup = model::make_lookup_drafter();
      ForcedDrafter right(ForcedDrafter::Mode::kRight, want, prompt.size(), V);
      ForcedDrafter wrong(ForcedDrafter::Mode::kWrong, want, prompt.size(), V);
      ForcedDrafter random(ForcedDrafter::Mode::kRandom, want, prompt.size(), V, 99 + i);
      struct Run { model::Drafter* d; int64_t k; DraftStats* total; };
      // Every prompt: the Generator without drafts and with lookup drafts; one forced drafter in turn.
      std::vector<Run> runs = {{nullptr, 0, nullptr}, {lookup.get(), 1 + i % 5, &lookup_total}};
      Run const forced[4] = {{lookup.get(), -1, &adaptive_total},
                             {&right, 1 + (i / 4) % 5, &right_total},
                             {&wrong, 1 + (i / 4 + 2) % 5, &wrong_total},
                             {&random, 5, &random_total}};
      runs.push_back(forced[i % 4]);
      for (auto const& r : runs) {
        DepthPolicy pol;
        pol.fixed_k = r.k;
        Generator g(m, r.d, pol);
        if (r.k < 0) g.set_verify_cost({1.0, 1.2, 1.4, 1.6, 1.8, 2.0});  // a fixed table: the rule drafts
        auto st = m.new_sequence();
        DraftStats s;
        auto got = g.generate(*st, prompt, go, &s).value_or_throw();
        ++generations;
        if (got != want) {
          ++mismatches;
          BOOST_ERROR("prompt " << i << (sampled ? " T>0" : " greedy") << " drafter k=" << r.k << " differs");
        }
        if (r.total) r.total->add(s);
        if (r.d == &right && got.size() == static_cast<size_t>(kNew))
          BOOST_TEST(s.rounds == (kNew + r.k) / (r.k + 1), "always-right rounds, k=" << r.k);
        if (r.d == &wrong) BOOST_TEST(s.accepted == 0);
        if (check_state) {
          BOOST_TEST(st->length() == ref_state->length());
          BOOST_TEST(same_bits(probe(m, *st, 24, i), ref_probe), "state after drafted run, prompt " << i << " k=" << r.k);
          ++state_checks;
        }
      }
    }
  }
  BOOST_TEST_MESSAGE("drafted == serial: " << generations << " generations, " << mismatches << " mismatches, "
                     << state_checks << " state probes; lookup acceptance " << lookup_total.acceptance()
                     << " (" << lookup_total.tokens_per_round() << " tok/round), adaptive "
                     << adaptive_total.tokens_per_round() << " tok/round, random " << random_total.acceptance());
  BOOST_TEST(generations == 2 * kPrompts * 3);
  BOOST_TEST(mismatches == 0);
  // The drafts were really verified and partly kept.
  BOOST_TEST(right_total.accepted == right_total.drafted);
  BOOST_TEST(right_total.drafted > 0);
  BOOST_TEST(wrong_total.drafted > 0);
  BOOST_TEST(random_total.accepted > 0);
  BOOST_TEST(random_total.accepted < random_total.drafted);
  BOOST_TEST(lookup_total.accepted > 0);
  BOOST_TEST(adaptive_total.drafted > 0);
}

BOOST_AUTO_TEST_CASE(bf16_model_drafted_equals_serial) {
  auto& m = verify::tiny_model("bf16");
  int64_t V = m.info().vocab_size, n = 0;
  for (int i = 0; i < 16; ++i) {
    auto prompt = verify::corpus_prompt(200 + i, V);
    GenerateOptions go;
    go.max_new_tokens = kNew;
    go.ignore_eos = true;
    go.sampling = sampling_for(i, i % 2 == 1);
    auto ref_state = m.new_sequence();
    auto want = verify::serial_decode(m, *ref_state, prompt, kNew, go.sampling, true);
    ForcedDrafter random(ForcedDrafter::Mode::kRandom, want, prompt.size(), V, 7 + i);
    DepthPolicy pol;
    pol.fixed_k = 4;
    Generator g(m, &random, pol);
    auto st = m.new_sequence();
    BOOST_TEST(g.generate(*st, prompt, go).value_or_throw() == want, "bf16 prompt " << i);
    ++n;
  }
  BOOST_TEST(n == 16);
}

BOOST_AUTO_TEST_CASE(rollback_equals_serial_state_at_every_depth) {
  // Feed a prefix, then j ∈ 1..6 rejected tokens, truncate, continue: bitwise the fresh continuation.
  auto& m = verify::tiny_model("fp32");
  int64_t V = m.info().vocab_size;
  for (int i = 0; i < 12; ++i) {
    auto prompt = verify::corpus_prompt(300 + i, V);
    auto fresh = m.new_sequence();
    std::vector<float> lg(static_cast<size_t>(7 * V));
    model::SequenceStep s0{fresh.get(), prompt, 1, lg.data()};
    BOOST_REQUIRE(m.forward({&s0, 1}).ok());
    auto want = probe(m, *m.clone(*fresh).value_or_throw(), 20, i);
    for (int64_t j = 1; j <= 6; ++j) {
      auto st = m.clone(*fresh).value_or_throw();
      std::vector<int32_t> drafts;
      for (int64_t d = 0; d < j; ++d) drafts.push_back(static_cast<int32_t>((i * 13 + d * 5) % V));
      model::SequenceStep s{st.get(), drafts, j, lg.data()};
      BOOST_REQUIRE(m.forward({&s, 1}).ok());
      BOOST_REQUIRE(m.truncate(*st, fresh->length()).ok());
      BOOST_TEST(st->memory_bytes() == fresh->memory_bytes());
      BOOST_TEST(same_bits(probe(m, *st, 20, i), want), "prompt " << i << " rollback " << j);
    }
  }
}

BOOST_AUTO_TEST_CASE(depth_rule) {
  auto& m = verify::tiny_model("fp32");
  DepthPolicy pol;
  pol.prior_acceptance = 0.9;
  Generator g(m, nullptr, pol);
  // Verify cost flat in k: with confident drafts the deepest window wins.
  g.set_verify_cost({1, 1, 1, 1, 1, 1});
  std::vector<float> conf(5, 0.9f);
  BOOST_TEST(g.choose_depth(conf, 5) == 5);
  BOOST_TEST(g.choose_depth(conf, 2) == 2);
  // Linear cost: a round of k + 1 rows costs k + 1 → no k > 0 pays (E[k] < k + 1 for p < 1).
  g.set_verify_cost({1, 2, 3, 4, 5, 6});
  BOOST_TEST(g.choose_depth(conf, 5) == 0);
  // Cost 1 + 0.1k: E = 1 + .9 + .81 + … ; the rule stops where the marginal gain < marginal cost.
  g.set_verify_cost({1, 1.1, 1.2, 1.3, 1.4, 1.5});
  std::vector<float> falling = {0.9f, 0.5f, 0.05f, 0.05f, 0.05f};
  // E: k=1 1.9/1.1=1.727, k=2 2.35/1.2=1.958, k=3 2.3725/1.3=1.825 → 2.
  BOOST_TEST(g.choose_depth(falling, 5) == 2);
  // Unknown confidence uses the running acceptance (prior 0.9 here).
  std::vector<float> unknown(5, -1.f);
  BOOST_TEST(g.choose_depth(unknown, 5) == 5);
}

BOOST_AUTO_TEST_CASE(lookup_drafter_copies_the_latest_match) {
  auto d = model::make_lookup_drafter({2, 3});
  std::vector<int32_t> c = {5, 6, 7, 8, 1, 2, 9, 5, 6, 7, 4, 5, 6, 7};
  // Suffix (5,6,7) last occurred at 7 → proposes 4 5 6 7 (copy runs into the suffix).
  auto p = d->propose(c, 4);
  BOOST_TEST((p.tokens == std::vector<int32_t>{4, 5, 6, 7}));
  BOOST_TEST(d->propose(c, 2).tokens.size() == 2u);
  std::vector<int32_t> none = {1, 2, 3, 4};
  BOOST_TEST(d->propose(none, 4).tokens.empty());
  // Falls back to the 2-gram: (3, 9) occurs once before.
  std::vector<int32_t> two = {3, 9, 11, 12, 4, 3, 9};
  BOOST_TEST((d->propose(two, 3).tokens == std::vector<int32_t>{11, 12, 4}));
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// Constrained decoding under drafts: with a JSON-schema grammar over a 512-token byte vocabulary, the
/// Generator (masks for every verify row from GrammarMatcher::fill_draft_masks, drafts cut at the first
/// token the grammar rejects, the matcher advanced only on emitted tokens) emits exactly the ids of a
/// plain serial constrained loop (fill_mask → keyed sample → accept_token; stop when nothing is allowed), greedy and T > 0, for
/// always-right, random and lookup drafters; the matcher ends in the serial matcher's state.
#include <boost/test/unit_test.hpp>

#include "tessera/models/common/drafter.hpp"
#include "tessera/models/common/grammar.hpp"
#include "verify/draft/draft_fixture.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;

namespace {

std::shared_ptr<model::GrammarVocabulary const> byte_vocab(int64_t V, std::vector<int32_t> const& eos) {
  std::vector<std::string> bytes;
  char const* pieces[] = {"{\"", "\":", "\",", "\"}", "\"a", "\"b", "12", "0", "\": \"", "x", "ab", "\\n", ", \"", "}"};
  for (int64_t i = 0; i < V; ++i)
    bytes.push_back(i < 256 ? std::string(1, static_cast<char>(i)) : std::string(pieces[i % 14]) + (i % 3 ? "" : "7"));
  return model::GrammarVocabulary::build(bytes, eos).value_or_throw();
}

std::shared_ptr<model::GrammarVocabulary const> vocab;
std::vector<int32_t> serial_constrained(model::LanguageModel& m, std::span<int32_t const> prompt, int64_t n,
                                        ops::SamplingRowParams p, model::GrammarMatcher& g) {
  int64_t V = m.info().vocab_size;
  auto st = m.new_sequence();
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<uint32_t> mask;
  std::vector<int32_t> cur(prompt.begin(), prompt.end()), out;
  ExecContext ctx;
  while (static_cast<int64_t>(out.size()) < n) {
    model::SequenceStep step{st.get(), cur, 1, logits.data()};
    throw_if_error(m.forward({&step, 1}));
    p.position = st->length();
    mask = g.mask();
    bool none = true;
    for (auto w : mask) none = none && w == 0;
    if (none) break;  // complete, and no EOS id in the vocabulary
    int32_t tok = -1;
    int64_t po[2] = {0, static_cast<int64_t>(prompt.size())}, oo[2] = {0, static_cast<int64_t>(out.size())};
    ops::SampleArgs a;
    a.logits = TensorView<float const, 2>(logits.data(), {1, V});
    a.params = TensorView<ops::SamplingRowParams const, 1>(&p, {1});
    a.mask = TensorView<uint32_t const, 2>(mask.data(), {1, static_cast<int64_t>(mask.size())});
    a.prompt_offsets = TensorView<int64_t const, 1>(po, {2});
    a.prompt_tokens = TensorView<int32_t const, 1>(prompt.data(), {static_cast<int64_t>(prompt.size())});
    a.output_offsets = TensorView<int64_t const, 1>(oo, {2});
    a.output_tokens = TensorView<int32_t const, 1>(out.data(), {static_cast<int64_t>(out.size())});
    a.tokens = TensorView<int32_t, 1>(&tok, {1});
    throw_if_error(ops::sample(ctx, {1, V, 0, ops::LogprobMode::kRaw}, a));
    BOOST_REQUIRE(g.accept_token(tok));
    out.push_back(tok);
    cur.assign(1, tok);
    if (g.is_terminated()) break;
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(grammar_constrained_drafted_equals_serial) {
  auto& m = verify::tiny_model("fp32");
  int64_t V = m.info().vocab_size;
  // The golden tiny config names no EOS; the grammar needs one to end a complete object (the last id).
  std::vector<int32_t> eos = m.info().eos_token_ids;
  if (eos.empty()) eos.push_back(static_cast<int32_t>(V - 1));
  vocab = byte_vocab(V, eos);
  auto grammar = model::Grammar::from_json_schema(
                     R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a","b"],"additionalProperties":false})",
                     vocab)
                     .value_or_throw();
  int64_t runs = 0, accepted = 0;
  for (int i = 0; i < 12; ++i) {
    auto prompt = verify::corpus_prompt(400 + i, V);
    ops::SamplingRowParams p;
    p.temperature = i % 2 ? 0.9f : 0.f;
    p.seed = 77 + static_cast<uint64_t>(i);
    model::GrammarMatcher serial_g(grammar);
    auto want = serial_constrained(m, prompt, 24, p, serial_g);
    auto lookup = model::make_lookup_drafter();
    verify::ForcedDrafter right(verify::ForcedDrafter::Mode::kRight, want, prompt.size(), V);
    verify::ForcedDrafter random(verify::ForcedDrafter::Mode::kRandom, want, prompt.size(), V, 5 + i);
    for (model::Drafter* d : {static_cast<model::Drafter*>(&right), static_cast<model::Drafter*>(&random), lookup.get()}) {
      model::GrammarMatcher g(grammar);
      model::DepthPolicy pol;
      pol.fixed_k = 4;
      model::Generator gen(m, d, pol);
      model::GenerateOptions go;
      go.max_new_tokens = 24;
      go.sampling = p;
      go.grammar = &g;
      auto st = m.new_sequence();
      model::DraftStats s;
      auto got = gen.generate(*st, prompt, go, &s).value_or_throw();
      BOOST_TEST(got == want, "prompt " << i << " drafter " << d->name());
      BOOST_TEST(g.num_steps() == serial_g.num_steps());
      BOOST_TEST(g.is_terminated() == serial_g.is_terminated());
      accepted += s.accepted;
      ++runs;
    }
  }
  BOOST_TEST(runs == 36);
  BOOST_TEST(accepted > 0);
}

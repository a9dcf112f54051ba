// SPDX-License-Identifier: Apache-2.0
/// ops::spec_verify against the sequential reference (ref/spec_verify_ref.hpp: one-row sampler calls,
/// stop at the first disagreement) on seeded random logits: greedy and keyed T > 0, with penalties and
/// grammar masks, drafts built to agree for a random prefix; plus the argument checks.
#include <boost/test/unit_test.hpp>

#include <random>

#include "tessera/ops/spec_verify.hpp"
#include "tessera/ref/spec_verify_ref.hpp"

using namespace tessera;

namespace {

struct Case {
  std::vector<float> logits;
  std::vector<uint32_t> masks;
  std::vector<int32_t> prompt, output, drafts;
  ops::SamplingRowParams p;
};

/// Runs the op; returns the emitted tokens choices[0..a].
std::vector<int32_t> run_op(Case const& c, int64_t V, int64_t* accepted = nullptr) {
  int64_t k = static_cast<int64_t>(c.drafts.size()), a = -1;
  std::vector<int32_t> choices(static_cast<size_t>(k + 1));
  ops::SpecVerifyArgs args;
  args.logits = TensorView<float const, 2>(c.logits.data(), {k + 1, V});
  args.drafts = TensorView<int32_t const, 1>(c.drafts.data(), {k});
  args.params = c.p;
  if (!c.masks.empty()) args.masks = TensorView<uint32_t const, 2>(c.masks.data(), {k + 1, (V + 31) / 32});
  args.prompt_tokens = TensorView<int32_t const, 1>(c.prompt.data(), {static_cast<int64_t>(c.prompt.size())});
  args.output_tokens = TensorView<int32_t const, 1>(c.output.data(), {static_cast<int64_t>(c.output.size())});
  args.choices = TensorView<int32_t, 1>(choices.data(), {k + 1});
  args.num_accepted = &a;
  ExecContext ctx;
  throw_if_error(ops::spec_verify(ctx, {k, V}, args));
  if (accepted) *accepted = a;
  choices.resize(static_cast<size_t>(a + 1));
  return choices;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(spec_verify)

BOOST_AUTO_TEST_CASE(matches_sequential_reference) {
  std::mt19937_64 rng(20261202);
  std::normal_distribution<float> nd(0.f, 2.f);
  int64_t const V = 77;  // not a multiple of 32: the last mask word is partial
  int counts[7] = {};
  for (int it = 0; it < 600; ++it) {
    Case c;
    int64_t k = static_cast<int64_t>(rng() % 7);
    c.logits.resize(static_cast<size_t>((k + 1) * V));
    for (auto& x : c.logits) x = nd(rng);
    c.p.temperature = it % 3 == 0 ? 0.f : 0.3f + 0.5f * float(rng() % 4);
    c.p.top_k = it % 5 == 1 ? 20 : 0;
    c.p.top_p = it % 4 == 2 ? 0.9f : 1.f;
    c.p.min_p = it % 7 == 3 ? 0.05f : 0.f;
    c.p.frequency_penalty = it % 6 == 4 ? 0.7f : 0.f;
    c.p.presence_penalty = it % 6 == 5 ? 0.4f : 0.f;
    c.p.repetition_penalty = it % 8 == 1 ? 1.3f : 1.f;
    c.p.seed = rng();
    c.p.stream_key = rng() % 1000;
    c.p.position = static_cast<int64_t>(rng() % 5000);
    for (int i = 0; i < 6; ++i) c.prompt.push_back(static_cast<int32_t>(rng() % V));
    for (int i = 0; i < int(rng() % 9); ++i) c.output.push_back(static_cast<int32_t>(rng() % V));
    if (it % 4 == 0) {
      c.masks.resize(static_cast<size_t>((k + 1) * ((V + 31) / 32)));
      for (auto& w : c.masks) w = static_cast<uint32_t>(rng()) | 1u;  // ≥ one allowed token a row
    }
    // Drafts: the sequential reference's own choices for a random prefix, then a wrong token, then noise.
    int64_t agree = static_cast<int64_t>(rng() % (k + 1));
    c.drafts.assign(static_cast<size_t>(k), 0);
    for (int64_t i = 0; i < k; ++i) c.drafts[i] = static_cast<int32_t>(rng() % V);
    for (int64_t i = 0; i < agree; ++i) {
      auto e = ref::spec_verify_sequential(c.logits, V, std::span(c.drafts).first(i), c.p, c.masks, c.prompt, c.output);
      c.drafts[i] = e.back();  // the choice at row i given drafts 0..i−1
    }
    auto want = ref::spec_verify_sequential(c.logits, V, c.drafts, c.p, c.masks, c.prompt, c.output);
    int64_t a = -1;
    auto got = run_op(c, V, &a);
    BOOST_TEST(got == want, "case " << it << " k=" << k);
    BOOST_TEST(a >= agree);
    ++counts[a];
  }
  // Every acceptance length occurred.
  for (int a = 0; a < 7; ++a) BOOST_TEST(counts[a] > 0, "acceptance length " << a);
}

BOOST_AUTO_TEST_CASE(rejects_bad_arguments) {
  int64_t const V = 40, k = 2, a0 = 0;
  std::vector<float> logits((k + 1) * V, 0.5f);
  std::vector<int32_t> drafts = {3, 41}, choices(3);
  int64_t a = a0;
  ops::SpecVerifyArgs args;
  args.logits = TensorView<float const, 2>(logits.data(), {k + 1, V});
  args.drafts = TensorView<int32_t const, 1>(drafts.data(), {k});
  args.choices = TensorView<int32_t, 1>(choices.data(), {k + 1});
  args.num_accepted = &a;
  args.params.temperature = 0.f;
  ExecContext ctx;
  Status s = ops::spec_verify(ctx, {k, V}, args);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("draft 1") != std::string::npos, s.message());
  drafts[1] = 4;
  BOOST_TEST(ops::spec_verify(ctx, {k + 1, V}, args).message().find("logits") != std::string::npos);
  args.num_accepted = nullptr;
  BOOST_TEST(!ops::spec_verify(ctx, {k, V}, args).ok());
  args.num_accepted = &a;
  BOOST_TEST(ops::spec_verify(ctx, {k, V}, args).ok());
  BOOST_TEST(a == 0);  // flat logits: greedy picks id 0, draft 0 is 3
  BOOST_TEST(choices[0] == 0);
}

BOOST_AUTO_TEST_SUITE_END()

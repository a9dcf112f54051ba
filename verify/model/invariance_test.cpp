// SPDX-License-Identifier: Apache-2.0
/// Invariance gates of design/ARCHITECTURE.md §13.3 on the tiny model, bitwise: chunked prefill (chunks
/// of 1, 7, 64 and all) equals token-by-token decode for every row's logits, in fp32 and bf16, across the
/// window boundary, inside compressor groups and across candidate blocks; batched == alone; thread count;
/// a cloned state continues exactly like the original; truncate + continue == fresh. Plus the loader's and
/// forward's error messages.
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "tessera/core/thread_pool.hpp"

#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;
using tessera::model::SequenceStep;

namespace {

std::vector<int32_t> prompt_tokens(std::string const& variant, int i, size_t max_len) {
  std::vector<int32_t> t;
  for (auto x : verify::tiny_files(variant).ints("prompt." + std::to_string(i))) t.push_back(static_cast<int32_t>(x));
  if (t.size() > max_len) t.resize(max_len);
  return t;
}

/// Logits of every token, feeding the sequence in chunks of `chunk` tokens (0 = one chunk).
std::vector<float> run_chunked(Dsv41Model& m, std::vector<int32_t> const& toks, size_t chunk) {
  int64_t V = m.spec().vocab_size;
  std::vector<float> out(toks.size() * static_cast<size_t>(V));
  auto st = m.new_sequence();
  size_t c = chunk == 0 ? toks.size() : chunk;
  for (size_t b = 0; b < toks.size(); b += c) {
    size_t e = std::min(toks.size(), b + c);
    SequenceStep step{st.get(), std::span<int32_t const>(toks.data() + b, e - b), static_cast<int64_t>(e - b),
                      out.data() + b * static_cast<size_t>(V)};
    BOOST_REQUIRE(m.forward({&step, 1}).ok());
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dsv41_invariance)

BOOST_AUTO_TEST_CASE(chunked_prefill_equals_decode_bitwise) {
  for (std::string v : {"fp32", "bf16"}) {
    auto& m = verify::tiny_model(v);
    auto toks = prompt_tokens(v, 6, 90);  // > W = 16, many r = 2 groups, > 3 candidate blocks
    auto ref = run_chunked(m, toks, 1);   // token-by-token decode
    for (size_t chunk : {size_t{7}, size_t{64}, size_t{0}}) {
      auto got = run_chunked(m, toks, chunk);
      BOOST_TEST((std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0), v << " chunk " << chunk);
    }
  }
}

BOOST_AUTO_TEST_CASE(batched_equals_alone_bitwise) {
  auto& m = verify::tiny_model("fp32");
  int64_t V = m.spec().vocab_size;
  std::vector<std::vector<int32_t>> seqs = {prompt_tokens("fp32", 5, 40), prompt_tokens("fp32", 7, 23), prompt_tokens("fp32", 3, 16)};
  std::vector<std::vector<float>> alone;
  for (auto const& s : seqs) alone.push_back(run_chunked(m, s, 0));
  std::vector<std::unique_ptr<model::SequenceState>> states;
  std::vector<std::vector<float>> out;
  std::vector<SequenceStep> batch;
  for (auto const& s : seqs) {
    states.push_back(m.new_sequence());
    out.emplace_back(s.size() * static_cast<size_t>(V));
  }
  for (size_t i = 0; i < seqs.size(); ++i)
    batch.push_back({states[i].get(), seqs[i], static_cast<int64_t>(seqs[i].size()), out[i].data()});
  BOOST_REQUIRE(m.forward(batch).ok());
  for (size_t i = 0; i < seqs.size(); ++i)
    BOOST_TEST((std::memcmp(out[i].data(), alone[i].data(), alone[i].size() * sizeof(float)) == 0), "sequence " << i);
}

BOOST_AUTO_TEST_CASE(thread_count_does_not_change_a_bit) {
  // One thread vs three: every element is one fixed-order computation whatever task computes it.
  ThreadPool one(1), three(3);
  std::vector<std::vector<float>> out;
  for (ThreadPool* p : {&one, &three}) {
    ModelOptions o;
    o.numerics = Numerics::kBf16;
    o.pool = p;
    auto m = load_model(verify::tiny_dir("bf16"), o).value_or_throw();
    out.push_back(run_chunked(*m, prompt_tokens("bf16", 6, 70), 0));
  }
  BOOST_TEST((std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) == 0));
}

BOOST_AUTO_TEST_CASE(clone_continues_identically) {
  auto& m = verify::tiny_model("bf16");
  auto toks = prompt_tokens("bf16", 7, 41);
  auto st = m.new_sequence();
  std::vector<float> lg(512), la(512), lb(512);
  SequenceStep s1{st.get(), std::span<int32_t const>(toks.data(), 33), 1, lg.data()};
  BOOST_REQUIRE(m.forward({&s1, 1}).ok());
  auto copy = m.clone(*st).value_or_throw();
  SequenceStep a{st.get(), std::span<int32_t const>(toks.data() + 33, 8), 1, la.data()};
  SequenceStep b{copy.get(), std::span<int32_t const>(toks.data() + 33, 8), 1, lb.data()};
  BOOST_REQUIRE(m.forward({&a, 1}).ok());
  BOOST_REQUIRE(m.forward({&b, 1}).ok());
  BOOST_TEST(la == lb);
  BOOST_TEST(st->length() == 41);
}

// Rolling back and continuing equals never having gone further: truncate to lengths inside and at the
// end of compressor groups (ratio 2), across the window edge, then re-feed and compare every logit.
BOOST_AUTO_TEST_CASE(truncate_then_continue_equals_fresh_bitwise) {
  for (std::string v : {"fp32", "bf16"}) {
    auto& m = verify::tiny_model(v);
    auto toks = prompt_tokens(v, 7, 80);
    auto fresh = run_chunked(m, toks, 0);
    for (int64_t cut : {79, 70, 61, 40, 17}) {
      auto st = m.new_sequence();
      std::vector<int32_t> detour = toks;
      for (size_t i = static_cast<size_t>(cut); i < detour.size(); ++i) detour[i] = (detour[i] * 7 + 3) % 512;  // a rejected draft
      std::vector<float> scratch(80 * 512), lg((80 - cut) * 512);
      SequenceStep a{st.get(), detour, 80, scratch.data()};
      BOOST_REQUIRE(m.forward({&a, 1}).ok());
      BOOST_REQUIRE(m.truncate(*st, cut).ok());
      BOOST_TEST(st->length() == cut);
      SequenceStep b{st.get(), std::span<int32_t const>(toks.data() + cut, 80 - static_cast<size_t>(cut)), 80 - cut, lg.data()};
      BOOST_REQUIRE(m.forward({&b, 1}).ok());
      BOOST_TEST((std::memcmp(lg.data(), fresh.data() + cut * 512, lg.size() * sizeof(float)) == 0), v << " cut " << cut);
    }
    auto st = m.new_sequence();
    std::vector<float> lg(512);
    SequenceStep a{st.get(), toks, 1, lg.data()};
    BOOST_REQUIRE(m.forward({&a, 1}).ok());
    BOOST_TEST((m.truncate(*st, 5).code() == StatusCode::kNotSupported));  // 75 back > max_rollback 64
    BOOST_TEST((m.truncate(*st, 81).code() == StatusCode::kInvalidArgument));
  }
}

BOOST_AUTO_TEST_CASE(bad_input_errors_name_the_problem) {
  auto& m = verify::tiny_model("fp32");
  auto st = m.new_sequence();
  std::vector<int32_t> bad = {3, 512};
  std::vector<float> lg(512);
  SequenceStep s{st.get(), bad, 1, lg.data()};
  auto r = m.forward({&s, 1});
  BOOST_TEST(!r.ok());
  BOOST_TEST(r.message().find("512") != std::string::npos);
  BOOST_TEST(st->length() == 0);
  // A spec whose tensors are misshapen or missing: the error names the tensor.
  auto spec = tiny_golden_spec();
  spec.q_lora_rank = 48;
  auto e1 = Dsv41Model::create(spec, verify::tiny_weights("fp32"), {});
  BOOST_TEST(!e1.ok());
  BOOST_TEST(e1.status().message().find("model.layers.0.attn.wq_a.weight") != std::string::npos, e1.status().message());
  BOOST_TEST(e1.status().message().find("[32, 64]") != std::string::npos);
  spec = tiny_golden_spec();
  spec.num_layers = 8;
  spec.compress_ratios.push_back(1);
  auto e2 = Dsv41Model::create(spec, verify::tiny_weights("fp32"), {});
  BOOST_TEST(!e2.ok());
  BOOST_TEST(e2.status().message().find("model.layers.7.hc_attn_fn") != std::string::npos, e2.status().message());
}

// A batch whose steps would take a state past max_position_embeddings is refused before any step runs: no
// state of it advances, including the steps before the one that would pass the limit, and a state named twice
// counts both steps' tokens.
BOOST_AUTO_TEST_CASE(batch_refused_for_length_advances_no_state) {
  auto& m = verify::tiny_model("fp32");
  int64_t const P = m.spec().max_position_embeddings, V = m.info().vocab_size;
  std::vector<float> lg(static_cast<size_t>(V));
  std::vector<int32_t> head(static_cast<size_t>(P - 3)), five = {5, 6, 7, 8, 9}, two = {5, 6};
  for (size_t i = 0; i < head.size(); ++i) head[i] = static_cast<int32_t>((7 * i + 3) % static_cast<size_t>(V));
  auto full = m.new_sequence();
  SequenceStep f{full.get(), head, 1, lg.data()};
  throw_if_error(m.forward({&f, 1}));
  auto fresh = m.new_sequence();
  std::vector<SequenceStep> bad = {{fresh.get(), five, 1, lg.data()}, {full.get(), five, 1, lg.data()}};
  Status const s1 = m.forward(bad);
  BOOST_TEST(!s1.ok());
  BOOST_TEST(s1.message().find("max_position_embeddings") != std::string::npos, s1.message());
  BOOST_TEST(fresh->length() == 0);
  BOOST_TEST(full->length() == P - 3);
  std::vector<SequenceStep> twice = {{full.get(), two, 1, lg.data()}, {full.get(), two, 1, lg.data()}};
  Status const s2 = m.forward(twice);  // 2 + 2 tokens past P − 3: refused though each step alone fits
  BOOST_TEST(!s2.ok());
  BOOST_TEST(full->length() == P - 3);
  std::vector<SequenceStep> fits = {{full.get(), two, 1, lg.data()}, {full.get(), {five.data(), 1}, 1, lg.data()}};
  throw_if_error(m.forward(fits));  // exactly P
  BOOST_TEST(full->length() == P);
}

BOOST_AUTO_TEST_SUITE_END()

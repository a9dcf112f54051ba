// SPDX-License-Identifier: Apache-2.0
/// DSpark (spec/deepseek-v41.md §2.8, unverified against an inference reference: these tests check the
/// implementation against the spec's own formulation, not against another engine).
///  * the target-feature hook: every recorded row equals the mean over the hc streams of the golden-named
///    debug tap of the target layer's attention input, bit for bit, whatever the chunking; rollback
///    leaves the features of a fresh state of the same length;
///  * the block pass in one pass equals the position-by-position formulation (every row-wise op on one
///    row at a time) bit for bit;
///  * Markov chaining and the confidence head against a plain double-precision recomputation;
///  * loader errors name the tensor or field;
///  * drafted == serial with DSpark drafts (greedy and keyed T > 0, fixed depths and the depth rule), with
///    the final state continuing bit for bit like the serial one.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <cstring>

#include "tessera/models/common/drafter.hpp"
#include "verify/draft/draft_fixture.hpp"
#include "verify/draft/dspark_fixture.hpp"

using namespace tessera;
using model::dsv41::Dsv41Model;
using model::dsv41::Dsv41State;
using model::dsv41::DsparkPass;

namespace {

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Dsv41State& as_state(model::SequenceState& s) { return dynamic_cast<Dsv41State&>(s); }

void feed(Dsv41Model& m, model::SequenceState& st, std::span<int32_t const> toks, int64_t chunk) {
  for (size_t i = 0; i < toks.size(); i += static_cast<size_t>(chunk)) {
    size_t n = std::min(toks.size() - i, static_cast<size_t>(chunk));
    throw_if_error(m.forward_one(as_state(st), toks.subspan(i, n), 0, nullptr));
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dspark)

BOOST_AUTO_TEST_CASE(target_features_are_the_stream_mean_of_the_attention_input) {
  Dsv41Model& m = verify::dspark_tiny_model();
  auto const& sp = m.spec();
  BOOST_REQUIRE(m.has_dspark());
  int64_t const D = sp.hidden_size, n = sp.hc_mult, T = static_cast<int64_t>(sp.dspark.target_layers.size());
  // The attention input of layer t: the streams after t's Engram write, else after layer t − 1.
  std::map<std::string, std::vector<float>> seen;
  m.set_debug_tap([&](std::string const& name, std::vector<int64_t> const&, std::span<float const> v) {
    seen[name].assign(v.begin(), v.end());
  });
  auto prompt = verify::corpus_prompt(3, sp.vocab_size);
  prompt.resize(std::min<size_t>(prompt.size(), 20));
  auto st = m.new_sequence();
  feed(m, *st, prompt, static_cast<int64_t>(prompt.size()));
  m.set_debug_tap({});
  int64_t const S = static_cast<int64_t>(prompt.size());
  Dsv41State const& ds = as_state(*st);
  BOOST_REQUIRE_EQUAL(ds.dspark_tap_first(), 0);
  BOOST_REQUIRE_EQUAL(static_cast<int64_t>(ds.dspark_taps().size()), S * T * D);
  int64_t mismatches = 0;
  for (int64_t j = 0; j < T; ++j) {
    int64_t t = sp.dspark.target_layers[j];
    std::string key = sp.engram_index(t) >= 0 ? "model.layers." + std::to_string(t) + ".engram.out0"
                                              : "model.layers." + std::to_string(t - 1) + ".out0";
    BOOST_REQUIRE_MESSAGE(seen.count(key), "no debug tap " << key);
    auto const& X = seen[key];
    for (int64_t r = 0; r < S; ++r)
      for (int64_t c = 0; c < D; ++c) {
        float sum = 0.f;
        for (int64_t k = 0; k < n; ++k) sum += X[(r * n + k) * D + c];
        mismatches += ds.dspark_taps()[(r * T + j) * D + c] != sum / float(n);
      }
  }
  BOOST_TEST(mismatches == 0);
  // Chunking does not change the features; rollback gives the fresh state's features.
  auto st2 = m.new_sequence();
  feed(m, *st2, prompt, 3);
  BOOST_TEST(same_bits(ds.dspark_taps(), as_state(*st2).dspark_taps()));
  std::vector<int32_t> extra = {5, 6, 7, 8};
  feed(m, *st2, extra, 4);
  throw_if_error(m.truncate(*st2, S));
  BOOST_TEST(same_bits(ds.dspark_taps(), as_state(*st2).dspark_taps()));
  BOOST_TEST(st->memory_bytes() == st2->memory_bytes());
}

BOOST_AUTO_TEST_CASE(block_pass_equals_position_by_position) {
  Dsv41Model& m = verify::dspark_tiny_model();
  int checked = 0;
  for (int i = 0; i < 6; ++i) {
    auto prompt = verify::corpus_prompt(i, m.info().vocab_size);
    if (i == 5) prompt.resize(1);  // a single context position
    auto st = m.new_sequence();
    feed(m, *st, std::span<int32_t const>(prompt).first(prompt.size() - 1 + (i == 5)), 7);
    if (st->length() == 0) continue;
    int32_t anchor = prompt.back();
    DsparkPass one = m.dspark_draft(as_state(*st), anchor, 0).value_or_throw();
    for (int64_t step : {1, 2}) {
      DsparkPass rows = m.dspark_draft(as_state(*st), anchor, step).value_or_throw();
      BOOST_TEST(same_bits(one.base_logits, rows.base_logits));
      BOOST_TEST(same_bits(one.hidden, rows.hidden));
      BOOST_TEST(same_bits(one.confidence, rows.confidence));
      BOOST_TEST((one.tokens == rows.tokens));
    }
    BOOST_TEST(one.tokens.size() == 5u);
    BOOST_TEST(one.anchor_position == st->length());
    ++checked;
  }
  BOOST_TEST(checked == 6);
  // Cost of one pass (5 rows, 3 blocks) after a 40-token context, against a 1-row target forward.
  auto prompt = verify::corpus_prompt(1, m.info().vocab_size);
  auto st = m.new_sequence();
  feed(m, *st, prompt, 64);
  double pass = 1e9, fwd = 1e9;
  std::vector<float> lg(static_cast<size_t>(m.info().vocab_size));
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    (void)m.dspark_draft(as_state(*st), 7).value_or_throw();
    auto t1 = std::chrono::steady_clock::now();
    int32_t t = 7;
    throw_if_error(m.forward_one(as_state(*st), std::span<int32_t const>(&t, 1), 1, lg.data()));
    auto t2 = std::chrono::steady_clock::now();
    throw_if_error(m.truncate(*st, st->length() - 1));
    pass = std::min(pass, std::chrono::duration<double>(t1 - t0).count());
    fwd = std::min(fwd, std::chrono::duration<double>(t2 - t1).count());
  }
  BOOST_TEST_MESSAGE("DSpark pass " << pass * 1e6 << " us, 1-row target forward " << fwd * 1e6 << " us (min of 5)");
}

BOOST_AUTO_TEST_CASE(markov_chaining_and_confidence_head) {
  Dsv41Model& m = verify::dspark_tiny_model();
  auto const& w = *m.dspark_weights();
  int64_t const V = m.info().vocab_size, D = m.spec().hidden_size, r = m.spec().dspark.markov_rank;
  int64_t chained_differs = 0, rows = 0;
  for (int i = 0; i < 8; ++i) {
    auto prompt = verify::corpus_prompt(10 + i, V);
    auto st = m.new_sequence();
    feed(m, *st, std::span<int32_t const>(prompt).first(prompt.size() - 1), 64);
    DsparkPass p = m.dspark_draft(as_state(*st), prompt.back()).value_or_throw();
    int32_t prev = prompt.back();
    for (int64_t j = 0; j < 5; ++j, ++rows) {
      // m_j = markov_embed[prev_j] exactly.
      std::vector<float> mj(w.markov_embed.data_as<float>() + prev * r, w.markov_embed.data_as<float>() + (prev + 1) * r);
      BOOST_TEST(same_bits(mj, std::vector<float>(p.markov.begin() + j * r, p.markov.begin() + (j + 1) * r)));
      // d_j = argmax(base_j + head · m_j), recomputed in double; the chosen value is within fp32 noise of the max.
      std::vector<double> z(V);
      double best = -1e300;
      for (int64_t v = 0; v < V; ++v) {
        double b = 0;
        for (int64_t k = 0; k < r; ++k) b += double(w.markov_head.data_as<float>()[v * r + k]) * mj[k];
        z[v] = p.base_logits[j * V + v] + b;
        best = std::max(best, z[v]);
      }
      BOOST_TEST(z[p.tokens[j]] >= best - 1e-5);
      // Without the Markov term the choice would be argmax(base_j): count where chaining changes it.
      int64_t base_arg = std::max_element(p.base_logits.begin() + j * V, p.base_logits.begin() + (j + 1) * V) -
                         (p.base_logits.begin() + j * V);
      chained_differs += base_arg != p.tokens[j];
      // confidence_j = σ(proj · [h_j ; m_j]) in (0, 1).
      double logit = 0;
      for (int64_t k = 0; k < D; ++k) logit += double(w.confidence.data_as<float>()[k]) * p.hidden[j * D + k];
      for (int64_t k = 0; k < r; ++k) logit += double(w.confidence.data_as<float>()[D + k]) * mj[k];
      BOOST_TEST(std::abs(double(p.acceptance_logit[j]) - logit) <= 1e-5 * (1 + std::abs(logit)));
      BOOST_TEST(std::abs(double(p.confidence[j]) - 1 / (1 + std::exp(-logit))) <= 1e-6);
      BOOST_TEST((p.confidence[j] > 0.f && p.confidence[j] < 1.f));
      prev = p.tokens[j];
    }
  }
  BOOST_TEST_MESSAGE("DSpark rows " << rows << ", Markov term changed the argmax on " << chained_differs);
}

BOOST_AUTO_TEST_CASE(loader_errors_name_the_tensor) {
  using model::dsv41::ModelOptions;
  auto create = [](verify::OverlaySource const& src, model::dsv41::ModelSpec s = verify::tiny_mtp_spec()) {
    return Dsv41Model::create(std::move(s), src, ModelOptions{});
  };
  {
    auto src = verify::tiny_mtp_source("fp32");
    src->remove("mtp.1.attn.wkv.weight");
    auto r = create(*src);
    BOOST_REQUIRE(!r.ok());
    BOOST_TEST(r.status().message().find("mtp.1.attn.wkv.weight") != std::string::npos);
    BOOST_TEST_MESSAGE(r.status().message());
  }
  {
    auto src = verify::tiny_mtp_source("fp32");
    src->put("mtp.2.confidence_head.weight", Tensor::zeros(DType::kF32, {1, 64 + 255}));
    auto r = create(*src);
    BOOST_REQUIRE(!r.ok());
    BOOST_TEST(r.status().message().find("mtp.2.confidence_head.weight") != std::string::npos);
    BOOST_TEST(r.status().message().find("shape") != std::string::npos);
  }
  {
    auto src = verify::tiny_mtp_source("fp32");
    src->put("mtp.0.main_proj.weight", Tensor::zeros(DType::kF32, {64, 128}));
    auto r = create(*src);
    BOOST_REQUIRE(!r.ok());
    BOOST_TEST(r.status().message().find("mtp.0.main_proj.weight") != std::string::npos);
  }
  {
    auto src = verify::tiny_mtp_source("fp32");
    auto s = verify::tiny_mtp_spec();
    s.dspark.noise_token = 512;
    auto r = create(*src, s);
    BOOST_REQUIRE(!r.ok());
    BOOST_TEST(r.status().message().find("dspark_noise_token_id") != std::string::npos);
  }
  {
    // The vllm-ascend name of the confidence head is accepted.
    auto src = verify::tiny_mtp_source("fp32");
    Tensor t = src->load_f32("mtp.2.confidence_head.weight").value_or_throw();
    src->remove("mtp.2.confidence_head.weight");
    src->put("mtp.2.confidence_head.proj.weight", std::move(t));
    auto r = create(*src);
    BOOST_REQUIRE(r.ok());
    BOOST_TEST((*r)->has_dspark());
  }
  // A checkpoint without mtp.* loads the text model without a drafter.
  auto plain = Dsv41Model::create(verify::tiny_mtp_spec(), verify::tiny_weights("fp32"), ModelOptions{}).value_or_throw();
  BOOST_TEST(!plain->has_dspark());
  auto st = plain->new_sequence();
  int32_t t = 3;
  feed(*plain, *st, std::span<int32_t const>(&t, 1), 1);
  BOOST_TEST((plain->dspark_draft(as_state(*st), 4).status().code() == StatusCode::kNotSupported));
  BOOST_TEST(as_state(*st).dspark_taps().empty());
}

BOOST_AUTO_TEST_CASE(dspark_drafted_equals_serial) {
  Dsv41Model& m = verify::dspark_tiny_model();
  int64_t const V = m.info().vocab_size, kNew = 14;
  model::DraftStats total;
  int generations = 0, probes = 0;
  for (int i = 0; i < 24; ++i) {
    auto prompt = verify::corpus_prompt(i, V);
    for (bool sampled : {false, true}) {
      ops::SamplingRowParams p;
      p.temperature = sampled ? 0.8f : 0.f;
      p.top_p = sampled && i % 3 == 0 ? 0.9f : 1.f;
      p.seed = 77 + static_cast<uint64_t>(i);
      auto ref_state = m.new_sequence();
      auto ref = verify::serial_decode(m, *ref_state, prompt, kNew, p, true);
      for (int64_t k : {5, 2, -1}) {
        auto st = m.new_sequence();
        auto drafter = model::dsv41::make_dspark_drafter(m, as_state(*st));
        model::DepthPolicy pol;
        pol.fixed_k = k;
        model::Generator gen(m, drafter.get(), pol);
        model::GenerateOptions go;
        go.max_new_tokens = kNew;
        go.ignore_eos = true;
        go.sampling = p;
        model::DraftStats ds;
        auto out = gen.generate(*st, prompt, go, &ds).value_or_throw();
        BOOST_TEST((out == ref), "prompt " << i << (sampled ? " T>0" : " greedy") << " k " << k);
        if (k > 0) {
          BOOST_TEST(ds.drafted > 0);
          total.add(ds);
        }
        ++generations;
        if (k == 5 && i % 4 == 0) {
          // The drafted state continues like the serial one, bit for bit (features included).
          BOOST_TEST(same_bits(as_state(*st).dspark_taps(), as_state(*ref_state).dspark_taps()));
          BOOST_TEST(st->length() == ref_state->length());
          ++probes;
        }
      }
    }
  }
  BOOST_TEST(generations == 144);
  BOOST_TEST_MESSAGE("DSpark on the tiny model (random mtp weights): " << generations << " generations, rounds "
                     << total.rounds << " drafted " << total.drafted << " accepted " << total.accepted
                     << " acceptance " << total.acceptance() << " tokens/round " << total.tokens_per_round()
                     << ", state probes " << probes);
}

BOOST_AUTO_TEST_CASE(bf16_model_dspark_drafted_equals_serial) {
  Dsv41Model& m = verify::dspark_tiny_model("bf16");
  BOOST_REQUIRE(m.has_dspark());
  for (int i = 0; i < 6; ++i) {
    auto prompt = verify::corpus_prompt(40 + i, m.info().vocab_size);
    ops::SamplingRowParams p;
    p.temperature = i % 2 ? 0.9f : 0.f;
    p.seed = 3 + static_cast<uint64_t>(i);
    auto ref_state = m.new_sequence();
    auto ref = verify::serial_decode(m, *ref_state, prompt, 10, p, true);
    auto st = m.new_sequence();
    auto drafter = model::dsv41::make_dspark_drafter(m, as_state(*st));
    model::DepthPolicy pol;
    pol.fixed_k = 5;
    model::Generator gen(m, drafter.get(), pol);
    model::GenerateOptions go;
    go.max_new_tokens = 10;
    go.ignore_eos = true;
    go.sampling = p;
    model::DraftStats ds;
    BOOST_TEST((gen.generate(*st, prompt, go, &ds).value_or_throw() == ref), "bf16 prompt " << i);
    BOOST_TEST(ds.drafted > 0);
  }
}

BOOST_AUTO_TEST_CASE(synthetic_plan_has_the_spec_shapes) {
  // make-synthetic --mtp: spec §2.8 shapes for the tiny configuration (D 64, V 512, r 256, |T| 3, E 128).
  auto c = verify::tiny_mtp_config();
  BOOST_TEST(c.num_nextn_predict_layers == 3);
  BOOST_TEST(c.compress_ratios.size() == 10u);
  std::map<std::string, model::dsv41::TensorSpec> plan;
  for (auto const& t : model::dsv41::checkpoint_plan(c)) plan[t.name] = t;
  using V = std::vector<int64_t>;
  BOOST_TEST((plan.at("mtp.0.main_proj.weight").shape == V{64, 192}));
  BOOST_TEST((plan.at("mtp.0.main_norm.weight").shape == V{64}));
  BOOST_TEST((plan.at("mtp.2.markov_head.embed.weight").shape == V{512, 256}));
  BOOST_TEST((plan.at("mtp.2.markov_head.head.weight").shape == V{512, 256}));
  BOOST_TEST((plan.at("mtp.2.confidence_head.weight").shape == V{1, 64 + 256}));
  BOOST_TEST(plan.at("mtp.2.confidence_head.weight").fp32_island);
  BOOST_TEST((plan.at("mtp.1.ffn.gate.weight").shape == V{128, 64}));
  BOOST_TEST(plan.count("mtp.1.ffn.experts.127.w2.weight") == 1u);
  BOOST_TEST(plan.count("mtp.1.ffn.experts.128.w2.weight") == 0u);
  BOOST_TEST(plan.count("mtp.1.main_proj.weight") == 0u);
  BOOST_TEST(plan.count("mtp.0.norm.weight") == 0u);
  BOOST_TEST(plan.count("mtp.1.attn.compressor.wkv.weight") == 0u);  // window-only attention
  int64_t mtp = 0;
  for (auto const& [n, t] : plan) mtp += n.rfind("mtp.", 0) == 0;
  BOOST_TEST(mtp == 3 * (6 + 10 + 2 + 3 * 128 + 3) + 2 + 4);
  // Without --mtp nothing changes; a noise token outside the vocabulary is refused.
  auto plain = model::dsv41::tiny_config(512);
  for (auto const& t : model::dsv41::checkpoint_plan(plain)) BOOST_TEST(t.name.rfind("mtp.", 0) != 0);
  auto small = model::dsv41::tiny_config(512);
  small.dspark_noise_token_id = 600;
  auto st = model::dsv41::enable_mtp(small, 3);
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.message().find("dspark_noise_token_id") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// Model level, first layers of design/ARCHITECTURE.md §13.2: static state bitwise against the golden
/// (`static.rope.*`, `static.engram.*`, `hash_ids.i` of every prompt), then the prompt-4 per-module dumps.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <map>

#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;
using tessera::model::SequenceStep;

BOOST_AUTO_TEST_SUITE(dsv41_static)

BOOST_AUTO_TEST_CASE(spec_from_golden_config_is_the_tiny_spec) {
  for (std::string v : {"fp32", "bf16"}) {
    auto cfg = load_config(verify::tiny_dir(v)).value_or_throw();
    ModelSpec a = spec_from_config(cfg).value_or_throw(), b = tiny_golden_spec();
    BOOST_TEST(a.vocab_size == b.vocab_size);
    BOOST_TEST(a.hidden_size == b.hidden_size);
    BOOST_TEST(a.num_layers == b.num_layers);
    BOOST_TEST(a.compress_ratios == b.compress_ratios);
    BOOST_TEST(a.kv_source_layers == b.kv_source_layers);
    BOOST_TEST(a.index_source_layers == b.index_source_layers);
    BOOST_TEST(a.candidate_source_layer == b.candidate_source_layer);
    BOOST_TEST((a.candidate_topk_blocks == b.candidate_topk_blocks && a.candidate_block_size == b.candidate_block_size));
    BOOST_TEST((a.index_n_heads == b.index_n_heads && a.index_head_dim == b.index_head_dim && a.index_topk == b.index_topk));
    BOOST_TEST((a.o_groups == b.o_groups && a.o_lora_rank == b.o_lora_rank && a.q_lora_rank == b.q_lora_rank));
    BOOST_TEST((a.rope_dim == b.rope_dim && a.sliding_window == b.sliding_window));
    BOOST_TEST((a.swiglu_limit == b.swiglu_limit && a.routed_scale == b.routed_scale && a.top_k == b.top_k));
    BOOST_TEST((a.engram_layers == b.engram_layers && a.engram_num_embeddings == b.engram_num_embeddings));
    BOOST_TEST((a.yarn == b.yarn && a.yarn_factor == b.yarn_factor && a.yarn_original_max_pos == b.yarn_original_max_pos));
    BOOST_TEST((a.rope_theta == b.rope_theta && a.compress_rope_theta == b.compress_rope_theta));
    BOOST_TEST((a.hc_sinkhorn_iters == b.hc_sinkhorn_iters && a.rms_eps == b.rms_eps && a.hc_eps == b.hc_eps));
  }
}

BOOST_AUTO_TEST_CASE(rope_tables_bitwise) {
  for (std::string v : {"fp32", "bf16"}) {
    auto& m = verify::tiny_model(v);
    auto const& f = verify::tiny_files(v);
    BOOST_TEST(f.floats("static.rope.main_inv_freq") == m.main_inv_freq());
    BOOST_TEST(f.floats("static.rope.compress_inv_freq") == m.compress_inv_freq());
  }
}

BOOST_AUTO_TEST_CASE(engram_tables_bitwise) {
  auto& m = verify::tiny_model("fp32");
  auto const& f = verify::tiny_files("fp32");
  EngramTables computed = engram_layout(tiny_golden_spec());
  BOOST_TEST(computed.primes == f.ints("static.engram.primes"));    // computed, not read
  BOOST_TEST(computed.offsets == f.ints("static.engram.offsets"));
  BOOST_TEST(m.engram().multipliers == f.ints("static.engram.multipliers"));
  BOOST_TEST(m.engram().token_map == f.ints("static.engram.token_map"));
  BOOST_TEST(m.engram().pad_c == f.ints("static.engram.pad_id")[0]);
  BOOST_TEST(m.engram().pad_c == 1);  // spec §6: map[2] = 1
  // Appendix A multipliers of the tiny layers 1 and 5.
  std::vector<int64_t> appendix = {29662608052400909, 1873410163432121, 13919202536988139, 28638879857136817,
                                   14090283695042227, 11980416300147269, 7883456125943357, 25510975156890769};
  BOOST_TEST(m.engram().multipliers == appendix);
}

BOOST_AUTO_TEST_CASE(hash_ids_bitwise_every_prompt) {
  auto& m = verify::tiny_model("fp32");
  auto const& f = verify::tiny_files("fp32");
  for (int i = 0; i < 8; ++i) {
    std::string s = std::to_string(i);
    std::vector<int32_t> toks;
    for (auto t : f.ints("prompt." + s)) toks.push_back(static_cast<int32_t>(t));
    for (auto t : f.ints("gen_manual." + s)) toks.push_back(static_cast<int32_t>(t));
    auto st = m.new_sequence();
    auto ids = m.hash_ids(*static_cast<Dsv41State*>(st.get()), toks);
    BOOST_TEST(ids == f.ints("hash_ids." + s), "prompt " << i);
    // Split in two chunks: the look-back history carries across calls.
    size_t half = toks.size() / 2;
    std::vector<int32_t> a(toks.begin(), toks.begin() + static_cast<long>(half)), b(toks.begin() + static_cast<long>(half), toks.end());
    std::vector<float> lg(512);
    SequenceStep step{st.get(), a, 1, lg.data()};
    BOOST_REQUIRE(m.forward({&step, 1}).ok());
    auto tail = m.hash_ids(*static_cast<Dsv41State*>(st.get()), b);
    auto full = f.ints("hash_ids." + s);
    BOOST_TEST(std::equal(tail.begin(), tail.end(), full.begin() + static_cast<long>(half * 12)), "prompt " << i << " second chunk");
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(dsv41_modules)

// Prompt 4 (65 tokens: several windows and groups), fp32, against every debug.* dump of the golden's
// one-shot forward. Discrete outputs (indexer top-k sets, candidate blocks, router ids) must be equal
// everywhere. Floats: |Δ| ≤ 1e-5·max(1, |ref|) (a few fp32 ulps through 7 layers of different
// summation orders). Exception, measured and explained: at position 47 the layer-4 window KV meets an
// FP8 rounding boundary on which the golden's own one-shot path (these dumps) and its cached path
// (`step_logits`, the primary reference) disagree: its full_logits and step_logits differ by 5e-3 from
// position 47 on, while Tessera's logits equal step_logits to 4e-6 there. Rows ≥ 47 of layer ≥ 4 are
// therefore only held to the discrete checks.
BOOST_AUTO_TEST_CASE(prompt4_fp32_modules) {
  auto& m = verify::tiny_model("fp32");
  auto const& f = verify::tiny_files("fp32");
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> taps;
  m.set_debug_tap([&](std::string const& n, std::vector<int64_t> const& shape, std::span<float const> v) {
    taps[n] = {shape, std::vector<float>(v.begin(), v.end())};
  });
  std::vector<int32_t> toks;
  for (auto t : f.ints("prompt.4")) toks.push_back(static_cast<int32_t>(t));
  for (auto t : f.ints("gen_manual.4")) toks.push_back(static_cast<int32_t>(t));
  auto st = m.new_sequence();
  std::vector<float> lg(toks.size() * 512);
  SequenceStep step{st.get(), toks, static_cast<int64_t>(toks.size()), lg.data()};
  BOOST_REQUIRE(m.forward({&step, 1}).ok());
  m.set_debug_tap({});
  // This forward meets exact indexer cutoff ties (layer 1, positions 46 and 47: the golden counted the same
  // two in its one-shot run); the dumps' top-k sets below match at those rows with the lower-index rule.
  auto const& ties = static_cast<Dsv41State*>(st.get())->ties();
  BOOST_TEST(ties.total() == 2);
  for (auto const& e : ties.events) {
    BOOST_TEST((e.site == CutoffTie::Site::kIndexer && e.layer == 1));
    BOOST_TEST((e.position == 46 || e.position == 47));
  }
  int compared = 0;
  for (auto const& [name, sv] : taps) {
    std::string key = "debug." + name;
    BOOST_REQUIRE_MESSAGE(f.contains(key), "no golden dump " << key);
    auto g = f.floats(key);
    auto const& v = sv.second;
    BOOST_REQUIRE_MESSAGE(g.size() == v.size(), key << ": " << v.size() << " values vs golden " << g.size());
    bool discrete = name.find("topk_bias") != std::string::npos || name.find("candidates") != std::string::npos ||
                    name.find("gate.out1") != std::string::npos || name.find("index_k") != std::string::npos;
    int layer = name.rfind("model.layers.", 0) == 0 ? std::stoi(name.substr(13)) : (name == "model.norm.out0" ? 99 : -1);
    // Rows: the sequence axis is axis 1 of [1, S, …], axis 0 of [S, k], axis 2 of [1, H|1, S, keys].
    auto const& shape = sv.first;
    bool head_major = name.find("topk_bias") != std::string::npos || name.find("attn.out1") != std::string::npos;
    int64_t rows_axis = head_major ? 2 : (shape.size() == 2 ? 0 : 1);
    int64_t row_stride = 1;
    for (size_t d = static_cast<size_t>(rows_axis) + 1; d < shape.size(); ++d) row_stride *= shape[d];
    size_t bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      int64_t row = (static_cast<int64_t>(i) / row_stride) % shape[static_cast<size_t>(rows_axis)];
      bool exact = discrete;
      if (!exact && layer >= 4 && row >= 47) continue;
      if (exact ? !(g[i] == v[i] || (std::isinf(g[i]) && std::isinf(v[i]) && g[i] == v[i]))
                : !(std::fabs(g[i] - v[i]) <= 1e-5 * std::max(1.f, std::fabs(g[i]))))
        ++bad;
    }
    BOOST_TEST(bad == 0u, key << ": " << bad << " of " << g.size() << " values outside the bound");
    ++compared;
  }
  int golden_dumps = 0;
  for (auto const& n : f.names())
    if (n.rfind("debug.", 0) == 0) {
      ++golden_dumps;
      BOOST_TEST(taps.count(n.substr(6)) == 1u, "no Tessera tap for " << n);
    }
  BOOST_TEST(compared == golden_dumps);
  // The golden's own paths: full vs step logits at positions ≥ 47 differ (the flip), before they agree.
  auto full = f.floats("full_logits.4"), stp = f.floats("step_logits.4");
  double before = 0, after = 0;
  for (int k = 0; k < 32; ++k)
    for (int j = 0; j < 512; ++j) {
      double d = std::fabs(full[(32 + k) * 512 + j] - stp[k * 512 + j]);
      (32 + k < 47 ? before : after) = std::max(32 + k < 47 ? before : after, d);
    }
  BOOST_TEST(before < 1e-4);
  BOOST_TEST(after > 1e-3);
}

BOOST_AUTO_TEST_SUITE_END()

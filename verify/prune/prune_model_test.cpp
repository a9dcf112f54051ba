// SPDX-License-Identifier: Apache-2.0
/// Expert pruning on the golden tiny model (fp32): keep-everything settings are bit-identical to the
/// unpruned model; retention falls monotonically as top_p tightens; a static mask never selects a masked
/// expert and a checkpoint pruned to the same kept sets gives the same logits bit for bit (and loads,
/// generates and inspects like any other); calibration stats sum to tokens·k selections and to the
/// routing weight mass; decode scope leaves prefill chunks untouched.
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tessera/models/deepseek_v41/pruning.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;
using tessera::model::SequenceStep;

namespace {

std::unique_ptr<Dsv41Model> load_tiny(ExpertPruning p = {}) {
  ModelOptions o;
  o.prune = std::move(p);
  return load_model(verify::tiny_dir("fp32"), o).value_or_throw();
}

std::vector<int32_t> prompt(int i, size_t max_len) {
  std::vector<int32_t> t;
  for (auto x : verify::tiny_files("fp32").ints("prompt." + std::to_string(i))) t.push_back(static_cast<int32_t>(x));
  if (t.size() > max_len) t.resize(max_len);
  return t;
}

std::vector<float> logits_of(Dsv41Model& m, std::vector<int32_t> const& toks, bool stepwise) {
  int64_t V = m.spec().vocab_size;
  std::vector<float> out(toks.size() * V);
  auto st = m.new_sequence();
  size_t c = stepwise ? 1 : toks.size();
  for (size_t b = 0; b < toks.size(); b += c) {
    size_t e = std::min(toks.size(), b + c);
    SequenceStep s{st.get(), std::span<int32_t const>(toks.data() + b, e - b), static_cast<int64_t>(e - b), out.data() + b * V};
    throw_if_error(m.forward({&s, 1}));
  }
  return out;
}

std::vector<std::vector<int32_t>> golden_prompts() { return {prompt(2, 64), prompt(3, 64), prompt(4, 64), prompt(5, 64)}; }

}  // namespace

BOOST_AUTO_TEST_SUITE(prune_model)

BOOST_AUTO_TEST_CASE(keep_everything_is_bit_identical) {
  auto base = load_tiny();
  int64_t K = base->spec().top_k;
  std::vector<std::vector<uint8_t>> none(base->spec().num_layers, std::vector<uint8_t>(base->spec().n_experts, 0));
  for (auto const& p : golden_prompts()) {
    auto want_chunk = logits_of(*base, p, false), want_step = logits_of(*base, p, true);
    for (float tp : {1.f, 0.5f, 0.05f}) {
      for (auto scope : {ExpertPruning::Scope::kDecode, ExpertPruning::Scope::kAll}) {
        ExpertPruning pr{tp, K, true, scope, none};  // min_k = k: the prune path runs and keeps all
        throw_if_error(base->set_pruning(pr));
        auto a = logits_of(*base, p, false), b = logits_of(*base, p, true);
        BOOST_TEST((std::memcmp(a.data(), want_chunk.data(), a.size() * 4) == 0), "top_p " << tp);
        BOOST_TEST((std::memcmp(b.data(), want_step.data(), b.size() * 4) == 0), "top_p " << tp);
      }
    }
    throw_if_error(base->set_pruning({}));
  }
}

BOOST_AUTO_TEST_CASE(retention_falls_monotonically_as_top_p_tightens) {
  auto base = load_tiny();
  auto cand = load_tiny();
  auto prompts = golden_prompts();
  double last_kl = -1, last_agree = 2;
  for (float tp : {1.f, 0.95f, 0.9f, 0.8f, 0.7f, 0.6f, 0.55f, 0.52f, 0.5f}) {
    throw_if_error(cand->set_pruning({tp, 1, true, ExpertPruning::Scope::kAll, {}}));
    auto r = measure_retention(*base, *cand, prompts).value_or_throw();
    BOOST_TEST_MESSAGE("top_p " << tp << " top1 " << r.agreement() << " kl mean " << r.kl_mean() << " p99 "
                                << r.kl_quantile(0.99) << " max " << r.kl_max());
    std::printf("retention top_p %.2f positions %lld top1 %.4f kl_mean %.3e kl_p50 %.3e kl_p99 %.3e kl_max %.3e\n", tp,
                static_cast<long long>(r.positions), r.agreement(), r.kl_mean(), r.kl_quantile(0.5), r.kl_quantile(0.99),
                r.kl_max());
    if (tp == 1.f) {
      BOOST_TEST(r.kl_max() == 0.0);
      BOOST_TEST(r.agreement() == 1.0);
      for (double o : r.layer_overlap) BOOST_TEST(o == 1.0);
    }
    BOOST_TEST(r.kl_mean() >= last_kl, "KL must not fall as top_p tightens (top_p " << tp << ")");
    BOOST_TEST(r.agreement() <= last_agree, "top-1 agreement must not rise as top_p tightens (top_p " << tp << ")");
    // Once the previous setting dropped experts, a tighter one drops more: strictly worse on both.
    if (last_kl > 0.0) {
      BOOST_TEST(r.kl_mean() > last_kl, "KL must grow once pruning bites (top_p " << tp << ")");
      BOOST_TEST(r.agreement() < last_agree, "top-1 agreement must fall once pruning bites (top_p " << tp << ")");
    }
    last_kl = r.kl_mean();
    last_agree = r.agreement();
  }
  BOOST_TEST(last_kl > 0.0);
}

BOOST_AUTO_TEST_CASE(decode_scope_leaves_prefill_alone) {
  auto base = load_tiny();
  auto p = prompt(4, 33);
  auto chunk = logits_of(*base, p, false), step = logits_of(*base, p, true);
  throw_if_error(base->set_pruning({0.5f, 1, true, ExpertPruning::Scope::kDecode, {}}));
  auto pc = logits_of(*base, p, false), ps = logits_of(*base, p, true);
  BOOST_TEST((std::memcmp(pc.data(), chunk.data(), pc.size() * 4) == 0));  // one prefill chunk: unpruned
  int64_t V = base->spec().vocab_size;
  BOOST_TEST((std::memcmp(ps.data(), step.data(), V * 4) == 0));           // position 0 is prefill
  BOOST_TEST((std::memcmp(ps.data(), step.data(), ps.size() * 4) != 0));   // later decode rows are pruned
}

BOOST_AUTO_TEST_CASE(static_mask_and_pruned_checkpoint_agree_bitwise) {
  auto base = load_tiny();
  ModelSpec const& s = base->spec();
  auto prompts = golden_prompts();
  auto stats = calibrate(*base, prompts).value_or_throw();
  // Stats sum: every token selects k experts in every layer; the weight sum equals the routed mass.
  int64_t tokens = 0;
  for (auto const& p : prompts) tokens += static_cast<int64_t>(p.size());
  BOOST_TEST(stats.tokens == tokens);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    int64_t c = 0;
    double w = 0;
    for (int64_t e = 0; e < s.n_experts; ++e) { c += stats.count[l * s.n_experts + e]; w += stats.weight[l * s.n_experts + e]; }
    BOOST_TEST(c == tokens * s.top_k);
    // norm_top_k: each token's k weights sum to routed_scale (fp32 rounding per token).
    if (s.norm_topk_prob) BOOST_TEST(std::abs(w - tokens * static_cast<double>(s.routed_scale)) <= 1e-5 * tokens);
  }
  auto back = RoutingStats::from_json(stats.to_json()).value_or_throw();
  BOOST_TEST((back.count == stats.count));

  auto kept = choose_kept_experts(stats, 0.75).value_or_throw();
  BOOST_TEST(static_cast<int64_t>(kept[0].size()) == 6);
  auto mask = mask_from_kept(kept, s.n_experts);
  auto masked = load_tiny({1.f, 0, true, ExpertPruning::Scope::kAll, mask});
  // Masked experts are never selected.
  int64_t bad = 0;
  masked->set_debug_tap([&](std::string const& n, std::vector<int64_t> const&, std::span<float const> v) {
    auto pos = n.find(".ffn.gate.out1");
    if (pos == std::string::npos) return;
    size_t l = std::stoul(n.substr(13, pos - 13));
    for (float id : v) bad += mask[l][static_cast<size_t>(id)];
  });
  auto ml = logits_of(*masked, prompts[3], false);
  masked->set_debug_tap({});
  BOOST_TEST(bad == 0);

  std::string out = (std::filesystem::temp_directory_path() / ("tessera_prune_" + std::to_string(::getpid()))).string();
  throw_if_error(write_pruned_checkpoint(verify::tiny_dir("fp32"), kept, out));
  auto pruned = load_model(out, {}).value_or_throw();
  BOOST_TEST(pruned->spec().n_experts == 6);
  for (auto const& p : prompts) {
    auto a = logits_of(*masked, p, false), b = logits_of(*pruned, p, false);
    BOOST_TEST((std::memcmp(a.data(), b.data(), a.size() * 4) == 0));
  }
  auto r = measure_retention(*masked, *pruned, prompts, kept).value_or_throw();
  BOOST_TEST(r.kl_max() == 0.0);
  for (double o : r.layer_overlap) BOOST_TEST(o == 1.0);  // ids map back to the same original experts
  std::filesystem::remove_all(out);
}

BOOST_AUTO_TEST_CASE(bad_options_are_named) {
  auto base = load_tiny();
  auto st = base->set_pruning({1.5f, 0, true, ExpertPruning::Scope::kAll, {}});
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.message().find("top_p") != std::string::npos);
  std::vector<std::vector<uint8_t>> m(base->spec().num_layers, std::vector<uint8_t>(base->spec().n_experts, 1));
  st = base->set_pruning({1.f, 0, true, ExpertPruning::Scope::kAll, m});
  BOOST_TEST(st.message().find("fewer than num_experts_per_tok") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(png_is_well_formed) {
  std::string f = (std::filesystem::temp_directory_path() / ("tessera_plot_" + std::to_string(::getpid()) + ".png")).string();
  throw_if_error(write_plot_png(f, {0.0, 0.1, 0.05, 0.3, 0.2}, 64, 32));
  std::ifstream in(f, std::ios::binary);
  std::vector<unsigned char> b((std::istreambuf_iterator<char>(in)), {});
  BOOST_REQUIRE(b.size() > 8 + 25 + 12);
  BOOST_TEST((std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0));
  // One IDAT of 2 + (5 + 32·65) + 4 zlib bytes, then IEND.
  size_t idat = 8 + 25;
  uint32_t n = (b[idat] << 24) | (b[idat + 1] << 16) | (b[idat + 2] << 8) | b[idat + 3];
  BOOST_TEST(n == 2u + 5u + 32u * 65u + 4u);
  BOOST_TEST((std::memcmp(&b[b.size() - 8], "IEND", 4) == 0));
  std::filesystem::remove(f);
}

BOOST_AUTO_TEST_SUITE_END()

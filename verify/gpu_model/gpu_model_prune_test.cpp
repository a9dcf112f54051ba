// SPDX-License-Identifier: Apache-2.0
/// Routed-expert pruning on the GPU model (gpu_model.hpp, docs/pruning.md) against the CPU model on
/// golden/v41-tiny, bit for bit:
///  * per-token top-p (renormalised or original weights, every row or decode only) and the static mask
///    (alone and with top-p) give the CPU model's logits, one-shot and token by token; the settings do
///    change the logits (the check is not vacuous);
///  * keep-everything settings (top_p < 1 with min_k = k, an all-open mask) equal the unpruned GPU model;
///  * a batch of mixed chunk kinds (first tokens, one-token decode steps, prefill chunks) under each setting
///    equals each sequence alone and the pruned CPU model alone; at decode scope its prefill chunks equal
///    the unpruned model and its decode steps do not (the scope is decided per sequence of the batch);
///  * the route observer reports the CPU model's router ids and weights (−1 for a dropped slot);
///  * a checkpoint pruned to the mask's kept experts runs on the GPU model with the masked CPU model's logits;
///  * bad options are refused with the field named, at create and at set_pruning.
/// Built with gpu_model_test.cpp: for the GPU (suite gpu) and as the CPU composition (suite cpu).
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <regex>
#include <unistd.h>

#include "tessera/models/deepseek_v41/pruning.hpp"
#include "verify/gpu_model/gpu_model_fixture.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;
using verify::bitwise_equal;
using verify::run_chunked;

namespace {

using Scope = ExpertPruning::Scope;

std::vector<int32_t> golden_prompt(int i, size_t max_len) {
  std::vector<int32_t> t;
  for (auto x : verify::tiny_files("fp32").ints("prompt." + std::to_string(i))) t.push_back(static_cast<int32_t>(x));
  if (t.size() > max_len) t.resize(max_len);
  return t;
}

std::vector<std::vector<int32_t>> prompts() { return {golden_prompt(2, 48), golden_prompt(4, 48)}; }

std::unique_ptr<Dsv41Model> cpu_model(ExpertPruning p = {}) {
  ModelOptions o;
  o.prune = std::move(p);
  return load_model(verify::tiny_dir("fp32"), o).value_or_throw();
}

GpuDsv41Model& gpu_model() {
  static std::unique_ptr<GpuDsv41Model> m = verify::load_gpu_model(verify::tiny_dir("fp32"), {});
  return *m;
}

ModelSpec const& tiny_spec() { return verify::tiny_model("fp32").spec(); }

/// The 6 of 8 experts per layer with the largest routing weight on the prompts (ascending ids).
std::vector<std::vector<int32_t>> const& calibrated_kept() {
  static auto const kept = [] {
    auto stats = calibrate(verify::tiny_model("fp32"), prompts()).value_or_throw();
    return choose_kept_experts(stats, 0.75).value_or_throw();
  }();
  return kept;
}

std::vector<std::vector<uint8_t>> calibrated_mask() { return mask_from_kept(calibrated_kept(), tiny_spec().n_experts); }

struct Setting {
  std::string name;
  ExpertPruning prune;
};

std::vector<Setting> lossy_settings() {
  auto mask = calibrated_mask();
  return {{"top_p 0.55 renorm all", {0.55f, 1, true, Scope::kAll, {}}},
          {"top_p 0.5 orig all", {0.5f, 1, false, Scope::kAll, {}}},
          {"top_p 0.5 renorm decode", {0.5f, 1, true, Scope::kDecode, {}}},
          {"mask 6/8", {1.f, 0, true, Scope::kAll, mask}},
          {"mask 6/8 + top_p 0.55 decode", {0.55f, 1, true, Scope::kDecode, mask}}};
}

/// A batch of mixed chunk kinds: sequence i takes the first hist tokens of golden prompt 5 + i mod 3 in one step,
/// then its next `chunk` tokens, then 2 one-token steps; every logits row of the last two parts.
struct Mixed {
  size_t hist, chunk;
};
std::vector<Mixed> const kMixed = {{0, 1}, {20, 1}, {30, 7}, {40, 1}, {10, 5}, {0, 3}};

/// Per sequence: the logits rows of its chunk, then of its decode steps; `batched` runs each part as one
/// batch, otherwise every step alone.
std::vector<std::pair<std::vector<float>, std::vector<float>>> run_mixed(model::LanguageModel& m, bool batched) {
  int64_t const V = m.info().vocab_size;
  size_t const B = kMixed.size();
  std::vector<std::vector<int32_t>> toks(B);
  std::vector<std::unique_ptr<model::SequenceState>> st;
  for (size_t i = 0; i < B; ++i) {
    toks[i] = golden_prompt(5 + static_cast<int>(i % 3), kMixed[i].hist + kMixed[i].chunk);
    BOOST_REQUIRE(toks[i].size() == kMixed[i].hist + kMixed[i].chunk);
    st.push_back(m.new_sequence());
  }
  auto forward = [&](std::vector<model::SequenceStep>& steps) {
    if (batched) return throw_if_error(m.forward(steps));
    for (auto& x : steps) throw_if_error(m.forward({&x, 1}));
  };
  std::vector<std::pair<std::vector<float>, std::vector<float>>> out(B);
  std::vector<std::vector<float>> row(B, std::vector<float>(static_cast<size_t>(V)));
  std::vector<model::SequenceStep> steps;
  for (size_t i = 0; i < B; ++i)
    steps.push_back({st[i].get(), std::span<int32_t const>(toks[i].data(), kMixed[i].hist), kMixed[i].hist ? 1 : 0,
                     row[i].data()});
  forward(steps);
  steps.clear();
  for (size_t i = 0; i < B; ++i) {
    out[i].first.resize(kMixed[i].chunk * static_cast<size_t>(V));
    steps.push_back({st[i].get(), std::span<int32_t const>(toks[i].data() + kMixed[i].hist, kMixed[i].chunk),
                     static_cast<int64_t>(kMixed[i].chunk), out[i].first.data()});
  }
  forward(steps);
  std::vector<int32_t> next(B);
  for (int d = 0; d < 2; ++d) {
    steps.clear();
    for (size_t i = 0; i < B; ++i) {
      next[i] = static_cast<int32_t>((i * 13 + static_cast<size_t>(d) * 5 + 1) % static_cast<size_t>(V));
      steps.push_back({st[i].get(), std::span<int32_t const>(&next[i], 1), 1, row[i].data()});
    }
    forward(steps);
    for (size_t i = 0; i < B; ++i) out[i].second.insert(out[i].second.end(), row[i].begin(), row[i].end());
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_model_prune)

BOOST_AUTO_TEST_CASE(mixed_batch_pruning_equals_alone) {
  GpuDsv41Model& gpu = gpu_model();
  auto unpruned = run_mixed(verify::tiny_model("fp32"), false);
  for (auto const& [name, prune] : lossy_settings()) {
    auto cpu = cpu_model(prune);
    throw_if_error(gpu.set_pruning(prune));
    auto together = run_mixed(gpu, true), alone = run_mixed(gpu, false), ref = run_mixed(*cpu, false);
    bool decode_differs = false;
    for (size_t i = 0; i < kMixed.size(); ++i) {
      BOOST_TEST(bitwise_equal(together[i].first, alone[i].first), name << ", sequence " << i << " chunk: batched != alone");
      BOOST_TEST(bitwise_equal(together[i].second, alone[i].second), name << ", sequence " << i << " decode: batched != alone");
      BOOST_TEST(bitwise_equal(alone[i].first, ref[i].first), name << ", sequence " << i << " chunk: != CPU model");
      BOOST_TEST(bitwise_equal(alone[i].second, ref[i].second), name << ", sequence " << i << " decode: != CPU model");
      if (prune.scope == Scope::kDecode && prune.expert_mask.empty()) {
        // Decode scope prunes one-token steps past position 0 only: a first token or a longer chunk (on a
        // history fed in one step) routes like the unpruned model.
        bool const pruned_chunk = kMixed[i].chunk == 1 && kMixed[i].hist > 0;
        BOOST_TEST(bitwise_equal(together[i].first, unpruned[i].first) == !pruned_chunk, name << ", sequence " << i);
        decode_differs = decode_differs || !bitwise_equal(together[i].second, unpruned[i].second);
      }
    }
    if (prune.scope == Scope::kDecode && prune.expert_mask.empty()) BOOST_TEST(decode_differs, name << ": pruning changed nothing");
  }
  throw_if_error(gpu.set_pruning({}));
}

BOOST_AUTO_TEST_CASE(pruned_gpu_model_equals_pruned_cpu_model) {
  GpuDsv41Model& gpu = gpu_model();
  Dsv41Model& unpruned_cpu = verify::tiny_model("fp32");
  for (auto const& [name, prune] : lossy_settings()) {
    auto cpu = cpu_model(prune);
    throw_if_error(gpu.set_pruning(prune));
    for (auto const& p : prompts())
      for (int64_t chunk : {static_cast<int64_t>(p.size()), int64_t{1}}) {
        auto want = run_chunked(*cpu, p, chunk), got = run_chunked(gpu, p, chunk);
        BOOST_TEST(bitwise_equal(got, want), name << ", chunks of " << chunk << ": GPU model != CPU model");
        // Decode scope leaves a one-shot prefill unpruned; everything else must differ from unpruned.
        bool const pruned_rows = prune.scope == Scope::kAll || chunk == 1 || !prune.expert_mask.empty();
        if (pruned_rows)
          BOOST_TEST(!bitwise_equal(want, run_chunked(unpruned_cpu, p, chunk)), name << ": pruning changed nothing");
      }
  }
  throw_if_error(gpu.set_pruning({}));
}

BOOST_AUTO_TEST_CASE(pruning_given_at_create_equals_set_pruning) {
  ExpertPruning const prune{0.55f, 1, true, Scope::kAll, calibrated_mask()};
  ModelOptions o;
  o.prune = prune;
  auto created = verify::load_gpu_model(verify::tiny_dir("fp32"), o);
  BOOST_TEST(created->pruning().top_p == prune.top_p);
  auto cpu = cpu_model(prune);
  for (auto const& p : prompts()) BOOST_TEST(bitwise_equal(run_chunked(*created, p, 7), run_chunked(*cpu, p, 7)));
}

BOOST_AUTO_TEST_CASE(keep_everything_is_bit_identical) {
  GpuDsv41Model& gpu = gpu_model();
  throw_if_error(gpu.set_pruning({}));
  int64_t const K = tiny_spec().top_k, L = tiny_spec().num_layers, E = tiny_spec().n_experts;
  std::vector<std::vector<uint8_t>> open(static_cast<size_t>(L), std::vector<uint8_t>(static_cast<size_t>(E), 0));
  for (auto const& p : prompts()) {
    auto one_shot = run_chunked(gpu, p, static_cast<int64_t>(p.size())), stepwise = run_chunked(gpu, p, 1);
    for (float tp : {0.5f, 0.05f})
      for (Scope scope : {Scope::kAll, Scope::kDecode}) {
        throw_if_error(gpu.set_pruning({tp, K, true, scope, open}));  // min_k = k: the prune path runs, keeps all
        BOOST_TEST(bitwise_equal(run_chunked(gpu, p, static_cast<int64_t>(p.size())), one_shot), "top_p " << tp);
        BOOST_TEST(bitwise_equal(run_chunked(gpu, p, 1), stepwise), "top_p " << tp);
      }
    throw_if_error(gpu.set_pruning({}));
  }
}

BOOST_AUTO_TEST_CASE(route_observer_reports_the_cpu_routing) {
  auto mask = calibrated_mask();
  ExpertPruning const prune{0.5f, 1, true, Scope::kAll, mask};
  auto cpu = cpu_model(prune);
  std::map<std::string, std::vector<float>> cpu_route;  // "L.ids" / "L.w" → values of the chunk
  cpu->set_debug_tap([&](std::string const& n, std::vector<int64_t> const&, std::span<float const> v) {
    static std::regex const re(R"(model\.layers\.(\d+)\.ffn\.gate\.out([01]))");
    std::smatch mt;
    if (std::regex_match(n, mt, re)) cpu_route[mt[1].str() + (mt[2] == "0" ? ".w" : ".ids")].assign(v.begin(), v.end());
  });
  GpuDsv41Model& gpu = gpu_model();
  throw_if_error(gpu.set_pruning(prune));
  std::map<std::string, std::vector<float>> gpu_route;
  int64_t observer_calls = 0, kept_slots = 0;
  gpu.set_route_observer([&](int64_t l, std::span<int32_t const> ids, std::span<float const> w) {
    gpu_route[std::to_string(l) + ".ids"].assign(ids.begin(), ids.end());
    gpu_route[std::to_string(l) + ".w"].assign(w.begin(), w.end());
    for (int32_t id : ids) {
      kept_slots += id >= 0;
      if (id >= 0) BOOST_TEST(!mask[static_cast<size_t>(l)][static_cast<size_t>(id)], "masked expert selected");
    }
    ++observer_calls;
  });
  auto p = prompts()[0];
  run_chunked(*cpu, p, static_cast<int64_t>(p.size()));
  run_chunked(gpu, p, static_cast<int64_t>(p.size()));
  gpu.set_route_observer({});
  cpu->set_debug_tap({});
  int64_t const L = cpu->spec().num_layers, S = static_cast<int64_t>(p.size());
  BOOST_TEST(observer_calls == L);  // one call per layer for the one chunk
  BOOST_TEST(kept_slots == L * S);  // k = 2, top_p 0.5: the larger weight alone reaches half the sum
  BOOST_REQUIRE_EQUAL(gpu_route.size(), cpu_route.size());
  for (auto const& [key, v] : cpu_route) BOOST_TEST(bitwise_equal(gpu_route[key], v), key);
  throw_if_error(gpu.set_pruning({}));
}

BOOST_AUTO_TEST_CASE(pruned_checkpoint_equals_masked_model) {
  auto masked = cpu_model({1.f, 0, true, Scope::kAll, calibrated_mask()});
  std::string const out =
      (std::filesystem::temp_directory_path() / ("tessera_gpu_prune_" + std::to_string(::getpid()))).string();
  throw_if_error(write_pruned_checkpoint(verify::tiny_dir("fp32"), calibrated_kept(), out));
  {
    auto pruned = verify::load_gpu_model(out, {});
    for (auto const& p : prompts()) {
      BOOST_TEST(bitwise_equal(run_chunked(*pruned, p, static_cast<int64_t>(p.size())),
                               run_chunked(*masked, p, static_cast<int64_t>(p.size()))));
      BOOST_TEST(bitwise_equal(run_chunked(*pruned, p, 5), run_chunked(*masked, p, 5)));
    }
  }
  std::filesystem::remove_all(out);
}

BOOST_AUTO_TEST_CASE(bad_options_are_named) {
  GpuDsv41Model& gpu = gpu_model();
  auto st = gpu.set_pruning({1.5f, 0, true, Scope::kAll, {}});
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.message().find("top_p") != std::string::npos);
  auto const& spec = tiny_spec();
  std::vector<std::vector<uint8_t>> closed(static_cast<size_t>(spec.num_layers),
                                           std::vector<uint8_t>(static_cast<size_t>(spec.n_experts), 1));
  st = gpu.set_pruning({1.f, 0, true, Scope::kAll, closed});
  BOOST_TEST(st.message().find("fewer than num_experts_per_tok") != std::string::npos);
  BOOST_TEST(!gpu.pruning().active());  // a refused setting leaves the model as it was
  ModelOptions o;
  o.prune.min_k = -1;
  auto mf = open_model_folder(verify::tiny_dir("fp32")).value_or_throw();
  auto bad = GpuDsv41Model::create(std::move(mf.spec), mf.src, o, verify::kGpuModelOnCpu ? Backend::kCpu : Backend::kCuda);
  BOOST_TEST(!bad.ok());
  BOOST_TEST(bad.status().message().find("min_k") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

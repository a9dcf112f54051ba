// SPDX-License-Identifier: Apache-2.0
/// A rank's host model that reads only the routed experts the rank holds (load_rank_host_model with a plan and
/// rank, load_rank_host; one process per rank), on an FP8-format synthetic folder of verify::wide_block_config
/// (8 heads, 4 o-groups of o_lora_rank 32, hidden 128, 8 routed experts), bf16.
///  * At TP 2, TP 4, EP 2, EP 4, TP = EP = 2 every rank's weights sliced from its own host model equal, tensor for
///    tensor and byte for byte (dense tensors and stored codes + scales), the weights sliced from the host model of
///    the whole checkpoint; each rank's rank model, run as threads over the in-process communicator, gives the
///    logits of the rank models sliced from the whole host model and of the single-rank dequantised model bit for
///    bit.
///  * Under EP the checkpoint bytes read for a rank (stored bytes of every tensor loaded, scales included) are the
///    whole-checkpoint host model's less exactly the other experts' codes and scales, and the host model holds fewer
///    bytes; under TP alone they are the same (TP-split tensors are read whole and sliced afterwards).
///  * Bad input: a rank outside the plan, a plan of other dimensions, a host model asked for another rank's
///    experts, a forward on a partial host model, an expert range outside the checkpoint.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/common/random.hpp"
#include "verify/dist/synthetic_folder.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;
namespace fs = std::filesystem;

namespace {

using verify::tp_ep_name;
dist::ParallelConfig cfg(int tp, int ep) { return verify::tp_ep(tp, ep); }
std::string name_of(dist::ParallelConfig const& c) { return tp_ep_name(c); }

ModelOptions bf16() {
  ModelOptions o;
  o.numerics = Numerics::kBf16;
  return o;
}

struct Fp8Folder : verify::SyntheticFolder {
  Fp8Folder() : SyntheticFolder("rank_loader", verify::wide_block_config(), 81, *native_fp8_format(), true) {}
};

Fp8Folder& folder() {
  static Fp8Folder f;
  return f;
}

/// A WeightSource over the folder's checkpoint that records the checkpoint tensors it hands out (a block-scaled
/// weight "X.weight" with its "X.scale"); bytes_read() sums their stored sizes.
class CountingSource final : public WeightSource {
 public:
  explicit CountingSource(fs::path const& dir) {
    throw_if_error(src_.open((dir / "model.safetensors").string()));
    auto const ckpt = io::Checkpoint::open((dir / "model.safetensors").string()).value_or_throw();
    for (auto const& t : ckpt.tensors()) stored_[t.name] = t.nbytes;
  }
  bool contains(std::string const& n) const override { return src_.contains(n); }
  Result<std::vector<int64_t>> shape(std::string const& n) const override { return src_.shape(n); }
  Result<DType> dtype(std::string const& n) const override { return src_.dtype(n); }
  Result<Tensor> load_f32(std::string const& n) const override { return note(n), src_.load_f32(n); }
  Result<Tensor> load_i64(std::string const& n) const override { return note(n), src_.load_i64(n); }
  Result<ScaledWeight> load_scaled(std::string const& n) const override { return note(n), src_.load_scaled(n); }
  std::string describe() const override { return src_.describe(); }
  size_t bytes_read() const {
    size_t b = 0;
    for (auto const& n : read_) b += stored_.at(n);
    return b;
  }
  size_t checkpoint_bytes() const {
    size_t b = 0;
    for (auto const& [n, s] : stored_) b += s;
    return b;
  }
  /// Stored bytes of the routed experts' tensors outside [e0, e1).
  size_t expert_bytes_outside(int64_t e0, int64_t e1) const {
    size_t b = 0;
    for (auto const& [n, s] : stored_) {
      size_t const p = n.find(".experts.");
      if (p == std::string::npos) continue;
      int64_t const e = std::stoll(n.substr(p + 9));
      if (e < e0 || e >= e1) b += s;
    }
    return b;
  }

 private:
  void note(std::string const& n) const {
    if (!stored_.count(n)) return;  // Engram hash data of the golden file: not part of the checkpoint
    read_.insert(n);
    std::string const scale = n.substr(0, n.size() - std::string("weight").size()) + "scale";
    if (n.ends_with(".weight") && stored_.count(scale)) read_.insert(scale);
  }
  CheckpointSource src_;
  std::map<std::string, size_t> stored_;
  mutable std::set<std::string> read_;
};

/// The folder's checkpoint with the Engram hash data of the golden tiny fixture (second source), counting reads.
struct Sources {
  CountingSource counting;
  CheckpointSource engram;
  struct Both final : WeightSource {
    WeightSource const* a;
    WeightSource const* b;
    WeightSource const& pick(std::string const& n) const { return a->contains(n) ? *a : *b; }
    bool contains(std::string const& n) const override { return a->contains(n) || b->contains(n); }
    Result<std::vector<int64_t>> shape(std::string const& n) const override { return pick(n).shape(n); }
    Result<DType> dtype(std::string const& n) const override { return pick(n).dtype(n); }
    Result<Tensor> load_f32(std::string const& n) const override { return pick(n).load_f32(n); }
    Result<Tensor> load_i64(std::string const& n) const override { return pick(n).load_i64(n); }
    Result<ScaledWeight> load_scaled(std::string const& n) const override { return pick(n).load_scaled(n); }
    std::string describe() const override { return a->describe(); }
  } both;
  explicit Sources(fs::path const& dir) : counting(dir) {
    throw_if_error(engram.open(verify::tiny_dir("fp32") + "/golden.safetensors"));
    both.a = &counting;
    both.b = &engram;
  }
};

/// Every tensor of `w` by name (undefined ones included).
std::vector<std::pair<std::string, Tensor const*>> tensors_of(Weights const& w) {
  static constexpr std::pair<char const*, Tensor LayerWeights::*> kFields[] = {
      {"hc_attn_fn", &LayerWeights::hc_attn_fn}, {"hc_attn_base", &LayerWeights::hc_attn_base},
      {"hc_attn_scale", &LayerWeights::hc_attn_scale}, {"hc_ffn_fn", &LayerWeights::hc_ffn_fn},
      {"hc_ffn_base", &LayerWeights::hc_ffn_base}, {"hc_ffn_scale", &LayerWeights::hc_ffn_scale},
      {"attn_norm", &LayerWeights::attn_norm}, {"ffn_norm", &LayerWeights::ffn_norm}, {"wq_a", &LayerWeights::wq_a},
      {"q_norm", &LayerWeights::q_norm}, {"wq_b", &LayerWeights::wq_b}, {"wkv", &LayerWeights::wkv},
      {"kv_norm", &LayerWeights::kv_norm}, {"wo_a", &LayerWeights::wo_a}, {"wo_b", &LayerWeights::wo_b},
      {"attn_sink", &LayerWeights::attn_sink}, {"c_wkv", &LayerWeights::c_wkv}, {"c_wgate", &LayerWeights::c_wgate},
      {"c_norm", &LayerWeights::c_norm}, {"i_wq_b", &LayerWeights::i_wq_b},
      {"i_weights_proj", &LayerWeights::i_weights_proj}, {"i_wk", &LayerWeights::i_wk},
      {"i_k_norm", &LayerWeights::i_k_norm}, {"gate", &LayerWeights::gate}, {"gate_bias", &LayerWeights::gate_bias},
      {"e_table", &LayerWeights::e_table}, {"e_wkv", &LayerWeights::e_wkv}, {"e_qk", &LayerWeights::e_qk}};
  std::vector<std::pair<std::string, Tensor const*>> out{{"embed", &w.embed}, {"norm", &w.norm}, {"lm_head", &w.lm_head}};
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights const& L = w.layers[l];
    std::string const p = "layers." + std::to_string(l) + ".";
    for (auto const& [name, field] : kFields) out.emplace_back(p + name, &(L.*field));
    for (size_t e = 0; e < L.experts.size(); ++e)
      for (auto [wn, t] : {std::pair{"w1", &L.experts[e].w1}, {"w3", &L.experts[e].w3}, {"w2", &L.experts[e].w2}})
        out.emplace_back(p + "experts." + std::to_string(e) + "." + wn, t);
    for (auto [wn, t] : {std::pair{"w1", &L.shared.w1}, {"w3", &L.shared.w3}, {"w2", &L.shared.w2}})
      out.emplace_back(p + "shared." + wn, t);
  }
  return out;
}

bool same_bytes(Tensor const& a, Tensor const& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

/// `got` and `want` hold the same tensors and stored forms, byte for byte.
void check_same_weights(Weights const& got, Weights const& want, std::string const& what) {
  auto const g = tensors_of(got), w = tensors_of(want);
  BOOST_TEST_REQUIRE(g.size() == w.size(), what);
  size_t differ = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!same_bytes(*g[i].second, *w[i].second)) {
      ++differ;
      BOOST_TEST_MESSAGE(what << ": " << g[i].first << " differs");
    }
  BOOST_TEST(differ == 0u, what << ": dense tensors");
  BOOST_TEST(got.scaled.size() == want.scaled.size(), what);
  for (auto const& [key, sw] : want.scaled) {
    ScaledWeight const* o = got.scaled_of(key);
    BOOST_TEST_REQUIRE(o != nullptr, what << ": " << key);
    BOOST_TEST((o->dtype == sw.dtype && o->rows == sw.rows && o->cols == sw.cols), what << ": " << key);
    BOOST_TEST(same_bytes(o->codes, sw.codes), what << ": " << key << " codes");
    BOOST_TEST(same_bytes(o->scales, sw.scales), what << ": " << key << " scales");
  }
  BOOST_TEST(got.exl3.empty());
}

/// Logits of prefill chunks of 7, 1 and 12 tokens (every row) and 6 decode steps.
std::vector<float> schedule_logits(LanguageModel& m, std::vector<int32_t> const& toks) {
  int64_t const V = m.info().vocab_size;
  auto st = m.new_sequence();
  std::vector<float> all;
  size_t pos = 0;
  for (size_t chunk : {7u, 1u, 12u, 1u, 1u, 1u, 1u, 1u, 1u}) {
    std::vector<float> lg(chunk * V);
    SequenceStep s{st.get(), std::span<int32_t const>(toks.data() + pos, chunk), static_cast<int64_t>(chunk), lg.data()};
    throw_if_error(m.forward(std::span<SequenceStep>(&s, 1)));
    all.insert(all.end(), lg.begin(), lg.end());
    pos += chunk;
  }
  return all;
}

bool bitwise_equal(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Runs the schedule on rank models made from hosts[r] (one per rank) as threads over an in-process group; every
/// rank's logits.
std::vector<std::vector<float>> run_ranks(std::vector<Dsv41Model const*> const& hosts, dist::ShardingPlan const& plan,
                                          std::vector<int32_t> const& toks) {
  int const n = plan.world;
  auto comms = dist::InProcessCommunicator::create(n);
  std::vector<std::unique_ptr<ThreadPool>> pools;
  std::vector<std::unique_ptr<Dsv41Model>> ranks;
  for (int r = 0; r < n; ++r) {
    pools.push_back(std::make_unique<ThreadPool>(1));
    auto sh = std::make_shared<RankShard>(RankShard{plan, r, comms[static_cast<size_t>(r)].get()});
    ranks.push_back(make_rank_model(*hosts[static_cast<size_t>(r)], sh, pools.back().get()).value_or_throw());
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        out[static_cast<size_t>(r)] = schedule_logits(*ranks[static_cast<size_t>(r)], toks);
      } catch (std::exception const& e) {
        errors[static_cast<size_t>(r)] = e.what();
        comms[static_cast<size_t>(r)]->abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) BOOST_TEST_REQUIRE(errors[static_cast<size_t>(r)].empty(), "rank " << r << ": " << errors[static_cast<size_t>(r)]);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_rank_loader)

BOOST_AUTO_TEST_CASE(rank_hosts_read_their_experts_and_build_the_same_ranks) {
  Fp8Folder& f = folder();
  auto whole = load_rank_host_model(f.dir.string(), bf16()).value_or_throw();
  auto dense = load_model(f.dir.string(), bf16()).value_or_throw();
  ModelSpec const& spec = whole->spec();
  BOOST_TEST_REQUIRE(spec.n_experts == 8);
  std::mt19937_64 g(verify::test_seed(82));
  std::vector<int32_t> toks(32);
  for (auto& t : toks) t = static_cast<int32_t>(g() % 512);
  auto const base = schedule_logits(*dense, toks);
  // What the host model of the whole checkpoint reads (the model reads no more than it needs: a checkpoint tensor
  // such as ffn.gate.bias_vl is never read).
  Sources all(f.dir);
  (void)Dsv41Model::create(spec, all.both, rank_host_options(bf16())).value_or_throw();
  size_t const whole_read = all.counting.bytes_read();
  BOOST_TEST_REQUIRE(whole_read <= all.counting.checkpoint_bytes());
  for (auto const& c : {cfg(2, 1), cfg(4, 1), cfg(1, 2), cfg(1, 4), cfg(2, 2)}) {
    auto const plan = dist::make_plan(model_dims(spec), c).value_or_throw();
    std::vector<std::unique_ptr<Dsv41Model>> hosts;
    std::vector<Dsv41Model const*> host_ptrs, whole_ptrs;
    for (int r = 0; r < plan.world; ++r) {
      Sources s(f.dir);
      hosts.push_back(load_rank_host_model(spec, s.both, bf16(), plan, r).value_or_throw());
      host_ptrs.push_back(hosts.back().get());
      whole_ptrs.push_back(whole.get());
      RankShard const sh{plan, r, nullptr};
      std::string const what = name_of(c) + " rank " + std::to_string(r);
      check_same_weights(rank_weights(*hosts.back(), sh).value_or_throw(), rank_weights(*whole, sh).value_or_throw(), what);
      // Bytes read and held: under EP the other ranks' experts are neither read nor held.
      dist::Range const mine = c.ep > 1 ? plan.ranks[static_cast<size_t>(r)].experts : dist::Range{0, spec.n_experts};
      size_t const skipped = s.counting.expert_bytes_outside(mine.begin, mine.end);
      BOOST_TEST(s.counting.bytes_read() == whole_read - skipped, what << ": bytes read");
      if (c.ep > 1) {
        BOOST_TEST(skipped > 0u);
        BOOST_TEST(hosts.back()->weight_bytes() < whole->weight_bytes(), what << ": bytes held");
      } else {
        BOOST_TEST(hosts.back()->weight_bytes() == whole->weight_bytes(), what << ": bytes held");
      }
    }
    auto const sliced = run_ranks(host_ptrs, plan, toks);
    auto const from_whole = run_ranks(whole_ptrs, plan, toks);
    for (int r = 0; r < plan.world; ++r) {
      BOOST_TEST(bitwise_equal(sliced[static_cast<size_t>(r)], from_whole[static_cast<size_t>(r)]), name_of(c) << " rank " << r);
      BOOST_TEST(bitwise_equal(sliced[static_cast<size_t>(r)], base), name_of(c) << " rank " << r << " vs one dense rank");
    }
  }
}

BOOST_AUTO_TEST_CASE(load_rank_host_opens_the_folder_for_its_rank) {
  Fp8Folder& f = folder();
  auto h = load_rank_host(f.dir.string(), bf16(), cfg(2, 2), 1).value_or_throw();
  BOOST_TEST(h.plan.world == 2);
  auto const [e0, e1] = h.model->held_routed_experts();
  BOOST_TEST(e0 == h.plan.ranks[1].experts.begin);
  BOOST_TEST(e1 == h.plan.ranks[1].experts.end);
  BOOST_TEST(!rank_weights(*h.model, RankShard{h.plan, 1, nullptr}).value_or_throw().scaled.empty());  // bf16: stored
}

BOOST_AUTO_TEST_CASE(plans_the_checkpoint_cannot_serve_are_refused) {
  Fp8Folder& f = folder();
  auto mf = open_model_folder(f.dir.string()).value_or_throw();
  auto const plan = dist::make_plan(model_dims(mf.spec), cfg(2, 2)).value_or_throw();
  auto msg = [](auto const& r) { return r.ok() ? std::string() : r.status().message(); };

  auto outside = load_rank_host_model(mf.spec, mf.src, bf16(), plan, 2);
  BOOST_TEST(msg(outside).find("rank 2 is outside the plan's 2 ranks") != std::string::npos, msg(outside));

  dist::ModelDims other = model_dims(mf.spec);
  other.experts = 16;
  auto const other_plan = dist::make_plan(other, cfg(2, 2)).value_or_throw();
  auto dims = load_rank_host_model(mf.spec, mf.src, bf16(), other_plan, 0);
  BOOST_TEST(msg(dims).find("other dimensions than the checkpoint's (16 routed experts") != std::string::npos, msg(dims));

  // Rank 0's host model holds experts [0, 4): rank 1's rank model cannot be sliced from it, and it runs no forward.
  auto host0 = load_rank_host_model(mf.spec, mf.src, bf16(), plan, 0).value_or_throw();
  auto other_rank = rank_weights(*host0, RankShard{plan, 1, nullptr});
  BOOST_TEST(msg(other_rank).find("rank 1 needs routed experts [4, 8), the model holds [0, 4)") != std::string::npos,
             msg(other_rank));
  auto st = host0->new_sequence();
  int32_t const tok = 1;
  std::vector<float> lg(static_cast<size_t>(host0->info().vocab_size));
  SequenceStep step{st.get(), std::span<int32_t const>(&tok, 1), 1, lg.data()};
  Status const fw = host0->forward(std::span<SequenceStep>(&step, 1));
  BOOST_TEST(fw.message().find("holds routed experts [0, 4) of 8 only") != std::string::npos, fw.message());

  ModelOptions bad = bf16();
  bad.routed_experts_begin = 6;
  bad.routed_experts_end = 9;
  auto range = Dsv41Model::create(mf.spec, mf.src, bad);
  BOOST_TEST(msg(range).find("routed experts [6, 9) are not a range of the checkpoint's 8 routed experts") != std::string::npos,
             msg(range));
}

BOOST_AUTO_TEST_SUITE_END()

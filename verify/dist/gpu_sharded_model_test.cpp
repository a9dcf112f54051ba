// SPDX-License-Identifier: Apache-2.0
/// The GPU model's rank models (GpuDsv41Model::create_rank) as in-process thread ranks (ShardedModel::create_gpu)
/// against the single-rank GPU model on the same backend. Built twice: with TESSERA_GPU_MODEL_ON_CPU for the CPU
/// suite (the GPU composition on the CPU op backends in host memory, the in-process communicator directly), and
/// for the GPU suite (Backend::kCuda; every rank on device rank mod count, so with one GPU every rank shares it,
/// and the collectives stage the device buffers through host memory).
///  * golden/v41-tiny fp32 (4 heads, 2 o-groups, 8 experts) and a synthetic tiny variant with 8 heads, 4 o-groups
///    and 12 experts (TP 2 and 4 split whole groups there): chunked prefill + decode logits bit for bit equal to
///    the single-rank GPU model for TP 2 and 4, EP 2 and 4, TP = EP = 2 (gather plans; Engram sharded and
///    replicated); on the CPU suite also equal to the CPU model's ShardedModel of the same plan;
///  * bf16 numerics: TP = EP = 2 bit for bit;
///  * the golden gate run by every rank at TP = EP = 2: rank 0's report equals the single-rank GPU model's;
///  * two sequences in one batch == each alone; clone then continue == continue, truncate then re-feed == never
///    truncated; a bad step fails on every rank and leaves the model usable;
///  * the TP all-reduce plan (not bit-exact): teacher-forced top-1 equal to one rank's outside near-ties.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <unistd.h>

#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "verify/dist/rank_host_check.hpp"  // verify::top1_agreement
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_model/gpu_model_fixture.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;
namespace fs = std::filesystem;

namespace {

constexpr Backend kBackend = verify::kGpuModelOnCpu ? Backend::kCpu : Backend::kCuda;

dist::ParallelConfig cfg(int tp, int ep, dist::AttnCombine a = dist::AttnCombine::kGather,
                         dist::EngramPlacement e = dist::EngramPlacement::kSharded) {
  dist::ParallelConfig c;
  c.tp = tp;
  c.ep = ep;
  c.attn = a;
  c.engram = e;
  return c;
}

std::string name_of(dist::ParallelConfig const& c) {
  return "tp" + std::to_string(c.tp) + " ep" + std::to_string(c.ep) +
         (c.attn == dist::AttnCombine::kAllReduce ? " all-reduce" : " gather") +
         (c.engram == dist::EngramPlacement::kSharded ? " engram-sharded" : " engram-replicated");
}

/// A model as the CPU model (the host weights the ranks are sliced from) and the single-rank GPU model of the
/// same weights on the backend under test.
struct Pair {
  Dsv41Model* cpu = nullptr;
  std::unique_ptr<Dsv41Model> cpu_owned;
  std::unique_ptr<GpuDsv41Model> gpu;
};

ModelOptions options(Numerics n) {
  ModelOptions o;
  o.numerics = n;
  return o;
}

Pair& tiny(std::string const& variant) {
  static std::map<std::string, Pair> cache;
  Pair& p = cache[variant];
  if (!p.gpu) {
    p.cpu = &verify::tiny_model(variant);
    p.gpu = verify::load_gpu_model(verify::tiny_dir(variant), options(p.cpu->numerics()));
  }
  return p;
}

/// A synthetic variant: 8 heads in 4 o-groups, 12 routed experts, `top_k` experts per token; Engram hash data
/// from the golden.
Pair make_wide(int64_t top_k, uint64_t seed) {
  Config c = tiny_config(512);
  c.num_attention_heads = 8;
  c.o_groups = 4;
  c.n_routed_experts = 12;
  if (top_k > 0) c.num_experts_per_tok = top_k;
  fs::path dir = fs::temp_directory_path() /
                 ("tessera_gpu_rank_test_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
  throw_if_error(write_synthetic_checkpoint(c, dir.string(), seed, *dense_format(DType::kF32)).status());
  auto spec = spec_from_config(c).value_or_throw();
  CheckpointSource src;
  throw_if_error(src.open((dir / "model.safetensors").string()));
  throw_if_error(src.open(verify::tiny_dir("fp32") + "/golden.safetensors"));
  Pair q;
  q.cpu_owned = Dsv41Model::create(spec, src, {}).value_or_throw();
  q.cpu = q.cpu_owned.get();
  q.gpu = GpuDsv41Model::create(spec, src, {}, kBackend).value_or_throw();
  std::error_code ec;
  fs::remove_all(dir, ec);
  return q;
}

/// The tiny config's experts per token (2).
Pair& wide() {
  static Pair p = make_wide(0, 23);
  return p;
}

/// 4 experts per token: EP ranks then hold experts of one token on several ranks, and the combine's order
/// (ascending expert id, not the router's slot order) decides the bits of a 4-term fp32 sum.
Pair& wide_top4() {
  static Pair p = make_wide(4, 29);
  return p;
}

/// Logits of a fixed schedule: prefill chunks of 7, 1 and 12 tokens (logits for every row), then 6 decode
/// steps; all rows concatenated.
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

std::vector<int32_t> tokens(uint64_t seed, size_t n) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % 512);
  return t;
}

/// The exact plans of a model on `p`: each rank model's logits equal the single-rank GPU model's bit for bit
/// (and, on the CPU suite, the CPU rank models' ShardedModel of the same plan).
void check_exact_plans(Pair& p, std::vector<dist::ParallelConfig> const& configs, uint64_t seed, std::string const& what) {
  auto toks = tokens(verify::test_seed(seed), 32);
  auto base = schedule_logits(*p.gpu, toks);
  for (auto const& c : configs) {
    auto sm = ShardedModel::create_gpu(*p.cpu, c, kBackend).value_or_throw();
    BOOST_TEST_REQUIRE(sm->plan().bit_exact());
    auto got = schedule_logits(*sm, toks);
    BOOST_TEST(verify::bitwise_equal(got, base), what << " " << name_of(c) << " vs the single-rank GPU model");
    if (verify::kGpuModelOnCpu) {
      auto cpu = ShardedModel::create(*p.cpu, c).value_or_throw();
      BOOST_TEST(verify::bitwise_equal(got, schedule_logits(*cpu, toks)), what << " " << name_of(c) << " vs the CPU ranks");
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_gpu_rank_model)

BOOST_AUTO_TEST_CASE(tiny_exact_plans_bit_for_bit) {
  // 2 o-groups: TP 2 splits whole groups, TP 4 gathers head outputs.
  check_exact_plans(tiny("fp32"),
                    {cfg(2, 1), cfg(4, 1), cfg(1, 2), cfg(1, 4), cfg(2, 2),
                     cfg(2, 2, dist::AttnCombine::kGather, dist::EngramPlacement::kReplicated)},
                    81, "tiny fp32");
}

BOOST_AUTO_TEST_CASE(wide_exact_plans_bit_for_bit) {
  Pair& p = wide();
  for (int tp : {2, 4})
    BOOST_TEST(dist::make_plan(model_dims(p.cpu->spec()), cfg(tp, 1)).value_or_throw().ranks[0].gather_heads == false);
  check_exact_plans(p, {cfg(2, 1), cfg(4, 1), cfg(1, 2), cfg(1, 4), cfg(2, 2), cfg(4, 4)}, 82, "wide");
}

BOOST_AUTO_TEST_CASE(wide_top4_exact_plans_bit_for_bit) {
  Pair& p = wide_top4();
  BOOST_TEST_REQUIRE(p.cpu->spec().top_k == 4);
  check_exact_plans(p, {cfg(1, 2), cfg(1, 4), cfg(2, 2), cfg(4, 4)}, 84, "wide top-4");
}

BOOST_AUTO_TEST_CASE(bf16_exact_plan_bit_for_bit) {
  check_exact_plans(tiny("bf16"), {cfg(2, 2)}, 83, "tiny bf16");
}

BOOST_AUTO_TEST_CASE(golden_gate_tp2_ep2_equals_single_rank) {
  // Every rank runs the golden gate on its rank model at once (the collectives line up because control flow is
  // replicated); rank 0's report equals the single-rank GPU model's field for field.
  Pair& p = tiny("fp32");
  auto const& golden = verify::tiny_files("fp32").source();
  GoldenGateHooks h;
  h.set_boundary_ulps = [&p](int u) { p.gpu->set_boundary_ulps(u); };
  h.ties = &GpuDsv41Model::ties;
  h.boundaries = &GpuDsv41Model::quant_boundaries;
  GoldenReport const base = run_golden_gate(*p.gpu, false, h, golden, {}).value_or_throw();
  auto sm = ShardedModel::create_gpu(*p.cpu, cfg(2, 2), kBackend).value_or_throw();
  GoldenReport const rep = run_golden_gate_sharded(*sm, golden, {}).value_or_throw();
  BOOST_TEST_MESSAGE("single rank: " << base.summary_line() << "\ntp 2 ep 2: " << rep.summary_line());
  BOOST_TEST(rep.summary_line() == base.summary_line());
  BOOST_TEST(rep.total == base.total);
  BOOST_TEST(rep.exact == base.exact);
  BOOST_TEST(rep.failures == base.failures);
  BOOST_TEST(rep.pass == base.pass);
  BOOST_TEST(std::memcmp(&rep.max_abs_err, &base.max_abs_err, sizeof(double)) == 0);
}

BOOST_AUTO_TEST_CASE(rank_holds_only_its_slices) {
  // Expert parallel: a rank uploads its routed experts only (the point of the split).
  Pair& p = wide();
  auto ep = ShardedModel::create_gpu(*p.cpu, cfg(1, 4), kBackend).value_or_throw();
  auto tp = ShardedModel::create_gpu(*p.cpu, cfg(2, 1), kBackend).value_or_throw();
  size_t const one = p.gpu->weight_bytes();
  for (int r = 0; r < 4; ++r) BOOST_TEST(static_cast<GpuDsv41Model&>(ep->rank_model(r)).weight_bytes() < one);
  for (int r = 0; r < 2; ++r) BOOST_TEST(static_cast<GpuDsv41Model&>(tp->rank_model(r)).weight_bytes() < one);
}

BOOST_AUTO_TEST_CASE(batched_equals_alone) {
  Pair& p = wide();
  auto sm = ShardedModel::create_gpu(*p.cpu, cfg(2, 2), kBackend).value_or_throw();
  int64_t const V = sm->info().vocab_size;
  auto ta = tokens(verify::test_seed(84), 20), tb = tokens(verify::test_seed(85), 20);
  // Alone: a 9-token prefill then 3 decode steps each.
  auto alone = [&](std::vector<int32_t> const& t) {
    auto st = sm->new_sequence();
    std::vector<float> all;
    size_t pos = 0;
    for (size_t chunk : {9u, 1u, 1u, 1u}) {
      std::vector<float> lg(chunk * V);
      SequenceStep s{st.get(), std::span<int32_t const>(t.data() + pos, chunk), static_cast<int64_t>(chunk), lg.data()};
      throw_if_error(sm->forward(std::span<SequenceStep>(&s, 1)));
      all.insert(all.end(), lg.begin(), lg.end());
      pos += chunk;
    }
    return all;
  };
  auto wa = alone(ta), wb = alone(tb);
  // Batched: the two sequences' same steps in one forward (b's prefill 5 + 4 so the chunks differ in length).
  auto sa = sm->new_sequence(), sb = sm->new_sequence();
  std::vector<float> ga, gb;
  std::vector<std::pair<size_t, size_t>> a_chunks{{0, 9}, {9, 1}, {10, 1}, {11, 1}};
  std::vector<std::pair<size_t, size_t>> b_chunks{{0, 5}, {5, 4}, {9, 1}, {10, 1}, {11, 1}};
  {
    std::vector<float> la(9 * V), lb(5 * V);
    SequenceStep s[2] = {{sa.get(), std::span<int32_t const>(ta.data(), 9), 9, la.data()},
                         {sb.get(), std::span<int32_t const>(tb.data(), 5), 5, lb.data()}};
    BOOST_TEST_REQUIRE(sm->forward(s).ok());
    ga.insert(ga.end(), la.begin(), la.end());
    gb.insert(gb.end(), lb.begin(), lb.end());
    std::vector<float> lb2(4 * V);
    SequenceStep s2{sb.get(), std::span<int32_t const>(tb.data() + 5, 4), 4, lb2.data()};
    BOOST_TEST_REQUIRE(sm->forward(std::span<SequenceStep>(&s2, 1)).ok());
    gb.insert(gb.end(), lb2.begin(), lb2.end());
  }
  for (size_t pos = 9; pos < 12; ++pos) {
    std::vector<float> la(V), lb(V);
    SequenceStep s[2] = {{sa.get(), std::span<int32_t const>(ta.data() + pos, 1), 1, la.data()},
                         {sb.get(), std::span<int32_t const>(tb.data() + pos, 1), 1, lb.data()}};
    BOOST_TEST_REQUIRE(sm->forward(s).ok());
    ga.insert(ga.end(), la.begin(), la.end());
    gb.insert(gb.end(), lb.begin(), lb.end());
  }
  BOOST_TEST(verify::bitwise_equal(ga, wa));
  BOOST_TEST(verify::bitwise_equal(gb, wb));
}

BOOST_AUTO_TEST_CASE(sharded_state_clone_truncate_and_failure) {
  Pair& p = wide();
  auto sm = ShardedModel::create_gpu(*p.cpu, cfg(2, 2), kBackend).value_or_throw();
  auto toks = tokens(verify::test_seed(86), 24);
  int64_t const V = sm->info().vocab_size;
  auto run = [&](SequenceState* st, size_t from, size_t n) {
    std::vector<float> lg(n * V);
    SequenceStep s{st, std::span<int32_t const>(toks.data() + from, n), static_cast<int64_t>(n), lg.data()};
    throw_if_error(sm->forward(std::span<SequenceStep>(&s, 1)));
    return lg;
  };
  auto a = sm->new_sequence();
  run(a.get(), 0, 16);
  auto snap = sm->clone(*a).value_or_throw();
  auto cont = run(a.get(), 16, 8);
  BOOST_TEST(snap->length() == 16);
  BOOST_TEST(verify::bitwise_equal(run(snap.get(), 16, 8), cont));  // the clone continues exactly
  BOOST_TEST(sm->truncate(*a, 18).ok());
  BOOST_TEST(a->length() == 18);
  BOOST_TEST(verify::bitwise_equal(run(a.get(), 18, 6), std::vector<float>(cont.begin() + 2 * V, cont.end())));
  BOOST_TEST(a->memory_bytes() > 0);
  // A bad step fails on every rank, leaves the state as it was and the model usable.
  std::vector<int32_t> bad{9999};
  std::vector<float> lg(V);
  SequenceStep s{a.get(), bad, 1, lg.data()};
  BOOST_TEST(!sm->forward(std::span<SequenceStep>(&s, 1)).ok());
  BOOST_TEST(a->length() == 24);
  auto* st = dynamic_cast<ShardedState*>(a.get());
  BOOST_TEST_REQUIRE(st != nullptr);
  for (auto const& r : st->ranks) BOOST_TEST(r->length() == 24);
  auto fresh = sm->new_sequence();
  std::vector<int32_t> const first(toks.begin(), toks.begin() + 16);
  BOOST_TEST(verify::bitwise_equal(run(fresh.get(), 0, 16), verify::run_all(*p.gpu, first, 16)));
}

BOOST_AUTO_TEST_CASE(tp_all_reduce_top1) {
  // The all-reduce sums partial wo_b dots of the ranks' groups (another fp32 order): teacher-forced top-1 equal
  // to one rank's outside near-ties (single-rank top-1/top-2 gap ≤ 1e-3, the golden gate's fp32 tie bound).
  for (Pair* p : {&tiny("fp32"), &wide()})
    for (int tp : {2, 4}) {
      if (p->cpu->spec().o_groups % tp != 0) continue;  // the all-reduce needs whole groups per rank
      auto sm = ShardedModel::create_gpu(*p->cpu, cfg(tp, tp, dist::AttnCombine::kAllReduce), kBackend).value_or_throw();
      BOOST_TEST_REQUIRE(!sm->plan().bit_exact());
      verify::Top1 t;
      for (uint64_t seed : {91u, 92u}) {
        auto toks = tokens(seed, 32);
        verify::Top1 s = verify::top1_agreement(schedule_logits(*p->gpu, toks), schedule_logits(*sm, toks),
                                                 p->cpu->spec().vocab_size, 1e-3f);
        t.agree += s.agree;
        t.ties += s.ties;
        t.rows += s.rows;
        t.max_diff = std::max(t.max_diff, s.max_diff);
      }
      BOOST_TEST_MESSAGE(p->cpu->spec().num_heads << " heads, tp " << tp << " all-reduce: top-1 " << t.agree << "/" << t.rows
                                                  << ", near-ties " << t.ties << ", max |dlogit| " << t.max_diff);
      BOOST_TEST(t.rows > 0);
      BOOST_TEST(t.agree + t.ties == t.rows);
    }
}

BOOST_AUTO_TEST_CASE(rank_model_refuses_a_mismatched_communicator) {
  // The collectives take buffers in the backend's memory: a host communicator on CUDA (or the reverse) is refused.
  Pair& p = tiny("fp32");
  auto plan = dist::make_plan(model_dims(p.cpu->spec()), cfg(1, 1)).value_or_throw();
  auto comms = dist::InProcessCommunicator::create(1);  // host memory
  auto sh = std::make_shared<RankShard>(RankShard{plan, 0, comms[0].get()});
  auto rm = GpuDsv41Model::create_rank(*p.cpu, sh, options(p.cpu->numerics()), kBackend);
  if (verify::kGpuModelOnCpu) {
    BOOST_TEST_REQUIRE(rm.ok(), rm.status().message());
    auto toks = tokens(verify::test_seed(87), 12);
    BOOST_TEST(verify::bitwise_equal(verify::run_all(**rm, toks, 12), verify::run_all(*p.gpu, toks, 12)));
  } else {
    BOOST_TEST(!rm.ok());
  }
  auto bad = GpuDsv41Model::create_rank(*p.cpu, sh, options(Numerics::kBf16), kBackend);
  BOOST_TEST(!bad.ok());
}

BOOST_AUTO_TEST_SUITE_END()

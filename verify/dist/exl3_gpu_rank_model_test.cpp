// SPDX-License-Identifier: Apache-2.0
/// EXL3 weights on GPU rank models (docs/multi-gpu.md "EXL3 weights on ranks"): GpuDsv41Model::create_rank of host
/// models holding EXL3 linears as stored, on a synthetic exl3:2.5 checkpoint (every linear an EXL3 group) and a
/// mixed:2.5 one (EXL3 routed and shared experts over the FP8 trunk, held as stored in bf16), both of
/// verify::exl3_rank_config (the TP 2 / 4 parts of wq_b, wo_a and the LM head are whole 128-column blocks; wo_b's and
/// the shared expert's cut a block, so the rank holds the covering block and keeps its rows). Built into
/// verify_dist_gpu_model_cpu (TESSERA_GPU_MODEL_ON_CPU: the GPU model on the CPU op backends, CI) and
/// verify_dist_gpu_model (CUDA).
/// What is checked, and why:
///   * every rank holds its EXL3 parts as EXL3 (projection_dtype / routed_experts_dtype kI16) and nothing else of
///     them: its weight bytes are the GPU rank of the dequantised host's (ModelOptions::dequantize_weights: dense
///     slices of the same outputs) less exactly Σ over its parts (dense bytes of the outputs it yields − trellis −
///     2·|suh| − 2·|svh|), plus one device table of 9 pointers per held expert and MoE layer;
///   * gather plans (TP 2, TP 4 head gather, EP 2, TP = EP = 2), fp32 and bf16: chunked prefill + decode logits of
///     every rank (thread ranks) equal the single-rank GPU model's bit for bit. A part's outputs are bits of the whole
///     EXL3 product: output j is its column's sum over all inputs (float64 on the CPU backend; on CUDA the whole
///     layer's chunk chain, Exl3GemmDesc::chunk_n) and its own 128-block's output Hadamard and svh[j]. A rank's EXL3
///     experts run the single-rank grouped products on its (token, slot) pairs, row-invariant. On the CPU suite the
///     GPU ranks also equal the CPU rank models (make_rank_model) of the same plan bit for bit;
///   * the mixed checkpoint: the same plans bit for bit (FP8 slices as stored next to EXL3 expert parts);
///   * TP 2 all-reduce (wo_b an input split on its o-groups, 128 inputs each): the rank-order sum of fp32 partial
///     products differs from one product in rounding only; gated as docs/multi-gpu.md's all-reduce, teacher-forced
///     top-1 agreement with one rank outside near-ties (top-1/top-2 gap ≤ 1e-3); on the CPU suite bit for bit the
///     CPU rank models' all-reduce (the same partial products, summed in the same rank order);
///   * GPU rank models made from rank host models (load_rank_host_model, one per rank, released after; CPU op
///     backends only, as in scaled_rank_model_test.cpp) give the single-rank logits bit for bit.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <random>
#include <string>
#include <thread>

#include "tessera/core/thread_pool.hpp"
#include "tessera/dist/communicator.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/dist/rank_host_check.hpp"
#include "verify/dist/synthetic_folder.hpp"
#include "verify/gpu_model/gpu_model_fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;

namespace {

constexpr Backend kBackend = verify::kGpuModelOnCpu ? Backend::kCpu : Backend::kCuda;

struct Folders {
  verify::SyntheticFolder exl3{"exl3_gpu_rank", verify::exl3_rank_config(), 47, *exl3_format(2.5), true};
  verify::SyntheticFolder mixed{"mixed_gpu_rank", verify::exl3_rank_config(), 48, *mixed_format(2.5), true};
};

Folders& folders() {
  static Folders f;
  return f;
}

ModelOptions opts(Numerics n, bool dequantize = false) {
  ModelOptions o;
  o.numerics = n;
  o.dequantize_weights = dequantize;
  return o;
}

std::string name_of(bool mixed, Numerics n) {
  return std::string(mixed ? "mixed" : "exl3") + (n == Numerics::kBf16 ? " bf16" : " fp32");
}

std::vector<int32_t> tokens() {
  std::mt19937 rng(13);
  std::vector<int32_t> t(26);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 512u);
  return t;
}

/// The host model the CLI's sharded paths slice from (rank_host_options: block-scaled weights as stored in bf16; EXL3
/// as stored, the loader's default), the single-rank GPU model of the same folder and its schedule logits.
struct Models {
  std::unique_ptr<Dsv41Model> host;
  std::unique_ptr<GpuDsv41Model> gpu;
  std::vector<float> base;
};

Models& models(bool mixed, Numerics n) {
  static std::unique_ptr<Models> cache[2][2];
  auto& m = cache[mixed][n == Numerics::kBf16];
  if (!m) {
    m = std::make_unique<Models>();
    std::string const dir = (mixed ? folders().mixed : folders().exl3).dir.string();
    m->host = load_model(dir, rank_host_options(opts(n))).value_or_throw();
    m->gpu = verify::load_gpu_model(dir, opts(n));
    m->base = verify::schedule_logits(*m->gpu, tokens());
  }
  return *m;
}

dist::ParallelConfig allreduce(int tp) {
  dist::ParallelConfig c = verify::tp_ep(tp, 1);
  c.attn = dist::AttnCombine::kAllReduce;
  return c;
}

/// Every rank's schedule logits (each rank model runs the schedule on its thread).
std::vector<std::vector<float>> every_rank(ShardedModel& g) {
  std::vector<std::vector<float>> out(static_cast<size_t>(g.world()));
  throw_if_error(g.run_ranks([&](LanguageModel& m, int r) -> Status {
    try {
      out[static_cast<size_t>(r)] = verify::schedule_logits(m, tokens());
    } catch (Error const& e) {
      return e.status();
    }
    return {};
  }));
  return out;
}

void check_exact_plans(bool mixed, Numerics n) {
  Models& m = models(mixed, n);
  for (auto const& c : {verify::tp_ep(2, 1), verify::tp_ep(4, 1), verify::tp_ep(1, 2), verify::tp_ep(2, 2)}) {
    std::string const what = name_of(mixed, n) + " " + verify::tp_ep_name(c);
    auto g = ShardedModel::create_gpu(*m.host, c, kBackend).value_or_throw();
    BOOST_TEST_REQUIRE(g->plan().bit_exact());
    auto const got = every_rank(*g);
    for (size_t r = 0; r < got.size(); ++r)
      BOOST_TEST(verify::bitwise_equal(got[r], m.base), what << " rank " << r << ": GPU rank vs the single-rank GPU model");
    if (!verify::kGpuModelOnCpu) continue;
    auto cpu = ShardedModel::create(*m.host, c).value_or_throw();
    BOOST_TEST(verify::bitwise_equal(got[0], verify::schedule_logits(*cpu, tokens())), what << ": GPU ranks vs CPU ranks");
  }
}

size_t exl3_bytes(Exl3Weight const& q) { return q.trellis.nbytes() + 2 * (q.suh.size() + q.svh.size()); }

/// The memory checks of the file comment at plan `c` on the EXL3 checkpoint.
void check_rank_memory(Numerics n, dist::ParallelConfig const& c) {
  Models& m = models(false, n);
  static std::unique_ptr<Dsv41Model> dense_host[2];
  auto& dh = dense_host[n == Numerics::kBf16];
  if (!dh) dh = load_model(folders().exl3.dir.string(), opts(n, true)).value_or_throw();
  auto eg = ShardedModel::create_gpu(*m.host, c, kBackend).value_or_throw();
  auto dg = ShardedModel::create_gpu(*dh, c, kBackend).value_or_throw();
  dist::ShardingPlan const& plan = eg->plan();
  ModelSpec const& s = m.host->spec();
  // Dense bytes a value on the GPU model: projections bf16 in bf16 numerics, else fp32; experts (routed and shared)
  // in the backend's MoeExperts dtype (the CPU op's fp32, CUDA's projections' dtype).
  int64_t const lin = n == Numerics::kBf16 ? 2 : 4, ex = kBackend == Backend::kCpu ? 4 : lin;
  for (int r = 0; r < plan.world; ++r) {
    std::string const what = name_of(false, n) + " " + verify::tp_ep_name(c) + " rank " + std::to_string(r);
    Weights const rw = rank_weights(*m.host, RankShard{plan, r, nullptr}).value_or_throw();
    BOOST_TEST_REQUIRE(rank_weights(*dh, RankShard{plan, r, nullptr}).value_or_throw().exl3.empty());
    auto& eq = static_cast<GpuDsv41Model&>(eg->rank_model(r));
    auto& dq = static_cast<GpuDsv41Model&>(dg->rank_model(r));
    int64_t saved = 0;
    int kept = 0;
    for (auto const& [key, q] : rw.exl3) {
      bool const expert = key.find(".experts.") != std::string::npos || key.find(".shared.") != std::string::npos;
      saved += (expert ? ex : lin) * q.outputs() * q.desc.k - static_cast<int64_t>(exl3_bytes(q));
      kept += q.kept_end >= 0;
    }
    int64_t const held = c.ep > 1 ? plan.ranks[static_cast<size_t>(r)].experts.size() : s.n_experts;
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < s.num_layers; ++l) {
      auto const rx = eq.routed_experts_dtype(l);
      if (!rx) continue;
      ++moe_layers;
      BOOST_TEST((*rx == DType::kI16), what << " layer " << l << ": routed experts");
      for (char const* f : {"wq_b", "wo_a", "wo_b"})
        BOOST_TEST((eq.projection_dtype(scaled_weight_key(l, f)).value_or_throw() == DType::kI16), what << " " << l << " " << f);
    }
    BOOST_TEST((eq.projection_dtype(scaled_head_key()).value_or_throw() == DType::kI16), what);
    BOOST_TEST(moe_layers > 0);
    if (c.tp > 1) BOOST_TEST(kept > 0, what << ": parts cutting a 128-block (wo_b, shared expert) are held");
    int64_t const tables = moe_layers * 9 * held * static_cast<int64_t>(sizeof(void*));
    BOOST_TEST(static_cast<int64_t>(dq.weight_bytes()) - static_cast<int64_t>(eq.weight_bytes()) == saved - tables, what);
    BOOST_TEST(eq.weight_bytes() < m.gpu->weight_bytes(), what);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_exl3_gpu_rank_model)

BOOST_AUTO_TEST_CASE(ranks_hold_exl3_parts_and_count_them) {
  for (Numerics n : {Numerics::kFp32, Numerics::kBf16})
    for (auto const& c : {verify::tp_ep(2, 1), verify::tp_ep(4, 1), verify::tp_ep(1, 2), verify::tp_ep(2, 2), allreduce(2)})
      check_rank_memory(n, c);
}

BOOST_AUTO_TEST_CASE(exl3_gather_plans_bit_exact_fp32) { check_exact_plans(false, Numerics::kFp32); }
BOOST_AUTO_TEST_CASE(exl3_gather_plans_bit_exact_bf16) { check_exact_plans(false, Numerics::kBf16); }
BOOST_AUTO_TEST_CASE(mixed_gather_plans_bit_exact_fp32) { check_exact_plans(true, Numerics::kFp32); }
BOOST_AUTO_TEST_CASE(mixed_gather_plans_bit_exact_bf16) { check_exact_plans(true, Numerics::kBf16); }

BOOST_AUTO_TEST_CASE(allreduce_top1) {
  for (Numerics n : {Numerics::kFp32, Numerics::kBf16}) {
    Models& m = models(false, n);
    auto g = ShardedModel::create_gpu(*m.host, allreduce(2), kBackend).value_or_throw();
    BOOST_TEST_REQUIRE(!g->plan().bit_exact());
    auto const got = every_rank(*g);
    int64_t const V = m.gpu->info().vocab_size;
    verify::Top1 const t = verify::top1_agreement(m.base, got[0], V, 1e-3f);
    BOOST_TEST_MESSAGE(name_of(false, n) << " tp2 all-reduce on GPU ranks: top-1 " << t.agree << "/" << t.rows
                                         << ", near-ties " << t.ties << ", max |dlogit| " << t.max_diff);
    BOOST_TEST(t.rows > 0);
    BOOST_TEST(t.agree + t.ties == t.rows, name_of(false, n));
    for (size_t r = 1; r < got.size(); ++r) BOOST_TEST(verify::bitwise_equal(got[r], got[0]), "rank " << r);
    if (!verify::kGpuModelOnCpu) continue;
    auto cpu = ShardedModel::create(*m.host, allreduce(2)).value_or_throw();
    BOOST_TEST(verify::bitwise_equal(got[0], verify::schedule_logits(*cpu, tokens())),
               name_of(false, n) << ": GPU ranks vs CPU ranks, all-reduce");
  }
}

#if TESSERA_GPU_MODEL_ON_CPU
// One process per rank builds its GPU rank model from a host model holding only its parts and routed experts; here
// threads over the in-process communicator, so in the CPU-backend build only (CUDA thread ranks need device buffers).
BOOST_AUTO_TEST_CASE(gpu_ranks_from_rank_host_models) {
  auto mf = open_model_folder(folders().exl3.dir.string()).value_or_throw();
  Models& m = models(false, Numerics::kFp32);
  for (auto const& c : {verify::tp_ep(2, 1), verify::tp_ep(2, 2)}) {
    auto const plan = dist::make_plan(model_dims(mf.spec), c).value_or_throw();
    int const n = plan.world;
    auto comms = dist::InProcessCommunicator::create(n);
    std::vector<std::unique_ptr<ThreadPool>> pools;
    std::vector<std::unique_ptr<GpuDsv41Model>> ranks;
    for (int r = 0; r < n; ++r) {
      auto host = load_rank_host_model(mf.spec, mf.src, opts(Numerics::kFp32), plan, r).value_or_throw();
      BOOST_TEST_REQUIRE(!rank_weights(*host, RankShard{plan, r, nullptr}).value_or_throw().exl3.empty());
      pools.push_back(std::make_unique<ThreadPool>(1));
      ModelOptions o = opts(Numerics::kFp32);
      o.pool = pools.back().get();
      auto sh = std::make_shared<RankShard>(RankShard{plan, r, comms[static_cast<size_t>(r)].get()});
      ranks.push_back(GpuDsv41Model::create_rank(*host, sh, o, kBackend).value_or_throw());
    }
    std::vector<std::vector<float>> got(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          got[static_cast<size_t>(r)] = verify::schedule_logits(*ranks[static_cast<size_t>(r)], tokens());
        } catch (std::exception const& e) {
          errors[static_cast<size_t>(r)] = e.what();
          comms[static_cast<size_t>(r)]->abort(e.what());
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      BOOST_TEST_REQUIRE(errors[static_cast<size_t>(r)].empty(), verify::tp_ep_name(c) << " rank " << r << ": "
                                                                   << errors[static_cast<size_t>(r)]);
      BOOST_TEST(verify::bitwise_equal(got[static_cast<size_t>(r)], m.base), verify::tp_ep_name(c) << " rank " << r);
    }
  }
}
#endif

BOOST_AUTO_TEST_SUITE_END()

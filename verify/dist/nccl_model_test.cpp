// SPDX-License-Identifier: Apache-2.0
/// The CPU-backend rank model over NCCL, one process per GPU (host buffers staged through the GPU by
/// HostStagingCommunicator). Alone: rank 0 of 1, the staging layer's collectives on host buffers and the
/// world-1 rank model. Under the launch variables with WORLD_SIZE = 2 or 4 (docs/multi-gpu.md): every
/// process runs the golden/v41-tiny fp32 model's rank of a TP = EP = WORLD_SIZE gather plan (exact), and
/// its logits must equal the single-rank model's bit for bit; then the all-reduce plan (TP 2 only, the
/// tiny model has 2 o-groups) must keep every top-1 outside near-ties. The same for the GPU rank model
/// (GpuDsv41Model::create_rank) over the NCCL communicator with device buffers: its logits must equal the
/// single-rank GPU model's bit for bit (alone: the world-1 rank model).
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tessera/dist/nccl_communicator.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "verify/gpu_model/gpu_model_fixture.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;

namespace tessera::verify {
dist::NcclCommunicator& nccl_comm();  // nccl_test.cpp
}

namespace {

std::vector<float> run_schedule(LanguageModel& m, std::vector<int32_t> const& toks) {
  int64_t V = m.info().vocab_size;
  auto st = m.new_sequence();
  std::vector<float> all;
  size_t pos = 0;
  for (size_t chunk : {9u, 1u, 1u, 1u, 1u}) {
    std::vector<float> lg(chunk * V);
    SequenceStep s{st.get(), std::span<int32_t const>(toks.data() + pos, chunk), static_cast<int64_t>(chunk), lg.data()};
    throw_if_error(m.forward(std::span<SequenceStep>(&s, 1)));
    all.insert(all.end(), lg.begin(), lg.end());
    pos += chunk;
  }
  return all;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_nccl_model)

BOOST_AUTO_TEST_CASE(host_staging_collectives) {
  dist::NcclCommunicator& c = verify::nccl_comm();
  dist::HostStagingCommunicator h(c);
  int const n = h.size(), me = h.rank();
  std::vector<float> x(64), y(64);
  for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(me * 3 + i % 7);
  BOOST_TEST_REQUIRE(h.all_reduce_sum(x.data(), y.data(), 64).ok());
  for (int i = 0; i < 64; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += static_cast<float>(r * 3 + i % 7);
    BOOST_TEST(y[i] == want);
  }
  std::vector<size_t> bytes;
  size_t total = 0;
  for (int r = 0; r < n; ++r) { bytes.push_back((r + 1) * 4); total += r + 1; }
  std::vector<float> g(total);
  BOOST_TEST_REQUIRE(h.all_gatherv(x.data(), g.data(), bytes).ok());
  size_t off = 0;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i <= r; ++i) BOOST_TEST(g[off++] == static_cast<float>(r * 3 + i % 7));
  std::vector<float> b(5, static_cast<float>(me));
  BOOST_TEST_REQUIRE(h.broadcast(b.data(), 20, 0).ok());
  BOOST_TEST(b[4] == 0.f);
}

BOOST_AUTO_TEST_CASE(rank_model_equals_single_rank) {
  dist::NcclCommunicator& c = verify::nccl_comm();
  dist::HostStagingCommunicator h(c);
  int const W = c.size();
  Dsv41Model& one = verify::tiny_model("fp32");
  std::mt19937_64 gen(4242);
  std::vector<int32_t> toks(13);
  for (auto& t : toks) t = static_cast<int32_t>(gen() % 512);
  auto base = run_schedule(one, toks);
  dist::ParallelConfig cfg;
  cfg.tp = one.spec().num_heads % W == 0 ? W : 1;
  cfg.ep = W;
  cfg.attn = dist::AttnCombine::kGather;
  auto plan = dist::make_plan(model_dims(one.spec()), cfg);
  BOOST_TEST_REQUIRE(plan.ok(), plan.status().message());
  auto sh = std::make_shared<RankShard>(RankShard{*plan, c.rank(), &h});
  ThreadPool pool(1);
  auto rm = make_rank_model(one, sh, &pool).value_or_throw();
  auto got = run_schedule(*rm, toks);
  BOOST_TEST_MESSAGE("rank " << c.rank() << " of " << W << ": tp " << cfg.tp << " ep " << cfg.ep);
  BOOST_TEST(std::memcmp(got.data(), base.data(), base.size() * sizeof(float)) == 0);
  if (W == 2) {
    cfg.attn = dist::AttnCombine::kAllReduce;
    auto p2 = dist::make_plan(model_dims(one.spec()), cfg).value_or_throw();
    auto sh2 = std::make_shared<RankShard>(RankShard{p2, c.rank(), &h});
    auto rm2 = make_rank_model(one, sh2, &pool).value_or_throw();
    auto ar = run_schedule(*rm2, toks);
    int64_t V = one.spec().vocab_size;
    for (size_t r = 0; r < base.size() / V; ++r) {
      float const* x = &base[r * V];
      int64_t ia = argmax_first(x, V);
      float second = -INFINITY;
      for (int64_t j = 0; j < V; ++j)
        if (j != ia) second = std::max(second, x[j]);
      BOOST_TEST((ia == argmax_first(&ar[r * V], V) || x[ia] - second <= 1e-3f), "row " << r);
    }
  }
}

BOOST_AUTO_TEST_CASE(gpu_rank_model_equals_single_rank) {
  // Each process: its rank of a TP = EP = WORLD_SIZE gather plan as a GPU rank model on the communicator's
  // device, collectives on device buffers through NCCL; the gather plan is exact, so its logits equal the
  // single-rank GPU model's bit for bit.
  dist::NcclCommunicator& c = verify::nccl_comm();
  BOOST_TEST_REQUIRE(cudaSetDevice(c.device()) == cudaSuccess);
  int const W = c.size();
  Dsv41Model& one = verify::tiny_model("fp32");
  ModelOptions o;
  o.numerics = one.numerics();
  auto single = verify::load_gpu_model(verify::tiny_dir("fp32"), o);
  std::mt19937_64 gen(4243);
  std::vector<int32_t> toks(13);
  for (auto& t : toks) t = static_cast<int32_t>(gen() % 512);
  auto base = run_schedule(*single, toks);
  dist::ParallelConfig cfg;
  cfg.tp = one.spec().num_heads % W == 0 ? W : 1;
  cfg.ep = W;
  cfg.attn = dist::AttnCombine::kGather;
  auto plan = dist::make_plan(model_dims(one.spec()), cfg);
  BOOST_TEST_REQUIRE(plan.ok(), plan.status().message());
  BOOST_TEST_REQUIRE(plan->bit_exact());
  auto sh = std::make_shared<RankShard>(RankShard{*plan, c.rank(), &c});
  auto rm = GpuDsv41Model::create_rank(one, sh, o, Backend::kCuda);
  BOOST_TEST_REQUIRE(rm.ok(), rm.status().message());
  BOOST_TEST_MESSAGE("GPU rank " << c.rank() << " of " << W << ": tp " << cfg.tp << " ep " << cfg.ep << ", "
                                 << (*rm)->weight_bytes() << " weight bytes (one rank: " << single->weight_bytes() << ")");
  if (W > 1) BOOST_TEST((*rm)->weight_bytes() < single->weight_bytes());
  auto got = run_schedule(**rm, toks);
  BOOST_TEST(std::memcmp(got.data(), base.data(), base.size() * sizeof(float)) == 0);
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// Multi-process serving's protocol (models/common/rank_driver.hpp) over NCCL, one process per GPU: each
/// process holds the GPU rank model of a TP = EP = WORLD_SIZE gather plan of golden/v41-tiny fp32 (collectives on
/// device buffers through the NCCL communicator); rank 0 drives it through a RankDriver whose command channel is
/// a HostStagingCommunicator over the same communicator, the others run `follow`. Rank 0's logits of a schedule
/// of two sequences (batched prefill, greedy decode together, a clone, a truncate, a release) must equal the
/// single-rank GPU model's bit for bit; an oversize request is refused with nothing broadcast; the shutdown ends
/// every follower with success. Alone: rank 0 of 1 (the driver broadcasts to itself).
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <cstring>
#include <random>

#include "tessera/dist/nccl_communicator.hpp"
#include "tessera/models/common/rank_driver.hpp"
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

std::vector<int32_t> toks(uint64_t seed, size_t n) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % 512);
  return t;
}

/// Every logit of: a and b prefilled in one batch, four greedy decode steps of both, a clone of a decoding
/// beside it, b truncated by two and decoding on, the clone released.
std::vector<float> schedule(LanguageModel& m) {
  int64_t const V = m.info().vocab_size;
  std::vector<float> all;
  auto run = [&](std::vector<std::pair<SequenceState*, std::vector<int32_t>>> const& reqs) {
    std::vector<float> lg(reqs.size() * static_cast<size_t>(V));
    std::vector<SequenceStep> steps;
    for (size_t i = 0; i < reqs.size(); ++i) steps.push_back({reqs[i].first, reqs[i].second, 1, lg.data() + i * V});
    throw_if_error(m.forward(steps));
    all.insert(all.end(), lg.begin(), lg.end());
    std::vector<int32_t> next;
    for (size_t i = 0; i < reqs.size(); ++i) next.push_back(static_cast<int32_t>(argmax_first(lg.data() + i * V, V)));
    return next;
  };
  auto a = m.new_sequence(), b = m.new_sequence();
  auto n = run({{a.get(), toks(1, 9)}, {b.get(), toks(2, 13)}});
  for (int i = 0; i < 4; ++i) n = run({{a.get(), {n[0]}}, {b.get(), {n[1]}}});
  auto c = m.clone(*a).value_or_throw();
  auto nc = run({{c.get(), {n[0]}}, {a.get(), {(n[0] + 1) % 512}}});
  throw_if_error(m.truncate(*b, b->length() - 2));
  run({{b.get(), {n[1]}}, {c.get(), {nc[0]}}});
  c.reset();
  run({{b.get(), {7}}});
  return all;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_nccl_driver)

BOOST_AUTO_TEST_CASE(gpu_rank_driver_equals_single_rank) {
  dist::NcclCommunicator& c = verify::nccl_comm();
  int const dev = c.device();
  BOOST_TEST_REQUIRE(cudaSetDevice(dev) == cudaSuccess);
  int const W = c.size();
  Dsv41Model& one = verify::tiny_model("fp32");
  ModelOptions o;
  o.numerics = one.numerics();
  dist::ParallelConfig cfg;
  cfg.tp = one.spec().num_heads % W == 0 ? W : 1;
  cfg.ep = W;
  cfg.attn = dist::AttnCombine::kGather;
  auto plan = dist::make_plan(model_dims(one.spec()), cfg);
  BOOST_TEST_REQUIRE(plan.ok(), plan.status().message());
  auto sh = std::make_shared<RankShard>(RankShard{*plan, c.rank(), &c});
  auto rm = GpuDsv41Model::create_rank(one, sh, o, Backend::kCuda);
  BOOST_TEST_REQUIRE(rm.ok(), rm.status().message());
  dist::HostStagingCommunicator channel(c);  // the commands are host data
  if (c.rank() != 0) {
    Status s = follow(**rm, channel);
    BOOST_TEST(s.ok(), s.message());
    return;
  }
  auto base = schedule(*verify::load_gpu_model(verify::tiny_dir("fp32"), o));
  auto d = RankDriver::create(**rm, channel, {}, [dev]() -> Status {
             return cudaSetDevice(dev) == cudaSuccess ? Status{} : Status(StatusCode::kCudaError, "cudaSetDevice");
           }).value_or_throw();
  auto got = schedule(*d);
  BOOST_TEST_MESSAGE("driver over " << W << " NCCL rank(s), tp " << cfg.tp << " ep " << cfg.ep << ": " << got.size() << " logits");
  BOOST_TEST((got.size() == base.size() && std::memcmp(got.data(), base.data(), base.size() * sizeof(float)) == 0));
  uint64_t const sent = d->commands_sent();
  auto s = d->new_sequence();
  std::vector<int32_t> big = toks(3, static_cast<size_t>(one.info().max_context + 1));
  std::vector<float> lg(static_cast<size_t>(one.info().vocab_size));
  SequenceStep st{s.get(), big, 1, lg.data()};
  BOOST_TEST((d->forward(std::span<SequenceStep>(&st, 1)).code() == StatusCode::kInvalidArgument));
  BOOST_TEST(d->commands_sent() == sent);
  BOOST_TEST(d->shutdown().ok());
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// One process per rank for `tessera serve --tp/--ep` (servers/cli/serve_ranks.hpp).
///
/// Start-up, on every rank: the NCCL group forms first (TCP rendezvous, then ncclCommInitRank), so slow model
/// loads wait inside NCCL rather than against the rendezvous timeout; then each rank loads its host model
/// (load_rank_host: its routed experts and its parts of the split tensors only; in bf16 block-scaled weights held as
/// stored), builds its rank model, and all ranks all-gather a start-up flag: if any rank failed, every rank exits
/// (rank 0 never listens). Signals: rank 0 drains on SIGTERM/SIGINT as `tessera serve` does and its driver's destruction sends
/// the shutdown; a follower ignores the first SIGTERM/SIGINT (a launcher's Ctrl-C reaches every rank, and rank
/// 0's drain still needs the followers) and exits at once on a second.
#include "servers/cli/serve_ranks.hpp"

#include <cstdio>
#include <exception>

#include "tessera/core/config.hpp"

#if TESSERA_WITH_NCCL
#include <signal.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <thread>

#include "tessera/dist/nccl_communicator.hpp"
#include "tessera/models/common/rank_driver.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#endif

namespace tessera::cli {

#if TESSERA_WITH_NCCL
namespace {

/// What a rank's model needs alive; members are released in reverse order (the rank model before the
/// communicators it uses).
struct RankBundle {
  std::unique_ptr<dist::NcclCommunicator> nccl;
  std::unique_ptr<dist::HostStagingCommunicator> staging;  // host buffers: the command channel, a CPU rank's collectives
  std::unique_ptr<model::LanguageModel> full;              // the CPU model (host weights a CPU rank shares)
  std::unique_ptr<model::LanguageModel> rank_model;
};

Status set_device(int d) {
  cudaError_t const e = cudaSetDevice(d);
  return e == cudaSuccess ? Status{} : Status(StatusCode::kCudaError, "cudaSetDevice(" + std::to_string(d) + "): " + cudaGetErrorString(e));
}

/// Loads this rank's host model and builds its rank model into `b`.
Status build_rank(RankBundle& b, server::ServeConfig const& c, dist::ParallelConfig const& cfg) {
  model::dsv41::ModelOptions mo;
  mo.numerics = c.numerics;
  mo.prune = c.prune;
  int const me = b.nccl->rank();
  // This rank's host model: its routed experts and its parts of the split tensors only; in bf16 block-scaled weights
  // held as stored.
  auto host = model::dsv41::load_rank_host(c.model_dir, mo, cfg, me);
  if (!host) return Status(host.status().code(), "--model " + c.model_dir + ": " + host.status().message());
  model::dsv41::Dsv41Model* const full = host->model.get();
  dist::ShardingPlan const plan = std::move(host->plan);
  b.full = std::move(host->model);
  if (c.device == "cuda") {
    // Collectives on device buffers straight through NCCL.
    auto sh = std::make_shared<model::dsv41::RankShard>(model::dsv41::RankShard{plan, me, b.nccl.get()});
    model::dsv41::ModelOptions o;
    o.numerics = full->numerics();
    o.prune = c.prune;
    TESSERA_TRY(set_device(b.nccl->device()));
    auto rm = model::dsv41::GpuDsv41Model::create_rank(*full, sh, o, Backend::kCuda);
    if (!rm) return rm.status();
    b.rank_model = std::move(*rm);
    b.full.reset();  // only read while the rank's slices were uploaded
  } else {
    // Host buffers staged through this rank's GPU; the rank model shares the replicated tensors with `full`.
    auto sh = std::make_shared<model::dsv41::RankShard>(model::dsv41::RankShard{plan, me, b.staging.get()});
    auto rm = model::dsv41::make_rank_model(*full, sh, nullptr);
    if (!rm) return rm.status();
    b.rank_model = std::move(*rm);
  }
  return {};
}

/// Every rank's start-up outcome; the first failure ("rank r: …") or success. The failing rank's message is
/// printed by that rank.
Status agree_on_startup(dist::Communicator& c, Status const& mine) {
  int32_t const ok = mine.ok() ? 1 : 0;
  std::vector<int32_t> all(static_cast<size_t>(c.size()));
  TESSERA_TRY(c.all_gather(&ok, all.data(), sizeof ok));
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r]) return Status(StatusCode::kInternal, "rank " + std::to_string(r) + " failed to start");
  return {};
}

/// Followers: the first SIGTERM/SIGINT is noted, the second ends the process.
void follower_signals(int rank) {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::thread([sigs, rank] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "tessera serve: rank %d: signal %d; following rank 0 until it shuts the group down (a second "
                         "signal exits now)\n", rank, sig);
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "tessera serve: rank %d: second signal, exiting\n", rank);
    ::_exit(130);
  }).detach();
}

}  // namespace
#endif

int serve_ranks(server::ServeConfig c, dist::ParallelConfig cfg, dist::LaunchEnv const& env) {
  int const world = std::max(cfg.tp, cfg.ep);
  if (world != env.world_size) {
    std::fprintf(stderr, "tessera serve: WORLD_SIZE=%d but --tp %d --ep %d make a group of %d ranks (one process per rank: "
                         "launch max(tp, ep) processes)\n", env.world_size, cfg.tp, cfg.ep, world);
    return 2;
  }
  if (c.model_dir.empty() || c.model_dir == "stub") {
    std::fprintf(stderr, "tessera serve: one process per rank (WORLD_SIZE=%d) needs --model DIR\n", env.world_size);
    return 2;
  }
  if (c.draft == "dspark") {
    std::fprintf(stderr, "tessera serve: --draft dspark does not run on rank models; use --draft lookup or none\n");
    return 2;
  }
  if (c.draft == "auto") c.draft = "none";
#if !TESSERA_WITH_NCCL
  std::fprintf(stderr, "tessera serve: WORLD_SIZE=%d asks for one process per rank over NCCL, and this build has no NCCL "
                       "(it needs CUDA 13 with nccl.h and libnccl.so in /usr/local/cuda: meson setup build -Dnccl=enabled); "
                       "unset WORLD_SIZE to run the ranks as threads of one process\n", env.world_size);
  return 2;
#else
  auto b = std::make_shared<RankBundle>();
  auto nccl = dist::NcclCommunicator::create(env);
  if (!nccl) {
    std::fprintf(stderr, "tessera serve: rank %d: NCCL group: %s\n", env.rank, nccl.status().message().c_str());
    return 1;
  }
  b->nccl = std::move(*nccl);
  b->staging = std::make_unique<dist::HostStagingCommunicator>(*b->nccl);
  Status built;
  try {  // every rank must reach the start-up round, whatever happened while building
    built = build_rank(*b, c, cfg);
  } catch (std::exception const& e) {
    built = Status(StatusCode::kInternal, e.what());
  }
  if (!built.ok()) std::fprintf(stderr, "tessera serve: rank %d: %s\n", env.rank, built.message().c_str());
  if (Status s = agree_on_startup(*b->staging, built); !s.ok()) {
    if (built.ok()) std::fprintf(stderr, "tessera serve: rank %d: %s\n", env.rank, s.message().c_str());
    return 1;
  }
  int const dev = b->nccl->device();
  if (env.rank != 0) {
    follower_signals(env.rank);
    std::fprintf(stderr, "tessera serve: rank %d of %d (GPU %d, %s rank model) following rank 0\n", env.rank, env.world_size,
                 dev, c.device == "cuda" ? "GPU" : "CPU");
    Status s = model::follow(*b->rank_model, *b->staging);
    if (!s.ok()) {
      std::fprintf(stderr, "tessera serve: rank %d: %s\n", env.rank, s.message().c_str());
      return 1;
    }
    std::fprintf(stderr, "tessera serve: rank %d: shut down by rank 0\n", env.rank);
    return 0;
  }
  std::function<Status()> enter;
  if (c.device == "cuda") enter = [dev] { return set_device(dev); };
  model::LanguageModel& rm = *b->rank_model;
  dist::Communicator& channel = *b->staging;
  auto driver = model::RankDriver::create(rm, channel, b, enter);
  if (!driver) {
    std::fprintf(stderr, "tessera serve: %s\n", driver.status().message().c_str());
    (void)model::shutdown_followers(channel);
    return 1;
  }
  std::fprintf(stderr, "tessera serve: rank 0 of %d processes (NCCL, GPU %d, %s rank models), tp %d, ep %d; ranks 1-%d follow\n",
               env.world_size, dev, c.device == "cuda" ? "GPU" : "CPU", cfg.tp, cfg.ep, env.world_size - 1);
  // The driver is the served model; it owns the bundle (rank model, CPU model, communicators).
  c.model = std::shared_ptr<model::LanguageModel>(std::move(*driver));
  return server::serve_main(std::move(c));
#endif
}

}  // namespace tessera::cli

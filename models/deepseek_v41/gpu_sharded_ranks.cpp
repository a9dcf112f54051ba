// SPDX-License-Identifier: Apache-2.0
/// GPU rank models as threads of one process (ShardedModel::create_gpu, sharded.hpp): the in-process
/// communicator joins the ranks; on CUDA each rank thread runs on device rank mod the visible device count, and
/// its collectives go through a staging adapter that copies the rank's device buffers to host memory, runs the
/// in-process collective there and copies the result back (the mirror image of dist::HostStagingCommunicator).
/// The adapter moves bits only, so every result is the in-process communicator's (rank-order sums included);
/// it exists to exercise the multi-rank GPU model in one process (with one GPU every rank shares it). NCCL, one
/// process per GPU, is the production path: GpuDsv41Model::create_rank over dist::NcclCommunicator.
#include <algorithm>
#include <vector>

#include "models/deepseek_v41/gpu_internal.hpp"
#include "tessera/core/thread_pool.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"

#if TESSERA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessera::model::dsv41 {

namespace {

/// Makes CUDA device `ordinal` current on the calling thread.
Status use_cuda_device(int ordinal) {
#if TESSERA_WITH_CUDA
  cudaError_t const e = cudaSetDevice(ordinal);
  if (e != cudaSuccess)
    return Status(StatusCode::kCudaError, "cudaSetDevice(" + std::to_string(ordinal) + "): " + cudaGetErrorString(e));
  return {};
#else
  (void)ordinal;
  return not_supported("Tessera was built without CUDA");
#endif
}

/// Device buffers over a host-memory communicator. Each call copies its device input to host staging memory
/// (on its own stream of the calling thread's current device, opened at the first call, and synchronised), runs
/// the inner collective on host memory, and copies the result back before returning (blocking, as the
/// interface promises). The caller must have finished writing the input (the GPU model synchronises its
/// stream before each collective).
class DeviceStagingCommunicator final : public dist::Communicator {
 public:
  explicit DeviceStagingCommunicator(dist::Communicator& host) : host_(host) {}
  ~DeviceStagingCommunicator() override {
    if (open_) mem_.close();
  }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  dist::MemorySpace memory_space() const override { return dist::MemorySpace::kDevice; }
  std::string name() const override { return host_.name() + " (device staging)"; }

  Status all_reduce_sum(float const* send, float* recv, size_t count) override {
    size_t const b = count * sizeof(float);
    TESSERA_TRY(down(send, b, in_));
    out_.resize(std::max<size_t>(b, 1));
    TESSERA_TRY(host_.all_reduce_sum(reinterpret_cast<float const*>(in_.data()), reinterpret_cast<float*>(out_.data()), count));
    return up(recv, out_.data(), b);
  }
  Status all_gather(void const* send, void* recv, size_t bytes) override {
    size_t const total = bytes * static_cast<size_t>(size());
    TESSERA_TRY(down(send, bytes, in_));
    out_.resize(std::max<size_t>(total, 1));
    TESSERA_TRY(host_.all_gather(in_.data(), out_.data(), bytes));
    return up(recv, out_.data(), total);
  }
  Status all_gatherv(void const* send, void* recv, std::span<size_t const> bytes) override {
    if (static_cast<int>(bytes.size()) != size()) return invalid_argument("all_gatherv: one size per rank expected");
    size_t total = 0;
    for (size_t b : bytes) total += b;
    TESSERA_TRY(down(send, bytes[static_cast<size_t>(rank())], in_));
    out_.resize(std::max<size_t>(total, 1));
    TESSERA_TRY(host_.all_gatherv(in_.data(), out_.data(), bytes));
    return up(recv, out_.data(), total);
  }
  Status reduce_scatter_sum(float const* send, float* recv, size_t count) override {
    size_t const b = count * sizeof(float);
    TESSERA_TRY(down(send, b * static_cast<size_t>(size()), in_));
    out_.resize(std::max<size_t>(b, 1));
    TESSERA_TRY(host_.reduce_scatter_sum(reinterpret_cast<float const*>(in_.data()), reinterpret_cast<float*>(out_.data()),
                                         count));
    return up(recv, out_.data(), b);
  }
  Status all_to_allv(void const* send, std::span<size_t const> send_bytes, std::span<size_t const> send_off, void* recv,
                     std::span<size_t const> recv_bytes, std::span<size_t const> recv_off) override {
    size_t const n = static_cast<size_t>(size());
    if (send_bytes.size() != n || send_off.size() != n || recv_bytes.size() != n || recv_off.size() != n)
      return invalid_argument("all_to_allv: size/offset vectors must have one entry per rank");
    size_t in = 0, out = 0;
    for (size_t q = 0; q < n; ++q) {
      in = std::max(in, send_off[q] + send_bytes[q]);
      out = std::max(out, recv_off[q] + recv_bytes[q]);
    }
    TESSERA_TRY(down(send, in, in_));
    out_.resize(std::max<size_t>(out, 1));
    TESSERA_TRY(host_.all_to_allv(in_.data(), send_bytes, send_off, out_.data(), recv_bytes, recv_off));
    // Only the received blocks are defined: copy those back.
    for (size_t q = 0; q < n; ++q)
      TESSERA_TRY(up(static_cast<unsigned char*>(recv) + recv_off[q], out_.data() + recv_off[q], recv_bytes[q]));
    return {};
  }
  Status broadcast(void* buf, size_t bytes, int root) override {
    TESSERA_TRY(down(buf, bytes, in_));
    TESSERA_TRY(host_.broadcast(in_.data(), bytes, root));
    return up(buf, in_.data(), bytes);
  }
  Status barrier() override { return host_.barrier(); }

 private:
  Status ready() {
    if (open_) return {};
    mem_.backend = Backend::kCuda;
    DeviceInfo info;
    TESSERA_TRY(mem_.open(&info));
    open_ = true;
    return {};
  }
  Status down(void const* dev, size_t bytes, std::vector<unsigned char>& host) {
    host.resize(std::max<size_t>(bytes, 1));
    if (bytes == 0) return {};
    TESSERA_TRY(ready());
    TESSERA_TRY(mem_.copy(host.data(), dev, bytes, gpu::Mem::Copy::kDevToHost));
    return mem_.sync();
  }
  Status up(void* dev, unsigned char const* host, size_t bytes) {
    if (bytes == 0) return {};
    TESSERA_TRY(ready());
    TESSERA_TRY(mem_.copy(dev, host, bytes, gpu::Mem::Copy::kHostToDev));
    return mem_.sync();
  }

  dist::Communicator& host_;
  gpu::Mem mem_;
  bool open_ = false;
  std::vector<unsigned char> in_, out_;
};

}  // namespace

Result<std::unique_ptr<ShardedModel>> ShardedModel::create_gpu(Dsv41Model const& full, dist::ParallelConfig cfg,
                                                              Backend backend, ModelOptions opts) {
  if (backend == Backend::kCuda && !cuda_model_available())
    return not_supported("--device cuda: this build has no CUDA support or no CUDA device is visible");
  auto plan = dist::make_plan(model_dims(full.spec()), cfg);
  if (!plan) return plan.status();
  opts.numerics = full.numerics();
  std::unique_ptr<ShardedModel> m(new ShardedModel());
  int const n = plan->world;
  if (backend == Backend::kCuda) {
    int const devices = cuda_device_count();
    m->enter_rank_ = [devices](int r) { return use_cuda_device(r % devices); };
    m->wrap_comm_ = [](dist::Communicator& host, int) -> std::unique_ptr<dist::Communicator> {
      return std::make_unique<DeviceStagingCommunicator>(host);
    };
  }
  for (int r = 0; r < n; ++r) {
    m->pools_.push_back(std::make_unique<ThreadPool>(1));  // the CPU op backends' threads of rank r
    auto sh = std::make_shared<RankShard>();
    sh->plan = *plan;
    sh->rank = r;
    m->shards_.push_back(sh);
  }
  m->make_group(n);
  for (int r = 0; r < n; ++r) {
    TESSERA_TRY(m->enter_rank(r));  // the rank's stream and weights on its device
    ModelOptions o = opts;
    o.pool = m->pools_[r].get();
    auto rm = GpuDsv41Model::create_rank(full, m->shards_[r], std::move(o), backend);
    if (!rm) return rm.status();
    m->ranks_.push_back(std::move(*rm));
  }
  TESSERA_TRY(m->enter_rank(0));
  m->info_ = m->ranks_[0]->info();
  m->info_.device = std::string(backend == Backend::kCuda ? "cuda" : "cpu backend") + " (in-process tp=" +
                    std::to_string(cfg.tp) + " ep=" + std::to_string(cfg.ep) + ")";
  m->bf16_ = full.numerics() == Numerics::kBf16;
  m->hooks_ = [](LanguageModel& lm) {
    auto& rm = static_cast<GpuDsv41Model&>(lm);
    GoldenGateHooks h;
    h.set_boundary_ulps = [&rm](int u) { rm.set_boundary_ulps(u); };
    h.ties = &GpuDsv41Model::ties;
    h.boundaries = &GpuDsv41Model::quant_boundaries;
    return h;
  };
  return m;
}

}  // namespace tessera::model::dsv41

// SPDX-License-Identifier: Apache-2.0
/// NcclCommunicator (include/tessera/dist/nccl_communicator.hpp): NCCL 2.x collectives on one stream per
/// communicator, synchronised before each call returns; byte collectives move ncclUint8, reductions are
/// ncclFloat32 sums. all_gatherv and all_to_allv are grouped broadcasts / send-recv pairs.
#include "tessera/dist/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <cstring>
#include <vector>

namespace tessera::dist {

namespace {

Status nccl_status(ncclResult_t r, char const* what) {
  if (r == ncclSuccess) return {};
  return Status(StatusCode::kInternal, std::string("nccl ") + what + ": " + ncclGetErrorString(r));
}
Status cuda_status(cudaError_t r, char const* what) {
  if (r == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(r));
}

}  // namespace

struct NcclCommunicator::Impl {
  LaunchEnv env;
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float for barrier()

  ~Impl() {
    if (comm) ncclCommDestroy(comm);
    if (scratch) cudaFree(scratch);
    if (stream) cudaStreamDestroy(stream);
  }
  Status sync(char const* what) { return cuda_status(cudaStreamSynchronize(stream), what); }
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCommunicator::~NcclCommunicator() = default;

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create_from_env(double timeout_s) {
  auto env = launch_env_from_environment();
  if (!env) return env.status();
  return create(*env, timeout_s);
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(LaunchEnv const& env, double timeout_s) {
  // NVLink SHARP / multicast off before NCCL reads its environment: NVLS multicast objects on shared
  // machines can put the GPUs out of service for everyone until a reset. Overrides an inherited value.
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  int count = 0;
  TESSERA_TRY(cuda_status(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (count < 1) return not_supported("nccl communicator: no CUDA device visible");
  impl->device = env.local_rank % count;
  TESSERA_TRY(cuda_status(cudaSetDevice(impl->device), "cudaSetDevice"));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  std::vector<uint8_t> blob;
  if (env.rank == 0) {
    TESSERA_TRY(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    blob.assign(reinterpret_cast<uint8_t const*>(&id), reinterpret_cast<uint8_t const*>(&id) + sizeof id);
  }
  auto got = tcp_rendezvous(env, blob, timeout_s);
  if (!got) return got.status();
  if (got->size() != sizeof id)
    return malformed("nccl communicator: the rendezvous delivered " + std::to_string(got->size()) +
                     " bytes, an ncclUniqueId has " + std::to_string(sizeof id));
  std::memcpy(&id, got->data(), sizeof id);
  TESSERA_TRY(cuda_status(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  TESSERA_TRY(cuda_status(cudaMalloc(&impl->scratch, sizeof(float)), "cudaMalloc"));
  TESSERA_TRY(nccl_status(ncclCommInitRank(&impl->comm, env.world_size, id, env.rank), "ncclCommInitRank"));
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(impl)));
}

int NcclCommunicator::rank() const { return impl_->env.rank; }
int NcclCommunicator::size() const { return impl_->env.world_size; }
int NcclCommunicator::device() const { return impl_->device; }
void* NcclCommunicator::stream() const { return impl_->stream; }

Status NcclCommunicator::all_reduce_sum(float const* send, float* recv, size_t count) {
  TESSERA_TRY(nccl_status(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce"));
  return impl_->sync("all_reduce_sum");
}

Status NcclCommunicator::all_gather(void const* send, void* recv, size_t bytes) {
  TESSERA_TRY(nccl_status(ncclAllGather(send, recv, bytes, ncclUint8, impl_->comm, impl_->stream), "ncclAllGather"));
  return impl_->sync("all_gather");
}

Status NcclCommunicator::all_gatherv(void const* send, void* recv, std::span<size_t const> bytes) {
  if (static_cast<int>(bytes.size()) != size())
    return invalid_argument("nccl all_gatherv: " + std::to_string(bytes.size()) + " sizes for " + std::to_string(size()) + " ranks");
  TESSERA_TRY(nccl_status(ncclGroupStart(), "ncclGroupStart"));
  size_t off = 0;
  Status s;
  for (int r = 0; r < size() && s.ok(); ++r) {
    auto* dst = static_cast<uint8_t*>(recv) + off;
    if (bytes[r]) s = nccl_status(ncclBroadcast(r == rank() ? send : dst, dst, bytes[r], ncclUint8, r, impl_->comm, impl_->stream),
                                  "ncclBroadcast");
    off += bytes[r];
  }
  Status e = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
  TESSERA_TRY(s);
  TESSERA_TRY(e);
  return impl_->sync("all_gatherv");
}

Status NcclCommunicator::reduce_scatter_sum(float const* send, float* recv, size_t count) {
  TESSERA_TRY(nccl_status(ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, impl_->comm, impl_->stream),
                          "ncclReduceScatter"));
  return impl_->sync("reduce_scatter_sum");
}

Status NcclCommunicator::all_to_allv(void const* send, std::span<size_t const> send_bytes, std::span<size_t const> send_off,
                                     void* recv, std::span<size_t const> recv_bytes, std::span<size_t const> recv_off) {
  size_t const n = static_cast<size_t>(size());
  if (send_bytes.size() != n || send_off.size() != n || recv_bytes.size() != n || recv_off.size() != n)
    return invalid_argument("nccl all_to_allv: size/offset vectors must have one entry per rank");
  TESSERA_TRY(nccl_status(ncclGroupStart(), "ncclGroupStart"));
  Status s;
  for (int q = 0; q < size() && s.ok(); ++q) {
    if (send_bytes[q])
      s = nccl_status(ncclSend(static_cast<uint8_t const*>(send) + send_off[q], send_bytes[q], ncclUint8, q, impl_->comm,
                               impl_->stream), "ncclSend");
    if (s.ok() && recv_bytes[q])
      s = nccl_status(ncclRecv(static_cast<uint8_t*>(recv) + recv_off[q], recv_bytes[q], ncclUint8, q, impl_->comm,
                               impl_->stream), "ncclRecv");
  }
  Status e = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
  TESSERA_TRY(s);
  TESSERA_TRY(e);
  return impl_->sync("all_to_allv");
}

Status NcclCommunicator::broadcast(void* buf, size_t bytes, int root) {
  if (root < 0 || root >= size()) return invalid_argument("nccl broadcast: root " + std::to_string(root) + " out of range");
  TESSERA_TRY(nccl_status(ncclBroadcast(buf, buf, bytes, ncclUint8, root, impl_->comm, impl_->stream), "ncclBroadcast"));
  return impl_->sync("broadcast");
}

Status NcclCommunicator::barrier() {
  TESSERA_TRY(nccl_status(ncclAllReduce(impl_->scratch, impl_->scratch, 1, ncclFloat32, ncclSum, impl_->comm, impl_->stream),
                          "ncclAllReduce (barrier)"));
  return impl_->sync("barrier");
}

}  // namespace tessera::dist

namespace tessera::dist {

HostStagingCommunicator::HostStagingCommunicator(NcclCommunicator& inner) : inner_(inner) {}

HostStagingCommunicator::~HostStagingCommunicator() {
  if (din_) cudaFree(din_);
  if (dout_) cudaFree(dout_);
}

Status HostStagingCommunicator::reserve(size_t in, size_t out) {
  TESSERA_TRY(cuda_status(cudaSetDevice(inner_.device()), "cudaSetDevice"));
  for (auto [p, cap, need] : {std::tuple{&din_, &cap_in_, in}, std::tuple{&dout_, &cap_out_, out}}) {
    if (need <= *cap) continue;
    if (*p) cudaFree(*p);
    *p = nullptr;
    *cap = 0;
    TESSERA_TRY(cuda_status(cudaMalloc(p, need), "cudaMalloc (host staging)"));
    *cap = need;
  }
  return {};
}
Status HostStagingCommunicator::up(void const* host, size_t bytes) {
  return bytes ? cuda_status(cudaMemcpy(din_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D") : Status{};
}
Status HostStagingCommunicator::down(void* host, size_t bytes) {
  return bytes ? cuda_status(cudaMemcpy(host, dout_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H") : Status{};
}

Status HostStagingCommunicator::all_reduce_sum(float const* send, float* recv, size_t count) {
  size_t const b = count * sizeof(float);
  TESSERA_TRY(reserve(b + 1, b + 1));
  TESSERA_TRY(up(send, b));
  TESSERA_TRY(inner_.all_reduce_sum(static_cast<float*>(din_), static_cast<float*>(dout_), count));
  return down(recv, b);
}
Status HostStagingCommunicator::all_gather(void const* send, void* recv, size_t bytes) {
  TESSERA_TRY(reserve(bytes + 1, bytes * static_cast<size_t>(size()) + 1));
  TESSERA_TRY(up(send, bytes));
  TESSERA_TRY(inner_.all_gather(din_, dout_, bytes));
  return down(recv, bytes * static_cast<size_t>(size()));
}
Status HostStagingCommunicator::all_gatherv(void const* send, void* recv, std::span<size_t const> bytes) {
  if (static_cast<int>(bytes.size()) != size()) return invalid_argument("all_gatherv: one size per rank expected");
  size_t total = 0;
  for (size_t b : bytes) total += b;
  TESSERA_TRY(reserve(bytes[rank()] + 1, total + 1));
  TESSERA_TRY(up(send, bytes[rank()]));
  TESSERA_TRY(inner_.all_gatherv(din_, dout_, bytes));
  return down(recv, total);
}
Status HostStagingCommunicator::reduce_scatter_sum(float const* send, float* recv, size_t count) {
  size_t const b = count * sizeof(float);
  TESSERA_TRY(reserve(b * static_cast<size_t>(size()) + 1, b + 1));
  TESSERA_TRY(up(send, b * static_cast<size_t>(size())));
  TESSERA_TRY(inner_.reduce_scatter_sum(static_cast<float*>(din_), static_cast<float*>(dout_), count));
  return down(recv, b);
}
Status HostStagingCommunicator::all_to_allv(void const* send, std::span<size_t const> send_bytes,
                                            std::span<size_t const> send_off, void* recv,
                                            std::span<size_t const> recv_bytes, std::span<size_t const> recv_off) {
  size_t const n = static_cast<size_t>(size());
  if (send_bytes.size() != n || send_off.size() != n || recv_bytes.size() != n || recv_off.size() != n)
    return invalid_argument("all_to_allv: size/offset vectors must have one entry per rank");
  size_t in = 0, out = 0;
  for (size_t q = 0; q < n; ++q) {
    in = std::max(in, send_off[q] + send_bytes[q]);
    out = std::max(out, recv_off[q] + recv_bytes[q]);
  }
  TESSERA_TRY(reserve(in + 1, out + 1));
  TESSERA_TRY(up(send, in));
  TESSERA_TRY(inner_.all_to_allv(din_, send_bytes, send_off, dout_, recv_bytes, recv_off));
  // Only the received blocks are defined on the device: copy those back.
  for (size_t q = 0; q < n; ++q)
    if (recv_bytes[q])
      TESSERA_TRY(cuda_status(cudaMemcpy(static_cast<uint8_t*>(recv) + recv_off[q], static_cast<uint8_t*>(dout_) + recv_off[q],
                                         recv_bytes[q], cudaMemcpyDeviceToHost), "cudaMemcpy D2H"));
  return {};
}
Status HostStagingCommunicator::broadcast(void* buf, size_t bytes, int root) {
  TESSERA_TRY(reserve(bytes + 1, 1));
  TESSERA_TRY(up(buf, bytes));
  TESSERA_TRY(inner_.broadcast(din_, bytes, root));
  return bytes ? cuda_status(cudaMemcpy(buf, din_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H") : Status{};
}

}  // namespace tessera::dist

// SPDX-License-Identifier: Apache-2.0
/// The NCCL communicator (include/tessera/dist/communicator.hpp): one process per rank, one GPU per
/// process (LOCAL_RANK modulo the visible device count), bootstrapped like torchrun (dist/bootstrap.hpp:
/// rank 0 makes the ncclUniqueId and hands it out over the TCP rendezvous). Buffers are device pointers
/// of that GPU. Each collective is enqueued on the communicator's own stream, which is synchronised
/// before the call returns (blocking semantics, as the interface promises). Built only when the `nccl`
/// feature finds NCCL (TESSERA_WITH_NCCL); this header is plain C++ and declares no CUDA types.
///
/// NVLink multicast (NVLS) is forced off: `create` sets NCCL_NVLS_ENABLE=0 in the process environment
/// before ncclCommInitRank, overriding any inherited value, because NVLS reservations of multicast
/// objects on shared machines can leave the GPUs unusable for other tenants until a reset.
#pragma once

#include <memory>

#include "tessera/dist/bootstrap.hpp"
#include "tessera/dist/communicator.hpp"

namespace tessera::dist {

class NcclCommunicator final : public Communicator {
 public:
  /// Bootstraps from the environment (launch_env_from_environment) and the TCP rendezvous.
  static Result<std::unique_ptr<NcclCommunicator>> create_from_env(double timeout_s = 300);
  static Result<std::unique_ptr<NcclCommunicator>> create(LaunchEnv const& env, double timeout_s = 300);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  std::string name() const override { return "nccl"; }
  int device() const;
  /// The cudaStream_t the collectives run on.
  void* stream() const;
  Status all_reduce_sum(float const* send, float* recv, size_t count) override;
  Status all_gather(void const* send, void* recv, size_t bytes) override;
  /// Grouped ncclBroadcast, one per contributing rank (NCCL has no all-gather-v).
  Status all_gatherv(void const* send, void* recv, std::span<size_t const> bytes) override;
  Status reduce_scatter_sum(float const* send, float* recv, size_t count) override;
  /// Grouped ncclSend/ncclRecv pairs.
  Status all_to_allv(void const* send, std::span<size_t const> send_bytes, std::span<size_t const> send_off, void* recv,
                     std::span<size_t const> recv_bytes, std::span<size_t const> recv_off) override;
  Status broadcast(void* buf, size_t bytes, int root) override;
  /// A one-float all-reduce on the stream, then a stream synchronisation.
  Status barrier() override;

  struct Impl;

 private:
  explicit NcclCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Host buffers over a device communicator: every call copies its inputs to device scratch buffers
/// (grown on demand), runs the collective there and copies the result back. Lets the CPU-backend rank
/// model (models/deepseek_v41/sharded.hpp) run one process per GPU over NCCL: slow, but the same
/// collectives in the same order as a GPU model would issue. Results are those of the inner
/// communicator (NCCL's reduction order for sums).
class HostStagingCommunicator final : public Communicator {
 public:
  explicit HostStagingCommunicator(NcclCommunicator& inner);
  ~HostStagingCommunicator() override;

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::string name() const override { return "nccl (host staging)"; }
  Status all_reduce_sum(float const* send, float* recv, size_t count) override;
  Status all_gather(void const* send, void* recv, size_t bytes) override;
  Status all_gatherv(void const* send, void* recv, std::span<size_t const> bytes) override;
  Status reduce_scatter_sum(float const* send, float* recv, size_t count) override;
  Status all_to_allv(void const* send, std::span<size_t const> send_bytes, std::span<size_t const> send_off, void* recv,
                     std::span<size_t const> recv_bytes, std::span<size_t const> recv_off) override;
  Status broadcast(void* buf, size_t bytes, int root) override;
  Status barrier() override { return inner_.barrier(); }

 private:
  /// Device buffers of at least `in` and `out` bytes.
  Status reserve(size_t in, size_t out);
  Status up(void const* host, size_t bytes);
  Status down(void* host, size_t bytes);
  NcclCommunicator& inner_;
  void* din_ = nullptr;
  void* dout_ = nullptr;
  size_t cap_in_ = 0, cap_out_ = 0;
};

}  // namespace tessera::dist

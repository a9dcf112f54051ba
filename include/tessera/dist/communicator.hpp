// SPDX-License-Identifier: Apache-2.0
/// Collective communication between the ranks of one tensor/expert-parallel group (docs/multi-gpu.md).
/// Every rank calls the same collectives in the same order with the same sizes; a call returns once this
/// rank's receive buffer holds the result (blocking semantics), so the caller may reuse its buffers.
///
/// Buffers live in the communicator's memory space: host memory for the in-process communicator, device
/// memory of the rank's GPU for the NCCL one (`memory_space()`). Data-movement collectives are untyped
/// (bytes); reductions are fp32 sums.
///
/// Reduction order (the determinism contract):
///  * InProcessCommunicator: out[i] = (((x_0[i] + x_1[i]) + x_2[i]) + … + x_{N−1}[i]) in fp32, starting
///    from rank 0's element and adding ranks in increasing rank order; every rank computes the same sum, so
///    all ranks get the same bits, and the result is a pure function of the inputs (reproducible).
///  * NcclCommunicator: NCCL's own order (ring or tree, chosen from topology and size); deterministic for a
///    fixed topology, NCCL version and configuration, but not equal to the in-process order. The model
///    uses sums only where docs/multi-gpu.md states the resulting bound; every exact path is built from
///    gathers, which move bits and never round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/status.hpp"

namespace tessera::dist {

enum class MemorySpace : uint8_t { kHost, kDevice };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual MemorySpace memory_space() const = 0;
  /// "in-process" or "nccl", for messages.
  virtual std::string name() const = 0;

  /// recv[i] = Σ_r send_r[i] (fp32, order above); send == recv is allowed.
  virtual Status all_reduce_sum(float const* send, float* recv, size_t count) = 0;
  /// recv[r·bytes .. (r+1)·bytes) = send of rank r (bytes per rank equal on all ranks).
  virtual Status all_gather(void const* send, void* recv, size_t bytes) = 0;
  /// Variable sizes: rank r contributes bytes[r] (the same vector on every rank); recv holds the
  /// contributions back to back in rank order (offset of r = Σ_{q<r} bytes[q]).
  virtual Status all_gatherv(void const* send, void* recv, std::span<size_t const> bytes) = 0;
  /// recv[i] = Σ_r send_r[rank·count + i] for i < count (send holds size()·count floats).
  virtual Status reduce_scatter_sum(float const* send, float* recv, size_t count) = 0;
  /// Rank r sends send[send_off[q] .. +send_bytes[q]) to each rank q and receives rank q's block for it at
  /// recv[recv_off[q] .. +recv_bytes[q]); recv_bytes[q] must equal rank q's send_bytes[r].
  virtual Status all_to_allv(void const* send, std::span<size_t const> send_bytes, std::span<size_t const> send_off,
                             void* recv, std::span<size_t const> recv_bytes, std::span<size_t const> recv_off) = 0;
  /// Root's buffer is copied to every rank's buffer.
  virtual Status broadcast(void* buf, size_t bytes, int root) = 0;
  virtual Status barrier() = 0;
};

/// All-to-all of equal blocks (bytes per destination rank), built on all_to_allv.
Status all_to_all(Communicator& c, void const* send, void* recv, size_t bytes_per_rank);

/// Ranks as threads of one process sharing host memory (tests and the CPU backend). `create(n)` makes
/// the n communicators of one group; rank r's must be used by one thread at a time. If a rank calls
/// `abort`, every rank blocked in (or later entering) a collective of the group returns an error instead
/// of waiting forever for it.
class InProcessCommunicator final : public Communicator {
 public:
  static std::vector<std::unique_ptr<InProcessCommunicator>> create(int size);
  ~InProcessCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override;
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::string name() const override { return "in-process"; }
  Status all_reduce_sum(float const* send, float* recv, size_t count) override;
  Status all_gather(void const* send, void* recv, size_t bytes) override;
  Status all_gatherv(void const* send, void* recv, std::span<size_t const> bytes) override;
  Status reduce_scatter_sum(float const* send, float* recv, size_t count) override;
  Status all_to_allv(void const* send, std::span<size_t const> send_bytes, std::span<size_t const> send_off, void* recv,
                     std::span<size_t const> recv_bytes, std::span<size_t const> recv_off) override;
  Status broadcast(void* buf, size_t bytes, int root) override;
  Status barrier() override;
  /// Fails the group's current and future collectives (a rank that hit an error calls it).
  void abort(std::string const& why);

  struct Group;

 private:
  InProcessCommunicator(std::shared_ptr<Group> g, int rank) : group_(std::move(g)), rank_(rank) {}
  std::shared_ptr<Group> group_;
  int rank_ = 0;
};

}  // namespace tessera::dist

// SPDX-License-Identifier: Apache-2.0
/// The in-process communicator (include/tessera/dist/communicator.hpp): ranks are threads sharing host
/// memory. Every collective is post → barrier → each rank computes its own result from the posted
/// buffers into a private copy → barrier → copy out, so a rank may pass the same buffer as send and
/// receive, and no rank overwrites a buffer another rank is still reading. Sums run in rank order.
#include "tessera/dist/communicator.hpp"

#include <condition_variable>
#include <cstring>
#include <mutex>

namespace tessera::dist {

struct InProcessCommunicator::Group {
  struct Slot {
    void const* send = nullptr;
    void* buf = nullptr;  // broadcast
    size_t bytes = 0;     // the size argument as the rank passed it (checked for agreement)
    int root = 0;
    std::span<size_t const> send_bytes, send_off;
  };
  explicit Group(int n) : size(n), slots(static_cast<size_t>(n)) {}
  int const size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string why;
  std::vector<Slot> slots;

  /// A generation barrier; an error once the group is aborted.
  Status wait() {
    std::unique_lock<std::mutex> lk(mu);
    if (aborted) return Status(StatusCode::kInternal, "in-process communicator aborted: " + why);
    uint64_t const gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return {};
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    if (generation != gen) return {};
    return Status(StatusCode::kInternal, "in-process communicator aborted: " + why);
  }
  /// The same size argument on every rank, or an error naming the collective (every rank sees the same
  /// slots after the first barrier, so all ranks fail together).
  Status agree(char const* what) const {
    for (auto const& s : slots)
      if (s.bytes != slots[0].bytes || s.root != slots[0].root)
        return invalid_argument(std::string("in-process ") + what + ": ranks passed different sizes or roots");
    return {};
  }
};

std::vector<std::unique_ptr<InProcessCommunicator>> InProcessCommunicator::create(int size) {
  if (size < 1) throw Error(invalid_argument("in-process communicator: size must be >= 1"));
  auto g = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<InProcessCommunicator>> out;
  for (int r = 0; r < size; ++r) out.emplace_back(new InProcessCommunicator(g, r));
  return out;
}

InProcessCommunicator::~InProcessCommunicator() = default;

int InProcessCommunicator::size() const { return group_->size; }

void InProcessCommunicator::abort(std::string const& why) {
  std::lock_guard<std::mutex> lk(group_->mu);
  if (!group_->aborted) group_->why = "rank " + std::to_string(rank_) + ": " + why;
  group_->aborted = true;
  group_->cv.notify_all();
}

Status InProcessCommunicator::all_reduce_sum(float const* send, float* recv, size_t count) {
  Group& g = *group_;
  g.slots[rank_] = {send, nullptr, count, 0, {}, {}};
  TESSERA_TRY(g.wait());
  Status s = g.agree("all_reduce_sum");
  std::vector<float> acc;
  if (s.ok()) {
    auto const* x0 = static_cast<float const*>(g.slots[0].send);
    acc.assign(x0, x0 + count);
    for (int r = 1; r < g.size; ++r) {
      auto const* xr = static_cast<float const*>(g.slots[r].send);
      for (size_t i = 0; i < count; ++i) acc[i] += xr[i];
    }
  }
  TESSERA_TRY(g.wait());
  TESSERA_TRY(s);
  if (count) std::memcpy(recv, acc.data(), count * sizeof(float));
  return {};
}

Status InProcessCommunicator::all_gather(void const* send, void* recv, size_t bytes) {
  std::vector<size_t> sizes(static_cast<size_t>(size()), bytes);
  return all_gatherv(send, recv, sizes);
}

Status InProcessCommunicator::all_gatherv(void const* send, void* recv, std::span<size_t const> bytes) {
  Group& g = *group_;
  if (static_cast<int>(bytes.size()) != g.size)
    return invalid_argument("in-process all_gatherv: " + std::to_string(bytes.size()) + " sizes for " +
                            std::to_string(g.size) + " ranks");
  size_t total = 0;
  for (size_t b : bytes) total += b;
  g.slots[rank_] = {send, nullptr, total, 0, bytes, {}};
  TESSERA_TRY(g.wait());
  Status s = g.agree("all_gatherv");
  for (int r = 0; s.ok() && r < g.size; ++r)
    if (g.slots[r].send_bytes[rank_] != bytes[rank_] || g.slots[r].send_bytes[r] != bytes[r])
      s = invalid_argument("in-process all_gatherv: ranks passed different size vectors");
  std::vector<unsigned char> out;
  if (s.ok()) {
    out.resize(total);
    size_t off = 0;
    for (int r = 0; r < g.size; ++r) {
      if (bytes[r]) std::memcpy(out.data() + off, g.slots[r].send, bytes[r]);
      off += bytes[r];
    }
  }
  TESSERA_TRY(g.wait());
  TESSERA_TRY(s);
  if (total) std::memcpy(recv, out.data(), total);
  return {};
}

Status InProcessCommunicator::reduce_scatter_sum(float const* send, float* recv, size_t count) {
  Group& g = *group_;
  g.slots[rank_] = {send, nullptr, count, 0, {}, {}};
  TESSERA_TRY(g.wait());
  Status s = g.agree("reduce_scatter_sum");
  std::vector<float> acc;
  if (s.ok()) {
    size_t const base = static_cast<size_t>(rank_) * count;
    auto const* x0 = static_cast<float const*>(g.slots[0].send) + base;
    acc.assign(x0, x0 + count);
    for (int r = 1; r < g.size; ++r) {
      auto const* xr = static_cast<float const*>(g.slots[r].send) + base;
      for (size_t i = 0; i < count; ++i) acc[i] += xr[i];
    }
  }
  TESSERA_TRY(g.wait());
  TESSERA_TRY(s);
  if (count) std::memcpy(recv, acc.data(), count * sizeof(float));
  return {};
}

Status InProcessCommunicator::all_to_allv(void const* send, std::span<size_t const> send_bytes,
                                          std::span<size_t const> send_off, void* recv,
                                          std::span<size_t const> recv_bytes, std::span<size_t const> recv_off) {
  Group& g = *group_;
  size_t const n = static_cast<size_t>(g.size);
  if (send_bytes.size() != n || send_off.size() != n || recv_bytes.size() != n || recv_off.size() != n)
    return invalid_argument("in-process all_to_allv: size/offset vectors must have one entry per rank");
  g.slots[rank_] = {send, nullptr, 0, 0, send_bytes, send_off};
  TESSERA_TRY(g.wait());
  Status s;
  for (int q = 0; s.ok() && q < g.size; ++q)
    if (g.slots[q].send_bytes[rank_] != recv_bytes[q])
      s = invalid_argument("in-process all_to_allv: rank " + std::to_string(rank_) + " expects " +
                           std::to_string(recv_bytes[q]) + " bytes from rank " + std::to_string(q) + ", which sends " +
                           std::to_string(g.slots[q].send_bytes[rank_]));
  std::vector<std::vector<unsigned char>> blocks(n);
  if (s.ok())
    for (int q = 0; q < g.size; ++q) {
      auto const* src = static_cast<unsigned char const*>(g.slots[q].send) + g.slots[q].send_off[rank_];
      blocks[q].assign(src, src + recv_bytes[q]);
    }
  TESSERA_TRY(g.wait());
  TESSERA_TRY(s);
  for (size_t q = 0; q < n; ++q)
    if (recv_bytes[q]) std::memcpy(static_cast<unsigned char*>(recv) + recv_off[q], blocks[q].data(), recv_bytes[q]);
  return {};
}

Status InProcessCommunicator::broadcast(void* buf, size_t bytes, int root) {
  Group& g = *group_;
  if (root < 0 || root >= g.size) return invalid_argument("in-process broadcast: root " + std::to_string(root) + " out of range");
  g.slots[rank_] = {buf, buf, bytes, root, {}, {}};
  TESSERA_TRY(g.wait());
  Status s = g.agree("broadcast");
  std::vector<unsigned char> copy;
  if (s.ok() && rank_ != root) {
    auto const* src = static_cast<unsigned char const*>(g.slots[root].send);
    copy.assign(src, src + bytes);
  }
  TESSERA_TRY(g.wait());
  TESSERA_TRY(s);
  if (rank_ != root && bytes) std::memcpy(buf, copy.data(), bytes);
  return {};
}

Status InProcessCommunicator::barrier() {
  TESSERA_TRY(group_->wait());
  return {};
}

Status all_to_all(Communicator& c, void const* send, void* recv, size_t bytes_per_rank) {
  size_t const n = static_cast<size_t>(c.size());
  std::vector<size_t> sizes(n, bytes_per_rank), offs(n);
  for (size_t r = 0; r < n; ++r) offs[r] = r * bytes_per_rank;
  return c.all_to_allv(send, sizes, offs, recv, sizes, offs);
}

}  // namespace tessera::dist

// SPDX-License-Identifier: Apache-2.0
/// The NCCL communicator on real GPUs. Alone (the gpu suite) it runs as rank 0 of 1 with a loopback
/// rendezvous; launched once per GPU with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set
/// (docs/multi-gpu.md) every process runs the same cases as its rank. Inputs are a function of
/// (rank, index) so each rank knows every rank's contribution; sums use small integers, exact in any
/// order, so results are compared bit for bit whatever order NCCL reduces in. NCCL_NVLS_ENABLE must read
/// 0 after the communicator exists.
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tessera/dist/nccl_communicator.hpp"

using namespace tessera;
using namespace tessera::dist;

namespace tessera::verify {
/// The process's communicator, shared by the NCCL suites of this executable.
NcclCommunicator& nccl_comm();
}

namespace {

NcclCommunicator& comm() { return verify::nccl_comm(); }

}  // namespace

NcclCommunicator& tessera::verify::nccl_comm() {
  static std::unique_ptr<NcclCommunicator> c = [] {
    if (!std::getenv("WORLD_SIZE")) {
      ::setenv("WORLD_SIZE", "1", 1);
      ::setenv("RANK", "0", 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(20000 + ::getpid() % 30000).c_str(), 1);
    }
    return NcclCommunicator::create_from_env(120).value_or_throw();
  }();
  return *c;
}

namespace {

/// Rank r's i-th input: a small integer-valued float (sums exact in any order).
float val(int r, size_t i) { return static_cast<float>((r * 37 + static_cast<int>(i) * 11) % 101 - 50); }

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { BOOST_REQUIRE(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)) == cudaSuccess); }
  ~Dev() { cudaFree(p); }
  void put(std::vector<T> const& h) { BOOST_REQUIRE(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    BOOST_REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_nccl)

BOOST_AUTO_TEST_CASE(nvls_forced_off) {
  NcclCommunicator& c = comm();
  BOOST_TEST_MESSAGE("rank " << c.rank() << " of " << c.size() << " on device " << c.device());
  char const* v = std::getenv("NCCL_NVLS_ENABLE");
  BOOST_TEST_REQUIRE(v != nullptr);
  BOOST_TEST(std::string(v) == "0");
}

BOOST_AUTO_TEST_CASE(collectives) {
  NcclCommunicator& c = comm();
  int const n = c.size(), me = c.rank();
  size_t const count = 1000;
  std::vector<float> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = val(me, i);

  Dev<float> a(count), b(count);
  a.put(mine);
  BOOST_TEST_REQUIRE(c.all_reduce_sum(a.p, b.p, count).ok());
  auto sum = b.get();
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += val(r, i);
    BOOST_TEST(sum[i] == want);
  }

  Dev<float> g(count * n);
  BOOST_TEST_REQUIRE(c.all_gather(a.p, g.p, count * sizeof(float)).ok());
  auto gh = g.get();
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; i += 97) BOOST_TEST(gh[r * count + i] == val(r, i));

  // all_gatherv: rank r contributes r + 3 floats.
  std::vector<size_t> sizes;
  size_t total = 0;
  for (int r = 0; r < n; ++r) { sizes.push_back((r + 3) * sizeof(float)); total += r + 3; }
  Dev<float> gv(total);
  BOOST_TEST_REQUIRE(c.all_gatherv(a.p, gv.p, sizes).ok());
  auto gvh = gv.get();
  size_t off = 0;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < r + 3; ++i) BOOST_TEST(gvh[off++] == val(r, i));

  // reduce_scatter: rank me gets Σ_r val(r, me·k + i).
  size_t const k = count / n;
  Dev<float> rs(k);
  BOOST_TEST_REQUIRE(c.reduce_scatter_sum(a.p, rs.p, k).ok());
  auto rsh = rs.get();
  for (size_t i = 0; i < k; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += val(r, me * k + i);
    BOOST_TEST(rsh[i] == want);
  }

  // all_to_allv: rank me sends q + 1 floats from offset 5q to rank q; receives me + 1 from each.
  std::vector<size_t> sb, so, rb, ro;
  for (int q = 0; q < n; ++q) {
    sb.push_back((q + 1) * 4);
    so.push_back(5 * q * 4);
    rb.push_back((me + 1) * 4);
    ro.push_back(q * (me + 1) * 4);
  }
  Dev<float> at(n * (me + 1));
  BOOST_TEST_REQUIRE(c.all_to_allv(a.p, sb, so, at.p, rb, ro).ok());
  auto ath = at.get();
  for (int q = 0; q < n; ++q)
    for (int j = 0; j <= me; ++j) BOOST_TEST(ath[q * (me + 1) + j] == val(q, 5 * me + j));

  // broadcast from the last rank.
  BOOST_TEST_REQUIRE(c.broadcast(a.p, count * sizeof(float), n - 1).ok());
  auto bh = a.get();
  for (size_t i = 0; i < count; i += 31) BOOST_TEST(bh[i] == val(n - 1, i));
  BOOST_TEST(c.barrier().ok());
}

BOOST_AUTO_TEST_SUITE_END()

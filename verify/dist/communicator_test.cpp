// SPDX-License-Identifier: Apache-2.0
/// The in-process communicator against independently computed expectations: every collective on 1-4
/// thread ranks with seeded inputs, the documented rank-order fp32 sum (bit for bit, checked against a
/// plain left fold and shown to differ from another order on values chosen so the order matters),
/// in-place calls, mismatched sizes failing on all ranks, abort releasing blocked ranks; the TCP
/// rendezvous of the NCCL bootstrap on loopback; sharding-plan ranges and validation.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "tessera/dist/bootstrap.hpp"
#include "tessera/dist/communicator.hpp"
#include "tessera/dist/plan.hpp"
#include "verify/common/random.hpp"

using namespace tessera;
using namespace tessera::dist;

namespace {

/// Runs fn(comm) on one thread per rank; returns each rank's Status.
std::vector<Status> on_ranks(int n, std::function<Status(InProcessCommunicator&)> const& fn) {
  auto comms = InProcessCommunicator::create(n);
  std::vector<Status> st(static_cast<size_t>(n));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back([&, r] { st[r] = fn(*comms[r]); });
  for (auto& t : th) t.join();
  return st;
}

bool all_ok(std::vector<Status> const& s) {
  for (auto const& x : s)
    if (!x.ok()) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_communicator)

BOOST_AUTO_TEST_CASE(all_reduce_is_rank_order_left_fold) {
  uint64_t seed = verify::test_seed(101);
  for (int n : {1, 2, 3, 4}) {
    size_t const count = 257;
    std::vector<std::vector<float>> in;
    for (int r = 0; r < n; ++r) in.push_back(verify::randn(count, seed + r, 1e3f));
    std::vector<std::vector<float>> out(n, std::vector<float>(count));
    auto st = on_ranks(n, [&](InProcessCommunicator& c) {
      // Odd ranks reduce in place.
      if (c.rank() % 2) {
        out[c.rank()] = in[c.rank()];
        return c.all_reduce_sum(out[c.rank()].data(), out[c.rank()].data(), count);
      }
      return c.all_reduce_sum(in[c.rank()].data(), out[c.rank()].data(), count);
    });
    BOOST_TEST(all_ok(st));
    for (size_t i = 0; i < count; ++i) {
      float want = in[0][i];
      for (int r = 1; r < n; ++r) want += in[r][i];
      for (int r = 0; r < n; ++r) BOOST_TEST(std::memcmp(&out[r][i], &want, 4) == 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(all_reduce_order_is_observable) {
  // 1 + 2^-24 + 2^-24: the rank-order fold gives 1, the reverse order 1 + 2^-23. The communicator must
  // give the documented one.
  float const tiny = std::ldexp(1.f, -24);
  std::vector<float> in{1.f, tiny, tiny};
  std::vector<float> out(3);
  auto st = on_ranks(3, [&](InProcessCommunicator& c) { return c.all_reduce_sum(&in[c.rank()], &out[c.rank()], 1); });
  BOOST_TEST(all_ok(st));
  for (float v : out) BOOST_TEST(v == 1.f);
  BOOST_TEST((tiny + tiny) + 1.f != 1.f);
}

BOOST_AUTO_TEST_CASE(gathers_scatter_alltoall_broadcast) {
  uint64_t seed = verify::test_seed(202);
  for (int n : {1, 2, 4}) {
    // all_gather: rank r contributes 5 floats.
    std::vector<std::vector<float>> in;
    for (int r = 0; r < n; ++r) in.push_back(verify::randn(5, seed + 10 * r));
    std::vector<std::vector<float>> g(n, std::vector<float>(5 * n));
    BOOST_TEST(all_ok(on_ranks(n, [&](InProcessCommunicator& c) {
      return c.all_gather(in[c.rank()].data(), g[c.rank()].data(), 5 * sizeof(float));
    })));
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q) BOOST_TEST(std::memcmp(&g[r][5 * q], in[q].data(), 20) == 0);

    // all_gatherv: rank r contributes r + 1 floats (rank 0 of size 4: 1, …).
    std::vector<size_t> sizes;
    size_t total = 0;
    for (int r = 0; r < n; ++r) { sizes.push_back((r + 1) * sizeof(float)); total += r + 1; }
    std::vector<std::vector<float>> gv(n, std::vector<float>(total));
    BOOST_TEST(all_ok(on_ranks(n, [&](InProcessCommunicator& c) {
      return c.all_gatherv(in[c.rank()].data(), gv[c.rank()].data(), sizes);
    })));
    for (int r = 0; r < n; ++r) {
      size_t off = 0;
      for (int q = 0; q < n; ++q) {
        BOOST_TEST(std::memcmp(&gv[r][off], in[q].data(), (q + 1) * 4) == 0);
        off += q + 1;
      }
    }

    // reduce_scatter: rank r gets Σ_q in_q[r·3 .. r·3+3) in rank order.
    std::vector<std::vector<float>> rs_in;
    for (int r = 0; r < n; ++r) rs_in.push_back(verify::randn(3 * n, seed + 100 + r));
    std::vector<std::vector<float>> rs(n, std::vector<float>(3));
    BOOST_TEST(all_ok(on_ranks(n, [&](InProcessCommunicator& c) {
      return c.reduce_scatter_sum(rs_in[c.rank()].data(), rs[c.rank()].data(), 3);
    })));
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < 3; ++i) {
        float want = rs_in[0][r * 3 + i];
        for (int q = 1; q < n; ++q) want += rs_in[q][r * 3 + i];
        BOOST_TEST(std::memcmp(&rs[r][i], &want, 4) == 0);
      }

    // all_to_allv: rank r sends (r + q + 1) floats, value 100·r + q + j/16, to rank q.
    auto payload = [](int from, int to, int j) { return 100.f * from + to + j / 16.f; };
    std::vector<std::vector<float>> recv(n);
    BOOST_TEST(all_ok(on_ranks(n, [&](InProcessCommunicator& c) {
      int me = c.rank();
      std::vector<size_t> sb, so, rb, ro;
      std::vector<float> send;
      size_t rtot = 0;
      for (int q = 0; q < n; ++q) {
        so.push_back(send.size() * 4);
        for (int j = 0; j < me + q + 1; ++j) send.push_back(payload(me, q, j));
        sb.push_back((me + q + 1) * 4);
        ro.push_back(rtot * 4);
        rb.push_back((q + me + 1) * 4);
        rtot += q + me + 1;
      }
      recv[me].assign(rtot, -1.f);
      return c.all_to_allv(send.data(), sb, so, recv[me].data(), rb, ro);
    })));
    for (int r = 0; r < n; ++r) {
      size_t k = 0;
      for (int q = 0; q < n; ++q)
        for (int j = 0; j < q + r + 1; ++j) BOOST_TEST(recv[r][k++] == payload(q, r, j));
    }

    // all_to_all (equal blocks of 2 ints).
    std::vector<std::vector<int32_t>> a2a(n, std::vector<int32_t>(2 * n));
    BOOST_TEST(all_ok(on_ranks(n, [&](InProcessCommunicator& c) {
      std::vector<int32_t> s;
      for (int q = 0; q < n; ++q) { s.push_back(c.rank() * 10 + q); s.push_back(-q); }
      return all_to_all(c, s.data(), a2a[c.rank()].data(), 8);
    })));
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q) { BOOST_TEST(a2a[r][2 * q] == q * 10 + r); BOOST_TEST(a2a[r][2 * q + 1] == -r); }

    // broadcast from the last rank.
    std::vector<std::vector<float>> b(n);
    for (int r = 0; r < n; ++r) b[r] = verify::randn(7, seed + 1000 + r);
    auto want = b[n - 1];
    BOOST_TEST(all_ok(on_ranks(n, [&](InProcessCommunicator& c) { return c.broadcast(b[c.rank()].data(), 28, n - 1); })));
    for (int r = 0; r < n; ++r) BOOST_TEST(std::memcmp(b[r].data(), want.data(), 28) == 0);
    BOOST_TEST(all_ok(on_ranks(n, [&](InProcessCommunicator& c) { return c.barrier(); })));
  }
}

BOOST_AUTO_TEST_CASE(mismatched_sizes_fail_on_every_rank) {
  std::vector<float> buf(16, 1.f);
  auto st = on_ranks(2, [&](InProcessCommunicator& c) {
    std::vector<float> out(16);
    return c.all_reduce_sum(buf.data(), out.data(), c.rank() == 0 ? 8 : 16);
  });
  BOOST_TEST(!st[0].ok());
  BOOST_TEST(!st[1].ok());
  BOOST_TEST(st[0].message().find("different sizes") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(abort_releases_blocked_ranks) {
  auto st = on_ranks(3, [&](InProcessCommunicator& c) -> Status {
    if (c.rank() == 2) {
      c.abort("planted failure");
      return Status(StatusCode::kInternal, "rank 2 failed");
    }
    float x = 1.f, y = 0.f;
    return c.all_reduce_sum(&x, &y, 1);  // would wait for rank 2 forever without abort
  });
  BOOST_TEST(!st[0].ok());
  BOOST_TEST(!st[1].ok());
  BOOST_TEST(st[0].message().find("planted failure") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(tcp_rendezvous_loopback) {
  // Port from the pid so parallel test runs rarely collide; the test retries on another port once.
  int const n = 4;
  std::vector<uint8_t> blob(128);
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<uint8_t>(i * 7 + 3);
  bool done = false;
  for (int attempt = 0; attempt < 3 && !done; ++attempt) {
    int port = 20000 + static_cast<int>((::getpid() * 7 + attempt * 977) % 30000);
    std::vector<Result<std::vector<uint8_t>>> got(n, Result<std::vector<uint8_t>>(std::vector<uint8_t>{}));
    std::vector<std::thread> th;
    for (int r = 0; r < n; ++r)
      th.emplace_back([&, r] {
        LaunchEnv e;
        e.rank = r;
        e.world_size = n;
        e.master_addr = "127.0.0.1";
        e.master_port = port;
        got[r] = tcp_rendezvous(e, r == 0 ? blob : std::vector<uint8_t>{}, 10.0);
      });
    for (auto& t : th) t.join();
    if (!got[0].ok() && got[0].status().message().find("bind") != std::string::npos) continue;  // port taken
    for (int r = 0; r < n; ++r) {
      BOOST_TEST_REQUIRE(got[r].ok(), got[r].status().message());
      BOOST_TEST((*got[r] == blob));
    }
    done = true;
  }
  BOOST_TEST(done);
}

BOOST_AUTO_TEST_CASE(launch_env_validation) {
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "2", 1);
  auto e = launch_env_from_environment();
  BOOST_TEST(!e.ok());
  BOOST_TEST(e.status().message().find("RANK=2") != std::string::npos);
  ::setenv("RANK", "1", 1);
  ::unsetenv("MASTER_ADDR");
  e = launch_env_from_environment();
  BOOST_TEST(!e.ok());
  BOOST_TEST(e.status().message().find("MASTER_ADDR") != std::string::npos);
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  ::setenv("MASTER_PORT", "29511", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  e = launch_env_from_environment();
  BOOST_TEST_REQUIRE(e.ok());
  BOOST_TEST(e->rank == 1);
  BOOST_TEST(e->world_size == 2);
  BOOST_TEST(e->local_rank == 0);
  BOOST_TEST(e->master_addr == "10.0.0.1");
  BOOST_TEST(e->master_port == 29511);
  for (char const* v : {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"}) ::unsetenv(v);
}

BOOST_AUTO_TEST_CASE(plan_ranges_cover_and_validate) {
  // The released v41-flash attention shape (64 heads, 8 groups) and the tiny one (4 heads, 2 groups).
  ModelDims flash{.hidden = 4096, .heads = 64, .head_dim = 512, .o_groups = 8, .o_lora_rank = 1024, .experts = 256,
                  .moe_inter = 2048, .vocab = 129280, .layers = 16, .engram_columns = 43};
  for (int w : {2, 4, 8, 16}) {
    for (auto [tp, ep] : {std::pair{w, 1}, std::pair{1, w}, std::pair{w, w}}) {
      ParallelConfig c;
      c.tp = tp;
      c.ep = ep;
      c.nodes = w == 16 ? 2 : 1;
      auto p = make_plan(flash, c);
      BOOST_TEST_REQUIRE(p.ok(), p.status().message());
      BOOST_TEST(p->world == w);
      int64_t heads = 0, experts = 0, vocab = 0, cols = 0;
      for (auto const& r : p->ranks) {
        heads += r.heads.size();
        experts += r.experts.size();
        vocab += r.vocab.size();
        cols += r.engram_cols.size();
        BOOST_TEST(r.node == r.rank / (w / c.nodes));
      }
      BOOST_TEST(heads == (tp == 1 ? 64 * w : 64));
      BOOST_TEST(experts == (ep == 1 ? 256 * w : 256));
      BOOST_TEST(vocab == (tp == 1 ? 129280LL * w : 129280));
      BOOST_TEST(cols == 43);
      BOOST_TEST(p->ranks[0].gather_heads == (tp == 16));
      BOOST_TEST(p->bit_exact());  // the default combine is the exact gather
      ParallelConfig ar = c;
      ar.attn = AttnCombine::kAllReduce;
      BOOST_TEST(make_plan(flash, ar)->bit_exact() == (tp == 1 || tp == 16));
    }
  }
  BOOST_TEST((split_range(10, 4, 0) == Range{0, 3}));
  BOOST_TEST((split_range(10, 4, 3) == Range{8, 10}));
  ParallelConfig bad;
  bad.tp = 2;
  bad.ep = 4;
  auto p = make_plan(flash, bad);
  BOOST_TEST(!p.ok());
  BOOST_TEST(p.status().message().find("world size") != std::string::npos);
  bad.tp = 3;
  bad.ep = 1;
  p = make_plan(flash, bad);
  BOOST_TEST(!p.ok());
  BOOST_TEST(p.status().message().find("num_attention_heads") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

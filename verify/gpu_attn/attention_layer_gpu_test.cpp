// SPDX-License-Identifier: Apache-2.0
/// The attention side of one CSA2 layer chained on each backend, as the model chains it (spec §2.5.4–
/// §2.5.5): IndexScore → CandidateBlocks → IndexTopK (restricted by the candidates) → AttentionKeyList →
/// Attention, on seeded random inputs, every intermediate resident on its backend. The GPU chain equals
/// the CPU chain bit for bit up to the attention (scores, candidate mask, picks, tie flags, key lists)
/// and the attention output is within the attention test's tolerance (exact where expf is exact).
/// A disabled case `timing` prints per-call times at the released shapes (run it with --run_test).
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "tessera/ops/attention.hpp"
#include "tessera/ops/attention_keys.hpp"
#include "tessera/ops/backend_route.hpp"
#include "tessera/ops/indexer.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_attn/gpu_attn_util.hpp"

using namespace tessera;
using namespace tessera::verify;
using namespace tessera::verify::gpu_attn;

namespace {

struct Layer {
  int64_t S, p0, n_old, W, ratio, T, Hi, di, K, Bc, KB, H, hd;
  float scale_override = -1.f;   // ≥ 0: attention scale (0 makes every expf exact)
};

/// Host vectors of one layer's inputs.
struct Inputs {
  std::vector<float> qi, wi, ik, q, pool, sinks;
  std::vector<int64_t> pos, old_pos;
};

Inputs make_inputs(Layer const& L, uint64_t seed) {
  Inputs in;
  in.qi = randn(static_cast<size_t>(L.S * L.Hi * L.di), seed + 1);
  in.wi = randn(static_cast<size_t>(L.S * L.Hi), seed + 2, 0.5f);
  in.ik = randn(static_cast<size_t>(L.T * L.di), seed + 3);
  in.q = randn(static_cast<size_t>(L.S * L.H * L.hd), seed + 4);
  in.pool = randn(static_cast<size_t>((L.n_old + L.S + L.T) * L.hd), seed + 5);
  in.sinks = randn(static_cast<size_t>(L.H), seed + 6);
  if (L.scale_override == 0.f)
    for (float& x : in.sinks) x = -200.f;   // expf(−200 − 0) = 0 exactly
  for (int64_t r = 0; r < L.S; ++r) in.pos.push_back(L.p0 + r);
  for (int64_t i = 0; i < L.n_old; ++i) in.old_pos.push_back(L.p0 - L.n_old + i);
  return in;
}

struct Chain {
  std::vector<float> scores, out;
  std::vector<uint8_t> cand, cand_tie, tie;
  std::vector<int32_t> sel, ids;
  std::vector<int64_t> off;
};

template <class T>
struct Buf {   // host or device storage behind one interface
  bool dev;
  std::vector<T> h;
  DevBuf<T> d;
  Buf(bool on_dev, std::vector<T> v) : dev(on_dev), h(v), d(on_dev ? v : std::vector<T>{}) {}
  Buf(bool on_dev, int64_t n) : Buf(on_dev, std::vector<T>(static_cast<size_t>(n), T{})) {}
  template <int R> TensorView<T, R> v(std::array<int64_t, R> s) { return dev ? d.template view<R>(s) : TensorView<T, R>(h.data(), s); }
  template <int R> TensorView<T const, R> c(std::array<int64_t, R> s) {
    return dev ? d.template cview<R>(s) : TensorView<T const, R>(h.data(), s);
  }
  std::vector<T> get() { return dev ? d.host() : h; }
};

Chain run_chain(Layer const& L, Inputs const& in, bool gpu) {
  ExecContext ctx;
  ctx.backend = gpu ? Backend::kCuda : Backend::kCpu;
  Buf<float> qi(gpu, in.qi), wi(gpu, in.wi), ik(gpu, in.ik), q(gpu, in.q), pool(gpu, in.pool), sinks(gpu, in.sinks);
  Buf<int64_t> pos(gpu, in.pos), old_pos(gpu, in.old_pos), off(gpu, L.S + 1);
  Buf<float> scores(gpu, L.S * L.T), out(gpu, L.S * L.H * L.hd);
  Buf<uint8_t> cand(gpu, L.S * L.T), cand_tie(gpu, L.S), tie(gpu, L.S);
  Buf<int32_t> sel(gpu, L.S * L.K);
  ops::AttentionKeyListDesc kd{L.S, L.n_old, L.W, L.T, L.K};
  int64_t const cap = ops::attention_key_capacity(kd), nk = L.n_old + L.S + L.T;
  Buf<int32_t> ids(gpu, cap);
  float const si = static_cast<float>(1.0 / std::sqrt(static_cast<double>(L.di)));
  Status s = ops::run_on_backend<ops::IndexScore>(
      ctx, ops::IndexScoreDesc{L.S, L.Hi, L.di, L.T, L.ratio, si},
      ops::IndexScoreArgs{qi.c<2>({L.S, L.Hi * L.di}), wi.c<2>({L.S, L.Hi}), ik.c<2>({L.T, L.di}), pos.c<1>({L.S}),
                          scores.v<2>({L.S, L.T})});
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  Chain c;
  c.scores = scores.get();
  s = ops::run_on_backend<ops::CandidateBlocks>(
      ctx, ops::CandidateBlocksDesc{L.S, L.T, L.ratio, L.Bc, L.KB},
      ops::CandidateBlocksArgs{scores.c<2>({L.S, L.T}), pos.c<1>({L.S}), cand.v<2>({L.S, L.T}), cand_tie.v<1>({L.S})});
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  s = ops::run_on_backend<ops::IndexTopK>(
      ctx, ops::IndexTopKDesc{L.S, L.T, L.K},
      ops::IndexTopKArgs{scores.v<2>({L.S, L.T}), cand.c<2>({L.S, L.T}), sel.v<2>({L.S, L.K}), tie.v<1>({L.S})});
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  s = ops::run_on_backend<ops::AttentionKeyList>(
      ctx, kd,
      ops::AttentionKeyListArgs{old_pos.c<1>({L.n_old}), pos.c<1>({L.S}), sel.c<2>({L.S, L.K}), off.v<1>({L.S + 1}),
                                ids.v<1>({cap})});
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  // The CPU attention takes exactly nnz ids; the GPU one any list at least that long (here: the capacity).
  c.off = off.get();
  int64_t const nnz = c.off.back();
  float const scale = L.scale_override >= 0.f ? L.scale_override
                                              : static_cast<float>(1.0 / std::sqrt(static_cast<double>(L.hd)));
  s = ops::run_on_backend<ops::Attention>(
      ctx, ops::AttentionDesc{L.S, L.H, L.hd, nk, scale, DType::kF32},
      ops::AttentionArgs{q.c<2>({L.S, L.H * L.hd}), pool.c<2>({nk, L.hd}), off.c<1>({L.S + 1}),
                         ids.c<1>({gpu ? cap : nnz}), sinks.c<1>({L.H}), out.v<2>({L.S, L.H * L.hd}), {}});
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  c.cand = cand.get();
  c.cand_tie = cand_tie.get();
  c.tie = tie.get();
  c.sel = sel.get();
  c.ids = ids.get();
  c.ids.resize(static_cast<size_t>(nnz));
  c.out = out.get();
  return c;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_attention_layer)

BOOST_AUTO_TEST_CASE(chain_gpu_equals_cpu) {
  uint64_t const seed = test_seed(0x1A7E);
  // A prefill chunk after a cached window (ratio 2, 32 entries), a decode step (ratio 1), a prompt from
  // position 0 longer than the window.
  Layer const layers[] = {{24, 40, 15, 16, 2, 32, 4, 32, 6, 4, 3, 4, 64},
                          {1, 90, 15, 16, 1, 91, 4, 32, 8, 8, 2, 4, 64},
                          {50, 0, 0, 16, 2, 25, 2, 32, 5, 4, 2, 2, 64},
                          {24, 40, 15, 16, 2, 32, 4, 32, 6, 4, 3, 4, 64, 0.f}};
  for (Layer const& L : layers) {
    Inputs in = make_inputs(L, seed + static_cast<uint64_t>(L.S));
    Chain cpu = run_chain(L, in, false), gpu = run_chain(L, in, true);
    BOOST_TEST(bit_mismatches(cpu.scores, gpu.scores) == 0);
    BOOST_TEST(cpu.cand == gpu.cand, boost::test_tools::per_element());
    BOOST_TEST(cpu.cand_tie == gpu.cand_tie, boost::test_tools::per_element());
    BOOST_TEST(cpu.sel == gpu.sel, boost::test_tools::per_element());
    BOOST_TEST(cpu.tie == gpu.tie, boost::test_tools::per_element());
    BOOST_TEST(cpu.off == gpu.off, boost::test_tools::per_element());
    BOOST_TEST(cpu.ids == gpu.ids, boost::test_tools::per_element());
    if (L.scale_override == 0.f) {
      BOOST_TEST(bit_mismatches(cpu.out, gpu.out) == 0);   // every expf argument is 0: exact
    } else {
      // The attention test's bound with Σ_u |p_u·k_u[i]| ≤ max_u |k_u[i]| (the p_u sum to at most 1).
      int64_t bad = 0;
      double worst = 0.0;
      for (int64_t r = 0; r < L.S; ++r) {
        int64_t const k0 = cpu.off[r], k1 = cpu.off[r + 1];
        for (int64_t h = 0; h < L.H; ++h)
          for (int64_t i = 0; i < L.hd; ++i) {
            double mk = 0.0;
            for (int64_t u = k0; u < k1; ++u) mk = std::max(mk, std::fabs(double(in.pool[cpu.ids[u] * L.hd + i])));
            size_t const x = static_cast<size_t>((r * L.H + h) * L.hd + i);
            double const diff = std::fabs(double(cpu.out[x]) - gpu.out[x]);
            worst = std::max(worst, diff);
            bad += !(diff <= (8.0 + 2.0 * (k1 - k0)) * kF32Eps * mk);
          }
      }
      BOOST_TEST(bad == 0);
      BOOST_TEST_MESSAGE("S=" << L.S << ": max |Δo| = " << worst << ", "
                               << cpu.out.size() - bit_mismatches(cpu.out, gpu.out) << "/" << cpu.out.size()
                               << " bit-identical");
    }
  }
}

/// Per-call device times at the released shapes (H 64, hd 512, W 128, top-k 512, Hi 64, di 128).
BOOST_AUTO_TEST_CASE(timing, *boost::unit_test::disabled()) {
  auto time_it = [](char const* what, auto&& f) {
    f();
    DevBuf<float> sync(int64_t{1});
    (void)sync.host();
    auto t0 = std::chrono::steady_clock::now();
    int const n = 20;
    for (int i = 0; i < n; ++i) f();
    (void)sync.host();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
    std::printf("%-44s %9.1f us\n", what, us);
  };
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  for (int64_t rows : {1, 64, 1024}) {
    int64_t const H = 64, hd = 512, per_row = 640, nk = 4096;
    DevBuf<float> q(randn(static_cast<size_t>(rows * H * hd), 1)), keys(randn(static_cast<size_t>(nk * hd), 2)),
        sinks(randn(64, 3)), out(rows * H * hd);
    std::vector<int64_t> off;
    std::vector<int32_t> ids;
    for (int64_t r = 0; r <= rows; ++r) off.push_back(r * per_row);
    for (int64_t i = 0; i < rows * per_row; ++i) ids.push_back(static_cast<int32_t>((i * 5) % nk));
    DevBuf<int64_t> doff(off);
    DevBuf<int32_t> dids(ids);
    ops::AttentionDesc d{rows, H, hd, nk, 0.044f, DType::kBf16};
    ops::AttentionArgs a{q.cview<2>({rows, H * hd}), keys.cview<2>({nk, hd}), doff.cview<1>({rows + 1}),
                         dids.cview<1>({rows * per_row}), sinks.cview<1>({H}), out.view<2>({rows, H * hd}), {}};
    char name[96];
    std::snprintf(name, sizeof name, "attention rows=%lld H=64 hd=512 keys/row=640", static_cast<long long>(rows));
    time_it(name, [&] { throw_if_error(ops::Attention<Backend::kCuda>::run(d, a, ctx)); });
  }
  for (int64_t T : {8192, 65536}) {
    int64_t const Hi = 64, di = 128;
    DevBuf<float> q(randn(static_cast<size_t>(Hi * di), 4)), w(randn(64, 5)), k(randn(static_cast<size_t>(T * di), 6)),
        s(T);
    DevBuf<int64_t> pos(std::vector<int64_t>{4 * T - 1});
    DevBuf<int32_t> sel(int64_t{512});
    DevBuf<uint8_t> tie(int64_t{1});
    ops::IndexScoreArgs sa{q.cview<2>({1, Hi * di}), w.cview<2>({1, Hi}), k.cview<2>({T, di}), pos.cview<1>({1}),
                           s.view<2>({1, T})};
    char name[96];
    std::snprintf(name, sizeof name, "index_score decode T=%lld Hi=64 di=128", static_cast<long long>(T));
    time_it(name, [&] { throw_if_error(ops::IndexScore<Backend::kCuda>::run({1, Hi, di, T, 4, 0.088f}, sa, ctx)); });
    std::snprintf(name, sizeof name, "index_topk decode T=%lld K=512", static_cast<long long>(T));
    time_it(name, [&] {
      throw_if_error(ops::IndexTopK<Backend::kCuda>::run({1, T, 512}, {s.view<2>({1, T}), {}, sel.view<2>({1, 512}),
                                                                        tie.view<1>({1})}, ctx));
    });
  }
}

BOOST_AUTO_TEST_SUITE_END()

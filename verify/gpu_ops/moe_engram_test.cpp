// SPDX-License-Identifier: Apache-2.0
/// CUDA MoE router / experts and Engram hash / gather / gate against their CPU backends.
/// Bitwise: router selection on exact ties (identical gate rows: lower id first, cutoff-tie flag), the
/// static mask, Engram hash and gather. Named tolerances where CUDA expf/log1pf (≤ 2 ulp) replace glibc's:
///   router weights: sqrt(softplus) then the renormalisation: relative kRouteRelTol = 4e-6; the selected ids
///     must equal the CPU's unless the CPU's k-th and (k+1)-th biased scores are within kRouteTieRel (a
///     certified near-tie) — none occur on these seeds.
///   experts: silu feeds every activation: |Δ| ≤ kExpertsTolF32 = 1e-5·max|out_row| (fp32) and
///     kExpertsTolBf16 = 2^-6·max|out_row| (bf16: one activation may cross a bf16 rounding boundary, and the
///     output is rounded again).
///   engram gate: σ of the normalised dot: |Δ| ≤ 2^-21·(|h|+|v|) (fp32), 2^-7·(|h|+|v|) (bf16).
/// Row invariance: a token alone gives the bits it gets in the batch.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "tessera/ops/engram.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ref/moe_ref.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;

namespace {

constexpr double kRouteRelTol = 4e-6;
constexpr double kRouteTieRel = 1e-5;
constexpr double kExpertsTolF32 = 1e-5;
constexpr double kExpertsTolBf16 = 0x1p-6;

template <template <Backend> class F, class D, class A>
void run_ok(ExecContext& ctx, D const& d, A const& a) {
  auto s = ops::dispatch<F>(ctx, d, a);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
}

struct RouteOut {
  std::vector<int32_t> ids;
  std::vector<float> w;
  std::vector<uint8_t> tie;
};

RouteOut route(bool gpu, ops::MoeRouteDesc const& d, std::vector<float> const& x, std::vector<float> const& gate,
               std::vector<float> const& bias, std::vector<uint8_t> const& mask) {
  RouteOut o{std::vector<int32_t>(d.rows * d.top_k, 77), std::vector<float>(d.rows * d.top_k, -1.f),
             std::vector<uint8_t>(d.rows, 9)};
  if (!gpu) {
    ops::MoeRouteArgs a{TensorView<float const, 2>(x.data(), {d.rows, d.dim}),
                        TensorView<float const, 2>(gate.data(), {d.experts, d.dim}),
                        TensorView<float const, 1>(bias.data(), {d.experts}),
                        TensorView<float, 2>(o.w.data(), {d.rows, d.top_k}),
                        TensorView<int32_t, 2>(o.ids.data(), {d.rows, d.top_k}),
                        TensorView<uint8_t, 1>(o.tie.data(), {d.rows}),
                        mask.empty() ? TensorView<uint8_t const, 1>{} : TensorView<uint8_t const, 1>(mask.data(), {d.experts})};
    ExecContext c;
    run_ok<ops::MoeRoute>(c, d, a);
    return o;
  }
  DeviceBuffer<float> dx(x), dg(gate), db(bias), dw(o.w);
  DeviceBuffer<int32_t> di(o.ids);
  DeviceBuffer<uint8_t> dt(o.tie), dm(mask);
  ops::MoeRouteArgs a{dx.cview<2>({d.rows, d.dim}), dg.cview<2>({d.experts, d.dim}), db.cview<1>({d.experts}),
                      dw.view<2>({d.rows, d.top_k}), di.view<2>({d.rows, d.top_k}), dt.view<1>({d.rows}),
                      mask.empty() ? TensorView<uint8_t const, 1>{} : dm.cview<1>({d.experts})};
  ExecContext c = cuda_ctx();
  run_ok<ops::MoeRoute>(c, d, a);
  return {di.get(), dw.get(), dt.get()};
}

/// CPU biased scores of a row, sorted descending (for the near-tie certificate).
std::vector<float> sorted_biased(float const* x, std::vector<float> const& gate, std::vector<float> const& bias,
                                 ops::MoeRouteDesc const& d) {
  std::vector<float> v(d.experts);
  for (int64_t e = 0; e < d.experts; ++e)
    v[e] = std::sqrt(ref::softplus(ref::dot(x, &gate[e * d.dim], d.dim) / d.gate_temp, d.md)) + bias[e];
  std::sort(v.begin(), v.end(), std::greater<>());
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(moe_route_matches_cpu) {
  uint64_t const seed = test_seed(521);
  int64_t const rows = 23, experts = 64, dim = 200;
  auto x = randn(rows * dim, seed, 1.f);
  auto gate = randn(experts * dim, seed + 1, 0.1f);
  auto bias = randn(experts, seed + 2, 0.05f);
  std::vector<uint8_t> mask(experts, 0);
  for (int64_t e : {3, 17, 18, 60}) mask[e] = 1;
  for (DType const md : {DType::kF32, DType::kBf16})  // md selects softplus's arithmetic
  for (int64_t k : {1, 6})
    for (float top_p : {1.f, 0.6f})
      for (bool use_mask : {false, true})
        for (bool renorm : {true, false}) {
          ops::MoeRouteDesc d{rows, experts, dim, k, 1.3f, 2.5f, true, top_p, 2, renorm, md};
          auto const& m = use_mask ? mask : std::vector<uint8_t>{};
          auto cpu = route(false, d, x, gate, bias, m);
          auto gpu = route(true, d, x, gate, bias, m);
          BOOST_TEST_INFO("k=" << k << " top_p=" << top_p << " mask=" << use_mask << " renorm=" << renorm
                                 << " md=" << dtype_name(md));
          for (int64_t r = 0; r < rows; ++r) {
            bool same = std::equal(&cpu.ids[r * k], &cpu.ids[r * k] + k, &gpu.ids[r * k]);
            if (!same) {
              auto s = sorted_biased(&x[r * dim], gate, bias, d);
              BOOST_TEST_MESSAGE("row " << r << " ids differ; CPU k-th/(k+1)-th " << s[k - 1] << " " << s[k]);
              BOOST_TEST(std::fabs(s[k - 1] - s[k]) <= kRouteTieRel * std::fabs(s[k - 1]));
              continue;
            }
            for (int64_t i = 0; i < k; ++i)
              BOOST_TEST(std::fabs(gpu.w[r * k + i] - cpu.w[r * k + i]) <= kRouteRelTol * std::fabs(cpu.w[r * k + i]));
            BOOST_TEST(gpu.tie[r] == cpu.tie[r]);
            if (use_mask)
              for (int64_t i = 0; i < k; ++i) BOOST_TEST((gpu.ids[r * k + i] < 0 || !mask[gpu.ids[r * k + i]]));
          }
          // Row 11 alone.
          ops::MoeRouteDesc d1 = d;
          d1.rows = 1;
          auto alone = route(true, d1, row_slice(x, dim, 11), gate, bias, m);
          BOOST_TEST((alone.ids == row_slice(gpu.ids, k, 11)));
          BOOST_TEST(count_bit_diffs(alone.w, row_slice(gpu.w, k, 11), "route alone") == 0);
        }
}

/// The release's router width (384 experts, hidden 5120) on every score path: the chunk-parallel kernel with
/// 16-byte weight loads (5120) and scalar ones with a partial last chunk (5121), and the warp-per-expert kernel
/// past its dim limit (8200). 6 rows run as row groups of 4 with 8 experts per block, a row alone as one row with
/// 2 experts per block: the row's results must be the same bits either way.
BOOST_AUTO_TEST_CASE(moe_route_release_width_matches_cpu) {
  uint64_t const seed = test_seed(523);
  int64_t const rows = 6, experts = 384, k = 6;
  for (int64_t dim : {5120, 5121, 8200}) {
    auto x = randn(rows * dim, seed + dim, 1.f);
    auto gate = randn(experts * dim, seed + dim + 1, 0.02f);
    auto bias = randn(experts, seed + dim + 2, 0.05f);
    for (DType const md : {DType::kF32, DType::kBf16}) {
      ops::MoeRouteDesc d{rows, experts, dim, k, 1.f, 2.5f, true, 1.f, 0, true, md};
      auto cpu = route(false, d, x, gate, bias, {});
      auto gpu = route(true, d, x, gate, bias, {});
      BOOST_TEST_INFO("dim=" << dim << " md=" << dtype_name(md));
      for (int64_t r = 0; r < rows; ++r) {
        if (!std::equal(&cpu.ids[r * k], &cpu.ids[r * k] + k, &gpu.ids[r * k])) {
          auto s = sorted_biased(&x[r * dim], gate, bias, d);
          BOOST_TEST(std::fabs(s[k - 1] - s[k]) <= kRouteTieRel * std::fabs(s[k - 1]));
          continue;
        }
        for (int64_t i = 0; i < k; ++i)
          BOOST_TEST(std::fabs(gpu.w[r * k + i] - cpu.w[r * k + i]) <= kRouteRelTol * std::fabs(cpu.w[r * k + i]));
      }
      for (int64_t r : {0, 5}) {
        ops::MoeRouteDesc d1 = d;
        d1.rows = 1;
        auto alone = route(true, d1, row_slice(x, dim, r), gate, bias, {});
        BOOST_TEST((alone.ids == row_slice(gpu.ids, k, r)));
        BOOST_TEST(count_bit_diffs(alone.w, row_slice(gpu.w, k, r), "route alone") == 0);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(moe_route_exact_ties_lower_id_wins) {
  uint64_t const seed = test_seed(522);
  int64_t const rows = 3, experts = 48, dim = 64;
  auto x = randn(rows * dim, seed);
  auto gate = randn(experts * dim, seed + 1, 0.1f);
  std::vector<float> bias(experts, 0.f);
  for (int64_t e : {40, 9, 5}) {  // three identical experts with a large bias: an exact three-way tie on top
    std::copy(&gate[7 * dim], &gate[8 * dim], &gate[e * dim]);
    bias[e] = 50.f;
  }
  for (int64_t k : {2, 3, 4}) {
    ops::MoeRouteDesc d{rows, experts, dim, k, 1.f, 1.f, true};
    auto cpu = route(false, d, x, gate, bias, {});
    auto gpu = route(true, d, x, gate, bias, {});
    BOOST_TEST((gpu.ids == cpu.ids));
    BOOST_TEST((gpu.tie == cpu.tie));
    for (int64_t r = 0; r < rows; ++r) {
      BOOST_TEST(gpu.ids[r * k] == 5);
      BOOST_TEST(gpu.ids[r * k + 1] == 9);
      if (k >= 3) BOOST_TEST(gpu.ids[r * k + 2] == 40);
      BOOST_TEST(gpu.tie[r] == (k == 2 ? 1 : 0));
    }
  }
  // Mask expert 5: 9 and 40 lead.
  std::vector<uint8_t> mask(experts, 0);
  mask[5] = 1;
  ops::MoeRouteDesc d{rows, experts, dim, 2, 1.f, 1.f, true};
  auto gpu = route(true, d, x, gate, bias, mask);
  auto cpu = route(false, d, x, gate, bias, mask);
  BOOST_TEST((gpu.ids == cpu.ids));
  BOOST_TEST(gpu.ids[0] == 9);
  BOOST_TEST(gpu.ids[1] == 40);
}

BOOST_AUTO_TEST_CASE(moe_experts_matches_cpu) {
  uint64_t const seed = test_seed(523);
  // 1-3 rows: the decode-sized kernels (one warp per output; fp32 coalesced when the row length is a
  // multiple of 32, e.g. 96 and 1024/512, else chunk per lane; bf16 a lane per K index); 9 rows: experts get
  // 0-8 assignments (one tile each); 41 rows: several tiles per expert; dim 1030: partial chunks and blocks
  // and unaligned weight rows; inter 80 and 520: a last 32-step with one 16-block or part of one. bf16
  // weights with md = bf16 run the tensor-core kSkinny path (ops::MoeTcPath::kAuto; moe_tc_test.cpp covers
  // every path); there x is bf16-valued, as in the model.
  for (auto const& [rows, dim, inter] : {std::tuple<int64_t, int64_t, int64_t>{1, 96, 80}, {3, 96, 80}, {9, 96, 80},
                                        {41, 96, 80}, {2, 1030, 520}, {2, 1024, 512}}) {
  int64_t const experts = 8, k = 3;
  auto x = randn(rows * dim, seed);
  std::mt19937_64 g(seed);
  std::vector<int32_t> ids(rows * k);
  std::vector<float> wts = randn(rows * k, seed + 1, 0.3f, 0.5f);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> perm(experts);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    for (int64_t i = 0; i < k; ++i) ids[r * k + i] = perm[i];
  }
  int64_t const pruned = rows > 2 ? 2 * k + 1 : k - 1;  // a pruned slot
  ids[pruned] = -1;
  wts[pruned] = 0.f;
  std::vector<float> x_bf16 = x;  // md = bf16: the model's MoE input is →bf16 (the tensor-core paths' precondition)
  for (auto& v : x_bf16) v = round_to_bf16(v);
  for (DType wdt : {DType::kF32, DType::kBf16})
    for (DType md : {DType::kF32, DType::kBf16})
      for (float limit : {0.f, 1.5f}) {
        std::vector<float> const& xin = md == DType::kBf16 ? x_bf16 : x;
        std::vector<std::vector<float>> w1(experts + 1), w3(experts + 1), w2(experts + 1);  // [experts] = shared
        for (int64_t e = 0; e <= experts; ++e) {
          w1[e] = randn(inter * dim, seed + 10 + e, 0.15f);
          w3[e] = randn(inter * dim, seed + 100 + e, 0.15f);
          w2[e] = randn(dim * inter, seed + 200 + e, 0.15f);
          if (wdt == DType::kBf16)
            for (auto* v : {&w1[e], &w3[e], &w2[e]})
              for (auto& f : *v) f = round_to_bf16(f);
        }
        ops::MoeExpertsDesc d{rows, experts, dim, inter, k, limit, true, md, DType::kF32};
        std::vector<TensorView<float const, 2>> v1, v3, v2;
        for (int64_t e = 0; e < experts; ++e) {
          v1.emplace_back(w1[e].data(), std::array<int64_t, 2>{inter, dim});
          v3.emplace_back(w3[e].data(), std::array<int64_t, 2>{inter, dim});
          v2.emplace_back(w2[e].data(), std::array<int64_t, 2>{dim, inter});
        }
        std::vector<float> cpu(rows * dim);
        ops::MoeExpertsArgs a;
        a.x = TensorView<float const, 2>(xin.data(), {rows, dim});
        a.ids = TensorView<int32_t const, 2>(ids.data(), {rows, k});
        a.weights = TensorView<float const, 2>(wts.data(), {rows, k});
        a.w1 = v1; a.w3 = v3; a.w2 = v2;
        a.shared_w1 = TensorView<float const, 2>(w1[experts].data(), {inter, dim});
        a.shared_w3 = TensorView<float const, 2>(w3[experts].data(), {inter, dim});
        a.shared_w2 = TensorView<float const, 2>(w2[experts].data(), {dim, inter});
        a.out = TensorView<float, 2>(cpu.data(), {rows, dim});
        ExecContext cctx;
        run_ok<ops::MoeExperts>(cctx, d, a);

        // Device copies (fp32 or bf16 storage) and the pointer tables.
        std::vector<DeviceBuffer<float>> f32;
        std::vector<DeviceBuffer<Bf16>> b16;
        auto put = [&](std::vector<float> const& h) -> void const* {
          if (wdt == DType::kF32) { f32.emplace_back(h); return f32.back().data(); }
          std::vector<Bf16> hb(h.size());
          for (size_t i = 0; i < h.size(); ++i) hb[i] = Bf16::from_float(h[i]);
          b16.emplace_back(hb);
          return b16.back().data();
        };
        f32.reserve(3 * (experts + 1));
        b16.reserve(3 * (experts + 1));
        std::vector<uint64_t> p1, p3, p2;
        for (int64_t e = 0; e <= experts; ++e) {
          p1.push_back(reinterpret_cast<uint64_t>(put(w1[e])));
          p3.push_back(reinterpret_cast<uint64_t>(put(w3[e])));
          p2.push_back(reinterpret_cast<uint64_t>(put(w2[e])));
        }
        DeviceBuffer<uint64_t> t1(p1), t3(p3), t2(p2);
        ops::MoeExpertsDeviceWeights dev;
        dev.w1 = reinterpret_cast<void const* const*>(t1.data());
        dev.w3 = reinterpret_cast<void const* const*>(t3.data());
        dev.w2 = reinterpret_cast<void const* const*>(t2.data());
        dev.shared_w1 = reinterpret_cast<void const*>(p1[experts]);
        dev.shared_w3 = reinterpret_cast<void const*>(p3[experts]);
        dev.shared_w2 = reinterpret_cast<void const*>(p2[experts]);
        auto run_gpu = [&](int64_t r0, int64_t nr) {
          DeviceBuffer<float> dx(std::vector<float>(xin.begin() + r0 * dim, xin.begin() + (r0 + nr) * dim));
          DeviceBuffer<int32_t> di(std::vector<int32_t>(ids.begin() + r0 * k, ids.begin() + (r0 + nr) * k));
          DeviceBuffer<float> dw(std::vector<float>(wts.begin() + r0 * k, wts.begin() + (r0 + nr) * k));
          DeviceBuffer<float> dout(static_cast<size_t>(nr * dim));
          ops::MoeExpertsDesc dd = d;
          dd.rows = nr;
          dd.weight_dtype = wdt;
          ops::MoeExpertsArgs ga;
          ga.x = dx.cview<2>({nr, dim});
          ga.ids = di.cview<2>({nr, k});
          ga.weights = dw.cview<2>({nr, k});
          ga.out = dout.view<2>({nr, dim});
          ga.dev = dev;
          ExecContext c = cuda_ctx();
          run_ok<ops::MoeExperts>(c, dd, ga);
          return dout.get();
        };
        auto gpu = run_gpu(0, rows);
        double const tol = md == DType::kBf16 ? kExpertsTolBf16 : kExpertsTolF32;
        int64_t bad = 0, exact = 0;
        for (int64_t r = 0; r < rows; ++r) {
          double mx = 0;
          for (int64_t o = 0; o < dim; ++o) mx = std::max(mx, std::fabs(double(cpu[r * dim + o])));
          for (int64_t o = 0; o < dim; ++o) {
            bad += std::fabs(double(gpu[r * dim + o]) - cpu[r * dim + o]) > tol * mx;
            exact += gpu[r * dim + o] == cpu[r * dim + o];
          }
        }
        BOOST_TEST_INFO("w=" << dtype_name(wdt) << " md=" << dtype_name(md) << " limit=" << limit);
        BOOST_TEST(bad == 0);
        std::printf("moe_experts rows=%lld w=%s md=%s limit=%g: %lld/%lld outputs bitwise equal to the CPU\n",
                    static_cast<long long>(rows), std::string(dtype_name(wdt)).c_str(), std::string(dtype_name(md)).c_str(), limit,
                    static_cast<long long>(exact), static_cast<long long>(rows * dim));
        BOOST_TEST(exact == rows * dim);  // bitwise: the same dot orders and SiLU (exp_md) on both sides
        int64_t const one = std::min<int64_t>(2, rows - 1), nt = std::min<int64_t>(5, rows);
        auto alone = run_gpu(one, 1);
        BOOST_TEST(count_bit_diffs(alone, row_slice(gpu, dim, one), "experts alone") == 0);
        auto tail = run_gpu(rows - nt, nt);  // the last rows as a smaller batch with other tile mates
        BOOST_TEST(count_bit_diffs(tail, std::vector<float>(gpu.end() - nt * dim, gpu.end()), "experts tail") == 0);
      }
  }
}

BOOST_AUTO_TEST_CASE(engram_hash_gather_gate) {
  uint64_t const seed = test_seed(524);
  std::mt19937_64 g(seed);
  int64_t const rows = 37, n = 4, heads = 3, c = (n - 1) * heads;
  std::vector<int64_t> look(rows * n), mult(n), primes(c), offs(c);
  for (auto& v : look) v = static_cast<int64_t>(g() % 200000);
  look[5] = 199999;  // a pad id
  for (auto& v : mult) v = static_cast<int64_t>(g() % (1ll << 40)) | 1;
  for (int64_t i = 0; i < c; ++i) { primes[i] = 1009 + 2 * static_cast<int64_t>(g() % 500); offs[i] = i * 2100; }
  std::vector<int64_t> cpu_ids(rows * c);
  ExecContext cctx;
  ops::EngramHashDesc hd{rows, n, heads};
  run_ok<ops::EngramHash>(cctx, hd, ops::EngramHashArgs{TensorView<int64_t const, 2>(look.data(), {rows, n}),
                                                        TensorView<int64_t const, 1>(mult.data(), {n}),
                                                        TensorView<int64_t const, 1>(primes.data(), {c}),
                                                        TensorView<int64_t const, 1>(offs.data(), {c}),
                                                        TensorView<int64_t, 2>(cpu_ids.data(), {rows, c})});
  DeviceBuffer<int64_t> dl(look), dm(mult), dp(primes), dof(offs), did(cpu_ids.size());
  ExecContext ctx = cuda_ctx();
  run_ok<ops::EngramHash>(ctx, hd, ops::EngramHashArgs{dl.cview<2>({rows, n}), dm.cview<1>({n}), dp.cview<1>({c}),
                                                       dof.cview<1>({c}), did.view<2>({rows, c})});
  BOOST_TEST((did.get() == cpu_ids));

  // Gather from a table holding every id (max offset + prime).
  int64_t const table_rows = offs[c - 1] + 2100, hdim = 24;
  auto table = randn(table_rows * hdim, seed + 1);
  std::vector<float> cpu_g(rows * c * hdim);
  ops::EngramGatherDesc gd{rows, c, table_rows, hdim};
  run_ok<ops::EngramGather>(cctx, gd, ops::EngramGatherArgs{TensorView<int64_t const, 2>(cpu_ids.data(), {rows, c}),
                                                            TensorView<float const, 2>(table.data(), {table_rows, hdim}),
                                                            TensorView<float, 2>(cpu_g.data(), {rows, c * hdim})});
  DeviceBuffer<float> dt(table), dgo(cpu_g.size());
  run_ok<ops::EngramGather>(ctx, gd, ops::EngramGatherArgs{did.cview<2>({rows, c}), dt.cview<2>({table_rows, hdim}),
                                                           dgo.view<2>({rows, c * hdim})});
  BOOST_TEST(count_bit_diffs(dgo.get(), cpu_g, "gather") == 0);
  // An id outside the table gathers NaNs (no crash).
  DeviceBuffer<int64_t> bad_id(std::vector<int64_t>{table_rows + 5});
  DeviceBuffer<float> bad_out(static_cast<size_t>(hdim));
  run_ok<ops::EngramGather>(ctx, ops::EngramGatherDesc{1, 1, table_rows, hdim},
                            ops::EngramGatherArgs{bad_id.cview<2>({1, 1}), dt.cview<2>({table_rows, hdim}),
                                                  bad_out.view<2>({1, hdim})});
  for (float v : bad_out.get()) BOOST_TEST(std::isnan(v));

  // Gate, fp32 and bf16, separate output and in place.
  int64_t const streams = 4, dim = 300, grows = 7;
  for (DType md : {DType::kF32, DType::kBf16})
    for (bool in_place : {false, true}) {
      auto x = randn(grows * streams * dim, seed + 2);
      auto kv = randn(grows * (streams + 1) * dim, seed + 3);
      auto w = randn(streams * dim, seed + 4, 0.3f, 1.f);
      if (md == DType::kBf16)
        for (auto& v : x) v = round_to_bf16(v);
      std::vector<float> cpu(x.size());
      ops::EngramGateDesc d{grows, streams, dim, 1e-20f, md};
      run_ok<ops::EngramGate>(cctx, d, ops::EngramGateArgs{TensorView<float const, 2>(x.data(), {grows, streams * dim}),
                                                           TensorView<float const, 2>(kv.data(), {grows, (streams + 1) * dim}),
                                                           TensorView<float const, 1>(w.data(), {streams * dim}),
                                                           TensorView<float, 2>(cpu.data(), {grows, streams * dim})});
      DeviceBuffer<float> dx(x), dkv(kv), dw(w), dout(x.size());
      run_ok<ops::EngramGate>(ctx, d, ops::EngramGateArgs{dx.cview<2>({grows, streams * dim}),
                                                          dkv.cview<2>({grows, (streams + 1) * dim}), dw.cview<1>({streams * dim}),
                                                          in_place ? dx.view<2>({grows, streams * dim})
                                                                   : dout.view<2>({grows, streams * dim})});
      auto gpu = in_place ? dx.get() : dout.get();
      double const tol = md == DType::kBf16 ? 0x1p-7 : 0x1p-21;
      int64_t bad = 0;
      for (int64_t r = 0; r < grows; ++r)
        for (int64_t k = 0; k < streams; ++k)
          for (int64_t i = 0; i < dim; ++i) {
            size_t const e = static_cast<size_t>(r * streams * dim + k * dim + i);
            double const mag = std::fabs(x[e]) + std::fabs(kv[r * (streams + 1) * dim + streams * dim + i]);
            bad += std::fabs(double(gpu[e]) - cpu[e]) > tol * mag;
          }
      BOOST_TEST_INFO("md=" << dtype_name(md) << " in_place=" << in_place);
      BOOST_TEST(bad == 0);
      std::printf("engram_gate md=%s: %lld bit mismatches of %zu\n", std::string(dtype_name(md)).c_str(),
                  static_cast<long long>(count_bit_diffs(gpu, cpu, "gate")), gpu.size());
    }
}

/// The router at the released width (dim 5120, 384 experts, top-6: one warp per expert, ref::dot's chunks
/// over the lanes) and past the chunk-parallel limit (dim 8200: one thread per expert): bitwise.
BOOST_AUTO_TEST_CASE(moe_route_released_width_bitwise) {
  uint64_t const seed = test_seed(527);
  for (int64_t const dim : {5120, 8200}) {
    int64_t const rows = 3, experts = 384, k = 6;
    auto x = randn(rows * dim, seed + dim, 1.f);
    auto gate = randn(experts * dim, seed + dim + 1, 0.02f);
    auto bias = randn(experts, seed + dim + 2, 0.05f);
    ops::MoeRouteDesc d{rows, experts, dim, k, 1.f, 1.5f, true};
    auto cpu = route(false, d, x, gate, bias, {});
    auto gpu = route(true, d, x, gate, bias, {});
    BOOST_TEST_INFO("dim=" << dim);
    BOOST_TEST((gpu.ids == cpu.ids));
    BOOST_TEST(count_bit_diffs(gpu.w, cpu.w, "route weights") == 0);
    BOOST_TEST((gpu.tie == cpu.tie));
  }
}

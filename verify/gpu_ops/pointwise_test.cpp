// SPDX-License-Identifier: Apache-2.0
/// CUDA RMSNorm, RoPE, QAT fake quantisers and mHC against their CPU backends on seeded random inputs.
/// Bitwise (no transcendental): RMSNorm (sqrt and division are correctly rounded on both sides), QAT
/// (including the near-boundary flags), mHC collapse and expand. Named tolerances:
///   RoPE: bitwise. cos/sin are the fp64 cos/sin of the fp32 angle rounded once to fp32 on both sides (CUDA's
///     and glibc's fp64 cos/sin are within an fp64 ulp, which changes the fp32 rounding only within 2^-29 ulp of
///     a midpoint).
///   mHC mix: sigmoid and the softmax use CUDA expf (≤ 2 ulp) instead of glibc's: relative 1e-5
///     (kMixRelTol) on pre/post/comb after 20 Sinkhorn iterations (each a handful of roundings).
/// Row invariance: every kernel gives a row the same bits alone and inside a batch.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "tessera/ops/mhc.hpp"
#include "tessera/ops/norm.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ops/rope.hpp"
#include "tessera/ref/rope_ref.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;

namespace {

constexpr double kMixRelTol = 1e-5;

template <template <Backend> class F, class D, class A>
void run_ok(ExecContext& ctx, D const& d, A const& a) {
  auto s = ops::dispatch<F>(ctx, d, a);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
}

std::vector<float> norm_gpu(ops::RmsNormDesc const& d, std::vector<float> const& x, std::vector<float> const& w,
                            bool in_place) {
  DeviceBuffer<float> dx(x), dw(w), dy(x.size());
  ops::RmsNormArgs a{dx.cview<2>({d.rows, d.dim}), dw.cview<1>({d.dim}),
                     in_place ? dx.view<2>({d.rows, d.dim}) : dy.view<2>({d.rows, d.dim})};
  ExecContext ctx = cuda_ctx();
  run_ok<ops::RmsNorm>(ctx, d, a);
  return in_place ? dx.get() : dy.get();
}

}  // namespace

BOOST_AUTO_TEST_CASE(rms_norm_bitwise_and_row_invariant) {
  uint64_t const seed = test_seed(511);
  for (int64_t dim : {7, 1000, 4096})
    for (bool weighted : {true, false})
      for (DType md : {DType::kF32, DType::kBf16}) {
        int64_t const rows = 33;
        ops::RmsNormDesc d{rows, dim, 1e-6f, weighted, md};
        auto x = randn(static_cast<size_t>(rows * dim), seed + dim, 3.f);
        auto w = randn(static_cast<size_t>(dim), seed + 1, 0.5f, 1.f);
        std::vector<float> cpu(x.size());
        ops::RmsNormArgs a{TensorView<float const, 2>(x.data(), {rows, dim}),
                           TensorView<float const, 1>(w.data(), {dim}), TensorView<float, 2>(cpu.data(), {rows, dim})};
        ExecContext cctx;
        run_ok<ops::RmsNorm>(cctx, d, a);
        BOOST_TEST_INFO("dim=" << dim << " weighted=" << weighted << " md=" << dtype_name(md));
        BOOST_TEST(count_bit_diffs(norm_gpu(d, x, w, false), cpu, "norm") == 0);
        BOOST_TEST(count_bit_diffs(norm_gpu(d, x, w, true), cpu, "norm in place") == 0);
        ops::RmsNormDesc d1 = d;
        d1.rows = 1;
        BOOST_TEST(count_bit_diffs(norm_gpu(d1, row_slice(x, dim, 17), w, false), row_slice(cpu, dim, 17), "alone") == 0);
      }
}

BOOST_AUTO_TEST_CASE(rope_main_and_yarn_forward_inverse) {
  uint64_t const seed = test_seed(512);
  int64_t total = 0, exact = 0;
  // (rows, heads, head_dim): 13 rows take head tiles (one tile of 3 heads; 64 heads of 512 in 8 or 11 tiles), 80
  // rows a block per row; row 9 alone (tiled) must equal its row of the 80.
  struct Shape {
    int64_t rows, heads, hd;
  };
  for (Shape const sh : {Shape{13, 3, 96}, Shape{13, 64, 512}, Shape{80, 64, 512}})
  for (int64_t rd : {64, 96})
    for (bool yarn : {false, true})
      for (bool inverse : {false, true})
        for (DType md : {DType::kF32, DType::kBf16}) {
          int64_t const rows = sh.rows, heads = sh.heads, hd = sh.hd;
          std::mt19937_64 g(seed);
          std::vector<int64_t> pos(rows);
          for (int64_t r = 0; r < rows; ++r) pos[r] = r < 4 ? r : static_cast<int64_t>(g() % 1000000);
          auto inv = yarn ? ref::rope_inv_freq_yarn(160000.0, rd, 16.0, 32.0, 1.0, 65536.0)
                          : ref::rope_inv_freq_default(10000.0, rd);
          auto x = randn(static_cast<size_t>(rows * heads * hd), seed + rd + yarn, 2.f);
          if (md == DType::kBf16)
            for (auto& v : x) v = round_to_bf16(v);
          ops::RopeDesc d{rows, heads, hd, rd, inverse, md};
          std::vector<float> cpu = x;
          ops::RopeArgs a{TensorView<float, 2>(cpu.data(), {rows, heads * hd}),
                          TensorView<int64_t const, 1>(pos.data(), {rows}),
                          TensorView<float const, 1>(inv.data(), {rd / 2})};
          ExecContext cctx;
          run_ok<ops::Rope>(cctx, d, a);
          DeviceBuffer<float> dx(x), dinv(inv);
          DeviceBuffer<int64_t> dpos(pos);
          ops::RopeArgs ga{dx.view<2>({rows, heads * hd}), dpos.cview<1>({rows}), dinv.cview<1>({rd / 2})};
          ExecContext ctx = cuda_ctx();
          run_ok<ops::Rope>(ctx, d, ga);
          auto gpu = dx.get();
          int64_t bad = 0;
          for (size_t e = 0; e < gpu.size(); ++e) {
            ++total;
            exact += gpu[e] == cpu[e];
            bad += std::bit_cast<uint32_t>(gpu[e]) != std::bit_cast<uint32_t>(cpu[e]);
          }
          BOOST_TEST_INFO("rows=" << rows << " heads=" << heads << " rope_dim=" << rd << " yarn=" << yarn << " inverse=" << inverse << " md=" << dtype_name(md));
          BOOST_TEST(bad == 0);
          // Row invariance: row 9 alone.
          DeviceBuffer<float> d1(row_slice(x, heads * hd, 9));
          DeviceBuffer<int64_t> p1(std::vector<int64_t>{pos[9]});
          ops::RopeDesc dd = d;
          dd.rows = 1;
          run_ok<ops::Rope>(ctx, dd, ops::RopeArgs{d1.view<2>({1, heads * hd}), p1.cview<1>({1}), dinv.cview<1>({rd / 2})});
          BOOST_TEST(count_bit_diffs(d1.get(), row_slice(gpu, heads * hd, 9), "rope alone") == 0);
        }
  std::printf("rope: %lld of %lld elements bitwise equal to the CPU\n", static_cast<long long>(exact),
              static_cast<long long>(total));
}

BOOST_AUTO_TEST_CASE(qat_bitwise_with_boundary_flags) {
  uint64_t const seed = test_seed(513);
  for (auto kind : {ops::QatKind::kFp8Block32, ops::QatKind::kFp4Block16E4m3, ops::QatKind::kFp4Block32Ue8m0})
    for (DType md : {DType::kF32, DType::kBf16})
      for (int ulps : {0, 4})
        for (int64_t dim : {256, 40}) {
          int64_t const rows = 11;
          auto x = randn(static_cast<size_t>(rows * dim), seed + dim + static_cast<int>(kind));
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < dim; ++i) x[r * dim + i] *= std::pow(10.f, static_cast<float>(r - 5));
          ops::FakeQuantDesc d{rows, dim, kind, md, ulps};
          std::vector<float> cpu = x;
          std::vector<uint8_t> cnear(rows, 9);
          ExecContext cctx;
          run_ok<ops::FakeQuant>(cctx, d, ops::FakeQuantArgs{TensorView<float, 2>(cpu.data(), {rows, dim}),
                                                             TensorView<uint8_t, 1>(cnear.data(), {rows})});
          DeviceBuffer<float> dx(x);
          DeviceBuffer<uint8_t> dn(std::vector<uint8_t>(rows, 9));
          ExecContext ctx = cuda_ctx();
          run_ok<ops::FakeQuant>(ctx, d, ops::FakeQuantArgs{dx.view<2>({rows, dim}), dn.view<1>({rows})});
          BOOST_TEST_INFO("kind=" << int(kind) << " md=" << dtype_name(md) << " ulps=" << ulps << " dim=" << dim);
          auto gpu = dx.get();
          BOOST_TEST(count_bit_diffs(gpu, cpu, "qat") == 0);
          if (dim == 40 && kind != ops::QatKind::kFp4Block16E4m3) BOOST_TEST(count_bit_diffs(gpu, x, "pass-through") == 0);
          if (ulps > 0) {
            auto gnear = dn.get();
            BOOST_TEST((gnear == cnear));
          }
          // Row 3 alone.
          DeviceBuffer<float> d1(row_slice(x, dim, 3));
          ops::FakeQuantDesc d1d = d;
          d1d.rows = 1;
          d1d.boundary_ulps = 0;
          run_ok<ops::FakeQuant>(ctx, d1d, ops::FakeQuantArgs{d1.view<2>({1, dim}), {}});
          BOOST_TEST(count_bit_diffs(d1.get(), row_slice(gpu, dim, 3), "qat alone") == 0);
        }
}

BOOST_AUTO_TEST_CASE(qat_packed_rows_bitwise) {
  // The packed form written by the CUDA quantiser is byte-equal to the CPU's; QatUnpack on CUDA (contiguous,
  // gathered with unused slots, paged, scattered) gives the quantiser's values bit for bit.
  uint64_t const seed = test_seed(517);
  for (auto kind : {ops::QatKind::kFp8Block32, ops::QatKind::kFp4Block16E4m3, ops::QatKind::kFp4Block32Ue8m0})
    for (DType md : {DType::kF32, DType::kBf16})
      for (int64_t dim : {512, 128, 64}) {
        int64_t const rows = 37, bytes = ops::qat_packed_row_bytes(kind, dim);
        auto x = randn(static_cast<size_t>(rows * dim), seed + dim + static_cast<int>(kind));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < dim; ++i) x[r * dim + i] *= std::ldexp(1.f, static_cast<int>(r % 13) * 3 - 20);
        BOOST_TEST_INFO("kind=" << int(kind) << " md=" << dtype_name(md) << " dim=" << dim);
        ops::FakeQuantDesc d{rows, dim, kind, md, 0};
        std::vector<float> cpu = x;
        std::vector<uint8_t> cpacked(static_cast<size_t>(rows * bytes));
        ExecContext cctx;
        run_ok<ops::FakeQuant>(cctx, d, ops::FakeQuantArgs{TensorView<float, 2>(cpu.data(), {rows, dim}), {},
                                                           TensorView<uint8_t, 2>(cpacked.data(), {rows, bytes})});
        DeviceBuffer<float> dx(x);
        DeviceBuffer<uint8_t> dp(std::vector<uint8_t>(static_cast<size_t>(rows * bytes), 0xA5));
        ExecContext ctx = cuda_ctx();
        run_ok<ops::FakeQuant>(ctx, d, ops::FakeQuantArgs{dx.view<2>({rows, dim}), {}, dp.view<2>({rows, bytes})});
        BOOST_TEST(count_bit_diffs(dx.get(), cpu, "qat values") == 0);
        BOOST_TEST((dp.get() == cpacked));
        // Contiguous unpack.
        DeviceBuffer<float> du(std::vector<float>(static_cast<size_t>(rows * dim), 7.f));
        run_ok<ops::QatUnpack>(ctx, ops::QatUnpackDesc{rows, dim, rows, kind, md},
                               ops::QatUnpackArgs{dp.cview<2>({rows, bytes}), {}, du.view<2>({rows, dim})});
        BOOST_TEST(count_bit_diffs(du.get(), cpu, "unpack") == 0);
        // Gathered and paged: pages of 4 rows placed in reverse order in one arena.
        std::vector<int32_t> ids = {36, -1, 0, 17, 17, 40, 3};
        int64_t const n = static_cast<int64_t>(ids.size()), per = 4, npages = (rows + per - 1) / per;
        std::vector<float> want(static_cast<size_t>(n * dim), 0.f);
        for (int64_t i = 0; i < n; ++i)
          if (ids[i] >= 0 && ids[i] < rows) std::copy_n(cpu.begin() + ids[i] * dim, dim, want.begin() + i * dim);
        DeviceBuffer<int32_t> did(ids);
        DeviceBuffer<float> dg(std::vector<float>(static_cast<size_t>(n * dim), 7.f));
        run_ok<ops::QatUnpack>(ctx, ops::QatUnpackDesc{n, dim, rows, kind, md},
                               ops::QatUnpackArgs{dp.cview<2>({rows, bytes}), did.cview<1>({n}), dg.view<2>({n, dim})});
        BOOST_TEST(count_bit_diffs(dg.get(), want, "gathered unpack") == 0);
        std::vector<uint8_t> arena(static_cast<size_t>(npages * per * bytes), 0x5A);
        for (int64_t pg = 0; pg < npages; ++pg)
          std::copy_n(cpacked.begin() + pg * per * bytes, std::min(per, rows - pg * per) * bytes,
                      arena.begin() + (npages - 1 - pg) * per * bytes);
        DeviceBuffer<uint8_t> darena(arena);
        std::vector<uint8_t const*> pages(static_cast<size_t>(npages));
        for (int64_t pg = 0; pg < npages; ++pg) pages[pg] = darena.data() + (npages - 1 - pg) * per * bytes;
        DeviceBuffer<uint8_t const*> dpages(pages);
        DeviceBuffer<float> dpg(std::vector<float>(static_cast<size_t>(n * dim), 7.f));
        ops::QatUnpackArgs pa{{}, did.cview<1>({n}), dpg.view<2>({n, dim}), dpages.data(), per};
        run_ok<ops::QatUnpack>(ctx, ops::QatUnpackDesc{n, dim, rows, kind, md}, pa);
        BOOST_TEST(count_bit_diffs(dpg.get(), want, "paged unpack") == 0);
        // Scattered into a wider buffer: −1 and past-the-end targets write nothing.
        std::vector<int32_t> dst = {9, 0, -1, 4, 2, 10, 6};
        int64_t const out_n = 10;
        std::vector<float> want_sc(static_cast<size_t>(out_n * dim), 7.f);
        for (int64_t i = 0; i < n; ++i)
          if (dst[i] >= 0 && dst[i] < out_n) std::copy_n(want.begin() + i * dim, dim, want_sc.begin() + dst[i] * dim);
        DeviceBuffer<int32_t> ddst(dst);
        DeviceBuffer<float> dsc(std::vector<float>(static_cast<size_t>(out_n * dim), 7.f));
        ops::QatUnpackArgs sa = pa;
        sa.out = dsc.view<2>({out_n, dim});
        sa.out_rows = ddst.cview<1>({n});
        run_ok<ops::QatUnpack>(ctx, ops::QatUnpackDesc{n, dim, rows, kind, md}, sa);
        BOOST_TEST(count_bit_diffs(dsc.get(), want_sc, "scattered unpack") == 0);
      }
}

BOOST_AUTO_TEST_CASE(mhc_mix_collapse_expand) {
  uint64_t const seed = test_seed(514);
  // The split mix (rms pass, chunk-sum blocks, chunk-order finish) at n·D % 32 == 0 and not (4 × 1001);
  // n·D = 20480 is the released width, 4 × 5121 beyond it. md selects exp's arithmetic (fmath::exp_rn /
  // expf) and the softmax order. Row counts and odd shapes: mhc_mix_split_bitwise below.
  for (DType const md : {DType::kF32, DType::kBf16})
  for (int64_t dim : {64, 1000, 1001, 5120, 5121}) {
    int64_t const rows = 6, n = 4, nd = n * dim, nm = (2 + n) * n;
    auto x = randn(static_cast<size_t>(rows * nd), seed + dim, 1.5f);
    auto fn = randn(static_cast<size_t>(nm * nd), seed + 2, 0.05f);
    auto base = randn(static_cast<size_t>(nm), seed + 3, 0.5f);
    std::vector<float> scale = {0.7f, 1.3f, 2.1f};
    ops::MhcMixDesc d{rows, n, dim, 20, 1e-6f, 1e-20f, md};
    std::vector<float> pre(rows * n), post(rows * n), comb(rows * n * n);
    ExecContext cctx;
    run_ok<ops::MhcMix>(cctx, d, ops::MhcMixArgs{TensorView<float const, 2>(x.data(), {rows, nd}),
                                                 TensorView<float const, 2>(fn.data(), {nm, nd}),
                                                 TensorView<float const, 1>(base.data(), {nm}),
                                                 TensorView<float const, 1>(scale.data(), {3}),
                                                 TensorView<float, 2>(pre.data(), {rows, n}),
                                                 TensorView<float, 2>(post.data(), {rows, n}),
                                                 TensorView<float, 2>(comb.data(), {rows, n * n})});
    DeviceBuffer<float> dx(x), dfn(fn), dbase(base), dscale(scale), dpre(pre.size()), dpost(post.size()),
        dcomb(comb.size());
    ExecContext ctx = cuda_ctx();
    auto mix = [&](int64_t r0, int64_t nr, DeviceBuffer<float>& px, DeviceBuffer<float>& pp, DeviceBuffer<float>& pq,
                   DeviceBuffer<float>& pc) {
      ops::MhcMixDesc dd = d;
      dd.rows = nr;
      run_ok<ops::MhcMix>(ctx, dd, ops::MhcMixArgs{TensorView<float const, 2>(px.data() + r0 * nd, {nr, nd}, Device::kCuda),
                                                   dfn.cview<2>({nm, nd}), dbase.cview<1>({nm}), dscale.cview<1>({3}),
                                                   pp.view<2>({nr, n}), pq.view<2>({nr, n}), pc.view<2>({nr, n * n})});
    };
    mix(0, rows, dx, dpre, dpost, dcomb);
    auto gpre = dpre.get(), gpost = dpost.get(), gcomb = dcomb.get();
    BOOST_TEST_INFO("dim=" << dim << " md=" << dtype_name(md));
    BOOST_TEST(max_rel_diff(gpre, pre) <= kMixRelTol);
    BOOST_TEST(max_rel_diff(gpost, post) <= kMixRelTol);
    BOOST_TEST(max_rel_diff(gcomb, comb) <= kMixRelTol);
    BOOST_TEST(count_bit_diffs(gpre, pre, "pre") + count_bit_diffs(gpost, post, "post") +
                   count_bit_diffs(gcomb, comb, "comb") == 0);  // bitwise: the same exp (exp_md) and sum orders on both sides
    std::printf("mhc_mix dim=%lld md=%s: bit mismatches pre %lld post %lld comb %lld (max rel %.3g)\n",
                static_cast<long long>(dim), std::string(dtype_name(md)).c_str(),
                static_cast<long long>(count_bit_diffs(gpre, pre, "pre")),
                static_cast<long long>(count_bit_diffs(gpost, post, "post")),
                static_cast<long long>(count_bit_diffs(gcomb, comb, "comb")), max_rel_diff(gcomb, comb));
    DeviceBuffer<float> a1{static_cast<size_t>(n)}, a2{static_cast<size_t>(n)}, a3{static_cast<size_t>(n * n)};
    mix(4, 1, dx, a1, a2, a3);
    BOOST_TEST(count_bit_diffs(a1.get(), row_slice(gpre, n, 4), "mix alone pre") == 0);
    BOOST_TEST(count_bit_diffs(a3.get(), row_slice(gcomb, n * n, 4), "mix alone comb") == 0);

    // Collapse and expand on the CPU's pre/post/comb (so both sides see identical inputs): bitwise.
    dpre.upload(pre);
    dpost.upload(post);
    dcomb.upload(comb);
    auto y = randn(static_cast<size_t>(rows * dim), seed + 5);
    DeviceBuffer<float> dy(y), dout(static_cast<size_t>(rows * dim)), dexp(static_cast<size_t>(rows * nd));
    for (DType md : {DType::kF32, DType::kBf16}) {
      std::vector<float> col(rows * dim), ex(rows * nd);
      run_ok<ops::MhcCollapse>(cctx, ops::MhcCollapseDesc{rows, n, dim, md},
                               ops::MhcCollapseArgs{TensorView<float const, 2>(x.data(), {rows, nd}),
                                                    TensorView<float const, 2>(pre.data(), {rows, n}),
                                                    TensorView<float, 2>(col.data(), {rows, dim})});
      run_ok<ops::MhcExpand>(cctx, ops::MhcExpandDesc{rows, n, dim, md},
                             ops::MhcExpandArgs{TensorView<float const, 2>(y.data(), {rows, dim}),
                                                TensorView<float const, 2>(x.data(), {rows, nd}),
                                                TensorView<float const, 2>(post.data(), {rows, n}),
                                                TensorView<float const, 2>(comb.data(), {rows, n * n}),
                                                TensorView<float, 2>(ex.data(), {rows, nd})});
      run_ok<ops::MhcCollapse>(ctx, ops::MhcCollapseDesc{rows, n, dim, md},
                               ops::MhcCollapseArgs{dx.cview<2>({rows, nd}), dpre.cview<2>({rows, n}),
                                                    dout.view<2>({rows, dim})});
      run_ok<ops::MhcExpand>(ctx, ops::MhcExpandDesc{rows, n, dim, md},
                             ops::MhcExpandArgs{dy.cview<2>({rows, dim}), dx.cview<2>({rows, nd}),
                                                dpost.cview<2>({rows, n}), dcomb.cview<2>({rows, n * n}),
                                                dexp.view<2>({rows, nd})});
      BOOST_TEST_INFO("md=" << dtype_name(md));
      BOOST_TEST(count_bit_diffs(dout.get(), col, "collapse") == 0);
      BOOST_TEST(count_bit_diffs(dexp.get(), ex, "expand") == 0);
    }
  }
}

// MhcMix's split projection against the CPU op, bitwise, on fresh inputs per case: every row tile of the
// chunk-sum kernel (1, 2, 4, 8 rows: rows 1, 2, 7 and 64 / 300 with a partial last tile), two scratch slabs
// (600 rows of the released shape: 546 + 54), lane_sum's 4-wide (n·D % 128 == 0) and 1-wide orders, partial
// last chunks and chunk groups, nm = 80 (n = 8: one chunk per block), and from 4,096 rows the one-pass chunk sums and
// totals (mhc_mix_totals_kernel; its last row alone takes the split path). fn ~ N(0, 1/n·D) so the mix outputs
// are O(1) and neither the sigmoids nor the softmax saturate; output buffers start as NaN so an unwritten
// element fails the finiteness check (count_bit_diffs counts two NaNs as equal).
BOOST_AUTO_TEST_CASE(mhc_mix_split_bitwise) {
  uint64_t const seed = test_seed(515);
  struct Case {
    int64_t n, dim;
    std::vector<int64_t> rows;
  };
  std::vector<Case> const cases = {
      {4, 5120, {1, 2, 7, 64, 300, 600}},  // released: nm = 24, 5 chunks per block, 128 blocks per row tile
      {3, 37, {1, 2, 7, 64, 300}},         // n·D = 111: chunks 32, 32, 32, 15 in one group; lane_sum 1-wide
      {8, 129, {1, 7, 64}},                // nm = 80, one chunk per block, n·D = 1032 (last chunk 8 wide)
      {4, 5121, {1, 7}},                   // n·D = 20484 (past the released width): last chunk 4 wide
      {4, 1280, {4161}},                   // from kTotalsMinRows rows: chunk sums and totals in one pass (last block 1 row)
      {4, 5120, {4096}},                   // the same at the released width (160 groups of 4 chunks)
  };
  uint64_t salt = 0;
  for (DType const md : {DType::kF32, DType::kBf16})
    for (Case const& cs : cases)
      for (int64_t const rows : cs.rows) {
        ++salt;
        int64_t const n = cs.n, dim = cs.dim, nd = n * dim, nm = (2 + n) * n;
        auto x = randn(static_cast<size_t>(rows * nd), seed + 100 * salt, 1.5f);
        auto fn = randn(static_cast<size_t>(nm * nd), seed + 100 * salt + 1, 1.f / std::sqrt(static_cast<float>(nd)));
        auto base = randn(static_cast<size_t>(nm), seed + 100 * salt + 2, 0.5f);
        std::vector<float> const scale = {0.7f, 1.3f, 2.1f};
        ops::MhcMixDesc d{rows, n, dim, 20, 1e-6f, 1e-20f, md};
        std::vector<float> pre(rows * n), post(rows * n), comb(rows * n * n);
        ExecContext cctx;
        run_ok<ops::MhcMix>(cctx, d, ops::MhcMixArgs{TensorView<float const, 2>(x.data(), {rows, nd}),
                                                     TensorView<float const, 2>(fn.data(), {nm, nd}),
                                                     TensorView<float const, 1>(base.data(), {nm}),
                                                     TensorView<float const, 1>(scale.data(), {3}),
                                                     TensorView<float, 2>(pre.data(), {rows, n}),
                                                     TensorView<float, 2>(post.data(), {rows, n}),
                                                     TensorView<float, 2>(comb.data(), {rows, n * n})});
        float const qnan = std::numeric_limits<float>::quiet_NaN();
        DeviceBuffer<float> dx(x), dfn(fn), dbase(base), dscale(scale);
        ExecContext ctx = cuda_ctx();
        auto mix = [&](int64_t r0, int64_t nr) {
          DeviceBuffer<float> dp(std::vector<float>(nr * n, qnan)), dq(std::vector<float>(nr * n, qnan)),
              dc(std::vector<float>(nr * n * n, qnan));
          ops::MhcMixDesc dd = d;
          dd.rows = nr;
          run_ok<ops::MhcMix>(ctx, dd,
                              ops::MhcMixArgs{TensorView<float const, 2>(dx.data() + r0 * nd, {nr, nd}, Device::kCuda),
                                              dfn.cview<2>({nm, nd}), dbase.cview<1>({nm}), dscale.cview<1>({3}),
                                              dp.view<2>({nr, n}), dq.view<2>({nr, n}), dc.view<2>({nr, n * n})});
          return std::array<std::vector<float>, 3>{dp.get(), dq.get(), dc.get()};
        };
        auto const [gpre, gpost, gcomb] = mix(0, rows);
        BOOST_TEST_INFO("n=" << n << " dim=" << dim << " rows=" << rows << " md=" << dtype_name(md));
        int64_t const bad = count_bit_diffs(gpre, pre, "pre") + count_bit_diffs(gpost, post, "post") +
                            count_bit_diffs(gcomb, comb, "comb");
        BOOST_TEST(bad == 0);
        // Real values: every output written and finite, pre in (0, 1 + hc_eps], post in (0, 2], and each column
        // of comb summing to ~1 (the Sinkhorn iterations end on a column normalisation).
        bool finite = true, ranges = true;
        for (float v : gpre) { finite &= std::isfinite(v); ranges &= v > 0.f && v <= 1.f + 1e-6f; }
        for (float v : gpost) { finite &= std::isfinite(v); ranges &= v > 0.f && v <= 2.f; }
        for (float v : gcomb) finite &= std::isfinite(v);
        BOOST_TEST(finite);
        BOOST_TEST(ranges);
        double worst_col = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < n; ++k) {
            double s = 0;
            for (int64_t j = 0; j < n; ++j) s += gcomb[r * n * n + j * n + k];
            worst_col = std::max(worst_col, std::abs(s - 1.0));
          }
        BOOST_TEST(worst_col < 1e-3);
        // Not saturated: the pre gates spread over the sigmoid's range.
        auto const [lo, hi] = std::minmax_element(gpre.begin(), gpre.end());
        if (rows * n >= 8) BOOST_TEST(*hi - *lo > 0.05f);
        if (rows > 1) {  // distinct rows give distinct outputs (no row reads another's inputs)
          BOOST_TEST((row_slice(gcomb, n * n, 0) != row_slice(gcomb, n * n, rows - 1)));
          // Row invariance: the last row alone.
          auto const [p1, q1, c1] = mix(rows - 1, 1);
          BOOST_TEST(count_bit_diffs(p1, row_slice(gpre, n, rows - 1), "alone pre") +
                         count_bit_diffs(q1, row_slice(gpost, n, rows - 1), "alone post") +
                         count_bit_diffs(c1, row_slice(gcomb, n * n, rows - 1), "alone comb") == 0);
        }
        std::printf("mhc_mix split n=%lld dim=%lld rows=%lld md=%s: %lld bit mismatches, column sums %.2g from 1\n",
                    static_cast<long long>(n), static_cast<long long>(dim), static_cast<long long>(rows),
                    std::string(dtype_name(md)).c_str(), static_cast<long long>(bad), worst_col);
      }
}

// SPDX-License-Identifier: Apache-2.0
/// QAT fake quantisers, RMSNorm and RoPE ops against independent formulations: brute-force nearest-grid
/// search over every e4m3 / e2m1 value (ties resolved by the spec's rule, not by the bit tricks of
/// core/dtype.hpp), double-precision norms and complex-number rotations.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <vector>

#include "tessera/ops/norm.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ops/rope.hpp"
#include "tessera/ref/rope_ref.hpp"
#include "verify/common/random.hpp"

using namespace tessera;

namespace {

/// Nearest e4m3 value to q (|q| ≤ 448) by exhaustive search; ties to the even code.
float e4m3_nearest(float q) {
  double best = 1e30;
  int best_code = 0;
  for (int c = 0; c < 256; ++c) {
    float v = float_from_fp8_e4m3(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    double d = std::fabs(static_cast<double>(v) - q);
    if (d < best || (d == best && (c & 1) == 0 && std::signbit(v) == std::signbit(q))) { best = d; best_code = c; }
  }
  return float_from_fp8_e4m3(static_cast<uint8_t>(best_code));
}
/// Nearest e2m1 magnitude with the spec's tie table: ties at 0.25, 1.25, 2.5, 5 round down, at 0.75,
/// 1.75, 3.5 round up.
float e2m1_nearest(float q) {
  static double const grid[8] = {0, .5, 1, 1.5, 2, 3, 4, 6};
  double a = std::fabs(q);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    double d = std::fabs(grid[i] - a), db = std::fabs(grid[best] - a);
    if (d < db || (d == db && (i % 2 == 0))) best = i;  // tie → even code index
  }
  return static_cast<float>(std::signbit(q) ? -grid[best] : grid[best]);
}

std::vector<float> quant(std::vector<float> x, int64_t dim, ops::QatKind kind) {
  ExecContext ctx;
  int64_t rows = static_cast<int64_t>(x.size()) / dim;
  BOOST_REQUIRE(ops::fake_quant(ctx, {rows, dim, kind, DType::kF32}, {TensorView<float, 2>(x.data(), {rows, dim})}).ok());
  return x;
}

Status run_unpack(ExecContext& ctx, ops::QatUnpackDesc const& d, std::vector<uint8_t> const& packed,
                  std::vector<int32_t> const& ids, std::vector<float>& out) {
  int64_t const bytes = ops::qat_packed_row_bytes(d.kind, d.dim);
  ops::QatUnpackArgs a{TensorView<uint8_t const, 2>(packed.data(), {d.src_rows, bytes}),
                       TensorView<int32_t const, 1>(ids.empty() ? nullptr : ids.data(), {static_cast<int64_t>(ids.size())}),
                       TensorView<float, 2>(out.data(), {d.rows, d.dim})};
  if (auto st = ops::QatUnpack<Backend::kCpu>::check(d, a); !st.ok()) return st;
  return ops::QatUnpack<Backend::kCpu>::run(d, a, ctx);
}

std::vector<float> quant_md(std::vector<float> x, int64_t dim, ops::QatKind kind, DType md) {
  ExecContext ctx;
  int64_t rows = static_cast<int64_t>(x.size()) / dim;
  BOOST_REQUIRE(ops::fake_quant(ctx, {rows, dim, kind, md}, {TensorView<float, 2>(x.data(), {rows, dim})}).ok());
  return x;
}

bool bits_equal(std::vector<float> const& a, std::vector<float> const& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(qat)

BOOST_AUTO_TEST_CASE(fp8_block32_vs_bruteforce) {
  auto x = verify::randn(64 * 8, verify::test_seed(11), 2.f);
  x[5] = 0.f;  x[40] = -0.f;  // zeros inside a block
  for (int i = 64; i < 96; ++i) x[i] = 1e-6f * (i - 80);  // amax clamp to 1e-4 bites
  auto y = quant(x, 64, ops::QatKind::kFp8Block32);
  for (size_t b = 0; b < x.size(); b += 32) {
    double amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
    amax = std::max(amax, 1e-4);
    // Smallest power of two ≥ amax/448 (computed in double; amax/448 is not a power of two here).
    double scale = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(static_cast<float>(amax) * (1.f / 448.f)))));
    for (size_t i = b; i < b + 32; ++i) {
      float q = std::clamp(x[i] / static_cast<float>(scale), -448.f, 448.f);
      BOOST_TEST(y[i] == e4m3_nearest(q) * static_cast<float>(scale));
    }
  }
}

BOOST_AUTO_TEST_CASE(fp4_block16_e4m3_ties_and_bruteforce) {
  // A block with amax 6 has scale e4m3(1) = 1, so the tie points are hit exactly.
  std::vector<float> x = {6.f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, -0.25f, -0.75f, -2.5f, -5.f, -0.f, 0.1f, 5.5f, -6.f};
  auto y = quant(x, 16, ops::QatKind::kFp4Block16E4m3);
  std::vector<float> expect = {6, 0, 1, 1, 2, 2, 4, 4, 0.f, -1, -2, -4, 0.f, 0, 6, -6};
  for (size_t i = 0; i < x.size(); ++i) BOOST_TEST(y[i] == expect[i]);
  // −0.25 and −0 take code 8 (−0), which the golden's value table (_FP4_TABLE[8] = 0.0) reads as +0; its debug
  // tensors of the indexer keys hold +0 there.
  BOOST_TEST(!std::signbit(y[8]));
  BOOST_TEST(!std::signbit(y[12]));
  auto r = verify::randn(16 * 20, verify::test_seed(12), 0.3f);
  auto z = quant(r, 32, ops::QatKind::kFp4Block16E4m3);
  for (size_t b = 0; b < r.size(); b += 16) {
    float amax = 0;
    for (size_t i = b; i < b + 16; ++i) amax = std::max(amax, std::fabs(r[i]));
    float scale = e4m3_nearest(std::max(amax, 6.f / 512.f) / 6.f);
    for (size_t i = b; i < b + 16; ++i)
      BOOST_TEST(z[i] == e2m1_nearest(std::clamp(r[i] / scale, -6.f, 6.f)) * scale);
  }
}

BOOST_AUTO_TEST_CASE(fp4_block32_ue8m0_vs_bruteforce) {
  auto r = verify::randn(32 * 16, verify::test_seed(13), 1.5f);
  auto z = quant(r, 64, ops::QatKind::kFp4Block32Ue8m0);
  for (size_t b = 0; b < r.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(r[i]));
    float t = amax * static_cast<float>(1.0 / 6.0);
    float scale = static_cast<float>(std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(static_cast<double>(t))))));
    for (size_t i = b; i < b + 32; ++i) BOOST_TEST(z[i] == e2m1_nearest(std::clamp(r[i] / scale, -6.f, 6.f)) * scale);
  }
}

BOOST_AUTO_TEST_CASE(near_boundary_report) {
  // Blocks of 32 with amax 384 (scale 1): 2.375 is the e4m3 midpoint between 2.25 and 2.5. The reach
  // is 2 ulps of the block's amax (2·2^-15 = 6.1e-5 here).
  std::vector<float> x(64, 0.5f);
  x[0] = 384.f; x[1] = 2.375f - 2e-5f;                        // within reach of a midpoint: flagged
  x[32] = 384.f; x[33] = 2.3f;                                // every value well inside its cell
  for (int i = 34; i < 64; ++i) x[i] = 0.25f * (i % 7) + 0.1f;
  std::vector<uint8_t> near(2, 9);
  ExecContext ctx;
  BOOST_REQUIRE(ops::fake_quant(ctx, {2, 32, ops::QatKind::kFp8Block32, DType::kF32, 2},
                                {TensorView<float, 2>(x.data(), {2, 32}), TensorView<uint8_t, 1>(near.data(), {2})}).ok());
  BOOST_TEST(near[0] == 1);
  BOOST_TEST(near[1] == 0);
  BOOST_TEST(x[1] == 2.25f);  // and the quantisation itself still happened
}

BOOST_AUTO_TEST_CASE(width_not_multiple_of_block_passes_through) {
  auto x = verify::randn(48, verify::test_seed(14));
  auto y = quant(x, 48, ops::QatKind::kFp8Block32);
  BOOST_TEST(x == y);
}

BOOST_AUTO_TEST_CASE(packed_rows_reproduce_the_quantiser) {
  // Every kind and model dtype: the packed row unpacks to exactly the quantised values, through the identity
  // and through a gather with unused (−1) and out-of-range slots. Rows span magnitudes from the clamp floors
  // (subnormal e4m3 scales of B.2, the 1e-4 floor of B.1) to large values, with ±0 and saturating outliers.
  BOOST_TEST(ops::qat_packed_row_bytes(ops::QatKind::kFp4Block16E4m3, 512) == 288);
  BOOST_TEST(ops::qat_packed_row_bytes(ops::QatKind::kFp4Block32Ue8m0, 128) == 68);
  BOOST_TEST(ops::qat_packed_row_bytes(ops::QatKind::kFp8Block32, 512) == 528);
  BOOST_TEST(ops::qat_packed_row_bytes(ops::QatKind::kFp8Block32, 48) == 0);
  int64_t const rows = 12, dim = 128;
  for (auto kind : {ops::QatKind::kFp8Block32, ops::QatKind::kFp4Block16E4m3, ops::QatKind::kFp4Block32Ue8m0})
    for (DType md : {DType::kF32, DType::kBf16}) {
      BOOST_TEST_CONTEXT("kind " << static_cast<int>(kind) << " md " << dtype_name(md)) {
        auto x = verify::randn(static_cast<size_t>(rows * dim), verify::test_seed(15), 1.f);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < dim; ++i) x[static_cast<size_t>(r * dim + i)] *= std::ldexp(1.f, static_cast<int>(3 * r - 24));
        x[3] = 0.f; x[4] = -0.f; x[7] = 1e30f; x[200] = -1e-30f;
        int64_t const bytes = ops::qat_packed_row_bytes(kind, dim);
        std::vector<float> q = x;
        std::vector<uint8_t> packed(static_cast<size_t>(rows * bytes), 0xA5);
        ExecContext ctx;
        BOOST_REQUIRE(ops::fake_quant(ctx, {rows, dim, kind, md},
                                      {TensorView<float, 2>(q.data(), {rows, dim}), {},
                                       TensorView<uint8_t, 2>(packed.data(), {rows, bytes})}).ok());
        BOOST_TEST(bits_equal(q, quant_md(x, dim, kind, md)));  // the packed output does not change the values
        std::vector<float> u(q.size(), 7.f);
        BOOST_REQUIRE(run_unpack(ctx, {rows, dim, rows, kind, md}, packed, {}, u).ok());
        BOOST_TEST(bits_equal(u, q));
        std::vector<int32_t> ids = {5, -1, 11, 0, 5, 99};
        int64_t const n = static_cast<int64_t>(ids.size());
        std::vector<float> g(static_cast<size_t>(n * dim), 7.f);
        BOOST_REQUIRE(run_unpack(ctx, {n, dim, rows, kind, md}, packed, ids, g).ok());
        std::vector<float> want(g.size(), 0.f);
        for (int64_t i = 0; i < n; ++i) {
          int32_t const id = ids[static_cast<size_t>(i)];
          if (id >= 0 && id < rows) std::copy_n(q.begin() + id * dim, dim, want.begin() + i * dim);
        }
        BOOST_TEST(bits_equal(g, want));
        // The same rows paged: pages of 5 rows copied out of order into one arena.
        int64_t const per = 5, npages = (rows + per - 1) / per;
        std::vector<uint8_t> arena(static_cast<size_t>(npages * per * bytes), 0x5A);
        std::vector<uint8_t const*> pages(static_cast<size_t>(npages));
        for (int64_t pg = 0; pg < npages; ++pg) {
          int64_t const slot = npages - 1 - pg;
          int64_t const n_rows = std::min(per, rows - pg * per);
          std::copy_n(packed.begin() + pg * per * bytes, n_rows * bytes, arena.begin() + slot * per * bytes);
          pages[static_cast<size_t>(pg)] = arena.data() + slot * per * bytes;
        }
        std::vector<float> pgd(g.size(), 7.f);
        ops::QatUnpackArgs pa{{}, TensorView<int32_t const, 1>(ids.data(), {n}), TensorView<float, 2>(pgd.data(), {n, dim}),
                              pages.data(), per};
        ops::QatUnpackDesc const pd{n, dim, rows, kind, md};
        BOOST_REQUIRE(ops::QatUnpack<Backend::kCpu>::check(pd, pa).ok());
        BOOST_REQUIRE(ops::QatUnpack<Backend::kCpu>::run(pd, pa, ctx).ok());
        BOOST_TEST(bits_equal(pgd, want));
        // Scattered: result i to out row dst[i] of a wider buffer; −1 and past-the-end targets write nothing,
        // untargeted rows keep their bytes.
        std::vector<int32_t> dst = {8, 0, -1, 3, 2, 9, 5};
        int64_t const out_n = 9;
        dst.resize(static_cast<size_t>(n));
        std::vector<float> sc(static_cast<size_t>(out_n * dim), 7.f), want_sc = sc;
        for (int64_t i = 0; i < n; ++i)
          if (dst[static_cast<size_t>(i)] >= 0 && dst[static_cast<size_t>(i)] < out_n)
            std::copy_n(want.begin() + i * dim, dim, want_sc.begin() + dst[static_cast<size_t>(i)] * dim);
        ops::QatUnpackArgs sa = pa;
        sa.out = TensorView<float, 2>(sc.data(), {out_n, dim});
        sa.out_rows = TensorView<int32_t const, 1>(dst.data(), {n});
        BOOST_REQUIRE(ops::QatUnpack<Backend::kCpu>::check(pd, sa).ok());
        BOOST_REQUIRE(ops::QatUnpack<Backend::kCpu>::run(pd, sa, ctx).ok());
        BOOST_TEST(bits_equal(sc, want_sc));
        sa.out_rows = TensorView<int32_t const, 1>(dst.data(), {n - 1});  // out_rows must cover every result row
        BOOST_TEST(!ops::QatUnpack<Backend::kCpu>::check(pd, sa).ok());
      }
    }
}

BOOST_AUTO_TEST_CASE(packed_rows_reject_bad_shapes) {
  ExecContext ctx;
  std::vector<float> x(2 * 48, 1.f);
  std::vector<uint8_t> packed(2 * 64);
  // 48 values have no FP4-block-32 form.
  auto st = ops::fake_quant(ctx, {2, 48, ops::QatKind::kFp4Block32Ue8m0, DType::kF32},
                            {TensorView<float, 2>(x.data(), {2, 48}), {}, TensorView<uint8_t, 2>(packed.data(), {2, 26})});
  BOOST_TEST(!st.ok());
  BOOST_TEST(x == std::vector<float>(2 * 48, 1.f));  // rejected before any write
  // Wrong packed width for a packable row.
  st = ops::fake_quant(ctx, {2, 32, ops::QatKind::kFp4Block16E4m3, DType::kF32},
                       {TensorView<float, 2>(x.data(), {2, 32}), {}, TensorView<uint8_t, 2>(packed.data(), {2, 17})});
  BOOST_TEST(!st.ok());
  std::vector<float> out(3 * 48);
  BOOST_TEST(!run_unpack(ctx, {3, 32, 2, ops::QatKind::kFp4Block16E4m3, DType::kF32}, packed, {}, out).ok());  // rows ≠ src_rows
  BOOST_TEST(!run_unpack(ctx, {2, 48, 2, ops::QatKind::kFp8Block32, DType::kF32}, packed, {}, out).ok());     // no packed form
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(norm)

BOOST_AUTO_TEST_CASE(weighted_and_unweighted_vs_double) {
  int64_t rows = 7, dim = 96;
  auto x = verify::randn(rows * dim, verify::test_seed(21));
  auto w = verify::randn(dim, verify::test_seed(22), 0.1f, 1.f);
  for (int64_t i = 0; i < dim; ++i) x[6 * dim + i] = 0.f;  // a zero row: eps = 1e-20 gives zeros, not NaN
  ExecContext ctx;
  for (bool weighted : {true, false})
    for (DType md : {DType::kF32, DType::kBf16}) {
      std::vector<float> y(rows * dim);
      BOOST_REQUIRE(ops::rms_norm(ctx, {rows, dim, 1e-20f, weighted, md},
                                  {TensorView<float const, 2>(x.data(), {rows, dim}), TensorView<float const, 1>(w.data(), {dim}),
                                   TensorView<float, 2>(y.data(), {rows, dim})}).ok());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
        double inv = 1.0 / std::sqrt(ss / dim + 1e-20);
        for (int64_t i = 0; i < dim; ++i) {
          double e = x[r * dim + i] * inv * (weighted ? w[i] : 1.0);
          float got = y[r * dim + i];
          BOOST_TEST(!std::isnan(got));
          double tol = (weighted && md == DType::kBf16) ? std::fabs(e) * 0x1p-7 + 1e-30 : std::fabs(e) * 1e-6 + 1e-30;
          BOOST_TEST(std::fabs(got - e) <= tol);
          if (weighted && md == DType::kBf16) BOOST_TEST(got == round_to_bf16(got));
        }
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rope)

BOOST_AUTO_TEST_CASE(partial_interleaved_vs_complex_and_inverse) {
  int64_t rows = 5, heads = 3, hd = 64, rd = 16;
  auto x = verify::randn(rows * heads * hd, verify::test_seed(31));
  std::vector<int64_t> pos = {0, 1, 17, 300, 1000};
  auto inv = ref::rope_inv_freq_default(10000.0, rd);
  auto y = x;
  ExecContext ctx;
  auto run = [&](std::vector<float>& v, bool inverse) {
    BOOST_REQUIRE(ops::rope(ctx, {rows, heads, hd, rd, inverse, DType::kF32},
                            {TensorView<float, 2>(v.data(), {rows, heads * hd}), TensorView<int64_t const, 1>(pos.data(), {rows}),
                             TensorView<float const, 1>(inv.data(), {rd / 2})}).ok());
  };
  run(y, false);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      float const* a = &x[(r * heads + h) * hd];
      float const* b = &y[(r * heads + h) * hd];
      for (int64_t i = 0; i < hd - rd; ++i) BOOST_TEST(a[i] == b[i]);  // nope channels untouched
      for (int64_t p = 0; p < rd / 2; ++p) {
        double phi = static_cast<double>(static_cast<float>(pos[r]) * inv[p]);
        std::complex<double> z(a[hd - rd + 2 * p], a[hd - rd + 2 * p + 1]), e = z * std::polar(1.0, phi);
        BOOST_TEST(std::fabs(b[hd - rd + 2 * p] - e.real()) <= 1e-5);
        BOOST_TEST(std::fabs(b[hd - rd + 2 * p + 1] - e.imag()) <= 1e-5);
      }
    }
  run(y, true);
  for (size_t i = 0; i < x.size(); ++i) BOOST_TEST(std::fabs(y[i] - x[i]) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(yarn_tiny_table_matches_formula) {
  // Tiny configuration (spec §6): low = 0, high = 3 → slot 0 original, slots ≥ 3 divided by 4.
  auto f = ref::rope_inv_freq_yarn(160000.0, 16, 4.0, 32.0, 1.0, 128.0);
  auto d = ref::rope_inv_freq_default(160000.0, 16);
  BOOST_TEST(f[0] == d[0]);
  for (int j = 3; j < 8; ++j) BOOST_TEST(std::fabs(f[j] - d[j] / 4) <= 1e-6 * d[j]);
  BOOST_TEST((f[1] < d[1] && f[1] > d[1] / 4));
}

BOOST_AUTO_TEST_SUITE_END()

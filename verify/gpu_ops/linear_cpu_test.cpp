// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the linear family: fp32 and bf16-stored weights both give ref::linear_row over rows bit
/// for bit (bf16 widening is exact), md fp32 and bf16; strided rows; shape errors name the argument;
/// block-scaled FP8 / FP4 weights give what bf16 weights holding their decoded values give. The
/// CUDA backend is checked against this in linear_test.cpp (gpu suite).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <random>
#include <string>

#include "tessera/ops/linear.hpp"
#include "tessera/ref/common_ref.hpp"
#include "verify/common/random.hpp"

using namespace tessera;

BOOST_AUTO_TEST_CASE(linear_cpu_matches_ref_for_both_weight_types) {
  uint64_t const seed = verify::test_seed(541);
  int64_t const rows = 7, in = 301, out = 45;
  auto x = verify::randn(static_cast<size_t>(rows * (in + 5)), seed);
  for (auto& v : x) v = round_to_bf16(v);  // bf16 weights with a bf16 output take bf16 activations
  auto w = verify::randn(static_cast<size_t>(out * in), seed + 1, 0.05f);
  for (auto& v : w) v = round_to_bf16(v);
  std::vector<Bf16> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = Bf16::from_float(w[i]);
  for (DType md : {DType::kF32, DType::kBf16})
    for (DType wdt : {DType::kF32, DType::kBf16}) {
      std::vector<float> y(static_cast<size_t>(rows * (out + 2)), -3.f);
      ops::LinearArgs a;
      a.x = TensorView<float const, 2>(x.data(), {rows, in}, {in + 5, 1});
      a.w = TensorView<float const, 2>(w.data(), {out, in});
      a.w_bf16 = TensorView<Bf16 const, 2>(wb.data(), {out, in});
      a.y = TensorView<float, 2>(y.data(), {rows, out}, {out + 2, 1});
      ExecContext ctx;
      auto s = ops::dispatch<ops::Linear>(ctx, ops::LinearDesc{rows, in, out, wdt, md}, a);
      BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> ref(static_cast<size_t>(out));
        ref::linear_row(&x[r * (in + 5)], w.data(), in, out, ref.data(), md);
        for (int64_t o = 0; o < out; ++o)
          bad += std::bit_cast<uint32_t>(y[r * (out + 2) + o]) != std::bit_cast<uint32_t>(ref[o]);
        bad += y[r * (out + 2) + out] != -3.f;
      }
      BOOST_TEST_INFO("md=" << dtype_name(md) << " w=" << dtype_name(wdt));
      BOOST_TEST(bad == 0);
    }
}

BOOST_AUTO_TEST_CASE(linear_cpu_rejects_bad_arguments) {
  std::vector<float> x(12), w(12), y(12);
  ops::LinearArgs a;
  a.x = TensorView<float const, 2>(x.data(), {3, 4});
  a.w = TensorView<float const, 2>(w.data(), {3, 4});
  a.y = TensorView<float, 2>(y.data(), {3, 4});
  ExecContext ctx;
  auto s = ops::linear(ctx, ops::LinearDesc{3, 4, 3, DType::kF32, DType::kF32}, a);  // y has 4 columns, out is 3
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.to_string().find("linear y") != std::string::npos);
  s = ops::linear(ctx, ops::LinearDesc{3, 4, 4, DType::kF16, DType::kF32}, a);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.to_string().find("weight_dtype") != std::string::npos);
  // bf16 weights with a bf16 output refuse an x value that is not a bf16 value, naming it.
  std::vector<Bf16> wb(12, Bf16::from_float(0.5f));
  a.w_bf16 = TensorView<Bf16 const, 2>(wb.data(), {3, 4});
  a.y = TensorView<float, 2>(y.data(), {3, 3});
  for (size_t i = 0; i < x.size(); ++i) x[i] = round_to_bf16(0.37f * static_cast<float>(i) - 1.f);
  s = ops::linear(ctx, ops::LinearDesc{3, 4, 3, DType::kBf16, DType::kBf16}, a);
  BOOST_TEST(s.ok());
  x[6] = 1.f + 1.f / 1024.f;  // not a bf16 value (8 significand bits)
  s = ops::linear(ctx, ops::LinearDesc{3, 4, 3, DType::kBf16, DType::kBf16}, a);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.to_string().find("x[1, 2]") != std::string::npos);
  s = ops::linear(ctx, ops::LinearDesc{3, 4, 3, DType::kBf16, DType::kF32}, a);  // fp32 output: any x
  BOOST_TEST(s.ok());
  a.y = TensorView<float, 2>(y.data(), {3, 4});
  ctx.backend = Backend::kCuda;  // the plain entry point is CPU-only; ops::dispatch routes to CUDA
  s = ops::linear(ctx, ops::LinearDesc{3, 4, 4, DType::kF32, DType::kF32}, a);
  BOOST_TEST(!s.ok());
}

/// The grouped form (wo_a): group g of one call equals ref::linear_row / ref::bmm_dot on its own slices of x,
/// W and y, for both weight types, both output dtypes, both dot orders; columns outside the groups' outputs
/// (the padded row stride) are untouched; a grouped call with mismatched shapes names the argument.
BOOST_AUTO_TEST_CASE(linear_cpu_grouped_matches_per_group_ref) {
  uint64_t const seed = verify::test_seed(542);
  int64_t const rows = 5, in = 40, out = 24, G = 3;
  auto x = verify::randn(static_cast<size_t>(rows * G * in), seed);
  for (auto& v : x) v = round_to_bf16(v);
  auto w = verify::randn(static_cast<size_t>(G * out * in), seed + 1, 0.05f);
  for (auto& v : w) v = round_to_bf16(v);
  std::vector<Bf16> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = Bf16::from_float(w[i]);
  for (bool fma_chain : {false, true})
    for (DType md : {DType::kF32, DType::kBf16})
      for (DType wdt : {DType::kF32, DType::kBf16}) {
        int64_t const ys = G * out + 2;
        std::vector<float> y(static_cast<size_t>(rows * ys), -3.f);
        ops::LinearArgs a;
        a.x = TensorView<float const, 2>(x.data(), {rows, G * in});
        a.w = TensorView<float const, 2>(w.data(), {G * out, in});
        a.w_bf16 = TensorView<Bf16 const, 2>(wb.data(), {G * out, in});
        a.y = TensorView<float, 2>(y.data(), {rows, G * out}, {ys, 1});
        ExecContext ctx;
        auto s = ops::linear(ctx, ops::LinearDesc{rows, in, out, wdt, md, fma_chain, ops::LinearImpl::kAuto, G}, a);
        BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t g = 0; g < G; ++g)
            for (int64_t o = 0; o < out; ++o) {
              float const* xr = &x[(r * G + g) * in];
              float const* wr = &w[(g * out + o) * in];
              float const ref = ref::round_md(fma_chain ? ref::bmm_dot(xr, wr, in, md) : ref::gemm_dot(xr, wr, in, md), md);
              bad += std::bit_cast<uint32_t>(y[r * ys + g * out + o]) != std::bit_cast<uint32_t>(ref);
            }
          bad += y[r * ys + G * out] != -3.f || y[r * ys + G * out + 1] != -3.f;
        }
        BOOST_TEST_INFO("md=" << dtype_name(md) << " w=" << dtype_name(wdt) << " fma_chain=" << fma_chain);
        BOOST_TEST(bad == 0);
      }
  ops::LinearArgs a;
  std::vector<float> y(static_cast<size_t>(rows * G * out));
  a.x = TensorView<float const, 2>(x.data(), {rows, in});  // one group's width: wrong for G = 3
  a.w = TensorView<float const, 2>(w.data(), {G * out, in});
  a.y = TensorView<float, 2>(y.data(), {rows, G * out});
  ExecContext ctx;
  auto s = ops::linear(ctx, ops::LinearDesc{rows, in, out, DType::kF32, DType::kF32, false, ops::LinearImpl::kAuto, G}, a);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.to_string().find("linear x") != std::string::npos);
  s = ops::linear(ctx, ops::LinearDesc{rows, in, out, DType::kF32, DType::kF32, false, ops::LinearImpl::kAuto, 0}, a);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.to_string().find("groups") != std::string::npos);
}

namespace {
/// The e4m3 value of a byte from the format's definition (bias 7, subnormals below exponent field 1), and the
/// e2m1 value from its table (spec §4.2): formulated independently of core/dtype.hpp's decoders.
double e4m3_value(uint8_t b) {
  int const sign = b & 0x80 ? -1 : 1, e = (b >> 3) & 15, m = b & 7;
  return sign * (e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7));
}
double e2m1_value(uint8_t c) {
  double const mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8 ? -1 : 1) * mag[c & 7];
}
}  // namespace

BOOST_AUTO_TEST_CASE(linear_cpu_block_scaled_weights_are_their_decoded_bf16_values) {
  // FP8 (32×32-block scales) and FP4 (per-row-per-32 scales) codes against bf16 weights holding the decoded
  // values: bit-identical y, for md fp32 and bf16, K with a partial last scale block, strided code rows, and a
  // grouped call (the grouped output projection's layout: group g = code rows [g·out, (g+1)·out)).
  uint64_t const seed = verify::test_seed(733);
  std::mt19937_64 g(seed);
  struct Shape { DType fmt; int64_t rows, in, out, groups; };
  Shape const shapes[] = {{DType::kF8E4m3, 5, 96, 45, 1}, {DType::kF8E4m3, 3, 80, 70, 1}, {DType::kF8E4m3, 4, 64, 32, 3},
                          {DType::kF4E2m1x2, 5, 96, 45, 1}, {DType::kF4E2m1x2, 2, 70, 9, 1}, {DType::kF4E2m1x2, 3, 64, 5, 2}};
  for (Shape const& sh : shapes) {
    bool const fp4 = sh.fmt == DType::kF4E2m1x2;
    int64_t const wrows = sh.groups * sh.out, kb = (sh.in + 31) / 32, qcols = fp4 ? sh.in / 2 : sh.in, ldq = qcols + 3;
    int64_t const srows = fp4 ? wrows : (wrows + 31) / 32;
    std::vector<uint8_t> q(static_cast<size_t>(wrows * ldq), 0xFF), s(static_cast<size_t>(srows * kb));
    for (int64_t o = 0; o < wrows; ++o)
      for (int64_t j = 0; j < qcols; ++j) {
        auto v = static_cast<uint8_t>(g() & 0xFF);
        if (!fp4 && (v & 0x7F) == 0x7F) v = 0x00;  // e4m3 NaN codes are not weights
        q[static_cast<size_t>(o * ldq + j)] = v;
      }
    for (auto& v : s) v = static_cast<uint8_t>(120 + g() % 14);
    std::vector<Bf16> wb(static_cast<size_t>(wrows * sh.in));
    for (int64_t o = 0; o < wrows; ++o)
      for (int64_t i = 0; i < sh.in; ++i) {
        uint8_t const byte = q[static_cast<size_t>(o * ldq + (fp4 ? i / 2 : i))];
        double const code = fp4 ? e2m1_value(i % 2 ? byte >> 4 : byte & 15) : e4m3_value(byte);
        int const scale = s[static_cast<size_t>((fp4 ? o : o / 32) * kb + i / 32)] - 127;
        wb[static_cast<size_t>(o * sh.in + i)] = Bf16::from_float(static_cast<float>(std::ldexp(code, scale)));
      }
    auto x = verify::randn(static_cast<size_t>(sh.rows * sh.groups * sh.in), seed + 9);
    for (auto& v : x) v = round_to_bf16(v);
    for (DType md : {DType::kF32, DType::kBf16}) {
      int64_t const ycols = sh.groups * sh.out;
      std::vector<float> y_q(static_cast<size_t>(sh.rows * ycols), -3.f), y_b(y_q);
      ExecContext ctx;
      ops::LinearArgs a;
      a.x = TensorView<float const, 2>(x.data(), {sh.rows, sh.groups * sh.in});
      a.y = TensorView<float, 2>(y_b.data(), {sh.rows, ycols});
      a.w_bf16 = TensorView<Bf16 const, 2>(wb.data(), {wrows, sh.in});
      auto st = ops::linear(ctx, ops::LinearDesc{sh.rows, sh.in, sh.out, DType::kBf16, md, false, ops::LinearImpl::kAuto, sh.groups}, a);
      BOOST_REQUIRE_MESSAGE(st.ok(), st.to_string());
      a.w_bf16 = {};
      a.w_q = TensorView<uint8_t const, 2>(q.data(), {wrows, qcols}, {ldq, 1});
      a.w_scale = TensorView<uint8_t const, 2>(s.data(), {srows, kb});
      a.y = TensorView<float, 2>(y_q.data(), {sh.rows, ycols});
      st = ops::linear(ctx, ops::LinearDesc{sh.rows, sh.in, sh.out, sh.fmt, md, false, ops::LinearImpl::kAuto, sh.groups}, a);
      BOOST_REQUIRE_MESSAGE(st.ok(), st.to_string());
      int64_t bad = 0;
      for (size_t i = 0; i < y_q.size(); ++i) bad += std::bit_cast<uint32_t>(y_q[i]) != std::bit_cast<uint32_t>(y_b[i]);
      BOOST_TEST_INFO(dtype_name(sh.fmt) << " rows " << sh.rows << " in " << sh.in << " out " << sh.out << " groups "
                                         << sh.groups << " md " << dtype_name(md));
      BOOST_TEST(bad == 0);
      BOOST_TEST(std::all_of(y_q.begin(), y_q.end(), [](float v) { return v != -3.f; }));
    }
  }
}

BOOST_AUTO_TEST_CASE(linear_cpu_block_scaled_weights_reject_bad_shapes) {
  std::vector<float> x(4 * 64), y(4 * 64);
  std::vector<uint8_t> q(64 * 64), s(64 * 2);
  ExecContext ctx;
  auto call = [&](DType fmt, int64_t in, int64_t out, int64_t groups, std::array<int64_t, 2> qs, std::array<int64_t, 2> ss) {
    ops::LinearArgs a;
    a.x = TensorView<float const, 2>(x.data(), {4, groups * in});
    a.y = TensorView<float, 2>(y.data(), {4, groups * out});
    a.w_q = TensorView<uint8_t const, 2>(q.data(), qs);
    a.w_scale = TensorView<uint8_t const, 2>(s.data(), ss);
    return ops::linear(ctx, ops::LinearDesc{4, in, out, fmt, DType::kF32, false, ops::LinearImpl::kAuto, groups}, a);
  };
  BOOST_TEST(call(DType::kF8E4m3, 64, 40, 1, {40, 64}, {2, 2}).ok());
  auto st = call(DType::kF8E4m3, 64, 40, 1, {40, 64}, {40, 2});  // per-row scales given for 32×32 blocks
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.to_string().find("w_scale") != std::string::npos);
  st = call(DType::kF8E4m3, 32, 20, 2, {40, 32}, {2, 1});  // groups that split a 32-row scale block
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.to_string().find("out % 32") != std::string::npos);
  BOOST_TEST(call(DType::kF4E2m1x2, 64, 40, 1, {40, 32}, {40, 2}).ok());
  st = call(DType::kF4E2m1x2, 63, 40, 1, {40, 32}, {40, 2});  // odd in: codes come in pairs
  BOOST_TEST(!st.ok());
  st = call(DType::kF4E2m1x2, 64, 40, 1, {40, 64}, {40, 2});  // unpacked code width
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.to_string().find("w_q") != std::string::npos);
}

// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the linear family: fp32 and bf16-stored weights both give ref::linear_row over rows bit
/// for bit (bf16 widening is exact), md fp32 and bf16; strided rows; shape errors name the argument. The
/// CUDA backend is checked against this in linear_test.cpp (gpu suite).
#include <boost/test/unit_test.hpp>

#include <bit>
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

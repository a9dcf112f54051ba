// SPDX-License-Identifier: Apache-2.0
/// ref::cuda_expf (CUDA's expf replayed on the CPU) and fmath::log1p (the shared CPU/GPU ln(1 + u)).
///   - the embedded ex2 grids reconstruct to exactly what the generator measured (FNV-1a-64 digest);
///   - expf values measured on an H200 (CUDA 13.0, sm_90) where CUDA's expf is not correctly rounded,
///     subnormal results and huge ones included, are reproduced bit for bit;
///   - the structure of the replay: within 2 ulp of the correctly rounded exp everywhere, exp(0) = 1,
///     ±inf, NaN, underflow to 0;
///   - fmath::log1p within 1 ulp of the double-precision log1p over the softplus domain and its edges;
///   - fmath::exp_rn and log1p_rn (the model's exp and ln(1 + ·) on both CPU and GPU) equal the fp64 function
///     rounded once on a million seeded inputs each, and handle the edges.
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "tessera/core/fmath.hpp"
#include "tessera/ref/common_ref.hpp"

using namespace tessera;

namespace {
int64_t ulp_distance(float a, float b) {
  auto key = [](float x) {
    int32_t const i = std::bit_cast<int32_t>(x);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::llabs(key(a) - key(b));
}
}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_expf)

BOOST_AUTO_TEST_CASE(grids_reconstruct_to_the_measured_digest) {
  BOOST_TEST(ref::cuda_ex2_grid_digest() == ref::cuda_ex2_table_digest());
}

BOOST_AUTO_TEST_CASE(measured_h200_values) {
  // {x, CUDA expf(x)} as bit patterns, from scripts/cuda_ex2_measure-style sampling on an H200; each differs from
  // the correctly rounded exp(x) by one ulp (the last two give subnormal results).
  static constexpr uint32_t kPairs[][2] = {
      {0xb5c7c442u, 0x3f7fffe6u}, {0xb7481fcdu, 0x3f7fff37u}, {0xc1f11540u, 0x29b8092au},
      {0xbd105a34u, 0x3f772297u}, {0xc1983f20u, 0x31baaaddu}, {0xc2319bb8u, 0x1f75cd6au},
      {0x428dba62u, 0x7296a9c7u}, {0xc1947748u, 0x3215b81bu}, {0xc192197bu, 0x324940c1u},
      {0xbe3e35c0u, 0x3f549a4fu}, {0xc107bfceu, 0x3958b8e2u}, {0xc126bde6u, 0x37f9e3ffu},
      {0xc19c481fu, 0x31617252u}, {0xc138bafbu, 0x37225ef0u}, {0xc05c56d4u, 0x3d02f844u},
      {0xc1460080u, 0x368dad96u}, {0xc2b105d9u, 0x002788a2u}, {0xc2af71e0u, 0x005705acu},
  };
  for (auto const& [xb, yb] : kPairs) {
    float const x = std::bit_cast<float>(xb);
    float const y = ref::cuda_expf(x);
    BOOST_TEST(std::bit_cast<uint32_t>(y) == yb, "x = " << std::hexfloat << x << ": " << y << " vs " << std::bit_cast<float>(yb));
    BOOST_TEST(y != static_cast<float>(std::exp(static_cast<double>(x))));
  }
}

BOOST_AUTO_TEST_CASE(within_two_ulp_and_edges) {
  std::mt19937 g(7);
  std::uniform_real_distribution<float> d(-87.f, 88.f);
  int64_t worst = 0, differ = 0;
  int const n = 200000;
  for (int i = 0; i < n; ++i) {
    float const x = d(g);
    float const y = ref::cuda_expf(x);
    int64_t const u = ulp_distance(y, static_cast<float>(std::exp(static_cast<double>(x))));
    worst = std::max(worst, u);
    differ += u != 0;
  }
  BOOST_TEST(worst <= 2);
  BOOST_TEST(differ > n / 100);  // the replay is not the correctly rounded exp
  BOOST_TEST(ref::cuda_expf(0.f) == 1.f);
  BOOST_TEST(ref::cuda_expf(-0.f) == 1.f);
  BOOST_TEST(ref::cuda_expf(-INFINITY) == 0.f);
  BOOST_TEST(std::isinf(ref::cuda_expf(INFINITY)));
  BOOST_TEST(std::isinf(ref::cuda_expf(89.f)));
  BOOST_TEST(ref::cuda_expf(-110.f) == 0.f);
  BOOST_TEST(std::isnan(ref::cuda_expf(NAN)));
  BOOST_TEST(ref::cuda_ex2(1.f) == 2.f);
  BOOST_TEST(ref::cuda_ex2(-1.f) == 0.5f);
  BOOST_TEST(ref::cuda_ex2(10.f) == 1024.f);
}

BOOST_AUTO_TEST_CASE(log1p_within_two_ulp) {
  std::mt19937 g(11);
  std::uniform_real_distribution<float> frac(-0.999f, 1.f);
  std::uniform_real_distribution<float> expo(-40.f, 30.f);
  int64_t worst = 0;
  auto check = [&](float u) {
    float const y = fmath::log1p(u);
    float const want = static_cast<float>(std::log1p(static_cast<double>(u)));
    int64_t const d = ulp_distance(y, want);
    worst = std::max(worst, d);
    BOOST_TEST(d <= 2, "u = " << std::hexfloat << u << ": " << y << " vs " << want);
  };
  for (int i = 0; i < 300000; ++i) {
    check(frac(g));
    check(std::exp2(expo(g)));  // the softplus domain: u = exp(x) in (0, 4.9e8]
  }
  for (float u : {0x1p-149f, 0x1p-126f, 0x1p-25f, 0x1p-24f, 0x1p-23f, 0x1.8p-23f, 1e-7f, 0.4142135f, 0.4142137f,
                  -0.2928932f, -0.5f, -0.75f, -0.9999999f, 1.f, 2.f, 3.f, 1e8f, 4.85e8f, 3.0e38f})
    check(u);
  BOOST_TEST(fmath::log1p(0.f) == 0.f);
  BOOST_TEST(std::isinf(fmath::log1p(-1.f)));
  BOOST_TEST(std::isnan(fmath::log1p(-2.f)));
  BOOST_TEST(std::isnan(fmath::log1p(NAN)));
  BOOST_TEST(std::isinf(fmath::log1p(INFINITY)));
  BOOST_TEST_MESSAGE("fmath::log1p worst error " << worst << " ulp");
}

BOOST_AUTO_TEST_CASE(exp_rn_and_log1p_rn_are_correctly_rounded) {
  std::mt19937 g(13);
  std::uniform_real_distribution<float> ex(-103.f, 88.f), frac(-0.999f, 1.f), expo(-40.f, 30.f);
  int64_t bad_exp = 0, bad_log = 0;
  for (int i = 0; i < 1000000; ++i) {
    float const x = ex(g);
    bad_exp += fmath::exp_rn(x) != static_cast<float>(std::exp(static_cast<double>(x)));
    for (float u : {frac(g), std::exp2(expo(g))})
      bad_log += fmath::log1p_rn(u) != static_cast<float>(std::log1p(static_cast<double>(u)));
  }
  BOOST_TEST(bad_exp == 0);
  BOOST_TEST(bad_log == 0);
  BOOST_TEST(fmath::exp_rn(0.f) == 1.f);
  BOOST_TEST(fmath::exp_rn(-INFINITY) == 0.f);
  BOOST_TEST(std::isinf(fmath::exp_rn(89.f)));
  BOOST_TEST(fmath::exp_rn(-103.f) > 0.f);  // subnormal result
  BOOST_TEST(fmath::exp_rn(-105.f) == 0.f);
  BOOST_TEST(std::isnan(fmath::exp_rn(NAN)));
  BOOST_TEST(fmath::log1p_rn(0.f) == 0.f);
  BOOST_TEST(fmath::log1p_rn(0x1p-40f) == 0x1p-40f);
  BOOST_TEST(std::isinf(fmath::log1p_rn(-1.f)));
  BOOST_TEST(std::isnan(fmath::log1p_rn(-2.f)));
  BOOST_TEST(std::isinf(fmath::log1p_rn(INFINITY)));
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// cuda_math::sinf / cosf / log1pf, the replays of libdevice's __nv_sinf / __nv_cosf / __nv_log1pf. The replay is
/// the specification (the device check scripts/device/bf16.sh compares it with the H200's own functions bit for
/// bit); here: the accuracy CUDA documents for those functions (sinf/cosf within 2 ulp, log1pf within 1 ulp of the
/// exact value, which a mistyped constant or a wrong quadrant would break), both argument reductions (Cody–Waite
/// below 105615, Payne–Hanek above), the special values, and that the replay is not just the correctly rounded
/// function (it differs on a measurable share of inputs, like CUDA's).
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "tessera/core/cuda_math.hpp"

using namespace tessera;

namespace {
int64_t ulp_distance(float a, float b) {
  auto key = [](float x) {
    int32_t const i = std::bit_cast<int32_t>(x);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::llabs(key(a) - key(b));
}
/// |f(x) − exact| in ulps of the fp32 grid at the exact value (fractional, from fp64).
double ulp_error(float got, double exact) {
  double const ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(exact)) - 23);
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_math_replay)

BOOST_AUTO_TEST_CASE(sin_cos_within_two_ulp) {
  std::mt19937 g(5);
  int64_t not_rn = 0, n = 0;
  double worst = 0;
  for (auto [lo, hi] : {std::pair{-4.f, 4.f}, std::pair{-600.f, 600.f}, std::pair{-1e5f, 1e5f}, std::pair{1e5f, 1e9f},
                        std::pair{-1e30f, -1e5f}}) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (int i = 0; i < 200000; ++i) {
      float const x = d(g);
      double const s = std::sin(static_cast<double>(x)), c = std::cos(static_cast<double>(x));
      float const rs = cuda_math::sinf(x), rc = cuda_math::cosf(x);
      if (std::fabs(s) > 1e-30) worst = std::max(worst, ulp_error(rs, s));
      if (std::fabs(c) > 1e-30) worst = std::max(worst, ulp_error(rc, c));
      not_rn += (rs != static_cast<float>(s)) + (rc != static_cast<float>(c));
      n += 2;
    }
  }
  BOOST_TEST(worst <= 2.0, "worst " << worst << " ulp");
  BOOST_TEST(not_rn > 0);  // not the correctly rounded functions
  BOOST_TEST_MESSAGE("sinf/cosf replay: worst " << worst << " ulp, " << not_rn << " of " << n << " not correctly rounded");
}

BOOST_AUTO_TEST_CASE(sin_cos_special_values) {
  BOOST_TEST(std::bit_cast<uint32_t>(cuda_math::sinf(0.f)) == 0u);
  BOOST_TEST(std::bit_cast<uint32_t>(cuda_math::sinf(-0.f)) == 0x80000000u);
  BOOST_TEST(cuda_math::cosf(0.f) == 1.f);
  BOOST_TEST(std::isnan(cuda_math::sinf(INFINITY)));
  BOOST_TEST(std::isnan(cuda_math::cosf(-INFINITY)));
  BOOST_TEST(std::isnan(cuda_math::sinf(NAN)));
  // Angles the RoPE tables meet (position · inverse frequency): the replay stays within 2 ulp there too.
  for (int pos = 0; pos < 4096; ++pos)
    for (float f : {1.f, 0.31622776f, 0.1f, 1e-2f, 1e-3f, 1.3335214e-4f}) {
      float const phi = static_cast<float>(pos) * f;
      BOOST_TEST(ulp_distance(cuda_math::cosf(phi), static_cast<float>(std::cos(static_cast<double>(phi)))) <= 2);
      BOOST_TEST(ulp_distance(cuda_math::sinf(phi), static_cast<float>(std::sin(static_cast<double>(phi)))) <= 2);
    }
}

BOOST_AUTO_TEST_CASE(log1p_within_one_ulp) {
  std::mt19937 g(9);
  int64_t not_rn = 0, n = 0;
  double worst = 0;
  // The softplus domain (log1pf of expf(x), x ≤ 20: (0, 4.9e8]) and the rest of (−1, ∞).
  for (auto [lo, hi] : {std::pair{-40.f, 20.f}, std::pair{-1.f, 1.f}, std::pair{-1e-6f, 1e-6f}}) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (int i = 0; i < 300000; ++i) {
      float const x = lo == -40.f ? std::exp(d(g)) : d(g);
      if (!(x > -1.f)) continue;
      double const exact = std::log1p(static_cast<double>(x));
      float const r = cuda_math::log1pf(x);
      if (exact != 0) worst = std::max(worst, ulp_error(r, exact));
      not_rn += r != static_cast<float>(exact);
      ++n;
    }
  }
  for (float x : {1e10f, 3.4e38f, 1e-30f, -0.999999f, 6.5e4f})
    worst = std::max(worst, ulp_error(cuda_math::log1pf(x), std::log1p(static_cast<double>(x))));
  BOOST_TEST(worst <= 1.0, "worst " << worst << " ulp");
  BOOST_TEST(not_rn > 0);
  BOOST_TEST_MESSAGE("log1pf replay: worst " << worst << " ulp, " << not_rn << " of " << n << " not correctly rounded");
}

BOOST_AUTO_TEST_CASE(log1p_special_values) {
  BOOST_TEST(std::bit_cast<uint32_t>(cuda_math::log1pf(0.f)) == 0u);
  BOOST_TEST(std::bit_cast<uint32_t>(cuda_math::log1pf(-0.f)) == 0x80000000u);
  BOOST_TEST(cuda_math::log1pf(INFINITY) == INFINITY);
  BOOST_TEST(std::isnan(cuda_math::log1pf(-2.f)));
  BOOST_TEST(std::isnan(cuda_math::log1pf(-INFINITY)));
  BOOST_TEST(std::isnan(cuda_math::log1pf(NAN)));
  BOOST_TEST(cuda_math::log1pf(-1.f) == -INFINITY);
  BOOST_TEST(cuda_math::log1pf(1e-30f) == 1e-30f);
}

BOOST_AUTO_TEST_CASE(add_rz_rounds_toward_zero) {
  BOOST_TEST(cuda_math::add_rz(1.f, std::ldexp(1.f, -24) * 1.5f) == 1.f);      // RN would give 1 + 2^-23
  BOOST_TEST(cuda_math::add_rz(-1.f, -std::ldexp(1.f, -24) * 1.5f) == -1.f);
  BOOST_TEST(cuda_math::add_rz(1.f, -std::ldexp(1.f, -30)) == std::nextafter(1.f, 0.f));
  BOOST_TEST(cuda_math::add_rz(2.f, 3.f) == 5.f);
}

BOOST_AUTO_TEST_SUITE_END()

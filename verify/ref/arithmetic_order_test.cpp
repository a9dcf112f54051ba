// SPDX-License-Identifier: Apache-2.0
/// The golden-order arithmetic of include/tessera/ref/common_ref.hpp and norm_ref.hpp against independent
/// formulations: ref::dot (chunks of 32, FMA chains, chunk sums in order), ref::dot_fma_seq, ref::lane_sum
/// (32 lanes, 4-wide vectors when n % 128 == 0, halving fold) and ref::rsqrt (CUDA rsqrtf from the embedded
/// table: the counts measured on the H200 when the table was made, monotonicity, 4^k invariance).
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "tessera/ref/norm_ref.hpp"

using namespace tessera;

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(arithmetic_order)

BOOST_AUTO_TEST_CASE(dot_is_chunked_fma) {
  for (int64_t n : {1, 31, 32, 33, 64, 100, 256, 5120}) {
    auto a = randn(n, 1 + n), b = randn(n, 2 + n);
    // Independent: per-chunk partial sums with std::fma collected first, then a left fold.
    std::vector<float> part;
    for (int64_t c = 0; c < n; c += 32) {
      float p = 0.f;
      for (int64_t i = c; i < std::min<int64_t>(n, c + 32); ++i) p = std::fma(a[i], b[i], p);
      part.push_back(p);
    }
    float want = part[0];
    for (size_t i = 1; i < part.size(); ++i) want += part[i];
    BOOST_TEST(std::bit_cast<uint32_t>(ref::dot(a.data(), b.data(), n)) == std::bit_cast<uint32_t>(want));
    float seq = 0.f;
    for (int64_t i = 0; i < n; ++i) seq = std::fma(a[i], b[i], seq);
    BOOST_TEST(std::bit_cast<uint32_t>(ref::dot_fma_seq(a.data(), b.data(), n)) == std::bit_cast<uint32_t>(seq));
  }
}

BOOST_AUTO_TEST_CASE(lane_sum_order) {
  for (int64_t n : {1, 7, 32, 64, 96, 128, 256, 512, 1000, 5120}) {
    auto x = randn(n, 3 + n, 3.f);
    int64_t const vec = n % 128 == 0 ? 4 : 1;
    // Independent: element i goes to lane (i / vec) % 32, component i % vec.
    std::vector<float> comp(32 * 4, 0.f);
    for (int64_t i = 0; i < n; ++i) {
      int64_t const lane = (i / vec) % 32, c = i % vec;
      comp[lane * 4 + c] += x[i];
    }
    std::vector<float> lanes(32);
    for (int t = 0; t < 32; ++t) {
      lanes[t] = comp[t * 4];
      for (int64_t c = 1; c < vec; ++c) lanes[t] += comp[t * 4 + c];
    }
    for (int h = 16; h > 0; h /= 2)
      for (int t = 0; t < h; ++t) lanes[t] += lanes[t + h];
    float const got = ref::lane_sum(n, [&](int64_t i) { return x[i]; });
    BOOST_TEST(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(lanes[0]), "n = " << n);
  }
}

BOOST_AUTO_TEST_CASE(rsqrt_is_cuda_rsqrtf) {
  // Over every fp32 in [1, 4): the counts scripts/gen_cuda_rsqrt_table.py printed on the H200.
  int64_t differ = 0;
  int lo = 0, hi = 0;
  float prev = INFINITY;
  bool monotone = true;
  for (uint32_t i = 0; i < (1u << 24); ++i) {
    float const x = std::bit_cast<float>(0x3F800000u + i);
    float const y = ref::rsqrt(x);
    int const off = static_cast<int>(std::bit_cast<int32_t>(y) - std::bit_cast<int32_t>(ref::rsqrt_correctly_rounded(x)));
    differ += off != 0;
    lo = std::min(lo, off);
    hi = std::max(hi, off);
    monotone = monotone && y <= prev;
    prev = y;
  }
  BOOST_TEST(differ == 3634130);
  BOOST_TEST(lo == -2);
  BOOST_TEST(hi == 1);
  BOOST_TEST(monotone);
  // 4^k invariance, and the special inputs.
  auto x = randn(2000, 7);
  for (float v : x) {
    float const a = std::fabs(v) + 1e-3f;
    for (int k : {-30, -1, 1, 30}) {
      float const s = std::ldexp(a, 2 * k);
      BOOST_TEST(std::bit_cast<uint32_t>(ref::rsqrt(s)) == std::bit_cast<uint32_t>(std::ldexp(ref::rsqrt(a), -k)));
    }
  }
  BOOST_TEST(std::isinf(ref::rsqrt(0.f)));
  BOOST_TEST(std::isnan(ref::rsqrt(-1.f)));
  BOOST_TEST(ref::rsqrt(INFINITY) == 0.f);
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// Exhaustive tests of the bit-exact conversions in core/dtype.hpp against independent formulations:
/// decoding by the textbook formula (sign · 2^(e−bias) · (1 + m/2^M), subnormals m · 2^(1−bias−M)) in
/// double, and encoding by brute-force nearest search with ties to the even code.
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tessera/core/dtype.hpp"
#include "tessera/core/packed_codes.hpp"

using namespace tessera;

namespace {

/// Textbook decode of a binary float with E exponent bits, M mantissa bits, IEEE specials unless
/// `fn` (e4m3fn: no inf, only all-ones is NaN).
double decode_ieee(uint32_t code, int E, int M, bool fn) {
  uint32_t sign = (code >> (E + M)) & 1u;
  uint32_t e = (code >> M) & ((1u << E) - 1u);
  uint32_t m = code & ((1u << M) - 1u);
  int bias = (1 << (E - 1)) - 1;
  double v;
  if (!fn && e == (1u << E) - 1u) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (fn && e == (1u << E) - 1u && m == (1u << M) - 1u) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - M);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -M), static_cast<int>(e) - bias);
  }
  return sign ? -v : v;
}

/// Nearest code among `codes` (finite values, ascending magnitude for one sign) with ties to the even
/// code; returns the code index into the table.
template <class Table>
int nearest_even(double x, Table const& values) {
  int best = -1;
  double best_d = 0;
  for (int i = 0; i < static_cast<int>(values.size()); ++i) {
    double d = std::abs(values[i] - x);
    if (best < 0 || d < best_d || (d == best_d && (i % 2 == 0) && (best % 2 == 1))) { best = i; best_d = d; }
  }
  return best;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dtype)

BOOST_AUTO_TEST_CASE(bf16_decode_every_code) {
  for (uint32_t c = 0; c < 65536; ++c) {
    double ref = decode_ieee(c, 8, 7, false);
    float got = float_from_bf16_bits(static_cast<uint16_t>(c));
    if (std::isnan(ref)) BOOST_REQUIRE(std::isnan(got));
    else BOOST_REQUIRE_EQUAL(static_cast<double>(got), ref);
  }
}

BOOST_AUTO_TEST_CASE(bf16_encode_roundtrip_midpoints_and_neighbours) {
  for (uint32_t c = 0; c < 65536; ++c) {
    float v = float_from_bf16_bits(static_cast<uint16_t>(c));
    if (std::isnan(v)) { BOOST_REQUIRE_EQUAL(bf16_bits_from_float(v), 0x7FC0u); continue; }
    BOOST_REQUIRE_EQUAL(bf16_bits_from_float(v), c);
    if ((c & 0x7FFFu) >= 0x7F80u) continue;  // inf: no upper neighbour
    // Midpoint to the next code away from zero: bits c<<16 | 0x8000 is exactly halfway.
    uint32_t mid = (c << 16) | 0x8000u;
    uint32_t up = (c + 1) & 0xFFFFu;
    uint16_t even = (c & 1u) ? static_cast<uint16_t>(up) : static_cast<uint16_t>(c);
    BOOST_REQUIRE_EQUAL(bf16_bits_from_float(std::bit_cast<float>(mid)), even);
    BOOST_REQUIRE_EQUAL(bf16_bits_from_float(std::bit_cast<float>(mid - 1)), c);
    BOOST_REQUIRE_EQUAL(bf16_bits_from_float(std::bit_cast<float>(mid + 1)), up);
  }
  BOOST_TEST(bf16_bits_from_float(3.4e38f) == 0x7F80u);  // rounds past the largest finite → inf
  BOOST_TEST(round_to_bf16(1.00390625f) == 1.0f);        // 1 + 2^-8 is a tie → even (1.0)
  BOOST_TEST(round_to_bf16(1.01171875f) == 1.015625f);   // 1 + 3·2^-8 tie → even (1 + 2^-6)
}

BOOST_AUTO_TEST_CASE(f16_decode_every_code) {
  for (uint32_t c = 0; c < 65536; ++c) {
    double ref = decode_ieee(c, 5, 10, false);
    float got = float_from_f16_bits(static_cast<uint16_t>(c));
    if (std::isnan(ref)) BOOST_REQUIRE(std::isnan(got));
    else BOOST_REQUIRE_EQUAL(static_cast<double>(got), ref);
  }
}

BOOST_AUTO_TEST_CASE(f16_encode_every_code_and_midpoint) {
  for (uint32_t c = 0; c < 65536; ++c) {
    uint32_t mag = c & 0x7FFFu, sign = c & 0x8000u;
    double v = decode_ieee(c, 5, 10, false);
    if (std::isnan(v)) {
      BOOST_REQUIRE_EQUAL(f16_bits_from_float(static_cast<float>(v)) & 0x7FFFu, 0x7E00u);
      continue;
    }
    BOOST_REQUIRE_EQUAL(f16_bits_from_float(static_cast<float>(v)), c);
    if (mag >= 0x7C00u) continue;
    // Midpoint to the next magnitude (exact in fp32: f16 has 10 mantissa bits, fp32 23).
    double next = mag + 1 == 0x7C00u ? 65536.0 : std::abs(decode_ieee(mag + 1, 5, 10, false));
    double mid = (std::abs(v) + next) / 2;
    uint32_t even = (mag & 1u) ? mag + 1 : mag;
    float midf = static_cast<float>(sign ? -mid : mid);
    BOOST_REQUIRE_EQUAL(static_cast<double>(std::abs(midf)), mid);
    BOOST_REQUIRE_EQUAL(f16_bits_from_float(midf), sign | even);
    float below = std::nextafter(midf, 0.f), above = std::nextafter(midf, sign ? -INFINITY : INFINITY);
    BOOST_REQUIRE_EQUAL(f16_bits_from_float(below), c);
    BOOST_REQUIRE_EQUAL(f16_bits_from_float(above), sign | (mag + 1));
  }
  BOOST_TEST(f16_bits_from_float(65519.996f) == 0x7BFFu);
  BOOST_TEST(f16_bits_from_float(65520.f) == 0x7C00u);
  BOOST_TEST(f16_bits_from_float(std::ldexp(1.f, -25)) == 0u);                 // tie → 0
  BOOST_TEST(f16_bits_from_float(std::nextafter(std::ldexp(1.f, -25), 1.f)) == 1u);
  BOOST_TEST(f16_bits_from_float(std::ldexp(3.f, -25)) == 2u);                 // 1.5 units → 2 (even)
}

BOOST_AUTO_TEST_CASE(fp8_e4m3_decode_every_code) {
  for (uint32_t c = 0; c < 256; ++c) {
    double ref = decode_ieee(c, 4, 3, true);
    float got = float_from_fp8_e4m3(static_cast<uint8_t>(c));
    if (std::isnan(ref)) BOOST_REQUIRE(std::isnan(got));
    else BOOST_REQUIRE_EQUAL(static_cast<double>(got), ref);
  }
  BOOST_TEST(float_from_fp8_e4m3(0x7E) == 448.f);
  BOOST_TEST(float_from_fp8_e4m3(0x01) == std::ldexp(1.f, -9));
}

BOOST_AUTO_TEST_CASE(fp8_e4m3_encode_against_brute_force) {
  std::vector<double> mags;  // codes 0..0x7E by magnitude (ascending == code order)
  for (uint32_t c = 0; c <= 0x7E; ++c) mags.push_back(decode_ieee(c, 4, 3, true));
  std::mt19937 g(1234);
  std::uniform_real_distribution<float> logmag(-14.f, 9.5f);
  auto check = [&](float x) {
    uint8_t got = fp8_e4m3_from_float(x);
    double a = std::abs(static_cast<double>(x));
    uint8_t sign = std::signbit(x) ? 0x80 : 0;
    if (a >= 480.0 || std::isnan(x)) { BOOST_REQUIRE_EQUAL(got, sign | 0x7F); return; }
    if (a >= 464.0 && a < 480.0) {  // beyond the 448/480 midpoint: c10 rounds to the NaN code
      BOOST_REQUIRE_EQUAL(got, a == 464.0 ? (sign | 0x7E) : (sign | 0x7F));
      return;
    }
    BOOST_REQUIRE_EQUAL(got, sign | nearest_even(a, mags));
  };
  for (int i = 0; i < 300000; ++i) {
    float x = std::ldexp(1.f, 0) * std::exp2(logmag(g));
    check((i & 1) ? -x : x);
  }
  for (uint32_t c = 0; c < 0x7E; ++c) {  // every midpoint and its neighbours
    float mid = static_cast<float>((mags[c] + mags[c + 1]) / 2);
    check(mid); check(-mid); check(std::nextafter(mid, 0.f)); check(std::nextafter(mid, 1e9f));
    check(static_cast<float>(mags[c]));
  }
  check(464.f); check(470.f); check(480.f); check(1e30f); check(INFINITY); check(NAN);
  BOOST_TEST(fp8_e4m3_from_float_saturate(1000.f) == 0x7E);
  BOOST_TEST(fp8_e4m3_from_float_saturate(-470.f) == 0xFE);
  BOOST_TEST((fp8_e4m3_from_float_saturate(NAN) & 0x7F) == 0x7F);
  BOOST_TEST(fp8_e4m3_from_float(-0.f) == 0x80);
}

BOOST_AUTO_TEST_CASE(e8m0_codes_and_ceil_rule) {
  for (uint32_t c = 0; c < 255; ++c)
    BOOST_REQUIRE_EQUAL(static_cast<double>(float_from_e8m0(static_cast<uint8_t>(c))),
                        std::ldexp(1.0, static_cast<int>(c) - 127));
  BOOST_TEST(std::isnan(float_from_e8m0(0xFF)));
  // Bit-pattern ceil: exact powers map to themselves, anything above to the next power.
  for (int e = -126; e <= 126; ++e) {
    float p = std::ldexp(1.f, e);
    BOOST_REQUIRE_EQUAL(pow2_ceil_bits(p), p);
    BOOST_REQUIRE_EQUAL(pow2_ceil_bits(std::nextafter(p, INFINITY)), std::ldexp(1.f, e + 1));
    BOOST_REQUIRE_EQUAL(pow2_ceil_bits(p * 1.5f), std::ldexp(1.f, e + 1));
  }
  BOOST_TEST(pow2_ceil_bits(1e-4f / 448.f) == std::ldexp(1.f, -22));  // amax floor of Appendix B.1
}

// The kernels' register decode of four e2m1 codes: every 16-bit word, with junk above bit 15, against the
// value conversion; and byte_perm against the bytes it names.
BOOST_AUTO_TEST_CASE(bf16x2_from_e2m1x4_every_word) {
  static_assert(byte_perm(0x03020100u, 0x07060504u, 0x7531u) == 0x07050301u);
  static_assert([] {
    uint32_t a = 0, b = 0;
    bf16x2_from_e2m1x4(0xF8A1u, a, b);  // codes 1, 10, 8, 15: .5, −1, −0, −6
    return a == 0xBF803F00u && b == 0xC0C08000u;
  }());
  for (uint32_t s = 0; s < 0x10000u; s += 0x111u)
    for (uint32_t i = 0; i < 4; ++i) {
      uint32_t const sel = (s & 0x7777u) >> (4 * i) & 7u;
      BOOST_REQUIRE_EQUAL(byte_perm(0x03020100u, 0x07060504u, s & 0x7777u) >> (8 * i) & 0xFFu, sel);
    }
  auto bf = [](uint32_t code) { return uint32_t{bf16_bits_from_float(float_from_fp4_e2m1(static_cast<uint8_t>(code)))}; };
  for (uint32_t w = 0; w < 0x10000u; ++w) {
    uint32_t p01 = 0, p23 = 0;
    bf16x2_from_e2m1x4(w | (w * 0x9E370000u), p01, p23);
    BOOST_REQUIRE_EQUAL(p01, bf(w & 15u) | bf(w >> 4 & 15u) << 16);
    BOOST_REQUIRE_EQUAL(p23, bf(w >> 8 & 15u) | bf(w >> 12 & 15u) << 16);
  }
}

BOOST_AUTO_TEST_CASE(fp4_e2m1_every_code_and_tie) {
  float const grid[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (uint8_t c = 0; c < 16; ++c) {
    float v = float_from_fp4_e2m1(c);
    BOOST_REQUIRE_EQUAL(std::abs(v), grid[c & 7]);
    BOOST_REQUIRE_EQUAL(std::signbit(v), (c & 8) != 0);
    BOOST_REQUIRE_EQUAL(fp4_e2m1_from_float(v), c);  // −0 keeps its sign code
  }
  // The ties of Appendix B.2 / spec §5.4.
  struct { float x; float want; } ties[] = {{0.25f, 0.f}, {0.75f, 1.f}, {1.25f, 1.f}, {1.75f, 2.f},
                                             {2.5f, 2.f},  {3.5f, 4.f},  {5.f, 4.f},   {7.f, 6.f}, {100.f, 6.f}};
  for (auto t : ties) {
    BOOST_TEST(float_from_fp4_e2m1(fp4_e2m1_from_float(t.x)) == t.want);
    BOOST_TEST(float_from_fp4_e2m1(fp4_e2m1_from_float(-t.x)) == -t.want);
  }
  // Brute force over a dense sweep: nearest grid value, ties to the even code.
  std::vector<double> g(grid, grid + 8);
  for (int i = 0; i <= 80000; ++i) {
    float x = static_cast<float>(i) * 1e-4f;
    BOOST_REQUIRE_EQUAL(fp4_e2m1_from_float(x), nearest_even(x, g));
  }
  auto p = Fp4E2m1x2::pack(1.5f, -4.f);
  BOOST_TEST(p.bits == 0xE3);  // 1.5 = code 3 (low), −4 = 8|6 (high)
  BOOST_TEST(p.low() == 1.5f);
  BOOST_TEST(p.high() == -4.f);
}

BOOST_AUTO_TEST_CASE(type_erased_load) {
  uint16_t b[2] = {bf16_bits_from_float(1.5f), bf16_bits_from_float(-2.f)};
  BOOST_TEST(load_as_float(b, DType::kBf16, 1) == -2.f);
  uint8_t f4[1] = {Fp4E2m1x2::pack(3.f, -0.5f).bits};
  BOOST_TEST(load_as_float(f4, DType::kF4E2m1x2, 0) == 3.f);
  BOOST_TEST(load_as_float(f4, DType::kF4E2m1x2, 1) == -0.5f);
  BOOST_TEST(dtype_size(DType::kF8E4m3) == 1u);
  BOOST_TEST(dtype_name(DType::kE8m0) == "e8m0");
}

BOOST_AUTO_TEST_SUITE_END()

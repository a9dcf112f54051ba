// SPDX-License-Identifier: Apache-2.0
/// Elementary functions written once in IEEE fp32 operations (+, −, ×, ÷ and fma, each rounded to nearest) so
/// the CPU and every CUDA kernel compute them bit for bit alike. Used where neither side can replay the other's
/// library function exactly (CUDA's log1pf is a polynomial of its own; glibc's differs from it on some inputs).
#pragma once

#include <cstdint>
#include <cstring>

#include "tessera/core/config.hpp"

#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace tessera::fmath {

TESSERA_HOST_DEVICE inline uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
#endif
}
TESSERA_HOST_DEVICE inline float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, 4);
  return x;
#endif
}
/// a·b + c rounded once.
TESSERA_HOST_DEVICE inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
/// Each of these is one correctly rounded IEEE operation on both sides (nvcc would otherwise contract a·b + c).
TESSERA_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TESSERA_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TESSERA_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// a + b = s + e exactly (Knuth's TwoSum), s = a + b rounded.
TESSERA_HOST_DEVICE inline float two_sum(float a, float b, float& e) {
  float const s = add_rn(a, b);
  float const bb = add_rn(s, -a);
  e = add_rn(add_rn(a, -add_rn(s, -bb)), add_rn(b, -bb));
  return s;
}

/// ln(1 + u) for fp32 u, within 1 ulp (verify/ref/cuda_expf_test.cpp measures it against double log1p).
///   a = 1 + u rounded, c = (1 + u) − a exactly (Fast2Sum), so ln(1 + u) = ln(a) + ln(1 + c/a) ≈ ln(a) + c/a.
///   a = m·2^k with m in [√½, √2); ln(a) = k·ln2 + 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.1716, with
///   2·atanh(s) = 2s + 2s·(s²/3 + s⁴/5 + … + s¹²/13) (truncation below 2^-30 relative). m − 1 is exact
///   (Sterbenz); m + 1 = d + e_d by TwoSum and f = s·d + r exactly (fma), so s + (r − s·e_d)/d carries s to
///   about 2^-46. ln2 = LN2_HI + LN2_LO with LN2_HI's low 12 bits zero, so k·LN2_HI is exact; the large terms are
///   added by TwoSum and every small term joins one low-order sum before the last rounding.
TESSERA_HOST_DEVICE inline float log1p(float u) {
  if (!(u > -1.f)) return u == -1.f ? -INFINITY : (u != u ? u : NAN);
  if (u == INFINITY) return u;
  float const a = add_rn(1.f, u);
  if (a == 1.f) return u;  // |u| < 2^-24: ln(1 + u) = u − u²/2 + … rounds to u
  float const c = u <= 1.f ? add_rn(u, -add_rn(a, -1.f)) : add_rn(1.f, -add_rn(a, -u));
  uint32_t const ab = bits_of(a);
  int32_t k = static_cast<int32_t>((ab >> 23) & 0xFF) - 127;
  uint32_t mb = (ab & 0x007FFFFFu) | 0x3F800000u;
  if (mb > 0x3FB504F3u) { mb -= 0x00800000u; ++k; }  // m > √2 (0x3FB504F3): halve m into [√½, 1)
  float const m = float_of(mb);
  float const f = add_rn(m, -1.f);
  float e_d;
  float const d = two_sum(m, 1.f, e_d);
  float const s = div_rn(f, d);
  float const r = fma_rn(-s, d, f);
  float const s_lo = div_rn(fma_rn(-s, e_d, r), d);
  float const z = mul_rn(s, s);
  float p = 1.f / 13.f;
  p = fma_rn(p, z, 1.f / 11.f);
  p = fma_rn(p, z, 1.f / 9.f);
  p = fma_rn(p, z, 1.f / 7.f);
  p = fma_rn(p, z, 1.f / 5.f);
  p = fma_rn(p, z, 1.f / 3.f);
  constexpr float kLn2Hi = 0.693145751953125f;    // 0x3F317200
  constexpr float kLn2Lo = 1.42860676533018e-06f;  // ln2 − kLn2Hi
  float const kf = static_cast<float>(k);
  float const two_s = add_rn(s, s);
  float e_hi;
  float const hi = two_sum(mul_rn(kf, kLn2Hi), two_s, e_hi);
  float lo = add_rn(mul_rn(kf, kLn2Lo), div_rn(c, a));
  lo = add_rn(lo, add_rn(add_rn(s_lo, s_lo), e_hi));
  lo = fma_rn(mul_rn(two_s, z), p, lo);
  return add_rn(hi, lo);
}

/// 2^k as a double for k in [−1022, 1023] (exponent bits; exact).
TESSERA_HOST_DEVICE inline double pow2_f64(int k) {
  uint64_t const b = static_cast<uint64_t>(k + 1023) << 52;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double d;
  std::memcpy(&d, &b, 8);
  return d;
#endif
}

TESSERA_HOST_DEVICE inline double fma_f64(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

TESSERA_HOST_DEVICE inline double rint_f64(double x) {
#if defined(__CUDA_ARCH__)
  return rint(x);
#else
  return std::nearbyint(x);  // round half to even in the default rounding mode
#endif
}

/// e^x for fp32 x, evaluated in fp64 and rounded once: the correctly rounded fp32 e^x except where the true value
/// lies within ~2^-28 fp32 ulp of a rounding midpoint. The same fp64 operations run on the CPU and in every CUDA
/// kernel, so both sides agree bit for bit (glibc's expf, also correctly rounded in practice, agrees too).
///   k = rint(x/ln2), r = x − k·ln2 (LN2_HI has 32 trailing zero bits, so k·LN2_HI is exact; |r| ≤ 0.3466),
///   e^r by its Taylor polynomial to r^13/13! (truncation below 2^-60 relative), e^x = e^r·2^k (exact scaling
///   in fp64), then one rounding to fp32 (subnormal results included).
TESSERA_HOST_DEVICE inline float exp_rn(float x) {
  if (x != x) return x;
  if (x > 88.7228394f) return INFINITY;  // above ln(FLT_MAX·(1 + 2^-24)): rounds to infinity
  if (x < -103.972084f) return 0.f;      // below ln(2^-150): rounds to zero
  double const xd = x;
  double const k = rint_f64(xd * 1.4426950408889634);
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 0x3FE62E42FEE00000
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln2 − kLn2Hi
  double const r = fma_f64(-k, kLn2Lo, fma_f64(-k, kLn2Hi, xd));
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = fma_f64(p, r, 1.0 / 479001600.0);
  p = fma_f64(p, r, 1.0 / 39916800.0);
  p = fma_f64(p, r, 1.0 / 3628800.0);
  p = fma_f64(p, r, 1.0 / 362880.0);
  p = fma_f64(p, r, 1.0 / 40320.0);
  p = fma_f64(p, r, 1.0 / 5040.0);
  p = fma_f64(p, r, 1.0 / 720.0);
  p = fma_f64(p, r, 1.0 / 120.0);
  p = fma_f64(p, r, 1.0 / 24.0);
  p = fma_f64(p, r, 1.0 / 6.0);
  p = fma_f64(p, r, 0.5);
  p = fma_f64(p, r, 1.0);
  p = fma_f64(p, r, 1.0);
  return static_cast<float>(p * pow2_f64(static_cast<int>(k)));
}

/// ln(1 + u) for fp32 u, evaluated in fp64 and rounded once (correctly rounded but within ~2^-28 ulp of a
/// midpoint), identical on the CPU and the GPU. 1 + u is exact in fp64 for |u| ≥ 2^-29 (and u < 2^29); below
/// that ln(1 + u) = u − u²/2 + u³/3 to far below an fp32 ulp. ln(a) = e·ln2 + 2·atanh(s), a = m·2^e with
/// m in [√½, √2), s = (m − 1)/(m + 1), |s| ≤ 0.1716: the series to s^23/23 (truncation below 2^-60).
TESSERA_HOST_DEVICE inline float log1p_rn(float u) {
  if (!(u > -1.f)) return u == -1.f ? -INFINITY : (u != u ? u : NAN);
  if (u == INFINITY) return u;
  double const ud = u;
  if (ud > -0x1p-29 && ud < 0x1p-29) return static_cast<float>(fma_f64(ud * ud, fma_f64(ud, 1.0 / 3.0, -0.5), ud));
  double const a = 1.0 + ud;
#if defined(__CUDA_ARCH__)
  uint64_t const ab = static_cast<uint64_t>(__double_as_longlong(a));
#else
  uint64_t ab;
  std::memcpy(&ab, &a, 8);
#endif
  int e = static_cast<int>((ab >> 52) & 0x7FF) - 1023;
  uint64_t mb = (ab & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  if (mb > 0x3FF6A09E667F3BCDull) { mb -= 0x0010000000000000ull; ++e; }  // m > √2: halve m into [√½, 1)
#if defined(__CUDA_ARCH__)
  double const m = __longlong_as_double(static_cast<long long>(mb));
#else
  double m;
  std::memcpy(&m, &mb, 8);
#endif
  double const s = (m - 1.0) / (m + 1.0);
  double const z = s * s;
  double p = 1.0 / 23.0;
  p = fma_f64(p, z, 1.0 / 21.0);
  p = fma_f64(p, z, 1.0 / 19.0);
  p = fma_f64(p, z, 1.0 / 17.0);
  p = fma_f64(p, z, 1.0 / 15.0);
  p = fma_f64(p, z, 1.0 / 13.0);
  p = fma_f64(p, z, 1.0 / 11.0);
  p = fma_f64(p, z, 1.0 / 9.0);
  p = fma_f64(p, z, 1.0 / 7.0);
  p = fma_f64(p, z, 1.0 / 5.0);
  p = fma_f64(p, z, 1.0 / 3.0);
  double const two_s = 2.0 * s;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  double const ed = e;
  double const ln_m = fma_f64(two_s * z, p, two_s);
  return static_cast<float>(fma_f64(ed, kLn2Hi, fma_f64(ed, kLn2Lo, ln_m)));
}

}  // namespace tessera::fmath

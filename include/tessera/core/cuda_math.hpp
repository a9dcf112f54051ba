// SPDX-License-Identifier: Apache-2.0
/// CUDA's sinf, cosf and log1pf (libdevice __nv_sinf / __nv_cosf / __nv_log1pf, CUDA 13, no -ftz, no fast math),
/// replayed as the same sequence of IEEE operations (fma and products rounded to nearest, one addition rounded
/// toward zero, integer bit manipulation), so the CPU and every CUDA kernel reproduce the golden engine's torch.cos,
/// torch.sin and F.softplus bit for bit. None of them is correctly rounded; libdevice is the specification.
/// (CUDA's expf goes through the hardware ex2.approx and has a measured replay instead: ref::cuda_expf.)
#pragma once

#include <cstdint>

#include "tessera/core/config.hpp"
#include "tessera/core/fmath.hpp"

#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace tessera::cuda_math {

/// a + b rounded toward zero.
TESSERA_HOST_DEVICE inline float add_rz(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rz(a, b);
#else
  float e;
  float s = fmath::two_sum(a, b, e);  // a + b = s + e exactly
  if ((s > 0.f && e < 0.f) || (s < 0.f && e > 0.f)) s = std::nextafter(s, 0.f);
  return s;
#endif
}

/// float → int32 rounded to nearest even, saturating, NaN → 0 (cvt.rni.s32.f32).
TESSERA_HOST_DEVICE inline int32_t f2i_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(x);
#else
  if (x != x) return 0;
  if (x >= 2147483648.f) return INT32_MAX;
  if (x <= -2147483648.f) return INT32_MIN;
  return static_cast<int32_t>(std::nearbyint(x));
#endif
}

/// The shared core of sinf / cosf: reduction of a to t in [−π/4, π/4] with quadrant q (Cody–Waite in three fma
/// steps below |a| = 105615, Payne–Hanek with the 192 bits of 2/π above), then the quadrant's polynomial.
/// `quadrant_offset` is 0 for sin and 1 for cos.
TESSERA_HOST_DEVICE inline float trig(float a, int32_t quadrant_offset) {
  float const j = static_cast<float>(f2i_rn(fmath::mul_rn(a, 0x1.45f306p-1f)));
  int32_t q = static_cast<int32_t>(j);
  float t = fmath::fma_rn(j, -0x1.921fb4p+0f, a);
  t = fmath::fma_rn(j, -0x1.4442d0p-24f, t);
  t = fmath::fma_rn(j, -0x1.84698ap-48f, t);
  float const abs_a = a < 0.f ? -a : a;
  if (abs_a >= 105615.f) {
    if (abs_a == INFINITY) {
      t = fmath::mul_rn(a, 0.f);  // NaN
      q = 0;
    } else {
      constexpr uint32_t kTwoOverPi[6] = {0x3C439041u, 0xDB629599u, 0xF534DDC0u, 0xFC2757D1u, 0x4E441529u, 0xA2F9836Eu};
      uint32_t const bits = fmath::bits_of(a);
      uint32_t sign = bits & 0x80000000u;
      uint32_t const e = ((bits >> 23) & 0xFFu) - 128u;
      uint32_t const m = (bits << 8) | 0x80000000u;
      int32_t const idx = 4 - static_cast<int32_t>(e >> 5);
      uint32_t result[7];
      uint32_t hi = 0;
      for (int i = 0; i < 6; ++i) {
        uint64_t const p = static_cast<uint64_t>(kTwoOverPi[i]) * m + hi;
        result[i] = static_cast<uint32_t>(p);
        hi = static_cast<uint32_t>(p >> 32);
      }
      result[6] = hi;
      uint32_t const sh = e & 31u;
      hi = result[idx + 2];
      uint32_t lo = result[idx + 1];
      if (sh != 0) {
        hi = (hi << sh) + (lo >> (32 - sh));
        lo = (lo << sh) + (result[idx] >> (32 - sh));
      }
      uint32_t qq = hi >> 30;
      hi = (hi << 2) + (lo >> 30);
      lo = lo << 2;
      qq += hi >> 31;
      q = sign ? -static_cast<int32_t>(qq) : static_cast<int32_t>(qq);
      if (hi >> 31) {
        hi = ~hi;
        lo = ~lo;
        sign ^= 0x80000000u;
      }
      int64_t const fixed = static_cast<int64_t>((static_cast<uint64_t>(hi) << 32) | lo);
      double const d = static_cast<double>(fixed) * 0x1.921fb54442d19p-64;  // π/2 · 2^−64
      float const r = static_cast<float>(d);
      t = sign ? -r : r;
    }
  }
  q += quadrant_offset;
  float const s = fmath::mul_rn(t, t);
  bool const odd = (q & 1) != 0;
  float const c = odd ? 1.f : t;
  float const sc = fmath::fma_rn(s, c, 0.f);
  float p = odd ? fmath::fma_rn(0x1.9758p-16f, s, -0x1.6c0fdap-10f) : -0x1.9a82a6p-13f;
  p = fmath::fma_rn(p, s, odd ? 0x1.555576p-5f : 0x1.110bc8p-7f);
  p = fmath::fma_rn(p, s, odd ? -0x1.fffffep-2f : -0x1.55555p-3f);
  float r = fmath::fma_rn(p, sc, c);
  if (q & 2) r = fmath::fma_rn(r, -1.f, 0.f);
  return r;
}

TESSERA_HOST_DEVICE inline float sinf(float a) { return trig(a, 0); }
TESSERA_HOST_DEVICE inline float cosf(float a) { return trig(a, 1); }

/// log1pf: 1 + a rounded toward zero picks the scale 2^e (so that the reduced argument lies near [−¼, ½]), then a
/// degree-9 polynomial in the reduced argument and e·ln2. +inf, NaN and a < −1 go through fma(a, ∞, ∞); −0 → −0.
TESSERA_HOST_DEVICE inline float log1pf(float a) {
  float const u = add_rz(a, 1.f);
  uint32_t const scale_bits = (fmath::bits_of(u) - 0x3F400000u) & 0xFF800000u;
  float const m = fmath::float_of(fmath::bits_of(a) - scale_bits);
  float const four_over = fmath::float_of(0x40800000u - scale_bits);
  float const r = fmath::add_rn(m, fmath::fma_rn(0.25f, four_over, -1.f));
  float const e = fmath::mul_rn(static_cast<float>(static_cast<int32_t>(scale_bits)), 0x1p-23f);
  float p = fmath::fma_rn(-0x1.737efp-5f, r, 0x1.b00024p-4f);
  p = fmath::fma_rn(p, r, -0x1.0ef1cp-3f);
  p = fmath::fma_rn(p, r, 0x1.28c8eap-3f);
  p = fmath::fma_rn(p, r, -0x1.54d1bap-3f);
  p = fmath::fma_rn(p, r, 0x1.995f3cp-3f);
  p = fmath::fma_rn(p, r, -0x1.000084p-2f);
  p = fmath::fma_rn(p, r, 0x1.5555ccp-2f);
  p = fmath::fma_rn(p, r, -0.5f);
  float const q = fmath::mul_rn(p, r);
  float res = fmath::fma_rn(e, 0x1.62e43p-1f, fmath::fma_rn(q, r, r));
  uint32_t const ab = fmath::bits_of(a);
  if (ab >= 0x7F800000u) {  // +inf, NaN, or a ≤ −0
    if (static_cast<int32_t>(ab) > static_cast<int32_t>(0xBF800000u)) res = fmath::fma_rn(a, INFINITY, INFINITY);
    if (a == 0.f) res = -0.f;
  }
  return res;
}

}  // namespace tessera::cuda_math

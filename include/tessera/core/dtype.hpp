// SPDX-License-Identifier: Apache-2.0
/// Element types and bit-exact conversions shared by the CPU reference and the CUDA kernels.
///
/// Rounding is round-to-nearest-even everywhere. NaN and overflow rules follow PyTorch's c10 casts, which
/// the golden engine used (spec/deepseek-v41.md Appendix B):
///   f32 → bf16: RNE; NaN → 0x7FC0 (sign dropped, as c10); overflow rounds to ±inf.
///   f32 → f16 : RNE with subnormals; NaN → sign|0x7E00; |x| ≥ 65520 → ±inf.
///   f32 → e4m3fn (no inf; max 448 = 0x7E; NaN = 0x7F): RNE; |x| ≥ 480, inf and NaN → sign|0x7F, so
///         (464, 480) rounds to NaN exactly like c10. `fp8_e4m3_from_float_saturate` clamps to ±448 first
///         (the QAT quantisers of Appendix B.1 clamp before casting).
///   ue8m0: value 2^(code−127), code 0xFF = NaN; `e8m0_ceil_pow2(t)` is the bit-pattern power of two of
///         Appendix B.1 step 3: code = exponent(t) + [mantissa(t) ≠ 0].
///   e2m1 : codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign; RNE onto the grid with the ties of
///         Appendix B.2 (0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4); −0 keeps its sign code.
///         Packed two per byte, the even element in the low nibble.
/// All functions are constexpr and TESSERA_HOST_DEVICE so kernels and references round identically; they
/// use integer arithmetic only, so the result does not depend on FTZ/DAZ or the FP environment.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "tessera/core/config.hpp"

namespace tessera {

namespace detail {
/// Shifts a mantissa right by `shift` (1..31) with round-to-nearest-even.
TESSERA_HOST_DEVICE constexpr uint32_t shift_right_rne(uint32_t m, int shift) {
  uint32_t r = m >> shift;
  uint32_t rem = m & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return r;
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------------
// bf16

TESSERA_HOST_DEVICE constexpr uint16_t bf16_bits_from_float(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  uint32_t rounding_bias = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}
TESSERA_HOST_DEVICE constexpr float float_from_bf16_bits(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}
/// Rounds an fp32 value to the nearest bf16 value (RNE) and back: the "→bf16" of the spec.
TESSERA_HOST_DEVICE constexpr float round_to_bf16(float f) { return float_from_bf16_bits(bf16_bits_from_float(f)); }

// ---------------------------------------------------------------------------------------------------
// f16 (IEEE binary16)

TESSERA_HOST_DEVICE constexpr uint16_t f16_bits_from_float(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // ≥ 65520 → inf
  if (ax < 0x38800000u) {                                               // < 2^-14: subnormal or zero
    if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);          // ≤ 2^-25 (a tie at 2^-25 → 0)
    uint32_t e = ax >> 23;                                              // 102..112
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    return static_cast<uint16_t>(sign | detail::shift_right_rne(m, static_cast<int>(126 - e)));
  }
  uint32_t mant_odd = (ax >> 13) & 1u;
  ax += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu + mant_odd;
  return static_cast<uint16_t>(sign | (ax >> 13));
}
TESSERA_HOST_DEVICE constexpr float float_from_f16_bits(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);
    // Normalise the subnormal: value = m · 2^-24.
    int shift = 0;
    while ((m & 0x400u) == 0) { m <<= 1; ++shift; }
    m &= 0x3FFu;
    uint32_t exp = static_cast<uint32_t>(127 - 15 + 1 - shift);
    return std::bit_cast<float>(sign | (exp << 23) | (m << 13));
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}
TESSERA_HOST_DEVICE constexpr float round_to_f16(float f) { return float_from_f16_bits(f16_bits_from_float(f)); }

// ---------------------------------------------------------------------------------------------------
// fp8 e4m3fn (bias 7, no infinities, max 448, NaN 0x7F/0xFF)

TESSERA_HOST_DEVICE constexpr uint8_t fp8_e4m3_from_float(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 24) & 0x80u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x43F00000u) return static_cast<uint8_t>(sign | 0x7Fu);     // ≥ 480, inf, NaN → NaN
  if (ax < 0x3C800000u) {                                               // < 2^-6: subnormal or zero
    if (ax <= 0x3A800000u) return static_cast<uint8_t>(sign);           // ≤ 2^-10 (tie → 0)
    uint32_t e = ax >> 23;                                              // 117..120
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    return static_cast<uint8_t>(sign | detail::shift_right_rne(m, static_cast<int>(141 - e)));
  }
  uint32_t mant_odd = (ax >> 20) & 1u;
  ax += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu + mant_odd;
  return static_cast<uint8_t>(sign | (ax >> 20));
}
/// Clamp to ±448, then RNE; NaN stays NaN. The cast of the QAT quantisers (Appendix B.1 steps 4-5).
TESSERA_HOST_DEVICE constexpr uint8_t fp8_e4m3_from_float_saturate(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint8_t>(((x >> 24) & 0x80u) | 0x7Fu);
  if (f > 448.f) f = 448.f;
  if (f < -448.f) f = -448.f;
  return fp8_e4m3_from_float(f);
}
TESSERA_HOST_DEVICE constexpr float float_from_fp8_e4m3(uint8_t b) {
  uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  uint32_t e = (b >> 3) & 0xFu;
  uint32_t m = b & 0x7u;
  if (e == 0xF && m == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);
    int shift = 0;                                  // value = m · 2^-9, normalise
    while ((m & 0x8u) == 0) { m <<= 1; ++shift; }
    m &= 0x7u;
    uint32_t exp = static_cast<uint32_t>(127 - 7 + 1 - shift);
    return std::bit_cast<float>(sign | (exp << 23) | (m << 20));
  }
  return std::bit_cast<float>(sign | ((e + 120u) << 23) | (m << 20));
}

// ---------------------------------------------------------------------------------------------------
// ue8m0 (power-of-two scales)

TESSERA_HOST_DEVICE constexpr float float_from_e8m0(uint8_t b) {
  if (b == 0xFF) return std::bit_cast<float>(0x7FC00000u);
  if (b == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127 is an fp32 subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 23);
}
/// Code of the smallest power of two ≥ t for t > 0 by the bit-pattern rule exponent + [mantissa ≠ 0]
/// (Appendix B.1 step 3; ceil log2 with an exact-power check). t must be positive and finite.
TESSERA_HOST_DEVICE constexpr uint8_t e8m0_ceil_pow2(float t) {
  uint32_t x = std::bit_cast<uint32_t>(t);
  uint32_t e = (x >> 23) & 0xFFu;
  uint32_t m = x & 0x7FFFFFu;
  uint32_t code = e + (m != 0 ? 1u : 0u);
  return static_cast<uint8_t>(code > 0xFEu ? 0xFEu : code);
}
/// The power of two 2^(code−127) as an fp32 value built from its bit pattern (Appendix B.1 step 3).
TESSERA_HOST_DEVICE constexpr float pow2_ceil_bits(float t) { return float_from_e8m0(e8m0_ceil_pow2(t)); }

// ---------------------------------------------------------------------------------------------------
// fp4 e2m1

/// Values of the 16 e2m1 codes (bit 3 = sign): 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives, −0 for code 8.
/// Built from the bit fields (exponent e = bits 2..1, mantissa m = bit 0: e = 0 gives m·0.5, else
/// (1 + m/2)·2^(e−1)) rather than a table, which device code would place in local memory.
TESSERA_HOST_DEVICE constexpr float float_from_fp4_e2m1(uint8_t code) {
  uint32_t const c = code & 0xFu, e = (c >> 1) & 3u, m = c & 1u;
  uint32_t const mag = e != 0 ? ((e + 126u) << 23) | (m << 22) : (m != 0 ? 126u << 23 : 0u);
  return std::bit_cast<float>(((c & 8u) << 28) | mag);
}
/// The e2m1 value of a code with −0 (code 8) read as +0: the value table of the golden engine's FP4 fake
/// quantiser (spec Appendix B.2/B.3, `_FP4_TABLE`), whose negative inputs below the first threshold come out +0.
TESSERA_HOST_DEVICE constexpr float float_from_fp4_e2m1_zero_unsigned(uint8_t code) {
  return (code & 0x7u) == 0 ? 0.f : float_from_fp4_e2m1(code);
}
/// RNE onto the e2m1 grid: code = #{thresholds ≤ |q|} over [0.25⁺, 0.75, 1.25⁺, 1.75, 2.5⁺, 3.5, 5.0⁺];
/// values beyond ±6 saturate to ±6; NaN gives code 0 with its sign.
TESSERA_HOST_DEVICE constexpr uint8_t fp4_e2m1_from_float(float q) {
  uint32_t x = std::bit_cast<uint32_t>(q);
  uint8_t sign = static_cast<uint8_t>((x >> 28) & 0x8u);
  float a = std::bit_cast<float>(x & 0x7FFFFFFFu);
  uint8_t code = static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                                      (a >= 3.5f) + (a > 5.0f));
  return static_cast<uint8_t>(sign | code);
}

// ---------------------------------------------------------------------------------------------------
// Storage types: trivially copyable wrappers with explicit conversions.

struct Bf16 {
  uint16_t bits = 0;
  TESSERA_HOST_DEVICE static constexpr Bf16 from_float(float f) { return {bf16_bits_from_float(f)}; }
  TESSERA_HOST_DEVICE constexpr float to_float() const { return float_from_bf16_bits(bits); }
};
struct Fp16 {
  uint16_t bits = 0;
  TESSERA_HOST_DEVICE static constexpr Fp16 from_float(float f) { return {f16_bits_from_float(f)}; }
  TESSERA_HOST_DEVICE constexpr float to_float() const { return float_from_f16_bits(bits); }
};
struct Fp8E4m3 {
  uint8_t bits = 0;
  TESSERA_HOST_DEVICE static constexpr Fp8E4m3 from_float(float f) { return {fp8_e4m3_from_float(f)}; }
  TESSERA_HOST_DEVICE constexpr float to_float() const { return float_from_fp8_e4m3(bits); }
};
struct E8m0 {
  uint8_t bits = 127;
  TESSERA_HOST_DEVICE constexpr float to_float() const { return float_from_e8m0(bits); }
};
/// Two e2m1 values per byte: element 2i in the low nibble, 2i+1 in the high nibble.
struct Fp4E2m1x2 {
  uint8_t bits = 0;
  TESSERA_HOST_DEVICE constexpr float low() const { return float_from_fp4_e2m1(bits & 0xFu); }
  TESSERA_HOST_DEVICE constexpr float high() const { return float_from_fp4_e2m1(bits >> 4); }
  TESSERA_HOST_DEVICE static constexpr Fp4E2m1x2 pack(float even, float odd) {
    return {static_cast<uint8_t>(fp4_e2m1_from_float(even) | (fp4_e2m1_from_float(odd) << 4))};
  }
};
static_assert(sizeof(Bf16) == 2 && sizeof(Fp16) == 2 && sizeof(Fp8E4m3) == 1 && sizeof(E8m0) == 1 &&
              sizeof(Fp4E2m1x2) == 1);

// ---------------------------------------------------------------------------------------------------
// Type-erased element types (loader, registry, server).

enum class DType : uint8_t {
  kF32, kF64, kBf16, kF16, kF8E4m3, kE8m0, kF4E2m1x2, kI8, kI16, kI32, kI64, kU8, kU16, kU32, kU64, kBool,
};

/// Bytes per stored element; kF4E2m1x2 counts one packed byte (two values) as one element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: case DType::kU64: return 8;
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kBf16: case DType::kF16: case DType::kI16: case DType::kU16: return 2;
    case DType::kF8E4m3: case DType::kE8m0: case DType::kF4E2m1x2: case DType::kI8: case DType::kU8:
    case DType::kBool: return 1;
  }
  return 0;
}

/// Short lower-case name used in messages and `tessera inspect`.
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBf16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4m3: return "f8_e4m3";
    case DType::kE8m0: return "e8m0";
    case DType::kF4E2m1x2: return "f4_e2m1x2";
    case DType::kI8: return "i8";
    case DType::kI16: return "i16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kU16: return "u16";
    case DType::kU32: return "u32";
    case DType::kU64: return "u64";
    case DType::kBool: return "bool";
  }
  return "?";
}

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };
template <> struct DTypeOf<Bf16> { static constexpr DType value = DType::kBf16; };
template <> struct DTypeOf<Fp16> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<Fp8E4m3> { static constexpr DType value = DType::kF8E4m3; };
template <> struct DTypeOf<E8m0> { static constexpr DType value = DType::kE8m0; };
template <> struct DTypeOf<Fp4E2m1x2> { static constexpr DType value = DType::kF4E2m1x2; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kI8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::kI16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::kU16; };
template <> struct DTypeOf<uint32_t> { static constexpr DType value = DType::kU32; };
template <> struct DTypeOf<uint64_t> { static constexpr DType value = DType::kU64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };
template <class T> inline constexpr DType dtype_of = DTypeOf<std::remove_cv_t<T>>::value;

/// Reads element `i` of a type-erased buffer as fp32 (f4 packed: element i is nibble i of byte i/2).
/// For loaders, tests and tools; hot paths use typed views.
inline float load_as_float(void const* data, DType t, size_t i) {
  auto const* p = static_cast<unsigned char const*>(data);
  auto ld = [&]<class T>(T) {  // unaligned-safe load of element i
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return v;
  };
  switch (t) {
    case DType::kF32: return ld(float{});
    case DType::kF64: return static_cast<float>(ld(double{}));
    case DType::kBf16: return float_from_bf16_bits(ld(uint16_t{}));
    case DType::kF16: return float_from_f16_bits(ld(uint16_t{}));
    case DType::kF8E4m3: return float_from_fp8_e4m3(p[i]);
    case DType::kE8m0: return float_from_e8m0(p[i]);
    case DType::kF4E2m1x2: return float_from_fp4_e2m1((i & 1) ? (p[i / 2] >> 4) : (p[i / 2] & 0xFu));
    case DType::kI8: return static_cast<float>(static_cast<int8_t>(p[i]));
    case DType::kI16: return static_cast<float>(ld(int16_t{}));
    case DType::kI32: return static_cast<float>(ld(int32_t{}));
    case DType::kI64: return static_cast<float>(ld(int64_t{}));
    case DType::kU8: return static_cast<float>(p[i]);
    case DType::kU16: return static_cast<float>(ld(uint16_t{}));
    case DType::kU32: return static_cast<float>(ld(uint32_t{}));
    case DType::kU64: return static_cast<float>(ld(uint64_t{}));
    case DType::kBool: return p[i] ? 1.f : 0.f;
  }
  return 0.f;
}

}  // namespace tessera

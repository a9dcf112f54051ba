// SPDX-License-Identifier: Apache-2.0
/// EXL3 codec primitives shared bit for bit by the CPU reference and the CUDA kernels (spec/exl3.md §2–§4):
///   * the circular trellis bitstream of a 16×16 tile: 16·K int16 words read as little-endian uint32s,
///     MSB first; the state of stream position p is the 16-bit window ending at bit E(p) = (p+1)·K (§2.4);
///   * the in-tile order (the mma.sync m16n8k16 B-fragment permutation, §2.5);
///   * the codebooks 3INST, MCG and MUL1: 16-bit state → fp16 (§3);
///   * the scaled 128-point Hadamard with ExLlamaV3's exact roundings of the input transform and of the
///     fp16/fp32 output epilogues (§4.3).
/// Rates are carried in half-bit units `k2 = 2·bits`: even k2 = integer K (1..8, verified); odd k2 = the
/// MUL1 half rates 1.5/2.5/3.5 of §2.6 (UNVERIFIED: third-party layout, loaders refuse them by default).
#pragma once

#include <cstdint>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"

namespace tessera::exl3 {

/// Codebook ids as ExLlamaV3 numbers them (cb 0/1/2); the checkpoint marker tensor selects 1 and 2.
enum class Codebook : uint8_t { k3Inst = 0, kMcg = 1, kMul1 = 2 };

inline constexpr int kTileDim = 16;            // a tile is 16 (k) × 16 (n) weights
inline constexpr int kTileSize = 256;          // stream positions per tile
inline constexpr int kHadDim = 128;            // Hadamard block along k and n
inline constexpr int kMinBits = 1, kMaxBits = 8;

// clang-format off
inline constexpr uint32_t kMul3Inst = 89226354u;      // 3INST: x = s·kMul3Inst + kAdd3Inst (mod 2^32)
inline constexpr uint32_t kAdd3Inst = 64248484u;
inline constexpr uint32_t kMulMcg   = 0xCBAC1FEDu;    // MCG:   x = s·kMulMcg; also the `mcg` marker value
inline constexpr uint32_t kMulMul1  = 0x83DCD12Du;    // MUL1:  x = s·kMulMul1; also the `mul1` marker value
inline constexpr uint32_t kLopMask  = 0x8FFF8FFFu;    // keep sign + low 12 bits of each half
inline constexpr uint32_t kLopXor   = 0x3B603B60u;    // force exponent 0b011xx: each half ±[0.125, 2)
inline constexpr uint16_t kMul1ScaleBits = 0x1EEE;    // fp16 1774·2^-18 = 0.00676727294921875
inline constexpr uint16_t kMul1BiasBits  = 0xC931;    // fp16 −1329·2^-7 = −10.3828125
inline constexpr uint32_t kHadScaleBits  = 0x3DB504F3u;  // fp32 0.088388347648f = fp32(1/sqrt(128))
inline constexpr float    kHadScale      = 0.088388347648f;
/// RMS of the 3INST table; the quantizer divides suh by −kCodebookScale (spec §3.5) for every codebook.
inline constexpr double   kCodebookScale = 1.24371088;
// clang-format on

// ---------------------------------------------------------------------------------------------------
// Codebooks (§3)

/// 3INST/MCG tail: mask/xor, then fp16(lo) + fp16(hi) with one RNE rounding. Both halves lie in
/// ±[0.125, 2) so their fp32 sum is exact and one rounding equals the hardware __hadd.
TESSERA_HOST_DEVICE constexpr uint16_t lop3_half_sum(uint32_t x) {
  x = (x & kLopMask) ^ kLopXor;
  float lo = float_from_f16_bits(static_cast<uint16_t>(x & 0xFFFFu));
  float hi = float_from_f16_bits(static_cast<uint16_t>(x >> 16));
  return f16_bits_from_float(lo + hi);
}

/// MUL1: byte sum of s·kMulMul1 (0..1020) → h = 1024 + sum (exact in fp16) → fp16(h·A + B). h·A is an
/// integer multiple of 2^-18 below 2^22 units and the sum with B is exact in fp32, so one RNE rounding
/// equals __hfma (and contraction to an fp32 FMA changes nothing).
TESSERA_HOST_DEVICE constexpr uint32_t mul1_byte_sum(uint32_t s) {
  uint32_t x = s * kMulMul1;
  return (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
}
TESSERA_HOST_DEVICE constexpr uint16_t mul1_from_byte_sum(uint32_t sum) {
  float h = static_cast<float>(1024u + sum);
  return f16_bits_from_float(h * float_from_f16_bits(kMul1ScaleBits) + float_from_f16_bits(kMul1BiasBits));
}

/// fp16 bits of the weight for 16-bit state `s` (upper bits of `s` are ignored).
template <Codebook kCb>
TESSERA_HOST_DEVICE constexpr uint16_t decode_state(uint32_t s) {
  s &= 0xFFFFu;
  if constexpr (kCb == Codebook::k3Inst) return lop3_half_sum(s * kMul3Inst + kAdd3Inst);
  else if constexpr (kCb == Codebook::kMcg) return lop3_half_sum(s * kMulMcg);
  else return mul1_from_byte_sum(mul1_byte_sum(s));
}
TESSERA_HOST_DEVICE constexpr uint16_t decode_state(Codebook cb, uint32_t s) {
  switch (cb) {
    case Codebook::k3Inst: return decode_state<Codebook::k3Inst>(s);
    case Codebook::kMcg: return decode_state<Codebook::kMcg>(s);
    default: return decode_state<Codebook::kMul1>(s);
  }
}

// ---------------------------------------------------------------------------------------------------
// Rates and the tile bitstream (§2.3, §2.4, §2.6)

/// int16 words per tile: 16·bits = 8·k2.
TESSERA_HOST_DEVICE constexpr int words16_per_tile(int k2) { return 8 * k2; }
/// Stream bits per tile: 256·bits = 128·k2 (a multiple of 32 for every k2, so whole uint32 words).
TESSERA_HOST_DEVICE constexpr int stream_bits(int k2) { return 128 * k2; }
/// New bits of position p: K for integer rates; KA for even p and KA+1 for odd p at half rates.
TESSERA_HOST_DEVICE constexpr int position_bits(int k2, int p) { return (k2 >> 1) + ((k2 & 1) & p); }
/// Exclusive end bit E(p) of position p's window: (p+1)·K, or (p/2)(2KA+1) + (p odd ? 2KA+1 : KA).
TESSERA_HOST_DEVICE constexpr int stream_end(int k2, int p) {
  if ((k2 & 1) == 0) return (p + 1) * (k2 >> 1);
  int ka = k2 >> 1;
  return (p >> 1) * (2 * ka + 1) + ((p & 1) ? 2 * ka + 1 : ka);
}

/// uint32 word j of a tile given its int16 words read as uint16 (u[2j] low half, u[2j+1] high half).
TESSERA_HOST_DEVICE constexpr uint32_t tile_word32(uint16_t const* u, int j) {
  return static_cast<uint32_t>(u[2 * j]) | (static_cast<uint32_t>(u[2 * j + 1]) << 16);
}

/// 16-bit window ending (exclusively) at stream bit `end`, wrapping around the circular stream of
/// `nw32` uint32 words `wd` (MSB of wd[0] is stream bit 0): s = ((wd[i0]<<32 | wd[i1]) >> (48 − o)).
TESSERA_HOST_DEVICE constexpr uint32_t window16(uint32_t const* wd, int nw32, int end) {
  int const len = 32 * nw32;
  int b0 = end - 16;
  if (b0 < 0) b0 += len;
  int const i0 = b0 >> 5, o = b0 & 31;
  int const i1 = (i0 + 1 == nw32) ? 0 : i0 + 1;
  uint64_t const pair = (static_cast<uint64_t>(wd[i0]) << 32) | wd[i1];
  return static_cast<uint32_t>(pair >> (48 - o)) & 0xFFFFu;
}

/// State of stream position p (0..255) of a tile whose uint32 words are `wd` (4·k2 of them).
TESSERA_HOST_DEVICE constexpr uint32_t tile_state(uint32_t const* wd, int k2, int p) {
  return window16(wd, 4 * k2, stream_end(k2, p));
}

/// Packs one tile: `codes[p]` holds position p's new bits in its low position_bits(k2, p) bits; writes
/// 8·k2 uint16 words `out` exactly as stored in the checkpoint (MSB-first stream in LE uint32 words).
TESSERA_HOST_DEVICE constexpr void pack_tile(uint16_t const* codes, int k2, uint16_t* out) {
  uint32_t wd[4 * 16] = {};
  int bit = 0;
  for (int p = 0; p < kTileSize; ++p) {
    int const d = position_bits(k2, p);
    for (int t = d - 1; t >= 0; --t, ++bit)
      if ((codes[p] >> t) & 1u) wd[bit >> 5] |= 1u << (31 - (bit & 31));
  }
  for (int j = 0; j < 4 * k2; ++j) {
    out[2 * j] = static_cast<uint16_t>(wd[j] & 0xFFFFu);
    out[2 * j + 1] = static_cast<uint16_t>(wd[j] >> 16);
  }
}

// ---------------------------------------------------------------------------------------------------
// In-tile order (§2.5): position p = 8·lane + j is element j of lane `lane` of two m16n8k16 B fragments.

/// Row (along k, inputs) of stream position p inside its tile.
TESSERA_HOST_DEVICE constexpr int tile_row(int p) {
  int const l = p >> 3, j = p & 7;
  return 2 * (l & 3) + (j & 1) + 8 * ((j >> 1) & 1);
}
/// Column (along n, outputs) of stream position p inside its tile.
TESSERA_HOST_DEVICE constexpr int tile_col(int p) {
  int const l = p >> 3, j = p & 7;
  return (l >> 2) + 8 * (j >> 2);
}

/// Stream position of tile element (r, c): the inverse of (tile_row, tile_col).
TESSERA_HOST_DEVICE constexpr int tile_pos(int r, int c) {
  int const lane = 4 * (c & 7) + ((r & 7) >> 1);
  int const j = (r & 1) | ((r >> 3) << 1) | ((c >> 3) << 2);
  return 8 * lane + j;
}

// ---------------------------------------------------------------------------------------------------
// Hadamard-128 (§4.1, §4.3)

/// Unnormalised Sylvester transform of one block of 128 in fp32: for index bit b = 0..6 in that order,
/// (v[j], v[j + 2^b]) → (lo + hi, lo − hi) for every j with bit b clear.
TESSERA_HOST_DEVICE constexpr void fwht128(float* v) {
  for (int h = 1; h < kHadDim; h <<= 1)
    for (int j = 0; j < kHadDim; ++j)
      if ((j & h) == 0) {
        float const lo = v[j], hi = v[j + h];
        v[j] = lo + hi;
        v[j + h] = lo - hi;
      }
}

/// Input transform of one 128 block: xh = fp16(fwht(fp16(x·suh)) · r). The fp16·fp16 product is exact in
/// fp32, so rounding it once equals an fp16 multiply.
TESSERA_HOST_DEVICE constexpr void input_transform128(uint16_t const* x, uint16_t const* suh, uint16_t* xh) {
  float v[kHadDim] = {};
  for (int i = 0; i < kHadDim; ++i)
    v[i] = round_to_f16(float_from_f16_bits(x[i]) * float_from_f16_bits(suh[i]));
  fwht128(v);
  for (int i = 0; i < kHadDim; ++i) xh[i] = f16_bits_from_float(v[i] * kHadScale);
}

/// fp16 epilogue of one 128 block of fp32 accumulators: o = fp16(fwht(acc)·r), y = fp16(o·svh).
TESSERA_HOST_DEVICE constexpr void epilogue128_f16(float const* acc, uint16_t const* svh, uint16_t* y) {
  float v[kHadDim] = {};
  for (int i = 0; i < kHadDim; ++i) v[i] = acc[i];
  fwht128(v);
  for (int i = 0; i < kHadDim; ++i)
    y[i] = f16_bits_from_float(round_to_f16(v[i] * kHadScale) * float_from_f16_bits(svh[i]));
}

/// fp32 epilogue of one 128 block: y = (fwht(acc)·r)·svh, both multiplies in fp32.
TESSERA_HOST_DEVICE constexpr void epilogue128_f32(float const* acc, uint16_t const* svh, float* y) {
  float v[kHadDim] = {};
  for (int i = 0; i < kHadDim; ++i) v[i] = acc[i];
  fwht128(v);
  for (int i = 0; i < kHadDim; ++i) {
    float const t = v[i] * kHadScale;
    y[i] = t * float_from_f16_bits(svh[i]);
  }
}

/// Legacy packed signs (§1.2): element 16·w + b is −1 if bit b of word w is set, else +1 (fp16 bits).
TESSERA_HOST_DEVICE constexpr uint16_t legacy_sign_f16(uint16_t word, int b) {
  return ((word >> b) & 1u) ? uint16_t{0xBC00} : uint16_t{0x3C00};
}

}  // namespace tessera::exl3

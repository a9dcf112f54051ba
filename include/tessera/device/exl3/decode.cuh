// SPDX-License-Identifier: Apache-2.0
/// EXL3 trellis decode straight into mma.sync.m16n8k16 B fragments (spec/exl3.md §2.4, §2.5, §3, §6.2).
/// Lane l of a warp owns stream positions 8l..8l+7 of a 16×16 tile, which are exactly its elements of the
/// two `.col` B fragments (k × n = 16 × 8) of the tile:
///   frag[0] = {p 8l+0, 8l+1}  (k = 2(l%4), 2(l%4)+1;  n = l/4)        columns 0–7, b0
///   frag[1] = {p 8l+2, 8l+3}  (k + 8, k + 9;          n = l/4)        columns 0–7, b1
///   frag[2] = {p 8l+4, 8l+5}  (k, k + 1;              n = l/4 + 8)    columns 8–15, b0
///   frag[3] = {p 8l+6, 8l+7}  (k + 8, k + 9;          n = l/4 + 8)    columns 8–15, b1
/// (each a half2, lower k in the low half). The lane's 8 windows span 7K + 16 stream bits starting at
/// b = (8lK + K − 16) mod 256K; it loads the kLaneWords uint32s covering them, shifts them left by
/// o = b mod 32 with funnel shifts so the span starts at the MSB, and cuts each 16-bit window at a
/// compile-time offset jK. Codebooks run on pairs: 3INST/MCG = IMAD + LOP3 per weight, PRMT to pair the
/// halves, one HADD2 per two weights; MUL1 = IMAD + DP4A per weight, PRMT, one HFMA2 per two weights.
/// Bit-exact with include/tessera/codec/exl3.hpp (HADD2/HFMA2 round once, RNE, like the spec's
/// __hadd/__hfma).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "tessera/codec/exl3.hpp"

namespace tessera::device::exl3 {

using tessera::exl3::Codebook;

/// Normalised 32-bit words holding a lane's 7K + 16 window bits, and the loaded words (one more).
template <int kBits>
inline constexpr int kNormWords = (7 * kBits + 16 + 31) / 32;
template <int kBits>
inline constexpr int kLaneWords = kNormWords<kBits> + 1;

/// Words a lane actually touches: max over lanes of ceil((o + 7K + 16) / 32), o = first bit mod 32. For
/// K ≤ 4 every lane's span fits in 2 words (K = 3: o ≤ 27, K = 4: o = 20), one fewer than kLaneWords;
/// the words past it only feed bits beyond the span, so they are set to 0 instead of loaded.
template <int kBits>
constexpr int load_words_needed() {
  int most = 0;
  for (int l = 0; l < 32; ++l) {
    int b = 8 * l * kBits + kBits - 16;
    if (b < 0) b += 256 * kBits;
    int const w = ((b & 31) + 7 * kBits + 16 + 31) / 32;
    most = w > most ? w : most;
  }
  return most;
}
template <int kBits>
inline constexpr int kLoadWords = load_words_needed<kBits>();
static_assert(kLoadWords<1> <= kLaneWords<1> && kLoadWords<4> == 2 && kLoadWords<8> <= kLaneWords<8>);

/// First stream bit of lane `lane`'s windows, (8·lane·K + K − 16) mod 256K.
template <int kBits>
__device__ __forceinline__ int lane_first_bit(int lane) {
  int b = 8 * lane * kBits + kBits - 16;
  return b < 0 ? b + 256 * kBits : b;
}

/// Loads the lane's words of one tile (`tile` = 8K uint32 words, 4-byte aligned), wrapping circularly.
template <int kBits>
__device__ __forceinline__ void load_lane_words(uint32_t const* __restrict__ tile, int first_bit,
                                                uint32_t (&w)[kLaneWords<kBits>]) {
  constexpr int kTileWords = 8 * kBits;
  int idx = first_bit >> 5;
#pragma unroll
  for (int q = 0; q < kLaneWords<kBits>; ++q) {
    w[q] = q < kLoadWords<kBits> ? __ldg(tile + idx) : 0u;
    idx = (idx + 1 == kTileWords) ? 0 : idx + 1;
  }
}

/// The lane's 8 states from its loaded words; `o` = first_bit mod 32. After normalising (span bit 0 at
/// the MSB of nw[0]), window j covers span bits [b, b + 16), b = jK. It is cut from the 32-bit word X_t
/// that starts at span bit t = 16⌊b/16⌋ + (b mod 8), so b − t ∈ {0, 8}: X_t >> 16 when b = t, bits 23..8
/// of X_t (one PRMT with zero bytes) when b = t + 8. Windows with the same t share X_t (K = 2, 4, 8 need
/// 4 distinct X_t, free when t is a multiple of 32): one instruction per window plus one per X_t.
template <int kBits>
__device__ __forceinline__ void lane_states(uint32_t const (&w)[kLaneWords<kBits>], int o, uint32_t (&s)[8]) {
  uint32_t nw[kNormWords<kBits> + 1];
#pragma unroll
  for (int q = 0; q < kNormWords<kBits>; ++q) nw[q] = __funnelshift_l(w[q + 1], w[q], o);
  nw[kNormWords<kBits>] = 0u;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    int const b = j * kBits;                       // compile-time after unrolling
    int const t = 16 * (b / 16) + (b % 8);
    int const q = t >> 5, off = t & 31;
    uint32_t const x = off == 0 ? nw[q] : __funnelshift_l(nw[q + 1], nw[q], off);
    s[j] = (b == t) ? (x >> 16) : __byte_perm(x, 0u, 0x4421);
  }
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_half2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

/// Two weights as a half2 (s0 in the low half).
template <Codebook kCb>
__device__ __forceinline__ uint32_t decode_pair(uint32_t s0, uint32_t s1) {
  namespace c = tessera::exl3;
  if constexpr (kCb == Codebook::kMul1) {
    uint32_t const h0 = __dp4a(s0 * c::kMulMul1, 0x01010101u, 0x6400u);   // fp16 bits of 1024 + byte sum
    uint32_t const h1 = __dp4a(s1 * c::kMulMul1, 0x01010101u, 0x6400u);
    __half2 const a = bits_half2(static_cast<uint32_t>(c::kMul1ScaleBits) * 0x00010001u);
    __half2 const b = bits_half2(static_cast<uint32_t>(c::kMul1BiasBits) * 0x00010001u);
    return half2_bits(__hfma2(bits_half2(__byte_perm(h0, h1, 0x5410)), a, b));
  } else {
    uint32_t x0, x1;
    if constexpr (kCb == Codebook::k3Inst) {
      x0 = s0 * c::kMul3Inst + c::kAdd3Inst;
      x1 = s1 * c::kMul3Inst + c::kAdd3Inst;
    } else {
      x0 = s0 * c::kMulMcg;
      x1 = s1 * c::kMulMcg;
    }
    x0 = (x0 & c::kLopMask) ^ c::kLopXor;
    x1 = (x1 & c::kLopMask) ^ c::kLopXor;
    return half2_bits(__hadd2(bits_half2(__byte_perm(x0, x1, 0x5410)), bits_half2(__byte_perm(x0, x1, 0x7632))));
  }
}

/// The lane's two B fragments of a tile (layout in the file comment) from its loaded words.
template <int kBits, Codebook kCb>
__device__ __forceinline__ void decode_fragments(uint32_t const (&w)[kLaneWords<kBits>], int o, uint32_t (&frag)[4]) {
  uint32_t s[8];
  lane_states<kBits>(w, o, s);
#pragma unroll
  for (int i = 0; i < 4; ++i) frag[i] = decode_pair<kCb>(s[2 * i], s[2 * i + 1]);
}

/// D += A·B for one m16n8k16 (fp16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

}  // namespace tessera::device::exl3

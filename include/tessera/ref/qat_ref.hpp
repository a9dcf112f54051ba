// SPDX-License-Identifier: Apache-2.0
/// The QAT fake quantisers of spec/deepseek-v41.md Appendix B, on one block of a row:
///   FP8 (B.1, block 32): amax = max(max|x|, 1e-4); scale = 2^ceil-bits(amax·fp32(1/448));
///       q = clamp(x/scale, ±448); out = →md(f32(e4m3_RNE(q))·scale).
///   FP4 e4m3 scale (B.2, block 16): scale = f32(e4m3_RNE(max(amax, 6·2⁻⁹)/6)); q = clamp(x/scale, ±6)
///       (true fp32 division); out = →md(LUT[e2m1(q)]·scale), LUT the golden's e2m1 table (code 8, −0, reads +0).
///   FP4 ue8m0 scale (B.3, block 32): scale = 2^ceil-bits(max(amax, 6·2⁻¹²⁶)·fp32(1/6)); rest as B.2.
/// A row whose length is not a multiple of the block passes through unchanged (as the reference does).
/// The packed form (qat_pack_row / qat_unpack_element) stores the codes the quantiser chose, so unpacking
/// reproduces its output bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessera/ops/qat.hpp"
#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

using ops::QatKind;

inline int64_t qat_block(QatKind k) { return k == QatKind::kFp4Block16E4m3 ? 16 : 32; }

/// One quantisation block encoded: element codes (e4m3 bytes for FP8, e2m1 nibbles one per byte for FP4) and
/// the scale's code (e8m0 for B.1 / B.3, e4m3 for B.2). The fake-quantised value of element i is
/// →md(qat_decode(code_i, scale_code)): the quantiser and its packed form share that one expression.
inline void qat_block_encode(float const* x, int64_t b, QatKind kind, uint8_t* codes, uint8_t& scale_code) {
  float amax = 0.f;
  for (int64_t i = 0; i < b; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (kind == QatKind::kFp8Block32) {
    scale_code = e8m0_ceil_pow2(std::max(amax, 1e-4f) * static_cast<float>(1.0 / 448.0));
    float const scale = float_from_e8m0(scale_code);
    for (int64_t i = 0; i < b; ++i) codes[i] = fp8_e4m3_from_float_saturate(std::clamp(x[i] / scale, -448.f, 448.f));
    return;
  }
  float scale;
  if (kind == QatKind::kFp4Block16E4m3) {
    scale_code = fp8_e4m3_from_float(std::max(amax, static_cast<float>(6.0 * 0x1p-9)) / 6.f);
    scale = float_from_fp8_e4m3(scale_code);
  } else {
    scale_code = e8m0_ceil_pow2(std::max(amax, static_cast<float>(6.0 * 0x1p-126)) * static_cast<float>(1.0 / 6.0));
    scale = float_from_e8m0(scale_code);
  }
  for (int64_t i = 0; i < b; ++i) codes[i] = fp4_e2m1_from_float(std::clamp(x[i] / scale, -6.f, 6.f));
}

/// The fp32 value of one element code under its block's scale code (before →md).
inline float qat_decode(uint8_t code, uint8_t scale_code, QatKind kind) {
  if (kind == QatKind::kFp8Block32) return float_from_fp8_e4m3(code) * float_from_e8m0(scale_code);
  float const scale =
      kind == QatKind::kFp4Block16E4m3 ? float_from_fp8_e4m3(scale_code) : float_from_e8m0(scale_code);
  return float_from_fp4_e2m1_zero_unsigned(code) * scale;
}

inline void qat_block_apply(float* x, int64_t b, QatKind kind, DType md) {
  uint8_t codes[32] = {}, scale_code = 0;
  qat_block_encode(x, b, kind, codes, scale_code);
  for (int64_t i = 0; i < b; ++i) x[i] = round_md(qat_decode(codes[i], scale_code, kind), md);
}

/// Packed row (the compact form of a quantised row, e.g. decode state): [element codes | scale codes].
/// FP8: dim e4m3 bytes, then dim/32 e8m0 bytes. FP4: dim/2 bytes, element 2j in the low nibble and 2j+1 in the
/// high nibble, then dim/block scale bytes (e4m3 for B.2, e8m0 for B.3). A 512-wide B.2 row is 288 bytes, a
/// 128-wide B.3 row 68 bytes. qat_packed_row_bytes (ops/qat.hpp) gives the size, 0 where dim % block ≠ 0.
inline void qat_pack_row(float const* x, int64_t n, QatKind kind, uint8_t* packed) {
  int64_t const b = qat_block(kind);
  bool const fp4 = kind != QatKind::kFp8Block32;
  uint8_t* scales = packed + (fp4 ? n / 2 : n);
  uint8_t codes[32] = {};
  for (int64_t blk = 0; blk < n / b; ++blk) {
    qat_block_encode(x + blk * b, b, kind, codes, scales[blk]);
    for (int64_t i = 0; i < b; ++i) {
      int64_t const e = blk * b + i;
      if (!fp4)
        packed[e] = codes[i];
      else if (e % 2 == 0)
        packed[e / 2] = codes[i];
      else
        packed[e / 2] = static_cast<uint8_t>(packed[e / 2] | (codes[i] << 4));
    }
  }
}

/// Element e of a packed row as the quantiser outputs it: →md(qat_decode(code_e, scale_code_e)).
inline float qat_unpack_element(uint8_t const* packed, int64_t n, int64_t e, QatKind kind, DType md) {
  int64_t const b = qat_block(kind);
  bool const fp4 = kind != QatKind::kFp8Block32;
  uint8_t const code = !fp4 ? packed[e] : static_cast<uint8_t>((packed[e / 2] >> (4 * (e % 2))) & 0xFu);
  uint8_t const scale_code = packed[(fp4 ? n / 2 : n) + e / b];
  return round_md(qat_decode(code, scale_code, kind), md);
}

/// True if moving any single input of the block by up to `ulps` ulps of the block's largest magnitude
/// (either way) changes any output of the block: an input sits on a rounding boundary of an element code
/// or of the block scale within the reach of summation-order noise (the inputs come out of norms, dot
/// products and rotations whose absolute error scales with the block's magnitude, not the element's).
/// Such a decision cannot be reproduced across engines: the quantiser counterpart of a top-k tie.
inline bool qat_block_near_boundary(float const* x, int64_t b, QatKind kind, DType md, int ulps) {
  float base[32] = {}, pert[32] = {}, amax = 0.f;
  for (int64_t i = 0; i < b; ++i) amax = std::max(amax, std::fabs(x[i]));
  float delta = static_cast<float>(ulps) * (std::nextafter(amax, INFINITY) - amax);
  std::copy(x, x + b, base);
  qat_block_apply(base, b, kind, md);
  for (int64_t i = 0; i < b; ++i)
    for (float dir : {1.f, -1.f}) {
      std::copy(x, x + b, pert);
      pert[i] = x[i] + dir * delta;
      qat_block_apply(pert, b, kind, md);
      // An output depends only on its code and the block scale, so any change is a boundary crossing.
      for (int64_t j = 0; j < b; ++j)
        if (pert[j] != base[j]) return true;
    }
  return false;
}

/// Fake-quantises one row of n values in place.
inline void qat_row(float* x, int64_t n, QatKind kind, DType md) {
  int64_t b = qat_block(kind);
  if (n % b != 0) return;
  for (int64_t i = 0; i < n; i += b) qat_block_apply(x + i, b, kind, md);
}

}  // namespace tessera::ref

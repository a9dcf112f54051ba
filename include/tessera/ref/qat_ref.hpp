// SPDX-License-Identifier: Apache-2.0
/// The QAT fake quantisers of spec/deepseek-v41.md Appendix B, on one block of a row:
///   FP8 (B.1, block 32): amax = max(max|x|, 1e-4); scale = 2^ceil-bits(amax·fp32(1/448));
///       q = clamp(x/scale, ±448); out = →md(f32(e4m3_RNE(q))·scale).
///   FP4 e4m3 scale (B.2, block 16): scale = f32(e4m3_RNE(max(amax, 6·2⁻⁹)/6)); q = clamp(x/scale, ±6)
///       (true fp32 division); out = →md(LUT[e2m1(q)]·scale), LUT the golden's e2m1 table (code 8, −0, reads +0).
///   FP4 ue8m0 scale (B.3, block 32): scale = 2^ceil-bits(max(amax, 6·2⁻¹²⁶)·fp32(1/6)); rest as B.2.
/// A row whose length is not a multiple of the block passes through unchanged (as the reference does).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessera/ops/qat.hpp"
#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

using ops::QatKind;

inline int64_t qat_block(QatKind k) { return k == QatKind::kFp4Block16E4m3 ? 16 : 32; }

inline void qat_block_apply(float* x, int64_t b, QatKind kind, DType md) {
  float amax = 0.f;
  for (int64_t i = 0; i < b; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (kind == QatKind::kFp8Block32) {
    float scale = pow2_ceil_bits(std::max(amax, 1e-4f) * static_cast<float>(1.0 / 448.0));
    for (int64_t i = 0; i < b; ++i) {
      float q = std::clamp(x[i] / scale, -448.f, 448.f);
      x[i] = round_md(float_from_fp8_e4m3(fp8_e4m3_from_float_saturate(q)) * scale, md);
    }
    return;
  }
  float scale;
  if (kind == QatKind::kFp4Block16E4m3)
    scale = float_from_fp8_e4m3(fp8_e4m3_from_float(std::max(amax, static_cast<float>(6.0 * 0x1p-9)) / 6.f));
  else
    scale = pow2_ceil_bits(std::max(amax, static_cast<float>(6.0 * 0x1p-126)) * static_cast<float>(1.0 / 6.0));
  for (int64_t i = 0; i < b; ++i) {
    float q = std::clamp(x[i] / scale, -6.f, 6.f);
    x[i] = round_md(float_from_fp4_e2m1_zero_unsigned(fp4_e2m1_from_float(q)) * scale, md);
  }
}

/// True if moving any single input of the block by up to `ulps` ulps of the block's largest magnitude
/// (either way) changes any output of the block: an input sits on a rounding boundary of an element code
/// or of the block scale within the reach of summation-order noise (the inputs come out of norms, dot
/// products and rotations whose absolute error scales with the block's magnitude, not the element's).
/// Such a decision cannot be reproduced across engines: the quantiser counterpart of a top-k tie.
inline bool qat_block_near_boundary(float const* x, int64_t b, QatKind kind, DType md, int ulps) {
  float base[32], pert[32], amax = 0.f;
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

// SPDX-License-Identifier: Apache-2.0
/// RMSNorm references (spec/deepseek-v41.md §2.2). Weighted: y = →md(w ⊙ →md(x·rsqrt(mean(x²) + eps)))
/// with the statistic in fp32 and the product with w rounded to the model dtype. Unweighted (the mHC
/// input norm): y = x·rsqrt(mean(x²) + eps), all fp32. eps is 1e-20 in DeepSeek-V4.1, so a zero row gives
/// zeros, never NaN.
#pragma once

#include <cstdint>

#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

/// Σ_i v(i) of one row (v(i) an fp32 value, e.g. a rounded product) in the order of the golden engine's
/// contiguous row reduction (torch's CUDA reduce kernel on an H200, verified bitwise for n = 32 … 5120):
/// 32 lanes; with n a multiple of 128, lane t reads the 4-wide vectors t, t+32, t+64, … and keeps one
/// running sum per vector component, then adds the four in component order; otherwise lane t sums the
/// elements t, t+32, t+64, … . The 32 lane sums are then folded by halving (s[t] += s[t+16], s[t] += s[t+8],
/// …, s[0] += s[1]). Every addition is rounded to fp32. The order depends only on n.
template <class Elem>
inline float lane_sum(int64_t n, Elem&& v) {
  constexpr int kLanes = 32;
  int64_t const vec = n % (4 * kLanes) == 0 ? 4 : 1;
  float lane[kLanes];
  for (int t = 0; t < kLanes; ++t) {
    float comp[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t v0 = t * vec; v0 < n; v0 += kLanes * vec)
      for (int64_t c = 0; c < vec; ++c) comp[c] = comp[c] + v(v0 + c);
    float a = comp[0];
    for (int64_t c = 1; c < vec; ++c) a = a + comp[c];
    lane[t] = a;
  }
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int t = 0; t < h; ++t) lane[t] = lane[t] + lane[t + h];
  return lane[0];
}

/// Σ_i x[i]² (each square rounded) in the lane_sum order.
inline float sum_squares(float const* x, int64_t n) {
  return lane_sum(n, [x](int64_t i) { return x[i] * x[i]; });
}

/// mean(x²) of one row: sum_squares(x, n)·fl(1/n), as torch's mean multiplies by the rounded factor.
inline float mean_square(float const* x, int64_t n) {
  return sum_squares(x, n) * (1.f / static_cast<float>(n));
}

/// rsqrt(mean(x²) + eps) of one row.
inline float rms_inv(float const* x, int64_t n, float eps) { return rsqrt(mean_square(x, n) + eps); }

/// One row of the weighted RMSNorm; `w` null means the unweighted form (no rounding at all).
inline void rms_norm_row(float const* x, float const* w, int64_t n, float eps, DType md, float* y) {
  float r = rms_inv(x, n, eps);
  if (!w) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r;
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = round_md(w[i] * round_md(x[i] * r, md), md);
}

}  // namespace tessera::ref

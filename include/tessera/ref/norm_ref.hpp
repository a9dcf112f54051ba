// SPDX-License-Identifier: Apache-2.0
/// RMSNorm references (spec/deepseek-v41.md §2.2). Weighted: y = →md(w ⊙ →md(x·rsqrt(mean(x²) + eps)))
/// with the statistic in fp32 and the product with w rounded to the model dtype. Unweighted (the mHC
/// input norm): y = x·rsqrt(mean(x²) + eps), all fp32. eps is 1e-20 in DeepSeek-V4.1, so a zero row gives
/// zeros, never NaN.
#pragma once

#include <cstdint>

#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

/// rsqrt(mean(x²) + eps) of one row, the sum of squares taken in index order.
inline float rms_inv(float const* x, int64_t n, float eps) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  return rsqrt(ss / static_cast<float>(n) + eps);
}

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

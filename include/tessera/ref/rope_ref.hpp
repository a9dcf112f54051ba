// SPDX-License-Identifier: Apache-2.0
/// Partial interleaved RoPE (spec/deepseek-v41.md §2.5.1). Only the trailing R channels of a head rotate;
/// pair p is channels (hd−R+2p, hd−R+2p+1) = (a, b): a' = a·cos_p − b·sin_p, b' = a·sin_p + b·cos_p, each
/// product rounded to fp32, the result →md. The inverse rotation uses −sin. Angles φ_p = f32(pos)·inv_freq_p
/// (one fp32 product). cos/sin, →md before use: in bf16, CUDA's cosf/sinf of φ (cuda_math, the golden engine's
/// torch.cos/sin); in fp32, the fp64 cos/sin of φ rounded once (CUDA's cosf/sinf move the fp32 model further
/// from the golden, whose fp32 GEMM orders it cannot follow anyway). The CUDA op computes both the same way. Also the inverse-frequency tables: `main` (plain) and
/// `compress` (YaRN, transformers' _compute_yarn_parameters with truncation, attention factor 1).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

/// cos/sin of one position for R/2 frequencies, rounded to md.
inline void rope_cos_sin(int64_t pos, float const* inv_freq, int64_t half, DType md, float* cos_out,
                         float* sin_out) {
  float fp = static_cast<float>(pos);
  for (int64_t p = 0; p < half; ++p) {
    float phi = fp * inv_freq[p];
    if (md == DType::kBf16) {  // the golden engine's own torch.cos / torch.sin: CUDA's cosf / sinf
      cos_out[p] = round_md(cuda_math::cosf(phi), md);
      sin_out[p] = round_md(cuda_math::sinf(phi), md);
    } else {
      cos_out[p] = static_cast<float>(std::cos(static_cast<double>(phi)));
      sin_out[p] = static_cast<float>(std::sin(static_cast<double>(phi)));
    }
  }
}

/// Rotates the trailing 2·half channels of one head vector x[0, hd) in place.
inline void rope_apply_row(float* x, int64_t hd, int64_t half, float const* cos_v, float const* sin_v,
                           bool inverse, DType md) {
  float* r = x + hd - 2 * half;
  for (int64_t p = 0; p < half; ++p) {
    float a = r[2 * p], b = r[2 * p + 1];
    float c = cos_v[p], s = inverse ? -sin_v[p] : sin_v[p];
    float ac = a * c, bs = b * s, as = a * s, bc = b * c;
    r[2 * p] = round_md(ac - bs, md);
    r[2 * p + 1] = round_md(as + bc, md);
  }
}

/// inv_freq_j = 1 / theta^(2j/R) in fp32 (the exponent 2j/R and the power in fp32).
inline std::vector<float> rope_inv_freq_default(double theta, int64_t rope_dim) {
  std::vector<float> f(static_cast<size_t>(rope_dim / 2));
  for (int64_t j = 0; j < rope_dim / 2; ++j) {
    float e = static_cast<float>(2 * j) / static_cast<float>(rope_dim);
    f[j] = 1.f / std::pow(static_cast<float>(theta), e);
  }
  return f;
}

/// YaRN: pos_j = θ^(2j/R); extra = 1/pos; inter = 1/(s·pos); ramp over [low, high] from the correction
/// dims of β_fast/β_slow (floor/ceil, clamped to [0, R−1]); inv = inter·(1−ef) + extra·ef, ef = 1 − ramp.
inline std::vector<float> rope_inv_freq_yarn(double theta, int64_t rope_dim, double factor, double beta_fast,
                                             double beta_slow, double original_max_pos) {
  auto corr = [&](double rot) {
    return (static_cast<double>(rope_dim) * std::log(original_max_pos / (rot * 2 * M_PI))) / (2 * std::log(theta));
  };
  double low = std::max(std::floor(corr(beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(beta_slow)), static_cast<double>(rope_dim - 1));
  if (low == high) high += 0.001;
  int64_t half = rope_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  float fs = static_cast<float>(factor);
  for (int64_t j = 0; j < half; ++j) {
    float e = static_cast<float>(2 * j) / static_cast<float>(rope_dim);
    float pos = std::pow(static_cast<float>(theta), e);
    float extra = 1.f / pos;
    float inter = 1.f / (fs * pos);
    float lin = (static_cast<float>(j) - static_cast<float>(low)) / static_cast<float>(high - low);
    float ramp = std::min(std::max(lin, 0.f), 1.f);
    float ef = 1.f - ramp;
    f[j] = inter * (1.f - ef) + extra * ef;
  }
  return f;
}

}  // namespace tessera::ref

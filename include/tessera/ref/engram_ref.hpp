// SPDX-License-Identifier: Apache-2.0
/// Engram (spec/deepseek-v41.md §2.4): n-gram hashing and the gated residual write. No short convolution.
/// Hash of one position: tok_i (i = 0..N−1) = compressed id at t−i, or pad_c once blocked (t−i < 0 or a
/// DEAD id at or after t−i; blocking is cumulative); P_i = tok_i·mult_i (int64); h = P_0; for i = 1..N−1:
/// h ^= P_i, column (i−1)·He + head = h mod prime[i−1][head] + offset[column].
/// Gate of stream k: rstd = rsqrt(mean_D(h_k²)+eps)·rsqrt(mean_D(κ_k²)+eps);
///   dot = (Σ_D h_k ⊙ w_k ⊙ κ_k)·rstd·D^(−1/2); g = σ(copysign(sqrt(max(|dot|, 1e-6)), dot));
///   out_k = →md(h_k + g·v).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessera/ref/norm_ref.hpp"

namespace tessera::ref {

inline constexpr int64_t kEngramDead = -1;

/// history(p) for p ≤ t gives the compressed id at p (kEngramDead for a DEAD position); writes tok [N].
template <class History>
inline void engram_lookback(History const& history, int64_t t, int64_t n, int64_t pad_c, int64_t* tok) {
  bool blocked = false;
  for (int64_t i = 0; i < n; ++i) {
    int64_t src = t - i >= 0 ? history(t - i) : kEngramDead;
    blocked = blocked || t - i < 0 || src == kEngramDead;
    tok[i] = blocked ? pad_c : src;
  }
}

/// tok [N], mult [N], primes [(N−1)·He], offsets [(N−1)·He] → ids [(N−1)·He].
inline void engram_hash_row(int64_t const* tok, int64_t const* mult, int64_t const* primes, int64_t const* offsets,
                            int64_t n, int64_t heads, int64_t* ids) {
  int64_t h = tok[0] * mult[0];
  for (int64_t i = 1; i < n; ++i) {
    h ^= tok[i] * mult[i];
    for (int64_t hd = 0; hd < heads; ++hd) {
      int64_t c = (i - 1) * heads + hd;
      ids[c] = h % primes[c] + offsets[c];
    }
  }
}

/// x [n, D] (md values), key [n, D] and value [D] (f32 of the md projection), w [n, D] = q ⊙ k weights.
inline void engram_gate_row(float const* x, float const* key, float const* value, float const* w, int64_t n,
                            int64_t d, float eps, DType md, float* out) {
  float inv_sqrt_d = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int64_t k = 0; k < n; ++k) {
    float const* h = x + k * d;
    float const* kk = key + k * d;
    float rstd = rms_inv(h, d, eps) * rms_inv(kk, d, eps);
    float const* wk = w + k * d;
    float const s = lane_sum(d, [&](int64_t i) { return (h[i] * wk[i]) * kk[i]; });
    float dt = s * rstd * inv_sqrt_d;
    float g = sigmoid(std::copysign(std::sqrt(std::max(std::fabs(dt), 1e-6f)), dt), md);
    for (int64_t i = 0; i < d; ++i) out[k * d + i] = round_md(h[i] + g * value[i], md);
  }
}

}  // namespace tessera::ref

// SPDX-License-Identifier: Apache-2.0
/// Softmax-gated KV pooling of one compressor group (spec/deepseek-v41.md §2.5.3, ratio r > 1), fp32:
///   latent[c] = →md(Σ_{i<r} a_i[c]·softmax_i(g[·, c])), a and g the fp32 projections of the r tokens; exp in the
///   model dtype's arithmetic (exp_md).
/// Ratio 1 has no pooling (every token is its own group: latent = norm(wkv(x))).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

/// a, g: r rows of `dim` (row i at a + i·dim); out [dim].
inline void compress_pool_group(float const* a, float const* g, int64_t r, int64_t dim, DType md, float* out) {
  for (int64_t c = 0; c < dim; ++c) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < r; ++i) mx = std::max(mx, g[i * dim + c]);
    float s = 0.f;
    for (int64_t i = 0; i < r; ++i) s += exp_md(g[i * dim + c] - mx, md);
    float acc = 0.f;
    for (int64_t i = 0; i < r; ++i) acc += a[i * dim + c] * (exp_md(g[i * dim + c] - mx, md) / s);
    out[c] = round_md(acc, md);
  }
}

}  // namespace tessera::ref

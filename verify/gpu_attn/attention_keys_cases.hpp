// SPDX-License-Identifier: Apache-2.0
/// AttentionKeyList test cases shared by the CPU and GPU tests: seeded random chunks (cached window
/// positions, consecutive chunk positions, IndexTopK-like picks in random order with −1 padding) and the
/// key lists written out independently of the functor (keys at positions (p − W, p] in pool order, then the
/// set of valid picks in ascending order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "tessera/ops/attention_keys.hpp"

namespace tessera::verify::gpu_attn {

struct KeyShape { int64_t rows, p0, n_old, W, entries, top_k, ratio; };

/// Prefill longer than the window, prefill after a cached window, decode, a long chunk, no top-k, and
/// picks past the published entries (visible by position, not yet published) with −1 padding.
inline std::vector<KeyShape> key_shapes() {
  return {{40, 0, 0, 16, 20, 6, 2},     {23, 57, 15, 16, 27, 6, 2}, {1, 130, 15, 16, 65, 6, 2},
          {300, 9, 9, 128, 150, 16, 2}, {17, 80, 15, 16, 0, 0, 1},  {5, 200, 30, 16, 190, 512, 1}};
}

struct KeyCase {
  ops::AttentionKeyListDesc d;
  std::vector<int64_t> old_pos, pos;
  std::vector<int32_t> sel;
};

inline KeyCase key_case(uint64_t seed, int64_t rows, int64_t p0, int64_t n_old, int64_t W, int64_t entries, int64_t top_k,
                 int64_t ratio) {
  KeyCase c;
  c.d = {rows, n_old, W, entries, top_k};
  for (int64_t i = 0; i < n_old; ++i) c.old_pos.push_back(p0 - n_old + i);
  for (int64_t r = 0; r < rows; ++r) c.pos.push_back(p0 + r);
  std::mt19937_64 g(seed);
  for (int64_t r = 0; r < rows; ++r) {
    // IndexTopK-like picks: distinct visible entries (plus an occasional one past `entries`), any order.
    int64_t const vis = (p0 + r + 1) / ratio;
    std::vector<int32_t> pool;
    for (int64_t e = 0; e < vis; ++e) pool.push_back(static_cast<int32_t>(e));
    std::shuffle(pool.begin(), pool.end(), g);
    for (int64_t i = 0; i < top_k; ++i) c.sel.push_back(i < static_cast<int64_t>(pool.size()) ? pool[i] : -1);
  }
  return c;
}

/// Row offsets and ids written out independently of the functor (chunk positions consecutive from p0).
inline std::pair<std::vector<int64_t>, std::vector<int32_t>> expected_key_list(KeyCase const& c, int64_t p0) {
  std::vector<int64_t> off{0};
  std::vector<int32_t> ids;
  ops::AttentionKeyListDesc const& d = c.d;
  for (int64_t r = 0; r < d.rows; ++r) {
    int64_t const p = c.pos[r];
    for (int64_t i = 0; i < d.n_old; ++i)
      if (p - c.old_pos[i] < d.window) ids.push_back(static_cast<int32_t>(i));
    for (int64_t q = std::max<int64_t>(p - d.window + 1, p0); q <= p; ++q)
      ids.push_back(static_cast<int32_t>(d.n_old + q - p0));
    std::set<int32_t> picks;
    for (int64_t i = 0; i < d.top_k; ++i) {
      int32_t const e = c.sel[r * d.top_k + i];
      if (e >= 0 && e < d.entries) picks.insert(e);
    }
    for (int32_t e : picks) ids.push_back(static_cast<int32_t>(d.n_old + d.rows + e));
    off.push_back(static_cast<int64_t>(ids.size()));
  }
  return {off, ids};
}

}  // namespace tessera::verify::gpu_attn

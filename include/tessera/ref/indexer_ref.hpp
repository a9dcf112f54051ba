// SPDX-License-Identifier: Apache-2.0
/// The ReLU-weighted multi-head lightning indexer and its two-level top-k (spec/deepseek-v41.md §2.5.4).
///   score[s, j] = Σ_h w[s,h]·(relu(q_{s,h}·k_j)·di^(−1/2)),  w = f32(weights_proj(x))·Hi^(−1/2);
///   visible iff j < (pos_s + 1) // r, else −inf.
/// Candidate blocks: block b = entries [b·Bc, (b+1)·Bc), score = max; the block (vis−1)//Bc is forced to
/// +inf; the min(topk_blocks, #blocks) best blocks with a score > −inf are kept.
/// Top-k: the K best finite scores.
///
/// Tie rule (exact ties at a top-k cutoff): among equal values the LOWER index wins. This is what
/// torch.topk's radix select does on CUDA (values strictly above the k-th value first, then the entries
/// equal to it in index order), and it reproduces every selected set in the golden's prompt-4 dumps
/// (verify/model). Because the rule depends only on (value, index), a row selects the same set whatever
/// the row length T ≥ its visible count, i.e. whatever the chunking. `-0.0` never occurs (sums start at
/// +0), so value equality is bit equality.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/ref/common_ref.hpp"

namespace tessera::ref {

/// Number of compressed entries visible to a query at absolute position `pos` for ratio r.
inline int64_t index_visible(int64_t pos, int64_t ratio) { return (pos + 1) / ratio; }

/// q [Hi, di] (fp32 values after FP4), w [Hi] (already × Hi^(−1/2)), keys [T, di]; out [T].
inline void index_score_row(float const* q, float const* w, float const* keys, int64_t t_len, int64_t heads,
                            int64_t di, int64_t visible, float scale, float* out) {
  for (int64_t j = 0; j < t_len; ++j) {
    if (j >= visible) { out[j] = -INFINITY; continue; }
    float acc = 0.f;
    for (int64_t h = 0; h < heads; ++h) {
      float d = dot(q + h * di, keys + j * di, di);
      float r = d > 0.f ? d : 0.f;
      acc += (r * scale) * w[h];
    }
    out[j] = acc;
  }
}

/// Indices of the k best values with value > −inf, ordered by (value desc, index asc); `*cutoff_tie` is
/// set when a (k+1)-th finite value equals the k-th (the selection depended on the tie rule).
inline void topk_select(float const* v, int64_t n, int64_t k, std::vector<int32_t>& sel, bool* cutoff_tie) {
  sel.clear();
  std::vector<int32_t> idx;
  idx.reserve(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    if (v[j] > -INFINITY) idx.push_back(static_cast<int32_t>(j));
  auto better = [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  int64_t take = std::min<int64_t>(k, static_cast<int64_t>(idx.size()));
  if (cutoff_tie) *cutoff_tie = false;
  if (take < static_cast<int64_t>(idx.size())) {
    std::nth_element(idx.begin(), idx.begin() + take, idx.end(), better);
    std::sort(idx.begin(), idx.begin() + take, better);
    if (cutoff_tie && take > 0) {
      float kth = v[idx[take - 1]];
      for (size_t r = static_cast<size_t>(take); r < idx.size(); ++r)
        if (v[idx[r]] == kth) { *cutoff_tie = true; break; }
    }
  } else {
    std::sort(idx.begin(), idx.end(), better);
  }
  sel.assign(idx.begin(), idx.begin() + take);
}

/// Candidate entry mask [T] of one query (1 = inside a kept block); returns the cutoff-tie flag.
inline bool candidate_blocks_row(float const* scores, int64_t t_len, int64_t visible, int64_t block,
                                 int64_t topk_blocks, uint8_t* mask) {
  int64_t nb = (t_len + block - 1) / block;
  std::vector<float> bs(static_cast<size_t>(nb), -INFINITY);
  for (int64_t j = 0; j < t_len; ++j) bs[j / block] = std::max(bs[j / block], scores[j]);
  // The block holding the newest visible entry is pinned in; past the last block (visible > t_len) there
  // is nothing to pin, as in the reference's masked_fill over existing block indices.
  if (visible > 0 && (visible - 1) / block < nb) bs[(visible - 1) / block] = INFINITY;
  std::vector<int32_t> sel;
  bool tie = false;
  topk_select(bs.data(), nb, std::min(topk_blocks, nb), sel, &tie);
  std::fill(mask, mask + t_len, uint8_t{0});
  for (int32_t b : sel)
    for (int64_t j = b * block; j < std::min(t_len, (b + 1) * block); ++j) mask[j] = 1;
  return tie;
}

}  // namespace tessera::ref

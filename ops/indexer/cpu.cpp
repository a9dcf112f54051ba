// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the indexer family: ref/indexer_ref.hpp per query row.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu_common.hpp"
#include "tessera/ops/indexer.hpp"
#include "tessera/ref/indexer_ref.hpp"

namespace tessera::ops {

Status IndexScore<Backend::kCpu>::check(IndexScoreDesc const& d, IndexScoreArgs const& a) {
  TESSERA_CHECK(d.ratio >= 1, "index_score ratio must be >= 1");
  TESSERA_TRY(check_shape(a.q, {d.rows, d.heads * d.head_dim}, "index_score q"));
  TESSERA_TRY(check_shape(a.weights, {d.rows, d.heads}, "index_score weights"));
  TESSERA_TRY(check_index_score_keys(d, a));
  TESSERA_TRY(check_shape(a.positions, {d.rows}, "index_score positions"));
  return check_shape(a.scores, {d.rows, d.entries}, "index_score scores");
}

Status IndexScore<Backend::kCpu>::run(IndexScoreDesc const& d, IndexScoreArgs const& a, ExecContext& ctx) {
  int64_t const key_rows = a.keys.shape[0];
  for (int64_t r = 0; r < (a.key_base.data ? d.rows : 0); ++r) {
    int64_t const vis = std::min(ref::index_visible(a.positions(r), d.ratio), d.entries);
    if (vis > 0 && (a.key_base(r) < 0 || a.key_base(r) + vis > key_rows))
      return invalid_argument("index_score: row " + std::to_string(r) + " reads keys past the buffer");
  }
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float const* keys = a.keys.data + (a.key_base.data ? a.key_base(r) * d.head_dim : 0);
      ref::index_score_row(&a.q(r, 0), &a.weights(r, 0), keys, d.entries, d.heads, d.head_dim,
                           ref::index_visible(a.positions(r), d.ratio), d.scale, &a.scores(r, 0));
    }
  }, 4);
  return {};
}

Status CandidateBlocks<Backend::kCpu>::check(CandidateBlocksDesc const& d, CandidateBlocksArgs const& a) {
  TESSERA_CHECK(d.block_size >= 1 && d.topk_blocks >= 1 && d.ratio >= 1, "candidate_blocks sizes must be >= 1");
  TESSERA_TRY(check_shape(a.scores, {d.rows, d.entries}, "candidate_blocks scores"));
  TESSERA_TRY(check_shape(a.positions, {d.rows}, "candidate_blocks positions"));
  TESSERA_TRY(check_shape(a.mask, {d.rows, d.entries}, "candidate_blocks mask"));
  return check_shape(a.cutoff_tie, {d.rows}, "candidate_blocks cutoff_tie");
}

Status CandidateBlocks<Backend::kCpu>::run(CandidateBlocksDesc const& d, CandidateBlocksArgs const& a,
                                           ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      a.cutoff_tie(r) = ref::candidate_blocks_row(&a.scores(r, 0), d.entries, ref::index_visible(a.positions(r), d.ratio),
                                                  d.block_size, d.topk_blocks, &a.mask(r, 0));
  }, 4);
  return {};
}

Status IndexTopK<Backend::kCpu>::check(IndexTopKDesc const& d, IndexTopKArgs const& a) {
  TESSERA_CHECK(d.top_k >= 1, "index_topk top_k must be >= 1");
  TESSERA_TRY(check_shape(a.scores, {d.rows, d.entries}, "index_topk scores"));
  if (a.mask.data) TESSERA_TRY(check_shape(a.mask, {d.rows, d.entries}, "index_topk mask"));
  TESSERA_TRY(check_shape(a.selected, {d.rows, d.top_k}, "index_topk selected"));
  return check_shape(a.cutoff_tie, {d.rows}, "index_topk cutoff_tie");
}

Status IndexTopK<Backend::kCpu>::run(IndexTopKDesc const& d, IndexTopKArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    std::vector<int32_t> sel;
    for (int64_t r = b; r < e; ++r) {
      float* s = &a.scores(r, 0);
      if (a.mask.data)
        for (int64_t j = 0; j < d.entries; ++j)
          if (!a.mask(r, j)) s[j] = -INFINITY;
      bool tie = false;
      ref::topk_select(s, d.entries, d.top_k, sel, &tie);
      a.cutoff_tie(r) = tie;
      for (int64_t i = 0; i < d.top_k; ++i)
        a.selected(r, i) = i < static_cast<int64_t>(sel.size()) ? sel[static_cast<size_t>(i)] : -1;
    }
  }, 4);
  return {};
}

Status index_score(ExecContext& ctx, IndexScoreDesc const& d, IndexScoreArgs const& a) {
  return detail::dispatch_cpu<IndexScore>(ctx, d, a);
}
Status candidate_blocks(ExecContext& ctx, CandidateBlocksDesc const& d, CandidateBlocksArgs const& a) {
  return detail::dispatch_cpu<CandidateBlocks>(ctx, d, a);
}
Status index_topk(ExecContext& ctx, IndexTopKDesc const& d, IndexTopKArgs const& a) {
  return detail::dispatch_cpu<IndexTopK>(ctx, d, a);
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the attention family: ref/attention_ref.hpp per query row over its listed keys.
#include <vector>

#include "ops/cpu_common.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/ref/attention_ref.hpp"

namespace tessera::ops {

Status Attention<Backend::kCpu>::check(AttentionDesc const& d, AttentionArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.q, {d.rows, d.heads * d.head_dim}, "attention q"));
  TESSERA_TRY(check_shape(a.keys, {d.num_keys, d.head_dim}, "attention keys"));
  bool const ends = a.row_ends.data != nullptr;
  TESSERA_TRY(check_shape(a.row_offsets, {ends ? d.rows : d.rows + 1}, "attention row_offsets"));
  if (ends) TESSERA_TRY(check_shape(a.row_ends, {d.rows}, "attention row_ends"));
  TESSERA_TRY(check_shape(a.sinks, {d.heads}, "attention sinks"));
  TESSERA_TRY(check_shape(a.out, {d.rows, d.heads * d.head_dim}, "attention out"));
  int64_t nnz = ends ? a.key_ids.shape[0] : a.row_offsets(d.rows);
  TESSERA_TRY(check_shape(a.key_ids, {nnz}, "attention key_ids"));
  auto const first = [&](int64_t r) { return a.row_offsets(r); };
  auto const last_end = [&](int64_t r) { return ends ? a.row_ends(r) : a.row_offsets(r + 1); };
  if (a.probs.data) TESSERA_TRY(check_shape(a.probs, {d.heads, nnz}, "attention probs"));
  TESSERA_CHECK(!a.key_cols.data == !a.sink_cols.data, "attention key_cols and sink_cols come together");
  if (a.key_cols.data) {
    TESSERA_TRY(check_shape(a.key_cols, {nnz}, "attention key_cols"));
    TESSERA_TRY(check_shape(a.sink_cols, {d.rows}, "attention sink_cols"));
    for (int64_t r = 0; r < d.rows; ++r) {
      int64_t last = -1;
      for (int64_t i = first(r); i < last_end(r); ++i) {
        TESSERA_CHECK(a.key_cols(i) > last, "attention key_cols must increase within a row");
        last = a.key_cols(i);
      }
      TESSERA_CHECK(a.sink_cols(r) > last, "attention sink column must follow the row's key columns");
    }
  }
  TESSERA_CHECK(d.max_row_keys >= 0, "attention max_row_keys must be non-negative");
  for (int64_t r = 0; r < d.rows; ++r) {
    TESSERA_CHECK(first(r) <= last_end(r), ends ? "attention row_offsets must not exceed row_ends"
                                                : "attention row_offsets must be non-decreasing");
    TESSERA_CHECK(first(r) >= 0 && last_end(r) <= nnz, "attention row " + std::to_string(r) + " lists keys past key_ids");
    TESSERA_CHECK(d.max_row_keys == 0 || last_end(r) - first(r) <= d.max_row_keys,
                  "attention row " + std::to_string(r) + " lists more keys than max_row_keys " +
                      std::to_string(d.max_row_keys));
    for (int64_t i = first(r); i < last_end(r); ++i)
      TESSERA_CHECK(a.key_ids(i) >= 0 && a.key_ids(i) < d.num_keys, "attention key id out of range");
  }
  return {};
}

Status Attention<Backend::kCpu>::run(AttentionDesc const& d, AttentionArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    std::vector<float const*> keys;
    std::vector<float> scratch;
    for (int64_t r = b; r < e; ++r) {
      int64_t k0 = a.row_offsets(r), k1 = a.row_ends.data ? a.row_ends(r) : a.row_offsets(r + 1);
      keys.resize(static_cast<size_t>(k1 - k0));
      for (int64_t i = k0; i < k1; ++i) keys[i - k0] = &a.keys(a.key_ids(i), 0);
      scratch.resize(keys.size() + 1);
      ref::attention_row(&a.q(r, 0), keys.data(), k1 - k0, a.sinks.data, d.heads, d.head_dim, d.scale, d.md,
                         &a.out(r, 0), scratch.data(), a.probs.data ? &a.probs(0, k0) : nullptr,
                         a.probs.data ? a.probs.stride[0] : 0, a.key_cols.data ? &a.key_cols(k0) : nullptr,
                         a.sink_cols.data ? a.sink_cols(r) : -1);
    }
  }, 2);
  return {};
}

Status attention(ExecContext& ctx, AttentionDesc const& d, AttentionArgs const& a) {
  return detail::dispatch_cpu<Attention>(ctx, d, a);
}

}  // namespace tessera::ops

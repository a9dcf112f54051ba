// SPDX-License-Identifier: Apache-2.0
/// AttentionKeyList (spec/deepseek-v41.md §2.5.5): the per-row key lists the attention family consumes
/// (CSR: key_ids[row_offsets[r] .. row_offsets[r+1])), over the key pool [n_old cached window entries |
/// the chunk's rows | the compressed entries]. Row r at position p lists, in this order,
///   the cached window entries i with old_pos[i] > p − W        (ids i, ring order),
///   the chunk rows j ≤ r with pos[j] > p − W                    (ids n_old + j),
///   the compressed entries e its top-k selected with 0 ≤ e < entries, ascending (ids n_old + rows + e).
/// `selected` is IndexTopK's output (value-desc order, −1 padded); top_k = 0 means no compressed part.
/// This is the loop of the CPU model's attention block, so the key order (and hence the summation order
/// of the attention) is the same on both backends. The CPU functor is defined here (plain loops); the
/// CUDA functor (kernels/attention/attention_keys_cuda.cu) builds the lists on the device from the
/// device-resident top-k, without a host round trip.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <vector>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct AttentionKeyListDesc {
  int64_t rows = 0, n_old = 0, window = 1, entries = 0, top_k = 0;
  friend bool operator==(AttentionKeyListDesc const&, AttentionKeyListDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, AttentionKeyListDesc const& d) {
  return os << "AttentionKeyListDesc{ rows=" << d.rows << " n_old=" << d.n_old << " window=" << d.window
            << " entries=" << d.entries << " top_k=" << d.top_k << " }";
}

/// Upper bound of the number of listed keys: each row lists at most min(n_old + rows, W) window keys and
/// top_k compressed ones. key_ids must hold at least this many.
inline int64_t attention_key_capacity(AttentionKeyListDesc const& d) {
  return d.rows * (std::min(d.n_old + d.rows, d.window) + d.top_k);
}

struct AttentionKeyListArgs {
  TensorView<int64_t const, 1> old_pos;   // [n_old] positions of the cached window entries
  TensorView<int64_t const, 1> pos;       // [rows] positions of the chunk's rows, strictly increasing
  TensorView<int32_t const, 2> selected;  // [rows, top_k] IndexTopK output, or empty when top_k = 0
  TensorView<int64_t, 1> row_offsets;     // [rows + 1] out
  TensorView<int32_t, 1> key_ids;         // [≥ attention_key_capacity] out (the tail past nnz is unused)
};

inline Status check_attention_key_list(AttentionKeyListDesc const& d, AttentionKeyListArgs const& a) {
  TESSERA_CHECK(d.rows >= 0 && d.n_old >= 0 && d.window >= 1 && d.entries >= 0 && d.top_k >= 0,
                "attention_key_list: bad sizes in desc");
  TESSERA_CHECK(d.n_old + d.rows + d.entries < (int64_t{1} << 31), "attention_key_list: key pool too large");
  TESSERA_TRY(check_shape(a.old_pos, {d.n_old}, "attention_key_list old_pos"));
  TESSERA_TRY(check_shape(a.pos, {d.rows}, "attention_key_list pos"));
  if (d.top_k > 0) TESSERA_TRY(check_shape(a.selected, {d.rows, d.top_k}, "attention_key_list selected"));
  TESSERA_TRY(check_shape(a.row_offsets, {d.rows + 1}, "attention_key_list row_offsets"));
  TESSERA_TRY(check_shape(a.key_ids, {-1}, "attention_key_list key_ids"));
  TESSERA_CHECK(a.key_ids.shape[0] >= attention_key_capacity(d),
                "attention_key_list key_ids shorter than attention_key_capacity(desc)");
  return {};
}

template <Backend B> struct AttentionKeyList;
template <> struct AttentionKeyList<Backend::kCpu> {
  static Status check(AttentionKeyListDesc const& d, AttentionKeyListArgs const& a) {
    return check_attention_key_list(d, a);
  }
  static Status run(AttentionKeyListDesc const& d, AttentionKeyListArgs const& a, ExecContext&) {
    int64_t n = 0;
    std::vector<int32_t> sel;
    a.row_offsets(0) = 0;
    for (int64_t r = 0; r < d.rows; ++r) {
      int64_t const p = a.pos(r);
      for (int64_t i = 0; i < d.n_old; ++i)
        if (a.old_pos(i) > p - d.window) a.key_ids(n++) = static_cast<int32_t>(i);
      for (int64_t j = 0; j <= r; ++j)
        if (a.pos(j) > p - d.window) a.key_ids(n++) = static_cast<int32_t>(d.n_old + j);
      sel.clear();
      for (int64_t i = 0; i < d.top_k; ++i)
        if (a.selected(r, i) >= 0 && a.selected(r, i) < d.entries) sel.push_back(a.selected(r, i));
      std::sort(sel.begin(), sel.end());
      for (int32_t e : sel) a.key_ids(n++) = static_cast<int32_t>(d.n_old + d.rows + e);
      a.row_offsets(r + 1) = n;
    }
    return {};
  }
};
static_assert(BackendOp<AttentionKeyList<Backend::kCpu>, AttentionKeyListDesc, AttentionKeyListArgs>);

/// CUDA backend: one block computes every row's count and the offsets (row r's chunk part scans only
/// j > r − W, exact when `pos` is strictly increasing), then one block per row writes its ids (the top-k
/// part sorted ascending in shared memory; top_k ≤ kAttentionKeyListTopKMax).
inline constexpr int64_t kAttentionKeyListTopKMax = 8192;
template <> struct AttentionKeyList<Backend::kCuda> {
  static Status check(AttentionKeyListDesc const&, AttentionKeyListArgs const&);
  static Status run(AttentionKeyListDesc const&, AttentionKeyListArgs const&, ExecContext&);
};

}  // namespace tessera::ops

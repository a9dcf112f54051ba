// SPDX-License-Identifier: Apache-2.0
/// Indexer family (spec/deepseek-v41.md §2.5.4): IndexScore (ReLU-weighted multi-head scores with the
/// absolute-position visibility j < (pos+1)//r), CandidateBlocks (block maxima, the query's newest block
/// forced in, top blocks kept) and IndexTopK (the K best finite scores). Exact ties at a cutoff resolve
/// to the lower index (ref/indexer_ref.hpp states the evidence); every row reports whether it met one.
#pragma once

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct IndexScoreDesc {
  int64_t rows = 0, heads = 0, head_dim = 0, entries = 0, ratio = 1;
  float scale = 0.f;  // di^(−1/2)
  friend bool operator==(IndexScoreDesc const&, IndexScoreDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, IndexScoreDesc const& d) {
  return os << "IndexScoreDesc{"
            << " rows=" << d.rows
            << " heads=" << d.heads
            << " head_dim=" << d.head_dim
            << " entries=" << d.entries
            << " ratio=" << d.ratio
            << " scale=" << d.scale << " }";
}

/// Several sequences in one call (key_base): row r scores keys key_base[r] + j for j < its visible count
/// (pos_r + 1) // ratio, which the caller keeps within that row's sequence's keys; `entries` is then the row length
/// of scores (the longest sequence's), and j ≥ the visible count is −inf as always. The CUDA backend runs such a
/// call on its per-row kernel (decode-sized rows); the values are the same either way.
struct IndexScoreArgs {
  TensorView<float const, 2> q;           // [rows, heads·head_dim] after RoPE and FP4
  TensorView<float const, 2> weights;     // [rows, heads] = f32(weights_proj(x))·Hi^(−1/2)
  TensorView<float const, 2> keys;        // [entries, head_dim], or [any, head_dim] with key_base
  TensorView<int64_t const, 1> positions; // [rows]
  TensorView<float, 2> scores;            // [rows, entries]; −inf where invisible
  TensorView<int64_t const, 1> key_base;  // [rows] or empty (every row: keys row 0 on)
};

struct CandidateBlocksDesc {
  int64_t rows = 0, entries = 0, ratio = 1, block_size = 8, topk_blocks = 1;
  friend bool operator==(CandidateBlocksDesc const&, CandidateBlocksDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, CandidateBlocksDesc const& d) {
  return os << "CandidateBlocksDesc{"
            << " rows=" << d.rows
            << " entries=" << d.entries
            << " ratio=" << d.ratio
            << " block_size=" << d.block_size
            << " topk_blocks=" << d.topk_blocks << " }";
}

struct CandidateBlocksArgs {
  TensorView<float const, 2> scores;      // [rows, entries]
  TensorView<int64_t const, 1> positions; // [rows]
  TensorView<uint8_t, 2> mask;            // [rows, entries] 1 = candidate
  TensorView<uint8_t, 1> cutoff_tie;      // [rows] 1 = an exact tie at the block cutoff
};

struct IndexTopKDesc {
  int64_t rows = 0, entries = 0, top_k = 1;
  friend bool operator==(IndexTopKDesc const&, IndexTopKDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, IndexTopKDesc const& d) {
  return os << "IndexTopKDesc{"
            << " rows=" << d.rows
            << " entries=" << d.entries
            << " top_k=" << d.top_k << " }";
}

struct IndexTopKArgs {
  TensorView<float, 2> scores;            // [rows, entries]; entries outside `mask` are set to −inf first
  TensorView<uint8_t const, 2> mask;      // [rows, entries] candidate mask, or empty
  TensorView<int32_t, 2> selected;        // [rows, top_k] entry ids (value desc, id asc), −1 padded
  TensorView<uint8_t, 1> cutoff_tie;      // [rows]
};

template <Backend B> struct IndexScore;
template <Backend B> struct CandidateBlocks;
template <Backend B> struct IndexTopK;
template <> struct IndexScore<Backend::kCpu> {
  static Status check(IndexScoreDesc const&, IndexScoreArgs const&);
  static Status run(IndexScoreDesc const&, IndexScoreArgs const&, ExecContext&);
};
template <> struct CandidateBlocks<Backend::kCpu> {
  static Status check(CandidateBlocksDesc const&, CandidateBlocksArgs const&);
  static Status run(CandidateBlocksDesc const&, CandidateBlocksArgs const&, ExecContext&);
};
template <> struct IndexTopK<Backend::kCpu> {
  static Status check(IndexTopKDesc const&, IndexTopKArgs const&);
  static Status run(IndexTopKDesc const&, IndexTopKArgs const&, ExecContext&);
};
static_assert(BackendOp<IndexScore<Backend::kCpu>, IndexScoreDesc, IndexScoreArgs>);

// CUDA backend (kernels/indexer/indexer_cuda.cu, CUDA builds only): views in device memory. IndexScore is
// bit-equal to the CPU backend (no transcendental); CandidateBlocks and IndexTopK select exactly the same
// sets, in the same order, with the same lower-index-wins tie rule and the same cutoff-tie flags.
template <> struct IndexScore<Backend::kCuda> {
  static Status check(IndexScoreDesc const&, IndexScoreArgs const&);
  static Status run(IndexScoreDesc const&, IndexScoreArgs const&, ExecContext&);
};
template <> struct CandidateBlocks<Backend::kCuda> {
  static Status check(CandidateBlocksDesc const&, CandidateBlocksArgs const&);
  static Status run(CandidateBlocksDesc const&, CandidateBlocksArgs const&, ExecContext&);
};
/// top_k ≤ kIndexTopKCudaMax (the selected entries are sorted in shared memory).
inline constexpr int64_t kIndexTopKCudaMax = 8192;
template <> struct IndexTopK<Backend::kCuda> {
  static Status check(IndexTopKDesc const&, IndexTopKArgs const&);
  static Status run(IndexTopKDesc const&, IndexTopKArgs const&, ExecContext&);
};

/// The keys' shape, shared by both backends: [entries, head_dim]; with key_base [any, head_dim] and key_base [rows].
inline Status check_index_score_keys(IndexScoreDesc const& d, IndexScoreArgs const& a) {
  if (a.key_base.data == nullptr) return check_shape(a.keys, {d.entries, d.head_dim}, "index_score keys");
  TESSERA_TRY(check_shape(a.key_base, {d.rows}, "index_score key_base"));
  if (!a.keys.is_contiguous()) return invalid_argument("index_score: keys read through key_base must be contiguous");
  return check_shape(a.keys, {a.keys.shape[0], d.head_dim}, "index_score keys");
}

Status index_score(ExecContext&, IndexScoreDesc const&, IndexScoreArgs const&);
Status candidate_blocks(ExecContext&, CandidateBlocksDesc const&, CandidateBlocksArgs const&);
Status index_topk(ExecContext&, IndexTopKDesc const&, IndexTopKArgs const&);

}  // namespace tessera::ops

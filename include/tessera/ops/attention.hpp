// SPDX-License-Identifier: Apache-2.0
/// CSA2 attention family (spec/deepseek-v41.md §2.5.5): shared K=V latent, per-head sinks, softmax in fp32
/// with the logits, probabilities and output rounded to md. Each query row attends the key rows listed
/// for it (CSR: key_ids[row_offsets[r] .. row_offsets[r+1])): its visible window entries in position
/// order, then its selected compressed entries in entry order. Masked keys are simply absent (they
/// contribute exactly 0 in the reference). In bf16 the optional key_cols / sink_cols place each listed key and
/// each row's sink in the golden engine's logit row (its softmax sums by column lanes, its P·V walks columns in
/// 16-wide tensor-core blocks); fp32 ignores them. bf16 reads q and the keys as bf16 values (→bf16, the operands
/// of a tensor-core GEMM; the model's are bf16 values). Reference: ref/attention_ref.hpp.
#pragma once

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct AttentionDesc {
  int64_t rows = 0, heads = 0, head_dim = 0, num_keys = 0;
  float scale = 0.f;  // hd^(−1/2)
  DType md = DType::kF32;
  /// A bound on every row's listed keys (0: none given). A row listing more is an error (CPU) or poisoned with
  /// NaN (CUDA). With a bound ≤ 1024 the CUDA backend runs bf16 on the tensor cores (attention_tc.cuh).
  int64_t max_row_keys = 0;
  friend bool operator==(AttentionDesc const&, AttentionDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, AttentionDesc const& d) {
  return os << "AttentionDesc{"
            << " rows=" << d.rows
            << " heads=" << d.heads
            << " head_dim=" << d.head_dim
            << " num_keys=" << d.num_keys
            << " scale=" << d.scale
            << " md=" << dtype_name(d.md)
            << " max_row_keys=" << d.max_row_keys << " }";
}

struct AttentionArgs {
  TensorView<float const, 2> q;             // [rows, heads·head_dim]
  TensorView<float const, 2> keys;          // [num_keys, head_dim]  K = V
  TensorView<int64_t const, 1> row_offsets; // [rows + 1]; with row_ends: [rows], each row's first listed key
  TensorView<int32_t const, 1> key_ids;     // [row_offsets[rows]], or with row_ends [≥ every row's end]
  TensorView<float const, 1> sinks;         // [heads] fp32
  TensorView<float, 2> out;                 // [rows, heads·head_dim]
  TensorView<float, 2> probs;               // optional [heads, row_offsets[rows]]: p per listed key
  TensorView<int32_t const, 1> key_cols;    // optional [row_offsets[rows]]: column of each listed key, increasing
                                            //   within a row (with sink_cols; absent: the listed order)
  TensorView<int32_t const, 1> sink_cols;   // optional [rows]: column of the row's sink, after its keys' columns
  /// Optional [rows]: row r lists key_ids[row_offsets[r], row_ends[r]) and the rows' ranges may leave unread
  /// slots between them (several independently built lists in one call, e.g. the sequences of a batch, each
  /// written at its own base); key_ids (and key_cols, probs) then span every row's range.
  TensorView<int64_t const, 1> row_ends;
};

template <Backend B> struct Attention;
template <> struct Attention<Backend::kCpu> {
  static Status check(AttentionDesc const&, AttentionArgs const&);
  static Status run(AttentionDesc const&, AttentionArgs const&, ExecContext&);
};
static_assert(BackendOp<Attention<Backend::kCpu>, AttentionDesc, AttentionArgs>);

/// CUDA backend (kernels/attention/attention_cuda.cu, CUDA builds only): every view in device memory
/// (device tag kCuda), the same arithmetic in the same order (fp32 bit-equal up to expf). `check` sees only
/// shapes (the CSR arrays stay on the device); a row whose offsets are inconsistent, or a key id out of
/// range, yields NaN in that row's output instead of a read out of bounds. `validate` copies the CSR arrays
/// to the host and runs the CPU backend's full check (tests, debugging).
template <> struct Attention<Backend::kCuda> {
  static Status check(AttentionDesc const&, AttentionArgs const&);
  static Status validate(AttentionDesc const&, AttentionArgs const&);
  static Status run(AttentionDesc const&, AttentionArgs const&, ExecContext&);
};

Status attention(ExecContext&, AttentionDesc const&, AttentionArgs const&);

}  // namespace tessera::ops

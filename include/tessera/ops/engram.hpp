// SPDX-License-Identifier: Apache-2.0
/// Engram family (spec/deepseek-v41.md §2.4): EngramHash (n-gram hash ids from look-back ids, stored
/// multipliers, primes and offsets), EngramGather (table rows → [rows, C·de]) and EngramGate (the
/// normalised signed-sqrt sigmoid gate and the residual write into every stream). No short conv.
/// Reference: ref/engram_ref.hpp.
#pragma once

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct EngramHashDesc {
  int64_t rows = 0, max_ngram = 4, heads = 1;
  friend bool operator==(EngramHashDesc const&, EngramHashDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, EngramHashDesc const& d) {
  return os << "EngramHashDesc{"
            << " rows=" << d.rows
            << " max_ngram=" << d.max_ngram
            << " heads=" << d.heads << " }";
}

struct EngramHashArgs {
  TensorView<int64_t const, 2> lookback;     // [rows, N] compressed ids (pad_c where blocked)
  TensorView<int64_t const, 1> multipliers;  // [N]
  TensorView<int64_t const, 1> primes;       // [(N−1)·He]
  TensorView<int64_t const, 1> offsets;      // [(N−1)·He]
  TensorView<int64_t, 2> ids;                // [rows, (N−1)·He]
};

struct EngramGatherDesc {
  int64_t rows = 0, columns = 0, table_rows = 0, head_dim = 0;
  friend bool operator==(EngramGatherDesc const&, EngramGatherDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, EngramGatherDesc const& d) {
  return os << "EngramGatherDesc{"
            << " rows=" << d.rows
            << " columns=" << d.columns
            << " table_rows=" << d.table_rows
            << " head_dim=" << d.head_dim << " }";
}

struct EngramGatherArgs {
  TensorView<int64_t const, 2> ids;   // [rows, columns]
  TensorView<float const, 2> table;   // [table_rows, head_dim]
  TensorView<float, 2> out;           // [rows, columns·head_dim]
};

struct EngramGateDesc {
  int64_t rows = 0, streams = 4, dim = 0;
  float eps = 1e-20f;
  DType md = DType::kF32;
  friend bool operator==(EngramGateDesc const&, EngramGateDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, EngramGateDesc const& d) {
  return os << "EngramGateDesc{"
            << " rows=" << d.rows
            << " streams=" << d.streams
            << " dim=" << d.dim
            << " eps=" << d.eps
            << " md=" << dtype_name(d.md) << " }";
}

struct EngramGateArgs {
  TensorView<float const, 2> x;   // [rows, n·D] streams
  TensorView<float const, 2> kv;  // [rows, (n+1)·D] = wkv(rows): n keys then the value
  TensorView<float const, 1> w;   // [n·D] q_weight ⊙ k_weight
  TensorView<float, 2> out;       // [rows, n·D]; may alias x
};

template <Backend B> struct EngramHash;
template <Backend B> struct EngramGather;
template <Backend B> struct EngramGate;
template <> struct EngramHash<Backend::kCpu> {
  static Status check(EngramHashDesc const&, EngramHashArgs const&);
  static Status run(EngramHashDesc const&, EngramHashArgs const&, ExecContext&);
};
template <> struct EngramGather<Backend::kCpu> {
  static Status check(EngramGatherDesc const&, EngramGatherArgs const&);
  static Status run(EngramGatherDesc const&, EngramGatherArgs const&, ExecContext&);
};
template <> struct EngramGate<Backend::kCpu> {
  static Status check(EngramGateDesc const&, EngramGateArgs const&);
  static Status run(EngramGateDesc const&, EngramGateArgs const&, ExecContext&);
};
static_assert(BackendOp<EngramGate<Backend::kCpu>, EngramGateDesc, EngramGateArgs>);

// CUDA backend: kernels/engram/engram_cuda.cu (builds with CUDA only). Views hold device memory; check()
// validates shapes only. A hash id outside the table gathers a NaN row (ids live on the device).
template <> struct EngramHash<Backend::kCuda> {
  static Status check(EngramHashDesc const&, EngramHashArgs const&);
  static Status run(EngramHashDesc const&, EngramHashArgs const&, ExecContext&);
};
template <> struct EngramGather<Backend::kCuda> {
  static Status check(EngramGatherDesc const&, EngramGatherArgs const&);
  static Status run(EngramGatherDesc const&, EngramGatherArgs const&, ExecContext&);
};
template <> struct EngramGate<Backend::kCuda> {
  static Status check(EngramGateDesc const&, EngramGateArgs const&);
  static Status run(EngramGateDesc const&, EngramGateArgs const&, ExecContext&);
};

Status engram_hash(ExecContext&, EngramHashDesc const&, EngramHashArgs const&);
Status engram_gather(ExecContext&, EngramGatherDesc const&, EngramGatherArgs const&);
Status engram_gate(ExecContext&, EngramGateDesc const&, EngramGateArgs const&);

}  // namespace tessera::ops

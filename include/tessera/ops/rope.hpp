// SPDX-License-Identifier: Apache-2.0
/// Partial interleaved RoPE family (spec/deepseek-v41.md §2.5.1): rotates the trailing rope_dim channels
/// of every head of every row by φ = f32(pos)·inv_freq (cos/sin →md), or by −φ when `inverse` (the
/// attention output). In place. Reference: ref/rope_ref.hpp.
#pragma once

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct RopeDesc {
  int64_t rows = 0, heads = 1, head_dim = 0, rope_dim = 0;
  bool inverse = false;
  DType md = DType::kF32;
  friend bool operator==(RopeDesc const&, RopeDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, RopeDesc const& d) {
  return os << "RopeDesc{"
            << " rows=" << d.rows
            << " heads=" << d.heads
            << " head_dim=" << d.head_dim
            << " rope_dim=" << d.rope_dim
            << " inverse=" << d.inverse
            << " md=" << dtype_name(d.md) << " }";
}

struct RopeArgs {
  TensorView<float, 2> x;                 // [rows, heads·head_dim], rotated in place
  TensorView<int64_t const, 1> positions; // [rows] absolute positions
  TensorView<float const, 1> inv_freq;    // [rope_dim/2]
};

template <Backend B> struct Rope;
template <> struct Rope<Backend::kCpu> {
  static Status check(RopeDesc const&, RopeArgs const&);
  static Status run(RopeDesc const&, RopeArgs const&, ExecContext&);
};
static_assert(BackendOp<Rope<Backend::kCpu>, RopeDesc, RopeArgs>);

// CUDA backend: kernels/rope/rope_cuda.cu (builds with CUDA only). Views hold device memory.
template <> struct Rope<Backend::kCuda> {
  static Status check(RopeDesc const&, RopeArgs const&);
  static Status run(RopeDesc const&, RopeArgs const&, ExecContext&);
};

Status rope(ExecContext&, RopeDesc const&, RopeArgs const&);

}  // namespace tessera::ops

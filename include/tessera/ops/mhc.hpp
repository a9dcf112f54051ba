// SPDX-License-Identifier: Apache-2.0
/// mHC family (spec/deepseek-v41.md §2.3): MhcMix (norm, projection, sigmoid pre/post, Sinkhorn comb),
/// MhcCollapse (→md(Σ_k pre_k·X_k)) and MhcExpand (→md(post_k·y + Σ_j C[j,k]·X_j)). Streams are stored
/// [rows, n·D], stream-major. Reference: ref/mhc_ref.hpp.
#pragma once

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct MhcMixDesc {
  int64_t rows = 0, streams = 4, dim = 0;
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f, norm_eps = 1e-20f;
  /// The model dtype: nothing is rounded to it (the mix is fp32), it selects exp's arithmetic (ref::exp_md).
  DType md = DType::kF32;
  friend bool operator==(MhcMixDesc const&, MhcMixDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, MhcMixDesc const& d) {
  return os << "MhcMixDesc{"
            << " rows=" << d.rows
            << " streams=" << d.streams
            << " dim=" << d.dim
            << " sinkhorn_iters=" << d.sinkhorn_iters
            << " hc_eps=" << d.hc_eps
            << " norm_eps=" << d.norm_eps
            << " md=" << dtype_name(d.md) << " }";
}

struct MhcMixArgs {
  TensorView<float const, 2> x;      // [rows, n·D]
  TensorView<float const, 2> fn;     // [(2+n)·n, n·D]
  TensorView<float const, 1> base;   // [(2+n)·n]
  TensorView<float const, 1> scale;  // [3]
  TensorView<float, 2> pre;          // [rows, n]
  TensorView<float, 2> post;         // [rows, n]
  TensorView<float, 2> comb;         // [rows, n·n], row j = input stream
};

struct MhcCollapseDesc {
  int64_t rows = 0, streams = 4, dim = 0;
  DType md = DType::kF32;
  friend bool operator==(MhcCollapseDesc const&, MhcCollapseDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, MhcCollapseDesc const& d) {
  return os << "MhcCollapseDesc{"
            << " rows=" << d.rows
            << " streams=" << d.streams
            << " dim=" << d.dim
            << " md=" << dtype_name(d.md) << " }";
}

struct MhcCollapseArgs {
  TensorView<float const, 2> x;    // [rows, n·D]
  TensorView<float const, 2> pre;  // [rows, n]
  TensorView<float, 2> out;        // [rows, D]
};

struct MhcExpandDesc {
  int64_t rows = 0, streams = 4, dim = 0;
  DType md = DType::kF32;
  friend bool operator==(MhcExpandDesc const&, MhcExpandDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, MhcExpandDesc const& d) {
  return os << "MhcExpandDesc{"
            << " rows=" << d.rows
            << " streams=" << d.streams
            << " dim=" << d.dim
            << " md=" << dtype_name(d.md) << " }";
}

struct MhcExpandArgs {
  TensorView<float const, 2> y;     // [rows, D] sublayer output
  TensorView<float const, 2> x;     // [rows, n·D] residual streams
  TensorView<float const, 2> post;  // [rows, n]
  TensorView<float const, 2> comb;  // [rows, n·n]
  TensorView<float, 2> out;         // [rows, n·D]; must not alias x
};

template <Backend B> struct MhcMix;
template <Backend B> struct MhcCollapse;
template <Backend B> struct MhcExpand;
template <> struct MhcMix<Backend::kCpu> {
  static Status check(MhcMixDesc const&, MhcMixArgs const&);
  static Status run(MhcMixDesc const&, MhcMixArgs const&, ExecContext&);
};
template <> struct MhcCollapse<Backend::kCpu> {
  static Status check(MhcCollapseDesc const&, MhcCollapseArgs const&);
  static Status run(MhcCollapseDesc const&, MhcCollapseArgs const&, ExecContext&);
};
template <> struct MhcExpand<Backend::kCpu> {
  static Status check(MhcExpandDesc const&, MhcExpandArgs const&);
  static Status run(MhcExpandDesc const&, MhcExpandArgs const&, ExecContext&);
};
static_assert(BackendOp<MhcMix<Backend::kCpu>, MhcMixDesc, MhcMixArgs>);

// CUDA backend: kernels/mhc/mhc_cuda.cu (builds with CUDA only). Views hold device memory.
template <> struct MhcMix<Backend::kCuda> {
  static Status check(MhcMixDesc const&, MhcMixArgs const&);
  static Status run(MhcMixDesc const&, MhcMixArgs const&, ExecContext&);
};
template <> struct MhcCollapse<Backend::kCuda> {
  static Status check(MhcCollapseDesc const&, MhcCollapseArgs const&);
  static Status run(MhcCollapseDesc const&, MhcCollapseArgs const&, ExecContext&);
};
template <> struct MhcExpand<Backend::kCuda> {
  static Status check(MhcExpandDesc const&, MhcExpandArgs const&);
  static Status run(MhcExpandDesc const&, MhcExpandArgs const&, ExecContext&);
};

Status mhc_mix(ExecContext&, MhcMixDesc const&, MhcMixArgs const&);
Status mhc_collapse(ExecContext&, MhcCollapseDesc const&, MhcCollapseArgs const&);
Status mhc_expand(ExecContext&, MhcExpandDesc const&, MhcExpandArgs const&);

}  // namespace tessera::ops

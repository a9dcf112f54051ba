// SPDX-License-Identifier: Apache-2.0
/// RMSNorm family (spec/deepseek-v41.md §2.2): weighted y = →md(w ⊙ →md(x·rsqrt(mean(x²)+eps))) and
/// unweighted y = x·rsqrt(mean(x²)+eps) (fp32), one statistic per row. Reference: ref/norm_ref.hpp.
#pragma once

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct RmsNormDesc {
  int64_t rows = 0, dim = 0;
  float eps = 1e-20f;
  bool weighted = true;
  DType md = DType::kF32;
  friend bool operator==(RmsNormDesc const&, RmsNormDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, RmsNormDesc const& d) {
  return os << "RmsNormDesc{"
            << " rows=" << d.rows
            << " dim=" << d.dim
            << " eps=" << d.eps
            << " weighted=" << d.weighted
            << " md=" << dtype_name(d.md) << " }";
}

struct RmsNormArgs {
  TensorView<float const, 2> x;       // [rows, dim]
  TensorView<float const, 1> weight;  // [dim]; unused when !weighted
  TensorView<float, 2> y;             // [rows, dim]; may alias x
};

template <Backend B> struct RmsNorm;
template <> struct RmsNorm<Backend::kCpu> {
  static Status check(RmsNormDesc const&, RmsNormArgs const&);
  static Status run(RmsNormDesc const&, RmsNormArgs const&, ExecContext&);
};
static_assert(BackendOp<RmsNorm<Backend::kCpu>, RmsNormDesc, RmsNormArgs>);

// CUDA backend: kernels/norm/norm_cuda.cu (builds with CUDA only). Views hold device memory.
template <> struct RmsNorm<Backend::kCuda> {
  static Status check(RmsNormDesc const&, RmsNormArgs const&);
  static Status run(RmsNormDesc const&, RmsNormArgs const&, ExecContext&);
};

Status rms_norm(ExecContext&, RmsNormDesc const&, RmsNormArgs const&);

}  // namespace tessera::ops

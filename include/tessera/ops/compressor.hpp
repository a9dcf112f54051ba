// SPDX-License-Identifier: Apache-2.0
/// Compressor family (spec/deepseek-v41.md §2.5.3): softmax-gated pooling of complete groups of `ratio`
/// tokens, fp32, latent →md (pre-RoPE, pre-norm). Partial groups are the caller's buffer; ratio 1 needs
/// no pooling. Reference: ref/compressor_ref.hpp.
#pragma once

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct CompressPoolDesc {
  int64_t groups = 0, ratio = 2, dim = 0;
  DType md = DType::kF32;
  friend bool operator==(CompressPoolDesc const&, CompressPoolDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, CompressPoolDesc const& d) {
  return os << "CompressPoolDesc{"
            << " groups=" << d.groups
            << " ratio=" << d.ratio
            << " dim=" << d.dim
            << " md=" << dtype_name(d.md) << " }";
}

struct CompressPoolArgs {
  TensorView<float const, 2> kv;    // [groups·ratio, dim] fp32 a_t = x·W_kvᵀ
  TensorView<float const, 2> gate;  // [groups·ratio, dim] fp32 g_t = x·W_gateᵀ
  TensorView<float, 2> out;         // [groups, dim]
};

template <Backend B> struct CompressPool;
template <> struct CompressPool<Backend::kCpu> {
  static Status check(CompressPoolDesc const&, CompressPoolArgs const&);
  static Status run(CompressPoolDesc const&, CompressPoolArgs const&, ExecContext&);
};
static_assert(BackendOp<CompressPool<Backend::kCpu>, CompressPoolDesc, CompressPoolArgs>);

/// CUDA backend (kernels/compressor/compressor_cuda.cu, CUDA builds only): views in device memory, the
/// reference's arithmetic per (group, channel) in the same order (fp32 bit-equal up to expf).
template <> struct CompressPool<Backend::kCuda> {
  static Status check(CompressPoolDesc const&, CompressPoolArgs const&);
  static Status run(CompressPoolDesc const&, CompressPoolArgs const&, ExecContext&);
};

Status compress_pool(ExecContext&, CompressPoolDesc const&, CompressPoolArgs const&);

}  // namespace tessera::ops

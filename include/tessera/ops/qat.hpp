// SPDX-License-Identifier: Apache-2.0
/// QAT fake-quantiser family (spec/deepseek-v41.md Appendix B): FP8 block 32 with ue8m0 scales (window
/// KV), FP4 block 16 with e4m3 scales (compressed KV), FP4 block 32 with ue8m0 scales (indexer q/k).
/// In place, per row; a row whose width is not a multiple of the block is left unchanged.
/// Reference: ref/qat_ref.hpp.
#pragma once

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

/// Which quantiser: FP8 block 32 ue8m0 (B.1), FP4 block 16 e4m3 scale (B.2), FP4 block 32 ue8m0 (B.3).
enum class QatKind : uint8_t { kFp8Block32, kFp4Block16E4m3, kFp4Block32Ue8m0 };

struct FakeQuantDesc {
  int64_t rows = 0, dim = 0;
  QatKind kind = QatKind::kFp8Block32;
  DType md = DType::kF32;
  int boundary_ulps = 0;  // > 0: report rows with an input within this many ulps of a rounding boundary
  friend bool operator==(FakeQuantDesc const&, FakeQuantDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, FakeQuantDesc const& d) {
  return os << "FakeQuantDesc{"
            << " rows=" << d.rows
            << " dim=" << d.dim
            << " kind=" << static_cast<int>(d.kind)
            << " md=" << dtype_name(d.md)
            << " boundary_ulps=" << d.boundary_ulps << " }";
}

struct FakeQuantArgs {
  TensorView<float, 2> x;              // [rows, dim], quantised in place
  TensorView<uint8_t, 1> near_boundary; // [rows], written when desc.boundary_ulps > 0
};

template <Backend B> struct FakeQuant;
template <> struct FakeQuant<Backend::kCpu> {
  static Status check(FakeQuantDesc const&, FakeQuantArgs const&);
  static Status run(FakeQuantDesc const&, FakeQuantArgs const&, ExecContext&);
};
static_assert(BackendOp<FakeQuant<Backend::kCpu>, FakeQuantDesc, FakeQuantArgs>);

// CUDA backend: kernels/qat/qat_cuda.cu (builds with CUDA only). Views hold device memory.
template <> struct FakeQuant<Backend::kCuda> {
  static Status check(FakeQuantDesc const&, FakeQuantArgs const&);
  static Status run(FakeQuantDesc const&, FakeQuantArgs const&, ExecContext&);
};

Status fake_quant(ExecContext&, FakeQuantDesc const&, FakeQuantArgs const&);

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// QAT fake-quantiser family (spec/deepseek-v41.md Appendix B): FP8 block 32 with ue8m0 scales (window
/// KV), FP4 block 16 with e4m3 scales (compressed KV), FP4 block 32 with ue8m0 scales (indexer q/k).
/// In place, per row; a row whose width is not a multiple of the block is left unchanged. Optionally also
/// writes each row's packed form (codes + scale codes, ref::qat_pack_row's layout); QatUnpack turns packed
/// rows back into exactly the values the quantiser wrote (the compact decode state of the model).
/// Reference: ref/qat_ref.hpp.
#pragma once

#include <ostream>
#include <string>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

/// Which quantiser: FP8 block 32 ue8m0 (B.1), FP4 block 16 e4m3 scale (B.2), FP4 block 32 ue8m0 (B.3).
enum class QatKind : uint8_t { kFp8Block32, kFp4Block16E4m3, kFp4Block32Ue8m0 };

/// Bytes of one packed row of `dim` values: FP8 dim + dim/32, FP4 dim/2 + dim/block; 0 when dim is not a
/// multiple of the block (such rows are not quantised and have no packed form).
constexpr int64_t qat_packed_row_bytes(QatKind k, int64_t dim) {
  int64_t const block = k == QatKind::kFp4Block16E4m3 ? 16 : 32;
  if (dim <= 0 || dim % block != 0) return 0;
  return (k == QatKind::kFp8Block32 ? dim : dim / 2) + dim / block;
}

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
  TensorView<float, 2> x;              // [rows, dim], quantised in place (contiguous rows on CUDA)
  TensorView<uint8_t, 1> near_boundary; // [rows], written when desc.boundary_ulps > 0
  TensorView<uint8_t, 2> packed;       // [rows, qat_packed_row_bytes], contiguous; written when non-empty
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

/// out[i] = the quantiser's output for packed row row_ids[i] (identity when row_ids is empty): element e =
/// →md(value(code_e) · scale(code of e's block)), bit for bit what FakeQuant wrote. A row id outside
/// [0, src_rows) gives a row of zeros (unused slots of a gather table).
struct QatUnpackDesc {
  int64_t rows = 0, dim = 0, src_rows = 0;
  QatKind kind = QatKind::kFp8Block32;
  DType md = DType::kF32;
  friend bool operator==(QatUnpackDesc const&, QatUnpackDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, QatUnpackDesc const& d) {
  return os << "QatUnpackDesc{ rows=" << d.rows << " dim=" << d.dim << " src_rows=" << d.src_rows
            << " kind=" << static_cast<int>(d.kind) << " md=" << dtype_name(d.md) << " }";
}

/// The packed rows come contiguous (`packed`) or paged (`pages`, e.g. a sequence's decode state): row e at
/// pages[e / rows_per_page] + (e % rows_per_page) · qat_packed_row_bytes. Several sequences' paged rows unpack in
/// one call through one table holding their page tables back to back (a sequence whose table starts at page P
/// has its row e at id P·rows_per_page + e) with row_ids, and out_rows scatters the results (e.g. into each
/// sequence's part of a pass-wide key pool).
struct QatUnpackArgs {
  TensorView<uint8_t const, 2> packed;   // [src_rows, qat_packed_row_bytes], contiguous; empty when paged
  TensorView<int32_t const, 1> row_ids;  // [rows] or empty (then src_rows == rows)
  TensorView<float, 2> out;              // [rows, dim] (or [any, dim] with out_rows), contiguous
  uint8_t const* const* pages = nullptr; // [⌈src_rows / rows_per_page⌉] page addresses (backend memory), or null
  int64_t rows_per_page = 0;
  /// [rows] or empty: result row i goes to out row out_rows[i]; an id outside [0, out rows) writes nothing.
  TensorView<int32_t const, 1> out_rows;
};

template <Backend B> struct QatUnpack;
template <> struct QatUnpack<Backend::kCpu> {
  static Status check(QatUnpackDesc const&, QatUnpackArgs const&);
  static Status run(QatUnpackDesc const&, QatUnpackArgs const&, ExecContext&);
};
static_assert(BackendOp<QatUnpack<Backend::kCpu>, QatUnpackDesc, QatUnpackArgs>);
template <> struct QatUnpack<Backend::kCuda> {
  static Status check(QatUnpackDesc const&, QatUnpackArgs const&);
  static Status run(QatUnpackDesc const&, QatUnpackArgs const&, ExecContext&);
};

/// Shape checks shared by both backends.
inline Status check_fake_quant(FakeQuantDesc const& d, FakeQuantArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  if (d.boundary_ulps > 0) TESSERA_TRY(check_shape(a.near_boundary, {d.rows}, "fake_quant near_boundary"));
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "fake_quant x"));
  if (a.packed.data == nullptr) return {};
  int64_t const bytes = qat_packed_row_bytes(d.kind, d.dim);
  if (bytes == 0) return invalid_argument("fake_quant: a row of " + std::to_string(d.dim) + " values has no packed form");
  TESSERA_TRY(check_shape(a.packed, {d.rows, bytes}, "fake_quant packed"));
  if (!a.packed.is_contiguous()) return invalid_argument("fake_quant: packed rows must be contiguous");
  return {};
}

inline Status check_qat_unpack(QatUnpackDesc const& d, QatUnpackArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  int64_t const bytes = qat_packed_row_bytes(d.kind, d.dim);
  if (bytes == 0) return invalid_argument("qat_unpack: a row of " + std::to_string(d.dim) + " values has no packed form");
  if (d.rows < 0 || d.src_rows < 0) return invalid_argument("qat_unpack: negative row count");
  if (a.pages != nullptr) {
    if (a.packed.data != nullptr) return invalid_argument("qat_unpack: both contiguous and paged rows given");
    if (a.rows_per_page <= 0) return invalid_argument("qat_unpack: paged rows need rows_per_page > 0");
  } else {
    TESSERA_TRY(check_shape(a.packed, {d.src_rows, bytes}, "qat_unpack packed"));
    if (!a.packed.is_contiguous()) return invalid_argument("qat_unpack: packed rows must be contiguous");
  }
  if (a.out_rows.data != nullptr) {
    TESSERA_TRY(check_shape(a.out_rows, {d.rows}, "qat_unpack out_rows"));
    if (a.out.shape[1] != d.dim) return invalid_argument("qat_unpack: out rows of " + std::to_string(a.out.shape[1]) +
                                                       " values, expected " + std::to_string(d.dim));
  } else {
    TESSERA_TRY(check_shape(a.out, {d.rows, d.dim}, "qat_unpack out"));
  }
  if (!a.out.is_contiguous()) return invalid_argument("qat_unpack: out rows must be contiguous");
  if (a.row_ids.data == nullptr) {
    if (d.rows != d.src_rows) return invalid_argument("qat_unpack: without row ids, rows must equal src_rows");
  } else {
    TESSERA_TRY(check_shape(a.row_ids, {d.rows}, "qat_unpack row_ids"));
  }
  return {};
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the QAT fake quantisers (include/tessera/ops/qat.hpp, ref/qat_ref.hpp, spec Appendix B):
/// FP8 e4m3 with ue8m0 block-32 scales, FP4 e2m1 with e4m3 block-16 scales, FP4 with ue8m0 block-32
/// scales, in place, plus the optional near-rounding-boundary flag and packed form per row. One block per row,
/// one lane per element: max, the power-of-two / e4m3 scale, the true fp32 division, the clamp and the code
/// conversions of core/dtype.hpp are all exact operations, so the output is bitwise the reference's.
/// QatUnpack: one block per output row, one thread per element, the quantiser's own decode expression
/// (qat_decode_md), so unpacked rows equal the quantiser's output bit for bit.
#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/qat.hpp"

namespace tessera::kernels {

namespace {

using ops::QatKind;
using device::std_clamp;
using device::std_max;

/// The block scale of ref::qat_block_encode from the block's amax (max of |x| from +0; NaN never wins):
/// returns the scale, writes its code.
__device__ __forceinline__ float qat_scale(float amax, QatKind kind, uint8_t& scale_code) {
  if (kind == QatKind::kFp8Block32) {
    scale_code = e8m0_ceil_pow2(__fmul_rn(std_max(amax, 1e-4f), static_cast<float>(1.0 / 448.0)));
    return float_from_e8m0(scale_code);
  }
  if (kind == QatKind::kFp4Block16E4m3) {
    scale_code = fp8_e4m3_from_float(__fdiv_rn(std_max(amax, static_cast<float>(6.0 * 0x1p-9)), 6.f));
    return float_from_fp8_e4m3(scale_code);
  }
  scale_code = e8m0_ceil_pow2(__fmul_rn(std_max(amax, static_cast<float>(6.0 * 0x1p-126)), static_cast<float>(1.0 / 6.0)));
  return float_from_e8m0(scale_code);
}

/// One element's code under its block's scale (ref::qat_block_encode's per-element expression).
__device__ __forceinline__ uint8_t qat_code(float x, float scale, QatKind kind) {
  if (kind == QatKind::kFp8Block32) return fp8_e4m3_from_float_saturate(std_clamp(__fdiv_rn(x, scale), -448.f, 448.f));
  return fp4_e2m1_from_float(std_clamp(__fdiv_rn(x, scale), -6.f, 6.f));
}

/// ref::qat_block_encode on x[0, b) (b ≤ 32), by one thread.
__device__ void qat_block_encode(float const* x, int b, QatKind kind, uint8_t* codes, uint8_t& scale_code) {
  float amax = 0.f;
  for (int i = 0; i < b; ++i) amax = std_max(amax, fabsf(x[i]));
  float const scale = qat_scale(amax, kind, scale_code);
  for (int i = 0; i < b; ++i) codes[i] = qat_code(x[i], scale, kind);
}

/// ref::qat_decode then →md.
__device__ float qat_decode_md(uint8_t code, uint8_t scale_code, QatKind kind, bool bf16) {
  float v;
  if (kind == QatKind::kFp8Block32)
    v = __fmul_rn(float_from_fp8_e4m3(code), float_from_e8m0(scale_code));
  else
    v = __fmul_rn(float_from_fp4_e2m1_zero_unsigned(code),
                  kind == QatKind::kFp4Block16E4m3 ? float_from_fp8_e4m3(scale_code) : float_from_e8m0(scale_code));
  return device::round_md(v, bf16);
}

/// ref::qat_block_apply on x[0, b) (b ≤ 32) in place.
__device__ void qat_block_apply(float* x, int b, QatKind kind, bool bf16) {
  uint8_t codes[32], scale_code = 0;
  qat_block_encode(x, b, kind, codes, scale_code);
  for (int i = 0; i < b; ++i) x[i] = qat_decode_md(codes[i], scale_code, kind, bf16);
}

/// ref::qat_block_near_boundary.
__device__ bool qat_block_near_boundary(float const* x, int b, QatKind kind, bool bf16, int ulps) {
  float base[32], pert[32], amax = 0.f;
  for (int i = 0; i < b; ++i) amax = std_max(amax, fabsf(x[i]));
  float const delta = __fmul_rn(static_cast<float>(ulps), __fsub_rn(nextafterf(amax, INFINITY), amax));
  for (int i = 0; i < b; ++i) base[i] = x[i];
  qat_block_apply(base, b, kind, bf16);
  for (int i = 0; i < b; ++i)
    for (int s = 0; s < 2; ++s) {
      float const dir = s == 0 ? 1.f : -1.f;
      for (int j = 0; j < b; ++j) pert[j] = x[j];
      pert[i] = __fadd_rn(x[i], __fmul_rn(dir, delta));
      qat_block_apply(pert, b, kind, bf16);
      for (int j = 0; j < b; ++j)
        if (pert[j] != base[j]) return true;
    }
  return false;
}

struct QatParams {
  float* x = nullptr;             // [rows, dim], row stride dim
  uint8_t* near = nullptr;        // [rows] or null
  uint8_t* packed = nullptr;      // [rows, qat_packed_row_bytes] or null
  int64_t rows = 0, dim = 0;
  QatKind kind = QatKind::kFp8Block32;
  int block = 32, ulps = 0;
  bool bf16 = false;
};

/// One block per row. The quantisation itself: one lane per element, 32 / block quantisation blocks per warp
/// step; a block's amax is a max over its lanes (|x| with NaN taken as +0: the reference's sequential
/// std::max from +0 never lets a NaN win, and a max of non-NaN values is order-free), so every lane forms
/// the reference's scale and its own element's code. The boundary check (diagnostics, boundary_ulps > 0) runs
/// first, one thread per quantisation block, on the unquantised row.
constexpr int kQatThreads = 256;
__global__ void __launch_bounds__(kQatThreads) qat_kernel(QatParams const p) {
  device::pdl_enter();
  int64_t const row = blockIdx.x;
  float* x = p.x + row * p.dim;
  bool const whole = p.dim % p.block == 0;
  int64_t const nblk = whole ? p.dim / p.block : 0;
  if (p.near) {
    int near = 0;
    for (int64_t b = threadIdx.x; b < nblk && !near; b += blockDim.x)
      near = qat_block_near_boundary(x + b * p.block, p.block, p.kind, p.bf16, p.ulps);
    near = __syncthreads_or(near);  // also: every check has read the row before it is overwritten
    if (threadIdx.x == 0) p.near[row] = near ? 1 : 0;
  }
  bool const fp4 = p.kind != QatKind::kFp8Block32;
  int64_t const code_bytes = fp4 ? p.dim / 2 : p.dim;
  uint8_t* packed = p.packed ? p.packed + row * (code_bytes + nblk) : nullptr;
  int const lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  int const nwarps = static_cast<int>(blockDim.x >> 5), per = 32 / p.block;
  int const seg = lane / p.block, i = lane % p.block;
  for (int64_t b0 = static_cast<int64_t>(warp) * per; b0 < nblk; b0 += static_cast<int64_t>(nwarps) * per) {
    int64_t const b = b0 + seg;
    bool const ok = b < nblk;
    int64_t const e = b * p.block + i;
    float const v = ok ? x[e] : 0.f;
    float amax = fabsf(v);
    if (amax != amax) amax = 0.f;
    for (int h = p.block / 2; h > 0; h /= 2) amax = std_max(amax, __shfl_xor_sync(0xffffffffu, amax, h));
    uint8_t scale_code = 0;
    float const scale = qat_scale(amax, p.kind, scale_code);
    uint8_t const code = qat_code(v, scale, p.kind);
    unsigned const partner = __shfl_down_sync(0xffffffffu, static_cast<unsigned>(code), 1);
    if (!ok) continue;
    x[e] = qat_decode_md(code, scale_code, p.kind, p.bf16);
    if (!packed) continue;
    // ref::qat_pack_row's layout: [codes | scale codes]; FP4 blocks are even-sized, so a block owns whole bytes.
    if (!fp4) packed[e] = code;
    else if (i % 2 == 0) packed[e / 2] = static_cast<uint8_t>(code | (partner << 4));
    if (i == 0) packed[code_bytes + b] = scale_code;
  }
}

struct QatUnpackParams {
  uint8_t const* packed = nullptr;  // [src_rows, row_bytes], or null when paged
  uint8_t const* const* pages = nullptr;  // row e at pages[e / rows_per_page] + (e % rows_per_page)·row_bytes
  int64_t rows_per_page = 0;
  int32_t const* row_ids = nullptr; // [rows] or null (identity)
  int32_t const* out_rows = nullptr;  // [rows] or null (identity)
  float* out = nullptr;             // [out_total, dim]
  int64_t rows = 0, dim = 0, src_rows = 0, row_bytes = 0, out_total = 0;
  QatKind kind = QatKind::kFp8Block32;
  int block = 32;
  bool bf16 = false;
};

/// One block per output row, one thread per element (strided).
__global__ void __launch_bounds__(128) qat_unpack_kernel(QatUnpackParams const p) {
  device::pdl_enter();
  int64_t const row = blockIdx.x;
  int64_t const src = p.row_ids ? p.row_ids[row] : row;
  int64_t const dst = p.out_rows ? p.out_rows[row] : row;
  if (dst < 0 || dst >= p.out_total) return;
  float* out = p.out + dst * p.dim;
  if (src < 0 || src >= p.src_rows) {
    for (int64_t e = threadIdx.x; e < p.dim; e += blockDim.x) out[e] = 0.f;
    return;
  }
  uint8_t const* packed =
      p.pages ? p.pages[src / p.rows_per_page] + (src % p.rows_per_page) * p.row_bytes : p.packed + src * p.row_bytes;
  bool const fp4 = p.kind != QatKind::kFp8Block32;
  uint8_t const* scales = packed + (fp4 ? p.dim / 2 : p.dim);
  for (int64_t e = threadIdx.x; e < p.dim; e += blockDim.x) {
    uint8_t const code = fp4 ? static_cast<uint8_t>((packed[e / 2] >> (4 * (e % 2))) & 0xFu) : packed[e];
    out[e] = qat_decode_md(code, scales[e / p.block], p.kind, p.bf16);
  }
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<FakeQuant<Backend::kCuda>, FakeQuantDesc, FakeQuantArgs>);

static_assert(BackendOp<QatUnpack<Backend::kCuda>, QatUnpackDesc, QatUnpackArgs>);

Status FakeQuant<Backend::kCuda>::check(FakeQuantDesc const& d, FakeQuantArgs const& a) {
  TESSERA_TRY(check_fake_quant(d, a));
  if (!a.x.is_contiguous()) return invalid_argument("fake_quant: x rows must be contiguous on CUDA");
  return {};
}

Status FakeQuant<Backend::kCuda>::run(FakeQuantDesc const& d, FakeQuantArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  QatParams p;
  p.x = a.x.data;
  p.near = d.boundary_ulps > 0 ? a.near_boundary.data : nullptr;
  p.rows = d.rows; p.dim = d.dim; p.kind = d.kind;
  p.block = d.kind == QatKind::kFp4Block16E4m3 ? 16 : 32;
  p.ulps = d.boundary_ulps; p.bf16 = d.md == DType::kBf16;
  p.packed = a.packed.data;
  device::launch_pdl(qat_kernel, static_cast<unsigned>(d.rows), kQatThreads, 0, stream_of(ctx), p);
  return launch_status("qat_kernel");
}

Status QatUnpack<Backend::kCuda>::check(QatUnpackDesc const& d, QatUnpackArgs const& a) { return check_qat_unpack(d, a); }

Status QatUnpack<Backend::kCuda>::run(QatUnpackDesc const& d, QatUnpackArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  if (d.rows > 0x7FFFFFFF) return invalid_argument("qat_unpack: more than 2^31 − 1 rows");
  QatUnpackParams p;
  p.packed = a.packed.data;
  p.pages = a.pages;
  p.rows_per_page = a.rows_per_page;
  p.row_ids = a.row_ids.data;
  p.out_rows = a.out_rows.data;
  p.out = a.out.data;
  p.rows = d.rows; p.dim = d.dim; p.src_rows = d.src_rows; p.out_total = a.out.shape[0];
  p.row_bytes = qat_packed_row_bytes(d.kind, d.dim);
  p.kind = d.kind;
  p.block = d.kind == QatKind::kFp4Block16E4m3 ? 16 : 32;
  p.bf16 = d.md == DType::kBf16;
  device::launch_pdl(qat_unpack_kernel, static_cast<unsigned>(d.rows), 128, 0, stream_of(ctx), p);
  return launch_status("qat_unpack_kernel");
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the QAT fake quantisers (include/tessera/ops/qat.hpp, ref/qat_ref.hpp, spec Appendix B):
/// FP8 e4m3 with ue8m0 block-32 scales, FP4 e2m1 with e4m3 block-16 scales, FP4 with ue8m0 block-32
/// scales, in place, plus the optional near-rounding-boundary flag per row. One block per row, one thread
/// per quantisation block: max, the power-of-two / e4m3 scale, the true fp32 division, the clamp and the
/// code conversions of core/dtype.hpp are all exact operations, so the output is bitwise the reference's.
#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/qat.hpp"

namespace tessera::kernels {

namespace {

using ops::QatKind;
using device::std_clamp;
using device::std_max;

/// ref::qat_block_apply on x[0, b) (b ≤ 32) in place.
__device__ void qat_block_apply(float* x, int b, QatKind kind, bool bf16) {
  float amax = 0.f;
  for (int i = 0; i < b; ++i) amax = std_max(amax, fabsf(x[i]));
  if (kind == QatKind::kFp8Block32) {
    float const scale = pow2_ceil_bits(__fmul_rn(std_max(amax, 1e-4f), static_cast<float>(1.0 / 448.0)));
    for (int i = 0; i < b; ++i) {
      float const q = std_clamp(__fdiv_rn(x[i], scale), -448.f, 448.f);
      x[i] = device::round_md(__fmul_rn(float_from_fp8_e4m3(fp8_e4m3_from_float_saturate(q)), scale), bf16);
    }
    return;
  }
  float scale;
  if (kind == QatKind::kFp4Block16E4m3)
    scale = float_from_fp8_e4m3(fp8_e4m3_from_float(__fdiv_rn(std_max(amax, static_cast<float>(6.0 * 0x1p-9)), 6.f)));
  else
    scale = pow2_ceil_bits(__fmul_rn(std_max(amax, static_cast<float>(6.0 * 0x1p-126)), static_cast<float>(1.0 / 6.0)));
  for (int i = 0; i < b; ++i) {
    float const q = std_clamp(__fdiv_rn(x[i], scale), -6.f, 6.f);
    x[i] = device::round_md(__fmul_rn(float_from_fp4_e2m1_zero_unsigned(fp4_e2m1_from_float(q)), scale), bf16);
  }
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
  int64_t rows = 0, dim = 0;
  QatKind kind = QatKind::kFp8Block32;
  int block = 32, ulps = 0;
  bool bf16 = false;
};

__global__ void __launch_bounds__(128) qat_kernel(QatParams const p) {
  int64_t const row = blockIdx.x;
  float* x = p.x + row * p.dim;
  bool const whole = p.dim % p.block == 0;
  int64_t const nblk = whole ? p.dim / p.block : 0;
  int near = 0;
  if (p.near)
    for (int64_t b = threadIdx.x; b < nblk && !near; b += blockDim.x)
      near = qat_block_near_boundary(x + b * p.block, p.block, p.kind, p.bf16, p.ulps);
  if (p.near) {
    near = __syncthreads_or(near);
    if (threadIdx.x == 0) p.near[row] = near ? 1 : 0;
  }
  for (int64_t b = threadIdx.x; b < nblk; b += blockDim.x) {
    float v[32];
    float* src = x + b * p.block;
    for (int i = 0; i < p.block; ++i) v[i] = src[i];
    qat_block_apply(v, p.block, p.kind, p.bf16);
    for (int i = 0; i < p.block; ++i) src[i] = v[i];
  }
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<FakeQuant<Backend::kCuda>, FakeQuantDesc, FakeQuantArgs>);

Status FakeQuant<Backend::kCuda>::check(FakeQuantDesc const& d, FakeQuantArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  if (d.boundary_ulps > 0) TESSERA_TRY(check_shape(a.near_boundary, {d.rows}, "fake_quant near_boundary"));
  return check_shape(a.x, {d.rows, d.dim}, "fake_quant x");
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
  qat_kernel<<<static_cast<unsigned>(d.rows), 128, 0, stream_of(ctx)>>>(p);
  return launch_status("qat_kernel");
}

}  // namespace tessera::ops

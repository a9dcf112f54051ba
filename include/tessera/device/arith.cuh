// SPDX-License-Identifier: Apache-2.0
/// The device side of the CPU references' arithmetic convention (include/tessera/ref/common_ref.hpp):
/// every product and every sum rounded separately to fp32 (RNE), dot products accumulated sequentially
/// in index order from +0. nvcc contracts a·b + c into one FMA (one rounding) unless told otherwise, so
/// every value-path multiply-add of the op kernels goes through these helpers; changing the convention
/// (for example to FMA) is a change here and in ref::dot, nowhere else.
/// Also the host's std::max / std::min / std::clamp semantics (NaN propagation differs from fmaxf).
#pragma once

#include <cstdint>

#include "tessera/core/dtype.hpp"

namespace tessera::device {

/// acc + a·b with the product and the sum rounded separately: one step of ref::dot.
__device__ __forceinline__ float dot_step(float acc, float a, float b) { return __fadd_rn(acc, __fmul_rn(a, b)); }

/// An fp32 weight, or a bf16-stored one widened exactly.
__device__ __forceinline__ float load_w(float const* p) { return __ldg(p); }
__device__ __forceinline__ float load_w(Bf16 const* p) {
  return __uint_as_float(static_cast<uint32_t>(__ldg(reinterpret_cast<unsigned short const*>(p))) << 16);
}

/// ref::dot(a, b, n) for a in memory the caller reads directly and b a weight row.
template <class W>
__device__ __forceinline__ float dot_seq(float const* a, W const* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc = dot_step(acc, a[i], load_w(b + i));
  return acc;
}

/// "→md" of common_ref.hpp: identity for fp32, RNE to bf16 for bf16.
__device__ __forceinline__ float round_md(float x, bool bf16) { return bf16 ? round_to_bf16(x) : x; }

/// std::max / std::min / std::clamp exactly (a NaN in the second argument is dropped, in the first kept).
__device__ __forceinline__ float std_max(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float std_min(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float std_clamp(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

/// The fp32 activations of common_ref.hpp with CUDA's non-intrinsic expf/log1pf (≤ 2 ulp, not
/// correctly rounded like glibc's, so results agree with the CPU to a few ulps, not bitwise).
__device__ __forceinline__ float sigmoid(float x) { return __fdiv_rn(1.f, __fadd_rn(1.f, expf(-x))); }
__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.f, expf(-x))); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
/// 1/sqrt(x) as two correctly rounded operations (sqrtf and the division are IEEE without fast-math):
/// bitwise equal to ref::rsqrt.
__device__ __forceinline__ float rsqrt_ref(float x) { return __fdiv_rn(1.f, __fsqrt_rn(x)); }

/// rsqrt(mean(x²) + eps) of x[0, n) exactly as ref::rms_inv (sequential; call from one thread).
__device__ __forceinline__ float rms_inv_seq(float const* x, int64_t n, float eps) {
  float ss = 0.f;
#pragma unroll 8
  for (int64_t i = 0; i < n; ++i) ss = dot_step(ss, x[i], x[i]);
  return rsqrt_ref(__fadd_rn(__fdiv_rn(ss, static_cast<float>(n)), eps));
}

}  // namespace tessera::device

// The gpuattn families' spelling of the same step (same arithmetic).
namespace tessera::dev {
__device__ __forceinline__ float dot_step(float acc, float a, float b) { return __fadd_rn(acc, __fmul_rn(a, b)); }
}  // namespace tessera::dev

// SPDX-License-Identifier: Apache-2.0
/// The device side of the CPU references' arithmetic (include/tessera/ref/common_ref.hpp, norm_ref.hpp):
/// ref::dot's chunked FMA order (DotAcc, dot_seq), ref::dot_fma_seq's single FMA chain (fma_step),
/// separately rounded product-then-sum steps where the reference rounds both (dot_step), ref::lane_sum's
/// reduction order and the correctly rounded rsqrt. nvcc contracts a·b + c into one FMA unless told
/// otherwise, so every value-path multiply-add of the op kernels goes through these helpers.
/// Also the host's std::max / std::min / std::clamp semantics (NaN propagation differs from fmaxf).
#pragma once

#include <cstdint>

#include "tessera/core/cuda_math.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/fmath.hpp"
#include "tessera/core/tensor_core.hpp"

namespace tessera::device {

/// acc + a·b with the product and the sum rounded separately: one step of ref::dot.
__device__ __forceinline__ float dot_step(float acc, float a, float b) { return __fadd_rn(acc, __fmul_rn(a, b)); }

/// The dot-product order of ref::dot as chunks of kDotChunk consecutive indices, so a kernel that walks k
/// in 32-wide tiles can follow it: begin() at a chunk start, step() per index in order, end() at the chunk
/// end, value() at the end. The two switches describe ref::dot: kDotFma (one fused rounding per step
/// instead of a rounded product and a rounded sum) and kDotCarry (the running sum carries across chunks,
/// i.e. one sequential chain; otherwise each chunk starts from +0 and the chunk sums are added in order).
/// Today's ref::dot (the golden engine's SGEMM order): kDotFma = true, kDotCarry = false. A change of ref::dot to another chunked order is a
/// change of these constants (and kDotChunk) only.
inline constexpr int kDotChunk = 32;
inline constexpr bool kDotFma = true;
inline constexpr bool kDotCarry = false;

struct DotAcc {
  static constexpr bool kWholeChunk = false;  // fed one product at a time (begin/step/end)
  float total = 0.f, chunk = 0.f;
  bool first = true;
  __device__ __forceinline__ void begin() { chunk = kDotCarry ? total : 0.f; }
  __device__ __forceinline__ void step(float a, float b) { chunk = kDotFma ? __fmaf_rn(a, b, chunk) : dot_step(chunk, a, b); }
  __device__ __forceinline__ void end() {
    total = (kDotCarry || first) ? chunk : __fadd_rn(total, chunk);
    first = false;
  }
  __device__ __forceinline__ float value() const { return total; }
};

/// An fp32 weight, or a bf16-stored one widened exactly.
__device__ __forceinline__ float load_w(float const* p) { return __ldg(p); }
__device__ __forceinline__ float load_w(Bf16 const* p) {
  return __uint_as_float(static_cast<uint32_t>(__ldg(reinterpret_cast<unsigned short const*>(p))) << 16);
}

/// ref::dot(a, b, n) on one thread for a in memory the caller reads directly and b a weight row.
template <class W>
__device__ __forceinline__ float dot_seq(float const* a, W const* b, int64_t n) {
  DotAcc acc;
  for (int64_t c0 = 0; c0 < n; c0 += kDotChunk) {
    int64_t const c1 = c0 + kDotChunk < n ? c0 + kDotChunk : n;
    acc.begin();
    for (int64_t i = c0; i < c1; ++i) acc.step(a[i], load_w(b + i));
    acc.end();
  }
  return acc.value();
}

/// "→md" of common_ref.hpp: identity for fp32, RNE to bf16 for bf16.
__device__ __forceinline__ float round_md(float x, bool bf16) { return bf16 ? round_to_bf16(x) : x; }

/// std::max / std::min / std::clamp exactly (a NaN in the second argument is dropped, in the first kept).
__device__ __forceinline__ float std_max(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float std_min(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float std_clamp(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

/// ref::exp_md / log1p_md: bf16 takes the device's own expf (bitwise equal to ref::cuda_expf on sm_90) and the
/// libdevice log1pf replay (cuda_math::log1pf, the same IEEE operations as on the CPU); fp32 takes
/// fmath::exp_rn / log1p_rn (fp64 evaluation, one rounding), the same operations as the CPU's.
__device__ __forceinline__ float exp_md(float x, bool bf16) { return bf16 ? expf(x) : fmath::exp_rn(x); }
__device__ __forceinline__ float log1p_md(float x, bool bf16) { return bf16 ? cuda_math::log1pf(x) : fmath::log1p_rn(x); }

/// The activations of common_ref.hpp (sigmoid, SiLU, softplus) in the model dtype's arithmetic.
__device__ __forceinline__ float sigmoid(float x, bool bf16) { return __fdiv_rn(1.f, __fadd_rn(1.f, exp_md(-x, bf16))); }
__device__ __forceinline__ float silu(float x, bool bf16) { return __fdiv_rn(x, __fadd_rn(1.f, exp_md(-x, bf16))); }
__device__ __forceinline__ float softplus(float x, bool bf16) {
  return x > 20.f ? x : log1p_md(exp_md(x, bf16), bf16);
}
/// The fp32 forms (ref::sigmoid / silu / softplus of one argument).
__device__ __forceinline__ float sigmoid(float x) { return sigmoid(x, false); }
__device__ __forceinline__ float silu(float x) { return silu(x, false); }
__device__ __forceinline__ float softplus(float x) { return softplus(x, false); }

/// ref::warp_softmax_sum on one thread: add(col, v) in increasing column order, value() folds the 32 lanes by
/// halving.
struct WarpSoftmaxSum {
  float lane[32];
  __device__ __forceinline__ WarpSoftmaxSum() {
    for (int t = 0; t < 32; ++t) lane[t] = 0.f;
  }
  __device__ __forceinline__ void add(int64_t col, float v) { lane[col & 31] = __fadd_rn(lane[col & 31], v); }
  __device__ __forceinline__ float value() {
    for (int h = 16; h > 0; h /= 2)
      for (int t = 0; t < h; ++t) lane[t] = __fadd_rn(lane[t], lane[t + h]);
    return lane[0];
  }
};

/// The dot order of ref::gemm_dot for a bf16 output (ref::dot_tc, tc::BlockAcc) for the 32-wide tile walkers
/// (warp_dot_rows): chunk() takes one 32-wide tile column (len ≤ 32 operands starting at a multiple of 32, so
/// at a block boundary) and runs its two 16-product blocks as tc::block_step, two passes over the operands in
/// shared memory instead of BlockAcc's 16 buffered fp64 products per output. kWholeChunk tells the walkers to
/// call chunk() instead of begin()/step()/end().
struct TcDotAcc {
  static constexpr bool kWholeChunk = true;
  float acc = 0.f;
  template <class A, class B>
  __device__ __forceinline__ void chunk(int len, A const& a, B const& b) {
    for (int b0 = 0; b0 < len; b0 += tc::kBlock)
      acc = tc::block_step(acc, len - b0 < tc::kBlock ? len - b0 : tc::kBlock, [&](int i) { return a(b0 + i); },
                           [&](int i) { return b(b0 + i); });
  }
  __device__ __forceinline__ float value() const { return acc; }
};
/// ref::rsqrt is CUDA's rsqrtf (the golden engine's torch.rsqrt; the CPU replays the table measured on an
/// H200), so the device takes the hardware instruction itself: bitwise equal to ref::rsqrt on sm_90.
__device__ __forceinline__ float rsqrt_ref(float x) { return rsqrtf(x); }

/// ref::lane_sum: 32 lanes (4-wide vectors when n % 128 == 0) folded by halving; v(i) gives element i.
/// Sequential emulation for one thread (the statistic of one row).
template <class Elem>
__device__ __forceinline__ float lane_sum_seq(int64_t n, Elem&& v) {
  constexpr int kLanes = 32;
  int64_t const vec = n % (4 * kLanes) == 0 ? 4 : 1;
  float lane[kLanes];
  for (int t = 0; t < kLanes; ++t) {
    float comp[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t v0 = t * vec; v0 < n; v0 += kLanes * vec)
      for (int64_t c = 0; c < vec; ++c) comp[c] = __fadd_rn(comp[c], v(v0 + c));
    float a = comp[0];
    for (int64_t c = 1; c < vec; ++c) a = __fadd_rn(a, comp[c]);
    lane[t] = a;
  }
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int t = 0; t < h; ++t) lane[t] = __fadd_rn(lane[t], lane[t + h]);
  return lane[0];
}

/// rsqrt(mean(x²) + eps) of x[0, n) exactly as ref::rms_inv (sequential; call from one thread).
__device__ __forceinline__ float rms_inv_seq(float const* x, int64_t n, float eps) {
  float const ss = lane_sum_seq(n, [x](int64_t i) { return __fmul_rn(x[i], x[i]); });
  return rsqrt_ref(__fadd_rn(__fmul_rn(ss, __fdiv_rn(1.f, static_cast<float>(n))), eps));
}

/// One fused multiply-add step acc ← rn(a·b + acc) (ref::dot_fma_seq, the batched-GEMM order).
__device__ __forceinline__ float fma_step(float acc, float a, float b) { return __fmaf_rn(a, b, acc); }

/// Σ a[i]·b[i] as one sequential FMA chain (ref::dot_fma_seq) for one thread; `vec4` reads b as float4
/// (n a multiple of 4, b 16-byte aligned); a typically sits in shared memory.
__device__ __forceinline__ float fma_dot_row(float const* a, float const* b, int64_t n, bool vec4) {
  float acc = 0.f;
  if (vec4) {
    float4 const* b4 = reinterpret_cast<float4 const*>(b);
    for (int64_t i = 0; i < n / 4; ++i) {
      float4 const v = b4[i];
      acc = fma_step(acc, a[4 * i + 0], v.x);
      acc = fma_step(acc, a[4 * i + 1], v.y);
      acc = fma_step(acc, a[4 * i + 2], v.z);
      acc = fma_step(acc, a[4 * i + 3], v.w);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) acc = fma_step(acc, a[i], b[i]);
  }
  return acc;
}

}  // namespace tessera::device

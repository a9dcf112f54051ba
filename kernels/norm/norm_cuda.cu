// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the RMSNorm family (include/tessera/ops/norm.hpp, ref/norm_ref.hpp): one block per row, the
/// row staged in shared memory up to kStagedMaxDim with batched (float4 where aligned) loads.
/// The statistic Σx² follows ref::lane_sum's order (warp 0's lanes are its 32 lanes, warp_rms_inv), then
/// ss·(1/n) + eps and ref::rsqrt (rsqrtf): bitwise equal to ref::rms_norm_row, weighted
/// (→md(w·→md(x·r))) and unweighted (x·r).
#include <type_traits>

#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/norm.hpp"

namespace tessera::kernels {

namespace {

struct RmsNormParams {
  float const* x = nullptr;       // [rows, dim], row stride x_stride
  float const* w = nullptr;       // [dim] or null (unweighted)
  float* y = nullptr;             // [rows, dim], row stride y_stride; may alias x
  int64_t rows = 0, dim = 0, x_stride = 0, y_stride = 0;
  float eps = 0.f;
  bool bf16 = false;
};

constexpr int kNormThreads = 256;
constexpr int kNormPer = 8;  // accesses per thread issued together: one batch covers 8·256·kW floats

/// kStaged: the block copies the row into shared memory in batches of kNormPer independent loads per thread
/// (a 5120-wide row is one batch at kW = 4: one DRAM round trip, where a load-store loop is 20 dependent
/// round trips), then warp 0 walks ref::lane_sum's order there. The first batch of weights is requested before
/// the statistic, so it arrives while warp 0 sums. kW = 4: float4 accesses (dim % 4 == 0, 16-byte aligned
/// rows and weight); kW = 1: scalar. Unstaged (dim > kStagedMaxDim): warp 0 reads the row from global memory.
template <bool kStaged, int kW>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(RmsNormParams const p) {
  device::pdl_enter();
  using V = std::conditional_t<kW == 4, float4, float>;
  extern __shared__ __align__(16) float row_s[];  // kStaged: [dim]
  __shared__ float s_r;
  int const t = static_cast<int>(threadIdx.x);
  int64_t const row = blockIdx.x, nv = p.dim / kW;
  constexpr int64_t kBatch = int64_t{kNormPer} * kNormThreads;
  float const* x = p.x + row * p.x_stride;
  V* const y = reinterpret_cast<V*>(p.y + row * p.y_stride);
  V const* const w = reinterpret_cast<V const*>(p.w);
  if constexpr (kStaged) {
    V const* xv = reinterpret_cast<V const*>(x);
    V* const xs = reinterpret_cast<V*>(row_s);
    for (int64_t b0 = 0; b0 < nv; b0 += kBatch) {
      V v[kNormPer];
#pragma unroll
      for (int j = 0; j < kNormPer; ++j)
        if (b0 + j * kNormThreads + t < nv) v[j] = xv[b0 + j * kNormThreads + t];
#pragma unroll
      for (int j = 0; j < kNormPer; ++j)
        if (b0 + j * kNormThreads + t < nv) xs[b0 + j * kNormThreads + t] = v[j];
    }
    x = row_s;
  }
  V wv[kNormPer];
  if (w) {
#pragma unroll
    for (int j = 0; j < kNormPer; ++j)
      if (j * kNormThreads + t < nv) wv[j] = __ldg(w + j * kNormThreads + t);
  }
  if constexpr (kStaged) __syncthreads();
  if (t < 32) {
    float const r = warp_rms_inv(x, p.dim, p.eps);
    if (t == 0) s_r = r;
  }
  __syncthreads();
  float const r = s_r;
  auto out = [&](float xv, float wv1) {
    float const v = __fmul_rn(xv, r);
    return w ? device::round_md(__fmul_rn(wv1, device::round_md(v, p.bf16)), p.bf16) : v;
  };
  V const* const xr = reinterpret_cast<V const*>(x);
  for (int64_t b0 = 0; b0 < nv; b0 += kBatch) {
    if (w && b0 > 0) {
#pragma unroll
      for (int j = 0; j < kNormPer; ++j)
        if (b0 + j * kNormThreads + t < nv) wv[j] = __ldg(w + b0 + j * kNormThreads + t);
    }
#pragma unroll
    for (int j = 0; j < kNormPer; ++j) {
      int64_t const i = b0 + j * kNormThreads + t;
      if (i >= nv) break;
      V const xi = xr[i];
      V o;
      if constexpr (kW == 4) {
        float4 const wi = w ? wv[j] : make_float4(0.f, 0.f, 0.f, 0.f);
        o = make_float4(out(xi.x, wi.x), out(xi.y, wi.y), out(xi.z, wi.z), out(xi.w, wi.w));
      } else {
        o = out(xi, w ? wv[j] : 0.f);
      }
      y[i] = o;
    }
  }
}

/// Rows up to this width are staged (shared memory without an opt-in).
constexpr int64_t kStagedMaxDim = 12 * 1024;

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<RmsNorm<Backend::kCuda>, RmsNormDesc, RmsNormArgs>);

Status RmsNorm<Backend::kCuda>::check(RmsNormDesc const& d, RmsNormArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.dim > 0, "rms_norm dim must be positive");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "rms_norm x"));
  TESSERA_TRY(check_shape(a.y, {d.rows, d.dim}, "rms_norm y"));
  if (d.weighted) TESSERA_TRY(check_shape(a.weight, {d.dim}, "rms_norm weight"));
  return {};
}

Status RmsNorm<Backend::kCuda>::run(RmsNormDesc const& d, RmsNormArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  RmsNormParams p;
  p.x = a.x.data; p.w = d.weighted ? a.weight.data : nullptr; p.y = a.y.data;
  p.rows = d.rows; p.dim = d.dim; p.x_stride = d.dim; p.y_stride = d.dim;
  p.eps = d.eps; p.bf16 = d.md == DType::kBf16;
  auto aligned16 = [](void const* q) { return q == nullptr || (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  bool const vec4 = d.dim % 4 == 0 && aligned16(p.x) && aligned16(p.y) && aligned16(p.w);
  unsigned const grid = static_cast<unsigned>(d.rows);
  size_t const smem = static_cast<size_t>(d.dim) * 4;
  if (d.dim > kStagedMaxDim)
    device::launch_pdl(rms_norm_kernel<false, 1>, grid, kNormThreads, 0, stream_of(ctx), p);
  else if (vec4)
    device::launch_pdl(rms_norm_kernel<true, 4>, grid, kNormThreads, smem, stream_of(ctx), p);
  else
    device::launch_pdl(rms_norm_kernel<true, 1>, grid, kNormThreads, smem, stream_of(ctx), p);
  return launch_status("rms_norm_kernel");
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the RMSNorm family (include/tessera/ops/norm.hpp, ref/norm_ref.hpp): one block per row, the
/// row staged in shared memory up to kStagedMaxDim.
/// The statistic Σx² follows ref::lane_sum's order (warp 0's lanes are its 32 lanes, warp_rms_inv), then
/// ss·(1/n) + eps and ref::rsqrt (rsqrtf): bitwise equal to ref::rms_norm_row, weighted
/// (→md(w·→md(x·r))) and unweighted (x·r).
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

/// kStaged: the block first copies the row into shared memory (one round trip with every thread's loads in
/// flight), then warp 0 walks ref::lane_sum's order there instead of over 5120 / 128 dependent global batches.
template <bool kStaged>
__global__ void __launch_bounds__(256) rms_norm_kernel(RmsNormParams const p) {
  extern __shared__ float row_s[];  // kStaged: [dim]
  __shared__ float s_r;
  int64_t const row = blockIdx.x;
  float const* x = p.x + row * p.x_stride;
  float* y = p.y + row * p.y_stride;
  if constexpr (kStaged) {
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) row_s[i] = x[i];
    __syncthreads();
    x = row_s;
  }
  if (threadIdx.x < 32) {
    float const r = warp_rms_inv(x, p.dim, p.eps);
    if (threadIdx.x == 0) s_r = r;
  }
  __syncthreads();
  float const r = s_r;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    float const v = __fmul_rn(x[i], r);
    y[i] = p.w ? device::round_md(__fmul_rn(p.w[i], device::round_md(v, p.bf16)), p.bf16) : v;
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
  if (d.dim <= kStagedMaxDim)
    rms_norm_kernel<true><<<static_cast<unsigned>(d.rows), 256, static_cast<size_t>(d.dim) * 4, stream_of(ctx)>>>(p);
  else
    rms_norm_kernel<false><<<static_cast<unsigned>(d.rows), 256, 0, stream_of(ctx)>>>(p);
  return launch_status("rms_norm_kernel");
}

}  // namespace tessera::ops

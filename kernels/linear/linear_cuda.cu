// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the linear family (include/tessera/ops/linear.hpp): y[r, o] = →md(ref::gemm_dot(x_r, W_o)).
/// Block of 4 warps = 128 consecutive outputs × up to 8 rows; lane l of a warp owns output o0 + l and runs
/// its dot products in ref::gemm_dot's order (warp_dot_rows with device::DotAcc for an fp32 output, TcDotAcc,
/// the tensor-core blocks of ref::dot_tc, for bf16), so each y[r, o] is the exact arithmetic of the CPU
/// reference whatever the row count or grid: bitwise equal to the CPU and row-invariant.
#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/linear.hpp"

namespace tessera::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 8;

struct LinearParams {
  float const* x = nullptr;  // [rows, in], row stride x_stride
  void const* w = nullptr;   // [out, in] fp32 or bf16
  float* y = nullptr;        // [rows, out], row stride y_stride
  int64_t rows = 0, in = 0, out = 0, x_stride = 0, y_stride = 0;
  bool bf16_out = false;
};

template <class W, class Acc>
__global__ void __launch_bounds__(kWarps * 32) linear_rows_kernel(LinearParams const p) {
  __shared__ float tiles[kWarps][32 * 33];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 32;
  int64_t const r0 = static_cast<int64_t>(blockIdx.y) * kRows;
  if (o0 >= p.out) return;
  int const n_x = static_cast<int>(p.rows - r0 < kRows ? p.rows - r0 : kRows);
  float acc[kRows];
  warp_dot_rows<kRows, W, Acc>(p.x + r0 * p.x_stride, p.x_stride, n_x, static_cast<W const*>(p.w), p.in, p.in, o0,
                               p.out, tiles[warp], acc);
  int64_t const o = o0 + lane;
  if (o >= p.out) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (r < n_x) p.y[(r0 + r) * p.y_stride + o] = device::round_md(acc[r], p.bf16_out);
}

/// fma_chain order (ref::bmm_dot, small projections only: wo_a): one thread per (row, output) runs one FMA
/// chain for an fp32 output, the tensor-core blocks of ref::dot_tc for bf16.
template <class W>
__global__ void linear_fma_chain_kernel(LinearParams const p) {
  int64_t const o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (o >= p.out) return;
  float const* x = p.x + r * p.x_stride;
  W const* w = static_cast<W const*>(p.w) + o * p.in;
  float acc = 0.f;
  if (p.bf16_out) {
    tc::BlockAcc tc_acc;
    for (int64_t i = 0; i < p.in; ++i) tc_acc.step(x[i], device::load_w(w + i));
    acc = tc_acc.value();
  } else {
    for (int64_t i = 0; i < p.in; ++i) acc = device::fma_step(acc, x[i], device::load_w(w + i));
  }
  p.y[r * p.y_stride + o] = device::round_md(acc, p.bf16_out);
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<Linear<Backend::kCuda>, LinearDesc, LinearArgs>);

Status Linear<Backend::kCuda>::check(LinearDesc const& d, LinearArgs const& a) { return check_linear(d, a); }

Status Linear<Backend::kCuda>::run(LinearDesc const& d, LinearArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  LinearParams p;
  p.x = a.x.data;
  p.y = a.y.data;
  p.rows = d.rows; p.in = d.in; p.out = d.out;
  p.x_stride = a.x.stride[0];
  p.y_stride = a.y.stride[0];
  p.bf16_out = d.md == DType::kBf16;
  if (d.fma_chain) {
    if (d.rows > 65535) return invalid_argument("linear (fma_chain): rows > 65535 per launch");
    dim3 g(static_cast<unsigned>(ceil_div(d.out, 128)), static_cast<unsigned>(d.rows));
    if (d.weight_dtype == DType::kBf16) {
      p.w = a.w_bf16.data;
      linear_fma_chain_kernel<Bf16><<<g, 128, 0, stream_of(ctx)>>>(p);
    } else {
      p.w = a.w.data;
      linear_fma_chain_kernel<float><<<g, 128, 0, stream_of(ctx)>>>(p);
    }
    return launch_status("linear_fma_chain_kernel");
  }
  dim3 grid(static_cast<unsigned>(ceil_div(d.out, kWarps * 32)), static_cast<unsigned>(ceil_div(d.rows, kRows)));
  if (grid.y > 65535) return invalid_argument("linear: rows > 524280 per launch");
  bool const bf16_w = d.weight_dtype == DType::kBf16;
  p.w = bf16_w ? static_cast<void const*>(a.w_bf16.data) : static_cast<void const*>(a.w.data);
  if (bf16_w && p.bf16_out) linear_rows_kernel<Bf16, device::TcDotAcc><<<grid, kWarps * 32, 0, stream_of(ctx)>>>(p);
  else if (bf16_w) linear_rows_kernel<Bf16, device::DotAcc><<<grid, kWarps * 32, 0, stream_of(ctx)>>>(p);
  else if (p.bf16_out) linear_rows_kernel<float, device::TcDotAcc><<<grid, kWarps * 32, 0, stream_of(ctx)>>>(p);
  else linear_rows_kernel<float, device::DotAcc><<<grid, kWarps * 32, 0, stream_of(ctx)>>>(p);
  return launch_status("linear_rows_kernel");
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// Glue kernels of the GPU model's EXL3 linears (models/deepseek_v41/gpu_exl3.cpp; host twins there, same
/// arithmetic; the contract in models/deepseek_v41/exl3_linear.cpp):
///   to_f16        out[r, c] = →fp16(x[r·stride + c]) (RNE)
///   store_md      dst[r·stride + c] = →md(src[r, c])
///   exl3_moe_act  act[a, i] = →fp16(→md(w_a·(silu(min(g, L))·clamp(u, ±L)))), g, u = →md(G / U[a, i])
///   moe_combine   out[t, :] = →md(Σ_{a in list(t)} →md(Y[a, :]) + →md(Ysh[t, :])), list(t) in ascending expert
///                 id, summed from +0 in fp32 in that order (MoeExperts' order)
/// Each output element depends only on its own row's inputs (row invariance).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "models/deepseek_v41/gpu_internal.hpp"
#include "tessera/device/arith.cuh"

namespace tessera::model::dsv41::gpu {

namespace {

__global__ void to_f16_kernel(float const* x, int64_t stride, int64_t cols, uint16_t* out) {
  int64_t const r = blockIdx.y;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[r * cols + c] = __half_as_ushort(__float2half_rn(x[r * stride + c]));
}

__global__ void store_md_kernel(float const* src, int64_t cols, float* dst, int64_t stride, bool bf16) {
  int64_t const r = blockIdx.y;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[r * stride + c] = device::round_md(src[r * cols + c], bf16);
}

__global__ void moe_act_kernel(float const* g, float const* u, float const* w, int64_t inter, float limit, bool bf16,
                               uint16_t* out) {
  int64_t const a = blockIdx.y;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < inter;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float gv = device::round_md(g[a * inter + i], bf16), uv = device::round_md(u[a * inter + i], bf16);
    if (limit > 0.f) {
      uv = fminf(fmaxf(uv, -limit), limit);
      gv = fminf(gv, limit);
    }
    float y = __fmul_rn(device::silu(gv, bf16), uv);
    if (w) y = __fmul_rn(w[a], y);
    out[a * inter + i] = __half_as_ushort(__float2half_rn(device::round_md(y, bf16)));
  }
}

__global__ void moe_combine_kernel(float const* y, int64_t const* off, int32_t const* list, float const* ysh, int64_t D,
                                   bool bf16, float* out) {
  int64_t const t = blockIdx.y;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < D;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int64_t j = off[t]; j < off[t + 1]; ++j) acc = __fadd_rn(acc, device::round_md(y[list[j] * D + o], bf16));
    if (ysh) acc = __fadd_rn(acc, device::round_md(ysh[t * D + o], bf16));
    out[t * D + o] = device::round_md(acc, bf16);
  }
}

Status status_of(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

dim3 grid_of(int64_t rows, int64_t cols) {
  return dim3(static_cast<unsigned>((cols + 255) / 256 < 64 ? (cols + 255) / 256 : 64), static_cast<unsigned>(rows));
}

}  // namespace

Status launch_to_f16(CUstream_st* stream, float const* x, int64_t stride, int64_t rows, int64_t cols, uint16_t* out) {
  if (rows == 0 || cols == 0) return {};
  if (rows > 65535) return invalid_argument("to_f16: more than 65535 rows");
  to_f16_kernel<<<grid_of(rows, cols), 256, 0, stream>>>(x, stride, cols, out);
  return status_of(cudaGetLastError(), "to_f16");
}

Status launch_store_md(CUstream_st* stream, float const* src, int64_t rows, int64_t cols, float* dst, int64_t stride,
                       bool bf16) {
  if (rows == 0 || cols == 0) return {};
  if (rows > 65535) return invalid_argument("store_md: more than 65535 rows");
  store_md_kernel<<<grid_of(rows, cols), 256, 0, stream>>>(src, cols, dst, stride, bf16);
  return status_of(cudaGetLastError(), "store_md");
}

Status launch_exl3_moe_act(CUstream_st* stream, float const* g, float const* u, float const* w, int64_t rows,
                           int64_t inter, float limit, bool bf16, uint16_t* out) {
  if (rows == 0) return {};
  if (rows > 65535) return invalid_argument("exl3_moe_act: more than 65535 rows");
  moe_act_kernel<<<grid_of(rows, inter), 256, 0, stream>>>(g, u, w, inter, limit, bf16, out);
  return status_of(cudaGetLastError(), "exl3_moe_act");
}

Status launch_moe_combine(CUstream_st* stream, float const* y, int64_t const* off, int32_t const* list,
                          float const* ysh, int64_t tokens, int64_t D, bool bf16, float* out) {
  if (tokens == 0) return {};
  if (tokens > 65535) return invalid_argument("moe_combine: more than 65535 tokens");
  moe_combine_kernel<<<grid_of(tokens, D), 256, 0, stream>>>(y, off, list, ysh, D, bf16, out);
  return status_of(cudaGetLastError(), "moe_combine");
}

}  // namespace tessera::model::dsv41::gpu

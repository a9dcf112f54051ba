// SPDX-License-Identifier: Apache-2.0
/// Host-side helpers shared by the op-family CUDA entry points: cudaError_t → Status, launch checks,
/// stream-ordered scratch (ctx.workspace when large enough, else cudaMallocAsync freed after the op), and
/// the warp-tiled sequential dot product used by every projection kernel.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "tessera/core/context.hpp"
#include "tessera/core/status.hpp"
#include "tessera/device/arith.cuh"

namespace tessera::kernels {

inline Status cuda_status(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}
/// The status of the last launch (configuration errors surface here, not in the kernel).
inline Status launch_status(char const* kernel) { return cuda_status(cudaGetLastError(), kernel); }

inline cudaStream_t stream_of(ExecContext const& ctx) { return reinterpret_cast<cudaStream_t>(ctx.stream); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }

/// Device scratch for one op: ctx.workspace when it is large enough, else a stream-ordered allocation
/// released (stream-ordered) when the op returns.
struct Scratch {
  void* ptr = nullptr;
  bool owned = false;
  cudaStream_t stream = nullptr;
  Status acquire(ExecContext& ctx, size_t bytes) {
    stream = stream_of(ctx);
    if (ctx.workspace && ctx.workspace_bytes >= bytes) { ptr = ctx.workspace; return {}; }
    owned = true;
    return cuda_status(cudaMallocAsync(&ptr, bytes == 0 ? 256 : bytes, stream), "workspace allocation");
  }
  ~Scratch() {
    if (owned && ptr) cudaFreeAsync(ptr, stream);
  }
};

/// Lane l of a warp gets, for its output o = o0 + l (o < n_out) and each of R input vectors x_r
/// (x + r·x_stride, read by all lanes at once), acc[r] = the dot product x_r·W[o, :] of length n in the order of
/// Acc: device::DotAcc is ref::dot's (32-wide chunks), device::TcDotAcc ref::dot_tc's (16-product tensor-core
/// blocks; ref::gemm_dot for a bf16 output). W is row-major with leading dimension ld. The warp stages
/// 32×32 tiles of W in `tile` (32·33 floats of shared memory owned by this warp) so global loads are
/// coalesced along k; the per-output arithmetic is the same whatever R, the tile or the launch shape.
template <int R, class W, class Acc = device::DotAcc>
__device__ __forceinline__ void warp_dot_rows(float const* x, int64_t x_stride, int n_x, W const* w, int64_t ld,
                                              int64_t n, int64_t o0, int64_t n_out, float* tile, float (&acc)[R]) {
  int const lane = threadIdx.x & 31;
  static_assert(device::kDotChunk == 32 && 32 % tc::kBlock == 0, "the 32-wide tiles hold whole chunks and blocks");
  Acc d[R];
  for (int64_t k0 = 0; k0 < n; k0 += 32) {
    int64_t const k = k0 + lane;
    for (int j = 0; j < 32; ++j) {
      int64_t const o = o0 + j;
      tile[j * 33 + lane] = (o < n_out && k < n) ? device::load_w(w + o * ld + k) : 0.f;
    }
    __syncwarp();
    int const kk = static_cast<int>(n - k0 < 32 ? n - k0 : 32);
    float const* trow = tile + lane * 33;
#pragma unroll
    for (int r = 0; r < R; ++r) d[r].begin();
    for (int t = 0; t < kk; ++t) {
      float const wv = trow[t];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < n_x) d[r].step(x[r * x_stride + k0 + t], wv);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) d[r].end();
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = d[r].value();
}

/// warp_dot_rows with the R input vectors given by pointers (xr[r] for r < n_x; gathered token rows).
template <int R, class W, class Acc = device::DotAcc>
__device__ __forceinline__ void warp_dot_rows_ptr(float const* const* xr, int n_x, W const* w, int64_t ld, int64_t n,
                                                  int64_t o0, int64_t n_out, float* tile, float (&acc)[R]) {
  int const lane = threadIdx.x & 31;
  Acc d[R];
  for (int64_t k0 = 0; k0 < n; k0 += 32) {
    int64_t const k = k0 + lane;
    for (int j = 0; j < 32; ++j) {
      int64_t const o = o0 + j;
      tile[j * 33 + lane] = (o < n_out && k < n) ? device::load_w(w + o * ld + k) : 0.f;
    }
    __syncwarp();
    int const kk = static_cast<int>(n - k0 < 32 ? n - k0 : 32);
    float const* trow = tile + lane * 33;
#pragma unroll
    for (int r = 0; r < R; ++r) d[r].begin();
    for (int t = 0; t < kk; ++t) {
      float const wv = trow[t];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < n_x) d[r].step(xr[r][k0 + t], wv);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) d[r].end();
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = d[r].value();
}

}  // namespace tessera::kernels

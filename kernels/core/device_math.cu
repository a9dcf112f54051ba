// SPDX-License-Identifier: Apache-2.0
/// ops::eval_device_math_cuda: one thread per element, the device functions exactly as the op kernels call them.
#include <cuda_runtime.h>

#include <string>

#include "tessera/core/fmath.hpp"
#include "tessera/device/arith.cuh"
#include "tessera/ops/device_math.hpp"

namespace tessera::kernels {

template <ops::DeviceMathFn F>
__global__ void device_math_kernel(float const* in, float* out, int64_t n) {
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float const x = in[i];
  if constexpr (F == ops::DeviceMathFn::kExpf) out[i] = expf(x);
  if constexpr (F == ops::DeviceMathFn::kExpRn) out[i] = fmath::exp_rn(x);
  if constexpr (F == ops::DeviceMathFn::kLog1pRn) out[i] = fmath::log1p_rn(x);
  if constexpr (F == ops::DeviceMathFn::kSigmoid) out[i] = device::sigmoid(x);
  if constexpr (F == ops::DeviceMathFn::kSilu) out[i] = device::silu(x);
  if constexpr (F == ops::DeviceMathFn::kSoftplus) out[i] = device::softplus(x);
  if constexpr (F == ops::DeviceMathFn::kLog1p) out[i] = fmath::log1p(x);
}

}  // namespace tessera::kernels

namespace tessera::ops {

Status eval_device_math_cuda(DeviceMathFn fn, float const* in, float* out, int64_t n) {
  if (n <= 0) return invalid_argument("eval_device_math_cuda: n must be positive");
  float *d_in = nullptr, *d_out = nullptr;
  size_t const bytes = static_cast<size_t>(n) * sizeof(float);
  auto done = [&](cudaError_t e, char const* what) {
    cudaFree(d_in);
    cudaFree(d_out);
    return e == cudaSuccess ? Status{} : Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
  };
  cudaError_t e = cudaMalloc(&d_in, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&d_out, bytes);
  if (e != cudaSuccess) return done(e, "cudaMalloc");
  if ((e = cudaMemcpy(d_in, in, bytes, cudaMemcpyHostToDevice)) != cudaSuccess) return done(e, "cudaMemcpy");
  int const threads = 256;
  unsigned const blocks = static_cast<unsigned>((n + threads - 1) / threads);
  switch (fn) {
    case DeviceMathFn::kExpf: kernels::device_math_kernel<DeviceMathFn::kExpf><<<blocks, threads>>>(d_in, d_out, n); break;
    case DeviceMathFn::kSigmoid: kernels::device_math_kernel<DeviceMathFn::kSigmoid><<<blocks, threads>>>(d_in, d_out, n); break;
    case DeviceMathFn::kSilu: kernels::device_math_kernel<DeviceMathFn::kSilu><<<blocks, threads>>>(d_in, d_out, n); break;
    case DeviceMathFn::kSoftplus: kernels::device_math_kernel<DeviceMathFn::kSoftplus><<<blocks, threads>>>(d_in, d_out, n); break;
    case DeviceMathFn::kLog1p: kernels::device_math_kernel<DeviceMathFn::kLog1p><<<blocks, threads>>>(d_in, d_out, n); break;
    case DeviceMathFn::kExpRn: kernels::device_math_kernel<DeviceMathFn::kExpRn><<<blocks, threads>>>(d_in, d_out, n); break;
    case DeviceMathFn::kLog1pRn: kernels::device_math_kernel<DeviceMathFn::kLog1pRn><<<blocks, threads>>>(d_in, d_out, n); break;
  }
  if ((e = cudaGetLastError()) != cudaSuccess) return done(e, "kernel launch");
  if ((e = cudaMemcpy(out, d_out, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) return done(e, "cudaMemcpy");
  return done(cudaSuccess, "");
}

}  // namespace tessera::ops

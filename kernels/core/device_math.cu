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
  if constexpr (F == ops::DeviceMathFn::kLog1pf) out[i] = log1pf(x);
  if constexpr (F == ops::DeviceMathFn::kSinf) out[i] = sinf(x);
  if constexpr (F == ops::DeviceMathFn::kCosf) out[i] = cosf(x);
  if constexpr (F == ops::DeviceMathFn::kReplayLog1pf) out[i] = cuda_math::log1pf(x);
  if constexpr (F == ops::DeviceMathFn::kReplaySinf) out[i] = cuda_math::sinf(x);
  if constexpr (F == ops::DeviceMathFn::kReplayCosf) out[i] = cuda_math::cosf(x);
  if constexpr (F == ops::DeviceMathFn::kSigmoidBf16) out[i] = device::sigmoid(x, true);
  if constexpr (F == ops::DeviceMathFn::kSiluBf16) out[i] = device::silu(x, true);
  if constexpr (F == ops::DeviceMathFn::kSoftplusBf16) out[i] = device::softplus(x, true);
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
#define TESSERA_DEVICE_MATH_CASE(F) \
  case DeviceMathFn::F: kernels::device_math_kernel<DeviceMathFn::F><<<blocks, threads>>>(d_in, d_out, n); break;
    TESSERA_DEVICE_MATH_CASE(kExpf)
    TESSERA_DEVICE_MATH_CASE(kSigmoid)
    TESSERA_DEVICE_MATH_CASE(kSilu)
    TESSERA_DEVICE_MATH_CASE(kSoftplus)
    TESSERA_DEVICE_MATH_CASE(kLog1p)
    TESSERA_DEVICE_MATH_CASE(kExpRn)
    TESSERA_DEVICE_MATH_CASE(kLog1pRn)
    TESSERA_DEVICE_MATH_CASE(kLog1pf)
    TESSERA_DEVICE_MATH_CASE(kSinf)
    TESSERA_DEVICE_MATH_CASE(kCosf)
    TESSERA_DEVICE_MATH_CASE(kReplayLog1pf)
    TESSERA_DEVICE_MATH_CASE(kReplaySinf)
    TESSERA_DEVICE_MATH_CASE(kReplayCosf)
    TESSERA_DEVICE_MATH_CASE(kSigmoidBf16)
    TESSERA_DEVICE_MATH_CASE(kSiluBf16)
    TESSERA_DEVICE_MATH_CASE(kSoftplusBf16)
#undef TESSERA_DEVICE_MATH_CASE
  }
  if ((e = cudaGetLastError()) != cudaSuccess) return done(e, "kernel launch");
  if ((e = cudaMemcpy(out, d_out, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) return done(e, "cudaMemcpy");
  return done(cudaSuccess, "");
}

}  // namespace tessera::ops

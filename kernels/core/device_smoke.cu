// SPDX-License-Identifier: Apache-2.0
/// The smallest end-to-end proof that the CUDA build works on a device: a kernel writes
/// out[i] = a·i + b, the host reads it back. Used by scripts/gpu-check.sh through verify/ops.
#include <cuda_runtime.h>

#include "tessera/ops/device_smoke.hpp"

namespace tessera::kernels {

__global__ void write_index_pattern_kernel(int32_t* out, int64_t n, int32_t a, int32_t b) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * static_cast<int32_t>(i) + b;
}

}  // namespace tessera::kernels

namespace tessera::ops {

Status write_index_pattern_cuda(int32_t* host_out, int64_t n, int32_t a, int32_t b, DeviceInfo* info) {
  if (n <= 0) return invalid_argument("write_index_pattern_cuda: n must be positive");
  int32_t* d = nullptr;
  auto fail = [&](cudaError_t e, char const* what) {
    if (d) cudaFree(d);
    return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
  };
  cudaError_t e = cudaMalloc(&d, static_cast<size_t>(n) * sizeof(int32_t));
  if (e != cudaSuccess) return fail(e, "cudaMalloc");
  int threads = 256;
  int blocks = static_cast<int>((n + threads - 1) / threads);
  kernels::write_index_pattern_kernel<<<blocks, threads>>>(d, n, a, b);
  if ((e = cudaGetLastError()) != cudaSuccess) return fail(e, "kernel launch");
  if ((e = cudaMemcpy(host_out, d, static_cast<size_t>(n) * sizeof(int32_t), cudaMemcpyDeviceToHost)) != cudaSuccess)
    return fail(e, "cudaMemcpy");
  cudaFree(d);
  if (info) {
    cudaDeviceProp p{};
    int dev = 0;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&p, dev);
    info->sm = p.major * 10 + p.minor;
    info->num_sms = p.multiProcessorCount;
    info->smem_per_block_optin = p.sharedMemPerBlockOptin;
    info->global_memory = p.totalGlobalMem;
    info->name = p.name;
  }
  return {};
}

}  // namespace tessera::ops

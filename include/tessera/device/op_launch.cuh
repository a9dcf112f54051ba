// SPDX-License-Identifier: Apache-2.0
/// Host-side helpers of the CUDA op backends: argument views must live in CUDA memory (a TensorView's
/// `device` tag), launch errors become a Status naming the kernel, and dynamic shared memory above the
/// 48 KiB default is opted into per kernel (H100/H200: 227 KiB per block).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "tessera/core/context.hpp"
#include "tessera/core/status.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/device/pdl.cuh"

namespace tessera::device {

/// kOk when `v` is empty or tagged as CUDA memory; otherwise an invalid-argument naming `what`.
template <class T, int kRank>
Status check_on_device(TensorView<T, kRank> const& v, char const* what) {
  if (v.numel() > 0 && v.device != Device::kCuda)
    return invalid_argument(std::string(what) + " must be a view of CUDA device memory (device tag is CPU)");
  return {};
}

/// The launch error of the last kernel, if any, as a Status naming `what`.
inline Status launch_status(char const* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

/// Largest dynamic shared memory one block may opt into on the current device.
inline size_t smem_optin_bytes(ExecContext const& ctx) {
  if (ctx.device.smem_per_block_optin > 0) return ctx.device.smem_per_block_optin;
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 48 * 1024;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 48 * 1024;
  return static_cast<size_t>(v);
}

/// Lets `kernel` launch with `bytes` of dynamic shared memory (no-op up to the 48 KiB default).
template <class K>
Status allow_dynamic_smem(K* kernel, size_t bytes, ExecContext const& ctx, char const* what) {
  if (bytes <= 48 * 1024) return {};
  if (bytes > smem_optin_bytes(ctx))
    return not_supported(std::string(what) + ": needs " + std::to_string(bytes) +
                         " bytes of shared memory per block, more than the device allows");
  cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<void const*>(kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e != cudaSuccess) return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
  return {};
}

}  // namespace tessera::device

// SPDX-License-Identifier: Apache-2.0
/// Execution context: which backend runs an op, the device it runs on, its stream and workspace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/core/config.hpp"

struct CUstream_st;  // cudaStream_t without <cuda_runtime.h>

namespace tessera {

class ThreadPool;

enum class Backend : uint8_t { kCpu, kCuda };

/// Properties of the device an op runs on (queried once; host-side tests construct it by hand).
struct DeviceInfo {
  int sm = 0;                       // compute capability × 10 + minor, e.g. 90 for sm_90(a)
  int num_sms = 0;
  size_t smem_per_block_optin = 0;  // bytes
  size_t global_memory = 0;         // bytes
  std::string name;
};

struct ExecContext {
  Backend backend = Backend::kCpu;
  DeviceInfo device;
  CUstream_st* stream = nullptr;   // CUDA stream; nullptr = the legacy default stream
  void* workspace = nullptr;       // device scratch, `workspace_bytes` long
  size_t workspace_bytes = 0;
  ThreadPool* pool = nullptr;      // CPU backend; nullptr = ThreadPool::global()
  int impl_override = -1;          // ≥ 0 forces one implementation of a family (tests, benches)
};

}  // namespace tessera

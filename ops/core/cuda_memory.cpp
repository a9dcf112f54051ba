// SPDX-License-Identifier: Apache-2.0
/// CUDA memory hooks of the core library (runtime API only; a build without CUDA reports kNotSupported).
#include "tessera/core/tensor.hpp"

#if TESSERA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessera {

#if TESSERA_WITH_CUDA
static Status cuda_status(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return {};
  return Status(e == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kCudaError,
                std::string(what) + ": " + cudaGetErrorString(e));
}
Status cuda_malloc(void** ptr, size_t bytes) { return cuda_status(cudaMalloc(ptr, bytes), "cudaMalloc"); }
void cuda_free(void* ptr) { cudaFree(ptr); }
Status cuda_memcpy(void* dst, void const* src, size_t bytes, bool dst_is_device, bool src_is_device) {
  cudaMemcpyKind kind = dst_is_device ? (src_is_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                      : (src_is_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  return cuda_status(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}
int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}
#else
Status cuda_malloc(void**, size_t) { return not_supported("Tessera was built without CUDA"); }
void cuda_free(void*) {}
Status cuda_memcpy(void*, void const*, size_t, bool, bool) { return not_supported("Tessera was built without CUDA"); }
int cuda_device_count() { return 0; }
#endif

}  // namespace tessera

// SPDX-License-Identifier: Apache-2.0
/// Programmatic dependent launch (sm_90+). A kernel started by launch_pdl may become resident while the
/// kernel before it in the stream still runs: once every block of the predecessor has executed
/// pdl_launch_dependents (or exited), the next grid launches, and its blocks wait in pdl_wait until the
/// predecessor grid has completed and its memory is visible. A batch-1 decode layer is ~40 dependent
/// launches of 3–100 µs; this hides the launch latency and block ramp between them (~1.5 µs a boundary
/// on H100 in a CUDA graph) behind the predecessor's tail.
///
/// Contract of a kernel launched this way: every block executes pdl_wait before it reads anything an earlier
/// kernel of the stream wrote or writes anything an earlier kernel reads. Only data no kernel of the stream
/// writes (weights, tables) may be read before it. Because every block of every such grid waits, a grid
/// completes after its predecessor, so the order is transitive along the stream: a kernel that waits has
/// every earlier kernel's writes visible, as with plain launches. pdl_enter (wait, then let the next grid
/// launch) as a kernel's first statement meets the contract for any kernel. Without the launch attribute
/// both instructions are no-ops, so the kernels stay correct under plain <<<>>> launches.
///
/// TESSERA_PDL=0 in the environment launches without the attribute (read once per process).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

namespace tessera::device {

/// Returns once the predecessor grid has completed and its writes are visible (no-op below sm_90 or
/// without the launch attribute).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// Lets the next grid of the stream launch once every block of this grid has executed it (or exited).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// A kernel's first statement: wait for the predecessor, then let the successor launch. The successor's
/// blocks can then only become resident after all of this grid's blocks are (no grid waits on slots its
/// own dependents hold).
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

/// Whether launch_pdl sets the attribute: TESSERA_PDL unset or anything but "0".
inline bool pdl_enabled() {
  static bool const on = [] {
    char const* e = std::getenv("TESSERA_PDL");
    return !(e && e[0] == '0' && e[1] == '\0');
  }();
  return on;
}

/// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-stream-serialization attribute
/// (pdl_enabled). Errors are those of the launch and are also left for cudaGetLastError, as with <<<>>>.
template <class... KArgs, class... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace tessera::device

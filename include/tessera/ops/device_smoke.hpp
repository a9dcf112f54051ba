// SPDX-License-Identifier: Apache-2.0
/// Device smoke test: proves that a CUDA build launches kernels and reads results back.
#pragma once

#include <cstdint>

#include "tessera/core/context.hpp"
#include "tessera/core/status.hpp"

namespace tessera::ops {

/// Writes host_out[i] = a·i + b for i < n through a CUDA kernel; fills `info` with the device's
/// properties when non-null. Defined in kernels/core/device_smoke.cu (CUDA builds only).
Status write_index_pattern_cuda(int32_t* host_out, int64_t n, int32_t a, int32_t b, DeviceInfo* info);

}  // namespace tessera::ops

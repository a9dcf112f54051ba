// SPDX-License-Identifier: Apache-2.0
/// Elementwise evaluation of the device math the CUDA kernels use (CUDA's expf, device::sigmoid / silu /
/// softplus of include/tessera/device/arith.cuh, fmath::log1p) on host arrays, for checking the CPU replays
/// (ref::cuda_expf, fmath::log1p) against the hardware. Defined in kernels/core/device_math.cu (CUDA builds).
#pragma once

#include <cstdint>

#include "tessera/core/status.hpp"

namespace tessera::ops {

enum class DeviceMathFn { kExpf, kSigmoid, kSilu, kSoftplus, kLog1p };

/// out[i] = fn(in[i]) computed on the current CUDA device; `in` and `out` are host arrays of n floats.
Status eval_device_math_cuda(DeviceMathFn fn, float const* in, float* out, int64_t n);

}  // namespace tessera::ops

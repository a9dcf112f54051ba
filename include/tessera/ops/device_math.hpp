// SPDX-License-Identifier: Apache-2.0
/// Elementwise evaluation of device math on host arrays (CUDA's expf; fmath::exp_rn, log1p, log1p_rn; the
/// device::sigmoid / silu / softplus the kernels call), for checking the CPU versions against the hardware. Defined in kernels/core/device_math.cu (CUDA builds).
#pragma once

#include <cstdint>

#include "tessera/core/status.hpp"

namespace tessera::ops {

enum class DeviceMathFn { kExpf, kExpRn, kLog1p, kLog1pRn, kSigmoid, kSilu, kSoftplus };

/// out[i] = fn(in[i]) computed on the current CUDA device; `in` and `out` are host arrays of n floats.
Status eval_device_math_cuda(DeviceMathFn fn, float const* in, float* out, int64_t n);

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// Elementwise evaluation of device math on host arrays (CUDA's expf, log1pf, sinf, cosf; fmath::exp_rn, log1p,
/// log1p_rn; the cuda_math replays; the device::sigmoid / silu / softplus the kernels call, fp32 and bf16 forms),
/// for checking the CPU versions against the hardware. Defined in kernels/core/device_math.cu (CUDA builds).
#pragma once

#include <cstdint>

#include "tessera/core/status.hpp"

namespace tessera::ops {

enum class DeviceMathFn {
  kExpf, kExpRn, kLog1p, kLog1pRn, kSigmoid, kSilu, kSoftplus,
  kLog1pf, kSinf, kCosf,                                   // CUDA's own
  kReplayLog1pf, kReplaySinf, kReplayCosf,                 // cuda_math:: on the device
  kSigmoidBf16, kSiluBf16, kSoftplusBf16,                  // device::sigmoid / silu / softplus(x, bf16 = true)
};

/// out[i] = fn(in[i]) computed on the current CUDA device; `in` and `out` are host arrays of n floats.
Status eval_device_math_cuda(DeviceMathFn fn, float const* in, float* out, int64_t n);

}  // namespace tessera::ops

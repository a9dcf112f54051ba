// SPDX-License-Identifier: Apache-2.0
/// Device arithmetic that mirrors the CPU references bit for bit. Every accumulate step of a kernel that
/// promises fp32 equality with ref::dot (include/tessera/ref/common_ref.hpp: sequential in index order,
/// the product and the sum each rounded to nearest even, never contracted to an FMA) goes through
/// dot_step: acc ← rn(acc + rn(a·b)).
#pragma once

namespace tessera::dev {
__device__ __forceinline__ float dot_step(float acc, float a, float b) { return __fadd_rn(acc, __fmul_rn(a, b)); }
}  // namespace tessera::dev

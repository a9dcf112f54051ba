// SPDX-License-Identifier: Apache-2.0
/// Small helpers shared by the op-family headers: shape checks that name the offending argument, and the
/// model-dtype tag (fp32 or bf16) carried by every Desc whose op rounds to the model dtype.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "tessera/core/concepts.hpp"
#include "tessera/core/context.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/status.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera::ops {

/// kOk if `v` has exactly `dims` (−1 = any); otherwise an invalid-argument naming `what`.
template <class T, int kRank>
Status check_shape(TensorView<T, kRank> const& v, std::array<int64_t, kRank> const& dims, char const* what) {
  for (int i = 0; i < kRank; ++i)
    if (dims[i] >= 0 && v.shape[i] != dims[i])
      return invalid_argument(std::string(what) + ": dimension " + std::to_string(i) + " is " +
                              std::to_string(v.shape[i]) + ", expected " + std::to_string(dims[i]));
  if (v.numel() > 0 && !v.is_contiguous()) return invalid_argument(std::string(what) + " must be contiguous");
  return {};
}

/// Checks, then runs Op (one backend functor of a family): `run_checked<RmsNorm<Backend::kCuda>>(ctx, d, a)`.
template <class Op, class Desc, class Args>
Status run_checked(ExecContext& ctx, Desc const& d, Args const& a) {
  TESSERA_TRY(Op::check(d, a));
  return Op::run(d, a, ctx);
}

/// Routes by ctx.backend to Family<kCpu> or Family<kCuda>. A template, so only code that instantiates it
/// (and therefore links libtessera_kernels in CUDA builds) needs the CUDA symbols; the families' plain
/// entry points (rms_norm, …) stay CPU-only and link without the kernels library.
template <template <Backend> class Family, class Desc, class Args>
Status dispatch(ExecContext& ctx, Desc const& d, Args const& a) {
  if (ctx.backend == Backend::kCpu) return run_checked<Family<Backend::kCpu>>(ctx, d, a);
#if TESSERA_WITH_CUDA
  if (ctx.backend == Backend::kCuda) return run_checked<Family<Backend::kCuda>>(ctx, d, a);
#endif
  return not_supported("this build has no backend for the op's ExecContext::backend");
}

inline Status check_md(DType md) {
  if (md != DType::kF32 && md != DType::kBf16) return invalid_argument("model dtype must be f32 or bf16");
  return {};
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// Routing of one op-family call by ExecContext::backend: check, then run, on the CPU functor
/// `Family<Backend::kCpu>` or the CUDA functor `Family<Backend::kCuda>` (both take (Desc, Args)).
/// The family's free function (ops::attention, …) stays CPU-only so the CPU library never needs the
/// kernel library; a caller that routes to CUDA links tessera_kernels (CUDA builds only).
#pragma once

#include "tessera/core/config.hpp"
#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

template <template <Backend> class Family, class Desc, class Args>
Status run_on_backend(ExecContext& ctx, Desc const& d, Args const& a) {
  if (ctx.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    TESSERA_TRY(Family<Backend::kCuda>::check(d, a));
    return Family<Backend::kCuda>::run(d, a, ctx);
#else
    return not_supported("this build has no CUDA backend");
#endif
  }
  TESSERA_TRY(Family<Backend::kCpu>::check(d, a));
  return Family<Backend::kCpu>::run(d, a, ctx);
}

}  // namespace tessera::ops

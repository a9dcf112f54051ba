// SPDX-License-Identifier: Apache-2.0
/// CPU-backend helpers: the thread pool of an ExecContext, and the run-after-check pattern of every
/// family entry point. Rows are split across tasks; a row's arithmetic never spans tasks.
#pragma once

#include "tessera/core/thread_pool.hpp"
#include "tessera/ops/op_common.hpp"

namespace tessera::ops::detail {

inline ThreadPool& cpu_pool(ExecContext& ctx) { return ctx.pool ? *ctx.pool : ThreadPool::global(); }

template <template <Backend> class Family, class Desc, class Args>
Status dispatch_cpu(ExecContext& ctx, Desc const& d, Args const& a) {
  if (ctx.backend != Backend::kCpu) return not_supported("only the CPU backend is built for this op family");
  TESSERA_TRY(Family<Backend::kCpu>::check(d, a));
  return Family<Backend::kCpu>::run(d, a, ctx);
}

}  // namespace tessera::ops::detail

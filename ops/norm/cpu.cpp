// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the RMSNorm family: ref/norm_ref.hpp over rows.
#include "ops/cpu_common.hpp"
#include "tessera/ops/norm.hpp"
#include "tessera/ref/norm_ref.hpp"

namespace tessera::ops {

Status RmsNorm<Backend::kCpu>::check(RmsNormDesc const& d, RmsNormArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "rms_norm x"));
  TESSERA_TRY(check_shape(a.y, {d.rows, d.dim}, "rms_norm y"));
  if (d.weighted) TESSERA_TRY(check_shape(a.weight, {d.dim}, "rms_norm weight"));
  return {};
}

Status RmsNorm<Backend::kCpu>::run(RmsNormDesc const& d, RmsNormArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    std::vector<float> tmp(static_cast<size_t>(d.dim));
    for (int64_t r = b; r < e; ++r) {
      ref::rms_norm_row(&a.x(r, 0), d.weighted ? a.weight.data : nullptr, d.dim, d.eps, d.md, tmp.data());
      std::copy(tmp.begin(), tmp.end(), &a.y(r, 0));
    }
  }, 16);
  return {};
}

Status rms_norm(ExecContext& ctx, RmsNormDesc const& d, RmsNormArgs const& a) {
  return detail::dispatch_cpu<RmsNorm>(ctx, d, a);
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the mHC family: ref/mhc_ref.hpp over rows.
#include <vector>

#include "ops/cpu_common.hpp"
#include "tessera/ops/mhc.hpp"
#include "tessera/ref/mhc_ref.hpp"

namespace tessera::ops {

Status MhcMix<Backend::kCpu>::check(MhcMixDesc const& d, MhcMixArgs const& a) {
  int64_t n = d.streams, nm = (2 + n) * n;
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.sinkhorn_iters >= 1, "mhc sinkhorn_iters must be >= 1");
  TESSERA_TRY(check_shape(a.x, {d.rows, n * d.dim}, "mhc_mix x"));
  TESSERA_TRY(check_shape(a.fn, {nm, n * d.dim}, "mhc_mix fn"));
  TESSERA_TRY(check_shape(a.base, {nm}, "mhc_mix base"));
  TESSERA_TRY(check_shape(a.scale, {3}, "mhc_mix scale"));
  TESSERA_TRY(check_shape(a.pre, {d.rows, n}, "mhc_mix pre"));
  TESSERA_TRY(check_shape(a.post, {d.rows, n}, "mhc_mix post"));
  return check_shape(a.comb, {d.rows, n * n}, "mhc_mix comb");
}

Status MhcMix<Backend::kCpu>::run(MhcMixDesc const& d, MhcMixArgs const& a, ExecContext& ctx) {
  int64_t n = d.streams;
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    std::vector<float> scratch(static_cast<size_t>(n * d.dim + (2 + n) * n));
    for (int64_t r = b; r < e; ++r)
      ref::mhc_mix_row(&a.x(r, 0), a.fn.data, a.base.data, a.scale.data, n, d.dim, d.sinkhorn_iters, d.hc_eps,
                       d.norm_eps, d.md, &a.pre(r, 0), &a.post(r, 0), &a.comb(r, 0), scratch.data());
  }, 4);
  return {};
}

Status MhcCollapse<Backend::kCpu>::check(MhcCollapseDesc const& d, MhcCollapseArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.x, {d.rows, d.streams * d.dim}, "mhc_collapse x"));
  TESSERA_TRY(check_shape(a.pre, {d.rows, d.streams}, "mhc_collapse pre"));
  return check_shape(a.out, {d.rows, d.dim}, "mhc_collapse out");
}

Status MhcCollapse<Backend::kCpu>::run(MhcCollapseDesc const& d, MhcCollapseArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      ref::mhc_collapse_row(&a.x(r, 0), &a.pre(r, 0), d.streams, d.dim, d.md, &a.out(r, 0));
  }, 16);
  return {};
}

Status MhcExpand<Backend::kCpu>::check(MhcExpandDesc const& d, MhcExpandArgs const& a) {
  int64_t n = d.streams;
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.y, {d.rows, d.dim}, "mhc_expand y"));
  TESSERA_TRY(check_shape(a.x, {d.rows, n * d.dim}, "mhc_expand x"));
  TESSERA_TRY(check_shape(a.post, {d.rows, n}, "mhc_expand post"));
  TESSERA_TRY(check_shape(a.comb, {d.rows, n * n}, "mhc_expand comb"));
  TESSERA_TRY(check_shape(a.out, {d.rows, n * d.dim}, "mhc_expand out"));
  TESSERA_CHECK(a.out.data != a.x.data || d.rows == 0, "mhc_expand out must not alias x");
  return {};
}

Status MhcExpand<Backend::kCpu>::run(MhcExpandDesc const& d, MhcExpandArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      ref::mhc_expand_row(&a.y(r, 0), &a.x(r, 0), &a.post(r, 0), &a.comb(r, 0), d.streams, d.dim, d.md,
                          &a.out(r, 0));
  }, 16);
  return {};
}

Status mhc_mix(ExecContext& ctx, MhcMixDesc const& d, MhcMixArgs const& a) {
  return detail::dispatch_cpu<MhcMix>(ctx, d, a);
}
Status mhc_collapse(ExecContext& ctx, MhcCollapseDesc const& d, MhcCollapseArgs const& a) {
  return detail::dispatch_cpu<MhcCollapse>(ctx, d, a);
}
Status mhc_expand(ExecContext& ctx, MhcExpandDesc const& d, MhcExpandArgs const& a) {
  return detail::dispatch_cpu<MhcExpand>(ctx, d, a);
}

}  // namespace tessera::ops

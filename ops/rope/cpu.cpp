// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the RoPE family: ref/rope_ref.hpp over rows and heads.
#include <vector>

#include "ops/cpu_common.hpp"
#include "tessera/ops/rope.hpp"
#include "tessera/ref/rope_ref.hpp"

namespace tessera::ops {

Status Rope<Backend::kCpu>::check(RopeDesc const& d, RopeArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.rope_dim % 2 == 0 && d.rope_dim <= d.head_dim, "rope_dim must be even and <= head_dim");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.heads * d.head_dim}, "rope x"));
  TESSERA_TRY(check_shape(a.positions, {d.rows}, "rope positions"));
  TESSERA_TRY(check_shape(a.inv_freq, {d.rope_dim / 2}, "rope inv_freq"));
  return {};
}

Status Rope<Backend::kCpu>::run(RopeDesc const& d, RopeArgs const& a, ExecContext& ctx) {
  int64_t half = d.rope_dim / 2;
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t r = b; r < e; ++r) {
      ref::rope_cos_sin(a.positions(r), a.inv_freq.data, half, d.md, c.data(), s.data());
      for (int64_t h = 0; h < d.heads; ++h)
        ref::rope_apply_row(&a.x(r, h * d.head_dim), d.head_dim, half, c.data(), s.data(), d.inverse, d.md);
    }
  }, 16);
  return {};
}

Status rope(ExecContext& ctx, RopeDesc const& d, RopeArgs const& a) { return detail::dispatch_cpu<Rope>(ctx, d, a); }

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the QAT fake-quantiser family: ref/qat_ref.hpp over rows.
#include "ops/cpu_common.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ref/qat_ref.hpp"

namespace tessera::ops {

Status FakeQuant<Backend::kCpu>::check(FakeQuantDesc const& d, FakeQuantArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  if (d.boundary_ulps > 0) TESSERA_TRY(check_shape(a.near_boundary, {d.rows}, "fake_quant near_boundary"));
  return check_shape(a.x, {d.rows, d.dim}, "fake_quant x");
}

Status FakeQuant<Backend::kCpu>::run(FakeQuantDesc const& d, FakeQuantArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    int64_t blk = ref::qat_block(d.kind);
    for (int64_t r = b; r < e; ++r) {
      if (d.boundary_ulps > 0) {
        bool near = false;
        for (int64_t i = 0; d.dim % blk == 0 && i < d.dim && !near; i += blk)
          near = ref::qat_block_near_boundary(&a.x(r, i), blk, d.kind, d.md, d.boundary_ulps);
        a.near_boundary(r) = near;
      }
      ref::qat_row(&a.x(r, 0), d.dim, d.kind, d.md);
    }
  }, 16);
  return {};
}

Status fake_quant(ExecContext& ctx, FakeQuantDesc const& d, FakeQuantArgs const& a) {
  return detail::dispatch_cpu<FakeQuant>(ctx, d, a);
}

}  // namespace tessera::ops

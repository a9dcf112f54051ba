// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the QAT fake-quantiser family: ref/qat_ref.hpp over rows.
#include "ops/cpu_common.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ref/qat_ref.hpp"

namespace tessera::ops {

Status FakeQuant<Backend::kCpu>::check(FakeQuantDesc const& d, FakeQuantArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  return check_shape(a.x, {d.rows, d.dim}, "fake_quant x");
}

Status FakeQuant<Backend::kCpu>::run(FakeQuantDesc const& d, FakeQuantArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) ref::qat_row(&a.x(r, 0), d.dim, d.kind, d.md);
  }, 16);
  return {};
}

Status fake_quant(ExecContext& ctx, FakeQuantDesc const& d, FakeQuantArgs const& a) {
  return detail::dispatch_cpu<FakeQuant>(ctx, d, a);
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the compressor family: ref/compressor_ref.hpp per group.
#include "ops/cpu_common.hpp"
#include "tessera/ops/compressor.hpp"
#include "tessera/ref/compressor_ref.hpp"

namespace tessera::ops {

Status CompressPool<Backend::kCpu>::check(CompressPoolDesc const& d, CompressPoolArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.ratio >= 2, "compress_pool needs ratio >= 2 (ratio 1 has no pooling)");
  TESSERA_TRY(check_shape(a.kv, {d.groups * d.ratio, d.dim}, "compress_pool kv"));
  TESSERA_TRY(check_shape(a.gate, {d.groups * d.ratio, d.dim}, "compress_pool gate"));
  return check_shape(a.out, {d.groups, d.dim}, "compress_pool out");
}

Status CompressPool<Backend::kCpu>::run(CompressPoolDesc const& d, CompressPoolArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.groups, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g)
      ref::compress_pool_group(&a.kv(g * d.ratio, 0), &a.gate(g * d.ratio, 0), d.ratio, d.dim, d.md, &a.out(g, 0));
  }, 8);
  return {};
}

Status compress_pool(ExecContext& ctx, CompressPoolDesc const& d, CompressPoolArgs const& a) {
  return detail::dispatch_cpu<CompressPool>(ctx, d, a);
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the QAT fake-quantiser family: ref/qat_ref.hpp over rows, and the packed rows' unpacking.
#include "ops/cpu_common.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ref/qat_ref.hpp"

namespace tessera::ops {

Status FakeQuant<Backend::kCpu>::check(FakeQuantDesc const& d, FakeQuantArgs const& a) { return check_fake_quant(d, a); }

Status FakeQuant<Backend::kCpu>::run(FakeQuantDesc const& d, FakeQuantArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    int64_t blk = ref::qat_block(d.kind);
    std::vector<float> row;
    for (int64_t r = b; r < e; ++r) {
      if (d.boundary_ulps > 0) {
        bool near = false;
        for (int64_t i = 0; d.dim % blk == 0 && i < d.dim && !near; i += blk)
          near = ref::qat_block_near_boundary(&a.x(r, i), blk, d.kind, d.md, d.boundary_ulps);
        a.near_boundary(r) = near;
      }
      if (a.packed.data != nullptr) {  // codes of the inputs (check: dim is a multiple of the block)
        row.resize(static_cast<size_t>(d.dim));
        for (int64_t i = 0; i < d.dim; ++i) row[static_cast<size_t>(i)] = a.x(r, i);
        ref::qat_pack_row(row.data(), d.dim, d.kind, &a.packed(r, 0));
      }
      ref::qat_row(&a.x(r, 0), d.dim, d.kind, d.md);
    }
  }, 16);
  return {};
}

Status fake_quant(ExecContext& ctx, FakeQuantDesc const& d, FakeQuantArgs const& a) {
  return detail::dispatch_cpu<FakeQuant>(ctx, d, a);
}

Status QatUnpack<Backend::kCpu>::check(QatUnpackDesc const& d, QatUnpackArgs const& a) { return check_qat_unpack(d, a); }

Status QatUnpack<Backend::kCpu>::run(QatUnpackDesc const& d, QatUnpackArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t const src = a.row_ids.data != nullptr ? a.row_ids(r) : r;
      int64_t const dst = a.out_rows.data != nullptr ? a.out_rows(r) : r;
      if (dst < 0 || dst >= a.out.shape[0]) continue;
      float* out = &a.out(dst, 0);
      if (src < 0 || src >= d.src_rows) {
        std::fill(out, out + d.dim, 0.f);
        continue;
      }
      int64_t const bytes = qat_packed_row_bytes(d.kind, d.dim);
      uint8_t const* packed = a.pages ? a.pages[src / a.rows_per_page] + (src % a.rows_per_page) * bytes : &a.packed(src, 0);
      for (int64_t i = 0; i < d.dim; ++i) out[i] = ref::qat_unpack_element(packed, d.dim, i, d.kind, d.md);
    }
  }, 16);
  return {};
}

}  // namespace tessera::ops

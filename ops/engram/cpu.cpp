// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the Engram family: ref/engram_ref.hpp per position.
#include <algorithm>
#include <vector>

#include "ops/cpu_common.hpp"
#include "tessera/ops/engram.hpp"
#include "tessera/ref/engram_ref.hpp"

namespace tessera::ops {

Status EngramHash<Backend::kCpu>::check(EngramHashDesc const& d, EngramHashArgs const& a) {
  int64_t c = (d.max_ngram - 1) * d.heads;
  TESSERA_CHECK(d.max_ngram >= 2 && d.heads >= 1, "engram_hash needs max_ngram >= 2 and heads >= 1");
  TESSERA_TRY(check_shape(a.lookback, {d.rows, d.max_ngram}, "engram_hash lookback"));
  TESSERA_TRY(check_shape(a.multipliers, {d.max_ngram}, "engram_hash multipliers"));
  TESSERA_TRY(check_shape(a.primes, {c}, "engram_hash primes"));
  TESSERA_TRY(check_shape(a.offsets, {c}, "engram_hash offsets"));
  TESSERA_TRY(check_shape(a.ids, {d.rows, c}, "engram_hash ids"));
  for (int64_t i = 0; i < c; ++i) TESSERA_CHECK(a.primes(i) > 0, "engram_hash primes must be positive");
  return {};
}

Status EngramHash<Backend::kCpu>::run(EngramHashDesc const& d, EngramHashArgs const& a, ExecContext&) {
  for (int64_t r = 0; r < d.rows; ++r)
    ref::engram_hash_row(&a.lookback(r, 0), a.multipliers.data, a.primes.data, a.offsets.data, d.max_ngram, d.heads,
                         &a.ids(r, 0));
  return {};
}

Status EngramGather<Backend::kCpu>::check(EngramGatherDesc const& d, EngramGatherArgs const& a) {
  TESSERA_TRY(check_shape(a.ids, {d.rows, d.columns}, "engram_gather ids"));
  TESSERA_TRY(check_shape(a.table, {d.table_rows, d.head_dim}, "engram_gather table"));
  TESSERA_TRY(check_shape(a.out, {d.rows, d.columns * d.head_dim}, "engram_gather out"));
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t c = 0; c < d.columns; ++c)
      TESSERA_CHECK(a.ids(r, c) >= 0 && a.ids(r, c) < d.table_rows, "engram_gather hash id outside the table");
  return {};
}

Status EngramGather<Backend::kCpu>::run(EngramGatherDesc const& d, EngramGatherArgs const& a, ExecContext&) {
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t c = 0; c < d.columns; ++c) {
      float const* src = &a.table(a.ids(r, c), 0);
      std::copy(src, src + d.head_dim, &a.out(r, c * d.head_dim));
    }
  return {};
}

Status EngramGate<Backend::kCpu>::check(EngramGateDesc const& d, EngramGateArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.x, {d.rows, d.streams * d.dim}, "engram_gate x"));
  TESSERA_TRY(check_shape(a.kv, {d.rows, (d.streams + 1) * d.dim}, "engram_gate kv"));
  TESSERA_TRY(check_shape(a.w, {d.streams * d.dim}, "engram_gate w"));
  return check_shape(a.out, {d.rows, d.streams * d.dim}, "engram_gate out");
}

Status EngramGate<Backend::kCpu>::run(EngramGateDesc const& d, EngramGateArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    std::vector<float> tmp(static_cast<size_t>(d.streams * d.dim));
    for (int64_t r = b; r < e; ++r) {
      float const* kv = &a.kv(r, 0);
      ref::engram_gate_row(&a.x(r, 0), kv, kv + d.streams * d.dim, a.w.data, d.streams, d.dim, d.eps, d.md, tmp.data());
      std::copy(tmp.begin(), tmp.end(), &a.out(r, 0));
    }
  }, 8);
  return {};
}

Status engram_hash(ExecContext& ctx, EngramHashDesc const& d, EngramHashArgs const& a) {
  return detail::dispatch_cpu<EngramHash>(ctx, d, a);
}
Status engram_gather(ExecContext& ctx, EngramGatherDesc const& d, EngramGatherArgs const& a) {
  return detail::dispatch_cpu<EngramGather>(ctx, d, a);
}
Status engram_gate(ExecContext& ctx, EngramGateDesc const& d, EngramGateArgs const& a) {
  return detail::dispatch_cpu<EngramGate>(ctx, d, a);
}

}  // namespace tessera::ops

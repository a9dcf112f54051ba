// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the MoE family: ref/moe_ref.hpp per token (route, then its experts in ascending id and
/// the shared expert last); block-scaled routed experts widened one weight row at a time (ops::scaled_weight).
#include <algorithm>
#include <string>
#include <vector>

#include "ops/cpu_common.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ref/moe_ref.hpp"

namespace tessera::ops {

Status MoeRoute<Backend::kCpu>::check(MoeRouteDesc const& d, MoeRouteArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.top_k >= 1 && d.top_k <= d.experts, "moe_route needs 1 <= top_k <= experts");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "moe_route x"));
  TESSERA_TRY(check_shape(a.gate, {d.experts, d.dim}, "moe_route gate"));
  if (a.bias.data) TESSERA_TRY(check_shape(a.bias, {d.experts}, "moe_route bias"));
  TESSERA_TRY(check_shape(a.weights, {d.rows, d.top_k}, "moe_route weights"));
  TESSERA_TRY(check_shape(a.ids, {d.rows, d.top_k}, "moe_route ids"));
  TESSERA_CHECK(d.prune_top_p > 0.f && d.prune_top_p <= 1.f, "moe_route needs 0 < prune_top_p <= 1");
  TESSERA_CHECK(d.prune_min_k >= 0, "moe_route needs prune_min_k >= 0");
  if (a.expert_mask.data) {
    TESSERA_TRY(check_shape(a.expert_mask, {d.experts}, "moe_route expert_mask"));
    int64_t open = 0;
    for (int64_t e = 0; e < d.experts; ++e) open += a.expert_mask(e) ? 0 : 1;
    TESSERA_CHECK(open >= d.top_k, "moe_route expert_mask leaves " + std::to_string(open) + " experts, fewer than top_k " +
                                       std::to_string(d.top_k));
  }
  return check_shape(a.cutoff_tie, {d.rows}, "moe_route cutoff_tie");
}

Status MoeRoute<Backend::kCpu>::run(MoeRouteDesc const& d, MoeRouteArgs const& a, ExecContext& ctx) {
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      a.cutoff_tie(r) = ref::moe_route_row(&a.x(r, 0), a.gate.data, a.bias.data, d.experts, d.dim, d.top_k, d.gate_temp,
                                           d.norm_top_k, d.routed_scale, &a.ids(r, 0), &a.weights(r, 0),
                                           a.expert_mask.data, d.md);
      if (d.prune_top_p < 1.f)
        ref::moe_prune_row(&a.ids(r, 0), &a.weights(r, 0), d.top_k, d.prune_top_p, d.prune_min_k, d.prune_renorm);
    }
  }, 8);
  return {};
}

namespace {

/// The shape of a block-scaled [rows, cols] weight's codes and scales in `fmt` (ops::Linear's layouts).
Status check_scaled(BlockScaledView const& v, DType fmt, int64_t rows, int64_t cols, char const* what) {
  bool const fp4 = fmt == DType::kF4E2m1x2;
  int64_t const kb = (cols + 31) / 32;
  TESSERA_CHECK(!fp4 || cols % 2 == 0, std::string(what) + ": fp4 weights need an even column count");
  TESSERA_TRY(check_shape(v.q, {rows, fp4 ? cols / 2 : cols}, what));
  TESSERA_TRY(check_shape(v.scale, {fp4 ? rows : (rows + 31) / 32, kb}, what));
  TESSERA_CHECK(rows == 0 || (v.q.data && v.q.stride[1] == 1 && v.scale.data && v.scale.stride[1] == 1),
                std::string(what) + " needs unit inner strides");
  return {};
}

}  // namespace

Status MoeExperts<Backend::kCpu>::check(MoeExpertsDesc const& d, MoeExpertsArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.weight_dtype == DType::kF32, "moe_experts: the CPU backend takes fp32 expert weights");
  bool const scaled = moe_routed_scaled(d);
  TESSERA_CHECK(scaled || d.routed_scaled == DType::kF32 || d.routed_scaled == d.weight_dtype,
                "moe_experts routed_scaled must be f8_e4m3, f4_e2m1x2 or unset");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "moe_experts x"));
  TESSERA_TRY(check_shape(a.ids, {d.rows, d.top_k}, "moe_experts ids"));
  TESSERA_TRY(check_shape(a.weights, {d.rows, d.top_k}, "moe_experts weights"));
  TESSERA_TRY(check_shape(a.out, {d.rows, d.dim}, "moe_experts out"));
  if (scaled) {
    TESSERA_CHECK(static_cast<int64_t>(a.w1_scaled.size()) == d.experts &&
                      static_cast<int64_t>(a.w3_scaled.size()) == d.experts &&
                      static_cast<int64_t>(a.w2_scaled.size()) == d.experts,
                  "moe_experts needs one w1/w3/w2 block-scaled view per expert (routed_scaled)");
    for (int64_t e = 0; e < d.experts; ++e) {
      TESSERA_TRY(check_scaled(a.w1_scaled[e], d.routed_scaled, d.inter, d.dim, "moe_experts w1 (block-scaled)"));
      TESSERA_TRY(check_scaled(a.w3_scaled[e], d.routed_scaled, d.inter, d.dim, "moe_experts w3 (block-scaled)"));
      TESSERA_TRY(check_scaled(a.w2_scaled[e], d.routed_scaled, d.dim, d.inter, "moe_experts w2 (block-scaled)"));
    }
  } else {
    TESSERA_CHECK(static_cast<int64_t>(a.w1.size()) == d.experts && static_cast<int64_t>(a.w2.size()) == d.experts &&
                      static_cast<int64_t>(a.w3.size()) == d.experts,
                  "moe_experts needs one w1/w2/w3 view per expert");
    for (int64_t e = 0; e < d.experts; ++e) {
      TESSERA_TRY(check_shape(a.w1[e], {d.inter, d.dim}, "moe_experts w1"));
      TESSERA_TRY(check_shape(a.w3[e], {d.inter, d.dim}, "moe_experts w3"));
      TESSERA_TRY(check_shape(a.w2[e], {d.dim, d.inter}, "moe_experts w2"));
    }
  }
  TESSERA_CHECK(moe_shared_scaled(d) || !d.shared_expert || d.shared_scaled == DType::kF32 ||
                    d.shared_scaled == d.weight_dtype,
                "moe_experts shared_scaled must be f8_e4m3, f4_e2m1x2 or unset");
  if (moe_shared_scaled(d)) {
    TESSERA_TRY(check_scaled(a.shared_w1_scaled, d.shared_scaled, d.inter, d.dim, "moe_experts shared w1 (block-scaled)"));
    TESSERA_TRY(check_scaled(a.shared_w3_scaled, d.shared_scaled, d.inter, d.dim, "moe_experts shared w3 (block-scaled)"));
    TESSERA_TRY(check_scaled(a.shared_w2_scaled, d.shared_scaled, d.dim, d.inter, "moe_experts shared w2 (block-scaled)"));
  } else if (d.shared_expert) {
    TESSERA_TRY(check_shape(a.shared_w1, {d.inter, d.dim}, "moe_experts shared w1"));
    TESSERA_TRY(check_shape(a.shared_w3, {d.inter, d.dim}, "moe_experts shared w3"));
    TESSERA_TRY(check_shape(a.shared_w2, {d.dim, d.inter}, "moe_experts shared w2"));
  }
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t i = 0; i < d.top_k; ++i)
      TESSERA_CHECK(a.ids(r, i) >= -1 && a.ids(r, i) < d.experts, "moe_experts expert id out of range");
  return {};
}

Status MoeExperts<Backend::kCpu>::run(MoeExpertsDesc const& d, MoeExpertsArgs const& a, ExecContext& ctx) {
  bool const scaled = moe_routed_scaled(d), shared_scaled = moe_shared_scaled(d);
  detail::cpu_pool(ctx).parallel_for(d.rows, [&](int64_t b, int64_t e) {
    std::vector<float> acc(static_cast<size_t>(d.dim)), scratch(static_cast<size_t>(2 * d.inter));
    std::vector<float> wrow(static_cast<size_t>(scaled || shared_scaled ? std::max(d.dim, d.inter) : 0));
    std::vector<std::pair<int32_t, float>> order(static_cast<size_t>(d.top_k));
    // Row r of a block-scaled expert weight widened to its values (one row at a time, read before the next).
    auto widen_as = [&](DType t, BlockScaledView const& v, int64_t r, int64_t cols) {
      scaled_weight_row(t, v.q.data, v.q.stride[0], v.scale.data, v.scale.stride[0], r, cols, wrow.data());
      return static_cast<float const*>(wrow.data());
    };
    auto widen = [&](BlockScaledView const& v, int64_t r, int64_t cols) { return widen_as(d.routed_scaled, v, r, cols); };
    for (int64_t r = b; r < e; ++r) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t i = 0; i < d.top_k; ++i) order[i] = {a.ids(r, i), a.weights(r, i)};
      std::sort(order.begin(), order.end(), [](auto const& x, auto const& y) { return x.first < y.first; });
      float const* x = &a.x(r, 0);
      for (auto const& [id, w] : order) {
        if (id < 0) continue;  // −1 = slot dropped by pruning
        if (scaled)
          ref::moe_expert_row_accumulate_rows(
              x, [&](int64_t i) { return widen(a.w1_scaled[id], i, d.dim); },
              [&](int64_t i) { return widen(a.w3_scaled[id], i, d.dim); },
              [&](int64_t o) { return widen(a.w2_scaled[id], o, d.inter); }, d.dim, d.inter, d.swiglu_limit, true, w,
              d.md, acc.data(), scratch.data());
        else
          ref::moe_expert_row_accumulate(x, a.w1[id].data, a.w3[id].data, a.w2[id].data, d.dim, d.inter, d.swiglu_limit,
                                         true, w, d.md, acc.data(), scratch.data());
      }
      if (shared_scaled)
        ref::moe_expert_row_accumulate_rows(
            x, [&](int64_t i) { return widen_as(d.shared_scaled, a.shared_w1_scaled, i, d.dim); },
            [&](int64_t i) { return widen_as(d.shared_scaled, a.shared_w3_scaled, i, d.dim); },
            [&](int64_t o) { return widen_as(d.shared_scaled, a.shared_w2_scaled, o, d.inter); }, d.dim, d.inter,
            d.swiglu_limit, false, 0.f, d.md, acc.data(), scratch.data());
      else if (d.shared_expert)
        ref::moe_expert_row_accumulate(x, a.shared_w1.data, a.shared_w3.data, a.shared_w2.data, d.dim, d.inter,
                                       d.swiglu_limit, false, 0.f, d.md, acc.data(), scratch.data());
      for (int64_t o = 0; o < d.dim; ++o) a.out(r, o) = ref::round_md(acc[o], d.md);
    }
  }, 2);
  return {};
}

Status moe_route(ExecContext& ctx, MoeRouteDesc const& d, MoeRouteArgs const& a) {
  return detail::dispatch_cpu<MoeRoute>(ctx, d, a);
}
Status moe_experts(ExecContext& ctx, MoeExpertsDesc const& d, MoeExpertsArgs const& a) {
  return detail::dispatch_cpu<MoeExperts>(ctx, d, a);
}

}  // namespace tessera::ops

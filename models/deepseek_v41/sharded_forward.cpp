// SPDX-License-Identifier: Apache-2.0
/// The sharded steps of one rank's forward (model_internal.hpp; plans in dist/plan.hpp). Each leaves
/// every rank with the full result of the single-rank step. Exactness: gathers move bits, and every
/// element computed here is the same fixed-order dot product (ref::dot) the single-rank step computes,
/// so only the attention all-reduce (AttnCombine::kAllReduce) can change a value:
///   single rank  out[o] = →md(dot(y[0..G·ro), wo_b[o]))                     (one ref::dot over all n)
///   all-reduce   out[o] = →md(Σ_r dot(y[g0_r·ro..g1_r·ro), wo_b[o, …]))        (rank-order sum of partials)
/// MoE combine: out = →md(Σ_{selected e ascending} y_e + y_shared) from a zero fp32 buffer, as
/// ops::moe_experts sums, whichever rank computed each y_e (0 + y = y for every y, and +0 vs −0 cannot
/// change a sum that starts from +0).
/// A weight held as a block-scaled slice (rank_weights) enters these dots as its values, the dequantised bf16
/// weights (ops::Linear's block-scaled weights, rows widened for wo_a and the routed experts): the same operands.
/// An EXL3 weight's part (slice_exl3) gives its outputs' bits of the whole EXL3 product: each output is its column's
/// float64 sum over all inputs and its own 128-block's output Hadamard, the same on every rank. Under the all-reduce
/// wo_b is an input split (spec/exl3.md §1.4): partial products, fp32 epilogue each, summed in rank order, →md once.
#include <algorithm>
#include <cstring>
#include <map>

#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/ops/engram.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ref/common_ref.hpp"
#include "tessera/ref/moe_ref.hpp"

namespace tessera::model::dsv41 {

namespace {

/// Each rank holds local [rows, widths[rank]]; returns [rows, Σ widths] with rank r's columns at
/// Σ_{q<r} widths[q] (all-gatherv, then a transpose of the rank blocks).
std::vector<float> gather_cols(RankShard const& sh, std::vector<float> const& local, int64_t rows,
                               std::vector<int64_t> const& widths) {
  int const n = static_cast<int>(widths.size());
  std::vector<size_t> bytes(static_cast<size_t>(n));
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    bytes[r] = static_cast<size_t>(rows * widths[r]) * sizeof(float);
    total += widths[r];
  }
  std::vector<float> recv(static_cast<size_t>(rows * total)), out(static_cast<size_t>(rows * total));
  throw_if_error(sh.comm->all_gatherv(local.data(), recv.data(), bytes));
  int64_t block = 0, col = 0;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(&out[i * total + col], &recv[block + i * widths[r]], widths[r] * sizeof(float));
    block += rows * widths[r];
    col += widths[r];
  }
  return out;
}

}  // namespace

int64_t shard_heads(RankShard const& sh) { return sh.me().heads.size(); }

void shard_attention_out(RankShard const& sh, ExecContext& ctx, ModelSpec const& s, Weights const& all, int64_t l,
                         std::vector<float> const& o, int64_t S, DType md, std::vector<float>& out) {
  LayerWeights const& w = all.layers[static_cast<size_t>(l)];
  StoredLinear const wo_b = stored_linear(all, scaled_weight_key(l, "wo_b"));
  dist::RankPlan const& me = sh.me();
  int64_t const hd = s.head_dim, ro = s.o_lora_rank, G = s.o_groups, D = s.hidden_size, hpg = s.num_heads / G, gw = hpg * hd;
  bool const tp = sh.plan.cfg.tp > 1;
  // Head outputs the rank's groups read: its own, or everyone's when groups span ranks.
  std::vector<float> full;
  std::vector<float> const* src = &o;
  int64_t heads_here = me.heads.size(), first_head = me.heads.begin;
  if (tp && me.gather_heads) {
    full = gather_cols(sh, o, S, widths_of(sh, [&](dist::RankPlan const& r) { return r.heads.size() * hd; }));
    src = &full;
    heads_here = s.num_heads;
    first_head = 0;
  }
  dist::Range const groups = tp ? me.groups : dist::Range{0, G};
  int64_t const Gl = groups.size();
  std::vector<float> y(static_cast<size_t>(S * Gl * ro));
  if (Exl3Weight const* qa = all.exl3_of(scaled_weight_key(l, "wo_a"))) {
    // EXL3: the grouped product over the held groups (their tile columns and svh, suh shared; spec/exl3.md §1.4),
    // group gi's input the head outputs of group groups.begin + gi.
    std::vector<float> xg(static_cast<size_t>(S * Gl * gw));
    for (int64_t r = 0; r < S; ++r)
      for (int64_t gi = 0; gi < Gl; ++gi) {
        float const* from = &(*src)[r * heads_here * hd + ((groups.begin + gi) * hpg - first_head) * hd];
        std::copy(from, from + gw, xg.begin() + (r * Gl + gi) * gw);
      }
    linear_exl3_grouped(ctx, xg.data(), S, *qa, Gl, y.data(), md);
  } else {
    // Rows of the groups in `groups` (all of them when replicated); a block-scaled slice widened for the call.
    Tensor const wa_t = dense_weight(w.wo_a, all.scaled_of(scaled_weight_key(l, "wo_a")));
    float const* wa = wa_t.data_as<float>();
    for (int64_t r = 0; r < S; ++r)
      for (int64_t gi = 0; gi < Gl; ++gi) {
        int64_t const g = groups.begin + gi;
        ref::linear_row_fma_seq(&(*src)[r * heads_here * hd + (g * hpg - first_head) * hd], wa + gi * ro * gw, gw, ro,
                                &y[r * Gl * ro + gi * ro], md);
      }
  }
  out.assign(static_cast<size_t>(S * D), 0.f);
  if (!tp) {
    linear(ctx, y.data(), S, w.wo_b, wo_b, out.data(), md);
    return;
  }
  if (!me.gather_heads && sh.plan.cfg.attn == dist::AttnCombine::kAllReduce) {
    // Partial sums over the rank's wo_b columns in fp32, summed across ranks, then rounded once.
    linear(ctx, y.data(), S, w.wo_b, wo_b, out.data(), DType::kF32);
    throw_if_error(sh.comm->all_reduce_sum(out.data(), out.data(), out.size()));
    for (float& v : out) v = ref::round_md(v, md);
    return;
  }
  // Gather modes: every rank gets all groups' y, computes its rows of wo_b with full dot products.
  std::vector<float> yall =
      me.gather_heads ? std::move(y)
                      : gather_cols(sh, y, S, widths_of(sh, [&](dist::RankPlan const& r) { return r.groups.size() * ro; }));
  std::vector<float> part(static_cast<size_t>(S * me.wo_b_rows.size()));
  linear(ctx, yall.data(), S, w.wo_b, wo_b, part.data(), md);
  out = gather_cols(sh, part, S, widths_of(sh, [](dist::RankPlan const& r) { return r.wo_b_rows.size(); }));
}

void shard_engram_gather(RankShard const& sh, ExecContext& ctx, EngramTables const& et, int64_t ei, Tensor const& table,
                         std::vector<int64_t> const& ids, int64_t S, int64_t de, std::vector<float>& out) {
  int64_t const C = et.columns();
  bool const sharded = sh.plan.world > 1 && sh.plan.cfg.engram == dist::EngramPlacement::kSharded;
  dist::Range const cols = sharded ? sh.me().engram_cols : dist::Range{0, C};
  int64_t const Cl = cols.size();
  int64_t const base = sharded && Cl > 0 ? et.offsets[ei * C + cols.begin] : 0;
  std::vector<int64_t> local_ids(static_cast<size_t>(S * Cl));
  for (int64_t r = 0; r < S; ++r)
    for (int64_t j = 0; j < Cl; ++j) local_ids[r * Cl + j] = ids[r * C + cols.begin + j] - base;
  std::vector<float> local(static_cast<size_t>(S * Cl * de));
  if (Cl > 0)
    throw_if_error(ops::engram_gather(
        ctx, {S, Cl, table.dim(0), de},
        {TensorView<int64_t const, 2>(local_ids.data(), {S, Cl}),
         TensorView<float const, 2>(table.data_as<float>(), {table.dim(0), table.dim(1)}),
         TensorView<float, 2>(local.data(), {S, Cl * de})}));
  if (!sharded) {
    out = std::move(local);
    return;
  }
  out = gather_cols(sh, local, S, widths_of(sh, [&](dist::RankPlan const& r) { return r.engram_cols.size() * de; }));
}

void shard_moe(RankShard const& sh, ExecContext& ctx, ModelSpec const& s, Weights const& all, int64_t l,
               std::vector<float> const& xa, std::vector<int32_t> const& ids, std::vector<float> const& wts, int64_t S,
               DType md, std::vector<float>& out) {
  LayerWeights const& w = all.layers[static_cast<size_t>(l)];
  dist::ShardingPlan const& p = sh.plan;
  dist::RankPlan const& me = sh.me();
  int64_t const D = s.hidden_size, I = s.moe_inter, K = s.top_k;
  float const L = s.swiglu_limit;
  bool const ep = p.cfg.ep > 1, tp = p.cfg.tp > 1;
  ThreadPool& pool = ctx.pool ? *ctx.pool : ThreadPool::global();

  // Routed experts: the rank's (token, slot) pairs in (token, slot) order, each y = 0 + f32(→md(w2·a)).
  auto owner = [&](int32_t id) {
    for (auto const& r : p.ranks)
      if (r.experts.contains(id)) return r.rank;
    return -1;
  };
  std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(p.world));  // per rank: s·K + k
  for (int64_t i = 0; i < S * K; ++i)
    if (ids[i] >= 0) pairs[ep ? owner(ids[i]) : sh.rank].push_back(i);
  auto const& mine = pairs[sh.rank];
  std::vector<float> local(mine.size() * D, 0.f);
  // EXL3 layers (check_exl3_weights: every expert linear EXL3 exactly when the shared expert's is) run
  // moe_experts_mixed's arithmetic: y = →md(EXL3_w2(act)) stored as is (the single-rank y of the slot).
  bool const exl3 = all.exl3_of(exl3_shared_key(l, "w1")) != nullptr;
  if (exl3) {
    // Each held expert's pairs as the rows of one call: the EXL3 linears are row-invariant.
    std::map<int32_t, std::vector<int64_t>> by_expert;  // expert id → indices into `mine`
    for (size_t j = 0; j < mine.size(); ++j) by_expert[ids[mine[j]]].push_back(static_cast<int64_t>(j));
    for (auto const& [e, js] : by_expert) {
      int64_t const m = static_cast<int64_t>(js.size());
      std::vector<float> xe(static_cast<size_t>(m * D)), we(static_cast<size_t>(m)), act(static_cast<size_t>(m * I)),
          ye(static_cast<size_t>(m * D));
      for (int64_t j = 0; j < m; ++j) {
        int64_t const i = mine[js[j]];
        std::copy(&xa[(i / K) * D], &xa[(i / K) * D] + D, xe.begin() + j * D);
        we[j] = wts[i];
      }
      ExpertWeights const& ex = w.experts[e];
      expert_act_mixed(ctx, xe.data(), m, ex.w1, all.exl3_of(scaled_expert_key(l, e, "w1")), ex.w3,
                       all.exl3_of(scaled_expert_key(l, e, "w3")), we.data(), L, md, act.data());
      linear(ctx, act.data(), m, ex.w2, all.exl3_of(scaled_expert_key(l, e, "w2")), ye.data(), md);
      for (int64_t j = 0; j < m; ++j) std::copy(ye.begin() + j * D, ye.begin() + (j + 1) * D, local.begin() + js[j] * D);
    }
  } else pool.parallel_for(static_cast<int64_t>(mine.size()), [&](int64_t b, int64_t e) {
    std::vector<float> scratch(static_cast<size_t>(2 * I)), wrow(static_cast<size_t>(std::max(D, I)));
    for (int64_t j = b; j < e; ++j) {
      int64_t const i = mine[j];
      ScaledWeight const* q[3];
      int k = 0;
      for (char const* wn : {"w1", "w3", "w2"}) q[k++] = all.scaled_of(scaled_expert_key(l, ids[i], wn));
      if (q[0]) {  // held as stored: each weight row widened to its values (MoeExperts<kCpu>'s routed_scaled)
        auto row = [&](ScaledWeight const& sw, int64_t r) {
          ops::scaled_weight_row(sw.dtype, sw.codes.data_as<uint8_t>(), sw.codes.dim(1), sw.scales.data_as<uint8_t>(),
                                 sw.scales.dim(1), r, sw.cols, wrow.data());
          return static_cast<float const*>(wrow.data());
        };
        ref::moe_expert_row_accumulate_rows(
            &xa[(i / K) * D], [&](int64_t r) { return row(*q[0], r); }, [&](int64_t r) { return row(*q[1], r); },
            [&](int64_t r) { return row(*q[2], r); }, D, I, L, true, wts[i], md, &local[j * D], scratch.data());
      } else {
        ExpertWeights const& ex = w.experts[ids[i]];
        ref::moe_expert_row_accumulate(&xa[(i / K) * D], ex.w1.data_as<float>(), ex.w3.data_as<float>(),
                                       ex.w2.data_as<float>(), D, I, L, true, wts[i], md, &local[j * D], scratch.data());
      }
    }
  });
  std::vector<float> Y(static_cast<size_t>(S * K * D), 0.f);
  if (ep) {
    std::vector<size_t> bytes;
    size_t total = 0;
    for (auto const& q : pairs) { bytes.push_back(q.size() * D * sizeof(float)); total += q.size() * D; }
    std::vector<float> recv(total);
    throw_if_error(sh.comm->all_gatherv(local.data(), recv.data(), bytes));
    size_t off = 0;
    for (auto const& q : pairs)
      for (int64_t i : q) {
        std::memcpy(&Y[i * D], &recv[off], D * sizeof(float));
        off += D;
      }
  } else {
    for (size_t j = 0; j < mine.size(); ++j) std::memcpy(&Y[mine[j] * D], &local[j * D], D * sizeof(float));
  }

  // Shared expert (ref::moe_expert_row_accumulate, unweighted, in two halves): a over the rank's rows of
  // w1/w3, gathered; then the rank's output rows of w2 with full-length dots, gathered.
  dist::Range const ir = tp ? me.shared_inter : dist::Range{0, I};
  dist::Range const orows = tp ? me.shared_rows : dist::Range{0, D};
  std::vector<float> a(static_cast<size_t>(S * ir.size()));
  float const *w1 = w.shared.w1.data_as<float>(), *w3 = w.shared.w3.data_as<float>(), *w2 = w.shared.w2.data_as<float>();
  if (exl3)
    expert_act_mixed(ctx, xa.data(), S, w.shared.w1, all.exl3_of(exl3_shared_key(l, "w1")), w.shared.w3,
                     all.exl3_of(exl3_shared_key(l, "w3")), nullptr, L, md, a.data());
  else pool.parallel_for(S, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t i = 0; i < ir.size(); ++i) {
        float g = ref::round_md(ref::gemm_dot(&xa[r * D], w1 + i * D, D, md), md);
        float u = ref::round_md(ref::gemm_dot(&xa[r * D], w3 + i * D, D, md), md);
        if (L > 0.f) { u = std::clamp(u, -L, L); g = std::min(g, L); }
        a[r * ir.size() + i] = ref::round_md(ref::silu(g, md) * u, md);
      }
  });
  if (tp) a = gather_cols(sh, a, S, widths_of(sh, [](dist::RankPlan const& r) { return r.shared_inter.size(); }));
  std::vector<float> ys(static_cast<size_t>(S * orows.size()));
  if (exl3) linear(ctx, a.data(), S, w.shared.w2, all.exl3_of(exl3_shared_key(l, "w2")), ys.data(), md);
  else pool.parallel_for(S, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t o = 0; o < orows.size(); ++o) ys[r * orows.size() + o] = ref::round_md(ref::gemm_dot(&a[r * I], w2 + o * I, I, md), md);
  });
  if (tp) ys = gather_cols(sh, ys, S, widths_of(sh, [](dist::RankPlan const& r) { return r.shared_rows.size(); }));

  // Combine in the single-rank order: ascending expert id from zero, the shared expert last, →md.
  out.assign(static_cast<size_t>(S * D), 0.f);
  std::vector<float> acc(static_cast<size_t>(D));
  std::vector<std::pair<int32_t, int64_t>> order(static_cast<size_t>(K));
  for (int64_t r = 0; r < S; ++r) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < K; ++k) order[k] = {ids[r * K + k], k};
    std::sort(order.begin(), order.end());
    for (auto const& [id, k] : order)
      if (id >= 0)
        for (int64_t o = 0; o < D; ++o) acc[o] += Y[(r * K + k) * D + o];
    for (int64_t o = 0; o < D; ++o) out[r * D + o] = ref::round_md(acc[o] + ys[r * D + o], md);
  }
}

void shard_head(RankShard const& sh, ExecContext& ctx, Weights const& w, float const* x, int64_t rows, int64_t D,
                int64_t V, DType md, float* logits) {
  StoredLinear const head = stored_linear(w, scaled_head_key());
  if (sh.plan.cfg.tp == 1) {
    linear(ctx, x, rows, w.lm_head, head, logits, md);
    return;
  }
  std::vector<float> local(static_cast<size_t>(rows * linear_out(w.lm_head, head)));
  linear(ctx, x, rows, w.lm_head, head, local.data(), md);
  auto all = gather_cols(sh, local, rows, widths_of(sh, [](dist::RankPlan const& r) { return r.vocab.size(); }));
  std::memcpy(logits, all.data(), static_cast<size_t>(rows * V) * sizeof(float));
}

}  // namespace tessera::model::dsv41

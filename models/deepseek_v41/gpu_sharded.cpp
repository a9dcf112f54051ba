// SPDX-License-Identifier: Apache-2.0
/// The sharded steps of a GPU rank model (gpu_forward.hpp; plans in dist/plan.hpp; the CPU rank model's
/// twin is sharded_forward.cpp). Each replaces the single-rank step it is named after, on the backend's
/// memory, and leaves every rank with that step's full-size result. Exactness: gathers move bits, and every
/// element computed here is the op the single-rank GPU model computes for it (the same family, Desc and
/// reduction order, on a slice of the weight rows), so only the attention all-reduce can change a value:
///   single rank  out[o] = →md(dot(y[0..G·ro), wo_b[o]))                        (one dot over all n)
///   all-reduce   out[o] = →md(Σ_r dot(y[g0_r·ro..g1_r·ro), wo_b[o, …]))        (the communicator's sum)
/// MoE: the routed experts run as MoeExperts over the rank's (token, slot) pairs with top_k 1 and no shared
/// expert, so pair p's row is →md(0 + y_p) = y_p (y_p is md already); the rows of all ranks are all-gathered,
/// and moe_combine sums each token's pairs in ascending expert id from a zero fp32 buffer, the shared
/// expert last, →md: ops::moe_experts' order whichever rank computed each y_p (0 + y = y, and +0 vs −0 cannot
/// change a sum that starts from +0). The shared expert is split by rows: its activation
/// a = →md(silu(→md(w1·x))·→md(w3·x)) over the rank's inter rows (Linear + moe_act), all-gathered, then the
/// rank's output rows →md(w2·a) with full-length dots, all-gathered: the dots of ref::moe_expert_row_accumulate
/// (ops::Linear and MoeExperts share ref::gemm_dot's order). Block-scaled slices (codes + scales, rank_weights) run
/// through the same ops' block-scaled weights, whose values are the dequantised bf16 weights. EXL3 parts (slice_exl3)
/// run through lin_exl3, whose kept outputs are bits of the whole EXL3 product (each output's sum over all inputs in
/// the whole group's order, its own 128-block's output Hadamard); the shared expert's EXL3 rows take Linear's place
/// with the single-rank exl3_moe_act roundings (→md of the products, of the activation, →fp16 as w2's input); a rank's
/// EXL3 routed experts run exl3_pairs, the single-rank grouped products on its pairs, row p = →md(0 + →md(y_p)).
///
/// Synchronisation: a collective's input must be finished when the communicator reads it, and the NCCL
/// communicator (like the host staging adapter) runs on its own stream; so the model's stream is
/// synchronised before every collective (collective_ready). A collective returns with its result in place,
/// so ops enqueued after it read the result.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "models/deepseek_v41/gpu_forward.hpp"
#include "tessera/ops/engram.hpp"
#include "tessera/ops/moe.hpp"

namespace tessera::model::dsv41 {

dist::Range GpuDsv41Model::Impl::engram_columns() const {
  int64_t const C = engram.columns();
  if (!shard || shard->plan.world == 1 || shard->plan.cfg.engram != dist::EngramPlacement::kSharded) return {0, C};
  return shard->me().engram_cols;
}

namespace fwd {

int64_t Forward::query_heads() const { return m_.shard ? m_.shard->me().heads.size() : m_.spec.num_heads; }

void Forward::collective_ready() { throw_if_error(s_.sync()); }

void Forward::gather_cols(float const* local, int64_t rows, std::vector<int64_t> const& widths, float* out) {
  RankShard const& sh = *m_.shard;
  int const n = static_cast<int>(widths.size());
  std::vector<size_t> bytes(static_cast<size_t>(n));
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    bytes[r] = static_cast<size_t>(rows * widths[r]) * sizeof(float);
    total += widths[r];
  }
  // One row: the rank blocks, back to back, are already that row's columns in order.
  float* recv = rows == 1 ? out : tmp_.get<float>(rows * total);
  collective_ready();
  throw_if_error(sh.comm->all_gatherv(local, recv, bytes));
  if (rows == 1) return;
  // Rank r's block [rows, w_r] at Σ_{q<r} rows·w_q → columns [col_r, col_r + w_r) of every row: one row-copy
  // launch per rank (copy_rows moves a fixed width).
  std::vector<gpu::RowCopy> t;
  t.reserve(static_cast<size_t>(n * rows));
  int64_t block = 0, col = 0;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < rows; ++i) t.push_back({recv + block + i * widths[r], out + i * total + col});
    block += rows * widths[r];
    col += widths[r];
  }
  gpu::RowCopy const* d = upload(t);
  for (int r = 0; r < n; ++r)
    if (widths[r] > 0) throw_if_error(gpu::copy_rows(s_, d + static_cast<int64_t>(r) * rows, rows, widths[r]));
}

void Forward::shard_attention_out(int64_t l, float const* o, float* out) {
  RankShard const& sh = *m_.shard;
  dist::RankPlan const& me = sh.me();
  ModelSpec const& s = m_.spec;
  gpu::GpuLayerWeights const& w = m_.w.layers[static_cast<size_t>(l)];
  DType const md = b_.md;
  int64_t const N = b_.rows, H = s.num_heads, hd = s.head_dim, ro = s.o_lora_rank, G = s.o_groups;
  int64_t const gw = H / G * hd;  // head-output columns of one group
  if (sh.plan.cfg.tp == 1) {  // every head and group on this rank: the single-rank output
    float* y = tmp_.get<float>(N * G * ro);
    lin(o, H * hd, N, w.wo_a, y, G * ro, md, 0, ro, gw, true, G);
    lin(y, N, w.wo_b, out, md);
    return;
  }
  float* yall = nullptr;  // [N, G·ro]: every group's wo_a output
  if (me.gather_heads) {
    // Groups span ranks: every head's output here, wo_a replicated.
    float* all = tmp_.get<float>(N * H * hd);
    gather_cols(o, N, widths_of(sh, [&](dist::RankPlan const& r) { return r.heads.size() * hd; }), all);
    yall = tmp_.get<float>(N * G * ro);
    lin(all, H * hd, N, w.wo_a, yall, G * ro, md, 0, ro, gw, true, G);
  } else {
    // The rank's heads are exactly its groups' heads: its wo_a rows over its own head outputs.
    int64_t const Gl = me.groups.size();
    float* y = tmp_.get<float>(N * Gl * ro);
    lin(o, Gl * gw, N, w.wo_a, y, Gl * ro, md, 0, ro, gw, true, Gl);
    if (sh.plan.cfg.attn == dist::AttnCombine::kAllReduce) {
      // Partial dots over the rank's wo_b columns in fp32, summed across ranks, then rounded once.
      lin(y, N, w.wo_b, out, DType::kF32);
      collective_ready();
      throw_if_error(sh.comm->all_reduce_sum(out, out, static_cast<size_t>(N * s.hidden_size)));
      if (md == DType::kBf16) throw_if_error(gpu::store_md(s_, out, s.hidden_size, N, s.hidden_size, out, s.hidden_size, true));
      return;
    }
    yall = tmp_.get<float>(N * G * ro);
    gather_cols(y, N, widths_of(sh, [&](dist::RankPlan const& r) { return r.groups.size() * ro; }), yall);
  }
  // Gather modes: the rank's wo_b rows with full-length dots, all-gathered.
  float* part = tmp_.get<float>(N * me.wo_b_rows.size());
  lin(yall, N, w.wo_b, part, md);
  gather_cols(part, N, widths_of(sh, [](dist::RankPlan const& r) { return r.wo_b_rows.size(); }), out);
}

void Forward::shard_engram_rows(int64_t ei, DevTensor const& table, float* rows) {
  RankShard const& sh = *m_.shard;
  int64_t const N = b_.rows, C = m_.engram.columns(), de = m_.spec.engram_head_dim;
  dist::Range const cols = m_.engram_columns();
  int64_t const Cu = cols.size();
  bool const sharded = Cu != C || (sh.plan.world > 1 && sh.plan.cfg.engram == dist::EngramPlacement::kSharded);
  float* local = sharded ? tmp_.get<float>(N * Cu * de) : rows;
  if (Cu > 0)
    run<ops::EngramGather>(ctx_, ops::EngramGatherDesc{N, Cu, table.rows, de},
                           ops::EngramGatherArgs{TensorView<int64_t const, 2>(b_.d_hash + ei * N * Cu, {N, Cu}, kDev),
                                                 dcv2(table), dv2(local, N, Cu * de)});
  if (sharded) gather_cols(local, N, widths_of(sh, [&](dist::RankPlan const& r) { return r.engram_cols.size() * de; }), rows);
}

void Forward::shard_moe(int64_t l, float const* xa, float const* rw, int32_t const* rid, int64_t N, float* F) {
  RankShard const& sh = *m_.shard;
  dist::ShardingPlan const& p = sh.plan;
  ModelSpec const& s = m_.spec;
  gpu::GpuExperts const& mx = m_.w.layers[static_cast<size_t>(l)].moe;
  DType const md = b_.md;
  bool const bf16 = md == DType::kBf16, ep = p.cfg.ep > 1, tp = p.cfg.tp > 1;
  int64_t const D = s.hidden_size, I = s.moe_inter, K = s.top_k, E = s.n_experts;
  int64_t const held = static_cast<int64_t>(mx.w1.size()), e0 = m_.first_expert;

  // The routing on the host: the all-gather's sizes and the combine order are host decisions.
  std::vector<int32_t> ids(static_cast<size_t>(N * K));
  std::vector<float> wts(static_cast<size_t>(N * K));
  throw_if_error(s_.copy(ids.data(), rid, ids.size() * sizeof(int32_t), Copy::kDevToHost));
  throw_if_error(s_.copy(wts.data(), rw, wts.size() * sizeof(float), Copy::kDevToHost));
  throw_if_error(s_.sync());
  // (token, slot) pairs i = r·K + k per owning rank, ascending i; slots dropped by pruning (id −1) run nowhere.
  std::vector<int> owner_of(static_cast<size_t>(E), sh.rank);
  if (ep)
    for (auto const& r : p.ranks)
      for (int64_t e = r.experts.begin; e < r.experts.end; ++e) owner_of[static_cast<size_t>(e)] = r.rank;
  std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(p.world));
  for (int64_t i = 0; i < N * K; ++i)
    if (ids[i] >= 0 && ids[i] < E) pairs[static_cast<size_t>(owner_of[static_cast<size_t>(ids[i])])].push_back(i);
  std::vector<int64_t> const& mine = pairs[static_cast<size_t>(sh.rank)];
  int64_t const P = static_cast<int64_t>(mine.size());

  // The rank's pairs: x rows gathered, one (local expert, weight) each; y_p = →md(0 + y) = y per pair.
  float* local = tmp_.get<float>(P * D);
  if (P > 0) {
    if (held == 0) throw Error(Status(StatusCode::kInternal, "forward: pairs routed to a rank without experts"));
    float* xg = tmp_.get<float>(P * D);
    std::vector<gpu::RowCopy> rows(static_cast<size_t>(P));
    std::vector<int32_t> pid(static_cast<size_t>(P));
    std::vector<float> pw(static_cast<size_t>(P));
    for (int64_t j = 0; j < P; ++j) {
      int64_t const i = mine[j];
      rows[j] = {xa + (i / K) * D, xg + j * D};
      pid[j] = static_cast<int32_t>(ids[i] - e0);
      pw[j] = wts[i];
    }
    throw_if_error(gpu::copy_rows(s_, upload(rows), P, D));
    int32_t const* d_pid = upload(pid);
    float const* d_pw = upload(pw);
    if (mx.routed_exl3) {
      // EXL3 experts (every expert linear of the layer, check_exl3_weights): the pairs as P tokens of top_k 1 over
      // the held experts, through the single-rank model's grouped EXL3 products (exl3_routed).
      exl3_pairs(l, xg, d_pid, d_pw, P, local);
    } else {
      auto* const* table = static_cast<void const* const*>(mx.ptrs);
      auto* const* scale_table = static_cast<void const* const*>(mx.scale_ptrs);
      bool const scaled = mx.routed_scaled != DType::kF32;  // codes in `table`, scales in `scale_table`
      std::vector<CF2> hw1, hw3, hw2;  // the CPU backend's views of the same weights (fp32, or codes + scales)
      std::vector<ops::BlockScaledView> hq1, hq3, hq2;
      if (kDev == Device::kCpu)
        for (int64_t e = 0; e < held; ++e) {
          if (scaled) {
            hq1.push_back(scaled_view(mx.w1[e]));
            hq3.push_back(scaled_view(mx.w3[e]));
            hq2.push_back(scaled_view(mx.w2[e]));
            continue;
          }
          hw1.push_back(dcv2(mx.w1[e]));
          hw3.push_back(dcv2(mx.w3[e]));
          hw2.push_back(dcv2(mx.w2[e]));
        }
      constexpr int64_t kMaxRows = 65535;  // MoeExperts' rows per launch
      for (int64_t c0 = 0; c0 < P; c0 += kMaxRows) {
        int64_t const n = std::min(kMaxRows, P - c0);
        ops::MoeExpertsDesc ed{n, held, D, I, 1, s.swiglu_limit, false, md};
        // Dense experts: their dtype. Block-scaled: the dense dtype the backend's op pairs them with (the CPU op's
        // fp32; CUDA's bf16 = md, the only numerics with stored experts).
        ed.weight_dtype = !scaled ? mx.w1.front().dtype : kDev == Device::kCpu ? DType::kF32 : DType::kBf16;
        ed.routed_scaled = mx.routed_scaled;
        ops::MoeExpertsArgs ma{};
        ma.x = dcv2(xg + c0 * D, n, D);
        ma.ids = TensorView<int32_t const, 2>(d_pid + c0, {n, 1}, kDev);
        ma.weights = dcv2(d_pw + c0, n, 1);
        ma.out = dv2(local + c0 * D, n, D);
        ma.dev.w1 = table;
        ma.dev.w3 = table + held;
        ma.dev.w2 = table + 2 * held;
        if (scaled) {
          ma.dev.s1 = scale_table;
          ma.dev.s3 = scale_table + held;
          ma.dev.s2 = scale_table + 2 * held;
        }
        ma.w1 = hw1;
        ma.w3 = hw3;
        ma.w2 = hw2;
        ma.w1_scaled = hq1;
        ma.w3_scaled = hq3;
        ma.w2_scaled = hq2;
        run<ops::MoeExperts>(ctx_, ed, ma);
      }
    }
  }
  // Every rank's pair outputs in rank order (EP), else the rank's own (all pairs).
  float* Y = local;
  std::vector<int64_t> first(static_cast<size_t>(p.world), 0);  // index in Y of each rank's first pair
  if (ep) {
    std::vector<size_t> bytes;
    int64_t total = 0;
    for (size_t q = 0; q < pairs.size(); ++q) {
      first[q] = total;
      bytes.push_back(pairs[q].size() * static_cast<size_t>(D) * sizeof(float));
      total += static_cast<int64_t>(pairs[q].size());
    }
    Y = tmp_.get<float>(total * D);
    collective_ready();
    throw_if_error(sh.comm->all_gatherv(local, Y, bytes));
  }
  // Combine lists: token r's pairs by ascending expert id (a token's experts are distinct).
  std::vector<int64_t> where(static_cast<size_t>(N * K), -1);
  for (size_t q = 0; q < pairs.size(); ++q)
    for (size_t j = 0; j < pairs[q].size(); ++j) where[static_cast<size_t>(pairs[q][j])] = first[q] + static_cast<int64_t>(j);
  std::vector<int64_t> off(static_cast<size_t>(N + 1), 0);
  std::vector<int32_t> list;
  list.reserve(static_cast<size_t>(N * K));
  std::vector<int64_t> slots(static_cast<size_t>(K));
  for (int64_t r = 0; r < N; ++r) {
    std::iota(slots.begin(), slots.end(), r * K);
    std::sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) { return ids[a] != ids[b] ? ids[a] < ids[b] : a < b; });
    for (int64_t i : slots)
      if (where[static_cast<size_t>(i)] >= 0) list.push_back(static_cast<int32_t>(where[static_cast<size_t>(i)]));
    off[r + 1] = static_cast<int64_t>(list.size());
  }
  if (list.empty()) list.push_back(0);  // an upload of at least one entry; off names none of it

  // Shared expert: the rank's inter rows of the activation, gathered; its output rows, gathered.
  int64_t const Il = mx.s1.rows, Dl = mx.s2.rows;
  float* g = tmp_.get<float>(N * Il);
  float* u = tmp_.get<float>(N * Il);
  float* act = tmp_.get<float>(N * Il);
  lin(xa, N, mx.s1, g, md);
  lin(xa, N, mx.s3, u, md);
  throw_if_error(gpu::moe_act(s_, g, u, N, Il, s.swiglu_limit, bf16, act));
  float* a = act;
  if (tp) {
    a = tmp_.get<float>(N * I);
    gather_cols(act, N, widths_of(sh, [](dist::RankPlan const& r) { return r.shared_inter.size(); }), a);
  }
  float* ys = tmp_.get<float>(N * Dl);
  lin(a, N, mx.s2, ys, md);
  if (tp) {
    float* all = tmp_.get<float>(N * D);
    gather_cols(ys, N, widths_of(sh, [](dist::RankPlan const& r) { return r.shared_rows.size(); }), all);
    ys = all;
  }
  throw_if_error(gpu::moe_combine(s_, Y, upload(off), upload(list), ys, N, D, bf16, F));
}

void Forward::shard_head(float const* x, int64_t rows, float* logits) {
  RankShard const& sh = *m_.shard;
  DevTensor const& head = m_.w.lm_head;
  if (sh.plan.cfg.tp == 1) {
    lin(x, rows, head, logits, b_.md);
    return;
  }
  float* local = tmp_.get<float>(rows * head.rows);
  lin(x, rows, head, local, b_.md);
  gather_cols(local, rows, widths_of(sh, [](dist::RankPlan const& r) { return r.vocab.size(); }), logits);
}

}  // namespace fwd

}  // namespace tessera::model::dsv41

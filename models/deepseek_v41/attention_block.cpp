// SPDX-License-Identifier: Apache-2.0
/// The attention sub-block of one layer over a chunk (spec/deepseek-v41.md §2.5): projections, RoPE,
/// FP8 window KV, the compressor of KV sources (ratio 1 per token; ratio r > 1 gated pooling with the
/// partial group buffered across calls), the indexer (keys of new groups, scores, candidate blocks,
/// top-k), the compressed KV cache (RoPE at the group's first position, FP4), the sink attention over the
/// visible window plus the selected compressed entries, the inverse RoPE and the grouped output.
#include <algorithm>
#include <cmath>
#include <string>

#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/ops/compressor.hpp"
#include "tessera/ops/indexer.hpp"
#include "tessera/ops/norm.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ops/rope.hpp"
#include "tessera/ref/common_ref.hpp"

namespace tessera::model::dsv41 {

namespace {

using F2 = TensorView<float, 2>;
using CF2 = TensorView<float const, 2>;
using CF1 = TensorView<float const, 1>;

F2 v2(std::vector<float>& v, int64_t r, int64_t c) { return F2(v.data(), {r, c}); }
CF2 cv2(std::vector<float> const& v, int64_t r, int64_t c) { return CF2(v.data(), {r, c}); }
CF1 cv1(Tensor const& t) { return CF1(t.data_as<float>(), {t.numel()}); }
CF1 cv1(std::vector<float> const& v) { return CF1(v.data(), {static_cast<int64_t>(v.size())}); }
TensorView<int64_t const, 1> pos1(std::vector<int64_t> const& p) {
  return TensorView<int64_t const, 1>(p.data(), {static_cast<int64_t>(p.size())});
}

void norm_rows(ExecContext& ctx, std::vector<float>& x, int64_t rows, int64_t dim, Tensor const& w, float eps, DType md) {
  throw_if_error(ops::rms_norm(ctx, {rows, dim, eps, true, md}, {cv2(x, rows, dim), cv1(w), v2(x, rows, dim)}));
}
void rope_rows(ExecContext& ctx, std::vector<float>& x, int64_t rows, int64_t heads, int64_t hd, int64_t rd,
               std::vector<int64_t> const& pos, std::vector<float> const& inv_freq, bool inverse, DType md) {
  throw_if_error(ops::rope(ctx, {rows, heads, hd, rd, inverse, md}, {v2(x, rows, heads * hd), pos1(pos), cv1(inv_freq)}));
}
/// Quantises rows in place; with `ulps` > 0 records rows that met a rounding boundary.
void quant_rows(ExecContext& ctx, std::vector<float>& x, int64_t rows, int64_t dim, ops::QatKind kind, DType md,
                int ulps = 0, std::vector<QuantBoundary>* events = nullptr, QuantBoundary::Site site = {},
                int32_t layer = 0, std::vector<int64_t> const* pos = nullptr) {
  std::vector<uint8_t> near(ulps > 0 ? rows : 0);
  throw_if_error(ops::fake_quant(ctx, {rows, dim, kind, md, ulps},
                                 {v2(x, rows, dim), TensorView<uint8_t, 1>(near.data(), {static_cast<int64_t>(near.size())})}));
  for (int64_t r = 0; r < static_cast<int64_t>(near.size()); ++r)
    if (near[r]) events->push_back({site, layer, (*pos)[r]});
}
void append(std::vector<float>& dst, std::vector<float> const& src) { dst.insert(dst.end(), src.begin(), src.end()); }

}  // namespace

void Dsv41Model::attention_block(int64_t l, Dsv41State& st, Chunk& c, std::vector<float> const& xa,
                                 std::vector<float>& out) {
  ModelSpec const& s = spec_;
  LayerWeights const& w = w_.layers[l];
  LayerState& ls = st.layers_[l];
  ExecContext& ctx = c.ctx;
  DType md = c.md;
  int64_t S = c.rows, D = s.hidden_size, H = shard_ ? shard_heads(*shard_) : s.num_heads, hd = s.head_dim, R = s.rope_dim, qr = s.q_lora_rank;
  int64_t ratio = s.compress_ratios[l];
  std::vector<float> const& table = ratio ? compress_inv_freq_ : main_inv_freq_;
  std::string const pfx = "model.layers." + std::to_string(l) + ".attn.";

  // Projections (§2.5.2).
  std::vector<float> q_res(S * qr), q(S * H * hd), kv(S * hd);
  linear(ctx, xa.data(), S, w.wq_a, q_(l, "wq_a"), q_res.data(), md);
  norm_rows(ctx, q_res, S, qr, w.q_norm, s.rms_eps, md);
  linear(ctx, q_res.data(), S, w.wq_b, q_(l, "wq_b"), q.data(), md);
  rope_rows(ctx, q, S, H, hd, R, c.pos, table, false, md);
  linear(ctx, xa.data(), S, w.wkv, q_(l, "wkv"), kv.data(), md);
  norm_rows(ctx, kv, S, hd, w.kv_norm, s.rms_eps, md);
  rope_rows(ctx, kv, S, 1, hd, R, c.pos, table, false, md);
  int const bu = opts_.boundary_ulps;
  auto* bev = &st.boundaries_;
  int32_t const li = static_cast<int32_t>(l);
  quant_rows(ctx, kv, S, hd, ops::QatKind::kFp8Block32, md, bu, bev, QuantBoundary::Site::kWindowKv, li, &c.pos);

  if (ratio > 0) {
    // Compressor (§2.5.3): latents of the groups completing in this chunk, pre-RoPE.
    std::vector<float> lat;
    std::vector<int64_t> lat_pos;
    int64_t groups = 0;
    if (s.is_kv_source(l)) {
      if (ratio == 1) {
        groups = S;
        lat.resize(S * hd);
        linear(ctx, xa.data(), S, w.c_wkv, q_(l, "c_wkv"), lat.data(), md);
        norm_rows(ctx, lat, S, hd, w.c_norm, s.rms_eps, md);
        for (int64_t g = 0; g < S; ++g) lat_pos.push_back(ls.entry_count + g);
      } else {
        // fp32 GEMMs of the fp32 input with the upcast weights, appended behind the buffered rows.
        std::vector<float> a(S * hd), g(S * hd);
        linear(ctx, xa.data(), S, w.c_wkv, q_(l, "c_wkv"), a.data(), DType::kF32);
        linear(ctx, xa.data(), S, w.c_wgate, q_(l, "c_wgate"), g.data(), DType::kF32);
        append(ls.buf_kv, a);
        append(ls.buf_gate, g);
        append(ls.raw_kv, a);
        append(ls.raw_gate, g);
        for (int64_t r = 0; r < S; ++r) ls.raw_pos.push_back(c.pos[r]);
        int64_t keep_raw = opts_.max_rollback + ratio, have_raw = static_cast<int64_t>(ls.raw_pos.size());
        if (have_raw > keep_raw) {
          ls.raw_kv.erase(ls.raw_kv.begin(), ls.raw_kv.begin() + (have_raw - keep_raw) * hd);
          ls.raw_gate.erase(ls.raw_gate.begin(), ls.raw_gate.begin() + (have_raw - keep_raw) * hd);
          ls.raw_pos.erase(ls.raw_pos.begin(), ls.raw_pos.begin() + (have_raw - keep_raw));
        }
        int64_t buffered = static_cast<int64_t>(ls.buf_kv.size()) / hd;
        groups = buffered / ratio;
        if (groups > 0) {
          lat.resize(groups * hd);
          throw_if_error(ops::compress_pool(ctx, {groups, ratio, hd, md},
                                            {cv2(ls.buf_kv, groups * ratio, hd), cv2(ls.buf_gate, groups * ratio, hd),
                                             v2(lat, groups, hd)}));
          norm_rows(ctx, lat, groups, hd, w.c_norm, s.rms_eps, md);
          ls.buf_kv.erase(ls.buf_kv.begin(), ls.buf_kv.begin() + groups * ratio * hd);
          ls.buf_gate.erase(ls.buf_gate.begin(), ls.buf_gate.begin() + groups * ratio * hd);
        }
        for (int64_t j = 0; j < groups; ++j) lat_pos.push_back(ls.entry_count * ratio + j * ratio);
      }
      if (groups > 0) tap(pfx + "compressor.out0", {1, groups, hd}, lat);
    }

    // Indexer (§2.5.4).
    if (s.is_index_source(l)) {
      int64_t Hi = s.index_n_heads, di = s.index_head_dim;
      if (s.is_kv_source(l)) {
        if (groups > 0) {
          std::vector<float> k(groups * di);
          linear(ctx, lat.data(), groups, w.i_wk, q_(l, "i_wk"), k.data(), md);
          norm_rows(ctx, k, groups, di, w.i_k_norm, s.rms_eps, md);
          rope_rows(ctx, k, groups, 1, di, R, lat_pos, compress_inv_freq_, false, md);
          quant_rows(ctx, k, groups, di, ops::QatKind::kFp4Block32Ue8m0, md, bu, bev, QuantBoundary::Site::kIndexKey, li,
                     &lat_pos);
          append(ls.index_k, k);
        }
        c.idx_src = l;
      }
      std::vector<float> const* keys = c.idx_src >= 0 ? &st.layers_[c.idx_src].index_k : nullptr;
      int64_t T = keys ? static_cast<int64_t>(keys->size()) / di : 0;
      if (T > 0) {
        tap(pfx + "indexer.index_k", {1, 1, T, di}, *keys);
        std::vector<float> qi(S * Hi * di), wts(S * Hi), scores(S * T);
        linear(ctx, q_res.data(), S, w.i_wq_b, q_(l, "i_wq_b"), qi.data(), md);
        rope_rows(ctx, qi, S, Hi, di, R, c.pos, compress_inv_freq_, false, md);
        quant_rows(ctx, qi, S, Hi * di, ops::QatKind::kFp4Block32Ue8m0, md, bu, bev, QuantBoundary::Site::kIndexQuery, li,
                   &c.pos);
        linear(ctx, xa.data(), S, w.i_weights_proj, q_(l, "i_weights_proj"), wts.data(), md);
        float hs = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Hi)));
        for (float& x : wts) x = x * hs;
        float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(di)));
        throw_if_error(ops::index_score(ctx, {S, Hi, di, T, ratio, scale},
                                        {cv2(qi, S, Hi * di), cv2(wts, S, Hi), cv2(*keys, T, di), pos1(c.pos),
                                         v2(scores, S, T)}));
        std::vector<uint8_t> ties(S);
        TensorView<uint8_t const, 2> mask;
        if (l == s.candidate_source_layer) {
          c.cand.assign(S * T, 0);
          throw_if_error(ops::candidate_blocks(
              ctx, {S, T, ratio, s.candidate_block_size, s.candidate_topk_blocks},
              {cv2(scores, S, T), pos1(c.pos), TensorView<uint8_t, 2>(c.cand.data(), {S, T}),
               TensorView<uint8_t, 1>(ties.data(), {S})}));
          c.has_cand = true;
          for (int64_t r = 0; r < S; ++r)
            if (ties[r]) {
              ++st.ties_.candidate;
              st.ties_.events.push_back({CutoffTie::Site::kCandidateBlocks, static_cast<int32_t>(l), c.pos[r]});
            }
          if (tap_) {
            std::vector<float> cf(c.cand.begin(), c.cand.end());
            tap(pfx + "indexer.candidates", {1, S, T}, cf);
          }
        } else if (s.candidate_source_layer >= 0 && s.candidate_source_layer < l && c.has_cand &&
                   static_cast<int64_t>(c.cand.size()) == S * T) {
          mask = TensorView<uint8_t const, 2>(c.cand.data(), {S, T});
          if (tap_) {
            std::vector<float> cf(c.cand.begin(), c.cand.end());
            tap(pfx + "indexer.candidates", {1, S, T}, cf);
          }
        }
        int64_t K = s.index_topk;
        std::vector<int32_t> sel(S * K);
        throw_if_error(ops::index_topk(ctx, {S, T, K},
                                       {v2(scores, S, T), mask, TensorView<int32_t, 2>(sel.data(), {S, K}),
                                        TensorView<uint8_t, 1>(ties.data(), {S})}));
        for (int64_t r = 0; r < S; ++r)
          if (ties[r]) {
            ++st.ties_.indexer;
            st.ties_.events.push_back({CutoffTie::Site::kIndexer, static_cast<int32_t>(l), c.pos[r]});
          }
        c.has_topk = true;
        c.topk.assign(S, {});
        for (int64_t r = 0; r < S; ++r) {
          for (int64_t i = 0; i < K; ++i)
            if (sel[r * K + i] >= 0) c.topk[r].push_back(sel[r * K + i]);
          std::sort(c.topk[r].begin(), c.topk[r].end());
        }
        if (tap_) {
          std::vector<float> bias(S * T, -INFINITY);
          for (int64_t r = 0; r < S; ++r)
            for (int32_t j : c.topk[r]) bias[r * T + j] = 0.f;
          tap(pfx + "indexer.topk_bias", {1, 1, S, T}, bias);
        }
      }
    }

    // Compressed KV cache: RoPE at each group's first position, FP4 with e4m3 scales (§2.5.3).
    if (groups > 0) {
      rope_rows(ctx, lat, groups, 1, hd, R, lat_pos, compress_inv_freq_, false, md);
      quant_rows(ctx, lat, groups, hd, ops::QatKind::kFp4Block16E4m3, md, bu, bev, QuantBoundary::Site::kCompressedKv, li,
                 &lat_pos);
      append(ls.ckv, lat);
      ls.entry_count += groups;
    }
    if (s.is_kv_source(l)) c.ckv_src = l;
  }

  // Key pool: [old window rows | chunk rows | compressed entries]; per-row key lists (§2.5.5).
  int64_t W = s.sliding_window;
  int64_t n_old = static_cast<int64_t>(ls.window_pos.size());
  std::vector<float> const* ckv = (ratio > 0 && c.ckv_src >= 0) ? &st.layers_[c.ckv_src].ckv : nullptr;
  int64_t T = ckv ? static_cast<int64_t>(ckv->size()) / hd : 0;
  bool use_ckv = T > 0 && c.has_topk;
  std::vector<float> pool;
  pool.reserve((n_old + S + (use_ckv ? T : 0)) * hd);
  append(pool, ls.window);
  append(pool, kv);
  if (use_ckv) append(pool, *ckv);
  std::vector<int64_t> offs(S + 1, 0);
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < S; ++r) {
    int64_t p = c.pos[r];
    for (int64_t i = 0; i < n_old; ++i)
      if (ls.window_pos[i] > p - W) ids.push_back(static_cast<int32_t>(i));
    for (int64_t j = 0; j <= r; ++j)
      if (c.pos[j] > p - W) ids.push_back(static_cast<int32_t>(n_old + j));
    if (use_ckv)
      for (int32_t e : c.topk[r])
        if (e < T) ids.push_back(static_cast<int32_t>(n_old + S + e));
    offs[r + 1] = static_cast<int64_t>(ids.size());
  }
  int64_t nk = static_cast<int64_t>(pool.size()) / hd;
  // bf16: each listed key's column in the golden engine's logit row, laid out as in its one-shot forward of the
  // sequence up to the query (position p): window keys at their positions, compressed entry j at p + 1 + j, the
  // sink last, at p + 1 + T(p) with T(p) = ⌊(p + 1)/r⌋ the entries of the ratio-r source up to p. A function of
  // (p, key) alone, so every row is laid out the same whatever the chunking (ref/attention_ref.hpp).
  std::vector<int32_t> key_cols, sink_cols;
  if (md == DType::kBf16) {
    int64_t const src_ratio = ckv ? s.compress_ratios[c.ckv_src] : 0;
    for (int64_t r = 0; r < S; ++r) {
      int64_t const p = c.pos[r];
      for (int64_t i = offs[r]; i < offs[r + 1]; ++i) {
        int64_t const id = ids[i];
        int64_t const col = id < n_old ? ls.window_pos[id] : id < n_old + S ? c.pos[id - n_old] : p + 1 + (id - n_old - S);
        key_cols.push_back(static_cast<int32_t>(col));
      }
      sink_cols.push_back(static_cast<int32_t>(p + 1 + (src_ratio > 0 ? (p + 1) / src_ratio : 0)));
    }
  }
  std::vector<float> o(S * H * hd);
  std::vector<float> probs(tap_ ? H * ids.size() : 0);
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  throw_if_error(ops::attention(
      ctx, {S, H, hd, nk, scale, md},
      {cv2(q, S, H * hd), cv2(pool, nk, hd), TensorView<int64_t const, 1>(offs.data(), {S + 1}),
       TensorView<int32_t const, 1>(ids.data(), {static_cast<int64_t>(ids.size())}), cv1(w.attn_sink),
       v2(o, S, H * hd), tap_ ? v2(probs, H, static_cast<int64_t>(ids.size())) : F2(),
       TensorView<int32_t const, 1>(md == DType::kBf16 ? key_cols.data() : nullptr, {static_cast<int64_t>(key_cols.size())}),
       TensorView<int32_t const, 1>(md == DType::kBf16 ? sink_cols.data() : nullptr, {static_cast<int64_t>(sink_cols.size())})}));
  if (tap_) {
    // The golden layout: [1, H, S, n_old + S + T] over the concatenated key axis, 0 where masked.
    int64_t cols = nk;
    std::vector<float> full(H * S * cols, 0.f);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < S; ++r)
        for (int64_t i = offs[r]; i < offs[r + 1]; ++i) full[(h * S + r) * cols + ids[i]] = probs[h * ids.size() + i];
    tap(pfx + "out1", {1, H, S, cols}, full);
  }

  // Output (§2.5.6): inverse RoPE with the query's table, grouped wo_a, wo_b.
  rope_rows(ctx, o, S, H, hd, R, c.pos, table, true, md);
  if (shard_) {
    shard_attention_out(*shard_, ctx, s, w_, l, o, S, md, out);  // the rank's groups + the plan's combine
  } else {
    int64_t G = s.o_groups, ro = s.o_lora_rank, gw = H * hd / G;
    std::vector<float> y(S * G * ro);
    StoredLinear const qa = q_(l, "wo_a");
    if (qa.exl3) {
      linear_exl3_grouped(ctx, o.data(), S, *qa.exl3, G, y.data(), md);
    } else {
      // A block-scaled wo_a is widened to its values for the call (its groups need not start on scale blocks).
      Tensor const wa_t = dense_weight(w.wo_a, qa.scaled);
      float const* wa = wa_t.data_as<float>();
      for (int64_t r = 0; r < S; ++r)
        for (int64_t g = 0; g < G; ++g)
          ref::linear_row_fma_seq(&o[r * H * hd + g * gw], wa + g * ro * gw, gw, ro, &y[r * G * ro + g * ro], md);
    }
    out.assign(S * D, 0.f);
    linear(ctx, y.data(), S, w.wo_b, q_(l, "wo_b"), out.data(), md);
  }

  // Window ring: keep the last W−1 entries plus the rollback reserve.
  append(ls.window, kv);
  for (int64_t r = 0; r < S; ++r) ls.window_pos.push_back(c.pos[r]);
  int64_t keep = W - 1 + opts_.max_rollback, have = static_cast<int64_t>(ls.window_pos.size());
  if (have > keep) {
    ls.window.erase(ls.window.begin(), ls.window.begin() + (have - keep) * hd);
    ls.window_pos.erase(ls.window_pos.begin(), ls.window_pos.begin() + (have - keep));
  }
}

}  // namespace tessera::model::dsv41

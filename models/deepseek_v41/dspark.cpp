// SPDX-License-Identifier: Apache-2.0
/// DSpark (include/tessera/models/deepseek_v41/dspark.hpp, spec/deepseek-v41.md §2.8): the `mtp.*`
/// loader, the target-feature record kept in the sequence state, the block draft pass (all rows in one
/// pass, or row by row for the consistency test) with Markov chaining and the confidence head, and the
/// per-sequence drafter.
#include "tessera/models/deepseek_v41/dspark.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/ops/mhc.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/norm.hpp"
#include "tessera/ops/rope.hpp"
#include "tessera/ref/common_ref.hpp"

namespace tessera::model::dsv41 {

namespace {

using F2 = TensorView<float, 2>;
using CF2 = TensorView<float const, 2>;
using CF1 = TensorView<float const, 1>;
CF2 cv2(Tensor const& t) { return CF2(t.data_as<float>(), {t.dim(0), t.dim(1)}); }
CF1 cv1(Tensor const& t) { return CF1(t.data_as<float>(), {t.numel()}); }

#define TRY_ASSIGN(dst, expr)    \
  do {                           \
    auto r_ = (expr);            \
    if (!r_) return r_.status(); \
    dst = std::move(*r_);        \
  } while (0)

/// `mtp.{b}.<suffix>` (native) or `model.mtp.{b}.<suffix>`, shape-checked, bf16-rounded unless fp32-kept.
class MtpLoader {
 public:
  MtpLoader(WeightSource const& src, Numerics num) : src_(src), num_(num) {}
  Result<Tensor> get(int64_t b, std::vector<std::string> const& suffixes, std::vector<int64_t> const& shape,
                     bool keep_fp32 = false) const {
    std::vector<std::string> names;
    for (auto const& s : suffixes) names.push_back("mtp." + std::to_string(b) + "." + s);
    for (auto const& s : suffixes) names.push_back("model.mtp." + std::to_string(b) + "." + s);
    for (auto const& n : names) {
      if (!src_.contains(n)) continue;
      auto sh = src_.shape(n);
      if (!sh) return sh.status();
      if (*sh != shape)
        return malformed(src_.describe() + ": DSpark tensor " + n + " has shape " + shape_to_string(*sh) +
                         ", expected " + shape_to_string(shape));
      auto t = src_.load_f32(n);
      if (!t) return t.status();
      if (!keep_fp32 && num_ == Numerics::kBf16) {
        float* p = t->data_as<float>();
        for (int64_t i = 0; i < t->numel(); ++i) p[i] = round_to_bf16(p[i]);
      }
      return t;
    }
    std::string also;
    for (size_t i = 1; i < names.size(); ++i) also += (i > 1 ? ", " : "") + names[i];
    return not_found(src_.describe() + ": missing DSpark tensor " + names.front() + " (also looked for " + also + ")");
  }

 private:
  WeightSource const& src_;
  Numerics num_;
};

Status load_block(ModelSpec const& s, MtpLoader const& ld, int64_t b, LayerWeights& w) {
  int64_t D = s.hidden_size, n = s.hc_mult, nm = (2 + n) * n, hd = s.head_dim, H = s.num_heads;
  int64_t I = s.moe_inter, E = s.dspark.n_experts;
  TRY_ASSIGN(w.hc_attn_fn, ld.get(b, {"hc_attn_fn"}, {nm, n * D}, true));
  TRY_ASSIGN(w.hc_attn_base, ld.get(b, {"hc_attn_base"}, {nm}, true));
  TRY_ASSIGN(w.hc_attn_scale, ld.get(b, {"hc_attn_scale"}, {3}, true));
  TRY_ASSIGN(w.hc_ffn_fn, ld.get(b, {"hc_ffn_fn"}, {nm, n * D}, true));
  TRY_ASSIGN(w.hc_ffn_base, ld.get(b, {"hc_ffn_base"}, {nm}, true));
  TRY_ASSIGN(w.hc_ffn_scale, ld.get(b, {"hc_ffn_scale"}, {3}, true));
  TRY_ASSIGN(w.attn_norm, ld.get(b, {"attn_norm.weight"}, {D}));
  TRY_ASSIGN(w.ffn_norm, ld.get(b, {"ffn_norm.weight"}, {D}));
  TRY_ASSIGN(w.wq_a, ld.get(b, {"attn.wq_a.weight"}, {s.q_lora_rank, D}));
  TRY_ASSIGN(w.q_norm, ld.get(b, {"attn.q_norm.weight"}, {s.q_lora_rank}));
  TRY_ASSIGN(w.wq_b, ld.get(b, {"attn.wq_b.weight"}, {H * hd, s.q_lora_rank}));
  TRY_ASSIGN(w.wkv, ld.get(b, {"attn.wkv.weight"}, {hd, D}));
  TRY_ASSIGN(w.kv_norm, ld.get(b, {"attn.kv_norm.weight"}, {hd}));
  TRY_ASSIGN(w.wo_a, ld.get(b, {"attn.wo_a.weight"}, {s.o_groups * s.o_lora_rank, H * hd / s.o_groups}));
  TRY_ASSIGN(w.wo_b, ld.get(b, {"attn.wo_b.weight"}, {D, s.o_groups * s.o_lora_rank}));
  TRY_ASSIGN(w.attn_sink, ld.get(b, {"attn.attn_sink"}, {H}, true));
  TRY_ASSIGN(w.gate, ld.get(b, {"ffn.gate.weight"}, {E, D}));
  TRY_ASSIGN(w.gate_bias, ld.get(b, {"ffn.gate.bias"}, {E}, true));
  w.experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    std::string p = "ffn.experts." + std::to_string(e) + ".";
    TRY_ASSIGN(w.experts[e].w1, ld.get(b, {p + "w1.weight"}, {I, D}));
    TRY_ASSIGN(w.experts[e].w3, ld.get(b, {p + "w3.weight"}, {I, D}));
    TRY_ASSIGN(w.experts[e].w2, ld.get(b, {p + "w2.weight"}, {D, I}));
  }
  TRY_ASSIGN(w.shared.w1, ld.get(b, {"ffn.shared_experts.w1.weight"}, {I, D}));
  TRY_ASSIGN(w.shared.w3, ld.get(b, {"ffn.shared_experts.w3.weight"}, {I, D}));
  TRY_ASSIGN(w.shared.w2, ld.get(b, {"ffn.shared_experts.w2.weight"}, {D, I}));
  return {};
}

}  // namespace

Result<std::shared_ptr<DsparkWeights const>> load_dspark_weights(ModelSpec const& s, WeightSource const& src,
                                                                 Numerics num) {
  if (s.dspark.blocks <= 0) return std::shared_ptr<DsparkWeights const>();
  if (!src.contains("mtp.0.main_proj.weight") && !src.contains("model.mtp.0.main_proj.weight"))
    return std::shared_ptr<DsparkWeights const>();  // a text-only checkpoint: no drafter
  TESSERA_TRY(s.validate_dspark());
  MtpLoader ld(src, num);
  auto w = std::make_shared<DsparkWeights>();
  int64_t const D = s.hidden_size, T = static_cast<int64_t>(s.dspark.target_layers.size()), B = s.dspark.blocks;
  int64_t const V = s.vocab_size, r = s.dspark.markov_rank;
  w->blocks.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) TESSERA_TRY(load_block(s, ld, b, w->blocks[b]));
  TRY_ASSIGN(w->main_proj, ld.get(0, {"main_proj.weight"}, {D, T * D}));
  TRY_ASSIGN(w->main_norm, ld.get(0, {"main_norm.weight"}, {D}));
  TRY_ASSIGN(w->norm, ld.get(B - 1, {"norm.weight"}, {D}));
  TRY_ASSIGN(w->markov_embed, ld.get(B - 1, {"markov_head.embed.weight"}, {V, r}));
  TRY_ASSIGN(w->markov_head, ld.get(B - 1, {"markov_head.head.weight"}, {V, r}));
  TRY_ASSIGN(w->confidence, ld.get(B - 1, {"confidence_head.weight", "confidence_head.proj.weight"}, {1, D + r}, true));
  return std::shared_ptr<DsparkWeights const>(std::move(w));
}

void Dsv41Model::dspark_record(Dsv41State& st, int64_t layer, std::vector<float> const& X) const {
  auto const& tl = spec_.dspark.target_layers;
  auto it = std::find(tl.begin(), tl.end(), layer);
  if (it == tl.end()) return;
  int64_t const j = it - tl.begin(), T = static_cast<int64_t>(tl.size()), D = spec_.hidden_size, n = spec_.hc_mult;
  int64_t const S = static_cast<int64_t>(X.size()) / (n * D), TD = T * D;
  DType const md = opts_.numerics == Numerics::kBf16 ? DType::kBf16 : DType::kF32;
  if (st.dspark_taps_.empty()) st.dspark_tap_first_ = st.length_;
  int64_t const row0 = st.length_ - st.dspark_tap_first_;  // rows = positions first … length − 1, then the chunk
  if (j == 0) st.dspark_taps_.resize(static_cast<size_t>((row0 + S) * TD), 0.f);
  for (int64_t r = 0; r < S; ++r)
    for (int64_t c = 0; c < D; ++c) {
      float sum = 0.f;  // streams in order 0 … n−1
      for (int64_t k = 0; k < n; ++k) sum += X[static_cast<size_t>(r * n * D + k * D + c)];
      st.dspark_taps_[static_cast<size_t>((row0 + r) * TD + j * D + c)] = ref::round_md(sum / static_cast<float>(n), md);
    }
  if (j == T - 1) {  // keep the last W + max_rollback positions: a pass reads W, rollback reaches max_rollback
    int64_t const keep = spec_.sliding_window + opts_.max_rollback, have = row0 + S;
    if (have > keep) {
      st.dspark_taps_.erase(st.dspark_taps_.begin(), st.dspark_taps_.begin() + (have - keep) * TD);
      st.dspark_tap_first_ += have - keep;
    }
  }
}

void Dsv41Model::dspark_truncate(Dsv41State& st, int64_t length) const {
  int64_t const TD = static_cast<int64_t>(spec_.dspark.target_layers.size()) * spec_.hidden_size;
  int64_t const rows = std::max<int64_t>(0, length - st.dspark_tap_first_);
  st.dspark_taps_.resize(static_cast<size_t>(std::min<int64_t>(rows * TD, static_cast<int64_t>(st.dspark_taps_.size()))));
  if (st.dspark_taps_.empty()) st.dspark_tap_first_ = length;
}

Result<DsparkPass> Dsv41Model::dspark_draft(Dsv41State const& st, int32_t anchor, int64_t row_step) const {
  if (!dspark_) return not_supported("DSpark: the checkpoint has no mtp.* weights");
  ModelSpec const& s = spec_;
  DsparkWeights const& w = *dspark_;
  if (anchor < 0 || anchor >= s.vocab_size) return invalid_argument("DSpark: anchor token " + std::to_string(anchor) + " outside the vocabulary");
  int64_t const L = st.length_;
  if (L < 1) return invalid_argument("DSpark: the sequence holds no token yet (no target features)");
  int64_t const B = s.dspark.block_size, D = s.hidden_size, n = s.hc_mult, nD = n * D, W = s.sliding_window;
  int64_t const T = static_cast<int64_t>(s.dspark.target_layers.size()), TD = T * D, V = s.vocab_size;
  int64_t const H = s.num_heads, hd = s.head_dim, R = s.rope_dim, qr = s.q_lora_rank, r = s.dspark.markov_rank;
  int64_t const p0 = std::max<int64_t>(0, L - W), C = L - p0;  // context positions (a − W, a], a = L − 1
  if (p0 < st.dspark_tap_first_ || st.dspark_tap_first_ + static_cast<int64_t>(st.dspark_taps_.size()) / TD < L)
    return invalid_argument("DSpark: the state lacks target features of positions " + std::to_string(p0) + " … " +
                          std::to_string(L - 1));
  int64_t const step = row_step > 0 ? row_step : B;
  try {
    ExecContext ctx;
    ctx.pool = opts_.pool;
    DType const md = opts_.numerics == Numerics::kBf16 ? DType::kBf16 : DType::kF32;
    // Row-wise ops run on rows [r0, r0 + m) in chunks of `step` (one chunk = the one-pass block).
    auto rows = [&](auto&& fn) {
      for (int64_t r0 = 0; r0 < B; r0 += step) fn(r0, std::min(B, r0 + step) - r0);
    };
    auto norm = [&](float* x, int64_t m, int64_t dim, Tensor const& g) {
      throw_if_error(ops::rms_norm(ctx, {m, dim, s.rms_eps, true, md}, {CF2(x, {m, dim}), cv1(g), F2(x, {m, dim})}));
    };
    auto rope = [&](float* x, int64_t m, int64_t heads, int64_t const* pos, bool inverse) {
      throw_if_error(ops::rope(ctx, {m, heads, hd, R, inverse, md},
                               {F2(x, {m, heads * hd}), TensorView<int64_t const, 1>(pos, {m}), CF1(main_inv_freq_.data(), {static_cast<int64_t>(main_inv_freq_.size())})}));
    };
    std::vector<int64_t> qpos(B), cpos(C);
    for (int64_t i = 0; i < B; ++i) qpos[i] = L + i;
    for (int64_t i = 0; i < C; ++i) cpos[i] = p0 + i;

    // Context features c[p] = main_norm(main_proj(F[p])) (computed once per pass; context rows are not
    // block rows, so they are not split by `step`).
    std::vector<float> cf(C * D);
    float const* feat = st.dspark_taps_.data() + (p0 - st.dspark_tap_first_) * TD;
    linear(ctx, feat, C, w.main_proj, cf.data(), md);
    norm(cf.data(), C, D, w.main_norm);

    // Block input: embed(anchor), embed(noise) …, n equal streams, one-hot pre.
    std::vector<float> X(B * nD), X2(B * nD), pre(B * n, 0.f);
    float const* emb = w_.embed.data_as<float>();
    for (int64_t i = 0; i < B; ++i) {
      int64_t const tok = i == 0 ? anchor : s.dspark.noise_token;
      for (int64_t k = 0; k < n; ++k) std::memcpy(&X[i * nD + k * D], emb + tok * D, D * sizeof(float));
      pre[i * n] = 1.f;
    }
    std::vector<float> h(B * D), xa(B * D), A(B * D), F(B * D);
    std::vector<float> a_pre(B * n), a_post(B * n), a_comb(B * n * n), f_pre(B * n), f_post(B * n), f_comb(B * n * n);
    ops::MhcMixDesc const mix_desc{0, n, D, static_cast<int>(s.hc_sinkhorn_iters), s.hc_eps, s.rms_eps, md};
    for (LayerWeights const& lw : w.blocks) {
      // Attention site.
      rows([&](int64_t r0, int64_t m) {
        ops::MhcMixDesc d = mix_desc;
        d.rows = m;
        throw_if_error(ops::mhc_mix(ctx, d, {CF2(&X[r0 * nD], {m, nD}), cv2(lw.hc_attn_fn), cv1(lw.hc_attn_base),
                                             cv1(lw.hc_attn_scale), F2(&a_pre[r0 * n], {m, n}), F2(&a_post[r0 * n], {m, n}),
                                             F2(&a_comb[r0 * n * n], {m, n * n})}));
        throw_if_error(ops::mhc_collapse(ctx, {m, n, D, md}, {CF2(&X[r0 * nD], {m, nD}), CF2(&pre[r0 * n], {m, n}), F2(&h[r0 * D], {m, D})}));
        throw_if_error(ops::rms_norm(ctx, {m, D, s.rms_eps, true, md}, {CF2(&h[r0 * D], {m, D}), cv1(lw.attn_norm), F2(&xa[r0 * D], {m, D})}));
      });
      // Keys/values: kv_norm(wkv(·)) + RoPE over [context ; block rows]; queries from the block rows.
      std::vector<float> pool((C + B) * hd), q_res(B * qr), q(B * H * hd), o(B * H * hd);
      linear(ctx, cf.data(), C, lw.wkv, pool.data(), md);
      norm(pool.data(), C, hd, lw.kv_norm);
      rope(pool.data(), C, 1, cpos.data(), false);
      rows([&](int64_t r0, int64_t m) {
        float* kv = &pool[(C + r0) * hd];
        linear(ctx, &xa[r0 * D], m, lw.wkv, kv, md);
        norm(kv, m, hd, lw.kv_norm);
        rope(kv, m, 1, &qpos[r0], false);
        linear(ctx, &xa[r0 * D], m, lw.wq_a, &q_res[r0 * qr], md);
        norm(&q_res[r0 * qr], m, qr, lw.q_norm);
        linear(ctx, &q_res[r0 * qr], m, lw.wq_b, &q[r0 * H * hd], md);
        rope(&q[r0 * H * hd], m, H, &qpos[r0], false);
      });
      float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
      rows([&](int64_t r0, int64_t m) {
        // Every query sees all C context keys and all B block keys (bidirectional inside the block).
        std::vector<int64_t> offs(m + 1);
        std::vector<int32_t> ids;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t k = 0; k < C + B; ++k) ids.push_back(static_cast<int32_t>(k));
          offs[i + 1] = static_cast<int64_t>(ids.size());
        }
        throw_if_error(ops::attention(
            ctx, {m, H, hd, C + B, scale, md},
            {CF2(&q[r0 * H * hd], {m, H * hd}), CF2(pool.data(), {C + B, hd}), TensorView<int64_t const, 1>(offs.data(), {m + 1}),
             TensorView<int32_t const, 1>(ids.data(), {static_cast<int64_t>(ids.size())}), cv1(lw.attn_sink),
             F2(&o[r0 * H * hd], {m, H * hd}), F2()}));
        rope(&o[r0 * H * hd], m, H, &qpos[r0], true);
        int64_t const G = s.o_groups, ro = s.o_lora_rank, gw = H * hd / G;
        std::vector<float> y(m * G * ro);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t g = 0; g < G; ++g)
            ref::linear_row(&o[(r0 + i) * H * hd + g * gw], lw.wo_a.data_as<float>() + g * ro * gw, gw, ro, &y[i * G * ro + g * ro], md);
        linear(ctx, y.data(), m, lw.wo_b, &A[r0 * D], md);
        throw_if_error(ops::mhc_expand(ctx, {m, n, D, md}, {CF2(&A[r0 * D], {m, D}), CF2(&X[r0 * nD], {m, nD}), CF2(&a_post[r0 * n], {m, n}),
                                                            CF2(&a_comb[r0 * n * n], {m, n * n}), F2(&X2[r0 * nD], {m, nD})}));
      });
      std::swap(X, X2);
      // FFN site: the draft MoE (dspark_n_routed_experts, top dspark_num_experts_per_tok, shared expert).
      int64_t const E = s.dspark.n_experts, K = s.dspark.top_k;
      std::vector<TensorView<float const, 2>> w1, w3, w2;
      for (auto const& ex : lw.experts) { w1.push_back(cv2(ex.w1)); w3.push_back(cv2(ex.w3)); w2.push_back(cv2(ex.w2)); }
      rows([&](int64_t r0, int64_t m) {
        ops::MhcMixDesc d = mix_desc;
        d.rows = m;
        throw_if_error(ops::mhc_mix(ctx, d, {CF2(&X[r0 * nD], {m, nD}), cv2(lw.hc_ffn_fn), cv1(lw.hc_ffn_base), cv1(lw.hc_ffn_scale),
                                             F2(&f_pre[r0 * n], {m, n}), F2(&f_post[r0 * n], {m, n}), F2(&f_comb[r0 * n * n], {m, n * n})}));
        throw_if_error(ops::mhc_collapse(ctx, {m, n, D, md}, {CF2(&X[r0 * nD], {m, nD}), CF2(&a_pre[r0 * n], {m, n}), F2(&h[r0 * D], {m, D})}));
        throw_if_error(ops::rms_norm(ctx, {m, D, s.rms_eps, true, md}, {CF2(&h[r0 * D], {m, D}), cv1(lw.ffn_norm), F2(&xa[r0 * D], {m, D})}));
        std::vector<float> rw(m * K);
        std::vector<int32_t> rid(m * K);
        std::vector<uint8_t> tie(m);
        ops::MoeRouteDesc rd{m, E, D, K, s.gate_temp, s.routed_scale, s.norm_topk_prob};
        rd.md = md;  // softplus in the model dtype's arithmetic, as the target model's router
        throw_if_error(ops::moe_route(ctx, rd,
                                      {CF2(&xa[r0 * D], {m, D}), cv2(lw.gate), cv1(lw.gate_bias), F2(rw.data(), {m, K}),
                                       TensorView<int32_t, 2>(rid.data(), {m, K}), TensorView<uint8_t, 1>(tie.data(), {m})}));
        ops::MoeExpertsArgs ma{CF2(&xa[r0 * D], {m, D}), TensorView<int32_t const, 2>(rid.data(), {m, K}), CF2(rw.data(), {m, K}), w1, w3, w2,
                               cv2(lw.shared.w1), cv2(lw.shared.w3), cv2(lw.shared.w2), F2(&F[r0 * D], {m, D})};
        throw_if_error(ops::moe_experts(ctx, {m, E, D, s.moe_inter, K, s.swiglu_limit, true, md}, ma));
        throw_if_error(ops::mhc_expand(ctx, {m, n, D, md}, {CF2(&F[r0 * D], {m, D}), CF2(&X[r0 * nD], {m, nD}), CF2(&f_post[r0 * n], {m, n}),
                                                            CF2(&f_comb[r0 * n * n], {m, n * n}), F2(&X2[r0 * nD], {m, nD})}));
      });
      std::swap(X, X2);
      std::swap(pre, f_pre);
    }

    // Output: h = collapse with the last pre, base logits = lm_head(norm(h)), all rows in one pass.
    DsparkPass out;
    out.anchor_position = L;
    out.hidden.resize(B * D);
    out.base_logits.resize(B * V);
    rows([&](int64_t r0, int64_t m) {
      throw_if_error(ops::mhc_collapse(ctx, {m, n, D, md}, {CF2(&X[r0 * nD], {m, nD}), CF2(&pre[r0 * n], {m, n}), F2(&out.hidden[r0 * D], {m, D})}));
      throw_if_error(ops::rms_norm(ctx, {m, D, s.rms_eps, true, md}, {CF2(&out.hidden[r0 * D], {m, D}), cv1(w.norm), F2(&xa[r0 * D], {m, D})}));
      linear(ctx, &xa[r0 * D], m, w_.lm_head, stored_linear(w_, scaled_head_key()), &out.base_logits[r0 * V], md);
    });
    // Markov chaining (semi-autoregressive) and the fp32 confidence head.
    out.markov.resize(B * r);
    std::vector<float> bias(V), z(D + r);
    float const* cw = w.confidence.data_as<float>();
    int32_t prev = anchor;
    for (int64_t i = 0; i < B; ++i) {
      float* mi = &out.markov[i * r];
      std::memcpy(mi, w.markov_embed.data_as<float>() + prev * r, r * sizeof(float));
      linear(ctx, mi, 1, w.markov_head, bias.data(), md);
      float const* base = &out.base_logits[i * V];
      int32_t best = 0;
      float best_v = base[0] + bias[0];
      for (int64_t v = 1; v < V; ++v)
        if (float const x = base[v] + bias[v]; x > best_v) best_v = x, best = static_cast<int32_t>(v);
      std::memcpy(z.data(), &out.hidden[i * D], D * sizeof(float));
      std::memcpy(z.data() + D, mi, r * sizeof(float));
      float const logit = ref::dot(z.data(), cw, D + r);  // fp32 [h ; m] · proj
      out.tokens.push_back(best);
      out.acceptance_logit.push_back(logit);
      out.confidence.push_back(ref::sigmoid(logit, md));
      prev = best;
    }
    return out;
  } catch (Error const& e) {
    return e.status();
  }
}

namespace {

class DsparkDrafter final : public Drafter {
 public:
  DsparkDrafter(Dsv41Model const& m, Dsv41State const& st) : m_(m), st_(st) {}
  std::string name() const override { return "dspark"; }
  Draft propose(std::span<int32_t const> committed, int64_t max_k) override {
    Draft d;
    // The anchor is the pending token: the state must hold every committed token but it.
    if (max_k <= 0 || committed.empty() || st_.length() + 1 != static_cast<int64_t>(committed.size())) return d;
    auto p = m_.dspark_draft(st_, committed.back());
    if (!p) return d;
    int64_t const k = std::min<int64_t>(max_k, static_cast<int64_t>(p->tokens.size()));
    d.tokens.assign(p->tokens.begin(), p->tokens.begin() + k);
    d.confidence.assign(p->confidence.begin(), p->confidence.begin() + k);
    return d;
  }

 private:
  Dsv41Model const& m_;
  Dsv41State const& st_;
};

}  // namespace

std::unique_ptr<Drafter> make_dspark_drafter(Dsv41Model const& model, Dsv41State const& state) {
  return std::make_unique<DsparkDrafter>(model, state);
}

}  // namespace tessera::model::dsv41

// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 forward over a chunk of one sequence (spec/deepseek-v41.md §2.1, §2.3, §2.4, §2.6, §2.7):
/// embedding into n equal streams, Engram hashing from the per-sequence look-back, per layer the Engram
/// write, the two mHC sites with delayed pre, attention and MoE, then the final collapse, norm and LM
/// head. Decode is a chunk of one token. Also the LanguageModel face (batches, clone, state sizes).
#include "tessera/models/deepseek_v41/model.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/models/deepseek_v41/dspark.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/core/thread_pool.hpp"
#include "tessera/ops/engram.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/mhc.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/norm.hpp"
#include "tessera/ref/common_ref.hpp"
#include "tessera/ref/engram_ref.hpp"
#include "tessera/ref/rope_ref.hpp"

namespace tessera::model::dsv41 {

namespace {
using F2 = TensorView<float, 2>;
using CF2 = TensorView<float const, 2>;
using CF1 = TensorView<float const, 1>;
F2 v2(std::vector<float>& v, int64_t r, int64_t c) { return F2(v.data(), {r, c}); }
CF2 cv2(std::vector<float> const& v, int64_t r, int64_t c) { return CF2(v.data(), {r, c}); }
CF2 cv2(Tensor const& t) { return CF2(t.data_as<float>(), {t.dim(0), t.dim(1)}); }
CF1 cv1(Tensor const& t) { return CF1(t.data_as<float>(), {t.numel()}); }
}  // namespace

void linear(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w, float* out, DType md) {
  int64_t out_dim = w.dim(0), in_dim = w.dim(1);
  float const* wp = w.data_as<float>();
  int64_t col_block = 64;
  int64_t nb = (out_dim + col_block - 1) / col_block;
  ThreadPool& pool = ctx.pool ? *ctx.pool : ThreadPool::global();
  pool.parallel_for(rows * nb, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t r = t / nb, c0 = (t % nb) * col_block, c1 = std::min(out_dim, c0 + col_block);
      float const* xr = x + r * in_dim;
      for (int64_t o = c0; o < c1; ++o) out[r * out_dim + o] = ref::round_md(ref::gemm_dot(xr, wp + o * in_dim, in_dim, md), md);
    }
  }, 4);
}

void linear(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w, StoredLinear q, float* out, DType md) {
  if (q.exl3) return linear_exl3(ctx, x, rows, *q.exl3, out, md);
  if (!q.scaled) return linear(ctx, x, rows, w, out, md);
  ScaledWeight const& sw = *q.scaled;
  bool const fp4 = sw.dtype == DType::kF4E2m1x2;
  int64_t const ldq = fp4 ? sw.cols / 2 : sw.cols, kb = sw.scales.dim(1), srows = sw.scales.dim(0);
  ops::LinearDesc d{rows, sw.cols, sw.rows, sw.dtype, md};
  ops::LinearArgs a;
  a.x = CF2(x, {rows, sw.cols});
  a.w_q = TensorView<uint8_t const, 2>(sw.codes.data_as<uint8_t>(), {sw.rows, ldq});
  a.w_scale = TensorView<uint8_t const, 2>(sw.scales.data_as<uint8_t>(), {srows, kb});
  a.y = F2(out, {rows, sw.rows});
  throw_if_error(ops::linear(ctx, d, a));
}

int64_t linear_out(Tensor const& w, StoredLinear q) {
  if (q.exl3) return q.exl3->outputs();
  if (q.scaled) return q.scaled->rows;
  return w.dim(0);
}

Tensor dense_weight(Tensor const& w, ScaledWeight const* s) { return w.defined() || !s ? w : dequantize_scaled(*s); }

bool layer_has_scaled_experts(Weights const& w, int64_t l) {
  return w.scaled_of(scaled_expert_key(l, 0, "w1")) != nullptr;
}

StoredLinear Dsv41Model::q_(int64_t l, char const* field) const { return stored_linear(w_, scaled_weight_key(l, field)); }

size_t Dsv41Model::weight_bytes() const {
  size_t b = 0;
  auto add = [&](Tensor const& t) { b += t.defined() ? t.nbytes() : 0; };
  for (Tensor const* t : {&w_.embed, &w_.norm, &w_.lm_head}) add(*t);
  for (LayerWeights const& lw : w_.layers) {
    for (Tensor const* t : {&lw.hc_attn_fn, &lw.hc_attn_base, &lw.hc_attn_scale, &lw.hc_ffn_fn, &lw.hc_ffn_base,
                            &lw.hc_ffn_scale, &lw.attn_norm, &lw.ffn_norm, &lw.wq_a, &lw.q_norm, &lw.wq_b, &lw.wkv,
                            &lw.kv_norm, &lw.wo_a, &lw.wo_b, &lw.attn_sink, &lw.c_wkv, &lw.c_wgate, &lw.c_norm,
                            &lw.i_wq_b, &lw.i_weights_proj, &lw.i_wk, &lw.i_k_norm, &lw.gate, &lw.gate_bias,
                            &lw.e_table, &lw.e_wkv, &lw.e_qk})
      add(*t);
    for (ExpertWeights const& ex : lw.experts)
      for (Tensor const* t : {&ex.w1, &ex.w3, &ex.w2}) add(*t);
    for (Tensor const* t : {&lw.shared.w1, &lw.shared.w3, &lw.shared.w2}) add(*t);
  }
  for (auto const& [key, sw] : w_.scaled) b += sw.codes.nbytes() + sw.scales.nbytes();
  for (auto const& [key, q] : w_.exl3) b += q.trellis.nbytes() + (q.suh.size() + q.svh.size()) * sizeof(uint16_t);
  return b;
}

size_t Dsv41State::memory_bytes() const {
  size_t b = history_.size() * sizeof(int64_t) + dspark_taps_.size() * sizeof(float);
  for (auto const& l : layers_)
    b += (l.window.size() + l.buf_kv.size() + l.buf_gate.size() + l.raw_kv.size() + l.raw_gate.size() + l.ckv.size() +
          l.index_k.size()) * sizeof(float) +
         (l.window_pos.size() + l.raw_pos.size()) * sizeof(int64_t);
  return b;
}

Result<std::unique_ptr<Dsv41Model>> Dsv41Model::create(ModelSpec spec, WeightSource const& src, ModelOptions opts) {
  return create_(std::move(spec), src, std::move(opts), nullptr);
}

Result<std::unique_ptr<Dsv41Model>> Dsv41Model::create_(ModelSpec spec, WeightSource const& src, ModelOptions opts,
                                                        std::shared_ptr<RankShard const> part) {
  TESSERA_TRY(spec.validate());
  std::unique_ptr<Dsv41Model> m(new Dsv41Model());
  // EXL3 linears run as stored (their product, exl3_linear.cpp) unless dequantize_weights asks for their
  // effective dense weights; block-scaled weights are held as stored with weights_as_stored.
  if (opts.weights_as_stored && opts.numerics != Numerics::kBf16)
    return invalid_argument("weights_as_stored needs bf16 numerics (a stored weight's value is its bf16 rounding)");
  WeightLoadOptions wo;
  wo.keep_exl3 = !opts.dequantize_weights;
  if (opts.weights_as_stored) {
    wo.keep_scaled_projections = true;
    wo.projections_as_stored = true;
    wo.experts_as_stored = [](DType t) { return ops::is_block_scaled(t); };
  }
  wo.routed_begin = opts.routed_experts_begin;
  wo.routed_end = opts.routed_experts_end;
  if (part) {
    // The Engram table parts follow the hash layout's offsets and primes, which load_engram_tables checks stored
    // ones against.
    auto parts = rank_parts(spec, part->plan, part->rank, engram_layout(spec));
    if (!parts) return parts.status();
    if (parts->any()) {
      wo.parts = *parts;
      m->held_parts_ = std::move(*parts);
      m->part_ = std::move(part);
    }
  }
  auto w = load_weights(spec, src, opts.numerics, wo);
  if (!w) return w.status();
  TESSERA_TRY(check_exl3_weights(spec, *w, false));
  m->w_ = std::move(*w);
  auto e = load_engram_tables(spec, src);
  if (!e) return e.status();
  m->engram_ = std::move(*e);
  auto d = load_dspark_weights(spec, src, opts.numerics);
  if (!d) return d.status();
  m->dspark_ = std::move(*d);
  m->main_inv_freq_ = ref::rope_inv_freq_default(spec.rope_theta, spec.rope_dim);
  m->compress_inv_freq_ = spec.yarn ? ref::rope_inv_freq_yarn(spec.compress_rope_theta, spec.rope_dim, spec.yarn_factor,
                                                              spec.yarn_beta_fast, spec.yarn_beta_slow,
                                                              spec.yarn_original_max_pos)
                                    : ref::rope_inv_freq_default(spec.compress_rope_theta, spec.rope_dim);
  m->info_.name = spec.name;
  m->info_.model_type = "deepseek_v41";
  m->info_.vocab_size = spec.vocab_size;
  m->info_.max_context = spec.max_position_embeddings;
  m->info_.eos_token_ids = spec.eos_token_ids;
  m->info_.device = "cpu";
  m->info_.dtype = opts.numerics == Numerics::kBf16 ? "bf16" : "fp32";
  m->spec_ = std::move(spec);
  ExpertPruning prune = std::move(opts.prune);
  m->opts_ = opts;
  TESSERA_TRY(m->set_pruning(std::move(prune)));
  return m;
}

Status check_pruning(ExpertPruning const& p, ModelSpec const& spec) {
  if (!(p.top_p > 0.f && p.top_p <= 1.f))
    return invalid_argument("expert pruning: top_p " + std::to_string(p.top_p) + " is outside (0, 1]");
  if (p.min_k < 0) return invalid_argument("expert pruning: min_k must be >= 0");
  if (p.expert_mask.empty()) return {};
  if (static_cast<int64_t>(p.expert_mask.size()) != spec.num_layers)
    return invalid_argument("expert pruning: expert_mask has " + std::to_string(p.expert_mask.size()) +
                            " layers, the model " + std::to_string(spec.num_layers));
  for (size_t l = 0; l < p.expert_mask.size(); ++l) {
    auto const& m = p.expert_mask[l];
    if (static_cast<int64_t>(m.size()) != spec.n_experts)
      return invalid_argument("expert pruning: expert_mask layer " + std::to_string(l) + " has " +
                              std::to_string(m.size()) + " entries, n_routed_experts is " +
                              std::to_string(spec.n_experts));
    int64_t open = 0;
    for (uint8_t v : m) open += v ? 0 : 1;
    if (open < spec.top_k)
      return invalid_argument("expert pruning: expert_mask layer " + std::to_string(l) + " leaves " +
                              std::to_string(open) + " experts, fewer than num_experts_per_tok " +
                              std::to_string(spec.top_k));
  }
  return {};
}

Status Dsv41Model::set_pruning(ExpertPruning p) {
  TESSERA_TRY(check_pruning(p, spec_));
  opts_.prune = std::move(p);
  return {};
}

std::unique_ptr<SequenceState> Dsv41Model::new_sequence() {
  auto st = std::make_unique<Dsv41State>();
  st->layers_.resize(static_cast<size_t>(spec_.num_layers));
  return st;
}

Result<std::unique_ptr<SequenceState>> Dsv41Model::clone(SequenceState const& state) {
  auto const* s = dynamic_cast<Dsv41State const*>(&state);
  if (!s) return invalid_argument("clone: the state was not created by a DeepSeek-V4.1 model");
  return std::unique_ptr<SequenceState>(std::make_unique<Dsv41State>(*s));
}

Status Dsv41Model::truncate(SequenceState& state, int64_t length) {
  auto* st = dynamic_cast<Dsv41State*>(&state);
  if (!st) return invalid_argument("truncate: the state was not created by a DeepSeek-V4.1 model");
  if (length < 0 || length > st->length_) return invalid_argument("truncate: length outside [0, current length]");
  if (length == st->length_) return {};
  if (st->length_ - length > opts_.max_rollback)
    return not_supported("truncate: " + std::to_string(st->length_ - length) + " tokens back exceeds max_rollback " +
                         std::to_string(opts_.max_rollback));
  int64_t hd = spec_.head_dim, di = spec_.index_head_dim;
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    LayerState& ls = st->layers_[l];
    // Window: drop positions ≥ length (the reserve still holds the W−1 before it).
    size_t keep = 0;
    while (keep < ls.window_pos.size() && ls.window_pos[keep] < length) ++keep;
    ls.window.resize(keep * hd);
    ls.window_pos.resize(keep);
    if (!spec_.is_kv_source(l)) continue;
    int64_t r = spec_.compress_ratios[l];
    int64_t groups = length / r;  // groups whose last token is before `length`
    ls.entry_count = groups;
    ls.ckv.resize(static_cast<size_t>(groups * hd));
    if (spec_.is_index_source(l)) ls.index_k.resize(static_cast<size_t>(groups * di));
    if (r > 1) {
      // The partial group [groups·r, length) comes back from the raw projections.
      ls.buf_kv.clear();
      ls.buf_gate.clear();
      for (size_t i = 0; i < ls.raw_pos.size(); ++i)
        if (ls.raw_pos[i] >= groups * r && ls.raw_pos[i] < length) {
          ls.buf_kv.insert(ls.buf_kv.end(), ls.raw_kv.begin() + i * hd, ls.raw_kv.begin() + (i + 1) * hd);
          ls.buf_gate.insert(ls.buf_gate.end(), ls.raw_gate.begin() + i * hd, ls.raw_gate.begin() + (i + 1) * hd);
        }
      size_t k = 0;
      while (k < ls.raw_pos.size() && ls.raw_pos[k] < length) ++k;
      ls.raw_kv.resize(k * hd);
      ls.raw_gate.resize(k * hd);
      ls.raw_pos.resize(k);
    }
  }
  st->history_.resize(static_cast<size_t>(length));
  if (dspark_) dspark_truncate(*st, length);
  auto& ev = st->ties_.events;
  for (auto it = ev.begin(); it != ev.end();) {
    if (it->position >= length) {
      (it->site == CutoffTie::Site::kIndexer ? st->ties_.indexer
                                             : it->site == CutoffTie::Site::kRouter ? st->ties_.router : st->ties_.candidate) -= 1;
      it = ev.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(st->boundaries_, [&](QuantBoundary const& b) { return b.position >= length; });
  st->length_ = length;
  return {};
}

size_t Dsv41Model::state_bytes_for(int64_t n) const {
  size_t b = static_cast<size_t>(n) * sizeof(int64_t);
  if (dspark_)
    b += static_cast<size_t>(std::min(n, spec_.sliding_window + opts_.max_rollback) * static_cast<int64_t>(spec_.dspark.target_layers.size()) * spec_.hidden_size * 4);
  int64_t hd = spec_.head_dim, W = spec_.sliding_window;
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    b += static_cast<size_t>(std::min(n, W - 1 + opts_.max_rollback) * (hd * 4 + 8));
    if (spec_.is_kv_source(l)) {
      int64_t T = n / spec_.compress_ratios[l];
      b += static_cast<size_t>(T * hd * 4 + spec_.compress_ratios[l] * hd * 8);
      if (spec_.compress_ratios[l] > 1)
        b += static_cast<size_t>(std::min(n, opts_.max_rollback + spec_.compress_ratios[l]) * (hd * 8 + 8));
      if (spec_.is_index_source(l)) b += static_cast<size_t>(T * spec_.index_head_dim * 4);
    }
  }
  return b;
}

Status Dsv41Model::check_whole() const {
  if (shard_) return {};  // a rank model: its sharded steps use its parts
  if (auto const [e0, e1] = held_routed_experts(); e0 != 0 || e1 != spec_.n_experts)
    return invalid_argument("forward: the model holds routed experts [" + std::to_string(e0) + ", " +
                            std::to_string(e1) + ") of " + std::to_string(spec_.n_experts) +
                            " only (a rank's host model: run its rank model)");
  if (part_)
    return invalid_argument("forward: the model holds rank " + std::to_string(part_->rank) + "'s parts of the split " +
                            "weights of a tp " + std::to_string(part_->plan.cfg.tp) + " ep " +
                            std::to_string(part_->plan.cfg.ep) + " plan only (a rank's host model: run its rank model)");
  return {};
}

Status Dsv41Model::forward(std::span<SequenceStep> batch) {
  TESSERA_TRY(check_whole());
  for (auto const& step : batch) {
    if (!dynamic_cast<Dsv41State*>(step.state)) return invalid_argument("forward: a step has no DeepSeek-V4.1 state");
    if (step.num_logit_rows < 0 || step.num_logit_rows > static_cast<int64_t>(step.tokens.size()))
      return invalid_argument("forward: num_logit_rows must be in [0, tokens.size()]");
    if (step.num_logit_rows > 0 && !step.logits) return invalid_argument("forward: logits buffer missing");
    for (int32_t t : step.tokens)
      if (t < 0 || t >= spec_.vocab_size)
        return invalid_argument("forward: token id " + std::to_string(t) + " outside the vocabulary");
  }
  // Before any step runs: a batch refused for its length advances no state.
  TESSERA_TRY(check_batch_positions(batch, spec_.max_position_embeddings));
  // Sequences run one after another: a row never shares a reduction with another sequence.
  for (auto& step : batch)
    TESSERA_TRY(forward_one(*static_cast<Dsv41State*>(step.state), step.tokens, step.num_logit_rows, step.logits));
  return {};
}

std::vector<int64_t> Dsv41Model::hash_ids(Dsv41State const& st, std::span<int32_t const> tokens) const {
  int64_t S = static_cast<int64_t>(tokens.size()), Le = engram_.layers, C = engram_.columns(), N = engram_.max_ngram;
  std::vector<int64_t> hist = st.history_;
  for (int32_t t : tokens) hist.push_back(engram_.token_map[static_cast<size_t>(t)]);
  std::vector<int64_t> out(static_cast<size_t>(S * Le * C)), look(static_cast<size_t>(S * N));
  auto history = [&](int64_t p) { return hist[static_cast<size_t>(p)]; };
  for (int64_t r = 0; r < S; ++r) ref::engram_lookback(history, st.length_ + r, N, engram_.pad_c, &look[r * N]);
  ExecContext ctx;
  ctx.pool = opts_.pool;
  std::vector<int64_t> ids(static_cast<size_t>(S * C));
  for (int64_t e = 0; e < Le; ++e) {
    throw_if_error(ops::engram_hash(
        ctx, {S, N, engram_.heads},
        {TensorView<int64_t const, 2>(look.data(), {S, N}),
         TensorView<int64_t const, 1>(engram_.multipliers.data() + e * N, {N}),
         TensorView<int64_t const, 1>(engram_.primes.data() + e * C, {C}),
         TensorView<int64_t const, 1>(engram_.offsets.data() + e * C, {C}), TensorView<int64_t, 2>(ids.data(), {S, C})}));
    for (int64_t r = 0; r < S; ++r)
      std::copy(ids.begin() + r * C, ids.begin() + (r + 1) * C, out.begin() + (r * Le + e) * C);
  }
  return out;
}

Status Dsv41Model::forward_one(Dsv41State& st, std::span<int32_t const> tokens, int64_t num_logit_rows, float* logits) {
  TESSERA_TRY(check_whole());
  ModelSpec const& s = spec_;
  int64_t S = static_cast<int64_t>(tokens.size());
  if (S == 0) return {};
  if (st.length_ + S > s.max_position_embeddings)
    return invalid_argument("forward: sequence would reach " + std::to_string(st.length_ + S) +
                            " positions, beyond max_position_embeddings " + std::to_string(s.max_position_embeddings));
  try {
    Chunk c;
    c.rows = S;
    c.ctx.pool = opts_.pool;
    c.md = opts_.numerics == Numerics::kBf16 ? DType::kBf16 : DType::kF32;
    for (int64_t r = 0; r < S; ++r) c.pos.push_back(st.length_ + r);
    DType md = c.md;
    ExecContext& ctx = c.ctx;
    int64_t D = s.hidden_size, n = s.hc_mult, nD = n * D;

    // Engram hash ids of the chunk, then the look-back history grows (§2.4.2).
    std::vector<int64_t> hids;
    if (engram_.layers > 0) {
      hids = hash_ids(st, tokens);
      for (int32_t t : tokens) st.history_.push_back(engram_.token_map[static_cast<size_t>(t)]);
    }

    // Embedding into n equal streams and the one-hot initial pre (§2.1).
    std::vector<float> X(S * nD), X2(S * nD), pre(S * n, 0.f);
    float const* emb = w_.embed.data_as<float>();
    for (int64_t r = 0; r < S; ++r) {
      for (int64_t k = 0; k < n; ++k) std::memcpy(&X[r * nD + k * D], emb + tokens[r] * D, D * sizeof(float));
      pre[r * n] = 1.f;
    }
    if (tap_) {
      std::vector<float> e(S * D);
      for (int64_t r = 0; r < S; ++r) std::memcpy(&e[r * D], emb + tokens[r] * D, D * sizeof(float));
      tap("embed.out0", {1, S, D}, e);
    }

    std::vector<float> h(S * D), xa(S * D), A, F(S * D);
    std::vector<float> a_pre(S * n), a_post(S * n), a_comb(S * n * n), f_pre(S * n), f_post(S * n), f_comb(S * n * n);
    for (int64_t l = 0; l < s.num_layers; ++l) {
      LayerWeights const& lw = w_.layers[l];
      std::string const pfx = "model.layers." + std::to_string(l) + ".";
      int64_t ei = s.engram_index(l);
      if (ei >= 0) {
        int64_t C = engram_.columns(), de = s.engram_head_dim, Le = engram_.layers;
        std::vector<int64_t> ids(S * C);
        for (int64_t r = 0; r < S; ++r)
          std::copy(hids.begin() + (r * Le + ei) * C, hids.begin() + (r * Le + ei + 1) * C, ids.begin() + r * C);
        std::vector<float> rows(S * C * de), kv(S * (n + 1) * D);
        if (shard_)
          shard_engram_gather(*shard_, ctx, engram_, ei, lw.e_table, ids, S, de, rows);
        else
          throw_if_error(ops::engram_gather(ctx, {S, C, lw.e_table.dim(0), de},
                                            {TensorView<int64_t const, 2>(ids.data(), {S, C}), cv2(lw.e_table),
                                             v2(rows, S, C * de)}));
        tap(pfx + "engram.embed.out0", {1, S, C, de}, rows);
        linear(ctx, rows.data(), S, lw.e_wkv, q_(l, "e_wkv"), kv.data(), md);
        throw_if_error(ops::engram_gate(ctx, {S, n, D, s.rms_eps, md},
                                        {cv2(X, S, nD), cv2(kv, S, (n + 1) * D), cv1(lw.e_qk), v2(X, S, nD)}));
        tap_pin(pfx + "engram.out0", {1, S, n, D}, X);
      }
      if (dspark_) dspark_record(st, l, X);  // DSpark target features (dspark.hpp)
      // Attention site (§2.3): mix of the current streams, collapse with the previous site's pre.
      throw_if_error(ops::mhc_mix(ctx, {S, n, D, static_cast<int>(s.hc_sinkhorn_iters), s.hc_eps, s.rms_eps, md},
                                  {cv2(X, S, nD), cv2(lw.hc_attn_fn), cv1(lw.hc_attn_base), cv1(lw.hc_attn_scale),
                                   v2(a_pre, S, n), v2(a_post, S, n), v2(a_comb, S, n * n)}));
      throw_if_error(ops::mhc_collapse(ctx, {S, n, D, md}, {cv2(X, S, nD), cv2(pre, S, n), v2(h, S, D)}));
      throw_if_error(ops::rms_norm(ctx, {S, D, s.rms_eps, true, md}, {cv2(h, S, D), cv1(lw.attn_norm), v2(xa, S, D)}));
      attention_block(l, st, c, xa, A);
      tap_pin(pfx + "attn.out0", {1, S, D}, A);
      throw_if_error(ops::mhc_expand(ctx, {S, n, D, md},
                                     {cv2(A, S, D), cv2(X, S, nD), cv2(a_post, S, n), cv2(a_comb, S, n * n), v2(X2, S, nD)}));
      std::swap(X, X2);
      // FFN site: collapse with the attention site's pre.
      throw_if_error(ops::mhc_mix(ctx, {S, n, D, static_cast<int>(s.hc_sinkhorn_iters), s.hc_eps, s.rms_eps, md},
                                  {cv2(X, S, nD), cv2(lw.hc_ffn_fn), cv1(lw.hc_ffn_base), cv1(lw.hc_ffn_scale),
                                   v2(f_pre, S, n), v2(f_post, S, n), v2(f_comb, S, n * n)}));
      throw_if_error(ops::mhc_collapse(ctx, {S, n, D, md}, {cv2(X, S, nD), cv2(a_pre, S, n), v2(h, S, D)}));
      throw_if_error(ops::rms_norm(ctx, {S, D, s.rms_eps, true, md}, {cv2(h, S, D), cv1(lw.ffn_norm), v2(xa, S, D)}));
      int64_t K = s.top_k;
      std::vector<float> rw(S * K);
      std::vector<int32_t> rid(S * K);
      std::vector<uint8_t> rtie(S);
      ops::MoeRouteDesc rd{S, s.n_experts, D, K, s.gate_temp, s.routed_scale, s.norm_topk_prob};
      rd.md = md;
      ops::MoeRouteArgs ra{cv2(xa, S, D), cv2(lw.gate), cv1(lw.gate_bias), v2(rw, S, K),
                           TensorView<int32_t, 2>(rid.data(), {S, K}), TensorView<uint8_t, 1>(rtie.data(), {S})};
      if (ExpertPruning const& pr = opts_.prune; pr.active()) {  // lossy lever (seed-notes §5)
        bool const decode = S == 1 && c.pos[0] > 0;
        if (pr.scope == ExpertPruning::Scope::kAll || decode) {
          rd.prune_top_p = pr.top_p;
          rd.prune_min_k = pr.min_k;
          rd.prune_renorm = pr.renorm;
        }
        if (!pr.expert_mask.empty())
          ra.expert_mask = TensorView<uint8_t const, 1>(pr.expert_mask[l].data(), {s.n_experts});
      }
      throw_if_error(ops::moe_route(ctx, rd, ra));
      for (int64_t r = 0; r < S; ++r)
        if (rtie[r]) {
          ++st.ties_.router;
          st.ties_.events.push_back({CutoffTie::Site::kRouter, static_cast<int32_t>(l), c.pos[r]});
        }
      if (tap_) {
        tap(pfx + "ffn.gate.out0", {S, K}, rw);
        std::vector<float> idf(rid.begin(), rid.end());
        tap(pfx + "ffn.gate.out1", {S, K}, idf);
      }
      if (shard_) {
        shard_moe(*shard_, ctx, s, w_, l, xa, rid, rw, S, md, F);
      } else if (layer_has_exl3_experts(w_, l, s.n_experts)) {
        moe_experts_mixed(ctx, s, w_, l, xa.data(), rid.data(), rw.data(), S, md, F.data());
      } else {
        std::vector<TensorView<float const, 2>> w1, w3, w2;
        std::vector<ops::BlockScaledView> q1, q3, q2;
        ops::MoeExpertsDesc ed{S, s.n_experts, D, s.moe_inter, K, s.swiglu_limit, true, md};
        if (layer_has_scaled_experts(w_, l)) {  // held as stored (weights_as_stored): the op widens their rows
          for (int64_t e = 0; e < s.n_experts; ++e)
            for (auto [wn, dst] : {std::pair{"w1", &q1}, {"w3", &q3}, {"w2", &q2}}) {
              ScaledWeight const& sw = *w_.scaled_of(scaled_expert_key(l, e, wn));
              ed.routed_scaled = sw.dtype;
              dst->push_back({TensorView<uint8_t const, 2>(sw.codes.data_as<uint8_t>(), {sw.codes.dim(0), sw.codes.dim(1)}),
                              TensorView<uint8_t const, 2>(sw.scales.data_as<uint8_t>(), {sw.scales.dim(0), sw.scales.dim(1)})});
            }
        } else {
          for (auto const& ex : lw.experts) { w1.push_back(cv2(ex.w1)); w3.push_back(cv2(ex.w3)); w2.push_back(cv2(ex.w2)); }
        }
        ops::MoeExpertsArgs ma{cv2(xa, S, D), TensorView<int32_t const, 2>(rid.data(), {S, K}), cv2(rw, S, K), w1, w3, w2,
                               cv2(lw.shared.w1), cv2(lw.shared.w3), cv2(lw.shared.w2), v2(F, S, D)};
        ma.w1_scaled = q1;
        ma.w3_scaled = q3;
        ma.w2_scaled = q2;
        throw_if_error(ops::moe_experts(ctx, ed, ma));
      }
      tap_pin(pfx + "ffn.out0", {1, S, D}, F);
      throw_if_error(ops::mhc_expand(ctx, {S, n, D, md},
                                     {cv2(F, S, D), cv2(X, S, nD), cv2(f_post, S, n), cv2(f_comb, S, n * n), v2(X2, S, nD)}));
      std::swap(X, X2);
      std::swap(pre, f_pre);
      tap_pin(pfx + "out0", {1, S, n, D}, X);
      tap_pin(pfx + "out1", {1, S, n}, pre);
    }
    // Final collapse with the last site's pre, norm, LM head (§2.7).
    throw_if_error(ops::mhc_collapse(ctx, {S, n, D, md}, {cv2(X, S, nD), cv2(pre, S, n), v2(h, S, D)}));
    throw_if_error(ops::rms_norm(ctx, {S, D, s.rms_eps, true, md}, {cv2(h, S, D), cv1(w_.norm), v2(xa, S, D)}));
    tap("model.norm.out0", {1, S, D}, xa);
    if (num_logit_rows > 0 && shard_)
      shard_head(*shard_, ctx, w_, xa.data() + (S - num_logit_rows) * D, num_logit_rows, D, s.vocab_size, md, logits);
    else if (num_logit_rows > 0)
      linear(ctx, xa.data() + (S - num_logit_rows) * D, num_logit_rows, w_.lm_head, stored_linear(w_, scaled_head_key()),
             logits, md);
    st.length_ += S;
  } catch (Error const& e) {
    return e.status();
  }
  return {};
}

}  // namespace tessera::model::dsv41

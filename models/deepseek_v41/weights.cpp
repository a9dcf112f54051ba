// SPDX-License-Identifier: Apache-2.0
/// Weight loading by logical name over the OLD / NEW / native naming schemes (spec §4.1, §8.2), with
/// shape checks, the NEW fused-expert split, fp8 Engram-table dequantisation, bf16 rounding of every
/// non-fp32-kept parameter in bf16 mode, and (on request) the stored form of block-scaled projections and
/// routed experts.
#include "tessera/models/deepseek_v41/weights.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "tessera/core/dtype.hpp"
#include "tessera/core/thread_pool.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ref/exl3_ref.hpp"

namespace tessera::model::dsv41 {

namespace {

std::string join(std::vector<std::string> const& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

std::vector<std::string> lname(int64_t l, std::string const& old_suffix, std::string const& new_suffix);

class Loader {
 public:
  Loader(WeightSource const& src, Numerics num, WeightLoadOptions opts, Weights& out)
      : src_(src), num_(num), opts_(opts), out_(out) {}

  /// The first present name, checked against `shape`; rounded to bf16 unless `keep_fp32`. `found` (if set)
  /// receives the name loaded.
  /// A name stored as an EXL3 group loads as its effective dense weight, or, with `exl3_key` and
  /// WeightLoadOptions::keep_exl3, is recorded as stored under that key (an undefined tensor is returned).
  Result<Tensor> get(std::vector<std::string> const& names, std::vector<int64_t> const& shape, bool keep_fp32 = false,
                     std::string* found = nullptr, std::string const* exl3_key = nullptr) {
    for (auto const& n : names) {
      if (!src_.contains(n)) {
        if (!src_.is_exl3(n)) continue;
        if (found) *found = n;
        return exl3(n, shape, keep_fp32, exl3_key);
      }
      if (found) *found = n;
      auto sh = src_.shape(n);
      if (!sh) return sh.status();
      if (*sh != shape)
        return malformed(src_.describe() + ": tensor " + n + " has shape " + shape_to_string(*sh) + ", expected " +
                         shape_to_string(shape));
      auto t = src_.load_f32(n);
      if (!t) return t.status();
      if (!keep_fp32) round(*t);
      return t;
    }
    return not_found(src_.describe() + ": missing tensor " + names.front() +
                     (names.size() > 1 ? " (also looked for " + join({names.begin() + 1, names.end()}) + ")" : ""));
  }
  Result<Tensor> exl3(std::string const& n, std::vector<int64_t> const& shape, bool keep_fp32, std::string const* key) {
    auto q = src_.load_exl3(n);
    if (!q) return q.status();
    if (shape.size() != 2 || q->desc.n != shape[0] || q->desc.k != shape[1])
      return malformed(src_.describe() + ": EXL3 group " + q->name + " stores a " + std::to_string(q->desc.k) + " → " +
                       std::to_string(q->desc.n) + " linear (trellis [k/16, n/16, 16K]), expected weight " + n +
                       " of shape " + shape_to_string(shape));
    if (key && opts_.keep_exl3) {
      out_.exl3[*key] = std::move(*q);
      return Tensor{};
    }
    Tensor t = exl3_effective_weight(*q);
    if (!keep_fp32) round(t);
    return t;
  }
  int64_t routed_begin() const { return opts_.routed_begin; }
  int64_t routed_end(int64_t n_experts) const { return opts_.routed_end < 0 ? n_experts : opts_.routed_end; }
  void round(Tensor& t) const {
    if (num_ != Numerics::kBf16) return;
    float* p = t.data_as<float>();
    parallel_for(t.numel(), [p](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = round_to_bf16(p[i]);
    }, 1 << 16);
  }
  /// A projection (get, bf16-rounded); with keep_scaled_projections its stored form, when block-scaled, is
  /// also recorded as Weights::scaled[key].
  Result<Tensor> projection(std::string const& key, std::vector<std::string> const& names,
                            std::vector<int64_t> const& shape) {
    return stored(key, names, shape, opts_.keep_scaled_projections);
  }
  /// A linear that may be stored as EXL3 (get with its Weights::exl3 key).
  Result<Tensor> linear(std::string const& key, std::vector<std::string> const& names, std::vector<int64_t> const& shape) {
    return get(names, shape, false, nullptr, &key);
  }
  /// The first present name of `names` (empty when none is).
  std::string find_name(std::vector<std::string> const& names) const {
    for (auto const& n : names)
      if (src_.contains(n)) return n;
    return {};
  }
  /// One member of a set of weights recorded as stored together: tensor `name`'s stored form appended to `got` under
  /// `key` when it is block-scaled in the set's dtype `dt` (kF32 until the first member sets it): true; false when
  /// the name is absent (the dequantised load names it) or the tensor is not such a member; malformed for a stored
  /// shape other than [rows, cols].
  Result<bool> gather_stored(std::string const& name, int64_t rows, int64_t cols, std::string key, DType& dt,
                             std::vector<std::pair<std::string, ScaledWeight>>& got) {
    if (name.empty()) return false;
    auto sw = src_.load_scaled(name);
    if (!sw) return sw.status();
    if (!sw->present() || (dt != DType::kF32 && sw->dtype != dt)) return false;
    if (sw->rows != rows || sw->cols != cols)
      return malformed(src_.describe() + ": scaled tensor " + name + " stores " +
                       shape_to_string({sw->rows, sw->cols}) + ", expected " + shape_to_string({rows, cols}));
    dt = sw->dtype;
    got.emplace_back(std::move(key), std::move(*sw));
    return true;
  }
  /// The stored forms of a layer's routed experts [e0, e1) when WeightLoadOptions::experts_as_stored takes them all
  /// (every w1/w3/w2 stored block-scaled, one dtype, the expected logical shapes): recorded under
  /// scaled_expert_key, and true; false (nothing recorded) otherwise.
  Result<bool> experts_as_stored(int64_t l, int64_t e0, int64_t e1, int64_t I, int64_t D) {
    if (!opts_.experts_as_stored || e0 == e1) return false;
    std::vector<std::pair<std::string, ScaledWeight>> got;
    DType dt = DType::kF32;
    for (int64_t e = e0; e < e1; ++e) {
      std::string const p = "ffn.experts." + std::to_string(e) + ".";
      for (auto [wn, rows, cols] : {std::tuple{"w1", I, D}, {"w3", I, D}, {"w2", D, I}}) {
        auto ok = gather_stored(find_name(lname(l, p + wn + ".weight", p + wn + ".weight")), rows, cols,
                                scaled_expert_key(l, e, wn), dt, got);
        if (!ok || !*ok) return ok;
      }
    }
    if (!opts_.experts_as_stored(dt)) return false;
    for (auto& [key, sw] : got) out_.scaled[key] = std::move(sw);
    return true;
  }
  /// The stored form of layer l's shared expert when WeightLoadOptions::shared_expert_as_stored takes it (w1, w3,
  /// w2 stored block-scaled in one dtype, the expected logical shapes, no rank part): recorded under
  /// scaled_shared_key, and true; false (nothing recorded) otherwise.
  Result<bool> shared_as_stored(int64_t l, int64_t I, int64_t D) {
    if (!opts_.shared_expert_as_stored || part_of(&RankParts::shared_in) || part_of(&RankParts::shared_out)) return false;
    std::vector<std::pair<std::string, ScaledWeight>> got;
    DType dt = DType::kF32;
    for (auto [wn, rows, cols, old_name, new_name] :
         {std::tuple{"w1", I, D, "ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
          {"w3", I, D, "ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
          {"w2", D, I, "ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"}}) {
      auto ok = gather_stored(find_name(lname(l, old_name, new_name)), rows, cols, scaled_shared_key(l, wn), dt, got);
      if (!ok || !*ok) return ok;
    }
    if (!opts_.shared_expert_as_stored(dt)) return false;
    for (auto& [key, sw] : got) out_.scaled[key] = std::move(sw);
    return true;
  }
  Result<Tensor> stored(std::string const& key, std::vector<std::string> const& names, std::vector<int64_t> const& shape,
                        bool record) {
    if (record && opts_.projections_as_stored) {
      // Stored form only: recorded, and the dequantised tensor is not made.
      std::string const name = find_name(names);
      if (!name.empty()) {
        auto sw = src_.load_scaled(name);
        if (!sw) return sw.status();
        if (sw->present()) {
          if (sw->rows != shape[0] || sw->cols != shape[1])
            return malformed(src_.describe() + ": scaled tensor " + name + " stores " +
                             shape_to_string({sw->rows, sw->cols}) + ", expected " + shape_to_string(shape));
          out_.scaled[key] = std::move(*sw);
          return Tensor{};
        }
      }
    }
    std::string name;
    auto t = get(names, shape, false, &name, &key);
    if (!t || !record || !t->defined()) return t;
    auto sw = src_.load_scaled(name);
    if (!sw) return sw.status();
    if (!sw->present()) return t;
    if (sw->rows != shape[0] || sw->cols != shape[1])
      return malformed(src_.describe() + ": scaled tensor " + name + " stores " +
                       shape_to_string({sw->rows, sw->cols}) + ", expected " + shape_to_string(shape));
    out_.scaled[key] = std::move(*sw);
    return t;
  }
  /// Part `p` of the first present of `names` (the whole tensor's `shape` checked), read alone: with `record` a
  /// block-scaled tensor whose part is whole scale blocks is recorded as the stored part under `key` (an undefined
  /// tensor is returned); otherwise its values, →bf16 unless `keep_fp32` (WeightLoadOptions::parts).
  Result<Tensor> part(std::string const& key, std::vector<std::string> const& names, std::vector<int64_t> const& shape,
                      WeightPart const& p, bool record, bool keep_fp32 = false) {
    std::string n;
    for (auto const& c : names) {
      if (src_.contains(c)) {
        n = c;
        break;
      }
      if (!src_.is_exl3(c)) continue;
      TESSERA_TRY(check_part(c, shape, p));
      if (opts_.keep_exl3 && !key.empty()) {  // the whole group read, its part kept (slice_exl3)
        auto q = src_.load_exl3(c);
        if (!q) return q.status();
        if (q->desc.n != shape[0] || q->desc.k != shape[1])
          return malformed(src_.describe() + ": EXL3 group " + q->name + " stores a " + std::to_string(q->desc.k) +
                           " → " + std::to_string(q->desc.n) + " linear, expected weight " + c + " of shape " +
                           shape_to_string(shape));
        auto qp = slice_exl3(*q, p);
        if (!qp) return qp.status();
        out_.exl3[key] = std::move(*qp);
        return Tensor{};
      }
      auto t = exl3(c, shape, keep_fp32, nullptr);  // the whole effective weight, cut
      if (!t) return t.status();
      return slice_part(*t, p);
    }
    if (n.empty()) return get(names, shape, keep_fp32);  // names the missing tensor
    auto sh = src_.shape(n);
    if (!sh) return sh.status();
    if (*sh != shape)
      return malformed(src_.describe() + ": tensor " + n + " has shape " + shape_to_string(*sh) + ", expected " +
                       shape_to_string(shape));
    TESSERA_TRY(check_part(n, shape, p));
    if (record) {
      auto dt = src_.scaled_dtype(n);
      if (!dt) return dt.status();
      if (ops::is_block_scaled(*dt) && scaled_whole_blocks(*dt, shape[p.cols ? 1 : 0], p.begin, p.end, p.cols)) {
        Result<ScaledWeight> sw = ScaledWeight{};
        if (p.cols && *dt == DType::kF4E2m1x2) {  // no stored column read of packed pairs: the whole tensor, cut
          sw = src_.load_scaled(n);
          if (sw && sw->present()) sw = slice_scaled(*sw, p);
        } else {
          sw = p.cols ? src_.load_scaled_cols(n, p.begin, p.end) : src_.load_scaled_rows(n, p.begin, p.end);
        }
        if (!sw) return sw.status();
        int64_t const rows = p.cols ? shape[0] : p.size(), cols = p.cols ? p.size() : shape[1];
        if (sw->dtype != *dt || sw->rows != rows || sw->cols != cols)
          return malformed(src_.describe() + ": scaled tensor " + n + " stores " + shape_to_string({sw->rows, sw->cols}) +
                           " for the part, expected " + shape_to_string({rows, cols}));
        out_.scaled[key] = std::move(*sw);
        return Tensor{};
      }
    }
    auto t = p.cols ? src_.load_f32_cols(n, p.begin, p.end) : src_.load_f32_rows(n, p.begin, p.end);
    if (!t) return t.status();
    if (!keep_fp32) round(*t);
    return t;
  }
  /// OK when part `p` lies inside a tensor `n` of `shape` (columns: a 2-D tensor).
  Status check_part(std::string const& n, std::vector<int64_t> const& shape, WeightPart const& p) const {
    bool const has_axis = p.cols ? shape.size() == 2 : !shape.empty();
    int64_t const extent = has_axis ? shape[p.cols ? 1 : 0] : 0;
    if (has_axis && p.begin >= 0 && p.begin <= p.end && p.end <= extent) return {};
    return invalid_argument(src_.describe() + ": tensor " + n + " of shape " + shape_to_string(shape) + " has no " +
                            (p.cols ? "columns [" : "rows [") + std::to_string(p.begin) + ", " + std::to_string(p.end) +
                            ") (a rank's part)");
  }
  /// projection(), or its part `p` when set.
  Result<Tensor> projection(std::string const& key, std::vector<std::string> const& names,
                            std::vector<int64_t> const& shape, std::optional<WeightPart> const& p) {
    return p ? part(key, names, shape, *p, opts_.keep_scaled_projections) : projection(key, names, shape);
  }
  /// linear(), or its part `p` when set (values: linears are not recorded block-scaled).
  Result<Tensor> linear(std::string const& key, std::vector<std::string> const& names, std::vector<int64_t> const& shape,
                        std::optional<WeightPart> const& p) {
    return p ? part(key, names, shape, *p, false) : linear(key, names, shape);
  }
  /// The part WeightLoadOptions::parts gives `field` (none: the whole tensor).
  std::optional<WeightPart> part_of(std::optional<WeightPart> RankParts::*field) const {
    return opts_.parts.*field;
  }
  /// The part of layer l's Engram table (none: the whole table).
  std::optional<WeightPart> e_table_part(int64_t l) const {
    if (opts_.parts.e_table.empty()) return std::nullopt;
    return opts_.parts.e_table[static_cast<size_t>(l)];
  }
  WeightSource const& src() const { return src_; }

 private:
  WeightSource const& src_;
  Numerics num_;
  WeightLoadOptions opts_;
  Weights& out_;
};

/// Candidate names of a per-layer tensor: OLD, NEW, native.
std::vector<std::string> lname(int64_t l, std::string const& old_suffix, std::string const& new_suffix) {
  std::string i = std::to_string(l);
  return {"model.layers." + i + "." + old_suffix, "model.layers." + i + "." + new_suffix, "layers." + i + "." + old_suffix};
}

/// Rows [r0, r0 + rows) of expert e of a fused [E, R, C] tensor.
Tensor slice_expert(Tensor const& fused, int64_t e, int64_t r0, int64_t rows) {
  int64_t r_all = fused.dim(1), c = fused.dim(2);
  Tensor out = Tensor::zeros(DType::kF32, {rows, c});
  std::memcpy(out.data(), fused.data_as<float>() + (e * r_all + r0) * c, static_cast<size_t>(rows * c) * sizeof(float));
  return out;
}

#define TRY_ASSIGN(dst, expr)        \
  do {                               \
    auto r_ = (expr);                \
    if (!r_) return r_.status();     \
    dst = std::move(*r_);            \
  } while (0)

Status load_layer(ModelSpec const& s, Loader& ld, int64_t l, LayerWeights& w) {
  int64_t D = s.hidden_size, n = s.hc_mult, nm = (2 + n) * n, hd = s.head_dim, H = s.num_heads;
  int64_t I = s.moe_inter, E = s.n_experts;
  auto key = [l](char const* field) { return scaled_weight_key(l, field); };
  TRY_ASSIGN(w.hc_attn_fn, ld.get(lname(l, "hc_attn_fn", "attn_hc.fn"), {nm, n * D}, true));
  TRY_ASSIGN(w.hc_attn_base, ld.get(lname(l, "hc_attn_base", "attn_hc.base"), {nm}, true));
  TRY_ASSIGN(w.hc_attn_scale, ld.get(lname(l, "hc_attn_scale", "attn_hc.scale"), {3}, true));
  TRY_ASSIGN(w.hc_ffn_fn, ld.get(lname(l, "hc_ffn_fn", "ffn_hc.fn"), {nm, n * D}, true));
  TRY_ASSIGN(w.hc_ffn_base, ld.get(lname(l, "hc_ffn_base", "ffn_hc.base"), {nm}, true));
  TRY_ASSIGN(w.hc_ffn_scale, ld.get(lname(l, "hc_ffn_scale", "ffn_hc.scale"), {3}, true));
  TRY_ASSIGN(w.attn_norm, ld.get(lname(l, "attn_norm.weight", "input_layernorm.weight"), {D}));
  TRY_ASSIGN(w.ffn_norm, ld.get(lname(l, "ffn_norm.weight", "post_attention_layernorm.weight"), {D}));
  TRY_ASSIGN(w.wq_a, ld.projection(key("wq_a"),
                                   lname(l, "attn.wq_a.weight", "self_attn.q_a_proj.weight"), {s.q_lora_rank, D}));
  TRY_ASSIGN(w.q_norm, ld.get(lname(l, "attn.q_norm.weight", "self_attn.q_a_norm.weight"), {s.q_lora_rank}));
  TRY_ASSIGN(w.wq_b, ld.projection(key("wq_b"), lname(l, "attn.wq_b.weight", "self_attn.q_b_proj.weight"),
                                   {H * hd, s.q_lora_rank}, ld.part_of(&RankParts::wq_b)));
  TRY_ASSIGN(w.wkv, ld.projection(key("wkv"), lname(l, "attn.wkv.weight", "self_attn.kv_proj.weight"), {hd, D}));
  TRY_ASSIGN(w.kv_norm, ld.get(lname(l, "attn.kv_norm.weight", "self_attn.kv_norm.weight"), {hd}));
  TRY_ASSIGN(w.wo_a, ld.projection(key("wo_a"), lname(l, "attn.wo_a.weight", "self_attn.o_a_proj.weight"),
                                   {s.o_groups * s.o_lora_rank, H * hd / s.o_groups}, ld.part_of(&RankParts::wo_a)));
  TRY_ASSIGN(w.wo_b, ld.projection(key("wo_b"),
                                   lname(l, "attn.wo_b.weight", "self_attn.o_b_proj.weight"),
                                   {D, s.o_groups * s.o_lora_rank}, ld.part_of(&RankParts::wo_b)));
  if (auto const p = ld.part_of(&RankParts::attn_sink))
    TRY_ASSIGN(w.attn_sink, ld.part("", lname(l, "attn.attn_sink", "self_attn.sinks"), {H}, *p, false, true));
  else
    TRY_ASSIGN(w.attn_sink, ld.get(lname(l, "attn.attn_sink", "self_attn.sinks"), {H}, true));
  int64_t ratio = s.compress_ratios[l];
  if (s.is_kv_source(l)) {
    TRY_ASSIGN(w.c_wkv, ld.projection(key("c_wkv"),
                                      lname(l, "attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"),
                                      {hd, D}));
    if (ratio > 1)
      TRY_ASSIGN(w.c_wgate, ld.projection(key("c_wgate"),
                                          lname(l, "attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"),
                                          {hd, D}));
    TRY_ASSIGN(w.c_norm, ld.get(lname(l, "attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"), {hd}));
  }
  if (s.is_index_source(l)) {
    int64_t Hi = s.index_n_heads, di = s.index_head_dim;
    TRY_ASSIGN(w.i_wq_b, ld.projection(key("i_wq_b"),
                                       lname(l, "attn.indexer.wq_b.weight", "self_attn.indexer.q_b_proj.weight"),
                                       {Hi * di, s.q_lora_rank}));
    TRY_ASSIGN(w.i_weights_proj, ld.projection(key("i_weights_proj"),
                                               lname(l, "attn.indexer.weights_proj.weight", "self_attn.indexer.weights_proj.weight"),
                                               {Hi, D}));
    if (s.is_kv_source(l)) {
      TRY_ASSIGN(w.i_wk, ld.projection(key("i_wk"),
                                       lname(l, "attn.indexer.wk.weight", "self_attn.indexer.k_proj.weight"),
                                       {di, hd}));
      TRY_ASSIGN(w.i_k_norm, ld.get(lname(l, "attn.indexer.k_norm.weight", "self_attn.indexer.k_norm.weight"), {di}));
    }
  }
  TRY_ASSIGN(w.gate, ld.get(lname(l, "ffn.gate.weight", "mlp.gate.weight"), {E, D}));
  TRY_ASSIGN(w.gate_bias, ld.get(lname(l, "ffn.gate.bias", "mlp.gate.e_score_correction_bias"), {E}, true));
  w.experts.resize(static_cast<size_t>(E));
  // The routed experts read: [e0, e1) (WeightLoadOptions::routed_begin / routed_end); the others stay empty.
  int64_t const e0 = ld.routed_begin(), e1 = ld.routed_end(E);
  std::string fused_gu = "model.layers." + std::to_string(l) + ".mlp.experts.gate_up_proj";
  std::string fused_dn = "model.layers." + std::to_string(l) + ".mlp.experts.down_proj";
  bool routed_stored = false;  // the routed experts recorded as stored (WeightLoadOptions::experts_as_stored)
  if (ld.src().contains(fused_gu)) {
    Tensor gu, dn;
    TRY_ASSIGN(gu, ld.get({fused_gu}, {E, 2 * I, D}));
    TRY_ASSIGN(dn, ld.get({fused_dn}, {E, D, I}));
    for (int64_t e = e0; e < e1; ++e) {
      w.experts[e].w1 = slice_expert(gu, e, 0, I);
      w.experts[e].w3 = slice_expert(gu, e, I, I);
      w.experts[e].w2 = slice_expert(dn, e, 0, D);
    }
  } else {
    TRY_ASSIGN(routed_stored, ld.experts_as_stored(l, e0, e1, I, D));
    for (int64_t e = e0; e < e1 && !routed_stored; ++e) {
      std::string p = "ffn.experts." + std::to_string(e) + ".";
      TRY_ASSIGN(w.experts[e].w1, ld.linear(scaled_expert_key(l, e, "w1"), lname(l, p + "w1.weight", p + "w1.weight"), {I, D}));
      TRY_ASSIGN(w.experts[e].w3, ld.linear(scaled_expert_key(l, e, "w3"), lname(l, p + "w3.weight", p + "w3.weight"), {I, D}));
      TRY_ASSIGN(w.experts[e].w2, ld.linear(scaled_expert_key(l, e, "w2"), lname(l, p + "w2.weight", p + "w2.weight"), {D, I}));
    }
  }
  bool shared_stored = false;
  if (routed_stored) TRY_ASSIGN(shared_stored, ld.shared_as_stored(l, I, D));
  auto const shared_in = ld.part_of(&RankParts::shared_in);
  if (!shared_stored) {
    TRY_ASSIGN(w.shared.w1, ld.linear(exl3_shared_key(l, "w1"),
                                      lname(l, "ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"), {I, D},
                                      shared_in));
    TRY_ASSIGN(w.shared.w3, ld.linear(exl3_shared_key(l, "w3"),
                                      lname(l, "ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"), {I, D},
                                      shared_in));
    TRY_ASSIGN(w.shared.w2, ld.linear(exl3_shared_key(l, "w2"),
                                      lname(l, "ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"), {D, I},
                                      ld.part_of(&RankParts::shared_out)));
  }
  int64_t ei = s.engram_index(l);
  if (ei >= 0) {
    int64_t de = s.engram_head_dim, C = (s.engram_max_ngram - 1) * s.engram_n_heads;
    int64_t rows = s.engram_num_embeddings[ei];
    auto names = lname(l, "engram.embed.weight", "engram.embed.weight");
    names.push_back("model.engram_tables." + std::to_string(l) + ".weight");
    // With a part, rows [p.begin, p.end) of the table and of its scales: row r of the part is table row p.begin + r.
    auto const part = ld.e_table_part(l);
    if (part)
      TRY_ASSIGN(w.e_table, ld.part("", names, {rows, de}, *part, false));
    else
      TRY_ASSIGN(w.e_table, ld.get(names, {rows, de}));
    int64_t const held = part ? part->size() : rows;
    for (auto const& n : names) {
      if (!ld.src().contains(n)) continue;
      auto dt = ld.src().dtype(n);
      if (!dt) return dt.status();
      if (*dt != DType::kF8E4m3) break;
      // fp8 rows are dequantised with their per-32-channel scales (spec §2.4.3 step 1).
      std::string sn = n.substr(0, n.size() - std::string("weight").size());
      Tensor sc;
      std::vector<std::string> const scale_names{sn + "scale", sn + "weight_scale_inv"};
      if (part)
        TRY_ASSIGN(sc, ld.part("", scale_names, {rows, de / 32}, *part, false, true));
      else
        TRY_ASSIGN(sc, ld.get(scale_names, {rows, de / 32}, true));
      float* p = w.e_table.data_as<float>();
      for (int64_t r = 0; r < held; ++r)
        for (int64_t c = 0; c < de; ++c) p[r * de + c] *= sc.data_as<float>()[r * (de / 32) + c / 32];
      ld.round(w.e_table);
      break;
    }
    TRY_ASSIGN(w.e_wkv, ld.projection(key("e_wkv"),
                                      lname(l, "engram.wkv.weight", "engram.wkv.weight"), {(n + 1) * D, C * de}));
    Tensor q, k;
    TRY_ASSIGN(q, ld.get(lname(l, "engram.q_weight", "engram.q_weight"), {n, D}));
    TRY_ASSIGN(k, ld.get(lname(l, "engram.k_weight", "engram.k_weight"), {n, D}));
    w.e_qk = Tensor::zeros(DType::kF32, {n, D});
    for (int64_t i = 0; i < n * D; ++i) w.e_qk.data_as<float>()[i] = q.data_as<float>()[i] * k.data_as<float>()[i];
  }
  return {};
}

}  // namespace

Status check_scaled_row_range(std::string const& where, std::string const& name, DType dtype, int64_t rows, int64_t r0,
                              int64_t r1) {
  if (r0 < 0 || r0 > r1 || r1 > rows)
    return invalid_argument(where + ": scaled tensor " + name + " has " + std::to_string(rows) + " rows, no rows [" +
                            std::to_string(r0) + ", " + std::to_string(r1) + ")");
  if (dtype == DType::kF8E4m3 && (r0 % 32 != 0 || (r1 % 32 != 0 && r1 != rows)))
    return invalid_argument(where + ": rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") of FP8 tensor " +
                            name + " (" + std::to_string(rows) + " rows) are not whole 32-row scale blocks");
  return {};
}

Result<Tensor> WeightSource::load_f32_rows(std::string const& name, int64_t r0, int64_t r1) const {
  auto t = load_f32(name);
  if (!t) return t.status();
  if (t->rank() < 1 || r0 < 0 || r0 > r1 || r1 > t->dim(0))
    return invalid_argument(describe() + ": tensor " + name + " of shape " + shape_to_string(t->shape()) +
                            " has no rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ")");
  std::vector<int64_t> shape = t->shape();
  shape[0] = r1 - r0;
  auto out = Tensor::empty(DType::kF32, shape);
  if (!out) return out.status();
  size_t const row = t->dim(0) ? t->nbytes() / static_cast<size_t>(t->dim(0)) : 0;
  if (out->nbytes()) std::memcpy(out->data(), t->data_as<unsigned char>() + static_cast<size_t>(r0) * row, out->nbytes());
  return out;
}

namespace {
Tensor byte_rows(Tensor const& t, int64_t r0, int64_t r1) {
  std::vector<int64_t> shape = t.shape();
  shape[0] = r1 - r0;
  Tensor out = Tensor::zeros(t.dtype(), shape);
  size_t const row = t.dim(0) ? t.nbytes() / static_cast<size_t>(t.dim(0)) : 0;
  if (out.nbytes()) std::memcpy(out.data(), t.data_as<unsigned char>() + static_cast<size_t>(r0) * row, out.nbytes());
  return out;
}
}  // namespace

Result<ScaledWeight> WeightSource::load_scaled_rows(std::string const& name, int64_t r0, int64_t r1) const {
  auto sw = load_scaled(name);
  if (!sw) return sw.status();
  if (!sw->present()) return sw;
  TESSERA_TRY(check_scaled_row_range(describe(), name, sw->dtype, sw->rows, r0, r1));
  bool const fp8 = sw->dtype == DType::kF8E4m3;
  ScaledWeight out{sw->dtype, r1 - r0, sw->cols, byte_rows(sw->codes, r0, r1),
                   byte_rows(sw->scales, fp8 ? r0 / 32 : r0, fp8 ? (r1 + 31) / 32 : r1)};
  return out;
}

Status check_scaled_col_range(std::string const& where, std::string const& name, DType dtype, int64_t cols, int64_t c0,
                              int64_t c1) {
  if (dtype != DType::kF8E4m3)
    return invalid_argument(where + ": columns of " + std::string(dtype_name(dtype)) + " tensor " + name +
                            " are not read as stored (FP8 only)");
  if (c0 < 0 || c0 > c1 || c1 > cols)
    return invalid_argument(where + ": scaled tensor " + name + " has " + std::to_string(cols) + " columns, no columns [" +
                            std::to_string(c0) + ", " + std::to_string(c1) + ")");
  if (c0 % 32 != 0 || (c1 % 32 != 0 && c1 != cols))
    return invalid_argument(where + ": columns [" + std::to_string(c0) + ", " + std::to_string(c1) + ") of FP8 tensor " +
                            name + " (" + std::to_string(cols) + " columns) are not whole 32-column scale blocks");
  return {};
}

namespace {
/// Columns [c0, c1) of a 2-D tensor of byte-sized (or 4-byte) elements.
Tensor byte_cols(Tensor const& t, int64_t c0, int64_t c1) {
  Tensor out = Tensor::zeros(t.dtype(), {t.dim(0), c1 - c0});
  size_t const es = dtype_size(t.dtype()), row = static_cast<size_t>(t.dim(1)) * es, part = static_cast<size_t>(c1 - c0) * es;
  for (int64_t r = 0; r < t.dim(0) && part; ++r)
    std::memcpy(out.data_as<unsigned char>() + static_cast<size_t>(r) * part,
                t.data_as<unsigned char>() + static_cast<size_t>(r) * row + static_cast<size_t>(c0) * es, part);
  return out;
}
}  // namespace

Result<Tensor> WeightSource::load_f32_cols(std::string const& name, int64_t c0, int64_t c1) const {
  auto t = load_f32(name);
  if (!t) return t.status();
  if (t->rank() != 2 || c0 < 0 || c0 > c1 || c1 > t->dim(1))
    return invalid_argument(describe() + ": tensor " + name + " of shape " + shape_to_string(t->shape()) +
                            " has no columns [" + std::to_string(c0) + ", " + std::to_string(c1) + ")");
  return byte_cols(*t, c0, c1);
}

Result<ScaledWeight> WeightSource::load_scaled_cols(std::string const& name, int64_t c0, int64_t c1) const {
  auto sw = load_scaled(name);
  if (!sw) return sw.status();
  if (!sw->present()) return sw;
  TESSERA_TRY(check_scaled_col_range(describe(), name, sw->dtype, sw->cols, c0, c1));
  return ScaledWeight{sw->dtype, sw->rows, c1 - c0, byte_cols(sw->codes, c0, c1),
                      byte_cols(sw->scales, c0 / 32, (c1 + 31) / 32)};
}

Result<DType> WeightSource::scaled_dtype(std::string const& name) const {
  auto sw = load_scaled(name);
  if (!sw) return sw.status();
  return sw->dtype;
}

bool scaled_whole_blocks(DType dtype, int64_t n, int64_t begin, int64_t end, bool cols) {
  if (!cols && dtype == DType::kF4E2m1x2) return true;  // a scale row per row
  return begin % 32 == 0 && (end % 32 == 0 || end == n);
}

bool RankParts::any() const {
  for (auto const* p : {&wq_b, &attn_sink, &wo_a, &wo_b, &shared_in, &shared_out, &lm_head})
    if (p->has_value()) return true;
  for (auto const& p : e_table)
    if (p) return true;
  return false;
}

Tensor slice_part(Tensor const& t, WeightPart p) {
  if (!p.cols) {
    int64_t const cols = t.rank() == 1 ? 1 : t.dim(1);
    float const* src = t.data_as<float>() + p.begin * cols;
    std::vector<float> v(src, src + p.size() * cols);
    return t.rank() == 1 ? Tensor::from_floats(v, {p.size()}) : Tensor::from_floats(v, {p.size(), cols});
  }
  int64_t const n = t.dim(0), c = t.dim(1);
  std::vector<float> v(static_cast<size_t>(n * p.size()));
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(&v[i * p.size()], t.data_as<float>() + i * c + p.begin, p.size() * sizeof(float));
  return Tensor::from_floats(v, {n, p.size()});
}

ScaledWeight slice_scaled(ScaledWeight const& w, WeightPart p) {
  bool const fp4 = w.dtype == DType::kF4E2m1x2;
  if (!p.cols) {
    // Codes rows [r0, r1); scale rows [r0/32, ⌈r1/32⌉) (FP8 32-row blocks) or [r0, r1) (FP4).
    int64_t const s0 = fp4 ? p.begin : p.begin / 32, s1 = fp4 ? p.end : (p.end + 31) / 32;
    ScaledWeight out{w.dtype, p.size(), w.cols, byte_rows(w.codes, p.begin, p.end), byte_rows(w.scales, s0, s1)};
    return out;
  }
  // Code columns (FP4: bytes [c0/2, c1/2), two codes a byte) of every row; scale columns [c0/32, ⌈c1/32⌉).
  int64_t const q0 = fp4 ? p.begin / 2 : p.begin, q1 = fp4 ? p.end / 2 : p.end;
  return ScaledWeight{w.dtype, w.rows, p.size(), byte_cols(w.codes, q0, q1),
                      byte_cols(w.scales, p.begin / 32, (p.end + 31) / 32)};
}

Result<Exl3Weight> slice_exl3(Exl3Weight const& q, WeightPart p) {
  int64_t const k = q.desc.k, n = q.desc.n, tn = n / 16, wpt = q.trellis.dim(2);
  auto range = [&] { return std::to_string(p.begin) + ", " + std::to_string(p.end) + ")"; };
  if (q.kept_end >= 0) return not_supported("EXL3 group " + q.name + " already keeps part of its outputs; not cut again");
  if (p.begin < 0 || p.begin > p.end || p.end > (p.cols ? k : n))
    return invalid_argument("EXL3 group " + q.name + " has no " + (p.cols ? "input" : "output") + "s [" + range());
  Exl3Weight out;
  out.desc = q.desc;
  out.name = q.name;
  int16_t const* src = q.trellis.data_as<int16_t>();
  if (p.cols) {
    if (p.begin % 128 != 0 || p.end % 128 != 0)
      return not_supported("EXL3 group " + q.name + ": inputs [" + range() + " cut a 128-input Hadamard block "
                           "(spec/exl3.md §1.4 splits inputs on multiples of 128)");
    int64_t const t0 = p.begin / 16, t1 = p.end / 16;
    out.desc.k = p.size();
    out.trellis = Tensor::zeros(DType::kI16, {t1 - t0, tn, wpt});
    // Tile rows [t0, t1): trellis[t0 : t1, :, :], contiguous.
    std::memcpy(out.trellis.data_as<int16_t>(), src + t0 * tn * wpt, static_cast<size_t>((t1 - t0) * tn * wpt) * sizeof(int16_t));
    out.suh.assign(q.suh.begin() + p.begin, q.suh.begin() + p.end);
    out.svh = q.svh;
    return out;
  }
  int64_t const b0 = p.begin / 128 * 128, b1 = std::min(n, (p.end + 127) / 128 * 128);
  int64_t const c0 = b0 / 16, tc = (b1 - b0) / 16, tk = k / 16;
  out.desc.n = b1 - b0;
  out.trellis = Tensor::zeros(DType::kI16, {tk, tc, wpt});
  int16_t* dst = out.trellis.data_as<int16_t>();
  // Tile columns [c0, c0 + tc) of every tile row: trellis[:, c0 : c0 + tc, :].
  for (int64_t a = 0; a < tk; ++a)
    std::memcpy(dst + a * tc * wpt, src + (a * tn + c0) * wpt, static_cast<size_t>(tc * wpt) * sizeof(int16_t));
  out.suh = q.suh;
  out.svh.assign(q.svh.begin() + b0, q.svh.begin() + b1);
  out.whole_n = n;
  if (p.begin != b0 || p.end != b1) {
    out.kept_begin = p.begin - b0;
    out.kept_end = p.end - b0;
  }
  return out;
}

Tensor exl3_effective_weight(Exl3Weight const& q) {
  ref::Exl3HostLayer L;
  L.k = q.desc.k; L.n = q.desc.n; L.k2 = q.desc.k2; L.codebook = q.desc.codebook;
  L.trellis = q.trellis.data_as<int16_t>();
  L.suh = q.suh.data(); L.svh = q.svh.data();
  std::vector<double> const w = ref::exl3_dense_weight(L, ref::exl3_decode_inner(L).data());  // [k, n]
  int64_t const j0 = q.kept_begin, n = q.outputs();  // the outputs the linear yields
  Tensor t = Tensor::zeros(DType::kF32, {n, L.k});
  float* o = t.data_as<float>();
  parallel_for(n, [&](int64_t b, int64_t e) {  // elementwise: any split gives the same values
    for (int64_t j = b; j < e; ++j)
      for (int64_t i = 0; i < L.k; ++i) o[j * L.k + i] = static_cast<float>(w[static_cast<size_t>(i * L.n + j0 + j)]);
  });
  return t;
}

Tensor dequantize_scaled(ScaledWeight const& sw) {
  Tensor t = Tensor::zeros(DType::kF32, {sw.rows, sw.cols});
  uint8_t const* q = sw.codes.data_as<uint8_t>();
  uint8_t const* sc = sw.scales.data_as<uint8_t>();
  int64_t const ldq = sw.dtype == DType::kF4E2m1x2 ? sw.cols / 2 : sw.cols, lds = sw.scales.dim(1);
  float* o = t.data_as<float>();
  parallel_for(sw.rows, [&](int64_t b, int64_t e) {  // elementwise: any split gives the same values
    for (int64_t r = b; r < e; ++r) ops::scaled_weight_row(sw.dtype, q, ldq, sc, lds, r, sw.cols, o + r * sw.cols);
  });
  return t;
}

std::string scaled_weight_key(int64_t layer, std::string const& field) {
  return "layers." + std::to_string(layer) + "." + field;
}

Result<Weights> load_weights(ModelSpec const& s, WeightSource const& src, Numerics num, WeightLoadOptions opts) {
  int64_t const end = opts.routed_end < 0 ? s.n_experts : opts.routed_end;
  if (opts.routed_begin < 0 || opts.routed_begin > end || end > s.n_experts)
    return invalid_argument(src.describe() + ": routed experts [" + std::to_string(opts.routed_begin) + ", " +
                            std::to_string(end) + ") are not a range of the checkpoint's " +
                            std::to_string(s.n_experts) + " routed experts");
  if (!opts.parts.e_table.empty() && static_cast<int64_t>(opts.parts.e_table.size()) != s.num_layers)
    return invalid_argument(src.describe() + ": rank parts give Engram table parts of " +
                            std::to_string(opts.parts.e_table.size()) + " layers, the model has " +
                            std::to_string(s.num_layers));
  Weights w;
  Loader ld(src, num, opts, w);
  int64_t V = s.vocab_size, D = s.hidden_size;
  TRY_ASSIGN(w.embed, ld.get({"model.embed.weight", "model.embed_tokens.weight", "embed.weight"}, {V, D}));
  TRY_ASSIGN(w.norm, ld.get({"model.norm.weight", "norm.weight"}, {D}));
  TRY_ASSIGN(w.lm_head, ld.projection(scaled_head_key(), {"lm_head.weight", "head.weight"}, {V, D},
                                      ld.part_of(&RankParts::lm_head)));
  w.layers.resize(static_cast<size_t>(s.num_layers));
  for (int64_t l = 0; l < s.num_layers; ++l) TESSERA_TRY(load_layer(s, ld, l, w.layers[l]));
  return w;
}

}  // namespace tessera::model::dsv41

// SPDX-License-Identifier: Apache-2.0
/// Weights of the DeepSeek-V4.1 text model as fp32 host tensors (bf16 values in a bf16 model), loaded by
/// logical name from any of the three naming schemes of spec/deepseek-v41.md §4.1: OLD (transformers
/// 0a2080b, the golden's: `model.layers.i.attn.wq_a.weight`), NEW (§8.2: `…self_attn.q_a_proj.weight`,
/// fused `mlp.experts.gate_up_proj`) and native (`layers.i.attn.wq_a.weight`, `head.weight`). A missing
/// or misshapen tensor is an error that names it (and the alternatives looked for).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/models/deepseek_v41/model_spec.hpp"
#include "tessera/ops/exl3.hpp"

namespace tessera::model::dsv41 {

/// A block-scaled weight as stored (spec/deepseek-v41.md §4.2), in ops::LinearDesc's layouts for its dtype:
///   kF8E4m3    codes [rows, cols] e4m3 bytes,           scales [⌈rows/32⌉, ⌈cols/32⌉] ue8m0 (32×32 blocks);
///   kF4E2m1x2  codes [rows, cols/2] two e2m1 per byte,  scales [rows, ⌈cols/32⌉] ue8m0 (per row, 32 columns);
/// the even column in the low nibble. Value (r, c) = code · 2^(scale − 127), exact in fp32: what load_f32
/// returns for the same name. Row-major, contiguous; the tensors hold the checkpoint's bytes (their Tensor
/// dtype is the stored one: F8_E4M3 / I8 codes, F8_E8M0 scales). `dtype` kF32 with undefined tensors: the
/// tensor is not stored block-scaled.
struct ScaledWeight {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;  // logical shape
  Tensor codes, scales;
  bool present() const { return dtype == DType::kF8E4m3 || dtype == DType::kF4E2m1x2; }
};

/// An EXL3 linear as stored (spec/exl3.md §1.1): the group `P.trellis` / `P.suh` / `P.svh` (+ codebook marker)
/// standing for the weight `P.weight` [out, in]. Its value as a linear of the model is the EXL3 product
///   y = →md(Exl3Gemm_f32(→fp16(x)))   (docs/deepseek-v41-gpu.md "EXL3 checkpoints"; architecture note 18)
/// with k = in, n = out. No bias (DeepSeek-V4.1's linears have none; a group with `P.bias` is refused).
struct Exl3Weight {
  ops::Exl3LayerDesc desc;          // k = in_features, n = out_features, 2·K, codebook
  Tensor trellis;                   // I16 [k/16, n/16, 8·k2]: the checkpoint's words, an owned copy
  std::vector<uint16_t> suh, svh;   // fp16 bits [k], [n] (legacy packed signs expanded to ±1)
  std::string name;                 // the group's prefix P, for messages
  /// The outputs [kept_begin, kept_end) of the n computed that the linear yields; kept_end −1: all n. Set on a rank's
  /// part whose output bounds are not on 128-column Hadamard blocks: it holds the whole blocks covering the part
  /// (slice_exl3), computes them and keeps the part's columns.
  int64_t kept_begin = 0, kept_end = -1;
  /// Outputs of the whole group an output part was cut from (slice_exl3); 0 for a whole group or an input part. The
  /// CUDA product chooses its k-chunk count from the layer's width, so a part computes with the whole group's
  /// (ops::Exl3GemmDesc::chunk_n) and its outputs are the whole product's bits there too.
  int64_t whole_n = 0;
  /// Output features the linear yields.
  int64_t outputs() const { return kept_end < 0 ? desc.n : kept_end - kept_begin; }
};

/// The effective dense weight of an EXL3 linear as the model's [out, in] fp32 tensor: W = diag(suh) H W' H
/// diag(svh) (spec/exl3.md §4.2) summed in float64 and rounded once to fp32 (Wᵀ, row o = output o; the kept outputs
/// only, Exl3Weight::outputs()).
Tensor exl3_effective_weight(Exl3Weight const& w);

/// Where tensors come from (a checkpoint, a test fixture). Float tensors of any float dtype are returned
/// as fp32 values (exact for bf16/fp8); integer tensors as int64.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool contains(std::string const& name) const = 0;
  virtual Result<std::vector<int64_t>> shape(std::string const& name) const = 0;
  /// The stored dtype (the Engram table is dequantised with its scales only when it is fp8).
  virtual Result<DType> dtype(std::string const& name) const = 0;
  virtual Result<Tensor> load_f32(std::string const& name) const = 0;
  virtual Result<Tensor> load_i64(std::string const& name) const = 0;
  /// The stored codes and scales of a block-scaled tensor; an empty ScaledWeight (present() false) when
  /// `name` is not stored block-scaled (the default: a source without scaled tensors).
  virtual Result<ScaledWeight> load_scaled(std::string const& name) const {
    (void)name;
    return ScaledWeight{};
  }
  /// Rows [r0, r1) of load_f32(name). The default loads the whole tensor and copies the rows; CheckpointSource
  /// reads only the rows (and, block-scaled, the scale rows covering them).
  virtual Result<Tensor> load_f32_rows(std::string const& name, int64_t r0, int64_t r1) const;
  /// Rows [r0, r1) of load_scaled(name) as stored: codes rows [r0, r1); scale rows [r0/32, ⌈r1/32⌉) (kF8E4m3, which
  /// requires whole 32-row blocks: r0 a multiple of 32, r1 one or `rows`) or [r0, r1) (kF4E2m1x2); `rows` r1 − r0.
  /// A range that is not whole scale blocks, or outside the tensor, is refused with a message naming the tensor.
  /// The default loads the whole tensor and copies the rows; CheckpointSource reads only them.
  virtual Result<ScaledWeight> load_scaled_rows(std::string const& name, int64_t r0, int64_t r1) const;
  /// Columns [c0, c1) of load_f32(name) (a 2-D tensor). The default loads the whole tensor and copies the columns;
  /// CheckpointSource reads only them (block-scaled: their codes and the scale columns covering them, any columns).
  virtual Result<Tensor> load_f32_cols(std::string const& name, int64_t c0, int64_t c1) const;
  /// The block-scaled format `name` is stored in (kF8E4m3, kF4E2m1x2; kF32 when it is not stored block-scaled):
  /// load_scaled(name).dtype. The default loads the tensor; CheckpointSource answers from the checkpoint's header.
  virtual Result<DType> scaled_dtype(std::string const& name) const;
  /// Columns [c0, c1) of load_scaled(name) as stored, kF8E4m3 only: codes columns [c0, c1), scale columns
  /// [c0/32, ⌈c1/32⌉) of every scale row; whole 32-column blocks required (c0 a multiple of 32, c1 one or `cols`).
  /// FP4, a range that is not whole blocks or outside the tensor is refused with a message naming the tensor.
  /// The default loads the whole tensor and copies the columns; CheckpointSource reads only them.
  virtual Result<ScaledWeight> load_scaled_cols(std::string const& name, int64_t c0, int64_t c1) const;
  /// Whether the weight `name` ("P.weight", absent as such) is stored as an EXL3 group `P.trellis` / … .
  virtual bool is_exl3(std::string const& name) const {
    (void)name;
    return false;
  }
  /// The validated EXL3 group standing for `name` (errors name the offending tensor).
  virtual Result<Exl3Weight> load_exl3(std::string const& name) const {
    return not_found(describe() + ": no EXL3 group for " + name);
  }
  /// Where the tensors come from, for messages.
  virtual std::string describe() const = 0;
};

/// OK when rows [r0, r1) of a block-scaled tensor `name` (dtype, `rows` rows) can be read as stored: inside the
/// tensor and, for kF8E4m3, whole 32-row scale blocks (r0 a multiple of 32; r1 one or `rows`). `where` prefixes the
/// message.
Status check_scaled_row_range(std::string const& where, std::string const& name, DType dtype, int64_t rows, int64_t r0,
                              int64_t r1);
/// OK when columns [c0, c1) of a block-scaled tensor can be read as stored: kF8E4m3, inside the tensor, whole
/// 32-column scale blocks (c0 a multiple of 32; c1 one or `cols`).
Status check_scaled_col_range(std::string const& where, std::string const& name, DType dtype, int64_t cols, int64_t c0,
                              int64_t c1);

/// Whether rows (cols = false) or columns (cols = true) [begin, end) of a block-scaled weight in `dtype` with n of them
/// in all are whole scale blocks, so that they can be held as stored: FP8 (kF8E4m3) rows and columns come in 32×32
/// blocks, FP4 (kF4E2m1x2) columns in 32s (its rows have a scale row each, so any rows are). The last block may be the
/// tensor's partial one (end = n).
bool scaled_whole_blocks(DType dtype, int64_t n, int64_t begin, int64_t end, bool cols);

/// Rows [begin, end) of a weight, or columns [begin, end) of a 2-D one (`cols`): the part of a tensor-parallel split
/// that one rank holds.
struct WeightPart {
  int64_t begin = 0, end = 0;
  bool cols = false;
  int64_t size() const { return end - begin; }
  friend bool operator==(WeightPart const&, WeightPart const&) = default;
};

/// The parts of the tensor-parallel split tensors that one rank holds (rank_parts, sharded.hpp); an absent part is
/// the whole tensor. Every layer has the same parts except the Engram tables:
///   wq_b        rows [h0·hd, h1·hd) of the rank's query heads    attn_sink   the heads [h0, h1)
///   wo_a        rows [g0·ro, g1·ro) of its o-groups               wo_b        output rows, or (all-reduce) the groups' columns
///   shared_in   shared-expert w1 / w3 rows                        shared_out  shared-expert w2 rows
///   lm_head     vocabulary rows                                   e_table[l]  rows of layer l's Engram table that the
///                                                                             rank's hash columns index
struct RankParts {
  std::optional<WeightPart> wq_b, attn_sink, wo_a, wo_b, shared_in, shared_out, lm_head;
  std::vector<std::optional<WeightPart>> e_table;  // [num_layers], or empty: every table whole
  /// Whether any tensor is cut to a part.
  bool any() const;
  friend bool operator==(RankParts const&, RankParts const&) = default;
};

/// Part `p` of a 1-D or 2-D fp32 tensor (a copy; rows of a 1-D tensor).
Tensor slice_part(Tensor const& t, WeightPart p);
/// Part `p` of a block-scaled weight as stored, `p` whole scale blocks (scaled_whole_blocks): rows [r0, r1) of codes
/// with the scale rows covering them (FP8: [r0/32, ⌈r1/32⌉); FP4: [r0, r1)), or columns [c0, c1) of codes (FP4: bytes
/// [c0/2, c1/2)) with the scale columns [c0/32, ⌈c1/32⌉) of every scale row. Copies.
ScaledWeight slice_scaled(ScaledWeight const& w, WeightPart p);
/// Part `p` of an EXL3 linear as stored (spec/exl3.md §1.4; W [out, in] = n × k, so rows are outputs), copies:
///   rows [n0, n1):    the 128-column blocks covering them, [b0, b1) = [128·⌊n0/128⌋, min(n, 128·⌈n1/128⌉)): trellis
///                     tile columns [b0/16, b1/16) of every tile row, svh[b0:b1], suh whole; kept [n0 − b0, n1 − b0)
///                     when the part is not [b0, b1) itself. Each output is computed exactly as in the whole linear
///                     (its column's sum and its own 128-block's output Hadamard), so the part's outputs are bits of
///                     the whole product (whole_n = n records the group's width);
///   columns [k0, k1): an input split, trellis tile rows [k0/16, k1/16), suh[k0:k1], svh whole: the linear then gives
///                     the partial product over those inputs (the sum of the parts equals the whole product up to the
///                     roundings of the partial epilogues). k0 and k1 must be multiples of 128 (no input Hadamard block
///                     cut), else kNotSupported naming the group.
/// A weight that already keeps part of its outputs is not cut again (kNotSupported).
Result<Exl3Weight> slice_exl3(Exl3Weight const& q, WeightPart p);

struct ExpertWeights {
  Tensor w1, w3, w2;  // [I, D], [I, D], [D, I]
};

struct LayerWeights {
  Tensor hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;  // fp32 always
  Tensor attn_norm, ffn_norm;
  Tensor wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink;
  Tensor c_wkv, c_wgate, c_norm;                     // KV sources (c_wgate only for ratio > 1)
  Tensor i_wq_b, i_weights_proj, i_wk, i_k_norm;     // index sources (wk, k_norm when also a KV source)
  Tensor gate, gate_bias;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  Tensor e_table, e_wkv, e_qk;                       // Engram: table [rows, de], wkv, q_weight ⊙ k_weight
};

struct Weights {
  Tensor embed, norm, lm_head;
  std::vector<LayerWeights> layers;
  /// With WeightLoadOptions::keep_scaled_projections: the stored form of each block-scaled projection, by
  /// scaled_weight_key (the dequantised tensor above is loaded as well unless projections_as_stored); with
  /// experts_as_stored also routed experts, by scaled_expert_key (their ExpertWeights stay empty), and with
  /// shared_expert_as_stored the shared expert, by scaled_shared_key (its ExpertWeights stay empty). Its bf16
  /// value ops::scaled_weight = →bf16(code · 2^(s − 127)) equals the tensor above in bf16 numerics. A rank's
  /// weights (rank_weights, sharded.hpp) hold the slices of these: codes and scales of the rank's rows or columns.
  std::map<std::string, ScaledWeight> scaled;
  /// The stored form recorded under `key`, or nullptr.
  ScaledWeight const* scaled_of(std::string const& key) const {
    auto it = scaled.find(key);
    return it == scaled.end() ? nullptr : &it->second;
  }
  /// With WeightLoadOptions::keep_exl3: every linear stored as an EXL3 group, by scaled_weight_key /
  /// scaled_head_key / scaled_expert_key / exl3_shared_key; its dense tensor above is left undefined.
  std::map<std::string, Exl3Weight> exl3;
  /// The EXL3 weight recorded under `key`, or nullptr.
  Exl3Weight const* exl3_of(std::string const& key) const {
    auto it = exl3.find(key);
    return it == exl3.end() ? nullptr : &it->second;
  }
};

/// Key of Weights::scaled: "lm_head", or "layers.<l>.<field>" with the LayerWeights field name of one of the
/// projections wq_a, wq_b, wkv, wo_a, wo_b, c_wkv, c_wgate, i_wq_b, i_weights_proj, i_wk, e_wkv.
std::string scaled_weight_key(int64_t layer, std::string const& field);
inline std::string scaled_head_key() { return "lm_head"; }
/// "layers.<l>.experts.<e>.<w>" (w = w1, w3, w2).
inline std::string scaled_expert_key(int64_t layer, int64_t expert, char const* w) {
  return "layers." + std::to_string(layer) + ".experts." + std::to_string(expert) + "." + w;
}

/// The dense value of a block-scaled weight: [rows, cols] fp32 holding ops::scaled_weight = →bf16(code·2^(s−127)),
/// which equals the loader's dequantised tensor in bf16 numerics.
Tensor dequantize_scaled(ScaledWeight const& sw);

/// "layers.<l>.shared.<w>" (w = w1, w3, w2): the shared expert's key in Weights::exl3.
inline std::string exl3_shared_key(int64_t layer, char const* w) {
  return "layers." + std::to_string(layer) + ".shared." + w;
}

/// "layers.<l>.shared.<w>" (w = w1, w3, w2): the shared expert's key in Weights::scaled (the exl3_shared_key string).
inline std::string scaled_shared_key(int64_t layer, char const* w) { return exl3_shared_key(layer, w); }

struct WeightLoadOptions {
  /// Linears stored as EXL3 groups (the head, every projection, routed and shared experts) are recorded in
  /// Weights::exl3 as stored and their dense tensors left undefined. Off: they load as their effective dense
  /// weight (exl3_effective_weight, then →bf16 in bf16 numerics). Other EXL3 tensors always load dense.
  bool keep_exl3 = false;
  /// Also record the stored codes and scales of the head and of the attention / compressor / indexer /
  /// Engram projections that the source stores block-scaled (Weights::scaled). Experts (routed and shared)
  /// are never recorded.
  bool keep_scaled_projections = false;
  /// With keep_scaled_projections: a projection recorded in Weights::scaled is NOT loaded dequantised as well
  /// (its tensor in LayerWeights / Weights::lm_head stays undefined; dequantize_scaled makes it when needed).
  bool projections_as_stored = false;
  /// A layer whose routed experts (per-expert tensors) are ALL stored block-scaled in one dtype this accepts
  /// has them recorded in Weights::scaled (keys scaled_expert_key) INSTEAD of loaded dequantised: its
  /// ExpertWeights stay empty, so no fp32 host copy of them is made (a full-size Flash layer's experts are
  /// ~56 GB in fp32, ~7 GB stored). Empty (default): experts always load dequantised. The shared expert and
  /// fused NEW-format expert tensors always load dequantised.
  std::function<bool(DType)> experts_as_stored;
  /// A layer whose routed experts were recorded as stored (experts_as_stored) and whose shared expert's w1/w3/w2
  /// are stored block-scaled in one dtype this accepts, read whole (no RankParts part), has the shared expert
  /// recorded in Weights::scaled (keys scaled_shared_key) INSTEAD of loaded dequantised: its ExpertWeights stay
  /// empty (the native release stores it FP8: 35 MB a Flash layer as stored, 141 MB in fp32). Empty (default):
  /// the shared expert loads dequantised.
  std::function<bool(DType)> shared_expert_as_stored;
  /// Only routed experts [routed_begin, routed_end) are read (routed_end −1: all): the others are not read at all,
  /// their ExpertWeights stay empty and they get no Weights::scaled entry (a rank's host weights, sharded.hpp).
  /// Fused NEW-format expert tensors are read whole and the range kept.
  int64_t routed_begin = 0, routed_end = -1;
  /// Only these parts of the tensor-parallel split tensors are read (a rank's host weights, sharded.hpp; none by
  /// default: every tensor whole): each loaded
  /// tensor is its part, [end − begin, cols] or [rows, end − begin], exactly the slice rank_weights takes of the whole
  /// tensor. With keep_scaled_projections a block-scaled projection or head whose part is whole scale blocks
  /// (scaled_whole_blocks) is recorded as the stored part alone (Weights::scaled; its dense tensor stays undefined;
  /// FP8 codes and the scales covering them read alone, FP4 columns by a whole read); every other part is read as
  /// values (WeightSource::load_f32_rows / load_f32_cols, →bf16 unless kept fp32), which for a block-scaled weight
  /// are dequantize_scaled's. A part outside its tensor is refused naming the tensor; an EXL3 weight's part is, with
  /// keep_exl3, its EXL3 part (slice_exl3 of the group, which is read whole; an input split off 128-input blocks is
  /// kNotSupported) and otherwise cut from the whole effective weight.
  RankParts parts;
};

/// Loads every tensor the spec needs; in bf16 mode every parameter except the fp32-kept ones (mHC,
/// sinks, router biases) is rounded to bf16 (exact when the checkpoint is bf16 already).
Result<Weights> load_weights(ModelSpec const& spec, WeightSource const& src, Numerics numerics,
                             WeightLoadOptions opts = {});

}  // namespace tessera::model::dsv41

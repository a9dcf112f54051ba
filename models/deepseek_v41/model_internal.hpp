// SPDX-License-Identifier: Apache-2.0
/// Internals shared by the model's translation units: the per-forward chunk record (the reference's
/// per-forward `shared` dict plus positions) and the row-parallel linear layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/context.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/models/deepseek_v41/model.hpp"
#include "tessera/models/deepseek_v41/model_spec.hpp"
#include "tessera/models/deepseek_v41/weights.hpp"

namespace tessera::model::dsv41 {

struct Dsv41Model::Chunk {
  int64_t rows = 0;
  std::vector<int64_t> pos;             // [S] absolute positions
  ExecContext ctx;
  DType md = DType::kF32;
  // The per-forward shared state of spec §2.5.3-§2.5.4 (rebuilt every forward).
  int64_t ckv_src = -1;                 // layer whose compressed KV cache is published
  int64_t idx_src = -1;                 // layer whose index keys are published
  bool has_topk = false;
  std::vector<std::vector<int32_t>> topk;  // per row: selected entries, ascending
  bool has_cand = false;
  std::vector<uint8_t> cand;            // [S, T] candidate mask of the candidate source
};

/// out[r, o] = →md(x[r]·W[o]) for r < rows, W [out, in]; each element is one fixed-order dot product, so
/// the split across threads (rows × column blocks) never changes a value.
void linear(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w, float* out, DType md);

// EXL3 linears (exl3_linear.cpp): y = →md(Exl3Gemm_f32(→fp16(x))) per row; docs/deepseek-v41-gpu.md.
/// x [rows, x_stride] fp32 → fp16 bits [rows, cols] (RNE).
void to_f16_rows(float const* x, int64_t x_stride, int64_t rows, int64_t cols, uint16_t* out);
/// out[r, :] = →md(Exl3Gemm_f32(→fp16(x[r, :]))) on the CPU backend; x [rows, k], out [rows, n].
void linear_exl3(ExecContext& ctx, float const* x, int64_t rows, Exl3Weight const& q, float* out, DType md);
/// linear_exl3 when `q` is set, else the dense linear above.
void linear(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w, Exl3Weight const* q, float* out, DType md);

/// The form a linear's weight is held in: EXL3 (its product), block-scaled (ops::Linear's block-scaled weight,
/// whose values are the dequantised bf16 ones: the dense linear's bits), or neither (the dense tensor).
struct StoredLinear {
  Exl3Weight const* exl3 = nullptr;
  ScaledWeight const* scaled = nullptr;
};
/// The stored forms `w` records under `key` (Weights::exl3, Weights::scaled).
inline StoredLinear stored_linear(Weights const& w, std::string const& key) { return {w.exl3_of(key), w.scaled_of(key)}; }
/// out[r, o] = →md(x[r]·W[o]) with W from its held form (EXL3: linear_exl3; block-scaled: ops::Linear over the
/// codes and scales; else the dense `w`).
void linear(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w, StoredLinear q, float* out, DType md);
/// Output features of a linear held as `w` or `q`.
int64_t linear_out(Tensor const& w, StoredLinear q);
/// The dense fp32 value of a weight held as `w` or block-scaled `s` (dequantize_scaled when `w` is not held).
Tensor dense_weight(Tensor const& w, ScaledWeight const* s);
/// Whether layer l's routed experts are held block-scaled (Weights::scaled, ModelOptions::weights_as_stored).
bool layer_has_scaled_experts(Weights const& w, int64_t l);
/// The `groups` output slices of an EXL3 linear as layers of their own (trellis tile columns and svh of the
/// slice, suh shared; spec/exl3.md §1.4): each slice must be a multiple of 128 outputs (kNotSupported).
std::vector<Exl3Weight> exl3_split_outputs(Exl3Weight const& q, int64_t groups);
/// The grouped form (ops::LinearDesc::groups) of an EXL3 linear: group g maps x columns [g·k, (g+1)·k) to
/// out columns [g·n/G, (g+1)·n/G) through output slice g.
void linear_exl3_grouped(ExecContext& ctx, float const* x, int64_t rows, Exl3Weight const& q, int64_t groups, float* out,
                         DType md);
/// The expert activation of moe_experts_mixed for `rows` rows x [rows, D]: act[j, i] = →md(w_j·silu(min(g, L))·
/// clamp(u, ±L)) with g, u = →md(x_j·W1ᵀ), →md(x_j·W3ᵀ) (EXL3 when q1 / q3 are set, else the dense w1 / w3; the
/// silu rounded in md), w_j = weights[j] (the factor omitted when weights is null), L = limit (no clamp when 0),
/// over the I outputs W1 yields: act [rows, I].
void expert_act_mixed(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w1, Exl3Weight const* q1,
                      Tensor const& w3, Exl3Weight const* q3, float const* weights, float limit, DType md, float* act);
/// Whether layer l has any EXL3 routed or shared expert linear (the MoE then runs moe_experts_mixed).
bool layer_has_exl3_experts(Weights const& w, int64_t l, int64_t experts);
/// MoeExperts' arithmetic with each expert linear dense or EXL3: x [rows, D], ids / weights [rows, top_k]
/// (id −1 skipped), out [rows, D].
void moe_experts_mixed(ExecContext& ctx, ModelSpec const& s, Weights const& w, int64_t l, float const* x,
                       int32_t const* ids, float const* weights, int64_t rows, DType md, float* out);
/// What the models cannot run with EXL3 weights: a grouped wo_a whose groups split a 128-column Hadamard block; in a
/// sharded model (rank_weights) also a layer whose held expert linears (routed and shared) are partly EXL3.
Status check_exl3_weights(ModelSpec const& s, Weights const& w, bool sharded);

// Tensor/expert-parallel steps of one rank (sharded_forward.cpp; plans in dist/plan.hpp). Each replaces
// the single-rank step it is named after and leaves every rank with the same full-size result.
/// Query heads this rank computes.
int64_t shard_heads(RankShard const& sh);
/// Attention output of layer l from the rank's head outputs o [S, Hl·hd] (after the inverse RoPE): wo_a, wo_b
/// and the plan's combine → out [S, D].
void shard_attention_out(RankShard const& sh, ExecContext& ctx, ModelSpec const& s, Weights const& w, int64_t l,
                         std::vector<float> const& o, int64_t rows, DType md, std::vector<float>& out);
/// Engram rows [S, C·de] for hash ids [S, C] of Engram layer `ei` from the rank's column range.
void shard_engram_gather(RankShard const& sh, ExecContext& ctx, EngramTables const& et, int64_t ei,
                         Tensor const& table, std::vector<int64_t> const& ids, int64_t rows, int64_t de,
                         std::vector<float>& out);
/// The MoE block of layer l (routed experts of the rank + shared expert slice, combined in single-rank order).
void shard_moe(RankShard const& sh, ExecContext& ctx, ModelSpec const& s, Weights const& w, int64_t l,
               std::vector<float> const& xa, std::vector<int32_t> const& ids, std::vector<float> const& weights,
               int64_t rows, DType md, std::vector<float>& out);
/// Logits [rows, V] from the rank's LM head rows.
void shard_head(RankShard const& sh, ExecContext& ctx, Weights const& w, float const* x, int64_t rows, int64_t dim,
                int64_t vocab, DType md, float* logits);

}  // namespace tessera::model::dsv41

// SPDX-License-Identifier: Apache-2.0
/// Weights of the DeepSeek-V4.1 text model as fp32 host tensors (bf16 values in a bf16 model), loaded by
/// logical name from any of the three naming schemes of spec/deepseek-v41.md §4.1: OLD (transformers
/// 0a2080b, the golden's: `model.layers.i.attn.wq_a.weight`), NEW (§8.2: `…self_attn.q_a_proj.weight`,
/// fused `mlp.experts.gate_up_proj`) and native (`layers.i.attn.wq_a.weight`, `head.weight`). A missing
/// or misshapen tensor is an error that names it (and the alternatives looked for).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/models/deepseek_v41/model_spec.hpp"

namespace tessera::model::dsv41 {

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
  /// Where the tensors come from, for messages.
  virtual std::string describe() const = 0;
};

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
};

/// Loads every tensor the spec needs; in bf16 mode every parameter except the fp32-kept ones (mHC,
/// sinks, router biases) is rounded to bf16 (exact when the checkpoint is bf16 already).
Result<Weights> load_weights(ModelSpec const& spec, WeightSource const& src, Numerics numerics);

}  // namespace tessera::model::dsv41

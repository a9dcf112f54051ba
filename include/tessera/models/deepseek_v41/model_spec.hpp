// SPDX-License-Identifier: Apache-2.0
/// The hyper-parameters the DeepSeek-V4.1 model module runs with (spec/deepseek-v41.md §1), as plain
/// values with the derivations already applied, plus the numeric mode chosen at load. Built from a
/// config.json through `spec_from_config`, or by hand for the tiny golden configuration (§6).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/status.hpp"

namespace tessera::model::dsv41 {

/// fp32: every tensor fp32 (only the QAT fake-quant rounding remains). bf16: the bf16 model of transformers
/// (`dtype=bfloat16`), rounding at exactly the points of spec §5.1, fp32 islands kept (§4.2).
enum class Numerics : uint8_t { kFp32, kBf16 };

/// The DSpark draft module (spec §2.8; checkpoint keys `mtp.0` … `mtp.{blocks−1}`). blocks = 0: none.
struct DsparkSpec {
  int64_t blocks = 0;                 // num_nextn_predict_layers
  int64_t block_size = 5;             // draft positions per pass
  int64_t noise_token = 0;            // dspark_noise_token_id
  int64_t markov_rank = 256;
  int64_t n_experts = 128, top_k = 3; // the draft blocks' MoE
  std::vector<int64_t> target_layers; // dspark_target_layer_ids, ascending
};

struct ModelSpec {
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0, num_heads = 0, head_dim = 0, q_lora_rank = 0;
  int64_t rope_dim = 0, o_groups = 1, o_lora_rank = 0, sliding_window = 0, max_position_embeddings = 0;
  std::vector<int64_t> compress_ratios;        // per layer: 0 window only, 1 full-resolution, r > 1 pooled
  std::vector<int64_t> kv_source_layers, index_source_layers;
  int64_t candidate_source_layer = -1, candidate_topk_blocks = 1, candidate_block_size = 1;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int64_t moe_inter = 0, n_experts = 0, n_shared_experts = 1, top_k = 1;
  float gate_temp = 1.f, routed_scale = 1.f, swiglu_limit = 0.f;
  bool norm_topk_prob = true;
  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  float hc_eps = 1e-6f, rms_eps = 1e-20f;
  std::vector<int64_t> engram_layers, engram_num_embeddings;
  int64_t engram_vocab_size = 0, engram_max_ngram = 4, engram_n_heads = 0, engram_head_dim = 0;
  int64_t engram_pad_id = 2, engram_compressed_vocab = 0;
  double rope_theta = 10000, compress_rope_theta = 160000;
  bool yarn = false;
  double yarn_factor = 1, yarn_beta_fast = 32, yarn_beta_slow = 1, yarn_original_max_pos = 0;
  std::vector<int32_t> eos_token_ids;
  std::string name = "deepseek_v41";
  DsparkSpec dspark;

  bool is_kv_source(int64_t l) const;
  bool is_index_source(int64_t l) const;
  /// Index of layer l in engram_layers, or −1.
  int64_t engram_index(int64_t l) const;
  /// The KV source whose compressed cache layer l reads (the latest at or before l), or −1.
  int64_t kv_source_of(int64_t l) const;
  /// spec §1.1 validation list; the message names the offending field.
  Status validate() const;
  /// The DSpark fields (checked only when DSpark weights are loaded; a text-only load ignores them).
  Status validate_dspark() const;
};

/// The configuration of golden/v41-tiny (spec/deepseek-v41.md §6).
ModelSpec tiny_golden_spec();

}  // namespace tessera::model::dsv41

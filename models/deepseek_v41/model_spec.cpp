// SPDX-License-Identifier: Apache-2.0
/// ModelSpec queries, the §1.1 validation list, and the tiny golden configuration of spec §6.
#include "tessera/models/deepseek_v41/model_spec.hpp"

#include <algorithm>

namespace tessera::model::dsv41 {

namespace {
bool has(std::vector<int64_t> const& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

bool ModelSpec::is_kv_source(int64_t l) const { return has(kv_source_layers, l); }
bool ModelSpec::is_index_source(int64_t l) const { return has(index_source_layers, l); }
int64_t ModelSpec::engram_index(int64_t l) const {
  auto it = std::find(engram_layers.begin(), engram_layers.end(), l);
  return it == engram_layers.end() ? -1 : static_cast<int64_t>(it - engram_layers.begin());
}
int64_t ModelSpec::kv_source_of(int64_t l) const {
  int64_t best = -1;
  for (int64_t s : kv_source_layers)
    if (s <= l && s > best) best = s;
  return best;
}

Status ModelSpec::validate() const {
  auto bad = [](std::string m) { return invalid_argument("DeepSeek-V4.1 config: " + m); };
  if (vocab_size <= 0 || hidden_size <= 0 || num_layers <= 0 || num_heads <= 0 || head_dim <= 0)
    return bad("vocab_size, hidden_size, num_hidden_layers, num_attention_heads and head_dim must be positive");
  if (rope_dim % 2 || rope_dim > head_dim) return bad("qk_rope_head_dim must be even and <= head_dim");
  if (o_groups <= 0 || (num_heads * head_dim) % o_groups) return bad("o_groups must divide num_heads*head_dim");
  if (num_heads % o_groups) return bad("o_groups must divide num_attention_heads");
  if (static_cast<int64_t>(compress_ratios.size()) < num_layers) return bad("compress_ratios has fewer entries than layers");
  if (sliding_window < 1) return bad("sliding_window must be >= 1");
  for (int64_t s : kv_source_layers) {
    if (s < 0 || s >= num_layers) return bad("kv_source_layer_ids entry " + std::to_string(s) + " out of range");
    if (compress_ratios[s] == 0) return bad("KV source layer " + std::to_string(s) + " has compress ratio 0");
  }
  for (int64_t s : index_source_layers) {
    if (s < 0 || s >= num_layers) return bad("index_source_layer_ids entry " + std::to_string(s) + " out of range");
    if (compress_ratios[s] == 0) return bad("index source layer " + std::to_string(s) + " has compress ratio 0");
    if (kv_source_of(s) < 0) return bad("index source layer " + std::to_string(s) + " has no KV source before it");
  }
  if (candidate_source_layer >= 0 && !is_index_source(candidate_source_layer))
    return bad("candidate_source_layer_id is not an index source");
  for (int64_t l = 0; l < num_layers; ++l)
    if (compress_ratios[l] > 0 && kv_source_of(l) < 0)
      return bad("layer " + std::to_string(l) + " has a compress ratio but no KV source at or before it");
  if (static_cast<int64_t>(engram_num_embeddings.size()) != static_cast<int64_t>(engram_layers.size()))
    return bad("engram_num_embeddings must have one entry per engram layer");
  if (!engram_layers.empty() && (engram_max_ngram < 2 || engram_n_heads < 1 || engram_head_dim < 1))
    return bad("engram needs engram_max_ngram_size >= 2, engram_n_heads >= 1, engram_head_dim >= 1");
  if (top_k < 1 || top_k > n_experts) return bad("num_experts_per_tok must be in [1, n_routed_experts]");
  if (n_shared_experts > 1) return bad("n_shared_experts > 1 is not supported (transformers builds exactly one)");
  return {};
}

Status ModelSpec::validate_dspark() const {
  auto bad = [](std::string m) { return invalid_argument("DeepSeek-V4.1 config (DSpark): " + m); };
  if (dspark.blocks < 1) return bad("num_nextn_predict_layers is 0: the checkpoint has no DSpark blocks");
  {
    if (dspark.block_size < 1) return bad("dspark_block_size must be >= 1");
    if (dspark.noise_token < 0 || dspark.noise_token >= vocab_size)
      return bad("dspark_noise_token_id " + std::to_string(dspark.noise_token) + " is outside the vocabulary");
    if (dspark.markov_rank < 1) return bad("dspark_markov_rank must be >= 1");
    if (dspark.top_k < 1 || dspark.top_k > dspark.n_experts)
      return bad("dspark_num_experts_per_tok must be in [1, dspark_n_routed_experts]");
    if (dspark.target_layers.empty()) return bad("dspark_target_layer_ids is empty");
    for (size_t i = 0; i < dspark.target_layers.size(); ++i) {
      int64_t t = dspark.target_layers[i];
      if (t < 0 || t >= num_layers) return bad("dspark_target_layer_ids entry " + std::to_string(t) + " out of range");
      if (i > 0 && t <= dspark.target_layers[i - 1]) return bad("dspark_target_layer_ids must be ascending");
    }
  }
  return {};
}

ModelSpec tiny_golden_spec() {
  ModelSpec s;
  s.name = "deepseek_v41-tiny";
  s.vocab_size = 512; s.hidden_size = 64; s.num_layers = 7; s.num_heads = 4; s.head_dim = 64;
  s.q_lora_rank = 32; s.rope_dim = 16; s.o_groups = 2; s.o_lora_rank = 16; s.sliding_window = 16;
  s.max_position_embeddings = 512;
  s.compress_ratios = {0, 2, 2, 2, 1, 1, 1};
  s.kv_source_layers = {1, 4};
  s.index_source_layers = {1, 3, 4, 5};
  s.candidate_source_layer = 4; s.candidate_topk_blocks = 3; s.candidate_block_size = 4;
  s.index_n_heads = 4; s.index_head_dim = 32; s.index_topk = 6;
  s.moe_inter = 64; s.n_experts = 8; s.n_shared_experts = 1; s.top_k = 2;
  s.gate_temp = 1.f; s.routed_scale = 1.5f; s.norm_topk_prob = true; s.swiglu_limit = 0.6f;
  s.hc_mult = 4; s.hc_sinkhorn_iters = 20; s.hc_eps = 1e-6f; s.rms_eps = 1e-20f;
  s.engram_layers = {1, 5}; s.engram_num_embeddings = {462, 630};
  s.engram_vocab_size = 64; s.engram_max_ngram = 4; s.engram_n_heads = 2; s.engram_head_dim = 32;
  s.engram_pad_id = 2; s.engram_compressed_vocab = 256;
  s.rope_theta = 10000; s.compress_rope_theta = 160000;
  s.yarn = true; s.yarn_factor = 4; s.yarn_beta_fast = 32; s.yarn_beta_slow = 1; s.yarn_original_max_pos = 128;
  return s;
}

}  // namespace tessera::model::dsv41

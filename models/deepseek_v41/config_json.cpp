// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 config → flat text-config JSON (every §1.1 field, `layer_types`, `rope_parameters` and the
/// quantization_config), and the two presets: the released configuration and the tiny one of
/// spec/deepseek-v41.md §6.
#include <boost/json.hpp>

#include "tessera/models/deepseek_v41/config.hpp"

namespace tessera::model::dsv41 {

namespace json = boost::json;

namespace {

json::array ints(std::vector<int64_t> const& v) {
  json::array a;
  for (int64_t x : v) a.push_back(x);
  return a;
}
json::value opt_int(std::optional<int64_t> const& v) { return v ? json::value(*v) : json::value(nullptr); }

json::object rope_json(RopeParameters const& r) {
  json::object o;
  o["rope_type"] = r.rope_type;
  o["rope_theta"] = r.rope_theta;
  o["partial_rotary_factor"] = r.partial_rotary_factor;
  if (r.rope_type == "yarn") {
    o["factor"] = r.factor;
    o["original_max_position_embeddings"] = r.original_max_position_embeddings;
    o["beta_fast"] = r.beta_fast;
    o["beta_slow"] = r.beta_slow;
    o["attention_factor"] = r.attention_factor;
    o["truncate"] = r.truncate;
  }
  return o;
}

json::object fp8_json(Fp8QuantizationConfig const& q) {
  json::object o;
  o["quant_method"] = "fp8";
  o["fmt"] = q.fmt;
  o["activation_scheme"] = q.activation_scheme;
  o["weight_block_size"] = ints(q.weight_block_size);
  o["scale_fmt"] = q.scale_fmt;
  if (!q.expert_dtype.empty()) o["expert_dtype"] = q.expert_dtype;
  return o;
}

json::object quant_json(QuantizationConfig const& q) {
  if (q.fp8) return fp8_json(*q.fp8);
  json::object o;
  o["quant_method"] = q.quant_method;
  if (q.exl3) {
    auto const& e = *q.exl3;
    o["version"] = e.version;
    o["bits"] = e.bits;
    o["head_bits"] = e.head_bits;
    if (e.mtp_bits) o["mtp_bits"] = *e.mtp_bits;
    o["calibration"] = json::object{{"rows", e.calibration_rows}, {"cols", e.calibration_cols}};
    o["out_scales"] = e.out_scales;
    if (!e.codebook.empty()) o["codebook"] = e.codebook;
    if (e.original_quantization_config) o["original_quantization_config"] = fp8_json(*e.original_quantization_config);
  }
  return o;
}

}  // namespace

std::string to_json(Config const& c) {
  json::object o;
  o["model_type"] = c.model_type;
  o["vocab_size"] = c.vocab_size;
  o["hidden_size"] = c.hidden_size;
  o["num_hidden_layers"] = c.num_hidden_layers;
  o["num_attention_heads"] = c.num_attention_heads;
  o["num_key_value_heads"] = c.num_key_value_heads;
  o["head_dim"] = c.head_dim;
  o["q_lora_rank"] = c.q_lora_rank;
  o["qk_rope_head_dim"] = c.qk_rope_head_dim;
  o["rope_theta"] = c.rope_theta;
  o["compress_rope_theta"] = c.compress_rope_theta;
  if (c.rope_scaling) {
    json::object s;
    s["rope_type"] = c.rope_scaling->rope_type;
    if (c.rope_scaling->factor) s["factor"] = *c.rope_scaling->factor;
    if (c.rope_scaling->original_max_position_embeddings)
      s["original_max_position_embeddings"] = *c.rope_scaling->original_max_position_embeddings;
    s["beta_fast"] = c.rope_scaling->beta_fast;
    s["beta_slow"] = c.rope_scaling->beta_slow;
    if (!c.rope_scaling->truncate) s["truncate"] = false;
    o["rope_scaling"] = std::move(s);
  } else {
    o["rope_scaling"] = nullptr;
  }
  o["rope_parameters"] = json::object{{"main", rope_json(c.rope_main)}, {"compress", rope_json(c.rope_compress)}};
  o["max_position_embeddings"] = c.max_position_embeddings;
  o["attention_bias"] = c.attention_bias;
  o["attention_dropout"] = c.attention_dropout;
  o["sliding_window"] = c.sliding_window;
  o["compress_ratios"] = ints(c.compress_ratios);
  o["kv_source_layer_ids"] = ints(c.kv_source_layer_ids);
  o["index_source_layer_ids"] = ints(c.index_source_layer_ids);
  o["candidate_source_layer_id"] = c.candidate_source_layer_id;
  o["candidate_topk_blocks"] = c.candidate_topk_blocks;
  o["candidate_block_size"] = c.candidate_block_size;
  o["index_n_heads"] = c.index_n_heads;
  o["index_head_dim"] = c.index_head_dim;
  o["index_topk"] = c.index_topk;
  o["o_groups"] = c.o_groups;
  o["o_lora_rank"] = c.o_lora_rank;
  o["moe_intermediate_size"] = c.moe_intermediate_size;
  o["n_routed_experts"] = c.n_routed_experts;
  o["n_shared_experts"] = c.n_shared_experts;
  o["num_experts_per_tok"] = c.num_experts_per_tok;
  o["scoring_func"] = c.scoring_func;
  o["gate_temp"] = c.gate_temp;
  o["norm_topk_prob"] = c.norm_topk_prob;
  o["routed_scaling_factor"] = c.routed_scaling_factor;
  o["topk_method"] = c.topk_method;
  o["swiglu_limit"] = c.swiglu_limit;
  o["hc_mult"] = c.hc_mult;
  o["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  o["hc_eps"] = c.hc_eps;
  o["engram_layer_ids"] = ints(c.engram_layer_ids);
  o["engram_vocab_size"] = c.engram_vocab_size;
  o["engram_num_embeddings"] = ints(c.engram_num_embeddings);
  o["engram_max_ngram_size"] = c.engram_max_ngram_size;
  o["engram_n_heads"] = c.engram_n_heads;
  o["engram_head_dim"] = c.engram_head_dim;
  o["engram_pad_id"] = c.engram_pad_id;
  o["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
  o["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  o["dspark_block_size"] = c.dspark_block_size;
  o["dspark_noise_token_id"] = c.dspark_noise_token_id;
  o["dspark_target_layer_ids"] = ints(c.dspark_target_layer_ids);
  o["dspark_markov_rank"] = c.dspark_markov_rank;
  o["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
  o["dspark_num_experts_per_tok"] = c.dspark_num_experts_per_tok;
  o["hidden_act"] = c.hidden_act;
  o["initializer_range"] = c.initializer_range;
  o["rms_norm_eps"] = c.rms_norm_eps;
  o["use_cache"] = c.use_cache;
  o["tie_word_embeddings"] = c.tie_word_embeddings;
  o["pad_token_id"] = opt_int(c.pad_token_id);
  o["bos_token_id"] = opt_int(c.bos_token_id);
  if (c.eos_token_id.empty())
    o["eos_token_id"] = nullptr;
  else if (c.eos_token_id.size() == 1)
    o["eos_token_id"] = c.eos_token_id[0];
  else
    o["eos_token_id"] = ints(c.eos_token_id);
  o["output_router_logits"] = c.output_router_logits;
  o["router_aux_loss_coef"] = c.router_aux_loss_coef;
  o["router_jitter_noise"] = c.router_jitter_noise;
  json::array lt;
  for (auto const& t : c.layer_types) lt.push_back(json::string(t));
  o["layer_types"] = std::move(lt);
  if (c.quantization_config) o["quantization_config"] = quant_json(*c.quantization_config);
  return json::serialize(o);
}

Config released_config() { return parse_config("{}").value_or_throw(); }

Config tiny_config(int64_t vocab_size) {
  // spec/deepseek-v41.md §6; the compressed Engram vocabulary is the tiny tokenizer's (256).
  std::string const text = R"({
    "model_type": "deepseek_v41_text", "vocab_size": )" + std::to_string(vocab_size) + R"(,
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
    "qk_rope_head_dim": 16, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
    "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "num_hidden_layers": 7, "compress_ratios": [0, 2, 2, 2, 1, 1, 1],
    "kv_source_layer_ids": [1, 4], "index_source_layer_ids": [1, 3, 4, 5], "candidate_source_layer_id": 4,
    "candidate_topk_blocks": 3, "candidate_block_size": 4, "index_n_heads": 4, "index_head_dim": 32, "index_topk": 6,
    "sliding_window": 16, "max_position_embeddings": 512,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                     "beta_fast": 32.0, "beta_slow": 1.0},
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 1,
    "swiglu_limit": 0.6, "scoring_func": "sqrtsoftplus", "gate_temp": 1.0, "norm_topk_prob": true,
    "routed_scaling_factor": 1.5, "topk_method": "noaux_tc",
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-20,
    "engram_layer_ids": [1, 5], "engram_vocab_size": 64, "engram_max_ngram_size": 4, "engram_n_heads": 2,
    "engram_head_dim": 32, "engram_num_embeddings": [462, 630], "engram_pad_id": 2,
    "engram_compressed_vocab_size": 256,
    "num_nextn_predict_layers": 0, "dspark_noise_token_id": 0, "hidden_act": "silu",
    "eos_token_id": null, "bos_token_id": null, "pad_token_id": null,
    "initializer_range": 0.05, "use_cache": true, "tie_word_embeddings": false
  })";
  return parse_config(text).value_or_throw();
}

}  // namespace tessera::model::dsv41

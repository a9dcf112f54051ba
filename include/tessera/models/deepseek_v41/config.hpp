// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 text configuration (`DeepseekV41TextConfig`, spec/deepseek-v41.md §1.1): every field with
/// its released default, the derivations 1–8 of §1.1 (compress ratios, KV / index / candidate / DSpark
/// layers, Engram table sizes, RoPE parameters), `layer_types`, and the checkpoint's
/// `quantization_config` (native FP8/FP4, spec §1.3; EXL3, spec/exl3.md §1.3).
///
/// Accepted documents: a flat text config; a composite (`model_type` "deepseek_v41") whose `text_config`
/// holds the text fields; the golden fixtures' config.json, whose `golden_text_config` (or
/// `golden.text_config_used`) is the configuration that ran and is preferred when present. Unknown keys
/// are ignored (Hugging Face configs carry many); a known key with the wrong JSON type is an error naming
/// the key. Field names are the JSON keys. `layer_types` and `rope_parameters` are derived, not read
/// (a document with only `rope_parameters`, as transformers v5 may write, supplies the thetas and the
/// compress YaRN scaling from it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/status.hpp"

namespace tessera::model::dsv41 {

/// One RoPE table (§2.5.1). `rope_type` "default" uses rope_theta and the partial rotary factor only;
/// "yarn" also the scaling fields, with `attention_factor` forced to 1.0 (no mscale).
struct RopeParameters {
  std::string rope_type = "default";
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;  // qk_rope_head_dim / head_dim
  // YaRN only:
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 1.0;
  bool truncate = true;
};

/// `rope_scaling` as written in config.json (folded into `rope_parameters.compress` only).
struct RopeScaling {
  std::string rope_type;                               // "yarn" in every known checkpoint
  std::optional<double> factor;                        // absent: max_position_embeddings / original
  std::optional<int64_t> original_max_position_embeddings;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
};

/// Native DeepSeek FP8/FP4 quantization (released config.json, spec §1.3 and §4.2).
struct Fp8QuantizationConfig {
  std::string fmt;                          // "e4m3"
  std::string activation_scheme;            // "dynamic"
  std::vector<int64_t> weight_block_size;   // [32, 32]
  std::string scale_fmt;                    // "ue8m0"
  std::string expert_dtype;                 // "fp4" (routed experts), empty = same as the rest
};

/// EXL3 quantization (spec/exl3.md §1.3). Informational: every tensor's K comes from its trellis shape.
struct Exl3QuantizationConfig {
  std::string version;                      // ExLlamaV3 version that wrote it
  double bits = 0.0;                        // average bpw over the budgeted linears
  int64_t head_bits = 6;
  std::optional<int64_t> mtp_bits;
  int64_t calibration_rows = 250;
  int64_t calibration_cols = 2048;
  std::string out_scales;                   // "always" | "never" | "auto"
  std::string codebook;                     // "mul1" | "mcg" | "3inst" | "" (older checkpoints)
  std::optional<Fp8QuantizationConfig> original_quantization_config;  // the source's, when fp8
};

struct QuantizationConfig {
  std::string quant_method;                 // "fp8", "exl3", or another method kept by name only
  std::optional<Fp8QuantizationConfig> fp8;
  std::optional<Exl3QuantizationConfig> exl3;
};

/// The text configuration after derivation and validation. Per-layer lists are indexed by absolute layer.
struct Config {
  std::string model_type = "deepseek_v41_text";
  int64_t vocab_size = 129280;
  int64_t hidden_size = 5120;                 // D
  int64_t num_hidden_layers = 40;             // backbone layers
  int64_t num_attention_heads = 64;           // H
  int64_t num_key_value_heads = 1;
  int64_t head_dim = 512;                     // hd
  int64_t q_lora_rank = 1280;
  int64_t qk_rope_head_dim = 64;              // R, the trailing channels that rotate
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  std::optional<RopeScaling> rope_scaling;
  int64_t max_position_embeddings = 1048576;
  bool attention_bias = false;
  double attention_dropout = 0.0;
  int64_t sliding_window = 128;               // W
  std::vector<int64_t> compress_ratios;       // num_hidden_layers + num_nextn_predict_layers entries
  std::vector<int64_t> kv_source_layer_ids;
  std::vector<int64_t> index_source_layer_ids;
  int64_t candidate_source_layer_id = -1;     // < 0: no candidate restriction
  int64_t candidate_topk_blocks = 2048;
  int64_t candidate_block_size = 8;
  int64_t index_n_heads = 32;
  int64_t index_head_dim = 128;
  int64_t index_topk = 512;
  int64_t o_groups = 8;
  int64_t o_lora_rank = 1024;
  int64_t moe_intermediate_size = 2304;       // alias intermediate_size
  int64_t n_routed_experts = 384;             // alias num_local_experts
  int64_t n_shared_experts = 1;
  int64_t num_experts_per_tok = 6;
  std::string scoring_func = "sqrtsoftplus";
  double gate_temp = 1.0;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  std::string topk_method = "noaux_tc";
  double swiglu_limit = 10.0;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  std::vector<int64_t> engram_layer_ids;
  int64_t engram_vocab_size = 16000000;
  std::vector<int64_t> engram_num_embeddings; // rows of each Engram layer's table (= Σ its primes)
  int64_t engram_max_ngram_size = 4;
  int64_t engram_n_heads = 8;
  int64_t engram_head_dim = 256;
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 99092;
  int64_t num_nextn_predict_layers = 3;
  int64_t dspark_block_size = 5;
  int64_t dspark_noise_token_id = 128799;
  std::vector<int64_t> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 256;
  int64_t dspark_n_routed_experts = 128;
  int64_t dspark_num_experts_per_tok = 3;
  std::string hidden_act = "silu";
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-20;
  bool use_cache = true;
  bool tie_word_embeddings = false;
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_id = {1};    // JSON int or list; empty = None
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;
  double router_jitter_noise = 0.0;

  // Derived.
  std::vector<std::string> layer_types;       // "shared_compressed_attention" (KV sources) | "sliding_attention"
  RopeParameters rope_main;                   // rope_parameters["main"]: layers with ratio 0
  RopeParameters rope_compress;               // rope_parameters["compress"]: ratio > 0, compressed, indexer
  std::optional<QuantizationConfig> quantization_config;

  int64_t ratio(int64_t layer) const { return compress_ratios.at(static_cast<size_t>(layer)); }
  bool is_kv_source(int64_t layer) const;
  bool is_index_source(int64_t layer) const;
  bool is_engram_layer(int64_t layer) const;
  /// Position of `layer` in engram_layer_ids, or -1.
  int64_t engram_index(int64_t layer) const;
  /// The latest KV source at or before `layer` (-1 if none): whose compressed KV / index keys it reads.
  int64_t kv_source_for(int64_t layer) const;
};

/// Parses a config.json document (flat, composite or golden form), applies §1.1's defaults and
/// derivations and validates it. Errors name the offending key or layer.
Result<Config> parse_config(std::string_view json_text);
/// Reads `<dir>/config.json`, or the file itself when given a file path.
Result<Config> load_config(std::string const& dir_or_file);
/// A flat text-config JSON document (every field of §1.1 plus the derived ones) that parse_config reads
/// back to an equal Config; what `tessera make-synthetic` writes and `tessera inspect --json` embeds.
std::string to_json(Config const& c);

/// The released DeepSeek-V4.1 configuration (every default, derived).
Config released_config();
/// The tiny configuration of spec/deepseek-v41.md §6 (golden/v41-tiny), with `vocab_size` replaced.
Config tiny_config(int64_t vocab_size = 512);

}  // namespace tessera::model::dsv41

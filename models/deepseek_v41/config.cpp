// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 config.json: field reading with type checks, the defaults and derivations 1–8 of
/// spec/deepseek-v41.md §1.1, validation, and the quantization_config (spec §1.3, spec/exl3.md §1.3).
#include "tessera/models/deepseek_v41/config.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>

namespace tessera::model::dsv41 {

namespace json = boost::json;

namespace {

/// Released per-layer lists (§1.1).
std::vector<int64_t> released_ratios() {
  std::vector<int64_t> r = {0, 0};
  r.insert(r.end(), 18, 2);
  r.insert(r.end(), 20, 1);
  return r;
}
std::vector<int64_t> const kReleasedKvSources = {2, 8, 14, 20};
std::vector<int64_t> const kReleasedIndexSources = {2, 8, 14, 20, 24, 28, 32, 36};

/// Thrown inside this file only; parse_config turns it into a Status.
struct ConfigError {
  std::string message;
};
[[noreturn]] void fail(std::string msg) { throw ConfigError{std::move(msg)}; }

std::string kind_name(json::value const& v) {
  switch (v.kind()) {
    case json::kind::null: return "null";
    case json::kind::bool_: return "a boolean";
    case json::kind::int64: case json::kind::uint64: return "an integer";
    case json::kind::double_: return "a number";
    case json::kind::string: return "a string";
    case json::kind::array: return "a list";
    case json::kind::object: return "an object";
  }
  return "?";
}

/// Typed access to one JSON object; `where` prefixes key names in messages ("text_config.").
class Fields {
 public:
  Fields(json::object const& o, std::string where) : o_(o), where_(std::move(where)) {}

  json::value const* find(std::string_view key) const { return o_.if_contains(json::string_view(key.data(), key.size())); }
  /// The value of `key` if present and not null.
  json::value const* present(std::string_view key) const {
    auto const* v = find(key);
    return v && !v->is_null() ? v : nullptr;
  }
  [[noreturn]] void type_error(std::string_view key, json::value const& v, char const* want) const {
    fail(where_ + std::string(key) + " must be " + want + ", got " + kind_name(v));
  }
  static bool to_int(json::value const& v, int64_t& out) {
    if (v.is_int64()) { out = v.get_int64(); return true; }
    if (v.is_uint64() && v.get_uint64() <= static_cast<uint64_t>(INT64_MAX)) { out = static_cast<int64_t>(v.get_uint64()); return true; }
    return false;
  }
  void get(std::string_view key, int64_t& out) const {
    if (auto const* v = find(key)) {
      if (!to_int(*v, out)) type_error(key, *v, "an integer");
    }
  }
  void get(std::string_view key, double& out) const {
    if (auto const* v = find(key)) {
      if (v->is_double()) out = v->get_double();
      else if (v->is_int64()) out = static_cast<double>(v->get_int64());
      else if (v->is_uint64()) out = static_cast<double>(v->get_uint64());
      else type_error(key, *v, "a number");
    }
  }
  void get(std::string_view key, bool& out) const {
    if (auto const* v = find(key)) {
      if (!v->is_bool()) type_error(key, *v, "a boolean");
      out = v->get_bool();
    }
  }
  void get(std::string_view key, std::string& out) const {
    if (auto const* v = find(key)) {
      if (!v->is_string()) type_error(key, *v, "a string");
      out = std::string(v->get_string());
    }
  }
  /// An integer that may be null (std::nullopt).
  void get_opt(std::string_view key, std::optional<int64_t>& out) const {
    if (auto const* v = find(key)) {
      if (v->is_null()) { out.reset(); return; }
      int64_t x = 0;
      if (!to_int(*v, x)) type_error(key, *v, "an integer or null");
      out = x;
    }
  }
  /// A list of integers; returns false when absent or null.
  bool get_list(std::string_view key, std::vector<int64_t>& out) const {
    auto const* v = present(key);
    if (!v) return false;
    if (!v->is_array()) type_error(key, *v, "a list of integers");
    out.clear();
    for (auto const& e : v->get_array()) {
      int64_t x = 0;
      if (!to_int(e, x)) fail(where_ + std::string(key) + " must be a list of integers, found " + kind_name(e));
      out.push_back(x);
    }
    return true;
  }
  json::object const& object() const { return o_; }
  std::string const& where() const { return where_; }

 private:
  json::object const& o_;
  std::string where_;
};

Fp8QuantizationConfig read_fp8(Fields const& f) {
  Fp8QuantizationConfig q;
  f.get("fmt", q.fmt);
  f.get("activation_scheme", q.activation_scheme);
  f.get_list("weight_block_size", q.weight_block_size);
  f.get("scale_fmt", q.scale_fmt);
  f.get("expert_dtype", q.expert_dtype);
  return q;
}

QuantizationConfig read_quantization(json::value const& v, std::string const& where) {
  if (!v.is_object()) fail(where + " must be an object, got " + kind_name(v));
  Fields f(v.get_object(), where + ".");
  QuantizationConfig q;
  f.get("quant_method", q.quant_method);
  if (q.quant_method == "fp8") {
    q.fp8 = read_fp8(f);
  } else if (q.quant_method == "exl3") {
    Exl3QuantizationConfig e;
    f.get("version", e.version);
    f.get("bits", e.bits);
    f.get("head_bits", e.head_bits);
    f.get_opt("mtp_bits", e.mtp_bits);
    if (auto const* cal = f.present("calibration")) {
      if (!cal->is_object()) f.type_error("calibration", *cal, "an object");
      Fields c(cal->get_object(), where + ".calibration.");
      c.get("rows", e.calibration_rows);
      c.get("cols", e.calibration_cols);
    }
    f.get("out_scales", e.out_scales);
    f.get("codebook", e.codebook);
    if (auto const* o = f.present("original_quantization_config")) {
      QuantizationConfig orig = read_quantization(*o, where + ".original_quantization_config");
      if (orig.fp8) e.original_quantization_config = orig.fp8;
    }
    q.exl3 = e;
  }
  return q;
}

/// transformers v5 documents may carry only `rope_parameters` {main, compress}: take the thetas and the
/// compress scaling from there when `rope_theta` / `compress_rope_theta` / `rope_scaling` are absent.
json::value const* rope_parameters_fallback(Fields const& f, Config& c) {
  auto const* rp = f.present("rope_parameters");
  if (!rp) return nullptr;
  if (!rp->is_object()) f.type_error("rope_parameters", *rp, "an object");
  Fields p(rp->get_object(), f.where() + "rope_parameters.");
  json::value const* scaling = nullptr;
  for (char const* site : {"main", "compress"}) {
    auto const* s = p.present(site);
    if (!s) continue;
    if (!s->is_object()) p.type_error(site, *s, "an object");
    Fields sf(s->get_object(), p.where() + site + ".");
    bool const main = std::string_view(site) == "main";
    if (!f.find(main ? "rope_theta" : "compress_rope_theta")) sf.get("rope_theta", main ? c.rope_theta : c.compress_rope_theta);
    if (!main) {
      std::string type;
      sf.get("rope_type", type);
      if (type == "yarn") scaling = s;
    }
  }
  return scaling;
}

void read_rope_scaling(Fields const& f, Config& c) {
  json::value const* from_params = rope_parameters_fallback(f, c);
  auto const* v = f.present("rope_scaling");
  if (!v) v = from_params;
  if (!v) return;
  if (!v->is_object()) f.type_error("rope_scaling", *v, "an object or null");
  Fields r(v->get_object(), f.where() + "rope_scaling.");
  RopeScaling s;
  r.get("rope_type", s.rope_type);
  if (s.rope_type.empty()) r.get("type", s.rope_type);  // older spelling
  if (r.present("factor")) { double x = 0; r.get("factor", x); s.factor = x; }
  r.get_opt("original_max_position_embeddings", s.original_max_position_embeddings);
  r.get("beta_fast", s.beta_fast);
  r.get("beta_slow", s.beta_slow);
  r.get("truncate", s.truncate);
  c.rope_scaling = s;
}

/// Copies every §1.1 field present in `f` into `c`; records which None-able lists were given.
struct Given {
  bool compress_ratios = false, kv_sources = false, index_sources = false, dspark_targets = false;
  bool engram_num_embeddings = false;
  std::optional<int64_t> candidate;
};

Given read_fields(Fields const& f, Config& c) {
  Given g;
  f.get("model_type", c.model_type);
  f.get("vocab_size", c.vocab_size);
  f.get("hidden_size", c.hidden_size);
  f.get("num_hidden_layers", c.num_hidden_layers);
  f.get("num_attention_heads", c.num_attention_heads);
  f.get("num_key_value_heads", c.num_key_value_heads);
  f.get("head_dim", c.head_dim);
  f.get("q_lora_rank", c.q_lora_rank);
  f.get("qk_rope_head_dim", c.qk_rope_head_dim);
  f.get("rope_theta", c.rope_theta);
  f.get("compress_rope_theta", c.compress_rope_theta);
  read_rope_scaling(f, c);
  f.get("max_position_embeddings", c.max_position_embeddings);
  f.get("attention_bias", c.attention_bias);
  f.get("attention_dropout", c.attention_dropout);
  f.get("sliding_window", c.sliding_window);
  g.compress_ratios = f.get_list("compress_ratios", c.compress_ratios);
  g.kv_sources = f.get_list("kv_source_layer_ids", c.kv_source_layer_ids);
  g.index_sources = f.get_list("index_source_layer_ids", c.index_source_layer_ids);
  f.get_opt("candidate_source_layer_id", g.candidate);
  f.get("candidate_topk_blocks", c.candidate_topk_blocks);
  f.get("candidate_block_size", c.candidate_block_size);
  f.get("index_n_heads", c.index_n_heads);
  f.get("index_head_dim", c.index_head_dim);
  f.get("index_topk", c.index_topk);
  f.get("o_groups", c.o_groups);
  f.get("o_lora_rank", c.o_lora_rank);
  f.get(f.find("moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size", c.moe_intermediate_size);
  f.get(f.find("n_routed_experts") ? "n_routed_experts" : "num_local_experts", c.n_routed_experts);
  f.get("n_shared_experts", c.n_shared_experts);
  f.get("num_experts_per_tok", c.num_experts_per_tok);
  f.get("scoring_func", c.scoring_func);
  f.get("gate_temp", c.gate_temp);
  f.get("norm_topk_prob", c.norm_topk_prob);
  f.get("routed_scaling_factor", c.routed_scaling_factor);
  f.get("topk_method", c.topk_method);
  f.get("swiglu_limit", c.swiglu_limit);
  f.get("hc_mult", c.hc_mult);
  f.get("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  f.get("hc_eps", c.hc_eps);
  f.get_list("engram_layer_ids", c.engram_layer_ids);
  f.get("engram_vocab_size", c.engram_vocab_size);
  g.engram_num_embeddings = f.get_list("engram_num_embeddings", c.engram_num_embeddings);
  f.get("engram_max_ngram_size", c.engram_max_ngram_size);
  f.get("engram_n_heads", c.engram_n_heads);
  f.get("engram_head_dim", c.engram_head_dim);
  f.get("engram_pad_id", c.engram_pad_id);
  f.get("engram_compressed_vocab_size", c.engram_compressed_vocab_size);
  f.get("num_nextn_predict_layers", c.num_nextn_predict_layers);
  f.get("dspark_block_size", c.dspark_block_size);
  f.get("dspark_noise_token_id", c.dspark_noise_token_id);
  g.dspark_targets = f.get_list("dspark_target_layer_ids", c.dspark_target_layer_ids);
  f.get("dspark_markov_rank", c.dspark_markov_rank);
  f.get("dspark_n_routed_experts", c.dspark_n_routed_experts);
  f.get("dspark_num_experts_per_tok", c.dspark_num_experts_per_tok);
  f.get("hidden_act", c.hidden_act);
  f.get("initializer_range", c.initializer_range);
  f.get("rms_norm_eps", c.rms_norm_eps);
  f.get("use_cache", c.use_cache);
  f.get("tie_word_embeddings", c.tie_word_embeddings);
  f.get_opt("pad_token_id", c.pad_token_id);
  f.get_opt("bos_token_id", c.bos_token_id);
  if (auto const* v = f.find("eos_token_id")) {
    c.eos_token_id.clear();
    int64_t x = 0;
    if (v->is_null()) {
    } else if (Fields::to_int(*v, x)) {
      c.eos_token_id.push_back(x);
    } else if (v->is_array()) {
      f.get_list("eos_token_id", c.eos_token_id);
    } else {
      f.type_error("eos_token_id", *v, "an integer, a list of integers or null");
    }
  }
  f.get("output_router_logits", c.output_router_logits);
  f.get("router_aux_loss_coef", c.router_aux_loss_coef);
  f.get("router_jitter_noise", c.router_jitter_noise);
  if (auto const* q = f.present("quantization_config")) c.quantization_config = read_quantization(*q, f.where() + "quantization_config");
  return g;
}

bool contains(std::vector<int64_t> const& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
std::string list_str(std::vector<int64_t> const& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

/// Derivations 1–8 and validation (§1.1), plus the sizes Tessera's kernels rely on.
void derive(Config& c, Given const& g) {
  int64_t const n = c.num_hidden_layers;
  auto positive = [](int64_t v, char const* key) {
    if (v <= 0) fail(std::string(key) + " must be positive, got " + std::to_string(v));
  };
  positive(n, "num_hidden_layers");
  positive(c.vocab_size, "vocab_size");
  positive(c.hidden_size, "hidden_size");
  positive(c.num_attention_heads, "num_attention_heads");
  positive(c.head_dim, "head_dim");
  positive(c.q_lora_rank, "q_lora_rank");
  positive(c.o_groups, "o_groups");
  positive(c.o_lora_rank, "o_lora_rank");
  positive(c.moe_intermediate_size, "moe_intermediate_size");
  positive(c.n_routed_experts, "n_routed_experts");
  positive(c.num_experts_per_tok, "num_experts_per_tok");
  positive(c.hc_mult, "hc_mult");
  positive(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
  positive(c.sliding_window, "sliding_window");
  positive(c.index_n_heads, "index_n_heads");
  positive(c.index_head_dim, "index_head_dim");
  positive(c.index_topk, "index_topk");
  if (c.num_nextn_predict_layers < 0) fail("num_nextn_predict_layers must be >= 0");
  if (c.qk_rope_head_dim < 0 || c.qk_rope_head_dim > c.head_dim || c.qk_rope_head_dim % 2)
    fail("qk_rope_head_dim must be even and at most head_dim (" + std::to_string(c.head_dim) + "), got " +
         std::to_string(c.qk_rope_head_dim));
  if ((c.num_attention_heads * c.head_dim) % c.o_groups)
    fail("num_attention_heads * head_dim must be divisible by o_groups");
  if (c.num_experts_per_tok > c.n_routed_experts) fail("num_experts_per_tok exceeds n_routed_experts");

  // 1. compress_ratios.
  if (!g.compress_ratios) {
    if (n == 40) {
      c.compress_ratios = released_ratios();
    } else {
      int64_t head = std::min<int64_t>(2, n), twos = std::max<int64_t>(0, (n - head + 1) / 2);
      c.compress_ratios.assign(static_cast<size_t>(head), 0);
      c.compress_ratios.insert(c.compress_ratios.end(), static_cast<size_t>(twos), 2);
      c.compress_ratios.insert(c.compress_ratios.end(), static_cast<size_t>(n - head - twos), 1);
    }
  }
  int64_t const nr = static_cast<int64_t>(c.compress_ratios.size());
  if (nr < n || nr > n + c.num_nextn_predict_layers)
    fail("compress_ratios has " + std::to_string(nr) + " entries; need between num_hidden_layers (" +
         std::to_string(n) + ") and num_hidden_layers + num_nextn_predict_layers (" +
         std::to_string(n + c.num_nextn_predict_layers) + ")");
  for (int64_t i = 0; i < nr; ++i)
    if (c.compress_ratios[static_cast<size_t>(i)] < 0)
      fail("compress_ratios[" + std::to_string(i) + "] is negative");
  c.compress_ratios.resize(static_cast<size_t>(n + c.num_nextn_predict_layers), 0);

  // 2. kv_source_layer_ids.
  std::vector<int64_t> const backbone(c.compress_ratios.begin(), c.compress_ratios.begin() + n);
  if (!g.kv_sources) {
    c.kv_source_layer_ids.clear();
    if (backbone == released_ratios()) {
      c.kv_source_layer_ids = kReleasedKvSources;
    } else {
      for (int64_t i = 0; i < n; ++i) {
        int64_t r = backbone[static_cast<size_t>(i)];
        if (r > 0 && (i == 0 || backbone[static_cast<size_t>(i - 1)] != r)) c.kv_source_layer_ids.push_back(i);
      }
    }
  }
  // 3. index_source_layer_ids.
  if (!g.index_sources)
    c.index_source_layer_ids = c.kv_source_layer_ids == kReleasedKvSources ? kReleasedIndexSources : c.kv_source_layer_ids;
  // 4. dspark_target_layer_ids: the last 3 layers that are not KV sources, ascending.
  if (!g.dspark_targets) {
    c.dspark_target_layer_ids.clear();
    for (int64_t i = n - 1; i >= 0 && c.dspark_target_layer_ids.size() < 3; --i)
      if (!contains(c.kv_source_layer_ids, i)) c.dspark_target_layer_ids.insert(c.dspark_target_layer_ids.begin(), i);
  }
  // 5. Validation.
  for (int64_t l : c.kv_source_layer_ids) {
    if (l < 0 || l >= n) fail("kv_source_layer_ids: layer " + std::to_string(l) + " is out of range [0, " + std::to_string(n) + ")");
    if (backbone[static_cast<size_t>(l)] == 0) fail("kv_source_layer_ids: layer " + std::to_string(l) + " has compress ratio 0");
  }
  for (int64_t l : c.index_source_layer_ids) {
    if (l < 0 || l >= n) fail("index_source_layer_ids: layer " + std::to_string(l) + " is out of range [0, " + std::to_string(n) + ")");
    if (backbone[static_cast<size_t>(l)] == 0) fail("index_source_layer_ids: layer " + std::to_string(l) + " has compress ratio 0");
    bool has_kv = std::any_of(c.kv_source_layer_ids.begin(), c.kv_source_layer_ids.end(), [&](int64_t k) { return k <= l; });
    if (!has_kv) fail("index_source_layer_ids: layer " + std::to_string(l) + " has no KV source at or before it");
  }
  // 6. candidate_source_layer_id.
  c.candidate_source_layer_id = g.candidate ? *g.candidate : (c.kv_source_layer_ids.empty() ? -1 : c.kv_source_layer_ids.back());
  if (c.candidate_source_layer_id >= 0 && !contains(c.index_source_layer_ids, c.candidate_source_layer_id))
    fail("candidate_source_layer_id " + std::to_string(c.candidate_source_layer_id) + " is not an index source " +
         list_str(c.index_source_layer_ids));
  for (int64_t i = 0; i < n; ++i) {
    if (backbone[static_cast<size_t>(i)] > 0 && c.kv_source_for(i) < 0)
      fail("layer " + std::to_string(i) + " has compress ratio " + std::to_string(backbone[static_cast<size_t>(i)]) +
           " but no KV source at or before it");
  }
  // 7. engram_num_embeddings.
  for (int64_t l : c.engram_layer_ids)
    if (l < 0 || l >= n) fail("engram_layer_ids: layer " + std::to_string(l) + " is out of range [0, " + std::to_string(n) + ")");
  if (!g.engram_num_embeddings) c.engram_num_embeddings.assign(c.engram_layer_ids.size(), 0);
  if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
    fail("engram_num_embeddings has " + std::to_string(c.engram_num_embeddings.size()) + " entries but engram_layer_ids has " +
         std::to_string(c.engram_layer_ids.size()));
  if (!c.engram_layer_ids.empty()) {
    positive(c.engram_n_heads, "engram_n_heads");
    positive(c.engram_head_dim, "engram_head_dim");
    if (c.engram_max_ngram_size < 2) fail("engram_max_ngram_size must be at least 2");
  }
  // layer_types.
  c.layer_types.clear();
  for (int64_t i = 0; i < n; ++i)
    c.layer_types.push_back(c.is_kv_source(i) ? "shared_compressed_attention" : "sliding_attention");
  // 8. RoPE (§2.5.1): main = default; compress = rope_scaling with compress_rope_theta, attention factor 1.
  double const prf = static_cast<double>(c.qk_rope_head_dim) / static_cast<double>(c.head_dim);
  c.rope_main = RopeParameters{};
  c.rope_main.rope_theta = c.rope_theta;
  c.rope_main.partial_rotary_factor = prf;
  c.rope_compress = RopeParameters{};
  c.rope_compress.rope_theta = c.compress_rope_theta;
  c.rope_compress.partial_rotary_factor = prf;
  if (c.rope_scaling) {
    RopeScaling const& s = *c.rope_scaling;
    c.rope_compress.rope_type = s.rope_type;
    if (s.rope_type == "yarn") {
      int64_t orig = s.original_max_position_embeddings.value_or(c.max_position_embeddings);
      if (orig <= 0) fail("rope_scaling.original_max_position_embeddings must be positive");
      c.rope_compress.original_max_position_embeddings = orig;
      c.rope_compress.factor = s.factor ? *s.factor : static_cast<double>(c.max_position_embeddings) / static_cast<double>(orig);
      if (!(c.rope_compress.factor > 0)) fail("rope_scaling.factor must be positive");
      c.rope_compress.beta_fast = s.beta_fast;
      c.rope_compress.beta_slow = s.beta_slow;
      c.rope_compress.truncate = s.truncate;
      c.rope_compress.attention_factor = 1.0;
    } else if (s.rope_type != "default") {
      fail("rope_scaling.rope_type '" + s.rope_type + "' is not supported (only yarn)");
    }
  }
}

Config parse_document(json::value const& doc) {
  if (!doc.is_object()) fail("config is not a JSON object");
  auto const& root = doc.get_object();
  // The text configuration: golden_text_config > golden.text_config_used > text_config > the document.
  json::object const* text = &root;
  std::string where;
  auto pick = [&](json::value const* v, std::string w) {
    if (!v || v->is_null() || text != &root) return;
    if (!v->is_object()) fail(w + " must be an object, got " + kind_name(*v));
    text = &v->get_object();
    where = w + ".";
  };
  pick(root.if_contains("golden_text_config"), "golden_text_config");
  if (auto const* gold = root.if_contains("golden"); gold && gold->is_object())
    pick(gold->get_object().if_contains("text_config_used"), "golden.text_config_used");
  pick(root.if_contains("text_config"), "text_config");

  Config c;
  Fields f(*text, where);
  Given g = read_fields(f, c);
  if (!c.quantization_config && text != &root) {
    if (auto const* q = root.if_contains("quantization_config"); q && !q->is_null())
      c.quantization_config = read_quantization(*q, "quantization_config");
  }
  derive(c, g);
  return c;
}

}  // namespace

bool Config::is_kv_source(int64_t layer) const { return contains(kv_source_layer_ids, layer); }
bool Config::is_index_source(int64_t layer) const { return contains(index_source_layer_ids, layer); }
bool Config::is_engram_layer(int64_t layer) const { return contains(engram_layer_ids, layer); }
int64_t Config::engram_index(int64_t layer) const {
  auto it = std::find(engram_layer_ids.begin(), engram_layer_ids.end(), layer);
  return it == engram_layer_ids.end() ? -1 : static_cast<int64_t>(it - engram_layer_ids.begin());
}
int64_t Config::kv_source_for(int64_t layer) const {
  int64_t best = -1;
  for (int64_t k : kv_source_layer_ids)
    if (k <= layer && k > best) best = k;
  return best;
}

Result<Config> parse_config(std::string_view json_text) {
  json::error_code ec;
  json::value doc = json::parse(json::string_view(json_text.data(), json_text.size()), ec);
  if (ec) return malformed("config: not valid JSON (" + ec.message() + ")");
  try {
    return parse_document(doc);
  } catch (ConfigError const& e) {
    return malformed("config: " + e.message);
  }
}

Result<Config> load_config(std::string const& dir_or_file) {
  namespace fs = std::filesystem;
  fs::path p(dir_or_file);
  std::error_code ec;
  if (fs::is_directory(p, ec)) p /= "config.json";
  std::ifstream in(p, std::ios::binary);
  if (!in) return not_found(p.string() + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  auto r = parse_config(ss.str());
  if (!r) return Status(r.status().code(), p.string() + ": " + r.status().message());
  return r;
}

}  // namespace tessera::model::dsv41

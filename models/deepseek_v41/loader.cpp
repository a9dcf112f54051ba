// SPDX-License-Identifier: Apache-2.0
/// Model-folder loading: Config → ModelSpec, checkpoints as a WeightSource, Engram hash data lookup.
#include "tessera/models/deepseek_v41/loader.hpp"

#include <cstring>
#include <filesystem>

#include "tessera/core/thread_pool.hpp"
#include "tessera/ops/exl3_loader.hpp"

namespace tessera::model::dsv41 {

void CheckpointSource::add(io::Checkpoint ckpt, std::string label) {
  ckpts_.push_back(std::move(ckpt));
  labels_.push_back(std::move(label));
}

Status CheckpointSource::open(std::string const& path) {
  auto c = io::Checkpoint::open(path);
  if (!c) return c.status();
  add(std::move(*c), path);
  return {};
}

io::Checkpoint const* CheckpointSource::find(std::string const& name) const {
  for (auto const& c : ckpts_)
    if (c.contains(name)) return &c;
  return nullptr;
}

bool CheckpointSource::contains(std::string const& name) const { return find(name) != nullptr; }

namespace {

bool ends_with(std::string const& s, std::string const& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

/// The native release layout's scaled weights (spec/deepseek-v41.md §4.2): an F8_E4M3 `X.weight` with an
/// F8_E8M0 `X.scale` of 32×32 blocks, or packed FP4 experts (`X.weight` I8 [r, c/2], even column in the low
/// nibble) with an F8_E8M0 `X.scale` [r, c/32]. Engram tables (dequantised by the weight loader with
/// their per-row scales) are not included.
CheckpointSource::Scaled CheckpointSource::scaled(std::string const& name) const {
  if (!ends_with(name, ".weight") || name.find("engram.embed.") != std::string::npos ||
      name.find("engram_tables.") != std::string::npos)
    return Scaled::kNone;
  auto const* c = find(name);
  std::string const sn = name.substr(0, name.size() - 7) + ".scale";
  auto const* sc = c ? c->find(sn) : nullptr;
  if (!sc || sc->dtype != DType::kE8m0) return Scaled::kNone;
  auto const* t = c->find(name);
  if (t->dtype == DType::kF8E4m3) return Scaled::kFp8Block;
  if (t->dtype == DType::kI8 && t->shape.size() == 2) return Scaled::kFp4Row;
  return Scaled::kNone;
}

Result<std::vector<int64_t>> CheckpointSource::shape(std::string const& name) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  auto const* t = c->find(name);
  std::vector<int64_t> s = t->shape;
  if (t->dtype == DType::kF4E2m1x2 && !s.empty()) s.back() *= 2;  // logical shape of packed fp4
  if (scaled(name) == Scaled::kFp4Row) s.back() *= 2;              // two e2m1 codes per I8
  return s;
}

Result<DType> CheckpointSource::dtype(std::string const& name) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  return c->find(name)->dtype;
}

Result<ScaledWeight> CheckpointSource::load_stored(io::Checkpoint const& c, std::string const& name,
                                                   Scaled kind) const {
  auto w = c.load(name);
  if (!w) return w.status();
  if (w->rank() != 2)
    return malformed(describe() + ": scaled tensor " + name + " has shape " + shape_to_string(w->shape()) +
                     ", expected 2-D");
  std::string const sn = name.substr(0, name.size() - 7) + ".scale";
  auto sc = c.load(sn);
  if (!sc) return sc.status();
  int64_t const rows = w->dim(0), cols = kind == Scaled::kFp4Row ? 2 * w->dim(1) : w->dim(1);
  int64_t const cb = (cols + 31) / 32;
  std::vector<int64_t> const want = kind == Scaled::kFp8Block ? std::vector<int64_t>{(rows + 31) / 32, cb}
                                                              : std::vector<int64_t>{rows, cb};
  if (sc->shape() != want)
    return malformed(describe() + ": " + sn + " has shape " + shape_to_string(sc->shape()) + ", expected " +
                     shape_to_string(want) + " for " + name);
  ScaledWeight out;
  out.dtype = kind == Scaled::kFp8Block ? DType::kF8E4m3 : DType::kF4E2m1x2;
  out.rows = rows;
  out.cols = cols;
  out.codes = std::move(*w);
  out.scales = std::move(*sc);
  return out;
}

Result<ScaledWeight> CheckpointSource::load_scaled(std::string const& name) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  Scaled const kind = scaled(name);
  if (kind == Scaled::kNone) return ScaledWeight{};
  return load_stored(*c, name, kind);
}

Result<DType> CheckpointSource::scaled_dtype(std::string const& name) const {
  if (!find(name)) return not_found(describe() + ": no tensor " + name);
  Scaled const kind = scaled(name);
  return kind == Scaled::kFp8Block ? DType::kF8E4m3 : kind == Scaled::kFp4Row ? DType::kF4E2m1x2 : DType::kF32;
}

namespace {

/// value(r, c) = code · 2^(scale − 127), exact in fp32, of `rows` rows starting at checkpoint row `row0`: codes
/// [rows, cols] (FP8) or [rows, cols/2] (FP4, even column in the low nibble); scales cover rows from row0/32 (FP8,
/// 32×32 blocks) or row0 (FP4, a row each), `cb` = ⌈cols/32⌉ a row.
Result<Tensor> dequantize_stored(Tensor const& codes, Tensor const& scales, bool fp8, int64_t row0, int64_t rows,
                                 int64_t cols) {
  auto made = Tensor::empty(DType::kF32, {rows, cols});  // every element is written below
  if (!made) return made.status();
  Tensor out = std::move(*made);
  int64_t const cb = scales.dim(1);
  uint8_t const* b = codes.data_as<uint8_t>();
  uint8_t const* s8 = scales.data_as<uint8_t>();
  float* o = out.data_as<float>();
  parallel_for(rows, [&](int64_t r0, int64_t r1) {  // elementwise: any split gives the same values
    for (int64_t r = r0; r < r1; ++r) {
      int64_t const srow = fp8 ? (row0 + r) / 32 - row0 / 32 : r;
      for (int64_t j = 0; j < cols; ++j) {
        float const s = float_from_e8m0(s8[srow * cb + j / 32]);
        uint8_t const byte = fp8 ? b[r * cols + j] : b[(r * cols + j) / 2];
        float const v = fp8 ? float_from_fp8_e4m3(byte) : float_from_fp4_e2m1(j % 2 ? byte >> 4 : byte & 0xF);
        o[r * cols + j] = v * s;
      }
    }
  }, 32);
  return out;
}

}  // namespace

Result<Tensor> CheckpointSource::load_f32(std::string const& name) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  Scaled const kind = scaled(name);
  if (kind == Scaled::kNone) return c->load_f32(name);
  auto sw = load_stored(*c, name, kind);
  if (!sw) return sw.status();
  return dequantize_stored(sw->codes, sw->scales, kind == Scaled::kFp8Block, 0, sw->rows, sw->cols);
}

Result<ScaledWeight> CheckpointSource::load_stored_rows(io::Checkpoint const& c, std::string const& name, Scaled kind,
                                                        int64_t r0, int64_t r1, bool whole_blocks) const {
  auto const* wi = c.find(name);
  auto const* si = c.find(name.substr(0, name.size() - 7) + ".scale");
  if (wi->shape.size() != 2)
    return malformed(describe() + ": scaled tensor " + name + " has shape " + shape_to_string(wi->shape) +
                     ", expected 2-D");
  bool const fp8 = kind == Scaled::kFp8Block;
  int64_t const rows = wi->shape[0], cols = fp8 ? wi->shape[1] : 2 * wi->shape[1];
  std::vector<int64_t> const want{fp8 ? (rows + 31) / 32 : rows, (cols + 31) / 32};
  if (si->shape != want)
    return malformed(describe() + ": " + si->name + " has shape " + shape_to_string(si->shape) + ", expected " +
                     shape_to_string(want) + " for " + name);
  DType const dt = fp8 ? DType::kF8E4m3 : DType::kF4E2m1x2;
  if (whole_blocks) {
    TESSERA_TRY(check_scaled_row_range(describe(), name, dt, rows, r0, r1));
  } else if (r0 < 0 || r0 > r1 || r1 > rows) {
    return invalid_argument(describe() + ": tensor " + name + " has " + std::to_string(rows) + " rows, no rows [" +
                            std::to_string(r0) + ", " + std::to_string(r1) + ")");
  }
  auto codes = c.load_rows(name, r0, r1);
  if (!codes) return codes.status();
  auto scales = c.load_rows(si->name, fp8 ? r0 / 32 : r0, fp8 ? (r1 + 31) / 32 : r1);
  if (!scales) return scales.status();
  return ScaledWeight{dt, r1 - r0, cols, std::move(*codes), std::move(*scales)};
}

Result<Tensor> CheckpointSource::load_f32_rows(std::string const& name, int64_t r0, int64_t r1) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  Scaled const kind = scaled(name);
  if (kind == Scaled::kNone) return c->load_f32_rows(name, r0, r1);
  // Any rows: the scale rows covering them are read, whole blocks or not.
  auto sw = load_stored_rows(*c, name, kind, r0, r1, false);
  if (!sw) return sw.status();
  return dequantize_stored(sw->codes, sw->scales, kind == Scaled::kFp8Block, r0, sw->rows, sw->cols);
}

Result<ScaledWeight> CheckpointSource::load_scaled_rows(std::string const& name, int64_t r0, int64_t r1) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  Scaled const kind = scaled(name);
  if (kind == Scaled::kNone) return ScaledWeight{};
  return load_stored_rows(*c, name, kind, r0, r1, true);
}

Result<ScaledWeight> CheckpointSource::load_scaled_cols(std::string const& name, int64_t c0, int64_t c1) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  Scaled const kind = scaled(name);
  if (kind == Scaled::kNone) return ScaledWeight{};
  auto const* wi = c->find(name);
  int64_t const cols = wi->shape.size() == 2 ? (kind == Scaled::kFp4Row ? 2 * wi->shape[1] : wi->shape[1]) : 0;
  TESSERA_TRY(check_scaled_col_range(describe(), name, kind == Scaled::kFp8Block ? DType::kF8E4m3 : DType::kF4E2m1x2,
                                     cols, c0, c1));
  return load_stored_cols(*c, name, c0, c1);
}

Result<ScaledWeight> CheckpointSource::load_stored_cols(io::Checkpoint const& c, std::string const& name, int64_t c0,
                                                        int64_t c1) const {
  // FP8 only (the caller's kind): 32×32 blocks, scale columns [c0/32, ⌈c1/32⌉) of every scale row.
  auto const* wi = c.find(name);
  std::string const sn = name.substr(0, name.size() - 7) + ".scale";
  auto const* si = c.find(sn);
  if (wi->shape.size() != 2)
    return malformed(describe() + ": scaled tensor " + name + " has shape " + shape_to_string(wi->shape) + ", expected 2-D");
  int64_t const rows = wi->shape[0], cols = wi->shape[1];
  std::vector<int64_t> const want{(rows + 31) / 32, (cols + 31) / 32};
  if (si->shape != want)
    return malformed(describe() + ": " + sn + " has shape " + shape_to_string(si->shape) + ", expected " +
                     shape_to_string(want) + " for " + name);
  auto codes = c.load_cols(name, c0, c1);
  if (!codes) return codes.status();
  auto scales = c.load_cols(sn, c0 / 32, (c1 + 31) / 32);
  if (!scales) return scales.status();
  return ScaledWeight{DType::kF8E4m3, rows, c1 - c0, std::move(*codes), std::move(*scales)};
}

Result<Tensor> CheckpointSource::load_f32_cols(std::string const& name, int64_t c0, int64_t c1) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  Scaled const kind = scaled(name);
  if (kind == Scaled::kNone) return c->load_f32_cols(name, c0, c1);
  if (kind == Scaled::kFp4Row) return WeightSource::load_f32_cols(name, c0, c1);  // packed pairs: whole read
  auto const* wi = c->find(name);
  if (wi->shape.size() != 2 || c0 < 0 || c0 > c1 || c1 > wi->shape[1])
    return invalid_argument(describe() + ": tensor " + name + " of shape " + shape_to_string(wi->shape) +
                            " has no columns [" + std::to_string(c0) + ", " + std::to_string(c1) + ")");
  // Any columns: the scale columns covering them are read; value(r, j) = code(r, j) · 2^(scale(r/32, (c0+j)/32) − 127).
  auto sw = load_stored_cols(*c, name, c0, c1);
  if (!sw) return sw.status();
  int64_t const rows = sw->rows, n = c1 - c0, cb = sw->scales.dim(1);
  Tensor out = Tensor::zeros(DType::kF32, {rows, n});
  uint8_t const* b = sw->codes.data_as<uint8_t>();
  uint8_t const* s8 = sw->scales.data_as<uint8_t>();
  float* o = out.data_as<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j)
      o[r * n + j] = float_from_fp8_e4m3(b[r * n + j]) * float_from_e8m0(s8[(r / 32) * cb + (c0 + j) / 32 - c0 / 32]);
  return out;
}

namespace {
std::string exl3_prefix(std::string const& name) {
  return ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : std::string();
}
}  // namespace

bool CheckpointSource::is_exl3(std::string const& name) const {
  std::string const p = exl3_prefix(name);
  return !p.empty() && !contains(name) && contains(p + ".trellis");
}

Result<Exl3Weight> CheckpointSource::load_exl3(std::string const& name) const {
  if (!is_exl3(name)) return not_found(describe() + ": no EXL3 group for " + name);
  std::string const p = exl3_prefix(name);
  io::Checkpoint const* c = find(p + ".trellis");
  // The loader's checks over exactly this group's tensors (trellis shape and K, markers, scales, bias).
  ops::Exl3TensorSource gs;
  for (char const* part : {".trellis", ".suh", ".su", ".svh", ".sv", ".mcg", ".mul1", ".bias"})
    if (c->contains(p + part)) gs.names.push_back(p + part);
  gs.view = [c](std::string const& n) { return c->view(n); };
  auto groups = ops::load_exl3_groups(gs);
  if (!groups) return Status(groups.status().code(), describe() + ": " + groups.status().message());
  if (groups->size() != 1) return malformed(describe() + ": EXL3 group " + p + " did not load as one group");
  ops::Exl3Group& g = groups->front();
  if (!g.bias.empty())
    return not_supported(describe() + ": EXL3 tensor '" + p + ".bias': DeepSeek-V4.1's linears have no bias");
  Exl3Weight w;
  w.desc = g.desc;
  w.name = p;
  auto t = Tensor::empty(DType::kI16, g.trellis.dims());
  if (!t) return t.status();
  std::memcpy(t->data(), g.trellis.data, t->nbytes());
  w.trellis = std::move(*t);
  w.suh = std::move(g.suh);
  w.svh = std::move(g.svh);
  return w;
}

Result<Tensor> CheckpointSource::load_i64(std::string const& name) const {
  auto const* c = find(name);
  if (!c) return not_found(describe() + ": no tensor " + name);
  auto t = c->load(name);
  if (!t) return t.status();
  if (t->dtype() == DType::kI64) return t;
  Tensor out = Tensor::zeros(DType::kI64, t->shape());
  for (int64_t i = 0; i < t->numel(); ++i) {
    DType dt = t->dtype();
    if (dt == DType::kI32) out.data_as<int64_t>()[i] = t->data_as<int32_t>()[i];
    else if (dt == DType::kU8 || dt == DType::kBool) out.data_as<int64_t>()[i] = t->data_as<uint8_t>()[i];
    else return malformed(describe() + ": tensor " + name + " has dtype " + std::string(dtype_name(dt)) + ", expected an integer type");
  }
  return out;
}

std::string CheckpointSource::describe() const {
  std::string s;
  for (size_t i = 0; i < labels_.size(); ++i) s += (i ? " + " : "") + labels_[i];
  return s.empty() ? "(no checkpoint)" : s;
}

Result<ModelSpec> spec_from_config(Config const& c) {
  ModelSpec s;
  s.name = c.model_type;
  s.vocab_size = c.vocab_size;
  s.hidden_size = c.hidden_size;
  s.num_layers = c.num_hidden_layers;
  s.num_heads = c.num_attention_heads;
  s.head_dim = c.head_dim;
  s.q_lora_rank = c.q_lora_rank;
  s.rope_dim = c.qk_rope_head_dim;
  s.o_groups = c.o_groups;
  s.o_lora_rank = c.o_lora_rank;
  s.sliding_window = c.sliding_window;
  s.max_position_embeddings = c.max_position_embeddings;
  s.compress_ratios.assign(c.compress_ratios.begin(),
                           c.compress_ratios.begin() + std::min<size_t>(c.compress_ratios.size(), c.num_hidden_layers));
  s.kv_source_layers = c.kv_source_layer_ids;
  s.index_source_layers = c.index_source_layer_ids;
  s.candidate_source_layer = c.candidate_source_layer_id;
  s.candidate_topk_blocks = c.candidate_topk_blocks;
  s.candidate_block_size = c.candidate_block_size;
  s.index_n_heads = c.index_n_heads;
  s.index_head_dim = c.index_head_dim;
  s.index_topk = c.index_topk;
  s.moe_inter = c.moe_intermediate_size;
  s.n_experts = c.n_routed_experts;
  s.n_shared_experts = c.n_shared_experts;
  s.top_k = c.num_experts_per_tok;
  s.gate_temp = static_cast<float>(c.gate_temp);
  s.routed_scale = static_cast<float>(c.routed_scaling_factor);
  s.norm_topk_prob = c.norm_topk_prob;
  s.swiglu_limit = static_cast<float>(c.swiglu_limit);
  s.hc_mult = c.hc_mult;
  s.hc_sinkhorn_iters = c.hc_sinkhorn_iters;
  s.hc_eps = static_cast<float>(c.hc_eps);
  s.rms_eps = static_cast<float>(c.rms_norm_eps);
  s.engram_layers = c.engram_layer_ids;
  s.engram_num_embeddings = c.engram_num_embeddings;
  s.engram_vocab_size = c.engram_vocab_size;
  s.engram_max_ngram = c.engram_max_ngram_size;
  s.engram_n_heads = c.engram_n_heads;
  s.engram_head_dim = c.engram_head_dim;
  s.engram_pad_id = c.engram_pad_id;
  s.engram_compressed_vocab = c.engram_compressed_vocab_size;
  s.rope_theta = c.rope_main.rope_theta;
  s.compress_rope_theta = c.rope_compress.rope_theta;
  if (c.rope_main.rope_type != "default")
    return not_supported("rope_parameters.main.rope_type '" + c.rope_main.rope_type + "' (only 'default')");
  if (c.rope_compress.rope_type == "yarn") {
    if (!c.rope_compress.truncate) return not_supported("YaRN with truncate = false");
    s.yarn = true;
    s.yarn_factor = c.rope_compress.factor;
    s.yarn_beta_fast = c.rope_compress.beta_fast;
    s.yarn_beta_slow = c.rope_compress.beta_slow;
    s.yarn_original_max_pos = static_cast<double>(c.rope_compress.original_max_position_embeddings);
  } else if (c.rope_compress.rope_type != "default") {
    return not_supported("rope_parameters.compress.rope_type '" + c.rope_compress.rope_type + "'");
  }
  if (c.scoring_func != "sqrtsoftplus") return not_supported("scoring_func '" + c.scoring_func + "' (only sqrtsoftplus)");
  if (c.hidden_act != "silu") return not_supported("hidden_act '" + c.hidden_act + "' (only silu)");
  for (int64_t e : c.eos_token_id) s.eos_token_ids.push_back(static_cast<int32_t>(e));
  s.dspark.blocks = c.num_nextn_predict_layers;
  s.dspark.block_size = c.dspark_block_size;
  s.dspark.noise_token = c.dspark_noise_token_id;
  s.dspark.markov_rank = c.dspark_markov_rank;
  s.dspark.n_experts = c.dspark_n_routed_experts;
  s.dspark.top_k = c.dspark_num_experts_per_tok;
  s.dspark.target_layers = c.dspark_target_layer_ids;
  TESSERA_TRY(s.validate());
  return s;
}

Result<ModelFolder> open_model_folder(std::string const& dir) {
  namespace fs = std::filesystem;
  auto cfg = load_config(dir);
  if (!cfg) return cfg.status();
  auto spec = spec_from_config(*cfg);
  if (!spec) return spec.status();
  ModelFolder mf;
  mf.spec = std::move(*spec);
  fs::path folder = fs::is_directory(dir) ? fs::path(dir) : fs::path(dir).parent_path();
  fs::path model_file = folder / "model.safetensors";
  TESSERA_TRY(mf.src.open(fs::exists(model_file) ? model_file.string() : folder.string()));
  if (!mf.spec.engram_layers.empty() && !mf.src.contains("engram_hash.multipliers")) {
    for (char const* extra : {"engram_hash.safetensors", "golden.safetensors"}) {
      fs::path p = folder / extra;
      if (fs::exists(p)) {
        TESSERA_TRY(mf.src.open(p.string()));
        break;
      }
    }
  }
  return mf;
}

Result<std::unique_ptr<Dsv41Model>> load_model(std::string const& dir, ModelOptions opts) {
  auto mf = open_model_folder(dir);
  if (!mf) return mf.status();
  auto m = Dsv41Model::create(std::move(mf->spec), mf->src, opts);
  if (!m) return m.status();
  return std::move(*m);
}

}  // namespace tessera::model::dsv41

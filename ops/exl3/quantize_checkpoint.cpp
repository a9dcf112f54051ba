// SPDX-License-Identifier: Apache-2.0
/// Checkpoint → EXL3 conversion (include/tessera/ops/exl3_quantize.hpp): tensor selection, FP8 block
/// dequantisation, per-tensor K allocation against the average-bit budget, resumable sharded output,
/// index and quantization_config (spec/exl3.md §1.1, §1.3, §5.1).
#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tessera/core/config.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/ops/exl3_quantize.hpp"

namespace tessera::ops {

namespace fs = std::filesystem;

namespace {

bool ends_with(std::string const& s, std::string_view suf) {
  return s.size() >= suf.size() && std::string_view(s).substr(s.size() - suf.size()) == suf;
}

char const* codebook_name(exl3::Codebook cb) {
  return cb == exl3::Codebook::kMul1 ? "mul1" : cb == exl3::Codebook::kMcg ? "mcg" : "3inst";
}

bool is_head(std::string const& name) {
  return name == "lm_head.weight" || name == "head.weight" || ends_with(name, ".lm_head.weight");
}

struct Candidate {
  std::string name, prefix, scale;     // scale: FP8 block-scale tensor, or empty
  int64_t k = 0, n = 0;                // in, out
  bool head = false;
  int bits = 0;
};

bool is_candidate(io::TensorInfo const& t) {
  if (!ends_with(t.name, ".weight") || t.shape.size() != 2) return false;
  if (t.shape[0] % 128 || t.shape[1] % 128 || t.shape[0] == 0 || t.shape[1] == 0) return false;
  if (t.dtype != DType::kF32 && t.dtype != DType::kBf16 && t.dtype != DType::kF16 && t.dtype != DType::kF8E4m3) return false;
  if (t.name.find("embed") != std::string::npos || t.name.find("norm") != std::string::npos) return false;
  if (ends_with(t.name, ".gate.weight")) return false;   // MoE router: kept in full precision
  return true;
}

/// W as [k = in, n = out] row-major fp32 (y = x W), FP8 blocks scaled.
Result<std::vector<float>> load_weight(io::Checkpoint const& ck, Candidate const& c) {
  auto w = ck.load_f32(c.name);
  if (!w.ok()) return w.status();
  float const* src = w->data_as<float>();
  std::vector<float> s;
  int64_t sr = 0, sc = 0;
  if (!c.scale.empty()) {
    auto st = ck.load_f32(c.scale);
    if (!st.ok()) return st.status();
    if (st->rank() != 2 || st->dim(0) != (c.n + 127) / 128 || st->dim(1) != (c.k + 127) / 128)
      return malformed("FP8 scale '" + c.scale + "' has shape " + shape_to_string(st->shape()) +
                       ", expected 128x128 blocks of '" + c.name + "'");
    sr = st->dim(0);
    sc = st->dim(1);
    s.assign(st->data_as<float>(), st->data_as<float>() + sr * sc);
  }
  std::vector<float> out(static_cast<size_t>(c.k * c.n));
  for (int64_t o = 0; o < c.n; ++o)
    for (int64_t i = 0; i < c.k; ++i) {
      float v = src[o * c.k + i];
      if (!s.empty()) v *= s[(o / 128) * sc + i / 128];
      out[i * c.n + o] = v;
    }
  return out;
}

uint64_t name_seed(std::string const& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

Status write_text_atomic(fs::path const& path, std::string const& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return io_error("cannot write " + tmp.string());
    f << text;
    if (!f) return io_error("write failed: " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return io_error("cannot rename " + tmp.string() + ": " + ec.message());
  return {};
}

Result<boost::json::object> read_json_object(fs::path const& path) {
  std::ifstream f(path);
  if (!f) return not_found(path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  boost::system::error_code ec;
  auto v = boost::json::parse(ss.str(), ec);
  if (ec || !v.is_object()) return malformed(path.string() + " is not a JSON object");
  return v.as_object();
}

/// Per-tensor K: floor(bits) everywhere, then +1 in order of estimated error reduction per added bit.
void allocate_bits(io::Checkpoint const& ck, std::vector<Candidate>& cands, Exl3CheckpointQuantOptions const& opt) {
  int const base = std::clamp(static_cast<int>(std::floor(opt.bits + 1e-9)), exl3::kMinBits, exl3::kMaxBits);
  double total = 0, used = 0;
  for (auto& c : cands) {
    c.bits = c.head ? opt.head_bits : base;
    if (!c.head) { total += static_cast<double>(c.k * c.n); used += static_cast<double>(c.k * c.n) * base; }
  }
  double const budget = opt.bits * total;
  if (base >= exl3::kMaxBits || used >= budget) return;
  struct Gain { double per_bit; size_t idx; };
  std::vector<Gain> gains;
  for (size_t i = 0; i < cands.size(); ++i) {
    auto& c = cands[i];
    if (c.head) continue;
    auto w = load_weight(ck, c);
    if (!w.ok()) continue;
    double energy = 0;
    for (float v : *w) energy += static_cast<double>(v) * v;
    uint64_t const sd = name_seed(c.name, opt.seed);
    double const e0 = exl3_estimate_rel_mse(w->data(), c.k, c.n, base, opt.codebook, sd, opt.sample_tiles);
    double const e1 = exl3_estimate_rel_mse(w->data(), c.k, c.n, base + 1, opt.codebook, sd, opt.sample_tiles);
    gains.push_back({(e0 - e1) * energy / static_cast<double>(c.k * c.n), i});
  }
  std::stable_sort(gains.begin(), gains.end(), [](Gain const& a, Gain const& b) { return a.per_bit > b.per_bit; });
  for (auto const& g : gains) {
    auto& c = cands[g.idx];
    double const add = static_cast<double>(c.k * c.n);
    if (used + add > budget + 1e-6) continue;
    used += add;
    c.bits = base + 1;
  }
}

}  // namespace

Result<Exl3CheckpointQuantReport> exl3_quantize_checkpoint(Exl3CheckpointQuantOptions const& opt) {
  if (!(opt.bits >= 1.0 && opt.bits <= 8.0)) return invalid_argument("--bits must be within 1..8");
  if (opt.head_bits < 1 || opt.head_bits > 8) return invalid_argument("--head-bits must be within 1..8");
  auto ckr = io::Checkpoint::open(opt.in);
  if (!ckr.ok()) return ckr.status();
  io::Checkpoint const& ck = *ckr;
  fs::path const out(opt.out);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return io_error("cannot create " + out.string() + ": " + ec.message());
  if (fs::weakly_canonical(out, ec) == fs::weakly_canonical(fs::path(ck.directory()), ec))
    return invalid_argument("--out must differ from the input folder");

  // Select tensors.
  std::vector<Candidate> cands;
  std::set<std::string> consumed;
  for (auto const& t : ck.tensors()) {
    if (!is_candidate(t)) continue;
    Candidate c;
    c.name = t.name;
    c.prefix = t.name.substr(0, t.name.size() - 7);
    c.n = t.shape[0];
    c.k = t.shape[1];
    c.head = is_head(t.name);
    if (t.dtype == DType::kF8E4m3) {
      for (char const* s : {".weight_scale_inv", ".scale", ".weight_scale"})
        if (ck.contains(c.prefix + s)) { c.scale = c.prefix + s; break; }
      if (c.scale.empty()) return malformed("FP8 tensor '" + t.name + "' has no block scale (.weight_scale_inv or .scale)");
      consumed.insert(c.scale);
    }
    consumed.insert(t.name);
    cands.push_back(std::move(c));
  }
  if (cands.empty()) return invalid_argument("no quantizable tensor in " + opt.in);

  // Plan: reuse exl3_plan.json when it was made with the same options (resume), else allocate.
  fs::path const plan_path = out / "exl3_plan.json";
  boost::json::object plan_opts{{"bits", opt.bits}, {"codebook", codebook_name(opt.codebook)},
                                {"head_bits", opt.head_bits}, {"seed", opt.seed}};
  bool have_plan = false;
  if (auto old = read_json_object(plan_path); old.ok() && old->contains("options") && old->at("options") == plan_opts) {
    auto const& tk = old->at("tensors").as_object();
    have_plan = true;
    for (auto& c : cands) {
      auto const* v = tk.if_contains(c.name);
      if (!v || !v->is_int64()) { have_plan = false; break; }
      c.bits = static_cast<int>(v->as_int64());
    }
  }
  if (!have_plan) {
    allocate_bits(ck, cands, opt);
    boost::json::object tk;
    for (auto const& c : cands) tk[c.name] = c.bits;
    TESSERA_TRY(write_text_atomic(plan_path, boost::json::serialize(boost::json::object{{"options", plan_opts}, {"tensors", tk}})));
  }

  // Shards of earlier runs with this plan.
  std::map<std::string, double> done_mse;
  int next_shard = 1;
  for (auto const& e : fs::directory_iterator(out)) {
    std::string const fn = e.path().filename().string();
    if (fn.rfind("exl3-", 0) != 0 || !ends_with(fn, ".safetensors")) continue;
    if (!have_plan) { fs::remove(e.path(), ec); continue; }   // from another plan: stale
    next_shard = std::max(next_shard, std::atoi(fn.c_str() + 5) + 1);
    auto f = io::SafetensorsFile::open(e.path().string());
    if (!f.ok()) return f.status();
    auto it = f->metadata().find("exl3_rel_mse");
    if (it == f->metadata().end()) continue;
    boost::system::error_code jec;
    auto rep = boost::json::parse(it->second, jec);
    if (jec || !rep.is_object()) continue;
    for (auto const& kv : rep.as_object()) done_mse[std::string(kv.key())] = kv.value().to_number<double>();
  }

  Exl3CheckpointQuantReport report;
  io::SafetensorsWriter shard;
  boost::json::object shard_mse;
  size_t shard_fill = 0;
  auto flush = [&]() -> Status {
    if (shard.size() == 0) return {};
    char nm[32];
    std::snprintf(nm, sizeof nm, "exl3-%05d.safetensors", next_shard++);
    shard.set_metadata("exl3_rel_mse", boost::json::serialize(shard_mse));
    shard.set_metadata("format", "pt");
    TESSERA_TRY(shard.write((out / nm).string()));
    shard = io::SafetensorsWriter();
    shard_mse = {};
    shard_fill = 0;
    return {};
  };
  int const todo = static_cast<int>(cands.size());
  int finished = 0;
  for (auto const& c : cands) {
    Exl3TensorReport r{c.name, c.prefix, c.k, c.n, c.bits, 0, false};
    if (auto it = done_mse.find(c.name); it != done_mse.end()) {
      r.rel_mse = it->second;
      r.resumed = true;
      report.tensors.push_back(r);
      ++finished;
      continue;
    }
    auto w = load_weight(ck, c);
    if (!w.ok()) return w.status();
    int64_t const tiles = (c.k / 16) * (c.n / 16);
    auto progress = [&](int64_t d) { if (opt.progress) opt.progress(c.name, d, tiles, finished, todo); };
    Exl3QuantizedLayer q = exl3_quantize(w->data(), c.k, c.n, c.bits, opt.codebook, name_seed(c.name, opt.seed), progress);
    r.rel_mse = q.rel_mse;
    auto hold = std::make_shared<Exl3QuantizedLayer>(std::move(q));
    TESSERA_TRY(shard.add(c.prefix + ".trellis", DType::kI16, {c.k / 16, c.n / 16, 16LL * c.bits},
                          [hold](void* dst, size_t nb) { std::memcpy(dst, hold->trellis.data(), nb); return Status{}; }));
    TESSERA_TRY(shard.add(c.prefix + ".suh", DType::kF16, {c.k},
                          [hold](void* dst, size_t nb) { std::memcpy(dst, hold->suh.data(), nb); return Status{}; }));
    TESSERA_TRY(shard.add(c.prefix + ".svh", DType::kF16, {c.n},
                          [hold](void* dst, size_t nb) { std::memcpy(dst, hold->svh.data(), nb); return Status{}; }));
    if (opt.codebook != exl3::Codebook::k3Inst) {
      uint32_t const marker = opt.codebook == exl3::Codebook::kMcg ? exl3::kMulMcg : exl3::kMulMul1;
      TESSERA_TRY(shard.add(c.prefix + "." + codebook_name(opt.codebook), DType::kI32, {},
                            [marker](void* dst, size_t nb) { std::memcpy(dst, &marker, nb); return Status{}; }));
    }
    shard_mse[c.name] = r.rel_mse;
    shard_fill += hold->trellis.size() * 2;
    report.tensors.push_back(r);
    ++finished;
    if (shard_fill >= opt.shard_bytes) TESSERA_TRY(flush());
  }
  TESSERA_TRY(flush());

  // Everything not quantized, copied byte for byte.
  io::SafetensorsWriter rest;
  for (auto const& t : ck.tensors()) {
    if (consumed.count(t.name)) continue;
    report.copied.push_back(t.name);
    std::string const name = t.name;
    TESSERA_TRY(rest.add(name, t.dtype, t.shape, [&ck, name](void* dst, size_t nb) -> Status {
      auto v = ck.view(name);
      if (!v.ok()) return v.status();
      std::memcpy(dst, v->data, nb);
      return {};
    }));
  }
  if (rest.size()) TESSERA_TRY(rest.write((out / "model-unquantized.safetensors").string()));

  // Index over every shard in the folder.
  boost::json::object weight_map;
  size_t total_size = 0;
  for (auto const& e : fs::directory_iterator(out)) {
    std::string const fn = e.path().filename().string();
    if (!ends_with(fn, ".safetensors") || (fn.rfind("exl3-", 0) != 0 && fn != "model-unquantized.safetensors")) continue;
    auto f = io::SafetensorsFile::open(e.path().string());
    if (!f.ok()) return f.status();
    for (auto const& t : f->tensors()) { weight_map[t.name] = fn; total_size += t.nbytes; }
  }
  TESSERA_TRY(write_text_atomic(out / "model.safetensors.index.json",
                                boost::json::serialize(boost::json::object{
                                    {"metadata", boost::json::object{{"total_size", total_size}}}, {"weight_map", weight_map}})));

  // config.json with quantization_config (§1.3), and the files a model folder carries.
  double bits_sum = 0, count = 0;
  for (auto const& c : cands)
    if (!c.head) { bits_sum += static_cast<double>(c.bits) * c.k * c.n; count += static_cast<double>(c.k * c.n); }
  report.avg_bits = count > 0 ? bits_sum / count : 0;
  boost::json::object qc{{"quant_method", "exl3"}, {"version", "tessera-" TESSERA_VERSION},
                         {"bits", std::round(report.avg_bits * 100) / 100}, {"head_bits", opt.head_bits},
                         {"codebook", codebook_name(opt.codebook)}, {"out_scales", "always"},
                         {"calibration", boost::json::object{{"rows", 0}, {"cols", 0}}}};
  fs::path const src_dir(ck.directory());
  if (auto cfg = read_json_object(src_dir / "config.json"); cfg.ok()) {
    if (auto const* oq = cfg->if_contains("quantization_config")) qc["original_quantization_config"] = *oq;
    (*cfg)["quantization_config"] = qc;
    TESSERA_TRY(write_text_atomic(out / "config.json", boost::json::serialize(*cfg)));
  }
  TESSERA_TRY(write_text_atomic(out / "quantization_config.json", boost::json::serialize(qc)));
  for (char const* extra : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"})
    if (fs::exists(src_dir / extra)) fs::copy_file(src_dir / extra, out / extra, fs::copy_options::overwrite_existing, ec);
  return report;
}

}  // namespace tessera::ops

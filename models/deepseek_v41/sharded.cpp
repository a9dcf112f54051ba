// SPDX-License-Identifier: Apache-2.0
/// Rank models and the in-process sharded model (include/tessera/models/deepseek_v41/sharded.hpp):
/// weight slicing by the plan's ranges, per-rank memory of a checkpoint, and the thread-per-rank driver.
#include "tessera/models/deepseek_v41/sharded.hpp"

#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <tuple>

#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"

namespace tessera::model::dsv41 {

namespace {

using dist::Range;

/// Replaces weight `key` (dense tensor `dense`) of `out` by its part `p`. An EXL3 weight (out.exl3[key]) becomes its
/// EXL3 part (slice_exl3: output rows as the 128-column blocks covering them, input columns on 128-input blocks only).
/// A weight held block-scaled (out.scaled[key]) keeps its stored form when the part is whole scale blocks
/// (scaled_whole_blocks): the rank then holds only the stored part; otherwise it holds the part of the weight's values
/// (dequantize_scaled) and no stored form. WeightLoadOptions::parts reads exactly this from a checkpoint.
Status slice_weight(Weights& out, std::string const& key, Tensor& dense, WeightPart p) {
  if (auto x = out.exl3.find(key); x != out.exl3.end()) {
    auto q = slice_exl3(x->second, p);
    if (!q) return q.status();
    x->second = std::move(*q);
    return {};
  }
  auto it = out.scaled.find(key);
  if (it == out.scaled.end()) {
    dense = slice_part(dense, p);
    return {};
  }
  ScaledWeight const& sw = it->second;
  if (scaled_whole_blocks(sw.dtype, p.cols ? sw.cols : sw.rows, p.begin, p.end, p.cols)) {
    it->second = slice_scaled(sw, p);
    dense = Tensor{};
    return {};
  }
  dense = slice_part(dense_weight(dense, &sw), p);
  out.scaled.erase(it);
  return {};
}

WeightPart rows(Range r) { return {r.begin, r.end, false}; }

std::string plan_text(dist::ParallelConfig const& c) {
  return "tp " + std::to_string(c.tp) + " ep " + std::to_string(c.ep) +
         (c.attn == dist::AttnCombine::kAllReduce ? " all-reduce" : "") +
         (c.engram == dist::EngramPlacement::kSharded ? " Engram-sharded" : " Engram-replicated");
}

bool has(std::string const& s, char const* sub) { return s.find(sub) != std::string::npos; }

/// The expert id of a per-expert tensor name (`…experts.<e>.…`), or −1.
int64_t expert_of(std::string const& n) {
  size_t p = n.find("experts.");
  if (p == std::string::npos || has(n, "shared_experts")) return -1;
  p += 8;
  size_t q = p;
  while (q < n.size() && n[q] >= '0' && n[q] <= '9') ++q;
  return q > p && q < n.size() && n[q] == '.' ? std::stoll(n.substr(p, q - p)) : -1;
}

}  // namespace

/// Builds rank models and their weights with access to Dsv41Model's private members.
struct RankAccess {
  static Result<Weights> weights(Dsv41Model const& full, RankShard const& sh) {
    if (full.shard_) return invalid_argument("rank weights: the model is already a rank model");
    ModelSpec const& s = full.spec_;
    TESSERA_TRY(check_exl3_weights(s, full.w_, true));
    if (sh.rank < 0 || sh.rank >= sh.plan.world)
      return invalid_argument("rank weights: rank " + std::to_string(sh.rank) + " is outside the plan's " +
                              std::to_string(sh.plan.world) + " ranks");
    if (!(sh.plan.dims == model_dims(s))) return invalid_argument("rank weights: the plan was made for other model dimensions");
    dist::RankPlan const& me = sh.me();
    dist::ShardingPlan const& p = sh.plan;
    auto const [h0, h1] = full.held_routed_experts();
    Range const needs = p.cfg.ep > 1 ? me.experts : Range{0, s.n_experts};
    if (needs.size() > 0 && (needs.begin < h0 || needs.end > h1))
      return invalid_argument("rank weights: rank " + std::to_string(sh.rank) + " needs routed experts [" +
                              std::to_string(needs.begin) + ", " + std::to_string(needs.end) + "), the model holds [" +
                              std::to_string(h0) + ", " + std::to_string(h1) + ")");
    auto parts = rank_parts(s, p, sh.rank, full.engram_);
    if (!parts) return parts.status();
    if (full.part_ && !(full.held_parts_ == *parts))
      return invalid_argument("rank weights: the model holds the split tensors' parts of rank " +
                              std::to_string(full.part_->rank) + " of a " + plan_text(full.part_->plan.cfg) +
                              " plan (a rank's host model); rank " + std::to_string(sh.rank) + " of this " +
                              plan_text(p.cfg) + " plan needs other parts");
    Weights out = full.w_;  // shares every tensor (stored forms included); the rank's parts replace some below
    for (int64_t l = 0; l < s.num_layers; ++l) {
      LayerWeights& w = out.layers[l];
      auto key = [l](char const* field) { return scaled_weight_key(l, field); };
      // A host model holding parts (load_rank_host_model) was read with exactly these parts: nothing to cut.
      if (!full.part_) {
        if (parts->wq_b) TESSERA_TRY(slice_weight(out, key("wq_b"), w.wq_b, *parts->wq_b));
        if (parts->attn_sink) w.attn_sink = slice_part(w.attn_sink, *parts->attn_sink);
        if (parts->wo_a) TESSERA_TRY(slice_weight(out, key("wo_a"), w.wo_a, *parts->wo_a));
        if (parts->wo_b) TESSERA_TRY(slice_weight(out, key("wo_b"), w.wo_b, *parts->wo_b));
        for (auto [wn, t, part] : {std::tuple{"w1", &w.shared.w1, parts->shared_in}, {"w3", &w.shared.w3, parts->shared_in},
                                   {"w2", &w.shared.w2, parts->shared_out}})
          if (part) TESSERA_TRY(slice_weight(out, exl3_shared_key(l, wn), *t, *part));
        if (!parts->e_table.empty() && parts->e_table[l]) w.e_table = slice_part(w.e_table, *parts->e_table[l]);
      }
      if (p.cfg.ep > 1)
        for (int64_t e = 0; e < s.n_experts; ++e)
          if (!me.experts.contains(e)) {
            w.experts[e] = ExpertWeights{};
            for (char const* wn : {"w1", "w3", "w2"}) {
              out.scaled.erase(scaled_expert_key(l, e, wn));
              out.exl3.erase(scaled_expert_key(l, e, wn));
            }
          }
    }
    if (!full.part_ && parts->lm_head) TESSERA_TRY(slice_weight(out, scaled_head_key(), out.lm_head, *parts->lm_head));
    return out;
  }

  static Result<std::unique_ptr<Dsv41Model>> host(ModelSpec spec, WeightSource const& src, ModelOptions o,
                                                  dist::ShardingPlan const& plan, int rank) {
    auto part = std::make_shared<RankShard>();
    part->plan = plan;
    part->rank = rank;
    return Dsv41Model::create_(std::move(spec), src, std::move(o), std::move(part));
  }

  static Result<std::unique_ptr<Dsv41Model>> make(Dsv41Model const& full, std::shared_ptr<RankShard const> sh,
                                                  ThreadPool* pool) {
    auto w = weights(full, *sh);
    if (!w) return w.status();
    std::unique_ptr<Dsv41Model> m(new Dsv41Model());
    m->spec_ = full.spec_;
    m->opts_ = full.opts_;
    m->opts_.pool = pool;
    m->info_ = full.info_;
    m->engram_ = full.engram_;
    m->main_inv_freq_ = full.main_inv_freq_;
    m->compress_inv_freq_ = full.compress_inv_freq_;
    m->w_ = std::move(*w);
    m->shard_ = std::move(sh);
    return m;
  }
};

dist::ModelDims model_dims(ModelSpec const& s) {
  dist::ModelDims d;
  d.hidden = s.hidden_size;
  d.heads = s.num_heads;
  d.head_dim = s.head_dim;
  d.o_groups = s.o_groups;
  d.o_lora_rank = s.o_lora_rank;
  d.experts = s.n_experts;
  d.moe_inter = s.moe_inter;
  d.vocab = s.vocab_size;
  d.layers = s.num_layers;
  d.engram_columns = s.engram_layers.empty() ? 0 : (s.engram_max_ngram - 1) * s.engram_n_heads;
  return d;
}

bool scaled_slice_aligned(DType dtype, int64_t n, Range r, bool cols) {
  return scaled_whole_blocks(dtype, n, r.begin, r.end, cols);
}

Result<RankParts> rank_parts(ModelSpec const& s, dist::ShardingPlan const& p, int rank, EngramTables const& engram) {
  if (rank < 0 || rank >= p.world)
    return invalid_argument("rank parts: rank " + std::to_string(rank) + " is outside the plan's " +
                            std::to_string(p.world) + " ranks");
  if (!(p.dims == model_dims(s))) return invalid_argument("rank parts: the plan was made for other model dimensions");
  dist::RankPlan const& me = p.ranks[static_cast<size_t>(rank)];
  int64_t const hd = s.head_dim, ro = s.o_lora_rank;
  RankParts out;
  if (p.cfg.tp > 1) {
    out.wq_b = WeightPart{me.heads.begin * hd, me.heads.end * hd};
    out.attn_sink = rows(me.heads);
    if (!me.gather_heads) out.wo_a = WeightPart{me.groups.begin * ro, me.groups.end * ro};
    // All-reduce: the columns of the rank's groups (its partial products); else the rows of its output slice.
    if (!me.gather_heads && p.cfg.attn == dist::AttnCombine::kAllReduce)
      out.wo_b = WeightPart{me.groups.begin * ro, me.groups.end * ro, true};
    else
      out.wo_b = rows(me.wo_b_rows);
    out.shared_in = rows(me.shared_inter);
    out.shared_out = rows(me.shared_rows);
    out.lm_head = rows(me.vocab);
  }
  if (p.cfg.engram == dist::EngramPlacement::kSharded && p.world > 1 && !s.engram_layers.empty()) {
    out.e_table.resize(static_cast<size_t>(s.num_layers));
    int64_t const C = engram.columns();
    for (int64_t l = 0; l < s.num_layers; ++l) {
      int64_t const ei = s.engram_index(l);
      if (ei < 0) continue;
      // Hash column c of Engram layer ei indexes table rows [offsets[c], offsets[c] + primes[c]) (c = ei·C + column);
      // the rank's contiguous columns [c0, c1] index the contiguous rows from the first's start to the last's end.
      Range r{0, 0};
      if (me.engram_cols.size() > 0) {
        int64_t const c0 = ei * C + me.engram_cols.begin, c1 = ei * C + me.engram_cols.end - 1;
        r = {engram.offsets[c0], engram.offsets[c1] + engram.primes[c1]};
      }
      int64_t const table_rows = s.engram_num_embeddings[static_cast<size_t>(ei)];
      if (r.end > table_rows)
        return malformed("rank parts: Engram layer " + std::to_string(l) + " table has " + std::to_string(table_rows) +
                         " rows, the hash columns need " + std::to_string(r.end));
      out.e_table[static_cast<size_t>(l)] = rows(r);
    }
  }
  return out;
}

namespace {

/// How a checkpoint tensor is stored: dense, or one half of a block-scaled weight (spec §4.2: `X.weight` codes,
/// `X.scale` ue8m0 scales), with the weight's logical [rows, cols].
struct StoredAs {
  enum class Kind { kDense, kCodes, kScales } kind = Kind::kDense;
  DType format = DType::kF32;  // kF8E4m3 / kF4E2m1x2 for codes and scales
  int64_t rows = 0, cols = 0;
};

StoredAs stored_as(io::TensorInfo const& t, std::map<std::string, io::TensorInfo const*> const& by_name) {
  auto ends = [](std::string const& n, std::string const& suf) {
    return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
  };
  auto find = [&](std::string const& n) -> io::TensorInfo const* {
    auto it = by_name.find(n);
    return it == by_name.end() ? nullptr : it->second;
  };
  // The loader's rule (CheckpointSource::scaled): an F8_E4M3 weight, or a 2-D I8 one (FP4 pairs), with an E8M0
  // `.scale`; Engram tables are per-row-scaled tables, not block-scaled weights.
  auto format_of = [](io::TensorInfo const& w, io::TensorInfo const& sc) {
    if (sc.dtype != DType::kE8m0 || w.shape.size() != 2 || has(w.name, "engram.embed.") || has(w.name, "engram_tables."))
      return DType::kF32;
    return w.dtype == DType::kF8E4m3 ? DType::kF8E4m3 : w.dtype == DType::kI8 ? DType::kF4E2m1x2 : DType::kF32;
  };
  StoredAs a;
  if (ends(t.name, ".weight")) {
    io::TensorInfo const* sc = find(t.name.substr(0, t.name.size() - 7) + ".scale");
    if (!sc || (a.format = format_of(t, *sc)) == DType::kF32) return {};
    a.kind = StoredAs::Kind::kCodes;
    a.rows = t.shape[0];
    a.cols = a.format == DType::kF4E2m1x2 ? 2 * t.shape[1] : t.shape[1];
  } else if (ends(t.name, ".scale")) {
    io::TensorInfo const* w = find(t.name.substr(0, t.name.size() - 6) + ".weight");
    if (!w || (a.format = format_of(*w, t)) == DType::kF32) return {};
    a.kind = StoredAs::Kind::kScales;
    a.rows = w->shape[0];
    a.cols = a.format == DType::kF4E2m1x2 ? 2 * w->shape[1] : w->shape[1];
  }
  return a;
}

/// Bytes of rows r (cols = false) or columns r (cols = true) of tensor t, in the rank's terms: a dense tensor's
/// slice; a block-scaled weight's stored slice (codes and the scale blocks covering them) when the slice is whole
/// scale blocks, else its dense slice held as bf16 (2 bytes a value; rank_weights) and no scales.
size_t slice_bytes(io::TensorInfo const& t, StoredAs const& a, Range r, bool cols) {
  if (a.kind == StoredAs::Kind::kDense) {
    int64_t const n = cols ? t.shape[1] : t.shape[0];
    return n == 0 ? 0 : t.nbytes / static_cast<size_t>(n) * static_cast<size_t>(r.size());
  }
  bool const fp4 = a.format == DType::kF4E2m1x2;
  if (!scaled_slice_aligned(a.format, cols ? a.cols : a.rows, r, cols))
    return a.kind == StoredAs::Kind::kCodes ? static_cast<size_t>(2 * (cols ? a.rows : r.size()) * (cols ? r.size() : a.cols))
                                            : 0;
  if (a.kind == StoredAs::Kind::kCodes) {
    int64_t const rows = cols ? a.rows : r.size(), values = cols ? r.size() : a.cols;
    return static_cast<size_t>(rows * (fp4 ? values / 2 : values));
  }
  int64_t const scale_cols = (a.cols + 31) / 32;
  if (cols) return static_cast<size_t>((fp4 ? a.rows : (a.rows + 31) / 32) * ((r.end + 31) / 32 - r.begin / 32));
  return static_cast<size_t>((fp4 ? r.size() : (r.end + 31) / 32 - r.begin / 32) * scale_cols);
}

/// A tensor of an EXL3 group (spec/exl3.md §1.1: `P.trellis` I16 [k/16, n/16, 16·K] with `P.suh` / legacy `P.su` and
/// `P.svh` / legacy `P.sv`), and the group's [n, k] = [out, in] from its trellis; kNone for any other tensor (markers
/// and bias included).
struct Exl3Part {
  enum class Kind { kNone, kTrellis, kSuh, kSvh } kind = Kind::kNone;
  int64_t n = 0, k = 0;
};

Exl3Part exl3_part(io::TensorInfo const& t, std::map<std::string, io::TensorInfo const*> const& by_name) {
  static constexpr std::pair<char const*, Exl3Part::Kind> kSuffixes[] = {
      {".trellis", Exl3Part::Kind::kTrellis}, {".suh", Exl3Part::Kind::kSuh}, {".su", Exl3Part::Kind::kSuh},
      {".svh", Exl3Part::Kind::kSvh},         {".sv", Exl3Part::Kind::kSvh}};
  for (auto const& [suffix, kind] : kSuffixes) {
    size_t const len = std::strlen(suffix);
    if (t.name.size() <= len || t.name.compare(t.name.size() - len, len, suffix) != 0) continue;
    auto it = by_name.find(t.name.substr(0, t.name.size() - len) + ".trellis");
    if (it == by_name.end() || it->second->shape.size() != 3 || it->second->dtype != DType::kI16) return {};
    return {kind, 16 * it->second->shape[1], 16 * it->second->shape[0]};
  }
  return {};
}

/// Bytes of an EXL3 group's tensor t in the part a rank holds (slice_exl3): output rows r (cols = false) hold the
/// 128-column blocks covering them, [128·⌊r0/128⌋, min(n, 128·⌈r1/128⌉)): trellis tile columns and svh of those
/// columns, suh whole; input columns r (cols = true, the all-reduce wo_b) the 128-input blocks covering them: tile
/// rows and suh of those inputs, svh whole (the rank models refuse a split off the blocks; counted as its covering
/// blocks); `whole`: the group. suh / svh count 2 bytes an element, the fp16 vectors held (legacy packed signs
/// expanded).
size_t exl3_slice_bytes(io::TensorInfo const& t, Exl3Part const& g, Range r, bool cols, bool whole) {
  auto cover = [&](int64_t len) { return std::min(len, (r.end + 127) / 128 * 128) - r.begin / 128 * 128; };
  int64_t const n = whole || cols ? g.n : cover(g.n), k = whole || !cols ? g.k : cover(g.k);
  switch (g.kind) {
    case Exl3Part::Kind::kTrellis:
      return t.nbytes / static_cast<size_t>(g.k / 16 * (g.n / 16)) * static_cast<size_t>(k / 16 * (n / 16));
    case Exl3Part::Kind::kSuh: return static_cast<size_t>(2 * k);
    case Exl3Part::Kind::kSvh: return static_cast<size_t>(2 * n);
    case Exl3Part::Kind::kNone: break;
  }
  return t.nbytes;
}

}  // namespace

std::vector<size_t> plan_memory(dist::ShardingPlan const& p, ModelSpec const& s, std::vector<io::TensorInfo> const& tensors) {
  std::vector<size_t> out(static_cast<size_t>(p.world), 0);
  bool const tp = p.cfg.tp > 1, ep = p.cfg.ep > 1;
  std::map<std::string, io::TensorInfo const*> by_name;
  for (auto const& t : tensors) by_name[t.name] = &t;
  for (auto const& t : tensors) {
    std::string const& n = t.name;
    StoredAs const as = stored_as(t, by_name);
    Exl3Part const x = exl3_part(t, by_name);
    bool const attn = has(n, "attn.") && !has(n, "indexer") && !has(n, "compressor");
    int64_t const e = expert_of(n);
    for (auto const& r : p.ranks) {
      // The rank's part: rows or columns of the weight (exact bytes), or a fraction of the tensor.
      Range part{0, 0};
      bool cols = false, sliced = true;
      double f = 1.0;
      if (tp && attn && (has(n, "wq_b") || has(n, "q_b_proj")))
        part = {r.heads.begin * s.head_dim, r.heads.end * s.head_dim};
      else if (tp && attn && (has(n, "attn_sink") || has(n, "sinks")))
        part = r.heads;
      else if (tp && attn && (has(n, "wo_a") || has(n, "o_a_proj")))
        part = {r.groups.begin * s.o_lora_rank, r.groups.end * s.o_lora_rank};
      else if (tp && attn && (has(n, "wo_b") || has(n, "o_b_proj"))) {
        cols = r.wo_b_rows.size() == s.hidden_size && !r.gather_heads;  // all-reduce: the groups' columns
        part = cols ? Range{r.groups.begin * s.o_lora_rank, r.groups.end * s.o_lora_rank} : r.wo_b_rows;
      } else if (tp && has(n, "shared_experts.") && (has(n, ".w2") || has(n, "down_proj")))
        part = r.shared_rows;
      else if (tp && has(n, "shared_experts."))
        part = r.shared_inter;
      else if (tp && (n.rfind("lm_head", 0) == 0 || n.rfind("head.", 0) == 0))
        part = r.vocab;
      else {
        sliced = false;
        if (ep && e >= 0)
          f = r.experts.contains(e) ? 1.0 : 0.0;
        else if (ep && (has(n, "experts.gate_up_proj") || has(n, "experts.down_proj")))
          f = static_cast<double>(r.experts.size()) / s.n_experts;
        else if (p.world > 1 && p.cfg.engram == dist::EngramPlacement::kSharded && p.dims.engram_columns > 0 &&
                 (has(n, "engram.embed.") || has(n, "engram_tables.")))
          f = static_cast<double>(r.engram_cols.size()) / p.dims.engram_columns;  // ≈: columns differ by a few rows
      }
      if (x.kind != Exl3Part::Kind::kNone)  // held as stored (ModelOptions::dequantize_weights aside)
        out[r.rank] += static_cast<size_t>(static_cast<double>(exl3_slice_bytes(t, x, part, cols, !sliced)) * f + 0.5);
      else
        out[r.rank] += sliced && !t.shape.empty() ? slice_bytes(t, as, part, cols)
                                                  : static_cast<size_t>(static_cast<double>(t.nbytes) * f + 0.5);
    }
  }
  return out;
}

Result<std::unique_ptr<Dsv41Model>> make_rank_model(Dsv41Model const& full, std::shared_ptr<RankShard const> shard,
                                                    ThreadPool* pool) {
  return RankAccess::make(full, std::move(shard), pool);
}

Result<Weights> rank_weights(Dsv41Model const& full, RankShard const& shard) { return RankAccess::weights(full, shard); }

ModelOptions rank_host_options(ModelOptions o) {
  o.weights_as_stored = o.numerics == Numerics::kBf16;
  return o;
}

Result<std::unique_ptr<Dsv41Model>> load_rank_host_model(std::string const& dir, ModelOptions o) {
  return load_model(dir, rank_host_options(std::move(o)));
}

Result<ModelOptions> rank_host_options(ModelOptions o, dist::ShardingPlan const& plan, int rank) {
  if (rank < 0 || rank >= plan.world)
    return invalid_argument("rank host model: rank " + std::to_string(rank) + " is outside the plan's " +
                            std::to_string(plan.world) + " ranks");
  o = rank_host_options(std::move(o));
  Range const experts = plan.cfg.ep > 1 ? plan.ranks[static_cast<size_t>(rank)].experts : Range{0, plan.dims.experts};
  o.routed_experts_begin = experts.begin;
  o.routed_experts_end = experts.end;
  return o;
}

Result<std::unique_ptr<Dsv41Model>> load_rank_host_model(ModelSpec spec, WeightSource const& src, ModelOptions o,
                                                         dist::ShardingPlan const& plan, int rank) {
  if (!(plan.dims == model_dims(spec)))
    return invalid_argument("rank host model: the plan was made for other dimensions than the checkpoint's (" +
                            std::to_string(plan.dims.experts) + " routed experts, " + std::to_string(plan.dims.heads) +
                            " heads, hidden " + std::to_string(plan.dims.hidden) + " against " +
                            std::to_string(spec.n_experts) + ", " + std::to_string(spec.num_heads) + ", " +
                            std::to_string(spec.hidden_size) + ")");
  auto ro = rank_host_options(std::move(o), plan, rank);
  if (!ro) return ro.status();
  return RankAccess::host(std::move(spec), src, std::move(*ro), plan, rank);
}

Result<RankHost> load_rank_host(std::string const& dir, ModelOptions o, dist::ParallelConfig const& cfg, int rank) {
  auto mf = open_model_folder(dir);
  if (!mf) return mf.status();
  auto plan = dist::make_plan(model_dims(mf->spec), cfg);
  if (!plan) return plan.status();
  auto m = load_rank_host_model(std::move(mf->spec), mf->src, std::move(o), *plan, rank);
  if (!m) return m.status();
  return RankHost{std::move(*m), std::move(*plan)};
}

size_t ShardedState::memory_bytes() const {
  size_t b = 0;
  for (auto const& r : ranks) b += r->memory_bytes();
  return b;
}

ShardedModel::~ShardedModel() {
  // Each rank's model is released on its own device (its stream and memory belong to it).
  for (int r = world() - 1; r >= 0; --r) {
    (void)enter_rank(r);
    ranks_[static_cast<size_t>(r)].reset();
  }
}

Result<std::unique_ptr<ShardedModel>> ShardedModel::create(Dsv41Model const& full, dist::ParallelConfig cfg) {
  auto plan = dist::make_plan(model_dims(full.spec()), cfg);
  if (!plan) return plan.status();
  std::unique_ptr<ShardedModel> m(new ShardedModel());
  int const n = plan->world;
  for (int r = 0; r < n; ++r) {
    m->pools_.push_back(std::make_unique<ThreadPool>(1));
    auto sh = std::make_shared<RankShard>();
    sh->plan = *plan;
    sh->rank = r;
    m->shards_.push_back(sh);
  }
  m->make_group(n);
  for (int r = 0; r < n; ++r) {
    auto rm = make_rank_model(full, m->shards_[r], m->pools_[r].get());
    if (!rm) return rm.status();
    m->ranks_.push_back(std::move(*rm));
  }
  m->info_ = full.info();
  m->info_.device = "cpu (in-process tp=" + std::to_string(cfg.tp) + " ep=" + std::to_string(cfg.ep) + ")";
  m->bf16_ = full.numerics() == Numerics::kBf16;
  m->hooks_ = [](LanguageModel& lm) {
    auto& rm = static_cast<Dsv41Model&>(lm);
    GoldenGateHooks h;
    h.set_boundary_ulps = [&rm](int u) { rm.set_boundary_ulps(u); };
    h.ties = [](SequenceState const& s) { return &static_cast<Dsv41State const&>(s).ties(); };
    h.boundaries = [](SequenceState const& s) { return &static_cast<Dsv41State const&>(s).quant_boundaries(); };
    return h;
  };
  return m;
}

void ShardedModel::make_group(int n) {
  comms_ = dist::InProcessCommunicator::create(n);
  wrapped_.clear();
  for (int r = 0; r < n; ++r) {
    if (wrap_comm_) wrapped_.push_back(wrap_comm_(*comms_[r], r));
    shards_[r]->comm = wrap_comm_ ? wrapped_[r].get() : comms_[r].get();
  }
}

GoldenGateHooks ShardedModel::gate_hooks(int r) { return hooks_(*ranks_[static_cast<size_t>(r)]); }

std::unique_ptr<SequenceState> ShardedModel::new_sequence() {
  auto st = std::make_unique<ShardedState>();
  for (auto& r : ranks_) st->ranks.push_back(r->new_sequence());
  return st;
}

Status ShardedModel::forward(std::span<SequenceStep> batch) {
  int const n = world();
  for (auto const& step : batch)
    if (!dynamic_cast<ShardedState*>(step.state)) return invalid_argument("forward: a step has no sharded state");
  std::vector<std::vector<SequenceStep>> steps(static_cast<size_t>(n));
  std::vector<std::vector<float>> scratch(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    size_t need = 0;
    for (auto const& step : batch) need += static_cast<size_t>(step.num_logit_rows * info_.vocab_size);
    if (r > 0) scratch[r].resize(need);
    size_t off = 0;
    for (auto const& step : batch) {
      SequenceStep s = step;
      s.state = static_cast<ShardedState*>(step.state)->ranks[r].get();
      if (r > 0 && step.logits) {
        s.logits = scratch[r].data() + off;
        off += static_cast<size_t>(step.num_logit_rows * info_.vocab_size);
      }
      steps[r].push_back(s);
    }
  }
  return run_ranks([&](LanguageModel& m, int r) { return m.forward(steps[r]); });
}

Status ShardedModel::run_ranks(std::function<Status(LanguageModel&, int)> const& fn) {
  int const n = world();
  std::vector<Status> st(static_cast<size_t>(n));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        st[r] = enter_rank(r);
        if (st[r].ok()) st[r] = fn(*ranks_[r], r);
      } catch (std::exception const& e) {
        st[r] = Status(StatusCode::kInternal, e.what());
      }
      if (!st[r].ok()) comms_[r]->abort(st[r].message());
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < n; ++r)
    if (!st[r].ok()) {
      // The group is aborted: a fresh one for the next call (the rank models keep their shards).
      make_group(n);
      return st[r];
    }
  return {};
}

Result<GoldenReport> run_golden_gate_sharded(ShardedModel& model, WeightSource const& golden,
                                             std::function<void(std::string const&)> const& log) {
  std::vector<GoldenReport> rep(static_cast<size_t>(model.world()));
  TESSERA_TRY(model.run_ranks([&](LanguageModel& m, int r) -> Status {
    auto g = run_golden_gate(m, model.bf16(), model.gate_hooks(r), golden,
                             r == 0 ? log : std::function<void(std::string const&)>{});
    if (!g) return g.status();
    rep[r] = std::move(*g);
    return {};
  }));
  return std::move(rep[0]);
}

Result<std::unique_ptr<SequenceState>> ShardedModel::clone(SequenceState const& state) {
  auto const* s = dynamic_cast<ShardedState const*>(&state);
  if (!s) return invalid_argument("clone: the state was not created by a sharded model");
  auto out = std::make_unique<ShardedState>();
  for (int r = 0; r < world(); ++r) {
    TESSERA_TRY(enter_rank(r));
    auto c = ranks_[r]->clone(*s->ranks[r]);
    if (!c) return c.status();
    out->ranks.push_back(std::move(*c));
  }
  return std::unique_ptr<SequenceState>(std::move(out));
}

Status ShardedModel::truncate(SequenceState& state, int64_t length) {
  auto* s = dynamic_cast<ShardedState*>(&state);
  if (!s) return invalid_argument("truncate: the state was not created by a sharded model");
  for (int r = 0; r < world(); ++r) {
    TESSERA_TRY(enter_rank(r));
    TESSERA_TRY(ranks_[r]->truncate(*s->ranks[r], length));
  }
  return {};
}

size_t ShardedModel::state_bytes_for(int64_t num_tokens) const {
  return static_cast<size_t>(world()) * ranks_[0]->state_bytes_for(num_tokens);
}

}  // namespace tessera::model::dsv41

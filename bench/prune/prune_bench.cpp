// SPDX-License-Identifier: Apache-2.0
/// Decode speed of routed-expert pruning, next to its retention (docs/pruning.md):
///
///   bench_prune [--device cpu|cuda] [--model DIR] [--dtype fp32|bf16] [--top-p 0.9,0.8,0.7,0.5] [--min-k 1]
///               [--static KEEP[=DIR]]... [--prompt-len 32] [--steps 32] [--repeats 3] [--seed 7] [--json FILE]
///               [--no-retention]
///
/// Speed, on --model (default golden/v41-tiny/fp32) with the --device model: greedy decode after a prefill of
/// random tokens; ms/token is the median over repeats of the mean decode step (each step copies its logits to
/// the host). Per-token settings (top_p, min_k, kept weights renormalised, decode scope: prefill is never
/// pruned) are switched with set_pruning on one loaded model, the repeats interleaved over the settings; each
/// `--static KEEP=DIR` is a checkpoint written by `tessera prune --keep KEEP`, loaded unpruned. The routed
/// experts kept per decode row (mean over rows and layers) come from an untimed pass through the GPU model's
/// route observer or the CPU model's debug tap.
///
/// Retention, on golden/v41-tiny fp32 (CPU model) for the same settings: teacher-forced over golden prompts
/// 2-5 (first 64 tokens) against the unpruned model (pruning.hpp measure_retention). A static KEEP there is
/// the mask of the round(KEEP·E) experts with the largest routing weight on those prompts, which computes the
/// checkpoint `tessera prune` writes bit for bit (verify/prune).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tessera/models/deepseek_v41/config.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/pruning.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;
using Scope = ExpertPruning::Scope;

namespace {

struct Options {
  std::string device = "cpu", model, dtype = "bf16", json;
  std::vector<float> top_p{0.9f, 0.8f, 0.7f, 0.5f};
  int64_t min_k = 1, prompt_len = 32, steps = 32, repeats = 3;
  uint32_t seed = 7;
  std::vector<std::pair<double, std::string>> statics;  // KEEP, checkpoint folder ("" = retention only)
  bool retention = true;
};

struct Row {
  std::string label;
  double keep = 0;  // static rows: the kept fraction
  float top_p = 1.f;
  std::optional<double> ms;        // median ms per decode step
  double kept_per_row = 0;         // routed experts kept per decode row
  int64_t experts = 0, top_k = 0;  // of the timed checkpoint
  double expert_gib = 0;           // routed expert weights as loaded on the device
  double load_s = 0;
  std::optional<RetentionReport> tiny;
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr, "bench_prune: %s\nusage: bench_prune [--device cpu|cuda] [--model DIR] [--dtype fp32|bf16] "
                       "[--top-p 0.9,0.8,0.7,0.5] [--min-k 1] [--static KEEP[=DIR]]... [--prompt-len 32] [--steps 32] "
                       "[--repeats 3] [--seed 7] [--json FILE] [--no-retention]\n", why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--no-retention") { o.retention = false; continue; }
    if (i + 1 >= argc) usage(("missing value for " + a).c_str());
    std::string const v = argv[++i];
    try {
      if (a == "--device") o.device = v;
      else if (a == "--model") o.model = v;
      else if (a == "--dtype") o.dtype = v;
      else if (a == "--json") o.json = v;
      else if (a == "--min-k") o.min_k = std::stoll(v);
      else if (a == "--prompt-len") o.prompt_len = std::stoll(v);
      else if (a == "--steps") o.steps = std::stoll(v);
      else if (a == "--repeats") o.repeats = std::stoll(v);
      else if (a == "--seed") o.seed = static_cast<uint32_t>(std::stoul(v));
      else if (a == "--top-p") {
        o.top_p.clear();
        for (size_t b = 0; b < v.size();) {
          size_t e = v.find(',', b);
          o.top_p.push_back(std::stof(v.substr(b, e - b)));
          b = e == std::string::npos ? v.size() : e + 1;
        }
      } else if (a == "--static") {
        size_t const eq = v.find('=');
        o.statics.emplace_back(std::stod(v.substr(0, eq)), eq == std::string::npos ? "" : v.substr(eq + 1));
      } else usage(("unknown option " + a).c_str());
    } catch (std::exception const&) {
      usage((a + " " + v + ": not a number").c_str());
    }
  }
  if (o.device != "cpu" && o.device != "cuda") usage("--device must be cpu or cuda");
  if (o.dtype != "fp32" && o.dtype != "bf16") usage("--dtype must be fp32 or bf16");
  if (o.steps < 1 || o.repeats < 1 || o.prompt_len < 1) usage("--steps, --repeats and --prompt-len must be >= 1");
  return o;
}

double peak_rss_gib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / (1024.0 * 1024.0);  // kB
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// A model on the bench's device with the two pruning hooks both model classes have.
struct Loaded {
  std::unique_ptr<model::LanguageModel> m;
  Config cfg;
  double load_s = 0;
  int64_t kept = 0, rows = 0;  // counted while counting() is on

  Status set_pruning(ExpertPruning p) {
    if (auto* c = dynamic_cast<Dsv41Model*>(m.get())) return c->set_pruning(std::move(p));
    return dynamic_cast<GpuDsv41Model&>(*m).set_pruning(std::move(p));
  }
  /// Counts the kept slots of one-row (decode) router outputs while on.
  void counting(bool on) {
    kept = rows = 0;
    int64_t const K = cfg.num_experts_per_tok;
    if (auto* c = dynamic_cast<Dsv41Model*>(m.get())) {
      if (!on) return c->set_debug_tap({});
      c->set_debug_tap([this, K](std::string const& n, std::vector<int64_t> const& shape, std::span<float const> v) {
        if (shape.size() != 2 || shape[0] != 1 || static_cast<int64_t>(v.size()) != K ||
            n.find(".ffn.gate.out1") == std::string::npos)
          return;
        for (float id : v) kept += id >= 0;
        ++rows;
      });
      return;
    }
    auto& g = dynamic_cast<GpuDsv41Model&>(*m);
    if (!on) return g.set_route_observer({});
    g.set_route_observer([this, K](int64_t, std::span<int32_t const> ids, std::span<float const>) {
      if (static_cast<int64_t>(ids.size()) != K) return;
      for (int32_t id : ids) kept += id >= 0;
      ++rows;
    });
  }
};

Loaded load(Options const& o, std::string const& dir) {
  Loaded l;
  auto t0 = std::chrono::steady_clock::now();
  l.cfg = load_config(dir).value_or_throw();
  ModelOptions mo;
  mo.numerics = o.dtype == "bf16" ? Numerics::kBf16 : Numerics::kFp32;
  l.m = load_model_on(dir, mo, o.device).value_or_throw();
  l.load_s = seconds_since(t0);
  std::printf("loaded %s on %s (%s): %lld layers, %lld routed experts top-%lld, vocab %lld, %.1f s, peak host RSS "
              "%.1f GiB\n", dir.c_str(), o.device.c_str(), o.dtype.c_str(),
              static_cast<long long>(l.cfg.num_hidden_layers), static_cast<long long>(l.cfg.n_routed_experts),
              static_cast<long long>(l.cfg.num_experts_per_tok), static_cast<long long>(l.cfg.vocab_size), l.load_s,
              peak_rss_gib());
  std::fflush(stdout);
  return l;
}

/// Mean ms of one greedy decode step over `steps` steps after prefilling `prompt`.
double decode_ms(model::LanguageModel& m, std::vector<int32_t> const& prompt, int64_t steps) {
  int64_t const V = m.info().vocab_size;
  auto st = m.new_sequence();
  std::vector<float> logits(static_cast<size_t>(V));
  model::SequenceStep pre{st.get(), prompt, 1, logits.data()};
  throw_if_error(m.forward({&pre, 1}));
  std::vector<int32_t> cur{static_cast<int32_t>(argmax_first(logits.data(), V))};
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    model::SequenceStep step{st.get(), cur, 1, logits.data()};
    throw_if_error(m.forward({&step, 1}));
    cur[0] = static_cast<int32_t>(argmax_first(logits.data(), V));
  }
  return seconds_since(t0) * 1e3 / static_cast<double>(steps);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double expert_gib(Config const& c, std::string const& dtype) {
  double const bytes = dtype == "bf16" ? 2.0 : 4.0;
  return static_cast<double>(c.num_hidden_layers) * static_cast<double>(c.n_routed_experts) * 3.0 *
         static_cast<double>(c.hidden_size) * static_cast<double>(c.moe_intermediate_size) * bytes /
         (1024.0 * 1024.0 * 1024.0);
}

/// Speed rows: unpruned and per-token settings on --model, then each static checkpoint.
void measure_speed(Options const& o, std::vector<Row>& rows) {
  std::string const dir = o.model.empty() ? verify::tiny_dir("fp32") : o.model;
  std::mt19937 rng(o.seed);
  Loaded base = load(o, dir);
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_len));
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(base.cfg.vocab_size));
  auto per_token = [&](float tp) { return ExpertPruning{tp, o.min_k, true, Scope::kDecode, {}}; };
  size_t const n_token_rows = o.top_p.size() + 1;  // rows[0] = unpruned
  for (size_t i = 0; i < n_token_rows; ++i) {
    Row& r = rows[i];
    r.experts = base.cfg.n_routed_experts;
    r.top_k = base.cfg.num_experts_per_tok;
    r.expert_gib = expert_gib(base.cfg, o.dtype);
    r.load_s = base.load_s;
    throw_if_error(base.set_pruning(per_token(r.top_p)));
    base.counting(true);
    decode_ms(*base.m, prompt, std::min<int64_t>(o.steps, 8));  // untimed: kept experts, and a warm-up
    r.kept_per_row = base.rows ? static_cast<double>(base.kept) / static_cast<double>(base.rows) : 0.0;
    base.counting(false);
  }
  std::vector<std::vector<double>> ms(n_token_rows);
  for (int64_t rep = 0; rep < o.repeats; ++rep)
    for (size_t i = 0; i < n_token_rows; ++i) {
      throw_if_error(base.set_pruning(per_token(rows[i].top_p)));
      ms[i].push_back(decode_ms(*base.m, prompt, o.steps));
    }
  for (size_t i = 0; i < n_token_rows; ++i) rows[i].ms = median(ms[i]);
  base.m.reset();
  for (size_t s = 0; s < o.statics.size(); ++s) {
    Row& r = rows[n_token_rows + s];
    std::string const& sdir = o.statics[s].second;
    if (sdir.empty()) continue;
    Loaded pruned = load(o, sdir);
    r.experts = pruned.cfg.n_routed_experts;
    r.top_k = pruned.cfg.num_experts_per_tok;
    r.expert_gib = expert_gib(pruned.cfg, o.dtype);
    r.load_s = pruned.load_s;
    pruned.counting(true);
    decode_ms(*pruned.m, prompt, std::min<int64_t>(o.steps, 8));
    r.kept_per_row = pruned.rows ? static_cast<double>(pruned.kept) / static_cast<double>(pruned.rows) : 0.0;
    pruned.counting(false);
    std::vector<double> v;
    for (int64_t rep = 0; rep < o.repeats; ++rep) v.push_back(decode_ms(*pruned.m, prompt, o.steps));
    r.ms = median(v);
  }
}

/// Retention rows on golden/v41-tiny fp32 (CPU) for the same settings.
void measure_retention_rows(Options const& o, std::vector<Row>& rows) {
  auto base = load_model(verify::tiny_dir("fp32"), {}).value_or_throw();
  auto cand = load_model(verify::tiny_dir("fp32"), {}).value_or_throw();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 2; i <= 5; ++i) {
    std::vector<int32_t> p;
    for (auto x : verify::tiny_files("fp32").ints("prompt." + std::to_string(i))) p.push_back(static_cast<int32_t>(x));
    if (p.size() > 64) p.resize(64);
    prompts.push_back(std::move(p));
  }
  std::optional<RoutingStats> stats;
  for (Row& r : rows) {
    if (r.keep > 0) {
      if (!stats) stats = calibrate(*base, prompts).value_or_throw();
      auto kept = choose_kept_experts(*stats, r.keep).value_or_throw();
      throw_if_error(cand->set_pruning({1.f, 0, true, Scope::kAll, mask_from_kept(kept, base->spec().n_experts)}));
    } else {
      throw_if_error(cand->set_pruning({r.top_p, o.min_k, true, Scope::kDecode, {}}));
    }
    r.tiny = measure_retention(*base, *cand, prompts).value_or_throw();
  }
}

std::string fmt(char const* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

void print_table(Options const& o, std::vector<Row> const& rows) {
  double const base_ms = rows[0].ms.value_or(0);
  std::printf("\n| setting | routed experts (top-k) | expert weights GiB | kept per decode row | ms/token | tok/s | "
              "speed-up | tiny top-1 | tiny KL mean | p50 | p99 | max |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (Row const& r : rows) {
    std::string speed = "| – | – | – | – | – | – ";
    if (r.ms)
      speed = "| " + std::to_string(r.experts) + " (" + std::to_string(r.top_k) + ") | " + fmt("%.1f", r.expert_gib) +
              " | " + fmt("%.2f", r.kept_per_row) + " | " + fmt("%.2f", *r.ms) + " | " + fmt("%.1f", 1e3 / *r.ms) +
              " | " + fmt("%.3fx", base_ms / *r.ms) + " ";
    std::string ret = "| – | – | – | – | – |";
    if (r.tiny)
      ret = "| " + fmt("%.4f", r.tiny->agreement()) + " | " + fmt("%.3g", r.tiny->kl_mean()) + " | " +
            fmt("%.3g", r.tiny->kl_quantile(0.5)) + " | " + fmt("%.3g", r.tiny->kl_quantile(0.99)) + " | " +
            fmt("%.3g", r.tiny->kl_max()) + " |";
    std::printf("| %s %s%s\n", r.label.c_str(), speed.c_str(), ret.c_str());
  }
  std::printf("\nspeed: %s on %s (%s), prompt %lld random tokens, %lld decode steps, median of %lld; per-token rows "
              "min_k %lld, kept weights renormalised, decode scope; peak host RSS %.1f GiB\n",
              o.model.empty() ? "golden/v41-tiny/fp32" : o.model.c_str(), o.device.c_str(), o.dtype.c_str(),
              static_cast<long long>(o.prompt_len), static_cast<long long>(o.steps), static_cast<long long>(o.repeats),
              static_cast<long long>(o.min_k), peak_rss_gib());
  if (o.retention)
    std::printf("retention: golden/v41-tiny/fp32 (8 experts, top-2) on the CPU, prompts 2-5 (first 64 tokens), "
                "teacher-forced against the unpruned model\n");
}

void write_json(std::string const& path, std::vector<Row> const& rows) {
  std::ofstream f(path);
  f << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    Row const& r = rows[i];
    f << "  {\"setting\": \"" << r.label << "\", \"top_p\": " << r.top_p << ", \"keep\": " << r.keep;
    if (r.ms)
      f << ", \"experts\": " << r.experts << ", \"top_k\": " << r.top_k << ", \"expert_weights_gib\": " << r.expert_gib
        << ", \"kept_per_decode_row\": " << r.kept_per_row << ", \"ms_per_token\": " << *r.ms << ", \"load_s\": " << r.load_s;
    if (r.tiny)
      f << ", \"tiny\": {\"positions\": " << r.tiny->positions << ", \"top1_agreement\": " << r.tiny->agreement()
        << ", \"kl_mean\": " << r.tiny->kl_mean() << ", \"kl_p50\": " << r.tiny->kl_quantile(0.5)
        << ", \"kl_p99\": " << r.tiny->kl_quantile(0.99) << ", \"kl_max\": " << r.tiny->kl_max() << "}";
    f << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "]\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options const o = parse(argc, argv);
  std::vector<Row> rows;
  rows.push_back({"unpruned", 0, 1.f});
  for (float tp : o.top_p) rows.push_back({"top_p " + fmt("%.2f", tp), 0, tp});
  for (auto const& [keep, dir] : o.statics) rows.push_back({"static keep " + fmt("%.2f", keep), keep, 1.f});
  try {
    measure_speed(o, rows);
    if (o.retention) measure_retention_rows(o, rows);
  } catch (Error const& e) {
    std::fprintf(stderr, "bench_prune: %s\n", e.what());
    return 1;
  }
  print_table(o, rows);
  if (!o.json.empty()) write_json(o.json, rows);
  return 0;
}

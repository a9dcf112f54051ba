// SPDX-License-Identifier: Apache-2.0
/// `tessera plan (--model DIR | --preset v41-flash [--layers N] [--bits B]) [--tp N] [--ep M] [--nodes K]
/// [--attn allreduce|gather] [--engram sharded|replicated]`: the sharding plan (dist/plan.hpp) of a
/// DeepSeek-V4.1 model — per-rank head / group / expert / vocabulary / Engram ranges, the collectives per
/// layer, whether the plan is bit-exact against one rank — and the weight bytes each rank holds: from the
/// checkpoint's stored tensor sizes (--model), or for the released v41-flash dimensions (--preset) with
/// 2-D projections at B bits per weight (EXL3-style, default 2.8) and everything else in bf16 (Engram
/// tables fp8). Without --tp/--ep: the standard plans (1 node x 2, 4, 8 GPUs; 2 nodes x 4, 8 GPUs;
/// tp = ep = world).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "servers/cli/parallel_flags.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"

namespace tessera::cli {

namespace {

std::string human(size_t b) {
  char buf[32];
  double const x = static_cast<double>(b);
  if (x >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", x / (1024.0 * 1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.2f MiB", x / (1024.0 * 1024));
  return buf;
}

/// Prints one plan; false (after a message on stdout) when the configuration does not fit the model.
bool print_plan(model::dsv41::ModelSpec const& spec, std::vector<io::TensorInfo> const& tensors,
                dist::ParallelConfig const& c) {
  auto p = dist::make_plan(model::dsv41::model_dims(spec), c);
  if (!p) {
    std::printf("not possible: %s\n\n", p.status().message().c_str());
    return false;
  }
  std::printf("%s", p->describe().c_str());
  auto mem = model::dsv41::plan_memory(*p, spec, tensors);
  size_t total = 0;
  for (auto const& t : tensors) total += t.nbytes;
  std::printf("weights per rank (model total %s):", human(total).c_str());
  for (size_t r = 0; r < mem.size(); ++r) std::printf("%s r%zu %s", r ? "," : "", r, human(mem[r]).c_str());
  std::printf("\nlargest rank: %s of weights (KV state and activations come on top)\n\n",
              human(*std::max_element(mem.begin(), mem.end())).c_str());
  return true;
}

}  // namespace

int cmd_plan(std::vector<std::string> const& args) {
  std::vector<std::string> value_opts{"model", "preset", "layers", "bits"};
  for (auto const& n : parallel_flag_names()) value_opts.push_back(n);
  ArgParser a(args, value_opts, {"help"});
  bool const usage = !a.error().empty() || a.has("help") || !a.positionals().empty() || a.has("model") == a.has("preset");
  if (usage) {
    if (!a.error().empty()) std::fprintf(stderr, "tessera plan: %s\n", a.error().c_str());
    std::fprintf(stderr, "usage: tessera plan (--model DIR | --preset v41-flash [--layers N] [--bits 2.8]) %s\n",
                 parallel_usage());
    return a.has("help") && a.error().empty() ? 0 : 2;
  }
  auto cfg = parse_parallel_flags(a);
  if (!cfg) {
    std::fprintf(stderr, "tessera plan: %s\n", cfg.status().message().c_str());
    return 2;
  }
  model::dsv41::Config conf;
  std::vector<io::TensorInfo> tensors;
  if (a.has("model")) {
    std::string const dir = *a.get("model");
    auto c = model::dsv41::load_config(dir);
    auto ckpt = c ? io::Checkpoint::open(dir) : Result<io::Checkpoint>(c.status());
    if (!ckpt) {
      std::fprintf(stderr, "tessera plan: --model %s: %s\n", dir.c_str(), ckpt.status().message().c_str());
      return 2;
    }
    conf = *c;
    tensors = ckpt->tensors();
  } else {
    std::string const preset = *a.get("preset");
    if (preset != "v41-flash") {
      std::fprintf(stderr, "tessera plan: --preset %s: only v41-flash (the released dimensions)\n", preset.c_str());
      return 2;
    }
    model::dsv41::Config const rel = model::dsv41::released_config();
    long layers = std::strtol(a.get_or("layers", std::to_string(rel.num_hidden_layers)).c_str(), nullptr, 10);
    double bits = std::strtod(a.get_or("bits", "2.8").c_str(), nullptr);
    if (!(bits > 0 && bits <= 32)) {
      std::fprintf(stderr, "tessera plan: --bits %s: expected a number in (0, 32]\n", a.get_or("bits", "").c_str());
      return 2;
    }
    int64_t rows = 0;
    for (int64_t x : rel.engram_num_embeddings) rows = std::max(rows, x);
    auto c = model::dsv41::synthetic_config("v41-flash", rel.vocab_size, layers, rows);
    if (!c) {
      std::fprintf(stderr, "tessera plan: --preset v41-flash: %s\n", c.status().message().c_str());
      return 2;
    }
    conf = *c;
    using Role = model::dsv41::TensorSpec::Role;
    for (auto const& t : model::dsv41::checkpoint_plan(conf)) {
      double n = 1;
      for (int64_t d : t.shape) n *= static_cast<double>(d);
      double const per = t.role == Role::kLinear || t.role == Role::kExpertLinear ? bits / 8
                         : t.role == Role::kEngramTable                           ? 1.0
                         : t.fp32_island                                          ? 4.0
                                                                                  : 2.0;
      io::TensorInfo ti;
      ti.name = t.name;
      ti.shape = t.shape;
      ti.nbytes = static_cast<size_t>(n * per);
      tensors.push_back(ti);
    }
    std::printf("v41-flash dimensions, %ld layers, 2-D projections at %.2f bits per weight\n\n", layers, bits);
  }
  auto spec = model::dsv41::spec_from_config(conf);
  if (!spec) {
    std::fprintf(stderr, "tessera plan: %s\n", spec.status().message().c_str());
    return 2;
  }
  if (a.has("tp") || a.has("ep")) return print_plan(*spec, tensors, *cfg) ? 0 : 2;
  for (auto [nodes, world] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{1, 4}, std::pair{1, 8}, std::pair{2, 8},
                              std::pair{2, 16}}) {
    dist::ParallelConfig c = *cfg;
    c.tp = c.ep = world;
    c.nodes = nodes;
    std::printf("== %d node(s) x %d GPU(s) ==\n", nodes, world / nodes);
    print_plan(*spec, tensors, c);
  }
  return 0;
}

}  // namespace tessera::cli

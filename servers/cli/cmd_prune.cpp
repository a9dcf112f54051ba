// SPDX-License-Identifier: Apache-2.0
/// Expert-pruning commands (spec/seed-notes.md §5, docs/pruning.md):
///   tessera calibrate --model DIR --prompts FILE --out stats.json
///   tessera prune --model DIR --stats stats.json --keep 0.75 --out DIR2
///   tessera verify retention --base DIR (--candidate DIR2 | --prune-top-p P ...) --prompts FILE [--json F] [--png F]
/// Prompts FILE: JSON lines, each [ids...], {"ids": [...]} or {"text": "..."} (text needs tokenizer.json
/// in the model folder).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "servers/cli/command.hpp"
#include "servers/cli/prune_flags.hpp"
#include "tessera/models/common/tokenizer.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/pruning.hpp"

namespace tessera::cli {

Result<model::dsv41::Numerics> numerics_for(std::string const& dir, std::string const& flag);

namespace {

using namespace tessera::model::dsv41;

Result<std::vector<std::vector<int32_t>>> prompts_for(std::string const& dir, std::string const& file) {
  std::filesystem::path tok = std::filesystem::path(dir) / "tokenizer.json";
  std::function<Result<std::vector<int32_t>>(std::string const&)> fn;
  if (std::filesystem::exists(tok)) {
    fn = [tok](std::string const& text) -> Result<std::vector<int32_t>> {
      static std::optional<models::Tokenizer> t;
      if (!t) {
        auto r = models::Tokenizer::from_file(tok.string());
        if (!r) return r.status();
        t = std::move(*r);
      }
      auto ids = t->encode(text);
      if (!ids) return ids.status();
      return std::vector<int32_t>(ids->begin(), ids->end());
    };
  }
  return read_prompts(file, fn);
}

Result<std::unique_ptr<Dsv41Model>> load(std::string const& dir, ExpertPruning prune = {}) {
  auto num = numerics_for(dir, "");
  if (!num) return num.status();
  ModelOptions o;
  o.numerics = *num;
  o.prune = std::move(prune);
  return load_model(dir, o);
}

int fail(char const* cmd, Status const& s) {
  std::fprintf(stderr, "tessera %s: %s\n", cmd, s.message().c_str());
  return 1;
}

Status write_text(std::string const& path, std::string const& text) {
  std::ofstream f(path);
  f << text;
  return f ? Status{} : invalid_argument("cannot write " + path);
}

}  // namespace

int cmd_calibrate(std::vector<std::string> const& args) {
  ArgParser p(args, {"model", "prompts", "out"});
  if (!p.error().empty() || !p.has("model") || !p.has("prompts") || !p.has("out")) {
    std::fprintf(stderr, "usage: tessera calibrate --model DIR --prompts FILE --out stats.json\n%s\n", p.error().c_str());
    return 2;
  }
  auto prompts = prompts_for(*p.get("model"), *p.get("prompts"));
  if (!prompts) return fail("calibrate", prompts.status());
  auto m = load(*p.get("model"));
  if (!m) return fail("calibrate", m.status());
  auto st = calibrate(**m, *prompts);
  if (!st) return fail("calibrate", st.status());
  if (auto s = write_text(*p.get("out"), st->to_json()); !s.ok()) return fail("calibrate", s);
  std::printf("%lld prompts, %lld tokens, %lld layers x %lld experts -> %s\n", static_cast<long long>(prompts->size()),
              static_cast<long long>(st->tokens), static_cast<long long>(st->layers), static_cast<long long>(st->experts),
              p.get("out")->c_str());
  return 0;
}

int cmd_prune(std::vector<std::string> const& args) {
  ArgParser p(args, {"model", "stats", "keep", "out"});
  if (!p.error().empty() || !p.has("model") || !p.has("stats") || !p.has("out")) {
    std::fprintf(stderr, "usage: tessera prune --model DIR --stats stats.json [--keep 0.75] --out DIR2\n%s\n",
                 p.error().c_str());
    return 2;
  }
  std::ifstream f(*p.get("stats"));
  if (!f) return fail("prune", not_found("--stats " + *p.get("stats") + " cannot be opened"));
  std::stringstream ss;
  ss << f.rdbuf();
  auto st = RoutingStats::from_json(ss.str());
  if (!st) return fail("prune", st.status());
  auto cfg = load_config(*p.get("model"));
  if (!cfg) return fail("prune", cfg.status());
  if (cfg->num_hidden_layers != st->layers || cfg->n_routed_experts != st->experts)
    return fail("prune", invalid_argument("--stats describe " + std::to_string(st->layers) + " layers x " +
                                          std::to_string(st->experts) + " experts, the model " +
                                          std::to_string(cfg->num_hidden_layers) + " x " +
                                          std::to_string(cfg->n_routed_experts)));
  char* end = nullptr;
  std::string keep_s = p.get_or("keep", "0.75");
  double keep = std::strtod(keep_s.c_str(), &end);
  if (keep_s.empty() || *end) return fail("prune", invalid_argument("--keep " + keep_s + " is not a number"));
  auto kept = choose_kept_experts(*st, keep);
  if (!kept) return fail("prune", kept.status());
  if (auto s = write_pruned_checkpoint(*p.get("model"), *kept, *p.get("out")); !s.ok()) return fail("prune", s);
  std::printf("kept %zu of %lld experts per layer -> %s\n", (*kept)[0].size(), static_cast<long long>(st->experts),
              p.get("out")->c_str());
  return 0;
}

int cmd_verify_retention(std::vector<std::string> const& args) {
  std::vector<std::string> opts{"base", "candidate", "prompts", "json", "png"};
  for (auto const& n : prune_flag_names()) opts.push_back(n);
  ArgParser p(args, opts);
  bool cand_dir = p.has("candidate"), flags = has_prune_flags(p);
  if (!p.error().empty() || !p.has("base") || !p.has("prompts") || cand_dir == flags) {
    std::fprintf(stderr,
                 "usage: tessera verify retention --base DIR (--candidate DIR2 | --prune-top-p P [--prune-min-k K]\n"
                 "         [--prune-renorm kept|orig] [--prune-scope decode|all]) --prompts FILE [--json F] [--png F]\n%s\n",
                 p.error().c_str());
    return 2;
  }
  auto prune = parse_prune_flags(p);
  if (!prune) return fail("verify retention", prune.status());
  auto prompts = prompts_for(*p.get("base"), *p.get("prompts"));
  if (!prompts) return fail("verify retention", prompts.status());
  auto base = load(*p.get("base"));
  if (!base) return fail("verify retention", base.status());
  auto cand = cand_dir ? load(*p.get("candidate")) : load(*p.get("base"), *prune);
  if (!cand) return fail("verify retention", cand.status());
  // A pruned checkpoint's pruning.json maps its expert ids back to the base's.
  std::vector<std::vector<int32_t>> map;
  if (cand_dir) {
    std::ifstream pj(std::filesystem::path(*p.get("candidate")) / "pruning.json");
    if (pj) {
      std::stringstream ss;
      ss << pj.rdbuf();
      boost::system::error_code ec;
      auto v = boost::json::parse(ss.str(), ec);
      if (!ec && v.is_object() && v.as_object().contains("kept_experts"))
        for (auto const& row : v.at("kept_experts").as_array()) {
          map.emplace_back();
          for (auto const& e : row.as_array()) map.back().push_back(static_cast<int32_t>(e.to_number<int64_t>()));
        }
    }
  }
  auto r = measure_retention(**base, **cand, *prompts, map);
  if (!r) return fail("verify retention", r.status());
  std::printf("%s", r->to_text().c_str());
  if (auto j = p.get("json"))
    if (auto s = write_text(*j, r->to_json()); !s.ok()) return fail("verify retention", s);
  if (auto g = p.get("png"))
    if (auto s = write_plot_png(*g, r->kl); !s.ok()) return fail("verify retention", s);
  return 0;
}

}  // namespace tessera::cli

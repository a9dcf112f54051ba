// SPDX-License-Identifier: Apache-2.0
/// The expert-pruning load options shared by `generate`, `serve` and `verify retention`
/// (spec/seed-notes.md §5; a lossy lever, off unless a flag is given):
/// --prune-top-p P (0 < P ≤ 1), --prune-min-k K (≥ 0), --prune-renorm kept|orig, --prune-scope decode|all.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::cli {

inline std::vector<std::string> prune_flag_names() { return {"prune-top-p", "prune-min-k", "prune-renorm", "prune-scope"}; }
inline char const* prune_usage() {
  return "[--prune-top-p P] [--prune-min-k K] [--prune-renorm kept|orig] [--prune-scope decode|all]";
}
inline bool has_prune_flags(ArgParser const& a) {
  for (auto const& n : prune_flag_names())
    if (a.has(n)) return true;
  return false;
}

/// The pruning options the flags ask for (defaults = off); names the bad flag.
inline Result<model::dsv41::ExpertPruning> parse_prune_flags(ArgParser const& a) {
  model::dsv41::ExpertPruning p;
  if (auto v = a.get("prune-top-p")) {
    char* end = nullptr;
    double d = std::strtod(v->c_str(), &end);
    if (v->empty() || *end || !(d > 0.0 && d <= 1.0)) return invalid_argument("--prune-top-p " + *v + ": expected 0 < P <= 1");
    p.top_p = static_cast<float>(d);
  }
  if (auto v = a.get("prune-min-k")) {
    char* end = nullptr;
    long k = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end || k < 0 || k > 4096) return invalid_argument("--prune-min-k " + *v + ": expected an integer >= 0");
    p.min_k = k;
  }
  if (auto v = a.get("prune-renorm")) {
    if (*v != "kept" && *v != "orig") return invalid_argument("--prune-renorm " + *v + ": expected kept or orig");
    p.renorm = *v == "kept";
  }
  if (auto v = a.get("prune-scope")) {
    if (*v != "decode" && *v != "all") return invalid_argument("--prune-scope " + *v + ": expected decode or all");
    p.scope = *v == "all" ? model::dsv41::ExpertPruning::Scope::kAll : model::dsv41::ExpertPruning::Scope::kDecode;
  }
  return p;
}

}  // namespace tessera::cli

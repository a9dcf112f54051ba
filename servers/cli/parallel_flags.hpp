// SPDX-License-Identifier: Apache-2.0
/// The tensor/expert-parallel flags shared by `tessera plan` and `tessera serve` (dist/plan.hpp):
/// --tp N, --ep M (each 1 or the world size max(N, M)), --nodes K, --attn allreduce|gather,
/// --engram sharded|replicated.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "tessera/dist/plan.hpp"

namespace tessera::cli {

inline std::vector<std::string> parallel_flag_names() { return {"tp", "ep", "nodes", "attn", "engram"}; }
inline char const* parallel_usage() {
  return "[--tp N] [--ep M] [--nodes K] [--attn allreduce|gather] [--engram sharded|replicated]";
}
inline bool has_parallel_flags(ArgParser const& a) {
  for (auto const& n : parallel_flag_names())
    if (a.has(n)) return true;
  return false;
}

inline Result<dist::ParallelConfig> parse_parallel_flags(ArgParser const& a) {
  dist::ParallelConfig c;
  for (auto [name, dst] : {std::pair{"tp", &c.tp}, std::pair{"ep", &c.ep}, std::pair{"nodes", &c.nodes}}) {
    auto v = a.get(name);
    if (!v) continue;
    char* end = nullptr;
    long x = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end || x < 1 || x > 4096)
      return invalid_argument(std::string("--") + name + " " + *v + ": expected an integer in [1, 4096]");
    *dst = static_cast<int>(x);
  }
  std::string attn = a.get_or("attn", "gather");
  if (attn == "allreduce") c.attn = dist::AttnCombine::kAllReduce;
  else if (attn == "gather") c.attn = dist::AttnCombine::kGather;
  else return invalid_argument("--attn " + attn + ": expected allreduce or gather");
  std::string eng = a.get_or("engram", "sharded");
  if (eng == "sharded") c.engram = dist::EngramPlacement::kSharded;
  else if (eng == "replicated") c.engram = dist::EngramPlacement::kReplicated;
  else return invalid_argument("--engram " + eng + ": expected sharded or replicated");
  return c;
}

}  // namespace tessera::cli

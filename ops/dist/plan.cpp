// SPDX-License-Identifier: Apache-2.0
/// Sharding plans (include/tessera/dist/plan.hpp): range arithmetic and validation.
#include "tessera/dist/plan.hpp"

#include <algorithm>
#include <sstream>

namespace tessera::dist {

Range split_range(int64_t n, int parts, int i) {
  int64_t base = n / parts, extra = n % parts;
  int64_t b = i * base + std::min<int64_t>(i, extra);
  return {b, b + base + (i < extra ? 1 : 0)};
}

Result<ShardingPlan> make_plan(ModelDims const& d, ParallelConfig const& cfg) {
  if (cfg.tp < 1 || cfg.ep < 1 || cfg.nodes < 1) return invalid_argument("plan: tp, ep and nodes must be >= 1");
  int const world = std::max(cfg.tp, cfg.ep);
  if ((cfg.tp != 1 && cfg.tp != world) || (cfg.ep != 1 && cfg.ep != world))
    return invalid_argument("plan: tp " + std::to_string(cfg.tp) + " and ep " + std::to_string(cfg.ep) +
                            " must each be 1 or the world size (one group of ranks for both)");
  if (world % cfg.nodes != 0)
    return invalid_argument("plan: " + std::to_string(cfg.nodes) + " nodes do not divide " + std::to_string(world) + " ranks");
  int const tp = cfg.tp;
  if (d.heads % tp != 0)
    return invalid_argument("plan: tp " + std::to_string(tp) + " does not divide num_attention_heads " + std::to_string(d.heads));
  if (d.o_groups < 1 || d.heads % d.o_groups != 0)
    return invalid_argument("plan: o_groups " + std::to_string(d.o_groups) + " does not divide the heads");
  bool const gather_heads = d.o_groups % tp != 0;
  if (gather_heads && tp % d.o_groups != 0)
    return invalid_argument("plan: tp " + std::to_string(tp) + " neither divides nor is a multiple of o_groups " +
                            std::to_string(d.o_groups));
  if (cfg.ep > d.experts)
    return invalid_argument("plan: ep " + std::to_string(cfg.ep) + " exceeds n_routed_experts " + std::to_string(d.experts));
  ShardingPlan p;
  p.cfg = cfg;
  p.dims = d;
  p.world = world;
  int const per_node = world / cfg.nodes;
  for (int r = 0; r < world; ++r) {
    RankPlan rp;
    rp.rank = r;
    rp.node = r / per_node;
    rp.local_rank = r % per_node;
    int const t = tp == 1 ? 0 : r;
    rp.heads = split_range(d.heads, tp, t);
    rp.gather_heads = gather_heads;
    rp.groups = gather_heads ? Range{0, d.o_groups} : split_range(d.o_groups, tp, t);
    bool const gather_out = gather_heads || cfg.attn == AttnCombine::kGather;
    rp.wo_b_rows = gather_out ? split_range(d.hidden, tp, t) : Range{0, d.hidden};
    rp.experts = split_range(d.experts, cfg.ep, cfg.ep == 1 ? 0 : r);
    rp.shared_inter = split_range(d.moe_inter, tp, t);
    rp.shared_rows = split_range(d.hidden, tp, t);
    rp.vocab = split_range(d.vocab, tp, t);
    rp.engram_cols = cfg.engram == EngramPlacement::kSharded ? split_range(d.engram_columns, world, r)
                                                             : Range{0, d.engram_columns};
    p.ranks.push_back(rp);
  }
  return p;
}

bool ShardingPlan::bit_exact() const {
  return cfg.tp == 1 || ranks[0].gather_heads || cfg.attn == AttnCombine::kGather;
}

std::string ShardingPlan::attention_mode() const {
  if (cfg.tp == 1) return "replicated";
  if (ranks[0].gather_heads) return "heads split, head outputs all-gathered, wo_a replicated, wo_b rows split + all-gather (exact)";
  if (cfg.attn == AttnCombine::kGather) return "heads/groups split, wo_a outputs all-gathered, wo_b rows split + all-gather (exact)";
  return "heads/groups split, wo_b columns split + all-reduce (rank-order sum; not bit-exact)";
}

std::string ShardingPlan::describe() const {
  std::ostringstream o;
  auto rs = [](Range r) { return "[" + std::to_string(r.begin) + "," + std::to_string(r.end) + ")"; };
  o << "world " << world << " = " << cfg.nodes << " node(s) x " << world / cfg.nodes << " GPU(s); tp " << cfg.tp << ", ep "
    << cfg.ep << "; Engram " << (cfg.engram == EngramPlacement::kSharded ? "sharded by hash column" : "replicated") << "\n";
  o << "attention: " << attention_mode() << "\n";
  o << "bit-exact against one rank: " << (bit_exact() ? "yes" : "no (attention all-reduce order; docs/multi-gpu.md bound)") << "\n";
  o << "rank node heads    groups  wo_b_rows  experts    shared_inter shared_rows vocab          engram_cols\n";
  for (auto const& r : ranks) {
    char line[256];
    std::snprintf(line, sizeof line, "%4d %4d %-8s %-7s %-10s %-10s %-12s %-11s %-14s %s\n", r.rank, r.node, rs(r.heads).c_str(),
                  rs(r.groups).c_str(), rs(r.wo_b_rows).c_str(), rs(r.experts).c_str(), rs(r.shared_inter).c_str(),
                  rs(r.shared_rows).c_str(), rs(r.vocab).c_str(), rs(r.engram_cols).c_str());
    o << line;
  }
  o << "collectives per layer: ";
  if (cfg.tp > 1) {
    o << (bit_exact() ? "attention 2 all-gathers" : "attention 1 all-reduce") << ", shared expert 2 all-gathers, ";
  }
  if (cfg.ep > 1) o << "routed experts 1 all-gatherv, ";
  if (cfg.engram == EngramPlacement::kSharded && world > 1 && dims.engram_columns > 0) o << "Engram layers 1 all-gatherv, ";
  o << "per forward: " << (cfg.tp > 1 ? "LM head 1 all-gatherv" : "none") << "\n";
  return o.str();
}

}  // namespace tessera::dist

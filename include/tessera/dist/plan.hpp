// SPDX-License-Identifier: Apache-2.0
/// Sharding plans for tensor parallel (TP) attention / shared expert / LM head and expert parallel (EP)
/// routed experts over one group of `world` ranks (docs/multi-gpu.md). Tokens, the mHC streams, the
/// router and all KV / compressor / indexer state are replicated on every rank (the KV path has one
/// head: splitting it would only add traffic); what is split:
///  * attention (TP): query heads [h0, h1) per rank (wq_b rows, attn_sink). When tp divides o_groups,
///    the rank owns whole groups [g0, g1) (wo_a) and either
///      kAllReduce: wo_b columns of its groups, partial sums all-reduced (rank order; not bit-exact), or
///      kGather:    the groups' wo_a outputs all-gathered, wo_b rows [d0, d1) of the output, all-gathered
///                  (bit-exact: every output element is one full dot product in the single-rank order);
///    when o_groups < tp (tp a multiple of o_groups), the heads' outputs are all-gathered and wo_a is
///    replicated, then wo_b rows [d0, d1) as in kGather (bit-exact).
///  * routed experts (EP): experts [e0, e1) per rank; routing is replicated, each rank runs its experts
///    on the (token, slot) pairs routed to them, the outputs are all-gathered (variable sizes) and every
///    rank sums them in ascending expert id from zero, as one rank does (bit-exact).
///  * shared expert (TP): w1/w3 rows [i0, i1) → the activations all-gathered → w2 rows [d0, d1) →
///    all-gathered (bit-exact; two gathers instead of one all-reduce).
///  * LM head (TP): vocabulary rows [v0, v1), logits all-gathered (bit-exact).
///  * Engram tables: replicated, or sharded by contiguous hash-column ranges [c0, c1) of every Engram layer
///    (the reference shard format's hash-head ranges); rows gathered, then all-gathered (bit-exact).
/// tp and ep are each 1 or the world size (world = max(tp, ep)); nodes divide the world, ranks
/// node-major (rank = node · per_node + local_rank).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/status.hpp"

namespace tessera::dist {

/// The model dimensions a plan needs.
struct ModelDims {
  int64_t hidden = 0, heads = 0, head_dim = 0, o_groups = 1, o_lora_rank = 0;
  int64_t experts = 0, moe_inter = 0, vocab = 0, layers = 0;
  int64_t engram_columns = 0;  // hash columns per Engram layer ((N−1)·heads); 0 = no Engram
  bool operator==(ModelDims const&) const = default;
};

enum class AttnCombine : uint8_t { kAllReduce, kGather };
enum class EngramPlacement : uint8_t { kReplicated, kSharded };

struct ParallelConfig {
  int tp = 1, ep = 1, nodes = 1;
  AttnCombine attn = AttnCombine::kGather;  // exact by default; kAllReduce moves less data
  EngramPlacement engram = EngramPlacement::kSharded;
};

/// [begin, end)
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return i >= begin && i < end; }
  friend bool operator==(Range const&, Range const&) = default;
};

/// Part i of n split into `parts` contiguous ranges, the first n mod parts one longer.
Range split_range(int64_t n, int parts, int i);

struct RankPlan {
  int rank = 0, node = 0, local_rank = 0;
  Range heads;             // query heads
  Range groups;            // o-groups whose wo_a this rank applies (all of them when gather_heads)
  bool gather_heads = false;  // o_groups < tp: head outputs all-gathered, wo_a replicated
  Range wo_b_rows;         // output rows of wo_b (gather modes); all rows under kAllReduce
  Range experts;           // routed experts held
  Range shared_inter;      // shared expert w1/w3 rows
  Range shared_rows;       // shared expert w2 rows (outputs)
  Range vocab;             // LM head rows
  Range engram_cols;       // Engram hash columns of every Engram layer held
};

struct ShardingPlan {
  ParallelConfig cfg;
  ModelDims dims;
  int world = 1;
  std::vector<RankPlan> ranks;
  /// True when every collective is a gather: results equal single-rank bits.
  bool bit_exact() const;
  /// The attention combine in words (for plan output and docs).
  std::string attention_mode() const;
  /// A table of the per-rank ranges and the collectives per layer.
  std::string describe() const;
};

/// Validates the configuration against the dimensions; errors name the field.
Result<ShardingPlan> make_plan(ModelDims const& dims, ParallelConfig const& cfg);

}  // namespace tessera::dist

// SPDX-License-Identifier: Apache-2.0
/// Internals of the byte-level pushdown automaton behind tessera/models/common/grammar.hpp: grammar
/// nodes, stack frames, the byte step function, the vocabulary trie and the mask caches.
#pragma once

#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/models/common/grammar.hpp"

namespace tessera::model::grammar_detail {

enum class NodeKind : uint8_t {
  kLiteral,  // exact bytes `lit`
  kSeq,      // children in order
  kAlt,      // one of children (forks stacks)
  kRepeat,   // child `item` repeated [min, max] times, elements self-delimiting
  kWs,       // 0..max_ws JSON whitespace bytes
  kFreeText,  // UTF-8 text with ≤ max chars, ≥ min chars, no `forbidden`, ended by `lit` (consumed)
  kString,      // JSON string "…" with [min, max] characters
  kNumber,      // JSON number; integer-only and/or bounded (units of 10^-frac_cap)
  kObject,      // JSON object: declared keys (JSON-escaped) or free keys (`item` = value node)
  kArray,       // JSON array of `item`, [min, max] elements
  kDsmlParams,  // DSML parameter list of a tool call (raw keys; `children` JSON values, `raw` raw
                // values)
  kLiteralSet,  // one of several byte strings (enum, const, booleans) as a byte trie; a string that
                // is a prefix of another ends on the first byte that cannot continue it
};

inline constexpr int32_t kNone = -1;

/// Helper nodes of a kDsmlParams node, in Node::helpers order.
enum DsmlHelper : int {
  kParamOpen,    // `<｜DSML｜ parameter name="`
  kStringTrue,   // ` string="true">`
  kStringFalse,  // ` string="false">`
  kParamClose,   // `</｜DSML｜ parameter>\n` (after a JSON value)
  kNewline,      // `\n` (the zero-parameter invoke)
  kFreeKey,      // raw key text ended by `"` (tools without declared properties), or kNone
  kFreeJson,     // JSON value of a free key
  kFreeRaw,      // raw value of a free key
  kNumDsmlHelpers
};
inline constexpr int64_t kUnbounded = INT64_MAX;
inline constexpr int64_t kInfBytes = int64_t{1} << 40;

struct Node {
  NodeKind kind = NodeKind::kLiteral;
  std::string lit;                // kLiteral bytes; kFreeText terminator
  std::vector<int32_t> children;  // kSeq / kAlt; kObject & kDsmlParams: value node per key
  std::vector<int32_t>
      raw;  // kDsmlParams: raw (string="true") value node per key, kNone = not allowed
  std::vector<std::string> keys;       // kObject (escaped, no quotes) / kDsmlParams (raw)
  std::vector<std::string> forbidden;  // kFreeText
  std::vector<int32_t> helpers;        // kObject: {free-key string}; kDsmlParams: see DsmlHelper
  uint64_t required = 0;               // kObject / kDsmlParams: bit per key
  int32_t item = kNone;  // kRepeat / kArray element; kObject free-key value; kDsmlParams free keys
  int64_t min = 0, max = kUnbounded;  // counts (repeat, items, chars)
  // kNumber
  bool integer = false, bounded = false;
  int64_t lo_units = 0, hi_units = 0;  // inclusive bounds in units of 10^-frac_cap
  int32_t frac_cap = 20, int_cap = 20;
  // kLiteralSet: trie node t has edges lt_edges[lt_begin[t] .. lt_begin[t+1]) sorted by byte
  std::vector<uint32_t> lt_begin;
  std::vector<std::pair<uint8_t, uint32_t>> lt_edges;
  std::vector<uint8_t> lt_terminal;
  // analysis
  int32_t min_frames = 0;  // smallest stack height this node needs to finish (∞ = INT32_MAX)
  bool nullable = false;
  int64_t min_bytes = 0;   // fewest bytes of a complete value (ignoring max_depth; saturates at kInfBytes)
};

/// One open node. 32 bytes, no padding, compared and hashed as raw bytes.
struct Frame {
  uint32_t node;
  uint8_t phase;
  uint8_t ws;      // whitespace bytes in the current gap
  uint16_t aux;    // literal / key offset; UTF-8 and escape state
  uint32_t count;  // chars, items, digits, repetitions
  uint32_t extra;  // number: sign + fraction digits; DSML: key index
  uint64_t m1;     // seen-key mask; number magnitude (units); free-text pattern offsets
  uint64_t m2;     // candidate-key mask / current key bit
};
static_assert(sizeof(Frame) == 32);

inline Frame make_frame(int32_t node) {
  Frame f;
  std::memset(&f, 0, sizeof f);
  f.node = static_cast<uint32_t>(node);
  return f;
}

using Stack = std::vector<Frame>;

/// A set of stacks, stored flat: stack i = frames[off[i] .. off[i+1]).
struct StateSet {
  std::vector<Frame> frames;
  std::vector<uint32_t> off{0};
  size_t size() const { return off.size() - 1; }
  bool empty() const { return size() == 0; }
  void clear() {
    frames.clear();
    off.assign(1, 0);
  }
  void add(Frame const* f, size_t n);
  std::string key() const;  // serialized, for caches
};

struct GrammarDef {
  std::vector<Node> nodes;
  int32_t root = kNone;
  int max_depth = 40;
  int max_ws = 2;
  /// KMP failure tables per kFreeText node: [terminator, forbidden...] patterns.
  std::vector<std::vector<std::vector<uint16_t>>> kmp;

  int32_t add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int32_t>(nodes.size() - 1);
  }
  int32_t literal(std::string s) {
    Node n;
    n.kind = NodeKind::kLiteral;
    n.lit = std::move(s);
    return add(std::move(n));
  }
  int32_t seq(std::vector<int32_t> c) {
    Node n;
    n.kind = NodeKind::kSeq;
    n.children = std::move(c);
    return add(std::move(n));
  }
  int32_t alt(std::vector<int32_t> c) {
    Node n;
    n.kind = NodeKind::kAlt;
    n.children = std::move(c);
    return add(std::move(n));
  }
  /// One of `values` (deduplicated; a single value becomes a plain literal).
  int32_t literal_set(std::vector<std::string> values);
  /// Fills min_frames, nullable and KMP tables; fails if the root cannot finish within max_depth.
  Status finalize();
};

/// Feeds byte b to every stack of `in`, writing the surviving (deduplicated) stacks to `out`.
void step_set(GrammarDef const& g, StateSet const& in, uint8_t b, StateSet& out);
/// The start state (one stack holding the root frame).
StateSet initial_state(GrammarDef const& g);
/// True if some stack can end here.
bool can_finish(GrammarDef const& g, StateSet const& s);
/// A lower bound on the bytes that still have to follow before some stack of `s` can end (the
/// heuristic of GrammarMatcher::shortest_completion's A* search); kInfBytes when none can
/// (completion.cpp).
int64_t completion_bytes_lower_bound(GrammarDef const& g, StateSet const& s);
/// Fills Node::min_bytes of every node (a fixpoint; called by GrammarDef::finalize).
void compute_min_bytes(GrammarDef& g);

/// Leaf frames (kString, kFreeText) step without looking below the top: 0 = consumed, 1 = consumed
/// and finished, −1 = rejected.
bool is_leaf(NodeKind k);
int step_leaf(GrammarDef const& g, Frame& f, uint8_t b);
/// Leaf and number steps (leaves.cpp): 0 consumed, 1 consumed and finished, 2 finished before b
/// (numbers end on the first byte that cannot continue them), −1 rejected.
int leaf_number_step(Node const& n, Frame& f, uint8_t b);
bool leaf_number_accepting(Node const& n, Frame const& f);
int leaf_string_step(GrammarDef const& g, Node const& n, Frame& f, uint8_t b);
int leaf_text_step(GrammarDef const& g, Node const& n, Frame& f, uint8_t b);
/// The same step with the node's fields given explicitly (count-free leaf tables use an unbounded
/// copy).
int step_leaf_as(GrammarDef const& g, Node const& n, Frame& f, uint8_t b);
/// Pops the finished top frame of a stack and notifies the frames below (a leaf just finished).
void finish_top(GrammarDef const& g, Stack& s);

/// Byte trie of the vocabulary in DFS preorder: node i has byte[i] at depth[i] (1-based), its
/// subtree is [i, end[i]), and tokens tok[tok_off[i] .. tok_off[i+1]) end exactly at it.
struct Trie {
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<uint32_t> end;
  std::vector<uint32_t> tok_off;
  std::vector<int32_t> tok;
  size_t num_nodes() const { return byte.size(); }
};

/// Per-grammar caches: full state → mask, and leaf top frame → (inside mask, exit trie nodes).
struct LeafEntry {
  std::vector<uint32_t> inside;  // tokens that stay inside the leaf
  std::vector<uint32_t> exits;   // trie nodes at which the leaf finishes
  // Count-free entries of length-bounded JSON strings: characters each inside token adds (sorted by
  // characters, descending) and characters before each exit; the live count filters them per step.
  bool counted = false;
  std::vector<std::pair<uint32_t, int32_t>> inside_chars;
  std::vector<uint32_t> exit_chars;
};
/// Bounded by bytes: when full it is emptied (entries are cheap to recompute relative to a miss).
struct MaskCache {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<std::vector<uint32_t> const>> full;
  size_t bytes = 0;
  static constexpr size_t kMaxBytes = size_t{16} << 20;  // ~1000 masks of a 129k vocabulary
};
/// Leaf entries live with the vocabulary, keyed by the leaf's signature (kind, bounds, terminator,
/// forbidden strings, frame state without the node id), so every grammar on that vocabulary shares
/// them.
struct LeafCache {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<LeafEntry const>> map;
  size_t bytes = 0;
  static constexpr size_t kMaxBytes = size_t{128} << 20;  // counted entries hold ~1 MiB of counts
};

/// Wraps a finalized definition into a Grammar with empty caches.
Result<std::shared_ptr<Grammar const>> make_grammar(std::unique_ptr<GrammarDef> def,
                                                    std::shared_ptr<GrammarVocabulary const> vocab);

/// Computes the mask of `s` (EOS bits included), using and filling the caches.
void compute_mask(Grammar const& g, StateSet const& s, uint32_t* words);

}  // namespace tessera::model::grammar_detail

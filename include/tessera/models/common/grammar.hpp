// SPDX-License-Identifier: Apache-2.0
/// Grammar-constrained decoding: JSON schemas (OpenAI `response_format`), `json_object` mode and
/// DSML tool calls (`tool_choice` required / named, spec/chat-format.md §2.1, §3.1) compiled into a
/// pushdown automaton over **bytes**; per-step token masks come from a walk of the byte trie of the
/// vocabulary.
///
/// Model: a state is a set of stacks of frames (one frame per open grammar node: object, array,
/// string, number, literal, sequence, DSML parameter list, free text); anyOf/enum fork stacks, dead
/// stacks are dropped, identical stacks merged. A token is allowed iff feeding its bytes leaves
/// some stack alive. EOS ids are allowed iff the state is complete (the grammar accepts the bytes
/// so far).
///
/// Whitespace policy: between JSON tokens (after `{`, `[`, `:`, `,`, before `}`/`]`/`:`/`,`), and
/// before and after the top-level value, at most `max_whitespace` bytes of JSON whitespace (space,
/// \n, \r, \t) per gap; 0 = compact JSON only. Bounding each gap means the automaton cannot loop on
/// whitespace. Nesting is bounded by `max_depth` frames; a value is only started when it can be
/// finished within the bound, so the constraint never dead-ends.
///
/// Cost: masks are cached per state (the serialized stack set) and, for a single stack whose top is
/// a string / free text, per top frame ("inside the string" tokens are context-independent; only
/// tokens that close it are re-checked against the stack below).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/fwd.hpp>

#include "tessera/core/status.hpp"

namespace tessera::model {

namespace grammar_detail {
struct Trie;
struct GrammarDef;
struct MaskCache;
struct LeafCache;
}  // namespace grammar_detail

/// Token id → raw bytes, as a byte trie. Built once per tokenizer and shared by every grammar.
///
/// No dead states: the automaton only keeps stacks that can still finish (and starts nested values only
/// when they fit under max_depth), so every live state that is not complete has a next byte; `build`
/// requires a single-byte token for every byte UTF-8 text can contain and at least one EOS id, so a
/// mask is never empty: an incomplete state allows at least the single-byte token of some next byte,
/// a complete one allows EOS.
class GrammarVocabulary {
 public:
  /// Fails (kInvalidArgument) without an EOS id or without a single-byte token for some byte that
  /// needs_single_byte_token() names.
  /// \param token_bytes raw bytes of each id (the ByteLevel decoding); empty = never allowed
  /// \param eos_ids     stop tokens (at least one): allowed only when the grammar is complete
  /// \param excluded_ids ids never allowed as bytes (BOS, pad, role and other special tokens whose
  /// text
  ///                    must not appear inside constrained output). EOS ids are excluded
  ///                    implicitly.
  static Result<std::shared_ptr<GrammarVocabulary const>> build(
      std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids,
      std::vector<int32_t> excluded_ids = {});
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  /// Words of a token bitmask: ceil(size / 32); bit (id mod 32) of word ⌊id/32⌋.
  int64_t mask_words() const { return (size() + 31) / 32; }
  std::string const& token_bytes(int32_t id) const { return bytes_[id]; }
  bool is_eos(int32_t id) const;
  bool is_excluded(int32_t id) const;
  std::vector<int32_t> const& eos_ids() const { return eos_; }
  grammar_detail::Trie const& trie() const { return *trie_; }
  grammar_detail::LeafCache& leaf_cache() const { return *leaf_cache_; }
  /// Nodes of the byte trie (shared prefixes of the allowed tokens).
  size_t trie_nodes() const;
  /// Bytes that must be tokens of their own: all but 0xC0, 0xC1 and 0xF5–0xFF, which no grammar emits
  /// (its literals, keys, strings and free text are valid UTF-8).
  static bool needs_single_byte_token(uint8_t b);
  ~GrammarVocabulary();

 private:
  GrammarVocabulary() = default;
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;
  std::vector<uint8_t> flags_;  // bit 0 eos, bit 1 excluded
  std::unique_ptr<grammar_detail::Trie> trie_;
  std::unique_ptr<grammar_detail::LeafCache> leaf_cache_;
};

struct GrammarOptions {
  int max_whitespace = 8;  // JSON whitespace bytes allowed per gap (0 = compact; 8 fits 2-space
                           // pretty printing three levels deep)
  int max_depth = 40;      // frames on one stack (nesting bound)
  bool thinking_prefix = false;  // free text (no `｜DSML｜`) up to and including "</think>" first
};

/// One tool of an OpenAI `tools` list: the function name and its `parameters` schema (may be null).
struct ToolSpec {
  std::string name;
  std::string parameters_json;  // JSON text of `function.parameters`; empty = no parameters
};

/// A compiled grammar bound to a vocabulary; immutable apart from its internal mask caches (which
/// are thread-safe), so one Grammar serves many concurrent Matchers.
class Grammar {
 public:
  /// JSON value matching `schema` (OpenAI strict subset: see docs in
  /// models/common/grammar/schema.cpp).
  static Result<std::shared_ptr<Grammar const>> from_json_schema(
      std::string_view schema_json, std::shared_ptr<GrammarVocabulary const> vocab,
      GrammarOptions const& opt = {});
  static Result<std::shared_ptr<Grammar const>> from_json_schema(
      boost::json::value const& schema, std::shared_ptr<GrammarVocabulary const> vocab,
      GrammarOptions const& opt = {});
  static Result<std::shared_ptr<Grammar const>> from_json_schema(
      char const* schema_json, std::shared_ptr<GrammarVocabulary const> vocab,
      GrammarOptions const& opt = {}) {
    return from_json_schema(std::string_view(schema_json), std::move(vocab), opt);
  }
  /// `response_format: {"type": "json_object"}`: any JSON object.
  static Result<std::shared_ptr<Grammar const>> json_object(
      std::shared_ptr<GrammarVocabulary const> vocab, GrammarOptions const& opt = {});
  /// DSML tool-call block (`\n\n<｜DSML｜ calls>\n` invoke+ `</｜DSML｜ calls>`) calling one of
  /// `tools` with arguments that satisfy its schema; `max_calls` = 1 for parallel_tool_calls false,
  /// 0 = unbounded.
  static Result<std::shared_ptr<Grammar const>> tool_calls(
      std::span<ToolSpec const> tools, std::shared_ptr<GrammarVocabulary const> vocab,
      GrammarOptions const& opt = {}, int max_calls = 0);

  GrammarVocabulary const& vocab() const { return *vocab_; }
  grammar_detail::GrammarDef const& def() const { return *def_; }
  grammar_detail::MaskCache& cache() const { return *cache_; }
  ~Grammar();

 private:
  Grammar() = default;
  std::shared_ptr<GrammarVocabulary const> vocab_;
  std::unique_ptr<grammar_detail::GrammarDef> def_;
  std::unique_ptr<grammar_detail::MaskCache> cache_;
  friend struct GrammarBuilder;
};

/// The per-request state: feed accepted tokens, ask for the mask of the next one, roll back
/// rejected drafts. Not thread-safe (one per sequence); cheap to copy.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<Grammar const> g);
  GrammarMatcher(GrammarMatcher const&);
  GrammarMatcher& operator=(GrammarMatcher const&);
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;
  ~GrammarMatcher();

  /// Advances by one token; false (state unchanged) if the token is not allowed. EOS is accepted
  /// only when complete and moves to the terminated state, after which nothing is accepted.
  bool accept_token(int32_t id);
  /// Advances by raw bytes (forced prefixes, tests); false (state unchanged) if rejected. Counts as
  /// one step for rollback.
  bool accept_bytes(std::string_view bytes);
  /// Writes the allowed-token bitmask of the next step: mask_words() words, bit set = allowed.
  void fill_mask(uint32_t* words) const;
  std::vector<uint32_t> mask() const;
  int64_t mask_words() const;
  /// True when the bytes so far form a complete sentence of the grammar (EOS allowed).
  bool is_complete() const;
  /// True after EOS was accepted.
  bool is_terminated() const;
  /// A short byte string that completes the grammar from here (weighted A* over bytes guided by a
  /// lower bound on the bytes still needed: at most twice the shortest; at most `max_states`
  /// distinct states); nullopt if none was found within the budget. Lets a caller close a
  /// constrained reply that runs out of tokens, and lets tests steer walks to an end.
  std::optional<std::string> shortest_completion(size_t max_states = 200000) const;
  /// Speculative decoding: writes the masks of the current position and of the positions after each
  /// draft token, stopping at the first draft token the grammar rejects; the matcher is left
  /// unchanged. \param masks [draft.size() + 1, mask_words()] words; rows past the return value are
  /// untouched \return the number of leading draft tokens the grammar accepts (rows 0..return value
  /// are written)
  size_t fill_draft_masks(std::span<int32_t const> draft, uint32_t* masks);
  /// Undoes the last n accepted steps (tokens or accept_bytes calls); false if fewer were accepted.
  bool rollback(size_t n);
  size_t num_steps() const;
  /// Forgets all but the last `keep` steps (rollback can then undo at most `keep`); bounds the
  /// memory of long generations once drafts older than `keep` tokens can no longer be rejected.
  void trim_history(size_t keep);

 private:
  struct State;
  std::shared_ptr<Grammar const> g_;
  std::vector<std::unique_ptr<State>> history_;  // history_[0] = start state; back() = current
};

/// Builds the tool-call constraint for an OpenAI request. `tools_json` is the request's `tools`
/// array, `tool_choice_json` its `tool_choice` (absent = "auto"). Returns a factory of fresh
/// matchers for `required` (any declared tool) or a named tool, and an empty function for
/// `auto`/`none` (no constraint). Errors name the offending field (unknown tool name, bad schema,
/// non-function tool).
Result<std::function<GrammarMatcher()>> tool_call_matcher_factory(
    boost::json::value const& tools_json, boost::json::value const* tool_choice_json,
    std::shared_ptr<GrammarVocabulary const> vocab, GrammarOptions const& opt = {},
    bool parallel_tool_calls = true);

/// Builds the `response_format` constraint (`{"type":"json_schema","json_schema":{"schema":…}}`,
/// `{"type":"json_object"}`); `{"type":"text"}` gives an empty function.
Result<std::function<GrammarMatcher()>> response_format_matcher_factory(
    boost::json::value const& response_format, std::shared_ptr<GrammarVocabulary const> vocab,
    GrammarOptions const& opt = {});

/// Fills the vocabulary's shared leaf tables that nearly every constrained request needs (JSON string
/// text, reasoning text, raw DSML values), so the first requests after start-up do not pay ~10 ms trie
/// walks on their first masks. Optional; call once after building the vocabulary.
void prewarm_grammar_caches(std::shared_ptr<GrammarVocabulary const> const& vocab);

/// Raw bytes of a ByteLevel (GPT-2 byte↔unicode) token string, e.g. "Ġthe" → " the"; false if a
/// character is outside the 256-symbol alphabet.
bool byte_level_decode(std::string_view token, std::string* out);

}  // namespace tessera::model

// SPDX-License-Identifier: Apache-2.0
/// Internal state of tessera::models::Tokenizer: the id↔bytes tables, the merge table keyed by id pairs,
/// the added-token tries and the pre-tokenizer steps (spec/chat-format.md §1.2–§1.3). Not installed.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tessera/models/common/tokenizer.hpp"

namespace tessera::models::detail {

/// A stretch [begin, end) of the input in bytes.
struct Piece {
  size_t begin = 0;
  size_t end = 0;
};

/// One compiled regex (PCRE2, UTF + UCP, JIT when available). Move-only.
class Regex {
 public:
  /// Compiles `pattern` after rewriting `\s`/`\S` to Oniguruma's White_Space set.
  static Result<std::shared_ptr<Regex const>> compile(std::string const& pattern, std::string const& what);
  ~Regex();
  Regex(Regex const&) = delete;
  Regex& operator=(Regex const&) = delete;
  /// Appends to `out` the pieces of `subject` (offset `base` in the whole text) split Isolated: every
  /// match and every unmatched stretch, in order; empty matches produce nothing.
  void split_isolated(std::string_view subject, size_t base, std::vector<Piece>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;   // pcre2_code_8*
};

/// The `\s`→White_Space rewrite (exposed for tests): outside a class `\s` → `[\t-\r\x{85}\p{Z}]`, `\S` →
/// `[^\t-\r\x{85}\p{Z}]`; inside a class `\s` → `\t-\r\x{85}\p{Z}` (a `\S` inside a class is rejected).
Result<std::string> rewrite_white_space(std::string const& pattern);

/// A pre-tokenizer step of the file's Sequence.
struct PreStep {
  std::shared_ptr<Regex const> split;   // Split(pattern, Isolated); null for a no-split ByteLevel
};

/// Byte trie of added-token contents for leftmost-longest matching.
class AddedTrie {
 public:
  void insert(std::string_view s, int32_t index);
  bool empty() const { return nodes_.size() <= 1; }
  /// Longest token matching at text[pos…]: (index into the added table, length) or (-1, 0).
  std::pair<int32_t, size_t> longest(std::string_view text, size_t pos) const;
  /// True when some token starts with byte b (a fast reject).
  bool may_start(unsigned char b) const { return first_[b]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;   // sorted by byte
    int32_t token = -1;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<bool, 256> first_{};
};

enum class IdKind : uint8_t { kNone = 0, kVocab = 1, kAdded = 2 };

struct MergeRule {
  int32_t rank;
  TokenId merged;
};

}  // namespace tessera::models::detail

namespace tessera::models {

struct Tokenizer::Impl {
  std::string origin;
  std::vector<std::string> bytes_of;           // id → raw bytes
  std::vector<detail::IdKind> kind;            // id → what it names
  std::vector<int32_t> added_index;            // id → index into `added`, -1 if none
  std::unordered_map<std::string, TokenId> vocab_by_bytes;
  std::unordered_map<uint64_t, detail::MergeRule> merges;   // (left << 32 | right) → rule
  std::array<TokenId, 256> byte_id{};          // single-byte token of every byte (byte-level alphabet)
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, TokenId> added_by_content;
  detail::AddedTrie trie_raw;                  // pass 1: tokens with normalized = false
  detail::AddedTrie trie_normalized;           // pass 2: tokens with normalized = true
  std::vector<detail::PreStep> pre_steps;

  // BPE result cache for pre-tokenized pieces (bounded; cleared when full).
  mutable std::mutex cache_mutex;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> cache;
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  static constexpr size_t kCacheMaxPieceBytes = 256;

  /// BPE of one pre-tokenized piece; appends ids.
  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
  /// The pre-tokenizer's pieces of text[s.begin, s.end).
  std::vector<detail::Piece> pieces(std::string_view text, detail::Piece s) const;
  /// Pre-tokenize text[s.begin, s.end) and BPE every piece; appends ids (and byte spans if non-null).
  void encode_plain(std::string_view text, detail::Piece s, std::vector<TokenId>& ids,
                    std::vector<ByteSpan>* spans) const;
};

}  // namespace tessera::models

// SPDX-License-Identifier: Apache-2.0
/// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (spec/chat-format.md §1).
///
/// encode(text) = added-token split (leftmost-longest, first the `normalized: false` tokens, then the
/// `normalized: true` ones, as HF `AddedVocabulary` does) → the file's pre-tokenizer (a Sequence of
/// `Split(regex, Isolated)` and `ByteLevel`) on every non-added stretch → GPT-2 byte→unicode map → BPE with
/// merge ranks (lowest rank first, leftmost on ties) → ids. decode(ids) = concatenation of each token's raw
/// bytes (added tokens: their UTF-8 content; vocabulary tokens: the unicode→byte inverse map).
///
/// Regexes run on PCRE2 (UTF + UCP, JIT) with `\s`/`\S` rewritten to the Unicode White_Space set that
/// Oniguruma (the regex engine of HF `tokenizers`) uses; without PCRE2 (`-Dpcre2=disabled`) the loader
/// returns a clear `not_supported` error.
///
/// Invalid UTF-8 text passed to `encode` is rejected (`malformed`, with the byte offset): HF `tokenizers`
/// takes Rust `&str`, which cannot hold invalid UTF-8, so there is no reference behaviour to reproduce.
/// `decode` returns bytes as text with each maximal invalid UTF-8 subsequence replaced by U+FFFD (Rust
/// `String::from_utf8_lossy`, what HF decode does); `decode_bytes` returns the raw bytes.
///
/// Thread safety: a loaded Tokenizer is immutable except for an internal, mutex-guarded BPE cache; all
/// const member functions may be called concurrently. Copies share the loaded tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/status.hpp"

namespace tessera::models {

using TokenId = int32_t;

/// One entry of `added_tokens` (flags as in the HF file).
struct AddedToken {
  TokenId id = 0;
  std::string content;        // UTF-8 text matched literally in the input
  bool special = false;       // dropped by decode(…, skip_special = true)
  bool normalized = true;     // matched in the second pass (there is no normalizer, so only order differs)
  bool lstrip = false;        // the match absorbs white space on its left
  bool rstrip = false;        // the match absorbs white space on its right
  bool single_word = false;   // matched only when not adjacent to a word character
};

struct TokenizerOptions {
  /// When set, replaces the file's `added_tokens` table (e.g. the DeepSeek-V4.1 table of
  /// spec/chat-format.md §1.4 over a V3/V4 file; see `chat::v41_added_tokens`). Ids are used as given.
  std::optional<std::vector<AddedToken>> added_tokens_override;
};

/// [begin, end) byte offsets of a token in the encoded text.
using ByteSpan = std::pair<size_t, size_t>;

class Tokenizer {
 public:
  /// Loads `path` (a tokenizer.json). Errors name the file and the field.
  static Result<Tokenizer> from_file(std::string const& path, TokenizerOptions const& options = {});
  /// Same from JSON text; `origin` names the source in error messages.
  static Result<Tokenizer> from_json(std::string_view json_text, std::string const& origin,
                                     TokenizerOptions const& options = {});

  /// Token ids of `text`. allow_special = true: added tokens (special or not) typed in the text become
  /// their ids (the "exact mode" of spec §1.3); false: every byte is ordinary text ("safe mode").
  Result<std::vector<TokenId>> encode(std::string_view text, bool allow_special = true) const;
  /// encode plus the byte span of every token in `text`. A token that covers only part of a multi-byte
  /// character gets the span of its own bytes. HF's character offsets of a span [b, e) are
  /// [idx[b + 1] - 1, idx[e]) with idx = utf8::char_index(text) (whole characters).
  Result<std::vector<TokenId>> encode(std::string_view text, bool allow_special,
                                      std::vector<ByteSpan>* byte_offsets) const;

  /// The pre-tokenizer's pieces of `text` (byte spans, no added-token matching): what BPE runs on.
  Result<std::vector<ByteSpan>> pre_tokenize(std::string_view text) const;

  /// Text of `ids` with invalid UTF-8 replaced by U+FFFD. Unknown ids are an error.
  Result<std::string> decode(std::span<TokenId const> ids, bool skip_special = false) const;
  /// Raw bytes of `ids` (no UTF-8 repair).
  Result<std::string> decode_bytes(std::span<TokenId const> ids, bool skip_special = false) const;

  /// 1 + the largest id of the vocabulary and the added tokens (129,280 for DeepSeek-V4.1).
  size_t vocab_size() const;
  /// Raw bytes each id decodes to (empty for an id that names no token, e.g. a gap in the table).
  std::string const& token_bytes(TokenId id) const;
  std::span<std::string const> token_bytes() const;
  /// True when `id` names a token (vocabulary or added).
  bool has_token(TokenId id) const;
  /// The id of an added token by its content (e.g. "<｜end▁of▁sentence｜>"), else of the vocabulary token
  /// whose raw bytes equal `content`; nullopt if neither exists.
  std::optional<TokenId> token_id(std::string_view content) const;
  /// The added token with this id, or nullptr.
  AddedToken const* added_token(TokenId id) const;
  std::span<AddedToken const> added_tokens() const;
  bool is_special(TokenId id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<Impl const> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl const> impl_;
};

/// Incremental detokenizer: feed ids one at a time and receive text that never ends inside a UTF-8
/// sequence; incomplete trailing bytes are held back until the next token completes them. A byte that can
/// never become valid is emitted as U+FFFD at once (same policy as `Tokenizer::decode`).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(Tokenizer const& tok, bool skip_special = false)
      : tok_(&tok), skip_special_(skip_special) {}
  /// Text that became complete with `id` (may be empty). Unknown id → error.
  Result<std::string> feed(TokenId id);
  /// Emits whatever is held back (incomplete bytes as U+FFFD) and resets.
  std::string flush();
  /// Bytes currently held back (0‥3).
  size_t pending() const { return pending_.size(); }

 private:
  Tokenizer const* tok_;
  bool skip_special_;
  std::string pending_;
};

/// UTF-8 helpers shared by the tokenizer, chat encoder and parser.
namespace utf8 {
/// Length of the longest valid UTF-8 prefix of `s`; == s.size() iff `s` is valid.
size_t valid_prefix(std::string_view s);
/// `not ok` with "<what>: invalid UTF-8 at byte N" if `s` is not valid UTF-8.
Status validate(std::string_view s, std::string_view what);
/// `s` with each maximal invalid subsequence replaced by U+FFFD (Rust from_utf8_lossy).
std::string lossy(std::string_view s);
/// Length of a proper prefix of a UTF-8 sequence at the end of `s` that more bytes could complete (0‥3).
size_t incomplete_tail(std::string_view s);
/// Char (code point) index for every byte offset 0‥s.size() of valid UTF-8 `s` (offset → chars before).
std::vector<size_t> char_index(std::string_view s);
}  // namespace utf8

}  // namespace tessera::models

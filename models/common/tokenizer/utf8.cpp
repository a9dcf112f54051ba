// SPDX-License-Identifier: Apache-2.0
/// UTF-8 validation and repair (RFC 3629: no overlongs, no surrogates U+D800‥DFFF, max U+10FFFF) and the
/// streaming detokenizer that holds back an incomplete trailing sequence (spec/chat-format.md §1.3).
/// Repair follows Rust `String::from_utf8_lossy`: each maximal invalid subsequence → one U+FFFD.
#include <string>
#include <string_view>
#include <vector>

#include "tessera/models/common/tokenizer.hpp"

namespace tessera::models {
namespace utf8 {
namespace {

/// Length of the valid sequence at s[i] (1‥4), or -k where k ≥ 1 is the length of the maximal invalid
/// subsequence (a prefix of a valid sequence cut short, or 1 for a byte that can start none), or 0 when
/// s[i…] is a proper prefix of a valid sequence that runs into the end of `s`.
int classify(std::string_view s, size_t i) {
  auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;   // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < need; ++k) {
    if (i + k >= s.size()) return 0;
    auto b = static_cast<unsigned char>(s[i + k]);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return -k;
  }
  return need;
}

}  // namespace

size_t valid_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int c = classify(s, i);
    if (c <= 0) return i;
    i += static_cast<size_t>(c);
  }
  return i;
}

Status validate(std::string_view s, std::string_view what) {
  size_t n = valid_prefix(s);
  if (n == s.size()) return {};
  return malformed(std::string(what) + ": invalid UTF-8 at byte " + std::to_string(n));
}

std::string lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    int c = classify(s, i);
    if (c > 0) {
      out.append(s.substr(i, static_cast<size_t>(c)));
      i += static_cast<size_t>(c);
    } else {
      out += "\xEF\xBF\xBD";
      i += c == 0 ? s.size() - i : static_cast<size_t>(-c);
    }
  }
  return out;
}

size_t incomplete_tail(std::string_view s) {
  // A proper prefix of a valid sequence is at most 3 bytes and starts at a lead byte.
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    size_t i = s.size() - k;
    auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) == 0x80) continue;   // continuation byte: look further left
    return classify(s, i) == 0 ? k : 0;
  }
  return 0;
}

std::vector<size_t> char_index(std::string_view s) {
  std::vector<size_t> idx(s.size() + 1);
  size_t chars = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++chars;
    idx[i + 1] = chars;
  }
  // idx[i] = number of characters that start before byte i; idx[i] for a continuation byte counts its
  // own character, so a byte offset maps to the character containing the byte before it.
  return idx;
}

}  // namespace utf8

Result<std::string> StreamingDetokenizer::feed(TokenId id) {
  if (!tok_->has_token(id)) return invalid_argument("detokenize: unknown token id " + std::to_string(id));
  if (skip_special_ && tok_->is_special(id)) return std::string();
  pending_ += tok_->token_bytes(id);
  size_t keep = utf8::incomplete_tail(pending_);
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace tessera::models

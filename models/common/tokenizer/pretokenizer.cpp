// SPDX-License-Identifier: Apache-2.0
/// Pre-tokenizer pieces (spec/chat-format.md §1.2): PCRE2 regexes in UTF + UCP mode with the `Isolated`
/// split behaviour of HF `tokenizers` (every match and every unmatched stretch becomes a piece), and the
/// byte trie used for leftmost-longest added-token matching (§1.3).
///
/// Oniguruma (HF's engine) treats `\s` as Unicode White_Space = Z ∪ {U+0009‥U+000D, U+0085}; PCRE2's UCP
/// `\s` lacks U+0085, so patterns are rewritten to that explicit set before compiling.
#include "models/common/tokenizer/tokenizer_impl.hpp"

#include <algorithm>

#include "tessera/core/config.hpp"

#if TESSERA_WITH_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace tessera::models::detail {

namespace {
constexpr std::string_view kWsClassBody = "\\t-\\r\\x{85}\\p{Z}";
}

Result<std::string> rewrite_white_space(std::string const& pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char n = pattern[i + 1];
      if (n == 's' || n == 'S') {
        if (in_class) {
          if (n == 'S') return malformed("regex '" + pattern + "': \\S inside a character class is not supported");
          out += kWsClassBody;
        } else {
          out += n == 's' ? "[" : "[^";
          out += kWsClassBody;
          out += "]";
        }
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = out.size() + 1;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out += '^';
        ++i;
        ++class_start;
      }
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') {
        out += ']';
        ++i;
      }
      continue;
    }
    if (in_class && c == ']' && out.size() > class_start) in_class = false;
    out += c;
  }
  return out;
}

#if TESSERA_WITH_PCRE2

Result<std::shared_ptr<Regex const>> Regex::compile(std::string const& pattern, std::string const& what) {
  auto rewritten = rewrite_white_space(pattern);
  if (!rewritten) return rewritten.status();
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten->data()), rewritten->size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    return malformed(what + ": regex does not compile at offset " + std::to_string(err_off) + ": " +
                     reinterpret_cast<char const*>(buf));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);   // falls back to the interpreter if JIT is unavailable
  auto r = std::shared_ptr<Regex>(new Regex());
  r->code_ = code;
  return std::shared_ptr<Regex const>(std::move(r));
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::split_isolated(std::string_view subject, size_t base, std::vector<Piece>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  // One match-data block per thread: encode may run concurrently on several threads.
  struct MatchData {
    pcre2_match_data* p = pcre2_match_data_create(8, nullptr);
    ~MatchData() { pcre2_match_data_free(p); }
  };
  thread_local MatchData holder;
  pcre2_match_data* md = holder.p;
  auto const* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t const n = subject.size();
  size_t pos = 0, last = 0;
  while (pos <= n) {
    // The subject was validated as UTF-8 once for the whole text.
    int rc = pcre2_match(code, s, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;   // PCRE2_ERROR_NOMATCH (or a resource limit: the rest stays one piece)
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t mb = ov[0], me = ov[1];
    if (me == mb) {   // empty match: no piece; step over one character
      if (mb >= n) break;
      pos = mb + 1;
      while (pos < n && (static_cast<unsigned char>(subject[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (mb > last) out.push_back({base + last, base + mb});
    out.push_back({base + mb, base + me});
    last = pos = me;
  }
  if (last < n) out.push_back({base + last, base + n});
}

#else

Result<std::shared_ptr<Regex const>> Regex::compile(std::string const&, std::string const& what) {
  return not_supported(what + ": Tessera was built without PCRE2 (-Dpcre2=disabled or libpcre2-dev "
                       "missing), which the byte-level BPE pre-tokenizer needs; install libpcre2-dev and "
                       "reconfigure");
}
Regex::~Regex() = default;
void Regex::split_isolated(std::string_view subject, size_t base, std::vector<Piece>& out) const {
  if (!subject.empty()) out.push_back({base, base + subject.size()});
}

#endif

void AddedTrie::insert(std::string_view s, int32_t index) {
  if (s.empty()) return;
  first_[static_cast<unsigned char>(s[0])] = true;
  int32_t cur = 0;
  for (char ch : s) {
    auto b = static_cast<unsigned char>(ch);
    auto& nx = nodes_[cur].next;
    auto it = std::lower_bound(nx.begin(), nx.end(), b,
                               [](auto const& p, unsigned char v) { return p.first < v; });
    if (it != nx.end() && it->first == b) {
      cur = it->second;
    } else {
      int32_t id = static_cast<int32_t>(nodes_.size());
      nx.insert(it, {b, id});
      nodes_.emplace_back();
      cur = id;
    }
  }
  nodes_[cur].token = index;
}

std::pair<int32_t, size_t> AddedTrie::longest(std::string_view text, size_t pos) const {
  int32_t cur = 0, best = -1;
  size_t best_len = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto b = static_cast<unsigned char>(text[i]);
    auto const& nx = nodes_[cur].next;
    auto it = std::lower_bound(nx.begin(), nx.end(), b,
                               [](auto const& p, unsigned char v) { return p.first < v; });
    if (it == nx.end() || it->first != b) break;
    cur = it->second;
    if (nodes_[cur].token >= 0) {
      best = nodes_[cur].token;
      best_len = i + 1 - pos;
    }
  }
  return {best, best_len};
}

}  // namespace tessera::models::detail

// SPDX-License-Identifier: Apache-2.0
/// Byte-level BPE: loading a HF tokenizer.json, encode and decode (spec/chat-format.md §1).
///
/// GPT-2 byte map: bytes 33‥126, 161‥172, 174‥255 map to the same code point; the other 68 bytes map to
/// U+0100 upward in byte order. A vocabulary string is turned into raw bytes through the inverse map; a
/// string with a character outside the map keeps its own UTF-8 bytes (what HF's ByteLevel decoder does).
/// BPE per piece: symbols start as single bytes; repeatedly merge the adjacent pair with the lowest merge
/// rank, leftmost first (HF `Word::merge_all`, a min-heap over (rank, position) with stale entries skipped).
#include <algorithm>
#include <cctype>
#include <fstream>
#include <queue>
#include <sstream>

#include <boost/json.hpp>

#include "models/common/tokenizer/tokenizer_impl.hpp"

namespace tessera::models {

namespace json = boost::json;
using detail::IdKind;
using detail::Piece;

namespace {

/// Code point of byte b in the GPT-2 byte-level alphabet.
std::array<uint32_t, 256> make_byte_to_cp() {
  std::array<uint32_t, 256> m{};
  uint32_t extra = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    m[b] = printable ? static_cast<uint32_t>(b) : extra++;
  }
  return m;
}

/// Decodes the code point at s[i] of valid UTF-8, advancing i.
uint32_t next_cp(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0xFF >> (n + 1));
  for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

/// Raw bytes of a byte-level token string; `ok` false when some character is outside the map (then the
/// result is the string's own UTF-8, HF's fallback).
std::string byte_level_to_bytes(std::string_view token, bool* ok) {
  static auto const cp_to_byte = [] {
    std::array<int, 324> inv;
    inv.fill(-1);
    auto fwd = make_byte_to_cp();
    for (int b = 0; b < 256; ++b) inv[fwd[b]] = b;
    return inv;
  }();
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    uint32_t cp = next_cp(token, i);
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) {
      if (ok) *ok = false;
      return std::string(token);
    }
    out += static_cast<char>(cp_to_byte[cp]);
  }
  if (ok) *ok = true;
  return out;
}

bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_word_byte(unsigned char b) { return std::isalnum(b) || b == '_' || b >= 0x80; }

std::string escape_regex(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

constexpr char const* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status parse_pre_tokenizer(json::value const& v, std::string const& where, std::vector<detail::PreStep>& steps) {
  if (v.is_null()) return {};
  if (!v.is_object()) return malformed(where + ": not an object");
  auto const& o = v.as_object();
  auto const* type = o.if_contains("type");
  if (!type || !type->is_string()) return malformed(where + ".type: missing");
  std::string t(type->as_string());
  if (t == "Sequence") {
    auto const* list = o.if_contains("pretokenizers");
    if (!list || !list->is_array()) return malformed(where + ".pretokenizers: missing");
    for (size_t i = 0; i < list->as_array().size(); ++i)
      TESSERA_TRY(parse_pre_tokenizer(list->as_array()[i], where + ".pretokenizers[" + std::to_string(i) + "]", steps));
    return {};
  }
  if (t == "Split") {
    auto const* pat = o.if_contains("pattern");
    auto const* beh = o.if_contains("behavior");
    if (!pat || !pat->is_object()) return malformed(where + ".pattern: missing");
    std::string regex;
    if (auto const* r = pat->as_object().if_contains("Regex"); r && r->is_string()) {
      regex = std::string(r->as_string());
    } else if (auto const* s = pat->as_object().if_contains("String"); s && s->is_string()) {
      regex = escape_regex(std::string(s->as_string()));
    } else {
      return malformed(where + ".pattern: neither Regex nor String");
    }
    if (!beh || !beh->is_string() || beh->as_string() != "Isolated")
      return not_supported(where + ".behavior: only \"Isolated\" is implemented");
    if (auto const* inv = o.if_contains("invert"); inv && inv->is_bool() && inv->as_bool())
      return not_supported(where + ".invert: true is not implemented");
    auto re = detail::Regex::compile(regex, where + ".pattern");
    if (!re) return re.status();
    steps.push_back({std::move(*re)});
    return {};
  }
  if (t == "ByteLevel") {
    if (auto const* a = o.if_contains("add_prefix_space"); a && a->is_bool() && a->as_bool())
      return not_supported(where + ".add_prefix_space: true is not implemented");
    bool use_regex = true;
    if (auto const* u = o.if_contains("use_regex"); u && u->is_bool()) use_regex = u->as_bool();
    if (use_regex) {
      auto re = detail::Regex::compile(kGpt2Pattern, where + " (GPT-2 regex)");
      if (!re) return re.status();
      steps.push_back({std::move(*re)});
    }
    return {};   // the byte mapping itself is implicit: BPE runs on raw bytes
  }
  return not_supported(where + ": pre-tokenizer type \"" + t + "\" is not implemented");
}

Result<AddedToken> parse_added(json::value const& v, std::string const& where) {
  if (!v.is_object()) return malformed(where + ": not an object");
  auto const& o = v.as_object();
  AddedToken t;
  auto const* id = o.if_contains("id");
  auto const* content = o.if_contains("content");
  if (!id || !id->is_int64() || id->as_int64() < 0 || id->as_int64() > INT32_MAX)
    return malformed(where + ".id: missing or not a non-negative integer");
  if (!content || !content->is_string() || content->as_string().empty())
    return malformed(where + ".content: missing or empty");
  t.id = static_cast<TokenId>(id->as_int64());
  t.content = std::string(content->as_string());
  auto flag = [&](char const* k, bool def) {
    auto const* f = o.if_contains(k);
    return f && f->is_bool() ? f->as_bool() : def;
  };
  t.special = flag("special", false);
  t.normalized = flag("normalized", !t.special);
  t.lstrip = flag("lstrip", false);
  t.rstrip = flag("rstrip", false);
  t.single_word = flag("single_word", false);
  TESSERA_TRY(utf8::validate(t.content, where + ".content"));
  return t;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_file(std::string const& path, TokenizerOptions const& options) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("tokenizer: cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return io_error("tokenizer: read error on " + path);
  return from_json(ss.str(), path, options);
}

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text, std::string const& origin,
                                       TokenizerOptions const& options) {
  std::error_code ec;
  json::value root = json::parse(json_text, ec);
  if (ec) return malformed(origin + ": not valid JSON (" + ec.message() + ")");
  if (!root.is_object()) return malformed(origin + ": top level is not an object");
  auto const& top = root.as_object();
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;

  // normalizer: none, or an empty Sequence.
  if (auto const* n = top.if_contains("normalizer"); n && !n->is_null()) {
    auto const* nt = n->is_object() ? n->as_object().if_contains("type") : nullptr;
    auto const* list = n->is_object() ? n->as_object().if_contains("normalizers") : nullptr;
    bool empty_seq = nt && nt->is_string() && nt->as_string() == "Sequence" && list && list->is_array() &&
                     list->as_array().empty();
    if (!empty_seq) return not_supported(origin + ": normalizer: only none or an empty Sequence is implemented");
  }
  if (auto const* d = top.if_contains("decoder"); d && !d->is_null()) {
    auto const* dt = d->is_object() ? d->as_object().if_contains("type") : nullptr;
    if (!dt || !dt->is_string() || dt->as_string() != "ByteLevel")
      return not_supported(origin + ": decoder: only ByteLevel is implemented");
  }
  if (auto const* p = top.if_contains("pre_tokenizer"))
    TESSERA_TRY(parse_pre_tokenizer(*p, origin + ": pre_tokenizer", impl->pre_steps));

  auto const* model = top.if_contains("model");
  if (!model || !model->is_object()) return malformed(origin + ": model: missing");
  auto const& m = model->as_object();
  if (auto const* t = m.if_contains("type"); t && (!t->is_string() || t->as_string() != "BPE"))
    return not_supported(origin + ": model.type: only BPE is implemented");
  for (char const* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto const* v = m.if_contains(k); v && !v->is_null() && !(v->is_string() && v->as_string().empty()))
      return not_supported(origin + ": model." + k + " is not implemented");
  if (auto const* v = m.if_contains("ignore_merges"); v && v->is_bool()) impl->ignore_merges = v->as_bool();
  bool byte_fallback = false;
  if (auto const* v = m.if_contains("byte_fallback"); v && v->is_bool()) byte_fallback = v->as_bool();

  auto const* vocab = m.if_contains("vocab");
  if (!vocab || !vocab->is_object()) return malformed(origin + ": model.vocab: missing");
  std::vector<AddedToken> added;
  if (options.added_tokens_override) {
    added = *options.added_tokens_override;
  } else if (auto const* at = top.if_contains("added_tokens"); at && at->is_array()) {
    for (size_t i = 0; i < at->as_array().size(); ++i) {
      auto t = parse_added(at->as_array()[i], origin + ": added_tokens[" + std::to_string(i) + "]");
      if (!t) return t.status();
      added.push_back(std::move(*t));
    }
  }
  int64_t max_id = -1;
  for (auto const& kv : vocab->as_object()) {
    if (!kv.value().is_int64() || kv.value().as_int64() < 0 || kv.value().as_int64() > INT32_MAX)
      return malformed(origin + ": model.vocab[\"" + std::string(kv.key()) + "\"]: id is not a non-negative integer");
    max_id = std::max(max_id, kv.value().as_int64());
  }
  for (auto const& t : added) max_id = std::max<int64_t>(max_id, t.id);
  if (max_id < 0) return malformed(origin + ": empty vocabulary");
  size_t const n = static_cast<size_t>(max_id) + 1;
  impl->bytes_of.assign(n, {});
  impl->kind.assign(n, IdKind::kNone);
  impl->added_index.assign(n, -1);
  impl->vocab_by_bytes.reserve(vocab->as_object().size() * 2);
  for (auto const& kv : vocab->as_object()) {
    auto id = static_cast<TokenId>(kv.value().as_int64());
    if (impl->kind[id] != IdKind::kNone)
      return malformed(origin + ": model.vocab: id " + std::to_string(id) + " appears twice");
    bool ok = false;
    std::string bytes = byte_level_to_bytes(kv.key(), &ok);
    if (!ok && byte_fallback && kv.key().size() == 6 && kv.key().starts_with("<0x") && kv.key().ends_with(">")) {
      bytes.assign(1, static_cast<char>(std::stoi(std::string(kv.key().substr(3, 2)), nullptr, 16)));
      ok = true;
    }
    impl->kind[id] = IdKind::kVocab;
    if (ok) impl->vocab_by_bytes.emplace(bytes, id);
    impl->bytes_of[id] = std::move(bytes);
  }
  impl->byte_id.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = impl->vocab_by_bytes.find(std::string(1, static_cast<char>(b)));
    if (it == impl->vocab_by_bytes.end())
      return malformed(origin + ": model.vocab: no token for byte " + std::to_string(b) +
                       " (not a byte-level BPE vocabulary)");
    impl->byte_id[b] = it->second;
  }

  auto const* merges = m.if_contains("merges");
  if (!merges || !merges->is_array()) return malformed(origin + ": model.merges: missing");
  auto const& ma = merges->as_array();
  impl->merges.reserve(ma.size() * 2);
  for (size_t r = 0; r < ma.size(); ++r) {
    std::string a, b;
    if (ma[r].is_string()) {
      std::string_view s = ma[r].as_string();
      size_t sp = s.find(' ');
      if (sp == std::string_view::npos || s.find(' ', sp + 1) != std::string_view::npos)
        return malformed(origin + ": model.merges[" + std::to_string(r) + "]: not \"A B\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (ma[r].is_array() && ma[r].as_array().size() == 2 && ma[r].as_array()[0].is_string() &&
               ma[r].as_array()[1].is_string()) {
      a = ma[r].as_array()[0].as_string();
      b = ma[r].as_array()[1].as_string();
    } else {
      return malformed(origin + ": model.merges[" + std::to_string(r) + "]: not a pair");
    }
    bool oka = false, okb = false;
    std::string ba = byte_level_to_bytes(a, &oka), bb = byte_level_to_bytes(b, &okb);
    auto ia = impl->vocab_by_bytes.find(ba), ib = impl->vocab_by_bytes.find(bb);
    auto im = impl->vocab_by_bytes.find(ba + bb);
    if (!oka || !okb || ia == impl->vocab_by_bytes.end() || ib == impl->vocab_by_bytes.end() ||
        im == impl->vocab_by_bytes.end())
      return malformed(origin + ": model.merges[" + std::to_string(r) + "]: \"" + a + " " + b +
                       "\" names a token missing from model.vocab");
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
    impl->merges.emplace(key, detail::MergeRule{static_cast<int32_t>(r), im->second});   // first (lowest) rank wins
  }

  for (size_t i = 0; i < added.size(); ++i) {
    auto const& t = added[i];
    if (impl->added_index[t.id] >= 0)
      return malformed(origin + ": added_tokens: id " + std::to_string(t.id) + " appears twice");
    if (!impl->added_by_content.emplace(t.content, t.id).second)
      return malformed(origin + ": added_tokens: \"" + t.content + "\" appears twice");
    impl->added_index[t.id] = static_cast<int32_t>(i);
    impl->kind[t.id] = IdKind::kAdded;
    impl->bytes_of[t.id] = byte_level_to_bytes(t.content, nullptr);   // HF decodes added tokens the same way
    (t.normalized ? impl->trie_normalized : impl->trie_raw).insert(t.content, static_cast<int32_t>(i));
  }
  impl->added = std::move(added);
  return Tokenizer(std::move(impl));
}

// ---------------------------------------------------------------------------------------------------------
// Encoding

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  bool cacheable = piece.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(piece); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<TokenId> result;
  if (ignore_merges) {
    if (auto it = vocab_by_bytes.find(std::string(piece)); it != vocab_by_bytes.end()) result.push_back(it->second);
  }
  if (result.empty()) {
    struct Sym {
      TokenId id;
      int32_t prev, next;
      bool alive;
    };
    size_t const n = piece.size();
    std::vector<Sym> sym(n);
    for (size_t i = 0; i < n; ++i)
      sym[i] = {byte_id[static_cast<unsigned char>(piece[i])], static_cast<int32_t>(i) - 1,
                i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
    struct Cand {
      int32_t rank, pos;
      TokenId merged;
      bool operator>(Cand const& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto rule = [&](TokenId a, TokenId b) -> detail::MergeRule const* {
      auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
      return it == merges.end() ? nullptr : &it->second;
    };
    auto push = [&](int32_t pos) {
      if (pos < 0 || sym[pos].next < 0) return;
      if (auto const* r = rule(sym[pos].id, sym[sym[pos].next].id)) heap.push({r->rank, pos, r->merged});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
    while (!heap.empty()) {
      Cand c = heap.top();
      heap.pop();
      Sym& s = sym[c.pos];
      if (!s.alive || s.next < 0) continue;
      auto const* r = rule(s.id, sym[s.next].id);
      if (!r || r->merged != c.merged) continue;   // stale entry
      Sym& nx = sym[s.next];
      nx.alive = false;
      s.id = c.merged;
      s.next = nx.next;
      if (nx.next >= 0) sym[nx.next].prev = c.pos;
      push(s.prev);
      push(c.pos);
    }
    for (int32_t i = 0; i >= 0 && i < static_cast<int32_t>(n); i = sym[i].next) result.push_back(sym[i].id);
  }
  out.insert(out.end(), result.begin(), result.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(std::string(piece), std::move(result));
  }
}

std::vector<Piece> Tokenizer::Impl::pieces(std::string_view text, Piece s) const {
  std::vector<Piece> out, next;
  if (s.end <= s.begin) return out;
  out.push_back(s);
  for (auto const& step : pre_steps) {
    if (!step.split) continue;
    next.clear();
    for (auto const& p : out) step.split->split_isolated(text.substr(p.begin, p.end - p.begin), p.begin, next);
    out.swap(next);
  }
  return out;
}

void Tokenizer::Impl::encode_plain(std::string_view text, Piece s, std::vector<TokenId>& ids,
                                   std::vector<ByteSpan>* spans) const {
  for (auto const& p : pieces(text, s)) {
    size_t first = ids.size();
    bpe(text.substr(p.begin, p.end - p.begin), ids);
    if (spans) {
      size_t at = p.begin;
      for (size_t k = first; k < ids.size(); ++k) {
        size_t len = bytes_of[ids[k]].size();
        spans->push_back({at, at + len});
        at += len;
      }
    }
  }
}

Result<std::vector<ByteSpan>> Tokenizer::pre_tokenize(std::string_view text) const {
  TESSERA_TRY(utf8::validate(text, "tokenizer input"));
  std::vector<ByteSpan> out;
  for (auto const& p : impl_->pieces(text, {0, text.size()})) out.push_back({p.begin, p.end});
  return out;
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, bool allow_special) const {
  return encode(text, allow_special, nullptr);
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, bool allow_special,
                                               std::vector<ByteSpan>* byte_offsets) const {
  TESSERA_TRY(utf8::validate(text, "tokenizer input"));
  auto const& im = *impl_;
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (byte_offsets) byte_offsets->clear();
  if (!allow_special || im.added.empty()) {
    im.encode_plain(text, {0, text.size()}, ids, byte_offsets);
    return ids;
  }
  // Added tokens: leftmost-longest in pass 1 (normalized = false), then pass 2 (normalized = true) over the
  // stretches pass 1 left; each token may absorb white space (lstrip/rstrip) or need word boundaries.
  struct Seg {
    Piece span;
    int32_t added = -1;   // index into im.added, -1 for plain text
  };
  auto split = [&](detail::AddedTrie const& trie, Piece s, std::vector<Seg>& out) {
    if (trie.empty()) {
      out.push_back({s, -1});
      return;
    }
    std::string_view bounded = text.substr(0, s.end);
    size_t plain = s.begin, i = s.begin;
    while (i < s.end) {
      if (!trie.may_start(static_cast<unsigned char>(text[i]))) {
        ++i;
        continue;
      }
      auto [idx, len] = trie.longest(bounded, i);
      if (idx < 0) {
        ++i;
        continue;
      }
      AddedToken const& t = im.added[idx];
      size_t b = i, e = i + len;
      if (t.single_word && ((b > s.begin && is_word_byte(static_cast<unsigned char>(text[b - 1]))) ||
                            (e < s.end && is_word_byte(static_cast<unsigned char>(text[e]))))) {
        ++i;
        continue;
      }
      if (t.lstrip) {
        while (b > plain) {
          size_t k = b - 1;
          while (k > plain && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
          size_t j = k;
          if (!is_white_space(next_cp(text, j))) break;
          b = k;
        }
      }
      if (t.rstrip) {
        while (e < s.end) {
          size_t j = e;
          if (!is_white_space(next_cp(text, j))) break;
          e = j;
        }
      }
      if (b > plain) out.push_back({{plain, b}, -1});
      out.push_back({{b, e}, idx});
      plain = i = e;
    }
    if (plain < s.end) out.push_back({{plain, s.end}, -1});
  };
  std::vector<Seg> pass1, pass2;
  split(im.trie_raw, {0, text.size()}, pass1);
  for (auto const& seg : pass1) {
    if (seg.added >= 0) pass2.push_back(seg);
    else split(im.trie_normalized, seg.span, pass2);
  }
  for (auto const& seg : pass2) {
    if (seg.added >= 0) {
      ids.push_back(im.added[seg.added].id);
      if (byte_offsets) byte_offsets->push_back({seg.span.begin, seg.span.end});
    } else {
      im.encode_plain(text, seg.span, ids, byte_offsets);
    }
  }
  return ids;
}

// ---------------------------------------------------------------------------------------------------------
// Decoding and tables

Result<std::string> Tokenizer::decode_bytes(std::span<TokenId const> ids, bool skip_special) const {
  auto const& im = *impl_;
  std::string out;
  for (TokenId id : ids) {
    if (!has_token(id)) return invalid_argument("decode: unknown token id " + std::to_string(id));
    if (skip_special && is_special(id)) continue;
    out += im.bytes_of[id];
  }
  return out;
}

Result<std::string> Tokenizer::decode(std::span<TokenId const> ids, bool skip_special) const {
  auto b = decode_bytes(ids, skip_special);
  if (!b) return b.status();
  return utf8::lossy(*b);
}

size_t Tokenizer::vocab_size() const { return impl_->bytes_of.size(); }

std::string const& Tokenizer::token_bytes(TokenId id) const {
  static std::string const empty;
  return id >= 0 && static_cast<size_t>(id) < impl_->bytes_of.size() ? impl_->bytes_of[id] : empty;
}

std::span<std::string const> Tokenizer::token_bytes() const { return impl_->bytes_of; }

bool Tokenizer::has_token(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->kind.size() && impl_->kind[id] != IdKind::kNone;
}

std::optional<TokenId> Tokenizer::token_id(std::string_view content) const {
  if (auto it = impl_->added_by_content.find(std::string(content)); it != impl_->added_by_content.end())
    return it->second;
  if (auto it = impl_->vocab_by_bytes.find(std::string(content)); it != impl_->vocab_by_bytes.end())
    return it->second;
  return std::nullopt;
}

AddedToken const* Tokenizer::added_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->added_index.size() || impl_->added_index[id] < 0) return nullptr;
  return &impl_->added[impl_->added_index[id]];
}

std::span<AddedToken const> Tokenizer::added_tokens() const { return impl_->added; }

bool Tokenizer::is_special(TokenId id) const {
  auto const* t = added_token(id);
  return t && t->special;
}

}  // namespace tessera::models

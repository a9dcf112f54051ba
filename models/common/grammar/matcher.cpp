// SPDX-License-Identifier: Apache-2.0
/// Vocabulary trie, token masks and the per-request matcher.
///
/// Mask of a state S: token t is allowed iff stepping S through bytes(t) leaves a live stack. The
/// trie (DFS preorder) shares prefixes: a walk steps the state once per trie node and skips a whole
/// subtree as soon as no stack survives. Two caches make the common steps cheap:
///   * full: serialized S → mask (states repeat: every step inside one string value, structural
///     positions of repeated array elements, the reasoning text, …);
///   * leaf: when S is one stack whose top is a string / free text, the tokens that stay inside the
///     leaf depend only on the top frame: cache (inside mask, trie nodes where the leaf closes);
///     only the subtrees below the closing nodes are walked against the real stack below.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <queue>
#include <tuple>

#include "models/common/grammar/grammar_impl.hpp"

namespace tessera::model {

using namespace grammar_detail;

// ---- vocabulary
// ------------------------------------------------------------------------------------

GrammarVocabulary::~GrammarVocabulary() = default;

bool GrammarVocabulary::needs_single_byte_token(uint8_t b) {
  return b != 0xC0 && b != 0xC1 && b < 0xF5;  // the bytes valid UTF-8 can contain
}

size_t GrammarVocabulary::trie_nodes() const { return trie_->num_nodes(); }

bool GrammarVocabulary::is_eos(int32_t id) const {
  return id >= 0 && id < size() && (flags_[id] & 1);
}
bool GrammarVocabulary::is_excluded(int32_t id) const {
  return id < 0 || id >= size() || (flags_[id] & 3);
}

Result<std::shared_ptr<GrammarVocabulary const>> GrammarVocabulary::build(
    std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids,
    std::vector<int32_t> excluded_ids) {
  int64_t const n = static_cast<int64_t>(token_bytes.size());
  if (n == 0 || n > (int64_t{1} << 31) - 1)
    return invalid_argument("grammar vocabulary: size out of range");
  std::shared_ptr<GrammarVocabulary> v(new GrammarVocabulary());
  v->flags_.assign(n, 0);
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= n)
      return invalid_argument("grammar vocabulary: eos id " + std::to_string(id) + " out of range");
    v->flags_[id] |= 1;
  }
  for (int32_t id : excluded_ids) {
    if (id < 0 || id >= n)
      return invalid_argument("grammar vocabulary: excluded id " + std::to_string(id) +
                              " out of range");
    v->flags_[id] |= 2;
  }
  // No dead state by construction (grammar.hpp): a complete sentence always has a stop token, and every
  // byte a live state can continue with is a token of its own.
  if (eos_ids.empty())
    return invalid_argument(
        "grammar vocabulary: no EOS id; a complete constrained reply would have no token to end with");
  std::vector<uint8_t> single(256, 0);
  for (int64_t i = 0; i < n; ++i)
    if (token_bytes[i].size() == 1 && !(v->flags_[i] & 3))
      single[static_cast<uint8_t>(token_bytes[i][0])] = 1;
  for (int b = 0; b < 256; ++b)
    if (needs_single_byte_token(static_cast<uint8_t>(b)) && !single[b]) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      return invalid_argument(std::string("grammar vocabulary: no single-byte token for byte ") + hex +
                              "; constrained decoding needs every byte of UTF-8 text as a token of its own "
                              "(a byte-level BPE vocabulary)");
    }
  v->bytes_ = std::move(token_bytes);
  v->eos_ = std::move(eos_ids);
  // Trie in DFS preorder from the sorted byte strings: token i adds nodes for the bytes past its
  // longest common prefix with token i−1.
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; ++i)
    if (!(v->flags_[i] & 3) && !v->bytes_[i].empty()) ids.push_back(i);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    int const c = v->bytes_[a].compare(v->bytes_[b]);
    return c != 0 ? c < 0 : a < b;
  });
  auto trie = std::make_unique<Trie>();
  std::vector<uint32_t> path;  // node index per depth of the current path
  std::vector<std::vector<int32_t>> toks;
  std::string const* prev = nullptr;
  for (int32_t id : ids) {
    std::string const& s = v->bytes_[id];
    if (s.size() > 65535)
      return invalid_argument("grammar vocabulary: token " + std::to_string(id) + " too long");
    size_t l = 0;
    if (prev)
      while (l < s.size() && l < prev->size() && s[l] == (*prev)[l]) ++l;
    if (prev && l == s.size() && l == prev->size()) {
      toks[path[l - 1]].push_back(id);
      continue;
    }
    path.resize(l);
    for (size_t d = l; d < s.size(); ++d) {
      path.push_back(static_cast<uint32_t>(trie->byte.size()));
      trie->byte.push_back(static_cast<uint8_t>(s[d]));
      trie->depth.push_back(static_cast<uint16_t>(d + 1));
      toks.emplace_back();
    }
    toks[path.back()].push_back(id);
    prev = &s;
  }
  size_t const nn = trie->byte.size();
  trie->end.assign(nn, static_cast<uint32_t>(nn));
  std::vector<uint32_t> open;  // nodes whose subtree is still open
  for (uint32_t i = 0; i < nn; ++i) {
    while (!open.empty() && trie->depth[open.back()] >= trie->depth[i]) {
      trie->end[open.back()] = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  trie->tok_off.assign(nn + 1, 0);
  for (size_t i = 0; i < nn; ++i)
    trie->tok_off[i + 1] = trie->tok_off[i] + static_cast<uint32_t>(toks[i].size());
  for (auto& t : toks) trie->tok.insert(trie->tok.end(), t.begin(), t.end());
  v->trie_ = std::move(trie);
  v->leaf_cache_ = std::make_unique<LeafCache>();
  return std::shared_ptr<GrammarVocabulary const>(std::move(v));
}

bool byte_level_decode(std::string_view token, std::string* out) {
  // GPT-2 bytes_to_unicode: bytes 33–126, 161–172, 174–255 map to themselves; the other 68 bytes
  // map to U+0100 + k in byte order.
  static uint16_t const* table = [] {
    static uint16_t inv[512];
    std::fill(std::begin(inv), std::end(inv), 0xFFFF);
    int k = 0;
    for (int b = 0; b < 256; ++b) {
      bool const self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      int const cp = self ? b : 256 + k++;
      inv[cp] = static_cast<uint16_t>(b);
    }
    return inv;
  }();
  out->clear();
  for (size_t i = 0; i < token.size();) {
    unsigned char const c = token[i];
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c & 0x1F) << 6) | (token[i + 1] & 0x3F);
      i += 2;
    } else
      return false;
    if (cp >= 512 || table[cp] == 0xFFFF) return false;
    out->push_back(static_cast<char>(table[cp]));
  }
  return true;
}

// ---- grammar
// ---------------------------------------------------------------------------------------

Grammar::~Grammar() = default;

struct GrammarBuilder {
  static std::shared_ptr<Grammar const> make(std::unique_ptr<GrammarDef> d,
                                             std::shared_ptr<GrammarVocabulary const> v) {
    std::shared_ptr<Grammar> g(new Grammar());
    g->vocab_ = std::move(v);
    g->def_ = std::move(d);
    g->cache_ = std::make_unique<MaskCache>();
    return g;
  }
};

namespace grammar_detail {

Result<std::shared_ptr<Grammar const>> make_grammar(
    std::unique_ptr<GrammarDef> def, std::shared_ptr<GrammarVocabulary const> vocab) {
  return GrammarBuilder::make(std::move(def), std::move(vocab));
}

namespace {

void set_tokens(Trie const& t, uint32_t node, uint32_t* words) {
  for (uint32_t k = t.tok_off[node]; k < t.tok_off[node + 1]; ++k) {
    uint32_t const id = static_cast<uint32_t>(t.tok[k]);
    words[id >> 5] |= 1u << (id & 31);
  }
}

/// Walks trie nodes [begin, end) (a run of complete subtrees whose roots have depth base+1) from
/// `start`. A level whose state is one stack topped by a leaf (string / free text) steps only that
/// top frame (32 bytes) until the leaf finishes; the stack is rebuilt only then.
struct Level {
  StateSet set;
  Frame top;      // leaf mode: the current top frame
  int owner = 0;  // leaf mode: the level whose `set` holds the stack below the top
  bool leaf = false;
};

void enter_leaf_mode(GrammarDef const& g, std::vector<Level>& lv, int d) {
  Level& l = lv[d];
  l.leaf = false;
  if (l.set.size() == 1 && l.set.off[1] > 0) {
    Frame const& top = l.set.frames[l.set.off[1] - 1];
    if (is_leaf(g.nodes[top.node].kind)) {
      l.leaf = true;
      l.top = top;
      l.owner = d;
    }
  }
}

void walk(GrammarDef const& g, Trie const& t, StateSet const& start, uint32_t begin, uint32_t end,
          int base, uint32_t* words) {
  thread_local std::vector<Level> lv;
  thread_local Stack scratch;
  if (lv.size() < 2) lv.resize(2);
  lv[0].set = start;
  enter_leaf_mode(g, lv, 0);
  uint32_t i = begin;
  while (i < end) {
    int const d = t.depth[i] - base;
    if (static_cast<int>(lv.size()) <= d) lv.resize(d + 1);
    Level& parent = lv[d - 1];
    Level& cur = lv[d];
    if (parent.leaf) {
      Frame f = parent.top;
      int const r = step_leaf(g, f, t.byte[i]);
      if (r < 0) {
        i = t.end[i];
        continue;
      }
      if (r == 0) {
        cur.leaf = true;
        cur.top = f;
        cur.owner = parent.owner;
      } else {
        StateSet const& os = lv[parent.owner].set;
        scratch.assign(os.frames.begin(), os.frames.begin() + os.off[1]);
        scratch.back() = f;
        finish_top(g, scratch);
        cur.set.clear();
        cur.set.add(scratch.data(), scratch.size());
        enter_leaf_mode(g, lv, d);
      }
    } else {
      step_set(g, parent.set, t.byte[i], cur.set);
      if (cur.set.empty()) {
        i = t.end[i];
        continue;
      }
      enter_leaf_mode(g, lv, d);
    }
    set_tokens(t, i, words);
    ++i;
  }
}

std::string leaf_signature(GrammarDef const& g, Frame top) {
  Node const& n = g.nodes[top.node];
  top.node = 0;
  std::string k(1, static_cast<char>(n.kind));
  k.append(reinterpret_cast<char const*>(&n.min), sizeof n.min);
  k.append(reinterpret_cast<char const*>(&n.max), sizeof n.max);
  k.append(reinterpret_cast<char const*>(&top), sizeof top);
  k.append(n.lit);
  for (auto const& f : n.forbidden) {
    k.push_back('\0');
    k.append(f);
  }
  return k;
}

bool count_free(Node const& n) {
  return n.kind == NodeKind::kString && (n.min > 0 || n.max != kUnbounded);
}

std::shared_ptr<LeafEntry const> leaf_entry(Grammar const& gr, Frame const& top) {
  GrammarDef const& g = gr.def();
  Node const& node = g.nodes[top.node];
  bool const counted = count_free(node);
  // Count-free form: bounds lifted (counting kept on), count zeroed; the caller applies the bounds.
  Node nb = node;
  Frame t0 = top;
  if (counted) {
    nb.min = 0;
    nb.max = kUnbounded - 1;
    t0.count = 0;
  }
  LeafCache& c = gr.vocab().leaf_cache();
  std::string key = leaf_signature(g, t0);
  if (counted) key += "#counted";
  {
    std::lock_guard<std::mutex> lk(c.mu);
    if (auto it = c.map.find(key); it != c.map.end()) return it->second;
  }
  Trie const& t = gr.vocab().trie();
  auto e = std::make_shared<LeafEntry>();
  e->counted = counted;
  e->inside.assign(gr.vocab().mask_words(), 0);
  std::vector<Frame> fr(2, t0);
  for (uint32_t i = 0; i < t.num_nodes();) {
    int const d = t.depth[i];
    if (static_cast<int>(fr.size()) <= d) fr.resize(d + 1);
    fr[d] = fr[d - 1];
    int const r = step_leaf_as(g, nb, fr[d], t.byte[i]);
    if (r < 0) {
      i = t.end[i];
      continue;
    }
    if (r == 1) {
      e->exits.push_back(i);
      if (counted) e->exit_chars.push_back(fr[d].count);
      i = t.end[i];
      continue;
    }
    set_tokens(t, i, e->inside.data());
    if (counted)
      for (uint32_t k = t.tok_off[i]; k < t.tok_off[i + 1]; ++k)
        e->inside_chars.push_back({fr[d].count, t.tok[k]});
    ++i;
  }
  std::sort(e->inside_chars.begin(), e->inside_chars.end(), std::greater<>());
  size_t const size = key.size() + e->inside.size() * sizeof(uint32_t) +
                      e->exits.size() * 2 * sizeof(uint32_t) +
                      e->inside_chars.size() * sizeof(e->inside_chars[0]);
  std::lock_guard<std::mutex> lk(c.mu);
  if (c.bytes + size > LeafCache::kMaxBytes) {
    c.map.clear();
    c.bytes = 0;
  }
  if (c.map.emplace(key, e).second) c.bytes += size;
  return e;
}

}  // namespace

void compute_mask(Grammar const& gr, StateSet const& s, uint32_t* words) {
  GrammarDef const& g = gr.def();
  Trie const& t = gr.vocab().trie();
  int64_t const nw = gr.vocab().mask_words();
  MaskCache& c = gr.cache();
  std::string const key = s.key();
  {
    std::lock_guard<std::mutex> lk(c.mu);
    if (auto it = c.full.find(key); it != c.full.end()) {
      std::memcpy(words, it->second->data(), nw * sizeof(uint32_t));
      return;
    }
  }
  auto m = std::make_shared<std::vector<uint32_t>>(nw, 0u);
  uint32_t* w = m->data();
  bool leaf_path = false;
  if (s.size() == 1 && s.off[1] > 0) {
    Frame const& top = s.frames[s.off[1] - 1];
    if (is_leaf(g.nodes[top.node].kind)) {
      leaf_path = true;
      auto const e = leaf_entry(gr, top);
      std::memcpy(w, e->inside.data(), nw * sizeof(uint32_t));
      Node const& n = g.nodes[top.node];
      int64_t const count = top.count;
      int64_t const room =
          n.max == kUnbounded ? INT64_MAX : n.max - count;  // characters still allowed
      if (e->counted)
        for (auto const& [chars, id] : e->inside_chars) {
          if (static_cast<int64_t>(chars) <= room) break;
          w[id >> 5] &= ~(1u << (id & 31));
        }
      if (!e->exits.empty()) {
        Stack after(s.frames.begin(), s.frames.begin() + s.off[1]);
        if (e->counted) after.back().count = static_cast<uint32_t>(std::max<int64_t>(count, n.min));
        finish_top(g, after);
        StateSet as;
        as.add(after.data(), after.size());
        for (size_t k = 0; k < e->exits.size(); ++k) {
          uint32_t const x = e->exits[k];
          if (e->counted) {
            int64_t const chars = e->exit_chars[k];
            if (chars > room || count + chars < n.min) continue;
          }
          set_tokens(t, x, w);
          walk(g, t, as, x + 1, t.end[x], t.depth[x], w);
        }
      }
    }
  }
  if (!leaf_path) walk(g, t, s, 0, static_cast<uint32_t>(t.num_nodes()), 0, w);
  if (can_finish(g, s))
    for (int32_t id : gr.vocab().eos_ids()) w[id >> 5] |= 1u << (id & 31);
  std::memcpy(words, w, nw * sizeof(uint32_t));
  size_t const size = key.size() + m->size() * sizeof(uint32_t);
  std::lock_guard<std::mutex> lk(c.mu);
  if (c.bytes + size > MaskCache::kMaxBytes) {
    c.full.clear();
    c.bytes = 0;
  }
  if (c.full.emplace(key, std::move(m)).second) c.bytes += size;
}

}  // namespace grammar_detail

// ---- matcher
// ---------------------------------------------------------------------------------------

struct GrammarMatcher::State {
  StateSet set;
  bool terminated = false;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<Grammar const> g) : g_(std::move(g)) {
  auto s = std::make_unique<State>();
  s->set = initial_state(g_->def());
  history_.push_back(std::move(s));
}
GrammarMatcher::GrammarMatcher(GrammarMatcher const& o) : g_(o.g_) {
  for (auto const& s : o.history_) history_.push_back(std::make_unique<State>(*s));
}
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher const& o) {
  if (this != &o) {
    GrammarMatcher t(o);
    *this = std::move(t);
  }
  return *this;
}
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;
GrammarMatcher::~GrammarMatcher() = default;

int64_t GrammarMatcher::mask_words() const { return g_->vocab().mask_words(); }
size_t GrammarMatcher::num_steps() const { return history_.size() - 1; }
bool GrammarMatcher::is_terminated() const { return history_.back()->terminated; }
bool GrammarMatcher::is_complete() const {
  State const& s = *history_.back();
  return !s.terminated && can_finish(g_->def(), s.set);
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  State const& cur = *history_.back();
  if (cur.terminated) return false;
  auto next = std::make_unique<State>();
  StateSet a = cur.set, b;
  for (char ch : bytes) {
    step_set(g_->def(), a, static_cast<uint8_t>(ch), b);
    if (b.empty()) return false;
    std::swap(a, b);
  }
  next->set = std::move(a);
  history_.push_back(std::move(next));
  return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
  GrammarVocabulary const& v = g_->vocab();
  if (id < 0 || id >= v.size()) return false;
  State const& cur = *history_.back();
  if (cur.terminated) return false;
  if (v.is_eos(id)) {
    if (!can_finish(g_->def(), cur.set)) return false;
    auto next = std::make_unique<State>(cur);
    next->terminated = true;
    history_.push_back(std::move(next));
    return true;
  }
  if (v.is_excluded(id) || v.token_bytes(id).empty()) return false;
  return accept_bytes(v.token_bytes(id));
}

void GrammarMatcher::fill_mask(uint32_t* words) const {
  State const& cur = *history_.back();
  if (cur.terminated) {
    std::fill(words, words + mask_words(), 0u);
    return;
  }
  compute_mask(*g_, cur.set, words);
}

std::vector<uint32_t> GrammarMatcher::mask() const {
  std::vector<uint32_t> m(mask_words());
  fill_mask(m.data());
  return m;
}

std::optional<std::string> GrammarMatcher::shortest_completion(size_t max_states) const {
  State const& cur = *history_.back();
  if (cur.terminated) return std::nullopt;
  GrammarDef const& g = g_->def();
  // Weighted A* over byte extensions: cost = bytes so far + 2 · a lower bound on the bytes still
  // needed (completion_bytes_lower_bound: open literals, closing brackets and quotes, missing required
  // keys, parameters and items at their smallest values), ties to the longer prefix. The weight trades
  // exactness (the result is at most twice the shortest) for few expansions where the bound is loose.
  struct Item {
    StateSet set;
    int32_t parent;
    uint8_t byte;
    int32_t len;
  };
  std::vector<Item> items{{cur.set, -1, 0, 0}};
  std::unordered_map<std::string, int32_t> seen{{cur.set.key(), 0}};
  using Entry = std::tuple<int64_t, int32_t, int32_t>;  // (cost, −length, item), smallest first
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> open;
  open.push({2 * completion_bytes_lower_bound(g, cur.set), 0, 0});
  StateSet next;
  while (!open.empty()) {
    int32_t const head = std::get<2>(open.top());
    open.pop();
    if (can_finish(g, items[head].set)) {
      std::string out;
      for (int32_t i = head; items[i].parent >= 0; i = items[i].parent)
        out.push_back(static_cast<char>(items[i].byte));
      return std::string(out.rbegin(), out.rend());
    }
    for (int b = 0; b < 256; ++b) {
      step_set(g, items[head].set, static_cast<uint8_t>(b), next);
      if (next.empty()) continue;
      if (!seen.emplace(next.key(), static_cast<int32_t>(items.size())).second) continue;
      if (items.size() >= max_states) return std::nullopt;
      int32_t const len = items[head].len + 1;
      int64_t const rest = completion_bytes_lower_bound(g, next);
      if (rest >= kInfBytes) continue;
      open.push({len + 2 * rest, -len, static_cast<int32_t>(items.size())});
      items.push_back({next, head, static_cast<uint8_t>(b), len});
    }
  }
  return std::nullopt;
}

size_t GrammarMatcher::fill_draft_masks(std::span<int32_t const> draft, uint32_t* masks) {
  int64_t const nw = mask_words();
  size_t n = 0;
  fill_mask(masks);
  for (; n < draft.size(); ++n) {
    uint32_t const id = static_cast<uint32_t>(draft[n]);
    bool const bit = draft[n] >= 0 && draft[n] < g_->vocab().size() &&
                     ((masks[n * nw + (id >> 5)] >> (id & 31)) & 1);
    if (!bit || !accept_token(draft[n])) break;
    fill_mask(masks + (n + 1) * nw);
  }
  rollback(n);
  return n;
}

void GrammarMatcher::trim_history(size_t keep) {
  if (history_.size() <= keep + 1) return;
  history_.erase(history_.begin(), history_.end() - static_cast<std::ptrdiff_t>(keep + 1));
}

bool GrammarMatcher::rollback(size_t n) {
  if (n > num_steps()) return false;
  history_.resize(history_.size() - n);
  return true;
}

}  // namespace tessera::model

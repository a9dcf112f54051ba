// SPDX-License-Identifier: Apache-2.0
/// The byte step of the grammar pushdown automaton (grammar_impl.hpp): one frame per open node,
/// children pushed lazily when their first byte arrives, finished frames popped with a notification
/// to their parent. Choices (anyOf, optional repetition, DSML parameter vs end) fork the stack;
/// forks that cannot take the byte die. Nested values are only started when they fit under
/// max_depth (Node::min_frames), which is what keeps every live state completable.
#include <algorithm>
#include <bit>

#include "models/common/grammar/grammar_impl.hpp"

namespace tessera::model::grammar_detail {
namespace {

constexpr int32_t kInf = INT32_MAX / 4;

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\r' || b == '\t'; }

// ---- the runner
// ------------------------------------------------------------------------------------

struct Runner {
  GrammarDef const& g;
  std::vector<Stack> pending;
  size_t num_pending = 0;

  bool fits(Stack const& s, int32_t node) const {
    return static_cast<int>(s.size()) + g.nodes[node].min_frames <= g.max_depth;
  }
  void fork(Stack const& s) {
    if (num_pending == pending.size()) pending.emplace_back();
    pending[num_pending++] = s;
  }
  void push(Stack& s, int32_t node) { s.push_back(make_frame(node)); }

  /// Key candidates: unseen keys whose value fits.
  uint64_t available_keys(Stack const& s, Node const& n, uint64_t seen) const {
    uint64_t c = 0;
    for (size_t i = 0; i < n.keys.size(); ++i) {
      if ((seen >> i) & 1) continue;
      bool ok = false;
      if (n.kind == NodeKind::kObject) {
        ok = fits(s, n.children[i]);
      } else {
        ok = (n.children[i] != kNone && fits(s, n.children[i])) ||
             (n.raw[i] != kNone && fits(s, n.raw[i]));
      }
      if (ok) c |= uint64_t{1} << i;
    }
    return c;
  }

  /// Matches byte b of a declared key; returns 1 consumed, 2 key closed by '"', −1 rejected.
  static int match_key(Node const& n, Frame& f, uint8_t b) {
    uint64_t next = 0;
    for (uint64_t c = f.m2; c; c &= c - 1) {
      int const i = std::countr_zero(c);
      std::string const& k = n.keys[i];
      if (k.size() > f.aux && static_cast<uint8_t>(k[f.aux]) == b) next |= uint64_t{1} << i;
    }
    if (next) {
      f.m2 = next;
      ++f.aux;
      return 1;
    }
    if (b != '"') return -1;
    for (uint64_t c = f.m2; c; c &= c - 1) {
      int const i = std::countr_zero(c);
      if (n.keys[i].size() == f.aux) {
        f.m2 = uint64_t{1} << i;
        f.extra = static_cast<uint32_t>(i);
        return 2;
      }
    }
    return -1;
  }

  bool run(Stack& s, uint8_t b);
  int step_object(Stack& s, uint8_t b);
  int step_array(Stack& s, uint8_t b);
  int step_dsml(Stack& s, uint8_t b);
};

/// Results of container steps: consumed, continue the loop (a child was pushed or the frame popped
/// before b), rejected.
constexpr int kConsumed = 0, kAgain = 1, kReject = -1;

int gap(GrammarDef const& g, Frame& f,
        uint8_t b) {  // 1 = whitespace consumed, 0 = not whitespace, −1 = too much
  if (!is_ws(b)) return 0;
  if (f.ws >= g.max_ws) return -1;
  ++f.ws;
  return 1;
}

int Runner::step_object(Stack& s, uint8_t b) {
  Frame& f = s.back();
  Node const& n = g.nodes[f.node];
  bool const free_keys = n.keys.empty();
  auto start_key = [&]() -> int {
    f.ws = 0;
    if (free_keys) {
      if (!fits(s, n.item)) return kReject;  // a key whose value could not fit would dead-end at ':'
      f.phase = 2;
      push(s, n.helpers[0]);
      return kAgain;
    }
    uint64_t const c = available_keys(s, n, f.m1);
    if (!c) return kReject;
    f.phase = 2;
    f.aux = 0;
    f.m2 = c;
    return kConsumed;
  };
  auto close = [&]() -> int {
    if ((f.m1 & n.required) != n.required) return kReject;
    s.pop_back();
    return kAgain + 1;  // finished, byte consumed
  };
  switch (f.phase) {
    case 0:
      if (b != '{') return kReject;
      f.phase = 1;
      return kConsumed;
    case 1:
    case 6: {
      int const w = gap(g, f, b);
      if (w) return w > 0 ? kConsumed : kReject;
      if (b == '"') return start_key();
      if (b == '}' && f.phase == 1) return close();
      return kReject;
    }
    case 2: {
      int const r = match_key(n, f, b);
      if (r < 0) return kReject;
      if (r == 2) {
        f.phase = 3;
        f.ws = 0;
      }
      return kConsumed;
    }
    case 3: {
      int const w = gap(g, f, b);
      if (w) return w > 0 ? kConsumed : kReject;
      if (b != ':') return kReject;
      f.phase = 4;
      f.ws = 0;
      return kConsumed;
    }
    case 4: {
      int const w = gap(g, f, b);
      if (w) return w > 0 ? kConsumed : kReject;
      int32_t const v = free_keys ? n.item : n.children[f.extra];
      push(s, v);
      return kAgain;
    }
    case 5: {
      int const w = gap(g, f, b);
      if (w) return w > 0 ? kConsumed : kReject;
      if (b == ',') {
        if (free_keys ? !fits(s, n.item) : !available_keys(s, n, f.m1)) return kReject;
        f.phase = 6;
        f.ws = 0;
        return kConsumed;
      }
      if (b == '}') return close();
      return kReject;
    }
  }
  return kReject;
}

int Runner::step_array(Stack& s, uint8_t b) {
  Frame& f = s.back();
  Node const& n = g.nodes[f.node];
  switch (f.phase) {
    case 0:
      if (b != '[') return kReject;
      f.phase = 1;
      return kConsumed;
    case 1:
    case 3: {
      int const w = gap(g, f, b);
      if (w) return w > 0 ? kConsumed : kReject;
      if (b == ']' && f.phase == 1) {
        if (n.min > 0) return kReject;
        s.pop_back();
        return kAgain + 1;
      }
      if (static_cast<int64_t>(f.count) >= n.max || !fits(s, n.item)) return kReject;
      push(s, n.item);
      return kAgain;
    }
    case 2: {
      int const w = gap(g, f, b);
      if (w) return w > 0 ? kConsumed : kReject;
      if (b == ',') {
        if (static_cast<int64_t>(f.count) >= n.max || !fits(s, n.item)) return kReject;
        f.phase = 3;
        f.ws = 0;
        return kConsumed;
      }
      if (b == ']') {
        if (static_cast<int64_t>(f.count) < n.min) return kReject;
        s.pop_back();
        return kAgain + 1;
      }
      return kReject;
    }
  }
  return kReject;
}

/// DSML parameter list. Phases: 0 between parameters (choice), 20/21/22 chosen: parameter / end /
/// zero-parameter newline; 30 parameter-open literal running; 2 key bytes; 31 free key running; 3
/// after the key (choice); 40/41 chosen string="true"/"false"; 50/52 raw path; 60–64 JSON path;
/// 32/33 newline.
int Runner::step_dsml(Stack& s, uint8_t b) {
  Frame& f = s.back();
  Node const& n = g.nodes[f.node];
  bool const free_keys = n.helpers[kFreeKey] != kNone;
  switch (f.phase) {
    case 0: {
      // Free keys: one parameter at most, because a finite state cannot exclude a repeated key (the
      // reference parser rejects duplicates).
      bool const free_value_fits = free_keys && ((n.helpers[kFreeRaw] != kNone && fits(s, n.helpers[kFreeRaw])) ||
                                                 (n.helpers[kFreeJson] != kNone && fits(s, n.helpers[kFreeJson])));
      bool const more = free_keys ? f.count == 0 && fits(s, n.helpers[kFreeKey]) && free_value_fits
                                  : available_keys(s, n, f.m1) != 0;
      bool const end = f.count >= 1 && (f.m1 & n.required) == n.required;
      bool const zero = f.count == 0 && n.required == 0;
      uint8_t opts[3];
      int k = 0;
      if (more) opts[k++] = 20;
      if (end) opts[k++] = 21;
      if (zero) opts[k++] = 22;
      if (k == 0) return kReject;
      for (int i = 1; i < k; ++i) {
        fork(s);
        pending[num_pending - 1].back().phase = opts[i];
      }
      f.phase = opts[0];
      return kAgain;
    }
    case 20:
      f.phase = 30;
      push(s, n.helpers[kParamOpen]);
      return kAgain;
    case 21:
      s.pop_back();
      return kAgain + 2;  // finished before b
    case 22:
      f.phase = 32;
      push(s, n.helpers[kNewline]);
      return kAgain;
    case 33:
      s.pop_back();
      return kAgain + 2;
    case 2: {
      int const r = match_key(n, f, b);
      if (r < 0) return kReject;
      if (r == 2) f.phase = 3;
      return kConsumed;
    }
    case 3: {
      int32_t const jv = free_keys ? n.helpers[kFreeJson] : n.children[f.extra];
      int32_t const rv = free_keys ? n.helpers[kFreeRaw] : n.raw[f.extra];
      bool const t = rv != kNone && fits(s, rv), fl = jv != kNone && fits(s, jv);
      if (t && fl) {
        fork(s);
        pending[num_pending - 1].back().phase = 41;
      }
      if (!t && !fl) return kReject;
      f.phase = t ? 40 : 41;
      return kAgain;
    }
    case 40:
      f.phase = 50;
      push(s, n.helpers[kStringTrue]);
      return kAgain;
    case 51: {
      f.phase = 52;
      push(s, free_keys ? n.helpers[kFreeRaw] : n.raw[f.extra]);
      return kAgain;
    }
    case 41:
      f.phase = 60;
      push(s, n.helpers[kStringFalse]);
      return kAgain;
    case 61: {
      f.phase = 62;
      push(s, free_keys ? n.helpers[kFreeJson] : n.children[f.extra]);
      return kAgain;
    }
    case 63:
      f.phase = 64;
      push(s, n.helpers[kParamClose]);
      return kAgain;
  }
  return kReject;
}

/// The parent of a finished frame learns that its child is done (may finish the parent too).
void notify(GrammarDef const& g, Stack& s) {
  while (!s.empty()) {
    Frame& p = s.back();
    Node const& n = g.nodes[p.node];
    switch (n.kind) {
      case NodeKind::kSeq:
        if (++p.count < n.children.size()) return;
        s.pop_back();
        continue;
      case NodeKind::kRepeat:
        ++p.count;
        p.phase = 0;
        return;
      case NodeKind::kObject:
        if (p.phase == 2) {
          p.phase = 3;
          p.ws = 0;
          return;
        }  // free key string done
        if (!n.keys.empty()) p.m1 |= p.m2;
        p.phase = 5;
        p.ws = 0;
        return;
      case NodeKind::kArray:
        ++p.count;
        p.phase = 2;
        p.ws = 0;
        return;
      case NodeKind::kDsmlParams:
        switch (p.phase) {
          case 30:
            if (n.helpers[kFreeKey] != kNone) {
              p.phase = 31;
              s.push_back(make_frame(n.helpers[kFreeKey]));
              return;
            }
            p.phase = 2;
            p.aux = 0;
            p.m2 = 0;
            {
              uint64_t c = 0;
              for (size_t i = 0; i < n.keys.size(); ++i) {
                if ((p.m1 >> i) & 1) continue;
                bool const ok =
                    (n.children[i] != kNone &&
                     static_cast<int>(s.size()) + g.nodes[n.children[i]].min_frames <=
                         g.max_depth) ||
                    (n.raw[i] != kNone &&
                     static_cast<int>(s.size()) + g.nodes[n.raw[i]].min_frames <= g.max_depth);
                if (ok) c |= uint64_t{1} << i;
              }
              p.m2 = c;
            }
            return;
          case 31:
            p.phase = 3;
            return;
          case 50:
            p.phase = 51;
            return;
          case 60:
            p.phase = 61;
            return;
          case 62:
            p.phase = 63;
            return;
          case 52:
          case 64:
            p.phase = 0;
            ++p.count;
            if (!n.keys.empty()) p.m1 |= p.m2;
            return;
          case 32:
            p.phase = 33;
            return;
        }
        return;
      default:
        return;  // leaves never have children
    }
  }
}

bool Runner::run(Stack& s, uint8_t b) {
  for (;;) {
    if (s.empty()) return false;
    Frame& f = s.back();
    Node const& n = g.nodes[f.node];
    switch (n.kind) {
      case NodeKind::kLiteral:
        if (static_cast<uint8_t>(n.lit[f.aux]) != b) return false;
        if (++f.aux == n.lit.size()) {
          s.pop_back();
          notify(g, s);
        }
        return true;
      case NodeKind::kLiteralSet: {
        // m1 = trie node. Consumed edge → new node; a terminal node without a matching edge ends
        // before b.
        uint32_t const t = static_cast<uint32_t>(f.m1);
        for (uint32_t e = n.lt_begin[t]; e < n.lt_begin[t + 1]; ++e) {
          if (n.lt_edges[e].first != b) continue;
          uint32_t const c = n.lt_edges[e].second;
          f.m1 = c;
          if (n.lt_terminal[c] && n.lt_begin[c] == n.lt_begin[c + 1]) {
            s.pop_back();
            notify(g, s);
          }
          return true;
        }
        if (!n.lt_terminal[t]) return false;
        s.pop_back();
        notify(g, s);
        continue;
      }
      case NodeKind::kSeq: {
        int32_t const c = n.children[f.count];
        push(s, c);
        continue;
      }
      case NodeKind::kAlt: {
        s.pop_back();
        int32_t first = kNone;
        for (int32_t c : n.children) {
          if (!fits(s, c)) continue;
          if (first == kNone) {
            first = c;
            continue;
          }
          fork(s);
          pending[num_pending - 1].push_back(make_frame(c));
        }
        if (first == kNone) return false;
        push(s, first);
        continue;
      }
      case NodeKind::kRepeat: {
        bool more = static_cast<int64_t>(f.count) < n.max && fits(s, n.item);
        bool end = static_cast<int64_t>(f.count) >= n.min;
        if (f.phase == 1) more = false;
        if (more && end) {
          fork(s);
          pending[num_pending - 1].back().phase = 1;
          end = false;
        }
        if (more) {
          push(s, n.item);
          continue;
        }
        if (end) {
          s.pop_back();
          notify(g, s);
          continue;
        }
        return false;
      }
      case NodeKind::kWs:
        if (is_ws(b) && f.ws < g.max_ws) {
          ++f.ws;
          return true;
        }
        s.pop_back();
        notify(g, s);
        continue;
      case NodeKind::kString:
      case NodeKind::kFreeText: {
        int const r = step_leaf(g, f, b);
        if (r < 0) return false;
        if (r == 1) {
          s.pop_back();
          notify(g, s);
        }
        return true;
      }
      case NodeKind::kNumber: {
        int const r = leaf_number_step(n, f, b);
        if (r < 0) return false;
        if (r == 0) return true;
        s.pop_back();
        notify(g, s);
        continue;
      }
      case NodeKind::kObject:
      case NodeKind::kArray:
      case NodeKind::kDsmlParams: {
        int const r = n.kind == NodeKind::kObject  ? step_object(s, b)
                      : n.kind == NodeKind::kArray ? step_array(s, b)
                                                   : step_dsml(s, b);
        if (r == kReject) return false;
        if (r == kConsumed) return true;
        if (r == kAgain) continue;
        notify(g, s);                      // the frame was popped
        if (r == kAgain + 1) return true;  // … after consuming b
        continue;                          // … before b
      }
    }
    return false;
  }
}

bool frame_can_end(GrammarDef const& g, Frame const& f) {
  Node const& n = g.nodes[f.node];
  switch (n.kind) {
    case NodeKind::kSeq:
      for (size_t i = f.count; i < n.children.size(); ++i)
        if (!g.nodes[n.children[i]].nullable) return false;
      return true;
    case NodeKind::kAlt:
      return n.nullable;
    case NodeKind::kRepeat:
      return static_cast<int64_t>(f.count) >= n.min;
    case NodeKind::kWs:
      return true;
    case NodeKind::kLiteralSet:
      return n.lt_terminal[static_cast<uint32_t>(f.m1)] != 0;
    case NodeKind::kNumber:
      return leaf_number_accepting(n, f);
    case NodeKind::kDsmlParams:
      return f.phase == 33 || (f.phase == 0 && f.count >= 1 && (f.m1 & n.required) == n.required);
    default:
      return false;
  }
}

}  // namespace

bool is_leaf(NodeKind k) { return k == NodeKind::kString || k == NodeKind::kFreeText; }

int step_leaf(GrammarDef const& g, Frame& f, uint8_t b) {
  Node const& n = g.nodes[f.node];
  return n.kind == NodeKind::kString ? leaf_string_step(g, n, f, b) : leaf_text_step(g, n, f, b);
}

int step_leaf_as(GrammarDef const& g, Node const& n, Frame& f, uint8_t b) {
  return n.kind == NodeKind::kString ? leaf_string_step(g, n, f, b) : leaf_text_step(g, n, f, b);
}

void finish_top(GrammarDef const& g, Stack& s) {
  s.pop_back();
  notify(g, s);
}

void StateSet::add(Frame const* f, size_t n) {
  for (size_t i = 0; i < size(); ++i)
    if (off[i + 1] - off[i] == n && std::memcmp(frames.data() + off[i], f, n * sizeof(Frame)) == 0)
      return;
  frames.insert(frames.end(), f, f + n);
  off.push_back(static_cast<uint32_t>(frames.size()));
}

std::string StateSet::key() const {
  std::string k(reinterpret_cast<char const*>(off.data()), off.size() * sizeof(uint32_t));
  k.append(reinterpret_cast<char const*>(frames.data()), frames.size() * sizeof(Frame));
  return k;
}

void step_set(GrammarDef const& g, StateSet const& in, uint8_t b, StateSet& out) {
  thread_local std::vector<Stack> pending_store;
  thread_local Stack work;
  Runner r{g, std::move(pending_store), 0};
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    work.assign(in.frames.begin() + in.off[i], in.frames.begin() + in.off[i + 1]);
    r.num_pending = 0;
    if (r.run(work, b)) out.add(work.data(), work.size());
    while (r.num_pending > 0) {
      Stack s = std::move(r.pending[--r.num_pending]);
      if (r.run(s, b)) out.add(s.data(), s.size());
    }
  }
  pending_store = std::move(r.pending);
}

StateSet initial_state(GrammarDef const& g) {
  StateSet s;
  Frame f = make_frame(g.root);
  s.add(&f, 1);
  return s;
}

bool can_finish(GrammarDef const& g, StateSet const& set) {
  for (size_t i = 0; i < set.size(); ++i) {
    Stack s(set.frames.begin() + set.off[i], set.frames.begin() + set.off[i + 1]);
    bool ok = true;
    while (!s.empty()) {
      if (!frame_can_end(g, s.back())) {
        ok = false;
        break;
      }
      s.pop_back();
      notify(g, s);
    }
    if (ok) return true;
  }
  return false;
}

int32_t GrammarDef::literal_set(std::vector<std::string> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  if (values.size() == 1) return literal(values[0]);
  // Trie with children listed per node: build with maps, then flatten.
  std::vector<std::vector<std::pair<uint8_t, uint32_t>>> kids(1);
  std::vector<uint8_t> term(1, 0);
  for (auto const& v : values) {
    uint32_t t = 0;
    for (char ch : v) {
      uint8_t const b = static_cast<uint8_t>(ch);
      uint32_t next = 0;
      for (auto const& [eb, c] : kids[t])
        if (eb == b) next = c;
      if (next == 0) {
        next = static_cast<uint32_t>(kids.size());
        kids[t].push_back({b, next});
        kids.emplace_back();
        term.push_back(0);
      }
      t = next;
    }
    term[t] = 1;
  }
  Node n;
  n.kind = NodeKind::kLiteralSet;
  n.lt_terminal = std::move(term);
  n.lt_begin.push_back(0);
  for (auto& k : kids) {
    std::sort(k.begin(), k.end());
    n.lt_edges.insert(n.lt_edges.end(), k.begin(), k.end());
    n.lt_begin.push_back(static_cast<uint32_t>(n.lt_edges.size()));
  }
  return add(std::move(n));
}

Status GrammarDef::finalize() {
  size_t const nn = nodes.size();
  for (auto& n : nodes) {
    n.min_frames = kInf;
    n.nullable = false;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nn; ++i) {
      Node& n = nodes[i];
      auto mf = [&](int32_t c) { return c == kNone ? kInf : nodes[c].min_frames; };
      int32_t v = kInf;
      bool nul = false;
      switch (n.kind) {
        case NodeKind::kLiteral:
          v = 1;
          nul = n.lit.empty();
          break;
        case NodeKind::kWs:
          v = 1;
          nul = true;
          break;
        case NodeKind::kLiteralSet:
          v = 1;
          nul = n.lt_terminal[0] != 0;
          break;
        case NodeKind::kString:
        case NodeKind::kFreeText:
        case NodeKind::kNumber:
          v = 1;
          break;
        case NodeKind::kSeq: {
          int32_t m = 0;
          nul = true;
          for (int32_t c : n.children) {
            m = std::max(m, mf(c));
            nul = nul && nodes[c].nullable;
          }
          v = m >= kInf ? kInf : 1 + m;
          break;
        }
        case NodeKind::kAlt:
          for (int32_t c : n.children) {
            v = std::min(v, mf(c));
            nul = nul || nodes[c].nullable;
          }
          break;
        case NodeKind::kRepeat:
        case NodeKind::kArray: {
          int32_t const m = n.min > 0 ? mf(n.item) : 0;
          v = m >= kInf ? kInf : 1 + m;
          nul = n.kind == NodeKind::kRepeat && (n.min == 0 || nodes[n.item].nullable);
          break;
        }
        case NodeKind::kObject: {
          int32_t m = n.keys.empty() ? 0 : 0;
          for (size_t k = 0; k < n.keys.size(); ++k)
            if ((n.required >> k) & 1) m = std::max(m, mf(n.children[k]));
          v = m >= kInf ? kInf : 1 + m;
          break;
        }
        case NodeKind::kDsmlParams: {
          int32_t m = 1;
          for (size_t k = 0; k < n.keys.size(); ++k)
            if ((n.required >> k) & 1) m = std::max(m, std::min(mf(n.children[k]), mf(n.raw[k])));
          v = m >= kInf ? kInf : 1 + m;
          break;
        }
      }
      v = std::min(v, kInf);
      if (v != n.min_frames || nul != n.nullable) {
        n.min_frames = v;
        n.nullable = nul;
        changed = true;
      }
    }
  }
  compute_min_bytes(*this);
  kmp.assign(nn, {});
  for (size_t i = 0; i < nn; ++i) {
    Node const& n = nodes[i];
    if (n.kind == NodeKind::kString) {
      if (n.forbidden.size() > 1)
        return invalid_argument("grammar: strings support one forbidden substring");
      if (n.forbidden.empty()) continue;
    } else if (n.kind != NodeKind::kFreeText) {
      continue;
    }
    if (n.kind == NodeKind::kFreeText && (n.lit.empty() || n.forbidden.size() > 3))
      return invalid_argument("grammar: bad free-text node");
    std::vector<std::string const*> pats;
    if (n.kind == NodeKind::kFreeText) pats.push_back(&n.lit);
    for (auto const& p : n.forbidden) {
      if (p.empty()) return invalid_argument("grammar: empty forbidden string");
      size_t const first = n.lit.find(p);
      if (first != std::string::npos && n.lit.find(p, first + 1) != std::string::npos)
        return invalid_argument("grammar: a forbidden string occurs twice in the terminator");
      pats.push_back(&p);
    }
    for (auto const* p : pats) {
      std::vector<uint16_t> fail(p->size(), 0);
      for (size_t q = 1, k = 0; q < p->size(); ++q) {
        while (k > 0 && (*p)[q] != (*p)[k]) k = fail[k - 1];
        if ((*p)[q] == (*p)[k]) ++k;
        fail[q] = static_cast<uint16_t>(k);
      }
      kmp[i].push_back(std::move(fail));
    }
  }
  if (root == kNone || nodes[root].min_frames > max_depth)
    return invalid_argument("grammar: no finite value satisfies the schema within max_depth = " +
                            std::to_string(max_depth) +
                            " nesting levels (unsatisfiable or unboundedly recursive)");
  return {};
}

}  // namespace tessera::model::grammar_detail

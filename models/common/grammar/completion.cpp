// SPDX-License-Identifier: Apache-2.0
/// Lower bounds on the bytes a grammar state still needs before it can end: Node::min_bytes (the fewest
/// bytes of a complete value of each node) and, per frame, what its phase still requires (open literals,
/// closing quotes and brackets, required keys / parameters / items not written yet at their smallest
/// values). GrammarMatcher::shortest_completion orders its search by them. Bounds only: they ignore
/// max_depth and take every choice at its cheapest, so the true remainder is never smaller.
#include <algorithm>
#include <bit>

#include "models/common/grammar/grammar_impl.hpp"

namespace tessera::model::grammar_detail {
namespace {

int64_t mul_sat(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > kInfBytes / b ? kInfBytes : std::min(kInfBytes, a * b);
}

/// Fewest characters of a number in the node's range: "0" when the range holds 0, else the integer
/// digits of the bound nearest 0 (plus '-'), or "0.d" for a magnitude below 1.
int64_t number_min_chars(Node const& n) {
  if (!n.bounded || (n.lo_units <= 0 && n.hi_units >= 0)) return 1;
  int64_t const near = n.lo_units > 0 ? n.lo_units : -n.hi_units;  // smallest magnitude, in units
  int64_t whole = near;
  for (int k = 0; k < (n.integer ? 0 : n.frac_cap); ++k) whole /= 10;
  int64_t chars = n.lo_units > 0 ? 0 : 1;
  if (whole == 0) return chars + 3;
  for (; whole > 0; whole /= 10) ++chars;
  return chars;
}

/// Fewest bytes from literal-set trie node t to a terminal node.
int64_t literal_set_distance(Node const& n, uint32_t t) {
  if (n.lt_terminal[t]) return 0;
  int64_t best = kInfBytes;
  for (uint32_t e = n.lt_begin[t]; e < n.lt_begin[t + 1]; ++e)
    best = std::min(best, 1 + literal_set_distance(n, n.lt_edges[e].second));
  return best;
}

/// Fewest bytes of one DSML parameter with declared key k: open, key, '"', then the raw or JSON form.
int64_t dsml_param_bytes(GrammarDef const& g, Node const& n, size_t k) {
  auto mb = [&](int32_t c) { return c == kNone ? kInfBytes : g.nodes[c].min_bytes; };
  int64_t const raw = mb(n.helpers[kStringTrue]) + mb(n.raw[k]);
  int64_t const js = mb(n.helpers[kStringFalse]) + mb(n.children[k]) + mb(n.helpers[kParamClose]);
  return std::min(kInfBytes, mb(n.helpers[kParamOpen]) + static_cast<int64_t>(n.keys[k].size()) + 1 + std::min(raw, js));
}

/// Lower bound on the bytes frame f still needs before it finishes; `top` = no child frame above it
/// (a frame with a child above counts only what follows that child).
int64_t frame_remaining(GrammarDef const& g, Frame const& f, bool top) {
  Node const& n = g.nodes[f.node];
  auto mb = [&](int32_t c) { return c == kNone ? kInfBytes : g.nodes[c].min_bytes; };
  auto sat = [](int64_t x) { return std::min(kInfBytes, std::max<int64_t>(0, x)); };
  switch (n.kind) {
    case NodeKind::kLiteral:
      return static_cast<int64_t>(n.lit.size()) - f.aux;
    case NodeKind::kLiteralSet:
      return literal_set_distance(n, static_cast<uint32_t>(f.m1));
    case NodeKind::kWs:
      return 0;
    case NodeKind::kNumber:
      return leaf_number_accepting(n, f) ? 0 : 1;
    case NodeKind::kString: {
      int64_t const missing = n.min == 0 ? 0 : std::max<int64_t>(0, n.min - static_cast<int64_t>(f.count));
      return f.phase == 0 ? sat(2 + n.min) : sat(1 + missing);
    }
    case NodeKind::kFreeText:
      return static_cast<int64_t>(n.lit.size()) - static_cast<int64_t>(f.m1 & 0xFFFF);
    case NodeKind::kAlt:
      return n.min_bytes;
    case NodeKind::kSeq: {
      int64_t b = 0;
      for (size_t i = f.count + (top ? 0 : 1); i < n.children.size(); ++i) b = sat(b + mb(n.children[i]));
      return b;
    }
    case NodeKind::kRepeat: {
      if (f.phase == 1 && top) return 0;
      int64_t const need = static_cast<int64_t>(n.min) - static_cast<int64_t>(f.count) - (top ? 0 : 1);
      return need <= 0 ? 0 : mul_sat(need, mb(n.item));
    }
    case NodeKind::kArray: {
      if (f.phase == 0) return n.min_bytes;
      int64_t need = static_cast<int64_t>(n.min) - static_cast<int64_t>(f.count);
      if (!top) need -= 1;  // the item above counts itself
      if (top && f.phase == 3) need = std::max<int64_t>(need, 1);  // after ','
      return need <= 0 ? 1 : sat(1 + mul_sat(need, mb(n.item)));
    }
    case NodeKind::kObject: {
      if (f.phase == 0) return n.min_bytes;
      bool const free_keys = n.keys.empty();
      // Required keys still to write; the key in progress (m2) counts separately.
      uint64_t const current = (f.phase >= 2 && f.phase <= 4 && !free_keys) ? f.m2 : 0;
      int64_t b = 1;  // '}'
      for (size_t k = 0; k < n.keys.size(); ++k)
        if (((n.required & ~f.m1 & ~current) >> k) & 1)
          b = sat(b + static_cast<int64_t>(n.keys[k].size()) + 3 + mb(n.children[k]));
      if (f.phase == 2 && free_keys) return top ? sat(b + 3 + mb(n.item)) : sat(b + 1 + mb(n.item));
      if (f.phase == 2) {  // inside a declared key: the cheapest candidate's rest
        int64_t best = kInfBytes;
        for (uint64_t c = f.m2; c; c &= c - 1) {
          int const k = std::countr_zero(c);
          best = std::min(best, static_cast<int64_t>(n.keys[k].size()) - f.aux + 2 + mb(n.children[k]));
        }
        return sat(b + best);
      }
      int32_t const value = free_keys ? n.item : n.children[f.extra];
      if (f.phase == 3) return sat(b + 1 + mb(value));
      if (f.phase == 4) return top ? sat(b + mb(value)) : b;
      return b;
    }
    case NodeKind::kDsmlParams: {
      bool const free_keys = n.helpers[kFreeKey] != kNone;
      // Parameters still required, the one in progress (key known: m2 is its bit; key being typed: m2
      // holds the candidates) apart; then what the one in progress still needs after the child above.
      bool const key_started = f.phase == 2 || f.phase == 3 || (f.phase >= 40 && f.phase <= 64);
      uint64_t const missing = n.required & ~f.m1 & ~(key_started ? f.m2 : 0);
      int64_t b = 0;
      for (size_t k = 0; k < n.keys.size(); ++k)
        if ((missing >> k) & 1) b = sat(b + dsml_param_bytes(g, n, k));
      int64_t const open = mb(n.helpers[kParamOpen]);
      // Value nodes of declared key k, or of the free key.
      auto raw_of = [&](size_t k) { return free_keys ? n.helpers[kFreeRaw] : n.raw[k]; };
      auto json_of = [&](size_t k) { return free_keys ? n.helpers[kFreeJson] : n.children[k]; };
      auto forms = [&](size_t k) {  // the shorter of string="true" RAW and string="false" JSON close
        return std::min(sat(mb(n.helpers[kStringTrue]) + mb(raw_of(k))),
                        sat(mb(n.helpers[kStringFalse]) + mb(json_of(k)) + mb(n.helpers[kParamClose])));
      };
      size_t const key = free_keys ? 0 : f.extra;
      auto rawv = [&] { return mb(raw_of(key)); };
      auto jsonv = [&] { return mb(json_of(key)); };
      switch (f.phase) {
        case 31:  // the free key's text above
          return forms(key);
        case 30:  // the open literal above; the parameter may be one of the missing ones
          return missing ? sat(b - open) : 0;
        case 2: {  // typing the key: the cheapest candidate's rest
          int64_t best = kInfBytes;
          for (uint64_t c = f.m2; c; c &= c - 1) {
            int const k = std::countr_zero(c);
            best = std::min(best, sat(static_cast<int64_t>(n.keys[k].size()) - f.aux + 1 + forms(k)));
          }
          return sat(b + best);
        }
        case 3:
          return sat(b + forms(key));
        case 40:
          return sat(b + mb(n.helpers[kStringTrue]) + rawv());
        case 50:
        case 51:
          return sat(b + rawv());
        case 41:
          return sat(b + mb(n.helpers[kStringFalse]) + jsonv() + mb(n.helpers[kParamClose]));
        case 60:
        case 61:
          return sat(b + jsonv() + mb(n.helpers[kParamClose]));
        case 62:
        case 63:
          return sat(b + mb(n.helpers[kParamClose]));
        default:
          return b;
      }
    }
  }
  return 0;
}

}  // namespace

/// A fixpoint from above: values only fall, and every node's value is a sum / min of its children's plus
/// constants, so recursive grammars settle too.
void compute_min_bytes(GrammarDef& g) {
  auto& nodes = g.nodes;
  size_t const nn = nodes.size();
  for (auto& n : nodes) n.min_bytes = kInfBytes;
  auto add = [](int64_t a, int64_t b) { return std::min(kInfBytes, a + b); };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nn; ++i) {
      Node& n = nodes[i];
      auto mb = [&](int32_t c) { return c == kNone ? kInfBytes : nodes[c].min_bytes; };
      int64_t b = kInfBytes;
      switch (n.kind) {
        case NodeKind::kLiteral:
          b = static_cast<int64_t>(n.lit.size());
          break;
        case NodeKind::kWs:
          b = 0;
          break;
        case NodeKind::kLiteralSet:
          b = literal_set_distance(n, 0);
          break;
        case NodeKind::kString:
          b = add(2, n.min);
          break;
        case NodeKind::kFreeText:
          b = add(static_cast<int64_t>(n.lit.size()), n.min);
          break;
        case NodeKind::kNumber:
          b = number_min_chars(n);
          break;
        case NodeKind::kSeq:
          b = 0;
          for (int32_t c : n.children) b = add(b, mb(c));
          break;
        case NodeKind::kAlt:
          for (int32_t c : n.children) b = std::min(b, mb(c));
          break;
        case NodeKind::kRepeat:
          b = n.min == 0 ? 0 : (mb(n.item) >= kInfBytes ? kInfBytes : mul_sat(n.min, mb(n.item)));
          break;
        case NodeKind::kArray:
          b = n.min == 0 ? 2 : (mb(n.item) >= kInfBytes ? kInfBytes : add(1, mul_sat(n.min, mb(n.item) + 1)));
          break;
        case NodeKind::kObject:
          b = 2;
          for (size_t k = 0; k < n.keys.size(); ++k)
            if ((n.required >> k) & 1) b = add(b, add(static_cast<int64_t>(n.keys[k].size()) + 3, mb(n.children[k])));
          break;
        case NodeKind::kDsmlParams:
          b = n.required == 0 ? 1 : 0;
          for (size_t k = 0; k < n.keys.size(); ++k)
            if ((n.required >> k) & 1) b = add(b, dsml_param_bytes(g, n, k));
          break;
      }
      if (b < n.min_bytes) {
        n.min_bytes = b;
        changed = true;
      }
    }
  }
}

int64_t completion_bytes_lower_bound(GrammarDef const& g, StateSet const& s) {
  int64_t best = kInfBytes;
  for (size_t i = 0; i < s.size(); ++i) {
    int64_t b = 0;
    for (uint32_t k = s.off[i]; k < s.off[i + 1]; ++k)
      b = std::min(kInfBytes, b + frame_remaining(g, s.frames[k], k + 1 == s.off[i + 1]));
    best = std::min(best, b);
  }
  return best;
}

}  // namespace tessera::model::grammar_detail

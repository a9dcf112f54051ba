// SPDX-License-Identifier: Apache-2.0
/// The byte step of the grammar pushdown automaton (grammar_impl.hpp): one frame per open node, children
/// pushed lazily when their first byte arrives, finished frames popped with a notification to their
/// parent. Choices (anyOf, optional repetition, DSML parameter vs end) fork the stack; forks that
/// cannot take the byte die. Nested values are only started when they fit under max_depth
/// (Node::min_frames), which is what keeps every live state completable.
#include <algorithm>
#include <bit>

#include "models/common/grammar/grammar_impl.hpp"

namespace tessera::model::grammar_detail {
namespace {

constexpr int32_t kInf = INT32_MAX / 4;

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\r' || b == '\t'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

/// UTF-8 lead byte → (continuation count, constraint on the first continuation byte), RFC 3629:
/// constraint 0: 80–BF, 1: A0–BF (after E0), 2: 80–9F (after ED), 3: 90–BF (after F0), 4: 80–8F (after F4).
bool utf8_lead(uint8_t b, int* rem, int* con) {
  if (b >= 0xC2 && b <= 0xDF) { *rem = 1; *con = 0; return true; }
  if (b == 0xE0) { *rem = 2; *con = 1; return true; }
  if (b == 0xED) { *rem = 2; *con = 2; return true; }
  if (b >= 0xE1 && b <= 0xEF) { *rem = 2; *con = 0; return true; }
  if (b == 0xF0) { *rem = 3; *con = 3; return true; }
  if (b >= 0xF1 && b <= 0xF3) { *rem = 3; *con = 0; return true; }
  if (b == 0xF4) { *rem = 3; *con = 4; return true; }
  return false;
}
bool utf8_cont_ok(uint8_t b, int con) {
  static constexpr uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
  return b >= lo[con] && b <= hi[con];
}
/// UTF-8 state in Frame::aux: bits 0–3 constraint, bits 4–7 continuation bytes still due.
int utf8_step(uint16_t& aux, uint8_t b) {  // 1 = consumed as continuation, 0 = not in a character, −1 = bad
  int const rem = aux >> 4;
  if (rem == 0) return 0;
  if (!utf8_cont_ok(b, aux & 0xF)) return -1;
  aux = static_cast<uint16_t>((rem - 1) << 4);
  return 1;
}

// ---- numbers ---------------------------------------------------------------------------------------

using I128 = __int128;
I128 pow10(int k) { I128 r = 1; while (k-- > 0) r *= 10; return r; }

/// Number frame: phase 0 start, 1 after '-', 2 integer "0", 3 integer digits, 4 after '.', 5 fraction
/// digits, 6 after e/E, 7 after exponent sign, 8 exponent digits. count = integer digits, extra bit 31 =
/// negative, extra low bits = fraction digits, aux = exponent digits, m1 = integer part, m2 = fraction.
bool num_negative(Frame const& f) { return (f.extra >> 31) != 0; }
int num_frac_digits(Frame const& f) { return static_cast<int>(f.extra & 0xFFFF); }

/// Whether some completion of the prefix in `f` (in phase `ph`) lies in [lo_units, hi_units].
bool num_feasible(Node const& n, Frame const& f, int ph) {
  if (!n.bounded) return true;
  int const fc = n.integer ? 0 : n.frac_cap;
  I128 const s = pow10(fc);
  auto hit = [&](I128 a, I128 b) {  // magnitude interval [a, b] → signed, intersect
    I128 lo = a, hi = b;
    if (num_negative(f)) { lo = -b; hi = -a; }
    return !(hi < n.lo_units || lo > n.hi_units);
  };
  I128 const m = static_cast<I128>(f.m1);
  int const nd = static_cast<int>(f.count);
  if (ph == 1) return hit(0, pow10(n.int_cap) * s - 1);
  if (ph == 2 || ph == 3) {
    for (int k = 0; k <= n.int_cap - nd; ++k) {
      if (k > 0 && m == 0) break;
      I128 const p = pow10(k);
      if (hit(m * p * s, (m + 1) * p * s - 1)) return true;
    }
    return false;
  }
  if (ph == 4 || ph == 5) {
    int const j = num_frac_digits(f);
    I128 const u = m * s + static_cast<I128>(f.m2) * pow10(fc - j);
    return hit(u, u + pow10(fc - j) - 1);
  }
  return true;
}

bool num_accepting(Node const& n, Frame const& f) {
  int const ph = f.phase;
  if (ph != 2 && ph != 3 && ph != 5 && ph != 8) return false;
  if (!n.bounded) return true;
  int const fc = n.integer ? 0 : n.frac_cap;
  I128 u = static_cast<I128>(f.m1) * pow10(fc);
  if (ph == 5) u += static_cast<I128>(f.m2) * pow10(fc - num_frac_digits(f));
  if (num_negative(f)) u = -u;
  return u >= n.lo_units && u <= n.hi_units;
}

/// 0 consumed, 2 finished before b (re-feed b to the parent), −1 rejected.
int step_number(Node const& n, Frame& f, uint8_t b) {
  auto int_digit = [&]() -> int {
    if (f.phase == 2) return -1;  // no digit after a leading 0
    if (static_cast<int>(f.count) + 1 > n.int_cap) return -1;
    Frame t = f;
    if (n.bounded) t.m1 = f.m1 * 10 + (b - '0');
    t.count = f.count + 1;
    t.phase = (f.count == 0 && b == '0') ? 2 : 3;
    if (!num_feasible(n, t, t.phase)) return -1;
    f = t;
    return 0;
  };
  auto frac_digit = [&]() -> int {
    int const j = num_frac_digits(f);
    if (j + 1 > n.frac_cap) return -1;
    Frame t = f;
    if (n.bounded) t.m2 = f.m2 * 10 + (b - '0');
    t.extra = (f.extra & 0x80000000u) | static_cast<uint32_t>(j + 1);
    t.phase = 5;
    if (!num_feasible(n, t, 5)) return -1;
    f = t;
    return 0;
  };
  auto end = [&]() { return num_accepting(n, f) ? 2 : -1; };
  switch (f.phase) {
    case 0:
      if (b == '-') {
        Frame t = f;
        t.extra |= 0x80000000u;
        t.phase = 1;
        if (!num_feasible(n, t, 1)) return -1;
        f = t;
        return 0;
      }
      return is_digit(b) ? int_digit() : -1;
    case 1: return is_digit(b) ? int_digit() : -1;
    case 2:
    case 3:
      if (is_digit(b)) return int_digit();
      if (b == '.' && !n.integer) {
        Frame t = f;
        t.phase = 4;
        if (!num_feasible(n, t, 4)) return -1;
        f = t;
        return 0;
      }
      if ((b == 'e' || b == 'E') && !n.integer && !n.bounded) { f.phase = 6; return 0; }
      return end();
    case 4: return is_digit(b) ? frac_digit() : -1;
    case 5:
      if (is_digit(b)) return frac_digit();
      if ((b == 'e' || b == 'E') && !n.bounded) { f.phase = 6; return 0; }
      return end();
    case 6:
      if (b == '+' || b == '-') { f.phase = 7; return 0; }
      if (is_digit(b)) { f.phase = 8; f.aux = 1; return 0; }
      return -1;
    case 7:
      if (is_digit(b)) { f.phase = 8; f.aux = 1; return 0; }
      return -1;
    case 8:
      if (is_digit(b) && f.aux < 3) { ++f.aux; return 0; }
      return end();
  }
  return -1;
}

// ---- leaves ----------------------------------------------------------------------------------------

/// Counted characters saturate at `min` when there is no maximum, so unbounded strings have finitely
/// many states (and hit the mask caches).
bool count_char(Node const& n, Frame& f) {
  if (static_cast<int64_t>(f.count) >= n.max) return false;
  if (n.max != kUnbounded || static_cast<int64_t>(f.count) < n.min) ++f.count;
  return true;
}

/// JSON string: phase 0 before the opening quote, 1 in text, 2 after '\', 3–7 \u hex digits (5: the
/// second digit after a 'D' must be 0–7, so no surrogate escapes), 10 inside a UTF-8 character.
int step_string(GrammarDef const& g, Node const& n, Frame& f, uint8_t b) {
  if (!n.forbidden.empty() && f.phase != 0 && !(f.phase == 1 && b == '"')) {
    // Raw bytes of the string must not contain forbidden[0] (e.g. DSML markup inside tool arguments).
    std::string const& p = n.forbidden[0];
    auto const& fail = g.kmp[f.node][0];
    size_t k = static_cast<size_t>(f.m1);
    while (k > 0 && static_cast<uint8_t>(p[k]) != b) k = fail[k - 1];
    if (static_cast<uint8_t>(p[k]) == b) ++k;
    if (k == p.size()) return -1;
    f.m1 = k;
  }
  switch (f.phase) {
    case 0: if (b != '"') return -1; f.phase = 1; return 0;
    case 1:
      if (b == '"') return static_cast<int64_t>(f.count) >= n.min ? 1 : -1;
      if (b == '\\') { if (!count_char(n, f)) return -1; f.phase = 2; return 0; }
      if (b < 0x20) return -1;
      if (b < 0x80) return count_char(n, f) ? 0 : -1;
      {
        int rem, con;
        if (!utf8_lead(b, &rem, &con) || !count_char(n, f)) return -1;
        f.aux = static_cast<uint16_t>((rem << 4) | con);
        f.phase = 10;
        return 0;
      }
    case 10:
      if (utf8_step(f.aux, b) != 1) return -1;
      if ((f.aux >> 4) == 0) f.phase = 1;
      return 0;
    case 2:
      if (b == 'u') { f.phase = 3; return 0; }
      if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
        f.phase = 1;
        return 0;
      }
      return -1;
    case 3: if (!is_hex(b)) return -1; f.phase = (b == 'd' || b == 'D') ? 5 : 4; return 0;
    case 4: if (!is_hex(b)) return -1; f.phase = 6; return 0;
    case 5: if (!(b >= '0' && b <= '7')) return -1; f.phase = 6; return 0;
    case 6: if (!is_hex(b)) return -1; f.phase = 7; return 0;
    case 7: if (!is_hex(b)) return -1; f.phase = 1; return 0;
  }
  return -1;
}

int utf8_chars(std::string_view s) {
  int c = 0;
  for (unsigned char ch : s) c += (ch & 0xC0) != 0x80;
  return c;
}

/// Free text: m1 packs one 16-bit KMP offset per pattern (0 = terminator, 1.. = forbidden), phase bit 0
/// = "a forbidden occurrence lies inside the terminator being matched": from then on every byte must
/// extend the terminator. aux = UTF-8 state. Text chars = count − chars(matched terminator prefix).
int step_text(GrammarDef const& g, Node const& n, Frame& f, uint8_t b) {
  int const u = utf8_step(f.aux, b);
  if (u < 0) return -1;
  int const tchars = utf8_chars(n.lit);
  if (u == 0) {  // a character starts
    if (b < 0x80) {
      if (b < 0x20 && b != '\n' && b != '\t' && b != '\r') return -1;
    } else {
      int rem, con;
      if (!utf8_lead(b, &rem, &con)) return -1;
      f.aux = static_cast<uint16_t>((rem << 4) | con);
    }
    // Terminator bytes are counted too; the count saturates when only a minimum matters.
    if (n.max != kUnbounded || (n.min > 0 && static_cast<int64_t>(f.count) < n.min + tchars)) ++f.count;
  }
  auto const& tables = g.kmp[f.node];
  size_t const np = 1 + n.forbidden.size();
  auto pattern = [&](size_t i) -> std::string const& { return i == 0 ? n.lit : n.forbidden[i - 1]; };
  uint64_t m = 0;
  int kt = 0, kt_old = static_cast<int>(f.m1 & 0xFFFF);
  for (size_t i = 0; i < np; ++i) {
    std::string const& p = pattern(i);
    int k = static_cast<int>((f.m1 >> (16 * i)) & 0xFFFF);
    while (k > 0 && static_cast<uint8_t>(p[k]) != b) k = tables[i][k - 1];
    if (static_cast<uint8_t>(p[k]) == b) ++k;
    if (i == 0) {
      kt = k;
    } else if (k == static_cast<int>(p.size())) {
      // A forbidden occurrence just ended; allowed only as part of the terminator prefix.
      bool const inside = kt >= k && n.lit.compare(kt - k, k, p) == 0;
      if (!inside) return -1;
      f.phase |= 1;
      k = tables[i][k - 1];
    }
    m |= static_cast<uint64_t>(k) << (16 * i);
  }
  if ((f.phase & 1) && kt != kt_old + 1) return -1;
  f.m1 = m;
  if (kt == static_cast<int>(n.lit.size())) {
    if ((f.aux >> 4) != 0) return -1;
    int64_t const text = static_cast<int64_t>(f.count) - tchars;
    return (n.min == 0 || text >= n.min) ? 1 : -1;
  }
  if (n.max != kUnbounded) {
    int64_t const text = static_cast<int64_t>(f.count) - utf8_chars(std::string_view(n.lit).substr(0, kt));
    if (text > n.max) return -1;
  }
  return 0;
}

// ---- the runner ------------------------------------------------------------------------------------

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
        ok = (n.children[i] != kNone && fits(s, n.children[i])) || (n.raw[i] != kNone && fits(s, n.raw[i]));
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
    if (next) { f.m2 = next; ++f.aux; return 1; }
    if (b != '"') return -1;
    for (uint64_t c = f.m2; c; c &= c - 1) {
      int const i = std::countr_zero(c);
      if (n.keys[i].size() == f.aux) { f.m2 = uint64_t{1} << i; f.extra = static_cast<uint32_t>(i); return 2; }
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

int gap(GrammarDef const& g, Frame& f, uint8_t b) {  // 1 = whitespace consumed, 0 = not whitespace, −1 = too much
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
      f.phase = 2;
      push(s, n.helpers[0]);
      return kAgain;
    }
    uint64_t const c = available_keys(s, n, f.m1);
    if (!c) return kReject;
    f.phase = 2; f.aux = 0; f.m2 = c;
    return kConsumed;
  };
  auto close = [&]() -> int {
    if ((f.m1 & n.required) != n.required) return kReject;
    s.pop_back();
    return kAgain + 1;  // finished, byte consumed
  };
  switch (f.phase) {
    case 0: if (b != '{') return kReject; f.phase = 1; return kConsumed;
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
      if (r == 2) { f.phase = 3; f.ws = 0; }
      return kConsumed;
    }
    case 3: {
      int const w = gap(g, f, b);
      if (w) return w > 0 ? kConsumed : kReject;
      if (b != ':') return kReject;
      f.phase = 4; f.ws = 0;
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
        if (!free_keys && !available_keys(s, n, f.m1)) return kReject;
        f.phase = 6; f.ws = 0;
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
    case 0: if (b != '[') return kReject; f.phase = 1; return kConsumed;
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
        f.phase = 3; f.ws = 0;
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
/// zero-parameter newline; 30 parameter-open literal running; 2 key bytes; 31 free key running; 3 after
/// the key (choice); 40/41 chosen string="true"/"false"; 50/52 raw path; 60–64 JSON path; 32/33 newline.
int Runner::step_dsml(Stack& s, uint8_t b) {
  Frame& f = s.back();
  Node const& n = g.nodes[f.node];
  bool const free_keys = n.helpers[kFreeKey] != kNone;
  switch (f.phase) {
    case 0: {
      bool const more = free_keys ? fits(s, n.helpers[kFreeKey]) : available_keys(s, n, f.m1) != 0;
      bool const end = f.count >= 1 && (f.m1 & n.required) == n.required;
      bool const zero = f.count == 0 && n.required == 0;
      uint8_t opts[3];
      int k = 0;
      if (more) opts[k++] = 20;
      if (end) opts[k++] = 21;
      if (zero) opts[k++] = 22;
      if (k == 0) return kReject;
      for (int i = 1; i < k; ++i) { fork(s); pending[num_pending - 1].back().phase = opts[i]; }
      f.phase = opts[0];
      return kAgain;
    }
    case 20: f.phase = 30; push(s, n.helpers[kParamOpen]); return kAgain;
    case 21: s.pop_back(); return kAgain + 2;  // finished before b
    case 22: f.phase = 32; push(s, n.helpers[kNewline]); return kAgain;
    case 33: s.pop_back(); return kAgain + 2;
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
      if (t && fl) { fork(s); pending[num_pending - 1].back().phase = 41; }
      if (!t && !fl) return kReject;
      f.phase = t ? 40 : 41;
      return kAgain;
    }
    case 40: f.phase = 50; push(s, n.helpers[kStringTrue]); return kAgain;
    case 51: {
      f.phase = 52;
      push(s, free_keys ? n.helpers[kFreeRaw] : n.raw[f.extra]);
      return kAgain;
    }
    case 41: f.phase = 60; push(s, n.helpers[kStringFalse]); return kAgain;
    case 61: {
      f.phase = 62;
      push(s, free_keys ? n.helpers[kFreeJson] : n.children[f.extra]);
      return kAgain;
    }
    case 63: f.phase = 64; push(s, n.helpers[kParamClose]); return kAgain;
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
      case NodeKind::kRepeat: ++p.count; p.phase = 0; return;
      case NodeKind::kObject:
        if (p.phase == 2) { p.phase = 3; p.ws = 0; return; }  // free key string done
        if (!n.keys.empty()) p.m1 |= p.m2;
        p.phase = 5; p.ws = 0;
        return;
      case NodeKind::kArray: ++p.count; p.phase = 2; p.ws = 0; return;
      case NodeKind::kDsmlParams:
        switch (p.phase) {
          case 30:
            if (n.helpers[kFreeKey] != kNone) { p.phase = 31; s.push_back(make_frame(n.helpers[kFreeKey])); return; }
            p.phase = 2; p.aux = 0; p.m2 = 0;
            {
              uint64_t c = 0;
              for (size_t i = 0; i < n.keys.size(); ++i) {
                if ((p.m1 >> i) & 1) continue;
                bool const ok = (n.children[i] != kNone && static_cast<int>(s.size()) + g.nodes[n.children[i]].min_frames <= g.max_depth) ||
                                (n.raw[i] != kNone && static_cast<int>(s.size()) + g.nodes[n.raw[i]].min_frames <= g.max_depth);
                if (ok) c |= uint64_t{1} << i;
              }
              p.m2 = c;
            }
            return;
          case 31: p.phase = 3; return;
          case 50: p.phase = 51; return;
          case 60: p.phase = 61; return;
          case 62: p.phase = 63; return;
          case 52:
          case 64:
            p.phase = 0; ++p.count;
            if (!n.keys.empty()) p.m1 |= p.m2;
            return;
          case 32: p.phase = 33; return;
        }
        return;
      default: return;  // leaves never have children
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
        if (++f.aux == n.lit.size()) { s.pop_back(); notify(g, s); }
        return true;
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
          if (first == kNone) { first = c; continue; }
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
        if (more && end) { fork(s); pending[num_pending - 1].back().phase = 1; end = false; }
        if (more) { push(s, n.item); continue; }
        if (end) { s.pop_back(); notify(g, s); continue; }
        return false;
      }
      case NodeKind::kWs:
        if (is_ws(b) && f.ws < g.max_ws) { ++f.ws; return true; }
        s.pop_back();
        notify(g, s);
        continue;
      case NodeKind::kString:
      case NodeKind::kFreeText: {
        int const r = step_leaf(g, f, b);
        if (r < 0) return false;
        if (r == 1) { s.pop_back(); notify(g, s); }
        return true;
      }
      case NodeKind::kNumber: {
        int const r = step_number(n, f, b);
        if (r < 0) return false;
        if (r == 0) return true;
        s.pop_back();
        notify(g, s);
        continue;
      }
      case NodeKind::kObject:
      case NodeKind::kArray:
      case NodeKind::kDsmlParams: {
        int const r = n.kind == NodeKind::kObject ? step_object(s, b)
                      : n.kind == NodeKind::kArray ? step_array(s, b)
                                                   : step_dsml(s, b);
        if (r == kReject) return false;
        if (r == kConsumed) return true;
        if (r == kAgain) continue;
        notify(g, s);                 // the frame was popped
        if (r == kAgain + 1) return true;  // … after consuming b
        continue;                     // … before b
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
    case NodeKind::kAlt: return n.nullable;
    case NodeKind::kRepeat: return static_cast<int64_t>(f.count) >= n.min;
    case NodeKind::kWs: return true;
    case NodeKind::kNumber: return num_accepting(n, f);
    case NodeKind::kDsmlParams:
      return f.phase == 33 || (f.phase == 0 && f.count >= 1 && (f.m1 & n.required) == n.required);
    default: return false;
  }
}

}  // namespace

bool is_leaf(NodeKind k) { return k == NodeKind::kString || k == NodeKind::kFreeText; }

int step_leaf(GrammarDef const& g, Frame& f, uint8_t b) {
  Node const& n = g.nodes[f.node];
  return n.kind == NodeKind::kString ? step_string(g, n, f, b) : step_text(g, n, f, b);
}

int step_leaf_as(GrammarDef const& g, Node const& n, Frame& f, uint8_t b) {
  return n.kind == NodeKind::kString ? step_string(g, n, f, b) : step_text(g, n, f, b);
}

void finish_top(GrammarDef const& g, Stack& s) {
  s.pop_back();
  notify(g, s);
}

void StateSet::add(Frame const* f, size_t n) {
  for (size_t i = 0; i < size(); ++i)
    if (off[i + 1] - off[i] == n && std::memcmp(frames.data() + off[i], f, n * sizeof(Frame)) == 0) return;
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
      if (!frame_can_end(g, s.back())) { ok = false; break; }
      s.pop_back();
      notify(g, s);
    }
    if (ok) return true;
  }
  return false;
}

Status GrammarDef::finalize() {
  size_t const nn = nodes.size();
  for (auto& n : nodes) { n.min_frames = kInf; n.nullable = false; }
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nn; ++i) {
      Node& n = nodes[i];
      auto mf = [&](int32_t c) { return c == kNone ? kInf : nodes[c].min_frames; };
      int32_t v = kInf;
      bool nul = false;
      switch (n.kind) {
        case NodeKind::kLiteral: v = 1; nul = n.lit.empty(); break;
        case NodeKind::kWs: v = 1; nul = true; break;
        case NodeKind::kString: case NodeKind::kFreeText: case NodeKind::kNumber: v = 1; break;
        case NodeKind::kSeq: {
          int32_t m = 0;
          nul = true;
          for (int32_t c : n.children) { m = std::max(m, mf(c)); nul = nul && nodes[c].nullable; }
          v = m >= kInf ? kInf : 1 + m;
          break;
        }
        case NodeKind::kAlt:
          for (int32_t c : n.children) { v = std::min(v, mf(c)); nul = nul || nodes[c].nullable; }
          break;
        case NodeKind::kRepeat: case NodeKind::kArray: {
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
      if (v != n.min_frames || nul != n.nullable) { n.min_frames = v; n.nullable = nul; changed = true; }
    }
  }
  kmp.assign(nn, {});
  for (size_t i = 0; i < nn; ++i) {
    Node const& n = nodes[i];
    if (n.kind == NodeKind::kString) {
      if (n.forbidden.size() > 1) return invalid_argument("grammar: strings support one forbidden substring");
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
                            std::to_string(max_depth) + " nesting levels (unsatisfiable or unboundedly recursive)");
  return {};
}

}  // namespace tessera::model::grammar_detail

// SPDX-License-Identifier: Apache-2.0
/// Steps of the frames that never have children: JSON numbers (optionally integer-only and
/// bounded), JSON strings (UTF-8 validated per RFC 3629, escapes, optional length bounds and one
/// forbidden raw substring) and free text ended by a terminator (KMP matching of the terminator and
/// forbidden substrings). See grammar_impl.hpp for the frame layout.
#include <algorithm>

#include "models/common/grammar/grammar_impl.hpp"

namespace tessera::model::grammar_detail {
namespace {

bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

/// UTF-8 lead byte → (continuation count, constraint on the first continuation byte), RFC 3629:
/// constraint 0: 80–BF, 1: A0–BF (after E0), 2: 80–9F (after ED), 3: 90–BF (after F0), 4: 80–8F
/// (after F4).
bool utf8_lead(uint8_t b, int* rem, int* con) {
  if (b >= 0xC2 && b <= 0xDF) {
    *rem = 1;
    *con = 0;
    return true;
  }
  if (b == 0xE0) {
    *rem = 2;
    *con = 1;
    return true;
  }
  if (b == 0xED) {
    *rem = 2;
    *con = 2;
    return true;
  }
  if (b >= 0xE1 && b <= 0xEF) {
    *rem = 2;
    *con = 0;
    return true;
  }
  if (b == 0xF0) {
    *rem = 3;
    *con = 3;
    return true;
  }
  if (b >= 0xF1 && b <= 0xF3) {
    *rem = 3;
    *con = 0;
    return true;
  }
  if (b == 0xF4) {
    *rem = 3;
    *con = 4;
    return true;
  }
  return false;
}
bool utf8_cont_ok(uint8_t b, int con) {
  static constexpr uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80},
                           hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
  return b >= lo[con] && b <= hi[con];
}
/// UTF-8 state in Frame::aux: bits 0–3 constraint, bits 4–7 continuation bytes still due.
int utf8_step(uint16_t& aux,
              uint8_t b) {  // 1 = consumed as continuation, 0 = not in a character, −1 = bad
  int const rem = aux >> 4;
  if (rem == 0) return 0;
  if (!utf8_cont_ok(b, aux & 0xF)) return -1;
  aux = static_cast<uint16_t>((rem - 1) << 4);
  return 1;
}

// ---- numbers
// ---------------------------------------------------------------------------------------

using I128 = __int128;
I128 pow10(int k) {
  I128 r = 1;
  while (k-- > 0) r *= 10;
  return r;
}

/// Number frame: phase 0 start, 1 after '-', 2 integer "0", 3 integer digits, 4 after '.', 5
/// fraction digits, 6 after e/E, 7 after exponent sign, 8 exponent digits. count = integer digits,
/// extra bit 31 = negative, extra low bits = fraction digits, aux = exponent digits, m1 = integer
/// part, m2 = fraction.
bool num_negative(Frame const& f) { return (f.extra >> 31) != 0; }
int num_frac_digits(Frame const& f) { return static_cast<int>(f.extra & 0xFFFF); }

/// Whether some completion of the prefix in `f` (in phase `ph`) lies in [lo_units, hi_units].
bool num_feasible(Node const& n, Frame const& f, int ph) {
  if (!n.bounded) return true;
  int const fc = n.integer ? 0 : n.frac_cap;
  I128 const s = pow10(fc);
  auto hit = [&](I128 a, I128 b) {  // magnitude interval [a, b] → signed, intersect
    I128 lo = a, hi = b;
    if (num_negative(f)) {
      lo = -b;
      hi = -a;
    }
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
    case 1:
      return is_digit(b) ? int_digit() : -1;
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
      if ((b == 'e' || b == 'E') && !n.integer && !n.bounded) {
        f.phase = 6;
        return 0;
      }
      return end();
    case 4:
      return is_digit(b) ? frac_digit() : -1;
    case 5:
      if (is_digit(b)) return frac_digit();
      if ((b == 'e' || b == 'E') && !n.bounded) {
        f.phase = 6;
        return 0;
      }
      return end();
    case 6:
      if (b == '+' || b == '-') {
        f.phase = 7;
        return 0;
      }
      if (is_digit(b)) {
        f.phase = 8;
        f.aux = 1;
        return 0;
      }
      return -1;
    case 7:
      if (is_digit(b)) {
        f.phase = 8;
        f.aux = 1;
        return 0;
      }
      return -1;
    case 8:
      if (is_digit(b) && f.aux < 2) {
        ++f.aux;
        return 0;
      }  // |exponent| ≤ 99: finite doubles
      return end();
  }
  return -1;
}

// ---- leaves
// ----------------------------------------------------------------------------------------

/// Counted characters saturate at `min` when there is no maximum, so unbounded strings have
/// finitely many states (and hit the mask caches).
bool count_char(Node const& n, Frame& f) {
  if (static_cast<int64_t>(f.count) >= n.max) return false;
  if (n.max != kUnbounded || static_cast<int64_t>(f.count) < n.min) ++f.count;
  return true;
}

/// JSON string: phase 0 before the opening quote, 1 in text, 2 after '\', 3–7 \u hex digits (5: the
/// second digit after a 'D' must be 0–7, so no surrogate escapes), 10 inside a UTF-8 character.
int step_string(GrammarDef const& g, Node const& n, Frame& f, uint8_t b) {
  if (!n.forbidden.empty() && f.phase != 0 && !(f.phase == 1 && b == '"')) {
    // Raw bytes of the string must not contain forbidden[0] (e.g. DSML markup inside tool
    // arguments).
    std::string const& p = n.forbidden[0];
    auto const& fail = g.kmp[f.node][0];
    size_t k = static_cast<size_t>(f.m1);
    while (k > 0 && static_cast<uint8_t>(p[k]) != b) k = fail[k - 1];
    if (static_cast<uint8_t>(p[k]) == b) ++k;
    if (k == p.size()) return -1;
    f.m1 = k;
  }
  switch (f.phase) {
    case 0:
      if (b != '"') return -1;
      f.phase = 1;
      return 0;
    case 1:
      if (b == '"') return static_cast<int64_t>(f.count) >= n.min ? 1 : -1;
      if (b == '\\') {
        if (!count_char(n, f)) return -1;
        f.phase = 2;
        return 0;
      }
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
      if (b == 'u') {
        f.phase = 3;
        return 0;
      }
      if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' ||
          b == 't') {
        f.phase = 1;
        return 0;
      }
      return -1;
    case 3:
      if (!is_hex(b)) return -1;
      f.phase = (b == 'd' || b == 'D') ? 5 : 4;
      return 0;
    case 4:
      if (!is_hex(b)) return -1;
      f.phase = 6;
      return 0;
    case 5:
      if (!(b >= '0' && b <= '7')) return -1;
      f.phase = 6;
      return 0;
    case 6:
      if (!is_hex(b)) return -1;
      f.phase = 7;
      return 0;
    case 7:
      if (!is_hex(b)) return -1;
      f.phase = 1;
      return 0;
  }
  return -1;
}

int utf8_chars(std::string_view s) {
  int c = 0;
  for (unsigned char ch : s) c += (ch & 0xC0) != 0x80;
  return c;
}

/// Free text: m1 packs one 16-bit KMP offset per pattern (0 = terminator, 1.. = forbidden), phase
/// bit 0 = "a forbidden occurrence lies inside the terminator being matched": from then on every
/// byte must extend the terminator. aux = UTF-8 state. Text chars = count − chars(matched
/// terminator prefix).
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
    if (n.max != kUnbounded || (n.min > 0 && static_cast<int64_t>(f.count) < n.min + tchars))
      ++f.count;
  }
  auto const& tables = g.kmp[f.node];
  size_t const np = 1 + n.forbidden.size();
  auto pattern = [&](size_t i) -> std::string const& {
    return i == 0 ? n.lit : n.forbidden[i - 1];
  };
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
    int64_t const text =
        static_cast<int64_t>(f.count) - utf8_chars(std::string_view(n.lit).substr(0, kt));
    if (text > n.max) return -1;
  }
  return 0;
}

}  // namespace

int leaf_number_step(Node const& n, Frame& f, uint8_t b) { return step_number(n, f, b); }
bool leaf_number_accepting(Node const& n, Frame const& f) { return num_accepting(n, f); }
int leaf_string_step(GrammarDef const& g, Node const& n, Frame& f, uint8_t b) {
  return step_string(g, n, f, b);
}
int leaf_text_step(GrammarDef const& g, Node const& n, Frame& f, uint8_t b) {
  return step_text(g, n, f, b);
}

}  // namespace tessera::model::grammar_detail

// SPDX-License-Identifier: Apache-2.0
/// JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it (spec/chat-format.md
/// §2.2): separators ", " and ": ", keys in insertion order (Boost.JSON objects keep it), non-ASCII raw,
/// `"` `\` and C0 controls escaped (\n \r \t \b \f, else \u00xx lowercase), `/` and DEL unescaped.
/// Floats follow `repr`: the shortest round-trip digits, positional when -4 < exponent10 + 1 ≤ 16 (with
/// ".0" appended to integral values), else d[.ddd]e±XX with at least two exponent digits.
/// Known gaps: integers beyond uint64 and NaN/Infinity (which Python accepts) are not representable.
#include <charconv>
#include <cmath>
#include <cstdio>

#include <boost/json.hpp>

#include "tessera/models/deepseek_v41/chat.hpp"

namespace tessera::models::deepseek_v41::chat {

namespace json = boost::json;

std::string python_json_string(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (u < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", u);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

namespace {

std::string python_float_repr(double x) {
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);   // shortest round trip
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp10 = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  int decpt = exp10 + 1;   // value = 0.digits × 10^decpt
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(decpt) - digits.size(), '0');
      out += ".0";
    } else {
      out.append(digits, 0, static_cast<size_t>(decpt));
      out += '.';
      out.append(digits, static_cast<size_t>(decpt), std::string::npos);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return out;
}

void dump(json::value const& v, std::string& out) {
  switch (v.kind()) {
    case json::kind::null: out += "null"; break;
    case json::kind::bool_: out += v.get_bool() ? "true" : "false"; break;
    case json::kind::int64: out += std::to_string(v.get_int64()); break;
    case json::kind::uint64: out += std::to_string(v.get_uint64()); break;
    case json::kind::double_: out += python_float_repr(v.get_double()); break;
    case json::kind::string: out += python_json_string(v.get_string()); break;
    case json::kind::array: {
      out += '[';
      bool first = true;
      for (auto const& e : v.get_array()) {
        if (!first) out += ", ";
        first = false;
        dump(e, out);
      }
      out += ']';
      break;
    }
    case json::kind::object: {
      out += '{';
      bool first = true;
      for (auto const& kv : v.get_object()) {
        if (!first) out += ", ";
        first = false;
        out += python_json_string(kv.key());
        out += ": ";
        dump(kv.value(), out);
      }
      out += '}';
      break;
    }
  }
}

}  // namespace

Result<std::string> python_json_dumps(std::string_view json_text, std::string_view what) {
  std::error_code ec;
  json::value v = json::parse(json_text, ec);
  if (ec) return malformed(std::string(what) + ": invalid JSON (" + ec.message() + ")");
  std::string out;
  dump(v, out);
  return out;
}

/// Internal: dump an already parsed value (used by the encoder for tool-call arguments).
std::string python_json_dumps_value(json::value const& v) {
  std::string out;
  dump(v, out);
  return out;
}

}  // namespace tessera::models::deepseek_v41::chat

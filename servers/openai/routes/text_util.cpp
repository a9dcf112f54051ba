// SPDX-License-Identifier: Apache-2.0
/// UTF-8 assembly and validation, stop-string hold-back, Python-style JSON text, and the byte-level
/// stand-in codec (ids 0..255 = bytes, 256.. = DeepSeek special tokens of spec/chat-format.md §2.1).
#include <charconv>
#include <cmath>
#include <cstdio>

#include <boost/json.hpp>

#include "servers/openai/routes/text.hpp"

namespace tessera::server {

// Length of the UTF-8 sequence starting at s[i] if valid and complete, 0 if invalid, -1 if truncated.
static int utf8_seq(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  if (c < 0x80) return 1;
  int len;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
  else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
  else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
  else return 0;
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -1;
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
    // Reject overlongs and surrogates as soon as the second byte shows them.
    if (k == 1) {
      if (len == 3 && c == 0xE0 && b(i + 1) < 0xA0) return 0;
      if (len == 3 && c == 0xED && b(i + 1) >= 0xA0) return 0;
      if (len == 4 && c == 0xF0 && b(i + 1) < 0x90) return 0;
      if (len == 4 && c == 0xF4 && b(i + 1) >= 0x90) return 0;
    }
  }
  return len;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int n = utf8_seq(s, i);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    int n = utf8_seq(pending_, i);
    if (n < 0) break;  // truncated: wait for the next token's bytes
    if (n == 0) { out += "\xEF\xBF\xBD"; ++i; continue; }
    out.append(pending_, i, static_cast<size_t>(n));
    i += static_cast<size_t>(n);
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out = pending_.empty() ? "" : "\xEF\xBF\xBD";
  pending_.clear();
  return out;
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  size_t cut = std::string::npos;
  for (auto const& s : stops_) {
    if (s.empty()) continue;
    size_t p = held_.find(s);
    if (p != std::string::npos && p < cut) cut = p;
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (auto const& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) { hold = k; break; }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = stopped_ ? "" : held_;
  held_.clear();
  return out;
}

static void dumps(boost::json::value const& v, std::string& out) {
  switch (v.kind()) {
    case boost::json::kind::null: out += "null"; return;
    case boost::json::kind::bool_: out += v.get_bool() ? "true" : "false"; return;
    case boost::json::kind::int64: out += std::to_string(v.get_int64()); return;
    case boost::json::kind::uint64: out += std::to_string(v.get_uint64()); return;
    case boost::json::kind::double_: {
      double d = v.get_double();
      if (std::isnan(d)) { out += "NaN"; return; }
      if (std::isinf(d)) { out += d > 0 ? "Infinity" : "-Infinity"; return; }
      char buf[64];
      if (d == std::floor(d) && std::fabs(d) < 1e16) {
        std::snprintf(buf, sizeof buf, "%.1f", d);
        out += buf;
        return;
      }
      // Python repr: the shortest round-trip digits, fixed notation for exponents in [-4, 16), else
      // d[.ddd]e±XX with at least two exponent digits.
      auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
      std::string sci(buf, r.ptr);
      size_t e = sci.find('e');
      int exp10 = std::stoi(sci.substr(e + 1));
      std::string sign = sci[0] == '-' ? "-" : "";
      std::string digits;
      for (size_t k = sign.size(); k < e; ++k) if (sci[k] != '.') digits += sci[k];
      if (exp10 >= -4 && exp10 < 16) {
        std::string fixed;
        if (exp10 < 0) fixed = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
        else if (static_cast<int>(digits.size()) <= exp10 + 1) fixed = digits + std::string(exp10 + 1 - digits.size(), '0') + ".0";
        else fixed = digits.substr(0, exp10 + 1) + "." + digits.substr(exp10 + 1);
        out += sign + fixed;
      } else {
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        out += sign;
        out += digits[0];
        if (digits.size() > 1) { out += '.'; out.append(digits, 1, std::string::npos); }
        out += eb;
      }
      return;
    }
    case boost::json::kind::string: {
      out += '"';
      for (char ch : v.get_string()) {
        auto c = static_cast<unsigned char>(ch);
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          default:
            if (c < 0x20) {
              char buf[8];
              std::snprintf(buf, sizeof buf, "\\u%04x", c);
              out += buf;
            } else {
              out += ch;
            }
        }
      }
      out += '"';
      return;
    }
    case boost::json::kind::array: {
      out += '[';
      bool first = true;
      for (auto const& e : v.get_array()) { if (!first) out += ", "; first = false; dumps(e, out); }
      out += ']';
      return;
    }
    case boost::json::kind::object: {
      out += '{';
      bool first = true;
      for (auto const& kv : v.get_object()) {
        if (!first) out += ", ";
        first = false;
        dumps(boost::json::string(kv.key()), out);
        out += ": ";
        dumps(kv.value(), out);
      }
      out += '}';
      return;
    }
  }
}

std::string python_json_dumps(boost::json::value const& v) {
  std::string out;
  dumps(v, out);
  return out;
}

namespace {

char const* const kSpecials[] = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                                 "<｜System｜>", "<think>", "</think>", "｜DSML｜"};
constexpr int kNumSpecials = sizeof(kSpecials) / sizeof(kSpecials[0]);

class ByteCodec final : public TextCodec {
 public:
  std::string name() const override { return "byte-level stand-in"; }
  int64_t vocab_size() const override { return 256 + kNumSpecials; }
  std::vector<int32_t> encode(std::string_view text, bool special) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size();) {
      int hit = -1;
      if (special)
        for (int k = 0; k < kNumSpecials; ++k)
          if (text.substr(i).starts_with(kSpecials[k])) { hit = k; break; }
      if (hit >= 0) {
        ids.push_back(256 + hit);
        i += std::string_view(kSpecials[hit]).size();
      } else {
        ids.push_back(static_cast<uint8_t>(text[i++]));
      }
    }
    return ids;
  }
  std::string token_bytes(int32_t id) const override {
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    if (id >= 256 && id < 256 + kNumSpecials) return kSpecials[id - 256];
    return {};
  }
  std::optional<int32_t> special_id(std::string_view token) const override {
    for (int k = 0; k < kNumSpecials; ++k) if (token == kSpecials[k]) return 256 + k;
    return std::nullopt;
  }
};

}  // namespace

std::unique_ptr<TextCodec> make_byte_codec() { return std::make_unique<ByteCodec>(); }

}  // namespace tessera::server

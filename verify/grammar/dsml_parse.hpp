// SPDX-License-Identifier: Apache-2.0
/// A strict parser of DSML tool-call completions written from spec/chat-format.md §3.1/§3.2,
/// independent of the grammar: it rebuilds each call's `arguments` as the reference parser does
/// ({"KEY": json.dumps(RAW) | JSON, …}).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <boost/json.hpp>

namespace tessera::verify {

inline std::string const kDsmlBar =
    "\xEF\xBD\x9C"
    "DSML"
    "\xEF\xBD\x9C";  // ｜DSML｜

struct Call {
  std::string name;
  std::string arguments;  // JSON text rebuilt as the reference parser does
};

/// Strict parse of a DSML completion (without EOS) per §3.1/§3.2; returns false with a reason.
inline bool parse_dsml(std::string const& text, bool thinking, std::vector<Call>* calls,
                       std::string* why) {
  size_t p = 0;
  auto expect = [&](std::string const& s) {
    if (text.compare(p, s.size(), s) != 0) {
      *why = "expected '" + s + "' at " + std::to_string(p);
      return false;
    }
    p += s.size();
    return true;
  };
  if (thinking) {
    size_t const e = text.find("</think>");
    if (e == std::string::npos) {
      *why = "missing </think>";
      return false;
    }
    if (text.substr(0, e).find(kDsmlBar) != std::string::npos) {
      *why = "DSML inside reasoning";
      return false;
    }
    p = e + 8;
  }
  if (!expect("\n\n<" + kDsmlBar + " calls>\n")) return false;
  while (text.compare(p, 1 + kDsmlBar.size(), "<" + kDsmlBar) == 0) {
    if (!expect("<" + kDsmlBar + " invoke name=\"")) return false;
    size_t const q = text.find('"', p);
    if (q == std::string::npos) {
      *why = "unterminated name";
      return false;
    }
    Call c{text.substr(p, q - p), "{"};
    p = q;
    if (!expect("\">\n")) return false;
    std::map<std::string, int> seen;
    bool first = true;
    if (text.compare(p, 1, "\n") == 0) {
      ++p;
    } else {
      while (text.compare(p, 1 + kDsmlBar.size(), "<" + kDsmlBar) == 0) {
        if (!expect("<" + kDsmlBar + " parameter name=\"")) return false;
        size_t const k = text.find('"', p);
        std::string const key = text.substr(p, k - p);
        p = k;
        if (seen[key]++) {
          *why = "duplicate key " + key;
          return false;
        }
        if (!expect("\" string=\"")) return false;
        bool str;
        if (text.compare(p, 4, "true") == 0) {
          str = true;
          p += 4;
        } else if (text.compare(p, 5, "false") == 0) {
          str = false;
          p += 5;
        } else {
          *why = "bad string attribute";
          return false;
        }
        if (!expect("\">")) return false;
        std::string const end = "</" + kDsmlBar + " parameter>";
        size_t const e = text.find(end, p);
        if (e == std::string::npos) {
          *why = "unterminated parameter";
          return false;
        }
        std::string const v = text.substr(p, e - p);
        if (v.find(kDsmlBar) != std::string::npos) {
          *why = "DSML inside a value";
          return false;
        }
        p = e + end.size();
        if (!expect("\n")) return false;
        c.arguments += (first ? "" : ", ") + boost::json::serialize(boost::json::value(key)) +
                       ": " + (str ? boost::json::serialize(boost::json::value(v)) : v);
        first = false;
      }
    }
    c.arguments += "}";
    if (!expect("</" + kDsmlBar + " invoke>\n")) return false;
    calls->push_back(c);
  }
  if (!expect("</" + kDsmlBar + " calls>")) return false;
  if (p != text.size()) {
    *why = "trailing text";
    return false;
  }
  return true;
}

}  // namespace tessera::verify

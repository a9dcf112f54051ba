// SPDX-License-Identifier: Apache-2.0
/// Server-sent events framing (WHATWG HTML §9.2): one `data:` line per event (JSON never contains a raw
/// newline), a blank line after each event, comments (`: …`) as keep-alives, `data: [DONE]` last.
#pragma once

#include <string>
#include <string_view>

namespace tessera::server {

/// One event carrying `payload`; a payload with newlines is split into several `data:` lines.
inline std::string sse_data(std::string_view payload) {
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = payload.find('\n', start);
    out += "data: ";
    out.append(payload.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    out += '\n';
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  out += '\n';
  return out;
}

inline std::string sse_comment(std::string_view text) { return ": " + std::string(text) + "\n\n"; }
inline std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace tessera::server

// SPDX-License-Identifier: Apache-2.0
/// A small blocking HTTP/1.1 client (Boost.Beast) for the verification tools: one request per
/// connection, the body delivered in pieces as it arrives so a caller can read an SSE stream and drop the
/// connection mid-stream (client disconnect), plus an SSE splitter (`data:` payloads, comments skipped).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/status.hpp"

namespace tessera::harness {

/// `http://host[:port][/prefix]`; a trailing `/v1` or `/` is dropped, so routes are `/v1/...` and `/health`.
struct Url {
  std::string host;
  uint16_t port = 80;
  std::string root;  // path before /v1, usually empty
  std::string str() const;
};
Result<Url> parse_url(std::string const& text);

struct HttpResult {
  int status = 0;            // 0 = no response (transport error, see error)
  std::string body;          // what arrived (all of it unless aborted)
  std::string content_type;
  std::string error;         // transport error, empty on success
  bool aborted = false;      // the chunk callback asked to drop the connection
  double seconds = 0;
};

/// Called with each body piece; return false to close the connection at once.
using ChunkFn = std::function<bool(std::string_view)>;

/// One request on a fresh connection. `timeout_s` bounds the whole exchange.
HttpResult http_request(Url const& url, std::string_view method, std::string const& target, std::string const& body,
                        double timeout_s, ChunkFn const& on_chunk = {});

/// Splits an SSE byte stream into `data:` payloads (multi-line data joined with '\n'); `: comment`
/// events are counted, not returned. `malformed` is set by lines that are neither.
class SseSplitter {
 public:
  /// Appends bytes; returns the payloads of the events completed by them.
  std::vector<std::string> push(std::string_view bytes);
  bool malformed() const { return malformed_; }
  int comments() const { return comments_; }
  /// Bytes after the last complete event (a well-formed stream ends with none).
  std::string const& pending() const { return buf_; }

 private:
  std::string buf_;
  bool malformed_ = false;
  int comments_ = 0;
};

}  // namespace tessera::harness

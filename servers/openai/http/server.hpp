// SPDX-License-Identifier: Apache-2.0
/// HTTP/1.1 transport on Boost.Beast/Asio: one acceptor thread, one thread per connection (bounded),
/// keep-alive, request limits (header and body size, idle timeout), chunked SSE streaming, and a
/// disconnect probe the routes poll while a request runs. The routes behind it are `Api`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "servers/openai/routes/api.hpp"

namespace tessera::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;              // 0 = pick a free port
  size_t max_body_bytes = 8u << 20;  // larger bodies → 413
  size_t max_header_bytes = 16u << 10;
  int max_connections = 512;         // more → 503 and close
  double idle_timeout_s = 60;        // a connection silent this long is closed
};

class HttpServer {
 public:
  HttpServer(Api& api, HttpOptions options);
  ~HttpServer();
  /// Binds and starts accepting; kIoError when the address can't be bound.
  Status start();
  uint16_t port() const;
  /// Stops accepting; existing connections finish their current request.
  void stop_accepting();
  /// Closes every connection and joins the threads (after stop_accepting and the drain).
  void shutdown();
  int connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::server

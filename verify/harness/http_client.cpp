// SPDX-License-Identifier: Apache-2.0
/// Beast client and SSE splitter (see http_client.hpp).
#include "verify/harness/http_client.hpp"

#include <chrono>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace tessera::harness {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::string Url::str() const { return "http://" + host + ":" + std::to_string(port) + root; }

Result<Url> parse_url(std::string const& text) {
  std::string s = text;
  if (s.rfind("http://", 0) != 0) return invalid_argument("URL '" + text + "': only http://host:port URLs are supported");
  s = s.substr(7);
  Url u;
  size_t slash = s.find('/');
  std::string hostport = s.substr(0, slash);
  u.root = slash == std::string::npos ? "" : s.substr(slash);
  while (!u.root.empty() && u.root.back() == '/') u.root.pop_back();
  if (u.root.size() >= 3 && u.root.compare(u.root.size() - 3, 3, "/v1") == 0) u.root.resize(u.root.size() - 3);
  size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) {
    u.host = hostport;
  } else {
    u.host = hostport.substr(0, colon);
    std::string p = hostport.substr(colon + 1);
    char* end = nullptr;
    long v = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end || v < 1 || v > 65535) return invalid_argument("URL '" + text + "': bad port '" + p + "'");
    u.port = static_cast<uint16_t>(v);
  }
  if (u.host.empty()) return invalid_argument("URL '" + text + "': no host");
  return u;
}

HttpResult http_request(Url const& url, std::string_view method, std::string const& target, std::string const& body,
                        double timeout_s, ChunkFn const& on_chunk) {
  auto const t0 = std::chrono::steady_clock::now();
  HttpResult out;
  auto finish = [&] {
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  };
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    beast::error_code ec;
    auto const results = resolver.resolve(url.host, std::to_string(url.port), ec);
    if (ec) { out.error = "resolve " + url.host + ": " + ec.message(); return finish(); }
    stream.connect(results, ec);
    if (ec) { out.error = "connect " + url.str() + ": " + ec.message(); return finish(); }
    http::request<http::string_body> req{http::string_to_verb(method), url.root + target, 11};
    req.set(http::field::host, url.host);
    req.set(http::field::user_agent, "tessera-verify");
    req.set(http::field::connection, "close");
    if (!body.empty() || method == "POST") {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
    }
    http::write(stream, req, ec);
    if (ec) { out.error = "write: " + ec.message(); return finish(); }
    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(uint64_t{1} << 30);
    http::read_header(stream, buf, p, ec);
    if (ec) { out.error = "read header: " + ec.message(); return finish(); }
    out.status = static_cast<int>(p.get().result_int());
    out.content_type = std::string(p.get()[http::field::content_type]);
    char chunk[16384];
    while (!p.is_done()) {
      p.get().body().data = chunk;
      p.get().body().size = sizeof chunk;
      http::read(stream, buf, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      size_t n = sizeof chunk - p.get().body().size;
      if (n > 0) {
        std::string_view piece(chunk, n);
        out.body.append(piece);
        if (on_chunk && !on_chunk(piece)) {
          out.aborted = true;
          stream.socket().shutdown(tcp::socket::shutdown_both, ec);
          stream.socket().close(ec);
          return finish();
        }
      }
      if (ec) { out.error = "read body: " + ec.message(); return finish(); }
    }
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  } catch (std::exception const& e) {
    out.error = e.what();
  }
  return finish();
}

std::vector<std::string> SseSplitter::push(std::string_view bytes) {
  buf_.append(bytes);
  std::vector<std::string> out;
  for (;;) {
    size_t end = buf_.find("\n\n");
    if (end == std::string::npos) break;
    std::string event = buf_.substr(0, end);
    buf_.erase(0, end + 2);
    std::string data;
    bool any_data = false, all_comments = true;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      std::string line = event.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      pos = nl == std::string::npos ? event.size() + 1 : nl + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty() && line[0] == ':') continue;
      all_comments = false;
      if (line.rfind("data:", 0) == 0) {
        std::string v = line.substr(5);
        if (!v.empty() && v[0] == ' ') v.erase(0, 1);
        if (any_data) data += '\n';
        data += v;
        any_data = true;
      } else if (line.rfind("event:", 0) == 0 || line.rfind("id:", 0) == 0 || line.rfind("retry:", 0) == 0) {
        continue;
      } else {
        malformed_ = true;
      }
    }
    if (all_comments) { ++comments_; continue; }
    if (any_data) out.push_back(std::move(data));
  }
  return out;
}

}  // namespace tessera::harness

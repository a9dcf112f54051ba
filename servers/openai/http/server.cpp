// SPDX-License-Identifier: Apache-2.0
/// Beast transport (see server.hpp). Streaming responses use chunked transfer encoding so the
/// connection can be kept alive after `data: [DONE]`.
#include "servers/openai/http/server.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace tessera::server {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

char const* reason(int status) {
  return http::obsolete_reason(static_cast<http::status>(status)).data();
}

class BeastConnection final : public Connection {
 public:
  explicit BeastConnection(tcp::socket& s) : sock_(s) {}
  bool client_gone() override {
    if (gone_) return true;
    pollfd p{sock_.native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0) {
      if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) gone_ = true;
      else if (p.revents & POLLIN) {
        char c;
        ssize_t k = ::recv(sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0) gone_ = true;
      }
    }
    return gone_;
  }
  bool begin_stream() override {
    std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                       "Transfer-Encoding: chunked\r\nX-Accel-Buffering: no\r\n" + extra_headers_ + "\r\n";
    streaming_ = true;
    return raw(head);
  }
  bool write(std::string_view data) override {
    if (data.empty()) return !gone_;
    char len[32];
    std::snprintf(len, sizeof len, "%zx\r\n", data.size());
    std::string frame = len;
    frame.append(data);
    frame += "\r\n";
    return raw(frame);
  }
  void end_stream() override { raw("0\r\n\r\n"); }
  bool streaming() const { return streaming_; }
  void set_extra_headers(std::string h) { extra_headers_ = std::move(h); }

 private:
  bool raw(std::string_view s) {
    if (gone_) return false;
    boost::system::error_code ec;
    net::write(sock_, net::buffer(s.data(), s.size()), ec);
    if (ec) gone_ = true;
    return !gone_;
  }
  tcp::socket& sock_;
  bool gone_ = false;
  bool streaming_ = false;
  std::string extra_headers_;
};

}  // namespace

struct HttpServer::Impl {
  Api& api;
  HttpOptions opt;
  net::io_context io;
  tcp::acceptor acceptor{io};
  std::thread accept_thread;
  std::atomic<bool> accepting{false};
  mutable std::mutex mu;
  std::condition_variable cv;
  std::set<int> fds;  // open connection sockets
  int threads = 0;

  Impl(Api& a, HttpOptions o) : api(a), opt(std::move(o)) {}

  void simple_reply(tcp::socket& sock, HttpResponse const& r, bool keep_alive, bool head_only = false) {
    std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " + reason(r.status) + "\r\nContent-Type: " + r.content_type +
                       "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n";
    for (auto const& [k, v] : r.headers) head += k + ": " + v + "\r\n";
    head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    boost::system::error_code ec;
    std::array<net::const_buffer, 2> bufs{net::buffer(head), net::buffer(head_only ? std::string_view() : std::string_view(r.body))};
    net::write(sock, bufs, ec);
  }

  void serve(tcp::socket sock) {
    timeval tv{static_cast<time_t>(opt.idle_timeout_s), 0};
    ::setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    beast::flat_buffer buf;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(opt.max_body_bytes);
      parser.header_limit(static_cast<uint32_t>(opt.max_header_bytes));
      boost::system::error_code ec;
      http::read(sock, buf, parser, ec);
      if (ec == http::error::body_limit) {
        simple_reply(sock, Api::error_response({413, "the request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes",
                                                "invalid_request_error", "", "request_too_large"}), false);
        break;
      }
      if (ec == http::error::header_limit) {
        simple_reply(sock, Api::error_response({431, "the request headers are too large", "invalid_request_error", "", ""}), false);
        break;
      }
      if (ec) {
        // Beast's HTTP parse errors (bad method, bad target, bad version...) get a 400; socket errors and
        // a clean end of stream just close.
        if (ec.category() == make_error_code(http::error::bad_method).category() && ec != http::error::end_of_stream &&
            ec != http::error::partial_message)
          simple_reply(sock, Api::error_response({400, "malformed HTTP request: " + ec.message(), "invalid_request_error", "", ""}), false);
        break;
      }
      auto& m = parser.get();
      HttpRequest req;
      req.method = std::string(m.method_string());
      req.target = std::string(m.target());
      req.body = std::move(m.body());
      for (auto const& f : m) {
        std::string k(f.name_string());
        for (auto& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        req.headers.emplace_back(std::move(k), std::string(f.value()));
      }
      bool keep = m.keep_alive();
      BeastConnection conn(sock);
      if (api.options().cors) conn.set_extra_headers("Access-Control-Allow-Origin: *\r\n");
      std::optional<HttpResponse> r;
      try {
        r = api.handle(req, conn);
      } catch (std::exception const& e) {
        r = Api::error_response({500, std::string("internal error: ") + e.what(), "server_error", "", "internal_error"});
      }
      if (conn.streaming()) { if (!keep || conn.client_gone()) break; continue; }
      if (!r) break;  // the client went away before a response
      simple_reply(sock, *r, keep, req.method == "HEAD");
      if (!keep) break;
    }
    boost::system::error_code ec;
    sock.shutdown(tcp::socket::shutdown_both, ec);
  }

  void accept_loop() {
    while (accepting) {
      boost::system::error_code ec;
      tcp::socket sock(io);
      acceptor.accept(sock, ec);
      if (ec) {
        if (!accepting) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      int fd = sock.native_handle();
      {
        std::lock_guard lk(mu);
        if (threads >= opt.max_connections) {
          simple_reply(sock, Api::error_response({503, "too many connections", "server_error", "", "server_overloaded"}), false);
          continue;
        }
        ++threads;
        fds.insert(fd);
      }
      std::thread([this, s = std::move(sock), fd]() mutable {
        serve(std::move(s));
        std::lock_guard lk(mu);
        fds.erase(fd);
        --threads;
        cv.notify_all();
      }).detach();
    }
  }
};

HttpServer::HttpServer(Api& api, HttpOptions options) : impl_(std::make_unique<Impl>(api, std::move(options))) {}
HttpServer::~HttpServer() { shutdown(); }

Status HttpServer::start() {
  boost::system::error_code ec;
  auto addr = net::ip::make_address(impl_->opt.host, ec);
  if (ec) return invalid_argument("--host '" + impl_->opt.host + "' is not an IP address");
  tcp::endpoint ep(addr, impl_->opt.port);
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return io_error("cannot listen on " + impl_->opt.host + ":" + std::to_string(impl_->opt.port) + ": " + ec.message());
  impl_->accepting = true;
  impl_->accept_thread = std::thread([this] { impl_->accept_loop(); });
  return {};
}

uint16_t HttpServer::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void HttpServer::stop_accepting() {
  if (!impl_->accepting.exchange(false)) return;
  boost::system::error_code ec;
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);  // wakes the blocking accept
  impl_->acceptor.close(ec);
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
}

void HttpServer::shutdown() {
  stop_accepting();
  std::unique_lock lk(impl_->mu);
  for (int fd : impl_->fds) ::shutdown(fd, SHUT_RDWR);
  impl_->cv.wait_for(lk, std::chrono::seconds(5), [&] { return impl_->threads == 0; });
}

int HttpServer::connections() const {
  std::lock_guard lk(impl_->mu);
  return impl_->threads;
}

}  // namespace tessera::server

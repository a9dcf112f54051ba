// SPDX-License-Identifier: Apache-2.0
/// torchrun-style bootstrap (include/tessera/dist/bootstrap.hpp): environment variables and the TCP
/// rendezvous that hands rank 0's blob (the ncclUniqueId) to every rank.
#include "tessera/dist/bootstrap.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tessera::dist {

namespace {

using Clock = std::chrono::steady_clock;

Result<int> env_int(char const* name, int fallback, bool required, int lo, int hi) {
  char const* v = std::getenv(name);
  if (!v || !*v) {
    if (required) return not_found(std::string("environment variable ") + name + " is not set");
    return fallback;
  }
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end || x < lo || x > hi)
    return invalid_argument(std::string("environment variable ") + name + "=" + v + ": expected an integer in [" +
                            std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(x);
}

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept { std::swap(fd, o.fd); return *this; }
  ~Fd() { if (fd >= 0) ::close(fd); }
};

std::string where(LaunchEnv const& e) {
  return "rendezvous " + e.master_addr + ":" + std::to_string(e.master_port) + " (rank " + std::to_string(e.rank) +
         " of " + std::to_string(e.world_size) + ")";
}

/// Sends or receives exactly n bytes before the deadline.
Status io_exact(int fd, void* p, size_t n, bool sending, Clock::time_point deadline, LaunchEnv const& e) {
  auto* b = static_cast<unsigned char*>(p);
  while (n > 0) {
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (ms <= 0) return io_error(where(e) + ": timed out " + (sending ? "sending" : "receiving"));
    pollfd pf{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    int pr = ::poll(&pf, 1, ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    ssize_t k = sending ? ::send(fd, b, n, MSG_NOSIGNAL) : ::recv(fd, b, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return io_error(where(e) + ": connection closed while " + (sending ? "sending" : "receiving"));
    b += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

Result<sockaddr_storage> resolve(LaunchEnv const& e, socklen_t& len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(e.master_addr.c_str(), std::to_string(e.master_port).c_str(), &hints, &res);
  if (rc != 0 || !res) return io_error(where(e) + ": cannot resolve MASTER_ADDR: " + ::gai_strerror(rc));
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return ss;
}

}  // namespace

Result<LaunchEnv> launch_env_from_environment() {
  LaunchEnv e;
  auto ws = env_int("WORLD_SIZE", 1, true, 1, 1 << 16);
  if (!ws) return ws.status();
  e.world_size = *ws;
  auto r = env_int("RANK", 0, true, 0, e.world_size - 1);
  if (!r) return r.status();
  e.rank = *r;
  auto lr = env_int("LOCAL_RANK", e.rank, false, 0, 1 << 16);
  if (!lr) return lr.status();
  e.local_rank = *lr;
  char const* a = std::getenv("MASTER_ADDR");
  if (a && *a) e.master_addr = a;
  else if (e.world_size > 1) return not_found("environment variable MASTER_ADDR is not set (WORLD_SIZE > 1)");
  auto p = env_int("MASTER_PORT", 29500, e.world_size > 1, 1, 65535);
  if (!p) return p.status();
  e.master_port = *p;
  return e;
}

Result<std::vector<uint8_t>> tcp_rendezvous(LaunchEnv const& e, std::vector<uint8_t> const& blob, double timeout_s) {
  if (e.world_size == 1) return blob;
  auto const deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  socklen_t len = 0;
  auto addr = resolve(e, len);
  if (!addr) return addr.status();
  if (e.rank == 0) {
    Fd ls(::socket(addr->ss_family, SOCK_STREAM, 0));
    if (ls.fd < 0) return io_error(where(e) + ": socket: " + std::strerror(errno));
    int one = 1;
    ::setsockopt(ls.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(ls.fd, reinterpret_cast<sockaddr*>(&*addr), len) != 0)
      return io_error(where(e) + ": bind: " + std::strerror(errno));
    if (::listen(ls.fd, e.world_size) != 0) return io_error(where(e) + ": listen: " + std::strerror(errno));
    uint32_t const n = static_cast<uint32_t>(blob.size());
    std::vector<bool> seen(static_cast<size_t>(e.world_size), false);
    for (int got = 1; got < e.world_size;) {
      int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (ms <= 0)
        return io_error(where(e) + ": timed out waiting for " + std::to_string(e.world_size - got) + " rank(s)");
      pollfd pf{ls.fd, POLLIN, 0};
      if (::poll(&pf, 1, ms) <= 0) continue;
      Fd c(::accept(ls.fd, nullptr, nullptr));
      if (c.fd < 0) continue;
      int32_t peer = -1;
      TESSERA_TRY(io_exact(c.fd, &peer, 4, false, deadline, e));
      if (peer <= 0 || peer >= e.world_size || seen[peer])
        return malformed(where(e) + ": a peer announced rank " + std::to_string(peer) + " (out of range or twice)");
      seen[peer] = true;
      TESSERA_TRY(io_exact(c.fd, const_cast<uint32_t*>(&n), 4, true, deadline, e));
      if (n) TESSERA_TRY(io_exact(c.fd, const_cast<uint8_t*>(blob.data()), n, true, deadline, e));
      ++got;
    }
    return blob;
  }
  for (;;) {
    Fd c(::socket(addr->ss_family, SOCK_STREAM, 0));
    if (c.fd < 0) return io_error(where(e) + ": socket: " + std::strerror(errno));
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&*addr), len) == 0) {
      int32_t me = e.rank;
      TESSERA_TRY(io_exact(c.fd, &me, 4, true, deadline, e));
      uint32_t n = 0;
      TESSERA_TRY(io_exact(c.fd, &n, 4, false, deadline, e));
      if (n > (1u << 20)) return malformed(where(e) + ": blob of " + std::to_string(n) + " bytes announced");
      std::vector<uint8_t> out(n);
      if (n) TESSERA_TRY(io_exact(c.fd, out.data(), n, false, deadline, e));
      return out;
    }
    if (Clock::now() >= deadline) return io_error(where(e) + ": could not connect: " + std::strerror(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace tessera::dist

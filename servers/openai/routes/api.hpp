// SPDX-License-Identifier: Apache-2.0
/// The OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /tokenize,
/// /detokenize, /health, /metrics. The transport hands each request in with a `Connection` (disconnect
/// probe + SSE writer); the routes parse JSON into native structs, drive the engine, and format replies
/// and chunks in OpenAI's shapes (spec/chat-format.md §5.2).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "servers/openai/engine/engine.hpp"
#include "servers/openai/http/sha256.hpp"
#include "servers/openai/routes/constraints.hpp"
#include "servers/openai/routes/request.hpp"
#include "servers/openai/routes/text.hpp"

namespace tessera::server {

struct HttpRequest {
  std::string method;
  std::string target;  // path + query
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-case
  std::string header(std::string_view name) const {
    for (auto const& [k, v] : headers) if (k == name) return v;
    return {};
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

/// What a route needs from the transport while it runs.
class Connection {
 public:
  virtual ~Connection() = default;
  /// True once the peer closed or reset the connection.
  virtual bool client_gone() = 0;
  /// Sends status 200 with `Content-Type: text/event-stream` (chunked); false if the peer is gone.
  virtual bool begin_stream() = 0;
  virtual bool write(std::string_view data) = 0;
  virtual void end_stream() = 0;
};

/// Latency histogram in Prometheus' cumulative-bucket form.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // per bucket (non-cumulative), last = +Inf
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v);
};

struct ServedModel {
  std::string id;                      // what /v1/models lists and requests must name
  std::vector<std::string> aliases;
  std::string description;             // shown in /v1/models (e.g. "smoke-test model, random weights")
  TextCodec const* codec = nullptr;
  ChatFormat const* chat = nullptr;
  OutputParserFactory parser = nullptr;
  std::shared_ptr<ConstraintFactory const> constraints;  // null: constrained requests get a 400 naming…
  std::string constraints_off_reason;                    // … this reason
  Engine* engine = nullptr;
};

struct ApiOptions {
  RequestLimits limits;
  std::vector<Sha256Digest> api_key_digests;  // empty = no authentication
  bool metrics_open = false;                  // /metrics without a key
  double keepalive_s = 15;                    // SSE comment when nothing was written for this long
  double request_timeout_s = 600;             // per request, from arrival (0 = none)
  int retry_after_s = 5;                      // Retry-After on 503
  bool cors = false;                          // Access-Control-Allow-Origin: * (off unless asked)
  bool reasoning_alias = false;               // also emit reasoning text as `reasoning` (vLLM / OpenRouter clients)
};

class Api {
 public:
  Api(ServedModel model, ApiOptions options);
  /// Handles one request. Returns the response, or nullopt when the route streamed it through `conn`.
  std::optional<HttpResponse> handle(HttpRequest const& req, Connection& conn);
  /// New generation requests get 503 from now on; /health reports "draining".
  void set_draining() { draining_ = true; }
  /// Requests in flight inside handle() (all routes).
  int in_flight() const;
  ApiOptions const& options() const { return options_; }

  static HttpResponse error_response(ApiError const& e);

 private:
  friend class Generation;
  HttpResponse models() const;
  HttpResponse health() const;
  HttpResponse metrics() const;
  std::optional<HttpResponse> generate(HttpRequest const& req, Connection& conn, bool chat);
  HttpResponse tokenize(HttpRequest const& req);
  HttpResponse detokenize(HttpRequest const& req);
  bool authorized(HttpRequest const& req) const;
  void count(std::string const& route, int status);

  ServedModel model_;
  ApiOptions options_;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<int> generating_{0};

  mutable std::mutex metrics_mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (route, status) → count
  Histogram ttft_{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}};
  Histogram e2e_{{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480}};
  Histogram queue_{{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram tpot_{{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}};
  uint64_t finished_stop_ = 0, finished_length_ = 0, finished_tool_ = 0, finished_abort_ = 0;
  uint64_t reply_prompt_tokens_ = 0, reply_generation_tokens_ = 0;
  friend struct GenerationMetrics;
};

}  // namespace tessera::server

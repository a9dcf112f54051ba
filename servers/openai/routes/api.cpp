// SPDX-License-Identifier: Apache-2.0
/// Route dispatch, authentication, /v1/models, /tokenize, /detokenize, /health and /metrics. The
/// generation routes live in generate.cpp.
#include "servers/openai/routes/api.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <tuple>

#include <boost/json.hpp>

namespace tessera::server {
namespace json = boost::json;

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

Api::Api(ServedModel model, ApiOptions options) : model_(std::move(model)), options_(std::move(options)) {}

int Api::in_flight() const { return in_flight_.load(); }

HttpResponse Api::error_response(ApiError const& e) {
  json::object err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? json::value(nullptr) : json::value(e.param);
  err["code"] = e.code.empty() ? json::value(nullptr) : json::value(e.code);
  HttpResponse r;
  r.status = e.status;
  r.body = json::serialize(json::object{{"error", std::move(err)}});
  return r;
}

static ApiError api_error(int status, std::string message, std::string type, std::string code = {}) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

bool Api::authorized(HttpRequest const& req) const {
  if (options_.api_key_digests.empty()) return true;
  std::string key;
  std::string auth = req.header("authorization");
  if (auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0)) key = auth.substr(7);
  else key = req.header("x-api-key");
  if (key.empty()) return false;
  Sha256Digest d = sha256(key);
  bool ok = false;
  for (auto const& k : options_.api_key_digests) ok |= digests_equal(d, k);  // every digest, no early exit
  return ok;
}

void Api::count(std::string const& route, int status) {
  std::lock_guard lk(metrics_mu_);
  ++requests_[{route, status}];
}

std::optional<HttpResponse> Api::handle(HttpRequest const& req, Connection& conn) {
  struct InFlight {
    std::atomic<int>& n;
    explicit InFlight(std::atomic<int>& x) : n(x) { ++n; }
    ~InFlight() { --n; }
  } guard(in_flight_);
  std::string path = req.target.substr(0, req.target.find('?'));
  auto finish = [&](std::string const& route, HttpResponse r) {
    if (options_.cors) r.headers.emplace_back("Access-Control-Allow-Origin", "*");
    count(route, r.status);
    return std::optional<HttpResponse>(std::move(r));
  };
  if (options_.cors && req.method == "OPTIONS") {
    HttpResponse r;
    r.status = 204;
    r.headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                 {"Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key"}};
    return finish("options", std::move(r));
  }
  struct Route { char const* path; char const* method; char const* name; };
  static Route const kRoutes[] = {
      {"/v1/models", "GET", "models"}, {"/models", "GET", "models"},
      {"/v1/chat/completions", "POST", "chat"}, {"/chat/completions", "POST", "chat"},
      {"/v1/completions", "POST", "completions"}, {"/completions", "POST", "completions"},
      {"/tokenize", "POST", "tokenize"}, {"/v1/tokenize", "POST", "tokenize"},
      {"/detokenize", "POST", "detokenize"}, {"/v1/detokenize", "POST", "detokenize"},
      {"/health", "GET", "health"}, {"/v1/health", "GET", "health"},
      {"/metrics", "GET", "metrics"}, {"/v1/metrics", "GET", "metrics"}};
  Route const* route = nullptr;
  bool path_known = false;
  for (auto const& r : kRoutes) {
    if (path != r.path) continue;
    path_known = true;
    if (req.method == r.method || (req.method == "HEAD" && std::string_view(r.method) == "GET")) route = &r;
  }
  if (!route) {
    if (path_known)
      return finish("unknown", error_response(api_error(405, "method " + req.method + " is not allowed on " + path, "invalid_request_error", "method_not_allowed")));
    return finish("unknown", error_response(api_error(404, "no route for " + req.method + " " + path, "invalid_request_error", "not_found")));
  }
  std::string name = route->name;
  bool open = name == "health" || (name == "metrics" && options_.metrics_open);
  if (!open && !authorized(req)) {
    HttpResponse r = error_response(api_error(401, "a valid API key is required (Authorization: Bearer <key>)", "authentication_error", "invalid_api_key"));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return finish(name, std::move(r));
  }
  if (name == "models") return finish(name, models());
  if (name == "health") return finish(name, health());
  if (name == "metrics") return finish(name, metrics());
  if (name == "tokenize") return finish(name, tokenize(req));
  if (name == "detokenize") return finish(name, detokenize(req));
  auto r = generate(req, conn, name == "chat");
  if (r) return finish(name, std::move(*r));
  count(name, 200);
  return std::nullopt;
}

HttpResponse Api::models() const {
  json::array data;
  auto entry = [&](std::string const& id) {
    json::object m{{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "tessera"},
                   {"root", model_.id}, {"max_model_len", model_.engine->max_context()}};
    if (!model_.description.empty()) m["description"] = model_.description;
    return m;
  };
  data.push_back(entry(model_.id));
  for (auto const& a : model_.aliases) data.push_back(entry(a));
  HttpResponse r;
  r.body = json::serialize(json::object{{"object", "list"}, {"data", std::move(data)}});
  return r;
}

HttpResponse Api::health() const {
  EngineStats s = model_.engine->stats();
  bool draining = draining_ || s.draining;
  json::object o;
  o["status"] = draining ? "draining" : "ok";
  if (options_.api_key_digests.empty()) {
    o["model"] = model_.id;
    o["busy"] = s.slots_busy > 0 || s.queue_length > 0;
    o["slots_total"] = s.slots_total;
    o["slots_busy"] = s.slots_busy;
    o["queue"] = s.queue_length;
    o["requests_running"] = s.slots_busy;
    o["requests_waiting"] = s.queue_length;
    o["requests_in_flight"] = generating_.load();
    o["requests_total"] = s.requests_admitted;
    o["requests_refused"] = s.requests_refused;
    o["prompt_tokens_total"] = s.prompt_tokens_total;
    o["generation_tokens_total"] = s.generation_tokens_total;
    o["cached_tokens_total"] = s.cached_tokens_total;
    o["prefix_cache_entries"] = s.prefix_cache_entries;
    o["memory_used_bytes"] = s.memory_used_bytes;
    o["memory_budget_bytes"] = s.memory_budget_bytes;
    o["context_length"] = model_.engine->max_context();
    o["drafted_total"] = s.draft_tokens_total;
    o["accepted_total"] = s.accepted_tokens_total;
    if (s.drafting) o["drafter"] = s.drafter;
  }
  HttpResponse r;
  r.status = draining ? 503 : 200;
  r.body = json::serialize(o);
  return r;
}

HttpResponse Api::metrics() const {
  EngineStats s = model_.engine->stats();
  std::string out;
  char buf[1024];
  std::string const label = "model_name=\"" + model_.id + "\"";
  auto series = [&](char const* name, char const* type, char const* help, double v) {
    for (char const* prefix : {"tessera:", "vllm:"}) {
      std::snprintf(buf, sizeof buf, "# HELP %s%s %s\n# TYPE %s%s %s\n%s%s{%s} %.17g\n", prefix, name, help, prefix,
                    name, type, prefix, name, label.c_str(), v);
      out += buf;
    }
  };
  series("num_requests_running", "gauge", "Requests in engine slots.", s.slots_busy);
  series("num_requests_waiting", "gauge", "Requests waiting for a slot.", s.queue_length);
  series("kv_cache_usage_perc", "gauge", "Priced sequence-state memory in use, fraction of the budget.",
         s.memory_budget_bytes ? double(s.memory_used_bytes) / double(s.memory_budget_bytes) : 0.0);
  series("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", double(s.prompt_tokens_total));
  series("generation_tokens_total", "counter", "Generated tokens.", double(s.generation_tokens_total));
  series("prefix_cache_hits_total", "counter", "Requests that resumed from a cached prefix.", double(s.prefix_cache_hits));
  series("cached_prompt_tokens_total", "counter", "Prompt tokens served from the prefix cache.", double(s.cached_tokens_total));
  series("num_requests_refused_total", "counter", "Requests refused for capacity or drain.", double(s.requests_refused));
  // Constrained decoding: mean mask cost per constrained token = seconds_total / masks_total.
  for (auto const& [name, help, v] : {std::tuple<char const*, char const*, double>{
           "grammar_masks_total", "Token masks computed for constrained decoding (one per constrained token).",
           double(s.grammar_masks_total)},
       {"grammar_mask_seconds_total", "Time spent computing constrained-decoding token masks.", s.grammar_mask_seconds_total}}) {
    std::snprintf(buf, sizeof buf, "# HELP tessera:%s %s\n# TYPE tessera:%s counter\ntessera:%s{%s} %.17g\n", name, help, name,
                  name, label.c_str(), v);
    out += buf;
  }
  if (s.drafting) {
    // Speculative decoding, under vLLM's spec_decode names (only when a drafter is configured).
    series("spec_decode_num_drafts_total", "counter", "Decode rows that verified at least one draft token.",
           double(s.draft_rounds_total));
    series("spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.", double(s.draft_tokens_total));
    series("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", double(s.accepted_tokens_total));
    series("spec_decode_draft_acceptance_rate", "gauge", "Accepted / verified draft tokens.",
           s.draft_tokens_total ? double(s.accepted_tokens_total) / double(s.draft_tokens_total) : 0.0);
    for (char const* prefix : {"tessera:", "vllm:"}) {
      std::snprintf(buf, sizeof buf, "# HELP %sspec_decode_num_accepted_tokens_per_pos_total Rounds whose draft at this position was accepted.\n"
                    "# TYPE %sspec_decode_num_accepted_tokens_per_pos_total counter\n", prefix, prefix);
      out += buf;
      for (size_t j = 0; j < s.accepted_per_position.size(); ++j) {
        std::snprintf(buf, sizeof buf, "%sspec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%zu\"} %llu\n", prefix,
                      label.c_str(), j, static_cast<unsigned long long>(s.accepted_per_position[j]));
        out += buf;
      }
    }
    // Accepted drafts per verifying round, as a histogram (le = accepted count).
    out += "# HELP tessera:spec_decode_accepted_per_round Draft tokens accepted per verifying round.\n"
           "# TYPE tessera:spec_decode_accepted_per_round histogram\n";
    uint64_t cum = 0, sum = 0;
    for (size_t a = 0; a < s.rounds_by_accepted.size(); ++a) {
      cum += s.rounds_by_accepted[a];
      sum += a * s.rounds_by_accepted[a];
      std::snprintf(buf, sizeof buf, "tessera:spec_decode_accepted_per_round_bucket{%s,le=\"%zu\"} %llu\n", label.c_str(), a,
                    static_cast<unsigned long long>(cum));
      out += buf;
    }
    std::snprintf(buf, sizeof buf, "tessera:spec_decode_accepted_per_round_bucket{%s,le=\"+Inf\"} %llu\n"
                  "tessera:spec_decode_accepted_per_round_sum{%s} %llu\ntessera:spec_decode_accepted_per_round_count{%s} %llu\n",
                  label.c_str(), static_cast<unsigned long long>(cum), label.c_str(), static_cast<unsigned long long>(sum),
                  label.c_str(), static_cast<unsigned long long>(cum));
    out += buf;
  }
  std::lock_guard lk(metrics_mu_);
  for (char const* prefix : {"tessera:", "vllm:"}) {
    std::snprintf(buf, sizeof buf, "# HELP %srequest_success_total Finished requests by finish reason.\n# TYPE %srequest_success_total counter\n", prefix, prefix);
    out += buf;
    for (auto [reason, n] : {std::pair<char const*, uint64_t>{"stop", finished_stop_}, {"length", finished_length_},
                             {"tool_calls", finished_tool_}, {"abort", finished_abort_}}) {
      std::snprintf(buf, sizeof buf, "%srequest_success_total{%s,finished_reason=\"%s\"} %llu\n", prefix, label.c_str(), reason,
                    static_cast<unsigned long long>(n));
      out += buf;
    }
  }
  auto hist = [&](char const* name, char const* help, Histogram const& h) {
    for (char const* prefix : {"tessera:", "vllm:"}) {
      std::snprintf(buf, sizeof buf, "# HELP %s%s %s\n# TYPE %s%s histogram\n", prefix, name, help, prefix, name);
      out += buf;
      uint64_t cum = 0;
      for (size_t i = 0; i <= h.bounds.size(); ++i) {
        cum += h.counts[i];
        if (i < h.bounds.size()) std::snprintf(buf, sizeof buf, "%s%s_bucket{%s,le=\"%g\"} %llu\n", prefix, name, label.c_str(), h.bounds[i], static_cast<unsigned long long>(cum));
        else std::snprintf(buf, sizeof buf, "%s%s_bucket{%s,le=\"+Inf\"} %llu\n", prefix, name, label.c_str(), static_cast<unsigned long long>(cum));
        out += buf;
      }
      std::snprintf(buf, sizeof buf, "%s%s_sum{%s} %.9g\n%s%s_count{%s} %llu\n", prefix, name, label.c_str(), h.sum, prefix, name,
                    label.c_str(), static_cast<unsigned long long>(h.count));
      out += buf;
    }
  };
  hist("time_to_first_token_seconds", "Time from request arrival to the first generated token.", ttft_);
  hist("e2e_request_latency_seconds", "Time from request arrival to the last byte of the reply.", e2e_);
  hist("request_queue_time_seconds", "Time a request waited for a slot.", queue_);
  hist("time_per_output_token_seconds", "Mean time between generated tokens of a request.", tpot_);
  out += "# HELP tessera:http_requests_total HTTP requests by route and status.\n# TYPE tessera:http_requests_total counter\n";
  for (auto const& [k, n] : requests_) {
    std::snprintf(buf, sizeof buf, "tessera:http_requests_total{route=\"%s\",status=\"%d\"} %llu\n", k.first.c_str(), k.second,
                  static_cast<unsigned long long>(n));
    out += buf;
  }
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = std::move(out);
  return r;
}

HttpResponse Api::tokenize(HttpRequest const& req) {
  auto body = parse_body(req.body, options_.limits);
  if (auto* e = std::get_if<ApiError>(&body)) return error_response(*e);
  auto const& o = std::get<json::object>(body);
  std::vector<int32_t> ids;
  bool add_special = true;
  if (auto a = o.find("add_special_tokens"); a != o.end() && !a->value().is_null()) {
    if (!a->value().is_bool()) return error_response(ApiError{400, "'add_special_tokens' must be a boolean", "invalid_request_error", "add_special_tokens", ""});
    add_special = a->value().get_bool();
  }
  if (o.contains("messages")) {
    auto parsed = parse_chat_request(o, options_.limits);
    if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
    auto& r = std::get<ApiRequest>(parsed);
    auto encoded = model_.chat->encode(r.messages, r.render, *model_.codec);
    if (!encoded.ok()) return error_response(ApiError{400, encoded.status().message(), "invalid_request_error", "messages", ""});
    ids = std::move(*encoded);
  } else if (auto p = o.find("prompt"); p != o.end() && p->value().is_string()) {
    ids = model_.codec->encode(p->value().get_string(), add_special);
  } else {
    return error_response(ApiError{400, "'/tokenize' needs 'prompt' (a string) or 'messages'", "invalid_request_error", "prompt", ""});
  }
  json::array tokens, strs;
  bool want_strs = false;
  if (auto w = o.find("return_token_strs"); w != o.end() && w->value().is_bool()) want_strs = w->value().get_bool();
  for (int32_t t : ids) {
    tokens.push_back(t);
    if (want_strs) { Utf8Stream u; strs.push_back(json::string(u.push(model_.codec->token_bytes(t)) + u.flush())); }
  }
  json::object out{{"count", ids.size()}, {"max_model_len", model_.engine->max_context()}, {"tokens", std::move(tokens)}};
  if (want_strs) out["token_strs"] = std::move(strs);
  HttpResponse r;
  r.body = json::serialize(out);
  return r;
}

HttpResponse Api::detokenize(HttpRequest const& req) {
  auto body = parse_body(req.body, options_.limits);
  if (auto* e = std::get_if<ApiError>(&body)) return error_response(*e);
  auto const& o = std::get<json::object>(body);
  auto t = o.find("tokens");
  if (t == o.end() || !t->value().is_array())
    return error_response(ApiError{400, "'tokens' must be an array of token ids", "invalid_request_error", "tokens", ""});
  std::vector<int32_t> ids;
  for (auto const& x : t->value().get_array()) {
    if (!x.is_int64() || x.get_int64() < 0 || x.get_int64() >= model_.codec->vocab_size())
      return error_response(ApiError{400, "'tokens' entries must be integers in [0, " + std::to_string(model_.codec->vocab_size()) + ")",
                                     "invalid_request_error", "tokens", ""});
    ids.push_back(static_cast<int32_t>(x.get_int64()));
  }
  Utf8Stream u;
  std::string text = u.push(model_.codec->decode(ids)) + u.flush();
  HttpResponse r;
  r.body = json::serialize(json::object{{"prompt", text}});
  return r;
}

}  // namespace tessera::server

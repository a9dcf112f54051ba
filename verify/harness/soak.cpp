// SPDX-License-Identifier: Apache-2.0
/// Soak traffic, checks and summary (see soak.hpp).
#include "verify/harness/soak.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include <boost/json.hpp>

#include "servers/openai/http/sha256.hpp"
#include "verify/harness/openai_client.hpp"

namespace tessera::harness {
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

bool SoakReport::pass() const { return findings.empty() && idle; }

namespace {

json::object user(std::string text) { return json::object{{"role", "user"}, {"content", std::move(text)}}; }

json::array weather_tools() {
  return json::array{json::object{{"type", "function"}, {"function", json::object{{"name", "get_weather"}, {"description", "Weather forecast"},
      {"parameters", json::object{{"type", "object"}, {"properties", json::object{{"location", json::object{{"type", "string"}}}}}, {"required", json::array{"location"}}}}}}}};
}

// The fixed greedy pool: each body is sent many times, streamed and not, and must give one reply.
std::vector<std::pair<bool, json::object>> greedy_pool() {
  std::vector<std::pair<bool, json::object>> p;
  p.push_back({true, {{"messages", json::array{user("Tell me about the moon.")}}, {"max_tokens", 40}, {"reasoning_effort", "none"}}});
  p.push_back({true, {{"messages", json::array{user("Plan a picnic.")}}, {"max_tokens", 48}, {"reasoning_effort", "high"}}});
  p.push_back({true, {{"messages", json::array{user("Weather in Lima?")}}, {"max_tokens", 40}, {"tools", weather_tools()}}});
  p.push_back({false, {{"prompt", "In the beginning"}, {"max_tokens", 40}}});
  return p;
}

// A document of 30–80 % of `max_chars` (a token spans at least one character, so it fits the context).
std::string long_text(std::mt19937_64& rng, size_t max_chars) {
  static char const* kWords[] = {"river", "stone", "cloud", "engine", "token", "matrix", "window", "signal", "garden", "orbit"};
  std::string s;
  size_t const want = max_chars * (30 + rng() % 51) / 100;
  for (size_t i = 0; s.size() + 8 < want; ++i) s += std::string(kWords[rng() % 10]) + (i % 17 == 16 ? ".\n" : " ");
  return s;
}

std::string reply_hash(Reply const& r) {
  std::string b;
  if (r.source == TokenSource::kIds) b.assign(reinterpret_cast<char const*>(r.ids.data()), r.ids.size() * 4);
  else b = "text:" + r.reasoning + "\x1f" + r.content + "\x1f" + r.text;
  return server::to_hex(server::sha256(b)).substr(0, 16);
}

struct Job {
  std::string kind;
  bool chat = true;
  json::object body;
  int abort_after = -1;     // SSE events before dropping the connection
  std::string hash_key;     // greedy pool key (empty: not checked)
};

Job make_job(std::mt19937_64& rng, size_t long_chars) {
  static auto const pool = greedy_pool();
  int k = static_cast<int>(rng() % 100);
  Job j;
  auto pick_pool = [&](bool stream) {
    auto const& e = pool[rng() % pool.size()];
    j.chat = e.first;
    j.body = e.second;
    j.hash_key = json::serialize(j.body);
    if (stream) j.body["stream"] = true;
    j.body["temperature"] = 0;
    j.body["return_token_ids"] = true;
  };
  if (k < 18) { j.kind = "greedy"; pick_pool(false); }
  else if (k < 36) { j.kind = "greedy-stream"; pick_pool(true); }
  else if (k < 44) {
    j.kind = "tools";
    j.body = {{"messages", json::array{user("Check the weather in city " + std::to_string(rng() % 50) + ".")}}, {"max_tokens", 48},
              {"tools", weather_tools()}, {"tool_choice", "auto"}, {"stream", (rng() & 1) != 0}};
  } else if (k < 52) {
    j.kind = "json_schema";
    j.body = {{"messages", json::array{user("A person, as JSON.")}}, {"max_tokens", 48}, {"reasoning_effort", "none"},
              {"response_format", json::object{{"type", "json_schema"}, {"json_schema", json::object{{"name", "p"}, {"schema",
                  json::object{{"type", "object"}, {"properties", json::object{{"name", json::object{{"type", "string"}}}}}}}}}}}};
  } else if (k < 60) {
    j.kind = "thinking";
    j.body = {{"messages", json::array{user("Think about puzzle " + std::to_string(rng() % 100) + ".")}}, {"max_tokens", 64},
              {"reasoning_effort", "max"}, {"stream", true}};
  } else if (k < 66) {
    j.kind = "long";
    j.body = {{"messages", json::array{user("Summarise:\n" + long_text(rng, long_chars))}}, {"max_tokens", 24}, {"reasoning_effort", "none"}};
  } else if (k < 74) {
    j.kind = "completions";
    j.chat = false;
    j.body = {{"prompt", "Item " + std::to_string(rng() % 1000) + ":"}, {"max_tokens", 32}, {"stream", (rng() & 1) != 0}};
  } else if (k < 82) {
    j.kind = "sampled";
    j.body = {{"messages", json::array{user("A random word, please.")}}, {"max_tokens", 24}, {"temperature", 0.7},
              {"seed", static_cast<int64_t>(rng() % 100000)}, {"reasoning_effort", "none"}};
  } else if (k < 94) {
    j.kind = "cancel";
    j.body = {{"messages", json::array{user("Write a long story.")}}, {"max_tokens", 200}, {"stream", true}, {"reasoning_effort", "none"}};
    j.abort_after = 2 + static_cast<int>(rng() % 6);
  } else {
    j.kind = "disconnect";
    j.body = {{"messages", json::array{user("Write an essay.")}}, {"max_tokens", 200}, {"stream", true}};
    j.abort_after = 1;
  }
  j.body["return_token_ids"] = true;
  return j;
}

// The server's context (max_model_len of /v1/models, else /health context_length); 0 if unknown.
int64_t server_context(Url const& url) {
  for (char const* path : {"/v1/models", "/health"}) {
    HttpResult h = http_request(url, "GET", path, "", 10);
    boost::system::error_code ec;
    json::value v = h.status == 200 ? json::parse(h.body, ec) : json::value();
    if (!v.is_object()) continue;
    json::object const* o = &v.get_object();
    if (auto* d = o->if_contains("data"); d && d->is_array() && !d->get_array().empty() && d->get_array()[0].is_object())
      o = &d->get_array()[0].get_object();
    for (char const* k : {"max_model_len", "context_length"})
      if (auto* x = o->if_contains(k); x && x->is_int64() && x->get_int64() > 0) return x->get_int64();
  }
  return 0;
}

struct IdleState { bool checked = false, idle = false; std::string detail; };

IdleState idle_state(Url const& url) {
  IdleState st;
  HttpResult h = http_request(url, "GET", "/health", "", 10);
  boost::system::error_code ec;
  json::value v = json::parse(h.body, ec);
  if (h.status == 200 && !ec && v.is_object()) {
    auto const& o = v.get_object();
    auto num = [&](char const* k) -> int64_t { auto* x = o.if_contains(k); return x && x->is_int64() ? x->get_int64() : -1; };
    int64_t busy = num("slots_busy"), queue = num("queue"), running = num("requests_running"), inflight = num("requests_in_flight");
    if (busy >= 0 || running >= 0) {
      st.checked = true;
      st.idle = std::max<int64_t>(busy, 0) == 0 && std::max<int64_t>(queue, 0) == 0 && std::max<int64_t>(running, 0) == 0 &&
                std::max<int64_t>(inflight, 0) == 0;
      st.detail = "/health " + h.body;
      return st;
    }
  }
  // Prometheus text: sum every sample of the two gauges.
  HttpResult m = http_request(url, "GET", "/metrics", "", 10);
  if (m.status != 200) return st;
  double total = 0;
  bool seen = false;
  size_t pos = 0;
  while (pos < m.body.size()) {
    size_t nl = m.body.find('\n', pos);
    std::string line = m.body.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? m.body.size() : nl + 1;
    if (line.rfind("vllm:num_requests_running", 0) != 0 && line.rfind("vllm:num_requests_waiting", 0) != 0) continue;
    size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    total += std::strtod(line.c_str() + sp + 1, nullptr);
    seen = true;
    st.detail += line + "; ";
  }
  st.checked = seen;
  st.idle = seen && total == 0;
  st.detail = "/metrics " + st.detail;
  return st;
}

}  // namespace

SoakReport run_soak(SoakOptions const& opt) {
  SoakReport rep;
  std::mutex mu;
  auto const t0 = Clock::now();
  auto const deadline = t0 + std::chrono::duration<double>(opt.minutes * 60.0);
  std::atomic<int64_t> issued{0};
  std::atomic<bool> stop{false};
  auto finding = [&](std::string s) {
    std::lock_guard lk(mu);
    if (rep.findings.size() < 200) rep.findings.push_back(std::move(s));
  };
  int64_t const ctx = server_context(opt.url);
  // Long documents: up to 80 % of the context in characters, at most 192K characters (≈ 48K tokens).
  size_t const long_chars = static_cast<size_t>(std::min<int64_t>(ctx > 0 ? ctx * 8 / 10 : 4000, 196608));
  auto worker = [&](int w) {
    std::mt19937_64 rng(opt.seed * 1000003u + static_cast<uint64_t>(w));
    while (Clock::now() < deadline && !stop) {
      if (opt.max_requests >= 0 && issued.fetch_add(1) >= opt.max_requests) break;
      Job j = make_job(rng, long_chars);
      CallOptions co;
      co.timeout_s = opt.timeout_s;
      co.abort_after_events = j.abort_after;
      Reply r = call_openai(opt.url, j.chat, j.body, co);
      std::lock_guard lk(mu);
      auto& k = rep.kinds[j.kind];
      ++k.sent;
      k.seconds.push_back(r.seconds);
      if (r.aborted) { ++k.cancelled; continue; }
      if (j.abort_after >= 0 && r.error.empty()) { ++k.ok; continue; }  // ended before the planned drop
      if (!r.error.empty()) {
        if (r.server_error) ++k.server_errors;
        else ++k.http_errors;
        if (rep.findings.size() < 200)
          rep.findings.push_back(j.kind + ": " + (r.server_error ? "server error: " : "error: ") + r.error.substr(0, 300));
        continue;
      }
      ++k.ok;
      k.tokens += static_cast<int64_t>(r.size());
      if (r.size() == 0 && r.content.empty() && r.reasoning.empty() && r.text.empty() && r.tool_calls.empty()) ++k.empty;
      if (!j.hash_key.empty()) rep.hashes[j.hash_key].insert(reply_hash(r));
    }
  };
  auto health_loop = [&] {
    for (bool first = true; !stop; first = false) {
      for (int i = 0; i < 20 && !stop && !first; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      HttpResult h = http_request(opt.url, "GET", "/health", "", 10);
      boost::system::error_code ec;
      json::value v = json::parse(h.body, ec);
      std::lock_guard lk(mu);
      ++rep.health_checks;
      if (h.status != 200 || (!h.body.empty() && (ec || !v.is_object())))  // vLLM answers 200 with an empty body
        if (rep.findings.size() < 200) rep.findings.push_back("/health: HTTP " + std::to_string(h.status) + " " + h.error + " " + h.body.substr(0, 200));
    }
  };
  std::thread health(health_loop);
  std::vector<std::thread> ws;
  for (int w = 0; w < std::max(1, opt.workers); ++w) ws.emplace_back(worker, w);
  for (auto& t : ws) t.join();
  stop = true;
  health.join();

  // Every greedy body: exactly one reply hash.
  for (auto const& [key, hs] : rep.hashes)
    if (hs.size() != 1) finding("greedy body gave " + std::to_string(hs.size()) + " different replies: " + key.substr(0, 160));

  // Idle within the drain window: /health slot fields (Tessera), else the vLLM gauges of /metrics.
  auto const idle_deadline = Clock::now() + std::chrono::duration<double>(opt.idle_wait_s);
  for (;;) {
    IdleState st = idle_state(opt.url);
    rep.final_health = st.detail;
    if (!st.checked) {
      rep.findings.push_back("neither /health (slots_busy, requests_running) nor /metrics (vllm:num_requests_running) reports running "
                             "requests: slot release not checkable");
      break;
    }
    rep.idle_checked = true;
    if (st.idle) { rep.idle = true; break; }
    if (Clock::now() > idle_deadline) {
      rep.findings.push_back("server not idle " + std::to_string(opt.idle_wait_s) + " s after the traffic: " + st.detail.substr(0, 300));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  if (opt.smoke_question) {
    json::object body{{"messages", json::array{user("What is 17*23? Answer with the number only.")}}, {"temperature", 0},
                      {"max_tokens", 64}, {"reasoning_effort", "none"}};
    Reply r = call_openai(opt.url, true, body, CallOptions{opt.timeout_s, -1});
    rep.smoke = r.error.empty() ? r.content : "error: " + r.error;
    rep.smoke_ok = r.error.empty() && r.content.find("391") != std::string::npos;
    if (!rep.smoke_ok) rep.findings.push_back("smoke question: expected 391, got \"" + printable(rep.smoke).substr(0, 200) + "\"");
  }
  rep.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return rep;
}

std::string soak_text(SoakReport const& r, SoakOptions const& opt) {
  char line[256];
  std::string o = "soak against " + opt.url.str() + ": " + std::to_string(opt.workers) + " workers, seed " + std::to_string(opt.seed) + "\n";
  std::snprintf(line, sizeof line, "%-14s %6s %6s %9s %9s %9s %6s %8s %8s\n", "kind", "sent", "ok", "cancelled", "5xx/bad", "http-err", "empty", "tokens", "p50 s");
  o += line;
  SoakKindStats tot;
  for (auto const& [name, k] : r.kinds) {
    auto s = k.seconds;
    std::sort(s.begin(), s.end());
    std::snprintf(line, sizeof line, "%-14s %6lld %6lld %9lld %9lld %9lld %6lld %8lld %8.3f\n", name.c_str(), (long long)k.sent, (long long)k.ok,
                  (long long)k.cancelled, (long long)k.server_errors, (long long)k.http_errors, (long long)k.empty, (long long)k.tokens,
                  s.empty() ? 0.0 : s[s.size() / 2]);
    o += line;
    tot.sent += k.sent; tot.ok += k.ok; tot.cancelled += k.cancelled; tot.server_errors += k.server_errors;
    tot.http_errors += k.http_errors; tot.empty += k.empty; tot.tokens += k.tokens;
  }
  std::snprintf(line, sizeof line, "%-14s %6lld %6lld %9lld %9lld %9lld %6lld %8lld\n", "total", (long long)tot.sent, (long long)tot.ok,
                (long long)tot.cancelled, (long long)tot.server_errors, (long long)tot.http_errors, (long long)tot.empty, (long long)tot.tokens);
  o += line;
  size_t one = 0;
  for (auto const& [k, hs] : r.hashes) one += hs.size() == 1;
  o += "greedy bodies with exactly one reply hash: " + std::to_string(one) + "/" + std::to_string(r.hashes.size()) + "\n";
  o += "/health checks during the soak: " + std::to_string(r.health_checks) + "; after: " +
       (r.idle_checked ? (r.idle ? std::string("idle") : std::string("NOT idle")) : std::string("not checkable")) + "\n";
  if (opt.smoke_question) o += std::string("smoke question (17*23): ") + (r.smoke_ok ? "391 found" : "FAILED") + " — \"" + printable(r.smoke).substr(0, 120) + "\"\n";
  for (auto const& f : r.findings) o += "finding: " + f + "\n";
  std::snprintf(line, sizeof line, "%s in %.1f s: %zu finding(s)\n", r.pass() ? "PASS" : "FAIL", r.seconds, r.findings.size());
  o += line;
  return o;
}

std::string soak_jsonl(SoakReport const& r) {
  std::string o;
  for (auto const& [name, k] : r.kinds)
    o += json::serialize(json::object{{"kind", name}, {"sent", k.sent}, {"ok", k.ok}, {"cancelled", k.cancelled}, {"server_errors", k.server_errors},
                                      {"http_errors", k.http_errors}, {"empty", k.empty}, {"tokens", k.tokens}}) + "\n";
  json::array f;
  for (auto const& x : r.findings) f.push_back(json::string(x));
  size_t one = 0;
  for (auto const& [key, hs] : r.hashes) one += hs.size() == 1;
  json::object s{{"summary", true}, {"pass", r.pass()}, {"seconds", r.seconds}, {"findings", std::move(f)}, {"greedy_bodies", r.hashes.size()},
                 {"greedy_bodies_one_hash", one}, {"idle", r.idle}, {"idle_checked", r.idle_checked}, {"health_checks", r.health_checks}};
  if (!r.smoke.empty()) { s["smoke"] = r.smoke; s["smoke_ok"] = r.smoke_ok; }
  return o + json::serialize(s) + "\n";
}

}  // namespace tessera::harness

// SPDX-License-Identifier: Apache-2.0
/// /v1/chat/completions and /v1/completions: request → prompt ids → engine → reply. One code path for
/// both modes: token events are decoded to UTF-8, cut at stop strings (with hold-back), split into
/// reasoning / content / tool calls by the output parser, and either streamed as chunks or gathered into
/// one body (spec/chat-format.md §5.2).
#include <chrono>
#include <ctime>
#include <random>

#include <boost/json.hpp>

#include "servers/openai/http/sse.hpp"
#include "servers/openai/routes/api.hpp"

namespace tessera::server {
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string random_id(char const* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static char const* kHex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

ApiError err(int status, std::string message, std::string type = "invalid_request_error", std::string code = {}, std::string param = {}) {
  return ApiError{status, std::move(message), std::move(type), std::move(param), std::move(code)};
}

json::array byte_list(std::string const& s) {
  json::array a;
  for (unsigned char c : s) a.push_back(c);
  return a;
}

}  // namespace

/// Accumulates one reply; `emit` receives each chunk's choice object (streaming) or nothing.
struct GenerationMetrics {};

std::optional<HttpResponse> Api::generate(HttpRequest const& hreq, Connection& conn, bool chat) {
  auto const arrived = Clock::now();
  auto body = parse_body(hreq.body, options_.limits);
  if (auto* e = std::get_if<ApiError>(&body)) return error_response(*e);
  auto parsed = chat ? parse_chat_request(std::get<json::object>(body), options_.limits)
                     : parse_completion_request(std::get<json::object>(body), options_.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  ApiRequest& r = std::get<ApiRequest>(parsed);
  if (!r.model.empty() && r.model != model_.id &&
      std::find(model_.aliases.begin(), model_.aliases.end(), r.model) == model_.aliases.end())
    return error_response(err(404, "The model '" + r.model + "' does not exist; this server serves '" + model_.id + "'",
                              "invalid_request_error", "model_not_found", "model"));
  if (draining_) {
    HttpResponse resp = error_response(err(503, "the server is shutting down", "server_error", "server_shutting_down"));
    resp.headers.emplace_back("Retry-After", std::to_string(options_.retry_after_s));
    return resp;
  }
  // The constraint first: a schema the grammar cannot compile is a 400 whatever the prompt.
  std::shared_ptr<TokenConstraint> constraint;
  if (model_.constraints) {
    auto c = model_.constraints->for_request(r);
    if (auto* e = std::get_if<ApiError>(&c)) return error_response(*e);
    constraint = std::get<std::shared_ptr<TokenConstraint>>(c);
  } else if (wants_constraint(r)) {
    return error_response(err(400, "this server cannot constrain decoding (" + model_.constraints_off_reason +
                                       "): response_format json_object/json_schema and tool_choice required/named are unavailable",
                              "invalid_request_error", {}, r.response_format == "text" ? "tool_choice" : "response_format"));
  }
  // Prompt ids.
  std::vector<int32_t> prompt;
  if (chat) {
    auto ids = model_.chat->encode(r.messages, r.render, *model_.codec);
    if (!ids.ok()) return error_response(err(400, ids.status().message(), "invalid_request_error", {}, "messages"));
    prompt = std::move(*ids);
  } else if (r.prompt_text) {
    prompt = model_.codec->encode(*r.prompt_text, true);
  } else {
    prompt = r.prompt_ids;
    for (int32_t t : prompt)
      if (t >= model_.codec->vocab_size())
        return error_response(err(400, "prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                           std::to_string(model_.codec->vocab_size()) + ")", "invalid_request_error", {}, "prompt"));
  }
  int64_t const ctx = model_.engine->max_context();
  int64_t const n = static_cast<int64_t>(prompt.size());
  auto overflow = [&](int64_t want) {
    return error_response(err(400, "This model's maximum context length is " + std::to_string(ctx) + " tokens. However, you requested " +
                                       std::to_string(want) + " tokens (" + std::to_string(n) + " in the prompt, " +
                                       std::to_string(want - n) + " for the completion). Please reduce the length of the messages or completion.",
                              "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt"));
  };
  if (n >= ctx) return overflow(n + (r.max_tokens ? *r.max_tokens : 1));
  int64_t max_tokens = r.max_tokens ? *r.max_tokens : std::min<int64_t>(chat && r.render.thinking ? 65536 : 8192, ctx - n);
  if (n + max_tokens > ctx) return overflow(n + max_tokens);

  GenerationRequest g;
  g.prompt = prompt;
  g.max_tokens = max_tokens;
  g.sampling = r.sampling;
  if (!r.seed_given) g.sampling.seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  g.stop_token_ids = r.stop_token_ids;
  g.ignore_eos = r.ignore_eos;
  g.top_logprobs = r.logprobs ? r.top_logprobs : -1;
  g.timeout_s = options_.request_timeout_s;
  g.draft = r.draft;
  g.background = r.background;
  g.constraint = std::move(constraint);
  auto submitted = model_.engine->submit(std::move(g));
  if (!submitted.ok()) {
    if (submitted.status().code() == StatusCode::kOutOfMemory) {
      HttpResponse resp = error_response(err(503, submitted.status().message(), "server_error", "server_overloaded"));
      resp.headers.emplace_back("Retry-After", std::to_string(options_.retry_after_s));
      return resp;
    }
    return error_response(err(400, submitted.status().message(), "invalid_request_error", "context_length_exceeded"));
  }
  std::shared_ptr<RequestHandle> h = *submitted;
  struct Generating {
    std::atomic<int>& n;
    std::shared_ptr<RequestHandle> h;
    ~Generating() { h->cancel(); --n; }  // any early return cancels the engine side
  } generating{generating_, h};
  ++generating_;

  // Wait for a slot (or a refusal) before committing to a 200.
  while (!h->wait_admitted(std::chrono::milliseconds(50))) {
    if (conn.client_gone()) { std::lock_guard lk(metrics_mu_); ++finished_abort_; return std::nullopt; }
  }
  if (!h->admitted()) {
    FinishReason fr = h->finish_reason();
    if (fr == FinishReason::kOverCapacity) {
      HttpResponse resp = error_response(err(503, h->error(), "server_error", "server_overloaded"));
      resp.headers.emplace_back("Retry-After", std::to_string(options_.retry_after_s));
      return resp;
    }
    return error_response(err(fr == FinishReason::kTimeout ? 504 : 503, h->error().empty() ? "the request was not run" : h->error(), "server_error"));
  }
  double const queue_s = std::chrono::duration<double>(Clock::now() - arrived).count();

  std::string const id = random_id(chat ? "chatcmpl-" : "cmpl-");
  int64_t const created = static_cast<int64_t>(std::time(nullptr));
  bool const stream = r.stream;
  bool const thinking = chat && r.render.thinking;
  bool const parse_tools = chat && !r.render.tools.empty();
  std::unique_ptr<OutputParser> parser = chat ? model_.parser(thinking, parse_tools) : nullptr;
  Utf8Stream utf8;
  StopMatcher stops(r.stop);

  // Reply state.
  std::string reasoning, content, text;  // text = completions text
  struct Call { std::string id, name, arguments; };
  std::vector<Call> calls;
  std::vector<int32_t> reply_ids;
  json::array lp_content;  // chat logprobs entries / completions tokens
  json::array cl_tokens, cl_lps, cl_tops, cl_offsets;
  int64_t generated = 0, reasoning_tokens = 0, text_offset = 0;
  auto const& eos_ids = model_.engine->info().eos_token_ids;
  bool stopped_by_string = false;
  double ttft = -1;
  auto last_write = Clock::now();

  auto chunk = [&](json::object choice) {
    json::object c{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                   {"model", model_.id}, {"choices", json::array{std::move(choice)}}};
    if (r.include_usage) c["usage"] = nullptr;
    last_write = Clock::now();
    return conn.write(sse_data(json::serialize(c)));
  };
  auto logprob_entry = [&](TokenEvent const& ev) {
    Utf8Stream u;
    std::string raw = model_.codec->token_bytes(ev.token);
    std::string tok = u.push(raw) + u.flush();
    if (chat) {
      json::array top;
      for (auto const& t : ev.top) {
        Utf8Stream ut;
        std::string rb = model_.codec->token_bytes(t.token);
        top.push_back(json::object{{"token", ut.push(rb) + ut.flush()}, {"logprob", t.logprob}, {"bytes", byte_list(rb)}});
      }
      return json::value(json::object{{"token", tok}, {"logprob", ev.logprob}, {"bytes", byte_list(raw)}, {"top_logprobs", std::move(top)}});
    }
    json::object top;
    for (auto const& t : ev.top) { Utf8Stream ut; top[ut.push(model_.codec->token_bytes(t.token)) + ut.flush()] = t.logprob; }
    cl_tokens.push_back(json::string(tok));
    cl_lps.push_back(ev.logprob);
    cl_tops.push_back(std::move(top));
    cl_offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(tok.size());
    return json::value(nullptr);
  };

  // Applies decoded text (already cut at stop strings) to the reply; returns the delta for streaming.
  auto apply_text = [&](std::string const& piece, OutputDelta& d) {
    if (!chat) { d.content += piece; return; }
    if (!piece.empty()) parser->feed(piece, d);
  };
  auto merge_delta = [&](OutputDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    if (!chat) text += d.content;
    // parallel_tool_calls: false keeps the first call only.
    std::vector<OutputDelta::Tool> kept;
    for (auto& t : d.tools) {
      if (!r.parallel_tool_calls && t.index > 0) continue;
      if (t.begin) calls.push_back({t.id, t.name, ""});
      if (t.index < static_cast<int>(calls.size())) calls[t.index].arguments += t.arguments;
      kept.push_back(std::move(t));
    }
    d.tools = std::move(kept);
  };
  auto stream_delta = [&](OutputDelta const& d, json::array* lps, json::array* ids) -> bool {
    if (!stream) return true;
    bool has_text = !d.reasoning.empty() || !d.content.empty();
    if (!has_text && d.tools.empty() && (!lps || lps->empty()) && (!ids || ids->empty())) return true;
    if (has_text || d.tools.empty() || (lps && !lps->empty())) {
      json::object choice{{"index", 0}};
      if (chat) {
        json::object delta;
        if (!d.reasoning.empty()) {
          delta["reasoning_content"] = d.reasoning;
          if (options_.reasoning_alias) delta["reasoning"] = d.reasoning;
        }
        if (!d.content.empty()) delta["content"] = d.content;
        choice["delta"] = std::move(delta);
        choice["logprobs"] = lps && !lps->empty() ? json::value(json::object{{"content", *lps}, {"refusal", nullptr}}) : json::value(nullptr);
      } else {
        choice["text"] = d.content;
        choice["logprobs"] = nullptr;
      }
      if (ids && !ids->empty()) choice["token_ids"] = *ids;
      choice["finish_reason"] = nullptr;
      if (!chunk(std::move(choice))) return false;
    }
    for (auto const& t : d.tools) {
      json::object fn{{"arguments", t.arguments}};
      json::object tc{{"index", t.index}};
      if (t.begin) { tc["id"] = t.id; tc["type"] = "function"; fn = json::object{{"name", t.name}, {"arguments", ""}}; }
      tc["function"] = std::move(fn);
      json::object choice{{"index", 0}, {"delta", json::object{{"tool_calls", json::array{std::move(tc)}}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (!chunk(std::move(choice))) return false;
      if (t.begin && !t.arguments.empty()) {
        json::object choice2{{"index", 0}, {"delta", json::object{{"tool_calls", json::array{json::object{{"index", t.index}, {"function", json::object{{"arguments", t.arguments}}}}}}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
        if (!chunk(std::move(choice2))) return false;
      }
    }
    return true;
  };

  if (stream) {
    if (!conn.begin_stream()) return std::nullopt;
    if (chat) {
      json::object first{{"index", 0}, {"delta", json::object{{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (!chunk(std::move(first))) return std::nullopt;
    }
  }
  // Echo (completions): the prompt text leads the reply.
  if (!chat && r.echo) {
    OutputDelta d;
    d.content = model_.codec->decode(prompt);
    Utf8Stream u;
    d.content = u.push(d.content) + u.flush();
    text_offset = static_cast<int64_t>(d.content.size());
    merge_delta(d);
    if (!stream_delta(d, nullptr, nullptr)) return std::nullopt;
  }

  bool client_lost = false;
  std::vector<TokenEvent> events;
  for (;;) {
    events.clear();
    bool got = h->wait(events, std::chrono::milliseconds(100));
    // finish is set after the last event is pushed: once it is seen, one more drain gets every event.
    FinishReason fr = h->finish_reason();
    // The drain may bring events the timed-out wait missed: they must be processed, not dropped.
    if (fr != FinishReason::kNone) got = h->wait(events, std::chrono::milliseconds(0)) || got;
    if (conn.client_gone()) { client_lost = true; break; }
    if (!got) {
      if (stream && std::chrono::duration<double>(Clock::now() - last_write).count() >= options_.keepalive_s) {
        last_write = Clock::now();
        if (!conn.write(sse_comment("keep-alive"))) { client_lost = true; break; }
      }
      continue;
    }
    OutputDelta d;
    json::array lps, ids;
    for (auto const& ev : events) {
      if (ttft < 0) ttft = std::chrono::duration<double>(Clock::now() - arrived).count();
      ++generated;
      if (ev.is_stop_token || stopped_by_string) continue;  // stop tokens count as generated, never as text
      reply_ids.push_back(ev.token);
      ids.push_back(ev.token);
      if (r.logprobs) { auto e = logprob_entry(ev); if (chat) { lps.push_back(e); lp_content.push_back(e); } }
      // EOS only reaches the reply under ignore_eos; it adds no text (special tokens are skipped).
      bool is_eos = std::find(eos_ids.begin(), eos_ids.end(), ev.token) != eos_ids.end();
      std::string piece = stops.push(utf8.push(is_eos ? std::string() : model_.codec->token_bytes(ev.token)));
      size_t before = d.reasoning.size();
      apply_text(piece, d);
      if (d.reasoning.size() > before) ++reasoning_tokens;
      if (stops.stopped()) { stopped_by_string = true; h->cancel(); }
    }
    bool done = fr != FinishReason::kNone || stopped_by_string;
    if (done) {
      std::string tail = stopped_by_string ? "" : stops.push(utf8.flush()) + stops.flush();
      apply_text(tail, d);
      if (chat) parser->finish(d);
    }
    merge_delta(d);
    if (!stream_delta(d, &lps, r.return_token_ids ? &ids : nullptr)) { client_lost = true; break; }
    if (done) break;
  }
  FinishReason fr = h->finish_reason();
  double const e2e = std::chrono::duration<double>(Clock::now() - arrived).count();
  if (client_lost) {
    h->cancel();
    std::lock_guard lk(metrics_mu_);
    ++finished_abort_;
    return std::nullopt;
  }
  std::string finish = "stop";
  if (!stopped_by_string && fr == FinishReason::kLength) finish = "length";
  if (chat && !calls.empty() && finish == "stop") finish = "tool_calls";
  bool failed = !stopped_by_string && (fr == FinishReason::kError || fr == FinishReason::kTimeout || fr == FinishReason::kCancelled);
  {
    std::lock_guard lk(metrics_mu_);
    if (failed) ++finished_abort_;
    else if (finish == "stop") ++finished_stop_;
    else if (finish == "length") ++finished_length_;
    else ++finished_tool_;
    if (ttft >= 0) ttft_.observe(ttft);
    e2e_.observe(e2e);
    queue_.observe(queue_s);
    if (generated > 1 && ttft >= 0) tpot_.observe((e2e - ttft) / double(generated - 1));
  }
  json::object usage{{"prompt_tokens", n}, {"completion_tokens", generated}, {"total_tokens", n + generated},
                     {"prompt_tokens_details", json::object{{"cached_tokens", h->cached_tokens()}}}};
  if (chat) usage["completion_tokens_details"] = json::object{{"reasoning_tokens", reasoning_tokens}};

  if (stream) {
    if (failed) {
      json::object e{{"message", h->error().empty() ? std::string("generation ended: ") + to_string(fr) : h->error()},
                     {"type", "server_error"}, {"param", nullptr}, {"code", fr == FinishReason::kTimeout ? "timeout" : "internal_error"}};
      conn.write(sse_data(json::serialize(json::object{{"error", std::move(e)}})));
    } else {
      json::object choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
      if (chat) choice["delta"] = json::object{};
      else choice["text"] = "";
      chunk(std::move(choice));
      if (r.include_usage) {
        json::object c{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                       {"model", model_.id}, {"choices", json::array{}}, {"usage", usage}};
        conn.write(sse_data(json::serialize(c)));
      }
    }
    conn.write(sse_done());
    conn.end_stream();
    return std::nullopt;
  }
  if (failed) {
    return error_response(err(fr == FinishReason::kTimeout ? 504 : 500,
                              h->error().empty() ? std::string("generation ended: ") + to_string(fr) : h->error(), "server_error",
                              fr == FinishReason::kTimeout ? "timeout" : "internal_error"));
  }
  json::object choice{{"index", 0}, {"finish_reason", finish}};
  if (chat) {
    json::object msg{{"role", "assistant"}, {"content", calls.empty() || !content.empty() ? json::value(content) : json::value(nullptr)}};
    if (thinking) {
      msg["reasoning_content"] = reasoning;
      if (options_.reasoning_alias) msg["reasoning"] = reasoning;
    }
    if (!calls.empty()) {
      json::array tcs;
      for (auto const& c : calls)
        tcs.push_back(json::object{{"id", c.id}, {"type", "function"}, {"function", json::object{{"name", c.name}, {"arguments", c.arguments}}}});
      msg["tool_calls"] = std::move(tcs);
    }
    choice["message"] = std::move(msg);
    choice["logprobs"] = r.logprobs ? json::value(json::object{{"content", lp_content}, {"refusal", nullptr}}) : json::value(nullptr);
  } else {
    choice["text"] = text;
    choice["logprobs"] = r.logprobs ? json::value(json::object{{"tokens", cl_tokens}, {"token_logprobs", cl_lps}, {"top_logprobs", cl_tops}, {"text_offset", cl_offsets}})
                                    : json::value(nullptr);
  }
  if (r.return_token_ids) {
    json::array ids;
    for (int32_t t : reply_ids) ids.push_back(t);
    choice["token_ids"] = std::move(ids);
  }
  json::object out{{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created}, {"model", model_.id},
                   {"choices", json::array{std::move(choice)}}, {"usage", std::move(usage)}};
  if (r.return_token_ids) {
    json::array pids;
    for (int32_t t : prompt) pids.push_back(t);
    out["prompt_token_ids"] = std::move(pids);
  }
  HttpResponse resp;
  resp.body = json::serialize(out);
  return resp;
}

}  // namespace tessera::server

// SPDX-License-Identifier: Apache-2.0
/// Reply gathering for chat and completions, streamed or not (see openai_client.hpp).
#include "verify/harness/openai_client.hpp"

#include <cstdio>

namespace tessera::harness {
namespace json = boost::json;

namespace {

void append_ids(Reply& r, json::value const* v) {
  if (!v || !v->is_array()) return;
  for (auto const& x : v->get_array())
    if (x.is_int64()) r.ids.push_back(static_cast<int32_t>(x.get_int64()));
  r.source = TokenSource::kIds;
}

void append_logprobs(Reply& r, json::value const* lp) {
  if (!lp || !lp->is_object()) return;
  auto const& o = lp->get_object();
  if (auto c = o.find("content"); c != o.end() && c->value().is_array()) {
    for (auto const& e : c->value().get_array()) {
      if (!e.is_object()) continue;
      auto const& eo = e.get_object();
      std::string tok;
      if (auto b = eo.find("bytes"); b != eo.end() && b->value().is_array()) {
        for (auto const& x : b->value().get_array()) if (x.is_int64()) tok += static_cast<char>(x.get_int64());
      } else if (auto t = eo.find("token"); t != eo.end() && t->value().is_string()) {
        tok = std::string(t->value().get_string());
      }
      r.tokens.push_back(std::move(tok));
    }
  } else if (auto t = o.find("tokens"); t != o.end() && t->value().is_array()) {
    for (auto const& x : t->value().get_array()) r.tokens.push_back(x.is_string() ? std::string(x.get_string()) : std::string());
  }
}

void apply_tool_deltas(Reply& r, json::value const* v) {
  if (!v || !v->is_array()) return;
  for (auto const& d : v->get_array()) {
    if (!d.is_object()) continue;
    auto const& o = d.get_object();
    int64_t idx = o.contains("index") && o.at("index").is_int64() ? o.at("index").get_int64() : 0;
    while (static_cast<int64_t>(r.tool_calls.size()) <= idx) r.tool_calls.push_back(json::object{{"id", ""}, {"name", ""}, {"arguments", ""}});
    auto& call = r.tool_calls[static_cast<size_t>(idx)].get_object();
    if (auto id = o.find("id"); id != o.end() && id->value().is_string()) call["id"] = id->value().get_string();
    if (auto fn = o.find("function"); fn != o.end() && fn->value().is_object()) {
      auto const& f = fn->value().get_object();
      if (auto n = f.find("name"); n != f.end() && n->value().is_string())
        call["name"] = std::string(call["name"].get_string()) + std::string(n->value().get_string());
      if (auto a = f.find("arguments"); a != f.end() && a->value().is_string())
        call["arguments"] = std::string(call["arguments"].get_string()) + std::string(a->value().get_string());
    }
  }
}

std::string str_or(json::object const& o, char const* key) {
  auto it = o.find(key);
  return it != o.end() && it->value().is_string() ? std::string(it->value().get_string()) : std::string();
}

// One choice object of a full response or a chunk.
void apply_choice(Reply& r, json::object const& c, bool chunk) {
  if (auto it = c.find("token_ids"); it != c.end()) append_ids(r, &it->value());
  if (auto it = c.find("logprobs"); it != c.end()) append_logprobs(r, &it->value());
  if (auto it = c.find("finish_reason"); it != c.end() && it->value().is_string()) r.finish_reason = it->value().get_string();
  if (auto it = c.find("text"); it != c.end() && it->value().is_string()) r.text += it->value().get_string();
  char const* key = chunk ? "delta" : "message";
  if (auto it = c.find(key); it != c.end() && it->value().is_object()) {
    auto const& m = it->value().get_object();
    r.content += str_or(m, "content");
    r.reasoning += str_or(m, "reasoning_content");
    if (auto tc = m.find("tool_calls"); tc != m.end()) {
      if (chunk) {
        apply_tool_deltas(r, &tc->value());
      } else if (tc->value().is_array()) {
        for (auto const& t : tc->value().get_array()) {
          if (!t.is_object()) continue;
          json::object call{{"id", str_or(t.get_object(), "id")}, {"name", ""}, {"arguments", ""}};
          if (auto fn = t.get_object().find("function"); fn != t.get_object().end() && fn->value().is_object()) {
            call["name"] = str_or(fn->value().get_object(), "name");
            call["arguments"] = str_or(fn->value().get_object(), "arguments");
          }
          r.tool_calls.push_back(std::move(call));
        }
      }
    }
  }
}

void fail(Reply& r, std::string msg, bool server_side) {
  if (r.error.empty()) r.error = std::move(msg);
  r.server_error = r.server_error || server_side;
}

}  // namespace

Reply call_openai(Url const& url, bool chat, json::object const& body, CallOptions const& opt) {
  Reply r;
  bool const stream = body.contains("stream") && body.at("stream").is_bool() && body.at("stream").get_bool();
  std::string const target = chat ? "/v1/chat/completions" : "/v1/completions";
  SseSplitter sse;
  bool done = false, stream_error = false;
  std::string protocol_error;
  auto on_event = [&](std::string const& data) {
    ++r.events;
    if (done) { protocol_error = "SSE data after [DONE]"; return; }
    if (data == "[DONE]") { done = true; return; }
    boost::system::error_code ec;
    json::value v = json::parse(data, ec);
    if (ec || !v.is_object()) { protocol_error = "SSE event is not a JSON object: " + data.substr(0, 200); return; }
    auto const& o = v.get_object();
    if (auto e = o.find("error"); e != o.end()) { stream_error = true; protocol_error = "in-stream error: " + json::serialize(e->value()); return; }
    auto ch = o.find("choices");
    if (ch == o.end() || !ch->value().is_array()) { protocol_error = "chunk without choices"; return; }
    for (auto const& c : ch->value().get_array()) if (c.is_object()) apply_choice(r, c.get_object(), true);
  };
  ChunkFn on_chunk;
  if (stream)
    on_chunk = [&](std::string_view piece) {
      for (auto const& d : sse.push(piece)) {
        on_event(d);
        if (opt.abort_after_events >= 0 && r.events >= opt.abort_after_events) return false;
      }
      return true;
    };
  HttpResult h = http_request(url, "POST", target, json::serialize(body), opt.timeout_s, on_chunk);
  r.status = h.status;
  r.seconds = h.seconds;
  r.aborted = h.aborted;
  if (h.aborted) return r;
  if (!h.error.empty()) { fail(r, h.error, h.status >= 500 || h.status == 200); return r; }
  if (h.status != 200) {
    fail(r, "HTTP " + std::to_string(h.status) + ": " + h.body.substr(0, 300), h.status >= 500);
    boost::system::error_code ec;
    json::value v = json::parse(h.body, ec);
    if (ec || !v.is_object() || !v.get_object().contains("error")) fail(r, "", true);  // error without OpenAI shape
    return r;
  }
  if (stream) {
    if (h.content_type.find("text/event-stream") == std::string::npos) fail(r, "stream reply with content-type '" + h.content_type + "'", true);
    if (sse.malformed()) fail(r, "malformed SSE framing", true);
    if (!protocol_error.empty()) fail(r, protocol_error, true);
    if (!done) fail(r, "SSE stream ended without [DONE]", true);
    if (!sse.pending().empty()) fail(r, "SSE stream has trailing bytes after the last event", true);
    (void)stream_error;
    if (r.source == TokenSource::kNone && !r.tokens.empty()) r.source = TokenSource::kLogprobs;
    return r;
  }
  boost::system::error_code ec;
  json::value v = json::parse(h.body, ec);
  if (ec || !v.is_object()) { fail(r, "response is not JSON: " + h.body.substr(0, 200), true); return r; }
  auto const& o = v.get_object();
  auto ch = o.find("choices");
  if (ch == o.end() || !ch->value().is_array() || ch->value().get_array().empty() || !ch->value().get_array()[0].is_object()) {
    fail(r, "response without choices[0]", true);
    return r;
  }
  apply_choice(r, ch->value().get_array()[0].get_object(), false);
  if (auto p = o.find("prompt_token_ids"); p != o.end() && p->value().is_array())
    for (auto const& x : p->value().get_array()) if (x.is_int64()) r.prompt_ids.push_back(static_cast<int32_t>(x.get_int64()));
  if (r.source == TokenSource::kNone && !r.tokens.empty()) r.source = TokenSource::kLogprobs;
  if (r.finish_reason.empty()) fail(r, "choices[0] without finish_reason", true);
  return r;
}

Detok detokenize(Url const& url, std::vector<int32_t> const& ids, double timeout_s) {
  json::array a;
  for (int32_t t : ids) a.push_back(t);
  HttpResult h = http_request(url, "POST", "/detokenize", json::serialize(json::object{{"tokens", a}}), timeout_s);
  Detok d;
  if (h.status != 200) return d;
  boost::system::error_code ec;
  json::value v = json::parse(h.body, ec);
  if (ec || !v.is_object() || !v.get_object().contains("prompt") || !v.get_object().at("prompt").is_string()) return d;
  d.ok = true;
  d.text = v.get_object().at("prompt").get_string();
  return d;
}

std::string printable(std::string const& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == '\r') o += "\\r";
    else if (c < 0x20 || c == 0x7f) { char b[8]; std::snprintf(b, sizeof b, "\\x%02x", c); o += b; }
    else o += static_cast<char>(c);
  }
  return o;
}

}  // namespace tessera::harness

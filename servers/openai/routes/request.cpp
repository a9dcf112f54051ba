// SPDX-License-Identifier: Apache-2.0
/// Request parsing and validation (see request.hpp). Every malformed known field is a 400 naming the
/// field; unknown top-level fields are ignored.
#include "servers/openai/routes/request.hpp"

#include <cmath>

#include <boost/json.hpp>

namespace tessera::server {
namespace json = boost::json;

namespace {

ApiError bad(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

char const* kind_name(json::value const& v) {
  switch (v.kind()) {
    case json::kind::null: return "null";
    case json::kind::bool_: return "a boolean";
    case json::kind::int64: case json::kind::uint64: return "an integer";
    case json::kind::double_: return "a number";
    case json::kind::string: return "a string";
    case json::kind::array: return "an array";
    case json::kind::object: return "an object";
  }
  return "?";
}

// Field readers: nullopt error = ok (value written to out); a present JSON null counts as absent.
std::optional<ApiError> get_bool(json::object const& o, char const* key, bool& out, std::string const& prefix = "") {
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return std::nullopt;
  if (!it->value().is_bool()) return bad(prefix + key, "'" + prefix + key + "' must be a boolean, got " + kind_name(it->value()));
  out = it->value().get_bool();
  return std::nullopt;
}

std::optional<ApiError> get_number(json::object const& o, char const* key, double lo, double hi, std::optional<double>& out) {
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return std::nullopt;
  json::value const& v = it->value();
  if (!v.is_number()) return bad(key, std::string("'") + key + "' must be a number, got " + kind_name(v));
  double d = v.to_number<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return bad(key, std::string("'") + key + "' must be between " + json::serialize(json::value(lo)) + " and " +
                        json::serialize(json::value(hi)) + ", got " + json::serialize(v));
  out = d;
  return std::nullopt;
}

std::optional<ApiError> get_int(json::object const& o, char const* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return std::nullopt;
  json::value const& v = it->value();
  int64_t x;
  if (v.is_int64()) x = v.get_int64();
  else if (v.is_uint64()) x = v.get_uint64() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v.get_uint64());
  else if (v.is_double() && std::isfinite(v.get_double()) && v.get_double() == std::floor(v.get_double()) && std::fabs(v.get_double()) < 9e15)
    x = static_cast<int64_t>(v.get_double());  // 5.0 is an integer; 5.5 is not
  else return bad(key, std::string("'") + key + "' must be an integer, got " + kind_name(v) +
                           (v.is_double() ? " (" + json::serialize(v) + ")" : ""));
  if (x < lo || x > hi)
    return bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                        ", got " + std::to_string(x));
  out = x;
  return std::nullopt;
}

#define TRY_FIELD(expr) do { if (auto e_ = (expr)) return *e_; } while (0)

// Message content: string, null, or an array of text parts (joined with "\n\n" as the encoder does).
std::optional<ApiError> read_content(json::value const& v, std::string const& where, std::string& out, bool& is_null) {
  is_null = false;
  if (v.is_null()) { is_null = true; return std::nullopt; }
  if (v.is_string()) { out = v.get_string(); return std::nullopt; }
  if (!v.is_array()) return bad(where, "'" + where + "' must be a string, null or an array of content parts, got " + kind_name(v));
  std::string joined;
  size_t k = 0;
  for (auto const& part : v.get_array()) {
    std::string pw = where + "[" + std::to_string(k++) + "]";
    if (!part.is_object()) return bad(pw, "'" + pw + "' must be an object");
    auto const& po = part.get_object();
    auto t = po.find("type");
    if (t == po.end() || !t->value().is_string()) return bad(pw + ".type", "'" + pw + ".type' must be a string");
    std::string type(t->value().get_string());
    if (type == "text" || type == "input_text") {
      auto tx = po.find("text");
      if (tx == po.end() || !tx->value().is_string()) return bad(pw + ".text", "'" + pw + ".text' must be a string");
      if (!joined.empty()) joined += "\n\n";
      joined += tx->value().get_string();
    } else if (type == "image_url" || type == "input_image" || type == "image") {
      return bad(pw, "image input is not supported by this server (text-only model)");
    } else {
      return bad(pw + ".type", "unsupported content part type '" + type + "'");
    }
  }
  out = std::move(joined);
  return std::nullopt;
}

std::optional<ApiError> read_messages(json::object const& body, RequestLimits const& limits, std::vector<ChatMessage>& out) {
  auto it = body.find("messages");
  if (it == body.end() || it->value().is_null()) return bad("messages", "'messages' is a required field");
  if (!it->value().is_array()) return bad("messages", std::string("'messages' must be an array, got ") + kind_name(it->value()));
  auto const& arr = it->value().get_array();
  if (arr.empty()) return bad("messages", "'messages' must contain at least one message");
  if (arr.size() > limits.max_messages)
    return bad("messages", "'messages' has " + std::to_string(arr.size()) + " entries; the limit is " + std::to_string(limits.max_messages));
  for (size_t i = 0; i < arr.size(); ++i) {
    std::string w = "messages[" + std::to_string(i) + "]";
    if (!arr[i].is_object()) return bad(w, "'" + w + "' must be an object, got " + kind_name(arr[i]));
    auto const& m = arr[i].get_object();
    auto r = m.find("role");
    if (r == m.end() || !r->value().is_string()) return bad(w + ".role", "'" + w + ".role' is required and must be a string");
    ChatMessage msg;
    msg.role = r->value().get_string();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      return bad(w + ".role", "unknown role '" + std::string(r->value().get_string()) +
                                  "' (expected system, developer, user, assistant or tool)");
    bool is_null = true;
    auto c = m.find("content");
    if (c != m.end()) TRY_FIELD(read_content(c->value(), w + ".content", msg.content, is_null));
    if (is_null && msg.role != "assistant") return bad(w + ".content", "'" + w + ".content' is required for role '" + msg.role + "'");
    for (char const* rk : {"reasoning_content", "reasoning"}) {
      auto rc = m.find(rk);
      if (rc == m.end() || rc->value().is_null()) continue;
      if (!rc->value().is_string()) return bad(w + "." + rk, "'" + w + "." + rk + "' must be a string");
      msg.reasoning = std::string(rc->value().get_string());
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->value().is_null()) {
      if (msg.role != "assistant") return bad(w + ".tool_calls", "only assistant messages carry tool_calls");
      if (!tc->value().is_array()) return bad(w + ".tool_calls", "'" + w + ".tool_calls' must be an array");
      size_t k = 0;
      for (auto const& call : tc->value().get_array()) {
        std::string cw = w + ".tool_calls[" + std::to_string(k++) + "]";
        if (!call.is_object()) return bad(cw, "'" + cw + "' must be an object");
        auto const& co = call.get_object();
        ToolCallRef ref;
        if (auto id = co.find("id"); id != co.end() && id->value().is_string()) ref.id = id->value().get_string();
        auto fn = co.find("function");
        if (fn == co.end() || !fn->value().is_object()) return bad(cw + ".function", "'" + cw + ".function' must be an object");
        auto const& fo = fn->value().get_object();
        auto nm = fo.find("name");
        if (nm == fo.end() || !nm->value().is_string()) return bad(cw + ".function.name", "'" + cw + ".function.name' must be a string");
        ref.name = nm->value().get_string();
        auto ar = fo.find("arguments");
        if (ar != fo.end() && ar->value().is_string()) ref.arguments = ar->value().get_string();
        else if (ar != fo.end() && ar->value().is_object()) ref.arguments = json::serialize(ar->value());
        else if (ar == fo.end() || ar->value().is_null()) ref.arguments = "{}";
        else return bad(cw + ".function.arguments", "'" + cw + ".function.arguments' must be a string or an object");
        msg.tool_calls.push_back(std::move(ref));
      }
    }
    if (msg.role == "assistant" && is_null && msg.tool_calls.empty() && !msg.reasoning)
      return bad(w + ".content", "'" + w + ".content' is required unless the message has tool_calls");
    if (auto id = m.find("tool_call_id"); id != m.end() && !id->value().is_null()) {
      if (!id->value().is_string()) return bad(w + ".tool_call_id", "'" + w + ".tool_call_id' must be a string");
      msg.tool_call_id = id->value().get_string();
    }
    out.push_back(std::move(msg));
  }
  return std::nullopt;
}

// Fields shared by chat and completions.
std::optional<ApiError> read_common(json::object const& body, RequestLimits const& limits, ApiRequest& r) {
  if (auto m = body.find("model"); m != body.end() && !m->value().is_null()) {
    if (!m->value().is_string()) return bad("model", std::string("'model' must be a string, got ") + kind_name(m->value()));
    r.model = m->value().get_string();
  }
  std::optional<int64_t> i;
  std::optional<double> d;
  TRY_FIELD(get_int(body, "n", 1, 1 << 20, i));
  if (i && *i != 1) return bad("n", "'n' must be 1: this server generates one choice per request");
  i.reset();
  TRY_FIELD(get_int(body, "max_tokens", 1, limits.max_tokens_cap, i));
  if (i) r.max_tokens = i;
  i.reset();
  TRY_FIELD(get_int(body, "max_completion_tokens", 1, limits.max_tokens_cap, i));
  if (i) r.max_tokens = i;
  d.reset(); TRY_FIELD(get_number(body, "temperature", 0, 2, d)); if (d) r.sampling.temperature = static_cast<float>(*d);
  d.reset(); TRY_FIELD(get_number(body, "top_p", 0, 1, d));
  if (d) { if (*d <= 0) return bad("top_p", "'top_p' must be in (0, 1]"); r.sampling.top_p = static_cast<float>(*d); }
  i.reset(); TRY_FIELD(get_int(body, "top_k", -1, 1 << 30, i)); if (i) r.sampling.top_k = static_cast<int32_t>(std::max<int64_t>(*i, 0));
  d.reset(); TRY_FIELD(get_number(body, "min_p", 0, 1, d)); if (d) r.sampling.min_p = static_cast<float>(*d);
  d.reset(); TRY_FIELD(get_number(body, "presence_penalty", -2, 2, d)); if (d) r.sampling.presence_penalty = static_cast<float>(*d);
  d.reset(); TRY_FIELD(get_number(body, "frequency_penalty", -2, 2, d)); if (d) r.sampling.frequency_penalty = static_cast<float>(*d);
  d.reset(); TRY_FIELD(get_number(body, "repetition_penalty", 0, 10, d));
  if (d) { if (*d <= 0) return bad("repetition_penalty", "'repetition_penalty' must be > 0"); r.sampling.repetition_penalty = static_cast<float>(*d); }
  if (auto s = body.find("seed"); s != body.end() && !s->value().is_null()) {
    json::value const& v = s->value();
    if (v.is_int64()) r.sampling.seed = static_cast<uint64_t>(v.get_int64());
    else if (v.is_uint64()) r.sampling.seed = v.get_uint64();
    else return bad("seed", std::string("'seed' must be an integer, got ") + kind_name(v));
    r.seed_given = true;
  }
  if (auto s = body.find("stop"); s != body.end() && !s->value().is_null()) {
    if (s->value().is_string()) {
      r.stop.emplace_back(s->value().get_string());
    } else if (s->value().is_array()) {
      for (auto const& x : s->value().get_array()) {
        if (!x.is_string()) return bad("stop", std::string("'stop' entries must be strings, got ") + kind_name(x));
        r.stop.emplace_back(x.get_string());
      }
    } else {
      return bad("stop", std::string("'stop' must be a string or an array of strings, got ") + kind_name(s->value()));
    }
    if (r.stop.size() > limits.max_stop) return bad("stop", "'stop' has more than " + std::to_string(limits.max_stop) + " entries");
    for (auto const& x : r.stop) if (x.empty()) return bad("stop", "'stop' strings must not be empty");
  }
  if (auto s = body.find("stop_token_ids"); s != body.end() && !s->value().is_null()) {
    if (!s->value().is_array()) return bad("stop_token_ids", "'stop_token_ids' must be an array of integers");
    for (auto const& x : s->value().get_array()) {
      if (!x.is_int64() || x.get_int64() < 0 || x.get_int64() > INT32_MAX)
        return bad("stop_token_ids", "'stop_token_ids' entries must be non-negative integers");
      r.stop_token_ids.push_back(static_cast<int32_t>(x.get_int64()));
    }
  }
  TRY_FIELD(get_bool(body, "stream", r.stream));
  if (auto so = body.find("stream_options"); so != body.end() && !so->value().is_null()) {
    if (!so->value().is_object()) return bad("stream_options", "'stream_options' must be an object");
    TRY_FIELD(get_bool(so->value().get_object(), "include_usage", r.include_usage, "stream_options."));
  }
  TRY_FIELD(get_bool(body, "ignore_eos", r.ignore_eos));
  TRY_FIELD(get_bool(body, "return_token_ids", r.return_token_ids));
  TRY_FIELD(get_bool(body, "draft", r.draft));
  if (auto p = body.find("priority"); p != body.end() && !p->value().is_null()) {
    json::value const& v = p->value();
    if (v.is_string() && (v.get_string() == "background" || v.get_string() == "low")) r.background = true;
    else if (v.is_string() && (v.get_string() == "interactive" || v.get_string() == "normal" || v.get_string() == "auto" ||
                               v.get_string() == "default")) r.background = false;
    else if (v.is_int64() || v.is_uint64()) r.background = v.is_uint64() || v.get_int64() > 0;  // vLLM: lower is earlier
    else return bad("priority", "'priority' must be \"interactive\", \"background\" or an integer (lower runs first)");
  }
  return std::nullopt;
}

}  // namespace

ParsedBody parse_body(std::string_view body, RequestLimits const& limits) {
  if (!valid_utf8(body)) return bad("", "the request body is not valid UTF-8");
  json::parse_options opt;
  opt.max_depth = limits.max_json_depth;
  boost::system::error_code ec;
  json::value v = json::parse(body, ec, {}, opt);
  if (ec) {
    if (ec == json::error::too_deep)
      return bad("", "the request JSON nests deeper than " + std::to_string(limits.max_json_depth) + " levels");
    return bad("", "the request body is not valid JSON: " + ec.message());
  }
  if (!v.is_object()) return bad("", std::string("the request body must be a JSON object, got ") + kind_name(v));
  return std::move(v.get_object());
}

std::optional<Effort> map_effort(json::value const& v) {
  if (v.is_int64() || v.is_uint64()) {
    int64_t x = v.is_int64() ? v.get_int64() : -1;
    if (x >= 1 && x <= 100) return Effort{true, static_cast<int>(x)};
    return std::nullopt;
  }
  if (!v.is_string()) return std::nullopt;
  std::string s(v.get_string());
  if (s == "none") return Effort{false, 75};
  if (s == "low" || s == "minimal") return Effort{true, 50};
  if (s == "high" || s == "medium" || s == "xhigh") return Effort{true, 75};
  if (s == "max" || s == "ultra") return Effort{true, 100};
  return std::nullopt;
}

ParsedRequest parse_chat_request(json::object const& body, RequestLimits const& limits) {
  ApiRequest r;
  r.chat = true;
  TRY_FIELD(read_messages(body, limits, r.messages));
  TRY_FIELD(read_common(body, limits, r));
  TRY_FIELD(get_bool(body, "logprobs", r.logprobs));
  std::optional<int64_t> i;
  TRY_FIELD(get_int(body, "top_logprobs", 0, 20, i));
  if (i) r.top_logprobs = static_cast<int32_t>(*i);
  // Thinking and effort: top-level fields, then chat_template_kwargs (which win).
  auto apply_effort = [&](json::value const& v, std::string const& param) -> std::optional<ApiError> {
    auto e = map_effort(v);
    if (!e) return bad(param, "'" + param + "' must be an integer 1..100 or one of none, minimal, low, medium, high, xhigh, max, ultra; got " + json::serialize(v));
    r.render.thinking = e->thinking;
    r.render.effort = e->value;
    return std::nullopt;
  };
  if (auto e = body.find("reasoning_effort"); e != body.end() && !e->value().is_null()) TRY_FIELD(apply_effort(e->value(), "reasoning_effort"));
  if (auto e = body.find("reasoning"); e != body.end() && !e->value().is_null()) {
    if (!e->value().is_object()) return bad("reasoning", "'reasoning' must be an object");
    if (auto ef = e->value().get_object().find("effort"); ef != e->value().get_object().end() && !ef->value().is_null())
      TRY_FIELD(apply_effort(ef->value(), "reasoning.effort"));
  }
  if (auto t = body.find("thinking"); t != body.end() && !t->value().is_null()) {
    json::value const& tv = t->value();
    if (tv.is_bool()) r.render.thinking = tv.get_bool();
    else if (tv.is_object() && tv.get_object().contains("type") && tv.get_object().at("type").is_string()) {
      auto ty = tv.get_object().at("type").get_string();
      if (ty == "enabled") r.render.thinking = true;
      else if (ty == "disabled") r.render.thinking = false;
      else return bad("thinking.type", "'thinking.type' must be 'enabled' or 'disabled'");
    } else {
      return bad("thinking", "'thinking' must be {\"type\": \"enabled\"|\"disabled\"}");
    }
  }
  TRY_FIELD(get_bool(body, "enable_thinking", r.render.thinking));
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->value().is_null()) {
    if (!k->value().is_object()) return bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    auto const& ko = k->value().get_object();
    if (auto e = ko.find("reasoning_effort"); e != ko.end() && !e->value().is_null())
      TRY_FIELD(apply_effort(e->value(), "chat_template_kwargs.reasoning_effort"));
    TRY_FIELD(get_bool(ko, "thinking", r.render.thinking, "chat_template_kwargs."));
    TRY_FIELD(get_bool(ko, "enable_thinking", r.render.thinking, "chat_template_kwargs."));
    TRY_FIELD(get_bool(ko, "drop_thinking", r.render.drop_thinking, "chat_template_kwargs."));
  }
  // Tools.
  if (auto t = body.find("tools"); t != body.end() && !t->value().is_null()) {
    if (!t->value().is_array()) return bad("tools", "'tools' must be an array");
    if (t->value().get_array().size() > limits.max_tools) return bad("tools", "too many tools");
    size_t k = 0;
    for (auto const& tool : t->value().get_array()) {
      std::string w = "tools[" + std::to_string(k++) + "]";
      if (!tool.is_object()) return bad(w, "'" + w + "' must be an object");
      auto const& to = tool.get_object();
      if (auto ty = to.find("type"); ty != to.end() && !(ty->value().is_string() && ty->value().get_string() == "function"))
        return bad(w + ".type", "'" + w + ".type' must be 'function'");
      auto fn = to.find("function");
      if (fn == to.end() || !fn->value().is_object()) return bad(w + ".function", "'" + w + ".function' must be an object");
      auto const& fo = fn->value().get_object();
      auto nm = fo.find("name");
      if (nm == fo.end() || !nm->value().is_string() || nm->value().get_string().empty())
        return bad(w + ".function.name", "'" + w + ".function.name' must be a non-empty string");
      if (auto p = fo.find("parameters"); p != fo.end() && !p->value().is_object() && !p->value().is_null())
        return bad(w + ".function.parameters", "'" + w + ".function.parameters' must be an object");
      r.tool_names.emplace_back(nm->value().get_string());
      r.render.tools.push_back(fn->value());
    }
  }
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->value().is_null()) {
    json::value const& v = tc->value();
    if (v.is_string()) {
      std::string s(v.get_string());
      if (s != "none" && s != "auto" && s != "required") return bad("tool_choice", "'tool_choice' must be none, auto, required or a named function");
      r.tool_choice = s;
    } else if (v.is_object() && v.get_object().contains("function") && v.get_object().at("function").is_object() &&
               v.get_object().at("function").get_object().contains("name") &&
               v.get_object().at("function").get_object().at("name").is_string()) {
      r.tool_choice = "function";
      r.tool_choice_name = v.get_object().at("function").get_object().at("name").get_string();
      if (std::find(r.tool_names.begin(), r.tool_names.end(), r.tool_choice_name) == r.tool_names.end())
        return bad("tool_choice", "'tool_choice' names function '" + r.tool_choice_name + "', which is not in 'tools'");
    } else {
      return bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if ((r.tool_choice == "required") && r.tool_names.empty()) return bad("tool_choice", "'tool_choice' is 'required' but no tools were given");
  }
  if (r.tool_choice == "none") r.render.tools.clear();
  TRY_FIELD(get_bool(body, "parallel_tool_calls", r.parallel_tool_calls));
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->value().is_null()) {
    if (!rf->value().is_object()) return bad("response_format", "'response_format' must be an object");
    auto const& ro = rf->value().get_object();
    auto ty = ro.find("type");
    if (ty == ro.end() || !ty->value().is_string()) return bad("response_format.type", "'response_format.type' must be a string");
    r.response_format = ty->value().get_string();
    if (r.response_format == "json_schema") {
      auto js = ro.find("json_schema");
      if (js == ro.end() || !js->value().is_object()) return bad("response_format.json_schema", "'response_format.json_schema' must be an object");
      auto const& jo = js->value().get_object();
      auto sc = jo.find("schema");
      if (sc != jo.end() && !sc->value().is_object() && !sc->value().is_bool())
        return bad("response_format.json_schema.schema", "'response_format.json_schema.schema' must be an object");
      r.render.response_schema = sc != jo.end() ? sc->value() : json::value(json::object{});
    } else if (r.response_format == "json_object") {
      r.render.response_schema = json::value(json::object{{"type", "object"}});
    } else if (r.response_format != "text") {
      return bad("response_format.type", "'response_format.type' must be text, json_object or json_schema");
    }
  }
  return r;
}

ParsedRequest parse_completion_request(json::object const& body, RequestLimits const& limits) {
  ApiRequest r;
  r.chat = false;
  auto p = body.find("prompt");
  if (p == body.end() || p->value().is_null()) return bad("prompt", "'prompt' is a required field");
  json::value const& pv = p->value();
  auto read_ids = [&](json::array const& a) -> std::optional<ApiError> {
    for (auto const& x : a) {
      if (!x.is_int64() || x.get_int64() < 0 || x.get_int64() > INT32_MAX)
        return bad("prompt", "'prompt' token ids must be non-negative integers");
      r.prompt_ids.push_back(static_cast<int32_t>(x.get_int64()));
    }
    return std::nullopt;
  };
  if (pv.is_string()) {
    r.prompt_text = std::string(pv.get_string());
  } else if (pv.is_array() && pv.get_array().size() == 1 && pv.get_array()[0].is_string()) {
    r.prompt_text = std::string(pv.get_array()[0].get_string());
  } else if (pv.is_array() && pv.get_array().size() == 1 && pv.get_array()[0].is_array()) {
    TRY_FIELD(read_ids(pv.get_array()[0].get_array()));
  } else if (pv.is_array() && (pv.get_array().empty() || pv.get_array()[0].is_number())) {
    TRY_FIELD(read_ids(pv.get_array()));
  } else if (pv.is_array()) {
    return bad("prompt", "'prompt' batches are not supported: send one prompt (a string or a list of token ids) per request");
  } else {
    return bad("prompt", std::string("'prompt' must be a string or a list of token ids, got ") + kind_name(pv));
  }
  if ((r.prompt_text && r.prompt_text->empty()) || (!r.prompt_text && r.prompt_ids.empty()))
    return bad("prompt", "'prompt' must not be empty");
  TRY_FIELD(read_common(body, limits, r));
  if (!r.max_tokens) r.max_tokens = 16;  // OpenAI's completions default
  TRY_FIELD(get_bool(body, "echo", r.echo));
  if (auto lp = body.find("logprobs"); lp != body.end() && !lp->value().is_null()) {
    std::optional<int64_t> k;
    TRY_FIELD(get_int(body, "logprobs", 0, 20, k));
    r.logprobs = true;
    r.top_logprobs = static_cast<int32_t>(*k);
  }
  return r;
}

}  // namespace tessera::server

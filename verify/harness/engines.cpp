// SPDX-License-Identifier: Apache-2.0
/// Request files, the two-server comparison and teacher forcing (see engines.hpp).
#include "verify/harness/engines.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace tessera::harness {
namespace json = boost::json;

Result<std::vector<RequestSpec>> load_requests(std::string const& path) {
  std::ifstream f(path);
  if (!f) return io_error("cannot read the requests file '" + path + "'");
  std::vector<RequestSpec> out;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    size_t a = line.find_first_not_of(" \t\r");
    if (a == std::string::npos || line[a] == '#') continue;
    auto where = [&] { return "requests file '" + path + "' line " + std::to_string(lineno); };
    boost::system::error_code ec;
    json::value v = json::parse(line, ec);
    if (ec || !v.is_object()) return malformed(where() + ": not a JSON object (" + (ec ? ec.message() : "wrong type") + ")");
    RequestSpec s;
    s.line = lineno;
    s.body = std::move(v.get_object());
    s.name = "line " + std::to_string(lineno);
    if (auto n = s.body.find("name"); n != s.body.end()) {
      if (!n->value().is_string()) return malformed(where() + ": \"name\" must be a string");
      s.name = n->value().get_string();
      s.body.erase(n);
    }
    bool has_msgs = s.body.contains("messages"), has_prompt = s.body.contains("prompt");
    if (has_msgs == has_prompt) return malformed(where() + ": exactly one of \"messages\" (chat) or \"prompt\" (completions) is required");
    s.chat = has_msgs;
    if (has_msgs && (!s.body.at("messages").is_array() || s.body.at("messages").get_array().empty()))
      return malformed(where() + ": \"messages\" must be a non-empty array");
    if (auto fu = s.body.find("followups"); fu != s.body.end()) {
      if (!fu->value().is_array()) return malformed(where() + ": \"followups\" must be an array of user messages");
      if (!s.chat) return malformed(where() + ": \"followups\" needs a chat request (\"messages\")");
      for (auto const& m : fu->value().get_array()) {
        if (!m.is_string() && !m.is_object()) return malformed(where() + ": each followup must be a string or a message object");
        s.followups.push_back(m);
      }
      s.body.erase(fu);
    }
    if (auto tr = s.body.find("tool_results"); tr != s.body.end()) {
      if (!tr->value().is_array()) return malformed(where() + ": \"tool_results\" must be an array of strings");
      for (auto const& m : tr->value().get_array()) {
        if (!m.is_string()) return malformed(where() + ": \"tool_results\" entries must be strings");
        s.tool_results.emplace_back(m.get_string());
      }
      s.body.erase(tr);
    }
    if (s.body.contains("n") && !(s.body.at("n").is_int64() && s.body.at("n").get_int64() == 1))
      return malformed(where() + ": \"n\" must be 1 (one reply per request is compared)");
    out.push_back(std::move(s));
  }
  if (out.empty()) return malformed("requests file '" + path + "' holds no requests");
  return out;
}

size_t EnginesReport::equal() const {
  return static_cast<size_t>(std::count_if(replies.begin(), replies.end(), [](ReplyDiff const& d) { return d.equal; }));
}

namespace {

json::object prepared(json::object body, bool chat) {
  if (!body.contains("temperature")) body["temperature"] = 0;
  body["return_token_ids"] = true;
  if (!body.contains("logprobs")) {
    if (chat) body["logprobs"] = true;
    else body["logprobs"] = 0;
  }
  return body;
}

// s with every byte that does not start a well-formed UTF-8 sequence (RFC 3629: no overlongs, no surrogates,
// at most U+10FFFF) replaced by U+FFFD: one token of a byte-level vocabulary can be a partial character,
// and the text, JSON and HTML reports must stay valid UTF-8.
std::string valid_utf8(std::string const& s) {
  std::string o;
  size_t i = 0, n = s.size();
  auto cont = [&](size_t k) { return k < n && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80; };
  while (i < n) {
    unsigned char const c = static_cast<unsigned char>(s[i]);
    unsigned char const c1 = i + 1 < n ? static_cast<unsigned char>(s[i + 1]) : 0;
    size_t len = 0;
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF && cont(i + 1)) len = 2;
    else if (c >= 0xE0 && c <= 0xEF && cont(i + 1) && cont(i + 2) && !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0)) len = 3;
    else if (c >= 0xF0 && c <= 0xF4 && cont(i + 1) && cont(i + 2) && cont(i + 3) && !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90)) len = 4;
    if (len) o.append(s, i, len), i += len;
    else o += "\xEF\xBF\xBD", ++i;
  }
  return o;
}

std::string side_text(Reply const& r) {
  std::string s = r.reasoning + "\x1f" + r.content + "\x1f" + r.text + "\x1f";
  for (auto const& c : r.tool_calls) {
    auto const& o = c.get_object();
    s += std::string(o.at("name").get_string()) + "(" + std::string(o.at("arguments").get_string()) + ")";
  }
  return s;
}

// Decoded text of ids[b, e) from the side's own server; falls back to its logprob tokens, then to ids.
std::string decode_range_raw(Url const& url, Reply const& r, int64_t b, int64_t e) {
  b = std::max<int64_t>(b, 0);
  e = std::min<int64_t>(e, static_cast<int64_t>(r.size()));
  if (b >= e) return "";
  if (r.source == TokenSource::kIds) {
    std::vector<int32_t> ids(r.ids.begin() + b, r.ids.begin() + e);
    if (auto d = detokenize(url, ids); d.ok) return d.text;
    if (static_cast<int64_t>(r.tokens.size()) >= e) {
      std::string s;
      for (int64_t i = b; i < e; ++i) s += r.tokens[static_cast<size_t>(i)];
      return s;
    }
    std::string s = "[ids";
    for (int32_t t : ids) s += " " + std::to_string(t);
    return s + "]";
  }
  std::string s;
  for (int64_t i = b; i < e; ++i) s += r.tokens[static_cast<size_t>(i)];
  return s;
}

std::string decode_range(Url const& url, Reply const& r, int64_t b, int64_t e) { return valid_utf8(decode_range_raw(url, r, b, e)); }

void compare(ReplyDiff& d, EnginesOptions const& opt) {
  Reply const &a = d.a, &b = d.b;
  d.text_equal = side_text(a) == side_text(b);
  if (!a.error.empty() || !b.error.empty()) {
    d.problem = (!a.error.empty() ? "A: " + a.error : "") + (!a.error.empty() && !b.error.empty() ? "; " : "") +
                (!b.error.empty() ? "B: " + b.error : "");
    return;
  }
  bool by_ids = a.source == TokenSource::kIds && b.source == TokenSource::kIds;
  bool by_tokens = !by_ids && a.source != TokenSource::kNone && b.source != TokenSource::kNone &&
                   a.tokens.size() == a.size() && b.tokens.size() == b.size();
  if (!by_ids && !by_tokens) {
    d.problem = "no reply tokens to compare (the server returns neither token_ids nor logprobs tokens)";
    return;
  }
  size_t na = by_ids ? a.ids.size() : a.tokens.size(), nb = by_ids ? b.ids.size() : b.tokens.size();
  size_t i = 0;
  while (i < na && i < nb && (by_ids ? a.ids[i] == b.ids[i] : a.tokens[i] == b.tokens[i])) ++i;
  if (i == na && i == nb) {
    d.equal = true;
    return;
  }
  d.first_diff = static_cast<int64_t>(i);
  auto tok = [&](Reply const& r, Url const& url, size_t n, int32_t& id) -> std::string {
    if (i >= n) return "<end: " + (r.finish_reason.empty() ? std::string("no more tokens") : "finish_reason " + r.finish_reason) + ">";
    if (by_ids) id = r.ids[i];
    return decode_range(url, r, static_cast<int64_t>(i), static_cast<int64_t>(i) + 1);
  };
  d.a_token = tok(a, opt.a, na, d.a_id);
  d.b_token = tok(b, opt.b, nb, d.b_id);
  int64_t const c = opt.context_tokens, di = d.first_diff;
  d.context_before = decode_range(opt.a, a, di - c, di);
  d.a_after = decode_range(opt.a, a, di, di + c);
  d.b_after = decode_range(opt.b, b, di, di + c);
}

json::object assistant_message(Reply const& r) {
  json::object m{{"role", "assistant"}, {"content", r.content}};
  if (!r.reasoning.empty()) m["reasoning_content"] = r.reasoning;
  if (!r.tool_calls.empty()) {
    json::array tcs;
    for (auto const& c : r.tool_calls) {
      auto const& o = c.get_object();
      tcs.push_back(json::object{{"id", o.at("id")}, {"type", "function"},
                                 {"function", json::object{{"name", o.at("name")}, {"arguments", o.at("arguments")}}}});
    }
    m["tool_calls"] = std::move(tcs);
  }
  return m;
}

// Runs one request (all its turns) against one server.
std::vector<Reply> run_side(Url const& url, json::object const& extra, RequestSpec const& s, EnginesOptions const& opt,
                            std::vector<json::object>* bodies = nullptr) {
  std::vector<Reply> out;
  json::object body = prepared(s.body, s.chat);
  for (auto const& kv : extra) body[kv.key()] = kv.value();
  CallOptions co;
  co.timeout_s = opt.timeout_s;
  for (size_t turn = 0;; ++turn) {
    if (bodies) bodies->push_back(body);
    out.push_back(call_openai(url, s.chat, body, co));
    if (turn >= s.followups.size() || !out.back().error.empty()) break;
    Reply const& r = out.back();
    auto& msgs = body["messages"].as_array();
    msgs.push_back(assistant_message(r));
    if (!r.tool_calls.empty() && !s.tool_results.empty())
      for (auto const& c : r.tool_calls)
        msgs.push_back(json::object{{"role", "tool"}, {"tool_call_id", c.get_object().at("id")},
                                    {"content", s.tool_results[std::min(turn, s.tool_results.size() - 1)]}});
    json::value const& f = s.followups[turn];
    msgs.push_back(f.is_string() ? json::value(json::object{{"role", "user"}, {"content", f}}) : f);
  }
  return out;
}

// Teacher forcing: per position, the top-k distribution keyed "i:<id>" (prompt_logprobs) or
// "s:<text>" (completions top_logprobs), and the top-1 id (-1 if unknown).
struct TfPos { std::map<std::string, double> lp; int32_t top1 = -1; std::string top1_key; };
struct TfSide { bool ok = false; std::string mode; std::vector<TfPos> pos; };

std::optional<TfSide> tf_prompt_logprobs(Url const& url, std::vector<int32_t> const& seq, size_t n_prompt, size_t count, EnginesOptions const& opt) {
  json::array p;
  for (int32_t t : seq) p.push_back(t);
  json::object body{{"prompt", p}, {"max_tokens", 1}, {"temperature", 0}, {"prompt_logprobs", opt.tf_top_k}};
  HttpResult h = http_request(url, "POST", "/v1/completions", json::serialize(body), opt.timeout_s);
  if (h.status != 200) return std::nullopt;
  boost::system::error_code ec;
  json::value v = json::parse(h.body, ec);
  if (ec || !v.is_object()) return std::nullopt;
  json::value const* pl = nullptr;
  if (auto it = v.get_object().find("prompt_logprobs"); it != v.get_object().end()) pl = &it->value();
  auto const* ch = v.get_object().if_contains("choices");
  if (!pl && ch && ch->is_array() && !ch->get_array().empty() && ch->get_array()[0].is_object())
    pl = ch->get_array()[0].get_object().if_contains("prompt_logprobs");
  if (!pl || !pl->is_array() || pl->get_array().size() < n_prompt + count) return std::nullopt;
  TfSide s;
  s.ok = true;
  s.mode = "prompt_logprobs (one request a reply, top-" + std::to_string(opt.tf_top_k) + " by id)";
  for (size_t i = 0; i < count; ++i) {
    TfPos tp;
    auto const& e = pl->get_array()[n_prompt + i];
    if (!e.is_object()) return std::nullopt;
    int64_t best_rank = 1 << 30;
    double best_lp = -1e300;
    for (auto const& kv : e.get_object()) {
      double lp = 0;
      int64_t rank = 1 << 29;
      if (kv.value().is_object()) {
        auto const& o = kv.value().get_object();
        if (auto* l = o.if_contains("logprob"); l && l->is_number()) lp = l->to_number<double>();
        if (auto* rk = o.if_contains("rank"); rk && rk->is_int64()) rank = rk->get_int64();
      } else if (kv.value().is_number()) {
        lp = kv.value().to_number<double>();
      }
      std::string key = "i:" + std::string(kv.key());
      tp.lp[key] = lp;
      if (rank < best_rank || (rank == best_rank && lp > best_lp)) {
        best_rank = rank;
        best_lp = lp;
        tp.top1_key = key;
        tp.top1 = static_cast<int32_t>(std::strtol(std::string(kv.key()).c_str(), nullptr, 10));
      }
    }
    s.pos.push_back(std::move(tp));
  }
  return s;
}

TfSide tf_stepwise(Url const& url, std::vector<int32_t> const& seq, size_t n_prompt, size_t count, EnginesOptions const& opt) {
  TfSide s;
  s.mode = "no prompt_logprobs: step-wise, one max_tokens=1 request per position, top-" + std::to_string(opt.tf_top_k) + " by token text";
  for (size_t i = 0; i < count; ++i) {
    json::array p;
    for (size_t j = 0; j < n_prompt + i; ++j) p.push_back(seq[j]);
    json::object body{{"prompt", p}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", opt.tf_top_k}, {"return_token_ids", true},
                      {"ignore_eos", true}};
    HttpResult h = http_request(url, "POST", "/v1/completions", json::serialize(body), opt.timeout_s);
    boost::system::error_code ec;
    json::value v = h.status == 200 ? json::parse(h.body, ec) : json::value();
    TfPos tp;
    auto const* ch = v.is_object() ? v.get_object().if_contains("choices") : nullptr;
    if (!ch || !ch->is_array() || ch->get_array().empty() || !ch->get_array()[0].is_object()) {
      s.mode = "step-wise teacher forcing failed at position " + std::to_string(i) + " (HTTP " + std::to_string(h.status) + ")";
      return s;
    }
    auto const& c = ch->get_array()[0].get_object();
    if (auto* ids = c.if_contains("token_ids"); ids && ids->is_array() && !ids->get_array().empty() && ids->get_array()[0].is_int64())
      tp.top1 = static_cast<int32_t>(ids->get_array()[0].get_int64());
    auto const* lp = c.if_contains("logprobs");
    auto const* tops = lp && lp->is_object() ? lp->get_object().if_contains("top_logprobs") : nullptr;
    if (tops && tops->is_array() && !tops->get_array().empty() && tops->get_array()[0].is_object()) {
      double best = -1e300;
      for (auto const& kv : tops->get_array()[0].get_object()) {
        if (!kv.value().is_number()) continue;
        std::string key = "s:" + std::string(kv.key());
        double l = kv.value().to_number<double>();
        tp.lp[key] = l;
        if (l > best) { best = l; tp.top1_key = key; }
      }
    }
    s.pos.push_back(std::move(tp));
  }
  s.ok = true;
  return s;
}

TfSide teacher_force(Url const& url, std::vector<int32_t> const& seq, size_t n_prompt, size_t count, EnginesOptions const& opt) {
  if (auto s = tf_prompt_logprobs(url, seq, n_prompt, count, opt)) return *s;
  return tf_stepwise(url, seq, n_prompt, std::min<size_t>(count, static_cast<size_t>(opt.tf_max_positions)), opt);
}

// Prompt ids of a request body from POST /tokenize (streamed replies carry no prompt_token_ids).
std::vector<int32_t> tokenize_body(Url const& url, json::object const& body, double timeout_s) {
  json::object b = body;
  b.erase("stream");
  b.erase("stream_options");
  HttpResult h = http_request(url, "POST", "/tokenize", json::serialize(b), timeout_s);
  std::vector<int32_t> ids;
  boost::system::error_code ec;
  json::value v = h.status == 200 ? json::parse(h.body, ec) : json::value();
  auto const* t = v.is_object() ? v.get_object().if_contains("tokens") : nullptr;
  if (t && t->is_array())
    for (auto const& x : t->get_array()) if (x.is_int64()) ids.push_back(static_cast<int32_t>(x.get_int64()));
  return ids;
}

void run_teacher_forced(ReplyDiff& d, EnginesOptions const& opt, std::string& mode_a, std::string& mode_b, std::mutex& mu) {
  if (d.a.prompt_ids.empty() && !d.request.empty()) d.a.prompt_ids = tokenize_body(opt.a, d.request, opt.timeout_s);
  if (d.a.source != TokenSource::kIds || d.a.prompt_ids.empty()) {
    d.tf_note = "not run: server A returned no token_ids, or neither prompt_token_ids nor /tokenize gave the prompt ids";
    return;
  }
  std::vector<int32_t> seq = d.a.prompt_ids;
  seq.insert(seq.end(), d.a.ids.begin(), d.a.ids.end());
  size_t const n = d.a.prompt_ids.size(), count = d.a.ids.size();
  TfSide sa = teacher_force(opt.a, seq, n, count, opt), sb = teacher_force(opt.b, seq, n, count, opt);
  {
    std::lock_guard lk(mu);
    if (mode_a.empty()) mode_a = sa.mode;
    if (mode_b.empty()) mode_b = sb.mode;
  }
  if (!sa.ok || !sb.ok) {
    d.tf_note = "not run: " + (!sa.ok ? "A: " + sa.mode : "") + (!sb.ok ? " B: " + sb.mode : "");
    return;
  }
  size_t m = std::min(sa.pos.size(), sb.pos.size());
  bool same_keys = sa.mode.rfind("prompt_logprobs", 0) == sb.mode.rfind("prompt_logprobs", 0);
  double kl_sum = 0;
  for (size_t i = 0; i < m; ++i) {
    auto const &pa = sa.pos[i], &pb = sb.pos[i];
    bool agree = pa.top1 >= 0 && pb.top1 >= 0 ? pa.top1 == pb.top1 : (!pa.top1_key.empty() && pa.top1_key == pb.top1_key);
    d.tf_top1_agree += agree;
    if (!agree && d.tf_first_disagree < 0) d.tf_first_disagree = static_cast<int64_t>(i);
    if (!agree && d.tf_disagreements.size() < 8)
    {
      auto show = [](TfPos const& p) { return p.top1 >= 0 ? std::to_string(p.top1) : p.top1_key.empty() ? std::string("<no token returned>") : p.top1_key; };
      d.tf_disagreements.push_back(std::to_string(i) + ": A " + show(pa) + " vs B " + show(pb) + " (A's reply has " + std::to_string(d.a.ids[i]) + ")");
    }
    if (same_keys && !pa.lp.empty() && !pb.lp.empty()) {
      double floor_b = 0;
      for (auto const& [k, l] : pb.lp) floor_b = std::min(floor_b, l);
      double kl = 0;
      for (auto const& [k, l] : pa.lp) {
        auto it = pb.lp.find(k);
        kl += std::exp(l) * (l - (it != pb.lp.end() ? it->second : floor_b));
      }
      kl_sum += kl;
      d.tf_kl_max = std::max(d.tf_kl_max, kl);
    }
  }
  d.tf_positions = static_cast<int64_t>(m);
  d.tf_kl_mean = m ? kl_sum / static_cast<double>(m) : 0;
  if (!same_keys) d.tf_note = "KL not computed: the servers key their distributions differently (ids vs token text)";
  else if (m < count) d.tf_note = "first " + std::to_string(m) + " of " + std::to_string(count) + " positions";
}

}  // namespace

EnginesReport run_engines(std::vector<RequestSpec> const& requests, EnginesOptions const& opt) {
  EnginesReport rep;
  rep.a_url = opt.a.str();
  rep.b_url = opt.b.str();
  std::vector<std::vector<ReplyDiff>> per(requests.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
      auto const& s = requests[i];
      std::vector<json::object> bodies;
      std::vector<Reply> ra = run_side(opt.a, opt.a_extra, s, opt, &bodies), rb = run_side(opt.b, opt.b_extra, s, opt);
      size_t turns = std::max(ra.size(), rb.size());
      for (size_t t = 0; t < turns; ++t) {
        ReplyDiff d;
        d.name = t == 0 ? s.name : s.name + " #" + std::to_string(t + 1);
        d.turn = static_cast<int>(t);
        if (t < ra.size()) d.a = ra[t]; else d.a.error = "turn not run (an earlier turn failed)";
        if (t < rb.size()) d.b = rb[t]; else d.b.error = "turn not run (an earlier turn failed)";
        if (t < bodies.size()) d.request = bodies[t];
        compare(d, opt);
        if (opt.teacher_forced) run_teacher_forced(d, opt, rep.tf_mode_a, rep.tf_mode_b, mu);
        per[i].push_back(std::move(d));
      }
    }
  };
  int const nt = std::max(1, std::min<int>(opt.concurrency, static_cast<int>(requests.size())));
  std::vector<std::thread> threads;
  for (int t = 0; t < nt; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  for (auto& v : per) for (auto& d : v) rep.replies.push_back(std::move(d));
  return rep;
}

}  // namespace tessera::harness

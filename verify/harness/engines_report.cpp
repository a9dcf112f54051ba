// SPDX-License-Identifier: Apache-2.0
/// Text, JSON-lines and HTML renderings of an engines comparison (see engines.hpp).
#include <cstdio>
#include <string>

#include "verify/harness/engines.hpp"

namespace tessera::harness {
namespace json = boost::json;

namespace {

std::string fmt(char const* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string id_str(int32_t id) { return id >= 0 ? std::to_string(id) : "-"; }

char const* source_name(TokenSource s) {
  return s == TokenSource::kIds ? "token_ids" : s == TokenSource::kLogprobs ? "logprobs tokens" : "none";
}

std::string html_escape(std::string const& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

}  // namespace

std::string engines_text(EnginesReport const& r) {
  std::string o = "A: " + r.a_url + "\nB: " + r.b_url + "\n";
  for (auto const& d : r.replies) {
    if (d.equal) {
      o += "equal     " + d.name + "  (" + std::to_string(d.a.size()) + " tokens, " + source_name(d.a.source) +
           (d.text_equal ? "" : "; text differs") + ")\n";
    } else if (!d.problem.empty()) {
      o += "ERROR     " + d.name + "  " + d.problem + "\n";
    } else {
      o += "DIFFERENT " + d.name + "  first differing token at reply index " + std::to_string(d.first_diff) + " (of A " +
           std::to_string(d.a.size()) + " / B " + std::to_string(d.b.size()) + ")\n";
      o += "    A: id " + id_str(d.a_id) + " \"" + printable(d.a_token) + "\"    B: id " + id_str(d.b_id) + " \"" + printable(d.b_token) + "\"\n";
      o += "    context: \"" + printable(d.context_before) + "\" | A: \"" + printable(d.a_after) + "\" | B: \"" + printable(d.b_after) + "\"\n";
    }
    if (!d.tf_note.empty() || d.tf_positions > 0) {
      o += "    teacher-forced: ";
      if (d.tf_positions > 0)
        o += "top-1 agreement " + std::to_string(d.tf_top1_agree) + "/" + std::to_string(d.tf_positions) + ", KL mean " +
             fmt("%.3g", d.tf_kl_mean) + " max " + fmt("%.3g", d.tf_kl_max) +
             (d.tf_first_disagree >= 0 ? ", first disagreement at " + std::to_string(d.tf_first_disagree) : "");
      for (auto const& x : d.tf_disagreements) o += "\n      disagreement at " + x;
      if (!d.tf_note.empty()) o += (d.tf_positions > 0 ? "; " : "") + d.tf_note;
      o += "\n";
    }
  }
  if (!r.tf_mode_a.empty()) o += "teacher forcing, A: " + r.tf_mode_a + "\nteacher forcing, B: " + r.tf_mode_b + "\n";
  o += std::to_string(r.equal()) + "/" + std::to_string(r.replies.size()) + " replies equal\n";
  return o;
}

std::string engines_jsonl(EnginesReport const& r) {
  std::string o;
  for (auto const& d : r.replies) {
    json::object j{{"name", d.name}, {"turn", d.turn}, {"equal", d.equal}, {"text_equal", d.text_equal},
                   {"a_tokens", d.a.size()}, {"b_tokens", d.b.size()}, {"a_source", source_name(d.a.source)},
                   {"b_source", source_name(d.b.source)}, {"a_finish", d.a.finish_reason}, {"b_finish", d.b.finish_reason}};
    if (!d.problem.empty()) j["problem"] = d.problem;
    if (d.first_diff >= 0) {
      j["first_diff"] = d.first_diff;
      j["a_id"] = d.a_id;
      j["b_id"] = d.b_id;
      j["a_token"] = d.a_token;
      j["b_token"] = d.b_token;
      j["context_before"] = d.context_before;
      j["a_after"] = d.a_after;
      j["b_after"] = d.b_after;
    }
    if (d.tf_positions > 0 || !d.tf_note.empty()) {
      j["tf_positions"] = d.tf_positions;
      j["tf_top1_agree"] = d.tf_top1_agree;
      j["tf_kl_mean"] = d.tf_kl_mean;
      j["tf_kl_max"] = d.tf_kl_max;
      j["tf_first_disagree"] = d.tf_first_disagree;
      json::array dis;
      for (auto const& x : d.tf_disagreements) dis.push_back(json::string(x));
      j["tf_disagreements"] = std::move(dis);
      if (!d.tf_note.empty()) j["tf_note"] = d.tf_note;
    }
    o += json::serialize(j) + "\n";
  }
  json::object s{{"summary", true}, {"a", r.a_url}, {"b", r.b_url}, {"equal", r.equal()}, {"replies", r.replies.size()}, {"all_equal", r.all_equal()}};
  if (!r.tf_mode_a.empty()) { s["tf_mode_a"] = r.tf_mode_a; s["tf_mode_b"] = r.tf_mode_b; }
  o += json::serialize(s) + "\n";
  return o;
}

std::string engines_html(EnginesReport const& r) {
  std::string o =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tessera verify engines</title><style>"
      "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
      "vertical-align:top}.eq{color:#070}.ne{color:#b00;font-weight:bold}.ctx{font-family:monospace;white-space:pre-wrap}"
      ".a{background:#fdd}.b{background:#ddf}</style></head><body>\n";
  o += "<h1>" + std::to_string(r.equal()) + "/" + std::to_string(r.replies.size()) + " replies equal</h1>\n";
  o += "<p>A: <code>" + html_escape(r.a_url) + "</code><br>B: <code>" + html_escape(r.b_url) + "</code></p>\n";
  if (!r.tf_mode_a.empty())
    o += "<p>Teacher forcing, A: " + html_escape(r.tf_mode_a) + "<br>Teacher forcing, B: " + html_escape(r.tf_mode_b) + "</p>\n";
  o += "<table><tr><th>reply</th><th>result</th><th>tokens A/B</th><th>divergence</th><th>teacher-forced</th></tr>\n";
  for (auto const& d : r.replies) {
    o += "<tr><td>" + html_escape(d.name) + "</td>";
    if (d.equal) o += "<td class=\"eq\">equal</td>";
    else if (!d.problem.empty()) o += "<td class=\"ne\">error</td>";
    else o += "<td class=\"ne\">different at " + std::to_string(d.first_diff) + "</td>";
    o += "<td>" + std::to_string(d.a.size()) + " / " + std::to_string(d.b.size()) + "</td><td>";
    if (!d.problem.empty()) o += html_escape(d.problem);
    if (d.first_diff >= 0)
      o += "A id " + id_str(d.a_id) + " / B id " + id_str(d.b_id) + "<div class=\"ctx\">" + html_escape(d.context_before) +
           "<span class=\"a\">" + html_escape(d.a_after) + "</span></div><div class=\"ctx\">" + html_escape(d.context_before) +
           "<span class=\"b\">" + html_escape(d.b_after) + "</span></div>";
    o += "</td><td>";
    if (d.tf_positions > 0)
      o += "top-1 " + std::to_string(d.tf_top1_agree) + "/" + std::to_string(d.tf_positions) + ", KL mean " + fmt("%.3g", d.tf_kl_mean) +
           ", max " + fmt("%.3g", d.tf_kl_max);
    if (!d.tf_note.empty()) o += " " + html_escape(d.tf_note);
    o += "</td></tr>\n";
  }
  o += "</table>\n</body></html>\n";
  return o;
}

}  // namespace tessera::harness

// SPDX-License-Identifier: Apache-2.0
/// `tessera verify engines`: token-diff gate between two OpenAI-compatible servers (verify/harness/engines.hpp).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "verify/harness/engines.hpp"

namespace tessera::cli {

static bool write_file(std::string const& path, std::string const& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) { std::fprintf(stderr, "tessera verify engines: cannot write '%s'\n", path.c_str()); return false; }
  return true;
}

int cmd_verify_engines(std::vector<std::string> const& args) {
  ArgParser a(args, {"a", "b", "requests", "concurrency", "report-json", "report-html", "timeout", "context", "tf-top-k", "tf-max-positions", "a-extra", "b-extra"},
              {"teacher-forced", "help"});
  if (!a.error().empty() || a.has("help") || !a.has("a") || !a.has("b") || !a.has("requests") || !a.positionals().empty()) {
    if (!a.error().empty()) std::fprintf(stderr, "tessera verify engines: %s\n", a.error().c_str());
    std::fprintf(stderr,
                 "usage: tessera verify engines --a URL --b URL --requests FILE [--concurrency 1] [--report-json F]\n"
                 "         [--report-html F] [--timeout 120] [--context 8] [--teacher-forced [--tf-top-k 20]\n"
                 "         [--tf-max-positions 64]] [--a-extra JSON] [--b-extra JSON]\n"
                 "Sends the same greedy requests to both servers and compares the reply tokens; exit 0 only if all are equal.\n"
                 "FILE: JSON lines of OpenAI request bodies (+ \"name\", \"followups\", \"tool_results\"); see\n"
                 "verify/harness/requests/default.jsonl. --a-extra/--b-extra merge fields into one side's requests, e.g.\n"
                 "--b-extra '{\"draft\": false}' with --a and --b the same server compares drafted with serial decoding.\n");
    return a.has("help") && a.error().empty() ? 0 : 2;
  }
  harness::EnginesOptions o;
  auto ua = harness::parse_url(*a.get("a")), ub = harness::parse_url(*a.get("b"));
  if (!ua.ok() || !ub.ok()) {
    std::fprintf(stderr, "tessera verify engines: %s\n", (!ua.ok() ? ua.status() : ub.status()).message().c_str());
    return 2;
  }
  o.a = *ua;
  o.b = *ub;
  auto num = [&](char const* name, double lo, double hi, double def) -> double {
    auto v = a.get(name);
    if (!v) return def;
    char* end = nullptr;
    double d = std::strtod(v->c_str(), &end);
    if (v->empty() || *end || !(d >= lo && d <= hi)) {
      std::fprintf(stderr, "tessera verify engines: --%s %s: expected a number in [%g, %g]\n", name, v->c_str(), lo, hi);
      return -1;
    }
    return d;
  };
  double conc = num("concurrency", 1, 256, 1), to = num("timeout", 0.1, 86400, 120), ctx = num("context", 0, 256, 8),
         k = num("tf-top-k", 1, 20, 20), maxp = num("tf-max-positions", 1, 1 << 20, 64);
  if (conc < 0 || to < 0 || ctx < 0 || k < 0 || maxp < 0) return 2;
  o.concurrency = static_cast<int>(conc);
  o.timeout_s = to;
  o.context_tokens = static_cast<int>(ctx);
  o.teacher_forced = a.has("teacher-forced");
  o.tf_top_k = static_cast<int>(k);
  o.tf_max_positions = static_cast<int>(maxp);
  for (auto [name, dst] : {std::pair<char const*, boost::json::object*>{"a-extra", &o.a_extra}, {"b-extra", &o.b_extra}}) {
    auto v = a.get(name);
    if (!v) continue;
    boost::system::error_code ec;
    boost::json::value j = boost::json::parse(*v, ec);
    if (ec || !j.is_object()) { std::fprintf(stderr, "tessera verify engines: --%s must be a JSON object\n", name); return 2; }
    *dst = std::move(j.get_object());
  }
  auto reqs = harness::load_requests(*a.get("requests"));
  if (!reqs.ok()) { std::fprintf(stderr, "tessera verify engines: %s\n", reqs.status().message().c_str()); return 2; }
  harness::EnginesReport rep = harness::run_engines(*reqs, o);
  std::fputs(harness::engines_text(rep).c_str(), stdout);
  std::fflush(stdout);
  if (auto f = a.get("report-json"); f && !write_file(*f, harness::engines_jsonl(rep))) return 2;
  if (auto f = a.get("report-html"); f && !write_file(*f, harness::engines_html(rep))) return 2;
  return rep.all_equal() ? 0 : 1;
}

}  // namespace tessera::cli

// SPDX-License-Identifier: Apache-2.0
/// `tessera verify soak`: bounded mixed traffic and the soak pass line (verify/harness/soak.hpp).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "verify/harness/soak.hpp"

namespace tessera::cli {

int cmd_verify_soak(std::vector<std::string> const& args) {
  ArgParser a(args, {"url", "minutes", "seed", "max-requests", "workers", "timeout", "idle-wait", "report-json"}, {"smoke-question", "help"});
  if (!a.error().empty() || a.has("help") || !a.has("url") || !a.has("minutes") || !a.positionals().empty()) {
    if (!a.error().empty()) std::fprintf(stderr, "tessera verify soak: %s\n", a.error().c_str());
    std::fprintf(stderr,
                 "usage: tessera verify soak --url URL --minutes N [--seed S] [--max-requests N] [--workers 4]\n"
                 "         [--timeout 120] [--idle-wait 15] [--smoke-question] [--report-json F]\n"
                 "Mixed traffic (streamed and not, tools, json_schema, thinking, long prompts, cancels, disconnects); PASS =\n"
                 "no errors, /health idle afterwards, one reply per repeated greedy body (and 391 with --smoke-question).\n");
    return a.has("help") && a.error().empty() ? 0 : 2;
  }
  harness::SoakOptions o;
  auto u = harness::parse_url(*a.get("url"));
  if (!u.ok()) { std::fprintf(stderr, "tessera verify soak: %s\n", u.status().message().c_str()); return 2; }
  o.url = *u;
  auto num = [&](char const* name, double lo, double hi, double& out) {
    auto v = a.get(name);
    if (!v) return true;
    char* end = nullptr;
    double d = std::strtod(v->c_str(), &end);
    if (v->empty() || *end || !(d >= lo && d <= hi)) {
      std::fprintf(stderr, "tessera verify soak: --%s %s: expected a number in [%g, %g]\n", name, v->c_str(), lo, hi);
      return false;
    }
    out = d;
    return true;
  };
  double minutes = 1, seed = 1, maxr = -1, workers = 4, to = 120, idle = 15;
  if (!num("minutes", 0.001, 10080, minutes) || !num("seed", 0, 1e18, seed) || !num("max-requests", 0, 1e12, maxr) ||
      !num("workers", 1, 256, workers) || !num("timeout", 0.1, 86400, to) || !num("idle-wait", 0, 3600, idle))
    return 2;
  o.minutes = minutes;
  o.seed = static_cast<uint64_t>(seed);
  o.max_requests = static_cast<int64_t>(maxr);
  o.workers = static_cast<int>(workers);
  o.timeout_s = to;
  o.idle_wait_s = idle;
  o.smoke_question = a.has("smoke-question");
  auto rep = harness::run_soak(o);
  std::fputs(harness::soak_text(rep, o).c_str(), stdout);
  if (auto f = a.get("report-json")) {
    std::ofstream out(*f, std::ios::binary);
    out << harness::soak_jsonl(rep);
    if (!out) { std::fprintf(stderr, "tessera verify soak: cannot write '%s'\n", f->c_str()); return 2; }
  }
  return rep.pass() ? 0 : 1;
}

}  // namespace tessera::cli

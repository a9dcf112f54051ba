// SPDX-License-Identifier: Apache-2.0
/// `tessera verify soak`: bounded mixed traffic against one OpenAI-compatible server (ARCHITECTURE.md
/// §13.4, the reference deployment's soak pass line). Kinds: greedy chat streamed and not, tools,
/// json_schema, thinking, long prompts, completions, seeded sampling, streams cancelled mid-reply and
/// clients that disconnect right after the first event. Greedy bodies come from a small fixed pool, so
/// each is sent many times, streamed and not. PASS = no server errors (5xx, in-stream errors, malformed
/// responses or SSE), no other HTTP errors, `/health` idle afterwards (no slot left busy), exactly one
/// reply hash per repeated greedy body, and (with --smoke-question) "391" in the answer to
/// "What is 17*23? Answer with the number only.".
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "verify/harness/http_client.hpp"

namespace tessera::harness {

struct SoakOptions {
  Url url;
  double minutes = 1;
  uint64_t seed = 1;
  int64_t max_requests = -1;     // < 0: no limit
  int workers = 4;
  double timeout_s = 120;
  double idle_wait_s = 15;       // how long /health may take to report idle after the traffic
  bool smoke_question = false;
};

struct SoakKindStats {
  int64_t sent = 0, ok = 0, cancelled = 0, server_errors = 0, http_errors = 0, empty = 0, tokens = 0;
  std::vector<double> seconds;
};

struct SoakReport {
  std::map<std::string, SoakKindStats> kinds;
  std::vector<std::string> findings;            // every failure, one line each
  std::map<std::string, std::set<std::string>> hashes;  // greedy body → reply hashes seen
  int64_t health_checks = 0;
  std::string final_health;
  bool idle = false, idle_checked = false;
  std::string smoke;                            // the smoke answer (when asked)
  bool smoke_ok = false;
  double seconds = 0;
  bool pass() const;
};

SoakReport run_soak(SoakOptions const& opt);
std::string soak_text(SoakReport const& r, SoakOptions const& opt);
/// One JSON object per traffic kind, then a summary object (pass, findings, hashes, idle, smoke).
std::string soak_jsonl(SoakReport const& r);

}  // namespace tessera::harness

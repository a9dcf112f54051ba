// SPDX-License-Identifier: Apache-2.0
/// `tessera verify engines`: the same greedy requests sent to two OpenAI-compatible servers, replies
/// compared token by token (ARCHITECTURE.md §13.2 step 5 at HTTP level; the reference deployment's
/// diverge.py). Per reply: equal, or the first differing token index with both ids and decoded context.
/// Optional teacher-forced mode: the sequence prompt + A's reply is fed to both servers and the
/// distributions at every reply position compared (top-1 agreement, KL over A's top-k).
///
/// Requests file (JSON lines; blank lines and lines starting with '#' skipped): each line is an OpenAI
/// request body for /v1/chat/completions (has "messages") or /v1/completions (has "prompt"), plus optional
///   "name":      a label for the report (default "line N"),
///   "followups": [user message, ...]: after each reply the side's own assistant message (content,
///                reasoning_content, tool_calls) and the next user message are appended and the
///                conversation sent again (multi-turn; each turn is compared as its own reply),
///   "tool_results": [string, ...]: when a turn ends in tool calls, a `tool` message with this content
///                answers each call before the next followup.
/// The harness adds "temperature": 0 when absent, "return_token_ids": true and logprobs (to get tokens
/// from servers without ids); a request that sets "temperature" > 0 should set "seed" (keyed sampling).
#pragma once

#include <string>
#include <vector>

#include <boost/json.hpp>

#include "verify/harness/openai_client.hpp"

namespace tessera::harness {

struct RequestSpec {
  std::string name;
  bool chat = true;
  boost::json::object body;            // without the harness keys
  std::vector<boost::json::value> followups;
  std::vector<std::string> tool_results;
  int line = 0;
};

/// Parses a requests file; errors name the file, line and field.
Result<std::vector<RequestSpec>> load_requests(std::string const& path);

struct EnginesOptions {
  Url a, b;
  int concurrency = 1;
  double timeout_s = 120;
  int context_tokens = 8;              // decoded tokens shown either side of a divergence
  bool teacher_forced = false;
  int tf_top_k = 20;
  int tf_max_positions = 64;           // step-wise teacher forcing: positions per reply at most
  boost::json::object a_extra, b_extra;  // fields merged into every request of one side (e.g. {"draft": false})
};

/// One compared reply (a request's turn).
struct ReplyDiff {
  std::string name;                    // request name, "#turn" appended for followups
  int turn = 0;
  Reply a, b;
  boost::json::object request;         // the body sent to A for this turn
  bool equal = false;
  std::string problem;                 // a side failed or returned no tokens: not comparable
  int64_t first_diff = -1;             // index into the reply tokens; -1 when equal
  std::string a_token, b_token;        // "id 123" or the token text, at first_diff ("<end>" past the end)
  int32_t a_id = -1, b_id = -1;
  std::string context_before, a_after, b_after;  // decoded text: common prefix tail, then each side from first_diff
  bool text_equal = false;             // content + reasoning + tool calls equal
  // Teacher-forced results (when run): positions compared, top-1 agreements, mean/max KL.
  std::string tf_note;
  int64_t tf_positions = 0, tf_top1_agree = 0;
  double tf_kl_mean = 0, tf_kl_max = 0;
  int64_t tf_first_disagree = -1;
  std::vector<std::string> tf_disagreements;  // "pos: A id|text vs B id|text", the first 8
};

struct EnginesReport {
  std::string a_url, b_url;
  std::vector<ReplyDiff> replies;
  std::string tf_mode_a, tf_mode_b;    // how teacher forcing was done on each side (or why not)
  size_t equal() const;
  bool all_equal() const { return !replies.empty() && equal() == replies.size(); }
};

EnginesReport run_engines(std::vector<RequestSpec> const& requests, EnginesOptions const& opt);

std::string engines_text(EnginesReport const& r);
/// One JSON object per reply, then a summary object.
std::string engines_jsonl(EnginesReport const& r);
/// A self-contained HTML page (inline CSS, no scripts) with every divergence's context.
std::string engines_html(EnginesReport const& r);

}  // namespace tessera::harness

// SPDX-License-Identifier: Apache-2.0
/// OpenAI-compatible calls for the verification tools: send a chat or completions body (streamed or
/// not) and gather one `Reply`: the reply token ids (`choices[0].token_ids` from `return_token_ids`, or
/// the logprobs tokens when a server returns no ids), the prompt ids (`prompt_token_ids`), text,
/// reasoning, tool calls and finish reason; streamed replies are reassembled from their chunks.
/// Malformed responses (bad JSON, missing choices, SSE without `[DONE]`) are reported in `error`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "verify/harness/http_client.hpp"

namespace tessera::harness {

enum class TokenSource { kNone, kIds, kLogprobs };

struct Reply {
  int status = 0;                       // HTTP status (0 = none)
  std::string error;                    // transport / protocol / server error; empty = a well-formed reply
  bool server_error = false;            // 5xx, in-stream error event, or a malformed response
  bool aborted = false;                 // dropped by the caller mid-stream
  TokenSource source = TokenSource::kNone;
  std::vector<int32_t> ids;             // reply token ids (source kIds)
  std::vector<std::string> tokens;      // reply token strings from logprobs (both sources when present)
  std::vector<int32_t> prompt_ids;      // prompt_token_ids when returned
  std::string content, reasoning, text, finish_reason;
  boost::json::array tool_calls;        // [{id, name, arguments}]
  int events = 0;                       // SSE data events received
  double seconds = 0;
  /// Number of reply tokens under the reply's source.
  size_t size() const { return source == TokenSource::kIds ? ids.size() : tokens.size(); }
};

struct CallOptions {
  double timeout_s = 120;
  int abort_after_events = -1;          // ≥ 0: drop the connection after this many SSE data events
};

/// POSTs `body` to /v1/chat/completions (`chat`) or /v1/completions and gathers the reply.
Reply call_openai(Url const& url, bool chat, boost::json::object const& body, CallOptions const& opt = {});

/// Decodes token ids with POST /detokenize; an empty optional-like result (`ok == false`) when unsupported.
struct Detok { bool ok = false; std::string text; };
Detok detokenize(Url const& url, std::vector<int32_t> const& ids, double timeout_s = 10);

/// Bytes shown printable: control characters as \n, \t, \xNN.
std::string printable(std::string const& s);

}  // namespace tessera::harness

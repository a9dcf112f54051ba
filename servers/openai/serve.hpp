// SPDX-License-Identifier: Apache-2.0
/// `tessera serve`: builds the served model (weights, tokenizer, chat format), the engine, the routes and
/// the HTTP transport; runs until SIGTERM/SIGINT, then drains (new requests get 503, running ones get
/// `drain_timeout_s` to finish) and exits.
#pragma once

#include <functional>

#include <memory>
#include <string>

#include "servers/openai/engine/engine.hpp"
#include "servers/openai/http/server.hpp"
#include "servers/openai/routes/api.hpp"
#include "tessera/core/status.hpp"
#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::server {

struct ServeConfig {
  std::string model_dir;               // empty = the embedded default; "stub" = the stub model
  std::string served_name;
  std::string tokenizer_file;          // tokenizer.json for the stub model (default: byte-level stand-in)             // empty = derived from the model
  std::string device = "cpu";
  std::string api_key_file;
  std::string port_file;               // write the bound port here (tests with --port 0)
  std::string stub_scripts_file;       // JSON [{"trigger": "...", "reply": "..."}] for the stub model
  int64_t stub_step_delay_us = 0;
  int64_t stub_token_delay_us = 0;
  double drain_timeout_s = 20;
  /// Speculative decoding (docs/drafting.md): "auto" = DSpark when the checkpoint has mtp.* weights,
  /// else none; "dspark" (an error without the weights), "lookup" (prompt-lookup copies, any model),
  /// "none". draft_k ≥ 0 fixes the depth (else the depth rule).
  std::string draft = "auto";
  int64_t draft_k = -1;
  /// Routed-expert pruning of a DeepSeek-V4.1 model (docs/pruning.md; lossy, off by default). Decode-scope
  /// pruning and drafting do not combine exactly (a verify window is not a one-token chunk): "auto" then
  /// serves without a drafter, an explicit drafter is refused.
  model::dsv41::ExpertPruning prune;
  /// Numerics of a DeepSeek-V4.1 model (`--dtype`); fp32 unless set.
  model::dsv41::Numerics numerics = model::dsv41::Numerics::kFp32;
  /// Load the CPU model with ModelOptions::weights_as_stored (bf16 only): the host model of --tp/--ep ranks
  /// (model::dsv41::rank_host_options).
  bool weights_as_stored = false;
  HttpOptions http;
  EngineOptions engine;
  ApiOptions api;
  /// Where the model is loaded when it differs from `device` (empty: `device`): "cpu" when wrap_model builds
  /// GPU rank models from the CPU model's host weights (--tp/--ep with --device cuda).
  std::string load_device;
  /// The model to serve, already built (multi-process serving's rank 0 serves its RankDriver): nothing is
  /// loaded; model_dir still names the folder the tokenizer comes from.
  std::shared_ptr<model::LanguageModel> model;
  /// Wraps the loaded model before the engine sees it: test faults (verify/harness), the sharded model.
  std::function<std::unique_ptr<model::LanguageModel>(model::LanguageModel&)> wrap_model;
};

/// Fills `engine.make_drafter` / `drafter_name` / `draft_policy` for `model` from `draft` and `draft_k`
/// (kInvalidArgument for an unknown mode or "dspark" on a model without DSpark weights).
Status configure_drafting(EngineOptions& engine, model::LanguageModel& model, std::string const& draft, int64_t draft_k);

/// Returns the process exit code.
int serve_main(ServeConfig config);

/// Reads an API key file: one key per line or `label: key`; blank lines and `#` comments skipped.
Result<std::vector<Sha256Digest>> load_api_keys(std::string const& path);

}  // namespace tessera::server

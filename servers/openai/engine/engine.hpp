// SPDX-License-Identifier: Apache-2.0
/// The engine: one thread owns the model and runs continuous batching over a fixed number of slots.
///
/// Each step builds one batched `forward`: every slot that is decoding feeds one token (the last prompt
/// token first, then its own samples) and gets one logits row; slots still prefilling share the rest of
/// the step's token budget in chunks of prompt[pos, n-1). Prefill stops one token short of the prompt's
/// end so that (a) the prefix cache can snapshot the state of prompt[0, n-1) with `clone`, and (b) a later
/// request with the same prompt, or one that extends it, resumes from that snapshot and still gets the
/// logits of its last prompt token. Row invariance of the model makes the reply independent of batching,
/// chunking and cache hits.
///
/// Admission prices a request at state_bytes_for(prompt + max_tokens); it is admitted FIFO while a slot
/// is free and the priced total (running slots + prefix-cache snapshots, which are evicted LRU first)
/// fits the memory budget. A request that can never fit, or a full queue, is refused at submit; one that
/// waits longer than the queue timeout is finished with kOverCapacity (the HTTP side answers 503).
///
/// Speculative decoding (docs/drafting.md): with a drafter factory, a decode slot whose request allows
/// drafting feeds [last ; d₀ … d_{k−1}] with k + 1 logits rows (k from the depth rule, within the step's
/// token budget, the reply's max_tokens and the context), then runs row i through the same per-token
/// path as serial decoding (sampler at position old + 1 + i, penalties over the reply so far, the
/// constraint's mask, stop ids) and stops after the first token ≠ d_i or a finish; the state is truncated
/// to the emitted tokens. Each emitted token is therefore the token serial decoding emits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "servers/openai/engine/types.hpp"
#include "tessera/core/status.hpp"
#include "tessera/models/common/drafter.hpp"
#include "tessera/models/common/language_model.hpp"

namespace tessera::server {

struct EngineOptions {
  int max_batch = 8;                   // slots = sequences decoded together
  int64_t max_context = 0;             // 0 = the model's max_context
  int64_t step_token_budget = 256;     // tokens fed per forward (decode rows + prefill chunks)
  size_t memory_budget_bytes = 0;      // 0 = max_batch × state_bytes_for(max_context)
  int max_queue = 256;                 // waiting requests; more → refused (503)
  double queue_timeout_s = 60;         // waiting longer → kOverCapacity (503)
  int prefix_cache_entries = 32;       // snapshots kept (0 = no prefix cache)
  int64_t prefix_cache_min_tokens = 8; // shorter prefixes are not snapshotted
  /// Stop tokens beyond the model's own EOS ids, merged into info().eos_token_ids: the tokenizer's
  /// end-of-sentence token, which checkpoints whose config.json names no eos_token_id still end replies
  /// with (spec/chat-format.md §1.4: id 1 is the only stop token). Out-of-vocabulary ids are dropped.
  std::vector<int32_t> extra_eos_token_ids;
  /// A drafter over one slot's sequence state (null: no drafting; a null result: that slot decodes
  /// serially). Requests with draft = false never get one.
  std::function<std::unique_ptr<model::Drafter>(model::SequenceState&)> make_drafter;
  std::string drafter_name;            // for /metrics and /health ("dspark", "lookup")
  model::DepthPolicy draft_policy;     // fixed_k ≥ 0 bypasses the depth rule
};

struct EngineStats {
  int slots_total = 0;
  int slots_busy = 0;
  int queue_length = 0;
  bool draining = false;
  uint64_t requests_admitted = 0;
  uint64_t requests_finished = 0;
  uint64_t requests_refused = 0;
  uint64_t prompt_tokens_total = 0;     // prompt tokens of admitted requests
  uint64_t prefill_tokens_total = 0;    // prompt tokens actually run (the rest came from the cache)
  uint64_t cached_tokens_total = 0;
  uint64_t generation_tokens_total = 0;
  uint64_t grammar_masks_total = 0;        // constrained tokens: masks computed (one per sampled row)
  double grammar_mask_seconds_total = 0;   // time spent computing them (TokenConstraint::fill_mask)
  uint64_t prefix_cache_hits = 0;
  uint64_t steps_total = 0;
  int prefix_cache_entries = 0;
  size_t memory_used_bytes = 0;
  size_t memory_budget_bytes = 0;
  // Speculative decoding (vLLM's spec_decode counters).
  bool drafting = false;                 // a drafter factory is configured
  std::string drafter;
  uint64_t draft_rounds_total = 0;       // decode rows that verified ≥ 1 draft
  uint64_t draft_tokens_total = 0;       // drafts verified
  uint64_t accepted_tokens_total = 0;    // drafts kept
  std::vector<uint64_t> accepted_per_position;  // [max_k]: rounds whose draft i was kept
  std::vector<uint64_t> rounds_by_accepted;     // [max_k + 1]: rounds that kept exactly a drafts
};

class Engine {
 public:
  Engine(model::LanguageModel& model, EngineOptions options);
  ~Engine();
  Engine(Engine const&) = delete;
  Engine& operator=(Engine const&) = delete;

  /// kInvalidArgument: empty prompt, token id out of range, prompt + max_tokens over the context.
  /// kOutOfMemory: draining, queue full, or the request alone exceeds the memory budget.
  Result<std::shared_ptr<RequestHandle>> submit(GenerationRequest request);

  /// Refuse new requests from now on; running and queued ones continue.
  void begin_drain();
  /// True when nothing is queued or running.
  bool idle() const;
  /// Finishes everything still running with kCancelled and joins the engine thread.
  void stop();

  EngineStats stats() const;
  /// The model's info with eos_token_ids extended by EngineOptions::extra_eos_token_ids.
  model::ModelInfo const& info() const { return info_; }
  int64_t max_context() const { return max_context_; }
  EngineOptions const& options() const { return options_; }

 private:
  struct Slot;
  struct CacheEntry {
    std::vector<int32_t> tokens;
    std::unique_ptr<model::SequenceState> state;
    size_t bytes = 0;
  };

  void run();
  void take_incoming();
  void expire_waiting();
  void admit();
  bool step();
  Status sample_row(Slot& s, TokenEvent& ev);
  /// Emits one sampled token through the serial per-token path; true when the slot finished.
  bool emit(size_t i, TokenEvent ev);
  /// Drafts for a decode slot (0 … budget − 1 of them) into `window` after the pending token.
  int64_t propose(Slot& s, std::vector<int32_t>& window, int64_t budget);
  void finish_slot(size_t i, FinishReason r, std::string error = {});
  void cache_insert(Slot& s);
  CacheEntry* cache_lookup(std::vector<int32_t> const& prompt);
  bool evict_cache_for(size_t bytes);
  size_t used_bytes() const;

  model::LanguageModel& model_;
  model::ModelInfo info_;
  EngineOptions options_;
  int64_t max_context_ = 0;
  int64_t vocab_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<RequestHandle>, GenerationRequest>> incoming_;
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<int> queued_{0};  // submitted, not yet admitted or finished

  // Engine-thread state (read by stats() under stats_mu_ snapshots).
  std::deque<std::pair<std::shared_ptr<RequestHandle>, GenerationRequest>> waiting_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::list<CacheEntry> cache_;  // front = most recently used
  mutable std::mutex stats_mu_;
  EngineStats stats_;
  model::DepthRule depth_;  // cost table + acceptance over every request: a new slot's rule starts as a copy
  std::thread thread_;
};

}  // namespace tessera::server

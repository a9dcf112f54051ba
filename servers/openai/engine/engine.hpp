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
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "servers/openai/engine/types.hpp"
#include "tessera/core/status.hpp"
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
  uint64_t prefix_cache_hits = 0;
  uint64_t steps_total = 0;
  int prefix_cache_entries = 0;
  size_t memory_used_bytes = 0;
  size_t memory_budget_bytes = 0;
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
  std::thread thread_;
};

}  // namespace tessera::server

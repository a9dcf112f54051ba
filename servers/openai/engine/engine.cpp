// SPDX-License-Identifier: Apache-2.0
/// Continuous batching with chunked prefill, a clone-based prefix cache and priced admission
/// (see engine.hpp for the scheduling contract).
#include "servers/openai/engine/engine.hpp"

#include <algorithm>
#include <chrono>

#include "tessera/ops/sampling.hpp"

namespace tessera::server {

using Clock = std::chrono::steady_clock;

struct Engine::Slot {
  std::shared_ptr<RequestHandle> handle;
  GenerationRequest req;
  std::unique_ptr<model::SequenceState> state;
  int64_t pos = 0;                  // tokens fed to the state (prompt then reply)
  std::vector<int32_t> reply;       // sampled tokens (a stop token ends the reply and is not stored)
  size_t price = 0;
  bool cached_snapshot = false;     // prompt[0, n-1) already offered to the prefix cache
  std::vector<float> logits;       // [rows of the last step, V]
  // Speculative decoding.
  std::unique_ptr<model::Drafter> drafter;  // null: serial decoding
  model::DepthRule rule;
  std::vector<int32_t> committed;   // prompt ++ reply: what the drafter continues
  std::vector<int32_t> window;      // this step's [pending ; drafts]
  model::Draft draft;               // this step's drafts (tokens cut to the verified depth)
};

static double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Engine::Engine(model::LanguageModel& model, EngineOptions options)
    : model_(model), info_(model.info()), options_(options) {
  vocab_ = info_.vocab_size;
  for (int32_t id : options_.extra_eos_token_ids)
    if (id >= 0 && id < vocab_ &&
        std::find(info_.eos_token_ids.begin(), info_.eos_token_ids.end(), id) == info_.eos_token_ids.end())
      info_.eos_token_ids.push_back(id);
  max_context_ = options_.max_context > 0 ? std::min<int64_t>(options_.max_context, info_.max_context)
                                          : info_.max_context;
  if (options_.max_batch < 1) options_.max_batch = 1;
  if (options_.step_token_budget < options_.max_batch) options_.step_token_budget = options_.max_batch;
  if (options_.memory_budget_bytes == 0)
    options_.memory_budget_bytes = static_cast<size_t>(options_.max_batch) * model_.state_bytes_for(max_context_);
  depth_ = model::DepthRule(options_.draft_policy);
  stats_.drafting = static_cast<bool>(options_.make_drafter);
  stats_.drafter = options_.drafter_name;
  stats_.accepted_per_position.assign(static_cast<size_t>(std::max<int64_t>(options_.draft_policy.max_k, 0)), 0);
  stats_.rounds_by_accepted.assign(stats_.accepted_per_position.size() + 1, 0);
  stats_.slots_total = options_.max_batch;
  stats_.memory_budget_bytes = options_.memory_budget_bytes;
  slots_.resize(options_.max_batch);
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { stop(); }

Result<std::shared_ptr<RequestHandle>> Engine::submit(GenerationRequest req) {
  if (req.prompt.empty()) return invalid_argument("the prompt is empty");
  for (int32_t t : req.prompt)
    if (t < 0 || t >= vocab_)
      return invalid_argument("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(vocab_) + ")");
  int64_t n = static_cast<int64_t>(req.prompt.size());
  if (req.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  if (n + req.max_tokens > max_context_)
    return invalid_argument("This model's maximum context length is " + std::to_string(max_context_) +
                            " tokens. However, you requested " + std::to_string(n + req.max_tokens) +
                            " tokens (" + std::to_string(n) + " in the messages, " +
                            std::to_string(req.max_tokens) + " in the completion).");
  size_t price = model_.state_bytes_for(n + req.max_tokens);
  if (price > options_.memory_budget_bytes)
    return Status(StatusCode::kOutOfMemory, "the request needs " + std::to_string(price) +
                                                " bytes of sequence state, more than the server's budget");
  auto h = std::make_shared<RequestHandle>();
  h->prompt_tokens_ = n;
  {
    std::lock_guard lk(mu_);
    if (draining_.load() || stop_) {
      std::lock_guard sl(stats_mu_);
      ++stats_.requests_refused;
      return Status(StatusCode::kOutOfMemory, "the server is shutting down");
    }
    if (queued_.load() >= options_.max_queue) {
      std::lock_guard sl(stats_mu_);
      ++stats_.requests_refused;
      return Status(StatusCode::kOutOfMemory, "the request queue is full");
    }
    ++queued_;
    incoming_.emplace_back(h, std::move(req));
  }
  cv_.notify_all();
  return h;
}

void Engine::begin_drain() { draining_.store(true); }

bool Engine::idle() const {
  std::lock_guard lk(mu_);
  std::lock_guard sl(stats_mu_);
  return incoming_.empty() && stats_.queue_length == 0 && stats_.slots_busy == 0;
}

void Engine::stop() {
  {
    std::lock_guard lk(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard sl(stats_mu_);
  EngineStats s = stats_;
  s.draining = draining_.load();
  return s;
}

size_t Engine::used_bytes() const {
  size_t u = 0;
  for (auto const& s : slots_) if (s) u += s->price;
  for (auto const& e : cache_) u += e.bytes;
  return u;
}

void Engine::take_incoming() {
  std::lock_guard lk(mu_);
  // Waiting order: interactive requests FIFO, then background ones FIFO (admission takes the front).
  while (!incoming_.empty()) {
    auto& next = incoming_.front();
    auto at = waiting_.end();
    if (!next.second.background)
      at = std::find_if(waiting_.begin(), waiting_.end(), [](auto const& w) { return w.second.background; });
    waiting_.insert(at, std::move(next));
    incoming_.pop_front();
  }
}

void Engine::expire_waiting() {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto& h = it->first;
    double waited = seconds_since(h->submitted_);
    if (h->cancelled()) {
      h->finish(FinishReason::kCancelled);
    } else if (it->second.timeout_s > 0 && waited > it->second.timeout_s) {
      h->finish(FinishReason::kTimeout, "the request timed out while queued");
    } else if (waited > options_.queue_timeout_s) {
      h->finish(FinishReason::kOverCapacity, "the server is over capacity; retry later");
      std::lock_guard sl(stats_mu_);
      ++stats_.requests_refused;
    } else {
      ++it;
      continue;
    }
    --queued_;
    it = waiting_.erase(it);
  }
}

Engine::CacheEntry* Engine::cache_lookup(std::vector<int32_t> const& prompt) {
  auto best = cache_.end();
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    // Usable if it is a proper prefix of the prompt (the last prompt token must still be fed).
    if (it->tokens.size() >= prompt.size()) continue;
    if (!std::equal(it->tokens.begin(), it->tokens.end(), prompt.begin())) continue;
    if (best == cache_.end() || it->tokens.size() > best->tokens.size()) best = it;
  }
  if (best == cache_.end()) return nullptr;
  cache_.splice(cache_.begin(), cache_, best);  // most recently used first
  return &cache_.front();
}

bool Engine::evict_cache_for(size_t bytes) {
  while (used_bytes() + bytes > options_.memory_budget_bytes && !cache_.empty()) cache_.pop_back();
  return used_bytes() + bytes <= options_.memory_budget_bytes;
}

void Engine::cache_insert(Slot& s) {
  s.cached_snapshot = true;
  if (options_.prefix_cache_entries <= 0) return;
  int64_t len = static_cast<int64_t>(s.req.prompt.size()) - 1;
  if (len < options_.prefix_cache_min_tokens) return;
  for (auto& e : cache_)
    if (static_cast<int64_t>(e.tokens.size()) == len && std::equal(e.tokens.begin(), e.tokens.end(), s.req.prompt.begin()))
      return;
  auto copy = model_.clone(*s.state);
  if (!copy.ok()) return;  // the model cannot snapshot: no prefix cache
  CacheEntry e;
  e.tokens.assign(s.req.prompt.begin(), s.req.prompt.begin() + len);
  e.bytes = (*copy)->memory_bytes();
  e.state = std::move(*copy);
  while (static_cast<int>(cache_.size()) >= options_.prefix_cache_entries) cache_.pop_back();
  if (used_bytes() + e.bytes > options_.memory_budget_bytes) return;  // never crowd out running requests
  cache_.push_front(std::move(e));
}

void Engine::admit() {
  for (size_t i = 0; i < slots_.size() && !waiting_.empty(); ++i) {
    if (slots_[i]) continue;
    auto& [h, req] = waiting_.front();
    size_t price = model_.state_bytes_for(static_cast<int64_t>(req.prompt.size()) + req.max_tokens);
    CacheEntry* hit = cache_lookup(req.prompt);
    std::unique_ptr<model::SequenceState> state;
    int64_t cached = 0;
    if (hit) {
      auto copy = model_.clone(*hit->state);
      if (copy.ok()) { state = std::move(*copy); cached = static_cast<int64_t>(hit->tokens.size()); }
    }
    if (!evict_cache_for(price)) return;  // head of line waits for memory
    if (!state) state = model_.new_sequence();
    auto s = std::make_unique<Slot>();
    s->handle = h;
    s->req = std::move(req);
    s->state = std::move(state);
    s->pos = cached;
    s->price = price;
    s->logits.resize(static_cast<size_t>(vocab_));
    s->cached_snapshot = cached == static_cast<int64_t>(s->req.prompt.size()) - 1;
    s->committed = s->req.prompt;
    if (options_.make_drafter && s->req.draft) {
      s->drafter = options_.make_drafter(*s->state);
      s->rule = depth_;  // the engine's cost table and the acceptance learned from earlier requests
    }
    s->handle->set_admitted(cached);
    {
      std::lock_guard sl(stats_mu_);
      ++stats_.requests_admitted;
      stats_.prompt_tokens_total += s->req.prompt.size();
      stats_.cached_tokens_total += cached;
      if (cached) ++stats_.prefix_cache_hits;
    }
    slots_[i] = std::move(s);
    waiting_.pop_front();
    --queued_;
  }
}

void Engine::finish_slot(size_t i, FinishReason r, std::string error) {
  slots_[i]->handle->finish(r, std::move(error));
  slots_[i].reset();
  std::lock_guard sl(stats_mu_);
  ++stats_.requests_finished;
}

bool Engine::step() {
  // Cancellations and timeouts first: their slots free before this step's batch is built.
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i]) continue;
    if (slots_[i]->handle->cancelled()) finish_slot(i, FinishReason::kCancelled);
    else if (slots_[i]->req.timeout_s > 0 && seconds_since(slots_[i]->handle->submitted_) > slots_[i]->req.timeout_s)
      finish_slot(i, FinishReason::kTimeout, "the request exceeded its time limit");
  }
  std::vector<model::SequenceStep> batch;
  std::vector<size_t> owner;
  std::vector<int32_t> one_token(slots_.size());
  std::vector<bool> decode_row;
  int64_t budget = options_.step_token_budget;
  // Decode rows (including each slot's last prompt token) first: they are latency-bound. Drafts share
  // what the step budget leaves after one row per decode slot.
  int64_t decode_slots = 0;
  for (auto const& s : slots_)
    if (s && s->pos >= static_cast<int64_t>(s->req.prompt.size()) - 1) ++decode_slots;
  int64_t extra = std::max<int64_t>(0, budget - decode_slots);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot* s = slots_[i].get();
    int64_t n = s ? static_cast<int64_t>(s->req.prompt.size()) : 0;
    if (!s || s->pos < n - 1) continue;
    one_token[i] = s->pos < n ? s->req.prompt[s->pos] : s->reply.back();
    s->window.assign(1, one_token[i]);
    int64_t const k = s->drafter ? propose(*s, s->window, extra) : 0;
    extra -= k;
    s->logits.resize(static_cast<size_t>((k + 1) * vocab_));
    batch.push_back({s->state.get(), std::span<int32_t const>(s->window), k + 1, s->logits.data()});
    owner.push_back(i);
    decode_row.push_back(true);
    budget -= k + 1;
  }
  int64_t prefill_tokens = 0;
  for (size_t i = 0; i < slots_.size() && budget > 0; ++i) {
    Slot* s = slots_[i].get();
    int64_t n = s ? static_cast<int64_t>(s->req.prompt.size()) : 0;
    if (!s || s->pos >= n - 1) continue;
    int64_t chunk = std::min(budget, n - 1 - s->pos);
    batch.push_back({s->state.get(), std::span<int32_t const>(s->req.prompt.data() + s->pos, chunk), 1,
                     s->logits.data()});
    owner.push_back(i);
    decode_row.push_back(false);
    budget -= chunk;
    prefill_tokens += chunk + 0;
  }
  if (batch.empty()) return false;
  Status st = model_.forward(batch);
  if (!st.ok()) {
    for (size_t b = 0; b < owner.size(); ++b) finish_slot(owner[b], FinishReason::kError, st.message());
    return true;
  }
  uint64_t generated = 0, rounds = 0, drafted = 0, accepted = 0;
  std::vector<uint64_t> per_pos(stats_.accepted_per_position.size(), 0), by_accepted(stats_.rounds_by_accepted.size(), 0);
  for (size_t b = 0; b < batch.size(); ++b) {
    size_t i = owner[b];
    Slot& s = *slots_[i];
    int64_t n = static_cast<int64_t>(s.req.prompt.size());
    if (!decode_row[b]) {
      s.pos += static_cast<int64_t>(batch[b].tokens.size());
      if (s.pos == n - 1 && !s.cached_snapshot) cache_insert(s);
      continue;
    }
    int64_t const old_pos = s.pos, k = batch[b].num_logit_rows - 1;
    if (old_pos == n - 1) prefill_tokens += 1;
    std::vector<int32_t> const drafts(s.draft.tokens.begin(), s.draft.tokens.begin() + k);
    std::vector<float> const conf = s.draft.confidence;
    // Row r is the serial step at position old_pos + 1 + r; stop after the first token that is not
    // the draft (or a finish).
    int64_t a = 0;
    bool finished = false;
    for (int64_t r = 0; r <= k; ++r) {
      if (r > 0) std::copy(s.logits.begin() + r * vocab_, s.logits.begin() + (r + 1) * vocab_, s.logits.begin());
      s.pos = old_pos + 1 + r;
      TokenEvent ev;
      Status ss = sample_row(s, ev);
      if (!ss.ok()) { finish_slot(i, FinishReason::kError, ss.message()); finished = true; break; }
      int32_t const tok = ev.token;
      ++generated;
      finished = emit(i, std::move(ev));
      bool const kept = r < k && tok == drafts[static_cast<size_t>(r)];
      a += kept ? 1 : 0;
      if (finished || !kept) break;
    }
    if (k > 0) {
      ++rounds;
      drafted += static_cast<uint64_t>(k);
      accepted += static_cast<uint64_t>(a);
      for (int64_t j = 0; j < a && j < static_cast<int64_t>(per_pos.size()); ++j) ++per_pos[j];
      if (a < static_cast<int64_t>(by_accepted.size())) ++by_accepted[a];
    }
    if (finished) continue;
    if (k > 0) {
      s.rule.observe_round(k, a, conf);
      depth_.observe_round(k, a, conf);
      s.drafter->observe(k, a);
    }
    if (s.pos < old_pos + k + 1) {
      Status t = model_.truncate(*s.state, s.pos);  // drop the rejected drafts' rows
      if (!t.ok()) finish_slot(i, FinishReason::kError, t.message());
    }
  }
  std::lock_guard sl(stats_mu_);
  stats_.generation_tokens_total += generated;
  stats_.prefill_tokens_total += static_cast<uint64_t>(prefill_tokens);
  stats_.draft_rounds_total += rounds;
  stats_.draft_tokens_total += drafted;
  stats_.accepted_tokens_total += accepted;
  for (size_t j = 0; j < per_pos.size(); ++j) stats_.accepted_per_position[j] += per_pos[j];
  for (size_t j = 0; j < by_accepted.size(); ++j) stats_.rounds_by_accepted[j] += by_accepted[j];
  ++stats_.steps_total;
  return true;
}

bool Engine::emit(size_t i, TokenEvent ev) {
  Slot& s = *slots_[i];
  if (s.reply.empty()) s.handle->set_ttft(seconds_since(s.handle->submitted_));
  bool is_eos = std::find(info_.eos_token_ids.begin(), info_.eos_token_ids.end(), ev.token) != info_.eos_token_ids.end();
  bool is_stop_id = std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), ev.token) != s.req.stop_token_ids.end();
  if ((is_eos && !s.req.ignore_eos) || is_stop_id) {
    ev.is_stop_token = true;
    s.handle->push(std::move(ev));
    finish_slot(i, FinishReason::kStop);
    return true;
  }
  if (s.req.constraint) s.req.constraint->accept(ev.token);
  s.reply.push_back(ev.token);
  s.committed.push_back(ev.token);
  s.handle->push(std::move(ev));
  if (s.req.constraint && s.req.constraint->done()) {
    finish_slot(i, FinishReason::kStop);
    return true;
  }
  if (static_cast<int64_t>(s.reply.size()) >= s.req.max_tokens || s.pos + 1 >= max_context_) {
    finish_slot(i, FinishReason::kLength);
    return true;
  }
  return false;
}

int64_t Engine::propose(Slot& s, std::vector<int32_t>& window, int64_t budget) {
  model::DepthPolicy const& pol = options_.draft_policy;
  // A round emits ≤ k + 1 tokens and feeds k + 1: stay within max_tokens, the context and the budget.
  int64_t const room = std::min({budget, s.req.max_tokens - static_cast<int64_t>(s.reply.size()) - 1,
                                 max_context_ - s.pos - 2, pol.max_k});
  s.draft = {};
  if (room <= 0) return 0;
  if (pol.fixed_k < 0 && !depth_.calibrated()) {
    // Once per engine: the verify cost of 1 … max_k + 1 rows on a scratch sequence.
    auto cost = model::measure_verify_cost(model_, s.committed, pol.max_k);
    if (cost.ok()) depth_.set_cost(std::move(*cost), true);
  }
  if (!s.rule.calibrated() && depth_.calibrated()) s.rule.set_cost(depth_.cost(), true);
  // No drafter call when even certain drafts would not pay (confidences are ≤ 1).
  if (s.rule.choose(std::vector<float>(static_cast<size_t>(room), 1.f), room) == 0) return 0;
  s.draft = s.drafter->propose(s.committed, room);
  int64_t valid = 0;  // a drafter's out-of-vocabulary token ends its proposal
  while (valid < static_cast<int64_t>(s.draft.tokens.size()) && s.draft.tokens[valid] >= 0 && s.draft.tokens[valid] < vocab_) ++valid;
  int64_t const k = s.rule.choose(s.draft.confidence, std::min(room, valid));
  s.draft.tokens.resize(static_cast<size_t>(k));
  window.insert(window.end(), s.draft.tokens.begin(), s.draft.tokens.end());
  return k;
}

Status Engine::sample_row(Slot& s, TokenEvent& ev) {
  // One row of ops::sample: penalties over the prompt (repetition) and the reply, the constraint's mask,
  // the keyed draw at the token's absolute position (stream key 0: the reply is a function of seed,
  // prompt and position only), raw log-softmax logprobs.
  ops::SamplingRowParams p;
  SamplingParams const& q = s.req.sampling;
  p.temperature = q.temperature;
  p.top_k = q.top_k;
  p.top_p = q.top_p;
  p.min_p = q.min_p;
  p.presence_penalty = q.presence_penalty;
  p.frequency_penalty = q.frequency_penalty;
  p.repetition_penalty = q.repetition_penalty;
  p.seed = q.seed;
  p.stream_key = 0;
  p.position = s.pos;
  int64_t const words = (vocab_ + 31) / 32;
  std::vector<uint32_t> mask;
  if (s.req.constraint) {
    mask.assign(static_cast<size_t>(words), 0u);
    auto const t0 = Clock::now();
    s.req.constraint->fill_mask(mask.data());
    double const mask_s = seconds_since(t0);
    std::lock_guard sl(stats_mu_);
    ++stats_.grammar_masks_total;
    stats_.grammar_mask_seconds_total += mask_s;
  }
  int32_t const k = std::max<int32_t>(s.req.top_logprobs, 0);
  int64_t prompt_off[2] = {0, static_cast<int64_t>(s.req.prompt.size())};
  int64_t reply_off[2] = {0, static_cast<int64_t>(s.reply.size())};
  int32_t token = -1;
  float logprob = 0;
  std::vector<int32_t> top_ids(static_cast<size_t>(k));
  std::vector<float> top_lps(static_cast<size_t>(k));
  ops::SampleDesc d{1, vocab_, k, ops::LogprobMode::kRaw};
  ops::SampleArgs a;
  a.logits = TensorView<float const, 2>(s.logits.data(), {1, vocab_});
  a.params = TensorView<ops::SamplingRowParams const, 1>(&p, {1});
  if (!mask.empty()) a.mask = TensorView<uint32_t const, 2>(mask.data(), {1, words});
  if (q.repetition_penalty != 1.0f) {
    a.prompt_offsets = TensorView<int64_t const, 1>(prompt_off, {2});
    a.prompt_tokens = TensorView<int32_t const, 1>(s.req.prompt.data(), {prompt_off[1]});
  }
  a.output_offsets = TensorView<int64_t const, 1>(reply_off, {2});
  a.output_tokens = TensorView<int32_t const, 1>(s.reply.data(), {reply_off[1]});
  a.tokens = TensorView<int32_t, 1>(&token, {1});
  a.logprobs = TensorView<float, 1>(&logprob, {1});
  if (k > 0) {
    a.top_ids = TensorView<int32_t, 2>(top_ids.data(), {1, k});
    a.top_logprobs = TensorView<float, 2>(top_lps.data(), {1, k});
  }
  ExecContext ctx;
  ctx.backend = Backend::kCpu;
  TESSERA_TRY(ops::sample(ctx, d, a));
  ev.token = token;
  ev.logprob = logprob;
  for (int32_t j = 0; j < k; ++j) ev.top.push_back({top_ids[j], top_lps[j]});
  return {};
}

void Engine::run() {
  for (;;) {
    take_incoming();
    expire_waiting();
    admit();
    bool worked = step();
    {
      std::lock_guard sl(stats_mu_);
      stats_.queue_length = static_cast<int>(waiting_.size());
      stats_.slots_busy = 0;
      for (auto const& s : slots_) stats_.slots_busy += s ? 1 : 0;
      stats_.prefix_cache_entries = static_cast<int>(cache_.size());
      stats_.memory_used_bytes = used_bytes();
    }
    std::unique_lock lk(mu_);
    if (stop_) break;
    if (!worked && incoming_.empty()) {
      // Idle or blocked on admission: wake on new work, or poll for queue timeouts and cancellations.
      cv_.wait_for(lk, std::chrono::milliseconds(waiting_.empty() ? 200 : 20));
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) if (slots_[i]) finish_slot(i, FinishReason::kCancelled, "server stopped");
  for (auto& [h, r] : waiting_) { h->finish(FinishReason::kCancelled, "server stopped"); --queued_; }
  waiting_.clear();
  std::lock_guard lk(mu_);
  for (auto& [h, r] : incoming_) { h->finish(FinishReason::kCancelled, "server stopped"); --queued_; }
  incoming_.clear();
}

}  // namespace tessera::server

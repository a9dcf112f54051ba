// SPDX-License-Identifier: Apache-2.0
/// Native request and result types of the engine. No JSON crosses into the engine: the HTTP side parses a
/// request into a `GenerationRequest` (token ids and numbers), submits it, and reads `TokenEvent`s back
/// from the request's `RequestHandle` (a chunk generator the HTTP thread drains).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera::server {

/// Sampling knobs (OpenAI + vLLM names). temperature 0 = greedy argmax.
struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;                 // 0 = off
  float min_p = 0.0f;                // 0 = off
  float presence_penalty = 0.0f;     // OpenAI: subtract once per token that appeared in the reply
  float frequency_penalty = 0.0f;    // OpenAI: subtract per occurrence in the reply
  float repetition_penalty = 1.0f;   // vLLM/HF: divide positive / multiply negative logits of seen tokens
  uint64_t seed = 0;                 // keys the sampler: token = f(seed, logits, reply position)
};

/// Per-token restriction (grammar-constrained decoding). The engine asks for the allowed set before
/// sampling each reply token and reports the chosen token afterwards.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  /// Writes the allowed set of the next token: ceil(vocab/32) words, bit (v mod 32) of word ⌊v/32⌋.
  virtual void fill_mask(uint32_t* words) = 0;
  virtual void accept(int32_t token) = 0;
  /// True when the constrained text is complete (the engine then ends the reply with "stop").
  virtual bool done() const = 0;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // end the reply (finish "stop"), token not kept in the reply text
  bool ignore_eos = false;
  int32_t top_logprobs = -1;            // -1 = no logprobs; 0..20 = chosen token + this many alternatives
  std::shared_ptr<TokenConstraint> constraint;
  double timeout_s = 0;                 // 0 = none; wall clock from submit
  bool draft = true;                    // accepted for speculative decoding; serial decoding either way
  bool background = false;              // admitted after every waiting interactive request (same reply)
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kTimeout, kError, kOverCapacity };

inline char const* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kTimeout: return "timeout";
    case FinishReason::kError: return "error";
    case FinishReason::kOverCapacity: return "over_capacity";
  }
  return "?";
}

struct TopLogprob {
  int32_t token;
  float logprob;
};

struct TokenEvent {
  int32_t token = -1;
  float logprob = 0;               // log-softmax of the model's logits (before sampling transforms)
  std::vector<TopLogprob> top;     // top_logprobs alternatives, best first
  bool is_stop_token = false;      // EOS or a stop id: ends the reply, not part of its text
};

/// The engine→HTTP channel of one request. The engine pushes events; the HTTP thread pops them.
class RequestHandle {
 public:
  using Clock = std::chrono::steady_clock;

  /// Blocks until events or the end arrive, or `timeout` passes. Returns false on timeout with nothing.
  bool wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return !events_.empty() || finish_ != FinishReason::kNone || admitted_changed_; });
    admitted_changed_ = false;
    bool any = !events_.empty();
    while (!events_.empty()) { out.push_back(std::move(events_.front())); events_.pop_front(); }
    return any || finish_ != FinishReason::kNone;
  }
  /// Blocks until the engine admitted the request into a slot or finished it (rejections arrive here).
  bool wait_admitted(std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return admitted_ || finish_ != FinishReason::kNone; });
  }
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  FinishReason finish_reason() const { std::lock_guard lk(mu_); return finish_; }
  std::string error() const { std::lock_guard lk(mu_); return error_; }
  bool admitted() const { std::lock_guard lk(mu_); return admitted_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t cached_tokens() const { std::lock_guard lk(mu_); return cached_tokens_; }
  double ttft_s() const { std::lock_guard lk(mu_); return ttft_s_; }

  // Engine side.
  void push(TokenEvent ev) {
    { std::lock_guard lk(mu_); events_.push_back(std::move(ev)); }
    cv_.notify_all();
  }
  void set_admitted(int64_t cached) {
    { std::lock_guard lk(mu_); admitted_ = true; admitted_changed_ = true; cached_tokens_ = cached; }
    cv_.notify_all();
  }
  void set_ttft(double s) { std::lock_guard lk(mu_); ttft_s_ = s; }
  void finish(FinishReason r, std::string error = {}) {
    { std::lock_guard lk(mu_); if (finish_ == FinishReason::kNone) { finish_ = r; error_ = std::move(error); } }
    cv_.notify_all();
  }

  int64_t prompt_tokens_ = 0;
  Clock::time_point submitted_ = Clock::now();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  FinishReason finish_ = FinishReason::kNone;
  std::string error_;
  bool admitted_ = false;
  bool admitted_changed_ = false;
  int64_t cached_tokens_ = 0;
  double ttft_s_ = 0;
  std::atomic<bool> cancelled_{false};
};

}  // namespace tessera::server

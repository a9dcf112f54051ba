// SPDX-License-Identifier: Apache-2.0
/// StubModel: hash-of-history logits plus scripted replies (see stub_model.hpp).
#include "servers/openai/engine/stub_model.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace tessera::server {
namespace {

uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

struct StubState final : model::SequenceState {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> hashes;  // hashes[p] = hash of tokens[0..p]
  size_t bytes_per_token = 0;
  int64_t length() const override { return static_cast<int64_t>(tokens.size()); }
  size_t memory_bytes() const override { return 64 + tokens.size() * bytes_per_token; }
};

}  // namespace

StubModel::StubModel(StubModelConfig config) : cfg_(std::move(config)) {
  info_.name = cfg_.name;
  info_.model_type = "stub";
  info_.vocab_size = cfg_.vocab_size;
  info_.max_context = cfg_.max_context;
  info_.eos_token_ids = cfg_.eos_token_ids;
  allowed_.assign(static_cast<size_t>(cfg_.vocab_size), cfg_.allowed_tokens.empty() ? 1 : 0);
  for (int32_t t : cfg_.allowed_tokens) if (t >= 0 && t < cfg_.vocab_size) allowed_[t] = 1;
  for (int32_t t : cfg_.eos_token_ids) if (t >= 0 && t < cfg_.vocab_size) allowed_[t] = 1;
}

std::unique_ptr<model::SequenceState> StubModel::new_sequence() {
  auto s = std::make_unique<StubState>();
  s->bytes_per_token = cfg_.bytes_per_token;
  return s;
}

size_t StubModel::state_bytes_for(int64_t num_tokens) const {
  return 64 + static_cast<size_t>(num_tokens) * cfg_.bytes_per_token;
}

void StubModel::row(std::vector<int32_t> const& tokens, size_t end, uint64_t h, float* out) const {
  // Scripted reply: the last assistant marker before `end`, preceded somewhere by a trigger.
  if (cfg_.assistant_token >= 0 && !cfg_.scripts.empty()) {
    size_t a = end;
    while (a > 0 && tokens[a - 1] != cfg_.assistant_token) --a;
    if (a > 0) {
      for (auto const& sc : cfg_.scripts) {
        auto it = std::search(tokens.begin(), tokens.begin() + static_cast<long>(a - 1), sc.trigger.begin(), sc.trigger.end());
        if (sc.trigger.empty() || it == tokens.begin() + static_cast<long>(a - 1)) continue;
        size_t first = a;  // first reply position
        if (first < end && std::find(cfg_.reply_prefix_tokens.begin(), cfg_.reply_prefix_tokens.end(), tokens[first]) !=
                               cfg_.reply_prefix_tokens.end())
          ++first;
        if (end < first) break;
        size_t k = end - first;
        int32_t want = k < sc.reply.size() ? sc.reply[k] : cfg_.eos_token_ids.at(0);
        std::fill(out, out + cfg_.vocab_size, -30.0f);
        out[want] = 30.0f;
        return;
      }
    }
  }
  for (int64_t v = 0; v < cfg_.vocab_size; ++v) {
    if (!allowed_[v]) { out[v] = -30.0f; continue; }
    uint64_t r = mix(h, static_cast<uint64_t>(v) + 1);
    out[v] = static_cast<float>(static_cast<double>(r >> 40) * 0x1.0p-24 * 8.0 - 4.0);
  }
  for (int32_t e : cfg_.eos_token_ids) out[e] += cfg_.eos_bias;
}

void StubModel::logits_for(std::vector<int32_t> const& history, float* out) const {
  uint64_t h = cfg_.seed;
  for (int32_t t : history) h = mix(h, static_cast<uint64_t>(t));
  row(history, history.size(), h, out);
}

Status StubModel::forward(std::span<model::SequenceStep> batch) {
  int64_t fed = 0;
  for (auto const& st : batch) {
    if (!st.state) return invalid_argument("StubModel::forward: null sequence state");
    if (st.num_logit_rows < 1 || st.num_logit_rows > static_cast<int64_t>(st.tokens.size()))
      return invalid_argument("StubModel::forward: num_logit_rows out of range");
    auto const& s = static_cast<StubState const&>(*st.state);
    if (s.length() + static_cast<int64_t>(st.tokens.size()) > cfg_.max_context)
      return invalid_argument("StubModel::forward: sequence exceeds max_context");
    for (int32_t t : st.tokens)
      if (t < 0 || t >= cfg_.vocab_size) return invalid_argument("StubModel::forward: token id out of range");
    fed += static_cast<int64_t>(st.tokens.size());
  }
  for (auto const& st : batch) {
    auto& s = static_cast<StubState&>(*st.state);
    int64_t first_row = static_cast<int64_t>(st.tokens.size()) - st.num_logit_rows;
    for (size_t j = 0; j < st.tokens.size(); ++j) {
      uint64_t prev = s.hashes.empty() ? cfg_.seed : s.hashes.back();
      s.tokens.push_back(st.tokens[j]);
      s.hashes.push_back(mix(prev, static_cast<uint64_t>(st.tokens[j])));
      int64_t r = static_cast<int64_t>(j) - first_row;
      if (r >= 0) row(s.tokens, s.tokens.size(), s.hashes.back(), st.logits + r * cfg_.vocab_size);
    }
  }
  int64_t delay = cfg_.step_delay_us + cfg_.token_delay_us * fed;
  if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
  return {};
}

Result<std::unique_ptr<model::SequenceState>> StubModel::clone(model::SequenceState const& state) {
  return std::unique_ptr<model::SequenceState>(std::make_unique<StubState>(static_cast<StubState const&>(state)));
}

Status StubModel::truncate(model::SequenceState& state, int64_t length) {
  auto& s = static_cast<StubState&>(state);
  if (length < 0 || length > s.length()) return invalid_argument("StubModel::truncate: length out of range");
  s.tokens.resize(static_cast<size_t>(length));
  s.hashes.resize(static_cast<size_t>(length));
  return {};
}

}  // namespace tessera::server

// SPDX-License-Identifier: Apache-2.0
/// Shared pieces of the drafting tests and bench: the plain serial decode loop (one forward and one
/// one-row keyed sampler call per token, written independently of the Generator), the prompt corpus
/// (seeded random and periodic prompts) and the forced test drafters (always right, always wrong,
/// random mixtures) that know the serial continuation.
#pragma once

#include <algorithm>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "tessera/models/common/drafter.hpp"
#include "tessera/ops/sampling.hpp"

namespace tessera::verify {

/// Serial decoding: the reference every drafted run must reproduce. Leaves `state` holding
/// prompt ++ out[0 .. n−1).
inline std::vector<int32_t> serial_decode(model::LanguageModel& m, model::SequenceState& state,
                                          std::span<int32_t const> prompt, int64_t n, ops::SamplingRowParams p,
                                          bool ignore_eos) {
  int64_t V = m.info().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> cur(prompt.begin(), prompt.end()), out;
  ExecContext ctx;
  while (static_cast<int64_t>(out.size()) < n) {
    model::SequenceStep step{&state, cur, 1, logits.data()};
    throw_if_error(m.forward({&step, 1}));
    p.position = state.length();
    int32_t tok = -1;
    int64_t po[2] = {0, static_cast<int64_t>(prompt.size())}, oo[2] = {0, static_cast<int64_t>(out.size())};
    ops::SampleArgs a;
    a.logits = TensorView<float const, 2>(logits.data(), {1, V});
    a.params = TensorView<ops::SamplingRowParams const, 1>(&p, {1});
    a.prompt_offsets = TensorView<int64_t const, 1>(po, {2});
    a.prompt_tokens = TensorView<int32_t const, 1>(prompt.data(), {static_cast<int64_t>(prompt.size())});
    a.output_offsets = TensorView<int64_t const, 1>(oo, {2});
    a.output_tokens = TensorView<int32_t const, 1>(out.data(), {static_cast<int64_t>(out.size())});
    a.tokens = TensorView<int32_t, 1>(&tok, {1});
    throw_if_error(ops::sample(ctx, {1, V, 0, ops::LogprobMode::kRaw}, a));
    out.push_back(tok);
    cur.assign(1, tok);
    auto const& eos = m.info().eos_token_ids;
    if (!ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) break;
  }
  return out;
}

/// Prompt i of the corpus: even i → a random period-(2..6) pattern repeated (lookup-friendly), odd i →
/// uniform random tokens; lengths 3..40.
inline std::vector<int32_t> corpus_prompt(int i, int64_t vocab) {
  std::mt19937_64 rng(0x5eed0000u + static_cast<uint64_t>(i));
  size_t len = 3 + rng() % 38;
  std::vector<int32_t> t;
  if (i % 2 == 0) {
    std::vector<int32_t> pat(2 + rng() % 5);
    for (auto& x : pat) x = static_cast<int32_t>(rng() % vocab);
    for (size_t j = 0; j < len; ++j) t.push_back(pat[j % pat.size()]);
  } else {
    for (size_t j = 0; j < len; ++j) t.push_back(static_cast<int32_t>(rng() % vocab));
  }
  return t;
}

/// Knows the serial continuation `truth` of a prompt of `prompt_len` tokens. Mode kRight proposes it,
/// kWrong proposes (truth + 1) mod V at every position, kRandom a random length with each token right
/// with probability 1/2 and random otherwise.
class ForcedDrafter final : public model::Drafter {
 public:
  enum class Mode { kRight, kWrong, kRandom };
  ForcedDrafter(Mode mode, std::vector<int32_t> truth, size_t prompt_len, int64_t vocab, uint64_t seed = 1)
      : mode_(mode), truth_(std::move(truth)), prompt_len_(prompt_len), vocab_(vocab), rng_(seed) {}
  std::string name() const override { return "forced"; }
  model::Draft propose(std::span<int32_t const> committed, int64_t max_k) override {
    model::Draft d;
    size_t at = committed.size() - prompt_len_;  // serial tokens already emitted
    int64_t k = mode_ == Mode::kRandom ? static_cast<int64_t>(rng_() % static_cast<uint64_t>(max_k + 1)) : max_k;
    for (int64_t i = 0; i < k; ++i) {
      int32_t t = at + i < truth_.size() ? truth_[at + i] : 0;
      if (mode_ == Mode::kWrong) t = static_cast<int32_t>((t + 1) % vocab_);
      if (mode_ == Mode::kRandom && rng_() % 2) t = static_cast<int32_t>(rng_() % static_cast<uint64_t>(vocab_));
      d.tokens.push_back(t);
    }
    d.confidence.assign(d.tokens.size(), -1.f);
    return d;
  }

 private:
  Mode mode_;
  std::vector<int32_t> truth_;
  size_t prompt_len_;
  int64_t vocab_;
  std::mt19937_64 rng_;
};

}  // namespace tessera::verify

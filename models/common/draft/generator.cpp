// SPDX-License-Identifier: Apache-2.0
/// The exact speculative decode loop of drafter.hpp: draft, one verify forward over [pending ; drafts],
/// keyed acceptance (ops/spec_verify.hpp), rollback of the rejected rows (LanguageModel::truncate), and
/// the depth rule from the measured verify cost per window size and the running acceptance rate.
#include <algorithm>
#include <chrono>
#include <string>

#include "tessera/models/common/drafter.hpp"
#include "tessera/models/common/grammar.hpp"
#include "tessera/ops/spec_verify.hpp"

namespace tessera::model {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

void DraftStats::add(DraftStats const& o) {
  rounds += o.rounds;
  drafted += o.drafted;
  accepted += o.accepted;
  emitted += o.emitted;
  rollbacks += o.rollbacks;
  forward_s += o.forward_s;
  verify_s += o.verify_s;
  draft_s += o.draft_s;
  rollback_s += o.rollback_s;
}

Generator::Generator(LanguageModel& model, Drafter* drafter, DepthPolicy policy)
    : model_(model), drafter_(drafter), policy_(policy), rule_(policy) {}

Result<std::vector<int32_t>> Generator::generate(SequenceState& state, std::span<int32_t const> prompt,
                                                 GenerateOptions const& opts, DraftStats* stats_out) {
  if (prompt.empty()) return invalid_argument("generate: the prompt is empty");
  ModelInfo const& info = model_.info();
  int64_t const V = info.vocab_size, L0 = state.length();
  bool const drafting = drafter_ && (policy_.fixed_k != 0);
  // Seed the cost table by timing verify windows of 1 … max_k + 1 rows on a scratch sequence.
  if (drafting && policy_.fixed_k < 0 && !rule_.calibrated()) {
    auto cost = measure_verify_cost(model_, prompt, policy_.max_k);
    if (!cost) return cost.status();
    rule_.set_cost(std::move(*cost), false);
  }

  DraftStats st;
  std::vector<int32_t> committed(prompt.begin(), prompt.end()), out, pending(prompt.begin(), prompt.end());
  std::vector<float> logits;
  std::vector<uint32_t> masks;
  int64_t const words = (V + 31) / 32;
  auto is_eos = [&](int32_t t) { return std::find(info.eos_token_ids.begin(), info.eos_token_ids.end(), t) != info.eos_token_ids.end(); };
  bool done = opts.max_new_tokens <= 0;
  while (!done) {
    int64_t const L = state.length(), x = static_cast<int64_t>(pending.size());
    int64_t const remaining = opts.max_new_tokens - static_cast<int64_t>(out.size());
    // No drafts past the token budget (a round emits ≤ k + 1) or the context.
    int64_t const room = std::min(remaining - 1, info.max_context - L - x);
    Draft d;
    // No drafter call when even certain drafts would not pay (confidences are ≤ 1).
    if (drafting && room > 0 && rule_.choose(std::vector<float>(static_cast<size_t>(std::min(room, policy_.max_k)), 1.f), room) > 0) {
      auto t0 = Clock::now();
      d = drafter_->propose(committed, std::min(policy_.max_k, room));
      st.draft_s += seconds_since(t0);
    }
    int64_t k = choose_depth(d.confidence, std::min<int64_t>(static_cast<int64_t>(d.tokens.size()), room));
    d.tokens.resize(static_cast<size_t>(k));
    if (opts.grammar) {
      masks.assign(static_cast<size_t>((k + 1) * words), 0u);
      k = static_cast<int64_t>(opts.grammar->fill_draft_masks(d.tokens, masks.data()));
      // A row that allows nothing ends the reply: the window stops before it (and the round is the last
      // if it is row 0). GrammarVocabulary requires an EOS id and single-byte tokens, so this is defensive.
      auto empty_row = [&](int64_t r) {
        return std::all_of(masks.begin() + r * words, masks.begin() + (r + 1) * words, [](uint32_t w) { return w == 0; });
      };
      if (empty_row(0)) break;
      for (int64_t r = 1; r <= k; ++r)
        if (empty_row(r)) {
          k = r - 1;
          break;
        }
      d.tokens.resize(static_cast<size_t>(k));
      masks.resize(static_cast<size_t>((k + 1) * words));
    }
    std::vector<int32_t> window(pending);
    window.insert(window.end(), d.tokens.begin(), d.tokens.end());
    logits.resize(static_cast<size_t>((k + 1) * V));
    SequenceStep step{&state, window, k + 1, logits.data()};
    auto t0 = Clock::now();
    TESSERA_TRY(model_.forward({&step, 1}));
    double const fwd = seconds_since(t0);
    st.forward_s += fwd;
    if (x == 1) rule_.observe_cost(k, fwd);

    std::vector<int32_t> choices(static_cast<size_t>(k + 1));
    int64_t a = 0;
    ops::SpecVerifyArgs va;
    va.logits = TensorView<float const, 2>(logits.data(), {k + 1, V});
    va.drafts = TensorView<int32_t const, 1>(d.tokens.data(), {k});
    va.params = opts.sampling;
    va.params.position = L + x;
    if (opts.grammar) va.masks = TensorView<uint32_t const, 2>(masks.data(), {k + 1, words});
    va.prompt_tokens = TensorView<int32_t const, 1>(prompt.data(), {static_cast<int64_t>(prompt.size())});
    va.output_tokens = TensorView<int32_t const, 1>(out.data(), {static_cast<int64_t>(out.size())});
    va.choices = TensorView<int32_t, 1>(choices.data(), {k + 1});
    va.num_accepted = &a;
    ExecContext ctx;
    t0 = Clock::now();
    TESSERA_TRY(ops::spec_verify(ctx, {k, V}, va));
    st.verify_s += seconds_since(t0);

    if (a < k) {
      t0 = Clock::now();
      TESSERA_TRY(model_.truncate(state, L + x + a));
      st.rollback_s += seconds_since(t0);
      ++st.rollbacks;
    }
    if (k > 0) {
      rule_.observe_round(k, a, d.confidence);
      if (drafter_) drafter_->observe(k, a);
    }
    ++st.rounds;
    st.drafted += k;
    st.accepted += a;
    for (int64_t i = 0; i <= a && !done; ++i) {
      int32_t const t = choices[static_cast<size_t>(i)];
      if (opts.grammar && !opts.grammar->accept_token(t))
        return invalid_argument("generate: the grammar rejected its own masked choice " + std::to_string(t));
      out.push_back(t);
      committed.push_back(t);
      ++st.emitted;
      done = (is_eos(t) && !opts.ignore_eos) || (opts.grammar && opts.grammar->is_terminated()) || static_cast<int64_t>(out.size()) >= opts.max_new_tokens ||
             L + x + i + 1 > info.max_context;
    }
    pending.assign(1, out.back());
  }
  // Serial decoding leaves prompt ++ out[0 .. n−1) in the state; an early stop inside a round fed more.
  int64_t const want = L0 + static_cast<int64_t>(prompt.size()) + static_cast<int64_t>(out.size()) - 1;
  if (!out.empty() && state.length() > want) TESSERA_TRY(model_.truncate(state, want));
  if (stats_out) *stats_out = st;
  return out;
}

}  // namespace tessera::model

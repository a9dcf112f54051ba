// SPDX-License-Identifier: Apache-2.0
/// Micro-bench of exact drafting on the tiny golden model (fp32), on the CPU reference model or with
/// `--device cuda` the GPU model: verify-forward cost per window size (k + 1 rows after a 32-token prefix,
/// one sequence and a batch of 8), rollback cost (truncate of the k + 1 rows), and end-to-end tokens a
/// round / speed-up against serial decoding for repetitive (lookup-friendly) and random prompts:
///  * batch 1: the Generator vs the serial loop, with the lookup drafter (fixed depths, adaptive), the
///    k = 0 overhead (Generator with a drafter that never proposes) and an always-right drafter (ceiling);
///  * batch 8: 8 sequences in one forward a round, each with its own drafts, spec_verify and truncate,
///    against the same batched loop without drafts;
///  * DSpark (CPU model only: tiny golden target + seeded synthetic mtp.* weights,
///    verify/draft/dspark_fixture.hpp) at k = 5, 2 and adaptive: random draft weights, so acceptance ≈ 0;
///    the rows measure the pass overhead and the k = 0 path of the depth rule.
/// Every drafted run is checked == serial (exit 3 otherwise); times are the minimum of --reps (3)
/// repetitions. Prints one JSON object per line.
///   bench_draft [--device cpu|cuda] [--reps N] [--tokens N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "tessera/models/common/drafter.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/ops/spec_verify.hpp"
#include "verify/draft/draft_fixture.hpp"
#include "verify/draft/dspark_fixture.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

class NoDrafter final : public model::Drafter {
 public:
  std::string name() const override { return "none"; }
  model::Draft propose(std::span<int32_t const>, int64_t) override { return {}; }
};

/// Greedy speculative decoding of several sequences in one forward a round: each sequence feeds
/// [pending ; its drafts (≤ k, from its own drafter, none when the drafter is null)], spec_verify keeps
/// the agreeing prefix, truncate drops the rest. With no drafters it is batched serial decoding.
/// stats.rounds counts batched forwards; `seq_rounds` the sequences' rounds (a sequence is in a forward
/// until its n tokens are out, so stats.rounds follows the slowest sequence).
std::vector<std::vector<int32_t>> batched_generate(model::LanguageModel& m, std::vector<std::vector<int32_t>> const& prompts,
                                                   std::vector<model::Drafter*> const& drafters, int64_t k, int64_t n,
                                                   model::DraftStats& stats, int64_t& seq_rounds) {
  int64_t const V = m.info().vocab_size;
  size_t const B = prompts.size();
  std::vector<std::unique_ptr<model::SequenceState>> st(B);
  std::vector<std::vector<int32_t>> out(B), committed(prompts), pending(prompts), window(B);
  std::vector<std::vector<float>> logits(B);
  for (auto& s : st) s = m.new_sequence();
  ExecContext ctx;
  for (;;) {
    std::vector<size_t> live;
    std::vector<model::SequenceStep> steps;
    std::vector<int64_t> ks;
    for (size_t i = 0; i < B; ++i) {
      if (static_cast<int64_t>(out[i].size()) >= n) continue;
      int64_t const room = std::min(n - static_cast<int64_t>(out[i].size()) - 1, m.info().max_context - st[i]->length() - static_cast<int64_t>(pending[i].size()));
      model::Draft d;
      if (drafters[i] && room > 0) d = drafters[i]->propose(committed[i], std::min(k, room));
      d.tokens.resize(std::min<size_t>(d.tokens.size(), static_cast<size_t>(std::max<int64_t>(0, std::min(k, room)))));
      window[i] = pending[i];
      window[i].insert(window[i].end(), d.tokens.begin(), d.tokens.end());
      int64_t const ki = static_cast<int64_t>(d.tokens.size());
      logits[i].resize(static_cast<size_t>((ki + 1) * V));
      live.push_back(i);
      ks.push_back(ki);
      steps.push_back({st[i].get(), window[i], ki + 1, logits[i].data()});
    }
    if (live.empty()) break;
    throw_if_error(m.forward(steps));
    ++stats.rounds;
    seq_rounds += static_cast<int64_t>(live.size());
    for (size_t j = 0; j < live.size(); ++j) {
      size_t const i = live[j];
      int64_t const ki = ks[j], L = st[i]->length() - static_cast<int64_t>(window[i].size()), x = static_cast<int64_t>(pending[i].size());
      std::vector<int32_t> choices(static_cast<size_t>(ki + 1));
      int64_t a = 0;
      ops::SpecVerifyArgs va;
      va.logits = TensorView<float const, 2>(logits[i].data(), {ki + 1, V});
      va.drafts = TensorView<int32_t const, 1>(window[i].data() + x, {ki});
      va.params.temperature = 0;
      va.params.position = L + x;
      va.choices = TensorView<int32_t, 1>(choices.data(), {ki + 1});
      va.num_accepted = &a;
      throw_if_error(ops::spec_verify(ctx, {ki, V}, va));
      if (a < ki) {
        auto t0 = Clock::now();
        throw_if_error(m.truncate(*st[i], L + x + a));
        stats.rollback_s += since(t0);
        ++stats.rollbacks;
      }
      if (ki > 0 && drafters[i]) drafters[i]->observe(ki, a);
      stats.drafted += ki;
      stats.accepted += a;
      for (int64_t r = 0; r <= a && static_cast<int64_t>(out[i].size()) < n; ++r) {
        out[i].push_back(choices[static_cast<size_t>(r)]);
        committed[i].push_back(choices[static_cast<size_t>(r)]);
        ++stats.emitted;
      }
      pending[i].assign(1, out[i].back());
    }
  }
  return out;
}

std::string arg(int argc, char** argv, std::string const& name, std::string const& def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) return argv[i + 1];
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  std::string const device = arg(argc, argv, "device", "cpu");
  int const reps = std::max(1, std::stoi(arg(argc, argv, "reps", "3")));
  int64_t const n_new = std::max(2, std::stoi(arg(argc, argv, "tokens", "48")));
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "usage: bench_draft [--device cpu|cuda] [--reps N] [--tokens N]\n");
    return 2;
  }
  std::unique_ptr<model::LanguageModel> gpu;
  if (device == "cuda") {
    model::dsv41::ModelOptions o;
    auto loaded = model::dsv41::load_model_on(verify::tiny_dir("fp32"), o, "cuda");
    if (!loaded) {
      std::fprintf(stderr, "bench_draft: %s\n", loaded.status().message().c_str());
      return 2;
    }
    gpu = std::move(*loaded);
  }
  model::LanguageModel& m = gpu ? *gpu : static_cast<model::LanguageModel&>(verify::tiny_model("fp32"));
  std::printf("{\"case\":\"setup\",\"device\":\"%s\",\"model\":\"golden/v41-tiny/fp32\",\"reps\":%d,\"tokens\":%lld}\n",
              m.info().device.c_str(), reps, static_cast<long long>(n_new));
  int64_t V = m.info().vocab_size;
  auto prefix = verify::corpus_prompt(1, V);
  while (prefix.size() < 32) prefix.push_back(static_cast<int32_t>((prefix.size() * 37) % V));
  prefix.resize(32);
  std::vector<float> lg(static_cast<size_t>(8 * 16 * V));

  // Verify cost per window size and rollback cost, one sequence and a batch of 8.
  for (size_t batch : {size_t{1}, size_t{8}}) {
    std::vector<std::unique_ptr<model::SequenceState>> base;
    for (size_t b = 0; b < batch; ++b) {
      base.push_back(m.new_sequence());
      model::SequenceStep s0{base.back().get(), prefix, 1, lg.data()};
      throw_if_error(m.forward({&s0, 1}));
    }
    int const win_reps = batch == 1 ? 20 : 10;
    double one_row = 0;
    for (int64_t k = 0; k <= 8; ++k) {
      std::vector<int32_t> win(static_cast<size_t>(k + 1), 7);
      double best = 1e9, tr = 1e9;
      for (int r = 0; r < win_reps; ++r) {
        std::vector<std::unique_ptr<model::SequenceState>> st;
        std::vector<model::SequenceStep> steps;
        for (size_t b = 0; b < batch; ++b) {
          st.push_back(m.clone(*base[b]).value_or_throw());
          steps.push_back({st.back().get(), win, k + 1, lg.data() + b * 16 * V});
        }
        auto t0 = Clock::now();
        throw_if_error(m.forward(steps));
        best = std::min(best, since(t0));
        t0 = Clock::now();
        for (auto& s : st) throw_if_error(m.truncate(*s, base[0]->length()));
        tr = std::min(tr, since(t0) / static_cast<double>(batch));
      }
      if (k == 0) one_row = best;
      std::printf("{\"case\":\"verify_window\",\"batch\":%zu,\"k\":%lld,\"rows\":%lld,\"us_min\":%.1f,\"vs_1row\":%.3f,"
                  "\"rollback_%lld_us_min\":%.2f}\n",
                  batch, static_cast<long long>(k), static_cast<long long>(k + 1), best * 1e6, best / one_row,
                  static_cast<long long>(k + 1), tr * 1e6);
    }
  }

  // End to end.
  struct Kind { char const* name; int parity; };
  for (Kind kind : {Kind{"repetitive", 0}, Kind{"random", 1}}) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; prompts.size() < 8; ++i)
      if (i % 2 == kind.parity) prompts.push_back(verify::corpus_prompt(i, V));
    std::vector<std::vector<int32_t>> const batch1(prompts.begin(), prompts.begin() + 6);
    model::GenerateOptions go;
    go.max_new_tokens = n_new;
    go.ignore_eos = true;
    std::vector<std::vector<int32_t>> want;
    double serial_s = 1e9;
    for (int rep = 0; rep < reps; ++rep) {
      double s = 0;
      want.clear();
      for (auto const& p : prompts) {
        auto st = m.new_sequence();
        auto t0 = Clock::now();
        want.push_back(verify::serial_decode(m, *st, p, n_new, go.sampling, true));
        if (want.size() <= batch1.size()) s += since(t0);
      }
      serial_s = std::min(serial_s, s);
    }
    std::printf("{\"case\":\"e2e\",\"batch\":1,\"prompts\":\"%s\",\"drafter\":\"serial_loop\",\"s\":%.4f,\"tok\":%lld}\n", kind.name,
                serial_s, static_cast<long long>(batch1.size() * n_new));
    struct Cfg { std::string name; int64_t k; };
    for (Cfg cfg : {Cfg{"k0_overhead", -2}, Cfg{"lookup", 1}, Cfg{"lookup", 3}, Cfg{"lookup", 5}, Cfg{"lookup", -1},
                    Cfg{"always_right", 3}, Cfg{"always_right", 5}}) {
      model::DraftStats tot;
      double s = 1e9;
      bool exact = true;
      // The lookup drafter is stateless: one Generator for all prompts, so the adaptive rule calibrates
      // its cost table once (outside the timing) and keeps its acceptance estimate across prompts.
      NoDrafter none;
      auto lookup = model::make_lookup_drafter();
      model::DepthPolicy pol;
      pol.fixed_k = cfg.k == -2 ? 5 : cfg.k;
      model::Generator shared(m, cfg.name == "lookup" ? lookup.get() : static_cast<model::Drafter*>(&none), pol);
      if (cfg.k == -1) {
        auto st = m.new_sequence();
        model::GenerateOptions one = go;
        one.max_new_tokens = 1;
        shared.generate(*st, batch1[0], one).value_or_throw();
      }
      for (int rep = 0; rep < reps; ++rep) {
        double sum = 0;
        model::DraftStats rt;
        for (size_t i = 0; i < batch1.size(); ++i) {
          verify::ForcedDrafter right(verify::ForcedDrafter::Mode::kRight, want[i], batch1[i].size(), V);
          model::Generator own(m, &right, pol);
          model::Generator& g = cfg.name == "always_right" ? own : shared;
          auto st = m.new_sequence();
          model::DraftStats ds;
          auto t0 = Clock::now();
          auto got = g.generate(*st, batch1[i], go, &ds).value_or_throw();
          sum += since(t0);
          exact = exact && got == want[i];
          rt.add(ds);
        }
        if (sum < s) { s = sum; tot = rt; }
      }
      std::string const chosen = cfg.k == -1 ? " (cost table " + [&] {
        std::string t;
        for (double c : shared.verify_cost()) t += (t.empty() ? "" : "/") + std::to_string(static_cast<int>(c * 1e6));
        return t + " us)";
      }() : "";
      std::printf("{\"case\":\"e2e\",\"batch\":1,\"prompts\":\"%s\",\"drafter\":\"%s\",\"k\":\"%s%s\",\"exact\":%s,\"s\":%.4f,"
                  "\"speedup\":%.3f,\"tok_per_round\":%.3f,\"acceptance\":%.3f,\"rounds\":%lld,\"rollback_s\":%.5f,"
                  "\"verify_op_s\":%.5f,\"draft_s\":%.5f}\n",
                  kind.name, cfg.name.c_str(), cfg.k == -1 ? "adaptive" : cfg.k == -2 ? "0 (empty drafts)" : std::to_string(cfg.k).c_str(),
                  chosen.c_str(), exact ? "true" : "false", s, serial_s / s, tot.tokens_per_round(), tot.acceptance(),
                  static_cast<long long>(tot.rounds), tot.rollback_s, tot.verify_s, tot.draft_s);
      if (!exact) return 3;
    }
    // Batch 8: one forward a round for all 8 sequences, drafted vs the same loop without drafts.
    {
      model::DraftStats base_stats;
      double base_s = 1e9;
      for (int rep = 0; rep < reps; ++rep) {
        model::DraftStats st;
        int64_t seq_rounds = 0;
        auto t0 = Clock::now();
        auto got = batched_generate(m, prompts, std::vector<model::Drafter*>(prompts.size(), nullptr), 0, n_new, st, seq_rounds);
        base_s = std::min(base_s, since(t0));
        if (got != want) { std::printf("{\"case\":\"e2e\",\"batch\":8,\"exact\":false,\"drafter\":\"serial\"}\n"); return 3; }
        base_stats = st;
      }
      std::printf("{\"case\":\"e2e\",\"batch\":8,\"prompts\":\"%s\",\"drafter\":\"batched_serial\",\"exact\":true,\"s\":%.4f,\"rounds\":%lld,\"tok\":%lld}\n",
                  kind.name, base_s, static_cast<long long>(base_stats.rounds), static_cast<long long>(prompts.size() * n_new));
      for (Cfg cfg : {Cfg{"lookup", 1}, Cfg{"lookup", 3}, Cfg{"lookup", 5}, Cfg{"always_right", 3}, Cfg{"always_right", 5}}) {
        model::DraftStats tot;
        int64_t tot_seq_rounds = 0;
        double s = 1e9;
        bool exact = true;
        for (int rep = 0; rep < reps; ++rep) {
          std::vector<std::unique_ptr<model::Drafter>> owned;
          std::vector<model::Drafter*> ds;
          for (size_t i = 0; i < prompts.size(); ++i) {
            if (cfg.name == "lookup") owned.push_back(model::make_lookup_drafter());
            else owned.push_back(std::make_unique<verify::ForcedDrafter>(verify::ForcedDrafter::Mode::kRight, want[i], prompts[i].size(), V));
            ds.push_back(owned.back().get());
          }
          model::DraftStats st;
          int64_t seq_rounds = 0;
          auto t0 = Clock::now();
          auto got = batched_generate(m, prompts, ds, cfg.k, n_new, st, seq_rounds);
          double const t = since(t0);
          exact = exact && got == want;
          if (t < s) { s = t; tot = st; tot_seq_rounds = seq_rounds; }
        }
        // Tokens a round per sequence: emitted / the sequences' rounds.
        std::printf("{\"case\":\"e2e\",\"batch\":8,\"prompts\":\"%s\",\"drafter\":\"%s\",\"k\":\"%lld\",\"exact\":%s,\"s\":%.4f,"
                    "\"speedup\":%.3f,\"batched_rounds\":%lld,\"tok_per_seq_round\":%.3f,\"acceptance\":%.3f,\"rollback_s\":%.5f}\n",
                    kind.name, cfg.name.c_str(), static_cast<long long>(cfg.k), exact ? "true" : "false", s, base_s / s,
                    static_cast<long long>(tot.rounds), double(tot.emitted) / double(std::max<int64_t>(1, tot_seq_rounds)),
                    tot.acceptance(), tot.rollback_s);
        if (!exact) return 3;
      }
    }
    // DSpark: one drafter per sequence (it reads the sequence's target features); CPU model only.
    if (device != "cpu") {
      std::printf("{\"case\":\"e2e\",\"prompts\":\"%s\",\"drafter\":\"dspark\",\"skipped\":\"the DSpark pass runs on the CPU model only\"}\n", kind.name);
      continue;
    }
    auto& dm = verify::dspark_tiny_model();
    auto cost = model::measure_verify_cost(dm, batch1[0], 5).value_or_throw();
    for (int64_t k : {5, 2, -1}) {
      model::DraftStats tot;
      double s = 1e9;
      bool exact = true;
      model::DepthPolicy pol;
      pol.fixed_k = k;
      for (int rep = 0; rep < reps; ++rep) {
        double sum = 0;
        model::DraftStats rt;
        for (size_t i = 0; i < batch1.size(); ++i) {
          auto st = dm.new_sequence();
          auto drafter = model::dsv41::make_dspark_drafter(dm, static_cast<model::dsv41::Dsv41State const&>(*st));
          model::Generator g(dm, drafter.get(), pol);
          if (k < 0) g.set_verify_cost(cost, false);
          model::DraftStats ds;
          auto t0 = Clock::now();
          auto got = g.generate(*st, batch1[i], go, &ds).value_or_throw();
          sum += since(t0);
          exact = exact && got == want[i];
          rt.add(ds);
        }
        if (sum < s) { s = sum; tot = rt; }
      }
      std::printf("{\"case\":\"e2e\",\"batch\":1,\"prompts\":\"%s\",\"drafter\":\"dspark\",\"k\":\"%s\",\"exact\":%s,\"s\":%.4f,"
                  "\"speedup\":%.3f,\"tok_per_round\":%.3f,\"acceptance\":%.3f,\"rounds\":%lld,\"drafted\":%lld,"
                  "\"draft_s\":%.5f}\n",
                  kind.name, k < 0 ? "adaptive" : std::to_string(k).c_str(), exact ? "true" : "false", s, serial_s / s,
                  tot.tokens_per_round(), tot.acceptance(), static_cast<long long>(tot.rounds),
                  static_cast<long long>(tot.drafted), tot.draft_s);
      if (!exact) return 3;
    }
  }
  return 0;
}

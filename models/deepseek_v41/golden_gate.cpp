// SPDX-License-Identifier: Apache-2.0
/// The golden parity gate (see golden_gate.hpp for the rules and their derivations).
#include "tessera/models/deepseek_v41/golden_gate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera::model::dsv41 {

int64_t argmax_first(float const* v, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[b]) b = i;
  return b;
}

namespace {

struct Top2 {
  int64_t i1 = 0, i2 = 0;
  float v1 = 0, v2 = 0;
};
Top2 top2(float const* v, int64_t n) {
  Top2 t;
  t.i1 = argmax_first(v, n);
  t.v1 = v[t.i1];
  t.i2 = t.i1 == 0 ? 1 : 0;
  for (int64_t i = 0; i < n; ++i)
    if (i != t.i1 && v[i] > v[t.i2]) t.i2 = i;
  t.v2 = v[t.i2];
  return t;
}

/// One bf16 ulp at |x|: 2^(e−7) for x in [2^e, 2^(e+1)).
double bf16_ulp(double x) {
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = m·2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 1 - 7);
}

std::string fmt(char const* f, auto... a) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), f, a...);
  return buf;
}

}  // namespace

std::string GoldenReport::summary_line() const {
  return fmt("golden: %d/%d steps exact, %d near-ties, max_abs_err %.3g, max_rel_err %.3g, cutoff ties met %lld",
             exact, total, near_ties, max_abs_err, max_rel_err, static_cast<long long>(cutoff_ties));
}

Result<GoldenReport> run_golden_gate(Dsv41Model& model, WeightSource const& golden,
                                     std::function<void(std::string const&)> const& log) {
  GoldenGateHooks h;
  h.set_boundary_ulps = [&model](int u) { model.set_boundary_ulps(u); };
  h.ties = [](SequenceState const& s) { return &static_cast<Dsv41State const&>(s).ties(); };
  h.boundaries = [](SequenceState const& s) { return &static_cast<Dsv41State const&>(s).quant_boundaries(); };
  return run_golden_gate(model, model.numerics() == Numerics::kBf16, h, golden, log);
}

Result<GoldenReport> run_golden_gate(LanguageModel& model, bool bf16, GoldenGateHooks const& hooks, WeightSource const& golden,
                                     std::function<void(std::string const&)> const& log) {
  auto say = [&](std::string const& s) { if (log) log(s); };
  GoldenReport rep;
  rep.bf16 = bf16;
  int64_t V = model.info().vocab_size;
  struct P { std::vector<int32_t> prompt, gen; std::vector<float> step, full; };
  std::vector<P> ps;
  for (int i = 0;; ++i) {
    std::string si = std::to_string(i);
    if (!golden.contains("prompt." + si)) break;
    P p;
    for (auto [name, dst] : {std::pair{"prompt.", &p.prompt}, std::pair{"gen_manual.", &p.gen}}) {
      auto t = golden.load_i64(name + si);
      if (!t) return t.status();
      for (int64_t k = 0; k < t->numel(); ++k) dst->push_back(static_cast<int32_t>(t->data_as<int64_t>()[k]));
    }
    for (auto [name, dst] : {std::pair{"step_logits.", &p.step}, std::pair{"full_logits.", &p.full}}) {
      auto t = golden.load_f32(name + si);
      if (!t) return t.status();
      if (t->dim(-1) != V) return malformed(name + si + " has " + std::to_string(t->dim(-1)) + " columns, vocab is " + std::to_string(V));
      dst->assign(t->data_as<float>(), t->data_as<float>() + t->numel());
    }
    if (p.prompt.empty() || p.gen.empty() || p.step.size() != p.gen.size() * V ||
        p.full.size() != (p.prompt.size() + p.gen.size()) * V)
      return malformed("golden prompt " + si + ": inconsistent prompt/gen_manual/step_logits/full_logits shapes");
    ps.push_back(std::move(p));
  }
  if (ps.empty()) return not_found(golden.describe() + ": no prompt.0 in the golden file");

  // The golden's self-consistency: its one-shot path against its cached path.
  for (auto const& p : ps) {
    size_t L = p.prompt.size();
    for (size_t k = 0; k < p.gen.size(); ++k) {
      float const* f = &p.full[(L - 1 + k) * V];
      float const* s = &p.step[k * V];
      rep.self_consistency_agree += argmax_first(f, V) == argmax_first(s, V);
      for (int64_t j = 0; j < V; ++j)
        rep.self_consistency_max_abs = std::max(rep.self_consistency_max_abs, static_cast<double>(std::fabs(f[j] - s[j])));
    }
  }
  rep.logit_tolerance = rep.bf16 ? rep.self_consistency_max_abs : std::max(1e-3, 2 * rep.self_consistency_max_abs);
  auto tie_bound = [&](double v1) { return rep.bf16 ? bf16_ulp(v1) : 1e-3; };

  for (size_t i = 0; i < ps.size(); ++i) {
    P const& p = ps[i];
    GoldenPromptReport pr;
    pr.index = static_cast<int>(i);
    pr.length = static_cast<int64_t>(p.prompt.size());
    pr.steps = static_cast<int>(p.gen.size());
    int64_t L = pr.length, n = pr.steps;
    auto certified = [&](int64_t k, int64_t ours) {
      Top2 g = top2(&p.step[k * V], V);
      bool swap = (ours == g.i2 && p.gen[k] == g.i1);
      return swap && (static_cast<double>(g.v1) - g.v2) <= tie_bound(g.v1);
    };
    for (int64_t k = 0; k < n; ++k) {
      Top2 g = top2(&p.step[k * V], V);
      if (!rep.bf16 && static_cast<double>(g.v1) - g.v2 <= tie_bound(g.v1))
        pr.notes.push_back(fmt("precondition: golden fp32 gap %.3g at step %lld is within the tie bound", g.v1 - g.v2,
                               static_cast<long long>(k)));
    }
    if (!pr.notes.empty()) pr.failures += static_cast<int>(pr.notes.size());

    // (b) Teacher-forced: one forward over prompt + gen[0..n−2], logits of the last n rows; quantiser
    // decisions within 2 ulps of a rounding boundary are recorded to explain divergences.
    {
      struct Restore { GoldenGateHooks const& h; ~Restore() { h.set_boundary_ulps(0); } } restore{hooks};
      hooks.set_boundary_ulps(2);
      auto st = model.new_sequence();
      std::vector<int32_t> toks = p.prompt;
      toks.insert(toks.end(), p.gen.begin(), p.gen.end() - 1);
      std::vector<float> lg(static_cast<size_t>(n * V));
      SequenceStep step{st.get(), toks, n, lg.data()};
      TESSERA_TRY(model.forward({&step, 1}));
      TieCounts const& tc = *hooks.ties(*st);
      for (auto const& b : *hooks.boundaries(*st)) {
        static char const* const kSite[] = {"window-kv fp8", "compressed-kv fp4", "index-key fp4", "index-query fp4"};
        pr.boundary_list += fmt("%sL%d@%lld %s", pr.boundary_list.empty() ? "" : ", ", b.layer,
                                static_cast<long long>(b.position), kSite[static_cast<int>(b.site)]);
        if (pr.first_boundary_position < 0 || b.position < pr.first_boundary_position) pr.first_boundary_position = b.position;
      }
      pr.cutoff_ties = tc.total();
      for (auto [site, label] : {std::pair{CutoffTie::Site::kIndexer, "indexer"},
                                 std::pair{CutoffTie::Site::kCandidateBlocks, "candidate blocks"},
                                 std::pair{CutoffTie::Site::kRouter, "router"}}) {
        std::string part;
        for (auto const& e : tc.events)
          if (e.site == site) part += fmt(" L%d@%lld", e.layer, static_cast<long long>(e.position));
        if (!part.empty()) pr.tie_list += (pr.tie_list.empty() ? "" : "; ") + std::string(label) + part;
      }
      for (int64_t k = 0; k < n; ++k) {
        float const* a = &lg[k * V];
        float const* s = &p.step[k * V];
        float const* f = &p.full[(L - 1 + k) * V];
        double row_abs = 0, row_ref = 0, row_full = 0;
        for (int64_t j = 0; j < V; ++j) {
          row_abs = std::max(row_abs, static_cast<double>(std::fabs(a[j] - s[j])));
          row_ref = std::max(row_ref, static_cast<double>(std::fabs(s[j])));
          row_full = std::max(row_full, static_cast<double>(std::fabs(a[j] - f[j])));
        }
        pr.max_abs_err = std::max(pr.max_abs_err, row_abs);
        pr.max_rel_err = std::max(pr.max_rel_err, row_abs / std::max(row_ref, 1e-30));
        pr.max_abs_err_full = std::max(pr.max_abs_err_full, row_full);
        int64_t ours = argmax_first(a, V);
        if (ours == p.gen[k]) { ++pr.exact; continue; }
        Top2 g = top2(s, V), t = top2(a, V);
        bool ok = certified(k, ours);
        (ok ? pr.near_ties : pr.failures) += 1;
        pr.notes.push_back(fmt("prompt %zu step %lld (position %lld): teacher-forced argmax %lld, golden %d; golden "
                               "top1/top2 gap %.4g (bound %.4g), ours %.4g: %s",
                               i, static_cast<long long>(k), static_cast<long long>(L - 1 + k),
                               static_cast<long long>(ours), p.gen[k], g.v1 - g.v2, tie_bound(g.v1), t.v1 - t.v2,
                               ok ? "certified near-tie" : "FAILURE"));
      }
    }
    // (a) Free-running greedy: prefill, then single-token steps on our own tokens.
    {
      auto st = model.new_sequence();
      std::vector<float> lg(static_cast<size_t>(V));
      std::vector<int32_t> cur = p.prompt;
      for (int64_t k = 0; k < n; ++k) {
        SequenceStep step{st.get(), cur, 1, lg.data()};
        TESSERA_TRY(model.forward({&step, 1}));
        int32_t tok = static_cast<int32_t>(argmax_first(lg.data(), V));
        if (tok != p.gen[k]) {
          pr.greedy_first_divergence = static_cast<int>(k);
          pr.greedy_divergence_certified = rep.bf16 && certified(k, tok);
          Top2 g = top2(&p.step[k * V], V), t = top2(lg.data(), V);
          pr.notes.push_back(fmt("prompt %zu free-running greedy diverges at step %lld: ours %d, golden %d; golden gap "
                                 "%.4g, ours %.4g: %s",
                                 i, static_cast<long long>(k), tok, p.gen[k], g.v1 - g.v2, t.v1 - t.v2,
                                 pr.greedy_divergence_certified ? "certified near-tie (teacher-forced from here)"
                                                                : "FAILURE"));
          if (!pr.greedy_divergence_certified) ++pr.failures;
          break;
        }
        cur.assign(1, tok);
      }
    }
    say(fmt("prompt %d (length %lld): %d/%d teacher-forced exact, %d near-ties, greedy %s, max_abs_err %.3g "
            "(vs full_logits %.3g), cutoff ties %lld",
            pr.index, static_cast<long long>(pr.length), pr.exact, pr.steps, pr.near_ties,
            pr.greedy_first_divergence < 0 ? "equal" : ("diverges at step " + std::to_string(pr.greedy_first_divergence)).c_str(),
            pr.max_abs_err, pr.max_abs_err_full, static_cast<long long>(pr.cutoff_ties)));
    if (!pr.tie_list.empty()) say("  cutoff ties (layer@position): " + pr.tie_list);
    if (!pr.boundary_list.empty())
      say("  quantiser inputs within 2 ulps (of the block absmax) of a rounding boundary (layer@position): " +
          pr.boundary_list);
    for (auto const& nline : pr.notes) say("  " + nline);
    rep.exact += pr.exact;
    rep.total += pr.steps;
    rep.near_ties += pr.near_ties;
    rep.failures += pr.failures;
    rep.max_abs_err = std::max(rep.max_abs_err, pr.max_abs_err);
    rep.max_rel_err = std::max(rep.max_rel_err, pr.max_rel_err);
    rep.cutoff_ties += pr.cutoff_ties;
    rep.prompts.push_back(std::move(pr));
  }
  if (rep.failures > 0) rep.reasons.push_back(std::to_string(rep.failures) + " uncertified disagreement(s)");
  if (rep.max_abs_err > rep.logit_tolerance)
    rep.reasons.push_back(fmt("max_abs_err %.4g exceeds the tolerance %.4g", rep.max_abs_err, rep.logit_tolerance));
  if (rep.bf16 && rep.exact < rep.self_consistency_agree)
    rep.reasons.push_back(fmt("top-1 agreement %d below the golden's own %d", rep.exact, rep.self_consistency_agree));
  if (!rep.bf16 && rep.near_ties > 0) rep.reasons.push_back("fp32 requires every token equal");
  rep.pass = rep.reasons.empty();
  say(fmt("golden self-consistency: %d/%d argmax agree, max |full - step| %.4g; logit tolerance %.4g",
          rep.self_consistency_agree, rep.total, rep.self_consistency_max_abs, rep.logit_tolerance));
  return rep;
}

}  // namespace tessera::model::dsv41

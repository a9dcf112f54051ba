// SPDX-License-Identifier: Apache-2.0
/// The drafted == serial gate of the invariance suite (invariance.hpp): speculative decoding through
/// model::Generator must give the serial reply and leave the sequence in the serial state, whatever the
/// drafter proposes. For every prompt (the suite's random prompts and a repetitive one, where lookup
/// drafts get accepted) and every drafter — prompt lookup at fixed depths 1, 3, 5 and with the depth
/// rule, DSpark when the model has its weights, and three oracles that know the serial reply (always
/// right, always wrong, right with probability 1/2) — the reply ids must equal the serial ones and the
/// logits of one more step (the serial reply's last token fed to both states) must be bit-identical; the
/// same for seeded T > 0 sampling with the lookup drafter. The evidence gives rounds, drafted and
/// accepted tokens per drafter.
#include <cstring>
#include <random>

#include "tessera/models/common/drafter.hpp"
#include "verify/harness/invariance.hpp"

namespace tessera::harness {
namespace {

/// Proposes from the serial reply: its continuation (kRight), that continuation + 1 (kWrong), or each
/// token right with probability 1/2 and a seeded random id otherwise (kRandom).
class OracleDrafter final : public model::Drafter {
 public:
  enum class Mode { kRight, kWrong, kRandom };
  OracleDrafter(std::vector<int32_t> truth, size_t prompt_len, Mode mode, int64_t vocab, uint64_t seed)
      : truth_(std::move(truth)), prompt_len_(prompt_len), mode_(mode), vocab_(vocab), rng_(seed) {}
  std::string name() const override {
    return mode_ == Mode::kRight ? "always-right" : mode_ == Mode::kWrong ? "always-wrong" : "random";
  }
  model::Draft propose(std::span<int32_t const> committed, int64_t max_k) override {
    model::Draft d;
    size_t const at = committed.size() - prompt_len_;  // reply tokens emitted so far
    for (int64_t i = 0; i < max_k; ++i) {
      size_t const j = at + static_cast<size_t>(i);
      int32_t x = j < truth_.size() ? truth_[j] : 0;
      if (mode_ == Mode::kWrong) x = static_cast<int32_t>((x + 1) % vocab_);
      if (mode_ == Mode::kRandom && (rng_() & 1)) x = static_cast<int32_t>(rng_() % static_cast<uint64_t>(vocab_));
      d.tokens.push_back(x);
      d.confidence.push_back(-1.f);
    }
    return d;
  }

 private:
  std::vector<int32_t> truth_;
  size_t prompt_len_;
  Mode mode_;
  int64_t vocab_;
  std::mt19937_64 rng_;
};

struct Run {
  std::vector<int32_t> out;
  std::vector<float> next;  // logits after feeding out.back()
  int64_t length = 0;       // state length after generate
  model::DraftStats stats;
};

Result<Run> generate(model::LanguageModel& m, std::vector<int32_t> const& prompt, model::Drafter* drafter,
                     int64_t fixed_k, model::GenerateOptions const& go) {
  Run r;
  auto st = m.new_sequence();
  model::DepthPolicy pol;
  pol.fixed_k = fixed_k;
  model::Generator g(m, drafter, pol);
  // A fixed cost table (verify cost grows 10% per drafted row) keeps the depth rule's choices a function
  // of the acceptance history only, not of timings.
  g.set_verify_cost({1.0, 1.1, 1.2, 1.3, 1.4, 1.5}, true);
  auto out = g.generate(*st, prompt, go, &r.stats);
  if (!out.ok()) return out.status();
  r.out = std::move(*out);
  r.length = st->length();
  if (!r.out.empty()) {
    r.next.resize(static_cast<size_t>(m.info().vocab_size));
    int32_t const last = r.out.back();
    model::SequenceStep s{st.get(), std::span<int32_t const>(&last, 1), 1, r.next.data()};
    TESSERA_TRY(m.forward({&s, 1}));
  }
  return r;
}

std::string head(std::vector<int32_t> const& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + (v.size() > 6 ? ",…]" : "]");
}

}  // namespace

GateResult drafted_serial_gate(model::LanguageModel& m, std::vector<std::vector<int32_t>> prompts,
                               InvarianceOptions const& opt) {
  GateResult g{"drafted == serial (lookup k=1/3/5/adaptive, DSpark, oracles right/wrong/random; greedy and T>0)",
               Verdict::kSkip, {}};
  int64_t const vocab = m.info().vocab_size;
  int64_t const ctx = m.info().max_context > 0 ? m.info().max_context : (int64_t{1} << 30);
  {  // a repetitive prompt: a 9-token phrase four times
    std::vector<int32_t> rep;
    std::mt19937_64 rng(opt.prompt_seed + 17);
    std::vector<int32_t> phrase(9);
    for (auto& t : phrase) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    for (int i = 0; i < 4; ++i) rep.insert(rep.end(), phrase.begin(), phrase.end());
    if (static_cast<int64_t>(rep.size()) + opt.decode_tokens + 16 < ctx) prompts.push_back(std::move(rep));
  }
  bool all = true, any = false;
  model::DraftStats total;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto const& p = prompts[i];
    for (bool sampled : {false, true}) {
      model::GenerateOptions go;
      go.max_new_tokens = opt.decode_tokens;
      go.ignore_eos = true;
      if (sampled) {
        go.sampling.temperature = opt.temperature;
        go.sampling.top_p = opt.top_p;
        go.sampling.seed = opt.sample_seed;
      }
      auto serial = generate(m, p, nullptr, 0, go);
      if (!serial.ok()) {
        g.verdict = Verdict::kFail;
        g.evidence.push_back("prompt " + std::to_string(i) + ": serial run failed: " + serial.status().to_string());
        return g;
      }
      struct Case {
        std::string name;
        std::unique_ptr<model::Drafter> d;
        int64_t k;
      };
      std::vector<Case> cases;
      for (int64_t k : {1, 3, 5}) cases.push_back({"lookup k=" + std::to_string(k), model::make_lookup_drafter(), k});
      cases.push_back({"lookup adaptive", model::make_lookup_drafter(), -1});
      if (!sampled) {
        using M = OracleDrafter::Mode;
        cases.push_back({"always-right k=4", std::make_unique<OracleDrafter>(serial->out, p.size(), M::kRight, vocab, 1), 4});
        cases.push_back({"always-wrong k=3", std::make_unique<OracleDrafter>(serial->out, p.size(), M::kWrong, vocab, 2), 3});
        cases.push_back({"random k=5", std::make_unique<OracleDrafter>(serial->out, p.size(), M::kRandom, vocab, 3 + i), 5});
      }
      std::string line = "prompt " + std::to_string(i) + " (" + std::to_string(p.size()) + " tokens, " +
                         (sampled ? "T=" + std::to_string(opt.temperature).substr(0, 4) + " seed " + std::to_string(opt.sample_seed)
                                  : std::string("greedy")) + "): serial " + head(serial->out) + ";";
      bool ok = true;
      auto check = [&](std::string const& name, Run const& r) {
        bool const same_out = r.out == serial->out;
        bool const same_state = r.length == serial->length && r.next.size() == serial->next.size() &&
                                std::memcmp(r.next.data(), serial->next.data(), r.next.size() * sizeof(float)) == 0;
        line += " " + name + " " + std::to_string(r.stats.rounds) + " rounds " + std::to_string(r.stats.accepted) + "/" +
                std::to_string(r.stats.drafted) + " accepted" + (same_out ? "" : " REPLY DIFFERS " + head(r.out)) +
                (same_state ? "" : " STATE DIFFERS") + ";";
        ok = ok && same_out && same_state;
        total.add(r.stats);
        any = true;
      };
      for (auto& c : cases) {
        auto r = generate(m, p, c.d.get(), c.k, go);
        if (!r.ok()) {
          line += " " + c.name + " FAILED: " + r.status().to_string() + ";";
          ok = false;
          continue;
        }
        check(c.name, *r);
      }
      if (opt.dspark) {  // the drafter reads the target's own sequence state: build it per run
        auto st = m.new_sequence();
        auto d = opt.dspark(*st);
        if (d) {
          model::DepthPolicy pol;
          pol.fixed_k = 5;
          model::Generator gen(m, d.get(), pol);
          Run r;
          auto out = gen.generate(*st, p, go, &r.stats);
          if (!out.ok()) {
            line += " dspark FAILED: " + out.status().to_string() + ";";
            ok = false;
          } else {
            r.out = std::move(*out);
            r.length = st->length();
            r.next.resize(static_cast<size_t>(vocab));
            int32_t const last = r.out.back();
            model::SequenceStep s{st.get(), std::span<int32_t const>(&last, 1), 1, r.next.data()};
            if (Status fs = m.forward({&s, 1}); !fs.ok()) {
              line += " dspark FAILED: " + fs.to_string() + ";";
              ok = false;
            } else {
              check("dspark k=5", r);
            }
          }
        }
      }
      g.evidence.push_back(line);
      all = all && ok;
    }
  }
  if (!opt.dspark) g.evidence.push_back("DSpark not run: the model has no DSpark weights (mtp.*)");
  g.evidence.push_back("in all: " + std::to_string(total.rounds) + " rounds, " + std::to_string(total.accepted) + "/" +
                       std::to_string(total.drafted) + " drafted tokens accepted, " + std::to_string(total.rollbacks) +
                       " rollbacks; every reply and next-step logits row compared bitwise with the serial run");
  g.verdict = !any ? Verdict::kSkip : all ? Verdict::kPass : Verdict::kFail;
  return g;
}

}  // namespace tessera::harness

// SPDX-License-Identifier: Apache-2.0
/// Invariance suite (see invariance.hpp). A `Live` sequence is driven step by step: prefill chunks
/// (one logits row each, used only when the chunk ends the prompt), then one token a step; every logits
/// row that picks a token is kept, so two runs are compared bitwise row by row.
#include "verify/harness/invariance.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include <boost/json.hpp>

#include "servers/openai/http/sha256.hpp"
#include "tessera/ops/sampling.hpp"

namespace tessera::harness {

char const* to_string(Verdict v) { return v == Verdict::kPass ? "PASS" : v == Verdict::kFail ? "FAIL" : "SKIP"; }

namespace {

struct Live {
  std::vector<int32_t> prompt;
  int64_t chunk = 0;            // 0 = whole prompt
  int64_t start_step = 0;       // joins the batch at this step
  int64_t want = 0;             // tokens to generate
  float temperature = 0, top_p = 1;
  uint64_t seed = 0;
  std::unique_ptr<model::SequenceState> st;
  size_t fed = 0;
  std::vector<int32_t> out;
  std::vector<float> rows;      // [out.size(), V]
  bool done() const { return static_cast<int64_t>(out.size()) >= want; }
};

Status pick(Live& l, float const* row, int64_t vocab) {
  ops::SamplingRowParams p;
  p.temperature = l.temperature;
  p.top_p = l.top_p;
  p.seed = l.seed;
  p.position = static_cast<int64_t>(l.prompt.size() + l.out.size());
  int32_t token = -1;
  ops::SampleDesc d{1, vocab, 0, ops::LogprobMode::kRaw};
  ops::SampleArgs a;
  a.logits = TensorView<float const, 2>(row, {1, vocab});
  a.params = TensorView<ops::SamplingRowParams const, 1>(&p, {1});
  a.tokens = TensorView<int32_t, 1>(&token, {1});
  ExecContext ctx;
  TESSERA_TRY(ops::sample(ctx, d, a));
  l.rows.insert(l.rows.end(), row, row + vocab);
  l.out.push_back(token);
  return {};
}

// Runs every sequence to completion; sequences share each forward from their start step on.
Status run(model::LanguageModel& m, std::vector<Live*> const& seqs) {
  int64_t const v = m.info().vocab_size;
  for (Live* l : seqs) if (!l->st) l->st = m.new_sequence();
  for (int64_t step = 0;; ++step) {
    std::vector<Live*> active;
    bool pending = false;
    for (Live* l : seqs) {
      if (l->done()) continue;
      pending = true;
      if (step >= l->start_step) active.push_back(l);
    }
    if (!pending) return {};
    if (active.empty()) continue;
    std::vector<model::SequenceStep> batch(active.size());
    std::vector<std::vector<float>> logits(active.size(), std::vector<float>(static_cast<size_t>(v)));
    std::vector<std::vector<int32_t>> toks(active.size());
    for (size_t i = 0; i < active.size(); ++i) {
      Live& l = *active[i];
      if (l.fed < l.prompt.size()) {
        size_t n = l.chunk <= 0 ? l.prompt.size() - l.fed : std::min<size_t>(static_cast<size_t>(l.chunk), l.prompt.size() - l.fed);
        toks[i].assign(l.prompt.begin() + static_cast<long>(l.fed), l.prompt.begin() + static_cast<long>(l.fed + n));
      } else {
        toks[i] = {l.out.back()};
      }
      batch[i] = model::SequenceStep{l.st.get(), toks[i], 1, logits[i].data()};
    }
    TESSERA_TRY(m.forward(batch));
    for (size_t i = 0; i < active.size(); ++i) {
      Live& l = *active[i];
      bool prefill = l.fed < l.prompt.size();
      if (prefill) l.fed += toks[i].size();
      if (!prefill || l.fed == l.prompt.size()) TESSERA_TRY(pick(l, logits[i].data(), v));
    }
  }
}

struct Cmp {
  bool equal = true;
  std::string detail;
};

// Bitwise comparison of two runs: tokens, then logits rows.
Cmp compare(Live const& ref, Live const& got, int64_t vocab) {
  Cmp c;
  for (size_t i = 0; i < std::min(ref.out.size(), got.out.size()); ++i)
    if (ref.out[i] != got.out[i]) {
      c.equal = false;
      c.detail = "token " + std::to_string(i) + ": " + std::to_string(got.out[i]) + " vs reference " + std::to_string(ref.out[i]);
      break;
    }
  if (c.equal && ref.out.size() != got.out.size()) {
    c.equal = false;
    c.detail = "reply lengths " + std::to_string(got.out.size()) + " vs " + std::to_string(ref.out.size());
  }
  size_t rows = std::min(ref.rows.size(), got.rows.size());
  for (size_t k = 0; k < rows; ++k) {
    uint32_t a, b;
    std::memcpy(&a, &ref.rows[k], 4);
    std::memcpy(&b, &got.rows[k], 4);
    if (a == b) continue;
    double maxd = 0;
    size_t r = k / static_cast<size_t>(vocab);
    for (size_t j = r * static_cast<size_t>(vocab); j < std::min(rows, (r + 1) * static_cast<size_t>(vocab)); ++j)
      maxd = std::max(maxd, std::abs(static_cast<double>(ref.rows[j]) - got.rows[j]));
    c.equal = false;
    c.detail += (c.detail.empty() ? "" : "; ") + std::string("logits row ") + std::to_string(r) + " differs (first at vocab " +
                std::to_string(k % static_cast<size_t>(vocab)) + ", max |diff| " + std::to_string(maxd) + ")";
    break;
  }
  return c;
}

std::string reply_hash(std::vector<int32_t> const& ids) {
  std::string bytes(reinterpret_cast<char const*>(ids.data()), ids.size() * sizeof(int32_t));
  return server::to_hex(server::sha256(bytes)).substr(0, 16);
}

std::string ids_head(std::vector<int32_t> const& ids, size_t n = 6) {
  std::string s;
  for (size_t i = 0; i < std::min(n, ids.size()); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s + (ids.size() > n ? " …" : "");
}

void verdict(GateResult& g, bool ok, std::string line) {
  if (!ok) g.verdict = Verdict::kFail;
  else if (g.verdict == Verdict::kSkip) g.verdict = Verdict::kPass;
  g.evidence.push_back((ok ? "" : "MISMATCH ") + std::move(line));
}

void error(GateResult& g, Status const& s) {
  g.verdict = Verdict::kFail;
  g.evidence.push_back("error: " + s.message());
}

// Graph == eager: with the model's graph mode on, each prompt alone (one-shot prefill, greedy) and all of them
// staggered (sequence i joins at step 2i, chunks of 64) against the eager references `ref`.
GateResult graph_gate(model::LanguageModel& m, std::vector<std::vector<int32_t>> const& prompts,
                      std::vector<std::unique_ptr<Live>> const& ref, InvarianceOptions const& opt) {
  GateResult g{"graph == eager", Verdict::kSkip, {}};
  if (!opt.set_graphs) {
    g.evidence.push_back("SKIP: the model has no CUDA-graph mode");
    return g;
  }
  if (Status on = opt.set_graphs(true); !on.ok()) {
    g.evidence.push_back("SKIP: " + on.message());
    return g;
  }
  int64_t const vocab = m.info().vocab_size;
  auto make = [&](size_t i, int64_t chunk) {
    auto l = std::make_unique<Live>();
    l->prompt = prompts[i];
    l->chunk = chunk;
    l->want = opt.decode_tokens;
    return l;
  };
  for (size_t i = 0; i < prompts.size() && g.verdict != Verdict::kFail; ++i) {
    auto l = make(i, 0);
    if (Status s = run(m, {l.get()}); !s.ok()) { error(g, s); break; }
    Cmp cmp = compare(*ref[i], *l, vocab);
    verdict(g, cmp.equal, "alone, prompt " + std::to_string(i) + ": " +
                              (cmp.equal ? "tokens and " + std::to_string(l->out.size()) + " logits rows equal" : cmp.detail));
  }
  if (g.verdict != Verdict::kFail) {
    std::vector<std::unique_ptr<Live>> ls;
    std::vector<Live*> ptrs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ls.push_back(make(i, 64));
      ls.back()->start_step = 2 * static_cast<int64_t>(i);
      ptrs.push_back(ls.back().get());
    }
    if (Status s = run(m, ptrs); !s.ok()) {
      error(g, s);
    } else {
      for (size_t i = 0; i < prompts.size(); ++i) {
        Cmp cmp = compare(*ref[i], *ls[i], vocab);
        verdict(g, cmp.equal, "staggered (joins at step " + std::to_string(2 * i) + ", chunk 64), prompt " + std::to_string(i) +
                                  ": " + (cmp.equal ? "tokens and logits equal" : cmp.detail));
      }
    }
  }
  if (opt.graph_counts) {
    bool replayed = false;
    std::string const counts = opt.graph_counts(&replayed);
    verdict(g, replayed, "executable graphs: " + counts + (replayed ? "" : " (none replayed after an update)"));
  }
  if (Status off = opt.set_graphs(false); !off.ok()) error(g, off);
  return g;
}

}  // namespace

std::vector<GateResult> run_invariance(model::LanguageModel& m, InvarianceOptions const& opt) {
  int64_t const vocab = m.info().vocab_size;
  int64_t const ctx = m.info().max_context > 0 ? m.info().max_context : (int64_t{1} << 30);
  std::mt19937_64 rng(opt.prompt_seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : opt.prompt_lengths) {
    len = std::min<int64_t>(len, ctx - opt.decode_tokens - 8);
    if (len < 1) continue;
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& t : p) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    prompts.push_back(std::move(p));
  }
  auto make = [&](size_t i, int64_t chunk = 0, bool sampled = false, uint64_t seed = 0) {
    auto l = std::make_unique<Live>();
    l->prompt = prompts[i];
    l->chunk = chunk;
    l->want = opt.decode_tokens;
    if (sampled) { l->temperature = opt.temperature; l->top_p = opt.top_p; l->seed = seed; }
    return l;
  };
  std::vector<GateResult> gates;
  // The references and every other gate run eagerly; graph == eager switches the graph mode on for itself.
  if (opt.set_graphs)
    if (Status off = opt.set_graphs(false); !off.ok()) {
      GateResult g{"graph mode off for the references", Verdict::kFail, {}};
      error(g, off);
      gates.push_back(g);
      return gates;
    }

  // References: each prompt alone, one-shot prefill, greedy.
  std::vector<std::unique_ptr<Live>> ref;
  GateResult chunking{"prefill chunk sizes (1, 7, 64, 512, all) == one-shot", Verdict::kSkip, {}};
  for (size_t i = 0; i < prompts.size(); ++i) {
    ref.push_back(make(i));
    if (Status s = run(m, {ref.back().get()}); !s.ok()) { error(chunking, s); gates.push_back(chunking); return gates; }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string line = "prompt " + std::to_string(i) + " (" + std::to_string(prompts[i].size()) + " tokens): first token " +
                       std::to_string(ref[i]->out[0]) + ", reply hash " + reply_hash(ref[i]->out) + "; chunks";
    bool ok = true;
    for (int64_t c : opt.chunk_sizes) {
      if (c <= 0) continue;
      if (c >= static_cast<int64_t>(prompts[i].size())) {
        line += " " + std::to_string(c) + ":=one-shot";
        continue;
      }
      auto l = make(i, c);
      if (Status s = run(m, {l.get()}); !s.ok()) { error(chunking, s); ok = false; break; }
      Cmp cmp = compare(*ref[i], *l, vocab);
      line += " " + std::to_string(c) + (cmp.equal ? ":equal" : ":DIFFERENT (" + cmp.detail + ")");
      ok = ok && cmp.equal;
    }
    verdict(chunking, ok, line + " (" + std::to_string(ref[i]->out.size()) + " logits rows bitwise)");
  }
  gates.push_back(chunking);

  // Batched == alone: all together from step 0, and staggered (sequence i joins at step 2i).
  GateResult batched{"batched == alone", Verdict::kSkip, {}};
  for (int stagger : {0, 2}) {
    std::vector<std::unique_ptr<Live>> ls;
    std::vector<Live*> ptrs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ls.push_back(make(i, stagger ? 64 : 0));
      ls.back()->start_step = stagger * static_cast<int64_t>(i);
      ptrs.push_back(ls.back().get());
    }
    if (Status s = run(m, ptrs); !s.ok()) { error(batched, s); break; }
    for (size_t i = 0; i < prompts.size(); ++i) {
      Cmp cmp = compare(*ref[i], *ls[i], vocab);
      verdict(batched, cmp.equal, std::string(stagger ? "staggered (joins at step " + std::to_string(2 * i) + ", chunk 64)" : "batch of " + std::to_string(prompts.size())) +
                                      ", prompt " + std::to_string(i) + ": " + (cmp.equal ? "tokens and logits equal, hash " + reply_hash(ls[i]->out) : cmp.detail));
    }
  }
  gates.push_back(batched);

  // Snapshot/restore and rollback.
  GateResult restore{"snapshot/restore (clone, truncate) == fresh", Verdict::kSkip, {}};
  for (size_t i = 0; i < prompts.size() && restore.verdict != Verdict::kFail; ++i) {
    size_t const n = prompts[i].size();
    // Mid-prompt clone.
    if (n >= 2) {
      auto base = make(i);
      base->st = m.new_sequence();
      size_t k = n / 2;
      std::vector<float> scratch(static_cast<size_t>(vocab));
      std::vector<int32_t> head(prompts[i].begin(), prompts[i].begin() + static_cast<long>(k));
      model::SequenceStep st{base->st.get(), head, 1, scratch.data()};
      if (Status s = m.forward(std::span(&st, 1)); !s.ok()) { error(restore, s); break; }
      base->fed = k;
      auto c = m.clone(*base->st);
      if (!c.ok()) {
        restore.evidence.push_back(std::string("clone: ") + (c.status().code() == StatusCode::kNotSupported ? "not supported by the model" : c.status().message()));
        if (c.status().code() != StatusCode::kNotSupported) restore.verdict = Verdict::kFail;
        break;
      }
      auto copy = make(i);
      copy->st = std::move(*c);
      copy->fed = k;
      if (Status s = run(m, {copy.get(), base.get()}); !s.ok()) { error(restore, s); break; }
      Cmp a = compare(*ref[i], *copy, vocab), b = compare(*ref[i], *base, vocab);
      verdict(restore, a.equal && b.equal, "prompt " + std::to_string(i) + ": clone after " + std::to_string(k) + "/" + std::to_string(n) +
                                               " prompt tokens: copy " + (a.equal ? "equal" : a.detail) + ", original " + (b.equal ? "equal" : b.detail));
    }
    // Mid-reply clone.
    {
      auto base = make(i);
      base->want = opt.decode_tokens / 2;
      if (Status s = run(m, {base.get()}); !s.ok()) { error(restore, s); break; }
      auto c = m.clone(*base->st);
      if (!c.ok()) break;
      auto copy = make(i);
      copy->st = std::move(*c);
      copy->fed = n;
      copy->out = base->out;
      copy->rows = base->rows;
      base->want = copy->want = opt.decode_tokens;
      if (Status s = run(m, {base.get(), copy.get()}); !s.ok()) { error(restore, s); break; }
      Cmp a = compare(*ref[i], *copy, vocab), b = compare(*ref[i], *base, vocab);
      verdict(restore, a.equal && b.equal, "prompt " + std::to_string(i) + ": clone after " + std::to_string(opt.decode_tokens / 2) +
                                               " reply tokens, both continued: copy " + (a.equal ? "equal" : a.detail) + ", original " + (b.equal ? "equal" : b.detail));
    }
    // Rollback: the prompt plus 5 extra tokens, truncated back to the prompt less one, then resumed.
    {
      auto l = make(i);
      l->st = m.new_sequence();
      std::vector<int32_t> extended = prompts[i];
      for (int j = 0; j < 5; ++j) extended.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
      std::vector<float> scratch(static_cast<size_t>(vocab));
      model::SequenceStep st{l->st.get(), extended, 1, scratch.data()};
      if (Status s = m.forward(std::span(&st, 1)); !s.ok()) { error(restore, s); break; }
      Status t = m.truncate(*l->st, static_cast<int64_t>(n - 1));
      if (t.code() == StatusCode::kNotSupported) {
        if (i == 0) restore.evidence.push_back("truncate: SKIP (not supported by the model)");
        continue;
      }
      if (!t.ok()) { error(restore, t); break; }
      l->fed = n - 1;
      if (Status s = run(m, {l.get()}); !s.ok()) { error(restore, s); break; }
      Cmp a = compare(*ref[i], *l, vocab);
      verdict(restore, a.equal, "prompt " + std::to_string(i) + ": +5 tokens, truncate to " + std::to_string(n - 1) + ", resume: " + (a.equal ? "equal" : a.detail));
    }
  }
  gates.push_back(restore);

  // Keyed sampling.
  GateResult keyed{"keyed sampling reproducible (T=" + std::to_string(opt.temperature).substr(0, 4) + ", top_p=" +
                       std::to_string(opt.top_p).substr(0, 4) + ", seed " + std::to_string(opt.sample_seed) + ")", Verdict::kSkip, {}};
  {
    std::vector<std::unique_ptr<Live>> first, again, batch;
    std::vector<Live*> bp;
    bool ok = true;
    for (size_t i = 0; i < prompts.size() && ok; ++i) {
      first.push_back(make(i, 0, true, opt.sample_seed));
      again.push_back(make(i, 7, true, opt.sample_seed));
      batch.push_back(make(i, 64, true, opt.sample_seed));
      bp.push_back(batch.back().get());
      if (Status s = run(m, {first.back().get()}); !s.ok()) { error(keyed, s); ok = false; }
      else if (Status s2 = run(m, {again.back().get()}); !s2.ok()) { error(keyed, s2); ok = false; }
    }
    if (ok) {
      if (Status s = run(m, bp); !s.ok()) { error(keyed, s); ok = false; }
    }
    for (size_t i = 0; ok && i < prompts.size(); ++i) {
      Cmp a = compare(*first[i], *again[i], vocab), b = compare(*first[i], *batch[i], vocab);
      auto other = make(i, 0, true, opt.sample_seed + 1);
      std::string contrast;
      if (run(m, {other.get()}).ok())
        contrast = other->out == first[i]->out ? "; seed+1 gives the same reply (low-entropy prompt)" : "; seed+1 differs (" + ids_head(other->out) + ")";
      bool greedy_same = first[i]->out == ref[i]->out;
      verdict(keyed, a.equal && b.equal, "prompt " + std::to_string(i) + ": sampled " + ids_head(first[i]->out) + ", hash " + reply_hash(first[i]->out) +
                                              "; rerun (chunk 7) " + (a.equal ? "equal" : a.detail) + "; batched (chunk 64) " + (b.equal ? "equal" : b.detail) +
                                              contrast + (greedy_same ? "; equals the greedy reply" : ""));
    }
  }
  gates.push_back(keyed);

  gates.push_back(drafted_serial_gate(m, prompts, opt));
  gates.push_back(graph_gate(m, prompts, ref, opt));
  return gates;
}

std::string invariance_text(std::vector<GateResult> const& gates) {
  std::string o;
  int pass = 0, fail = 0, skip = 0;
  for (auto const& g : gates) {
    o += std::string(to_string(g.verdict)) + "  " + g.name + "\n";
    for (auto const& e : g.evidence) o += "      " + e + "\n";
    (g.verdict == Verdict::kPass ? pass : g.verdict == Verdict::kFail ? fail : skip)++;
  }
  o += std::to_string(pass) + " passed, " + std::to_string(fail) + " failed, " + std::to_string(skip) + " skipped\n";
  return o;
}

std::string invariance_jsonl(std::vector<GateResult> const& gates) {
  std::string o;
  for (auto const& g : gates) {
    boost::json::array ev;
    for (auto const& e : g.evidence) ev.push_back(boost::json::string(e));
    o += boost::json::serialize(boost::json::object{{"gate", g.name}, {"verdict", to_string(g.verdict)}, {"evidence", std::move(ev)}}) + "\n";
  }
  return o;
}

}  // namespace tessera::harness

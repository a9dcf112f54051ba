// SPDX-License-Identifier: Apache-2.0
/// The invariance suite on the stub model (every gate that runs passes; graph == eager is SKIP, never
/// PASS) and on models with planted faults (PerturbedModel): each fault fails the gate meant to catch
/// it, with evidence naming the mismatch.
#include <boost/test/unit_test.hpp>

#include "servers/openai/engine/stub_model.hpp"
#include "verify/harness/invariance.hpp"
#include "verify/harness/perturbed_model.hpp"

namespace th = tessera::harness;

namespace {

tessera::server::StubModelConfig stub_config() {
  tessera::server::StubModelConfig sc;
  for (int t = 32; t < 127; ++t) sc.allowed_tokens.push_back(t);
  return sc;
}

th::InvarianceOptions small() {
  th::InvarianceOptions o;
  o.prompt_lengths = {5, 37, 130, 600};
  o.decode_tokens = 12;
  return o;
}

th::GateResult const& gate(std::vector<th::GateResult> const& g, std::string const& prefix) {
  for (auto const& x : g) if (x.name.rfind(prefix, 0) == 0) return x;
  BOOST_FAIL("no gate " + prefix);
  return g.front();
}

bool any_evidence(th::GateResult const& g, std::string const& needle) {
  for (auto const& e : g.evidence) if (e.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(stub_model_passes_every_gate_that_runs) {
  tessera::server::StubModel m(stub_config());
  auto gates = th::run_invariance(m, small());
  BOOST_TEST_MESSAGE(th::invariance_text(gates));
  BOOST_TEST(gate(gates, "prefill chunk").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "batched").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "snapshot").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "keyed sampling").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "drafted").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "graph").verdict == th::Verdict::kSkip);
  // Every drafter ran on every prompt: the oracles accept all (right) and nothing (wrong).
  BOOST_TEST(gate(gates, "drafted").evidence.size() == 2 * 5u + 2u);  // 5 prompts × greedy/T>0, DSpark, totals
  BOOST_TEST(any_evidence(gate(gates, "drafted"), "always-right k=4 3 rounds 9/9 accepted"));
  BOOST_TEST(any_evidence(gate(gates, "drafted"), "always-wrong k=3 12 rounds 0/"));
  BOOST_TEST(any_evidence(gate(gates, "drafted"), "DSpark not run"));
  // Evidence: every prompt and every chunk size that differs from one-shot was compared.
  auto const& c = gate(gates, "prefill chunk");
  BOOST_TEST(c.evidence.size() == 4u);
  BOOST_TEST(any_evidence(c, "(600 tokens)"));
  BOOST_TEST(any_evidence(c, "512:equal"));
  BOOST_TEST(any_evidence(c, "1:equal 7:equal 64:equal"));
  BOOST_TEST(gate(gates, "batched").evidence.size() == 8u);
  BOOST_TEST(gate(gates, "snapshot").evidence.size() == 12u);
  // Sampling is really random: some prompt's reply changes with the seed.
  BOOST_TEST(any_evidence(gate(gates, "keyed sampling"), "seed+1 differs"));
  BOOST_TEST(th::invariance_text(gates).find("5 passed, 0 failed, 1 skipped") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(batch_dependent_logits_fail_batched_gate_only) {
  tessera::server::StubModel inner(stub_config());
  th::PerturbedModel m(inner, th::PerturbedModel::Fault::kBatch);
  auto gates = th::run_invariance(m, small());
  BOOST_TEST_MESSAGE(th::invariance_text(gates));
  BOOST_TEST(gate(gates, "prefill chunk").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "batched").verdict == th::Verdict::kFail);
  BOOST_TEST(any_evidence(gate(gates, "batched"), "logits row 0 differs"));
  BOOST_TEST(gate(gates, "keyed sampling").verdict == th::Verdict::kFail);  // its batched leg
}

BOOST_AUTO_TEST_CASE(chunk_dependent_logits_fail_chunk_gate) {
  tessera::server::StubModel inner(stub_config());
  th::PerturbedModel m(inner, th::PerturbedModel::Fault::kChunk);
  auto gates = th::run_invariance(m, small());
  BOOST_TEST_MESSAGE(th::invariance_text(gates));
  auto const& c = gate(gates, "prefill chunk");
  BOOST_TEST(c.verdict == th::Verdict::kFail);
  BOOST_TEST(any_evidence(c, "1:DIFFERENT (logits row 0 differs"));
}

BOOST_AUTO_TEST_CASE(broken_clone_fails_restore_gate) {
  tessera::server::StubModel inner(stub_config());
  th::PerturbedModel m(inner, th::PerturbedModel::Fault::kClone);
  auto gates = th::run_invariance(m, small());
  BOOST_TEST_MESSAGE(th::invariance_text(gates));
  BOOST_TEST(gate(gates, "prefill chunk").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "batched").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "snapshot").verdict == th::Verdict::kFail);
  BOOST_TEST(any_evidence(gate(gates, "snapshot"), "MISMATCH"));
}

BOOST_AUTO_TEST_CASE(broken_rollback_fails_drafted_gate) {
  tessera::server::StubModel inner(stub_config());
  th::PerturbedModel m(inner, th::PerturbedModel::Fault::kRollback);
  auto gates = th::run_invariance(m, small());
  BOOST_TEST_MESSAGE(th::invariance_text(gates));
  BOOST_TEST(gate(gates, "prefill chunk").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "batched").verdict == th::Verdict::kPass);
  BOOST_TEST(gate(gates, "drafted").verdict == th::Verdict::kFail);
  BOOST_TEST(any_evidence(gate(gates, "drafted"), "DIFFERS"));
  // Drafters whose drafts are all accepted never roll back and stay equal.
  BOOST_TEST(any_evidence(gate(gates, "drafted"), "always-right k=4 3 rounds 9/9 accepted;"));
}

BOOST_AUTO_TEST_CASE(planted_position_changes_greedy_token_exactly_there) {
  tessera::server::StubModel inner(stub_config());
  th::PerturbedModel m(inner, th::PerturbedModel::Fault::kPosition, 9);
  std::vector<int32_t> prompt = {40, 41, 42, 43, 44};
  // Greedy decode 8 tokens on both; they agree before absolute position 9 and differ at it.
  auto decode = [&](tessera::model::LanguageModel& lm) {
    auto st = lm.new_sequence();
    std::vector<float> logits(static_cast<size_t>(lm.info().vocab_size));
    std::vector<int32_t> out, feed = prompt;
    for (int i = 0; i < 8; ++i) {
      tessera::model::SequenceStep s{st.get(), feed, 1, logits.data()};
      BOOST_REQUIRE(lm.forward(std::span(&s, 1)).ok());
      int32_t best = 0;
      for (int32_t v = 1; v < lm.info().vocab_size; ++v) if (logits[v] > logits[best]) best = v;
      out.push_back(best);
      feed = {best};
    }
    return out;
  };
  auto a = decode(inner), b = decode(m);
  for (size_t i = 0; i < 4; ++i) BOOST_TEST(a[i] == b[i]);
  BOOST_TEST(a[4] != b[4]);  // reply index 4 = absolute position 9
}

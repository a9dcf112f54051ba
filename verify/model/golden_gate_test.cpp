// SPDX-License-Identifier: Apache-2.0
/// The golden gate (design/ARCHITECTURE.md §13.2 steps 3-5; rules in golden_gate.hpp) on both
/// golden/v41-tiny variants, asserted per prompt: no uncertified disagreement (teacher-forced and
/// free-running), logits within the derived tolerance, and the overall verdict.
///
/// The references compute in the golden engine's own orders (docs/deepseek-v41-cpu.md "Numerics"). fp32 passes
/// the gate: 256/256 steps exact, logits within 0.000603 (tolerance 0.0102), pinned below 1e-3.
/// bf16 reproduces the golden's one-shot forward bit for bit (golden_bitwise_test.cpp) and reaches 254/256 steps
/// exact with 1 certified near-tie (pinned: exactly 254). KNOWN FAILURES (bf16 only), declared with Boost.Test's
/// expected_failures (an upper bound: a regression that adds a failing assertion fails the case), 3 assertions:
///   - prompt 5 step 28: our argmax is the golden's one-shot (full_logits) argmax; its cached decode differs
///     there (the golden's own 254/256 self-consistency) with a top-1/top-2 gap of 2 bf16 ulps, above the 1-ulp
///     tie bound. Its decode computes the mHC mix projection (fp32, one row) in another order than its prefill
///     (32 lanes of 8-element FMA chains, halving fold: measured); a row-invariant model follows one of them.
///   - prompt 6: max_abs_err 0.672 against the tolerance 0.664, from one bf16 attention probability one ulp
///     apart in the prompt prefill (layer 1, row 139): the golden's softmax lanes follow the forward's length.
///   - the overall verdict.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>

#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;

namespace {

GoldenReport run(std::string const& v) {
  auto rep = run_golden_gate(verify::tiny_model(v), verify::tiny_files(v).source(),
                             [](std::string const& s) { BOOST_TEST_MESSAGE(s); })
                 .value_or_throw();
  BOOST_TEST_MESSAGE(rep.summary_line());
  std::printf("%s variant: %s\n", v.c_str(), rep.summary_line().c_str());
  return rep;
}

void check(GoldenReport const& rep) {
  for (auto const& p : rep.prompts) {
    BOOST_TEST(p.failures == 0, "prompt " << p.index << ": " << p.failures << " uncertified disagreement(s)");
    BOOST_TEST(p.max_abs_err <= rep.logit_tolerance, "prompt " << p.index << ": max_abs_err " << p.max_abs_err);
  }
  BOOST_TEST(rep.pass);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dsv41_golden_gate)

BOOST_AUTO_TEST_CASE(fp32_precondition_gaps_above_tie_bound) {
  auto const& f = verify::tiny_files("fp32");
  double min_gap = 1e30;
  for (int i = 0; i < 8; ++i) {
    auto s = f.floats("step_logits." + std::to_string(i));
    for (size_t k = 0; k < s.size() / 512; ++k) {
      float const* row = &s[k * 512];
      int64_t a = argmax_first(row, 512);
      float second = -INFINITY;
      for (int j = 0; j < 512; ++j)
        if (j != a) second = std::max(second, row[j]);
      min_gap = std::min(min_gap, static_cast<double>(row[a] - second));
    }
  }
  BOOST_TEST(min_gap > 1e-3);  // the fp32 gate is never weakened silently by a golden near-tie
}

BOOST_AUTO_TEST_CASE(fp32) {
  auto rep = run("fp32");
  BOOST_TEST(rep.self_consistency_agree == 256);
  BOOST_TEST(rep.exact == 256);
  BOOST_TEST(rep.max_abs_err < 1e-3);
  check(rep);
}

BOOST_AUTO_TEST_CASE(bf16, *boost::unit_test::expected_failures(3)) {
  auto rep = run("bf16");
  BOOST_TEST(rep.self_consistency_agree == 254);
  BOOST_TEST(rep.exact == 254);
  BOOST_TEST(rep.near_ties == 1);
  BOOST_TEST(rep.exact >= rep.self_consistency_agree);
  check(rep);
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// The golden gate (design/ARCHITECTURE.md §13.2 steps 3-5; rules in golden_gate.hpp) on both
/// golden/v41-tiny variants, asserted per prompt: no uncertified disagreement (teacher-forced and
/// free-running), logits within the derived tolerance, and the overall verdict.
///
/// KNOWN FAILURES, declared with Boost.Test's expected_failures so the suite stays runnable while the
/// count is pinned exactly (a fix or a regression both change it and fail the case):
///  * fp32, prompt 5: two FP8 rounding-boundary events in the window KV, both reported by verify golden.
///    At position 9, layer 6: the quantiser input 2.37499952 is 2 fp32 ulps below the e4m3 midpoint
///    2.375 (logit error 4e-3 at positions 9-24 only: layer 6 feeds no later state). At position 79,
///    layer 0: q = 4.74999237 lies 7.6e-6 below the midpoint 4.75 of its block (scale 2^-7; the value
///    is a small dot product with cancellation); Tessera rounds to 4.5, the golden to 5.0. That state
///    difference grows (2e-4 at position 79, 0.5 at 88) into 7 teacher-forced argmax differences at
///    golden gaps of 0.05-0.55 and a free-running divergence at step 0. 3 assertions (uncertified
///    disagreements, max error, verdict).
///  * bf16: independent bf16 arithmetic (our fp32 accumulation order vs cuBLAS tensor cores) rounds a
///    few elements per layer to the neighbouring bf16 value (prompt 4 layer 0: 1 of 4160 attention
///    outputs); FP8/FP4 quantisers and top-k selections amplify those into different states.
/// verify golden prints the details; the golden itself disagrees with itself on 3 fp32 prompts through
/// the same kind of FP8 boundary (its full_logits vs step_logits).
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

BOOST_AUTO_TEST_CASE(fp32, *boost::unit_test::expected_failures(3)) {
  auto rep = run("fp32");
  BOOST_TEST(rep.self_consistency_agree == 256);
  BOOST_TEST(rep.exact >= 249);
  check(rep);
}

BOOST_AUTO_TEST_CASE(bf16, *boost::unit_test::expected_failures(15)) {
  auto rep = run("bf16");
  BOOST_TEST(rep.self_consistency_agree == 254);
  BOOST_TEST(rep.exact >= rep.self_consistency_agree);
  check(rep);
}

BOOST_AUTO_TEST_SUITE_END()

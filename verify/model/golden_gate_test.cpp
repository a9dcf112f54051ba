// SPDX-License-Identifier: Apache-2.0
/// The golden gate (design/ARCHITECTURE.md §13.2 steps 3-5; rules in golden_gate.hpp) on both
/// golden/v41-tiny variants, asserted per prompt: no uncertified disagreement (teacher-forced and
/// free-running), logits within the derived tolerance, and the overall verdict.
///
/// KNOWN FAILURES, declared with Boost.Test's expected_failures so the suite stays runnable while the
/// count is pinned exactly (a fix or a regression both change it and fail the case):
///  * fp32, prompt 5: at position 9 the layer-6 window KV value before FP8 quantisation is 2.37499952
///    (0x1.2ffffcp+1), two fp32 ulps below the e4m3 rounding midpoint 2.375 at scale 1; Tessera rounds
///    it to 2.25, the golden (whose value lies on the other side by its own summation order) to 2.5. The
///    difference grows through the prefill (all its top-k sets stay equal) into 7 argmax differences
///    at golden gaps of 0.05-0.55. 3 assertions (teacher-forced failures, max error, free-running).
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

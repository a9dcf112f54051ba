// SPDX-License-Identifier: Apache-2.0
/// The invariance suite on the golden tiny DeepSeek-V4.1 checkpoint (golden/v41-tiny/fp32 and bf16,
/// CPU): every gate that runs passes bitwise.
#include <boost/test/unit_test.hpp>

#include <chrono>

#include "tessera/models/deepseek_v41/loader.hpp"
#include "verify/common/golden.hpp"
#include "verify/harness/invariance.hpp"

namespace th = tessera::harness;
namespace dsv41 = tessera::model::dsv41;

namespace {

void run_on(std::string const& variant, dsv41::Numerics numerics) {
  dsv41::ModelOptions mo;
  mo.numerics = numerics;
  auto m = dsv41::load_model(tessera::verify::golden_dir() + "/v41-tiny/" + variant, mo);
  BOOST_REQUIRE_MESSAGE(m.ok(), m.status().message());
  th::InvarianceOptions o;
  o.prompt_lengths = {5, 37, 130};
  o.decode_tokens = 8;
  auto t0 = std::chrono::steady_clock::now();
  auto gates = th::run_invariance(**m, o);
  std::string text = th::invariance_text(gates);
  BOOST_TEST_MESSAGE(variant << " (" << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s)\n" << text);
  for (auto const& g : gates) {
    bool expect_skip = g.name.rfind("graph", 0) == 0;
    BOOST_TEST((g.verdict == (expect_skip ? th::Verdict::kSkip : th::Verdict::kPass)), variant << ": " << g.name << "\n" << text);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(golden_tiny_fp32_invariance) { run_on("fp32", dsv41::Numerics::kFp32); }
BOOST_AUTO_TEST_CASE(golden_tiny_bf16_invariance) { run_on("bf16", dsv41::Numerics::kBf16); }

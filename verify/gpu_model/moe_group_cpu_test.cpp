// SPDX-License-Identifier: Apache-2.0
/// gpu::moe_group's host twin (models/deepseek_v41/gpu_exl3.cpp, the CPU backend of the GPU model) against the
/// grouping written out plainly in moe_group_cases.hpp: random routings with pruned slots, every token on one
/// expert, empty experts, repeated and out-of-range ids, N = 1 and N = 0, E at its limit; and the limits
/// refused with a clear Status. The CUDA kernel is checked against the same reference in gpu_model_exl3_test.cpp.
#include <boost/test/unit_test.hpp>

#include "models/deepseek_v41/gpu_internal.hpp"
#include "verify/gpu_model/moe_group_cases.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;
namespace mg = tessera::verify::moe_group;

namespace {

gpu::MoeGroupParams params_of(mg::Case const& c, mg::Output& o) {
  gpu::MoeGroupParams p;
  p.ids = c.ids.data();
  p.weights = c.weights.data();
  p.tokens = c.tokens;
  p.top_k = c.top_k;
  p.experts = c.experts;
  p.offsets = o.offsets.data();
  p.slot_assignment = o.slot_assignment.data();
  p.token_idx = o.token_idx.data();
  p.route_weight = o.route_weight.data();
  p.identity = o.identity.data();
  p.combine_offsets = o.combine_offsets.data();
  p.combine_list = o.combine_list.data();
  return p;
}

gpu::Mem host_mem() {
  gpu::Mem m;
  m.backend = Backend::kCpu;
  return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_group_cpu)

BOOST_AUTO_TEST_CASE(host_twin_equals_reference) {
  for (mg::Case const& c : mg::cases()) {
    mg::Output o(c);
    Status const s = gpu::moe_group(host_mem(), params_of(c, o));
    BOOST_TEST_REQUIRE(s.ok(), c.name << ": " << s.to_string());
    BOOST_TEST(mg::first_difference(c, o) == "", c.name);
  }
}

// The cases cover what they claim: pruned slots, an all-pruned routing, empty experts, one expert holding
// every assignment.
BOOST_AUTO_TEST_CASE(cases_cover_the_shapes) {
  bool pruned = false, all_pruned = false, empty_expert = false, one_expert = false, n1 = false;
  for (mg::Case const& c : mg::cases()) {
    mg::Grouping const g = mg::reference(c);
    int64_t const A = static_cast<int64_t>(g.token.size());
    pruned |= A < c.tokens * c.top_k;
    all_pruned |= c.tokens > 0 && A == 0;
    n1 |= c.tokens == 1;
    for (int64_t e = 0; e < c.experts; ++e) {
      int64_t const n = g.offsets[e + 1] - g.offsets[e];
      empty_expert |= A > 0 && n == 0;
      one_expert |= A > 1 && n == A;
    }
  }
  BOOST_TEST(pruned);
  BOOST_TEST(all_pruned);
  BOOST_TEST(empty_expert);
  BOOST_TEST(one_expert);
  BOOST_TEST(n1);
}

BOOST_AUTO_TEST_CASE(limits_are_refused) {
  mg::Case c = mg::random_case("ok", 3, 6, 384, 0.0, 21);
  auto refused = [&](int64_t tokens, int64_t top_k, int64_t experts, char const* what) {
    mg::Output o(c);
    gpu::MoeGroupParams p = params_of(c, o);
    p.tokens = tokens;
    p.top_k = top_k;
    p.experts = experts;
    Status const s = gpu::moe_group(host_mem(), p);
    BOOST_TEST((s.code() == StatusCode::kInvalidArgument), what);
    BOOST_TEST(s.message().find("moe_group") != std::string::npos, s.message());
  };
  refused(3, 6, 0, "no experts");
  refused(3, 6, gpu::kMoeGroupMaxExperts + 1, "experts past the limit");
  refused(3, 0, 384, "top_k 0");
  refused(int64_t{1} << 29, 4, 384, "N·K = 2^31");
  mg::Output o(c);
  gpu::MoeGroupParams p = params_of(c, o);
  p.combine_list = nullptr;
  BOOST_TEST((gpu::moe_group(host_mem(), p).code() == StatusCode::kInvalidArgument));
  p = params_of(c, o);
  p.tokens = (int64_t{1} << 29) - 1;  // N·K = 2^31 − 4: within the limit (only checked, not run)
  p.top_k = 4;
  BOOST_TEST(gpu::check_moe_group(p).ok());
}

BOOST_AUTO_TEST_SUITE_END()

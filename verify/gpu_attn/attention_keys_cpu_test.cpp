// SPDX-License-Identifier: Apache-2.0
/// AttentionKeyList<Backend::kCpu> (the model's key-list loop) against the key lists written out
/// independently in attention_keys_cases.hpp, on the shared seeded cases; too short a key_ids is refused.
#include <boost/test/unit_test.hpp>

#include <vector>

#include "tessera/ops/attention_keys.hpp"
#include "tessera/ops/backend_route.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_attn/attention_keys_cases.hpp"

using namespace tessera;
using namespace tessera::verify;
using namespace tessera::verify::gpu_attn;

BOOST_AUTO_TEST_SUITE(attention_keys_cpu)

BOOST_AUTO_TEST_CASE(cpu_equals_independent_lists) {
  uint64_t const seed = test_seed(0x4E76);
  for (KeyShape const& s : key_shapes()) {
    KeyCase c = key_case(seed + static_cast<uint64_t>(s.rows), s.rows, s.p0, s.n_old, s.W, s.entries, s.top_k, s.ratio);
    std::vector<int64_t> off(static_cast<size_t>(c.d.rows + 1), -7);
    std::vector<int32_t> ids(static_cast<size_t>(ops::attention_key_capacity(c.d)), -7);
    ExecContext ctx;
    ops::AttentionKeyListArgs a{TensorView<int64_t const, 1>(c.old_pos.data(), {c.d.n_old}),
                                TensorView<int64_t const, 1>(c.pos.data(), {c.d.rows}),
                                TensorView<int32_t const, 2>(c.sel.data(), {c.d.rows, c.d.top_k}),
                                TensorView<int64_t, 1>(off.data(), {c.d.rows + 1}),
                                TensorView<int32_t, 1>(ids.data(), {static_cast<int64_t>(ids.size())})};
    Status st = ops::run_on_backend<ops::AttentionKeyList>(ctx, c.d, a);
    BOOST_TEST_REQUIRE(st.ok(), st.to_string());
    auto [off_x, ids_x] = expected_key_list(c, s.p0);
    ids.resize(static_cast<size_t>(off.back()));
    BOOST_TEST(off == off_x, boost::test_tools::per_element());
    BOOST_TEST(ids == ids_x, boost::test_tools::per_element());
    BOOST_TEST(!ids_x.empty());
  }
  // key_ids shorter than the capacity.
  KeyCase c = key_case(seed, 4, 10, 3, 8, 5, 2, 2);
  std::vector<int64_t> off(5);
  std::vector<int32_t> ids(2);
  ExecContext ctx;
  Status st = ops::run_on_backend<ops::AttentionKeyList>(
      ctx, c.d, ops::AttentionKeyListArgs{TensorView<int64_t const, 1>(c.old_pos.data(), {3}),
                                          TensorView<int64_t const, 1>(c.pos.data(), {4}),
                                          TensorView<int32_t const, 2>(c.sel.data(), {4, 2}),
                                          TensorView<int64_t, 1>(off.data(), {5}), TensorView<int32_t, 1>(ids.data(), {2})});
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.message().find("attention_key_capacity") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

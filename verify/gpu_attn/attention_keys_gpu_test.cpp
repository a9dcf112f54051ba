// SPDX-License-Identifier: Apache-2.0
/// AttentionKeyList: the CUDA backend equals the CPU functor (the model's key-list loop) exactly, on
/// seeded random chunks: prefill longer than the window, prefill after a cached window, decode, no top-k,
/// picks past the published entries and −1 padding dropped, the top-k part in ascending entry order.
/// Also checked against a list built independently here (positions in the window, then the set of picks).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <vector>

#include "tessera/ops/attention_keys.hpp"
#include "tessera/ops/backend_route.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_attn/attention_keys_cases.hpp"
#include "verify/gpu_attn/gpu_attn_util.hpp"

using namespace tessera;
using namespace tessera::verify;
using namespace tessera::verify::gpu_attn;

namespace {

std::pair<std::vector<int64_t>, std::vector<int32_t>> keys_cpu(KeyCase const& c) {
  std::vector<int64_t> off(static_cast<size_t>(c.d.rows + 1), -7);
  std::vector<int32_t> ids(static_cast<size_t>(ops::attention_key_capacity(c.d)), -7);
  ExecContext ctx;
  ops::AttentionKeyListArgs a{TensorView<int64_t const, 1>(c.old_pos.data(), {c.d.n_old}),
                              TensorView<int64_t const, 1>(c.pos.data(), {c.d.rows}),
                              TensorView<int32_t const, 2>(c.sel.data(), {c.d.rows, c.d.top_k}),
                              TensorView<int64_t, 1>(off.data(), {c.d.rows + 1}),
                              TensorView<int32_t, 1>(ids.data(), {static_cast<int64_t>(ids.size())})};
  Status s = ops::run_on_backend<ops::AttentionKeyList>(ctx, c.d, a);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  ids.resize(static_cast<size_t>(off.back()));
  return {off, ids};
}

std::pair<std::vector<int64_t>, std::vector<int32_t>> keys_gpu(KeyCase const& c) {
  int64_t const cap = ops::attention_key_capacity(c.d);
  DevBuf<int64_t> old_pos(c.old_pos), pos(c.pos), off(std::vector<int64_t>(static_cast<size_t>(c.d.rows + 1), -7));
  DevBuf<int32_t> sel(c.sel), ids(std::vector<int32_t>(static_cast<size_t>(cap), -7));
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  ops::AttentionKeyListArgs a{old_pos.cview<1>({c.d.n_old}), pos.cview<1>({c.d.rows}),
                              c.d.top_k ? sel.cview<2>({c.d.rows, c.d.top_k}) : TensorView<int32_t const, 2>{},
                              off.view<1>({c.d.rows + 1}), ids.view<1>({cap})};
  Status s = ops::run_on_backend<ops::AttentionKeyList>(ctx, c.d, a);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  std::vector<int64_t> o = off.host();
  std::vector<int32_t> i = ids.host();
  i.resize(static_cast<size_t>(std::max<int64_t>(o.back(), 0)));
  return {o, i};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_attention_keys)

BOOST_AUTO_TEST_CASE(gpu_equals_cpu_and_independent_lists) {
  uint64_t const seed = test_seed(0x4E75);
  for (KeyShape const& s : key_shapes()) {
    KeyCase c = key_case(seed + static_cast<uint64_t>(s.rows), s.rows, s.p0, s.n_old, s.W, s.entries, s.top_k, s.ratio);
    auto [off_c, ids_c] = keys_cpu(c);
    auto [off_g, ids_g] = keys_gpu(c);
    auto [off_x, ids_x] = expected_key_list(c, s.p0);
    BOOST_TEST(off_c == off_g, boost::test_tools::per_element());
    BOOST_TEST(ids_c == ids_g, boost::test_tools::per_element());
    BOOST_TEST(off_g == off_x, boost::test_tools::per_element());
    BOOST_TEST(ids_g == ids_x, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments) {
  KeyCase c = key_case(1, 4, 10, 3, 8, 5, 2, 2);
  DevBuf<int64_t> old_pos(c.old_pos), pos(c.pos), off(int64_t{5});
  DevBuf<int32_t> sel(c.sel), ids(int64_t{2});
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  Status s = ops::run_on_backend<ops::AttentionKeyList>(
      ctx, c.d, ops::AttentionKeyListArgs{old_pos.cview<1>({3}), pos.cview<1>({4}), sel.cview<2>({4, 2}),
                                          off.view<1>({5}), ids.view<1>({2})});
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("attention_key_capacity") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// The CUDA router with expert pruning (kernels/moe/moe_route_cuda.cu, ops/moe.hpp) against the reference
/// (ref::moe_route_row, then ref::moe_prune_row when top_p < 1), bit for bit: ids, weights and cutoff-tie
/// flags, on fresh random inputs over a grid of top_p, min_k, renormalisation, the static mask and the
/// router's own normalisation. Softplus is fmath::exp_rn / log1p_rn on both sides, so nothing is left to a
/// tolerance. Also: keep-everything settings equal the unpruned router; the prune order's weight ties go
/// to the lower slot; a row alone gives the bits it gets in the batch.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>

#include "tessera/ops/moe.hpp"
#include "tessera/ref/moe_ref.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;

namespace {

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> w;
  std::vector<uint8_t> tie;
};

/// The reference, row by row.
Routing reference(ops::MoeRouteDesc const& d, std::vector<float> const& x, std::vector<float> const& gate,
                  std::vector<float> const& bias, std::vector<uint8_t> const& mask) {
  Routing o{std::vector<int32_t>(d.rows * d.top_k), std::vector<float>(d.rows * d.top_k), std::vector<uint8_t>(d.rows)};
  for (int64_t r = 0; r < d.rows; ++r) {
    int32_t* ids = &o.ids[r * d.top_k];
    float* w = &o.w[r * d.top_k];
    o.tie[r] = ref::moe_route_row(&x[r * d.dim], gate.data(), bias.data(), d.experts, d.dim, d.top_k, d.gate_temp,
                                  d.norm_top_k, d.routed_scale, ids, w, mask.empty() ? nullptr : mask.data());
    if (d.prune_top_p < 1.f) ref::moe_prune_row(ids, w, d.top_k, d.prune_top_p, d.prune_min_k, d.prune_renorm);
  }
  return o;
}

Routing on_gpu(ops::MoeRouteDesc const& d, std::vector<float> const& x, std::vector<float> const& gate,
               std::vector<float> const& bias, std::vector<uint8_t> const& mask) {
  DeviceBuffer<float> dx(x), dg(gate), db(bias), dw(std::vector<float>(d.rows * d.top_k, -7.f));
  DeviceBuffer<int32_t> di(std::vector<int32_t>(d.rows * d.top_k, 77));
  DeviceBuffer<uint8_t> dt(std::vector<uint8_t>(d.rows, 9)), dm(mask);
  ops::MoeRouteArgs a{dx.cview<2>({d.rows, d.dim}), dg.cview<2>({d.experts, d.dim}), db.cview<1>({d.experts}),
                      dw.view<2>({d.rows, d.top_k}), di.view<2>({d.rows, d.top_k}), dt.view<1>({d.rows}),
                      mask.empty() ? TensorView<uint8_t const, 1>{} : dm.cview<1>({d.experts})};
  ExecContext c = cuda_ctx();
  auto s = ops::dispatch<ops::MoeRoute>(c, d, a);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  return {di.get(), dw.get(), dt.get()};
}

bool same(Routing const& a, Routing const& b, char const* what) {
  return a.ids == b.ids && a.tie == b.tie && count_bit_diffs(a.w, b.w, what) == 0;
}

/// Rows of random router inputs whose scales spread from flat to sharp routing distributions.
std::vector<float> router_inputs(int64_t rows, int64_t dim, uint64_t seed) {
  auto x = randn(static_cast<size_t>(rows * dim), seed);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j) x[r * dim + j] *= 0.25f + 0.75f * static_cast<float>(r % 6);
  return x;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pruned_router_matches_reference_bitwise) {
  uint64_t const seed = test_seed(811);
  struct Shape { int64_t rows, experts, dim, k; };
  for (Shape sh : {Shape{37, 384, 512, 6}, Shape{29, 8, 64, 2}, Shape{13, 64, 96, 16}}) {
    auto x = router_inputs(sh.rows, sh.dim, seed + sh.experts);
    auto gate = randn(static_cast<size_t>(sh.experts * sh.dim), seed + 1 + sh.experts, 0.5f / std::sqrt(float(sh.dim)));
    auto bias = randn(static_cast<size_t>(sh.experts), seed + 2 + sh.experts, 0.05f);
    std::vector<uint8_t> mask(static_cast<size_t>(sh.experts), 0);
    for (int64_t e = 1; e < sh.experts && sh.experts - e >= sh.k; e += 3) mask[e] = 1;  // every third expert out
    int64_t open = std::count(mask.begin(), mask.end(), uint8_t{0});
    BOOST_REQUIRE(open >= sh.k);
    for (bool norm : {true, false})
      for (bool use_mask : {false, true}) {
        auto const& m = use_mask ? mask : std::vector<uint8_t>{};
        ops::MoeRouteDesc d{sh.rows, sh.experts, sh.dim, sh.k, 1.3f, 2.5f, norm};
        Routing const unpruned = on_gpu(d, x, gate, bias, m);
        BOOST_TEST(same(unpruned, reference(d, x, gate, bias, m), "unpruned"));
        for (float top_p : {0.95f, 0.8f, 0.6f, 0.4f, 0.05f})
          for (int64_t min_k : {int64_t{0}, int64_t{2}, sh.k})
            for (bool renorm : {true, false}) {
              ops::MoeRouteDesc dp = d;
              dp.prune_top_p = top_p;
              dp.prune_min_k = min_k;
              dp.prune_renorm = renorm;
              BOOST_TEST_INFO("E=" << sh.experts << " k=" << sh.k << " norm=" << norm << " mask=" << use_mask
                                   << " top_p=" << top_p << " min_k=" << min_k << " renorm=" << renorm);
              Routing const gpu = on_gpu(dp, x, gate, bias, m);
              Routing const want = reference(dp, x, gate, bias, m);
              BOOST_TEST(same(gpu, want, "pruned"));
              int64_t rows_pruned = 0;
              for (int64_t r = 0; r < sh.rows; ++r) {
                int64_t kept = 0;
                for (int64_t i = 0; i < sh.k; ++i) {
                  int32_t const id = gpu.ids[r * sh.k + i];
                  kept += id >= 0;
                  if (id < 0) BOOST_TEST(gpu.w[r * sh.k + i] == 0.f);
                  else BOOST_TEST(id == unpruned.ids[r * sh.k + i]);  // kept slots keep their position
                  if (id >= 0 && use_mask) BOOST_TEST(!mask[static_cast<size_t>(id)]);
                }
                BOOST_TEST(kept >= std::max<int64_t>(1, std::min(min_k, sh.k)));
                rows_pruned += kept < sh.k;
              }
              if (min_k >= sh.k) {  // keep-everything: the prune path runs and changes nothing
                BOOST_TEST(rows_pruned == 0);
                BOOST_TEST(same(gpu, unpruned, "keep everything"));
              }
              if (min_k < sh.k && top_p <= 0.4f) BOOST_TEST(rows_pruned > 0, "the grid point prunes no row");
            }
      }
    // A row alone: the bits it gets in the batch.
    ops::MoeRouteDesc d{sh.rows, sh.experts, sh.dim, sh.k, 1.3f, 2.5f, true, 0.6f, 1, true};
    Routing const all = on_gpu(d, x, gate, bias, mask);
    ops::MoeRouteDesc d1 = d;
    d1.rows = 1;
    Routing const alone = on_gpu(d1, row_slice(x, sh.dim, 5), gate, bias, mask);
    BOOST_TEST((alone.ids == row_slice(all.ids, sh.k, 5)));
    BOOST_TEST(count_bit_diffs(alone.w, row_slice(all.w, sh.k, 5), "row alone") == 0);
  }
}

BOOST_AUTO_TEST_CASE(prune_order_ties_go_to_the_lower_slot) {
  uint64_t const seed = test_seed(812);
  int64_t const rows = 4, experts = 32, dim = 64, k = 4;
  auto x = router_inputs(rows, dim, seed);
  auto gate = randn(static_cast<size_t>(experts * dim), seed + 1, 0.1f);
  std::vector<float> bias(experts, 0.f);
  // Experts 9 and 21 share a gate row that the inputs align with (equal, largest routing weights); the
  // other rows are scaled down. The biases select 21 ahead of 9.
  std::vector<float> const row(gate.begin() + 3 * dim, gate.begin() + 4 * dim);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t j = 0; j < dim; ++j) gate[e * dim + j] = (e == 9 || e == 21) ? row[j] : 0.01f * gate[e * dim + j];
  bias[21] = 2.f;
  bias[9] = 1.f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j) x[r * dim + j] = std::fabs(x[r * dim + j]) * (row[j] > 0 ? 1.f : -1.f);
  ops::MoeRouteDesc d{rows, experts, dim, k, 1.f, 1.f, true, 0.05f, 1, true};
  Routing const gpu = on_gpu(d, x, gate, bias, {});
  BOOST_TEST(same(gpu, reference(d, x, gate, bias, {}), "tie"));
  for (int64_t r = 0; r < rows; ++r) {
    BOOST_TEST(gpu.ids[r * k] == 21);      // slot 0: the larger biased score
    BOOST_TEST(gpu.ids[r * k + 1] == -1);  // expert 9: the same weight in a later slot, dropped
  }
}

// SPDX-License-Identifier: Apache-2.0
/// The attention output combine of one TP rank (shard_attention_out, models/deepseek_v41) on seeded
/// random head outputs and weights, against the single-rank formula written out here:
///   y_g = wo_a_g · o_g (per group, ref::linear_row), out[o] = ref::dot(y, wo_b[o], n), n = G·ro.
///  * gather combine (and the head gather of tp > o_groups): equal bit for bit;
///  * all-reduce combine: equal bit for bit to the rank-order fold of the ranks' partial dots
///    (Σ_r fl(Σ_{i∈r} y_i·wo_b[o, i]), the documented order), and within the summation bound
///    |Δ| ≤ 2·γ_n·Σ_i |y_i·wo_b[o, i]|, γ_n = n·u / (1 − n·u), u = 2⁻²⁴ (docs/multi-gpu.md).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <thread>

#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/ref/common_ref.hpp"
#include "verify/common/random.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;

namespace {

Tensor mat(std::vector<float> const& v, int64_t r, int64_t c) { return Tensor::from_floats(v, {r, c}); }

/// Rows [b, e) of a row-major [rows, cols] matrix; columns [b, e) likewise.
std::vector<float> rows_of(std::vector<float> const& m, int64_t cols, int64_t b, int64_t e) {
  return {m.begin() + b * cols, m.begin() + e * cols};
}
std::vector<float> cols_of(std::vector<float> const& m, int64_t rows, int64_t cols, int64_t b, int64_t e) {
  std::vector<float> out;
  for (int64_t i = 0; i < rows; ++i) out.insert(out.end(), m.begin() + i * cols + b, m.begin() + i * cols + e);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_attention_combine)

BOOST_AUTO_TEST_CASE(gather_exact_allreduce_within_bound) {
  uint64_t seed = verify::test_seed(313);
  ModelSpec s;
  s.num_heads = 8;
  s.head_dim = 16;
  s.o_groups = 4;
  s.o_lora_rank = 24;
  s.hidden_size = 40;
  int64_t const S = 3, H = s.num_heads, hd = s.head_dim, G = s.o_groups, ro = s.o_lora_rank, D = s.hidden_size;
  int64_t const gw = H * hd / G, n = G * ro;
  auto o = verify::randn(S * H * hd, seed);
  auto wa = verify::randn(G * ro * gw, seed + 1, 0.2f);
  auto wb = verify::randn(D * n, seed + 2, 0.2f);
  // Single rank, written out.
  std::vector<float> y(S * n), want(S * D), absdot(S * D);
  for (int64_t r = 0; r < S; ++r)
    for (int64_t g = 0; g < G; ++g)
      ref::linear_row(&o[r * H * hd + g * gw], &wa[g * ro * gw], gw, ro, &y[r * n + g * ro], DType::kF32);
  for (int64_t r = 0; r < S; ++r)
    for (int64_t d = 0; d < D; ++d) {
      want[r * D + d] = ref::dot(&y[r * n], &wb[d * n], n);
      double a = 0;
      for (int64_t i = 0; i < n; ++i) a += std::fabs(double(y[r * n + i]) * wb[d * n + i]);
      absdot[r * D + d] = static_cast<float>(a);
    }
  double const u = std::ldexp(1.0, -24), gamma = n * u / (1 - n * u);

  for (int tp : {2, 4, 8}) {
    for (auto mode : {dist::AttnCombine::kGather, dist::AttnCombine::kAllReduce}) {
      dist::ParallelConfig c;
      c.tp = tp;
      c.attn = mode;
      dist::ModelDims dims{.hidden = D, .heads = H, .head_dim = hd, .o_groups = G, .o_lora_rank = ro, .experts = 8,
                           .moe_inter = 8, .vocab = 16, .layers = 1, .engram_columns = 0};
      auto plan = dist::make_plan(dims, c).value_or_throw();
      auto comms = dist::InProcessCommunicator::create(tp);
      std::vector<std::vector<float>> got(tp);
      std::vector<std::thread> th;
      for (int rk = 0; rk < tp; ++rk)
        th.emplace_back([&, rk] {
          RankShard sh{plan, rk, comms[rk].get()};
          auto const& me = sh.me();
          Weights all;
          all.layers.resize(1);
          LayerWeights& w = all.layers[0];
          w.wo_a = me.gather_heads ? mat(wa, G * ro, gw)
                                   : mat(rows_of(wa, gw, me.groups.begin * ro, me.groups.end * ro), me.groups.size() * ro, gw);
          w.wo_b = !me.gather_heads && mode == dist::AttnCombine::kAllReduce
                       ? mat(cols_of(wb, D, n, me.groups.begin * ro, me.groups.end * ro), D, me.groups.size() * ro)
                       : mat(rows_of(wb, n, me.wo_b_rows.begin, me.wo_b_rows.end), me.wo_b_rows.size(), n);
          std::vector<float> mine = cols_of(o, S, H * hd, me.heads.begin * hd, me.heads.end * hd);
          ThreadPool pool(1);
          ExecContext ctx;
          ctx.pool = &pool;
          shard_attention_out(sh, ctx, s, all, 0, mine, S, DType::kF32, got[rk]);
        });
      for (auto& t : th) t.join();
      bool const exact = plan.bit_exact();
      BOOST_TEST(exact == (mode == dist::AttnCombine::kGather || tp > G));
      for (int rk = 1; rk < tp; ++rk) BOOST_TEST(std::memcmp(got[rk].data(), got[0].data(), S * D * 4) == 0);
      if (exact) {
        BOOST_TEST(std::memcmp(got[0].data(), want.data(), S * D * 4) == 0, "tp " << tp);
        continue;
      }
      double worst = 0;
      int64_t differ = 0;
      for (int64_t r = 0; r < S; ++r)
        for (int64_t d = 0; d < D; ++d) {
          float fold = 0.f;
          for (int rk = 0; rk < tp; ++rk) {
            auto const& gr = plan.ranks[rk].groups;
            float part = ref::dot(&y[r * n + gr.begin * ro], &wb[d * n + gr.begin * ro], gr.size() * ro);
            fold = rk == 0 ? part : fold + part;
          }
          float g = got[0][r * D + d], w1 = want[r * D + d];
          BOOST_TEST(std::memcmp(&g, &fold, 4) == 0);
          double bound = 2 * gamma * absdot[r * D + d];
          BOOST_TEST(std::fabs(double(g) - w1) <= bound);
          worst = std::max(worst, std::fabs(double(g) - w1) / bound);
          differ += g != w1;
        }
      BOOST_TEST_MESSAGE("tp " << tp << " all-reduce: " << differ << "/" << S * D << " elements differ from one rank, "
                               << "worst |diff| = " << worst << " of the bound");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

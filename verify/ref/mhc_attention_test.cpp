// SPDX-License-Identifier: Apache-2.0
/// mHC, attention and compressor ops against independent double-precision formulations: explicit
/// Sinkhorn on n×n matrices, a full masked softmax over the concatenated key axis with the sink column
/// (finfo.min window mask, −inf compressed bias), and a per-group softmax pooling.
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tessera/ops/attention.hpp"
#include "tessera/ops/compressor.hpp"
#include "tessera/ops/mhc.hpp"
#include "verify/common/random.hpp"

using namespace tessera;

BOOST_AUTO_TEST_SUITE(mhc)

BOOST_AUTO_TEST_CASE(mix_collapse_expand_vs_double) {
  int64_t rows = 3, n = 4, d = 32, nm = (2 + n) * n;
  auto x = verify::randn(rows * n * d, verify::test_seed(41));
  auto fn = verify::randn(nm * n * d, verify::test_seed(42), 0.05f);
  auto base = verify::randn(nm, verify::test_seed(43), 0.5f);
  std::vector<float> scale = {1.1f, 0.9f, 1.3f};
  std::vector<float> pre(rows * n), post(rows * n), comb(rows * n * n);
  ExecContext ctx;
  int iters = 20;
  float eps = 1e-6f;
  BOOST_REQUIRE(ops::mhc_mix(ctx, {rows, n, d, iters, eps, 1e-20f},
                             {TensorView<float const, 2>(x.data(), {rows, n * d}), TensorView<float const, 2>(fn.data(), {nm, n * d}),
                              TensorView<float const, 1>(base.data(), {nm}), TensorView<float const, 1>(scale.data(), {3}),
                              TensorView<float, 2>(pre.data(), {rows, n}), TensorView<float, 2>(post.data(), {rows, n}),
                              TensorView<float, 2>(comb.data(), {rows, n * n})}).ok());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n * d; ++i) ss += static_cast<double>(x[r * n * d + i]) * x[r * n * d + i];
    double inv = 1 / std::sqrt(ss / (n * d) + 1e-20);
    std::vector<double> m(nm);
    for (int64_t o = 0; o < nm; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < n * d; ++i) acc += x[r * n * d + i] * inv * fn[o * n * d + i];
      m[o] = acc;
    }
    auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
    double C[4][4];
    for (int j = 0; j < n; ++j) {
      double mx = -1e300, s = 0;
      for (int k = 0; k < n; ++k) { C[j][k] = m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k]; mx = std::max(mx, C[j][k]); }
      for (int k = 0; k < n; ++k) { C[j][k] = std::exp(C[j][k] - mx); s += C[j][k]; }
      for (int k = 0; k < n; ++k) C[j][k] = C[j][k] / s + eps;
    }
    // Column, then (iters − 1) × (row, column): the run ends on a column normalisation.
    auto col = [&] { for (int k = 0; k < n; ++k) { double s = 0; for (int j = 0; j < n; ++j) s += C[j][k]; for (int j = 0; j < n; ++j) C[j][k] /= s + eps; } };
    auto row = [&] { for (int j = 0; j < n; ++j) { double s = 0; for (int k = 0; k < n; ++k) s += C[j][k]; for (int k = 0; k < n; ++k) C[j][k] /= s + eps; } };
    col();
    for (int it = 0; it < iters - 1; ++it) { row(); col(); }
    for (int k = 0; k < n; ++k) {
      BOOST_TEST(std::fabs(pre[r * n + k] - (sig(m[k] * scale[0] + base[k]) + eps)) <= 2e-6);
      BOOST_TEST(std::fabs(post[r * n + k] - 2 * sig(m[n + k] * scale[1] + base[n + k])) <= 4e-6);
      double colsum = 0;
      for (int j = 0; j < n; ++j) {
        BOOST_TEST(std::fabs(comb[r * n * n + j * n + k] - C[j][k]) <= 2e-6);
        colsum += comb[r * n * n + j * n + k];
      }
      BOOST_TEST(std::fabs(colsum - 1) <= 1e-5);  // the last normalisation is over columns
    }
  }
  // Collapse and expand.
  auto y = verify::randn(rows * d, verify::test_seed(44));
  std::vector<float> col_out(rows * d), exp_out(rows * n * d);
  BOOST_REQUIRE(ops::mhc_collapse(ctx, {rows, n, d, DType::kF32},
                                  {TensorView<float const, 2>(x.data(), {rows, n * d}), TensorView<float const, 2>(pre.data(), {rows, n}),
                                   TensorView<float, 2>(col_out.data(), {rows, d})}).ok());
  BOOST_REQUIRE(ops::mhc_expand(ctx, {rows, n, d, DType::kBf16},
                                {TensorView<float const, 2>(y.data(), {rows, d}), TensorView<float const, 2>(x.data(), {rows, n * d}),
                                 TensorView<float const, 2>(post.data(), {rows, n}), TensorView<float const, 2>(comb.data(), {rows, n * n}),
                                 TensorView<float, 2>(exp_out.data(), {rows, n * d})}).ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; ++i) {
      double c = 0;
      for (int k = 0; k < n; ++k) c += static_cast<double>(pre[r * n + k]) * x[r * n * d + k * d + i];
      BOOST_TEST(std::fabs(col_out[r * d + i] - c) <= 1e-5 * (1 + std::fabs(c)));
      for (int k = 0; k < n; ++k) {
        double e = static_cast<double>(post[r * n + k]) * y[r * d + i];
        for (int j = 0; j < n; ++j) e += static_cast<double>(comb[r * n * n + j * n + k]) * x[r * n * d + j * d + i];
        float got = exp_out[r * n * d + k * d + i];
        BOOST_TEST(got == round_to_bf16(got));
        BOOST_TEST(std::fabs(got - e) <= std::fabs(e) * 0x1p-8 + 1e-6);
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(attention)

// Reference: every row sees the full concatenated key axis [window positions 0..T_w) ; compressed
// entries], with the additive masks of the golden engine, and the sink as an extra softmax column.
BOOST_AUTO_TEST_CASE(window_plus_compressed_with_sinks_vs_full_masked_softmax) {
  int64_t H = 4, hd = 64, W = 4, tw = 9, tc = 5;
  auto q = verify::randn(tw * H * hd, verify::test_seed(51), 0.3f);
  auto kw = verify::randn(tw * hd, verify::test_seed(52));
  auto kc = verify::randn(tc * hd, verify::test_seed(53));
  auto sinks = verify::randn(H, verify::test_seed(54));
  std::vector<std::vector<int>> sel(tw);  // selected compressed entries per row
  for (int64_t r = 0; r < tw; ++r)
    for (int e = 0; e < tc; ++e)
      if ((r + e) % 3 != 0 && e <= r / 2) sel[r].push_back(e);
  // Pool = window keys then compressed keys; row r attends window positions r−W+1..r and its entries.
  std::vector<float> pool = kw;
  pool.insert(pool.end(), kc.begin(), kc.end());
  std::vector<int64_t> offs = {0};
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < tw; ++r) {
    for (int64_t u = 0; u <= r; ++u) if (r - u < W) ids.push_back(static_cast<int32_t>(u));
    for (int e : sel[r]) ids.push_back(static_cast<int32_t>(tw + e));
    offs.push_back(static_cast<int64_t>(ids.size()));
  }
  // One row with no keys at all: the sink takes all the mass, the output is exactly 0.
  int64_t rows = tw + 1;
  q.resize(rows * H * hd, 0.5f);
  offs.push_back(offs.back());
  std::vector<float> out(rows * H * hd, 7.f);
  ExecContext ctx;
  float scale = 0.125f;
  BOOST_REQUIRE(ops::attention(ctx, {rows, H, hd, tw + tc, scale, DType::kF32},
                               {TensorView<float const, 2>(q.data(), {rows, H * hd}), TensorView<float const, 2>(pool.data(), {tw + tc, hd}),
                                TensorView<int64_t const, 1>(offs.data(), {rows + 1}),
                                TensorView<int32_t const, 1>(ids.data(), {static_cast<int64_t>(ids.size())}),
                                TensorView<float const, 1>(sinks.data(), {H}), TensorView<float, 2>(out.data(), {rows, H * hd})}).ok());
  double const fmin = std::numeric_limits<float>::lowest();
  for (int64_t r = 0; r < tw; ++r)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> l(tw + tc + 1);
      for (int64_t u = 0; u < tw; ++u) {
        double dt = 0;
        for (int64_t i = 0; i < hd; ++i) dt += static_cast<double>(q[(r * H + h) * hd + i]) * kw[u * hd + i];
        l[u] = dt * scale + ((u <= r && r - u < W) ? 0.0 : fmin);
      }
      for (int64_t e = 0; e < tc; ++e) {
        double dt = 0;
        for (int64_t i = 0; i < hd; ++i) dt += static_cast<double>(q[(r * H + h) * hd + i]) * kc[e * hd + i];
        bool on = std::find(sel[r].begin(), sel[r].end(), e) != sel[r].end();
        l[tw + e] = on ? dt * scale : -INFINITY;
      }
      l[tw + tc] = sinks[h];
      double mx = *std::max_element(l.begin(), l.end()), s = 0;
      for (double& v : l) { v = std::exp(v - mx); s += v; }
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (int64_t u = 0; u < tw; ++u) o += l[u] / s * kw[u * hd + i];
        for (int64_t e = 0; e < tc; ++e) o += l[tw + e] / s * kc[e * hd + i];
        BOOST_TEST(std::fabs(out[(r * H + h) * hd + i] - o) <= 2e-5);
      }
    }
  for (int64_t i = 0; i < H * hd; ++i) BOOST_TEST(out[tw * H * hd + i] == 0.f);
}

// bf16 reads q and the keys as bf16 values (the operands of a tensor-core GEMM): fp32 inputs give exactly the
// outputs and probabilities of their →bf16 roundings. max_row_keys bounds every row: a longer row is an error.
BOOST_AUTO_TEST_CASE(bf16_operands_and_row_bound) {
  int64_t const H = 3, hd = 64, nk = 21, rows = 4;
  auto q = verify::randn(rows * H * hd, verify::test_seed(61));
  auto keys = verify::randn(nk * hd, verify::test_seed(62));
  auto sinks = verify::randn(H, verify::test_seed(63));
  std::vector<int64_t> offs = {0};
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t u = 0; u < 5 + 4 * r; ++u) ids.push_back(static_cast<int32_t>((u * 5 + r) % nk));
    offs.push_back(static_cast<int64_t>(ids.size()));
  }
  int64_t const nnz = static_cast<int64_t>(ids.size());
  auto run = [&](std::vector<float> const& qv, std::vector<float> const& kv, int64_t bound, std::vector<float>& out,
                 std::vector<float>& probs) {
    out.assign(static_cast<size_t>(rows * H * hd), 0.f);
    probs.assign(static_cast<size_t>(H * nnz), 0.f);
    ExecContext ctx;
    ops::AttentionDesc d{rows, H, hd, nk, 0.125f, DType::kBf16};
    d.max_row_keys = bound;
    return ops::attention(ctx, d,
                          {TensorView<float const, 2>(qv.data(), {rows, H * hd}), TensorView<float const, 2>(kv.data(), {nk, hd}),
                           TensorView<int64_t const, 1>(offs.data(), {rows + 1}), TensorView<int32_t const, 1>(ids.data(), {nnz}),
                           TensorView<float const, 1>(sinks.data(), {H}), TensorView<float, 2>(out.data(), {rows, H * hd}),
                           TensorView<float, 2>(probs.data(), {H, nnz})});
  };
  std::vector<float> qb(q), kb(keys);
  for (float& v : qb) v = round_to_bf16(v);
  for (float& v : kb) v = round_to_bf16(v);
  int64_t changed = 0;
  for (size_t i = 0; i < q.size(); ++i) changed += qb[i] != q[i];
  BOOST_REQUIRE(changed > static_cast<int64_t>(q.size()) / 2);  // the inputs are not bf16 values
  std::vector<float> o1, p1, o2, p2;
  int64_t const longest = offs[rows] - offs[rows - 1];
  BOOST_REQUIRE(run(q, keys, longest, o1, p1).ok());
  BOOST_REQUIRE(run(qb, kb, 0, o2, p2).ok());
  for (size_t i = 0; i < o1.size(); ++i) BOOST_TEST(std::bit_cast<uint32_t>(o1[i]) == std::bit_cast<uint32_t>(o2[i]));
  for (size_t i = 0; i < p1.size(); ++i) BOOST_TEST(std::bit_cast<uint32_t>(p1[i]) == std::bit_cast<uint32_t>(p2[i]));
  Status const s = run(q, keys, longest - 1, o1, p1);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("max_row_keys") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressor)

BOOST_AUTO_TEST_CASE(gated_pooling_vs_double) {
  int64_t groups = 5, ratio = 3, dim = 16;
  auto a = verify::randn(groups * ratio * dim, verify::test_seed(61));
  auto g = verify::randn(groups * ratio * dim, verify::test_seed(62), 3.f);
  std::vector<float> out(groups * dim);
  ExecContext ctx;
  BOOST_REQUIRE(ops::compress_pool(ctx, {groups, ratio, dim, DType::kF32},
                                   {TensorView<float const, 2>(a.data(), {groups * ratio, dim}),
                                    TensorView<float const, 2>(g.data(), {groups * ratio, dim}), TensorView<float, 2>(out.data(), {groups, dim})}).ok());
  for (int64_t j = 0; j < groups; ++j)
    for (int64_t c = 0; c < dim; ++c) {
      double s = 0, acc = 0;
      for (int64_t i = 0; i < ratio; ++i) s += std::exp(static_cast<double>(g[(j * ratio + i) * dim + c]));
      for (int64_t i = 0; i < ratio; ++i) acc += a[(j * ratio + i) * dim + c] * std::exp(static_cast<double>(g[(j * ratio + i) * dim + c])) / s;
      BOOST_TEST(std::fabs(out[j * dim + c] - acc) <= 1e-5 * (1 + std::fabs(acc)));
    }
  // Ratio 1 has no pooling: the op refuses it.
  BOOST_TEST(!ops::compress_pool(ctx, {groups, 1, dim, DType::kF32},
                                 {TensorView<float const, 2>(a.data(), {groups, dim}), TensorView<float const, 2>(g.data(), {groups, dim}),
                                  TensorView<float, 2>(out.data(), {groups, dim})}).ok());
}

BOOST_AUTO_TEST_SUITE_END()

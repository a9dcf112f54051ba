// SPDX-License-Identifier: Apache-2.0
/// The indexer family on CUDA against the CPU backend (ref/indexer_ref.hpp), all bit for bit:
///   * IndexScore: seeded random queries, weights and keys, ratios 1, 2, 4, rows with nothing visible,
///     a Reindex source (its own queries and weights against another source's keys), scalar and vector
///     loads, the one-thread-per-entry kernel (decode rows) and the 32 × 64 block-tile kernel (prefill rows);
///     −inf where invisible; rows of several sequences through key_base;
///   * IndexTopK: random scores, with and without a candidate mask (scores rewritten in place), K below,
///     at and above the number of finite scores; quantised scores with many exact ties at the cutoff
///     (lower index wins, cutoff_tie reported), long rows (multi-pass radix select);
///   * CandidateBlocks: random and tied block maxima, the forced newest block, rows with nothing visible;
///   * a row's selection does not depend on the other rows of the launch.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tessera/ops/backend_route.hpp"
#include "tessera/ops/indexer.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_attn/gpu_attn_util.hpp"

using namespace tessera;
using namespace tessera::verify;
using namespace tessera::verify::gpu_attn;

namespace {

ExecContext cuda_ctx() {
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  return ctx;
}

struct ScoreCase {
  ops::IndexScoreDesc d;
  std::vector<float> q, w, keys;
  std::vector<int64_t> pos;
};

ScoreCase score_case(uint64_t seed, int64_t rows, int64_t p0, int64_t heads, int64_t di, int64_t entries,
                     int64_t ratio) {
  ScoreCase c;
  c.d = {rows, heads, di, entries, ratio, static_cast<float>(1.0 / std::sqrt(static_cast<double>(di)))};
  c.q = randn(static_cast<size_t>(rows * heads * di), seed + 1);
  c.w = randn(static_cast<size_t>(rows * heads), seed + 2, 0.5f);
  c.keys = randn(static_cast<size_t>(entries * di), seed + 3);
  for (int64_t r = 0; r < rows; ++r) c.pos.push_back(p0 + r);
  return c;
}

std::vector<float> score_cpu(ScoreCase const& c) {
  std::vector<float> s(static_cast<size_t>(c.d.rows * c.d.entries));
  ExecContext ctx;
  Status st = ops::index_score(ctx, c.d,
                               {TensorView<float const, 2>(c.q.data(), {c.d.rows, c.d.heads * c.d.head_dim}),
                                TensorView<float const, 2>(c.w.data(), {c.d.rows, c.d.heads}),
                                TensorView<float const, 2>(c.keys.data(), {c.d.entries, c.d.head_dim}),
                                TensorView<int64_t const, 1>(c.pos.data(), {c.d.rows}),
                                TensorView<float, 2>(s.data(), {c.d.rows, c.d.entries})});
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  return s;
}

std::vector<float> score_gpu(ScoreCase const& c) {
  DevBuf<float> q(c.q), w(c.w), k(c.keys), s(c.d.rows * c.d.entries);
  DevBuf<int64_t> pos(c.pos);
  ExecContext ctx = cuda_ctx();
  Status st = ops::run_on_backend<ops::IndexScore>(
      ctx, c.d,
      ops::IndexScoreArgs{q.cview<2>({c.d.rows, c.d.heads * c.d.head_dim}), w.cview<2>({c.d.rows, c.d.heads}),
                          k.cview<2>({c.d.entries, c.d.head_dim}), pos.cview<1>({c.d.rows}),
                          s.view<2>({c.d.rows, c.d.entries})});
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  return s.host();
}

struct TopkOut {
  std::vector<int32_t> sel;
  std::vector<uint8_t> tie;
  std::vector<float> scores;   // after masking in place
};

TopkOut topk_cpu(std::vector<float> scores, std::vector<uint8_t> const* mask, int64_t rows, int64_t n, int64_t k) {
  TopkOut o;
  o.sel.assign(static_cast<size_t>(rows * k), 7);
  o.tie.assign(static_cast<size_t>(rows), 7);
  ExecContext ctx;
  Status st = ops::index_topk(ctx, {rows, n, k},
                              {TensorView<float, 2>(scores.data(), {rows, n}),
                               mask ? TensorView<uint8_t const, 2>(mask->data(), {rows, n}) : TensorView<uint8_t const, 2>{},
                               TensorView<int32_t, 2>(o.sel.data(), {rows, k}), TensorView<uint8_t, 1>(o.tie.data(), {rows})});
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  o.scores = scores;
  return o;
}

TopkOut topk_gpu(std::vector<float> const& scores, std::vector<uint8_t> const* mask, int64_t rows, int64_t n,
                 int64_t k) {
  DevBuf<float> s(scores);
  DevBuf<uint8_t> m(mask ? *mask : std::vector<uint8_t>{});
  DevBuf<int32_t> sel(std::vector<int32_t>(static_cast<size_t>(rows * k), 7));
  DevBuf<uint8_t> tie(std::vector<uint8_t>(static_cast<size_t>(rows), 7));
  ExecContext ctx = cuda_ctx();
  Status st = ops::run_on_backend<ops::IndexTopK>(
      ctx, ops::IndexTopKDesc{rows, n, k},
      ops::IndexTopKArgs{s.view<2>({rows, n}), mask ? m.cview<2>({rows, n}) : TensorView<uint8_t const, 2>{},
                         sel.view<2>({rows, k}), tie.view<1>({rows})});
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  return {sel.host(), tie.host(), s.host()};
}

void expect_same_topk(TopkOut const& a, TopkOut const& b) {
  BOOST_TEST(a.sel == b.sel, boost::test_tools::per_element());
  BOOST_TEST(a.tie == b.tie, boost::test_tools::per_element());
  BOOST_TEST(bit_mismatches(a.scores, b.scores) == 0);
}

struct CandOut {
  std::vector<uint8_t> mask, tie;
};

CandOut cand_cpu(std::vector<float> const& scores, std::vector<int64_t> const& pos, ops::CandidateBlocksDesc const& d) {
  CandOut o{std::vector<uint8_t>(static_cast<size_t>(d.rows * d.entries), 7), std::vector<uint8_t>(static_cast<size_t>(d.rows), 7)};
  ExecContext ctx;
  Status st = ops::candidate_blocks(ctx, d,
                                    {TensorView<float const, 2>(scores.data(), {d.rows, d.entries}),
                                     TensorView<int64_t const, 1>(pos.data(), {d.rows}),
                                     TensorView<uint8_t, 2>(o.mask.data(), {d.rows, d.entries}),
                                     TensorView<uint8_t, 1>(o.tie.data(), {d.rows})});
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  return o;
}

CandOut cand_gpu(std::vector<float> const& scores, std::vector<int64_t> const& pos, ops::CandidateBlocksDesc const& d) {
  DevBuf<float> s(scores);
  DevBuf<int64_t> p(pos);
  DevBuf<uint8_t> m(std::vector<uint8_t>(static_cast<size_t>(d.rows * d.entries), 7));
  DevBuf<uint8_t> tie(std::vector<uint8_t>(static_cast<size_t>(d.rows), 7));
  ExecContext ctx = cuda_ctx();
  Status st = ops::run_on_backend<ops::CandidateBlocks>(
      ctx, d,
      ops::CandidateBlocksArgs{s.cview<2>({d.rows, d.entries}), p.cview<1>({d.rows}), m.view<2>({d.rows, d.entries}),
                               tie.view<1>({d.rows})});
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  return {m.host(), tie.host()};
}

/// Scores rounded to a few levels: many exact ties; −inf beyond each row's visible count (ratio 1).
std::vector<float> tied_scores(uint64_t seed, int64_t rows, int64_t n, std::vector<int64_t> const& pos, int levels) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  std::vector<float> s(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) s[r * n + j] = j < pos[r] + 1 ? 0.25f * static_cast<float>(d(g)) - 0.5f : -INFINITY;
  return s;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_indexer)

BOOST_AUTO_TEST_CASE(index_score_bitwise) {
  uint64_t const seed = test_seed(0x15C);
  struct Shape { int64_t rows, p0, heads, di, entries, ratio; };
  Shape const shapes[] = {{12, 0, 4, 32, 8, 2},      // early rows see nothing
                          {9, 40, 4, 32, 30, 1},     // ratio 1: the query's own entry is visible
                          {1, 517, 8, 64, 130, 4},   // decode over several tiles
                          {20, 100, 64, 128, 300, 4},  // the released Hi, di
                          {5, 33, 3, 30, 40, 2},     // di not a multiple of 4 (scalar loads)
                          // From kScoreTileMinRows rows on the block-tile kernel: rows and entries off its 32 × 64
                          // tile, tiles wholly in the future, partly visible tiles.
                          {70, 0, 64, 128, 200, 4},
                          {40, 300, 8, 64, 130, 1},
                          {33, 2000, 64, 128, 520, 4},
                          {8, 7, 2, 4, 70, 1}};
  for (Shape const& s : shapes) {
    ScoreCase c = score_case(seed + static_cast<uint64_t>(s.di * 7 + s.entries), s.rows, s.p0, s.heads, s.di,
                             s.entries, s.ratio);
    std::vector<float> cpu = score_cpu(c), gpu = score_gpu(c);
    BOOST_TEST(bit_mismatches(cpu, gpu) == 0);
    // Row invariance: the last row alone gives the same bits (alone it takes the one-thread-per-entry kernel, so
    // from kScoreTileMinRows rows on this also holds the two kernels to each other).
    ScoreCase one = c;
    int64_t const r = c.d.rows - 1, w = c.d.heads * c.d.head_dim;
    one.d.rows = 1;
    one.q.assign(c.q.begin() + r * w, c.q.end());
    one.w.assign(c.w.begin() + r * c.d.heads, c.w.end());
    one.pos = {c.pos[static_cast<size_t>(r)]};
    BOOST_TEST(bit_mismatches(score_gpu(one), std::vector<float>(gpu.begin() + r * c.d.entries, gpu.end())) == 0);
    int64_t finite = 0;
    for (float v : cpu) finite += std::isfinite(v);
    BOOST_TEST_MESSAGE("rows " << s.rows << " entries " << s.entries << ": " << finite << " visible scores");
  }
  // Reindex source: its own queries and weights against the keys another source published.
  ScoreCase src = score_case(seed + 99, 10, 60, 4, 32, 25, 2);
  ScoreCase re = score_case(seed + 199, 10, 60, 4, 32, 25, 2);
  re.keys = src.keys;
  BOOST_TEST(bit_mismatches(score_cpu(re), score_gpu(re)) == 0);
}

// A decode batch of sequences in one call: 40 rows (above kScoreTileMinRows, where a call without key_base would
// take the block tile) at the released Hi, di, each reading its own sequence's keys through key_base; CUDA equals
// the CPU backend bit for bit, and each row equals its sequence's call alone on its first T_i columns.
BOOST_AUTO_TEST_CASE(index_score_key_base_bitwise) {
  uint64_t const seed = test_seed(0x15D);
  int64_t const rows = 40, Hi = 64, di = 128, ratio = 4;
  std::mt19937_64 g(seed);
  std::vector<int64_t> T(static_cast<size_t>(rows)), first(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows));
  int64_t key_rows = 0, Tmax = 0;
  for (int64_t r = 0; r < rows; ++r) {
    pos[r] = static_cast<int64_t>(g() % 900);  // some see nothing (pos < 3)
    if (r % 9 == 4) pos[r] = 1;
    T[r] = (pos[r] + 1) / ratio + static_cast<int64_t>(g() % 3);  // T ≥ visible (the pass's later groups)
    first[r] = key_rows;
    key_rows += T[r];
    Tmax = std::max(Tmax, T[r]);
  }
  ScoreCase c = score_case(seed + 1, rows, 0, Hi, di, key_rows, ratio);
  c.pos = pos;
  c.d.entries = Tmax;
  std::vector<float> cpu(static_cast<size_t>(rows * Tmax), 7.f);
  ExecContext cctx;
  Status st = ops::index_score(cctx, c.d,
                               {TensorView<float const, 2>(c.q.data(), {rows, Hi * di}), TensorView<float const, 2>(c.w.data(), {rows, Hi}),
                                TensorView<float const, 2>(c.keys.data(), {key_rows, di}), TensorView<int64_t const, 1>(pos.data(), {rows}),
                                TensorView<float, 2>(cpu.data(), {rows, Tmax}), TensorView<int64_t const, 1>(first.data(), {rows})});
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  DevBuf<float> q(c.q), w(c.w), k(c.keys), out(std::vector<float>(static_cast<size_t>(rows * Tmax), 7.f));
  DevBuf<int64_t> dpos(pos), dfirst(first);
  ExecContext ctx = cuda_ctx();
  st = ops::run_on_backend<ops::IndexScore>(
      ctx, c.d, ops::IndexScoreArgs{q.cview<2>({rows, Hi * di}), w.cview<2>({rows, Hi}), k.cview<2>({key_rows, di}),
                                    dpos.cview<1>({rows}), out.view<2>({rows, Tmax}), dfirst.cview<1>({rows})});
  BOOST_TEST_REQUIRE(st.ok(), st.to_string());
  std::vector<float> const gpu = out.host();
  BOOST_TEST(bit_mismatches(cpu, gpu) == 0);
  int64_t finite = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (T[r] == 0) continue;
    ScoreCase one = score_case(seed, 1, 0, Hi, di, T[r], ratio);
    one.q.assign(c.q.begin() + r * Hi * di, c.q.begin() + (r + 1) * Hi * di);
    one.w.assign(c.w.begin() + r * Hi, c.w.begin() + (r + 1) * Hi);
    one.keys.assign(c.keys.begin() + first[r] * di, c.keys.begin() + (first[r] + T[r]) * di);
    one.pos = {pos[r]};
    std::vector<float> const alone = score_gpu(one);
    BOOST_TEST(bit_mismatches(alone, std::vector<float>(gpu.begin() + r * Tmax, gpu.begin() + r * Tmax + T[r])) == 0);
    for (int64_t j = T[r]; j < Tmax; ++j) BOOST_TEST((std::isinf(gpu[r * Tmax + j]) && gpu[r * Tmax + j] < 0));
    for (float v : alone) finite += std::isfinite(v);
  }
  BOOST_TEST(finite > 1000);
}

BOOST_AUTO_TEST_CASE(index_topk_random_and_masked) {
  uint64_t const seed = test_seed(0x70B);
  ScoreCase c = score_case(seed, 24, 3, 4, 32, 40, 1);
  std::vector<float> scores = score_cpu(c);
  std::mt19937_64 g(seed + 5);
  std::vector<uint8_t> mask(scores.size());
  for (auto& m : mask) m = static_cast<uint8_t>(g() % 3 != 0);
  for (int64_t k : {1, 6, 17, 40, 64}) {
    expect_same_topk(topk_cpu(scores, nullptr, c.d.rows, c.d.entries, k),
                     topk_gpu(scores, nullptr, c.d.rows, c.d.entries, k));
    expect_same_topk(topk_cpu(scores, &mask, c.d.rows, c.d.entries, k), topk_gpu(scores, &mask, c.d.rows, c.d.entries, k));
  }
}

BOOST_AUTO_TEST_CASE(index_topk_ties_at_the_cutoff) {
  uint64_t const seed = test_seed(0x71E);
  int64_t const rows = 16, n = 300;
  std::vector<int64_t> pos;
  for (int64_t r = 0; r < rows; ++r) pos.push_back(r * 19);
  std::vector<float> s = tied_scores(seed, rows, n, pos, 4);
  int64_t ties = 0;
  for (int64_t k : {1, 5, 32, 100}) {
    TopkOut cpu = topk_cpu(s, nullptr, rows, n, k), gpu = topk_gpu(s, nullptr, rows, n, k);
    expect_same_topk(cpu, gpu);
    for (uint8_t t : cpu.tie) ties += t;
  }
  BOOST_TEST(ties > 0);   // the case exercises the lower-index-wins rule
  // +0 and −0 are one value (float ==): the lower index wins between them too.
  std::vector<float> z{0.f, -0.f, 0.f, -0.f, 1.f, -1.f};
  expect_same_topk(topk_cpu(z, nullptr, 1, 6, 3), topk_gpu(z, nullptr, 1, 6, 3));
}

BOOST_AUTO_TEST_CASE(index_topk_long_rows) {
  uint64_t const seed = test_seed(0x7106);
  int64_t const rows = 3, n = 20000;
  auto s = randn(static_cast<size_t>(rows * n), seed);
  for (int64_t j = 0; j + 1 < rows * n; j += 3) s[j] = s[j + 1];      // exact ties everywhere
  for (int64_t j = 15000; j < n; ++j) s[2 * n + j] = -INFINITY;        // a partly visible row
  for (int64_t k : {512, 2048, 8192}) {
    TopkOut cpu = topk_cpu(s, nullptr, rows, n, k), gpu = topk_gpu(s, nullptr, rows, n, k);
    expect_same_topk(cpu, gpu);
    // Row invariance: the last row alone selects the same entries.
    std::vector<float> last(s.begin() + 2 * n, s.end());
    TopkOut one = topk_gpu(last, nullptr, 1, n, k);
    BOOST_TEST(std::equal(one.sel.begin(), one.sel.end(), gpu.sel.begin() + 2 * k));
  }
  // K beyond the compiled maximum is refused.
  DevBuf<float> ds(s);
  DevBuf<int32_t> sel(int64_t{1});
  DevBuf<uint8_t> tie(int64_t{1});
  BOOST_TEST(!ops::IndexTopK<Backend::kCuda>::check({1, n, ops::kIndexTopKCudaMax + 1},
                                                     {ds.view<2>({1, n}), {}, sel.view<2>({1, ops::kIndexTopKCudaMax + 1}),
                                                      tie.view<1>({1})})
                  .ok());
}

BOOST_AUTO_TEST_CASE(candidate_blocks_vs_cpu) {
  uint64_t const seed = test_seed(0xCB);
  // Random scores from the score op (ratio 2, rows at and before the first visible entry).
  ScoreCase c = score_case(seed, 30, 0, 4, 32, 26, 2);
  std::vector<float> s = score_cpu(c);
  for (int64_t kb : {1, 2, 3, 7, 100}) {
    ops::CandidateBlocksDesc d{c.d.rows, c.d.entries, 2, 4, kb};
    CandOut cpu = cand_cpu(s, c.pos, d), gpu = cand_gpu(s, c.pos, d);
    BOOST_TEST(cpu.mask == gpu.mask, boost::test_tools::per_element());
    BOOST_TEST(cpu.tie == gpu.tie, boost::test_tools::per_element());
  }
  // Tied block maxima (ratio 1).
  int64_t const rows = 12, n = 200;
  std::vector<int64_t> pos;
  for (int64_t r = 0; r < rows; ++r) pos.push_back(r * 17 + 3);
  std::vector<float> t = tied_scores(seed + 1, rows, n, pos, 3);
  int64_t ties = 0;
  for (int64_t kb : {2, 5, 9}) {
    ops::CandidateBlocksDesc d{rows, n, 1, 8, kb};
    CandOut cpu = cand_cpu(t, pos, d), gpu = cand_gpu(t, pos, d);
    BOOST_TEST(cpu.mask == gpu.mask, boost::test_tools::per_element());
    BOOST_TEST(cpu.tie == gpu.tie, boost::test_tools::per_element());
    for (uint8_t x : cpu.tie) ties += x;
    // Row invariance: each row alone.
    for (int64_t r = 0; r < rows; r += 5) {
      ops::CandidateBlocksDesc d1{1, n, 1, 8, kb};
      CandOut one = cand_gpu(std::vector<float>(t.begin() + r * n, t.begin() + (r + 1) * n), {pos[r]}, d1);
      BOOST_TEST(std::equal(one.mask.begin(), one.mask.end(), gpu.mask.begin() + r * n));
      BOOST_TEST(one.tie[0] == gpu.tie[r]);
    }
  }
  BOOST_TEST(ties > 0);
}

BOOST_AUTO_TEST_CASE(bad_arguments) {
  std::vector<float> host(64, 1.f);
  DevBuf<float> s(host);
  DevBuf<int64_t> pos(std::vector<int64_t>{3, 4});
  DevBuf<uint8_t> m(int64_t{64}), tie(int64_t{2});
  ExecContext ctx = cuda_ctx();
  Status st = ops::run_on_backend<ops::CandidateBlocks>(
      ctx, ops::CandidateBlocksDesc{2, 32, 1, 0, 1},
      ops::CandidateBlocksArgs{s.cview<2>({2, 32}), pos.cview<1>({2}), m.view<2>({2, 32}), tie.view<1>({2})});
  BOOST_TEST(!st.ok());
  st = ops::run_on_backend<ops::IndexTopK>(
      ctx, ops::IndexTopKDesc{2, 32, 4},
      ops::IndexTopKArgs{TensorView<float, 2>(host.data(), {2, 32}), {}, DevBuf<int32_t>(int64_t{8}).view<2>({2, 4}),
                         tie.view<1>({2})});
  BOOST_TEST(!st.ok());
  BOOST_TEST(st.message().find("index_topk scores") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// CUDA keyed sampler against the CPU backend on the same batch: greedy picks bitwise equal (lower id wins
/// ties), seeded T > 0 draws give the same token for every (row, position) — the Philox stream is the
/// same bits and the weights differ only by CUDA's fp64 exp (≤ 1 ulp), so a different token would need
/// u·mass within ~1e-13 of a cumulative boundary (none on these seeds) — across temperature, min-p, top-k,
/// top-p, penalties with prompt/output histories and grammar masks. Logprobs and top logprobs: same ids,
/// values within kLogprobTol = 1e-6 (fp64 log/exp rounded to fp32). Row invariance: a row alone gives the
/// bits it gets in the batch. Device-side errors: an all-masked row gives −1, invalid parameters −2.
#include <boost/test/unit_test.hpp>

#include <cmath>

#include "tessera/ops/op_common.hpp"
#include "tessera/ops/sampling.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;
using ops::SamplingRowParams;

namespace {

constexpr double kLogprobTol = 1e-6;

struct Batch {
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits;
  std::vector<SamplingRowParams> params;
  std::vector<uint32_t> mask;  // empty = none
  std::vector<int64_t> prompt_off, out_off;
  std::vector<int32_t> prompt_tok, out_tok;
};

struct Result {
  std::vector<int32_t> tokens, top_ids;
  std::vector<float> lp, top_lp;
  Status status;
};

Result run(Batch const& b, bool gpu, int32_t top_n, ops::LogprobMode mode) {
  ops::SampleDesc d{b.rows, b.vocab, top_n, mode};
  Result r;
  r.tokens.assign(b.rows, -7);
  r.lp.assign(b.rows, 0.f);
  r.top_ids.assign(b.rows * top_n, -1);
  r.top_lp.assign(b.rows * top_n, 0.f);
  int64_t const words = (b.vocab + 31) / 32;
  ops::SampleArgs a;
  if (!gpu) {
    a.logits = {b.logits.data(), {b.rows, b.vocab}};
    a.params = {b.params.data(), {b.rows}};
    if (!b.mask.empty()) a.mask = {b.mask.data(), {b.rows, words}};
    if (!b.prompt_off.empty()) {
      a.prompt_offsets = {b.prompt_off.data(), {b.rows + 1}};
      a.prompt_tokens = {b.prompt_tok.data(), {static_cast<int64_t>(b.prompt_tok.size())}};
    }
    if (!b.out_off.empty()) {
      a.output_offsets = {b.out_off.data(), {b.rows + 1}};
      a.output_tokens = {b.out_tok.data(), {static_cast<int64_t>(b.out_tok.size())}};
    }
    a.tokens = {r.tokens.data(), {b.rows}};
    a.logprobs = {r.lp.data(), {b.rows}};
    if (top_n > 0) {
      a.top_ids = {r.top_ids.data(), {b.rows, top_n}};
      a.top_logprobs = {r.top_lp.data(), {b.rows, top_n}};
    }
    ExecContext ctx;
    r.status = ops::sample(ctx, d, a);
    return r;
  }
  DeviceBuffer<float> dl(b.logits), dlp(r.lp), dtlp(r.top_lp);
  DeviceBuffer<SamplingRowParams> dp(b.params);
  DeviceBuffer<uint32_t> dm(b.mask);
  DeviceBuffer<int64_t> dpo(b.prompt_off), doo(b.out_off);
  DeviceBuffer<int32_t> dpt(b.prompt_tok), dot(b.out_tok), dtok(r.tokens), dtid(r.top_ids);
  a.logits = dl.cview<2>({b.rows, b.vocab});
  a.params = dp.cview<1>({b.rows});
  if (!b.mask.empty()) a.mask = dm.cview<2>({b.rows, words});
  if (!b.prompt_off.empty()) {
    a.prompt_offsets = dpo.cview<1>({b.rows + 1});
    a.prompt_tokens = dpt.cview<1>({static_cast<int64_t>(b.prompt_tok.size())});
  }
  if (!b.out_off.empty()) {
    a.output_offsets = doo.cview<1>({b.rows + 1});
    a.output_tokens = dot.cview<1>({static_cast<int64_t>(b.out_tok.size())});
  }
  a.tokens = dtok.view<1>({b.rows});
  a.logprobs = dlp.view<1>({b.rows});
  if (top_n > 0) {
    a.top_ids = dtid.view<2>({b.rows, top_n});
    a.top_logprobs = dtlp.view<2>({b.rows, top_n});
  }
  ExecContext ctx = cuda_ctx();
  r.status = ops::dispatch<ops::Sample>(ctx, d, a);
  r.tokens = dtok.get();
  r.lp = dlp.get();
  r.top_ids = dtid.get();
  r.top_lp = dtlp.get();
  return r;
}

/// Row `r` of a batch as a batch of one (histories and mask included).
Batch single(Batch const& b, int64_t r) {
  Batch o;
  o.rows = 1;
  o.vocab = b.vocab;
  o.logits = row_slice(b.logits, b.vocab, r);
  o.params = {b.params[r]};
  if (!b.mask.empty()) o.mask = row_slice(b.mask, (b.vocab + 31) / 32, r);
  if (!b.prompt_off.empty()) {
    o.prompt_off = {0, b.prompt_off[r + 1] - b.prompt_off[r]};
    o.prompt_tok.assign(b.prompt_tok.begin() + b.prompt_off[r], b.prompt_tok.begin() + b.prompt_off[r + 1]);
  }
  if (!b.out_off.empty()) {
    o.out_off = {0, b.out_off[r + 1] - b.out_off[r]};
    o.out_tok.assign(b.out_tok.begin() + b.out_off[r], b.out_tok.begin() + b.out_off[r + 1]);
  }
  return o;
}

/// A batch of `kinds` parameter sets × `reps` positions each, on random logits with a few exact ties.
Batch make_batch(int64_t vocab, int reps, uint64_t seed) {
  std::vector<SamplingRowParams> kinds(9);
  kinds[0].temperature = 0.f;
  kinds[1].temperature = 0.f;
  kinds[1].repetition_penalty = 1.4f;
  kinds[1].frequency_penalty = 0.6f;
  kinds[2].temperature = 0.8f;
  kinds[3].top_k = 20;
  kinds[4].temperature = 0.7f;
  kinds[4].top_p = 0.9f;
  kinds[5].temperature = 1.2f;
  kinds[5].min_p = 0.05f;
  kinds[5].top_k = 50;
  kinds[5].top_p = 0.8f;
  kinds[6].repetition_penalty = 1.3f;
  kinds[6].frequency_penalty = 0.5f;
  kinds[6].presence_penalty = 0.3f;
  kinds[7].temperature = 1.5f;       // with the grammar mask below
  kinds[8].temperature = 0.3f;
  kinds[8].top_p = 0.5f;
  Batch b;
  b.vocab = vocab;
  b.rows = static_cast<int64_t>(kinds.size()) * reps;
  b.logits = randn(static_cast<size_t>(b.rows * vocab), seed, 3.f);
  std::mt19937_64 g(seed + 1);
  int64_t const words = (vocab + 31) / 32;
  b.mask.assign(static_cast<size_t>(b.rows * words), 0xFFFFFFFFu);
  b.prompt_off = {0};
  b.out_off = {0};
  for (int64_t r = 0; r < b.rows; ++r) {
    SamplingRowParams p = kinds[r % kinds.size()];
    p.seed = 1234 + static_cast<uint64_t>(r % 3);
    p.stream_key = 0xABCDEF0000ull + static_cast<uint64_t>(r);
    p.position = 17 + r * 13;
    b.params.push_back(p);
    float* row = &b.logits[r * vocab];
    for (int i = 0; i < 5; ++i) row[g() % vocab] = std::nanf("");
    float mx = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) mx = std::isnan(row[v]) ? mx : std::max(mx, row[v]);
    row[vocab / 3] = row[vocab / 2] = mx + 0.5f;  // exact tie on top: the lower id wins when greedy
    if (r % kinds.size() == 7)
      for (int64_t w = 0; w < words; ++w) b.mask[r * words + w] = static_cast<uint32_t>(g()) | 1u;
    for (int i = 0, n = static_cast<int>(g() % 9); i < n; ++i) b.prompt_tok.push_back(static_cast<int32_t>(g() % vocab));
    b.prompt_tok.push_back(static_cast<int32_t>(vocab / 3));
    b.prompt_off.push_back(static_cast<int64_t>(b.prompt_tok.size()));
    for (int i = 0, n = static_cast<int>(g() % 12); i < n; ++i) b.out_tok.push_back(static_cast<int32_t>(g() % 40));
    b.out_off.push_back(static_cast<int64_t>(b.out_tok.size()));
  }
  return b;
}

}  // namespace

BOOST_AUTO_TEST_CASE(sampler_matches_cpu_tokens_and_logprobs) {
  uint64_t const seed = test_seed(531);
  for (int64_t vocab : {1000, 32003}) {
    Batch const b = make_batch(vocab, vocab > 5000 ? 6 : 40, seed + vocab);
    for (auto mode : {ops::LogprobMode::kRaw, ops::LogprobMode::kProcessed}) {
      int32_t const top_n = 5;
      auto cpu = run(b, false, top_n, mode);
      BOOST_REQUIRE_MESSAGE(cpu.status.ok(), cpu.status.to_string());
      auto gpu = run(b, true, top_n, mode);
      BOOST_REQUIRE_MESSAGE(gpu.status.ok(), gpu.status.to_string());
      int64_t diff_tok = 0, diff_lp = 0, diff_top = 0;
      for (int64_t r = 0; r < b.rows; ++r) {
        if (gpu.tokens[r] != cpu.tokens[r]) {
          ++diff_tok;
          BOOST_TEST_MESSAGE("row " << r << " token " << gpu.tokens[r] << " vs cpu " << cpu.tokens[r]);
          continue;
        }
        diff_lp += std::fabs(double(gpu.lp[r]) - cpu.lp[r]) > kLogprobTol;
        for (int32_t j = 0; j < top_n; ++j) {
          diff_top += gpu.top_ids[r * top_n + j] != cpu.top_ids[r * top_n + j];
          diff_lp += std::fabs(double(gpu.top_lp[r * top_n + j]) - cpu.top_lp[r * top_n + j]) > kLogprobTol;
        }
      }
      BOOST_TEST_INFO("vocab=" << vocab << " mode=" << int(mode));
      BOOST_TEST(diff_tok == 0);
      BOOST_TEST(diff_lp == 0);
      BOOST_TEST(diff_top == 0);
      std::printf("sampler vocab=%lld mode=%d: %lld rows, %lld token mismatches\n", static_cast<long long>(vocab),
                  int(mode), static_cast<long long>(b.rows), static_cast<long long>(diff_tok));
      // Greedy tie rows pick the lower of the two tied ids.
      for (int64_t r = 0; r < b.rows; r += 9) BOOST_TEST(gpu.tokens[r] == vocab / 3);
      // Row invariance.
      for (int64_t r : {int64_t{3}, int64_t{13}, b.rows - 1}) {
        auto one = run(single(b, r), true, top_n, mode);
        BOOST_TEST(one.tokens[0] == gpu.tokens[r]);
        BOOST_TEST(count_bit_diffs(one.lp, {gpu.lp[r]}, "lp alone") == 0);
        BOOST_TEST(count_bit_diffs(one.top_lp, row_slice(gpu.top_lp, top_n, r), "top lp alone") == 0);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sampler_device_errors) {
  uint64_t const seed = test_seed(532);
  Batch b;
  b.rows = 3;
  b.vocab = 100;
  b.logits = randn(300, seed);
  b.params.resize(3);
  b.params[1].top_p = 0.f;                        // invalid
  b.mask.assign(static_cast<size_t>(3 * 4), 0xFFFFFFFFu);
  for (int w = 0; w < 4; ++w) b.mask[2 * 4 + w] = 0;  // row 2: everything masked
  auto gpu = run(b, true, 0, ops::LogprobMode::kRaw);
  BOOST_REQUIRE_MESSAGE(gpu.status.ok(), gpu.status.to_string());
  BOOST_TEST(gpu.tokens[0] >= 0);
  BOOST_TEST(gpu.tokens[1] == -2);
  BOOST_TEST(gpu.tokens[2] == -1);
}

// SPDX-License-Identifier: Apache-2.0
/// CPU backend of the keyed sampler: validation, then the reference of
/// include/tessera/ref/sampling_ref.hpp row by row (rows are independent, so the thread split
/// cannot change a result).
#include <algorithm>
#include <cmath>
#include <string>

#include "tessera/core/concepts.hpp"
#include "tessera/core/thread_pool.hpp"
#include "tessera/ops/sampling.hpp"
#include "tessera/ref/sampling_ref.hpp"

namespace tessera::ops {
namespace {

std::string row_field(int64_t r, char const* field) {
  return "sample: row " + std::to_string(r) + ": " + field;
}

Status check_csr(TensorView<int64_t const, 1> const& off, TensorView<int32_t const, 1> const& tok,
                 int64_t rows, char const* name) {
  if (off.empty()) return {};
  TESSERA_CHECK(off.shape[0] == rows + 1,
                std::string("sample: ") + name + "_offsets must have num_rows + 1 entries");
  for (int64_t r = 0; r < rows; ++r)
    TESSERA_CHECK(off(r) >= 0 && off(r) <= off(r + 1) && off(r + 1) <= tok.shape[0],
                  std::string("sample: ") + name +
                      "_offsets not monotone within the token list at row " + std::to_string(r));
  return {};
}

std::span<int32_t const> csr_row(TensorView<int64_t const, 1> const& off,
                                 TensorView<int32_t const, 1> const& tok, int64_t r) {
  if (off.empty()) return {};
  return {tok.data + off(r), static_cast<size_t>(off(r + 1) - off(r))};
}

}  // namespace

Status Sample<Backend::kCpu>::check(SampleDesc const& d, SampleArgs const& a) {
  TESSERA_CHECK(d.num_rows >= 0 && d.vocab_size > 0,
                "sample: num_rows must be ≥ 0 and vocab_size > 0");
  TESSERA_CHECK(d.num_top_logprobs >= 0 && d.num_top_logprobs <= d.vocab_size,
                "sample: num_top_logprobs must be in [0, vocab_size]");
  TESSERA_CHECK(a.logits.shape[0] == d.num_rows && a.logits.shape[1] == d.vocab_size &&
                    a.logits.stride[1] == 1,
                "sample: logits must be [num_rows, vocab_size] with unit inner stride");
  TESSERA_CHECK(a.params.shape[0] == d.num_rows, "sample: params must have num_rows entries");
  TESSERA_CHECK(a.tokens.shape[0] == d.num_rows, "sample: tokens must have num_rows entries");
  if (!a.mask.empty())
    TESSERA_CHECK(a.mask.shape[0] == d.num_rows && a.mask.shape[1] == (d.vocab_size + 31) / 32 &&
                      a.mask.stride[1] == 1,
                  "sample: mask must be [num_rows, ceil(vocab_size/32)] words");
  if (!a.logprobs.empty())
    TESSERA_CHECK(a.logprobs.shape[0] == d.num_rows, "sample: logprobs must be [num_rows]");
  if (d.num_top_logprobs > 0)
    TESSERA_CHECK(a.top_ids.shape[0] == d.num_rows && a.top_ids.shape[1] == d.num_top_logprobs &&
                      a.top_logprobs.shape[0] == d.num_rows &&
                      a.top_logprobs.shape[1] == d.num_top_logprobs,
                  "sample: top_ids/top_logprobs must be [num_rows, num_top_logprobs]");
  TESSERA_TRY(check_csr(a.prompt_offsets, a.prompt_tokens, d.num_rows, "prompt"));
  TESSERA_TRY(check_csr(a.output_offsets, a.output_tokens, d.num_rows, "output"));
  for (int64_t r = 0; r < d.num_rows; ++r) {
    SamplingRowParams const& p = a.params(r);
    TESSERA_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.f,
                  row_field(r, "temperature must be ≥ 0"));
    TESSERA_CHECK(p.top_p > 0.f && p.top_p <= 1.f, row_field(r, "top_p must be in (0, 1]"));
    TESSERA_CHECK(p.min_p >= 0.f && p.min_p <= 1.f, row_field(r, "min_p must be in [0, 1]"));
    TESSERA_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.f,
                  row_field(r, "repetition_penalty must be > 0"));
    TESSERA_CHECK(std::isfinite(p.presence_penalty) && std::isfinite(p.frequency_penalty),
                  row_field(r, "presence/frequency penalties must be finite"));
    TESSERA_CHECK(p.position >= 0, row_field(r, "position must be ≥ 0"));
  }
  return {};
}

Status Sample<Backend::kCpu>::run(SampleDesc const& d, SampleArgs const& a, ExecContext& ctx) {
  int64_t const v_size = d.vocab_size;
  std::vector<int64_t> failed(static_cast<size_t>(d.num_rows), 0);
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      SamplingRowParams const& p = a.params(r);
      std::span<float const> const row(&a.logits(r, 0), static_cast<size_t>(v_size));
      uint32_t const* mask = a.mask.empty() ? nullptr : &a.mask(r, 0);
      auto const prompt = csr_row(a.prompt_offsets, a.prompt_tokens, r);
      auto const output = csr_row(a.output_offsets, a.output_tokens, r);
      std::vector<double> l = ref::penalized_logits(row, p, mask, prompt, output);
      int32_t tok;
      if (p.temperature > 0.f) {
        std::vector<double> const w = ref::kept_weights(l, p);
        tok = ref::draw(w, keyed_uniform(p.seed, p.stream_key, p.position));
      } else {
        tok = ref::argmax_first(l);
      }
      a.tokens(r) = tok;
      if (tok < 0) {
        failed[r] = 1;
        continue;
      }
      if (a.logprobs.empty() && d.num_top_logprobs == 0) continue;
      std::vector<double> src;
      if (d.logprob_mode == LogprobMode::kRaw) {
        src.resize(row.size());
        for (size_t v = 0; v < row.size(); ++v)
          src[v] = std::isnan(row[v]) ? ref::kNegInf : double(row[v]);
      } else {
        double const t = p.temperature > 0.f ? double(p.temperature) : 1.0;
        for (auto& x : l)
          if (x != ref::kNegInf) x /= t;
        src = std::move(l);
      }
      std::vector<double> const lp = ref::log_softmax(src);
      if (!a.logprobs.empty()) a.logprobs(r) = static_cast<float>(lp[tok]);
      if (d.num_top_logprobs > 0) {
        std::vector<int32_t> ids(lp.size());
        std::iota(ids.begin(), ids.end(), 0);
        std::partial_sort(
            ids.begin(), ids.begin() + d.num_top_logprobs, ids.end(),
            [&](int32_t x, int32_t y) { return lp[x] != lp[y] ? lp[x] > lp[y] : x < y; });
        for (int32_t j = 0; j < d.num_top_logprobs; ++j) {
          a.top_ids(r, j) = ids[j];
          a.top_logprobs(r, j) = static_cast<float>(lp[ids[j]]);
        }
      }
    }
  };
  if (ctx.pool)
    ctx.pool->parallel_for(d.num_rows, body);
  else
    parallel_for(d.num_rows, body);
  for (int64_t r = 0; r < d.num_rows; ++r)
    if (failed[r])
      return invalid_argument(row_field(r, "every token is masked or −∞; nothing can be sampled"));
  return {};
}

static_assert(BackendOp<Sample<Backend::kCpu>, SampleDesc, SampleArgs>);

Status sample(ExecContext& ctx, SampleDesc const& d, SampleArgs const& a) {
  if (ctx.backend != Backend::kCpu)
    return not_supported("sample: only the CPU backend is implemented");
  TESSERA_TRY(Sample<Backend::kCpu>::check(d, a));
  return Sample<Backend::kCpu>::run(d, a, ctx);
}

}  // namespace tessera::ops

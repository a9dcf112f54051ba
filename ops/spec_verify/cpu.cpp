// SPDX-License-Identifier: Apache-2.0
/// CPU backend of spec_verify: one keyed sampler launch over the k + 1 verify rows (row i keyed at
/// position p₀ + i, output history out ++ d₀ … d_{i−1} in CSR form), then the longest-prefix scan.
#include <string>
#include <vector>

#include "tessera/core/concepts.hpp"
#include "tessera/ops/spec_verify.hpp"

namespace tessera::ops {

Status SpecVerify<Backend::kCpu>::check(SpecVerifyDesc const& d, SpecVerifyArgs const& a) {
  int64_t const rows = d.num_drafts + 1;
  if (d.num_drafts < 0 || d.vocab_size <= 0) return invalid_argument("spec_verify: num_drafts must be ≥ 0 and vocab_size > 0");
  if (a.logits.shape[0] != rows || a.logits.shape[1] != d.vocab_size)
    return invalid_argument("spec_verify: logits must be [num_drafts + 1, vocab_size]");
  if (a.drafts.shape[0] != d.num_drafts) return invalid_argument("spec_verify: drafts must have num_drafts entries");
  if (a.choices.shape[0] != rows) return invalid_argument("spec_verify: choices must have num_drafts + 1 entries");
  if (!a.num_accepted) return invalid_argument("spec_verify: num_accepted output missing");
  if (!a.masks.empty() && (a.masks.shape[0] != rows || a.masks.shape[1] != (d.vocab_size + 31) / 32))
    return invalid_argument("spec_verify: masks must be [num_drafts + 1, ceil(vocab_size / 32)]");
  for (int64_t i = 0; i < d.num_drafts; ++i)
    if (a.drafts(i) < 0 || a.drafts(i) >= d.vocab_size)
      return invalid_argument("spec_verify: draft " + std::to_string(i) + " (id " + std::to_string(a.drafts(i)) +
                              ") outside the vocabulary");
  return {};
}

Status SpecVerify<Backend::kCpu>::run(SpecVerifyDesc const& d, SpecVerifyArgs const& a, ExecContext& ctx) {
  int64_t const k = d.num_drafts, rows = k + 1;
  int64_t const no = a.output_tokens.shape[0], np = a.prompt_tokens.shape[0];
  // Row i: prompt as given; output = out ++ d₀ … d_{i−1}.
  std::vector<int32_t> prompt_csr, out_csr;
  std::vector<int64_t> prompt_off(rows + 1, 0), out_off(rows + 1, 0);
  std::vector<SamplingRowParams> params(rows, a.params);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < np; ++j) prompt_csr.push_back(a.prompt_tokens(j));
    for (int64_t j = 0; j < no; ++j) out_csr.push_back(a.output_tokens(j));
    for (int64_t j = 0; j < i; ++j) out_csr.push_back(a.drafts(j));
    prompt_off[i + 1] = static_cast<int64_t>(prompt_csr.size());
    out_off[i + 1] = static_cast<int64_t>(out_csr.size());
    params[i].position = a.params.position + i;
  }
  SampleArgs s;
  s.logits = a.logits;
  s.params = TensorView<SamplingRowParams const, 1>(params.data(), {rows});
  s.mask = a.masks;
  s.prompt_offsets = TensorView<int64_t const, 1>(prompt_off.data(), {rows + 1});
  s.prompt_tokens = TensorView<int32_t const, 1>(prompt_csr.data(), {static_cast<int64_t>(prompt_csr.size())});
  s.output_offsets = TensorView<int64_t const, 1>(out_off.data(), {rows + 1});
  s.output_tokens = TensorView<int32_t const, 1>(out_csr.data(), {static_cast<int64_t>(out_csr.size())});
  s.tokens = a.choices;
  TESSERA_TRY(Sample<Backend::kCpu>::run(SampleDesc{rows, d.vocab_size, 0, LogprobMode::kRaw}, s, ctx));
  int64_t acc = 0;
  while (acc < k && a.drafts(acc) == a.choices(acc)) ++acc;
  *a.num_accepted = acc;
  return {};
}

static_assert(BackendOp<SpecVerify<Backend::kCpu>, SpecVerifyDesc, SpecVerifyArgs>);

Status spec_verify(ExecContext& ctx, SpecVerifyDesc const& d, SpecVerifyArgs const& a) {
  if (ctx.backend != Backend::kCpu) return not_supported("spec_verify: only the CPU backend is built");
  TESSERA_TRY(SpecVerify<Backend::kCpu>::check(d, a));
  return SpecVerify<Backend::kCpu>::run(d, a, ctx);
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// Sequential reference of ops/spec_verify.hpp, written as serial decoding would run it: for i = 0, 1, …
/// sample row i alone (one-row keyed sampler call at position p₀ + i, output history out ++ the tokens
/// emitted so far in this round), emit it, and continue only while it equals draft i.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/core/context.hpp"
#include "tessera/core/status.hpp"
#include "tessera/ops/sampling.hpp"

namespace tessera::ref {

/// The tokens a verify round emits (accepted drafts then the target's token), as serial decoding
/// produces them. logits: [drafts.size() + 1, V] row-major; masks: empty or [rows, ceil(V/32)].
inline std::vector<int32_t> spec_verify_sequential(std::span<float const> logits, int64_t V,
                                                   std::span<int32_t const> drafts, ops::SamplingRowParams p,
                                                   std::span<uint32_t const> masks, std::span<int32_t const> prompt,
                                                   std::span<int32_t const> output) {
  std::vector<int32_t> hist(output.begin(), output.end()), emitted;
  int64_t const words = (V + 31) / 32;
  ExecContext ctx;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    ops::SamplingRowParams row = p;
    row.position = p.position + static_cast<int64_t>(i);
    int64_t po[2] = {0, static_cast<int64_t>(prompt.size())}, oo[2] = {0, static_cast<int64_t>(hist.size())};
    int32_t tok = -1;
    ops::SampleArgs a;
    a.logits = TensorView<float const, 2>(logits.data() + i * V, {1, V});
    a.params = TensorView<ops::SamplingRowParams const, 1>(&row, {1});
    if (!masks.empty()) a.mask = TensorView<uint32_t const, 2>(masks.data() + i * words, {1, words});
    a.prompt_offsets = TensorView<int64_t const, 1>(po, {2});
    a.prompt_tokens = TensorView<int32_t const, 1>(prompt.data(), {static_cast<int64_t>(prompt.size())});
    a.output_offsets = TensorView<int64_t const, 1>(oo, {2});
    a.output_tokens = TensorView<int32_t const, 1>(hist.data(), {static_cast<int64_t>(hist.size())});
    a.tokens = TensorView<int32_t, 1>(&tok, {1});
    throw_if_error(ops::sample(ctx, {1, V, 0, ops::LogprobMode::kRaw}, a));
    emitted.push_back(tok);
    hist.push_back(tok);
    if (i == drafts.size() || tok != drafts[i]) break;
  }
  return emitted;
}

}  // namespace tessera::ref

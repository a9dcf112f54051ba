// SPDX-License-Identifier: Apache-2.0
/// Keyed token sampler used by the engine. The chosen token is a function of (logits, params, seed,
/// reply position) only, so a seeded request gives the same reply alone or batched. Transform order
/// (as vLLM): penalties on the raw logits → allowed mask → temperature → top-k → top-p → min-p → draw
/// u = hash(seed, position) ∈ [0,1) against the cumulative distribution in token-id order.
/// temperature 0 (or top_k 1) = argmax, lowest id on ties.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "servers/openai/engine/types.hpp"

namespace tessera::server {

/// A uniform double in [0,1) from (seed, position): splitmix64 of both, 53 mantissa bits.
double keyed_uniform(uint64_t seed, int64_t position);

/// `logits` is modified in place (penalties, mask). `reply` = tokens generated so far for the penalties.
/// `allowed` (optional, vocab-sized) forbids tokens with 0. Returns the chosen token.
int32_t sample_token(std::span<float> logits, SamplingParams const& p, int64_t position,
                     std::span<int32_t const> reply, std::vector<uint8_t> const* allowed);

/// log_softmax(logits)[token] and the `k` best (logprob desc, id asc on ties).
void token_logprobs(std::span<float const> logits, int32_t token, int32_t k, float& logprob,
                    std::vector<TopLogprob>& top);

}  // namespace tessera::server

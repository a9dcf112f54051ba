// SPDX-License-Identifier: Apache-2.0
/// Speculative verification (design/ARCHITECTURE.md §7.4 `spec_verify`, spec/seed-notes.md §4): the
/// target ran one forward over [x₀ ; d₀ … d_{k−1}] (the pending token and k drafts) and produced k + 1
/// logits rows. Row i is the target's distribution for the token at absolute position p₀ + i, given
/// the drafts d₀ … d_{i−1} before it. The op takes the request's *keyed* choice at every row,
///   c_i = sample(row i, key = (seed, stream, p₀ + i), output history = out ++ d₀ … d_{i−1}, mask_i),
/// (argmax at T = 0, the keyed Philox draw of ops/sampling.hpp at T > 0), accepts the longest prefix
///   a = max { j ≤ k : d_i = c_i for all i < j },
/// and emits c₀ … c_a (a + 1 tokens). Because row i's choice is computed exactly as serial decoding
/// computes the token at p₀ + i when the previous tokens were d₀ … d_{i−1} = c₀ … c_{i−1}, the emitted
/// tokens equal the serial tokens whatever the drafts are (any drafter, depth or acceptance).
/// Rows past a are sampled too (their choices are computed but not emitted).
#pragma once

#include <cstdint>
#include <ostream>

#include "tessera/core/config.hpp"
#include "tessera/core/context.hpp"
#include "tessera/core/status.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/ops/sampling.hpp"

namespace tessera::ops {

struct SpecVerifyDesc {
  int64_t num_drafts = 0;  // k; the logits have k + 1 rows
  int64_t vocab_size = 0;
  friend bool operator==(SpecVerifyDesc const&, SpecVerifyDesc const&) = default;
  friend std::ostream& operator<<(std::ostream& os, SpecVerifyDesc const& d) {
    return os << "SpecVerifyDesc{k=" << d.num_drafts << ", vocab=" << d.vocab_size << "}";
  }
};

struct SpecVerifyArgs {
  TensorView<float const, 2> logits;        // [k+1, V] target logits of the verify window
  TensorView<int32_t const, 1> drafts;      // [k]
  SamplingRowParams params;                 // the request's sampler; `position` = p₀ (row 0's token)
  TensorView<uint32_t const, 2> masks;      // [k+1, ceil(V/32)] grammar masks per row; empty = none
  TensorView<int32_t const, 1> prompt_tokens;  // the prompt (repetition penalty)
  TensorView<int32_t const, 1> output_tokens;  // tokens generated before row 0 (all penalties)
  TensorView<int32_t, 1> choices;           // [k+1] out: the keyed choice of every row
  int64_t* num_accepted = nullptr;          // out: a ∈ [0, k]; the round emits choices[0..a]
};

template <Backend B>
struct SpecVerify;

template <>
struct SpecVerify<Backend::kCpu> {
  static Status check(SpecVerifyDesc const&, SpecVerifyArgs const&);
  static Status run(SpecVerifyDesc const&, SpecVerifyArgs const&, ExecContext&);
};

/// Entry point: validates, then runs the backend named by ctx (CPU only for now).
Status spec_verify(ExecContext&, SpecVerifyDesc const&, SpecVerifyArgs const&);

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// Keyed sampler: logits [R, V] → one token per row, plus the chosen token's logprob and the top-n
/// logprobs. Randomness is a pure function of (seed, stream key, absolute position) through the
/// counter-based Philox4x32-10 generator, so a row's token never depends on which other rows share
/// the launch, on batching or on speculative drafting (ARCHITECTURE.md §7.4 `sampling`, §13.3).
///
/// Pipeline per row r (vLLM/OpenAI semantics; each stage is off at its neutral value):
///   1. penalties on the raw logits l (float):
///        repetition ρ ≠ 1 (vLLM/HF): for every token that occurs in the prompt or the output so
///        far,
///          l ← l / ρ if l > 0, else l · ρ;
///        frequency φ, presence π (OpenAI): l ← l − φ·c − π·[c > 0], c = count of the token in the
///          output so far (prompt tokens do not count);
///   2. logit mask: bit (v mod 32) of word ⌊v/32⌋ clear → l_v = −∞ (grammar constraint);
///   3. temperature T: T = 0 → greedy: the first index of the maximum (lowest id wins ties);
///      T > 0 → z = l / T, p ∝ exp(z − max z) in double precision;
///   4. min-p: keep p_v ≥ min_p · max p;  5. top-k: keep the k largest (ties: lower id first);
///   6. top-p: sort the kept tokens by (p desc, id asc) and keep rank j iff the mass of the ranks
///   before
///      j is < top_p · (kept mass), so at least one token survives;
///   7. draw u ∈ [0, 1) = 53 bits of Philox(counter = (pos lo, pos hi, key lo, key hi),
///      key = (seed lo, seed hi)) and return the first kept token, in ascending id order, whose
///      cumulative kept mass exceeds u · (kept mass).
/// Logprobs (OpenAI `logprobs`/`top_logprobs`): log-softmax of the **raw** logits by default, as
/// vLLM's default `raw_logprobs` mode; `LogprobMode::kProcessed` uses the logits after stages 1–3
/// (penalties, mask, temperature; T = 0 counts as T = 1), before the min-p/top-k/top-p truncation.
/// Top entries are ordered by (logprob desc, id asc). NaN logits count as −∞.
#pragma once

#include <cstdint>
#include <ostream>

#include "tessera/core/config.hpp"
#include "tessera/core/context.hpp"
#include "tessera/core/status.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera {

/// Philox4x32-10 (Salmon et al., SC'11): 10 rounds of the 4×32 multiply-xor network with the Weyl
/// key schedule; matches Random123's known-answer vectors. Usable from host and device code.
struct Philox4x32 {
  static constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  static constexpr uint32_t kW0 = 0x9E3779B9u,
                            kW1 = 0xBB67AE85u;  // key increments (golden ratio, √3−1)
  struct Block {
    uint32_t v[4];
  };

  TESSERA_HOST_DEVICE static constexpr Block generate(Block ctr, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; ++round) {
      uint64_t const p0 = uint64_t{kM0} * ctr.v[0];
      uint64_t const p1 = uint64_t{kM1} * ctr.v[2];
      uint32_t const hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
      uint32_t const hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
      ctr = Block{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
      k0 += kW0;
      k1 += kW1;
    }
    return ctr;
  }
};

/// The sampler's uniform draw u ∈ [0, 1) for (seed, stream key, absolute position): the top 53 bits
/// of words 0 and 1 of the Philox block, scaled by 2^-53. Words 2 and 3 are reserved for future
/// draws.
TESSERA_HOST_DEVICE constexpr double keyed_uniform(uint64_t seed, uint64_t stream_key,
                                                   int64_t position) {
  uint64_t const pos = static_cast<uint64_t>(position);
  Philox4x32::Block const b =
      Philox4x32::generate(Philox4x32::Block{{uint32_t(pos), uint32_t(pos >> 32),
                                              uint32_t(stream_key), uint32_t(stream_key >> 32)}},
                           uint32_t(seed), uint32_t(seed >> 32));
  uint64_t const bits = ((uint64_t{b.v[0]} << 32) | b.v[1]) >> 11;  // 53 bits
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);    // 2^-53
}

namespace ops {

/// Per-row sampling parameters (OpenAI request fields plus the key of the RNG stream).
struct SamplingRowParams {
  float temperature = 1.f;         // 0 → greedy
  int32_t top_k = 0;               // ≤ 0 → off
  float top_p = 1.f;               // (0, 1]; 1 → off
  float min_p = 0.f;               // [0, 1]; 0 → off
  float presence_penalty = 0.f;    // OpenAI, [-2, 2]
  float frequency_penalty = 0.f;   // OpenAI, [-2, 2]
  float repetition_penalty = 1.f;  // vLLM, > 0; 1 → off
  uint64_t seed = 0;               // request seed
  uint64_t stream_key = 0;         // request id / stream key
  int64_t position = 0;            // absolute position of the token being sampled
};

enum class LogprobMode : uint8_t { kRaw, kProcessed };

/// Everything that selects an implementation.
struct SampleDesc {
  int64_t num_rows = 0, vocab_size = 0;
  int32_t num_top_logprobs = 0;  // 0 → no top list; OpenAI allows ≤ 20
  LogprobMode logprob_mode = LogprobMode::kRaw;
  friend bool operator==(SampleDesc const&, SampleDesc const&) = default;
  friend std::ostream& operator<<(std::ostream& os, SampleDesc const& d) {
    return os << "SampleDesc{rows=" << d.num_rows << ", vocab=" << d.vocab_size
              << ", top=" << d.num_top_logprobs
              << ", mode=" << (d.logprob_mode == LogprobMode::kRaw ? "raw" : "processed") << "}";
  }
};

/// Token histories are CSR: row r owns tokens[offsets[r] .. offsets[r+1]). Empty views = none.
struct SampleArgs {
  TensorView<float const, 2> logits;              // [R, V]
  TensorView<SamplingRowParams const, 1> params;  // [R]
  TensorView<uint32_t const, 2> mask;           // [R, ceil(V/32)] allowed bits; empty = all allowed
  TensorView<int64_t const, 1> prompt_offsets;  // [R+1]  prompt tokens (repetition penalty only)
  TensorView<int32_t const, 1> prompt_tokens;   // [Np]
  TensorView<int64_t const, 1> output_offsets;  // [R+1]  generated tokens (all penalties)
  TensorView<int32_t const, 1> output_tokens;   // [No]
  TensorView<int32_t, 1> tokens;                // [R]    out: sampled ids
  TensorView<float, 1> logprobs;                // [R]    out (optional): logprob of the sampled id
  TensorView<int32_t, 2> top_ids;               // [R, n] out (optional)
  TensorView<float, 2> top_logprobs;            // [R, n] out (optional)
};

template <Backend B>
struct Sample;

template <>
struct Sample<Backend::kCpu> {
  static Status check(SampleDesc const&, SampleArgs const&);
  static Status run(SampleDesc const&, SampleArgs const&, ExecContext&);
};

/// CUDA backend (kernels/sampling/sampling_cuda.cu, builds with CUDA only). Every view holds device
/// memory, `params` included; check() validates shapes only. Per-row parameters are validated on the device:
/// a row whose parameters are invalid gets token −2, a row where every token is masked or −∞ gets −1 (the
/// CPU returns an error for both; run() does not synchronise, so the caller inspects `tokens`).
/// Same stages and the same keyed Philox draw as the CPU; greedy (T = 0) picks bitwise the same token; for
/// T > 0 the kept weights use CUDA's fp64 exp and block-order sums, so the token equals the CPU's unless
/// u·(kept mass) or top_p·(mass) falls within ~1e-13 (relative) of a cumulative boundary.
/// Workspace: workspace_bytes(desc) (ctx.workspace when large enough, else stream-ordered allocation).
template <>
struct Sample<Backend::kCuda> {
  static size_t workspace_bytes(SampleDesc const&);
  static Status check(SampleDesc const&, SampleArgs const&);
  static Status run(SampleDesc const&, SampleArgs const&, ExecContext&);
};

/// Entry point: validates, then runs the backend named by ctx (CPU only for now).
Status sample(ExecContext&, SampleDesc const&, SampleArgs const&);

}  // namespace ops
}  // namespace tessera

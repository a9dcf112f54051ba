// SPDX-License-Identifier: Apache-2.0
/// The Engram hash state (spec/deepseek-v41.md §2.4.1): primes, offsets, multipliers and the compressed
/// token map. Primes and offsets are pure arithmetic (smallest unused primes above engram_vocab_size − 1,
/// per (layer, n-gram size) slot; exclusive prefix sums) and are computed here. The multipliers come from
/// numpy's PCG64 and the token map from the tokenizer's decode + normaliser: both are STORED DATA, never
/// recomputed in C++. They are read from int64 tensors
///   `engram_hash.multipliers` [L_e, N] and `engram_hash.token_map` [V]
/// in the model folder (any safetensors file, e.g. written by a conversion step or make-synthetic), or
/// from the golden's `static.engram.multipliers` / `static.engram.token_map`. If primes/offsets are
/// stored too (`engram_hash.{primes,offsets}` or `static.engram.*`) they must equal the computed ones.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/models/deepseek_v41/model_spec.hpp"
#include "tessera/models/deepseek_v41/weights.hpp"

namespace tessera::model::dsv41 {

struct EngramTables {
  int64_t layers = 0, max_ngram = 0, heads = 0;
  std::vector<int64_t> primes;       // [L_e, (N−1)·He], column order: size 2 heads, size 3 heads, …
  std::vector<int64_t> offsets;      // [L_e, (N−1)·He]
  std::vector<int64_t> multipliers;  // [L_e, N]
  std::vector<int64_t> token_map;    // [V] compressed id per token id
  int64_t pad_c = 0;                 // token_map[engram_pad_id]
  int64_t columns() const { return (max_ngram - 1) * heads; }
};

/// The computed primes and offsets of §2.4.1 (no multipliers, no token map).
EngramTables engram_layout(ModelSpec const& spec);

/// The full state: computed layout + stored multipliers and token map from `src` (names above).
Result<EngramTables> load_engram_tables(ModelSpec const& spec, WeightSource const& src);

}  // namespace tessera::model::dsv41

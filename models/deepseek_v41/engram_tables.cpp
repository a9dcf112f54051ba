// SPDX-License-Identifier: Apache-2.0
/// Engram hash state: computed primes/offsets (spec §2.4.1) and the stored multipliers and token map.
#include "tessera/models/deepseek_v41/engram_tables.hpp"

#include <set>
#include <string>

namespace tessera::model::dsv41 {

namespace {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

/// The first of `names` the source holds, or "" if none.
std::string first_present(WeightSource const& src, std::initializer_list<char const*> names) {
  for (char const* n : names)
    if (src.contains(n)) return n;
  return "";
}

Result<std::vector<int64_t>> read_i64(WeightSource const& src, std::string const& name, size_t expected) {
  auto t = src.load_i64(name);
  if (!t) return t.status();
  if (static_cast<size_t>(t->numel()) != expected)
    return malformed(src.describe() + ": tensor " + name + " has " + std::to_string(t->numel()) +
                     " elements, expected " + std::to_string(expected));
  auto const* p = t->data_as<int64_t>();
  return std::vector<int64_t>(p, p + expected);
}

}  // namespace

EngramTables engram_layout(ModelSpec const& spec) {
  EngramTables t;
  t.layers = static_cast<int64_t>(spec.engram_layers.size());
  t.max_ngram = spec.engram_max_ngram;
  t.heads = spec.engram_n_heads;
  std::set<int64_t> seen;
  for (int64_t l = 0; l < t.layers; ++l) {
    int64_t total = 0;
    for (int64_t g = 0; g < t.max_ngram - 1; ++g) {
      int64_t cur = spec.engram_vocab_size - 1;
      for (int64_t h = 0; h < t.heads; ++h) {
        int64_t c = cur + 1;
        while (!is_prime(c) || seen.count(c)) ++c;
        seen.insert(c);
        cur = c;
        t.primes.push_back(c);
        t.offsets.push_back(total);
        total += c;
      }
    }
  }
  return t;
}

Result<EngramTables> load_engram_tables(ModelSpec const& spec, WeightSource const& src) {
  EngramTables t = engram_layout(spec);
  if (t.layers == 0) return t;
  size_t nc = static_cast<size_t>(t.layers * t.columns());
  std::string mult = first_present(src, {"engram_hash.multipliers", "static.engram.multipliers"});
  std::string map = first_present(src, {"engram_hash.token_map", "static.engram.token_map"});
  if (mult.empty())
    return not_found(src.describe() + ": the Engram hash multipliers are stored data; no tensor "
                     "engram_hash.multipliers [L_e, N] (int64) found (write it at conversion time)");
  if (map.empty())
    return not_found(src.describe() + ": the Engram compressed token map is stored data; no tensor "
                     "engram_hash.token_map [vocab] (int64) found (write it at conversion time)");
  auto m = read_i64(src, mult, static_cast<size_t>(t.layers * t.max_ngram));
  if (!m) return m.status();
  t.multipliers = std::move(*m);
  auto tm = src.load_i64(map);
  if (!tm) return tm.status();
  t.token_map.assign(tm->data_as<int64_t>(), tm->data_as<int64_t>() + tm->numel());
  if (static_cast<int64_t>(t.token_map.size()) < spec.vocab_size)
    return malformed(src.describe() + ": " + map + " has " + std::to_string(t.token_map.size()) +
                     " entries, fewer than vocab_size " + std::to_string(spec.vocab_size));
  for (int64_t v : t.token_map)
    if (v < 0 || v >= spec.engram_compressed_vocab)
      return malformed(src.describe() + ": " + map + " holds id " + std::to_string(v) +
                       " outside engram_compressed_vocab_size " + std::to_string(spec.engram_compressed_vocab));
  if (spec.engram_pad_id < 0 || spec.engram_pad_id >= static_cast<int64_t>(t.token_map.size()))
    return invalid_argument("engram_pad_id " + std::to_string(spec.engram_pad_id) + " outside the token map");
  t.pad_c = t.token_map[static_cast<size_t>(spec.engram_pad_id)];
  for (auto [stored, computed, what] : {std::tuple{first_present(src, {"engram_hash.primes", "static.engram.primes"}),
                                                   &t.primes, "primes"},
                                        std::tuple{first_present(src, {"engram_hash.offsets", "static.engram.offsets"}),
                                                   &t.offsets, "offsets"}}) {
    if (stored.empty()) continue;
    auto v = read_i64(src, stored, nc);
    if (!v) return v.status();
    if (*v != *computed)
      return malformed(src.describe() + ": stored Engram " + what + " (" + stored +
                       ") differ from the ones spec §2.4.1 derives from the config");
  }
  for (int64_t l = 0; l < t.layers; ++l) {
    int64_t sum = 0;
    for (int64_t c = 0; c < t.columns(); ++c) sum += t.primes[l * t.columns() + c];
    if (sum > spec.engram_num_embeddings[l])
      return invalid_argument("engram_num_embeddings[" + std::to_string(l) + "] = " +
                              std::to_string(spec.engram_num_embeddings[l]) + " is smaller than the prime sum " +
                              std::to_string(sum));
  }
  return t;
}

}  // namespace tessera::model::dsv41

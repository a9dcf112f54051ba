// SPDX-License-Identifier: Apache-2.0
/// Seeded test inputs: the seed comes from TESSERA_TEST_SEED or a per-test default, and is printed so a
/// failure can be replayed. Values are fresh random numbers, never zeros.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace tessera::verify {

inline uint64_t test_seed(uint64_t fallback) {
  uint64_t s = fallback;
  if (char const* env = std::getenv("TESSERA_TEST_SEED")) s = std::strtoull(env, nullptr, 0);
  std::printf("[seed %llu]\n", static_cast<unsigned long long>(s));
  return s;
}

/// n values from N(mean, stddev) with a fixed generator (mt19937_64), reproducible across platforms
/// for the same seed up to the normal_distribution implementation of the standard library.
inline std::vector<float> randn(size_t n, uint64_t seed, float stddev = 1.f, float mean = 0.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace tessera::verify

// SPDX-License-Identifier: Apache-2.0
/// Comparison metrics for tests and verification tools: bitwise equality, allclose(atol, rtol),
/// NMSE = Σ(a−b)² / Σb², cosine difference = 1 − a·b/(|a||b|) (DeepGEMM's calc_diff form), and the
/// max abs/rel errors, all accumulated in double. Tolerances are named and derived (see `Tolerance`).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>

namespace tessera::compare {

/// A named tolerance with the reason it has the value it has.
struct Tolerance {
  double atol = 0, rtol = 0, max_nmse = 0, max_cos_diff = 0;
  char const* name = "";
  char const* derivation = "";
};

/// fp32 accumulation over k terms of magnitude ~|x|: relative error ≲ k·eps32 (worst-case bound).
inline Tolerance fp32_accumulation(int64_t k) {
  double eps = 1.1920928955078125e-07;
  double r = static_cast<double>(k) * eps;
  return {r, r, r * r, r, "fp32_accumulation", "k * eps_f32 relative, k = reduction length"};
}
/// One bf16 rounding of the result: half an ulp relative (2^-9), doubled for a second rounding.
inline Tolerance bf16_output() {
  double r = std::ldexp(1.0, -8);
  return {r, r, r * r, r, "bf16_output", "two bf16 roundings: 2 * 2^-9 relative"};
}

struct Stats {
  size_t count = 0;
  double max_abs = 0, max_rel = 0, nmse = 0, cos_diff = 0;
  size_t argmax_abs = 0;
  size_t num_nan = 0;        // positions where exactly one side is NaN
  size_t num_mismatch = 0;   // positions outside atol + rtol·|b| (only when a tolerance is given)
  std::string to_string() const {
    std::ostringstream os;
    os << "n=" << count << " max_abs=" << max_abs << " (at " << argmax_abs << ") max_rel=" << max_rel
       << " nmse=" << nmse << " cos_diff=" << cos_diff << " nan_mismatch=" << num_nan
       << " outside_tol=" << num_mismatch;
    return os.str();
  }
};

/// Statistics of `a` (candidate) against `b` (reference). rel = |a−b| / max(|b|, tiny).
template <class A, class B>
Stats stats(std::span<A const> a, std::span<B const> b, double atol = -1, double rtol = 0) {
  Stats s;
  s.count = std::min(a.size(), b.size());
  double num = 0, den = 0, ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < s.count; ++i) {
    double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isnan(x) != std::isnan(y)) { ++s.num_nan; continue; }
    if (std::isnan(x)) continue;
    double d = std::abs(x - y);
    if (d > s.max_abs) { s.max_abs = d; s.argmax_abs = i; }
    s.max_rel = std::max(s.max_rel, d / std::max(std::abs(y), 1e-30));
    if (atol >= 0 && d > atol + rtol * std::abs(y)) ++s.num_mismatch;
    num += d * d; den += y * y; ab += x * y; aa += x * x; bb += y * y;
  }
  s.nmse = den > 0 ? num / den : num;
  s.cos_diff = (aa > 0 && bb > 0) ? 1.0 - ab / std::sqrt(aa * bb) : (aa == bb ? 0.0 : 1.0);
  return s;
}

/// True when every element is within atol + rtol·|b| and NaNs agree.
template <class A, class B>
bool allclose(std::span<A const> a, std::span<B const> b, double atol, double rtol) {
  if (a.size() != b.size()) return false;
  Stats s = stats(a, b, atol, rtol);
  return s.num_mismatch == 0 && s.num_nan == 0;
}

/// Bit-for-bit equality of two buffers of the same element type; returns the first differing index
/// or SIZE_MAX when equal.
template <class T>
size_t first_bitwise_mismatch(std::span<T const> a, std::span<T const> b) {
  if (a.size() != b.size()) return std::min(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  return SIZE_MAX;
}

}  // namespace tessera::compare

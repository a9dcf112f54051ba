// SPDX-License-Identifier: Apache-2.0
/// Helpers of the attention-side GPU tests: device buffers built from host vectors (views tagged
/// Device::kCuda), read-back, bit comparison of float arrays, and ulp-scaled error measures.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tessera/core/tensor.hpp"

namespace tessera::verify::gpu_attn {

/// A device copy of a host vector (at least one element is allocated so empty arrays get a pointer).
template <class T>
struct DevBuf {
  Tensor t;
  int64_t n = 0;
  explicit DevBuf(std::vector<T> const& v) : n(static_cast<int64_t>(v.size())) {
    t = Tensor::empty(dtype_of<T>, {std::max<int64_t>(n, 1)}, Device::kCuda).value_or_throw();
    if (n > 0) throw_if_error(cuda_memcpy(t.data(), v.data(), v.size() * sizeof(T), true, false));
  }
  explicit DevBuf(int64_t count) : DevBuf(std::vector<T>(static_cast<size_t>(count), T{})) {}
  T* ptr() const { return static_cast<T*>(const_cast<void*>(t.data())); }
  template <int kRank>
  TensorView<T, kRank> view(std::array<int64_t, kRank> shape) const {
    return TensorView<T, kRank>(ptr(), shape, Device::kCuda);
  }
  template <int kRank>
  TensorView<T const, kRank> cview(std::array<int64_t, kRank> shape) const {
    return TensorView<T const, kRank>(ptr(), shape, Device::kCuda);
  }
  std::vector<T> host() const {
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) throw_if_error(cuda_memcpy(v.data(), t.data(), v.size() * sizeof(T), false, true));
    return v;
  }
};

/// Number of positions whose bit patterns differ.
inline int64_t bit_mismatches(std::vector<float> const& a, std::vector<float> const& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  return bad;
}

/// 2^−23: one ulp of fp32 relative to a value in [1, 2).
inline constexpr float kF32Eps = 1.f / 8388608.f;
/// 2^−7: one ulp of bf16 (8 significant bits) relative to a value in [1, 2).
inline constexpr float kBf16Eps = 1.f / 128.f;

}  // namespace tessera::verify::gpu_attn

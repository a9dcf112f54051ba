// SPDX-License-Identifier: Apache-2.0
/// Test helpers of the GPU op suites: a device copy of a host vector (RAII), read back with get(), typed
/// views over it, bit comparison of float vectors that names the first differing index, and a
/// one-row-slice helper for the row-invariance checks.
#pragma once

#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tessera/core/context.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera::verify {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::vector<T> const& host) { upload(host); }
  explicit DeviceBuffer(size_t n) { alloc(n); }
  DeviceBuffer(DeviceBuffer const&) = delete;
  DeviceBuffer& operator=(DeviceBuffer const&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  ~DeviceBuffer() { if (p_) cuda_free(p_); }

  void alloc(size_t n) {
    if (p_) cuda_free(p_);
    n_ = n;
    void* v = nullptr;
    auto s = cuda_malloc(&v, std::max<size_t>(n, 1) * sizeof(T));
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    p_ = static_cast<T*>(v);
  }
  void upload(std::vector<T> const& host) {
    if (n_ != host.size() || !p_) alloc(host.size());
    if (host.empty()) return;
    auto s = cuda_memcpy(p_, host.data(), host.size() * sizeof(T), true, false);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  std::vector<T> get() const {
    std::vector<T> h(n_);
    if (n_ == 0) return h;
    auto s = cuda_memcpy(h.data(), p_, n_ * sizeof(T), false, true);  // synchronises with the default stream
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    return h;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }
  template <int kRank>
  TensorView<T, kRank> view(std::array<int64_t, kRank> shape) const { return TensorView<T, kRank>(p_, shape, Device::kCuda); }
  template <int kRank>
  TensorView<T const, kRank> cview(std::array<int64_t, kRank> shape) const {
    return TensorView<T const, kRank>(p_, shape, Device::kCuda);
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline ExecContext cuda_ctx() {
  ExecContext c;
  c.backend = Backend::kCuda;
  return c;
}

/// Number of elements whose bits differ; prints the first few with `what`. Two NaNs count as equal: NaN
/// payloads are not portable (x86 propagates an operand's payload and sign, CUDA returns 0x7FFFFFFF).
inline int64_t count_bit_diffs(std::vector<float> const& a, std::vector<float> const& b, char const* what) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      if (n < 5) std::printf("  %s[%zu]: %.9g vs %.9g\n", what, i, static_cast<double>(a[i]), static_cast<double>(b[i]));
      ++n;
    }
  return n;
}

/// Largest |a − b| / max(|a|, |b|, floor) over the vectors.
inline double max_rel_diff(std::vector<float> const& a, std::vector<float> const& b, double floor = 1e-30) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double const d = std::fabs(double(a[i]) - double(b[i]));
    double const s = std::max({std::fabs(double(a[i])), std::fabs(double(b[i])), floor});
    m = std::max(m, d / s);
  }
  return m;
}

/// Rows [r, r+1) of a row-major [rows, cols] vector.
template <class T>
std::vector<T> row_slice(std::vector<T> const& v, int64_t cols, int64_t r) {
  return std::vector<T>(v.begin() + r * cols, v.begin() + (r + 1) * cols);
}

}  // namespace tessera::verify

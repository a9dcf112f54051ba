// SPDX-License-Identifier: Apache-2.0
/// Tensors. `TensorView<T, kRank>`: a typed, non-owning view (pointer, shape, strides in elements, device),
/// usable on host and device. `AnyTensorView`: the type-erased form (dtype + runtime rank ≤ 8) that
/// crosses loader, registry and server boundaries. `Tensor`: an owning, contiguous, 64-byte-aligned
/// buffer in host or CUDA memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/status.hpp"

namespace tessera {

enum class Device : uint8_t { kCpu, kCuda };

/// Non-owning view with compile-time rank. Strides are in elements; row-major contiguous by default.
template <class T, int kRank>
struct TensorView {
  static_assert(kRank >= 0 && kRank <= 8, "TensorView supports ranks 0..8");
  using Element = T;
  static constexpr int rank = kRank;

  T* data = nullptr;
  std::array<int64_t, kRank> shape{};
  std::array<int64_t, kRank> stride{};
  Device device = Device::kCpu;

  TensorView() = default;
  TESSERA_HOST_DEVICE TensorView(T* p, std::array<int64_t, kRank> const& s, Device d = Device::kCpu)
      : data(p), shape(s), device(d) {
    int64_t acc = 1;
    for (int i = kRank - 1; i >= 0; --i) { stride[i] = acc; acc *= shape[i]; }
  }
  TESSERA_HOST_DEVICE TensorView(T* p, std::array<int64_t, kRank> const& s, std::array<int64_t, kRank> const& st,
                                 Device d = Device::kCpu)
      : data(p), shape(s), stride(st), device(d) {}

  /// Views of non-const elements convert to views of const elements.
  template <class U, class = std::enable_if_t<std::is_same_v<T, U const>>>
  TESSERA_HOST_DEVICE TensorView(TensorView<U, kRank> const& o)  // NOLINT(implicit)
      : data(o.data), shape(o.shape), stride(o.stride), device(o.device) {}

  TESSERA_HOST_DEVICE int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < kRank; ++i) n *= shape[i];
    return n;
  }
  TESSERA_HOST_DEVICE bool empty() const { return numel() == 0; }
  TESSERA_HOST_DEVICE bool is_contiguous() const {
    int64_t acc = 1;
    for (int i = kRank - 1; i >= 0; --i) {
      if (shape[i] != 1 && stride[i] != acc) return false;
      acc *= shape[i];
    }
    return true;
  }
  template <class... I>
  TESSERA_HOST_DEVICE T& operator()(I... idx) const {
    static_assert(sizeof...(I) == kRank, "index count must equal the rank");
    int64_t const ix[] = {static_cast<int64_t>(idx)...};
    int64_t off = 0;
    for (int i = 0; i < kRank; ++i) off += ix[i] * stride[i];
    return data[off];
  }
  /// The sub-view at index `i` of the leading dimension.
  TESSERA_HOST_DEVICE TensorView<T, kRank - 1> operator[](int64_t i) const requires(kRank >= 1) {
    TensorView<T, kRank - 1> v;
    v.data = data + i * stride[0];
    for (int d = 1; d < kRank; ++d) { v.shape[d - 1] = shape[d]; v.stride[d - 1] = stride[d]; }
    v.device = device;
    return v;
  }
  /// Rows [begin, end) of the leading dimension.
  TESSERA_HOST_DEVICE TensorView slice(int64_t begin, int64_t end) const requires(kRank >= 1) {
    TensorView v = *this;
    v.data = data + begin * stride[0];
    v.shape[0] = end - begin;
    return v;
  }
};

/// Type-erased view: what loaders return and what crosses non-templated boundaries.
struct AnyTensorView {
  static constexpr int kMaxRank = 8;
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};  // elements (for kF4E2m1x2: packed bytes along the last dim)
  Device device = Device::kCpu;

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::vector<int64_t> dims() const { return {shape.begin(), shape.begin() + rank}; }

  /// A typed view; fails if the dtype or rank does not match (the message names both).
  template <class T, int kRank>
  Result<TensorView<T, kRank>> as() const {
    if (dtype_of<T> != dtype)
      return Status(StatusCode::kInvalidArgument,
                    "tensor has dtype " + std::string(dtype_name(dtype)) + ", expected " +
                        std::string(dtype_name(dtype_of<T>)));
    if (rank != kRank)
      return Status(StatusCode::kInvalidArgument,
                    "tensor has rank " + std::to_string(rank) + ", expected " + std::to_string(kRank));
    TensorView<T, kRank> v;
    v.data = static_cast<T*>(data);
    for (int i = 0; i < kRank; ++i) { v.shape[i] = shape[i]; v.stride[i] = stride[i]; }
    v.device = device;
    return v;
  }
};

/// "[a, b, c]" for messages.
std::string shape_to_string(std::vector<int64_t> const& dims);

/// Owning, contiguous tensor in host memory (64-byte aligned) or CUDA device memory.
class Tensor {
 public:
  Tensor() = default;
  /// Allocates uninitialised storage; CUDA memory needs a build with CUDA and a device.
  static Result<Tensor> empty(DType dtype, std::vector<int64_t> shape, Device device = Device::kCpu);
  /// Host tensor filled with zero bytes.
  static Tensor zeros(DType dtype, std::vector<int64_t> shape);
  /// Host tensor holding a copy of `values` (float data, any shape with the same numel).
  static Tensor from_floats(std::vector<float> const& values, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  std::vector<int64_t> const& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i < 0 ? i + rank() : i)); }
  int64_t numel() const;
  size_t nbytes() const { return nbytes_; }
  void* data() { return data_.get(); }
  void const* data() const { return data_.get(); }
  template <class T> T* data_as() { return static_cast<T*>(data()); }
  template <class T> T const* data_as() const { return static_cast<T const*>(data()); }
  bool defined() const { return defined_; }

  AnyTensorView view() const;
  template <class T, int kRank>
  TensorView<T, kRank> view_as() const {
    return view().as<T, kRank>().value_or_throw();
  }
  /// Copies to another device (host↔CUDA), or clones on the same device.
  Result<Tensor> to(Device device) const;

 private:
  std::shared_ptr<void> data_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  std::vector<int64_t> shape_;
  size_t nbytes_ = 0;
  bool defined_ = false;
};

/// CUDA memory hooks, defined by the core library (fail with kNotSupported in a build without CUDA).
Status cuda_malloc(void** ptr, size_t bytes);
void cuda_free(void* ptr);
Status cuda_memcpy(void* dst, void const* src, size_t bytes, bool dst_is_device, bool src_is_device);
/// Number of usable CUDA devices (0 in a build without CUDA or on a machine without a GPU).
int cuda_device_count();

}  // namespace tessera

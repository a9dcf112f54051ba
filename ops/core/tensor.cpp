// SPDX-License-Identifier: Apache-2.0
/// Owning tensors in host memory (64-byte aligned) and CUDA memory.
#include "tessera/core/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

namespace tessera {

std::string shape_to_string(std::vector<int64_t> const& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

static Result<size_t> checked_nbytes(DType dtype, std::vector<int64_t> const& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return invalid_argument("negative dimension in shape " + shape_to_string(shape));
    if (d != 0 && n > SIZE_MAX / static_cast<size_t>(d))
      return invalid_argument("shape " + shape_to_string(shape) + " overflows size_t");
    n *= static_cast<size_t>(d);
  }
  size_t es = dtype_size(dtype);
  if (n > SIZE_MAX / es) return invalid_argument("shape " + shape_to_string(shape) + " overflows size_t");
  return n * es;
}

Result<Tensor> Tensor::empty(DType dtype, std::vector<int64_t> shape, Device device) {
  auto nb = checked_nbytes(dtype, shape);
  if (!nb) return nb.status();
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  t.nbytes_ = *nb;
  t.defined_ = true;
  if (device == Device::kCpu) {
    size_t padded = (t.nbytes_ + 63) / 64 * 64;
    void* p = padded ? std::aligned_alloc(64, padded) : nullptr;
    if (padded && !p) return Status(StatusCode::kOutOfMemory, "host allocation of " + std::to_string(padded) + " bytes failed");
    t.data_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    void* p = nullptr;
    if (t.nbytes_) TESSERA_TRY(cuda_malloc(&p, t.nbytes_));
    t.data_ = std::shared_ptr<void>(p, [](void* q) { if (q) cuda_free(q); });
  }
  return t;
}

Tensor Tensor::zeros(DType dtype, std::vector<int64_t> shape) {
  Tensor t = empty(dtype, std::move(shape)).value_or_throw();
  if (t.nbytes_) std::memset(t.data(), 0, t.nbytes_);
  return t;
}

Tensor Tensor::from_floats(std::vector<float> const& values, std::vector<int64_t> shape) {
  Tensor t = empty(DType::kF32, std::move(shape)).value_or_throw();
  if (static_cast<size_t>(t.numel()) != values.size())
    throw Error(StatusCode::kInvalidArgument, "from_floats: " + std::to_string(values.size()) +
                                                  " values do not fill shape " + shape_to_string(t.shape_));
  if (t.nbytes_) std::memcpy(t.data(), values.data(), t.nbytes_);
  return t;
}

AnyTensorView Tensor::view() const {
  AnyTensorView v;
  v.data = data_.get();
  v.dtype = dtype_;
  v.rank = rank();
  v.device = device_;
  int64_t acc = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[i] = shape_[i];
    v.stride[i] = acc;
    acc *= shape_[i];
  }
  return v;
}

Result<Tensor> Tensor::to(Device device) const {
  auto r = empty(dtype_, shape_, device);
  if (!r) return r.status();
  Tensor& t = *r;
  if (nbytes_ == 0) return r;
  if (device == Device::kCpu && device_ == Device::kCpu) {
    std::memcpy(t.data(), data(), nbytes_);
  } else {
    TESSERA_TRY(cuda_memcpy(t.data(), data(), nbytes_, device == Device::kCuda, device_ == Device::kCuda));
  }
  return r;
}

}  // namespace tessera

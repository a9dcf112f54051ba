// SPDX-License-Identifier: Apache-2.0
/// Safetensors writer. Layout: u64 header length (a multiple of 8, space padded) | JSON header
/// (`__metadata__` first, then the tensors in data order) | data. Tensors are ordered by element size
/// (largest first), then by name, so every tensor starts at a multiple of its element size; with the 8-byte
/// aligned header this makes zero-copy typed views of the written file aligned.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "tessera/io/safetensors.hpp"

namespace tessera::io {

namespace {

Result<size_t> checked_nbytes(std::string const& name, DType dtype, std::vector<int64_t> const& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return invalid_argument("tensor '" + name + "': negative dimension");
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return invalid_argument("tensor '" + name + "': size overflows");
  }
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(dtype)), &n))
    return invalid_argument("tensor '" + name + "': size overflows");
  return static_cast<size_t>(n);
}

}  // namespace

void SafetensorsWriter::set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

Status SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, Producer produce) {
  if (name == "__metadata__") return invalid_argument("'__metadata__' is not a valid tensor name");
  if (static_cast<int>(shape.size()) > AnyTensorView::kMaxRank)
    return invalid_argument("tensor '" + name + "': rank " + std::to_string(shape.size()) + " is too large");
  if (dtype == DType::kF4E2m1x2 && shape.empty())
    return invalid_argument("tensor '" + name + "': an f4 tensor needs at least one dimension");
  for (auto const& e : entries_)
    if (e.name == name) return invalid_argument("tensor '" + name + "' added twice");
  auto nb = checked_nbytes(name, dtype, shape);
  if (!nb) return nb.status();
  entries_.push_back({std::move(name), dtype, std::move(shape), *nb, std::move(produce)});
  return {};
}

Status SafetensorsWriter::add(std::string name, Tensor const& t) {
  if (!t.defined()) return invalid_argument("tensor '" + name + "' is undefined");
  if (t.device() != Device::kCpu) return invalid_argument("tensor '" + name + "' is not in host memory");
  Tensor keep = t;  // shares the buffer
  return add(std::move(name), t.dtype(), t.shape(), [keep](void* dst, size_t nbytes) {
    if (nbytes) std::memcpy(dst, keep.data(), nbytes);
    return Status{};
  });
}

Status SafetensorsWriter::add(std::string name, AnyTensorView const& v) {
  if (v.device != Device::kCpu) return invalid_argument("tensor '" + name + "' is not in host memory");
  if (v.rank < 0 || v.rank > AnyTensorView::kMaxRank) return invalid_argument("tensor '" + name + "': bad rank");
  auto t = Tensor::empty(v.dtype, v.dims());
  if (!t) return t.status();
  size_t const es = dtype_size(v.dtype);
  size_t const n = static_cast<size_t>(v.numel());
  auto* dst = static_cast<unsigned char*>(t->data());
  auto const* src = static_cast<unsigned char const*>(v.data);
  std::array<int64_t, AnyTensorView::kMaxRank> idx{};
  for (size_t i = 0; i < n; ++i) {  // row-major walk with the view's strides
    int64_t off = 0;
    for (int d = 0; d < v.rank; ++d) off += idx[d] * v.stride[d];
    std::memcpy(dst + i * es, src + off * static_cast<int64_t>(es), es);
    for (int d = v.rank - 1; d >= 0; --d) {
      if (++idx[d] < v.shape[d]) break;
      idx[d] = 0;
    }
  }
  return add(std::move(name), *t);
}

Status SafetensorsWriter::write(std::string const& path) {
  std::vector<Entry const*> order;
  for (auto const& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
    size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  boost::json::object header;
  if (!metadata_.empty()) {
    boost::json::object md;
    for (auto const& [k, v] : metadata_) md[k] = v;
    header["__metadata__"] = std::move(md);
  }
  size_t offset = 0;
  for (auto const* e : order) {
    boost::json::array shape;
    for (int64_t d : e->shape) shape.push_back(d);
    if (e->dtype == DType::kF4E2m1x2) shape.back() = shape.back().as_int64() * 2;  // logical e2m1 count
    boost::json::object entry;
    entry["dtype"] = safetensors_dtype_string(e->dtype);
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = boost::json::array{offset, offset + e->nbytes};
    header[e->name] = std::move(entry);
    offset += e->nbytes;
  }
  std::string text = boost::json::serialize(header);
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string const tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return io_error(tmp + ": cannot create (" + std::strerror(errno) + ")");
  auto fail = [&](std::string msg) {
    std::fclose(f);
    std::remove(tmp.c_str());
    return io_error(tmp + ": " + msg);
  };
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, f) != 8 || std::fwrite(text.data(), 1, text.size(), f) != text.size())
    return fail("write failed");
  std::vector<unsigned char> buf;
  for (auto const* e : order) {
    if (e->nbytes == 0) continue;
    buf.assign(e->nbytes, 0);  // one tensor at a time
    Status s = e->produce(buf.data(), e->nbytes);
    if (!s.ok()) {
      std::fclose(f);
      std::remove(tmp.c_str());
      return Status(s.code(), "tensor '" + e->name + "': " + s.message());
    }
    if (std::fwrite(buf.data(), 1, e->nbytes, f) != e->nbytes) return fail("write of tensor '" + e->name + "' failed");
  }
  buf.clear();
  buf.shrink_to_fit();
  if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) return fail("flush failed");
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    return io_error(tmp + ": close failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    return io_error(path + ": cannot rename the temporary file into place (" + std::strerror(e) + ")");
  }
  return {};
}

}  // namespace tessera::io

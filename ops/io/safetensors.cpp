// SPDX-License-Identifier: Apache-2.0
/// Safetensors file reader: maps a file read-only and validates its header completely before exposing a
/// tensor (length prefix, JSON, entry keys, dtype, shape, byte spans inside the data section and pairwise
/// disjoint, `__metadata__` string → string, no duplicate names). See include/tessera/io/safetensors.hpp.
#include "tessera/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "ops/io/json_strict.hpp"

namespace tessera::io {

namespace {

struct DTypeName {
  std::string_view name;
  DType dtype;
};
// clang-format off
constexpr DTypeName kDTypes[] = {
    {"F64", DType::kF64},   {"F32", DType::kF32},         {"F16", DType::kF16},      {"BF16", DType::kBf16},
    {"F8_E4M3", DType::kF8E4m3}, {"F8_E8M0", DType::kE8m0}, {"F4", DType::kF4E2m1x2},
    {"I64", DType::kI64},   {"I32", DType::kI32},         {"I16", DType::kI16},      {"I8", DType::kI8},
    {"U8", DType::kU8},     {"U16", DType::kU16},         {"U32", DType::kU32},      {"U64", DType::kU64},
    {"BOOL", DType::kBool},
};
// clang-format on

std::string join_dims(std::vector<int64_t> const& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

/// A JSON number as a non-negative integer, or false (doubles, negatives and non-numbers are refused).
bool as_size(boost::json::value const& v, uint64_t& out) {
  if (v.is_int64()) {
    if (v.get_int64() < 0) return false;
    out = static_cast<uint64_t>(v.get_int64());
    return true;
  }
  if (v.is_uint64()) {
    out = v.get_uint64();
    return true;
  }
  return false;
}

}  // namespace

Result<DType> dtype_from_safetensors(std::string_view s) {
  for (auto const& d : kDTypes)
    if (d.name == s) return d.dtype;
  return malformed("unknown dtype '" + std::string(s) + "'");
}

std::string_view safetensors_dtype_string(DType t) {
  for (auto const& d : kDTypes)
    if (d.dtype == t) return d.name;
  return "?";
}

namespace detail {
/// The bytes of one file: a read-only private mapping, or an owned buffer (`from_bytes`).
struct FileBytes {
  unsigned char const* data = nullptr;
  size_t size = 0;
  void* map = nullptr;
  std::vector<unsigned char> owned;
  FileBytes() = default;
  FileBytes(FileBytes const&) = delete;
  FileBytes& operator=(FileBytes const&) = delete;
  ~FileBytes() {
    if (map) ::munmap(map, size);
  }
};
}  // namespace detail

Result<SafetensorsFile> SafetensorsFile::open(std::string const& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return Status(e == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                  path + ": cannot open (" + std::strerror(e) + ")");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return io_error(path + ": cannot stat (" + std::strerror(e) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  auto bytes = std::make_shared<detail::FileBytes>();
  bytes->size = static_cast<size_t>(st.st_size);
  if (bytes->size > 0) {
    void* m = ::mmap(nullptr, bytes->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return io_error(path + ": cannot map " + std::to_string(bytes->size) + " bytes (" + std::strerror(e) + ")");
    }
    bytes->map = m;
    bytes->data = static_cast<unsigned char const*>(m);
  }
  ::close(fd);
  return parse(std::move(bytes), path);
}

Result<SafetensorsFile> SafetensorsFile::from_bytes(std::vector<unsigned char> data, std::string name) {
  auto bytes = std::make_shared<detail::FileBytes>();
  bytes->owned = std::move(data);
  bytes->data = bytes->owned.data();
  bytes->size = bytes->owned.size();
  return parse(std::move(bytes), std::move(name));
}

Result<SafetensorsFile> SafetensorsFile::parse(std::shared_ptr<detail::FileBytes const> bytes, std::string path) {
  size_t const size = bytes->size;
  if (size < 8)
    return malformed(path + ": file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes->data[i];  // little-endian u64
  if (n > kMaxHeaderBytes)
    return malformed(path + ": header length " + std::to_string(n) + " exceeds the limit of " +
                     std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    return malformed(path + ": header length " + std::to_string(n) + " exceeds the " + std::to_string(size - 8) +
                     " bytes that follow it");
  std::string_view text(reinterpret_cast<char const*>(bytes->data + 8), static_cast<size_t>(n));
  auto parsed = detail::parse_json_strict(text, path + ": header");
  if (!parsed) return parsed.status();
  if (!parsed->is_object()) return malformed(path + ": header is not a JSON object");
  auto const& root = parsed->get_object();

  SafetensorsFile f;
  f.path_ = path;
  f.data_start_ = 8 + static_cast<size_t>(n);
  size_t const data_size = size - f.data_start_;
  f.tensors_.reserve(root.size());
  for (auto const& kv : root) {
    std::string name(kv.key());
    if (name == "__metadata__") {
      if (!kv.value().is_object()) return malformed(path + ": __metadata__ is not an object");
      for (auto const& m : kv.value().get_object()) {
        if (!m.value().is_string())
          return malformed(path + ": __metadata__ value of '" + std::string(m.key()) + "' is not a string");
        f.metadata_.emplace(std::string(m.key()), std::string(m.value().get_string()));
      }
      continue;
    }
    std::string const where = path + ": tensor '" + name + "'";
    if (!kv.value().is_object()) return malformed(where + ": entry is not an object");
    auto const& e = kv.value().get_object();
    for (auto const& field : e) {
      std::string_view k(field.key().data(), field.key().size());
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        return malformed(where + ": unexpected key '" + std::string(k) + "'");
    }
    auto const* dt = e.if_contains("dtype");
    auto const* sh = e.if_contains("shape");
    auto const* off = e.if_contains("data_offsets");
    if (!dt) return malformed(where + ": missing key 'dtype'");
    if (!sh) return malformed(where + ": missing key 'shape'");
    if (!off) return malformed(where + ": missing key 'data_offsets'");
    if (!dt->is_string()) return malformed(where + ": dtype is not a string");
    auto dtype = dtype_from_safetensors(std::string_view(dt->get_string().data(), dt->get_string().size()));
    if (!dtype) return malformed(where + ": " + dtype.status().message());

    if (!sh->is_array()) return malformed(where + ": shape is not a list");
    auto const& sa = sh->get_array();
    if (sa.size() > static_cast<size_t>(AnyTensorView::kMaxRank))
      return malformed(where + ": rank " + std::to_string(sa.size()) + " exceeds the supported " +
                       std::to_string(AnyTensorView::kMaxRank));
    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    info.file = path;
    // The product of the non-zero dims must fit in int64: then every prefix and suffix product (numel,
    // strides), computed in int64 by views and kernels, fits as well, even for empty tensors.
    uint64_t numel = 1, nonzero = 1;
    bool overflow = false;
    for (auto const& d : sa) {
      uint64_t v = 0;
      if (!as_size(d, v) || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return malformed(where + ": shape is not a list of non-negative integers");
      if (v != 0) overflow |= __builtin_mul_overflow(nonzero, v, &nonzero);
      numel *= (v == 0 ? 0 : 1);
      info.shape.push_back(static_cast<int64_t>(v));
    }
    if (overflow || nonzero > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return malformed(where + ": element count overflows");
    if (numel != 0) numel = nonzero;
    uint64_t nbytes = 0;
    if (info.dtype == DType::kF4E2m1x2) {
      // File shape is logical (one entry per e2m1 value); Tessera's is packed (one entry per byte).
      if (info.shape.empty() || info.shape.back() % 2 != 0)
        return malformed(where + ": F4 tensor needs an even last dimension, shape " + join_dims(info.shape));
      info.shape.back() /= 2;
      nbytes = numel / 2;
    } else if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(info.dtype)), &nbytes)) {
      return malformed(where + ": byte size overflows");
    }

    if (!off->is_array() || off->get_array().size() != 2)
      return malformed(where + ": data_offsets is not a list [begin, end]");
    uint64_t begin = 0, end = 0;
    if (!as_size(off->get_array()[0], begin) || !as_size(off->get_array()[1], end))
      return malformed(where + ": data_offsets are not non-negative integers");
    if (end < begin)
      return malformed(where + ": data_offsets end " + std::to_string(end) + " < begin " + std::to_string(begin));
    if (end - begin != nbytes)
      return malformed(where + ": data_offsets span " + std::to_string(end - begin) + " bytes but " +
                       std::string(safetensors_dtype_string(info.dtype)) + " " + join_dims(info.shape) +
                       (info.dtype == DType::kF4E2m1x2 ? " (packed)" : "") + " needs " + std::to_string(nbytes));
    if (end > data_size)
      return malformed(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                       "] run past the data section of " + std::to_string(data_size) + " bytes");
    info.offset = static_cast<size_t>(begin);
    info.nbytes = static_cast<size_t>(nbytes);
    f.tensors_.push_back(std::move(info));
  }

  // Spans must be pairwise disjoint (empty tensors occupy nothing).
  std::vector<TensorInfo const*> by_offset;
  by_offset.reserve(f.tensors_.size());
  for (auto const& t : f.tensors_)
    if (t.nbytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->name < b->name;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    auto const* a = by_offset[i - 1];
    auto const* b = by_offset[i];
    if (b->offset < a->offset + a->nbytes)
      return malformed(path + ": tensor '" + b->name + "' overlaps tensor '" + a->name + "' (bytes " +
                       std::to_string(b->offset) + ".." + std::to_string(a->offset + a->nbytes) + ")");
  }
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](auto const& a, auto const& b) { return a.name < b.name; });
  f.bytes_ = std::move(bytes);
  return f;
}

TensorInfo const* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](TensorInfo const& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

size_t SafetensorsFile::file_size() const { return bytes_ ? bytes_->size : 0; }
unsigned char const* SafetensorsFile::file_data() const { return bytes_ ? bytes_->data : nullptr; }

/// Row-major view of `info`'s bytes starting at `base` (the file's data section).
static AnyTensorView make_view(TensorInfo const& info, unsigned char const* data_section) {
  AnyTensorView v;
  v.data = const_cast<unsigned char*>(data_section + info.offset);  // read-only mapping; see view()
  v.dtype = info.dtype;
  v.rank = static_cast<int>(info.shape.size());
  int64_t acc = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[i] = info.shape[i];
    v.stride[i] = acc;
    acc *= info.shape[i];
  }
  return v;
}

Result<AnyTensorView> SafetensorsFile::view(std::string_view name) const {
  TensorInfo const* t = find(name);
  if (!t) return not_found(path_ + ": no tensor '" + std::string(name) + "'");
  return make_view(*t, bytes_->data + data_start_);
}

}  // namespace tessera::io

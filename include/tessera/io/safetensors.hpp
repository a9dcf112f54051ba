// SPDX-License-Identifier: Apache-2.0
/// Safetensors checkpoints: a validating, zero-copy reader (one file or a sharded checkpoint) and a writer.
///
/// File layout (the safetensors format): `u64 N` (little-endian) | N bytes of UTF-8 JSON header | data.
/// The header is an object `{name: {"dtype": D, "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
/// "__metadata__": {string: string}}`; offsets are bytes from the start of the data section and
/// `end - begin = numel · sizeof(D)` (for `F4`, numel·4/8). Every field is validated before any tensor is
/// exposed: a malformed file yields a `kMalformedInput` status naming the file and the tensor, never a
/// crash. Views point into a read-only memory mapping shared by every copy of the reader, so readers are
/// cheap to move and safe to use from several threads at once (all accessors are const).
///
/// dtypes: F64 F32 F16 BF16 F8_E4M3 F8_E8M0 F4 I64 I32 I16 I8 U8 U16 U32 U64 BOOL. `F4` (e2m1, two per
/// byte, even element in the low nibble) maps to `DType::kF4E2m1x2` with the *packed* shape (last
/// dimension halved), because Tessera counts one packed byte as one element; the file stores the logical
/// shape. Native DeepSeek checkpoints store FP4 experts as `I8` instead; `layout.hpp` recognises those.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/dtype.hpp"
#include "tessera/core/status.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera::io {

/// Largest header accepted (the reference implementation's limit).
inline constexpr size_t kMaxHeaderBytes = 100'000'000;

/// One tensor entry of a safetensors header.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // Tessera shape (for kF4E2m1x2: packed, last dim = bytes per row)
  size_t offset = 0;           // bytes from the start of the data section of `file`
  size_t nbytes = 0;
  std::string file;            // path of the file holding the data
};

/// The DType of a safetensors dtype string ("BF16", "F8_E8M0", ...), or kMalformedInput.
Result<DType> dtype_from_safetensors(std::string_view s);
/// The safetensors dtype string of a DType ("F4" for kF4E2m1x2).
std::string_view safetensors_dtype_string(DType t);

namespace detail {
struct FileBytes;  // a read-only mapping (or an owned buffer) of a whole file
}

/// One safetensors file, mapped read-only; the header is parsed with Boost.JSON and fully validated.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  /// Maps and validates `path`.
  static Result<SafetensorsFile> open(std::string const& path);
  /// Validates an in-memory file image (tests, fuzzing); `name` is used in messages and as `path()`.
  static Result<SafetensorsFile> from_bytes(std::vector<unsigned char> bytes, std::string name);

  std::vector<TensorInfo> const& tensors() const { return tensors_; }          // sorted by name
  std::map<std::string, std::string> const& metadata() const { return metadata_; }  // __metadata__
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  /// The entry named `name`, or nullptr.
  TensorInfo const* find(std::string_view name) const;
  /// Zero-copy, row-major view into the mapping. Treat it as read-only (the pages are mapped PROT_READ).
  /// The pointer is as aligned as the file makes it: files from `SafetensorsWriter` (and the reference
  /// writers) align every tensor to its element size.
  Result<AnyTensorView> view(std::string_view name) const;
  std::string const& path() const { return path_; }

  size_t file_size() const;
  /// Byte offset of the data section in the file (8 + header length).
  size_t data_start() const { return data_start_; }
  /// The whole file image.
  unsigned char const* file_data() const;

 private:
  static Result<SafetensorsFile> parse(std::shared_ptr<detail::FileBytes const> bytes, std::string path);

  std::shared_ptr<detail::FileBytes const> bytes_;
  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  size_t data_start_ = 0;
};

/// A whole checkpoint: one `.safetensors` file; a directory holding `model.safetensors.index.json`
/// (sharded, `weight_map` validated against the shards), `model.safetensors`, or several `*.safetensors`;
/// or the path of an `*.index.json`. Tensor names are unique across files.
class Checkpoint {
 public:
  Checkpoint() = default;
  static Result<Checkpoint> open(std::string const& path);

  std::vector<TensorInfo> const& tensors() const { return tensors_; }  // all files, sorted by name
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  TensorInfo const* find(std::string_view name) const;
  Result<AnyTensorView> view(std::string_view name) const;
  /// Owning host copy with the stored dtype and shape.
  Result<Tensor> load(std::string_view name) const;
  /// Host copy converted to f32 (bit-exact widening); kF4E2m1x2 is unpacked, its last dim doubled.
  Result<Tensor> load_f32(std::string_view name) const;
  /// Rows [r0, r1) of dimension 0 as an owning host copy (stored dtype, shape {r1 − r0, dims[1:]…}): only those
  /// rows' bytes, (r1 − r0)·nbytes/dims[0], are copied out of the mapping. A range outside [0, dims[0]] or a
  /// 0-d tensor is refused with a message naming the tensor.
  Result<Tensor> load_rows(std::string_view name, int64_t r0, int64_t r1) const;
  /// load_f32 of rows [r0, r1) (as load_rows: only those rows are read).
  Result<Tensor> load_f32_rows(std::string_view name, int64_t r0, int64_t r1) const;
  /// Columns [c0, c1) of a 2-D tensor as an owning host copy (stored dtype, shape {dims[0], c1 − c0}): only those
  /// columns' bytes, dims[0]·(c1 − c0)·element size, are copied. Packed FP4 (kF4E2m1x2), other ranks and a range
  /// outside [0, dims[1]] are refused with a message naming the tensor.
  Result<Tensor> load_cols(std::string_view name, int64_t c0, int64_t c1) const;
  /// load_f32 of columns [c0, c1) (as load_cols: only those columns are read).
  Result<Tensor> load_f32_cols(std::string_view name, int64_t c0, int64_t c1) const;
  /// The folder holding config.json, tokenizer.json, ...
  std::string const& directory() const { return directory_; }
  /// `__metadata__` of every file merged (the first file, in path order, wins a conflicting key).
  std::map<std::string, std::string> const& metadata() const { return metadata_; }
  std::vector<SafetensorsFile> const& files() const { return files_; }
  /// Total bytes of tensor data.
  size_t total_bytes() const;

 private:
  std::vector<SafetensorsFile> files_;
  std::vector<TensorInfo> tensors_;
  std::vector<uint32_t> file_of_;  // file_of_[i]: index into files_ of tensors_[i]
  std::map<std::string, std::string> metadata_;
  std::string directory_;
};

/// Writes one safetensors file: tensors aligned to their element size (sorted by element size, then
/// name), the header padded with spaces to a multiple of 8 bytes like the reference writer, written to a
/// temporary name in the same folder and renamed into place. Data is produced tensor by tensor at
/// `write()`, so a lazily filled checkpoint never holds more than one tensor in memory.
class SafetensorsWriter {
 public:
  /// Fills `nbytes` bytes at `dst` with the tensor's row-major data.
  using Producer = std::function<Status(void* dst, size_t nbytes)>;

  void set_metadata(std::string key, std::string value);
  /// Copies the view's elements (any strides, host memory) now.
  Status add(std::string name, AnyTensorView const& t);
  /// Shares the tensor's buffer until `write()` (no copy).
  Status add(std::string name, Tensor const& t);
  /// Registers a tensor whose bytes `produce` writes when `write()` reaches it.
  Status add(std::string name, DType dtype, std::vector<int64_t> shape, Producer produce);
  size_t size() const { return entries_.size(); }
  Status write(std::string const& path);

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    size_t nbytes;
    Producer produce;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessera::io

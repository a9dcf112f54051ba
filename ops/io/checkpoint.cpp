// SPDX-License-Identifier: Apache-2.0
/// Checkpoints made of one or more safetensors files: resolution of a path (file, folder, index.json),
/// validation of `model.safetensors.index.json` against its shards, a name-sorted union of the tensors
/// (each name in exactly one file), and host copies (`load`, `load_f32`).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ops/io/json_strict.hpp"
#include "tessera/core/thread_pool.hpp"
#include "tessera/io/safetensors.hpp"

namespace tessera::io {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxIndexBytes = 100'000'000;

Result<std::string> read_text_file(fs::path const& p) {
  std::error_code ec;
  auto size = fs::file_size(p, ec);
  if (ec) return not_found(p.string() + ": cannot read (" + ec.message() + ")");
  if (size > kMaxIndexBytes) return malformed(p.string() + ": " + std::to_string(size) + " bytes is too large");
  std::ifstream in(p, std::ios::binary);
  if (!in) return io_error(p.string() + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A shard name from weight_map: a relative path that stays inside the checkpoint folder.
bool is_safe_relative(std::string const& name) {
  if (name.empty()) return false;
  fs::path p(name);
  if (p.is_absolute()) return false;
  for (auto const& part : p)
    if (part == "..") return false;
  return true;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(std::string const& path) {
  std::error_code ec;
  fs::path const p(path);
  auto st = fs::status(p, ec);
  if (ec || !fs::exists(st)) return not_found(path + ": no such file or folder");

  Checkpoint c;
  std::vector<std::string> files;   // shard paths, sorted
  fs::path index_path;
  if (fs::is_directory(st)) {
    c.directory_ = p.string();
    if (fs::exists(p / "model.safetensors.index.json")) {
      index_path = p / "model.safetensors.index.json";
    } else if (fs::exists(p / "model.safetensors")) {
      files.push_back((p / "model.safetensors").string());
    } else {
      for (auto const& e : fs::directory_iterator(p, ec))
        if (e.path().extension() == ".safetensors" && e.is_regular_file()) files.push_back(e.path().string());
      if (ec) return io_error(path + ": cannot list (" + ec.message() + ")");
      if (files.empty()) return not_found(path + ": no model.safetensors.index.json, model.safetensors or *.safetensors");
      std::sort(files.begin(), files.end());
    }
  } else {
    c.directory_ = p.has_parent_path() ? p.parent_path().string() : std::string(".");
    if (p.extension() == ".json")
      index_path = p;
    else
      files.push_back(p.string());
  }

  // Sharded: weight_map {tensor: shard} names every tensor and the file that holds it.
  std::vector<std::pair<std::string, std::string>> weight_map;
  if (!index_path.empty()) {
    std::string const ip = index_path.string();
    auto text = read_text_file(index_path);
    if (!text) return text.status();
    auto doc = detail::parse_json_strict(*text, ip);
    if (!doc) return doc.status();
    if (!doc->is_object()) return malformed(ip + ": not a JSON object");
    auto const& root = doc->get_object();
    if (auto const* md = root.if_contains("metadata"); md && !md->is_object() && !md->is_null())
      return malformed(ip + ": 'metadata' is not an object");
    auto const* wm = root.if_contains("weight_map");
    if (!wm) return malformed(ip + ": missing 'weight_map'");
    if (!wm->is_object()) return malformed(ip + ": 'weight_map' is not an object");
    std::vector<std::string> names;
    for (auto const& kv : wm->get_object()) {
      std::string tensor(kv.key());
      if (!kv.value().is_string())
        return malformed(ip + ": weight_map entry '" + tensor + "' is not a file name string");
      std::string shard(kv.value().get_string());
      if (!is_safe_relative(shard))
        return malformed(ip + ": weight_map entry '" + tensor + "' names '" + shard +
                         "', not a file inside the checkpoint folder");
      weight_map.emplace_back(tensor, (fs::path(c.directory_) / shard).lexically_normal().string());
      names.push_back(weight_map.back().second);
    }
    if (weight_map.empty()) return malformed(ip + ": 'weight_map' is empty");
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    for (auto const& n : names) {
      if (!fs::is_regular_file(n, ec))
        return not_found(ip + ": weight_map names shard '" + n + "', which does not exist");
    }
    files = std::move(names);
  }

  for (auto const& f : files) {
    auto sf = SafetensorsFile::open(f);
    if (!sf) return sf.status();
    c.files_.push_back(std::move(*sf));
  }
  for (auto const& [tensor, shard] : weight_map) {
    auto it = std::find_if(c.files_.begin(), c.files_.end(), [&](auto const& f) { return f.path() == shard; });
    if (it == c.files_.end() || !it->contains(tensor))
      return malformed(index_path.string() + ": weight_map puts tensor '" + tensor + "' in '" + shard +
                       "', which has no such tensor");
  }

  // Union, sorted by name; a name in two files is an error.
  std::vector<std::pair<TensorInfo const*, uint32_t>> all;
  for (uint32_t i = 0; i < c.files_.size(); ++i)
    for (auto const& t : c.files_[i].tensors()) all.emplace_back(&t, i);
  std::sort(all.begin(), all.end(), [](auto const& a, auto const& b) {
    return a.first->name != b.first->name ? a.first->name < b.first->name : a.second < b.second;
  });
  for (size_t i = 1; i < all.size(); ++i)
    if (all[i].first->name == all[i - 1].first->name)
      return malformed("tensor '" + all[i].first->name + "' is in both '" + all[i - 1].first->file + "' and '" +
                       all[i].first->file + "'");
  c.tensors_.reserve(all.size());
  c.file_of_.reserve(all.size());
  for (auto const& [t, i] : all) {
    c.tensors_.push_back(*t);
    c.file_of_.push_back(i);
  }
  for (auto const& f : c.files_)
    for (auto const& [k, v] : f.metadata()) c.metadata_.emplace(k, v);
  return c;
}

TensorInfo const* Checkpoint::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](TensorInfo const& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

Result<AnyTensorView> Checkpoint::view(std::string_view name) const {
  TensorInfo const* t = find(name);
  if (!t) return not_found(directory_ + ": checkpoint has no tensor '" + std::string(name) + "'");
  return files_[file_of_[static_cast<size_t>(t - tensors_.data())]].view(name);
}

Result<Tensor> Checkpoint::load(std::string_view name) const {
  auto v = view(name);
  if (!v) return v.status();
  auto t = Tensor::empty(v->dtype, v->dims());
  if (!t) return t.status();
  if (t->nbytes()) std::memcpy(t->data(), v->data, t->nbytes());
  return t;
}

namespace {

/// The rows [r0, r1) of a contiguous row-major view, as a view (same dtype, dimension 0 shortened).
Result<AnyTensorView> rows_view(AnyTensorView v, std::string_view name, int64_t r0, int64_t r1) {
  if (v.rank < 1 || r0 < 0 || r0 > r1 || r1 > v.shape[0])
    return invalid_argument("checkpoint tensor '" + std::string(name) + "' of shape " + shape_to_string(v.dims()) +
                            " has no rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ")");
  size_t const row_bytes = v.shape[0] ? v.nbytes() / static_cast<size_t>(v.shape[0]) : 0;
  v.data = static_cast<unsigned char*>(v.data) + static_cast<size_t>(r0) * row_bytes;
  v.shape[0] = r1 - r0;
  return v;
}

/// An owning fp32 copy of a contiguous view, each element widened exactly (load_as_float); kF4E2m1x2 unpacked,
/// its last dim doubled.
Result<Tensor> widen_to_f32(AnyTensorView const& v) {
  std::vector<int64_t> shape = v.dims();
  int64_t n = v.numel();
  if (v.dtype == DType::kF4E2m1x2) {
    shape.back() *= 2;
    n *= 2;
  }
  auto t = Tensor::empty(DType::kF32, shape);
  if (!t) return t.status();
  float* out = t->data_as<float>();
  void const* src = v.data;
  DType const dt = v.dtype;
  // f32 and bf16, the common cases, without the switch.
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        if (dt == DType::kF32) {
          std::memcpy(out + b, static_cast<float const*>(src) + b, static_cast<size_t>(e - b) * 4);
        } else if (dt == DType::kBf16) {
          auto const* p = static_cast<unsigned char const*>(src);
          for (int64_t i = b; i < e; ++i) {
            uint16_t bits;
            std::memcpy(&bits, p + 2 * i, 2);
            out[i] = float_from_bf16_bits(bits);
          }
        } else {
          for (int64_t i = b; i < e; ++i) out[i] = load_as_float(src, dt, static_cast<size_t>(i));
        }
      },
      1 << 16);
  return t;
}

}  // namespace

Result<Tensor> Checkpoint::load_f32(std::string_view name) const {
  auto v = view(name);
  if (!v) return v.status();
  return widen_to_f32(*v);
}

Result<Tensor> Checkpoint::load_rows(std::string_view name, int64_t r0, int64_t r1) const {
  auto whole = view(name);
  if (!whole) return whole.status();
  auto v = rows_view(*whole, name, r0, r1);
  if (!v) return v.status();
  auto t = Tensor::empty(v->dtype, v->dims());
  if (!t) return t.status();
  if (t->nbytes()) std::memcpy(t->data(), v->data, t->nbytes());
  return t;
}

Result<Tensor> Checkpoint::load_f32_rows(std::string_view name, int64_t r0, int64_t r1) const {
  auto whole = view(name);
  if (!whole) return whole.status();
  auto v = rows_view(*whole, name, r0, r1);
  if (!v) return v.status();
  return widen_to_f32(*v);
}

Result<Tensor> Checkpoint::load_cols(std::string_view name, int64_t c0, int64_t c1) const {
  auto v = view(name);
  if (!v) return v.status();
  if (v->rank != 2 || v->dtype == DType::kF4E2m1x2 || c0 < 0 || c0 > c1 || c1 > v->shape[1])
    return invalid_argument("checkpoint tensor '" + std::string(name) + "' (" + std::string(dtype_name(v->dtype)) +
                            " " + shape_to_string(v->dims()) + ") has no readable columns [" + std::to_string(c0) +
                            ", " + std::to_string(c1) + ")");
  int64_t const rows = v->shape[0];
  auto t = Tensor::empty(v->dtype, {rows, c1 - c0});
  if (!t) return t.status();
  size_t const es = dtype_size(v->dtype), row = static_cast<size_t>(v->shape[1]) * es, part = static_cast<size_t>(c1 - c0) * es;
  auto const* src = static_cast<unsigned char const*>(v->data) + static_cast<size_t>(c0) * es;
  auto* dst = t->data_as<unsigned char>();
  for (int64_t r = 0; r < rows && part; ++r) std::memcpy(dst + static_cast<size_t>(r) * part, src + static_cast<size_t>(r) * row, part);
  return t;
}

Result<Tensor> Checkpoint::load_f32_cols(std::string_view name, int64_t c0, int64_t c1) const {
  auto t = load_cols(name, c0, c1);
  if (!t) return t.status();
  return widen_to_f32(t->view());
}

size_t Checkpoint::total_bytes() const {
  size_t s = 0;
  for (auto const& t : tensors_) s += t.nbytes;
  return s;
}

}  // namespace tessera::io

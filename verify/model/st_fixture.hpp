// SPDX-License-Identifier: Apache-2.0
/// Test-local safetensors access for the golden fixtures: a WeightSource over one or more files, read
/// whole into memory (fixtures are a few MB). Only F32, BF16, I64 and U8 payloads occur in golden/v41-tiny.
#pragma once

#include <boost/json.hpp>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/models/deepseek_v41/weights.hpp"

namespace tessera::verify {

class StFiles final : public model::dsv41::WeightSource {
 public:
  struct Entry {
    std::shared_ptr<std::vector<char>> bytes;
    size_t begin = 0, end = 0;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
  };

  void add(std::string const& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(io_error("cannot open " + path));
    auto bytes = std::make_shared<std::vector<char>>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    std::memcpy(&n, bytes->data(), 8);
    auto hdr = boost::json::parse(std::string_view(bytes->data() + 8, n)).as_object();
    for (auto const& [k, v] : hdr) {
      if (k == "__metadata__") continue;
      auto const& o = v.as_object();
      Entry e;
      e.bytes = bytes;
      std::string dt(o.at("dtype").as_string());
      e.dtype = dt == "F32" ? DType::kF32 : dt == "BF16" ? DType::kBf16 : dt == "I64" ? DType::kI64 : DType::kU8;
      for (auto const& d : o.at("shape").as_array()) e.shape.push_back(d.as_int64());
      auto const& off = o.at("data_offsets").as_array();
      e.begin = 8 + n + static_cast<size_t>(off[0].as_int64());
      e.end = 8 + n + static_cast<size_t>(off[1].as_int64());
      entries_[std::string(k)] = e;
    }
    desc_ += (desc_.empty() ? "" : "+") + path;
  }

  bool contains(std::string const& name) const override { return entries_.count(name) > 0; }
  Result<std::vector<int64_t>> shape(std::string const& name) const override {
    auto it = entries_.find(name);
    if (it == entries_.end()) return not_found("no tensor " + name);
    return it->second.shape;
  }
  Result<DType> dtype(std::string const& name) const override {
    auto it = entries_.find(name);
    if (it == entries_.end()) return not_found("no tensor " + name);
    return it->second.dtype;
  }
  Result<Tensor> load_f32(std::string const& name) const override {
    auto it = entries_.find(name);
    if (it == entries_.end()) return not_found("no tensor " + name);
    Entry const& e = it->second;
    Tensor t = Tensor::zeros(DType::kF32, e.shape);
    char const* p = e.bytes->data() + e.begin;
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = load_as_float(p, e.dtype, static_cast<size_t>(i));
    return t;
  }
  Result<Tensor> load_i64(std::string const& name) const override {
    auto it = entries_.find(name);
    if (it == entries_.end()) return not_found("no tensor " + name);
    Entry const& e = it->second;
    Tensor t = Tensor::zeros(DType::kI64, e.shape);
    char const* p = e.bytes->data() + e.begin;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (e.dtype == DType::kI64) std::memcpy(&t.data_as<int64_t>()[i], p + 8 * i, 8);
      else t.data_as<int64_t>()[i] = static_cast<int64_t>(load_as_float(p, e.dtype, static_cast<size_t>(i)));
    }
    return t;
  }
  std::string describe() const override { return desc_; }
  std::vector<std::string> names() const {
    std::vector<std::string> v;
    for (auto const& [k, e] : entries_) v.push_back(k);
    return v;
  }

  std::vector<float> floats(std::string const& name) const {
    Tensor t = load_f32(name).value_or_throw();
    return {t.data_as<float>(), t.data_as<float>() + t.numel()};
  }
  std::vector<int64_t> ints(std::string const& name) const {
    Tensor t = load_i64(name).value_or_throw();
    return {t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel()};
  }

 private:
  std::map<std::string, Entry> entries_;
  std::string desc_;
};

}  // namespace tessera::verify

// SPDX-License-Identifier: Apache-2.0
/// Shared fixture of the model suites: the golden/v41-tiny variant folders loaded through the real
/// loader (config.json, model.safetensors, Engram hash data from golden.safetensors), kept for the whole
/// test binary, and typed access to the golden tensors.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/models/deepseek_v41/loader.hpp"
#include "verify/common/golden.hpp"

namespace tessera::verify {

inline std::string tiny_dir(std::string const& variant) { return golden_dir() + "/v41-tiny/" + variant; }

/// golden.safetensors of a variant, with typed helpers.
class GoldenFile {
 public:
  explicit GoldenFile(std::string const& path) { throw_if_error(src_.open(path)); ckpt_ = io::Checkpoint::open(path).value_or_throw(); }
  model::dsv41::CheckpointSource const& source() const { return src_; }
  bool contains(std::string const& n) const { return src_.contains(n); }
  std::vector<float> floats(std::string const& n) const {
    Tensor t = src_.load_f32(n).value_or_throw();
    return {t.data_as<float>(), t.data_as<float>() + t.numel()};
  }
  std::vector<int64_t> ints(std::string const& n) const {
    Tensor t = src_.load_i64(n).value_or_throw();
    return {t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel()};
  }
  std::vector<std::string> names() const {
    std::vector<std::string> v;
    for (auto const& t : ckpt_.tensors()) v.push_back(t.name);
    return v;
  }

 private:
  model::dsv41::CheckpointSource src_;
  io::Checkpoint ckpt_;
};

inline GoldenFile const& tiny_files(std::string const& variant) {
  static std::map<std::string, std::unique_ptr<GoldenFile>> cache;
  auto& f = cache[variant];
  if (!f) f = std::make_unique<GoldenFile>(tiny_dir(variant) + "/golden.safetensors");
  return *f;
}

inline model::dsv41::Dsv41Model& tiny_model(std::string const& variant) {
  static std::map<std::string, std::unique_ptr<model::dsv41::Dsv41Model>> cache;
  auto& m = cache[variant];
  if (!m) {
    model::dsv41::ModelOptions o;
    o.numerics = variant == "bf16" ? model::dsv41::Numerics::kBf16 : model::dsv41::Numerics::kFp32;
    m = model::dsv41::load_model(tiny_dir(variant), o).value_or_throw();
  }
  return *m;
}

/// The weights of a variant as a WeightSource (for loader error tests).
inline model::dsv41::CheckpointSource const& tiny_weights(std::string const& variant) {
  static std::map<std::string, std::unique_ptr<model::dsv41::CheckpointSource>> cache;
  auto& s = cache[variant];
  if (!s) {
    s = std::make_unique<model::dsv41::CheckpointSource>();
    throw_if_error(s->open(tiny_dir(variant) + "/model.safetensors"));
    throw_if_error(s->open(tiny_dir(variant) + "/golden.safetensors"));
  }
  return *s;
}

}  // namespace tessera::verify

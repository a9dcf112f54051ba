// SPDX-License-Identifier: Apache-2.0
/// Shared fixture of the model suites: the golden/v41-tiny variant folders, the model loaded once per
/// (variant, numerics) and kept for the whole test binary.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "tessera/models/deepseek_v41/model.hpp"
#include "verify/common/golden.hpp"
#include "verify/model/st_fixture.hpp"

namespace tessera::verify {

inline std::string tiny_dir(std::string const& variant) { return golden_dir() + "/v41-tiny/" + variant; }

/// The golden tensors of a variant (weights + golden.safetensors).
inline StFiles const& tiny_files(std::string const& variant) {
  static std::map<std::string, std::unique_ptr<StFiles>> cache;
  auto& f = cache[variant];
  if (!f) {
    f = std::make_unique<StFiles>();
    f->add(tiny_dir(variant) + "/model.safetensors");
    f->add(tiny_dir(variant) + "/golden.safetensors");
  }
  return *f;
}

inline model::dsv41::Dsv41Model& tiny_model(std::string const& variant) {
  static std::map<std::string, std::unique_ptr<model::dsv41::Dsv41Model>> cache;
  auto& m = cache[variant];
  if (!m) {
    model::dsv41::ModelOptions o;
    o.numerics = variant == "bf16" ? model::dsv41::Numerics::kBf16 : model::dsv41::Numerics::kFp32;
    m = model::dsv41::Dsv41Model::create(model::dsv41::tiny_golden_spec(), tiny_files(variant), o).value_or_throw();
  }
  return *m;
}

}  // namespace tessera::verify

// SPDX-License-Identifier: Apache-2.0
/// The tiny model with DSpark: the golden/v41-tiny weights (and Engram hash data) plus seeded synthetic
/// `mtp.*` tensors of the make-synthetic --mtp plan (3 blocks, spec §2.8 shapes: 128 draft experts
/// top-3, Markov rank 256, targets [3, 5, 6], noise token 0), held in memory. Used by the DSpark tests
/// and the server drafting test.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/models/deepseek_v41/config.hpp"
#include "tessera/models/deepseek_v41/dspark.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/model/fixture.hpp"

namespace tessera::verify {

/// A WeightSource over a base source plus in-memory tensors (which win), with names removable (tests).
class OverlaySource final : public model::dsv41::WeightSource {
 public:
  explicit OverlaySource(model::dsv41::WeightSource const& base) : base_(base) {}
  void put(std::string name, Tensor t) { mem_[std::move(name)] = std::move(t); }
  void remove(std::string const& name) { mem_.erase(name); hidden_.push_back(name); }
  bool contains(std::string const& n) const override {
    if (std::find(hidden_.begin(), hidden_.end(), n) != hidden_.end()) return false;
    return mem_.count(n) || base_.contains(n);
  }
  Result<std::vector<int64_t>> shape(std::string const& n) const override {
    if (auto it = mem_.find(n); it != mem_.end()) return it->second.shape();
    return base_.shape(n);
  }
  Result<DType> dtype(std::string const& n) const override {
    if (mem_.count(n)) return DType::kF32;
    return base_.dtype(n);
  }
  Result<Tensor> load_f32(std::string const& n) const override {
    if (auto it = mem_.find(n); it != mem_.end()) {
      Tensor t = Tensor::zeros(DType::kF32, it->second.shape());
      std::memcpy(t.data(), it->second.data(), static_cast<size_t>(t.numel()) * sizeof(float));
      return t;
    }
    return base_.load_f32(n);
  }
  Result<Tensor> load_i64(std::string const& n) const override { return base_.load_i64(n); }
  std::string describe() const override { return "tiny+mtp"; }

 private:
  model::dsv41::WeightSource const& base_;
  std::map<std::string, Tensor> mem_;
  std::vector<std::string> hidden_;
};

/// The tiny configuration with 3 DSpark blocks (what make-synthetic --preset tiny --mtp writes).
inline model::dsv41::Config tiny_mtp_config() {
  auto c = model::dsv41::tiny_config(512);
  throw_if_error(model::dsv41::enable_mtp(c, 3));
  return c;
}

/// tiny_golden_spec() with the DSpark fields of `c`.
inline model::dsv41::ModelSpec tiny_mtp_spec(model::dsv41::Config const& c = tiny_mtp_config()) {
  model::dsv41::ModelSpec s = model::dsv41::tiny_golden_spec();
  s.dspark.blocks = c.num_nextn_predict_layers;
  s.dspark.block_size = c.dspark_block_size;
  s.dspark.noise_token = c.dspark_noise_token_id;
  s.dspark.markov_rank = c.dspark_markov_rank;
  s.dspark.n_experts = c.dspark_n_routed_experts;
  s.dspark.top_k = c.dspark_num_experts_per_tok;
  s.dspark.target_layers = c.dspark_target_layer_ids;
  return s;
}

/// The golden tiny weights of `variant` plus the seeded synthetic mtp.* tensors.
inline std::unique_ptr<OverlaySource> tiny_mtp_source(std::string const& variant, uint64_t seed = 7) {
  auto src = std::make_unique<OverlaySource>(tiny_weights(variant));
  for (auto const& ts : model::dsv41::checkpoint_plan(tiny_mtp_config())) {
    if (ts.name.rfind("mtp.", 0) != 0) continue;
    Tensor t = Tensor::zeros(DType::kF32, ts.shape);
    model::dsv41::synthetic_values(ts, seed)(t.data_as<float>(), 0, t.numel());
    if (variant == "bf16" && !ts.fp32_island)
      for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = round_to_bf16(t.data_as<float>()[i]);
    src->put(ts.name, std::move(t));
  }
  return src;
}

/// A tiny model with DSpark; `max_positions` > 0 replaces max_position_embeddings (512 in the golden
/// configuration; the server test's tool prompts are longer).
inline std::unique_ptr<model::dsv41::Dsv41Model> make_dspark_tiny(std::string const& variant, int64_t max_positions = 0) {
  auto src = tiny_mtp_source(variant);
  model::dsv41::ModelOptions o;
  o.numerics = variant == "bf16" ? model::dsv41::Numerics::kBf16 : model::dsv41::Numerics::kFp32;
  auto spec = tiny_mtp_spec();
  if (max_positions > 0) spec.max_position_embeddings = max_positions;
  return model::dsv41::Dsv41Model::create(spec, *src, o).value_or_throw();
}

/// The tiny model with DSpark (cached per variant for the test binary).
inline model::dsv41::Dsv41Model& dspark_tiny_model(std::string const& variant = "fp32") {
  static std::map<std::string, std::unique_ptr<model::dsv41::Dsv41Model>> cache;
  auto& m = cache[variant];
  if (!m) m = make_dspark_tiny(variant);
  return *m;
}

}  // namespace tessera::verify

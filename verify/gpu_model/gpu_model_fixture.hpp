// SPDX-License-Identifier: Apache-2.0
/// Shared by the GPU model test files, which are built twice: for the GPU (suite gpu), and with
/// TESSERA_GPU_MODEL_ON_CPU for the CPU suite, where the GPU model's composition runs on the CPU op backends
/// in host memory. The model under test from a folder, forwards over fresh sequences, bitwise comparison.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"

namespace tessera::verify {

#if TESSERA_GPU_MODEL_ON_CPU
inline constexpr bool kGpuModelOnCpu = true;
#else
inline constexpr bool kGpuModelOnCpu = false;
#endif

/// The GPU model of folder `dir` on the backend under test (CUDA, or the CPU op backends).
inline std::unique_ptr<model::dsv41::GpuDsv41Model> load_gpu_model(std::string const& dir,
                                                                   model::dsv41::ModelOptions opts) {
  auto mf = model::dsv41::open_model_folder(dir).value_or_throw();
  return model::dsv41::GpuDsv41Model::create(std::move(mf.spec), mf.src, std::move(opts),
                                             kGpuModelOnCpu ? Backend::kCpu : Backend::kCuda)
      .value_or_throw();
}

/// Logits [num_rows, V] of the last num_rows tokens of one forward over `tokens` on a fresh sequence.
inline std::vector<float> run_all(model::LanguageModel& m, std::vector<int32_t> const& tokens, int64_t num_rows) {
  auto st = m.new_sequence();
  std::vector<float> out(static_cast<size_t>(num_rows * m.info().vocab_size));
  model::SequenceStep step{st.get(), tokens, num_rows, out.data()};
  throw_if_error(m.forward({&step, 1}));
  return out;
}

/// Logits of every row of a fresh sequence fed in chunks of `chunk` tokens.
inline std::vector<float> run_chunked(model::LanguageModel& m, std::vector<int32_t> const& tokens, int64_t chunk) {
  int64_t const V = m.info().vocab_size, S = static_cast<int64_t>(tokens.size());
  auto st = m.new_sequence();
  std::vector<float> out(static_cast<size_t>(S * V));
  for (int64_t b = 0; b < S; b += chunk) {
    int64_t const e = std::min(S, b + chunk);
    model::SequenceStep step{st.get(), std::span<int32_t const>(tokens.data() + b, static_cast<size_t>(e - b)), e - b,
                             out.data() + b * V};
    throw_if_error(m.forward({&step, 1}));
  }
  return out;
}

inline bool bitwise_equal(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace tessera::verify

// SPDX-License-Identifier: Apache-2.0
/// `load_model_on`: a model folder on the CPU reference model or the GPU model (gpu_model.hpp).
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"

namespace tessera::model::dsv41 {

Result<std::unique_ptr<LanguageModel>> load_model_on(std::string const& dir, ModelOptions opts, std::string const& device) {
  if (device == "cpu") {
    auto m = load_model(dir, std::move(opts));
    if (!m) return m.status();
    return std::unique_ptr<LanguageModel>(std::move(*m));
  }
  if (device != "cuda") return invalid_argument("--device must be cpu or cuda, got '" + device + "'");
  if (!cuda_model_available())
    return not_supported("--device cuda: this build has no CUDA support or no CUDA device is visible");
  auto mf = open_model_folder(dir);
  if (!mf) return mf.status();
  auto m = GpuDsv41Model::create(std::move(mf->spec), mf->src, std::move(opts));
  if (!m) return m.status();
  return std::unique_ptr<LanguageModel>(std::move(*m));
}

}  // namespace tessera::model::dsv41

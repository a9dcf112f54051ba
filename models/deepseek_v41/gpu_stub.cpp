// SPDX-License-Identifier: Apache-2.0
/// The GPU model in a build without CUDA: every entry reports kNotSupported (gpu_model.hpp).
#include "tessera/models/deepseek_v41/gpu_model.hpp"

namespace tessera::model::dsv41 {

namespace {
Status no_cuda() { return not_supported("--device cuda: Tessera was built without CUDA"); }
}  // namespace

struct GpuDsv41Model::Impl {};

bool cuda_model_available() { return false; }
Result<std::unique_ptr<GpuDsv41Model>> GpuDsv41Model::create(ModelSpec, WeightSource const&, ModelOptions) {
  return no_cuda();
}
GpuDsv41Model::~GpuDsv41Model() = default;
ModelInfo const& GpuDsv41Model::info() const {
  static ModelInfo const kNone;
  return kNone;
}
std::unique_ptr<SequenceState> GpuDsv41Model::new_sequence() { return nullptr; }
Status GpuDsv41Model::forward(std::span<SequenceStep>) { return no_cuda(); }
Result<std::unique_ptr<SequenceState>> GpuDsv41Model::clone(SequenceState const&) { return no_cuda(); }
Status GpuDsv41Model::truncate(SequenceState&, int64_t) { return no_cuda(); }
size_t GpuDsv41Model::state_bytes_for(int64_t) const { return 0; }
TieCounts const* GpuDsv41Model::ties(SequenceState const&) { return nullptr; }
std::vector<QuantBoundary> const* GpuDsv41Model::quant_boundaries(SequenceState const&) { return nullptr; }
void GpuDsv41Model::set_boundary_ulps(int) {}
size_t GpuDsv41Model::pool_bytes() const { return 0; }

}  // namespace tessera::model::dsv41

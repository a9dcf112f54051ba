// SPDX-License-Identifier: Apache-2.0
/// The GPU model's private state (gpu_model.hpp): the sequence state class and the model's Impl, shared
/// by gpu_model.cpp (weights, LanguageModel face, clone / truncate) and the forward (gpu_forward.hpp,
/// gpu_forward.cpp, gpu_attention.cpp).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "models/deepseek_v41/gpu_internal.hpp"
#include "tessera/core/context.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/weights.hpp"

namespace tessera::model::dsv41 {

namespace gpu {
/// Uploads an EXL3 linear as stored (trellis, suh, svh; gpu_exl3.cpp), its outputs cut into `groups` slices
/// (DevTensor's EXL3 layout; each slice a multiple of 128 outputs).
Status upload_exl3(Mem const& mem, GpuWeights& w, Exl3Weight const& q, int64_t groups, DevTensor* out);
}  // namespace gpu

class GpuDsv41State final : public SequenceState {
 public:
  int64_t length() const override { return length_; }
  size_t memory_bytes() const override;

  std::shared_ptr<gpu::DevicePool> pool_;  // first member: released after every block of the state
  int64_t length_ = 0;
  std::vector<gpu::GpuLayerState> layers_;
  std::vector<int64_t> history_;  // compressed token id per position (Engram look-back), host
  TieCounts ties_;
  std::vector<QuantBoundary> boundaries_;
};

struct GpuDsv41Model::Impl {
  ModelSpec spec;
  ModelOptions opts;
  ModelInfo info;
  EngramTables engram;
  DType md = DType::kF32;
  gpu::GpuWeights w;
  gpu::Mem mem;                            // the backend's memory and stream
  std::shared_ptr<gpu::DevicePool> pool;  // shared with the states (a state may outlive the model)
  ExecContext ctx;
  std::vector<float> main_inv_freq, compress_inv_freq;
  std::vector<void*> expert_masks;  // per layer: the backend's copy of opts.prune.expert_mask[l] (empty = none)
  GpuDsv41Model::RouteObserver route_observer;
  /// The CUDA-graph mode's recorder and executable graphs (null: eager launches).
  std::unique_ptr<gpu::GraphCapture> graphs;
  /// A rank model's place in its group (null: the whole model); its weights hold the rank's slices, and the
  /// forward runs the sharded steps (gpu_sharded.cpp) at the query heads, attention output, Engram rows, MoE
  /// and LM head.
  std::shared_ptr<RankShard const> shard;
  /// The routed experts held, [first_expert, first_expert + GpuExperts::w1.size()): the device tables index
  /// them from 0 (a rank holds its plan range; the whole model all of them).
  int64_t first_expert = 0;

  ~Impl();
  void free_expert_masks();
  /// Uploads `host` (routed experts [first_expert, first_expert + held_experts) only; −1 = all from first_expert).
  Status upload(Weights const& host, int64_t held_experts = -1);
  /// The host part of create / create_rank after the weights are loaded: RoPE tables, the backend, the pool,
  /// the upload, info and pruning.
  Status finish_create(GpuDsv41Model& m, Weights const& host, Backend backend, ModelOptions opts, int64_t held_experts);
  /// One forward over the steps of a pass (gpu_forward.hpp): their states are distinct GPU states, tokens
  /// in the vocabulary, num_logit_rows in [0, tokens.size()] (GpuDsv41Model::forward checks); steps without
  /// tokens are skipped. On failure every state of the pass is left as it was.
  Status forward_pass(std::span<SequenceStep const> steps);
  /// A pass of one step.
  Status forward_one(GpuDsv41State& st, std::span<int32_t const> tokens, int64_t num_logit_rows, float* logits);
  /// The Engram hash columns whose table rows this model holds: a rank's range under a sharded Engram, else all.
  dist::Range engram_columns() const;
  /// Host compressed-id history → Engram hash ids [S, L_e, C] of the chunk (as the CPU model's hash_ids).
  std::vector<int64_t> hash_ids(GpuDsv41State const& st, std::span<int32_t const> tokens) const;
};

}  // namespace tessera::model::dsv41

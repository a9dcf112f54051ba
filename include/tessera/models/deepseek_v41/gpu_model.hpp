// SPDX-License-Identifier: Apache-2.0
/// The DeepSeek-V4.1 text model on the CUDA op backends: the CPU model's forward (model.cpp,
/// attention_block.cpp) with every tensor on the device and every op family called as
/// Family<Backend::kCuda>, in the same order of operations, in fp32 or bf16 numerics. Weights come from
/// the CPU loader (fp32 host tensors, bf16-rounded in a bf16 model) and are uploaded once: projections as
/// bf16 in a bf16 model (exact), fp32 otherwise; mHC, sinks, router and Engram tables stay fp32. In a bf16
/// model the projections and head a checkpoint stores block-scaled (native FP8 e4m3 with 32×32 ue8m0 blocks,
/// or FP4) are uploaded as stored, codes + scales, and run through ops::Linear's block-scaled weight dtypes,
/// whose values are the dequantised bf16 weights (ModelOptions::dequantize_weights uploads those instead);
/// experts stay dequantised.
///
/// Each sequence's decode state lives on the device in blocks of the model's DevicePool (window ring,
/// compressor raw rows, compressed KV, index keys; see models/deepseek_v41/gpu_internal.hpp); the Engram
/// look-back (compressed ids by position), the cutoff-tie and quantiser-boundary records stay on the host.
/// Prefill takes chunks of any size and decode is a chunk of one token on the same state. A batch runs as
/// one forward over the layers: the rows of all its steps are concatenated and every row-wise op (embedding,
/// Engram, mHC, norms, projections, RoPE, quantisers, router, experts, LM head) runs once over all of them;
/// only the compressor pooling, the indexer's scoring and selection, the key pool and the attention core
/// run per sequence. Every kernel is row-invariant, so each sequence gets exactly what it gets alone. A step
/// naming a state already in the batch, or rows past 65535, start another such pass (steps run in order).
/// On failure a pass leaves all its states as they were (earlier passes of the batch stay applied). clone
/// copies the device blocks; truncate rolls back up to ModelOptions::max_rollback tokens exactly like the
/// CPU model.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "tessera/models/common/language_model.hpp"
#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::model::dsv41 {

class GpuDsv41State;

class GpuDsv41Model final : public LanguageModel {
 public:
  /// Loads and uploads the weights of `spec` from `src`; kNotSupported in a build without CUDA or on a
  /// machine without a CUDA device. `backend` kCpu runs the same composition, state layout and glue on
  /// the CPU op backends in host memory (how CI checks it against Dsv41Model without a GPU).
  static Result<std::unique_ptr<GpuDsv41Model>> create(ModelSpec spec, WeightSource const& src, ModelOptions opts,
                                                       Backend backend = Backend::kCuda);
  /// Rank `shard->rank` of a tensor/expert-parallel group (sharded.hpp): uploads only that rank's weights
  /// (rank_weights of `full`: its query heads, o-groups, wo_b slice, routed experts, shared-expert rows, LM-head
  /// rows and Engram table rows) on the current device: dense ones as dense (bf16 values in a bf16 model),
  /// block-scaled slices held as stored as codes + scales, EXL3 parts (slice_exl3) as trellis + suh + svh with their
  /// kept outputs (docs/multi-gpu.md "EXL3 weights on ranks"); it runs the sharded steps of models/deepseek_v41/gpu_sharded.cpp over `shard->comm`, which takes buffers in this
  /// backend's memory (device memory on kCuda, host memory on kCpu). `full` is only read here. Every rank
  /// must run the same forwards (the collectives line up because control flow is replicated); each ends a
  /// step with the single-rank model's full-size tensors, so the states stay replicated, and with logits
  /// equal to the single-rank GPU model's bit for bit when the plan is exact (ShardingPlan::bit_exact).
  /// opts.numerics must be full's; opts.dequantize_weights has no effect (the rank holds the forms `full` holds).
  /// Errors: full's EXL3 weights breaking the rank rules (check_exl3_weights: a layer mixing EXL3 and dense expert
  /// linears, a grouped EXL3 wo_a off 128-column groups) or an EXL3 input split off 128-input blocks, kNotSupported.
  static Result<std::unique_ptr<GpuDsv41Model>> create_rank(Dsv41Model const& full, std::shared_ptr<RankShard const> shard,
                                                            ModelOptions opts, Backend backend = Backend::kCuda);
  ~GpuDsv41Model() override;

  ModelInfo const& info() const override;
  std::unique_ptr<SequenceState> new_sequence() override;
  Status forward(std::span<SequenceStep> batch) override;
  Result<std::unique_ptr<SequenceState>> clone(SequenceState const& state) override;
  Status truncate(SequenceState& state, int64_t length) override;
  size_t state_bytes_for(int64_t num_tokens) const override;
  /// Bytes of one sequence's state after num_tokens tokens for `spec` under `opts`: the window and raw
  /// rings (fp32), whole pages of packed compressed-KV entries and index keys (288 B and 68 B a row at the
  /// released widths), and the Engram look-back (8 B a token).
  static size_t state_bytes_for(ModelSpec const& spec, ModelOptions const& opts, int64_t num_tokens);

  /// Diagnostics of a GPU sequence (the golden gate's tie and boundary reports).
  static TieCounts const* ties(SequenceState const& s);
  static std::vector<QuantBoundary> const* quant_boundaries(SequenceState const& s);
  void set_boundary_ulps(int ulps);
  /// Validates (check_pruning) and installs routed-expert pruning for later forwards, as
  /// Dsv41Model::set_pruning: the same MoeRoute Desc fields, and the static masks uploaded as one
  /// [n_routed_experts] byte row per layer.
  Status set_pruning(ExpertPruning p);
  ExpertPruning const& pruning() const;
  /// Observer of the router (diagnostics, calibration): after each layer's MoeRoute, one call per step of
  /// the batch (in batch order) with its chunk's ids [rows, top_k] (−1 = a slot dropped by per-token
  /// pruning) and weights, copied to the host (one stream synchronisation per layer while an observer is
  /// set); calls are layer-major (layer 0 for every step, then layer 1, …). Empty = none.
  using RouteObserver =
      std::function<void(int64_t layer, std::span<int32_t const> ids, std::span<float const> weights)>;
  void set_route_observer(RouteObserver observer);
  /// Switches the CUDA-graph mode (ModelOptions::cuda_graphs) for later forwards:
  /// each pass's layers and head recorded per segment and launched as graphs, every segment's executable graphs kept
  /// and updated in place by the next recording of the same shape. A pass with a route observer runs eagerly.
  /// kNotSupported on the CPU backends and on rank models (their collectives run between segments). Off releases
  /// the executable graphs.
  Status set_cuda_graphs(bool on);
  bool cuda_graphs() const;
  /// Executable-graph counters since graphs were switched on: segments launched, executables updated in place,
  /// executables instantiated (zeros when off).
  struct GraphCounts {
    int64_t launches = 0, updates = 0, instantiations = 0;
  };
  GraphCounts graph_counts() const;
  /// Device bytes held by the state pool (blocks in use and cached).
  size_t pool_bytes() const;
  /// Device bytes held by the weights.
  size_t weight_bytes() const;
  /// How the projection of Weights::scaled key `key` (scaled_weight_key / scaled_head_key) is held:
  /// kF8E4m3 / kF4E2m1x2 as stored (codes + scales), kI16 an EXL3 trellis as stored, kBf16 or kF32 dense; kNotFound for an unknown key or a
  /// weight the layer does not have.
  Result<DType> projection_dtype(std::string const& key) const;
  /// How layer `layer`'s routed experts are held: kF8E4m3 / kF4E2m1x2 as stored (CUDA, bf16 numerics, a
  /// checkpoint storing them block-scaled), else their dense dtype; kNotFound for a layer without experts.
  Result<DType> routed_experts_dtype(int64_t layer) const;
  /// How layer `layer`'s shared expert is held: kF8E4m3 / kF4E2m1x2 as stored (where the routed experts are held
  /// so too and the checkpoint stores it block-scaled; TESSERA_SHARED_AS_STORED=0 at create loads it dense), else
  /// its dense dtype (EXL3: kI16); kNotFound for a layer out of range.
  Result<DType> shared_expert_dtype(int64_t layer) const;

  struct Impl;

 private:
  GpuDsv41Model() = default;
  std::unique_ptr<Impl> impl_;
};

/// Whether this build has CUDA and the machine a CUDA device.
bool cuda_model_available();

/// `load_model` (loader.hpp) on a device: "cpu" gives the CPU model, "cuda" the GPU model (a clear
/// kNotSupported when CUDA is unavailable); anything else is invalid.
Result<std::unique_ptr<LanguageModel>> load_model_on(std::string const& dir, ModelOptions opts, std::string const& device);

}  // namespace tessera::model::dsv41

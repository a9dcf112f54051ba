// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 over a tensor/expert-parallel group (dist/plan.hpp, docs/multi-gpu.md). A rank model
/// is a Dsv41Model holding the rank's weight slices (replicated tensors are shared with the full model,
/// not copied) plus a RankShard; its forward runs the single-rank code with the sharded steps of
/// model_internal.hpp at the five places that differ (query heads, attention output, Engram rows, MoE,
/// LM head). Every rank ends each step with the same full-size tensors, so states stay replicated.
///
/// ShardedModel runs the ranks as threads over the in-process communicator on the CPU backend: one
/// LanguageModel whose sequences hold one state per rank; rank 0's logits are returned. Exactness
/// against one rank: bit-exact whenever the plan is (ShardingPlan::bit_exact); with the attention
/// all-reduce the sums differ by rounding only (bound in docs/multi-gpu.md).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tessera/core/thread_pool.hpp"
#include "tessera/dist/communicator.hpp"
#include "tessera/dist/plan.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::model::dsv41 {

struct RankShard {
  dist::ShardingPlan plan;
  int rank = 0;
  dist::Communicator* comm = nullptr;  // host-memory communicator of this rank
  dist::RankPlan const& me() const { return plan.ranks[static_cast<size_t>(rank)]; }
};

/// The plan dimensions of a model spec.
dist::ModelDims model_dims(ModelSpec const& spec);

/// Bytes each rank holds under `plan` for `tensors` (names of any scheme of weights.hpp, `nbytes` as
/// stored, so quantized checkpoints count their packed bytes): split tensors count their slice,
/// everything else is replicated. Engram tables count their share of hash columns (≈ rows).
std::vector<size_t> plan_memory(dist::ShardingPlan const& plan, ModelSpec const& spec,
                                std::vector<io::TensorInfo> const& tensors);

/// A rank model of `full` for rank `shard->rank` of `shard->plan` (its slices copied, the rest shared).
Result<std::unique_ptr<Dsv41Model>> make_rank_model(Dsv41Model const& full, std::shared_ptr<RankShard const> shard,
                                                    ThreadPool* pool);

class ShardedState final : public SequenceState {
 public:
  int64_t length() const override { return ranks[0]->length(); }
  size_t memory_bytes() const override;
  std::vector<std::unique_ptr<SequenceState>> ranks;  // one Dsv41State per rank
};

class ShardedModel final : public LanguageModel {
 public:
  /// Builds the plan for `full` and `cfg` and one rank model per rank (threads with one-thread pools).
  static Result<std::unique_ptr<ShardedModel>> create(Dsv41Model const& full, dist::ParallelConfig cfg);
  ~ShardedModel() override;

  ModelInfo const& info() const override { return info_; }
  std::unique_ptr<SequenceState> new_sequence() override;
  /// Runs the batch on every rank concurrently; a rank's failure aborts the group (the others return
  /// too) and the group is rebuilt for the next call.
  Status forward(std::span<SequenceStep> batch) override;
  Result<std::unique_ptr<SequenceState>> clone(SequenceState const& state) override;
  Status truncate(SequenceState& state, int64_t length) override;
  size_t state_bytes_for(int64_t num_tokens) const override;

  /// Runs fn(rank model, rank) on one thread per rank (fn must issue the same forwards on every rank);
  /// a failing rank aborts the group so the others return too; the group is rebuilt afterwards. Returns
  /// the first failing rank's status.
  Status run_ranks(std::function<Status(Dsv41Model&, int)> const& fn);
  dist::ShardingPlan const& plan() const { return shards_[0]->plan; }
  int world() const { return static_cast<int>(ranks_.size()); }
  Dsv41Model& rank_model(int r) { return *ranks_[static_cast<size_t>(r)]; }

 private:
  ShardedModel() = default;
  ModelInfo info_;
  std::vector<std::unique_ptr<ThreadPool>> pools_;
  std::vector<std::unique_ptr<dist::InProcessCommunicator>> comms_;
  std::vector<std::shared_ptr<RankShard>> shards_;
  std::vector<std::unique_ptr<Dsv41Model>> ranks_;
};

struct GoldenReport;

/// The golden gate (golden_gate.hpp) of a sharded model: every rank runs it on its rank model at once;
/// rank 0's report (and log lines).
Result<GoldenReport> run_golden_gate_sharded(ShardedModel& model, WeightSource const& golden,
                                             std::function<void(std::string const&)> const& log);

}  // namespace tessera::model::dsv41

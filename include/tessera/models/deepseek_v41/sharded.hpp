// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 over a tensor/expert-parallel group (dist/plan.hpp, docs/multi-gpu.md). A rank model
/// is a Dsv41Model holding the rank's weight slices (replicated tensors are shared with the full model,
/// not copied) plus a RankShard; its forward runs the single-rank code with the sharded steps of
/// model_internal.hpp at the five places that differ (query heads, attention output, Engram rows, MoE,
/// LM head). Every rank ends each step with the same full-size tensors, so states stay replicated.
/// Block-scaled weights held as stored (ModelOptions::weights_as_stored) are sliced as stored: the rank's rows
/// or columns of codes and the scale blocks covering them, where the plan's range falls on scale blocks
/// (rank_weights, scaled_slice_aligned).
///
/// The GPU model's rank models (GpuDsv41Model::create_rank, gpu_model.hpp) run the same sharded steps on the
/// backend's memory (models/deepseek_v41/gpu_sharded.cpp).
///
/// ShardedModel runs the ranks as threads over the in-process communicator: CPU rank models (create), or GPU
/// rank models on either op backend (create_gpu). One LanguageModel whose sequences hold one state per rank;
/// rank 0's logits are returned. Exactness against one rank: bit-exact whenever the plan is
/// (ShardingPlan::bit_exact); with the attention all-reduce the sums differ by rounding only (bound in
/// docs/multi-gpu.md).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/thread_pool.hpp"
#include "tessera/dist/communicator.hpp"
#include "tessera/dist/plan.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/engram_tables.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "tessera/models/deepseek_v41/model.hpp"

namespace tessera::model::dsv41 {

struct RankShard {
  dist::ShardingPlan plan;
  int rank = 0;
  /// This rank's communicator, in the rank model's memory: host memory for the CPU model and the GPU model
  /// on Backend::kCpu, device memory for the GPU model on Backend::kCuda.
  dist::Communicator* comm = nullptr;
  dist::RankPlan const& me() const { return plan.ranks[static_cast<size_t>(rank)]; }
};

/// widths[r] = range_size(rank r's plan): the per-rank sizes of a gather's blocks.
template <class F>
std::vector<int64_t> widths_of(RankShard const& sh, F range_size) {
  std::vector<int64_t> w;
  for (auto const& r : sh.plan.ranks) w.push_back(range_size(r));
  return w;
}

/// The plan dimensions of a model spec.
dist::ModelDims model_dims(ModelSpec const& spec);

/// Whether rows (cols = false) or columns (cols = true) [r.begin, r.end) of a block-scaled weight in `dtype` with n
/// of them in all are whole scale blocks, so that a rank can hold the slice as stored: scaled_whole_blocks
/// (weights.hpp; FP8 rows and columns in 32×32 blocks, FP4 columns in 32s, any FP4 rows; the last block may be the
/// tensor's partial one).
bool scaled_slice_aligned(DType dtype, int64_t n, dist::Range r, bool cols);

/// The parts of the split tensors rank `rank` of `plan` holds (weights.hpp RankParts), for a model of `spec` whose
/// Engram hash layout is `engram` (its offsets and primes):
///   TP:  wq_b rows [h0·hd, h1·hd), attn_sink [h0, h1), wo_a rows [g0·ro, g1·ro) (none when heads are gathered),
///        wo_b rows wo_b_rows or, under the all-reduce, columns [g0·ro, g1·ro); shared-expert w1 / w3 rows shared_inter,
///        w2 rows shared_rows; LM-head rows vocab;
///   Engram sharded over world > 1: per Engram layer ei the table rows [offsets[c0], offsets[c1] + primes[c1]) of the
///        rank's hash columns c0 … c1 (column c = ei·C + j), [0, 0) for a rank without columns.
/// rank_weights cuts exactly these from a whole host model; WeightLoadOptions::parts reads exactly these
/// (load_rank_host_model). Errors: a rank outside the plan, a plan of other dimensions, hash columns past a table's rows.
Result<RankParts> rank_parts(ModelSpec const& spec, dist::ShardingPlan const& plan, int rank, EngramTables const& engram);

/// Bytes each rank holds under `plan` for `tensors` (names of any scheme of weights.hpp, `nbytes` as
/// stored, so quantized checkpoints count their packed bytes): split tensors count their slice, everything
/// else is replicated. A block-scaled weight (`X.weight` codes + `X.scale`, spec §4.2) counts the codes and
/// scale blocks of its slice (rank_weights' stored slice), or, when the slice is not whole scale blocks
/// (scaled_slice_aligned), its values as bf16 (2 bytes each: the dense slice a bf16 rank holds) and no scales.
/// An EXL3 group (spec/exl3.md §1.1: `P.trellis`, `P.suh` / `P.su`, `P.svh` / `P.sv`) counts the part slice_exl3 cuts,
/// as the rank models hold it: split by output rows, the trellis tile columns and svh of the 128-column blocks covering
/// them and suh whole; split by input columns (the all-reduce wo_b), the tile rows and suh of the 128-input blocks
/// covering them and svh whole; suh / svh 2 bytes an element (legacy packed signs expanded); a routed expert's group
/// whole on the rank holding it; markers replicated as stored.
/// Engram tables count their share of hash columns (≈ rows).
std::vector<size_t> plan_memory(dist::ShardingPlan const& plan, ModelSpec const& spec,
                                std::vector<io::TensorInfo> const& tensors);

/// The options of the host model that rank models are sliced from (`tessera serve --tp/--ep`, threads or one process
/// per rank, and `tessera verify golden --tp/--ep`): `o` with weights_as_stored set exactly when o.numerics is bf16,
/// so the host model and every rank model hold the checkpoint's block-scaled weights as stored (FP8 / FP4 codes +
/// scales, their slices on the ranks) instead of dense values, with the same logits bit for bit. fp32 numerics keep
/// dense weights: the ops' block-scaled weights are bf16-numerics weights (their value is the bf16 rounding of the
/// dequantised weight, in bf16 products), which the fp32 model does not compute with (Dsv41Model::create refuses).
ModelOptions rank_host_options(ModelOptions o);

/// load_model(dir, rank_host_options(o)): the host model of the CLI's sharded paths.
Result<std::unique_ptr<Dsv41Model>> load_rank_host_model(std::string const& dir, ModelOptions o);

/// rank_host_options(o) for the host model of one rank of `plan` (one process per rank): only the routed experts
/// the rank holds are read (ModelOptions::routed_experts_begin / end: the rank's range under EP, all of them
/// otherwise). Error: a rank outside the plan.
Result<ModelOptions> rank_host_options(ModelOptions o, dist::ShardingPlan const& plan, int rank);

/// Rank `rank`'s host model of `plan` from `src`: Dsv41Model::create with rank_host_options(o, plan, rank), reading
/// only what the rank holds. The checkpoint's routed experts outside the rank's range are not read, and of the split
/// tensors only the rank's parts (rank_parts; WeightLoadOptions::parts): rows or columns read alone, block-scaled ones
/// as stored when whole scale blocks (bf16, weights_as_stored), else their values, so the host holds what rank_weights
/// would cut from the whole host model, byte for byte. When any tensor is cut the model records it (held_part()). The
/// model runs no forward itself and serves make_rank_model / GpuDsv41Model::create_rank of that rank (and of any rank
/// with the same parts and experts). Errors: a plan made for other dimensions than `spec`'s (model_dims), a rank
/// outside the plan, a part outside its tensor, an EXL3 input split off 128-input blocks (kNotSupported).
Result<std::unique_ptr<Dsv41Model>> load_rank_host_model(ModelSpec spec, WeightSource const& src, ModelOptions o,
                                                         dist::ShardingPlan const& plan, int rank);

/// A rank process's host model and the plan it was loaded for.
struct RankHost {
  std::unique_ptr<Dsv41Model> model;
  dist::ShardingPlan plan;
};
/// Opens the model folder `dir`, makes the plan of `cfg` for its dimensions and loads rank `rank`'s host model
/// (load_rank_host_model): what `tessera serve --tp/--ep` does in each process under the launch variables.
Result<RankHost> load_rank_host(std::string const& dir, ModelOptions o, dist::ParallelConfig const& cfg, int rank);

/// A rank model of `full` for rank `shard->rank` of `shard->plan` (its slices copied, the rest shared).
Result<std::unique_ptr<Dsv41Model>> make_rank_model(Dsv41Model const& full, std::shared_ptr<RankShard const> shard,
                                                    ThreadPool* pool);

/// The weights rank `shard.rank` holds: `full`'s with the plan's slices copied (wq_b / attn_sink heads, wo_a
/// groups, wo_b rows or columns, shared-expert rows, LM-head rows, Engram table rows of the rank's hash
/// columns) and the routed experts outside the rank's range left empty (undefined tensors; the vector keeps
/// n_routed_experts entries); every other tensor is shared with `full`, not copied.
/// EXL3 weights (Weights::exl3) stay EXL3: a split one becomes its EXL3 part (slice_exl3, weights.hpp): output rows as
/// the trellis tile columns and svh of the 128-column blocks covering them (suh whole; the rank keeps its rows of their
/// outputs), the all-reduce wo_b's input columns as tile rows and suh (svh whole), refused (kNotSupported) when they are
/// not on 128-input blocks; routed experts outside the rank's range are dropped from Weights::exl3, the others kept
/// whole. A layer whose expert linears are partly EXL3 is refused (kNotSupported, check_exl3_weights).
/// Block-scaled weights `full` holds as stored (Weights::scaled, ModelOptions::weights_as_stored) stay stored:
/// a split one becomes the stored slice (its rows or columns of codes and the scale blocks covering them; the
/// dense tensor stays undefined) when the slice is whole scale blocks (scaled_slice_aligned), else the dense
/// slice of its values (dequantize_scaled; e.g. o_lora_rank 16 splits wo_a's 32-row FP8 blocks at TP 2) and
/// no stored form; routed experts outside the rank's range are dropped from Weights::scaled, the others kept whole.
/// The cuts are rank_parts. From a host model holding a rank's parts (held_part(), load_rank_host_model) nothing is
/// cut: its tensors are shared as they are, which is the same bytes, and a rank needing other parts is refused.
Result<Weights> rank_weights(Dsv41Model const& full, RankShard const& shard);

class ShardedState final : public SequenceState {
 public:
  int64_t length() const override { return ranks[0]->length(); }
  size_t memory_bytes() const override;
  std::vector<std::unique_ptr<SequenceState>> ranks;  // one Dsv41State per rank
};

class ShardedModel final : public LanguageModel {
 public:
  /// Builds the plan for `full` and `cfg` and one CPU rank model per rank (threads with one-thread pools).
  static Result<std::unique_ptr<ShardedModel>> create(Dsv41Model const& full, dist::ParallelConfig cfg);
  /// The same with GPU rank models (GpuDsv41Model::create_rank) on `backend`, their weights sliced from
  /// `full` (which may be released afterwards). kCuda: rank r runs on CUDA device r mod the visible device
  /// count (with one GPU every rank shares it), and its collectives stage the device buffers through host
  /// memory to the in-process communicator (a test path; NCCL is the production one). kCpu: the ranks
  /// compute in host memory and use the in-process communicator directly. The numerics are full's
  /// (opts.numerics is overridden); opts.pool is set per rank (one-thread pools).
  static Result<std::unique_ptr<ShardedModel>> create_gpu(Dsv41Model const& full, dist::ParallelConfig cfg,
                                                          Backend backend, ModelOptions opts = {});
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
  Status run_ranks(std::function<Status(LanguageModel&, int)> const& fn);
  dist::ShardingPlan const& plan() const { return shards_[0]->plan; }
  int world() const { return static_cast<int>(ranks_.size()); }
  LanguageModel& rank_model(int r) { return *ranks_[static_cast<size_t>(r)]; }
  /// The golden gate's hooks (golden_gate.hpp) for rank model r, and whether the ranks compute in bf16.
  GoldenGateHooks gate_hooks(int r);
  bool bf16() const { return bf16_; }

 private:
  ShardedModel() = default;
  /// A fresh in-process group; each rank's RankShard::comm points at its communicator (through the rank's
  /// staging adapter when wrap_comm_ is set).
  void make_group(int n);
  /// Makes rank r's device current on the calling thread (kCuda ranks); empty = nothing to do.
  Status enter_rank(int r) const { return enter_rank_ ? enter_rank_(r) : Status{}; }

  ModelInfo info_;
  bool bf16_ = false;
  std::vector<std::unique_ptr<ThreadPool>> pools_;
  std::vector<std::unique_ptr<dist::InProcessCommunicator>> comms_;
  std::function<std::unique_ptr<dist::Communicator>(dist::Communicator& host, int rank)> wrap_comm_;
  std::vector<std::unique_ptr<dist::Communicator>> wrapped_;  // per rank when wrap_comm_ is set
  std::function<Status(int)> enter_rank_;
  std::function<GoldenGateHooks(LanguageModel&)> hooks_;
  std::vector<std::shared_ptr<RankShard>> shards_;
  std::vector<std::unique_ptr<LanguageModel>> ranks_;
};

/// The golden gate (golden_gate.hpp) of a sharded model: every rank runs it on its rank model at once;
/// rank 0's report (and log lines).
Result<GoldenReport> run_golden_gate_sharded(ShardedModel& model, WeightSource const& golden,
                                             std::function<void(std::string const&)> const& log);

}  // namespace tessera::model::dsv41

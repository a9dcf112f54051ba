// SPDX-License-Identifier: Apache-2.0
/// The DeepSeek-V4.1 text model on the CPU op backend (spec/deepseek-v41.md §2-§3), the plain and
/// trustworthy implementation every fast path is checked against. One decode state per sequence:
/// window rings (post-RoPE, FP8-fake-quantised K=V, last W−1 entries), compressor partial-group buffers
/// (raw fp32 projections), compressed KV and index-key caches (post-RoPE, FP4), and the Engram look-back
/// (compressed ids by position). Prefill takes chunks of any size, decode is a chunk of one token, and
/// every row is computed by the same per-row code with fixed reduction orders, so a token's logits are
/// bit-identical whatever the chunking and whatever else is in the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/context.hpp"
#include "tessera/models/common/language_model.hpp"
#include "tessera/models/deepseek_v41/engram_tables.hpp"
#include "tessera/models/deepseek_v41/model_spec.hpp"
#include "tessera/models/deepseek_v41/weights.hpp"

namespace tessera::model::dsv41 {

struct RankShard;     // tensor/expert-parallel rank view (sharded.hpp)
struct StoredLinear;  // a linear's held form (model_internal.hpp)
struct RankAccess;  // builds rank models (sharded.cpp)

/// One exact top-k cutoff tie: the k-th and (k+1)-th finite values were equal, so the selection was
/// decided by the tie rule (lower index wins, ref/indexer_ref.hpp).
struct CutoffTie {
  enum class Site : uint8_t { kIndexer, kCandidateBlocks, kRouter } site;
  int32_t layer = 0;
  int64_t position = 0;  // absolute position of the query / token
};

/// Exact top-k cutoff ties met while computing a sequence (each counted once per row and call site).
struct TieCounts {
  int64_t indexer = 0, candidate = 0, router = 0;
  std::vector<CutoffTie> events;  // every tie, in the order met
  int64_t total() const { return indexer + candidate + router; }
};

/// A quantiser decision within `boundary_ulps` of a rounding boundary (ModelOptions::boundary_ulps):
/// summation-order noise of another engine can flip it (the fp32 counterpart of a top-k tie).
struct QuantBoundary {
  enum class Site : uint8_t { kWindowKv, kCompressedKv, kIndexKey, kIndexQuery } site;
  int32_t layer = 0;
  int64_t position = 0;  // token position (window KV, index query) or group position (compressed, keys)
};

/// Per-layer decode state. The window keeps W−1 + max_rollback entries and ratio > 1 KV sources keep the
/// raw projections of their last max_rollback + r tokens, so `truncate` can rebuild the exact state of
/// any length within the last max_rollback tokens.
struct LayerState {
  std::vector<float> window;        // [≤ W−1+max_rollback, hd] oldest first
  std::vector<int64_t> window_pos;  // positions of `window`
  std::vector<float> buf_kv, buf_gate;  // [< r, hd] fp32 partial group (ratio > 1 KV sources)
  std::vector<float> raw_kv, raw_gate;  // [≤ max_rollback + r, hd] recent raw projections (ratio > 1)
  std::vector<int64_t> raw_pos;         // positions of raw_kv rows
  int64_t entry_count = 0;          // groups emitted
  std::vector<float> ckv;           // [T, hd] compressed KV
  std::vector<float> index_k;       // [T, di] index keys
};

class Dsv41State final : public SequenceState {
 public:
  int64_t length() const override { return length_; }
  size_t memory_bytes() const override;
  TieCounts const& ties() const { return ties_; }
  std::vector<QuantBoundary> const& quant_boundaries() const { return boundaries_; }
  /// DSpark target features [rows, |T|·D] of positions dspark_tap_first() … length − 1 (dspark.hpp).
  std::vector<float> const& dspark_taps() const { return dspark_taps_; }
  int64_t dspark_tap_first() const { return dspark_tap_first_; }

 private:
  friend class Dsv41Model;
  int64_t length_ = 0;
  std::vector<LayerState> layers_;
  std::vector<int64_t> history_;    // compressed token id per position (Engram look-back)
  TieCounts ties_;
  std::vector<QuantBoundary> boundaries_;
  std::vector<float> dspark_taps_;  // last W + max_rollback positions (only with DSpark weights)
  int64_t dspark_tap_first_ = 0;
};

struct DsparkWeights;
struct DsparkPass;

/// Optional observer of intermediate tensors, named like the golden's `debug.*` keys without the
/// prefix (e.g. "model.layers.3.attn.out0"); rows are the chunk's rows. For tests and bisection.
using DebugTap = std::function<void(std::string const& name, std::vector<int64_t> const& shape,
                                    std::span<float const> values)>;
/// Optional override of a module output after it was tapped, by name as DebugTap: the callee may overwrite
/// `values` (e.g. with the golden's own tensor) so that later modules see them. Offered at the layer outputs
/// (`…out0`, `…out1`) and the sub-block outputs (`…attn.out0`, `…ffn.out0`, `…engram.out0`); for bisection:
/// pinning every layer's input to the reference's isolates each layer's own arithmetic.
using DebugPin = std::function<void(std::string const& name, std::span<float> values)>;

/// Routed-expert pruning (spec/seed-notes.md §5; lossy, labelled, off by default; ops/moe.hpp). The
/// shared expert is never pruned. The defaults compute the unpruned model bit for bit.
struct ExpertPruning {
  enum class Scope : uint8_t { kDecode, kAll };  // decode = chunks of one token after the first position
  float top_p = 1.f;    // per-token top-p over the selected experts' weights, (0, 1]; 1 = off
  int64_t min_k = 0;    // keep at least max(1, min_k)
  bool renorm = true;   // rescale the kept weights to the selected sum; false = keep the original weights
  Scope scope = Scope::kDecode;
  std::vector<std::vector<uint8_t>> expert_mask;  // [layers][n_experts], nonzero = never selected; empty = none
  bool active() const { return top_p < 1.f || !expert_mask.empty(); }
};

/// Names the first bad field of `p` for a model of `spec`: top_p in (0, 1], min_k ≥ 0, and a non-empty
/// mask has one row of n_routed_experts per layer, each leaving at least num_experts_per_tok experts open.
Status check_pruning(ExpertPruning const& p, ModelSpec const& spec);

struct ModelOptions {
  Numerics numerics = Numerics::kFp32;
  ExpertPruning prune;
  ThreadPool* pool = nullptr;  // nullptr = ThreadPool::global()
  int64_t max_rollback = 64;   // truncate() reaches back this many tokens (state kept for it)
  int boundary_ulps = 0;       // > 0: record quantiser decisions this close to a boundary (diagnostics)
  /// GPU model, bf16 numerics: true uploads block-scaled (native FP8 / FP4) projections, head and routed experts
  /// dequantised instead of as stored codes + scales (the same values and logits; two to four times the bytes).
  /// The CPU model dequantises them unless weights_as_stored. EXL3 linears (CPU and GPU model): true loads their
  /// effective dense weights (exl3_effective_weight, →bf16 in bf16) and runs the dense arithmetic instead of the
  /// EXL3 product.
  bool dequantize_weights = false;
  /// CPU model, bf16 numerics: hold the block-scaled projections, head and routed experts as stored codes +
  /// scales (Weights::scaled, no dequantised copy; WeightLoadOptions::projections_as_stored / experts_as_stored)
  /// and compute with them through the ops' block-scaled weights (ops::Linear, MoeExpertsDesc::routed_scaled):
  /// the values are the dequantised bf16 weights, so the logits are the dequantised model's bit for bit, from
  /// about a quarter (FP8) or an eighth (FP4) of the fp32 bytes. The rank models sliced from such a model
  /// (make_rank_model, GpuDsv41Model::create_rank) hold the stored slices. fp32 numerics: refused (a stored
  /// weight's value is its bf16 rounding).
  bool weights_as_stored = false;
  /// CPU model: read only routed experts [routed_experts_begin, routed_experts_end) of the checkpoint (end −1: all;
  /// WeightLoadOptions::routed_begin / routed_end), the host model of one expert-parallel rank
  /// (load_rank_host_model, sharded.hpp). A model holding part of them runs no forward (kInvalidArgument) and
  /// slices only ranks whose experts it holds (rank_weights).
  int64_t routed_experts_begin = 0, routed_experts_end = -1;
  /// GPU model: bytes of one page of a sequence's growing state (compressed-KV entries, index keys); a
  /// sequence holds at most one partly used page per layer and family. Tests set small pages.
  int64_t state_page_bytes = 64 << 10;
  /// GPU model: run each forward's layers and head as CUDA graphs, recorded per segment and replayed through
  /// executable graphs updated in place (GpuDsv41Model::set_cuda_graphs; the same kernels and parameters as eager
  /// launches, so the same bits). kOff: eager launches; kAuto: on for a single-rank model on CUDA, off on the CPU op
  /// backends and for rank models (the default); kOn: as kAuto, but a model that cannot record fails to create. The
  /// environment's TESSERA_CUDA_GRAPHS=0 makes it kOff (eager launches, e.g. for A/B timings) and =1 makes kOff kAuto.
  enum class CudaGraphs : uint8_t { kOff, kAuto, kOn };
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;
};

class Dsv41Model final : public LanguageModel {
 public:
  /// Loads weights and the Engram tables from `src` for `spec`.
  static Result<std::unique_ptr<Dsv41Model>> create(ModelSpec spec, WeightSource const& src, ModelOptions opts);

  ModelInfo const& info() const override { return info_; }
  std::unique_ptr<SequenceState> new_sequence() override;
  Status forward(std::span<SequenceStep> batch) override;
  Result<std::unique_ptr<SequenceState>> clone(SequenceState const& state) override;
  /// Rolls back to the first `length` tokens, bit-exactly (continuing from there equals never having gone
  /// further); kNotSupported beyond ModelOptions::max_rollback tokens back.
  Status truncate(SequenceState& state, int64_t length) override;
  size_t state_bytes_for(int64_t num_tokens) const override;

  ModelSpec const& spec() const { return spec_; }
  /// The routed experts the model holds: [first, second) of n_routed_experts (ModelOptions::routed_experts_begin).
  std::pair<int64_t, int64_t> held_routed_experts() const {
    return {opts_.routed_experts_begin, opts_.routed_experts_end < 0 ? spec_.n_experts : opts_.routed_experts_end};
  }
  /// The rank whose parts of the tensor-parallel split tensors this host model holds (plan and rank, no communicator;
  /// load_rank_host_model reads only those parts, rank_parts), or nullptr when it holds every tensor whole. Such a
  /// model runs no forward (kInvalidArgument) and slices only rank models that need exactly its parts (rank_weights).
  RankShard const* held_part() const { return part_.get(); }
  /// Bytes of the weight tensors the model references (Weights: dense tensors, stored codes and scales, EXL3
  /// groups); a rank model counts the tensors it shares with the full model as well as its own slices.
  size_t weight_bytes() const;
  EngramTables const& engram() const { return engram_; }
  Numerics numerics() const { return opts_.numerics; }
  void set_boundary_ulps(int ulps) { opts_.boundary_ulps = ulps; }
  /// Validates and installs routed-expert pruning for later forwards (names the bad field).
  Status set_pruning(ExpertPruning p);
  ExpertPruning const& pruning() const { return opts_.prune; }
  std::vector<float> const& main_inv_freq() const { return main_inv_freq_; }
  std::vector<float> const& compress_inv_freq() const { return compress_inv_freq_; }
  void set_debug_tap(DebugTap tap) { tap_ = std::move(tap); }
  void set_debug_pin(DebugPin pin) { pin_ = std::move(pin); }
  /// DSpark (dspark.hpp): loaded when the checkpoint has `mtp.*` weights.
  bool has_dspark() const { return dspark_ != nullptr; }
  DsparkWeights const* dspark_weights() const { return dspark_.get(); }
  /// One draft pass for `anchor` (the pending token at position st.length()). `row_step` > 0 runs every
  /// row-wise op on that many rows at a time (1 = the position-by-position formulation; tests).
  Result<DsparkPass> dspark_draft(Dsv41State const& st, int32_t anchor, int64_t row_step = 0) const;

  /// Appends `tokens` to one sequence and writes logits for its last `num_logit_rows` tokens.
  Status forward_one(Dsv41State& st, std::span<int32_t const> tokens, int64_t num_logit_rows, float* logits);
  /// Engram hash ids [S, L_e, C] the chunk would use (advances nothing); for the hash_ids fixtures.
  std::vector<int64_t> hash_ids(Dsv41State const& st, std::span<int32_t const> tokens) const;

 private:
  Dsv41Model() = default;
  /// create; with `part` (a rank of a plan) only the parts of the split tensors that rank holds are read
  /// (WeightLoadOptions::parts = rank_parts) and recorded as held_part() when any tensor is cut.
  static Result<std::unique_ptr<Dsv41Model>> create_(ModelSpec spec, WeightSource const& src, ModelOptions opts,
                                                     std::shared_ptr<RankShard const> part);
  /// Why the model cannot run a forward of its own (a host model holding part of the weights), or OK.
  Status check_whole() const;
  struct Chunk;
  void attention_block(int64_t l, Dsv41State& st, Chunk& c, std::vector<float> const& xa, std::vector<float>& out);
  /// The stored form of projection `field` of layer l (Weights::exl3 / Weights::scaled; neither when dense).
  StoredLinear q_(int64_t l, char const* field) const;
  void dspark_record(Dsv41State& st, int64_t layer, std::vector<float> const& X) const;
  void dspark_truncate(Dsv41State& st, int64_t length) const;
  void tap(std::string const& name, std::vector<int64_t> shape, std::span<float const> v) const {
    if (tap_) tap_(name, shape, v);
  }
  void tap_pin(std::string const& name, std::vector<int64_t> shape, std::vector<float>& v) const {
    tap(name, std::move(shape), v);
    if (pin_) pin_(name, v);
  }

  ModelSpec spec_;
  ModelOptions opts_;
  ModelInfo info_;
  Weights w_;
  EngramTables engram_;
  std::vector<float> main_inv_freq_, compress_inv_freq_;
  DebugTap tap_;
  DebugPin pin_;
  std::shared_ptr<DsparkWeights const> dspark_;
  /// This model's rank of a tensor/expert-parallel group (its weights hold the rank's slices);
  /// null = the whole model on one rank.
  std::shared_ptr<RankShard const> shard_;
  /// held_part(), and the parts it holds (rank_parts of that rank; every part read alone from the checkpoint).
  std::shared_ptr<RankShard const> part_;
  RankParts held_parts_;
  friend struct RankAccess;
};

}  // namespace tessera::model::dsv41

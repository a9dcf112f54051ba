// SPDX-License-Identifier: Apache-2.0
/// Internals of the DeepSeek-V4.1 GPU model (gpu_model.hpp): the backend's memory (device memory and a
/// stream for kCuda; host memory for kCpu, where the same composition runs on the CPU op backends so CI can
/// check it against the CPU model), the memory pool, the weights, the per-sequence state, and the glue
/// kernels (kernels/dsv41/model_kernels.cu, with host twins in gpu_mem.cpp). Plain C++ (no CUDA headers).
///
/// Memory: every device buffer (weights excepted) is a block of a DevicePool, which keeps freed blocks in
/// power-of-two size classes (≥ 4 KiB) and hands them out again, so per-step scratch and the growth of
/// sequence state cost no cudaMalloc in steady state, and freeing a sequence returns its blocks to the pool.
///
/// Per-sequence state of layer ℓ (rows of hd fp32 unless said otherwise; positions are implicit because
/// every buffer holds the tail of the sequence):
///   window   ring of W−1+max_rollback rows: FP8-fake-quantised post-RoPE K=V of positions
///            [len−n_window, len), position p in row p mod (W−1+max_rollback)
///   raw kv/gate ring of max_rollback+r rows (ratio r > 1 KV sources): the fp32 compressor projections of
///            positions [len−n_raw, len), position p in row p mod (max_rollback+r); the partial group is
///            positions [r·entries, len)
///   ckv      [capacity, hd]          compressed KV entries 0..entries−1 (post-RoPE, FP4)
///   index_k  [capacity, di]          index keys of the same groups (index sources)
/// Capacities of ckv / index_k double when full (a copy into a bigger block). The rings are written only
/// when a forward commits (its new rows overwrite the oldest positions), so a failed forward leaves them
/// as they were; truncate only lowers n_window / n_raw.
#pragma once

#include <cstdint>
#include <span>
#include <limits>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/context.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/status.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ops/exl3.hpp"

namespace tessera::model::dsv41::gpu {

class HostStage;

/// Memory of the model's backend. kCuda: cudaMalloc'd memory, copies ordered on `stream`; kCpu: host
/// memory, copies immediate.
struct Mem {
  enum class Copy : uint8_t { kHostToDev, kDevToHost, kDevToDev };
  Backend backend = Backend::kCuda;
  CUstream_st* stream = nullptr;
  /// Set while `stream` records a CUDA graph (GraphCapture): a recorded copy reads its source when the graph
  /// runs, so host-to-device copies take their bytes from here (stable until the pass has synchronised).
  HostStage* stage = nullptr;
  Device tag() const { return backend == Backend::kCuda ? Device::kCuda : Device::kCpu; }
  Result<void*> alloc(size_t bytes) const;
  void free(void* p) const;
  Status copy(void* dst, void const* src, size_t bytes, Copy kind) const;
  Status sync() const;
  /// kCuda: creates the stream and describes the current device; kCpu: nothing.
  Status open(DeviceInfo* info);
  /// Synchronises and destroys the stream (kCuda).
  void close();
};

/// Pinned host bytes for the host-to-device copies a CUDA graph records (Mem::stage): chunks of at least 1 MiB,
/// bump-allocated, kept across passes (reset() once the pass's graphs have run), so a steady state allocates none.
class HostStage {
 public:
  HostStage() = default;
  HostStage(HostStage const&) = delete;
  HostStage& operator=(HostStage const&) = delete;
  ~HostStage();
  /// A stable copy of `bytes` bytes at `src` (16-byte aligned).
  Result<void const*> put(void const* src, size_t bytes);
  void reset();
  size_t capacity() const;

 private:
  struct Chunk {
    unsigned char* p;
    size_t cap, used;
  };
  std::vector<Chunk> chunks_;
  size_t cur_ = 0;
};

/// The forward's CUDA-graph mode (ModelOptions::cuda_graphs): each segment of a pass (a layer; the head) is
/// recorded from `stream` (relaxed stream capture: the host work between launches runs as in eager mode, and
/// recording executes nothing), then launched through an executable graph. Each segment index keeps up to
/// kShapesPerSegment executables keyed by the recording's shape (its nodes' kinds and kernels, in order): a recording
/// whose shape is cached updates that executable in place (cudaGraphExecUpdate: new kernel parameters and grids, copy
/// addresses and sizes), and only a new shape is instantiated, so a decode whose layers alternate between a few
/// shapes (a compressor group completing every `ratio` tokens) replays the same executables. The launched work is the eager stream's, in its order: the same
/// kernels with the same parameters, hence the same bits.
class GraphCapture {
 public:
  struct Counts {
    int64_t launches = 0, updates = 0, instantiations = 0;
  };
  static constexpr size_t kShapesPerSegment = 4;
  GraphCapture() = default;
  GraphCapture(GraphCapture const&) = delete;
  GraphCapture& operator=(GraphCapture const&) = delete;
  ~GraphCapture();
  /// Starts recording `mem.stream` and points mem.stage at the host stage.
  Status begin(Mem& mem);
  /// Ends the recording and launches it as segment `segment`'s executable graph.
  Status end_and_launch(Mem& mem, size_t segment);
  /// Ends an open recording and drops it (a failed pass); nothing of it ran.
  void abort(Mem& mem);
  bool recording() const { return recording_; }
  /// Releases the staged host bytes; call after the pass's graphs have completed (a synchronisation).
  void release_stage() { stage_.reset(); }
  Counts const& counts() const { return counts_; }

 private:
  struct Exec {
    uint64_t shape = 0;
    void* exec = nullptr;  // cudaGraphExec_t
    uint64_t last_use = 0;
  };
  std::vector<std::vector<Exec>> exec_;  // per segment, at most kShapesPerSegment
  uint64_t clock_ = 0;
  HostStage stage_;
  Counts counts_;
  bool recording_ = false;
};

/// A caching pool of blocks of the backend's memory in power-of-two size classes. Thread-safe (a state may
/// be released on another thread than the one running forwards).
class DevicePool {
 public:
  explicit DevicePool(Mem mem) : mem_(mem) {}
  DevicePool(DevicePool const&) = delete;
  DevicePool& operator=(DevicePool const&) = delete;
  ~DevicePool();
  /// A block of at least `bytes` (its class size in *capacity).
  Result<void*> get(size_t bytes, size_t* capacity);
  void put(void* p, size_t capacity);
  size_t bytes_held() const { return held_; }

 private:
  Mem mem_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  std::vector<void*> all_;
  size_t held_ = 0;
};

/// A pool block owned by value (moves, frees to its pool).
class DevBlock {
 public:
  DevBlock() = default;
  DevBlock(DevBlock&& o) noexcept { *this = std::move(o); }
  DevBlock& operator=(DevBlock&& o) noexcept;
  DevBlock(DevBlock const&) = delete;
  DevBlock& operator=(DevBlock const&) = delete;
  ~DevBlock() { reset(); }
  static Result<DevBlock> make(DevicePool& pool, size_t bytes);
  void reset();
  void* get() const { return p_; }
  template <class T> T* as() const { return static_cast<T*>(p_); }
  size_t capacity() const { return cap_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  DevicePool* pool_ = nullptr;
  void* p_ = nullptr;
  size_t cap_ = 0;
};

/// A weight on the device: fp32, bf16 (values already bf16 in a bf16 model, so exact), or block-scaled as
/// stored (ops::is_block_scaled, bf16 numerics only): codes at p in ops::LinearDesc's layout for the dtype
/// (kF8E4m3 [rows, cols] bytes, kF4E2m1x2 [rows, cols/2]) and ue8m0 scales at scale, rows of scale_stride
/// bytes (kF8E4m3: ⌈rows/32⌉ rows of 32×32 blocks; kF4E2m1x2: rows rows of 32 columns). rows / cols are the
/// logical [out, in] either way.
struct DevTensor {
  void* p = nullptr;
  int64_t rows = 0, cols = 0;   // 2-D [out, in] (1-D: rows = numel, cols = 1)
  DType dtype = DType::kF32;
  void* scale = nullptr;        // block-scaled only
  int64_t scale_stride = 0;     // bytes per scale row (⌈cols/32⌉)
  // EXL3 (dtype kI16; rows = n outputs, cols = k inputs): p = the trellis of each of exl3_groups output slices in
  // turn, slice g = [k/16, n/(16·G), 8·k2] int16 (its tile columns, spec/exl3.md §1.4); suh fp16 [k] (shared),
  // svh fp16 [n] (slice g at g·n/G). exl3.n is the slice's width. A rank's output part (slice_exl3, one slice): the
  // trellis and svh of the 128-column blocks covering it, exl3.n of them computed, of which outputs
  // [exl3_kept_begin, exl3_kept_begin + rows) are the linear's (rows < exl3.n when the part cuts a block); its
  // products sum in the whole group's chunk order (exl3_chunk_n = the group's n, ops::Exl3GemmDesc::chunk_n).
  void* suh = nullptr;
  void* svh = nullptr;
  ops::Exl3LayerDesc exl3{};
  int64_t exl3_groups = 1;
  int64_t exl3_kept_begin = 0;
  int64_t exl3_chunk_n = 0;
  bool is_exl3() const { return dtype == DType::kI16; }
  /// Int16 words of one slice's trellis.
  int64_t exl3_slice_words() const { return exl3.k / 16 * (exl3.n / 16) * 8 * exl3.k2; }
  float const* f32() const { return static_cast<float const*>(p); }
  Bf16 const* bf16() const { return static_cast<Bf16 const*>(p); }
  uint8_t const* codes() const { return static_cast<uint8_t const*>(p); }
  uint8_t const* scales() const { return static_cast<uint8_t const*>(scale); }
  /// Bytes per row of codes.
  int64_t code_stride() const { return dtype == DType::kF4E2m1x2 ? cols / 2 : cols; }
};

struct GpuExperts {
  std::vector<DevTensor> w1, w3, w2;
  void* ptrs = nullptr;          // device [3, E] pointer table (w1 | w3 | w2): weights, or codes when block-scaled
  void* scale_ptrs = nullptr;    // device [3, E] table of the routed experts' scales (block-scaled only)
  DType routed_scaled = DType::kF32;  // kF8E4m3 / kF4E2m1x2: the routed experts are stored block-scaled
  DevTensor s1, s3, s2;          // shared expert
  DType shared_scaled = DType::kF32;  // kF8E4m3 / kF4E2m1x2: the shared expert is held block-scaled (s1/s3/s2)
  // EXL3 routed experts (w1/w3/w2 EXL3 DevTensors, one layer shape per projection): device [3][3][E] pointers,
  // projection j (w1 | w3 | w2) × (trellis | suh | svh) × expert; the shared expert is EXL3 as well.
  void* exl3_ptrs = nullptr;
  bool routed_exl3 = false;
};

struct GpuLayerWeights {
  DevTensor hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  DevTensor attn_norm, ffn_norm, q_norm, kv_norm, attn_sink, c_norm, i_k_norm;
  DevTensor wq_a, wq_b, wkv, wo_a, wo_b, c_wkv, c_wgate, i_wq_b, i_weights_proj, i_wk;
  DevTensor gate, gate_bias;
  GpuExperts moe;
  DevTensor e_table, e_wkv, e_qk;
};

struct GpuWeights {
  DevTensor embed, norm, lm_head;
  std::vector<GpuLayerWeights> layers;
  DevTensor main_inv_freq, compress_inv_freq;
  std::vector<void*> allocations;  // Mem::alloc'd, freed by the model
  size_t bytes = 0;                // of the allocations
};

/// Quantisers of the stored compressed KV (spec §2.5.3, Appendix B.2) and index keys (§2.5.4, B.3).
inline constexpr ops::QatKind kCkvQat = ops::QatKind::kFp4Block16E4m3;
inline constexpr ops::QatKind kIndexKeyQat = ops::QatKind::kFp4Block32Ue8m0;

/// Bytes of one stored compressed-KV entry (width hd) or index key (width di): the quantiser's packed row
/// (ops::qat_packed_row_bytes: 288 B at hd 512, 68 B at di 128), or fp32 values for a width the quantiser
/// leaves unchanged (not a multiple of its block).
inline int64_t ckv_entry_bytes(int64_t hd) {
  int64_t const b = ops::qat_packed_row_bytes(kCkvQat, hd);
  return b ? b : hd * 4;
}
inline int64_t index_key_bytes(int64_t di) {
  int64_t const b = ops::qat_packed_row_bytes(kIndexKeyQat, di);
  return b ? b : di * 4;
}

/// One growing row family of a sequence's state (compressed-KV entries or index keys) in fixed pages of
/// rows_per_page rows of row_bytes, taken from the model's DevicePool, with a table of the page addresses
/// in the backend's memory for the kernels: row e lives at table[e / rows_per_page] + (e % rows_per_page) ·
/// row_bytes. A sequence of n rows holds ⌈n / rows_per_page⌉ pages, so its memory stays within one page of
/// n · row_bytes at any length, and growing never copies old rows.
class PagedRows {
 public:
  /// Sets the layout (before the first reserve; rows_per_page = ⌊page_bytes / row_bytes⌋ ≥ 1).
  void configure(int64_t row_bytes, int64_t page_bytes);
  /// Rows of row_bytes in a page of page_bytes (≥ 1), and the bytes of the pages that hold `rows` rows.
  static int64_t rows_per_page_for(int64_t row_bytes, int64_t page_bytes) {
    return page_bytes / row_bytes > 1 ? page_bytes / row_bytes : 1;
  }
  static int64_t page_bytes_for(int64_t rows, int64_t row_bytes, int64_t page_bytes) {
    int64_t const per = rows_per_page_for(row_bytes, page_bytes);
    return (rows + per - 1) / per * per * row_bytes;
  }
  bool configured() const { return row_bytes_ > 0; }
  /// Pages for rows [0, rows).
  Status reserve(DevicePool& pool, Mem const& mem, int64_t rows);
  /// Rows [row0, row0 + n) ← n contiguous rows at src (backend memory); the rows must be reserved.
  Status write(Mem const& mem, int64_t row0, int64_t n, void const* src) const;
  /// dst ← rows [0, n) contiguously (backend memory).
  Status read(Mem const& mem, int64_t n, void* dst) const;
  /// Returns the pages wholly beyond the first `rows` rows to the pool.
  void shrink(int64_t rows);
  /// A copy of the first `rows` rows of `o` (same layout) in pages of `pool`.
  Status assign(DevicePool& pool, Mem const& mem, PagedRows const& o, int64_t rows);
  uint8_t const* const* table() const { return table_.as<uint8_t const* const>(); }
  /// The host mirror of table(): the page addresses in order.
  std::span<uint8_t const* const> host_table() const { return addresses_; }
  int64_t row_bytes() const { return row_bytes_; }
  int64_t rows_per_page() const { return per_page_; }
  int64_t pages() const { return static_cast<int64_t>(pages_.size()); }
  /// Bytes held: the pages and the table.
  size_t bytes() const;

 private:
  int64_t row_bytes_ = 0, per_page_ = 0, page_bytes_ = 0;
  std::vector<DevBlock> pages_;
  std::vector<uint8_t const*> addresses_;  // host mirror of the table
  DevBlock table_;
};

struct GpuLayerState {
  DevBlock window;                 // [W−1+max_rollback, hd] fp32
  int64_t n_window = 0;
  DevBlock raw_kv, raw_gate;       // [max_rollback + r, hd] fp32
  int64_t n_raw = 0;
  PagedRows ckv, index_k;          // rows of ckv_entry_bytes(hd), index_key_bytes(di)
  int64_t entries = 0;
};

/// The CSR key lists of one attention call (kernels/dsv41/model_kernels.cu).
struct KeyListParams {
  int64_t rows = 0;        // S query rows at positions pos0 + r
  int64_t pos0 = 0;
  int64_t n_old = 0;       // old window rows, positions wpos0 + i
  int64_t wpos0 = 0;
  int64_t window = 0;      // W
  int32_t const* selected = nullptr;  // [S, top_k] entry ids (−1 padded), or null
  int64_t top_k = 0;
  int64_t entries = 0;     // T compressed entries (ids ≥ T are dropped)
  // Compact pool (non-null): the compressed part of the pool holds each row's selections, not all T entries:
  // row r's k-th listed selection (ascending entry id) is pool row n_old + rows + r·top_k + k, and
  // gather[r·top_k + k] = its entry id (−1 for the unused slots k ≥ the row's count). Else entry e is pool
  // row n_old + rows + e.
  int32_t* gather = nullptr;   // [S, top_k] out
  int64_t* offsets = nullptr;  // [S + 1] out
  int64_t* counts = nullptr;   // [S] scratch (CUDA: each row's list length before the scan)
  int32_t* key_ids = nullptr;  // [≤ S·(W + top_k)] out
  // bf16 only (else null): each listed key's column in the golden engine's logit row and each row's sink column
  // (key_column / sink_column; the CPU model's layout in attention_block.cpp).
  int32_t* key_cols = nullptr;   // [like key_ids] out
  int32_t* sink_cols = nullptr;  // [S] out
  int64_t src_ratio = 0;         // ratio of the compressed entries' source layer (0: none)
  // Several sequences' lists in one attention call: this sequence's pool starts at row id_base of the pass-wide
  // pool (every listed id is id_base + its pool row above; key_column / sink_column see the ids before it), its
  // lists at slot slot_base of the pass-wide key_ids / key_cols (key_ids and key_cols point there), and
  // row_begin / row_end (optional, [rows] out) receive slot_base + offsets[r], slot_base + offsets[r + 1].
  int64_t id_base = 0;
  int64_t slot_base = 0;
  int64_t* row_begin = nullptr;
  int64_t* row_end = nullptr;
  // build_key_lists_batched: row r's list (and its key_cols) at slots r·row_cap .. of key_ids (no scan; the lists
  // have gaps), row_begin[r] = slot_base + r·row_cap and row_end[r] = row_begin[r] + its length (both required);
  // offsets and counts are not used. row_cap ≥ window + top_k (a row lists at most W window keys and top_k
  // selections).
  int64_t row_cap = 0;
  // build_key_lists_batched (null: none): the unpack list of this sequence's compressed pool part, for one
  // QatUnpack of every sequence's parts (row ids into a table of several sequences' pages, out_rows into the
  // pass-wide pool). Compact pools: u = r·top_k + k for every slot, unpack_src[u] = unpack_base + gather[u]
  // (−1 for an unused slot), unpack_dst[u] = id_base + n_old + rows + u; else u = e < entries,
  // unpack_src[u] = unpack_base + e, unpack_dst[u] = id_base + n_old + rows + e (written by row 0's block).
  int32_t* unpack_src = nullptr;
  int32_t* unpack_dst = nullptr;
  int64_t unpack_base = 0;  // the sequence's first stored entry in the shared page table (page index · rows per page)
};

/// Sequences per build_key_lists_batched launch: their KeyListParams travel by value in the kernel's parameters
/// (16 × 176 B, under the 4 KiB limit).
inline constexpr int kKeyListBatch = 16;

/// The routing of one MoE call grouped for Exl3GroupedGemm and moe_combine (moe_group). Slot s = r·K + i holds
/// token r's i-th routed expert ids[s] with weight weights[s]; a slot is kept when 0 ≤ ids[s] < E (−1: pruned),
/// else skipped. Of the S = N·K slots A are kept; A = offsets[E] lives in the backend's memory only, so every
/// array is sized by the capacity S and rows [A, S) are padding.
///   offsets[e]           kept slots of experts < e (offsets[0] = 0, offsets[E] = A)
///   slot_assignment[s]   a = offsets[e] + #{kept slots s' < s with ids[s'] = e} for a kept slot of expert e (rows
///                        ascending within an expert, slot order within a row), −1 for a skipped slot
///   token_idx[a]         the token r of assignment a; route_weight[a] its weight; padding: 0 and +0
///   identity[a]          a, for every a < S (the down projection's token_idx)
///   combine_offsets[r]   kept slots of tokens < r ([N + 1], combine_offsets[N] = A)
///   combine_list[j]      token r's assignments at j ∈ [combine_offsets[r], combine_offsets[r+1]) in ascending
///                        (expert id, a) order (MoeExperts' combine order); padding: 0
/// A pure function of ids and weights: the CUDA kernel and the host twin write the same arrays bit for bit.
struct MoeGroupParams {
  int32_t const* ids = nullptr;        // [N, K]
  float const* weights = nullptr;      // [N, K]
  int64_t tokens = 0, top_k = 0, experts = 0;  // N, K, E
  int32_t* offsets = nullptr;          // [E + 1] out
  int32_t* slot_assignment = nullptr;  // [S] out
  int32_t* token_idx = nullptr;        // [S] out
  float* route_weight = nullptr;       // [S] out
  int32_t* identity = nullptr;         // [S] out
  int64_t* combine_offsets = nullptr;  // [N + 1] out
  int32_t* combine_list = nullptr;     // [S] out
};

/// Experts moe_group supports: the CUDA kernel keeps per-warp counts of every expert in shared memory.
inline constexpr int64_t kMoeGroupMaxExperts = 512;

/// moe_group's limits, shared by both twins: 1 ≤ E ≤ kMoeGroupMaxExperts, K ≥ 1, N ≥ 0, N·K < 2^31 (int32
/// assignment ids); the arrays of S entries may be null when N = 0.
inline Status check_moe_group(MoeGroupParams const& p) {
  if (p.experts < 1 || p.experts > kMoeGroupMaxExperts)
    return invalid_argument("moe_group: " + std::to_string(p.experts) + " experts, supported 1.." +
                            std::to_string(kMoeGroupMaxExperts));
  if (p.top_k < 1 || p.tokens < 0) return invalid_argument("moe_group: top_k must be ≥ 1 and tokens ≥ 0");
  if (p.tokens > std::numeric_limits<int32_t>::max() / p.top_k)
    return invalid_argument("moe_group: tokens · top_k must be below 2^31");
  if (!p.offsets || !p.combine_offsets) return invalid_argument("moe_group: offsets and combine_offsets are required");
  if (p.tokens > 0 && (!p.ids || !p.weights || !p.slot_assignment || !p.token_idx || !p.route_weight || !p.identity ||
                       !p.combine_list))
    return invalid_argument("moe_group: every array is required");
  return {};
}

/// Rows per block of the EXL3 path of a pass (gpu_exl3.cpp): Forward::lin_exl3 runs its rows and Forward::moe_exl3 its
/// tokens in blocks of at most get() (exl3_pairs: get()·top_k pairs, the slots of one moe_exl3 block), so their
/// scratch and the EXL3 ops' workspaces scale with the block, not with the pass. Every product on the path is
/// row-invariant, so any block size gives the same bits.
struct Exl3RowBlock {
  static constexpr int64_t kDefault = 8192;
  static int64_t get();
  /// Test hook (verify/gpu_model): blocks of max(rows, 1) rows from now on, process-wide; kDefault restores.
  static void set_for_test(int64_t rows);
};

/// Test hook (verify/gpu_model): a pass throws right after layer `layer`'s attention — inside that layer's graph
/// segment while it is being recorded in CUDA-graph mode, with the layer's window rows and compressed entries
/// written — so a test can check that a failure inside a recording rolls every state back like an eager one.
/// −1 (the default): never. Process-wide.
struct FaultHook {
  static int64_t layer();
  static void set_for_test(int64_t layer);
};

/// One row of copy_rows: `cols` floats from src to dst (rows of distinct dst do not overlap any src).
struct RowCopy {
  float const* src = nullptr;
  float* dst = nullptr;
};

/// One sequence's window rows for the attention key pool: pool rows [0, n_old) are the ring rows of positions
/// p0 … p0 + n_old − 1 (ring row = position mod cap), rows [n_old, n_old + chunk_rows) the chunk's rows, `cols`
/// floats each, written contiguously from dst.
struct WindowGather {
  float const* ring = nullptr;
  int64_t cap = 0, p0 = 0, n_old = 0;
  float const* chunk = nullptr;
  int64_t chunk_rows = 0;
  float* dst = nullptr;
};
/// Sequences per window_gather launch (their WindowGather by value in the kernel's parameters).
inline constexpr int kWindowGatherBatch = 32;

// CUDA launches (kernels/dsv41/model_kernels.cu, CUDA builds only).
Status launch_embed_streams(CUstream_st* stream, float const* emb, int32_t const* tokens, int64_t rows, int64_t n,
                            int64_t D, float* X, float* pre);
Status launch_scale_inplace(CUstream_st* stream, float* x, int64_t count, float s);
Status launch_build_key_lists(CUstream_st* stream, KeyListParams const& p);
/// 1 ≤ n ≤ kKeyListBatch sequences' lists (row_cap layout), one block per row of all of them.
Status launch_build_key_lists_batched(CUstream_st* stream, KeyListParams const* seqs, int n);
Status launch_copy_rows(CUstream_st* stream, RowCopy const* table, int64_t count, int64_t cols);
/// 1 ≤ n ≤ kWindowGatherBatch sequences' window rows, one block per pool row of all of them.
Status launch_window_gather(CUstream_st* stream, WindowGather const* seqs, int n, int64_t cols);

// EXL3 glue (kernels/dsv41/exl3_glue.cu; host twins in gpu_exl3.cpp).
Status launch_to_f16(CUstream_st* stream, float const* x, int64_t stride, int64_t rows, int64_t cols, uint16_t* out);
Status launch_store_md(CUstream_st* stream, float const* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst,
                       int64_t stride, bool bf16);
Status launch_exl3_moe_act(CUstream_st* stream, float const* g, float const* u, float const* w, int64_t rows,
                           int32_t const* row_count, int64_t inter, float limit, bool bf16, uint16_t* out);
Status launch_moe_act(CUstream_st* stream, float const* g, float const* u, int64_t rows, int64_t inter, float limit,
                      bool bf16, float* out);
Status launch_moe_combine(CUstream_st* stream, float const* y, int64_t const* off, int32_t const* list,
                          float const* ysh, int64_t tokens, int64_t D, bool bf16, float* out);
Status launch_moe_group(CUstream_st* stream, MoeGroupParams const& p);

/// out[r, c] = →fp16(x[r·stride + c]) as fp16 bits (RNE).
Status to_f16(Mem const& m, float const* x, int64_t stride, int64_t rows, int64_t cols, uint16_t* out);
/// dst[r·stride + c] = →md(src[r·src_stride + c]) for c < cols.
Status store_md(Mem const& m, float const* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst, int64_t stride,
                bool bf16);
/// The EXL3 MoE activation: act[a, i] = →fp16(→md(w[a]·(silu(min(g, L))·clamp(u, ±L)))) with g, u = →md(G, U [a, i])
/// (w null: unweighted, the shared expert; L ≤ 0: no clamp). Rows a < min(rows, *row_count) only (row_count in the
/// backend's memory, e.g. MoeGroupParams::offsets + E; null: every row); the other rows of out are left as they were.
Status exl3_moe_act(Mem const& m, float const* g, float const* u, float const* w, int64_t rows, int32_t const* row_count,
                    int64_t inter, float limit, bool bf16, uint16_t* out);
/// The unweighted expert activation in fp32 (a rank's slice of the shared expert, gpu_sharded.cpp):
/// out[a, i] = →md(silu(min(g, L))·clamp(u, ±L)) with g, u = →md(G, U [a, i]) (L ≤ 0: no clamp), as
/// ref::moe_expert_row_accumulate's activation of the shared expert.
Status moe_act(Mem const& m, float const* g, float const* u, int64_t rows, int64_t inter, float limit, bool bf16,
               float* out);
/// out[t, :] = →md(Σ_{j in [off[t], off[t+1])} →md(y[list[j], :]) + →md(ysh[t, :])) summed from +0 in this order
/// (ysh null: no shared term).
Status moe_combine(Mem const& m, float const* y, int64_t const* off, int32_t const* list, float const* ysh,
                   int64_t tokens, int64_t D, bool bf16, float* out);
/// The routing grouped by expert and the per-token combine lists (MoeGroupParams), on the backend's stream: no
/// host round trip. Beyond check_moe_group's limits: invalid_argument.
Status moe_group(Mem const& m, MoeGroupParams const& p);

// On the model's backend: the CUDA launch, or its host twin (gpu_mem.cpp) with the same arithmetic.
Status embed_streams(Mem const& m, float const* emb, int32_t const* tokens, int64_t rows, int64_t n, int64_t D, float* X,
                     float* pre);
Status scale_inplace(Mem const& m, float* x, int64_t count, float s);
Status build_key_lists(Mem const& m, KeyListParams const& p);
/// Several sequences' key lists (KeyListParams::row_cap layout: the same list per row as build_key_lists, at a
/// fixed slot per row) in ⌈n / kKeyListBatch⌉ launches instead of 3–4 per sequence.
Status build_key_lists_batched(Mem const& m, std::span<KeyListParams const> seqs);
/// Row copies described by `table` ([count] RowCopy in the backend's memory) in one launch.
Status copy_rows(Mem const& m, RowCopy const* table, int64_t count, int64_t cols);
/// Every sequence's window rows of a pass (WindowGather) in ⌈n / kWindowGatherBatch⌉ launches instead of up to
/// three copies per sequence.
Status window_gather(Mem const& m, std::span<WindowGather const> seqs, int64_t cols);

/// Row r's first visible old-window row i0 and first visible chunk row j0 (shared by both twins).
TESSERA_HOST_DEVICE inline void key_list_ranges(KeyListParams const& p, int64_t r, int64_t& i0, int64_t& j0) {
  int64_t const pos = p.pos0 + r;
  i0 = pos - p.window + 1 - p.wpos0;  // old window row i visible ⇔ wpos0 + i > pos − W
  if (i0 < 0) i0 = 0;
  if (i0 > p.n_old) i0 = p.n_old;
  j0 = r - p.window + 1;              // chunk row j visible ⇔ j ≤ r and pos0 + j > pos − W
  if (j0 < 0) j0 = 0;
}

/// The logit-row column of pool key `id` listed for row r: a window key at its position, compressed entry e at
/// p + 1 + e (p the row's position); the row's sink at p + 1 + ⌊(p + 1)/src_ratio⌋ (the CPU model's layout).
TESSERA_HOST_DEVICE inline int32_t key_column(KeyListParams const& p, int64_t r, int64_t id) {
  int64_t const pos = p.pos0 + r;
  if (id < p.n_old) return static_cast<int32_t>(p.wpos0 + id);
  if (id < p.n_old + p.rows) return static_cast<int32_t>(p.pos0 + (id - p.n_old));
  int64_t const slot = id - p.n_old - p.rows;
  return static_cast<int32_t>(pos + 1 + (p.gather ? p.gather[slot] : slot));
}
TESSERA_HOST_DEVICE inline int32_t sink_column(KeyListParams const& p, int64_t r) {
  int64_t const pos = p.pos0 + r;
  return static_cast<int32_t>(pos + 1 + (p.src_ratio > 0 ? (pos + 1) / p.src_ratio : 0));
}

}  // namespace tessera::model::dsv41::gpu

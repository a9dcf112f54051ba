// SPDX-License-Identifier: Apache-2.0
/// The GPU model's batched forward, shared by gpu_forward.cpp (the pass: uploads, the trunk, the LM head,
/// flags, commit / rollback) and gpu_attention.cpp (the attention sub-block).
///
/// A pass runs the steps of a batch as one forward over the layers. Their rows are concatenated in batch
/// order (sequence i owns rows [row0_i, row0_i + S_i)); every row-wise op (embedding, Engram, mHC, norms,
/// linears, RoPE with the per-row position vector, the quantisers, router, experts, LM head) runs once over
/// all rows; what reads or writes a sequence's state runs over every sequence at once where the ops allow it (key
/// pool gathers and unpacks, key lists, attention core; the indexer in decode-sized passes) and per sequence on
/// row slices of the batched buffers otherwise (compressor pooling, the indexer of longer chunks, the state
/// appends). Every op is row-invariant (fixed reduction order per row whatever the row count or launch shape), so
/// each row's values equal those of the sequence run alone.
///
/// Failure atomicity: the window and raw rings are written only at the commit, after every fallible step;
/// the compressed-KV / index-key appends land beyond the state's entry count, which a failure restores;
/// the Engram history is cut back to its old length. So a pass that fails before its commit (one launch
/// after the pass's synchronisation, then host bookkeeping that cannot fail) leaves every state exactly as
/// it was.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "models/deepseek_v41/gpu_impl.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/qat.hpp"

namespace tessera::model::dsv41::fwd {

/// The memory tag of the views of the forward running on this thread (kCuda, or kCpu for the host
/// composition); set by the pass for its duration.
extern thread_local Device kDev;

using F2 = TensorView<float, 2>;
using CF2 = TensorView<float const, 2>;
using CF1 = TensorView<float const, 1>;
using gpu::DevTensor;
using Copy = gpu::Mem::Copy;

inline F2 dv2(float* p, int64_t r, int64_t c) { return F2(p, {r, c}, kDev); }
inline CF2 dcv2(float const* p, int64_t r, int64_t c) { return CF2(p, {r, c}, kDev); }
inline CF2 dcv2(DevTensor const& t) { return CF2(t.f32(), {t.rows, t.cols}, kDev); }
/// The codes and scales of a block-scaled DevTensor as views (ops::Linear's layouts).
inline ops::BlockScaledView scaled_view(DevTensor const& t) {
  int64_t const srows = t.dtype == DType::kF8E4m3 ? (t.rows + 31) / 32 : t.rows;
  return {TensorView<uint8_t const, 2>(t.codes(), {t.rows, t.code_stride()}, kDev),
          TensorView<uint8_t const, 2>(t.scales(), {srows, t.scale_stride}, kDev)};
}
inline CF1 dcv1(DevTensor const& t) { return CF1(t.f32(), {t.rows * t.cols}, kDev); }
inline CF1 dcv1(float const* p, int64_t n) { return CF1(p, {n}, kDev); }
inline TensorView<int64_t const, 1> dpos(int64_t const* p, int64_t n) {
  return TensorView<int64_t const, 1>(p, {n}, kDev);
}

/// Checks, then runs Family on ctx.backend.
template <template <Backend> class Family, class D, class A>
void run(ExecContext& ctx, D const& d, A const& a) {
  throw_if_error(ops::dispatch<Family>(ctx, d, a));
}

/// Device scratch from the pool. release(mark) returns the blocks taken since mark(); reuse by later work
/// is safe because every user of the pool enqueues on the model's stream (kCuda) or runs at once (kCpu).
struct Scratch {
  gpu::DevicePool& pool;
  std::vector<gpu::DevBlock> blocks;
  template <class T>
  T* get(int64_t n) {
    auto b = gpu::DevBlock::make(pool, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T));
    if (!b) throw Error(b.status());
    blocks.push_back(std::move(*b));
    return blocks.back().as<T>();
  }
  size_t mark() const { return blocks.size(); }
  void release(size_t m) {
    while (blocks.size() > m) blocks.pop_back();
  }
};

/// Makes `blk` hold at least `bytes`, keeping its first `used` bytes (doubling growth).
void ensure(gpu::DevicePool& pool, gpu::DevBlock& blk, size_t bytes, size_t used, gpu::Mem const& mem);

/// Where a flag record sits in one layer's order of the CPU model (model.cpp / attention_block.cpp): the
/// records of a state are applied sorted by (layer, stage), rows ascending, which is the order in which the
/// sequence run alone records them.
enum class Stage : uint8_t { kWindowKv, kIndexKey, kIndexQuery, kCandidate, kIndexer, kCompressedKv, kRouter };

/// A flag vector the device writes (cutoff ties or near-boundary rows), read back after the pass: row r
/// belongs to sequence seq[r] (−1: not recorded) at position positions[r].
struct FlagRec {
  bool tie = false;
  uint8_t site = 0;
  int32_t layer = 0;
  Stage stage = Stage::kWindowKv;
  std::vector<int32_t> seq;
  std::vector<int64_t> positions;
  size_t offset = 0;  // of the flags in the pass's flag arena
};

/// One step of the pass.
struct SeqRun {
  GpuDsv41State* st = nullptr;
  std::span<int32_t const> tokens;
  int64_t S = 0, row0 = 0, pos0 = 0;  // rows [row0, row0 + S) at positions [pos0, pos0 + S)
  int64_t logit_rows = 0;
  float* logits = nullptr;
  size_t history_before = 0;
  std::vector<int64_t> entries_before;  // per layer
  // model.cpp's Chunk bookkeeping of this sequence.
  bool has_topk = false;
  int32_t* sel = nullptr;  // [S, index_topk] selections of the latest indexer (a slice of Pass::sel)
  bool has_cand = false;
  uint8_t* cand = nullptr;  // [S, cand_T]
  int64_t cand_T = 0;
  // The index keys of layer keys_src unpacked to fp32 ([keys_T, di], pass memory): the Reindex layers that
  // follow a KV source score the same keys, unpacked once.
  float* keys = nullptr;
  int64_t keys_src = -1, keys_T = 0;
};

/// The compressor groups completing in this pass at one KV-source layer: sequence i's `groups[i]` latents
/// are rows [g0[i], g0[i] + groups[i]) of the concatenation; `pos` holds each group's first position.
struct LatRows {
  std::vector<int64_t> groups, g0;
  int64_t total = 0;
  std::vector<int32_t> seq;
  std::vector<int64_t> pos;
  int64_t const* d_pos = nullptr;
};

/// Rows one commit writes into a ring: sequence i's last min(S_i, cap) rows of `rows` (row r at
/// rows + r·cols) go to the positions they hold.
struct RingWrite {
  int64_t layer = 0;
  enum Kind : uint8_t { kWindow, kRawKv, kRawGate } kind = kWindow;
  float const* rows = nullptr;
};

struct Pass {
  int64_t rows = 0;
  DType md = DType::kF32;
  std::vector<SeqRun> seqs;
  std::vector<int32_t> row_seq;  // sequence of each row
  std::vector<int64_t> pos;      // position of each row
  int64_t const* d_pos = nullptr;
  int32_t const* d_tokens = nullptr;
  int64_t const* d_hash = nullptr;  // [L_e, rows, C] Engram hash ids
  std::vector<LatRows> lat;         // per layer (empty for non-KV-source layers)
  int64_t idx_src = -1, ckv_src = -1;
  int32_t* sel = nullptr;           // [rows, index_topk]
  // Batched indexer (decode-sized passes, Forward::index_batched): every sequence's index keys of layer keys_src
  // unpacked back to back (sequence i's keys_T[i] rows from row keys_first[i]), and the candidate mask of every
  // row [rows, cand_cols] (sequence i's SeqRun::has_cand / cand_T say where it applies; SeqRun::cand stays null).
  float* keys = nullptr;
  int64_t keys_src = -1;
  std::vector<int64_t> keys_T, keys_first;
  uint8_t* cand = nullptr;
  int64_t cand_cols = 0;
  std::vector<FlagRec> flags;
  uint8_t* flag_arena = nullptr;
  size_t flag_used = 0, flag_cap = 0;
  std::vector<RingWrite> ring_writes;
  /// Host sources of the tables the pass uploads (Forward::upload: page tables, the sharded steps' tables), kept
  /// until the pass ends.
  std::vector<std::vector<unsigned char>> uploads;
};

class Forward {
 public:
  Forward(GpuDsv41Model::Impl& m, Pass& b, Scratch& keep, Scratch& tmp)
      : m_(m), b_(b), keep_(keep), tmp_(tmp), ctx_(m.ctx), s_(m.mem) {}

  /// y[r, :] = →md(x[r, :]·W[w_row0 + o, :]ᵀ) for o < out (rows strided by x_stride / y_stride); with groups > 1
  /// the grouped form of ops::LinearDesc (group g: x columns g·in.., W rows w_row0 + g·out.., y columns g·out..).
  /// A block-scaled W (DevTensor) is read over all its columns from a w_row0 on a scale block (FP8: a multiple
  /// of 32, else kInvalidArgument); a grouped FP8 call needs out % 32 == 0 (ops::Linear's check).
  void lin(float const* x, int64_t x_stride, int64_t rows, DevTensor const& w, float* y, int64_t y_stride, DType md,
           int64_t w_row0 = 0, int64_t out = -1, int64_t in = -1, bool fma_chain = false, int64_t groups = 1);
  void lin(float const* x, int64_t rows, DevTensor const& w, float* y, DType md) { lin(x, w.cols, rows, w, y, w.rows, md); }
  /// lin(x, rows, w_i, y_i, md) for each (w_i, y_i) of one x [rows, in]: on CUDA one bf16 copy of x and one batched
  /// launch where ops::Linear<kCuda>::run_shared_x allows (no EXL3 weight), so the products' chains overlap.
  void lin_shared_x(float const* x, int64_t rows, std::initializer_list<std::pair<DevTensor const*, float*>> outs, DType md);
  /// ops::Linear's operands for lin (a non-EXL3 weight).
  std::pair<ops::LinearDesc, ops::LinearArgs> lin_operands(float const* x, int64_t x_stride, int64_t rows, DevTensor const& w,
                                                           float* y, int64_t y_stride, DType md, int64_t w_row0, int64_t out,
                                                           int64_t in, bool fma_chain, int64_t groups) const;
  /// An EXL3 weight (DevTensor::is_exl3; gpu_exl3.cpp): y[r, g·n..] = →md(Exl3Gemm_f32(→fp16(x[r, g·k..]))) through
  /// output slice g of `w`, for each of `groups` slices (the weight's own slicing); rows in blocks of
  /// gpu::Exl3RowBlock.
  void lin_exl3(float const* x, int64_t x_stride, int64_t rows, DevTensor const& w, float* y, int64_t y_stride, DType md,
                int64_t groups);
  /// The MoE block of layer l with EXL3 experts (routed and shared): x [N, D], routing rw / rid [N, top_k] → F [N, D],
  /// tokens in blocks of gpu::Exl3RowBlock.
  void moe_exl3(int64_t l, float const* xa, float const* rw, int32_t const* rid, int64_t N, float* F);
  /// The EXL3 routed experts of layer l held by this model (local ids 0 … E−1 in rid [N, K]; other ids skipped) on
  /// the fp16 rows x16 [N, D]: fills `gp` (gpu::moe_group; scratch of tmp_) and returns y [N·K, D] fp32, assignment
  /// a's row Exl3Gemm_f32(w2, act_a), act_a = →fp16(→md(w_a·silu(min(g, L))·clamp(u, ±L))), g / u = →md(Exl3Gemm_f32
  /// (w1 / w3, its token's x16 row)); rows a < gp.offsets[E] only. moe_combine with gp's lists sums them.
  float* exl3_routed(int64_t l, uint16_t const* x16, float const* rw, int32_t const* rid, int64_t N, int64_t K,
                     gpu::MoeGroupParams& gp);
  /// A rank's (token, slot) pairs of layer l on its EXL3 routed experts (shard_moe): rows xg [P, D], local expert ids
  /// pid [P] and weights pw [P] → out [P, D], pair j's row →md(y_j) with y_j the single-rank model's output of that
  /// slot (exl3_routed over the pairs as P tokens of top_k 1).
  void exl3_pairs(int64_t l, float const* xg, int32_t const* pid, float const* pw, int64_t P, float* out);
  void norm(float* x, int64_t rows, int64_t dim, DevTensor const& w);
  void rope(float* x, int64_t rows, int64_t heads, int64_t hd, int64_t const* pos, DevTensor const& table, bool inverse);
  /// Fake-quantises rows in place; with boundary_ulps > 0 records the rows near a rounding boundary
  /// (row r for sequence seq[r] at positions[r]); with `packed` also writes the packed rows
  /// ([rows, ops::qat_packed_row_bytes(kind, dim)]).
  void quant(float* x, int64_t rows, int64_t dim, ops::QatKind kind, QuantBoundary::Site site, Stage stage, int64_t l,
             std::vector<int32_t> seq, std::vector<int64_t> positions, uint8_t* packed = nullptr);
  /// Rows [0, src_rows) of a stored compressed-KV / index-key family as fp32 values: QatUnpack of the packed
  /// pages (gathered by row_ids when non-null), or a copy of fp32 rows (gpu::ckv_entry_bytes's fallback;
  /// row_ids must be null).
  void unpack_rows(gpu::PagedRows const& stored, int64_t src_rows, int64_t dim, ops::QatKind kind,
                   int32_t const* row_ids, int64_t rows, float* out);
  /// Appends n rows of row_bytes (contiguous, device) to a state's paged family at row0.
  void append_rows(GpuDsv41State& st, gpu::PagedRows& rows, int64_t row_bytes, int64_t row0, int64_t n, uint8_t const* src);
  /// A device flag vector of the rows of sequence i (cutoff ties), recorded for the pass.
  uint8_t* tie_flags(int64_t i, CutoffTie::Site site, Stage stage, int64_t l);
  /// Tie flags of every row of the pass.
  uint8_t* tie_flags_all(CutoffTie::Site site, Stage stage, int64_t l);
  /// Tie flags of every row, recorded for the rows whose seq[r] ≥ 0.
  uint8_t* tie_flags_rows(CutoffTie::Site site, Stage stage, int64_t l, std::vector<int32_t> seq);
  void copy(void* dst, void const* src, size_t bytes) { throw_if_error(s_.copy(dst, src, bytes, Copy::kDevToDev)); }

  /// The attention sub-block of layer l over every row of the pass (gpu_attention.cpp).
  void attention(int64_t l, float const* xa, float* out);

  // The sharded steps of a rank model (gpu_sharded.cpp; Impl::shard set), at the five places where a rank's
  // forward differs from the single-rank one. Each leaves every rank with the single-rank step's full-size
  // result. Collectives take buffers in the backend's memory; the model's stream is synchronised before each
  // (so the collective reads finished data) and a collective returns with its result in place (blocking), so
  // work enqueued afterwards sees it.
  /// Query heads this model computes: the rank's heads, or all of them.
  int64_t query_heads() const;
  /// Attention output of layer l from the rank's head outputs o [N, Hl·hd] (after the inverse RoPE): its wo_a
  /// groups, wo_b slice and the plan's combine → out [N, D].
  void shard_attention_out(int64_t l, float const* o, float* out);
  /// Engram rows [N, C·de] of Engram layer ei: the rank's hash columns (local ids at Pass::d_hash) gathered from
  /// its table rows, then all-gathered (a replicated Engram: every column here).
  void shard_engram_rows(int64_t ei, DevTensor const& table, float* rows);
  /// The MoE block of layer l (x [N, D], routing rw / rid [N, top_k]) → F [N, D]: the rank's routed experts on
  /// the (token, slot) pairs routed to them and its shared-expert rows, combined in the single-rank order.
  void shard_moe(int64_t l, float const* xa, float const* rw, int32_t const* rid, int64_t N, float* F);
  /// Logits [rows, V] from the rank's LM-head rows (x [rows, D]).
  void shard_head(float const* x, int64_t rows, float* logits);

 private:
  /// Blocks until every op enqueued on the model's stream has run (before a collective reads its input).
  void collective_ready();
  /// Each rank holds local [rows, widths[rank]]; out [rows, Σ widths] with rank r's columns at Σ_{q<r} widths[q]
  /// (all-gatherv into rank blocks, then row copies into place).
  void gather_cols(float const* local, int64_t rows, std::vector<int64_t> const& widths, float* out);
  /// A copy of `v` in the backend's memory (scratch of the layer), its host source kept for the pass.
  template <class T>
  T* upload(std::vector<T> const& v);

  uint8_t* flag_bytes(int64_t n);
  /// The compressor and indexer of layer l (ratio > 0): new latents, index keys, selections.
  void compress_and_index(int64_t l, float const* xa, float const* q_res);
  /// The indexer's scores, candidate blocks and top-k of every row of a decode-sized pass in one call each, over
  /// every sequence's keys T[i] (sequences without keys: rows with seq_of_row −1, nothing selected or recorded).
  void index_batched(int64_t l, std::vector<int64_t> const& T, float const* qi, float const* wts, float scale,
                     std::vector<int32_t> const& seq_of_row);

  GpuDsv41Model::Impl& m_;
  Pass& b_;
  Scratch& keep_;  // lives for the pass
  Scratch& tmp_;   // released per layer / per sequence
  ExecContext& ctx_;
  gpu::Mem const& s_;
};

template <class T>
T* Forward::upload(std::vector<T> const& v) {
  auto const* p = reinterpret_cast<unsigned char const*>(v.data());
  b_.uploads.emplace_back(p, p + v.size() * sizeof(T));
  T* d = tmp_.get<T>(static_cast<int64_t>(v.size()));
  throw_if_error(s_.copy(d, b_.uploads.back().data(), v.size() * sizeof(T), Copy::kHostToDev));
  return d;
}

}  // namespace tessera::model::dsv41::fwd

// SPDX-License-Identifier: Apache-2.0
/// The GPU model's forward over a pass of sequences (gpu_forward.hpp): model.cpp's forward_one step for
/// step, every tensor on the device, every op family run as Family<Backend::kCuda> with the same Desc, in
/// the same order, over the concatenated rows of all the pass's sequences (the attention sub-block is
/// gpu_attention.cpp). The host keeps only what the CPU model keeps as bookkeeping: positions, the Engram
/// look-back (hash ids are computed on the host), the cutoff-tie and quantiser-boundary flags (downloaded
/// once per pass), and the per-sequence counts. Uploads: one block per pass (positions, compressor group
/// positions, hash ids, tokens). The same code runs on the CPU op backends in host memory (Backend::kCpu,
/// the CI check of the composition). In CUDA-graph mode (gpu::GraphCapture) each layer and the head is recorded
/// from the stream as it is enqueued and launched as one graph segment: the host work and its order are the
/// eager pass's, the uploads inside a segment read a pinned stage that lives until the pass's synchronisation.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <string>

#include "models/deepseek_v41/gpu_forward.hpp"
#include "tessera/ops/engram.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/mhc.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/norm.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ops/rope.hpp"
#include "tessera/ref/engram_ref.hpp"

namespace tessera::model::dsv41 {

namespace gpu {
namespace {
std::atomic<int64_t> fault_layer{-1};
}  // namespace
int64_t FaultHook::layer() { return fault_layer.load(std::memory_order_relaxed); }
void FaultHook::set_for_test(int64_t layer) { fault_layer.store(layer, std::memory_order_relaxed); }
}  // namespace gpu

namespace fwd {

thread_local Device kDev = Device::kCuda;

void ensure(gpu::DevicePool& pool, gpu::DevBlock& blk, size_t bytes, size_t used, gpu::Mem const& mem) {
  if (blk && blk.capacity() >= bytes) return;
  auto nb = gpu::DevBlock::make(pool, std::max(bytes, blk.capacity() * 2));
  if (!nb) throw Error(nb.status());
  if (blk && used > 0) throw_if_error(mem.copy(nb->get(), blk.get(), used, Copy::kDevToDev));
  blk = std::move(*nb);
}

void Forward::lin(float const* x, int64_t x_stride, int64_t rows, DevTensor const& w, float* y, int64_t y_stride, DType md,
                  int64_t w_row0, int64_t out, int64_t in, bool fma_chain, int64_t groups) {
  if (out < 0) out = w.rows;
  if (in < 0) in = w.cols;
  if (w.is_exl3()) {  // read whole (every slice, all its columns): the EXL3 product of gpu_exl3.cpp
    if (w_row0 != 0 || in != w.cols || groups * out != w.rows)
      throw Error(invalid_argument("forward: an EXL3 weight is read whole"));
    lin_exl3(x, x_stride, rows, w, y, y_stride, md, groups);
    return;
  }
  auto const [d, a] = lin_operands(x, x_stride, rows, w, y, y_stride, md, w_row0, out, in, fma_chain, groups);
  run<ops::Linear>(ctx_, d, a);
}

void Forward::lin_shared_x(float const* x, int64_t rows, std::initializer_list<std::pair<DevTensor const*, float*>> outs,
                           DType md) {
#if TESSERA_WITH_CUDA
  if (kDev == Device::kCuda && std::none_of(outs.begin(), outs.end(), [](auto const& o) { return o.first->is_exl3(); })) {
    std::vector<ops::LinearDesc> d;
    std::vector<ops::LinearArgs> a;
    for (auto const& [w, y] : outs) {
      auto const [di, ai] = lin_operands(x, w->cols, rows, *w, y, w->rows, md, 0, w->rows, w->cols, false, 1);
      d.push_back(di);
      a.push_back(ai);
    }
    throw_if_error(ops::Linear<Backend::kCuda>::run_shared_x(d, a, ctx_));
    return;
  }
#endif
  for (auto const& [w, y] : outs) lin(x, rows, *w, y, md);
}

std::pair<ops::LinearDesc, ops::LinearArgs> Forward::lin_operands(float const* x, int64_t x_stride, int64_t rows,
                                                                  DevTensor const& w, float* y, int64_t y_stride, DType md,
                                                                  int64_t w_row0, int64_t out, int64_t in, bool fma_chain,
                                                                  int64_t groups) const {
  ops::LinearDesc d{rows, in, out, w.dtype, md, fma_chain, ops::LinearImpl::kAuto, groups};
  ops::LinearArgs a;
  a.x = CF2(x, {rows, groups * in}, {x_stride, 1}, kDev);
  if (ops::is_block_scaled(w.dtype)) {
    // Rows [w_row0, w_row0 + groups·out) of the codes; their scale rows start at w_row0 / 32 (FP8 32×32
    // blocks, so w_row0 must be a multiple of 32) or w_row0 (FP4, per row).
    bool const fp8 = w.dtype == DType::kF8E4m3;
    if (fp8 && w_row0 % 32 != 0)
      throw Error(invalid_argument("forward: an FP8 weight viewed from row " + std::to_string(w_row0) +
                                   ", not a multiple of its 32-row scale blocks"));
    if (in != w.cols) throw Error(invalid_argument("forward: a block-scaled weight is read over all its columns"));
    int64_t const wrows = groups * out, srow0 = fp8 ? w_row0 / 32 : w_row0;
    a.w_q = TensorView<uint8_t const, 2>(w.codes() + w_row0 * w.code_stride(), {wrows, w.code_stride()},
                                         {w.code_stride(), 1}, kDev);
    a.w_scale = TensorView<uint8_t const, 2>(w.scales() + srow0 * w.scale_stride, {fp8 ? (wrows + 31) / 32 : wrows,
                                             w.scale_stride}, {w.scale_stride, 1}, kDev);
  } else if (w.dtype == DType::kBf16) {
    a.w_bf16 = TensorView<Bf16 const, 2>(w.bf16() + w_row0 * in, {groups * out, in}, kDev);
  } else {
    a.w = CF2(w.f32() + w_row0 * in, {groups * out, in}, kDev);
  }
  a.y = F2(y, {rows, groups * out}, {y_stride, 1}, kDev);
  return {d, a};
}

void Forward::norm(float* x, int64_t rows, int64_t dim, DevTensor const& w) {
  run<ops::RmsNorm>(ctx_, ops::RmsNormDesc{rows, dim, m_.spec.rms_eps, true, b_.md},
                    ops::RmsNormArgs{dcv2(x, rows, dim), dcv1(w), dv2(x, rows, dim)});
}

void Forward::rope(float* x, int64_t rows, int64_t heads, int64_t hd, int64_t const* pos, DevTensor const& table,
                   bool inverse) {
  run<ops::Rope>(ctx_, ops::RopeDesc{rows, heads, hd, m_.spec.rope_dim, inverse, b_.md},
                 ops::RopeArgs{dv2(x, rows, heads * hd), dpos(pos, rows), dcv1(table)});
}

uint8_t* Forward::flag_bytes(int64_t n) {
  if (b_.flag_used + static_cast<size_t>(n) > b_.flag_cap) throw Error(Status(StatusCode::kInternal, "forward: flag arena overflow"));
  uint8_t* p = b_.flag_arena + b_.flag_used;
  b_.flag_used += static_cast<size_t>(n);
  return p;
}

void Forward::quant(float* x, int64_t rows, int64_t dim, ops::QatKind kind, QuantBoundary::Site site, Stage stage, int64_t l,
                    std::vector<int32_t> seq, std::vector<int64_t> positions, uint8_t* packed) {
  int const ulps = m_.opts.boundary_ulps;
  uint8_t* near = nullptr;
  if (ulps > 0) {
    near = flag_bytes(rows);
    b_.flags.push_back({false, static_cast<uint8_t>(site), static_cast<int32_t>(l), stage, std::move(seq),
                        std::move(positions), static_cast<size_t>(near - b_.flag_arena)});
  }
  int64_t const pb = packed ? ops::qat_packed_row_bytes(kind, dim) : 0;
  run<ops::FakeQuant>(ctx_, ops::FakeQuantDesc{rows, dim, kind, b_.md, ulps},
                      ops::FakeQuantArgs{dv2(x, rows, dim), TensorView<uint8_t, 1>(near, {near ? rows : 0}, kDev),
                                         TensorView<uint8_t, 2>(packed, {packed ? rows : 0, pb}, kDev)});
}

void Forward::unpack_rows(gpu::PagedRows const& stored, int64_t src_rows, int64_t dim, ops::QatKind kind,
                          int32_t const* row_ids, int64_t rows, float* out) {
  if (ops::qat_packed_row_bytes(kind, dim) == 0) {
    if (row_ids || rows != src_rows) throw Error(Status(StatusCode::kInternal, "forward: gathered unpack of fp32 rows"));
    throw_if_error(stored.read(s_, rows, out));
    return;
  }
  ops::QatUnpackArgs a;
  a.row_ids = TensorView<int32_t const, 1>(row_ids, {row_ids ? rows : 0}, kDev);
  a.out = dv2(out, rows, dim);
  a.pages = stored.table();
  a.rows_per_page = stored.rows_per_page();
  run<ops::QatUnpack>(ctx_, ops::QatUnpackDesc{rows, dim, src_rows, kind, b_.md}, a);
}

void Forward::append_rows(GpuDsv41State& st, gpu::PagedRows& rows, int64_t row_bytes, int64_t row0, int64_t n,
                          uint8_t const* src) {
  if (!rows.configured()) rows.configure(row_bytes, m_.opts.state_page_bytes);
  throw_if_error(rows.reserve(*st.pool_, s_, row0 + n));
  throw_if_error(rows.write(s_, row0, n, src));
}

uint8_t* Forward::tie_flags(int64_t i, CutoffTie::Site site, Stage stage, int64_t l) {
  SeqRun const& sq = b_.seqs[static_cast<size_t>(i)];
  uint8_t* f = flag_bytes(sq.S);
  b_.flags.push_back({true, static_cast<uint8_t>(site), static_cast<int32_t>(l), stage,
                      std::vector<int32_t>(static_cast<size_t>(sq.S), static_cast<int32_t>(i)),
                      std::vector<int64_t>(b_.pos.begin() + sq.row0, b_.pos.begin() + sq.row0 + sq.S),
                      static_cast<size_t>(f - b_.flag_arena)});
  return f;
}

uint8_t* Forward::tie_flags_all(CutoffTie::Site site, Stage stage, int64_t l) {
  return tie_flags_rows(site, stage, l, b_.row_seq);
}

uint8_t* Forward::tie_flags_rows(CutoffTie::Site site, Stage stage, int64_t l, std::vector<int32_t> seq) {
  uint8_t* f = flag_bytes(b_.rows);
  b_.flags.push_back({true, static_cast<uint8_t>(site), static_cast<int32_t>(l), stage, std::move(seq), b_.pos,
                      static_cast<size_t>(f - b_.flag_arena)});
  return f;
}

}  // namespace fwd

using namespace fwd;

std::vector<int64_t> GpuDsv41Model::Impl::hash_ids(GpuDsv41State const& st, std::span<int32_t const> tokens) const {
  int64_t S = static_cast<int64_t>(tokens.size()), Le = engram.layers, C = engram.columns(), N = engram.max_ngram;
  std::vector<int64_t> hist = st.history_;
  for (int32_t t : tokens) hist.push_back(engram.token_map[static_cast<size_t>(t)]);
  std::vector<int64_t> out(static_cast<size_t>(S * Le * C)), look(static_cast<size_t>(S * N));
  auto history = [&](int64_t p) { return hist[static_cast<size_t>(p)]; };
  for (int64_t r = 0; r < S; ++r) ref::engram_lookback(history, st.length_ + r, N, engram.pad_c, &look[r * N]);
  ExecContext cpu;
  std::vector<int64_t> ids(static_cast<size_t>(S * C));
  for (int64_t e = 0; e < Le; ++e) {
    throw_if_error(ops::engram_hash(
        cpu, {S, N, engram.heads},
        {TensorView<int64_t const, 2>(look.data(), {S, N}),
         TensorView<int64_t const, 1>(engram.multipliers.data() + e * N, {N}),
         TensorView<int64_t const, 1>(engram.primes.data() + e * C, {C}),
         TensorView<int64_t const, 1>(engram.offsets.data() + e * C, {C}), TensorView<int64_t, 2>(ids.data(), {S, C})}));
    for (int64_t r = 0; r < S; ++r)
      std::copy(ids.begin() + r * C, ids.begin() + (r + 1) * C, out.begin() + (r * Le + e) * C);
  }
  return out;
}

Status GpuDsv41Model::Impl::forward_one(GpuDsv41State& st, std::span<int32_t const> tokens, int64_t num_logit_rows,
                                        float* logits) {
  SequenceStep step{&st, tokens, num_logit_rows, logits};
  return forward_pass({&step, 1});
}

namespace {

/// One copy per run of consecutive pieces whose source and destination both continue where the last
/// piece ended (pieces: {dst, src, bytes}).
struct Piece {
  char* dst;
  char const* src;
  size_t bytes;
};
void copy_merged(gpu::Mem const& mem, std::vector<Piece> const& pieces, Copy kind) {
  for (size_t i = 0; i < pieces.size();) {
    size_t j = i + 1, bytes = pieces[i].bytes;
    while (j < pieces.size() && pieces[j].dst == pieces[i].dst + bytes && pieces[j].src == pieces[i].src + bytes)
      bytes += pieces[j++].bytes;
    throw_if_error(mem.copy(pieces[i].dst, pieces[i].src, bytes, kind));
    i = j;
  }
}

/// Uploads a row-copy table and runs it (copy_rows).
void run_row_copies(gpu::Mem const& mem, Scratch& sc, std::vector<gpu::RowCopy> const& t, int64_t cols) {
  if (t.empty()) return;
  auto* d = sc.get<gpu::RowCopy>(static_cast<int64_t>(t.size()));
  throw_if_error(mem.copy(d, t.data(), t.size() * sizeof(gpu::RowCopy), Copy::kHostToDev));
  throw_if_error(gpu::copy_rows(mem, d, static_cast<int64_t>(t.size()), cols));
}

/// Undoes what a pass did to its states before its commit: the compressed-KV / index-key entry counts (the
/// appended rows lie past them) and the Engram look-back. The rings and every other count are only written
/// after the commit point.
void rollback_pass(gpu::Mem const& mem, Pass const& b) {
  (void)mem.sync();
  for (SeqRun const& sq : b.seqs) {
    sq.st->history_.resize(sq.history_before);
    for (size_t l = 0; l < sq.entries_before.size(); ++l) sq.st->layers_[l].entries = sq.entries_before[l];
  }
}

}  // namespace

Status GpuDsv41Model::Impl::forward_pass(std::span<SequenceStep const> steps) {
  ModelSpec const& s = spec;
  int64_t const L = s.num_layers;
  Pass b;
  b.md = md;
  for (SequenceStep const& step : steps) {
    auto* st = static_cast<GpuDsv41State*>(step.state);
    int64_t const S = static_cast<int64_t>(step.tokens.size());
    if (S == 0) continue;
    if (st->length_ + S > s.max_position_embeddings)
      return invalid_argument("forward: sequence would reach " + std::to_string(st->length_ + S) +
                              " positions, beyond max_position_embeddings " + std::to_string(s.max_position_embeddings));
    SeqRun sq;
    sq.st = st;
    sq.tokens = step.tokens;
    sq.S = S;
    sq.row0 = b.rows;
    sq.pos0 = st->length_;
    sq.logit_rows = step.num_logit_rows;
    sq.logits = step.logits;
    sq.history_before = st->history_.size();
    for (auto const& ls : st->layers_) sq.entries_before.push_back(ls.entries);
    for (int64_t r = 0; r < S; ++r) {
      b.row_seq.push_back(static_cast<int32_t>(b.seqs.size()));
      b.pos.push_back(sq.pos0 + r);
    }
    b.rows += S;
    b.seqs.push_back(std::move(sq));
  }
  if (b.rows == 0) return {};
  int64_t const N = b.rows;
  gpu::Mem const& cs = mem;
  struct Tag {
    Device saved;
    explicit Tag(Device t) : saved(kDev) { kDev = t; }
    ~Tag() { kDev = saved; }
  } tag(mem.tag());
  try {
    Scratch keep{*pool, {}}, tmp{*pool, {}};
    int64_t const D = s.hidden_size, n = s.hc_mult, nD = n * D;
    // Op workspace for the pass (bf16 copies of linear inputs for the tensor-core path: rows × in × 2 bytes),
    // capped at 64 MiB; a larger need falls back to the op's own stream-ordered allocation.
    struct WorkspaceGuard {
      ExecContext& ctx;
      void* saved;
      size_t saved_bytes;
      ~WorkspaceGuard() { ctx.workspace = saved, ctx.workspace_bytes = saved_bytes; }
    } ws_guard{ctx, ctx.workspace, ctx.workspace_bytes};
    if (mem.backend == Backend::kCuda) {
      int64_t const max_in = std::max({nD, s.o_groups * s.o_lora_rank, s.num_heads * s.head_dim, s.moe_inter});
      int64_t const bytes = std::min<int64_t>(N * max_in * 2 + 4096, int64_t{64} << 20);
      ctx.workspace = keep.get<unsigned char>(bytes);
      ctx.workspace_bytes = static_cast<size_t>(bytes);
    }
    Forward f(*this, b, keep, tmp);

    // The upload block: [positions N | group positions per KV-source layer | hash ids L_e·N·C | tokens].
    std::vector<int64_t> up(b.pos);
    std::vector<size_t> lat_off(static_cast<size_t>(L), 0);
    b.lat.resize(static_cast<size_t>(L));
    for (int64_t l = 0; l < L; ++l) {
      if (!s.is_kv_source(l)) continue;
      int64_t const ratio = s.compress_ratios[static_cast<size_t>(l)];
      LatRows& lr = b.lat[static_cast<size_t>(l)];
      for (size_t i = 0; i < b.seqs.size(); ++i) {
        SeqRun const& sq = b.seqs[i];
        int64_t const entries = sq.st->layers_[static_cast<size_t>(l)].entries;
        int64_t const groups = (sq.pos0 - entries * ratio + sq.S) / ratio;  // the partial group's rows + the chunk's
        lr.groups.push_back(groups);
        lr.g0.push_back(lr.total);
        lr.total += groups;
        for (int64_t j = 0; j < groups; ++j) {
          lr.seq.push_back(static_cast<int32_t>(i));
          lr.pos.push_back((entries + j) * ratio);
        }
      }
      lat_off[static_cast<size_t>(l)] = up.size();
      up.insert(up.end(), lr.pos.begin(), lr.pos.end());
    }
    // Engram hash ids per sequence (host), then the look-back histories grow (§2.4.2). Uploaded: the Cu columns
    // whose table rows this model holds ([L_e, N, Cu]), as row ids of its table (a rank's rows start at the
    // first held column's offset).
    int64_t const Le = engram.layers, C = engram.columns();
    dist::Range const cols = engram_columns();
    int64_t const Cu = cols.size();
    size_t const hash_off = up.size();
    if (Le > 0) {
      up.resize(up.size() + static_cast<size_t>(Le * N * Cu));
      for (SeqRun const& sq : b.seqs) {
        std::vector<int64_t> h = hash_ids(*sq.st, sq.tokens);  // [S, L_e, C]
        for (int64_t r = 0; r < sq.S; ++r)
          for (int64_t e = 0; e < Le; ++e) {
            int64_t const base = Cu < C && Cu > 0 ? engram.offsets[static_cast<size_t>(e * C + cols.begin)] : 0;
            for (int64_t j = 0; j < Cu; ++j)
              up[hash_off + static_cast<size_t>((e * N + sq.row0 + r) * Cu + j)] = h[(r * Le + e) * C + cols.begin + j] - base;
          }
        for (int32_t t : sq.tokens) sq.st->history_.push_back(engram.token_map[static_cast<size_t>(t)]);
      }
    }
    size_t const tok_bytes = up.size() * 8;  // the int32 tokens follow the int64 words
    std::vector<unsigned char> blob(tok_bytes + static_cast<size_t>(N) * 4);
    std::memcpy(blob.data(), up.data(), tok_bytes);
    for (SeqRun const& sq : b.seqs)
      std::memcpy(blob.data() + tok_bytes + static_cast<size_t>(sq.row0) * 4, sq.tokens.data(), sq.tokens.size() * 4);
    unsigned char* d_blob = keep.get<unsigned char>(static_cast<int64_t>(blob.size()));  // a pool block: 256-aligned
    throw_if_error(cs.copy(d_blob, blob.data(), blob.size(), Copy::kHostToDev));
    auto const* d_up = reinterpret_cast<int64_t const*>(d_blob);
    b.d_pos = d_up;
    for (int64_t l = 0; l < L; ++l) b.lat[static_cast<size_t>(l)].d_pos = d_up + lat_off[static_cast<size_t>(l)];
    b.d_hash = d_up + hash_off;
    b.d_tokens = reinterpret_cast<int32_t const*>(d_blob + tok_bytes);

    // Flags: per layer at most 7 records of ≤ N rows (window kv, index key, index query, candidate,
    // indexer, compressed kv, router).
    b.flag_cap = static_cast<size_t>(L * 7 * N);
    b.flag_arena = keep.get<uint8_t>(static_cast<int64_t>(b.flag_cap));
    b.sel = keep.get<int32_t>(N * s.index_topk);

    float* X = keep.get<float>(N * nD);
    float* X2 = keep.get<float>(N * nD);
    float* pre = keep.get<float>(N * n);
    throw_if_error(gpu::embed_streams(cs, w.embed.f32(), b.d_tokens, N, n, D, X, pre));
    float* h = keep.get<float>(N * D);
    float* xa = keep.get<float>(N * D);
    float* A = keep.get<float>(N * D);
    float* F = keep.get<float>(N * D);
    float* a_pre = keep.get<float>(N * n);
    float* a_post = keep.get<float>(N * n);
    float* a_comb = keep.get<float>(N * n * n);
    float* f_pre = keep.get<float>(N * n);
    float* f_post = keep.get<float>(N * n);
    float* f_comb = keep.get<float>(N * n * n);
    int64_t const K = s.top_k;
    float* rw = keep.get<float>(N * K);
    int32_t* rid = keep.get<int32_t>(N * K);
    ops::MhcMixDesc const mix{N, n, D, static_cast<int>(s.hc_sinkhorn_iters), s.hc_eps, s.rms_eps, md};

    // Router row ranges: per-token pruning at decode scope applies to one-token chunks past position 0 only,
    // so consecutive sequences of the same scope share one MoeRoute (row-invariant: the same values).
    struct RouteRange {
      int64_t r0, r1;
      bool prune;
    };
    std::vector<RouteRange> route_ranges;
    ExpertPruning const& pr = opts.prune;
    for (SeqRun const& sq : b.seqs) {
      bool const decode = sq.S == 1 && sq.pos0 > 0;
      bool const prune = pr.active() && (pr.scope == ExpertPruning::Scope::kAll || decode);
      if (!route_ranges.empty() && route_ranges.back().prune == prune) route_ranges.back().r1 = sq.row0 + sq.S;
      else route_ranges.push_back({sq.row0, sq.row0 + sq.S, prune});
    }

    // CUDA-graph mode: each layer, then the head, recorded and launched as one segment (a pass with a route
    // observer reads the router's output inside the layer, so it runs eagerly).
    gpu::GraphCapture* const graph = graphs && !route_observer && !shard ? graphs.get() : nullptr;
    struct RecordingGuard {
      gpu::GraphCapture* g;
      gpu::Mem& m;
      ~RecordingGuard() {
        if (g) g->abort(m);
      }
    } recording_guard{graph, mem};

    for (int64_t l = 0; l < L; ++l) {
      size_t const layer_mark = tmp.mark();
      if (graph) throw_if_error(graph->begin(mem));
      gpu::GpuLayerWeights const& lw = w.layers[static_cast<size_t>(l)];
      int64_t const ei = s.engram_index(l);
      if (ei >= 0) {
        int64_t const de = s.engram_head_dim;
        float* rows = tmp.get<float>(N * C * de);
        float* kv = tmp.get<float>(N * (n + 1) * D);
        if (shard)
          f.shard_engram_rows(ei, lw.e_table, rows);
        else
          run<ops::EngramGather>(ctx, ops::EngramGatherDesc{N, C, lw.e_table.rows, de},
                                 ops::EngramGatherArgs{TensorView<int64_t const, 2>(b.d_hash + ei * N * C, {N, C}, kDev),
                                                       dcv2(lw.e_table), dv2(rows, N, C * de)});
        f.lin(rows, N, lw.e_wkv, kv, md);
        run<ops::EngramGate>(
            ctx, ops::EngramGateDesc{N, n, D, s.rms_eps, md},
            ops::EngramGateArgs{dcv2(X, N, nD), dcv2(kv, N, (n + 1) * D), dcv1(lw.e_qk.f32(), n * D), dv2(X, N, nD)});
      }
      // Attention site (§2.3): mix of the current streams, collapse with the previous site's pre.
      run<ops::MhcMix>(ctx, mix,
                       ops::MhcMixArgs{dcv2(X, N, nD), dcv2(lw.hc_attn_fn), dcv1(lw.hc_attn_base), dcv1(lw.hc_attn_scale),
                                       dv2(a_pre, N, n), dv2(a_post, N, n), dv2(a_comb, N, n * n)});
      run<ops::MhcCollapse>(ctx, ops::MhcCollapseDesc{N, n, D, md},
                            ops::MhcCollapseArgs{dcv2(X, N, nD), dcv2(pre, N, n), dv2(h, N, D)});
      run<ops::RmsNorm>(ctx, ops::RmsNormDesc{N, D, s.rms_eps, true, md},
                        ops::RmsNormArgs{dcv2(h, N, D), dcv1(lw.attn_norm), dv2(xa, N, D)});
      f.attention(l, xa, A);
      if (gpu::FaultHook::layer() == l)
        throw Error(Status(StatusCode::kInternal, "injected failure after layer " + std::to_string(l) + "'s attention"));
      run<ops::MhcExpand>(ctx, ops::MhcExpandDesc{N, n, D, md},
                          ops::MhcExpandArgs{dcv2(A, N, D), dcv2(X, N, nD), dcv2(a_post, N, n), dcv2(a_comb, N, n * n),
                                             dv2(X2, N, nD)});
      std::swap(X, X2);
      // FFN site: collapse with the attention site's pre.
      run<ops::MhcMix>(ctx, mix,
                       ops::MhcMixArgs{dcv2(X, N, nD), dcv2(lw.hc_ffn_fn), dcv1(lw.hc_ffn_base), dcv1(lw.hc_ffn_scale),
                                       dv2(f_pre, N, n), dv2(f_post, N, n), dv2(f_comb, N, n * n)});
      run<ops::MhcCollapse>(ctx, ops::MhcCollapseDesc{N, n, D, md},
                            ops::MhcCollapseArgs{dcv2(X, N, nD), dcv2(a_pre, N, n), dv2(h, N, D)});
      run<ops::RmsNorm>(ctx, ops::RmsNormDesc{N, D, s.rms_eps, true, md},
                        ops::RmsNormArgs{dcv2(h, N, D), dcv1(lw.ffn_norm), dv2(xa, N, D)});
      uint8_t* rtie = f.tie_flags_all(CutoffTie::Site::kRouter, Stage::kRouter, l);
      for (RouteRange const& rr : route_ranges) {
        int64_t const rows = rr.r1 - rr.r0;
        ops::MoeRouteDesc rd{rows, s.n_experts, D, K, s.gate_temp, s.routed_scale, s.norm_topk_prob};
        rd.md = md;
        ops::MoeRouteArgs ra{dcv2(xa + rr.r0 * D, rows, D), dcv2(lw.gate), dcv1(lw.gate_bias), dv2(rw + rr.r0 * K, rows, K),
                             TensorView<int32_t, 2>(rid + rr.r0 * K, {rows, K}, kDev),
                             TensorView<uint8_t, 1>(rtie + rr.r0, {rows}, kDev), {}};
        if (pr.active()) {  // lossy lever (seed-notes §5), as model.cpp
          if (rr.prune) {
            rd.prune_top_p = pr.top_p;
            rd.prune_min_k = pr.min_k;
            rd.prune_renorm = pr.renorm;
          }
          if (!expert_masks.empty())
            ra.expert_mask = TensorView<uint8_t const, 1>(
                static_cast<uint8_t const*>(expert_masks[static_cast<size_t>(l)]), {s.n_experts}, kDev);
        }
        run<ops::MoeRoute>(ctx, rd, ra);
      }
      if (route_observer) {  // each sequence's rows, in batch order
        std::vector<int32_t> hid(static_cast<size_t>(N * K));
        std::vector<float> hw(static_cast<size_t>(N * K));
        throw_if_error(cs.copy(hid.data(), rid, hid.size() * 4, Copy::kDevToHost));
        throw_if_error(cs.copy(hw.data(), rw, hw.size() * 4, Copy::kDevToHost));
        throw_if_error(cs.sync());
        for (SeqRun const& sq : b.seqs) {
          size_t const o = static_cast<size_t>(sq.row0 * K), c = static_cast<size_t>(sq.S * K);
          route_observer(l, std::span<int32_t const>(hid).subspan(o, c), std::span<float const>(hw).subspan(o, c));
        }
      }
      if (shard) {
        f.shard_moe(l, xa, rw, rid, N, F);
      } else if (lw.moe.routed_exl3) {
        f.moe_exl3(l, xa, rw, rid, N, F);
      } else {
        ops::MoeExpertsDesc ed{N, s.n_experts, D, s.moe_inter, K, s.swiglu_limit, true, md};
        // The dense experts' dtype (a block-scaled shared expert rides beside block-scaled routed experts, whose
        // weight_dtype the backend fixes: fp32 on the CPU, bf16 on CUDA).
        ed.weight_dtype = lw.moe.shared_scaled == DType::kF32 ? lw.moe.s1.dtype
                          : mem.backend == Backend::kCpu     ? DType::kF32
                                                             : DType::kBf16;
        ops::MoeExpertsArgs ma{};
        ma.x = dcv2(xa, N, D);
        ma.ids = TensorView<int32_t const, 2>(rid, {N, K}, kDev);
        ma.weights = dcv2(rw, N, K);
        ma.out = dv2(F, N, D);
        auto* const* table = static_cast<void const* const*>(lw.moe.ptrs);
        ma.dev.w1 = table;
        ma.dev.w3 = table + s.n_experts;
        ma.dev.w2 = table + 2 * s.n_experts;
        if (lw.moe.routed_scaled != DType::kF32) {  // codes in `table`, scales in scale_ptrs (the CPU: views below)
          ed.routed_scaled = lw.moe.routed_scaled;
          auto* const* st = static_cast<void const* const*>(lw.moe.scale_ptrs);
          ma.dev.s1 = st;
          ma.dev.s3 = st + s.n_experts;
          ma.dev.s2 = st + 2 * s.n_experts;
        }
        ma.dev.shared_w1 = lw.moe.s1.p;  // codes when block-scaled, with their scales:
        ma.dev.shared_w3 = lw.moe.s3.p;
        ma.dev.shared_w2 = lw.moe.s2.p;
        if (lw.moe.shared_scaled != DType::kF32) {
          ed.shared_scaled = lw.moe.shared_scaled;
          ma.dev.shared_s1 = lw.moe.s1.scale;
          ma.dev.shared_s3 = lw.moe.s3.scale;
          ma.dev.shared_s2 = lw.moe.s2.scale;
        }
        std::vector<CF2> hw1, hw3, hw2;  // the CPU backend's views of the same weights (fp32, or codes + scales)
        std::vector<ops::BlockScaledView> hq1, hq3, hq2;
        if (mem.backend == Backend::kCpu) {
          for (size_t e = 0; e < lw.moe.w1.size(); ++e) {
            if (lw.moe.routed_scaled != DType::kF32) {
              hq1.push_back(scaled_view(lw.moe.w1[e]));
              hq3.push_back(scaled_view(lw.moe.w3[e]));
              hq2.push_back(scaled_view(lw.moe.w2[e]));
              continue;
            }
            hw1.push_back(dcv2(lw.moe.w1[e]));
            hw3.push_back(dcv2(lw.moe.w3[e]));
            hw2.push_back(dcv2(lw.moe.w2[e]));
          }
          ma.w1 = hw1;
          ma.w3 = hw3;
          ma.w2 = hw2;
          ma.w1_scaled = hq1;
          ma.w3_scaled = hq3;
          ma.w2_scaled = hq2;
          if (lw.moe.shared_scaled != DType::kF32) {
            ma.shared_w1_scaled = scaled_view(lw.moe.s1);
            ma.shared_w3_scaled = scaled_view(lw.moe.s3);
            ma.shared_w2_scaled = scaled_view(lw.moe.s2);
          } else {
            ma.shared_w1 = dcv2(lw.moe.s1);
            ma.shared_w3 = dcv2(lw.moe.s3);
            ma.shared_w2 = dcv2(lw.moe.s2);
          }
        }
        run<ops::MoeExperts>(ctx, ed, ma);
      }
      run<ops::MhcExpand>(ctx, ops::MhcExpandDesc{N, n, D, md},
                          ops::MhcExpandArgs{dcv2(F, N, D), dcv2(X, N, nD), dcv2(f_post, N, n), dcv2(f_comb, N, n * n),
                                             dv2(X2, N, nD)});
      std::swap(X, X2);
      std::swap(pre, f_pre);
      if (graph) throw_if_error(graph->end_and_launch(mem, static_cast<size_t>(l)));
      tmp.release(layer_mark);
    }
    // Final collapse with the last site's pre, norm, LM head (§2.7).
    if (graph) throw_if_error(graph->begin(mem));
    run<ops::MhcCollapse>(ctx, ops::MhcCollapseDesc{N, n, D, md},
                          ops::MhcCollapseArgs{dcv2(X, N, nD), dcv2(pre, N, n), dv2(h, N, D)});
    run<ops::RmsNorm>(ctx, ops::RmsNormDesc{N, D, s.rms_eps, true, md},
                      ops::RmsNormArgs{dcv2(h, N, D), dcv1(w.norm), dv2(xa, N, D)});
    // LM head over the concatenation of every sequence's logit rows (its last num_logit_rows rows); they
    // are gathered into one block unless they already are one.
    int64_t NL = 0;
    std::vector<gpu::RowCopy> gather;
    bool contiguous = true;
    int64_t first = -1;
    for (SeqRun const& sq : b.seqs) {
      int64_t const r0 = sq.row0 + sq.S - sq.logit_rows;
      if (sq.logit_rows > 0 && first >= 0 && r0 != first + NL) contiguous = false;
      if (sq.logit_rows > 0 && first < 0) first = r0;
      NL += sq.logit_rows;
    }
    std::vector<Piece> downloads;
    if (NL > 0) {
      int64_t const V = s.vocab_size;
      float const* x_head = xa + first * D;
      if (!contiguous) {
        float* g = keep.get<float>(NL * D);
        int64_t k = 0;
        for (SeqRun const& sq : b.seqs)
          for (int64_t r = sq.row0 + sq.S - sq.logit_rows; r < sq.row0 + sq.S; ++r) gather.push_back({xa + r * D, g + k++ * D});
        run_row_copies(cs, keep, gather, D);
        x_head = g;
      }
      float* d_logits = keep.get<float>(NL * V);
      if (shard) f.shard_head(x_head, NL, d_logits);
      else f.lin(x_head, NL, w.lm_head, d_logits, md);
      int64_t k = 0;
      for (SeqRun const& sq : b.seqs) {
        if (sq.logit_rows == 0) continue;
        downloads.push_back({reinterpret_cast<char*>(sq.logits), reinterpret_cast<char const*>(d_logits + k * V),
                             static_cast<size_t>(sq.logit_rows * V) * 4});
        k += sq.logit_rows;
      }
    }
    if (graph) throw_if_error(graph->end_and_launch(mem, static_cast<size_t>(L)));
    copy_merged(cs, downloads, Copy::kDevToHost);
    std::vector<uint8_t> host_flags(b.flag_used);
    throw_if_error(cs.copy(host_flags.data(), b.flag_arena, b.flag_used, Copy::kDevToHost));

    // The commit table: each sequence's last min(S, ring) rows of every layer's window kv (and of the raw
    // compressor projections of ratio > 1 KV sources) to the ring rows of their positions; uploaded now,
    // launched at the commit point.
    int64_t const hd = s.head_dim, w_cap = s.sliding_window - 1 + opts.max_rollback;
    std::vector<gpu::RowCopy> commit;
    for (RingWrite const& rwt : b.ring_writes) {
      int64_t const cap = rwt.kind == RingWrite::kWindow ? w_cap
                                                          : opts.max_rollback + s.compress_ratios[static_cast<size_t>(rwt.layer)];
      for (SeqRun const& sq : b.seqs) {
        gpu::GpuLayerState& ls = sq.st->layers_[static_cast<size_t>(rwt.layer)];
        gpu::DevBlock const& ring = rwt.kind == RingWrite::kWindow ? ls.window : rwt.kind == RingWrite::kRawKv ? ls.raw_kv
                                                                                                               : ls.raw_gate;
        for (int64_t j = std::max<int64_t>(0, sq.S - cap); j < sq.S; ++j)
          commit.push_back({rwt.rows + (sq.row0 + j) * hd, ring.as<float>() + ((sq.pos0 + j) % cap) * hd});
      }
    }
    auto* d_commit = keep.get<gpu::RowCopy>(static_cast<int64_t>(commit.size()));
    throw_if_error(cs.copy(d_commit, commit.data(), commit.size() * sizeof(gpu::RowCopy), Copy::kHostToDev));
    throw_if_error(cs.sync());  // logits and flags are on the host, every kernel before the commit has run
    if (graph) graph->release_stage();

    // Each state's new tie / boundary records, sorted by (layer, stage): the order the sequence alone
    // records them. Staged and room reserved before the commit, so nothing after it allocates.
    std::vector<size_t> order(b.flags.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      FlagRec const &a = b.flags[x], &c = b.flags[y];
      return a.layer != c.layer ? a.layer < c.layer : a.stage < c.stage;
    });
    std::vector<std::vector<CutoffTie>> ties(b.seqs.size());
    std::vector<std::vector<QuantBoundary>> bounds(b.seqs.size());
    for (size_t i : order) {
      FlagRec const& fr = b.flags[i];
      for (size_t r = 0; r < fr.positions.size(); ++r) {
        if (!host_flags[fr.offset + r] || fr.seq[r] < 0) continue;
        auto const k = static_cast<size_t>(fr.seq[r]);
        if (fr.tie) ties[k].push_back({static_cast<CutoffTie::Site>(fr.site), fr.layer, fr.positions[r]});
        else bounds[k].push_back({static_cast<QuantBoundary::Site>(fr.site), fr.layer, fr.positions[r]});
      }
    }
    for (size_t k = 0; k < b.seqs.size(); ++k) {
      GpuDsv41State& st = *b.seqs[k].st;
      st.ties_.events.reserve(st.ties_.events.size() + ties[k].size());
      st.boundaries_.reserve(st.boundaries_.size() + bounds[k].size());
    }

    // Commit point: one launch writes the rings. Everything before it can fail and leave the states as they
    // were (rollback_pass); after it only host bookkeeping that cannot fail. A device fault in the commit
    // itself surfaces at a later synchronisation.
    throw_if_error(gpu::copy_rows(cs, d_commit, static_cast<int64_t>(commit.size()), hd));
    for (size_t k = 0; k < b.seqs.size(); ++k) {
      SeqRun const& sq = b.seqs[k];
      GpuDsv41State& st = *sq.st;
      for (int64_t l = 0; l < L; ++l) {
        gpu::GpuLayerState& ls = st.layers_[static_cast<size_t>(l)];
        ls.n_window = std::min(w_cap, ls.n_window + sq.S);
        int64_t const ratio = s.compress_ratios[static_cast<size_t>(l)];
        if (s.is_kv_source(l) && ratio > 1) ls.n_raw = std::min(opts.max_rollback + ratio, ls.n_raw + sq.S);
      }
      for (CutoffTie const& t : ties[k]) {
        ++(t.site == CutoffTie::Site::kIndexer ? st.ties_.indexer
           : t.site == CutoffTie::Site::kRouter ? st.ties_.router
                                                : st.ties_.candidate);
        st.ties_.events.push_back(t);
      }
      st.boundaries_.insert(st.boundaries_.end(), bounds[k].begin(), bounds[k].end());
      st.length_ += sq.S;
    }
  } catch (Error const& e) {
    rollback_pass(cs, b);  // synchronises: no launched segment still reads the stage
    if (graphs) graphs->release_stage();
    return e.status();
  } catch (std::bad_alloc const&) {
    rollback_pass(cs, b);
    if (graphs) graphs->release_stage();
    return Status(StatusCode::kOutOfMemory, "forward: host allocation failed");
  }
  return {};
}

}  // namespace tessera::model::dsv41

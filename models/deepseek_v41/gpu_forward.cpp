// SPDX-License-Identifier: Apache-2.0
/// The GPU model's forward over a chunk of one sequence: model.cpp's forward_one and attention_block.cpp's
/// attention sub-block (spec/deepseek-v41.md §2.1-§2.7) step for step, every tensor on the device, every
/// op family run as Family<Backend::kCuda> with the same Desc, in the same order. The host keeps only
/// what the CPU model keeps as bookkeeping: positions, the Engram look-back (hash ids are computed on the
/// host and uploaded), and the cutoff-tie / quantiser-boundary flags, downloaded once per chunk. The same
/// code runs on the CPU op backends in host memory (Backend::kCpu, the CI check of the composition).
#include <algorithm>
#include <cmath>
#include <string>

#include "models/deepseek_v41/gpu_impl.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/ops/compressor.hpp"
#include "tessera/ops/engram.hpp"
#include "tessera/ops/indexer.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/mhc.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/norm.hpp"
#include "tessera/ops/qat.hpp"
#include "tessera/ops/rope.hpp"
#include "tessera/ref/engram_ref.hpp"

namespace tessera::model::dsv41 {

namespace {

/// The memory tag of the views of the forward running on this thread (kCuda, or kCpu for the host
/// composition); set by forward_one for its duration.
thread_local Device kDev = Device::kCuda;
using F2 = TensorView<float, 2>;
using CF2 = TensorView<float const, 2>;
using CF1 = TensorView<float const, 1>;
using gpu::DevTensor;

F2 dv2(float* p, int64_t r, int64_t c) { return F2(p, {r, c}, kDev); }
CF2 dcv2(float const* p, int64_t r, int64_t c) { return CF2(p, {r, c}, kDev); }
CF2 dcv2(DevTensor const& t) { return CF2(t.f32(), {t.rows, t.cols}, kDev); }
CF1 dcv1(DevTensor const& t) { return CF1(t.f32(), {t.rows * t.cols}, kDev); }
CF1 dcv1(float const* p, int64_t n) { return CF1(p, {n}, kDev); }
TensorView<int64_t const, 1> dpos(int64_t const* p, int64_t n) { return TensorView<int64_t const, 1>(p, {n}, kDev); }

using Copy = gpu::Mem::Copy;

/// Checks, then runs Family on ctx.backend.
template <template <Backend> class Family, class D, class A>
void run(ExecContext& ctx, D const& d, A const& a) {
  throw_if_error(ops::dispatch<Family>(ctx, d, a));
}

/// Per-forward device scratch from the pool (returned when the forward ends; same-stream reuse is safe).
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
};

/// Makes `blk` hold at least `bytes`, keeping its first `used` bytes (doubling growth).
void ensure(gpu::DevicePool& pool, gpu::DevBlock& blk, size_t bytes, size_t used, gpu::Mem const& mem) {
  if (blk && blk.capacity() >= bytes) return;
  auto nb = gpu::DevBlock::make(pool, std::max(bytes, blk.capacity() * 2));
  if (!nb) throw Error(nb.status());
  if (blk && used > 0) throw_if_error(mem.copy(nb->get(), blk.get(), used, Copy::kDevToDev));
  blk = std::move(*nb);
}

/// A flag vector the device writes (cutoff ties or near-boundary rows), read back after the chunk.
struct FlagRec {
  bool tie = false;
  uint8_t site = 0;
  int32_t layer = 0;
  std::vector<int64_t> positions;
  uint8_t* dev = nullptr;
};

}  // namespace

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

namespace {

/// Everything one chunk's layers share (model.cpp's Chunk, on the device).
struct GChunk {
  int64_t S = 0;
  int64_t pos0 = 0;
  std::vector<int64_t> pos;  // host copy
  int64_t* d_pos = nullptr;
  DType md = DType::kF32;
  int64_t idx_src = -1, ckv_src = -1;
  bool has_topk = false;
  int32_t* sel = nullptr;     // [S, K] selections of the latest indexer
  bool has_cand = false;
  uint8_t* cand = nullptr;    // [S, T_cand]
  int64_t cand_T = 0;
  std::vector<FlagRec> flags;
};

class Forward {
 public:
  Forward(GpuDsv41Model::Impl& m, GpuDsv41State& st, Scratch& sc, GChunk& c)
      : m_(m), st_(st), sc_(sc), c_(c), ctx_(m.ctx), s_(m.mem) {}

  /// y[r, :] = →md(x[r, :]·W[w_row0 + o, :]ᵀ) for o < out (rows strided by x_stride / y_stride).
  void lin(float const* x, int64_t x_stride, int64_t rows, DevTensor const& w, float* y, int64_t y_stride, DType md,
           int64_t w_row0 = 0, int64_t out = -1, int64_t in = -1, bool fma_chain = false) {
    if (out < 0) out = w.rows;
    if (in < 0) in = w.cols;
    ops::LinearDesc d{rows, in, out, w.dtype, md, fma_chain};
    ops::LinearArgs a;
    a.x = CF2(x, {rows, in}, {x_stride, 1}, kDev);
    if (w.dtype == DType::kBf16) a.w_bf16 = TensorView<Bf16 const, 2>(w.bf16() + w_row0 * in, {out, in}, kDev);
    else a.w = CF2(w.f32() + w_row0 * in, {out, in}, kDev);
    a.y = F2(y, {rows, out}, {y_stride, 1}, kDev);
    run<ops::Linear>(ctx_, d, a);
  }
  void lin(float const* x, int64_t rows, DevTensor const& w, float* y, DType md) { lin(x, w.cols, rows, w, y, w.rows, md); }

  void norm(float* x, int64_t rows, int64_t dim, DevTensor const& w) {
    run<ops::RmsNorm>(ctx_, ops::RmsNormDesc{rows, dim, m_.spec.rms_eps, true, c_.md},
                                      ops::RmsNormArgs{dcv2(x, rows, dim), dcv1(w), dv2(x, rows, dim)});
  }
  void rope(float* x, int64_t rows, int64_t heads, int64_t hd, int64_t const* pos, DevTensor const& table, bool inverse) {
    int64_t const R = m_.spec.rope_dim;
    run<ops::Rope>(ctx_, ops::RopeDesc{rows, heads, hd, R, inverse, c_.md},
                                   ops::RopeArgs{dv2(x, rows, heads * hd), dpos(pos, rows), dcv1(table)});
  }
  /// Fake-quantises rows in place; with boundary_ulps > 0 records the rows near a rounding boundary.
  void quant(float* x, int64_t rows, int64_t dim, ops::QatKind kind, QuantBoundary::Site site, int64_t l,
             std::vector<int64_t> const& pos) {
    int const ulps = m_.opts.boundary_ulps;
    uint8_t* near = ulps > 0 ? sc_.get<uint8_t>(rows) : nullptr;
    run<ops::FakeQuant>(
        ctx_, ops::FakeQuantDesc{rows, dim, kind, c_.md, ulps},
        ops::FakeQuantArgs{dv2(x, rows, dim), TensorView<uint8_t, 1>(near, {near ? rows : 0}, kDev)});
    if (near) c_.flags.push_back({false, static_cast<uint8_t>(site), static_cast<int32_t>(l), pos, near});
  }
  uint8_t* tie_flags(int64_t rows, CutoffTie::Site site, int64_t l) {
    uint8_t* f = sc_.get<uint8_t>(rows);
    c_.flags.push_back({true, static_cast<uint8_t>(site), static_cast<int32_t>(l), c_.pos, f});
    return f;
  }
  void copy(void* dst, void const* src, size_t bytes) { throw_if_error(s_.copy(dst, src, bytes, Copy::kDevToDev)); }
  int64_t* upload_pos(std::vector<int64_t> const& p) {
    int64_t* d = sc_.get<int64_t>(static_cast<int64_t>(p.size()));
    throw_if_error(s_.copy(d, p.data(), p.size() * 8, Copy::kHostToDev));
    return d;
  }

  void attention(int64_t l, float const* xa, float* out);

  GpuDsv41Model::Impl& m_;
  GpuDsv41State& st_;
  Scratch& sc_;
  GChunk& c_;
  ExecContext& ctx_;
  gpu::Mem const& s_;
};

void Forward::attention(int64_t l, float const* xa, float* out) {
  ModelSpec const& s = m_.spec;
  gpu::GpuLayerWeights const& w = m_.w.layers[static_cast<size_t>(l)];
  gpu::GpuLayerState& ls = st_.layers_[static_cast<size_t>(l)];
  DType const md = c_.md;
  int64_t const S = c_.S, D = s.hidden_size, H = s.num_heads, hd = s.head_dim, qr = s.q_lora_rank;
  int64_t const ratio = s.compress_ratios[static_cast<size_t>(l)];
  DevTensor const& table = ratio ? m_.w.compress_inv_freq : m_.w.main_inv_freq;
  int64_t const R = m_.opts.max_rollback;
  (void)D;

  // Projections (§2.5.2).
  float* q_res = sc_.get<float>(S * qr);
  float* q = sc_.get<float>(S * H * hd);
  float* kv = sc_.get<float>(S * hd);
  lin(xa, S, w.wq_a, q_res, md);
  norm(q_res, S, qr, w.q_norm);
  lin(q_res, S, w.wq_b, q, md);
  rope(q, S, H, hd, c_.d_pos, table, false);
  lin(xa, S, w.wkv, kv, md);
  norm(kv, S, hd, w.kv_norm);
  rope(kv, S, 1, hd, c_.d_pos, table, false);
  quant(kv, S, hd, ops::QatKind::kFp8Block32, QuantBoundary::Site::kWindowKv, l, c_.pos);

  if (ratio > 0) {
    // Compressor (§2.5.3): latents of the groups completing in this chunk, pre-RoPE.
    float* lat = nullptr;
    std::vector<int64_t> lat_pos;
    int64_t* d_lat_pos = nullptr;
    int64_t groups = 0;
    if (s.is_kv_source(l)) {
      if (ratio == 1) {
        groups = S;
        lat = sc_.get<float>(S * hd);
        lin(xa, S, w.c_wkv, lat, md);
        norm(lat, S, hd, w.c_norm);
        for (int64_t g = 0; g < S; ++g) lat_pos.push_back(ls.entries + g);
      } else {
        // [raw rows | chunk rows] of the fp32 projections; the partial group is the tail of the raw rows.
        int64_t const n_raw = ls.n_raw, n_buf = st_.length_ - ls.entries * ratio, all = n_raw + S;
        float* cat_kv = sc_.get<float>(all * hd);
        float* cat_gate = sc_.get<float>(all * hd);
        copy(cat_kv, ls.raw_kv.get(), static_cast<size_t>(n_raw * hd * 4));
        copy(cat_gate, ls.raw_gate.get(), static_cast<size_t>(n_raw * hd * 4));
        lin(xa, S, w.c_wkv, cat_kv + n_raw * hd, DType::kF32);
        lin(xa, S, w.c_wgate, cat_gate + n_raw * hd, DType::kF32);
        groups = (n_buf + S) / ratio;
        if (groups > 0) {
          lat = sc_.get<float>(groups * hd);
          float const* b_kv = cat_kv + (n_raw - n_buf) * hd;
          float const* b_gate = cat_gate + (n_raw - n_buf) * hd;
          run<ops::CompressPool>(
              ctx_, ops::CompressPoolDesc{groups, ratio, hd, md},
              ops::CompressPoolArgs{dcv2(b_kv, groups * ratio, hd), dcv2(b_gate, groups * ratio, hd), dv2(lat, groups, hd)});
          norm(lat, groups, hd, w.c_norm);
        }
        int64_t const keep = std::min(R + ratio, all);
        size_t const cap = static_cast<size_t>((R + ratio) * hd * 4);
        ensure(*st_.pool_, ls.raw_kv, cap, 0, s_);
        ensure(*st_.pool_, ls.raw_gate, cap, 0, s_);
        copy(ls.raw_kv.get(), cat_kv + (all - keep) * hd, static_cast<size_t>(keep * hd * 4));
        copy(ls.raw_gate.get(), cat_gate + (all - keep) * hd, static_cast<size_t>(keep * hd * 4));
        ls.n_raw = keep;
        for (int64_t j = 0; j < groups; ++j) lat_pos.push_back(ls.entries * ratio + j * ratio);
      }
      if (groups > 0) d_lat_pos = upload_pos(lat_pos);
    }

    // Indexer (§2.5.4).
    if (s.is_index_source(l)) {
      int64_t const Hi = s.index_n_heads, di = s.index_head_dim;
      int64_t T = 0;
      if (s.is_kv_source(l)) {
        if (groups > 0) {
          float* k = sc_.get<float>(groups * di);
          lin(lat, groups, w.i_wk, k, md);
          norm(k, groups, di, w.i_k_norm);
          rope(k, groups, 1, di, d_lat_pos, m_.w.compress_inv_freq, false);
          quant(k, groups, di, ops::QatKind::kFp4Block32Ue8m0, QuantBoundary::Site::kIndexKey, l, lat_pos);
          ensure(*st_.pool_, ls.index_k, static_cast<size_t>((ls.entries + groups) * di * 4),
                 static_cast<size_t>(ls.entries * di * 4), s_);
          copy(ls.index_k.as<float>() + ls.entries * di, k, static_cast<size_t>(groups * di * 4));
        }
        c_.idx_src = l;
        T = ls.entries + groups;
      } else if (c_.idx_src >= 0) {
        T = st_.layers_[static_cast<size_t>(c_.idx_src)].entries;
      }
      if (T > 0) {
        float const* keys = st_.layers_[static_cast<size_t>(c_.idx_src)].index_k.as<float>();
        float* qi = sc_.get<float>(S * Hi * di);
        float* wts = sc_.get<float>(S * Hi);
        float* scores = sc_.get<float>(S * T);
        lin(q_res, S, w.i_wq_b, qi, md);
        rope(qi, S, Hi, di, c_.d_pos, m_.w.compress_inv_freq, false);
        quant(qi, S, Hi * di, ops::QatKind::kFp4Block32Ue8m0, QuantBoundary::Site::kIndexQuery, l, c_.pos);
        lin(xa, S, w.i_weights_proj, wts, md);
        float const hs = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Hi)));
        throw_if_error(gpu::scale_inplace(s_, wts, S * Hi, hs));
        float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(di)));
        run<ops::IndexScore>(
            ctx_, ops::IndexScoreDesc{S, Hi, di, T, ratio, scale},
            ops::IndexScoreArgs{dcv2(qi, S, Hi * di), dcv2(wts, S, Hi), dcv2(keys, T, di), dpos(c_.d_pos, S),
                                dv2(scores, S, T)});
        TensorView<uint8_t const, 2> mask;
        if (l == s.candidate_source_layer) {
          c_.cand = sc_.get<uint8_t>(S * T);
          uint8_t* ties = tie_flags(S, CutoffTie::Site::kCandidateBlocks, l);
          run<ops::CandidateBlocks>(
              ctx_, ops::CandidateBlocksDesc{S, T, ratio, s.candidate_block_size, s.candidate_topk_blocks},
              ops::CandidateBlocksArgs{dcv2(scores, S, T), dpos(c_.d_pos, S), TensorView<uint8_t, 2>(c_.cand, {S, T}, kDev),
                                       TensorView<uint8_t, 1>(ties, {S}, kDev)});
          c_.has_cand = true;
          c_.cand_T = T;
        } else if (s.candidate_source_layer >= 0 && s.candidate_source_layer < l && c_.has_cand && c_.cand_T == T) {
          mask = TensorView<uint8_t const, 2>(c_.cand, {S, T}, kDev);
        }
        int64_t const K = s.index_topk;
        c_.sel = sc_.get<int32_t>(S * K);
        uint8_t* ties = tie_flags(S, CutoffTie::Site::kIndexer, l);
        run<ops::IndexTopK>(ctx_, ops::IndexTopKDesc{S, T, K},
                                            ops::IndexTopKArgs{dv2(scores, S, T), mask,
                                                               TensorView<int32_t, 2>(c_.sel, {S, K}, kDev),
                                                               TensorView<uint8_t, 1>(ties, {S}, kDev)});
        c_.has_topk = true;
      }
    }

    // Compressed KV cache: RoPE at each group's first position, FP4 with e4m3 scales (§2.5.3).
    if (groups > 0) {
      rope(lat, groups, 1, hd, d_lat_pos, m_.w.compress_inv_freq, false);
      quant(lat, groups, hd, ops::QatKind::kFp4Block16E4m3, QuantBoundary::Site::kCompressedKv, l, lat_pos);
      ensure(*st_.pool_, ls.ckv, static_cast<size_t>((ls.entries + groups) * hd * 4), static_cast<size_t>(ls.entries * hd * 4),
             s_);
      copy(ls.ckv.as<float>() + ls.entries * hd, lat, static_cast<size_t>(groups * hd * 4));
      ls.entries += groups;
    }
    if (s.is_kv_source(l)) c_.ckv_src = l;
  }

  // Key pool [old window rows | chunk rows | compressed entries] and the per-row key lists (§2.5.5).
  int64_t const W = s.sliding_window, n_old = ls.n_window;
  gpu::GpuLayerState const* src = (ratio > 0 && c_.ckv_src >= 0) ? &st_.layers_[static_cast<size_t>(c_.ckv_src)] : nullptr;
  int64_t const T = src ? src->entries : 0;
  bool const use_ckv = T > 0 && c_.has_topk;
  int64_t const nk = n_old + S + (use_ckv ? T : 0);
  float* pool = sc_.get<float>(nk * hd);
  copy(pool, ls.window.get(), static_cast<size_t>(n_old * hd * 4));
  copy(pool + n_old * hd, kv, static_cast<size_t>(S * hd * 4));
  if (use_ckv) copy(pool + (n_old + S) * hd, src->ckv.get(), static_cast<size_t>(T * hd * 4));
  int64_t const K = s.index_topk, cap = S * (W + (use_ckv ? K : 0));
  gpu::KeyListParams kp;
  kp.rows = S;
  kp.pos0 = c_.pos0;
  kp.n_old = n_old;
  kp.wpos0 = st_.length_ - n_old;
  kp.window = W;
  kp.selected = use_ckv ? c_.sel : nullptr;
  kp.top_k = K;
  kp.entries = T;
  kp.offsets = sc_.get<int64_t>(S + 1);
  kp.key_ids = sc_.get<int32_t>(cap);
  if (md == DType::kBf16) {  // the golden engine's logit-row layout (attention_block.cpp)
    kp.key_cols = sc_.get<int32_t>(cap);
    kp.sink_cols = sc_.get<int32_t>(S);
    kp.src_ratio = src ? s.compress_ratios[static_cast<size_t>(c_.ckv_src)] : 0;
  }
  throw_if_error(gpu::build_key_lists(s_, kp));
  // The list length: the CPU backend checks it exactly (host memory); the CUDA backend reads the offsets on
  // the device and takes the capacity as the bound.
  int64_t const nnz = s_.backend == Backend::kCpu ? kp.offsets[S] : cap;
  float* o = sc_.get<float>(S * H * hd);
  float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  run<ops::Attention>(
      ctx_, ops::AttentionDesc{S, H, hd, nk, scale, md},
      ops::AttentionArgs{dcv2(q, S, H * hd), dcv2(pool, nk, hd), TensorView<int64_t const, 1>(kp.offsets, {S + 1}, kDev),
                         TensorView<int32_t const, 1>(kp.key_ids, {nnz}, kDev), dcv1(w.attn_sink), dv2(o, S, H * hd),
                         F2(), TensorView<int32_t const, 1>(kp.key_cols, {kp.key_cols ? nnz : 0}, kDev),
                         TensorView<int32_t const, 1>(kp.sink_cols, {kp.sink_cols ? S : 0}, kDev)});

  // Output (§2.5.6): inverse RoPE with the query's table, grouped wo_a, wo_b.
  rope(o, S, H, hd, c_.d_pos, table, true);
  int64_t const G = s.o_groups, ro = s.o_lora_rank, gw = H * hd / G;
  float* y = sc_.get<float>(S * G * ro);
  for (int64_t g = 0; g < G; ++g) lin(o + g * gw, H * hd, S, w.wo_a, y + g * ro, G * ro, md, g * ro, ro, gw, true);
  lin(y, S, w.wo_b, out, md);

  // Window ring: the last W−1+max_rollback rows of [old window | chunk].
  int64_t const keep = std::min(W - 1 + R, n_old + S);
  ensure(*st_.pool_, ls.window, static_cast<size_t>((W - 1 + R) * hd * 4), 0, s_);
  copy(ls.window.get(), pool + (n_old + S - keep) * hd, static_cast<size_t>(keep * hd * 4));
  ls.n_window = keep;
}

}  // namespace

Status GpuDsv41Model::Impl::forward_one(GpuDsv41State& st, std::span<int32_t const> tokens, int64_t num_logit_rows,
                                        float* logits) {
  ModelSpec const& s = spec;
  int64_t const S = static_cast<int64_t>(tokens.size());
  if (S == 0) return {};
  if (st.length_ + S > s.max_position_embeddings)
    return invalid_argument("forward: sequence would reach " + std::to_string(st.length_ + S) +
                            " positions, beyond max_position_embeddings " + std::to_string(s.max_position_embeddings));
  gpu::Mem const& cs = mem;
  struct Tag {
    Device saved;
    explicit Tag(Device t) : saved(kDev) { kDev = t; }
    ~Tag() { kDev = saved; }
  } tag(mem.tag());
  std::vector<int64_t> const history_before = st.history_;
  try {
    Scratch sc{*pool, {}};
    GChunk c;
    c.S = S;
    c.pos0 = st.length_;
    c.md = md;
    for (int64_t r = 0; r < S; ++r) c.pos.push_back(st.length_ + r);
    Forward f(*this, st, sc, c);
    c.d_pos = f.upload_pos(c.pos);
    int64_t const D = s.hidden_size, n = s.hc_mult, nD = n * D;

    // Engram hash ids of the chunk (host), then the look-back history grows (§2.4.2).
    std::vector<int64_t> hids;
    if (engram.layers > 0) {
      hids = hash_ids(st, tokens);
      for (int32_t t : tokens) st.history_.push_back(engram.token_map[static_cast<size_t>(t)]);
    }

    int32_t* d_tok = sc.get<int32_t>(S);
    throw_if_error(cs.copy(d_tok, tokens.data(), static_cast<size_t>(S) * 4, Copy::kHostToDev));
    float* X = sc.get<float>(S * nD);
    float* X2 = sc.get<float>(S * nD);
    float* pre = sc.get<float>(S * n);
    throw_if_error(gpu::embed_streams(cs, w.embed.f32(), d_tok, S, n, D, X, pre));
    float* h = sc.get<float>(S * D);
    float* xa = sc.get<float>(S * D);
    float* A = sc.get<float>(S * D);
    float* F = sc.get<float>(S * D);
    float* a_pre = sc.get<float>(S * n);
    float* a_post = sc.get<float>(S * n);
    float* a_comb = sc.get<float>(S * n * n);
    float* f_pre = sc.get<float>(S * n);
    float* f_post = sc.get<float>(S * n);
    float* f_comb = sc.get<float>(S * n * n);
    int64_t const K = s.top_k;
    float* rw = sc.get<float>(S * K);
    int32_t* rid = sc.get<int32_t>(S * K);
    ops::MhcMixDesc const mix{S, n, D, static_cast<int>(s.hc_sinkhorn_iters), s.hc_eps, s.rms_eps, md};

    for (int64_t l = 0; l < s.num_layers; ++l) {
      gpu::GpuLayerWeights const& lw = w.layers[static_cast<size_t>(l)];
      int64_t const ei = s.engram_index(l);
      if (ei >= 0) {
        int64_t const C = engram.columns(), de = s.engram_head_dim, Le = engram.layers;
        std::vector<int64_t> ids(static_cast<size_t>(S * C));
        for (int64_t r = 0; r < S; ++r)
          std::copy(hids.begin() + (r * Le + ei) * C, hids.begin() + (r * Le + ei + 1) * C, ids.begin() + r * C);
        int64_t* d_ids = sc.get<int64_t>(S * C);
        throw_if_error(cs.copy(d_ids, ids.data(), ids.size() * 8, Copy::kHostToDev));
        float* rows = sc.get<float>(S * C * de);
        float* kv = sc.get<float>(S * (n + 1) * D);
        run<ops::EngramGather>(
            ctx, ops::EngramGatherDesc{S, C, lw.e_table.rows, de},
            ops::EngramGatherArgs{TensorView<int64_t const, 2>(d_ids, {S, C}, kDev), dcv2(lw.e_table), dv2(rows, S, C * de)});
        f.lin(rows, S, lw.e_wkv, kv, md);
        run<ops::EngramGate>(
            ctx, ops::EngramGateDesc{S, n, D, s.rms_eps, md},
            ops::EngramGateArgs{dcv2(X, S, nD), dcv2(kv, S, (n + 1) * D), dcv1(lw.e_qk.f32(), n * D), dv2(X, S, nD)});
      }
      // Attention site (§2.3): mix of the current streams, collapse with the previous site's pre.
      run<ops::MhcMix>(ctx, mix,
                                       ops::MhcMixArgs{dcv2(X, S, nD), dcv2(lw.hc_attn_fn), dcv1(lw.hc_attn_base),
                                                       dcv1(lw.hc_attn_scale), dv2(a_pre, S, n), dv2(a_post, S, n),
                                                       dv2(a_comb, S, n * n)});
      run<ops::MhcCollapse>(ctx, ops::MhcCollapseDesc{S, n, D, md},
                                            ops::MhcCollapseArgs{dcv2(X, S, nD), dcv2(pre, S, n), dv2(h, S, D)});
      run<ops::RmsNorm>(ctx, ops::RmsNormDesc{S, D, s.rms_eps, true, md},
                                        ops::RmsNormArgs{dcv2(h, S, D), dcv1(lw.attn_norm), dv2(xa, S, D)});
      f.attention(l, xa, A);
      run<ops::MhcExpand>(ctx, ops::MhcExpandDesc{S, n, D, md},
                                          ops::MhcExpandArgs{dcv2(A, S, D), dcv2(X, S, nD), dcv2(a_post, S, n),
                                                             dcv2(a_comb, S, n * n), dv2(X2, S, nD)});
      std::swap(X, X2);
      // FFN site: collapse with the attention site's pre.
      run<ops::MhcMix>(ctx, mix,
                                       ops::MhcMixArgs{dcv2(X, S, nD), dcv2(lw.hc_ffn_fn), dcv1(lw.hc_ffn_base),
                                                       dcv1(lw.hc_ffn_scale), dv2(f_pre, S, n), dv2(f_post, S, n),
                                                       dv2(f_comb, S, n * n)});
      run<ops::MhcCollapse>(ctx, ops::MhcCollapseDesc{S, n, D, md},
                                            ops::MhcCollapseArgs{dcv2(X, S, nD), dcv2(a_pre, S, n), dv2(h, S, D)});
      run<ops::RmsNorm>(ctx, ops::RmsNormDesc{S, D, s.rms_eps, true, md},
                                        ops::RmsNormArgs{dcv2(h, S, D), dcv1(lw.ffn_norm), dv2(xa, S, D)});
      uint8_t* rtie = f.tie_flags(S, CutoffTie::Site::kRouter, l);
      ops::MoeRouteDesc rd{S, s.n_experts, D, K, s.gate_temp, s.routed_scale, s.norm_topk_prob};
      rd.md = md;
      ops::MoeRouteArgs ra{dcv2(xa, S, D), dcv2(lw.gate), dcv1(lw.gate_bias), dv2(rw, S, K),
                           TensorView<int32_t, 2>(rid, {S, K}, kDev), TensorView<uint8_t, 1>(rtie, {S}, kDev), {}};
      if (ExpertPruning const& pr = opts.prune; pr.active()) {  // lossy lever (seed-notes §5), as model.cpp
        bool const decode = S == 1 && c.pos0 > 0;
        if (pr.scope == ExpertPruning::Scope::kAll || decode) {
          rd.prune_top_p = pr.top_p;
          rd.prune_min_k = pr.min_k;
          rd.prune_renorm = pr.renorm;
        }
        if (!expert_masks.empty())
          ra.expert_mask = TensorView<uint8_t const, 1>(static_cast<uint8_t const*>(expert_masks[static_cast<size_t>(l)]),
                                                        {s.n_experts}, kDev);
      }
      run<ops::MoeRoute>(ctx, rd, ra);
      if (route_observer) {
        std::vector<int32_t> hid(static_cast<size_t>(S * K));
        std::vector<float> hw(static_cast<size_t>(S * K));
        throw_if_error(cs.copy(hid.data(), rid, hid.size() * 4, Copy::kDevToHost));
        throw_if_error(cs.copy(hw.data(), rw, hw.size() * 4, Copy::kDevToHost));
        throw_if_error(cs.sync());
        route_observer(l, hid, hw);
      }
      ops::MoeExpertsDesc ed{S, s.n_experts, D, s.moe_inter, K, s.swiglu_limit, true, md};
      ed.weight_dtype = lw.moe.s1.dtype;
      ops::MoeExpertsArgs ma{};
      ma.x = dcv2(xa, S, D);
      ma.ids = TensorView<int32_t const, 2>(rid, {S, K}, kDev);
      ma.weights = dcv2(rw, S, K);
      ma.out = dv2(F, S, D);
      auto* const* table = static_cast<void const* const*>(lw.moe.ptrs);
      ma.dev.w1 = table;
      ma.dev.w3 = table + s.n_experts;
      ma.dev.w2 = table + 2 * s.n_experts;
      ma.dev.shared_w1 = lw.moe.s1.p;
      ma.dev.shared_w3 = lw.moe.s3.p;
      ma.dev.shared_w2 = lw.moe.s2.p;
      std::vector<CF2> hw1, hw3, hw2;  // the CPU backend's views of the same (fp32) weights
      if (mem.backend == Backend::kCpu) {
        for (size_t e = 0; e < lw.moe.w1.size(); ++e) {
          hw1.push_back(dcv2(lw.moe.w1[e]));
          hw3.push_back(dcv2(lw.moe.w3[e]));
          hw2.push_back(dcv2(lw.moe.w2[e]));
        }
        ma.w1 = hw1;
        ma.w3 = hw3;
        ma.w2 = hw2;
        ma.shared_w1 = dcv2(lw.moe.s1);
        ma.shared_w3 = dcv2(lw.moe.s3);
        ma.shared_w2 = dcv2(lw.moe.s2);
      }
      run<ops::MoeExperts>(ctx, ed, ma);
      run<ops::MhcExpand>(ctx, ops::MhcExpandDesc{S, n, D, md},
                                          ops::MhcExpandArgs{dcv2(F, S, D), dcv2(X, S, nD), dcv2(f_post, S, n),
                                                             dcv2(f_comb, S, n * n), dv2(X2, S, nD)});
      std::swap(X, X2);
      std::swap(pre, f_pre);
    }
    // Final collapse with the last site's pre, norm, LM head (§2.7).
    run<ops::MhcCollapse>(ctx, ops::MhcCollapseDesc{S, n, D, md},
                                          ops::MhcCollapseArgs{dcv2(X, S, nD), dcv2(pre, S, n), dv2(h, S, D)});
    run<ops::RmsNorm>(ctx, ops::RmsNormDesc{S, D, s.rms_eps, true, md},
                                      ops::RmsNormArgs{dcv2(h, S, D), dcv1(w.norm), dv2(xa, S, D)});
    if (num_logit_rows > 0) {
      float* d_logits = sc.get<float>(num_logit_rows * s.vocab_size);
      f.lin(xa + (S - num_logit_rows) * D, num_logit_rows, w.lm_head, d_logits, md);
      throw_if_error(cs.copy(logits, d_logits, static_cast<size_t>(num_logit_rows * s.vocab_size) * 4, Copy::kDevToHost));
    }
    // Flags back to the host, in the order the CPU model records them.
    std::vector<std::vector<uint8_t>> host_flags(c.flags.size());
    for (size_t i = 0; i < c.flags.size(); ++i) {
      host_flags[i].resize(c.flags[i].positions.size());
      throw_if_error(cs.copy(host_flags[i].data(), c.flags[i].dev, host_flags[i].size(), Copy::kDevToHost));
    }
    throw_if_error(cs.sync());
    for (size_t i = 0; i < c.flags.size(); ++i) {
      FlagRec const& fr = c.flags[i];
      for (size_t r = 0; r < fr.positions.size(); ++r) {
        if (!host_flags[i][r]) continue;
        if (fr.tie) {
          auto site = static_cast<CutoffTie::Site>(fr.site);
          ++(site == CutoffTie::Site::kIndexer ? st.ties_.indexer : site == CutoffTie::Site::kRouter ? st.ties_.router
                                                                                                       : st.ties_.candidate);
          st.ties_.events.push_back({site, fr.layer, fr.positions[r]});
        } else {
          st.boundaries_.push_back({static_cast<QuantBoundary::Site>(fr.site), fr.layer, fr.positions[r]});
        }
      }
    }
    st.length_ += S;
  } catch (Error const& e) {
    (void)cs.sync();
    st.history_ = history_before;
    return e.status();
  }
  return {};
}

}  // namespace tessera::model::dsv41

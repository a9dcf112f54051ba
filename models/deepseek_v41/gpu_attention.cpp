// SPDX-License-Identifier: Apache-2.0
/// The GPU model's attention sub-block over a pass (gpu_forward.hpp): attention_block.cpp (spec/deepseek-v41.md
/// §2.5) step for step. The projections, RoPE, quantisers, index queries and the output projections run once
/// over every row of the pass, and so does the compressor's pooling (every sequence's completing groups gathered
/// from its raw ring and row slice [row0, row0 + S) of the batched buffers, then pooled in one call); the indexer's scores / candidate blocks / top-k against each sequence's own index keys run
/// once over every row in a decode-sized pass (index_batched) and per sequence otherwise. The key pool (every
/// sequence's window rows in one gather, its compressed entries in one unpack), the key lists and the attention
/// core run once for the pass. The state keeps compressed-KV entries and index keys in the quantisers' packed form
/// (gpu::ckv_entry_bytes, gpu::index_key_bytes); consumers unpack them to exactly the values the quantisers wrote.
#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "models/deepseek_v41/gpu_forward.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/ops/compressor.hpp"
#include "tessera/ops/indexer.hpp"
#include "tessera/ops/qat.hpp"

namespace tessera::model::dsv41::fwd {

namespace {
/// A pass whose sequences all run at most this many rows (decode, draft windows) scores, selects candidate blocks
/// and top-k for every sequence in one call each (Forward::index_batched); longer chunks run per sequence, where
/// IndexScore takes the block tile. Either gives every row the same values.
constexpr int64_t kIndexBatchMaxRows = 4;
/// Whether the configuration lets one call serve every sequence's candidate restriction: no KV source after the
/// candidate source (the released layout: it is the last KV source). After such a source, a sequence's key count
/// may or may not still equal the one its blocks were chosen over, and the per-sequence path decides per sequence.
/// Several sequences' page tables of one row family back to back, for one QatUnpack (`pages` with `row_ids`): a
/// sequence's row e has id add()'s return + e.
struct SharedPageTable {
  std::vector<uint8_t const*> pages;
  int64_t rows_per_page = 0;
  int64_t add(gpu::PagedRows const& stored) {
    if (rows_per_page != 0 && stored.rows_per_page() != rows_per_page)
      throw Error(Status(StatusCode::kInternal, "forward: state rows paged unequally across sequences"));
    rows_per_page = stored.rows_per_page();
    int64_t const base = rows();
    pages.insert(pages.end(), stored.host_table().begin(), stored.host_table().end());
    return base;
  }
  int64_t rows() const { return static_cast<int64_t>(pages.size()) * rows_per_page; }
};

bool index_batch_ok(ModelSpec const& s) {
  for (int64_t l = std::max<int64_t>(s.candidate_source_layer + 1, 0); l < s.num_layers; ++l)
    if (s.candidate_source_layer >= 0 && s.is_kv_source(l)) return false;
  return true;
}
}  // namespace

void Forward::index_batched(int64_t l, std::vector<int64_t> const& T, float const* qi, float const* wts, float scale,
                            std::vector<int32_t> const& seq_of_row) {
  ModelSpec const& s = m_.spec;
  int64_t const N = b_.rows, Hi = s.index_n_heads, di = s.index_head_dim, K = s.index_topk;
  int64_t const ratio = s.compress_ratios[static_cast<size_t>(l)];
  size_t const nseq = b_.seqs.size();
  int64_t const Tmax = *std::max_element(T.begin(), T.end());

  // Every sequence's stored keys as the quantiser's values, back to back, once per source and key counts.
  if (b_.keys_src != b_.idx_src || b_.keys_T != T) {
    std::vector<int64_t> first(nseq, 0);
    int64_t total = 0;
    for (size_t i = 0; i < nseq; ++i) first[i] = total, total += T[i];
    b_.keys = keep_.get<float>(total * di);
    if (ops::qat_packed_row_bytes(gpu::kIndexKeyQat, di) > 0) {
      SharedPageTable table;
      std::vector<int32_t> ids;  // stored row of each unpacked key
      ids.reserve(static_cast<size_t>(total));
      for (size_t i = 0; i < nseq; ++i) {
        if (T[i] == 0) continue;
        int64_t const base = table.add(b_.seqs[i].st->layers_[static_cast<size_t>(b_.idx_src)].index_k);
        if (base + T[i] > INT32_MAX) throw Error(Status(StatusCode::kInternal, "forward: index key ids past int32"));
        for (int64_t e = 0; e < T[i]; ++e) ids.push_back(static_cast<int32_t>(base + e));
      }
      ops::QatUnpackArgs ua;
      ua.row_ids = TensorView<int32_t const, 1>(upload(ids), {total}, kDev);
      ua.out = dv2(b_.keys, total, di);
      ua.pages = upload(table.pages);
      ua.rows_per_page = table.rows_per_page;
      run<ops::QatUnpack>(ctx_, ops::QatUnpackDesc{total, di, table.rows(), gpu::kIndexKeyQat, b_.md}, ua);
    } else {
      for (size_t i = 0; i < nseq; ++i)
        if (T[i] > 0)
          throw_if_error(b_.seqs[i].st->layers_[static_cast<size_t>(b_.idx_src)].index_k.read(s_, T[i], b_.keys + first[i] * di));
    }
    b_.keys_src = b_.idx_src;
    b_.keys_T = T;
    b_.keys_first = std::move(first);
  }
  std::vector<int64_t> key_base(static_cast<size_t>(N), 0);
  for (int64_t r = 0; r < N; ++r) key_base[static_cast<size_t>(r)] = b_.keys_first[static_cast<size_t>(b_.row_seq[static_cast<size_t>(r)])];
  int64_t const key_rows = b_.keys_first.back() + b_.keys_T.back();

  float* scores = tmp_.get<float>(N * Tmax);
  run<ops::IndexScore>(ctx_, ops::IndexScoreDesc{N, Hi, di, Tmax, ratio, scale},
                       ops::IndexScoreArgs{dcv2(qi, N, Hi * di), dcv2(wts, N, Hi), dcv2(b_.keys, key_rows, di),
                                           dpos(b_.d_pos, N), dv2(scores, N, Tmax),
                                           TensorView<int64_t const, 1>(upload(key_base), {N}, kDev)});
  // Candidate blocks (§2.5.4 step 7) of every row; later index sources restrict a sequence's rows to them while
  // its key count is the one they were chosen over.
  TensorView<uint8_t const, 2> mask;
  if (l == s.candidate_source_layer) {
    b_.cand = keep_.get<uint8_t>(N * Tmax);
    b_.cand_cols = Tmax;
    uint8_t* ties = tie_flags_rows(CutoffTie::Site::kCandidateBlocks, Stage::kCandidate, l, seq_of_row);
    run<ops::CandidateBlocks>(
        ctx_, ops::CandidateBlocksDesc{N, Tmax, ratio, s.candidate_block_size, s.candidate_topk_blocks},
        ops::CandidateBlocksArgs{dcv2(scores, N, Tmax), dpos(b_.d_pos, N), TensorView<uint8_t, 2>(b_.cand, {N, Tmax}, kDev),
                                 TensorView<uint8_t, 1>(ties, {N}, kDev)});
    for (size_t i = 0; i < nseq; ++i)
      if (T[i] > 0) b_.seqs[i].has_cand = true, b_.seqs[i].cand = nullptr, b_.seqs[i].cand_T = T[i];
  } else if (s.candidate_source_layer >= 0 && s.candidate_source_layer < l && b_.cand) {
    size_t applies = 0, keyed = 0;
    for (size_t i = 0; i < nseq; ++i) {
      keyed += T[i] > 0;
      applies += T[i] > 0 && b_.seqs[i].has_cand && b_.seqs[i].cand_T == T[i];
    }
    // Without a KV source after the candidate source every later index source scores the key counts the blocks
    // were chosen over (index_batch_ok), so the mask applies to every sequence with keys or to none.
    if (applies == keyed && b_.cand_cols == Tmax) mask = TensorView<uint8_t const, 2>(b_.cand, {N, Tmax}, kDev);
    else if (applies > 0) throw Error(Status(StatusCode::kInternal, "forward: candidate mask of some sequences only"));
  }
  uint8_t* ties = tie_flags_rows(CutoffTie::Site::kIndexer, Stage::kIndexer, l, seq_of_row);
  run<ops::IndexTopK>(ctx_, ops::IndexTopKDesc{N, Tmax, K},
                      ops::IndexTopKArgs{dv2(scores, N, Tmax), mask, TensorView<int32_t, 2>(b_.sel, {N, K}, kDev),
                                         TensorView<uint8_t, 1>(ties, {N}, kDev)});
  for (size_t i = 0; i < nseq; ++i)
    if (T[i] > 0) b_.seqs[i].sel = b_.sel + b_.seqs[i].row0 * K, b_.seqs[i].has_topk = true;
}

void Forward::compress_and_index(int64_t l, float const* xa, float const* q_res) {
  ModelSpec const& s = m_.spec;
  gpu::GpuLayerWeights const& w = m_.w.layers[static_cast<size_t>(l)];
  DType const md = b_.md;
  int64_t const N = b_.rows, hd = s.head_dim;
  int64_t const ratio = s.compress_ratios[static_cast<size_t>(l)];
  int64_t const R = m_.opts.max_rollback, raw_cap = R + ratio;
  bool const kv_source = s.is_kv_source(l);
  LatRows const& lr = b_.lat[static_cast<size_t>(l)];
  size_t const nseq = b_.seqs.size();

  // Compressor (§2.5.3): latents of the groups completing in this pass, pre-RoPE, concatenated by sequence.
  float* lat = nullptr;
  if (kv_source && ratio == 1) {
    // One group per row (entries == length at ratio 1): lr.g0[i] = row0_i.
    if (lr.total != N) throw Error(Status(StatusCode::kInternal, "forward: ratio-1 groups != rows"));
    lat = tmp_.get<float>(N * hd);
    lin(xa, N, w.c_wkv, lat, md);
  } else if (kv_source) {
    // fp32 projections of every row; the raw rings take them at the commit.
    float* pkv = keep_.get<float>(N * hd);
    float* pgate = keep_.get<float>(N * hd);
    lin(xa, N, w.c_wkv, pkv, DType::kF32);
    lin(xa, N, w.c_wgate, pgate, DType::kF32);
    b_.ring_writes.push_back({l, RingWrite::kRawKv, pkv});
    b_.ring_writes.push_back({l, RingWrite::kRawGate, pgate});
    if (lr.total > 0) lat = tmp_.get<float>(lr.total * hd);
    // Every completing group's rows, sequence after sequence (sequence i's from row g0[i]·r): its partial group's
    // n_buf raw rows (positions r·entries .. pos0 − 1, in the ring) then the chunk rows that complete its groups,
    // gathered for every sequence in one launch per ring, then one pooling over every group.
    float* cat_kv = lr.total > 0 ? tmp_.get<float>(lr.total * ratio * hd) : nullptr;
    float* cat_gate = lr.total > 0 ? tmp_.get<float>(lr.total * ratio * hd) : nullptr;
    std::vector<gpu::WindowGather> g_kv, g_gate;
    for (size_t i = 0; i < nseq; ++i) {
      SeqRun& sq = b_.seqs[i];
      gpu::GpuLayerState& ls = sq.st->layers_[static_cast<size_t>(l)];
      size_t const ring_bytes = static_cast<size_t>(raw_cap * hd * 4);
      ensure(*sq.st->pool_, ls.raw_kv, ring_bytes, ls.raw_kv.capacity(), s_);  // exists before the commit
      ensure(*sq.st->pool_, ls.raw_gate, ring_bytes, ls.raw_gate.capacity(), s_);
      int64_t const groups = lr.groups[i];
      if (groups == 0) continue;
      int64_t const p0 = ls.entries * ratio, n_buf = sq.pos0 - p0, take = groups * ratio - n_buf;
      if (n_buf < 0 || take < 0 || take > sq.S)
        throw Error(Status(StatusCode::kInternal, "forward: compressor groups outside the raw rows and the chunk"));
      int64_t const dst = lr.g0[i] * ratio * hd;
      g_kv.push_back({ls.raw_kv.as<float>(), raw_cap, p0, n_buf, pkv + sq.row0 * hd, take, cat_kv + dst});
      g_gate.push_back({ls.raw_gate.as<float>(), raw_cap, p0, n_buf, pgate + sq.row0 * hd, take, cat_gate + dst});
    }
    if (lr.total > 0) {
      throw_if_error(gpu::window_gather(s_, g_kv, hd));
      throw_if_error(gpu::window_gather(s_, g_gate, hd));
      run<ops::CompressPool>(ctx_, ops::CompressPoolDesc{lr.total, ratio, hd, md},
                             ops::CompressPoolArgs{dcv2(cat_kv, lr.total * ratio, hd), dcv2(cat_gate, lr.total * ratio, hd),
                                                   dv2(lat, lr.total, hd)});
    }
  }
  if (lat) norm(lat, lr.total, hd, w.c_norm);

  // Indexer (§2.5.4).
  if (s.is_index_source(l)) {
    int64_t const Hi = s.index_n_heads, di = s.index_head_dim, K = s.index_topk;
    std::vector<int64_t> T(nseq, 0);  // index keys each sequence's queries score
    if (kv_source) {
      if (lat) {
        float* k = tmp_.get<float>(lr.total * di);
        lin(lat, lr.total, w.i_wk, k, md);
        norm(k, lr.total, di, w.i_k_norm);
        rope(k, lr.total, 1, di, lr.d_pos, m_.w.compress_inv_freq, false);
        int64_t const kb = gpu::index_key_bytes(di);
        auto* packed = ops::qat_packed_row_bytes(gpu::kIndexKeyQat, di) ? tmp_.get<uint8_t>(lr.total * kb) : nullptr;
        quant(k, lr.total, di, gpu::kIndexKeyQat, QuantBoundary::Site::kIndexKey, Stage::kIndexKey, l, lr.seq, lr.pos,
              packed);
        auto const* rows = packed ? packed : reinterpret_cast<uint8_t const*>(k);  // stored rows of kb bytes
        for (size_t i = 0; i < nseq; ++i) {
          if (lr.groups[i] == 0) continue;
          gpu::GpuLayerState& ls = b_.seqs[i].st->layers_[static_cast<size_t>(l)];
          append_rows(*b_.seqs[i].st, ls.index_k, kb, ls.entries, lr.groups[i], rows + lr.g0[i] * kb);
        }
      }
      b_.idx_src = l;
      for (size_t i = 0; i < nseq; ++i) T[i] = b_.seqs[i].st->layers_[static_cast<size_t>(l)].entries + lr.groups[i];
    } else if (b_.idx_src >= 0) {
      for (size_t i = 0; i < nseq; ++i) T[i] = b_.seqs[i].st->layers_[static_cast<size_t>(b_.idx_src)].entries;
    }
    if (std::any_of(T.begin(), T.end(), [](int64_t t) { return t > 0; })) {
      // Index queries and head weights of every row; a sequence without keys skips them (no flags either).
      float* qi = tmp_.get<float>(N * Hi * di);
      float* wts = tmp_.get<float>(N * Hi);
      lin(q_res, N, w.i_wq_b, qi, md);
      rope(qi, N, Hi, di, b_.d_pos, m_.w.compress_inv_freq, false);
      std::vector<int32_t> rs = b_.row_seq;
      for (int32_t& r : rs)
        if (T[static_cast<size_t>(r)] == 0) r = -1;
      quant(qi, N, Hi * di, ops::QatKind::kFp4Block32Ue8m0, QuantBoundary::Site::kIndexQuery, Stage::kIndexQuery, l,
            rs, b_.pos);
      lin(xa, N, w.i_weights_proj, wts, md);
      float const hs = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Hi)));
      throw_if_error(gpu::scale_inplace(s_, wts, N * Hi, hs));
      float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(di)));
      bool const batched = nseq > 1 && index_batch_ok(s) &&
                           std::all_of(b_.seqs.begin(), b_.seqs.end(), [](SeqRun const& q) { return q.S <= kIndexBatchMaxRows; });
      if (batched) index_batched(l, T, qi, wts, scale, rs);
      for (size_t i = 0; i < (batched ? 0 : nseq); ++i) {
        int64_t const Ti = T[i];
        if (Ti == 0) continue;
        SeqRun& sq = b_.seqs[i];
        int64_t const S = sq.S;
        int64_t const* d_pos = b_.d_pos + sq.row0;
        if (sq.keys_src != b_.idx_src || sq.keys_T != Ti) {  // the stored keys as the quantiser's values
          sq.keys = keep_.get<float>(Ti * di);
          sq.keys_src = b_.idx_src;
          sq.keys_T = Ti;
          unpack_rows(sq.st->layers_[static_cast<size_t>(b_.idx_src)].index_k, Ti, di, gpu::kIndexKeyQat, nullptr, Ti,
                      sq.keys);
        }
        float const* keys = sq.keys;
        size_t const mk = tmp_.mark();
        float* scores = tmp_.get<float>(S * Ti);
        run<ops::IndexScore>(ctx_, ops::IndexScoreDesc{S, Hi, di, Ti, ratio, scale},
                             ops::IndexScoreArgs{dcv2(qi + sq.row0 * Hi * di, S, Hi * di), dcv2(wts + sq.row0 * Hi, S, Hi),
                                                 dcv2(keys, Ti, di), dpos(d_pos, S), dv2(scores, S, Ti)});
        TensorView<uint8_t const, 2> mask;
        if (l == s.candidate_source_layer) {
          sq.cand = keep_.get<uint8_t>(S * Ti);
          uint8_t* ties = tie_flags(static_cast<int64_t>(i), CutoffTie::Site::kCandidateBlocks, Stage::kCandidate, l);
          run<ops::CandidateBlocks>(
              ctx_, ops::CandidateBlocksDesc{S, Ti, ratio, s.candidate_block_size, s.candidate_topk_blocks},
              ops::CandidateBlocksArgs{dcv2(scores, S, Ti), dpos(d_pos, S), TensorView<uint8_t, 2>(sq.cand, {S, Ti}, kDev),
                                       TensorView<uint8_t, 1>(ties, {S}, kDev)});
          sq.has_cand = true;
          sq.cand_T = Ti;
        } else if (s.candidate_source_layer >= 0 && s.candidate_source_layer < l && sq.has_cand && sq.cand_T == Ti) {
          mask = TensorView<uint8_t const, 2>(sq.cand, {S, Ti}, kDev);
        }
        sq.sel = b_.sel + sq.row0 * K;
        uint8_t* ties = tie_flags(static_cast<int64_t>(i), CutoffTie::Site::kIndexer, Stage::kIndexer, l);
        run<ops::IndexTopK>(ctx_, ops::IndexTopKDesc{S, Ti, K},
                            ops::IndexTopKArgs{dv2(scores, S, Ti), mask, TensorView<int32_t, 2>(sq.sel, {S, K}, kDev),
                                               TensorView<uint8_t, 1>(ties, {S}, kDev)});
        sq.has_topk = true;
        tmp_.release(mk);
      }
    }
  }

  // Compressed KV cache: RoPE at each group's first position, FP4 with e4m3 scales (§2.5.3), appended
  // beyond each state's entries (a failed pass restores the count).
  if (lat) {
    rope(lat, lr.total, 1, hd, lr.d_pos, m_.w.compress_inv_freq, false);
    int64_t const eb = gpu::ckv_entry_bytes(hd);
    auto* packed = ops::qat_packed_row_bytes(gpu::kCkvQat, hd) ? tmp_.get<uint8_t>(lr.total * eb) : nullptr;
    quant(lat, lr.total, hd, gpu::kCkvQat, QuantBoundary::Site::kCompressedKv, Stage::kCompressedKv, l, lr.seq, lr.pos,
          packed);
    auto const* rows = packed ? packed : reinterpret_cast<uint8_t const*>(lat);  // stored rows of eb bytes
    for (size_t i = 0; i < nseq; ++i) {
      int64_t const groups = lr.groups[i];
      if (groups == 0) continue;
      GpuDsv41State& st = *b_.seqs[i].st;
      gpu::GpuLayerState& ls = st.layers_[static_cast<size_t>(l)];
      append_rows(st, ls.ckv, eb, ls.entries, groups, rows + lr.g0[i] * eb);
      ls.entries += groups;
    }
  }
  if (kv_source) b_.ckv_src = l;
}

void Forward::attention(int64_t l, float const* xa, float* out) {
  ModelSpec const& s = m_.spec;
  gpu::GpuLayerWeights const& w = m_.w.layers[static_cast<size_t>(l)];
  DType const md = b_.md;
  int64_t const N = b_.rows, H = query_heads(), hd = s.head_dim, qr = s.q_lora_rank;
  int64_t const ratio = s.compress_ratios[static_cast<size_t>(l)];
  DevTensor const& table = ratio ? m_.w.compress_inv_freq : m_.w.main_inv_freq;
  int64_t const W = s.sliding_window, w_cap = W - 1 + m_.opts.max_rollback;

  // Projections (§2.5.2), every row.
  float* q_res = tmp_.get<float>(N * qr);
  float* q = tmp_.get<float>(N * H * hd);
  float* kv = keep_.get<float>(N * hd);  // the window rings take these rows at the commit
  lin_shared_x(xa, N, {{&w.wq_a, q_res}, {&w.wkv, kv}}, md);  // one launch: the two chains overlap
  norm(q_res, N, qr, w.q_norm);
  lin(q_res, N, w.wq_b, q, md);
  rope(q, N, H, hd, b_.d_pos, table, false);
  norm(kv, N, hd, w.kv_norm);
  rope(kv, N, 1, hd, b_.d_pos, table, false);
  quant(kv, N, hd, ops::QatKind::kFp8Block32, QuantBoundary::Site::kWindowKv, Stage::kWindowKv, l, b_.row_seq, b_.pos);
  b_.ring_writes.push_back({l, RingWrite::kWindow, kv});

  if (ratio > 0) compress_and_index(l, xa, q_res);

  // Key pool [old window rows | chunk rows | compressed entries] and key lists per sequence (§2.5.5), each at its
  // own base in pass-wide arrays, then one attention launch over every row of the pass: the kernels are
  // row-invariant, so a row's output is what its sequence's own launch gives.
  float* o = tmp_.get<float>(N * H * hd);
  float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  int64_t const K = s.index_topk;
  struct SeqKeys {
    int64_t n_old, T, nk, cap, pool0, slot0;
    bool use_ckv, compact;
    gpu::GpuLayerState const* src;
  };
  std::vector<SeqKeys> sk;
  sk.reserve(b_.seqs.size());
  int64_t pool_rows = 0, slots = 0;
  bool any_ckv = false;
  for (SeqRun& sq : b_.seqs) {
    GpuDsv41State& st = *sq.st;
    gpu::GpuLayerState& ls = st.layers_[static_cast<size_t>(l)];
    ensure(*st.pool_, ls.window, static_cast<size_t>(w_cap * hd * 4), ls.window.capacity(), s_);  // exists before the commit
    int64_t const S = sq.S, n_old = ls.n_window;
    gpu::GpuLayerState const* src = (ratio > 0 && b_.ckv_src >= 0) ? &st.layers_[static_cast<size_t>(b_.ckv_src)] : nullptr;
    int64_t const T = src ? src->entries : 0;
    bool const use_ckv = T > 0 && sq.has_topk;
    // Compact pool: with packed entries and fewer selection slots than entries (decode at long context), the
    // pool holds each row's selected entries only (KeyListParams::gather); else all T entries.
    bool const compact = use_ckv && ops::qat_packed_row_bytes(gpu::kCkvQat, hd) > 0 && S * K < T;
    int64_t const n_ckv = !use_ckv ? 0 : compact ? S * K : T;
    int64_t const nk = n_old + S + n_ckv, cap = S * (W + (use_ckv ? K : 0));
    sk.push_back({n_old, T, nk, cap, pool_rows, slots, use_ckv, compact, src});
    pool_rows += nk;
    slots += cap;
    any_ckv = any_ckv || use_ckv;
  }
  size_t const mk = tmp_.mark();
  float* pool = tmp_.get<float>(pool_rows * hd);
  int32_t* key_ids = tmp_.get<int32_t>(slots);
  int64_t* row_begin = tmp_.get<int64_t>(N);
  int64_t* row_end = tmp_.get<int64_t>(N);
  int32_t* key_cols = md == DType::kBf16 ? tmp_.get<int32_t>(slots) : nullptr;  // the golden engine's logit-row
  int32_t* sink_cols = md == DType::kBf16 ? tmp_.get<int32_t>(N) : nullptr;     // layout (attention_block.cpp)
  // Each sequence's pool [old window rows | chunk rows | all T entries unpacked, or its rows' selections]: the window
  // rows of every sequence in one batched gather, then every sequence's key lists in one batched build (row r of a
  // sequence at its slot r·row_cap) with the unpack lists of their compressed parts, then one unpack of every
  // sequence's stored entries through their page tables placed back to back.
  bool const packed = ops::qat_packed_row_bytes(gpu::kCkvQat, hd) > 0;
  SharedPageTable pool_pages;  // every packed pool's pages
  int64_t n_unpack = 0;
  std::vector<int64_t> unpack0(b_.seqs.size(), 0), unpack_base(b_.seqs.size(), 0);
  if (packed)
    for (size_t i = 0; i < b_.seqs.size(); ++i) {
      SeqKeys const& k = sk[i];
      if (!k.use_ckv) continue;
      unpack_base[i] = pool_pages.add(k.src->ckv);
      unpack0[i] = n_unpack;
      n_unpack += k.compact ? b_.seqs[i].S * K : k.T;
    }
  int32_t* unpack_src = n_unpack ? tmp_.get<int32_t>(n_unpack) : nullptr;
  int32_t* unpack_dst = n_unpack ? tmp_.get<int32_t>(n_unpack) : nullptr;
  std::vector<gpu::KeyListParams> kps(b_.seqs.size());
  std::vector<gpu::WindowGather> gathers(b_.seqs.size());
  for (size_t i = 0; i < b_.seqs.size(); ++i) {
    SeqRun& sq = b_.seqs[i];
    SeqKeys const& k = sk[i];
    gpu::GpuLayerState& ls = sq.st->layers_[static_cast<size_t>(l)];
    int64_t const S = sq.S, n_old = k.n_old;
    float* const seq_pool = pool + k.pool0 * hd;
    gathers[i] = {ls.window.as<float>(), w_cap, sq.pos0 - n_old, n_old, kv + sq.row0 * hd, S, seq_pool};
    if (k.use_ckv && !packed) unpack_rows(k.src->ckv, k.T, hd, gpu::kCkvQat, nullptr, k.T, seq_pool + (n_old + S) * hd);
    gpu::KeyListParams& kp = kps[i];
    kp.rows = S;
    kp.pos0 = sq.pos0;
    kp.n_old = n_old;
    kp.wpos0 = sq.pos0 - n_old;
    kp.window = W;
    kp.selected = k.use_ckv ? sq.sel : nullptr;
    kp.top_k = K;
    kp.entries = k.T;
    kp.row_cap = W + (k.use_ckv ? K : 0);  // cap = S·row_cap slots from slot0
    kp.key_ids = key_ids + k.slot0;
    if (key_cols) {
      kp.key_cols = key_cols + k.slot0;
      kp.sink_cols = sink_cols + sq.row0;
      kp.src_ratio = k.src ? s.compress_ratios[static_cast<size_t>(b_.ckv_src)] : 0;
    }
    if (k.compact) kp.gather = tmp_.get<int32_t>(S * K);
    if (k.use_ckv && packed) {
      kp.unpack_src = unpack_src + unpack0[i];
      kp.unpack_dst = unpack_dst + unpack0[i];
      kp.unpack_base = unpack_base[i];
    }
    kp.id_base = k.pool0;
    kp.slot_base = k.slot0;
    kp.row_begin = row_begin + sq.row0;
    kp.row_end = row_end + sq.row0;
  }
  throw_if_error(gpu::window_gather(s_, gathers, hd));
  throw_if_error(gpu::build_key_lists_batched(s_, kps));
  if (n_unpack > 0) {
    ops::QatUnpackArgs ua;
    ua.row_ids = TensorView<int32_t const, 1>(unpack_src, {n_unpack}, kDev);
    ua.out_rows = TensorView<int32_t const, 1>(unpack_dst, {n_unpack}, kDev);
    ua.out = dv2(pool, pool_rows, hd);
    ua.pages = upload(pool_pages.pages);
    ua.rows_per_page = pool_pages.rows_per_page;
    run<ops::QatUnpack>(ctx_, ops::QatUnpackDesc{n_unpack, hd, pool_pages.rows(), gpu::kCkvQat, md}, ua);
  }
  ops::AttentionArgs aa{dcv2(q, N, H * hd), dcv2(pool, pool_rows, hd), TensorView<int64_t const, 1>(row_begin, {N}, kDev),
                        TensorView<int32_t const, 1>(key_ids, {slots}, kDev), dcv1(w.attn_sink), dv2(o, N, H * hd), F2(),
                        TensorView<int32_t const, 1>(key_cols, {key_cols ? slots : 0}, kDev),
                        TensorView<int32_t const, 1>(sink_cols, {sink_cols ? N : 0}, kDev)};
  aa.row_ends = TensorView<int64_t const, 1>(row_end, {N}, kDev);
  // A row's bound: window + top-k (the largest over the pass's sequences).
  run<ops::Attention>(ctx_, ops::AttentionDesc{N, H, hd, pool_rows, scale, md, W + (any_ckv ? K : 0)}, aa);
  tmp_.release(mk);

  // Output (§2.5.6), every row: inverse RoPE with the query's table, grouped wo_a, wo_b.
  rope(o, N, H, hd, b_.d_pos, table, true);
  if (m_.shard) {
    shard_attention_out(l, o, out);  // the rank's heads: its groups and the plan's combine
    return;
  }
  int64_t const G = s.o_groups, ro = s.o_lora_rank, gw = H * hd / G;
  float* y = tmp_.get<float>(N * G * ro);
  lin(o, H * hd, N, w.wo_a, y, G * ro, md, 0, ro, gw, true, G);  // the G groups in one call
  lin(y, N, w.wo_b, out, md);
}

}  // namespace tessera::model::dsv41::fwd

// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the indexer family (include/tessera/ops/indexer.hpp, spec/deepseek-v41.md §2.5.4),
/// the arithmetic and selections of ref/indexer_ref.hpp:
///   IndexScore       score[s, j] = Σ_h (relu(q_{s,h}·k_j)·scale)·w[s,h] (h ascending, the dot one sequential
///                    FMA chain, fma_step), −inf for j ≥ (pos_s + 1) // r. Bit-equal to the CPU backend. Two
///                    kernels with the same per-output operations: below kScoreTileMinRows rows (decode), and for
///                    rows of several sequences (key_base), one thread per (row, entry) with the block's query row and
///                    weights in shared memory; from there on (prefill) a 32-row × 64-entry block tile, the tile's keys
///                    staged once and each head's 32 query rows in turn, every thread holding 4 × 4 chains
///                    (index_score_tile_kernel).
///   CandidateBlocks  block maxima of Bc entries (the block (vis − 1) // Bc forced to +inf), the
///                    min(topk_blocks, #blocks) best blocks > −inf kept (topk_select.cuh), entry mask.
///   IndexTopK        scores outside the mask set to −inf (in place, as the CPU backend does), the K best
///                    finite scores by (value desc, index asc), sorted by a bitonic network over unique
///                    (key, index) pairs in shared memory, −1 padded.
/// One block per query row for the selections: a row's result depends only on that row.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/indexer/topk_select.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/device/arith.cuh"
#include "tessera/device/op_launch.cuh"
#include "tessera/ops/indexer.hpp"

namespace tessera::kernels::indexer {

namespace {

constexpr int kScoreThreads = 128;

struct ScoreParams {
  float const* q = nullptr;          // [rows, heads·di]
  float const* weights = nullptr;    // [rows, heads]
  float const* keys = nullptr;       // [entries, di]
  int64_t const* key_base = nullptr;  // [rows] or null: row r's key j at keys row key_base[r] + j (per-row kernel)
  int64_t const* positions = nullptr;  // [rows]
  float* scores = nullptr;           // [rows, entries]
  int64_t rows = 0, heads = 0, di = 0, entries = 0, ratio = 1, tiles = 0;
  float scale = 0.f;
  bool vec4 = false;
};

/// grid rows · tiles, block kScoreThreads; dynamic smem (heads·di + heads) floats.
__global__ void __launch_bounds__(kScoreThreads, 1) index_score_kernel(ScoreParams const p) {
  device::pdl_enter();
  extern __shared__ float sm[];
  int64_t const row = blockIdx.x / p.tiles, tile = blockIdx.x % p.tiles;
  int64_t const j0 = tile * kScoreThreads, j = j0 + threadIdx.x;
  int64_t const visible = (p.positions[row] + 1) / p.ratio;
  float* srow = p.scores + row * p.entries;
  if (j0 >= visible) {   // the whole tile is in the future of this query
    if (j < p.entries) srow[j] = -INFINITY;
    return;
  }
  float* qs = sm;
  float* ws = sm + p.heads * p.di;
  for (int64_t i = threadIdx.x; i < p.heads * p.di; i += kScoreThreads) qs[i] = p.q[row * p.heads * p.di + i];
  for (int64_t i = threadIdx.x; i < p.heads; i += kScoreThreads) ws[i] = p.weights[row * p.heads + i];
  __syncthreads();
  if (j >= p.entries) return;
  if (j >= visible) {
    srow[j] = -INFINITY;
    return;
  }
  float const* kj = p.keys + ((p.key_base ? p.key_base[row] : 0) + j) * p.di;
  float acc = 0.f;
  for (int64_t h = 0; h < p.heads; ++h) {
    float const d = device::fma_dot_row(qs + h * p.di, kj, p.di, p.vec4);
    float const r = d > 0.f ? d : 0.f;
    acc = device::dot_step(acc, __fmul_rn(r, p.scale), ws[h]);
  }
  srow[j] = acc;
}

// ---- IndexScore, block tile: 32 rows × 64 entries, 128 threads, each thread rows tr + 8·i (i < 4) and entries
// tk + 16·jj (jj < 4) of the tile (tr = tid / 16, tk = tid % 16). Shared memory: the tile's keys [64][di + 4], one
// head's query rows [32][di + 4] (a 16-byte pad per row: the 8 threads of an LDS.128 phase read 8 consecutive key
// rows, 16-byte units 33·t mod 8 apart, conflict-free), the rows' weights [32][heads]. Per head, output (r, j) runs
// its own FMA chain over d in order from +0 (fma_dot_row's), then its score takes relu·scale·w (dot_step) in head
// order: the one-thread kernel's operations, so the same bits. Requires di % 4 == 0 and 16-byte aligned q and keys.
constexpr int kTileRows = 32, kTileEntries = 64, kTileThreads = 128;
constexpr int64_t kScoreTileMinRows = 8;

inline size_t score_tile_smem_bytes(int64_t heads, int64_t di) {
  return static_cast<size_t>((kTileRows + kTileEntries) * (di + 4) + kTileRows * heads) * sizeof(float);
}

/// grid (⌈entries/64⌉, ⌈rows/32⌉), block kTileThreads, dynamic smem score_tile_smem_bytes.
__global__ void __launch_bounds__(kTileThreads) index_score_tile_kernel(ScoreParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) float tile_sm[];
  int64_t const ld = p.di + 4;
  float* const ks = tile_sm;                       // [64][ld]
  float* const qs = ks + kTileEntries * ld;        // [32][ld]
  float* const ws = qs + kTileRows * ld;           // [32][heads]
  int const tid = static_cast<int>(threadIdx.x), tr = tid / 16, tk = tid % 16;
  int64_t const j0 = static_cast<int64_t>(blockIdx.x) * kTileEntries, r0 = static_cast<int64_t>(blockIdx.y) * kTileRows;
  int const nr = static_cast<int>(p.rows - r0 < kTileRows ? p.rows - r0 : kTileRows);
  int64_t vis[4];
  int64_t vis_max = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int const r = tr + 8 * i;
    vis[i] = r < nr ? (p.positions[r0 + r] + 1) / p.ratio : 0;
  }
  for (int r = 0; r < nr; ++r) {  // block-uniform: the tile's furthest visible entry
    int64_t const v = (p.positions[r0 + r] + 1) / p.ratio;
    vis_max = v > vis_max ? v : vis_max;
  }
  auto store = [&](float const (&sc)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int const r = tr + 8 * i;
      if (r >= nr) continue;
      float* const srow = p.scores + (r0 + r) * p.entries;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        int64_t const j = j0 + tk + 16 * jj;
        if (j < p.entries) srow[j] = j < vis[i] ? sc[i][jj] : -INFINITY;
      }
    }
  };
  float score[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) score[i][jj] = 0.f;
  if (j0 >= vis_max) {  // the whole tile is in the future of every row
    store(score);
    return;
  }
  int const q4 = static_cast<int>(p.di / 4);
  for (int e = tid; e < kTileEntries * q4; e += kTileThreads) {  // keys: rows past the entries as +0
    int const jr = e / q4, c = e % q4;
    float4 const v = j0 + jr < p.entries ? *reinterpret_cast<float4 const*>(p.keys + (j0 + jr) * p.di + 4 * c)
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<float4*>(ks + jr * ld + 4 * c) = v;
  }
  for (int64_t e = tid; e < kTileRows * p.heads; e += kTileThreads) {
    int64_t const r = e / p.heads, h = e % p.heads;
    ws[e] = r < nr ? p.weights[(r0 + r) * p.heads + h] : 0.f;
  }
  for (int64_t h = 0; h < p.heads; ++h) {
    __syncthreads();  // the previous head's rows are consumed (and, at h = 0, the keys and weights are in place)
    for (int e = tid; e < kTileRows * q4; e += kTileThreads) {
      int const r = e / q4, c = e % q4;
      float4 const v = r < nr ? *reinterpret_cast<float4 const*>(p.q + (r0 + r) * p.heads * p.di + h * p.di + 4 * c)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(qs + r * ld + 4 * c) = v;
    }
    __syncthreads();
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) acc[i][jj] = 0.f;
    for (int c = 0; c < q4; ++c) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<float4 const*>(qs + (tr + 8 * i) * ld + 4 * c);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) kv[jj] = *reinterpret_cast<float4 const*>(ks + (tk + 16 * jj) * ld + 4 * c);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          float a = acc[i][jj];
          a = device::fma_step(a, qv[i].x, kv[jj].x);
          a = device::fma_step(a, qv[i].y, kv[jj].y);
          a = device::fma_step(a, qv[i].z, kv[jj].z);
          acc[i][jj] = device::fma_step(a, qv[i].w, kv[jj].w);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float const wv = ws[(tr + 8 * i) * p.heads + h];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        float const d = acc[i][jj];
        float const r = d > 0.f ? d : 0.f;
        score[i][jj] = device::dot_step(score[i][jj], __fmul_rn(r, p.scale), wv);
      }
    }
  }
  store(score);
}

struct CandParams {
  float const* scores = nullptr;       // [rows, entries]
  int64_t const* positions = nullptr;  // [rows]
  uint8_t* mask = nullptr;             // [rows, entries]
  uint8_t* cutoff_tie = nullptr;       // [rows]
  int64_t rows = 0, entries = 0, ratio = 1, block = 1, topk_blocks = 1;
};

/// grid rows, block kTopkThreads.
__global__ void __launch_bounds__(kTopkThreads) candidate_blocks_kernel(CandParams const p) {
  device::pdl_enter();
  __shared__ TopkShared sh;
  int64_t const row = blockIdx.x;
  float const* s = p.scores + row * p.entries;
  uint8_t* m = p.mask + row * p.entries;
  int64_t const nb = (p.entries + p.block - 1) / p.block;
  int64_t const visible = (p.positions[row] + 1) / p.ratio;
  int64_t const forced = visible > 0 ? (visible - 1) / p.block : -1;
  auto get = [&](int64_t b) -> float {
    if (b == forced) return INFINITY;
    float mx = -INFINITY;
    int64_t const e = (b + 1) * p.block < p.entries ? (b + 1) * p.block : p.entries;
    for (int64_t j = b * p.block; j < e; ++j) mx = fmaxf(mx, s[j]);
    return mx;
  };
  int64_t const k = p.topk_blocks < nb ? p.topk_blocks : nb;
  TopkCut const cut = topk_cut(nb, k, get, sh);
  auto emit = [&](int64_t b, bool sel, int32_t) {
    int64_t const e = (b + 1) * p.block < p.entries ? (b + 1) * p.block : p.entries;
    for (int64_t j = b * p.block; j < e; ++j) m[j] = sel ? 1 : 0;
  };
  topk_emit(nb, cut, get, emit, sh);
  if (threadIdx.x == 0) p.cutoff_tie[row] = cut.tie ? 1 : 0;
}

struct TopkParams {
  float* scores = nullptr;            // [rows, entries]
  uint8_t const* mask = nullptr;      // [rows, entries] or null
  int32_t* selected = nullptr;        // [rows, top_k]
  uint8_t* cutoff_tie = nullptr;      // [rows]
  int64_t rows = 0, entries = 0, top_k = 1;
  int32_t sort_len = 1;               // power of two ≥ min(top_k, entries)
};

/// grid rows, block kTopkThreads; dynamic smem sort_len · (uint32 key + int32 index).
__global__ void __launch_bounds__(kTopkThreads) index_topk_kernel(TopkParams const p) {
  device::pdl_enter();
  __shared__ TopkShared sh;
  extern __shared__ uint32_t sort_s[];
  uint32_t* skey = sort_s;
  int32_t* sidx = reinterpret_cast<int32_t*>(sort_s + p.sort_len);
  int const tid = threadIdx.x;
  int64_t const row = blockIdx.x;
  float* s = p.scores + row * p.entries;
  uint8_t const* m = p.mask ? p.mask + row * p.entries : nullptr;
  auto get = [&](int64_t j) -> float { return (m && !m[j]) ? -INFINITY : s[j]; };

  for (int i = tid; i < p.sort_len; i += kTopkThreads) {
    skey[i] = 0u;          // below every eligible key (the key of −inf is 0x007fffff)
    sidx[i] = INT32_MAX;
  }
  TopkCut const cut = topk_cut(p.entries, p.top_k, get, sh);
  auto emit = [&](int64_t j, bool sel, int32_t rank) {
    if (sel) {
      skey[rank] = order_key(s[j]);
      sidx[rank] = static_cast<int32_t>(j);
    }
  };
  topk_emit(p.entries, cut, get, emit, sh);
  __syncthreads();
  // Bitonic sort into "better first": (key desc, index asc); pairs are unique, so the order is total.
  for (int size = 2; size <= p.sort_len; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < p.sort_len; i += kTopkThreads) {
        int const jx = i ^ stride;
        if (jx <= i) continue;
        bool const j_better = skey[jx] > skey[i] || (skey[jx] == skey[i] && sidx[jx] < sidx[i]);
        bool const up = (i & size) == 0;
        if (up == j_better) {
          uint32_t const tk = skey[i];
          skey[i] = skey[jx];
          skey[jx] = tk;
          int32_t const ti = sidx[i];
          sidx[i] = sidx[jx];
          sidx[jx] = ti;
        }
      }
      __syncthreads();
    }
  }
  int32_t* out = p.selected + row * p.top_k;
  for (int64_t i = tid; i < p.top_k; i += kTopkThreads) out[i] = i < cut.take ? sidx[i] : -1;
  if (m)
    for (int64_t j = tid; j < p.entries; j += kTopkThreads)
      if (!m[j]) s[j] = -INFINITY;
  if (tid == 0) p.cutoff_tie[row] = cut.tie ? 1 : 0;
}

}  // namespace

}  // namespace tessera::kernels::indexer

namespace tessera::ops {

static_assert(BackendOp<IndexScore<Backend::kCuda>, IndexScoreDesc, IndexScoreArgs>);
static_assert(BackendOp<CandidateBlocks<Backend::kCuda>, CandidateBlocksDesc, CandidateBlocksArgs>);
static_assert(BackendOp<IndexTopK<Backend::kCuda>, IndexTopKDesc, IndexTopKArgs>);

Status IndexScore<Backend::kCuda>::check(IndexScoreDesc const& d, IndexScoreArgs const& a) {
  TESSERA_CHECK(d.ratio >= 1, "index_score ratio must be >= 1");
  TESSERA_CHECK(d.rows >= 0 && d.heads >= 1 && d.head_dim >= 1 && d.entries >= 0, "index_score: bad sizes in desc");
  TESSERA_TRY(check_shape(a.q, {d.rows, d.heads * d.head_dim}, "index_score q"));
  TESSERA_TRY(check_shape(a.weights, {d.rows, d.heads}, "index_score weights"));
  TESSERA_TRY(check_index_score_keys(d, a));
  TESSERA_TRY(check_shape(a.positions, {d.rows}, "index_score positions"));
  TESSERA_TRY(check_shape(a.scores, {d.rows, d.entries}, "index_score scores"));
  if (a.key_base.data) TESSERA_TRY(device::check_on_device(a.key_base, "index_score key_base"));
  TESSERA_TRY(device::check_on_device(a.q, "index_score q"));
  TESSERA_TRY(device::check_on_device(a.weights, "index_score weights"));
  TESSERA_TRY(device::check_on_device(a.keys, "index_score keys"));
  TESSERA_TRY(device::check_on_device(a.positions, "index_score positions"));
  return device::check_on_device(a.scores, "index_score scores");
}

Status IndexScore<Backend::kCuda>::run(IndexScoreDesc const& d, IndexScoreArgs const& a, ExecContext& ctx) {
  namespace k = kernels::indexer;
  if (d.rows == 0 || d.entries == 0) return {};
  k::ScoreParams p;
  p.q = a.q.data;
  p.weights = a.weights.data;
  p.keys = a.keys.data;
  p.key_base = a.key_base.data;
  p.positions = a.positions.data;
  p.scores = a.scores.data;
  p.rows = d.rows;
  p.heads = d.heads;
  p.di = d.head_dim;
  p.entries = d.entries;
  p.ratio = d.ratio;
  p.tiles = (d.entries + k::kScoreThreads - 1) / k::kScoreThreads;
  p.scale = d.scale;
  p.vec4 = d.head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(a.keys.data) % 16 == 0;
  size_t const tile_smem = k::score_tile_smem_bytes(d.heads, d.head_dim);
  if (!p.key_base && d.rows >= k::kScoreTileMinRows && p.vec4 && reinterpret_cast<uintptr_t>(a.q.data) % 16 == 0 &&
      tile_smem <= device::smem_optin_bytes(ctx)) {
    TESSERA_TRY(device::allow_dynamic_smem(k::index_score_tile_kernel, tile_smem, ctx, "index_score tile (CUDA)"));
    int64_t const gx = (d.entries + k::kTileEntries - 1) / k::kTileEntries, gy = (d.rows + k::kTileRows - 1) / k::kTileRows;
    TESSERA_CHECK(gx < (int64_t{1} << 31) && gy <= 65535, "index_score (CUDA): rows·entries exceeds the grid");
    device::launch_pdl(k::index_score_tile_kernel, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
                       k::kTileThreads, tile_smem, ctx.stream, p);
    return device::launch_status("index_score tile (CUDA) kernel");
  }
  size_t const smem = static_cast<size_t>(d.heads * d.head_dim + d.heads) * sizeof(float);
  TESSERA_TRY(device::allow_dynamic_smem(k::index_score_kernel, smem, ctx, "index_score (CUDA)"));
  int64_t const blocks = d.rows * p.tiles;
  TESSERA_CHECK(blocks < (int64_t{1} << 31), "index_score (CUDA): rows·entries exceeds the grid");
  device::launch_pdl(k::index_score_kernel, static_cast<unsigned>(blocks), k::kScoreThreads, smem, ctx.stream, p);
  return device::launch_status("index_score (CUDA) kernel");
}

Status CandidateBlocks<Backend::kCuda>::check(CandidateBlocksDesc const& d, CandidateBlocksArgs const& a) {
  TESSERA_CHECK(d.block_size >= 1 && d.topk_blocks >= 1 && d.ratio >= 1, "candidate_blocks sizes must be >= 1");
  TESSERA_CHECK(d.rows >= 0 && d.entries >= 0, "candidate_blocks: bad sizes in desc");
  TESSERA_TRY(check_shape(a.scores, {d.rows, d.entries}, "candidate_blocks scores"));
  TESSERA_TRY(check_shape(a.positions, {d.rows}, "candidate_blocks positions"));
  TESSERA_TRY(check_shape(a.mask, {d.rows, d.entries}, "candidate_blocks mask"));
  TESSERA_TRY(check_shape(a.cutoff_tie, {d.rows}, "candidate_blocks cutoff_tie"));
  TESSERA_TRY(device::check_on_device(a.scores, "candidate_blocks scores"));
  TESSERA_TRY(device::check_on_device(a.positions, "candidate_blocks positions"));
  TESSERA_TRY(device::check_on_device(a.mask, "candidate_blocks mask"));
  return device::check_on_device(a.cutoff_tie, "candidate_blocks cutoff_tie");
}

Status CandidateBlocks<Backend::kCuda>::run(CandidateBlocksDesc const& d, CandidateBlocksArgs const& a,
                                            ExecContext& ctx) {
  namespace k = kernels::indexer;
  if (d.rows == 0) return {};
  k::CandParams p;
  p.scores = a.scores.data;
  p.positions = a.positions.data;
  p.mask = a.mask.data;
  p.cutoff_tie = a.cutoff_tie.data;
  p.rows = d.rows;
  p.entries = d.entries;
  p.ratio = d.ratio;
  p.block = d.block_size;
  p.topk_blocks = d.topk_blocks;
  device::launch_pdl(k::candidate_blocks_kernel, static_cast<unsigned>(d.rows), k::kTopkThreads, 0, ctx.stream, p);
  return device::launch_status("candidate_blocks (CUDA) kernel");
}

Status IndexTopK<Backend::kCuda>::check(IndexTopKDesc const& d, IndexTopKArgs const& a) {
  TESSERA_CHECK(d.top_k >= 1, "index_topk top_k must be >= 1");
  TESSERA_CHECK(d.rows >= 0 && d.entries >= 0, "index_topk: bad sizes in desc");
  TESSERA_CHECK(d.top_k <= kIndexTopKCudaMax, "index_topk (CUDA): top_k above 8192 is not compiled");
  TESSERA_TRY(check_shape(a.scores, {d.rows, d.entries}, "index_topk scores"));
  if (a.mask.data) TESSERA_TRY(check_shape(a.mask, {d.rows, d.entries}, "index_topk mask"));
  TESSERA_TRY(check_shape(a.selected, {d.rows, d.top_k}, "index_topk selected"));
  TESSERA_TRY(check_shape(a.cutoff_tie, {d.rows}, "index_topk cutoff_tie"));
  TESSERA_TRY(device::check_on_device(a.scores, "index_topk scores"));
  TESSERA_TRY(device::check_on_device(a.mask, "index_topk mask"));
  TESSERA_TRY(device::check_on_device(a.selected, "index_topk selected"));
  return device::check_on_device(a.cutoff_tie, "index_topk cutoff_tie");
}

Status IndexTopK<Backend::kCuda>::run(IndexTopKDesc const& d, IndexTopKArgs const& a, ExecContext& ctx) {
  namespace k = kernels::indexer;
  if (d.rows == 0) return {};
  k::TopkParams p;
  p.scores = a.scores.data;
  p.mask = a.mask.data;
  p.selected = a.selected.data;
  p.cutoff_tie = a.cutoff_tie.data;
  p.rows = d.rows;
  p.entries = d.entries;
  p.top_k = d.top_k;
  int64_t const need = d.top_k < d.entries ? d.top_k : d.entries;
  int32_t len = 1;
  while (len < need) len <<= 1;
  p.sort_len = len;
  size_t const smem = static_cast<size_t>(len) * (sizeof(uint32_t) + sizeof(int32_t));
  TESSERA_TRY(device::allow_dynamic_smem(k::index_topk_kernel, smem, ctx, "index_topk (CUDA)"));
  device::launch_pdl(k::index_topk_kernel, static_cast<unsigned>(d.rows), k::kTopkThreads, smem, ctx.stream, p);
  return device::launch_status("index_topk (CUDA) kernel");
}

}  // namespace tessera::ops

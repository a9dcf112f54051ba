// SPDX-License-Identifier: Apache-2.0
/// Tensor-core expert GEMMs of MoeExperts<kCuda> (kernels/moe/moe_tc.cuh: math, layouts, tiles). Four kernels on
/// the main loops of kernels/linear/linear_tc.cuh, each block taking its x rows gathered through the tile table
/// (the sorted assignments' tokens, or act slots) and its expert's weight pointer:
///   kSkinny (≤ 8 assignments per tile, one warp per 8 output columns, W streamed with 16-byte cp.async; with
///   block-scaled routed experts, MoeTcParams::routed_scaled, their tiles run the same tile on decoded codes,
///   linear_tc_quant.cuh, in launches of their own beside the shared expert's bf16 ones):
///     act:  skinny_warp_tile with kMats = 2 — the W1 and W3 rows of the same 8 columns against the same staged x
///           rows, so lane (g, c) holds g and u of (row g, columns 2c, 2c + 1) in acc[0] and acc[1] and the SwiGLU
///           is its epilogue. Bytes: the warp streams 2 × 8 W rows and stages x once; writing g, u to memory for a
///           separate act kernel would add 2·4 B·inter per assignment of traffic and a launch, and stage x twice.
///     down: skinny_warp_tile with kMats = 1 over W2, x rows = act slots.
///   kGemm (≤ 128 assignments per tile, 128 × 128 block tile, 8 warps; on sm_90a where ops::tc_wgmma_auto, the
///   128 × 256 wgmma tile of moe_tc_wgmma.cuh instead, same values):
///     act:  two launches of gemm_block_tile over the same gathered x rows, W1 then W3. The first stores
///           →bf16(g) into act at the output's position; the second puts →bf16(u) in shared memory, reads g back
///           and stores the activation over it. (One kernel doing both passes, or keeping g in registers, spills
///           under the 128 registers of two blocks per SM; g costs 2·2 B per output of extra traffic.)
///     down: gemm_block_tile over W2, x rows = act slots.
/// The m16n8 fragment rows of a skinny tile are the tile's assignments 0..7 (rows 8..15 zero registers); of a
/// GEMM tile, assignments 0..127 (rows ≥ count staged as +0). Only rows < count are stored. Operand staging is
/// 16-byte cp.async when K % 8 == 0 and the expert's matrices are 16-byte aligned (decided per block), else
/// element loads: the same arithmetic (linear_tc.cuh).
#include <algorithm>
#include <string>

#include "kernels/common/cuda_util.cuh"
#include "kernels/linear/linear_tc.cuh"
#include "kernels/linear/linear_tc_quant.cuh"
#include "kernels/linear/linear_tc_quant_direct.cuh"
#include "kernels/linear/linear_tc_quant_gemm.cuh"
#include "kernels/linear/linear_tc_quant_ws.cuh"
#include "kernels/linear/linear_tc_wgmma.cuh"
#include "kernels/moe/moe_tc.cuh"
#include "tessera/ops/linear.hpp"

namespace tessera::kernels::moe_tc {

namespace {

using ops::TcMma;
using namespace tc_linear;

constexpr int kActStages = 6;   // skinny act: 5 slabs × 8 KiB of W1/W3 in flight per warp; 74 KiB at 8 rows
constexpr int kDownStages = kSkinnyStages;  // skinny down: 7 slabs × 4 KiB of W2 in flight per warp; 66 KiB at 8 rows
static_assert(kSkinnyTileRows <= kSkinnyRows / 2, "skinny tiles use fragment rows 0..7 only");
static_assert(kGemmTileRows == kGemmBM);

struct Tile {
  int32_t expert, start, count;
};

/// Block tile t of the launch (routed for t < max_routed_tiles, then the shared expert's token tiles); false
/// when there is none (the block exits). Uniform over the block.
__device__ __forceinline__ bool tile_at(MoeTcParams const& p, int64_t t, Tile& tile) {
  if (t < p.max_routed_tiles) {
    if (t >= *p.num_tiles) return false;
    TileInfo const ti = p.tiles[t];
    if (ti.expert < p.expert_lo || ti.expert >= p.expert_hi) return false;
    tile = {ti.expert, ti.start, ti.count};
    return true;
  }
  if (!p.shared) return false;
  int64_t const tok0 = (t - p.max_routed_tiles) * p.tile_rows;
  if (tok0 >= p.rows) return false;
  tile = {-1, static_cast<int32_t>(tok0), static_cast<int32_t>(p.rows - tok0 < p.tile_rows ? p.rows - tok0 : p.tile_rows)};
  return true;
}

/// Row r < count of a tile: its token (x row), its slot (act / ybuf row) and its routing weight (routed only).
struct RowInfo {
  int32_t token, slot;
  float wt;
};

__device__ __forceinline__ RowInfo row_info(MoeTcParams const& p, Tile const& t, int r) {
  if (t.expert < 0) {
    int64_t const tok = t.start + r;
    return {static_cast<int32_t>(tok), static_cast<int32_t>(tok * (p.top_k + 1) + p.top_k), 0.f};
  }
  uint32_t const a = p.vals_sorted[t.start + r];
  int64_t const tok = a / p.top_k, s = a % p.top_k;
  return {static_cast<int32_t>(tok), static_cast<int32_t>(tok * (p.top_k + 1) + s), p.weights[a]};
}

__device__ __forceinline__ uint16_t const* expert_w(void const* const* table, void const* shared, int32_t e) {
  return static_cast<uint16_t const*>(e >= 0 ? table[e] : shared);
}

__device__ __forceinline__ bool aligned16(void const* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; }

/// The bits of →bf16(w·(silu(min(g', L))·clamp(u', ±L))), g' = →bf16(g), u' = →bf16(u): moe_cuda.cu's act
/// epilogue with md = bf16 (device::round_md, silu on exp_md, the same fp32 operations in the same order).
__device__ __forceinline__ uint16_t act_bits(float g, float u, float limit, bool routed, float wt) {
  float gv = device::round_md(g, true), uv = device::round_md(u, true);
  if (limit > 0.f) { uv = device::std_clamp(uv, -limit, limit); gv = device::std_min(gv, limit); }
  float y = __fmul_rn(device::silu(gv, true), uv);
  if (routed) y = __fmul_rn(wt, y);
  return bf16_bits_from_float(y);  // the bits of device::round_md(y, true)
}

__global__ void __launch_bounds__(256) moe_tc_convert_x_kernel(float const* x, uint16_t* xb, int64_t n) {
  device::pdl_enter();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    xb[i] = bf16_bits_from_float(x[i]);
}

// ---- kSkinny: grid (⌈N/8⌉, tiles), block 32. Each kernel picks its staging once per block (kVec16 or
// element loads, linear_tc.cuh), so each instantiation of the main loop is register-allocated on its own. ----

/// The SwiGLU epilogue of a skinny act tile: lane (g, c) holds g and u of (tile row g, columns n0 + 2c, + 1).
__device__ __forceinline__ void act_store(MoeTcParams const& p, Tile const& t, RowInfo const* rows_s, int64_t n0,
                                          float const (&acc)[2][4]) {
  int const lane = static_cast<int>(threadIdx.x & 31);
  int const g = lane >> 2, c = lane & 3;
  if (g >= t.count) return;  // fragment rows g + 8 ≥ 8 ≥ count are never stored
  RowInfo const ri = rows_s[g];
  uint16_t* const dst = p.act + static_cast<int64_t>(ri.slot) * p.inter;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int64_t const col = n0 + 2 * c + h;
    if (col < p.inter) dst[col] = act_bits(acc[0][h], acc[1][h], p.limit, t.expert >= 0, ri.wt);
  }
}

/// The down epilogue: ybuf[slot of tile row g, columns n0 + 2c, + 1] = →bf16 of the accumulators.
__device__ __forceinline__ void down_store(MoeTcParams const& p, Tile const& t, int32_t const* slot_s, int64_t n0,
                                           float const (&acc)[1][4]) {
  int const lane = static_cast<int>(threadIdx.x & 31);
  int const g = lane >> 2, c = lane & 3;
  if (g >= t.count) return;
  float* const dst = p.ybuf + static_cast<int64_t>(slot_s[g]) * p.dim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int64_t const col = n0 + 2 * c + h;
    if (col < p.dim) dst[col] = device::round_md(acc[0][h], true);
  }
}

template <int kStages, bool kVec16>
__device__ __forceinline__ void act_skinny(MoeTcParams const& p, Tile const& t, RowInfo const* rows_s,
                                           uint16_t* smem, uint16_t const* const (&w)[2]) {
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  float acc[2][4];
  skinny_warp_tile<TcMma::kK16, kVec16, 2, kStages>(
      smem, w, p.dim, n0, p.inter, p.dim, t.count,
      [&](int j) { return p.x + static_cast<int64_t>(rows_s[j].token) * p.dim; }, acc);
  act_store(p, t, rows_s, n0, acc);
}

template <int kStages>
__global__ void __launch_bounds__(32) moe_tc_act_skinny_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) uint16_t act_skinny_smem[];
  __shared__ RowInfo rows_s[kSkinnyTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;
  int const lane = static_cast<int>(threadIdx.x);
  if (lane < t.count) rows_s[lane] = row_info(p, t, lane);
  __syncwarp();
  uint16_t const* const w[2] = {expert_w(p.w.w1, p.w.shared_w1, t.expert), expert_w(p.w.w3, p.w.shared_w3, t.expert)};
  if (p.dim % 8 == 0 && aligned16(w[0]) && aligned16(w[1])) act_skinny<kStages, true>(p, t, rows_s, act_skinny_smem, w);
  else act_skinny<kStages, false>(p, t, rows_s, act_skinny_smem, w);
}

template <int kStages, bool kVec16>
__device__ __forceinline__ void down_skinny(MoeTcParams const& p, Tile const& t, int32_t const* slot_s,
                                            uint16_t* smem, uint16_t const* const (&w)[1]) {
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  float acc[1][4];
  skinny_warp_tile<TcMma::kK16, kVec16, 1, kStages>(
      smem, w, p.inter, n0, p.dim, p.inter, t.count,
      [&](int j) { return p.act + static_cast<int64_t>(slot_s[j]) * p.inter; }, acc);
  down_store(p, t, slot_s, n0, acc);
}

template <int kStages>
__global__ void __launch_bounds__(32) moe_tc_down_skinny_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) uint16_t down_skinny_smem[];
  __shared__ int32_t slot_s[kSkinnyTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;
  int const lane = static_cast<int>(threadIdx.x);
  if (lane < t.count) slot_s[lane] = row_info(p, t, lane).slot;
  __syncwarp();
  uint16_t const* const w[1] = {expert_w(p.w.w2, p.w.shared_w2, t.expert)};
  if (p.inter % 8 == 0 && aligned16(w[0])) down_skinny<kStages, true>(p, t, slot_s, down_skinny_smem, w);
  else down_skinny<kStages, false>(p, t, slot_s, down_skinny_smem, w);
}

// ---- kSkinny on block-scaled experts (MoeTcParams::routed_scaled): grid (⌈N/8⌉, tiles of the part), one warp per
// block; the routed tiles, or (launches of their own, p.tile0 = max_routed_tiles) the shared expert's token tiles
// when it is block-scaled too (MoeTcParams::shared_scaled; else they run the bf16 kernels above).
// 256-code K slabs: FP8 4 KiB (act) / 2 KiB (down) of codes per slab, FP4 half of that. ----
constexpr int kQuantBKMoe = 256;
constexpr int kActQStages = 6;
constexpr int kDownQStages = 8;

template <DType kFmt>
__device__ __forceinline__ QuantW routed_q(void const* const* codes, void const* const* scales, int32_t e, int64_t k) {
  return {static_cast<uint8_t const*>(codes[e]), static_cast<uint8_t const*>(scales[e]), k / kCodesPerByte<kFmt>, (k + 31) / 32};
}

/// The block-scaled operand of a tile: routed expert t.expert's, or the shared expert's (t.expert < 0; a launch
/// of shared tiles has kFmt = p.shared_scaled). m: 0 = W1, 1 = W3, 2 = W2; k: the matrix's columns.
template <DType kFmt>
__device__ __forceinline__ QuantW tile_q(MoeTcParams const& p, Tile const& t, int m, int64_t k) {
  if (t.expert < 0) {
    void const* const q = m == 0 ? p.w.shared_w1 : m == 1 ? p.w.shared_w3 : p.w.shared_w2;
    void const* const s = m == 0 ? p.w.shared_s1 : m == 1 ? p.w.shared_s3 : p.w.shared_s2;
    return {static_cast<uint8_t const*>(q), static_cast<uint8_t const*>(s), k / kCodesPerByte<kFmt>, (k + 31) / 32};
  }
  return m == 0 ? routed_q<kFmt>(p.w.w1, p.w.s1, t.expert, k)
         : m == 1 ? routed_q<kFmt>(p.w.w3, p.w.s3, t.expert, k)
                  : routed_q<kFmt>(p.w.w2, p.w.s2, t.expert, k);
}

/// kDirect: one warp per 8 columns, codes decoded in registers (linear_tc_quant_direct.cuh; kRing: the codes reach
/// them through its ring). A tile holds distinct tokens, so its count is at most the call's rows, and the launch
/// takes it when its x rows fit; else the shared-memory ring tile (linear_tc_quant.cuh). Same values.
/// kFmtShared: the format of the shared expert's tiles (t.expert < 0) when one launch runs the routed tiles and the
/// shared expert's together (launch_skinny_q; direct tiles only); the default, kFmt, for a launch of one format.
template <DType kFmt, bool kDirect, bool kRing = true, DType kFmtShared = kFmt>
__global__ void __launch_bounds__(32) moe_tc_act_skinny_q_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char act_q_smem[];
  __shared__ RowInfo rows_s[kSkinnyTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;
  int const lane = static_cast<int>(threadIdx.x);
  if (lane < t.count) rows_s[lane] = row_info(p, t, lane);
  __syncwarp();
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  auto const xrow = [&](int j) { return p.x + static_cast<int64_t>(rows_s[j].token) * p.dim; };
  auto const run = [&]<DType kF>() {
    QuantW const w[2] = {tile_q<kF>(p, t, 0, p.dim), tile_q<kF>(p, t, 1, p.dim)};
    float acc[2][4];
    if constexpr (kDirect) skinny_warp_tile_qd<kF, 2, kRing>(act_q_smem, w, n0, p.inter, p.dim, t.count, xrow, acc);
    else skinny_warp_tile_q<kF, 2, kActQStages, kQuantBKMoe>(act_q_smem, w, n0, p.inter, p.dim, t.count, xrow, acc);
    act_store(p, t, rows_s, n0, acc);
  };
  if constexpr (kFmtShared != kFmt) {
    static_assert(kDirect, "a launch of two formats runs the direct tiles");
    if (t.expert < 0) return run.template operator()<kFmtShared>();
  }
  run.template operator()<kFmt>();
}

template <DType kFmt, bool kDirect, bool kRing = true, DType kFmtShared = kFmt>
__global__ void __launch_bounds__(32) moe_tc_down_skinny_q_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char down_q_smem[];
  __shared__ int32_t slot_s[kSkinnyTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;
  int const lane = static_cast<int>(threadIdx.x);
  if (lane < t.count) slot_s[lane] = row_info(p, t, lane).slot;
  __syncwarp();
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  auto const xrow = [&](int j) { return p.act + static_cast<int64_t>(slot_s[j]) * p.inter; };
  auto const run = [&]<DType kF>() {
    QuantW const w[1] = {tile_q<kF>(p, t, 2, p.inter)};
    float acc[1][4];
    if constexpr (kDirect) skinny_warp_tile_qd<kF, 1, kRing>(down_q_smem, w, n0, p.dim, p.inter, t.count, xrow, acc);
    else skinny_warp_tile_q<kF, 1, kDownQStages, kQuantBKMoe>(down_q_smem, w, n0, p.dim, p.inter, t.count, xrow, acc);
    down_store(p, t, slot_s, n0, acc);
  };
  if constexpr (kFmtShared != kFmt) {
    static_assert(kDirect, "a launch of two formats runs the direct tiles");
    if (t.expert < 0) return run.template operator()<kFmtShared>();
  }
  run.template operator()<kFmt>();
}

/// Warp-specialised block-scaled tiles (MoeTcParams::warp_spec): one block of kWsThreads per (8 columns, tile); four
/// warps decode the codes into a bf16 ring, warp 0 runs the mma chain and the epilogue. Same values.
template <DType kFmt, int kRaw>
__global__ void __launch_bounds__(kWsThreads) moe_tc_act_ws_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char act_ws_smem[];
  __shared__ RowInfo rows_s[kSkinnyTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;  // block-uniform
  int const tid = static_cast<int>(threadIdx.x);
  if (tid < t.count) rows_s[tid] = row_info(p, t, tid);
  __syncthreads();
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  QuantW const w[2] = {tile_q<kFmt>(p, t, 0, p.dim), tile_q<kFmt>(p, t, 1, p.dim)};
  float acc[2][4];
  auto const xrow = [&](int j) { return p.x + static_cast<int64_t>(rows_s[j].token) * p.dim; };
  skinny_block_tile_ws<kFmt, 2, kRaw>(act_ws_smem, w, n0, p.inter, p.dim, t.count, xrow, acc);
  if (tid < 32) act_store(p, t, rows_s, n0, acc);
}

template <DType kFmt, int kRaw>
__global__ void __launch_bounds__(kWsThreads) moe_tc_down_ws_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char down_ws_smem[];
  __shared__ int32_t slot_s[kSkinnyTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;
  int const tid = static_cast<int>(threadIdx.x);
  if (tid < t.count) slot_s[tid] = row_info(p, t, tid).slot;
  __syncthreads();
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  QuantW const w[1] = {tile_q<kFmt>(p, t, 2, p.inter)};
  float acc[1][4];
  auto const xrow = [&](int j) { return p.act + static_cast<int64_t>(slot_s[j]) * p.inter; };
  skinny_block_tile_ws<kFmt, 1, kRaw>(down_ws_smem, w, n0, p.dim, p.inter, t.count, xrow, acc);
  if (tid < 32) down_store(p, t, slot_s, n0, acc);
}

// ---- kGemm: grid (⌈N/128⌉, tiles), block 256 ----

/// The block's tile rows into shared memory (row r < count: rows_s[r]).
__device__ __forceinline__ void gemm_rows(MoeTcParams const& p, Tile const& t, RowInfo* rows_s) {
  int const tid = static_cast<int>(threadIdx.x);
  if (tid < t.count) rows_s[tid] = row_info(p, t, tid);
  __syncthreads();
}

/// One gemm_block_tile pass over the tile's gathered rows: row r of the block tile reads x_row(rows_s[r]) when
/// r < count; rows past it are +0 (their address: row 0's, never read). The staged row addresses are derived
/// here from shared memory, so nothing of one pass stays live in registers across the next.
template <bool kVec16, class XRow>
__device__ __forceinline__ void gemm_pass(Tile const& t, RowInfo const* rows_s, XRow const& x_row, uint16_t* smem,
                                          uint16_t const* w, int64_t n0, int64_t n, int64_t k, float (&acc)[4][4][4]) {
  int const tid = static_cast<int>(threadIdx.x);
  uint16_t const* xrow[kGemmXRowsPerThread];
  bool xok[kGemmXRowsPerThread];
#pragma unroll
  for (int i = 0; i < kGemmXRowsPerThread; ++i) {
    int const r = (tid >> 2) + 64 * i;
    xok[i] = r < t.count;
    xrow[i] = x_row(rows_s[xok[i] ? r : 0]);
  }
  gemm_block_tile<TcMma::kK16, kVec16>(smem, xrow, xok, w, k, n0, n, k, acc);
}

/// The block-tile position (row, column lc) of accumulator i = 16·mt + 4·nt + e of this thread (gemm_block_tile's
/// layout: warp (wm, wn), tiles mt, nt; d0, d1 row g, d2, d3 row g + 8; columns 2c, 2c + 1).
__device__ __forceinline__ void gemm_position(int i, int& row, int& lc) {
  int const lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  int const mt = i >> 4, nt = (i >> 2) & 3, e = i & 3;
  row = (warp >> 2) * 64 + mt * 16 + (lane >> 2) + (e >> 1) * 8;
  lc = (warp & 3) * 32 + nt * 8 + 2 * (lane & 3) + (e & 1);
}

/// f(row of the tile, column within the block tile, accumulator) for every output of this thread with
/// row < count and column < cols (= min(N − n0, 128)).
template <class F>
__device__ __forceinline__ void gemm_for_each(float const (&acc)[4][4][4], int count, int cols, F&& f) {
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    int row, lc;
    gemm_position(i, row, lc);
    if (row < count && lc < cols) f(row, lc, acc[i >> 4][(i >> 2) & 3][i & 3]);
  }
}

/// gemm_for_each's positions as a loop that is not unrolled (f(row, column)), for an epilogue too large to
/// unroll 64 times.
template <class F>
__device__ __forceinline__ void gemm_for_each_slow(int count, int cols, F&& f) {
#pragma unroll 1
  for (int i = 0; i < 64; ++i) {
    int row, lc;
    gemm_position(i, row, lc);
    if (row < count && lc < cols) f(row, lc);
  }
}

/// Columns of the block tile at n0 that exist (N − n0, at most 128).
__device__ __forceinline__ int tile_cols(int64_t n0, int64_t n) {
  return static_cast<int>(n - n0 < kGemmBN ? n - n0 : kGemmBN);
}

/// The act GEMM's epilogue for the block tile at n0 (acc after gemm_block_tile or gemm_block_tile_q; smem free).
/// kUp = false: g = W1·x → act as →bf16(g). kUp = true (the next launch): u = W3·x, and act ← the activation of
/// the g stored there (by the same thread position of the previous launch) and u.
template <bool kUp>
__device__ __forceinline__ void act_epilogue(MoeTcParams const& p, Tile const& t, RowInfo const* rows_s, uint16_t* smem,
                                             int64_t n0, float const (&acc)[4][4][4]) {
  int const cols = tile_cols(n0, p.inter);
  auto out = [&](int row) { return p.act + static_cast<int64_t>(rows_s[row].slot) * p.inter + n0; };
  if constexpr (!kUp) {
    gemm_for_each(acc, t.count, cols, [&](int row, int lc, float g) { out(row)[lc] = bf16_bits_from_float(g); });
  } else {
    // →bf16(u) into the free ring (gemm_block_tile ended with a barrier; 32 KiB ≤ kGemmSmemBytes), then the
    // activation element by element from g (global) and u (shared, this thread's own): with the accumulators
    // dead, silu's registers fit under the 128 of two blocks per SM.
    uint16_t* const us = smem;
    gemm_for_each(acc, t.count, cols, [&](int row, int lc, float u) { us[row * kGemmBN + lc] = bf16_bits_from_float(u); });
    bool const routed = t.expert >= 0;
    gemm_for_each_slow(t.count, cols, [&](int row, int lc) {
      uint16_t* const dst = out(row) + lc;
      float const u = float_from_bf16_bits(us[row * kGemmBN + lc]);
      *dst = act_bits(float_from_bf16_bits(*dst), u, p.limit, routed, rows_s[row].wt);
    });
  }
}

template <bool kUp, bool kVec16>
__device__ __forceinline__ void act_gemm(MoeTcParams const& p, Tile const& t, RowInfo const* rows_s, uint16_t* smem) {
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kGemmBN;
  auto x_row = [&](RowInfo const& ri) { return p.x + static_cast<int64_t>(ri.token) * p.dim; };
  float acc[4][4][4];
  uint16_t const* const w = kUp ? expert_w(p.w.w3, p.w.shared_w3, t.expert) : expert_w(p.w.w1, p.w.shared_w1, t.expert);
  gemm_pass<kVec16>(t, rows_s, x_row, smem, w, n0, p.inter, p.dim, acc);
  act_epilogue<kUp>(p, t, rows_s, smem, n0, acc);
}

template <bool kUp>
__global__ void __launch_bounds__(kGemmWarps * 32, 2) moe_tc_act_gemm_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) uint16_t act_gemm_smem[];
  __shared__ RowInfo rows_s[kGemmTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;
  gemm_rows(p, t, rows_s);
  uint16_t const* const w = kUp ? expert_w(p.w.w3, p.w.shared_w3, t.expert) : expert_w(p.w.w1, p.w.shared_w1, t.expert);
  if (p.dim % 8 == 0 && aligned16(w)) act_gemm<kUp, true>(p, t, rows_s, act_gemm_smem);
  else act_gemm<kUp, false>(p, t, rows_s, act_gemm_smem);
}

template <bool kVec16>
__device__ __forceinline__ void down_gemm(MoeTcParams const& p, Tile const& t, RowInfo const* rows_s, uint16_t* smem,
                                          uint16_t const* w2) {
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kGemmBN;
  float acc[4][4][4];
  gemm_pass<kVec16>(t, rows_s, [&](RowInfo const& ri) { return p.act + static_cast<int64_t>(ri.slot) * p.inter; },
                    smem, w2, n0, p.dim, p.inter, acc);
  gemm_for_each(acc, t.count, tile_cols(n0, p.dim), [&](int row, int lc, float y) {
    p.ybuf[static_cast<int64_t>(rows_s[row].slot) * p.dim + n0 + lc] = device::round_md(y, true);
  });
}

__global__ void __launch_bounds__(kGemmWarps * 32, 2) moe_tc_down_gemm_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) uint16_t down_gemm_smem[];
  __shared__ RowInfo rows_s[kGemmTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;
  gemm_rows(p, t, rows_s);
  uint16_t const* const w2 = expert_w(p.w.w2, p.w.shared_w2, t.expert);
  if (p.inter % 8 == 0 && aligned16(w2)) down_gemm<true>(p, t, rows_s, down_gemm_smem, w2);
  else down_gemm<false>(p, t, rows_s, down_gemm_smem, w2);
}

// ---- kGemm on block-scaled routed experts (MoeTcParams::routed_scaled): grid (⌈N/128⌉, max_routed_tiles), 8 warps;
// the codes decoded per K slab inside the tile (linear_tc_quant_gemm.cuh). Routed tiles only (the shared expert's run
// the bf16 kernels above in launches of their own). ----

/// gemm_pass on block-scaled W: the x rows of the tile gathered as gemm_pass gathers them (16-byte rows).
template <DType kFmt, class XRow>
__device__ __forceinline__ void gemm_pass_q(Tile const& t, RowInfo const* rows_s, XRow const& x_row, unsigned char* smem,
                                            QuantW const& w, int64_t n0, int64_t n, int64_t k, float (&acc)[4][4][4]) {
  int const tid = static_cast<int>(threadIdx.x);
  uint16_t const* xrow[kGemmXRowsPerThread];
  bool xok[kGemmXRowsPerThread];
#pragma unroll
  for (int i = 0; i < kGemmXRowsPerThread; ++i) {
    int const r = (tid >> 2) + 64 * i;
    xok[i] = r < t.count;
    xrow[i] = x_row(rows_s[xok[i] ? r : 0]);
  }
  gemm_block_tile_q<kFmt>(smem, xrow, xok, w, n0, n, k, acc);
}

template <DType kFmt, bool kUp>
__global__ void __launch_bounds__(kGemmWarps * 32, 2) moe_tc_act_gemm_q_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char act_gemm_q_smem[];
  __shared__ RowInfo rows_s[kGemmTileRows];
  Tile t;
  if (!tile_at(p, blockIdx.y, t) || t.expert < 0) return;  // block-uniform
  gemm_rows(p, t, rows_s);
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kGemmBN;
  QuantW const w = kUp ? routed_q<kFmt>(p.w.w3, p.w.s3, t.expert, p.dim) : routed_q<kFmt>(p.w.w1, p.w.s1, t.expert, p.dim);
  float acc[4][4][4];
  gemm_pass_q<kFmt>(t, rows_s, [&](RowInfo const& ri) { return p.x + static_cast<int64_t>(ri.token) * p.dim; },
                    act_gemm_q_smem, w, n0, p.inter, p.dim, acc);
  act_epilogue<kUp>(p, t, rows_s, reinterpret_cast<uint16_t*>(act_gemm_q_smem), n0, acc);
}

template <DType kFmt>
__global__ void __launch_bounds__(kGemmWarps * 32, 2) moe_tc_down_gemm_q_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char down_gemm_q_smem[];
  __shared__ RowInfo rows_s[kGemmTileRows];
  Tile t;
  if (!tile_at(p, blockIdx.y, t) || t.expert < 0) return;
  gemm_rows(p, t, rows_s);
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kGemmBN;
  float acc[4][4][4];
  gemm_pass_q<kFmt>(t, rows_s, [&](RowInfo const& ri) { return p.act + static_cast<int64_t>(ri.slot) * p.inter; },
                    down_gemm_q_smem, routed_q<kFmt>(p.w.w2, p.w.s2, t.expert, p.inter), n0, p.dim, p.inter, acc);
  gemm_for_each(acc, t.count, tile_cols(n0, p.dim), [&](int row, int lc, float y) {
    p.ybuf[static_cast<int64_t>(rows_s[row].slot) * p.dim + n0 + lc] = device::round_md(y, true);
  });
}

/// Routed tile slots then the shared expert's token tiles.
int64_t grid_tiles(MoeTcParams const& p) {
  return p.max_routed_tiles + (p.shared ? ceil_div(p.rows, p.tile_rows) : 0);
}

Status check_grid(int64_t gx, int64_t gy, char const* what) {
  if (gx > 0x7FFFFFFF || gy > 65535) return invalid_argument(std::string(what) + ": grid too large");
  return {};
}

#include "kernels/moe/moe_tc_wgmma.cuh"

}  // namespace

namespace {
/// Rows × cols of one block-scaled matrix (ops::Linear's layouts; cols % 32 == 0) decoded to bf16 at w, by the
/// threads of the grid's x dimension: a thread decodes 8 consecutive weights of a row (ops::scaled_weight each) and
/// stores them as one 16-byte word.
__device__ __forceinline__ void decode_matrix_bf16(DType fmt, uint8_t const* q, uint8_t const* sc, int64_t rows,
                                                   int64_t cols, uint16_t* w) {
  int64_t const ldq = fmt == DType::kF4E2m1x2 ? cols / 2 : cols, lds = (cols + 31) / 32, groups = cols / 8;
  int64_t const total = rows * groups;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t const r = t / groups, i0 = (t - r * groups) * 8;
    uint32_t packed[4];
    for (int j = 0; j < 4; ++j)
      packed[j] = static_cast<uint32_t>(bf16_bits_from_float(ops::scaled_weight(fmt, q, ldq, sc, lds, r, i0 + 2 * j))) |
                  (static_cast<uint32_t>(bf16_bits_from_float(ops::scaled_weight(fmt, q, ldq, sc, lds, r, i0 + 2 * j + 1))) << 16);
    *reinterpret_cast<uint4*>(w + r * cols + i0) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}
}  // namespace

/// Experts [e0, e0 + gridDim.y) of one block-scaled matrix kind decoded to bf16: expert e's [rows, cols] at
/// out + (e − e0)·rows·cols, and table[e] pointing there (for the GEMM tiles' expert_w).
__global__ void __launch_bounds__(256) moe_tc_decode_experts_kernel(DType fmt, void const* const* codes,
                                                                    void const* const* scales, int32_t e0, int64_t rows,
                                                                    int64_t cols, uint16_t* out, void const** table) {
  device::pdl_enter();
  int32_t const e = e0 + static_cast<int32_t>(blockIdx.y);
  uint16_t* w = out + static_cast<int64_t>(blockIdx.y) * rows * cols;
  if (blockIdx.x == 0 && threadIdx.x == 0) table[e] = w;
  decode_matrix_bf16(fmt, static_cast<uint8_t const*>(codes[e]), static_cast<uint8_t const*>(scales[e]), rows, cols, w);
}

/// The shared expert's W1, W3 ([inter, dim]) and W2 ([dim, inter]) decoded to bf16 (grid y = 3: the matrix).
__global__ void __launch_bounds__(256) moe_tc_decode_shared_kernel(MoeTcParams const p, uint16_t* out) {
  device::pdl_enter();
  int const m = static_cast<int>(blockIdx.y);
  void const* const q = m == 0 ? p.w.shared_w1 : m == 1 ? p.w.shared_w3 : p.w.shared_w2;
  void const* const s = m == 0 ? p.w.shared_s1 : m == 1 ? p.w.shared_s3 : p.w.shared_s2;
  decode_matrix_bf16(p.shared_scaled, static_cast<uint8_t const*>(q), static_cast<uint8_t const*>(s),
                     m == 2 ? p.dim : p.inter, m == 2 ? p.inter : p.dim, out + static_cast<int64_t>(m) * p.inter * p.dim);
}

Status launch_decode_shared(MoeTcParams const& p, uint16_t* out, cudaStream_t st) {
  if (!ops::is_block_scaled(p.shared_scaled)) return invalid_argument("moe_tc decode shared: shared expert not block-scaled");
  if (p.dim % 32 != 0 || p.inter % 32 != 0) return invalid_argument("moe_tc decode shared: dim and inter must be multiples of 32");
  unsigned const bx = static_cast<unsigned>(std::min<int64_t>(ceil_div(p.inter * p.dim / 8, 256), 4096));
  device::launch_pdl(moe_tc_decode_shared_kernel, dim3(bx, 3), 256, 0, st, p, out);
  return launch_status("moe_tc_decode_shared_kernel");
}

Status launch_convert_x(float const* x, uint16_t* xb, int64_t n, cudaStream_t st) {
  if (n <= 0) return {};
  int64_t const blocks = ceil_div(n, 256) < 4096 ? ceil_div(n, 256) : 4096;
  device::launch_pdl(moe_tc_convert_x_kernel, static_cast<unsigned>(blocks), 256, 0, st, x, xb, n);
  return launch_status("moe_tc_convert_x_kernel");
}

namespace {
/// The act then down launches of the warp-specialised kernels over gy tiles from p.tile0 (xr: rows per tile,
/// ≤ kSkinnyTileRows).
template <DType kFmt, int kRaw>
Status launch_ws_part(MoeTcParams const& p, int64_t xr, int64_t ga, int64_t gd, int64_t gy, cudaStream_t st) {
  constexpr auto kActW = moe_tc_act_ws_kernel<kFmt, kRaw>;
  constexpr auto kDownW = moe_tc_down_ws_kernel<kFmt, kRaw>;
  TESSERA_TRY(cuda_status(allow_smem<kActW>(skinny_ws_smem_bytes<kFmt>(2, kRaw, kSkinnyTileRows, ops::kTcQuantMaxK)),
                          "moe_tc act (block-scaled, warp-specialised): shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<kDownW>(skinny_ws_smem_bytes<kFmt>(1, kRaw, kSkinnyTileRows, ops::kTcQuantMaxK)),
                          "moe_tc down (block-scaled, warp-specialised): shared memory attribute"));
  device::launch_pdl(kActW, dim3(static_cast<unsigned>(ga), static_cast<unsigned>(gy)), kWsThreads,
                     skinny_ws_smem_bytes<kFmt>(2, kRaw, xr, p.dim), st, p);
  TESSERA_TRY(launch_status("moe_tc_act_ws_kernel"));
  device::launch_pdl(kDownW, dim3(static_cast<unsigned>(gd), static_cast<unsigned>(gy)), kWsThreads,
                     skinny_ws_smem_bytes<kFmt>(1, kRaw, xr, p.inter), st, p);
  return launch_status("moe_tc_down_ws_kernel");
}

/// The direct act then down launches of one part (launch_part_q), or of the routed and shared parts together
/// (kFmtShared ≠ kFmt or p.tile0 = 0 with the shared tiles in grid y: launch_skinny_q); kRing: codes through the
/// shared-memory ring. xr: x rows a tile at most; the shared memory covers either format's tiles.
template <DType kFmt, bool kRing, DType kFmtShared = kFmt>
Status launch_part_qd_with(MoeTcParams const& p, int64_t xr, dim3 grid_a, dim3 grid_d, cudaStream_t st) {
  constexpr auto kActD = moe_tc_act_skinny_q_kernel<kFmt, true, kRing, kFmtShared>;
  constexpr auto kDownD = moe_tc_down_skinny_q_kernel<kFmt, true, kRing, kFmtShared>;
  auto const most = [](size_t a, size_t b) { return a > b ? a : b; };
  TESSERA_TRY(cuda_status(allow_smem<kActD>(most(skinny_qd_max_smem_bytes<kFmt>(2), skinny_qd_max_smem_bytes<kFmtShared>(2))),
                          "moe_tc act skinny (block-scaled, direct): shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<kDownD>(most(skinny_qd_max_smem_bytes<kFmt>(1), skinny_qd_max_smem_bytes<kFmtShared>(1))),
                          "moe_tc down skinny (block-scaled, direct): shared memory attribute"));
  device::launch_pdl(kActD, grid_a, 32,
                     most(skinny_qd_smem_bytes<kFmt>(2, xr, p.dim, kRing), skinny_qd_smem_bytes<kFmtShared>(2, xr, p.dim, kRing)),
                     st, p);
  TESSERA_TRY(launch_status("moe_tc_act_skinny_q_kernel (direct)"));
  device::launch_pdl(kDownD, grid_d, 32,
                     most(skinny_qd_smem_bytes<kFmt>(1, xr, p.inter, kRing), skinny_qd_smem_bytes<kFmtShared>(1, xr, p.inter, kRing)),
                     st, p);
  return launch_status("moe_tc_down_skinny_q_kernel (direct)");
}
template <DType kFmt, DType kFmtShared = kFmt>
Status launch_part_qd(MoeTcParams const& p, int64_t xr, dim3 grid_a, dim3 grid_d, cudaStream_t st) {
  return direct_ring_codes(std::min(p.dim, p.inter)) ? launch_part_qd_with<kFmt, true, kFmtShared>(p, xr, grid_a, grid_d, st)
                             : launch_part_qd_with<kFmt, false, kFmtShared>(p, xr, grid_a, grid_d, st);
}

/// Whether launch_skinny_q runs the routed and the block-scaled shared expert's direct tiles in one act and one
/// down launch (one wave of both parts' warps instead of two short ones; each tile computes what it computed in
/// its own launch, so the same values). TESSERA_MOE_SHARED_JOIN=0 keeps two launches (read once; A/B runs).
bool moe_shared_join() {
  static bool const on = [] {
    char const* e = std::getenv("TESSERA_MOE_SHARED_JOIN");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

/// Whether a part of tiles of xr rows runs on the direct tiles (not warp-specialised, direct allowed, x rows fit).
bool direct_part(MoeTcParams const& p, int64_t xr) {
  int64_t const dr = std::min(xr, p.rows);
  return !p.warp_spec && p.direct_ok && ops::tc_quant_direct_fits(dr, p.dim) && ops::tc_quant_direct_fits(dr, p.inter);
}

/// One part of a kSkinny call on the block-scaled tiles of kFmt: the routed tiles (p.tile0 = 0, gy =
/// max_routed_tiles) or the shared expert's token tiles (p.tile0 = max_routed_tiles, gy of them), act then down,
/// on the warp-specialised tiles when p.warp_spec, else the direct tile when every tile's rows fit it (a tile's
/// rows are distinct tokens: ≤ min(xr, p.rows)), else the ring. xr: rows per tile (≤ p.tile_rows). Same values on
/// each.
template <DType kFmt>
Status launch_part_q(MoeTcParams const& p, int64_t xr, int64_t gy, cudaStream_t st) {
  if (gy <= 0) return {};
  int64_t const ga = ceil_div(p.inter, kSkinnyCols), gd = ceil_div(p.dim, kSkinnyCols);
  if (p.warp_spec)
    return xr <= kWsDeepMaxRows ? launch_ws_part<kFmt, kWsRawDeep>(p, xr, ga, gd, gy, st)
                                : launch_ws_part<kFmt, kWsRawShallow>(p, xr, ga, gd, gy, st);
  dim3 const grid_a(static_cast<unsigned>(ga), static_cast<unsigned>(gy)), grid_d(static_cast<unsigned>(gd), static_cast<unsigned>(gy));
  int64_t const dr = std::min(xr, p.rows);
  if (direct_part(p, xr)) return launch_part_qd<kFmt>(p, dr, grid_a, grid_d, st);
  constexpr auto kActQ = moe_tc_act_skinny_q_kernel<kFmt, false>;
  constexpr auto kDownQ = moe_tc_down_skinny_q_kernel<kFmt, false>;
  TESSERA_TRY(cuda_status(allow_smem<kActQ>(skinny_q_smem_bytes<kFmt>(2, kActQStages, kSkinnyTileRows, kQuantBKMoe, ops::kTcQuantMaxK)),
                          "moe_tc act skinny (block-scaled): shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<kDownQ>(skinny_q_smem_bytes<kFmt>(1, kDownQStages, kSkinnyTileRows, kQuantBKMoe, ops::kTcQuantMaxK)),
                          "moe_tc down skinny (block-scaled): shared memory attribute"));
  device::launch_pdl(kActQ, grid_a, 32, skinny_q_smem_bytes<kFmt>(2, kActQStages, xr, kQuantBKMoe, p.dim), st, p);
  TESSERA_TRY(launch_status("moe_tc_act_skinny_q_kernel"));
  device::launch_pdl(kDownQ, grid_d, 32, skinny_q_smem_bytes<kFmt>(1, kDownQStages, xr, kQuantBKMoe, p.inter), st, p);
  return launch_status("moe_tc_down_skinny_q_kernel");
}

/// kSkinny with block-scaled routed experts of kFmt: the routed part, then the shared expert's part on the
/// block-scaled tiles of p.shared_scaled, or on the bf16 skinny kernels.
template <DType kFmt>
Status launch_skinny_q(MoeTcParams const& p, cudaStream_t st) {
  constexpr auto kAct = moe_tc_act_skinny_kernel<kActStages>;
  constexpr auto kDown = moe_tc_down_skinny_kernel<kDownStages>;
  if (p.tile_rows != kSkinnyTileRows && p.tile_rows != ops::kTcDirectMaxRows)
    return invalid_argument("moe_tc skinny: tiles of 8 (or, for the direct tile, 4) assignments expected");
  if (p.dim % 32 != 0 || p.inter % 32 != 0 || p.dim > ops::kTcQuantMaxK || p.inter > ops::kTcQuantMaxK)
    return invalid_argument("moe_tc block-scaled experts: dim and inter must be multiples of 32, at most " +
                            std::to_string(ops::kTcQuantMaxK));
  int64_t const xr = std::min<int64_t>(p.rows * p.top_k, p.tile_rows);
  int64_t const xs = std::min<int64_t>(p.rows, p.tile_rows);  // shared-expert tile rows
  int64_t const gr = p.max_routed_tiles, gs = p.shared ? ceil_div(p.rows, p.tile_rows) : 0;
  int64_t const ga = ceil_div(p.inter, kSkinnyCols), gd = ceil_div(p.dim, kSkinnyCols);
  TESSERA_TRY(check_grid(ga, gr + gs, "moe_tc act skinny"));
  TESSERA_TRY(check_grid(gd, gr + gs, "moe_tc down skinny"));
  bool const scaled_shared = p.shared_scaled == DType::kF8E4m3 || p.shared_scaled == DType::kF4E2m1x2;
  if (gs > 0 && scaled_shared && gr > 0 && moe_shared_join() && direct_part(p, xr)) {  // xs ≤ xr: one launch
    dim3 const grid_a(static_cast<unsigned>(ga), static_cast<unsigned>(gr + gs));
    dim3 const grid_d(static_cast<unsigned>(gd), static_cast<unsigned>(gr + gs));
    int64_t const dr = std::min(xr, p.rows);
    if (p.shared_scaled == kFmt) return launch_part_qd<kFmt>(p, dr, grid_a, grid_d, st);
    constexpr DType kOther = kFmt == DType::kF8E4m3 ? DType::kF4E2m1x2 : DType::kF8E4m3;
    return launch_part_qd<kFmt, kOther>(p, dr, grid_a, grid_d, st);
  }
  TESSERA_TRY(launch_part_q<kFmt>(p, xr, gr, st));
  if (gs == 0) return {};
  MoeTcParams ps = p;  // the shared expert's tiles: indices max_routed_tiles …
  ps.tile0 = p.max_routed_tiles;
  if (p.shared_scaled == DType::kF8E4m3) return launch_part_q<DType::kF8E4m3>(ps, xs, gs, st);
  if (p.shared_scaled == DType::kF4E2m1x2) return launch_part_q<DType::kF4E2m1x2>(ps, xs, gs, st);
  TESSERA_TRY(cuda_status(allow_smem<kAct>(skinny_tile_smem_bytes(2, kActStages, kSkinnyTileRows)),
                          "moe_tc act skinny: shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<kDown>(skinny_tile_smem_bytes(1, kDownStages, kSkinnyTileRows)),
                          "moe_tc down skinny: shared memory attribute"));
  device::launch_pdl(kAct, dim3(static_cast<unsigned>(ga), static_cast<unsigned>(gs)), 32,
                     skinny_tile_smem_bytes(2, kActStages, xs), st, ps);
  TESSERA_TRY(launch_status("moe_tc_act_skinny_kernel"));
  device::launch_pdl(kDown, dim3(static_cast<unsigned>(gd), static_cast<unsigned>(gs)), 32,
                     skinny_tile_smem_bytes(1, kDownStages, xs), st, ps);
  return launch_status("moe_tc_down_skinny_kernel");
}
}  // namespace

Status launch_skinny(MoeTcParams const& p, cudaStream_t st) {
  if (p.routed_scaled == DType::kF8E4m3) return launch_skinny_q<DType::kF8E4m3>(p, st);
  if (p.routed_scaled == DType::kF4E2m1x2) return launch_skinny_q<DType::kF4E2m1x2>(p, st);
  constexpr auto kAct = moe_tc_act_skinny_kernel<kActStages>;
  constexpr auto kDown = moe_tc_down_skinny_kernel<kDownStages>;
  if (p.tile_rows != kSkinnyTileRows) return invalid_argument("moe_tc skinny: tiles of 8 assignments expected");
  int64_t const xr = p.rows * p.top_k < kSkinnyTileRows ? p.rows * p.top_k : kSkinnyTileRows;  // rows per tile
  TESSERA_TRY(cuda_status(allow_smem<kAct>(skinny_tile_smem_bytes(2, kActStages, kSkinnyTileRows)),
                          "moe_tc act skinny: shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<kDown>(skinny_tile_smem_bytes(1, kDownStages, kSkinnyTileRows)),
                          "moe_tc down skinny: shared memory attribute"));
  int64_t const gy = grid_tiles(p), ga = ceil_div(p.inter, kSkinnyCols), gd = ceil_div(p.dim, kSkinnyCols);
  TESSERA_TRY(check_grid(ga, gy, "moe_tc act skinny"));
  TESSERA_TRY(check_grid(gd, gy, "moe_tc down skinny"));
  device::launch_pdl(kAct, dim3(static_cast<unsigned>(ga), static_cast<unsigned>(gy)), 32,
                     skinny_tile_smem_bytes(2, kActStages, xr), st, p);
  TESSERA_TRY(launch_status("moe_tc_act_skinny_kernel"));
  device::launch_pdl(kDown, dim3(static_cast<unsigned>(gd), static_cast<unsigned>(gy)), 32,
                     skinny_tile_smem_bytes(1, kDownStages, xr), st, p);
  return launch_status("moe_tc_down_skinny_kernel");
}

Status launch_gemm(MoeTcParams const& p, cudaStream_t st) {
  if (p.tile_rows != kGemmTileRows) return invalid_argument("moe_tc gemm: tiles of 128 assignments expected");
  if (ops::tc_wgmma_auto()) return launch_wgmma<DType::kBf16>(p, st);
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_act_gemm_kernel<false>>(kGemmSmemBytes), "moe_tc gate gemm: shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_act_gemm_kernel<true>>(kGemmSmemBytes), "moe_tc act gemm: shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_down_gemm_kernel>(kGemmSmemBytes), "moe_tc down gemm: shared memory attribute"));
  int64_t const gy = grid_tiles(p), ga = ceil_div(p.inter, kGemmBN), gd = ceil_div(p.dim, kGemmBN);
  TESSERA_TRY(check_grid(ga, gy, "moe_tc act gemm"));
  TESSERA_TRY(check_grid(gd, gy, "moe_tc down gemm"));
  dim3 const grid_a(static_cast<unsigned>(ga), static_cast<unsigned>(gy));
  device::launch_pdl(moe_tc_act_gemm_kernel<false>, grid_a, kGemmWarps * 32, kGemmSmemBytes, st, p);
  TESSERA_TRY(launch_status("moe_tc_act_gemm_kernel<gate>"));
  device::launch_pdl(moe_tc_act_gemm_kernel<true>, grid_a, kGemmWarps * 32, kGemmSmemBytes, st, p);
  TESSERA_TRY(launch_status("moe_tc_act_gemm_kernel<up>"));
  device::launch_pdl(moe_tc_down_gemm_kernel, dim3(static_cast<unsigned>(gd), static_cast<unsigned>(gy)),
                     kGemmWarps * 32, kGemmSmemBytes, st, p);
  return launch_status("moe_tc_down_gemm_kernel");
}

namespace {
template <DType kFmt>
Status launch_gemm_q(MoeTcParams const& p, cudaStream_t st) {
  constexpr auto kGate = moe_tc_act_gemm_q_kernel<kFmt, false>;
  constexpr auto kUp = moe_tc_act_gemm_q_kernel<kFmt, true>;
  constexpr auto kDown = moe_tc_down_gemm_q_kernel<kFmt>;
  constexpr size_t kSmem = gemm_q_smem_bytes<kFmt>();
  TESSERA_TRY(cuda_status(allow_smem<kGate>(kSmem), "moe_tc gate gemm (block-scaled): shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<kUp>(kSmem), "moe_tc act gemm (block-scaled): shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<kDown>(kSmem), "moe_tc down gemm (block-scaled): shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_act_gemm_kernel<false>>(kGemmSmemBytes), "moe_tc gate gemm: shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_act_gemm_kernel<true>>(kGemmSmemBytes), "moe_tc act gemm: shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_down_gemm_kernel>(kGemmSmemBytes), "moe_tc down gemm: shared memory attribute"));
  int64_t const gr = p.max_routed_tiles, gs = p.shared ? ceil_div(p.rows, p.tile_rows) : 0;
  int64_t const ga = ceil_div(p.inter, kGemmBN), gd = ceil_div(p.dim, kGemmBN);
  TESSERA_TRY(check_grid(ga, std::max(gr, gs), "moe_tc act gemm"));
  TESSERA_TRY(check_grid(gd, std::max(gr, gs), "moe_tc down gemm"));
  MoeTcParams ps = p;  // the shared expert's tiles: indices max_routed_tiles …
  ps.tile0 = p.max_routed_tiles;
  unsigned const threads = kGemmWarps * 32;
  // Gate before up for every tile (up reads the g its tile's gate launch stored), then down.
  if (gr > 0) {
    device::launch_pdl(kGate, dim3(static_cast<unsigned>(ga), static_cast<unsigned>(gr)), threads, kSmem, st, p);
    TESSERA_TRY(launch_status("moe_tc_act_gemm_q_kernel<gate>"));
  }
  if (gs > 0) {
    device::launch_pdl(moe_tc_act_gemm_kernel<false>, dim3(static_cast<unsigned>(ga), static_cast<unsigned>(gs)),
                       threads, kGemmSmemBytes, st, ps);
    TESSERA_TRY(launch_status("moe_tc_act_gemm_kernel<gate>"));
  }
  if (gr > 0) {
    device::launch_pdl(kUp, dim3(static_cast<unsigned>(ga), static_cast<unsigned>(gr)), threads, kSmem, st, p);
    TESSERA_TRY(launch_status("moe_tc_act_gemm_q_kernel<up>"));
  }
  if (gs > 0) {
    device::launch_pdl(moe_tc_act_gemm_kernel<true>, dim3(static_cast<unsigned>(ga), static_cast<unsigned>(gs)),
                       threads, kGemmSmemBytes, st, ps);
    TESSERA_TRY(launch_status("moe_tc_act_gemm_kernel<up>"));
  }
  if (gr > 0) {
    device::launch_pdl(kDown, dim3(static_cast<unsigned>(gd), static_cast<unsigned>(gr)), threads, kSmem, st, p);
    TESSERA_TRY(launch_status("moe_tc_down_gemm_q_kernel"));
  }
  if (gs > 0) {
    device::launch_pdl(moe_tc_down_gemm_kernel, dim3(static_cast<unsigned>(gd), static_cast<unsigned>(gs)), threads,
                       kGemmSmemBytes, st, ps);
    TESSERA_TRY(launch_status("moe_tc_down_gemm_kernel"));
  }
  return {};
}
}  // namespace

Status launch_gemm_scaled(MoeTcParams const& p, cudaStream_t st) {
  if (p.tile_rows != kGemmTileRows) return invalid_argument("moe_tc gemm: tiles of 128 assignments expected");
  bool const wg = ops::tc_wgmma_auto();
  if (p.routed_scaled == DType::kF8E4m3) return wg ? launch_wgmma<DType::kF8E4m3>(p, st) : launch_gemm_q<DType::kF8E4m3>(p, st);
  if (p.routed_scaled == DType::kF4E2m1x2) return wg ? launch_wgmma<DType::kF4E2m1x2>(p, st) : launch_gemm_q<DType::kF4E2m1x2>(p, st);
  return invalid_argument("moe_tc gemm (block-scaled): routed experts not block-scaled");
}

Status launch_gemm_decoded(MoeTcParams const& p, int64_t experts, int64_t group, cudaStream_t st) {
  if (!ops::is_block_scaled(p.routed_scaled)) return invalid_argument("moe_tc gemm decoded: routed experts not block-scaled");
  if (group < 1 || experts < 1 || experts > 0x7FFFFFFF) return invalid_argument("moe_tc gemm decoded: bad expert group");
  int64_t const mat = p.inter * p.dim;  // elements of W1, W3 and W2 alike
  size_t const table_bytes = align256(static_cast<size_t>(3 * experts) * sizeof(void*));
  size_t const bytes = table_bytes + static_cast<size_t>(3 * group * mat) * sizeof(uint16_t);
  void* buf = nullptr;
  TESSERA_TRY(cuda_status(cudaMallocAsync(&buf, bytes, st), "moe_tc gemm decoded: weight decode buffer"));
  auto** tables = static_cast<void const**>(buf);  // [3][experts]: W1 | W3 | W2 of the decoded group
  auto* wbuf = reinterpret_cast<uint16_t*>(static_cast<unsigned char*>(buf) + table_bytes);
  auto run = [&]() -> Status {
    for (int64_t e0 = 0; e0 < experts; e0 += group) {
      int64_t const n = experts - e0 < group ? experts - e0 : group;
      unsigned const bx = static_cast<unsigned>(std::min<int64_t>(ceil_div(mat / 8, 256), 4096));
      void const* const* codes[3] = {p.w.w1, p.w.w3, p.w.w2};
      void const* const* scales[3] = {p.w.s1, p.w.s3, p.w.s2};
      for (int j = 0; j < 3; ++j) {
        bool const down = j == 2;
        device::launch_pdl(moe_tc_decode_experts_kernel, dim3(bx, static_cast<unsigned>(n)), 256, 0, st, p.routed_scaled, codes[j], scales[j], static_cast<int32_t>(e0), down ? p.dim : p.inter,
            down ? p.inter : p.dim, wbuf + j * group * mat, tables + j * experts);
        TESSERA_TRY(launch_status("moe_tc_decode_experts_kernel"));
      }
      MoeTcParams q = p;
      q.w.w1 = tables;
      q.w.w3 = tables + experts;
      q.w.w2 = tables + 2 * experts;
      q.routed_scaled = DType::kBf16;
      q.expert_lo = static_cast<int32_t>(e0);
      q.expert_hi = static_cast<int32_t>(e0 + n);
      q.shared = p.shared && e0 == 0;
      TESSERA_TRY(launch_gemm(q, st));
    }
    return {};
  };
  Status const s = run();
  cudaError_t const e = cudaFreeAsync(buf, st);
  TESSERA_TRY(s);
  return cuda_status(e, "moe_tc gemm decoded: weight decode buffer release");
}

}  // namespace tessera::kernels::moe_tc

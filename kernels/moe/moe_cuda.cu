// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of MoeExperts (include/tessera/ops/moe.hpp, ref/moe_ref.hpp, spec §2.6; MoeRoute: moe_route_cuda.cu).
///   Grouped over experts: the (token, slot) assignments are sorted by expert id (CUB stable
///     radix sort: a pure function of the routing) and cut into tiles of up to 8 assignments of one
///     expert (and tiles of 8 tokens for the shared expert), so a block reads each weight tile once for
///     up to 8 tokens. act = →md(w·(silu(min(g, L))·clamp(u, ±L))) with g, u = →md(W1/W3 · x); then
///     y = →md(W2 · act) per assignment; then per token out_o = →md(Σ_e y_e,o + y_shared,o), the routed
///     experts in ascending id then the shared one, summed from +0 in fp32. Every dot runs in ref::gemm_dot's
///     order for the output dtype (tiles: warp_dot_rows_ptr with DotAcc, or TcDotAcc for bf16; decode-sized
///     launches: warp_dot_row / warp_dot_row_tc), so a value never depends on the tile it shares or the launch
///     shape, and a token's result never depends on the other tokens. With bf16 weights and md = bf16 the act
///     and down GEMMs run on the tensor cores instead (ops::MoeTcPath kSkinny / kGemm: kernels/moe/moe_tc.cuh,
///     the same values; x converted to bf16 first, act kept as bf16), on a tile table of 8 or 128 assignments.
///     Tile bound: expert e with n_e > 0 assignments takes ⌈n_e/T⌉ ≤ n_e/T + 1 tiles, and at most min(E, A)
///     experts have any, so max_routed_tiles = ⌈A/T⌉ + min(E, A) (A = rows·top_k) slots always suffice.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/common/cuda_util.cuh"
#include "kernels/linear/linear_tc.cuh"
#include "kernels/moe/moe_tc.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "tessera/ops/moe.hpp"

namespace tessera::kernels {

namespace {

constexpr int kMaxTopK = ops::kMoeCudaMaxTopK;
constexpr int kWarps = 4;
constexpr int kTile = 8;  // assignments (token rows) per block: each weight tile is reused for all of them

/// One block's rows: routed tile = up to tile_rows (kTile for these kernels) assignments of one expert
/// (consecutive in the sorted order); shared tile = up to tile_rows consecutive tokens of the shared expert.
using moe_tc::TileInfo;
static_assert(kTile == moe_tc::kSkinnyTileRows);

struct ExpertsParams {
  float const* x = nullptr;          // [rows, dim]
  int32_t const* ids = nullptr;      // [rows, top_k]
  float const* weights = nullptr;    // [rows, top_k]
  ops::MoeExpertsDeviceWeights w;
  uint32_t* keys = nullptr;          // [A] expert id (experts for an empty slot)
  uint32_t* keys_sorted = nullptr;   // [A]
  uint32_t* vals = nullptr;          // [A] assignment a = row·top_k + slot
  uint32_t* vals_sorted = nullptr;   // [A] assignments grouped by expert, ascending a within one
  TileInfo* tiles = nullptr;         // [max_routed_tiles]
  int32_t* num_tiles = nullptr;      // [1] routed tiles in use
  float* act = nullptr;              // [rows, top_k + 1, inter]: SwiGLU activations (slot top_k = shared)
  float* ybuf = nullptr;             // [rows, top_k + 1, dim]: →md(W2·act) per slot
  float* out = nullptr;              // [rows, dim]
  int64_t rows = 0, experts = 0, dim = 0, inter = 0, top_k = 1, max_routed_tiles = 0;
  int32_t tile_rows = kTile;         // assignments per routed tile in the table (kTile, or 128 for kGemm)
  float limit = 0.f;
  bool shared = true, bf16 = false;
};

__global__ void moe_keys_kernel(ExpertsParams const p) {
  device::pdl_enter();
  int64_t const a = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (a >= p.rows * p.top_k) return;
  int32_t const id = p.ids[a];
  p.keys[a] = (id >= 0 && id < p.experts) ? static_cast<uint32_t>(id) : static_cast<uint32_t>(p.experts);
  p.vals[a] = static_cast<uint32_t>(a);
}

/// Expert segments of the sorted keys (binary search per expert), then the tile table in expert order: thread t
/// owns the experts [t·per, (t + 1)·per), counts their tiles, takes its first slot from a block-wide exclusive scan
/// of those counts and writes them. The same table as a walk over the experts by one thread (the table is a pure
/// function of the routing); the walk cost ~15 µs a call at 384 experts on the H100.
__global__ void __launch_bounds__(256) moe_tiles_kernel(ExpertsParams const p) {
  device::pdl_enter();
  extern __shared__ int32_t off[];  // [experts + 1]
  __shared__ int32_t warp_total[8];
  int64_t const A = p.rows * p.top_k;
  for (int64_t e = threadIdx.x; e <= p.experts; e += blockDim.x) {
    int64_t lo = 0, hi = A;  // first index with key >= e
    while (lo < hi) {
      int64_t const mid = (lo + hi) >> 1;
      if (p.keys_sorted[mid] < static_cast<uint32_t>(e)) lo = mid + 1; else hi = mid;
    }
    off[e] = static_cast<int32_t>(lo);
  }
  __syncthreads();
  int const tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  int64_t const per = (p.experts + 255) / 256;
  int64_t const e0 = tid * per < p.experts ? tid * per : p.experts;
  int64_t const e1 = e0 + per < p.experts ? e0 + per : p.experts;
  int32_t count = 0;
  for (int64_t e = e0; e < e1; ++e) count += (off[e + 1] - off[e] + p.tile_rows - 1) / p.tile_rows;
  int32_t incl = count;  // inclusive scan within the warp, then over the warps' totals
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int32_t const v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  int32_t n = incl - count;
  for (int w = 0; w < warp; ++w) n += warp_total[w];
  for (int64_t e = e0; e < e1; ++e)
    for (int32_t s = off[e]; s < off[e + 1]; s += p.tile_rows) {
      int32_t const c = off[e + 1] - s < p.tile_rows ? off[e + 1] - s : p.tile_rows;
      p.tiles[n++] = TileInfo{static_cast<int32_t>(e), s, c, 0};
    }
  if (tid == 255) *p.num_tiles = n;
}

/// The rows of tile `t` (routed when t < max_routed_tiles): the slot index into act/ybuf ([rows, top_k+1])
/// and the expert; false when the block has no tile.
__device__ bool tile_rows(ExpertsParams const& p, int64_t t, int32_t (&slot)[kTile], int& n, int32_t& expert) {
  if (t < p.max_routed_tiles) {
    if (t >= *p.num_tiles) return false;
    TileInfo const ti = p.tiles[t];
    expert = ti.expert;
    n = ti.count;
    for (int r = 0; r < n; ++r) {
      uint32_t const a = p.vals_sorted[ti.start + r];
      slot[r] = static_cast<int32_t>((a / p.top_k) * (p.top_k + 1) + a % p.top_k);
    }
    return true;
  }
  if (!p.shared) return false;
  int64_t const tok0 = (t - p.max_routed_tiles) * kTile;
  if (tok0 >= p.rows) return false;
  expert = -1;
  n = static_cast<int>(p.rows - tok0 < kTile ? p.rows - tok0 : kTile);
  for (int r = 0; r < n; ++r) slot[r] = static_cast<int32_t>((tok0 + r) * (p.top_k + 1) + p.top_k);
  return true;
}

/// act[slot] = →md(w·(silu(min(g, L))·clamp(u, ±L))), g/u = →md(W1/W3·x); grid (inter/128, tiles).
template <class W>
__global__ void __launch_bounds__(kWarps * 32) moe_act_kernel(ExpertsParams const p) {
  device::pdl_enter();
  __shared__ float tiles[kWarps][32 * 33];
  __shared__ int32_t slot[kTile];
  __shared__ float const* xr[kTile];
  __shared__ float wt[kTile];
  __shared__ int n_s, expert_s, ok_s;
  if (threadIdx.x == 0) {
    int32_t sl[kTile];
    int n = 0;
    int32_t e = -1;
    ok_s = tile_rows(p, blockIdx.y, sl, n, e);
    n_s = n;
    expert_s = e;
    for (int r = 0; r < n; ++r) {
      slot[r] = sl[r];
      int64_t const tok = sl[r] / (p.top_k + 1), s = sl[r] % (p.top_k + 1);
      xr[r] = p.x + tok * p.dim;
      wt[r] = s < p.top_k ? p.weights[tok * p.top_k + s] : 0.f;
    }
  }
  __syncthreads();
  if (!ok_s) return;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 32;
  if (o0 >= p.inter) return;
  int const e = expert_s, n = n_s;
  W const* w1 = static_cast<W const*>(e >= 0 ? p.w.w1[e] : p.w.shared_w1);
  W const* w3 = static_cast<W const*>(e >= 0 ? p.w.w3[e] : p.w.shared_w3);
  float g[kTile], u[kTile];
  if (p.bf16) {
    warp_dot_rows_ptr<kTile, W, device::TcDotAcc>(xr, n, w1, p.dim, p.dim, o0, p.inter, tiles[warp], g);
    warp_dot_rows_ptr<kTile, W, device::TcDotAcc>(xr, n, w3, p.dim, p.dim, o0, p.inter, tiles[warp], u);
  } else {
    warp_dot_rows_ptr<kTile>(xr, n, w1, p.dim, p.dim, o0, p.inter, tiles[warp], g);
    warp_dot_rows_ptr<kTile>(xr, n, w3, p.dim, p.dim, o0, p.inter, tiles[warp], u);
  }
  int64_t const i = o0 + lane;
  if (i >= p.inter) return;
#pragma unroll
  for (int r = 0; r < kTile; ++r) {
    if (r >= n) break;
    float gv = device::round_md(g[r], p.bf16), uv = device::round_md(u[r], p.bf16);
    if (p.limit > 0.f) { uv = device::std_clamp(uv, -p.limit, p.limit); gv = device::std_min(gv, p.limit); }
    float y = __fmul_rn(device::silu(gv, p.bf16), uv);
    if (e >= 0) y = __fmul_rn(wt[r], y);
    p.act[static_cast<int64_t>(slot[r]) * p.inter + i] = device::round_md(y, p.bf16);
  }
}

/// ybuf[slot] = →md(W2·act[slot]); grid (dim/128, tiles).
template <class W>
__global__ void __launch_bounds__(kWarps * 32) moe_down_kernel(ExpertsParams const p) {
  device::pdl_enter();
  __shared__ float tiles[kWarps][32 * 33];
  __shared__ int32_t slot[kTile];
  __shared__ float const* ar[kTile];
  __shared__ int n_s, expert_s, ok_s;
  if (threadIdx.x == 0) {
    int32_t sl[kTile];
    int n = 0;
    int32_t e = -1;
    ok_s = tile_rows(p, blockIdx.y, sl, n, e);
    n_s = n;
    expert_s = e;
    for (int r = 0; r < n; ++r) { slot[r] = sl[r]; ar[r] = p.act + static_cast<int64_t>(sl[r]) * p.inter; }
  }
  __syncthreads();
  if (!ok_s) return;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 32;
  if (o0 >= p.dim) return;
  int const e = expert_s, n = n_s;
  W const* w2 = static_cast<W const*>(e >= 0 ? p.w.w2[e] : p.w.shared_w2);
  float y[kTile];
  if (p.bf16) warp_dot_rows_ptr<kTile, W, device::TcDotAcc>(ar, n, w2, p.inter, p.inter, o0, p.dim, tiles[warp], y);
  else warp_dot_rows_ptr<kTile>(ar, n, w2, p.inter, p.inter, o0, p.dim, tiles[warp], y);
  int64_t const o = o0 + lane;
  if (o >= p.dim) return;
#pragma unroll
  for (int r = 0; r < kTile; ++r) {
    if (r >= n) break;
    p.ybuf[static_cast<int64_t>(slot[r]) * p.dim + o] = device::round_md(y[r], p.bf16);
  }
}

/// Decode-sized launches (≤ kChunkTile rows, so no tile holds more than kChunkTile assignments): the
/// same act and y values, one warp per output: fp32 with ref::dot's chunks spread over the lanes
/// (warp_dot_row), so every weight load of a row is in flight at once; bf16 in the tensor-core block order
/// with a lane per K index and the block chain run by the whole warp (warp_dot_row_tc).
/// grid (outputs/kWarps, tiles).
constexpr int kChunkTile = 4;
constexpr int kChunksPerLane = 8;  // dim, inter ≤ 8192

/// The block's tile (routed or shared) in shared memory; false when the block has no tile.
struct TileShared {
  int32_t slot[kTile];
  float const* xr[kTile];
  float wt[kTile];
  int n, expert, ok;
};

__device__ void load_tile(ExpertsParams const& p, float const* rows_base, int64_t row_len, bool by_token, TileShared& t) {
  if (threadIdx.x == 0) {
    int32_t sl[kTile];
    int n = 0;
    int32_t e = -1;
    t.ok = tile_rows(p, blockIdx.y, sl, n, e);
    t.n = n;
    t.expert = e;
    for (int r = 0; r < n; ++r) {
      t.slot[r] = sl[r];
      int64_t const tok = sl[r] / (p.top_k + 1), s = sl[r] % (p.top_k + 1);
      t.xr[r] = by_token ? rows_base + tok * row_len : rows_base + static_cast<int64_t>(sl[r]) * row_len;
      t.wt[r] = s < p.top_k ? p.weights[tok * p.top_k + s] : 0.f;
    }
  }
  __syncthreads();
}

template <class W, bool kTc>
__global__ void __launch_bounds__(kWarps * 32) moe_act_chunks_kernel(ExpertsParams const p) {
  device::pdl_enter();
  __shared__ TileShared t;
  load_tile(p, p.x, p.dim, true, t);
  if (!t.ok) return;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const i = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (i >= p.inter) return;
  int const e = t.expert, n = t.n;
  W const* w1 = static_cast<W const*>(e >= 0 ? p.w.w1[e] : p.w.shared_w1);
  W const* w3 = static_cast<W const*>(e >= 0 ? p.w.w3[e] : p.w.shared_w3);
  float const* const* xr = t.xr;
  auto x = [xr](int r, int64_t k) { return xr[r][k]; };
  float g[kChunkTile], u[kChunkTile];
  if constexpr (kTc) {
    warp_dot_row_tc<kChunkTile>(x, n, w1 + i * p.dim, p.dim, g);
    warp_dot_row_tc<kChunkTile>(x, n, w3 + i * p.dim, p.dim, u);
  } else {
    warp_dot_row<kChunkTile, kChunksPerLane>(x, n, w1 + i * p.dim, p.dim, g);
    warp_dot_row<kChunkTile, kChunksPerLane>(x, n, w3 + i * p.dim, p.dim, u);
  }
#pragma unroll
  for (int r = 0; r < kChunkTile; ++r) {
    if (r != lane || r >= n) continue;
    float gv = device::round_md(g[r], p.bf16), uv = device::round_md(u[r], p.bf16);
    if (p.limit > 0.f) { uv = device::std_clamp(uv, -p.limit, p.limit); gv = device::std_min(gv, p.limit); }
    float y = __fmul_rn(device::silu(gv, p.bf16), uv);
    if (e >= 0) y = __fmul_rn(t.wt[r], y);
    p.act[static_cast<int64_t>(t.slot[r]) * p.inter + i] = device::round_md(y, p.bf16);
  }
}

template <class W, bool kTc>
__global__ void __launch_bounds__(kWarps * 32) moe_down_chunks_kernel(ExpertsParams const p) {
  device::pdl_enter();
  __shared__ TileShared t;
  load_tile(p, p.act, p.inter, false, t);
  if (!t.ok) return;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const o = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (o >= p.dim) return;
  int const e = t.expert, n = t.n;
  W const* w2 = static_cast<W const*>(e >= 0 ? p.w.w2[e] : p.w.shared_w2);
  float const* const* ar = t.xr;
  float y[kChunkTile];
  auto a = [ar](int r, int64_t k) { return ar[r][k]; };
  if constexpr (kTc) warp_dot_row_tc<kChunkTile>(a, n, w2 + o * p.inter, p.inter, y);
  else warp_dot_row<kChunkTile, kChunksPerLane>(a, n, w2 + o * p.inter, p.inter, y);
#pragma unroll
  for (int r = 0; r < kChunkTile; ++r)
    if (r == lane && r < n) p.ybuf[static_cast<int64_t>(t.slot[r]) * p.dim + o] = device::round_md(y[r], p.bf16);
}

/// The decode-sized act and down launches; kTc: the bf16 (tensor-core) dot order, a separate instantiation so
/// neither order's registers weigh on the other.
template <class W, bool kTc>
Status launch_moe_chunks(ExpertsParams const& p, dim3 ca, dim3 cd, cudaStream_t st) {
  device::launch_pdl(moe_act_chunks_kernel<W, kTc>, ca, kWarps * 32, 0, st, p);
  TESSERA_TRY(launch_status("moe_act_chunks_kernel"));
  device::launch_pdl(moe_down_chunks_kernel<W, kTc>, cd, kWarps * 32, 0, st, p);
  return launch_status("moe_down_chunks_kernel");
}

/// out = →md(Σ_{slots by ascending expert id} ybuf + ybuf[shared]) from +0; grid (dim/256, rows).
__global__ void __launch_bounds__(256) moe_combine_kernel(ExpertsParams const p) {
  device::pdl_enter();
  __shared__ int order[kMaxTopK];
  int64_t const row = blockIdx.y, k = p.top_k;
  if (threadIdx.x == 0)
    for (int64_t i = 0; i < k; ++i) {
      int32_t const id = p.ids[row * k + i];
      int64_t j = i;
      while (j > 0 && id < p.ids[row * k + order[j - 1]]) { order[j] = order[j - 1]; --j; }
      order[j] = static_cast<int>(i);
    }
  __syncthreads();
  int64_t const o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= p.dim) return;
  float const* yb = p.ybuf + row * (k + 1) * p.dim + o;
  float total = 0.f;
  for (int64_t t = 0; t < k; ++t) {
    int32_t const id = p.ids[row * k + order[t]];
    if (id < 0 || id >= p.experts) continue;
    total = __fadd_rn(total, yb[order[t] * p.dim]);
  }
  if (p.shared) total = __fadd_rn(total, yb[k * p.dim]);
  p.out[row * p.dim + o] = device::round_md(total, p.bf16);
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<MoeExperts<Backend::kCuda>, MoeExpertsDesc, MoeExpertsArgs>);


namespace {

/// Whether kAuto sends the block-scaled routed tiles of a call to the warp-specialised kernels: when the direct
/// tile does not take them (ops::moe_direct_tiles_fit) and the call has more than kTcDirectMaxRows tokens. The
/// one-warp direct tiles keep ~32 blocks of codes in flight per warp through their cp.async ring.
/// TESSERA_MOE_WS=0 / 1 forces the one-warp / warp-specialised choice (read once; for benchmarks: the values never
/// change, only the speed). H100, fp8 synthetic v41-flash (384 FP4 experts), one layer + head, step ms,
/// warp-specialised → direct: b2 1.77 → 1.34, b4 2.50 → 1.67 (bench/RESULTS.md, session 26).
bool moe_auto_warp_spec(MoeExpertsDesc const& d) {
  static int const forced = [] {
    char const* e = std::getenv("TESSERA_MOE_WS");
    return e && std::string(e) == "1" ? 1 : e && std::string(e) == "0" ? 0 : -1;
  }();
  return forced >= 0 ? forced == 1 : d.rows > ops::kTcDirectMaxRows && !moe_direct_tiles_fit(d);
}

/// The path of a call: ops::moe_tc_path_for, whose kAuto takes kGemm from min(kMoeTcGemmMinPerExpert per expert,
/// kMoeTcGemmMinAssignments) assignments, or on direct tiles from kMoeTcDirectGemmMinPerExpert per expert;
/// TESSERA_MOE_GEMM_MIN=n, TESSERA_MOE_GEMM_MIN_ROWS=a and TESSERA_MOE_GEMM_MIN_DIRECT=m (each ≥ 1) replace those
/// three (read once; for benchmarks: every path gives the same values, only the speed differs).
MoeTcPath moe_path(MoeExpertsDesc const& d) {
  static auto const env = [](char const* name, int64_t dflt) {
    char const* e = std::getenv(name);
    int64_t const v = e ? std::atoll(e) : 0;
    return v >= 1 ? v : dflt;
  };
  static int64_t const min_per_expert = env("TESSERA_MOE_GEMM_MIN", kMoeTcGemmMinPerExpert);
  static int64_t const min_assignments = env("TESSERA_MOE_GEMM_MIN_ROWS", kMoeTcGemmMinAssignments);
  static int64_t const min_per_expert_direct = env("TESSERA_MOE_GEMM_MIN_DIRECT", kMoeTcDirectGemmMinPerExpert);
  return moe_tc_path_for(d, min_per_expert, min_assignments, min_per_expert_direct);
}

/// The wgmma kGemm tiles' idle warpgroup (rows past the tile's count) issues no wgmma
/// (moe_tc::MoeTcParams::wg_skip_idle; same values: verify_gpu_moe_tc / moe_scaled on the H100). On by default:
/// 384 experts, one fp8 layer, prefill 128 … 2K 2.6–5.8 % faster and decode b64 12.80 → 12.07 ms (bench/RESULTS.md
/// 2026-12-07, session 24). TESSERA_MOE_WG_SKIP=0 turns it off for A/B runs (read once).
bool moe_wg_skip_idle() {
  static bool const on = [] {
    char const* e = std::getenv("TESSERA_MOE_WG_SKIP");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

/// kGemm with a block-scaled shared expert decodes it to bf16 once per call for the bf16 block tiles, except on the
/// wgmma tiles over in-tile decoded routed experts (no decode groups), which read the shared expert's codes the same
/// way (moe_tc_wgmma.cuh; same values). At 384 experts kGemm serves decode from 6 rows: the FP8 shared expert's
/// 35.4 MB of codes read in the tiles instead of a 70.8 MB bf16 copy written and read back every call.
bool shared_decoded_for_gemm(MoeExpertsDesc const& d, MoeTcPath path) {
  if (!moe_shared_scaled(d) || path != MoeTcPath::kGemm) return false;
  return !(moe_routed_scaled(d) && d.decode_group_experts <= 0 && ops::tc_wgmma_auto());
}

/// Whether a kSkinny call of more than kTcDirectMaxRows tokens runs its block-scaled routed tiles on the direct tile
/// (moe_direct_tiles_fit, and kDirect or kAuto without the warp-specialised choice): its tile table then cuts each
/// expert's assignments (and the shared expert's tokens) into tiles of at most kTcDirectMaxRows (up to
/// kTcDirectMaxRows tokens the tiles of 8 hold no more). Same values with any tiles: a row's chains never depend on
/// the rows beside it.
bool moe_direct_tiles(MoeExpertsDesc const& d, MoeTcPath path) {
  if (path != MoeTcPath::kSkinny || d.rows <= ops::kTcDirectMaxRows || !moe_direct_tiles_fit(d)) return false;
  return d.routed_quant_path == TcQuantPath::kDirect || !moe_auto_warp_spec(d);
}

/// Scratch of one call. The tensor-core paths keep act as bf16 bits and add x_bf16 [rows, dim].
struct ExpertsLayout {
  size_t act, ybuf, x_bf16, shared_bf16, keys, keys_sorted, vals, vals_sorted, tiles, num_tiles, cub, total;
  MoeTcPath path;
  int64_t tile_rows, max_routed_tiles;
};

/// Routed tile slots of a table of tiles of T assignments (the bound in the header comment).
int64_t max_routed_tiles(MoeExpertsDesc const& d, int64_t T) {
  int64_t const A = d.rows * d.top_k;
  return kernels::ceil_div(A, T) + std::min(d.experts, A);
}

ExpertsLayout experts_layout(MoeExpertsDesc const& d) {
  using kernels::align256;
  int64_t const A = d.rows * d.top_k, slots = d.rows * (d.top_k + 1);
  ExpertsLayout L{};
  L.path = moe_path(d);
  bool const tc = L.path != MoeTcPath::kEmulated;
  L.tile_rows = L.path == MoeTcPath::kGemm    ? kernels::moe_tc::kGemmTileRows
                : moe_direct_tiles(d, L.path) ? ops::kTcDirectMaxRows
                                              : kernels::kTile;
  L.max_routed_tiles = max_routed_tiles(d, L.tile_rows);
  size_t cub_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<uint32_t const*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), static_cast<uint32_t const*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), static_cast<int64_t>(A));
  size_t off = 0;
  auto take = [&](size_t bytes) { size_t const o = off; off += align256(bytes); return o; };
  L.act = take(static_cast<size_t>(slots * d.inter) * (tc ? sizeof(uint16_t) : sizeof(float)));
  L.ybuf = take(static_cast<size_t>(slots * d.dim) * sizeof(float));
  L.x_bf16 = take(tc ? static_cast<size_t>(d.rows * d.dim) * sizeof(uint16_t) : 0);
  // kGemm with a block-scaled shared expert on the bf16 block tiles: its W1 | W3 | W2 decoded to bf16.
  bool const shared_decoded = shared_decoded_for_gemm(d, L.path);
  L.shared_bf16 = take(shared_decoded ? static_cast<size_t>(3 * d.dim * d.inter) * sizeof(uint16_t) : 0);
  L.keys = take(static_cast<size_t>(A) * 4); L.keys_sorted = take(static_cast<size_t>(A) * 4);
  L.vals = take(static_cast<size_t>(A) * 4); L.vals_sorted = take(static_cast<size_t>(A) * 4);
  L.tiles = take(static_cast<size_t>(L.max_routed_tiles) * sizeof(kernels::TileInfo));
  L.num_tiles = take(sizeof(int32_t));
  L.cub = take(cub_bytes);
  L.total = off;
  return L;
}

}  // namespace

size_t MoeExperts<Backend::kCuda>::workspace_bytes(MoeExpertsDesc const& d) { return experts_layout(d).total; }

Status MoeExperts<Backend::kCuda>::check(MoeExpertsDesc const& d, MoeExpertsArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.weight_dtype == DType::kF32 || d.weight_dtype == DType::kBf16,
                "moe_experts weight_dtype must be f32 or bf16");
  TESSERA_CHECK(d.top_k >= 1 && d.top_k <= kMoeCudaMaxTopK, "moe_experts CUDA supports 1 <= top_k <= 16");
  TESSERA_CHECK(d.experts >= 1 && d.experts <= 8192, "moe_experts CUDA supports 1..8192 experts");
  TESSERA_CHECK(d.dim > 0 && d.inter > 0, "moe_experts dim and inter must be positive");
  TESSERA_CHECK(d.tc_path == MoeTcPath::kAuto || d.tc_path == MoeTcPath::kEmulated ||
                    d.tc_path == MoeTcPath::kSkinny || d.tc_path == MoeTcPath::kGemm,
                "moe_experts: unknown tc_path");
  {
    int64_t const T = moe_path(d) == MoeTcPath::kGemm ? kernels::moe_tc::kGemmTileRows : kernels::kTile;
    TESSERA_CHECK(d.rows <= 65535 && max_routed_tiles(d, T) + kernels::ceil_div(d.rows, T) <= 65535,
                  "moe_experts CUDA: too many rows per launch (split the batch)");
  }
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "moe_experts x"));
  TESSERA_TRY(check_shape(a.ids, {d.rows, d.top_k}, "moe_experts ids"));
  TESSERA_TRY(check_shape(a.weights, {d.rows, d.top_k}, "moe_experts weights"));
  TESSERA_TRY(check_shape(a.out, {d.rows, d.dim}, "moe_experts out"));
  TESSERA_CHECK(a.dev.w1 && a.dev.w3 && a.dev.w2, "moe_experts CUDA needs the device pointer arrays dev.w1/w3/w2");
  if (moe_routed_scaled(d)) {
    TESSERA_CHECK(d.weight_dtype == DType::kBf16 && d.md == DType::kBf16,
                  "moe_experts: block-scaled routed experts need weight_dtype = md = bf16");
    TESSERA_CHECK(d.tc_path == MoeTcPath::kAuto || d.tc_path == MoeTcPath::kSkinny || d.tc_path == MoeTcPath::kGemm,
                  "moe_experts: block-scaled routed experts run on the kSkinny or kGemm path");
    TESSERA_CHECK(d.decode_group_experts >= 0, "moe_experts: decode_group_experts must be ≥ 0");
    TESSERA_CHECK(d.dim % 32 == 0 && d.inter % 32 == 0 && d.dim <= kTcQuantMaxK && d.inter <= kTcQuantMaxK,
                  "moe_experts: block-scaled routed experts need dim and inter multiples of 32, at most " +
                      std::to_string(kTcQuantMaxK));
    TESSERA_CHECK(a.dev.s1 && a.dev.s3 && a.dev.s2, "moe_experts: block-scaled routed experts need dev.s1/s3/s2");
    if (!tc_quant_format_fused(d.routed_scaled))
      return not_supported("moe_experts: block-scaled routed experts in " + std::string(dtype_name(d.routed_scaled)) +
                           " have no verified fused tile (ops::tc_quant_format_fused)");
  } else {
    TESSERA_CHECK(d.routed_scaled == DType::kF32 || d.routed_scaled == d.weight_dtype,
                  "moe_experts routed_scaled must be f8_e4m3, f4_e2m1x2 or unset");
  }
  if (d.shared_expert)
    TESSERA_CHECK(a.dev.shared_w1 && a.dev.shared_w3 && a.dev.shared_w2,
                  "moe_experts CUDA needs dev.shared_w1/w3/w2 when shared_expert");
  if (moe_shared_scaled(d)) {
    // The block-scaled shared expert runs on the routed experts' block-scaled paths (their checks above).
    TESSERA_CHECK(moe_routed_scaled(d), "moe_experts: a block-scaled shared expert needs block-scaled routed experts");
    TESSERA_CHECK(a.dev.shared_s1 && a.dev.shared_s3 && a.dev.shared_s2,
                  "moe_experts: a block-scaled shared expert needs dev.shared_s1/s3/s2");
    for (void const* q : {a.dev.shared_w1, a.dev.shared_w3, a.dev.shared_w2})
      TESSERA_CHECK((reinterpret_cast<uintptr_t>(q) & 15u) == 0,
                    "moe_experts: a block-scaled shared expert needs 16-byte aligned codes");
    if (!tc_quant_format_fused(d.shared_scaled))
      return not_supported("moe_experts: a block-scaled shared expert in " + std::string(dtype_name(d.shared_scaled)) +
                           " has no verified fused tile (ops::tc_quant_format_fused)");
  } else {
    TESSERA_CHECK(!d.shared_expert || d.shared_scaled == DType::kF32 || d.shared_scaled == d.weight_dtype,
                  "moe_experts shared_scaled must be f8_e4m3, f4_e2m1x2 or unset");
  }
  return {};
}

Status MoeExperts<Backend::kCuda>::run(MoeExpertsDesc const& d, MoeExpertsArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  ExpertsLayout const L = experts_layout(d);
  Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, L.total));
  auto* base = static_cast<unsigned char*>(ws.ptr);
  ExpertsParams p;
  p.x = a.x.data; p.ids = a.ids.data; p.weights = a.weights.data; p.w = a.dev; p.out = a.out.data;
  p.keys = reinterpret_cast<uint32_t*>(base + L.keys);
  p.keys_sorted = reinterpret_cast<uint32_t*>(base + L.keys_sorted);
  p.vals = reinterpret_cast<uint32_t*>(base + L.vals);
  p.vals_sorted = reinterpret_cast<uint32_t*>(base + L.vals_sorted);
  p.tiles = reinterpret_cast<TileInfo*>(base + L.tiles);
  p.num_tiles = reinterpret_cast<int32_t*>(base + L.num_tiles);
  p.act = reinterpret_cast<float*>(base + L.act);
  p.ybuf = reinterpret_cast<float*>(base + L.ybuf);
  p.rows = d.rows; p.experts = d.experts; p.dim = d.dim; p.inter = d.inter; p.top_k = d.top_k;
  p.max_routed_tiles = L.max_routed_tiles;
  p.tile_rows = static_cast<int32_t>(L.tile_rows);
  p.limit = d.swiglu_limit; p.shared = d.shared_expert; p.bf16 = d.md == DType::kBf16;
  cudaStream_t const st = stream_of(ctx);
  int64_t const A = d.rows * d.top_k;
  device::launch_pdl(moe_keys_kernel, static_cast<unsigned>(ceil_div(A, 256)), 256, 0, st, p);
  TESSERA_TRY(launch_status("moe_keys_kernel"));
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= d.experts) ++end_bit;  // keys are 0..experts
  size_t cub_bytes = L.total - L.cub;
  TESSERA_TRY(cuda_status(cub::DeviceRadixSort::SortPairs(base + L.cub, cub_bytes,
                                                          static_cast<uint32_t const*>(p.keys), p.keys_sorted,
                                                          static_cast<uint32_t const*>(p.vals), p.vals_sorted, A, 0,
                                                          end_bit, st),
                          "moe_experts expert sort"));
  device::launch_pdl(moe_tiles_kernel, 1, 256, static_cast<size_t>(d.experts + 1) * sizeof(int32_t), st, p);
  TESSERA_TRY(launch_status("moe_tiles_kernel"));
  dim3 gc(static_cast<unsigned>(ceil_div(d.dim, 256)), static_cast<unsigned>(d.rows));
  if (L.path != MoeTcPath::kEmulated) {
    moe_tc::MoeTcParams q;
    auto* const xb = reinterpret_cast<uint16_t*>(base + L.x_bf16);
    q.x = xb; q.weights = p.weights; q.w = p.w; q.vals_sorted = p.vals_sorted;
    q.tiles = p.tiles; q.num_tiles = p.num_tiles;
    q.act = reinterpret_cast<uint16_t*>(base + L.act); q.ybuf = p.ybuf;
    q.rows = d.rows; q.dim = d.dim; q.inter = d.inter; q.top_k = d.top_k; q.max_routed_tiles = L.max_routed_tiles;
    q.tile_rows = p.tile_rows; q.limit = d.swiglu_limit; q.shared = d.shared_expert;
    q.routed_scaled = moe_routed_scaled(d) ? d.routed_scaled : DType::kBf16;
    q.direct_ok = d.routed_quant_path != TcQuantPath::kRing && d.routed_quant_path != TcQuantPath::kWarpSpec;
    q.warp_spec = d.routed_quant_path == TcQuantPath::kWarpSpec ||
                  (d.routed_quant_path == TcQuantPath::kAuto && moe_auto_warp_spec(d));
    q.wg_skip_idle = moe_wg_skip_idle();
    TESSERA_TRY(moe_tc::launch_convert_x(p.x, xb, d.rows * d.dim, st));
    if (moe_shared_scaled(d)) {
      q.shared_scaled = d.shared_scaled;
      if (shared_decoded_for_gemm(d, L.path)) {  // the bf16 block tiles on the shared expert decoded once per call
        auto* const sb = reinterpret_cast<uint16_t*>(base + L.shared_bf16);
        TESSERA_TRY(moe_tc::launch_decode_shared(q, sb, st));
        q.w.shared_w1 = sb;
        q.w.shared_w3 = sb + d.inter * d.dim;
        q.w.shared_w2 = sb + 2 * d.inter * d.dim;
        q.shared_scaled = DType::kBf16;
      }
    }
    if (L.path == MoeTcPath::kGemm && moe_routed_scaled(d) && d.decode_group_experts > 0) {
      TESSERA_TRY(moe_tc::launch_gemm_decoded(q, d.experts, std::min(d.decode_group_experts, d.experts), st));
    } else if (L.path == MoeTcPath::kGemm && moe_routed_scaled(d)) {
      TESSERA_TRY(moe_tc::launch_gemm_scaled(q, st));
    } else if (L.path == MoeTcPath::kGemm) {
      TESSERA_TRY(moe_tc::launch_gemm(q, st));
    } else {
      TESSERA_TRY(moe_tc::launch_skinny(q, st));
    }
    device::launch_pdl(moe_combine_kernel, gc, 256, 0, st, p);
    return launch_status("moe_combine_kernel");
  }
  unsigned const ny = static_cast<unsigned>(L.max_routed_tiles + ceil_div(d.rows, kTile));
  dim3 ga(static_cast<unsigned>(ceil_div(d.inter, kWarps * 32)), ny);
  dim3 gd(static_cast<unsigned>(ceil_div(d.dim, kWarps * 32)), ny);
  if (d.rows <= kChunkTile && d.dim <= 32 * 32 * kChunksPerLane && d.inter <= 32 * 32 * kChunksPerLane) {
    dim3 const ca(static_cast<unsigned>(ceil_div(d.inter, kWarps)), ny);
    dim3 const cd(static_cast<unsigned>(ceil_div(d.dim, kWarps)), ny);
    bool const bf16_w = d.weight_dtype == DType::kBf16;
    if (bf16_w && p.bf16) TESSERA_TRY((launch_moe_chunks<Bf16, true>(p, ca, cd, st)));
    else if (bf16_w) TESSERA_TRY((launch_moe_chunks<Bf16, false>(p, ca, cd, st)));
    else if (p.bf16) TESSERA_TRY((launch_moe_chunks<float, true>(p, ca, cd, st)));
    else TESSERA_TRY((launch_moe_chunks<float, false>(p, ca, cd, st)));
  } else if (d.weight_dtype == DType::kBf16) {
    device::launch_pdl(moe_act_kernel<Bf16>, ga, kWarps * 32, 0, st, p);
    TESSERA_TRY(launch_status("moe_act_kernel"));
    device::launch_pdl(moe_down_kernel<Bf16>, gd, kWarps * 32, 0, st, p);
  } else {
    device::launch_pdl(moe_act_kernel<float>, ga, kWarps * 32, 0, st, p);
    TESSERA_TRY(launch_status("moe_act_kernel"));
    device::launch_pdl(moe_down_kernel<float>, gd, kWarps * 32, 0, st, p);
  }
  TESSERA_TRY(launch_status("moe_down_kernel"));
  device::launch_pdl(moe_combine_kernel, gc, 256, 0, st, p);
  return launch_status("moe_combine_kernel");
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of MoeRoute (include/tessera/ops/moe.hpp, ref/moe_ref.hpp, spec §2.6; the experts: moe_cuda.cu).
///   Scores: moe_score_chunks_kernel (dim ≤ 8192: the (expert, chunk) FMA chains over a block's threads) or
///     moe_score_kernel (one warp per expert) forms s_e = sqrt(softplus(x·W_e / temp)) (the dot in ref::dot's
///     order in both model dtypes; softplus in the model dtype's arithmetic, device::softplus as ref::softplus:
///     bitwise as the CPU) and biased_e = s_e + b_e (−∞ for a masked expert) into scratch.
///   Selection: moe_route_kernel, one block per token: warp 0 selects the top-k by (value desc, id asc) in k
///     warp-wide arg-max passes (an exact total order, so ties go to the lower id as ref::topk_select) and sets
///     the cutoff-tie flag; thread 0 renormalises (sum in selection order), scales, and applies
///     ref::moe_prune_row (stable order by weight).
#include <algorithm>
#include <cstdint>

#include "kernels/common/cuda_util.cuh"
#include "kernels/linear/linear_tc.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/moe.hpp"

namespace tessera::kernels {

namespace {

constexpr int kMaxTopK = ops::kMoeCudaMaxTopK;

struct RouteParams {
  float const* x = nullptr;       // [rows, dim]
  float const* gate = nullptr;    // [experts, dim]
  float const* bias = nullptr;    // [experts] or null
  uint8_t const* mask = nullptr;  // [experts] or null; nonzero = never selected
  float* weights = nullptr;       // [rows, top_k]
  int32_t* ids = nullptr;         // [rows, top_k]
  uint8_t* cutoff_tie = nullptr;  // [rows]
  int64_t rows = 0, experts = 0, dim = 0, top_k = 1;
  float temp = 1.f, routed_scale = 1.f, prune_top_p = 1.f;
  int64_t prune_min_k = 0;
  bool norm = true, prune_renorm = true;
  bool bf16 = false;  // the model dtype: softplus's arithmetic
};

/// (v, i) better than (w, j): larger value, then lower index. −∞ and NaN never qualify (callers filter).
__device__ __forceinline__ bool better(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

constexpr int kRouteChunksPerLane = 8;  // dim ≤ 8192 on the chunk-parallel path
constexpr int kScoreWarps = 8;          // experts per score block (one warp each)
constexpr int kScoreRows = 4;           // rows per score block (each warp's gate row serves them all)

/// The per-(row, expert) tail of the score: s_e = sqrt(softplus(dot / temp)), biased_e = s_e + b_e (−∞ masked).
__device__ __forceinline__ void store_score(RouteParams const& p, float* scores, int64_t row, int64_t e, float dot) {
  float const se = sqrtf(device::softplus(__fdiv_rn(dot, p.temp), p.bf16));
  scores[row * 2 * p.experts + e] = se;
  scores[row * 2 * p.experts + p.experts + e] = (p.mask && p.mask[e]) ? -INFINITY : __fadd_rn(se, p.bias ? p.bias[e] : 0.f);
}

/// scores[row, e] = s_e and scores[row, E + e] = biased_e for dim > kChunkScoreMaxDim: one warp per expert,
/// kScoreRows rows per block, each (row, expert) dot a chain of warp_dot_row (ref::dot's order) or, past
/// 32·32·kRouteChunksPerLane, device::dot_seq.
__global__ void __launch_bounds__(kScoreWarps * 32) moe_score_kernel(RouteParams const p, float* scores) {
  device::pdl_enter();
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const row0 = static_cast<int64_t>(blockIdx.y) * kScoreRows,
                e = static_cast<int64_t>(blockIdx.x) * kScoreWarps + warp;
  if (e >= p.experts) return;
  int const n_x = static_cast<int>(p.rows - row0 < kScoreRows ? p.rows - row0 : kScoreRows);
  float const* x = p.x + row0 * p.dim;
  int64_t const dim = p.dim;
  float dot[kScoreRows];
  if (p.dim <= 32 * 32 * kRouteChunksPerLane) {  // ref::dot's chunks over the lanes
    warp_dot_row<kScoreRows, kRouteChunksPerLane>([x, dim](int r, int64_t k) { return __ldg(x + r * dim + k); }, n_x,
                                                  p.gate + e * p.dim, p.dim, dot);
  } else {
    for (int r = 0; r < n_x; ++r) dot[r] = device::dot_seq(x + r * dim, p.gate + e * p.dim, p.dim);
  }
  if (lane != 0) return;
  for (int r = 0; r < n_x; ++r) store_score(p, scores, row0 + r, e, dot[r]);
}

/// The chunk-parallel score kernel (dim ≤ kChunkScoreMaxDim): ref::dot(x_r, W_e) is a sum, in chunk order, of
/// independent 32-wide FMA chains from +0, so the block spreads the (expert, chunk) chains of its experts
/// over all its threads (the whole block works on one expert's row at once; a warp-per-expert kernel walks
/// 160 chunks on one warp) and one thread per (row, expert) then adds the chunk sums in chunk order: the
/// same fp32 operations as ref::dot, whatever the grid, the rows around or the experts per block.
/// Block: kChunkScoreThreads threads, experts [e0, e0 + eb), rows [row0, row0 + rb) (rb ≤ kScoreRows). The x rows are
/// staged in shared memory at index k + k/32 (a 33-float pitch per chunk: lanes on consecutive chunks hit
/// distinct banks); the chunk sums go to part[(r·eb + e)·pitch + c] (pitch = chunks + 1, conflict-free fold).
/// Each chain reads its chunk's 32 gate weights (128 contiguous bytes) once for all the block's rows.
constexpr int kChunkScoreThreads = 256;
constexpr int64_t kChunkScoreMaxDim = 8192;
__global__ void __launch_bounds__(kChunkScoreThreads) moe_score_chunks_kernel(RouteParams const p, int rb, int eb, float* scores) {
  device::pdl_enter();
  extern __shared__ __align__(16) float sm[];
  int64_t const dim = p.dim, chunks = (dim + 31) / 32, pitch = chunks + 1, xpitch = chunks * 33;
  int64_t const row0 = static_cast<int64_t>(blockIdx.y) * rb, e0 = static_cast<int64_t>(blockIdx.x) * eb;
  int const n_x = static_cast<int>(p.rows - row0 < rb ? p.rows - row0 : rb);
  int const n_e = static_cast<int>(p.experts - e0 < eb ? p.experts - e0 : eb);
  float* xs = sm;                  // [rb][chunks · 33]
  float* part = sm + rb * xpitch;  // [rb · eb][pitch]
  for (int r = 0; r < n_x; ++r)
    for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) xs[r * xpitch + k + k / 32] = __ldg(p.x + (row0 + r) * dim + k);
  __syncthreads();
  for (int64_t item = threadIdx.x; item < n_e * chunks; item += blockDim.x) {
    int const el = static_cast<int>(item / chunks);
    int64_t const c = item % chunks, k0 = c * 32;
    int const len = static_cast<int>(dim - k0 < 32 ? dim - k0 : 32);
    float wv[32];
    load_chunk(p.gate + (e0 + el) * dim + k0, len, wv);
#pragma unroll
    for (int r = 0; r < kScoreRows; ++r) {
      if (r >= n_x) break;
      float const* xc = xs + r * xpitch + c * 33;
      float acc = 0.f;
#pragma unroll
      for (int t = 0; t < 32; ++t)
        if (t < len) acc = __fmaf_rn(xc[t], wv[t], acc);
      part[(r * eb + el) * pitch + c] = acc;
    }
  }
  __syncthreads();
  if (threadIdx.x >= n_x * eb) return;
  int const r = static_cast<int>(threadIdx.x) / eb, el = static_cast<int>(threadIdx.x) % eb;
  if (el >= n_e) return;
  float const* ps = part + (r * eb + el) * pitch;
  float dot = ps[0];
  for (int64_t c = 1; c < chunks; ++c) dot = __fadd_rn(dot, ps[c]);
  store_score(p, scores, row0 + r, e0 + el, dot);
}

/// One block per row: the row's scores (moe_score_kernel) into shared memory, then the selection below. Selected
/// experts drop out of a copy of the biased scores (−∞), so a pass reads each score once; the weights stay in
/// thread 0's registers until they are stored (a round trip through global memory per access cost ~20 µs a call).
__global__ void __launch_bounds__(256) moe_route_kernel(RouteParams const p, float const* scores) {
  device::pdl_enter();
  extern __shared__ float smem[];
  float* s = smem;                        // [experts] unbiased scores; then [experts] the biased ones as read
  float* cand = smem + 2 * p.experts;     // [experts] biased, −∞ once selected
  __shared__ int sel[kMaxTopK];
  __shared__ float kth;
  int64_t const row = blockIdx.x;
  for (int64_t i = threadIdx.x; i < 2 * p.experts; i += blockDim.x) {
    float const v = scores[row * 2 * p.experts + i];
    smem[i] = v;
    if (i >= p.experts) cand[i - p.experts] = v;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    int const lane = threadIdx.x;
    for (int64_t i = 0; i < p.top_k; ++i) {
      float bv = -INFINITY;
      int bi = -1;
      for (int64_t e = lane; e < p.experts; e += 32) {
        float const v = cand[e];
        if (v > -INFINITY && (bi < 0 || better(v, static_cast<int>(e), bv, bi))) { bv = v; bi = static_cast<int>(e); }
      }
      for (int off = 16; off > 0; off >>= 1) {
        float const ov = __shfl_xor_sync(0xffffffffu, bv, off);
        int const oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi >= 0 && (bi < 0 || better(ov, oi, bv, bi))) { bv = ov; bi = oi; }
      }
      if (lane == 0) {
        sel[i] = bi;
        kth = bv;
        if (bi >= 0) cand[bi] = -INFINITY;
      }
      __syncwarp();
    }
    // Cutoff tie: an unselected finite score equal to the k-th (selected ones are −∞ in cand).
    int tie = 0;
    for (int64_t e = lane; e < p.experts; e += 32) {
      float const v = cand[e];
      tie |= v > -INFINITY && v == kth;
    }
    tie = __any_sync(0xffffffffu, tie);
    if (lane == 0) p.cutoff_tie[row] = tie ? 1 : 0;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int const k = static_cast<int>(p.top_k);
  int id[kMaxTopK];
  float w[kMaxTopK];
  float sum = 0.f;
  for (int i = 0; i < k; ++i) {
    id[i] = sel[i];
    w[i] = sel[i] >= 0 ? s[sel[i]] : 0.f;
    sum = __fadd_rn(sum, w[i]);
  }
  if (p.norm && k > 1)
    for (int i = 0; i < k; ++i) w[i] = __fdiv_rn(w[i], __fadd_rn(sum, 1e-20f));
  for (int i = 0; i < k; ++i) w[i] = __fmul_rn(w[i], p.routed_scale);
  if (p.prune_top_p < 1.f) {
    // ref::moe_prune_row: stable order by weight descending (insertion sort is stable).
    int order[kMaxTopK];
    for (int i = 0; i < k; ++i) {
      int j = i;
      while (j > 0 && w[i] > w[order[j - 1]]) { order[j] = order[j - 1]; --j; }
      order[j] = i;
    }
    float total = 0.f;
    for (int i = 0; i < k; ++i) total = __fadd_rn(total, w[i]);
    float const need = __fmul_rn(p.prune_top_p, total);
    int64_t const floor_k = p.prune_min_k > 1 ? p.prune_min_k : 1;
    float cum = 0.f;
    int keep = 0;
    while (keep < k && (keep < floor_k || cum < need)) cum = __fadd_rn(cum, w[order[keep++]]);
    if (keep < k) {
      for (int j = keep; j < k; ++j) { id[order[j]] = -1; w[order[j]] = 0.f; }
      if (p.prune_renorm) {
        float const scale = __fdiv_rn(total, cum);
        for (int j = 0; j < keep; ++j) w[order[j]] = __fmul_rn(w[order[j]], scale);
      }
    }
  }
  int32_t* const ids = p.ids + row * k;
  float* const wout = p.weights + row * k;
  for (int i = 0; i < k; ++i) { ids[i] = id[i]; wout[i] = w[i]; }
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<MoeRoute<Backend::kCuda>, MoeRouteDesc, MoeRouteArgs>);

Status MoeRoute<Backend::kCuda>::check(MoeRouteDesc const& d, MoeRouteArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.top_k >= 1 && d.top_k <= d.experts, "moe_route needs 1 <= top_k <= experts");
  TESSERA_CHECK(d.top_k <= kMoeCudaMaxTopK, "moe_route CUDA supports top_k <= 16");
  TESSERA_CHECK(d.experts * 3 * sizeof(float) <= 48 * 1024, "moe_route CUDA supports up to 4096 experts");
  TESSERA_CHECK(d.dim > 0, "moe_route dim must be positive");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "moe_route x"));
  TESSERA_TRY(check_shape(a.gate, {d.experts, d.dim}, "moe_route gate"));
  if (a.bias.data) TESSERA_TRY(check_shape(a.bias, {d.experts}, "moe_route bias"));
  if (a.expert_mask.data) TESSERA_TRY(check_shape(a.expert_mask, {d.experts}, "moe_route expert_mask"));
  TESSERA_TRY(check_shape(a.weights, {d.rows, d.top_k}, "moe_route weights"));
  TESSERA_TRY(check_shape(a.ids, {d.rows, d.top_k}, "moe_route ids"));
  TESSERA_CHECK(d.prune_top_p > 0.f && d.prune_top_p <= 1.f, "moe_route needs 0 < prune_top_p <= 1");
  TESSERA_CHECK(d.prune_min_k >= 0, "moe_route needs prune_min_k >= 0");
  return check_shape(a.cutoff_tie, {d.rows}, "moe_route cutoff_tie");
}

Status MoeRoute<Backend::kCuda>::run(MoeRouteDesc const& d, MoeRouteArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  RouteParams p;
  p.x = a.x.data; p.gate = a.gate.data; p.bias = a.bias.data; p.mask = a.expert_mask.data;
  p.weights = a.weights.data; p.ids = a.ids.data; p.cutoff_tie = a.cutoff_tie.data;
  p.rows = d.rows; p.experts = d.experts; p.dim = d.dim; p.top_k = d.top_k;
  p.temp = d.gate_temp; p.routed_scale = d.routed_scale; p.prune_top_p = d.prune_top_p;
  p.prune_min_k = d.prune_min_k; p.norm = d.norm_top_k; p.prune_renorm = d.prune_renorm;
  p.bf16 = d.md == DType::kBf16;
  size_t const row_scores = static_cast<size_t>(d.experts) * 2 * sizeof(float);  // s, biased per row
  size_t const smem = row_scores + static_cast<size_t>(d.experts) * sizeof(float);  // + the selection's copy
  if (d.rows > 65535) return invalid_argument("moe route: rows > 65535 per launch");
  Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, align256(row_scores * static_cast<size_t>(d.rows))));
  auto* scores = static_cast<float*>(ws.ptr);
  if (d.dim <= kChunkScoreMaxDim) {
    // Experts per block: 2 at decode sizes (E/2 blocks, ~1 chain per thread at dim 5120), 8 once several row
    // groups fill the GPU (each block re-stages its x rows, so fewer, wider blocks cut that traffic).
    int const eb = d.rows <= kScoreRows ? 2 : 8;
    int const rb = static_cast<int>(std::min<int64_t>(d.rows, kScoreRows));
    int64_t const chunks = ceil_div(d.dim, int64_t{32});
    size_t const sm = static_cast<size_t>(rb * chunks * 33 + rb * eb * (chunks + 1)) * sizeof(float);
    size_t const sm_max = static_cast<size_t>(kScoreRows * (kChunkScoreMaxDim / 32) * 33 +
                                              kScoreRows * 8 * (kChunkScoreMaxDim / 32 + 1)) * sizeof(float);
    TESSERA_TRY(cuda_status(tc_linear::allow_smem<moe_score_chunks_kernel>(sm_max), "moe_score_chunks_kernel smem attribute"));
    dim3 const gs(static_cast<unsigned>(ceil_div(d.experts, int64_t{eb})), static_cast<unsigned>(ceil_div(d.rows, int64_t{rb})));
    device::launch_pdl(moe_score_chunks_kernel, gs, kChunkScoreThreads, sm, stream_of(ctx), p, rb, eb, scores);
    TESSERA_TRY(launch_status("moe_score_chunks_kernel"));
  } else {
    dim3 const gs(static_cast<unsigned>(ceil_div(d.experts, kScoreWarps)), static_cast<unsigned>(ceil_div(d.rows, kScoreRows)));
    device::launch_pdl(moe_score_kernel, gs, kScoreWarps * 32, 0, stream_of(ctx), p, scores);
    TESSERA_TRY(launch_status("moe_score_kernel"));
  }
  device::launch_pdl(moe_route_kernel, static_cast<unsigned>(d.rows), 256, smem, stream_of(ctx), p, scores);
  return launch_status("moe_route_kernel");
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the mHC family (include/tessera/ops/mhc.hpp, ref/mhc_ref.hpp, spec §2.3).
///   MhcMix: three launches per slab of rows, so the fn stream (fp32 [(2+n)n, n·D]: 24 × 20480 × 4 B =
///     1.97 MB for the released n = 4, D = 5120) is spread over the whole GPU instead of one block per row:
///     1. mhc_rms_kernel (block per row): r = rsqrt(mean(x²)+eps) in ref::lane_sum's order → rinv[row].
///     2. mhc_mix_partial_kernel (block per (chunk group, row tile)): every chunk sum of ref::dot,
///        S[row, c, o] = FMA chain from +0 over k ∈ [32c, 32c+32) of fmul_rn(x_k, r)·fn[o, k] in k order.
///     3. mhc_mix_finish_staged_kernel (block per row, the row's chunk sums staged in shared memory; or
///        mhc_mix_finish_kernel, warp per row, when they do not fit): m_o = S[row, 0, o] + S[row, 1, o] + … in chunk order
///        (ref::dot's total), then the warp runs the sigmoids, the softmax and the Sinkhorn iterations in the
///        reference's exact order (mix_epilogue: one column normalisation, then (iters−1)× row + column; the
///        softmax denominator in warp-softmax lanes, the row sums in lane_sum's order, the column sums
///        sequentially). exp in the model dtype's arithmetic (device::exp_md: expf for bf16, fmath::exp_rn
///        for fp32, as ref::exp_md). The mix is an fp32 island: ref::dot's order in both model dtypes.
///     Bitwise equal to ref::mhc_mix_row: ref::dot's chunks start from +0 (kDotCarry false), so they are
///     independent and only their final sequential addition fixes an order; each value below is the same
///     sequence of correctly rounded fp32 operations (__fmul_rn / __fmaf_rn / __fadd_rn, never contracted)
///     as the reference, whatever the grid, tile or slab.
///   MhcCollapse / MhcExpand: one thread per output element, Σ over streams in the reference's order.
///     No transcendental: bitwise equal to the CPU.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/common/cuda_util.cuh"
#include "tessera/core/fmath.hpp"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/mhc.hpp"

namespace tessera::kernels {

namespace {

constexpr int kMaxStreams = 8;

/// One MhcMix launch set (a slab of rows; run() offsets x, pre, post, comb per slab). rinv and part are
/// stream-ordered scratch (Scratch): rinv [rows], part [rows, chunks, (2+n)n] (o fastest).
struct MhcMixParams {
  float const* x = nullptr;      // [rows, n·D]
  float const* fn = nullptr;     // [(2+n)n, n·D]
  float const* base = nullptr;   // [(2+n)n]
  float const* scale = nullptr;  // [3]
  float* pre = nullptr;          // [rows, n]
  float* post = nullptr;         // [rows, n]
  float* comb = nullptr;         // [rows, n·n]
  float* rinv = nullptr;         // [rows]: rsqrt(mean(x²)+eps) of each row
  float* part = nullptr;         // [rows, chunks, (2+n)n]: ref::dot's chunk sums S[row, c, o]
  int64_t rows = 0, n = 0, d = 0;
  int64_t chunks = 0;            // ⌈n·D / 32⌉ (ref::dot's chunks)
  int group_chunks = 1;          // G: consecutive chunks per partial block
  int iters = 1;
  float hc_eps = 0.f, norm_eps = 0.f;
  bool bf16 = false;  // the model dtype: selects exp's arithmetic (nothing is rounded to it)
};

static_assert(device::kDotChunk == 32 && device::kDotFma && !device::kDotCarry,
              "the split computes ref::dot's independent 32-wide FMA chunks from +0 and adds them in order");

/// Copies elements [0, total) through registers: element e is load(e), then store(e, value). B loads per
/// thread are issued before the first store, so a block has B·blockDim independent loads in flight (one
/// DRAM round trip for the partial kernel's 15 KB weight tile at n = 4).
template <int B, class Load, class Store>
__device__ __forceinline__ void stage(int total, Load&& load, Store&& store) {
  int const nt = static_cast<int>(blockDim.x);
  for (int e0 = static_cast<int>(threadIdx.x); e0 < total; e0 += B * nt) {
    float v[B];
#pragma unroll
    for (int j = 0; j < B; ++j) v[j] = e0 + j * nt < total ? load(e0 + j * nt) : 0.f;
#pragma unroll
    for (int j = 0; j < B; ++j)
      if (e0 + j * nt < total) store(e0 + j * nt, v[j]);
  }
}

// ---- 1. r per row ----------------------------------------------------------------------------------------
// r in its own pass rather than redundantly in every partial block: the pass reads each row's n·D·4 B
// (80 KB at n·D = 20480) once and costs one launch; a partial block needs r of its whole row tile before its
// first FMA, so redundant r would re-read 8 rows × 80 KB = 640 KB in each of the 128 chunk-group blocks
// (82 MB of L2 traffic per tile against the 1.97 MB weight stream) and put the 160-step chain below in
// front of every block's FMAs.
// The row is staged in tiles of kTile floats, each with kTile / kRmsThreads loads in flight per thread: the whole
// row at once (kRmsRowTile: one L2 round trip, 96 KB, n·D ≤ 24,576 — the released 20,480) or 8,192-float tiles.
constexpr int kRmsThreads = 512;
constexpr int kRmsTile = 8192;       // floats per tile of the tiled form (32 KB); a multiple of 128
constexpr int kRmsRowTile = 24576;   // floats of the whole-row form (96 KB); a multiple of 128

/// ref::lane_sum of x_k² (as warp_lane_sum / device::lane_sum_seq): with vec = 4 when n·D % 128 == 0, else 1,
/// lane l's component c is the sequential sum from +0 of x_k² over k ≡ vec·l + c (mod 32·vec), increasing k;
/// each lane adds its components in c order, then the 32 lane values fold by halving. Here chain
/// t = vec·l + c is thread t (< 32·vec), fed from a coalesced shared-memory tile whose start is a multiple of
/// 128, so k mod 32·vec = (offset in tile) mod 32·vec; warp 0 then combines the chains in lane_sum's order.
template <int kTile>
__global__ void __launch_bounds__(kRmsThreads) mhc_rms_kernel(MhcMixParams const p) {
  device::pdl_enter();
  static_assert(kTile % 128 == 0 && kTile % kRmsThreads == 0);
  extern __shared__ __align__(16) float xs[];  // kTile floats
  __shared__ float chain[128];
  int64_t const row = blockIdx.x, nd = p.n * p.d;
  float const* x = p.x + row * nd;
  int const vec = nd % 128 == 0 ? 4 : 1, nchain = 32 * vec, t = static_cast<int>(threadIdx.x);
  float comp = 0.f;
  for (int64_t k0 = 0; k0 < nd; k0 += kTile) {
    int const len = static_cast<int>(nd - k0 < kTile ? nd - k0 : kTile);
    __syncthreads();  // the previous tile is consumed
    if (kTile == kRmsRowTile && len % 4 == 0 && (reinterpret_cast<uintptr_t>(x + k0) & 15) == 0) {
      // 16-byte cp.async straight to shared memory, all issued before the first wait: one round trip.
      for (int e = t; e < len / 4; e += kRmsThreads) {
        uint32_t const dst = static_cast<uint32_t>(__cvta_generic_to_shared(xs + 4 * e));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(x + k0 + 4 * e) : "memory");
      }
      asm volatile("cp.async.wait_all;\n" ::: "memory");
    } else {
      stage<kTile / kRmsThreads>(len, [x, k0](int e) { return __ldg(x + k0 + e); },
                                 [](int e, float v) { xs[e] = v; });
    }
    __syncthreads();
    if (t < nchain) {
#pragma unroll 8
      for (int e = t; e < len; e += nchain) comp = __fadd_rn(comp, __fmul_rn(xs[e], xs[e]));
    }
  }
  if (t < nchain) chain[t] = comp;
  __syncthreads();
  if (t >= 32) return;
  float a = chain[t * vec];
  for (int c = 1; c < vec; ++c) a = __fadd_rn(a, chain[t * vec + c]);
  for (int h = 16; h > 0; h /= 2) {
    float const b = __shfl_down_sync(0xffffffffu, a, h);
    if (t < h) a = __fadd_rn(a, b);
  }
  if (t == 0)
    p.rinv[row] = device::rsqrt_ref(__fadd_rn(__fmul_rn(a, __fdiv_rn(1.f, static_cast<float>(nd))), p.norm_eps));
}

// ---- 2. chunk sums ---------------------------------------------------------------------------------------
// Block (g, tile): chunks [G·g, G·g + G) of ref::dot for every output o < (2+n)n and RT rows. Thread
// p = cc·nm + o owns chunk cc of output o; its RT chains share each weight read. Shared memory, each chunk
// padded to 33 floats: w_s[cc][o][33] (thread p reads w_s[p·33 + t]: bank (p + t) mod 32, conflict-free) and
// f_s[r][cc][33] (a warp reads ≤ G distinct chunks at the same t: broadcasts, distinct banks).
// G = clamp(128 / nm, 1, 8): n = 4 → nm = 24, G = 5, 120 threads, 640 / 5 = 128 blocks per row tile (one per
// SM of the H200's 132) each loading 24 × 160 × 4 B = 15 KB of fn as 32 coalesced loads per thread in one
// round trip; the whole 1.97 MB is requested at once at rows = 1. Rows beyond the tile's last hold f = 0 and
// their chains are discarded.
constexpr int kPartPairs = 128;    // max nm·G (threads per partial block)
constexpr int kMaxGroupChunks = 8;
constexpr int kMaxRowTile = 8;

// kSpan: the k indices of every chunk group as a compile-time constant (kFixedSpan, when every group is full: the
// released shape), so the staging's element → (output, k) division is a multiply; 0: the group's span at run time.
constexpr int kFixedSpan = 160;  // G = 5 chunks (nm = 24, n = 4)

template <int RT, int kSpan>
__global__ void __launch_bounds__(kPartPairs) mhc_mix_partial_kernel(MhcMixParams const p) {
  device::pdl_enter();
  static_assert(RT >= 1 && RT <= kMaxRowTile && kSpan % 32 == 0 && kSpan <= 32 * kMaxGroupChunks);
  __shared__ float w_s[kPartPairs * 33];
  __shared__ float f_s[kMaxRowTile * kMaxGroupChunks * 33];
  int64_t const nd = p.n * p.d, chunks = p.chunks;
  int const nm = static_cast<int>((2 + p.n) * p.n), G = kSpan ? kSpan / 32 : p.group_chunks;
  int64_t const groups = (chunks + G - 1) / G;
  int64_t const g = blockIdx.x % groups, r0 = blockIdx.x / groups * RT;
  int64_t const c0 = g * G, k0 = c0 * 32;
  int const ncg = kSpan ? G : static_cast<int>(chunks - c0 < G ? chunks - c0 : G);  // chunks in this group
  int const span = kSpan ? kSpan : static_cast<int>(nd - k0 < 32 * ncg ? nd - k0 : 32 * ncg);  // k indices in it
  int const nr = static_cast<int>(p.rows - r0 < RT ? p.rows - r0 : RT);
  float const* fn = p.fn + k0;
  stage<32>(nm * span, [fn, nd, span](int e) { int const o = e / span; return __ldg(fn + o * nd + (e - o * span)); },
            [span, nm](int e, float v) {
              int const o = e / span, k = e - o * span;
              w_s[((k >> 5) * nm + o) * 33 + (k & 31)] = v;
            });
  float const* x = p.x + r0 * nd + k0;
  float const* rinv = p.rinv + r0;
  stage<16>(RT * span,
            [x, nd, span, nr](int e) {
              int const r = e / span;
              return r < nr ? __ldg(x + r * nd + (e - r * span)) : 0.f;
            },
            [span, G, nr, rinv](int e, float v) {
              int const r = e / span, k = e - r * span;
              // f_k = fmul_rn(x_k, r): the reference's rms_norm_row value (no weight, fp32).
              f_s[(r * G + (k >> 5)) * 33 + (k & 31)] = r < nr ? __fmul_rn(v, __ldg(rinv + r)) : 0.f;
            });
  __syncthreads();
  int const pair = static_cast<int>(threadIdx.x);
  if (pair >= ncg * nm) return;
  int const cc = pair / nm, o = pair - cc * nm;
  int const len = span - 32 * cc < 32 ? span - 32 * cc : 32;  // < 32 only in the last chunk of n·D
  float const* wr = w_s + pair * 33;
  float const* fr = f_s + cc * 33;
  float acc[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) acc[r] = 0.f;  // each chunk from +0 (kDotCarry false)
#pragma unroll
  for (int t = 0; t < 32; ++t) {
    if (t >= len) break;  // no zero-padded steps: fma(+0, w, acc) is not the identity (acc = −0, w = ±inf)
    float const wv = wr[t];
#pragma unroll
    for (int r = 0; r < RT; ++r) acc[r] = __fmaf_rn(fr[r * G * 33 + t], wv, acc[r]);  // std::fma(f_k, fn_ok, acc)
  }
  float* out = p.part + (r0 * chunks + c0 + cc) * nm + o;
#pragma unroll
  for (int r = 0; r < RT; ++r)
    if (r < nr) out[r * chunks * nm] = acc[r];  // unrolled: acc stays in registers
}

// ---- 2'. chunk sums for many rows (prefill): a block tile of 64 rows × 4 chunks (128 k) at n = 4 (nm = 24), 128
// threads. Warp w owns chunk w of the four; lane (g, h) = (lane / 2, lane % 2) owns rows g + 16·i (i < 4) and outputs
// o = 12·h + j (j < 12): 48 chains, each ref::dot's FMA chain from +0 over the chunk's 32 k in order (k four at a
// time from float4 shared-memory reads). Shared memory: f_s[64][132] = fmul_rn(x, r) and w_s[24][132] (a 16-byte
// pad per row: a warp's f reads hit 16 consecutive rows, 33 16-byte units apart, conflict-free; its w reads two
// addresses). Per 32 k a thread reads 16 float4 values for 192 FMAs, where the row-tile kernel above reads one
// value per FMA and restages the chunk group's fn for every 8 rows. Same chains, so the same bits. Requires n = 4,
// n·D % 128 == 0 and 16-byte aligned x and fn rows.
constexpr int kRowsTileRows = 64, kRowsTileChunks = 4, kRowsTileNm = 24, kRowsTileLd = kRowsTileChunks * 32 + 4;
constexpr int64_t kRowsTileMinRows = 32;

__global__ void __launch_bounds__(128) mhc_mix_partial_rows_kernel(MhcMixParams const p) {
  device::pdl_enter();
  __shared__ __align__(16) float f_s[kRowsTileRows * kRowsTileLd];
  __shared__ __align__(16) float w_s[kRowsTileNm * kRowsTileLd];
  int64_t const nd = p.n * p.d, groups = p.chunks / kRowsTileChunks;
  int64_t const g = blockIdx.x % groups, r0 = blockIdx.x / groups * kRowsTileRows;
  int64_t const k0 = g * kRowsTileChunks * 32;
  int const nr = static_cast<int>(p.rows - r0 < kRowsTileRows ? p.rows - r0 : kRowsTileRows);
  int const tid = static_cast<int>(threadIdx.x);
  constexpr int kQ = kRowsTileChunks * 32 / 4;  // float4 per staged row
  for (int e = tid; e < kRowsTileRows * kQ; e += 128) {
    int const r = e / kQ, c = e % kQ;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < nr) {
      v = __ldg(reinterpret_cast<float4 const*>(p.x + (r0 + r) * nd + k0) + c);
      float const ri = __ldg(p.rinv + r0 + r);
      v = make_float4(__fmul_rn(v.x, ri), __fmul_rn(v.y, ri), __fmul_rn(v.z, ri), __fmul_rn(v.w, ri));  // rms_norm_row's f_k
    }
    *reinterpret_cast<float4*>(f_s + r * kRowsTileLd + 4 * c) = v;
  }
  for (int e = tid; e < kRowsTileNm * kQ; e += 128) {
    int const o = e / kQ, c = e % kQ;
    *reinterpret_cast<float4*>(w_s + o * kRowsTileLd + 4 * c) = __ldg(reinterpret_cast<float4 const*>(p.fn + o * nd + k0) + c);
  }
  __syncthreads();
  int const cc = tid >> 5, lane = tid & 31, gr = lane >> 1, h = lane & 1;
  float acc[4][12];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 12; ++j) acc[i][j] = 0.f;  // each chunk from +0 (kDotCarry false)
#pragma unroll 2
  for (int q = 0; q < 8; ++q) {  // k = 32·cc + 4q .. + 3
    int const kk = cc * 32 + 4 * q;
    float4 fv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) fv[i] = *reinterpret_cast<float4 const*>(f_s + (gr + 16 * i) * kRowsTileLd + kk);
#pragma unroll
    for (int j = 0; j < 12; ++j) {
      float4 const wv = *reinterpret_cast<float4 const*>(w_s + (12 * h + j) * kRowsTileLd + kk);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float a = acc[i][j];
        a = __fmaf_rn(fv[i].x, wv.x, a);  // std::fma(f_k, fn_ok, acc), k in order
        a = __fmaf_rn(fv[i].y, wv.y, a);
        a = __fmaf_rn(fv[i].z, wv.z, a);
        acc[i][j] = __fmaf_rn(fv[i].w, wv.w, a);
      }
    }
  }
  int64_t const c = g * kRowsTileChunks + cc;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int const r = gr + 16 * i;
    if (r >= nr) continue;
    float* const out = p.part + ((r0 + r) * p.chunks + c) * kRowsTileNm + 12 * h;
#pragma unroll
    for (int j = 0; j < 12; ++j) out[j] = acc[i][j];
  }
}

// ---- 2''. chunk sums and their total in one pass (long prefills): a block of 64 rows walks every 128-k group of
// n·D in order, so ref::dot's total m_o = S[0, o] + S[1, o] + … is formed as the chunks complete instead of through
// [rows, chunks, nm] scratch (503 MB per mix at 8,192 rows, written once and read back by the finish). Warp w forms
// chunk 4g + w of every row and output exactly as mhc_mix_partial_rows_kernel (lane (gr, h): rows gr + 16i, outputs
// 12h + j; each chain from +0 over the chunk's 32 k in order, f_k = fmul_rn(x_k, r)); the four chunks' sums go through
// shared memory and warp w' adds them in chunk order to the totals of rows 16w' … 16w' + 15 (lane l: row 16w' + l/2,
// outputs 12(l%2) + j), the first chunk taken as is. x and fn tiles arrive by cp.async one group ahead. Writes
// part[row, o] = m_o (chunks = 1 for the finish). Same operations, same order: the same bits. Requires what the
// row tile requires, and rows ≥ kTotalsMinRows (64-row blocks fill the GPU only then).
constexpr int kTotalsMinRows = 4096;

__global__ void __launch_bounds__(128) mhc_mix_totals_kernel(MhcMixParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) float tot_smem[];
  float* const x_s = tot_smem;                                          // [2][64][kRowsTileLd] raw x
  float* const w_s = x_s + 2 * kRowsTileRows * kRowsTileLd;             // [2][24][kRowsTileLd]
  float* const s_s = w_s + 2 * kRowsTileNm * kRowsTileLd;               // [4 chunks][64 rows][24]
  int64_t const nd = p.n * p.d, groups = p.chunks / kRowsTileChunks;
  int64_t const r0 = static_cast<int64_t>(blockIdx.x) * kRowsTileRows;
  int const nr = static_cast<int>(p.rows - r0 < kRowsTileRows ? p.rows - r0 : kRowsTileRows);
  int const tid = static_cast<int>(threadIdx.x), cc = tid >> 5, lane = tid & 31, gr = lane >> 1, h = lane & 1;
  constexpr int kQ = kRowsTileChunks * 32 / 4;  // float4 per staged row
  auto issue = [&](int64_t g, int buf) {
    int64_t const k0 = g * kRowsTileChunks * 32;
    float* const xb = x_s + buf * kRowsTileRows * kRowsTileLd;
    float* const wb = w_s + buf * kRowsTileNm * kRowsTileLd;
    for (int e = tid; e < kRowsTileRows * kQ; e += 128) {
      int const r = e / kQ, c = e % kQ;
      int const rr = r < nr ? r : nr - 1;  // rows past the last repeat it; their chains are never stored
      uint32_t const dst = static_cast<uint32_t>(__cvta_generic_to_shared(xb + r * kRowsTileLd + 4 * c));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(p.x + (r0 + rr) * nd + k0 + 4 * c) : "memory");
    }
    for (int e = tid; e < kRowsTileNm * kQ; e += 128) {
      int const o = e / kQ, c = e % kQ;
      uint32_t const dst = static_cast<uint32_t>(__cvta_generic_to_shared(wb + o * kRowsTileLd + 4 * c));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(p.fn + o * nd + k0 + 4 * c) : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  float rinv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) rinv[i] = gr + 16 * i < nr ? __ldg(p.rinv + r0 + gr + 16 * i) : 0.f;
  int const trow = 16 * cc + (lane >> 1), to = 12 * (lane & 1);  // this lane's totals: row trow, outputs to + j
  float tot[12];
  issue(0, 0);
  for (int64_t g = 0; g < groups; ++g) {
    int const buf = static_cast<int>(g & 1);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();  // group g's tiles landed for every thread; group g − 1's tiles and sums are consumed
    if (g + 1 < groups) issue(g + 1, buf ^ 1);
    float const* const xb = x_s + buf * kRowsTileRows * kRowsTileLd;
    float const* const wb = w_s + buf * kRowsTileNm * kRowsTileLd;
    float acc[4][12];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 12; ++j) acc[i][j] = 0.f;  // each chunk from +0 (kDotCarry false)
#pragma unroll 2
    for (int q = 0; q < 8; ++q) {  // k = 32·cc + 4q .. + 3
      int const kk = cc * 32 + 4 * q;
      float4 fv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float4 const v = *reinterpret_cast<float4 const*>(xb + (gr + 16 * i) * kRowsTileLd + kk);
        fv[i] = make_float4(__fmul_rn(v.x, rinv[i]), __fmul_rn(v.y, rinv[i]), __fmul_rn(v.z, rinv[i]),
                            __fmul_rn(v.w, rinv[i]));  // rms_norm_row's f_k
      }
#pragma unroll
      for (int j = 0; j < 12; ++j) {
        float4 const wv = *reinterpret_cast<float4 const*>(wb + (12 * h + j) * kRowsTileLd + kk);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float a = acc[i][j];
          a = __fmaf_rn(fv[i].x, wv.x, a);  // std::fma(f_k, fn_ok, acc), k in order
          a = __fmaf_rn(fv[i].y, wv.y, a);
          a = __fmaf_rn(fv[i].z, wv.z, a);
          acc[i][j] = __fmaf_rn(fv[i].w, wv.w, a);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 12; ++j) s_s[(cc * kRowsTileRows + gr + 16 * i) * kRowsTileNm + 12 * h + j] = acc[i][j];
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kRowsTileChunks; ++c)
#pragma unroll
      for (int j = 0; j < 12; ++j) {
        float const v = s_s[(c * kRowsTileRows + trow) * kRowsTileNm + to + j];
        tot[j] = g == 0 && c == 0 ? v : __fadd_rn(tot[j], v);  // chunk order; the first chunk taken as is
      }
  }
  if (trow < nr) {
    float* const out = p.part + (r0 + trow) * kRowsTileNm + to;
#pragma unroll
    for (int j = 0; j < 12; ++j) out[j] = tot[j];
  }
}

constexpr size_t kTotalsSmemBytes =
    (2 * kRowsTileRows * kRowsTileLd + 2 * kRowsTileNm * kRowsTileLd + kRowsTileChunks * kRowsTileRows * kRowsTileNm) * 4;

// ---- 3. chunk order, then the reference's scalar tail ------------------------------------------------------

/// pre, post and comb of one row from its mix outputs m [(2+n)n], by one thread: ref::mhc_mix_row's tail
/// operation for operation (n > 5 only). Not inlined: beside the warp epilogues it made the finish kernel spill
/// (68 bytes, ptxas, sm_90a).
__device__ __noinline__ void mix_epilogue(MhcMixParams const& p, int64_t row, float const* m) {
  int64_t const n = p.n;
  float const* base = p.base;
  float* pre = p.pre + row * n;
  float* post = p.post + row * n;
  float* comb = p.comb + row * n * n;
  for (int64_t k = 0; k < n; ++k) {
    float const a = __fmul_rn(m[k], p.scale[0]);
    pre[k] = __fadd_rn(device::sigmoid(__fadd_rn(a, base[k]), p.bf16), p.hc_eps);
    float const b = __fmul_rn(m[n + k], p.scale[1]);
    post[k] = __fmul_rn(2.f, device::sigmoid(__fadd_rn(b, base[n + k]), p.bf16));
  }
  float c[kMaxStreams * kMaxStreams];
  for (int64_t j = 0; j < n; ++j) {
    float* rowc = c + j * n;
    float mx = -INFINITY;
    for (int64_t k = 0; k < n; ++k) {
      float const v = __fmul_rn(m[2 * n + j * n + k], p.scale[2]);
      rowc[k] = __fadd_rn(v, base[2 * n + j * n + k]);
      mx = device::std_max(mx, rowc[k]);
    }
    device::WarpSoftmaxSum sum;
    for (int64_t k = 0; k < n; ++k) {
      rowc[k] = device::exp_md(__fsub_rn(rowc[k], mx), p.bf16);
      sum.add(k, rowc[k]);
    }
    float const s = sum.value();
    for (int64_t k = 0; k < n; ++k) rowc[k] = __fadd_rn(__fdiv_rn(rowc[k], s), p.hc_eps);
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < n; ++k) {
      float s = 0.f;
      for (int64_t j = 0; j < n; ++j) s = __fadd_rn(s, c[j * n + k]);
      float const den = __fadd_rn(s, p.hc_eps);
      for (int64_t j = 0; j < n; ++j) c[j * n + k] = __fdiv_rn(c[j * n + k], den);
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float const s = device::lane_sum_seq(n, [row = c + j * n](int64_t k) { return row[k]; });
      float const den = __fadd_rn(s, p.hc_eps);
      for (int64_t k = 0; k < n; ++k) c[j * n + k] = __fdiv_rn(c[j * n + k], den);
    }
  };
  col_norm();
  for (int it = 0; it < p.iters - 1; ++it) { row_norm(); col_norm(); }
  for (int64_t i = 0; i < n * n; ++i) comb[i] = c[i];
}

/// device::lane_sum_seq(kN, v) and device::WarpSoftmaxSum over columns 0..kN−1, for kN ≤ 32 (vec = 1: lane t
/// holds +0 + v_t for t < kN and +0 beyond; then the halving tree over 32 lanes). The tree's levels h ≥ P (P the
/// power of two ≥ kN) only add +0 to lanes t < P, and +0 + v_t is never −0, so (+0 + v_t) + 0 = +0 + v_t: they are
/// skipped, and the sum is the tree over P lanes, bit for bit. Compile-time indices keep the lanes in registers.
template <int kN>
__device__ __forceinline__ float lane_tree_sum(float const (&v)[kN]) {
  static_assert(kN >= 1 && kN <= 32, "one value per lane");
  constexpr int kP = kN <= 1 ? 1 : kN <= 2 ? 2 : kN <= 4 ? 4 : kN <= 8 ? 8 : kN <= 16 ? 16 : 32;
  float lane[kP];
#pragma unroll
  for (int t = 0; t < kP; ++t) lane[t] = t < kN ? __fadd_rn(0.f, v[t < kN ? t : 0]) : 0.f;
#pragma unroll
  for (int h = kP / 2; h > 0; h /= 2)
#pragma unroll
    for (int t = 0; t < h; ++t) lane[t] = __fadd_rn(lane[t], lane[t + h]);
  return lane[0];
}

/// mix_epilogue for n = kN ≤ 5 by one warp: lane e = j·kN + k < kN² holds c[j][k] (lanes beyond compute
/// values nobody stores). Every value is the same sequence of fp32 operations as mix_epilogue's: the row max
/// in k order, the softmax sum and the row sums as lane_tree_sum (= WarpSoftmaxSum / lane_sum_seq), the column
/// sums from +0 in j order; each lane gathers the row or column it needs by shuffles and forms the sum itself.
/// 20 Sinkhorn iterations cost ~40 dependent shuffle-sum-divide steps instead of thread 0's ~1,300 divisions
/// and local-memory lane arrays (measured 145 µs per row on the H200 with the sequential version).
template <int kN>
__device__ void mix_epilogue_warp(MhcMixParams const& p, int64_t row, float const* m) {
  static_assert(kN * kN <= 32, "one element per lane");
  int const lane = static_cast<int>(threadIdx.x & 31);
  constexpr int kNN = kN * kN;
  float const* base = p.base;
  if (lane < 2 * kN) {
    if (lane < kN) {
      float const a = __fmul_rn(m[lane], p.scale[0]);
      p.pre[row * kN + lane] = __fadd_rn(device::sigmoid(__fadd_rn(a, base[lane]), p.bf16), p.hc_eps);
    } else {
      int const k = lane - kN;
      float const b = __fmul_rn(m[kN + k], p.scale[1]);
      p.post[row * kN + k] = __fmul_rn(2.f, device::sigmoid(__fadd_rn(b, base[kN + k]), p.bf16));
    }
  }
  int const e = lane < kNN ? lane : 0, j = e / kN, k = e % kN;
  float c = __fadd_rn(__fmul_rn(m[2 * kN + e], p.scale[2]), base[2 * kN + e]);
  float rowv[kN];
  auto gather_row = [&](float v) {
#pragma unroll
    for (int kk = 0; kk < kN; ++kk) rowv[kk] = __shfl_sync(0xffffffffu, v, j * kN + kk);
  };
  gather_row(c);
  float mx = -INFINITY;
#pragma unroll
  for (int kk = 0; kk < kN; ++kk) mx = device::std_max(mx, rowv[kk]);
  c = device::exp_md(__fsub_rn(c, mx), p.bf16);
  gather_row(c);
  c = __fadd_rn(__fdiv_rn(c, lane_tree_sum<kN>(rowv)), p.hc_eps);
  auto col_norm = [&] {
    float s = 0.f;
#pragma unroll
    for (int jj = 0; jj < kN; ++jj) s = __fadd_rn(s, __shfl_sync(0xffffffffu, c, jj * kN + k));
    c = __fdiv_rn(c, __fadd_rn(s, p.hc_eps));
  };
  auto row_norm = [&] {
    gather_row(c);
    c = __fdiv_rn(c, __fadd_rn(lane_tree_sum<kN>(rowv), p.hc_eps));
  };
  col_norm();
  for (int it = 0; it < p.iters - 1; ++it) { row_norm(); col_norm(); }
  if (lane < kNN) p.comb[row * kNN + lane] = c;
}

/// mix_epilogue_warp for the row's n (mix_epilogue by lane 0 beyond n = 5); m in shared memory.
__device__ __forceinline__ void mix_epilogue_any(MhcMixParams const& p, int64_t row, float const* m) {
  int const lane = static_cast<int>(threadIdx.x & 31);
  switch (p.n) {  // the released checkpoint has n = 4
    case 1: mix_epilogue_warp<1>(p, row, m); return;
    case 2: mix_epilogue_warp<2>(p, row, m); return;
    case 3: mix_epilogue_warp<3>(p, row, m); return;
    case 4: mix_epilogue_warp<4>(p, row, m); return;
    case 5: mix_epilogue_warp<5>(p, row, m); return;
    default: if (lane == 0) mix_epilogue(p, row, m);
  }
}

/// One warp per row, kFinRows rows per block: lane o (and o + 32, o + 64 for nm > 32) forms ref::dot's total
/// m_o = S[0, o] (taken as is, not +0 + S[0, o]), then m_o ← m_o + S[c, o] for c = 1, 2, … in chunk order, loading
/// kFinAhead chunks ahead of the additions (a warp's 24 lanes read 96 contiguous bytes per chunk); then the warp runs
/// the row's epilogue. Rows are independent, so a block holds kFinRows of them and a prefill's rows fill the SMs
/// instead of one 512-thread block per row.
constexpr int kFinRows = 8;
constexpr int kFinAhead = 16;

__global__ void __launch_bounds__(kFinRows * 32) mhc_mix_finish_kernel(MhcMixParams const p) {
  device::pdl_enter();
  __shared__ float m_rows[kFinRows][(2 + kMaxStreams) * kMaxStreams];
  int const warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  int64_t const row = static_cast<int64_t>(blockIdx.x) * kFinRows + warp, chunks = p.chunks;
  if (row >= p.rows) return;  // warp-uniform; no block barrier follows
  int const nm = static_cast<int>((2 + p.n) * p.n);
  float* const m = m_rows[warp];
  float const* const s = p.part + row * chunks * nm;
#pragma unroll 1
  for (int o = lane; o < nm; o += 32) {
    float total = __ldg(s + o);
    int64_t c = 1;
    for (; c + kFinAhead <= chunks; c += kFinAhead) {
      float v[kFinAhead];
#pragma unroll
      for (int j = 0; j < kFinAhead; ++j) v[j] = __ldg(s + (c + j) * nm + o);
#pragma unroll
      for (int j = 0; j < kFinAhead; ++j) total = __fadd_rn(total, v[j]);
    }
    for (; c < chunks; ++c) total = __fadd_rn(total, __ldg(s + c * nm + o));
    m[o] = total;
  }
  __syncwarp();
  mix_epilogue_any(p, row, m);
}

/// One row per block when the row's chunk sums fit shared memory (chunks · nm · 4 B ≤ kStagedMaxBytes; 61,440 B at the
/// released n = 4, D = 5120): the block's threads copy S[row, ·, ·] (contiguous) into shared memory with all their loads
/// issued before the first store (one L2 round trip, where the warp-per-row kernel waits chunks / kFinAhead = 40 of
/// them: ~32 µs a row on the H100), then thread o < nm forms m_o = S[0, o] + S[1, o] + … in chunk order from shared
/// memory and warp 0 runs the epilogue. The same additions in the same order as mhc_mix_finish_kernel.
constexpr int kStagedThreads = 256;
constexpr int kStagedLoads = 16;  // 16-byte loads in flight per thread: 64 KB per block
constexpr size_t kStagedMaxBytes = size_t{96} << 10;

__global__ void __launch_bounds__(kStagedThreads) mhc_mix_finish_staged_kernel(MhcMixParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) float s_part[];
  __shared__ float m[(2 + kMaxStreams) * kMaxStreams];
  int64_t const row = blockIdx.x, chunks = p.chunks;
  int const nm = static_cast<int>((2 + p.n) * p.n), t = static_cast<int>(threadIdx.x);
  int64_t const total = chunks * nm;
  float const* const src = p.part + row * total;
  if (total % 4 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    int64_t const n4 = total / 4;
    for (int64_t e0 = t; e0 < n4; e0 += kStagedLoads * kStagedThreads) {
      float4 v[kStagedLoads];
#pragma unroll
      for (int j = 0; j < kStagedLoads; ++j)
        if (e0 + j * kStagedThreads < n4) v[j] = __ldg(reinterpret_cast<float4 const*>(src) + e0 + j * kStagedThreads);
#pragma unroll
      for (int j = 0; j < kStagedLoads; ++j)
        if (e0 + j * kStagedThreads < n4) reinterpret_cast<float4*>(s_part)[e0 + j * kStagedThreads] = v[j];
    }
  } else {
    for (int64_t e0 = t; e0 < total; e0 += 4 * kStagedLoads * kStagedThreads) {
      float v[4 * kStagedLoads];
#pragma unroll
      for (int j = 0; j < 4 * kStagedLoads; ++j)
        if (e0 + j * kStagedThreads < total) v[j] = __ldg(src + e0 + j * kStagedThreads);
#pragma unroll
      for (int j = 0; j < 4 * kStagedLoads; ++j)
        if (e0 + j * kStagedThreads < total) s_part[e0 + j * kStagedThreads] = v[j];
    }
  }
  __syncthreads();
  for (int o = t; o < nm; o += kStagedThreads) {
    float acc = s_part[o];
#pragma unroll 16
    for (int64_t c = 1; c < chunks; ++c) acc = __fadd_rn(acc, s_part[c * nm + o]);
    m[o] = acc;
  }
  __syncthreads();
  if (t < 32) mix_epilogue_any(p, row, m);
}

struct MhcCollapseParams {
  float const* x = nullptr;    // [rows, n·D]
  float const* pre = nullptr;  // [rows, n]
  float* out = nullptr;        // [rows, D]
  int64_t rows = 0, n = 0, d = 0;
  bool bf16 = false;
};

__global__ void __launch_bounds__(256) mhc_collapse_kernel(MhcCollapseParams const p) {
  device::pdl_enter();
  int64_t const row = blockIdx.y;
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.d) return;
  float const* x = p.x + row * p.n * p.d;
  float const* pre = p.pre + row * p.n;
  float s = 0.f;
  for (int64_t k = 0; k < p.n; ++k) s = device::dot_step(s, pre[k], x[k * p.d + i]);
  p.out[row * p.d + i] = device::round_md(s, p.bf16);
}

struct MhcExpandParams {
  float const* y = nullptr;     // [rows, D]
  float const* x = nullptr;     // [rows, n·D]
  float const* post = nullptr;  // [rows, n]
  float const* comb = nullptr;  // [rows, n·n]
  float* out = nullptr;         // [rows, n·D]
  int64_t rows = 0, n = 0, d = 0;
  bool bf16 = false;
};

__global__ void __launch_bounds__(256) mhc_expand_kernel(MhcExpandParams const p) {
  device::pdl_enter();
  int64_t const row = blockIdx.y;
  int64_t const t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.n * p.d) return;
  int64_t const k = t / p.d, i = t % p.d;
  float const* x = p.x + row * p.n * p.d;
  float const* comb = p.comb + row * p.n * p.n;
  float mixed = 0.f;
  for (int64_t j = 0; j < p.n; ++j) mixed = device::fma_step(mixed, comb[j * p.n + k], x[j * p.d + i]);
  float const py = __fmul_rn(p.post[row * p.n + k], p.y[row * p.d + i]);
  p.out[row * p.n * p.d + t] = device::round_md(__fadd_rn(py, mixed), p.bf16);
}

/// The chunk-sum launch for row tile rt (1, 2, 4 or kMaxRowTile).
template <int kSpan>
void launch_partial(int rt, unsigned grid, unsigned threads, cudaStream_t stream, MhcMixParams const& q) {
  switch (rt) {
    case 1: device::launch_pdl(mhc_mix_partial_kernel<1, kSpan>, grid, threads, 0, stream, q); break;
    case 2: device::launch_pdl(mhc_mix_partial_kernel<2, kSpan>, grid, threads, 0, stream, q); break;
    case 4: device::launch_pdl(mhc_mix_partial_kernel<4, kSpan>, grid, threads, 0, stream, q); break;
    default: device::launch_pdl(mhc_mix_partial_kernel<kMaxRowTile, kSpan>, grid, threads, 0, stream, q); break;
  }
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<MhcMix<Backend::kCuda>, MhcMixDesc, MhcMixArgs>);
static_assert(BackendOp<MhcCollapse<Backend::kCuda>, MhcCollapseDesc, MhcCollapseArgs>);
static_assert(BackendOp<MhcExpand<Backend::kCuda>, MhcExpandDesc, MhcExpandArgs>);

Status MhcMix<Backend::kCuda>::check(MhcMixDesc const& d, MhcMixArgs const& a) {
  int64_t n = d.streams, nm = (2 + n) * n;
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(n >= 1 && n <= kernels::kMaxStreams, "mhc_mix CUDA supports 1..8 streams");
  TESSERA_CHECK(d.dim > 0, "mhc_mix dim must be positive");
  TESSERA_CHECK(d.sinkhorn_iters >= 1, "mhc sinkhorn_iters must be >= 1");
  TESSERA_TRY(check_shape(a.x, {d.rows, n * d.dim}, "mhc_mix x"));
  TESSERA_TRY(check_shape(a.fn, {nm, n * d.dim}, "mhc_mix fn"));
  TESSERA_TRY(check_shape(a.base, {nm}, "mhc_mix base"));
  TESSERA_TRY(check_shape(a.scale, {3}, "mhc_mix scale"));
  TESSERA_TRY(check_shape(a.pre, {d.rows, n}, "mhc_mix pre"));
  TESSERA_TRY(check_shape(a.post, {d.rows, n}, "mhc_mix post"));
  return check_shape(a.comb, {d.rows, n * n}, "mhc_mix comb");
}

Status MhcMix<Backend::kCuda>::run(MhcMixDesc const& d, MhcMixArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  int64_t const n = d.streams, nd = n * d.dim, nm = (2 + n) * n;
  MhcMixParams p;
  p.x = a.x.data; p.fn = a.fn.data; p.base = a.base.data; p.scale = a.scale.data;
  p.pre = a.pre.data; p.post = a.post.data; p.comb = a.comb.data;
  p.n = n; p.d = d.dim; p.iters = d.sinkhorn_iters;
  p.hc_eps = d.hc_eps; p.norm_eps = d.norm_eps; p.bf16 = d.md == DType::kBf16;
  p.chunks = ceil_div(nd, device::kDotChunk);
  p.group_chunks = static_cast<int>(std::clamp<int64_t>(kPartPairs / nm, 1, kMaxGroupChunks));
  int64_t const groups = ceil_div(p.chunks, p.group_chunks);
  // Many rows (prefill): the 64-row block tile where its layout applies; the same chunk sums either way.
  bool const rows_tile = d.rows >= kRowsTileMinRows && n == 4 && nd % (kRowsTileChunks * 32) == 0 &&
                         reinterpret_cast<uintptr_t>(a.x.data) % 16 == 0 && reinterpret_cast<uintptr_t>(a.fn.data) % 16 == 0 &&
                         a.x.stride[0] == nd;
  static bool const totals_on = [] {  // TESSERA_MHC_TOTALS=0 keeps the slabs (benchmarks; the values are the same)
    char const* e = std::getenv("TESSERA_MHC_TOTALS");
    return !(e && std::string(e) == "0");
  }();
  if (totals_on && rows_tile && d.rows >= kTotalsMinRows && nd <= kRmsRowTile && d.rows <= 0x7fffffff) {
    // r of every row, then the chunk sums' totals [rows, nm] in one pass, then the epilogue (warp per row, one chunk).
    Scratch ws;
    size_t const rinv_all = align256(static_cast<size_t>(d.rows) * sizeof(float));
    TESSERA_TRY(ws.acquire(ctx, rinv_all + static_cast<size_t>(d.rows * nm) * sizeof(float)));
    MhcMixParams q = p;
    q.rows = d.rows;
    q.rinv = static_cast<float*>(ws.ptr);
    q.part = reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + rinv_all);
    TESSERA_TRY(cuda_status(allow_smem<mhc_rms_kernel<kRmsRowTile>>(kRmsRowTile * 4), "mhc_mix: shared memory attribute"));
    TESSERA_TRY(cuda_status(allow_smem<mhc_mix_totals_kernel>(kTotalsSmemBytes), "mhc_mix: shared memory attribute"));
    device::launch_pdl(mhc_rms_kernel<kRmsRowTile>, static_cast<unsigned>(q.rows), kRmsThreads, kRmsRowTile * 4,
                       ws.stream, q);
    TESSERA_TRY(launch_status("mhc_rms_kernel"));
    device::launch_pdl(mhc_mix_totals_kernel, static_cast<unsigned>(ceil_div(q.rows, kRowsTileRows)), 128,
                       kTotalsSmemBytes, ws.stream, q);
    TESSERA_TRY(launch_status("mhc_mix_totals_kernel"));
    q.chunks = 1;
    device::launch_pdl(mhc_mix_finish_kernel, static_cast<unsigned>(ceil_div(q.rows, kFinRows)), kFinRows * 32, 0,
                       ws.stream, q);
    return launch_status("mhc_mix_finish_kernel");
  }
  // Scratch per row: r and the chunk sums, 4 + 640 × 24 × 4 B ≈ 61 KB at n·D = 20480. Rows run in slabs
  // of at most kScratchBudget (546 rows there), so a long prefill does not allocate rows × 61 KB at once.
  constexpr size_t kScratchBudget = size_t{32} << 20;
  size_t const part_row = static_cast<size_t>(p.chunks * nm) * sizeof(float);
  int64_t const slab =
      std::clamp<int64_t>(static_cast<int64_t>(kScratchBudget / (part_row + sizeof(float))), 1, d.rows);
  size_t const rinv_bytes = align256(static_cast<size_t>(slab) * sizeof(float));
  Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, rinv_bytes + static_cast<size_t>(slab) * part_row));
  p.rinv = static_cast<float*>(ws.ptr);
  p.part = reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + rinv_bytes);
  // Row tile of the partial blocks: the smallest of 1, 2, 4, 8 covering the slab (fn is read once per tile).
  int const rt = slab <= 1 ? 1 : slab <= 2 ? 2 : slab <= 4 ? 4 : kMaxRowTile;
  if (groups * ceil_div(slab, rt) > 0x7fffffff) return invalid_argument("mhc_mix: n·D too large for one grid");
  unsigned const part_threads = static_cast<unsigned>(ceil_div(nm * p.group_chunks, 32) * 32);
  bool const row_rms = nd <= kRmsRowTile;
  if (row_rms)
    TESSERA_TRY(cuda_status(allow_smem<mhc_rms_kernel<kRmsRowTile>>(kRmsRowTile * 4), "mhc_mix: shared memory attribute"));
  bool const fixed_span = p.group_chunks * 32 == kFixedSpan && p.chunks % p.group_chunks == 0 && nd % 32 == 0;
  // Chunk order and epilogue: a row per block from shared memory where its chunk sums fit, else a warp per row.
  bool const staged = part_row <= kStagedMaxBytes;
  if (staged)
    TESSERA_TRY(cuda_status(allow_smem<mhc_mix_finish_staged_kernel>(kStagedMaxBytes), "mhc_mix: shared memory attribute"));
  auto finish = [&](MhcMixParams const& q) -> Status {
    if (staged) {
      device::launch_pdl(mhc_mix_finish_staged_kernel, static_cast<unsigned>(q.rows), kStagedThreads, part_row,
                         ws.stream, q);
      return launch_status("mhc_mix_finish_staged_kernel");
    }
    device::launch_pdl(mhc_mix_finish_kernel, static_cast<unsigned>(ceil_div(q.rows, kFinRows)), kFinRows * 32, 0,
                       ws.stream, q);
    return launch_status("mhc_mix_finish_kernel");
  };
  for (int64_t r0 = 0; r0 < d.rows; r0 += slab) {
    MhcMixParams q = p;
    q.rows = std::min(slab, d.rows - r0);
    q.x += r0 * nd; q.pre += r0 * n; q.post += r0 * n; q.comb += r0 * n * n;
    if (row_rms) device::launch_pdl(mhc_rms_kernel<kRmsRowTile>, static_cast<unsigned>(q.rows), kRmsThreads,
                                    kRmsRowTile * 4, ws.stream, q);
    else device::launch_pdl(mhc_rms_kernel<kRmsTile>, static_cast<unsigned>(q.rows), kRmsThreads, kRmsTile * 4,
                            ws.stream, q);
    TESSERA_TRY(launch_status("mhc_rms_kernel"));
    if (rows_tile) {
      unsigned const gr = static_cast<unsigned>(p.chunks / kRowsTileChunks * ceil_div(q.rows, kRowsTileRows));
      device::launch_pdl(mhc_mix_partial_rows_kernel, gr, 128, 0, ws.stream, q);
      TESSERA_TRY(launch_status("mhc_mix_partial_rows_kernel"));
      TESSERA_TRY(finish(q));
      continue;
    }
    unsigned const grid = static_cast<unsigned>(groups * ceil_div(q.rows, rt));
    if (fixed_span) launch_partial<kFixedSpan>(rt, grid, part_threads, ws.stream, q);
    else launch_partial<0>(rt, grid, part_threads, ws.stream, q);
    TESSERA_TRY(launch_status("mhc_mix_partial_kernel"));
    TESSERA_TRY(finish(q));
  }
  return {};
}

Status MhcCollapse<Backend::kCuda>::check(MhcCollapseDesc const& d, MhcCollapseArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.x, {d.rows, d.streams * d.dim}, "mhc_collapse x"));
  TESSERA_TRY(check_shape(a.pre, {d.rows, d.streams}, "mhc_collapse pre"));
  return check_shape(a.out, {d.rows, d.dim}, "mhc_collapse out");
}

Status MhcCollapse<Backend::kCuda>::run(MhcCollapseDesc const& d, MhcCollapseArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0 || d.dim == 0) return {};
  if (d.rows > 65535) return invalid_argument("mhc_collapse: rows > 65535 per launch");
  MhcCollapseParams p;
  p.x = a.x.data; p.pre = a.pre.data; p.out = a.out.data;
  p.rows = d.rows; p.n = d.streams; p.d = d.dim; p.bf16 = d.md == DType::kBf16;
  dim3 grid(static_cast<unsigned>(ceil_div(d.dim, 256)), static_cast<unsigned>(d.rows));
  device::launch_pdl(mhc_collapse_kernel, grid, 256, 0, stream_of(ctx), p);
  return launch_status("mhc_collapse_kernel");
}

Status MhcExpand<Backend::kCuda>::check(MhcExpandDesc const& d, MhcExpandArgs const& a) {
  int64_t n = d.streams;
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.y, {d.rows, d.dim}, "mhc_expand y"));
  TESSERA_TRY(check_shape(a.x, {d.rows, n * d.dim}, "mhc_expand x"));
  TESSERA_TRY(check_shape(a.post, {d.rows, n}, "mhc_expand post"));
  TESSERA_TRY(check_shape(a.comb, {d.rows, n * n}, "mhc_expand comb"));
  TESSERA_TRY(check_shape(a.out, {d.rows, n * d.dim}, "mhc_expand out"));
  TESSERA_CHECK(a.out.data != a.x.data || d.rows == 0, "mhc_expand out must not alias x");
  return {};
}

Status MhcExpand<Backend::kCuda>::run(MhcExpandDesc const& d, MhcExpandArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0 || d.dim == 0) return {};
  if (d.rows > 65535) return invalid_argument("mhc_expand: rows > 65535 per launch");
  MhcExpandParams p;
  p.y = a.y.data; p.x = a.x.data; p.post = a.post.data; p.comb = a.comb.data; p.out = a.out.data;
  p.rows = d.rows; p.n = d.streams; p.d = d.dim; p.bf16 = d.md == DType::kBf16;
  dim3 grid(static_cast<unsigned>(ceil_div(d.streams * d.dim, 256)), static_cast<unsigned>(d.rows));
  device::launch_pdl(mhc_expand_kernel, grid, 256, 0, stream_of(ctx), p);
  return launch_status("mhc_expand_kernel");
}

}  // namespace tessera::ops

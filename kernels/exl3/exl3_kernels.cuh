// SPDX-License-Identifier: Apache-2.0
/// EXL3 dequant-matmul kernels for sm_90a (mma.sync m16n8k16, fp16 × fp16 → fp32), spec/exl3.md §2–§4.
///
/// Summation contract (row invariance, §7.2 of the architecture). k is cut into S chunks of C = tiles_k/S
/// k-tiles, S = exl3_num_chunks(k, n) chosen from the layer shape only. Chunk partial P_s(r, c) is the
/// mma chain over its k-tiles in ascending order, starting from zero accumulators; the result is
///   acc(r, c) = ((0 + P_0) + P_1) + … + P_{S−1}      (fp32, this order, always)
/// The GEMV kernel computes the chunks in parallel (grid.y) into a partials buffer [S][rows][n] and the
/// epilogue adds them in order; the GEMM kernel walks the chunks sequentially with the same chain in
/// registers and stores acc as a single "partial". Both give the same bits for every row whatever the row
/// count, so choosing between them by row count keeps a row's result independent of the batch.
/// No atomics in the value path.
///
/// Fused epilogue (GEMV, `tickets` set): a 128-column group is written by 2·S blocks (its two 64-column
/// halves × S chunks). Each block stores its partials, fences, and takes a ticket (atomicAdd on the group's
/// counter); the block that draws ticket 2S − 1 resets the counter to 0 and applies `epilogue_warp` to the
/// group for every row — the same function, so the same additions in the same order, as the epilogue
/// kernel. The ticket only elects the block; no value passes through an atomic.
///
/// Work split:
///   GEMV   block = 4 warps sharing one chunk, warp = one 16-column tile × the chunk × its expert's rows in
///          groups of 16. Trellis words go straight from global memory to registers (a ring of kGemvDepth
///          tiles); the row group's xh A fragments of the chunk are staged once per block in shared memory.
///   GEMM   block = 8 warps, tile 128 rows × 128 columns; each warp owns one 16-column tile and all 128
///          rows (8 m16 sub-tiles, so every decoded B fragment feeds 16 MMAs); xh slabs of 128 × 64 are
///          double-buffered in shared memory (cp.async) and read with ldmatrix.x4; the chunk totals are
///          kept in shared memory (the chain is still ((0 + P_0) + P_1) + …).
///   grouped GEMM (MoE) the same block over 128-row tiles of one expert's rows, cut from expert_offsets[e]
///          (grouped_slot_expert maps the launch's tile slots to experts on the device).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "tessera/device/exl3/decode.cuh"
#include "tessera/device/pdl.cuh"

namespace tessera::kernels::exl3 {

namespace dx = tessera::device::exl3;
using tessera::exl3::Codebook;

/// Operands of the GEMV/GEMM kernels. Dense layers: trellis set, expert arrays null, rows [0, num_rows).
/// MoE: trellis_e[e] per expert and rows [expert_offsets[e], expert_offsets[e+1]) (GEMV: grid.z = expert, or an
/// assignment row when rows < experts; grouped GEMM: tile slots, see grouped_slot_expert).
struct Exl3MmaParams {
  __half const* xh = nullptr;                // [num_rows, k] input-transformed activations (GEMM; GEMV when x is null)
  // GEMV only: when x is set, the kernel applies the input transform itself (no xh in global memory).
  __half const* x = nullptr;                 // [T, k] raw activations
  int32_t const* token_idx = nullptr;        // [num_rows] source row of x per row (MoE), or null
  __half const* suh = nullptr;               // [k] (dense)
  __half const* const* suh_e = nullptr;      // [E] → [k] (MoE)
  int16_t const* trellis = nullptr;          // [k/16, n/16, 16K] (dense)
  int16_t const* const* trellis_e = nullptr; // [E] → [k/16, n/16, 16K] (MoE)
  int32_t const* expert_offsets = nullptr;   // [E + 1] (MoE)
  float* partial = nullptr;                  // [S][num_rows][n] (GEMV) or [num_rows][n] (GEMM)
  // GEMV fused epilogue (null tickets: the epilogue kernel runs after the GEMV instead).
  uint32_t* tickets = nullptr;               // [E or 1][n / 128] arrival counters, zero at rest
  __half const* svh = nullptr;               // [n] (dense)
  __half const* const* svh_e = nullptr;      // [E] → [n] (MoE)
  __half const* bias = nullptr;              // [n] or null
  float const* route_weight = nullptr;       // [num_rows] or null (fp32 output only)
  __half* y16 = nullptr;                     // [num_rows, n] fp16 output, or
  float* y32 = nullptr;                      // [num_rows, n] fp32 output
  int64_t num_rows = 0, k = 0, n = 0;
  int num_experts = 0;                       // E (MoE; set by the launchers)
  int tiles_k = 0, tiles_n = 0;
  int num_chunks = 1;                        // S
  int chunk_tiles = 0;                       // C = tiles_k / S
};

inline constexpr int kGemvWarps = 4;
inline constexpr int kGemmWarps = 8;
inline constexpr int kGemmRows = 128;         // rows per GEMM block (8 m16 sub-tiles per warp)
inline constexpr int kGemmSlabK = 64;         // k per staged xh slab (4 k-tiles)
inline constexpr int kGemmLda = kGemmSlabK + 8;  // padded smem row (halves): ldmatrix rows hit distinct banks
inline constexpr int kGemmSlabHalves = kGemmRows * kGemmLda;
/// Two xh slabs (2 × 18 KiB) and the fp32 chunk totals of the block (128 × 128 × 4 B = 64 KiB).
inline constexpr size_t kGemmSmemBytes = 2 * kGemmSlabHalves * sizeof(__half) + size_t{kGemmRows} * 128 * sizeof(float);
/// GEMV ring depth: tiles whose trellis words are in flight per warp. Chunks are multiples of 8 k-tiles
/// (exl3_num_chunks), so the ring needs no tail guards; 8 tiles are 256 B (K = 1) to 2 KiB (K = 8).
inline constexpr int kGemvDepth = 8;
/// Longest chunk the GEMV stages in shared memory: 64 k-tiles × 32 lanes × 16 B of A fragments = 32 KiB.
inline constexpr int kGemvMaxChunkTiles = 64;
/// Resident GEMV blocks per SM the register allocation must allow: 8 × 4 warps = 32 warps (≤ 64
/// registers); K ≥ 5 rings hold 24–32 words and get 6 blocks (≤ 80 registers) so nothing spills.
template <int kBits>
inline constexpr int kGemvMinBlocks = kBits >= 5 ? 6 : 8;

/// Programmatic dependent launch (tessera/device/pdl.cuh): every kernel of an op is launched with launch_pdl and
/// executes pdl_wait before reading anything a predecessor in the stream writes (x, xh, partials) or writing
/// anything it reads; weights may be read before it.
using device::launch_pdl;
using device::pdl_launch_dependents;
using device::pdl_wait;

/// Butterflies over a warp's 128 values (v[t] = element 4·lane + t), stages b = 0..6 in order.
__device__ __forceinline__ void fwht128_warp(float (&v)[4], int lane) {
  float a = v[0], b = v[1];
  v[0] = a + b; v[1] = a - b;
  a = v[2]; b = v[3];
  v[2] = a + b; v[3] = a - b;
  a = v[0]; b = v[2];
  v[0] = a + b; v[2] = a - b;
  a = v[1]; b = v[3];
  v[1] = a + b; v[3] = a - b;
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    bool const hi = (lane & m) != 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      float const other = __shfl_xor_sync(0xFFFFFFFFu, v[t], m);
      v[t] = hi ? __fsub_rn(other, v[t]) : __fadd_rn(v[t], other);
    }
  }
}

/// Input transform of one 128-block by a warp (spec §4.3): lane l gets x[4l..4l+3] and suh[4l..4l+3] as
/// fp16 quads and returns its quad of xh = fp16(fwht(fp16(x·suh))·r). Shared by the transform kernel and
/// the GEMV's staging, so both produce the same bits.
__device__ __forceinline__ uint2 input_transform_warp(uint2 xv, uint2 sv, int lane) {
  __half2 const x01 = *reinterpret_cast<__half2 const*>(&xv.x), x23 = *reinterpret_cast<__half2 const*>(&xv.y);
  __half2 const s01 = *reinterpret_cast<__half2 const*>(&sv.x), s23 = *reinterpret_cast<__half2 const*>(&sv.y);
  __half2 const m01 = __hmul2_rn(x01, s01), m23 = __hmul2_rn(x23, s23);
  float v[4] = {__low2float(m01), __high2float(m01), __low2float(m23), __high2float(m23)};
  fwht128_warp(v, lane);
  float const r = tessera::exl3::kHadScale;
  __half2 const o01 = __halves2half2(__float2half_rn(__fmul_rn(v[0], r)), __float2half_rn(__fmul_rn(v[1], r)));
  __half2 const o23 = __halves2half2(__float2half_rn(__fmul_rn(v[2], r)), __float2half_rn(__fmul_rn(v[3], r)));
  uint2 out;
  out.x = *reinterpret_cast<uint32_t const*>(&o01);
  out.y = *reinterpret_cast<uint32_t const*>(&o23);
  return out;
}

/// Epilogue of one 128-column group of one row by a warp (spec §4.3); lane l owns columns 4l..4l+3.
/// acc = ((0 + P_0) + P_1) + … + P_{S−1} in fp32, in this order (loads issued kBatch chunks at a time, adds
/// in order); butterflies; fp16 output y = fp16(fp16(v·r)·svh) (+ bias, fp16 add); fp32 output
/// y = (v·r)·svh (+ bias) (· route weight), every step rounded once. `src` is the lane's quad of P_0,
/// `cstride` the floats from P_s to P_{s+1}; y16 / y32 (one non-null) point at the lane's output quad.
/// acc quad += q (the lane's 4 columns of the next chunk partial): one step of the chain.
__device__ __forceinline__ void acc_add(float (&v)[4], float4 q) {
  v[0] = __fadd_rn(v[0], q.x); v[1] = __fadd_rn(v[1], q.y);
  v[2] = __fadd_rn(v[2], q.z); v[3] = __fadd_rn(v[3], q.w);
}

/// The epilogue after the chunk sum (see epilogue_warp): butterflies, ·r, ·svh, bias, route weight.
__device__ __forceinline__ void epilogue_finish(float (&v)[4], uint2 sv, uint2 bv, bool has_bias, float const* route,
                                                __half* y16, float* y32, int lane) {
  fwht128_warp(v, lane);
  __half const* svh = reinterpret_cast<__half const*>(&sv);
  __half const* bias = reinterpret_cast<__half const*>(&bv);
  float const r = tessera::exl3::kHadScale;
  if (y16) {
    __half y[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      // __hmul/__hadd lower to mul.f16/add.f16, which ptxas may contract into one fma.rn.f16 (one
      // rounding instead of two: y differs from fp16(fp16(o·svh) + bias) by an ulp). The _rn forms forbid it.
      y[t] = __hmul_rn(__float2half_rn(__fmul_rn(v[t], r)), svh[t]);
      if (has_bias) y[t] = __hadd_rn(y[t], bias[t]);
    }
    __half2 const y01 = __halves2half2(y[0], y[1]), y23 = __halves2half2(y[2], y[3]);
    uint2 out;
    out.x = *reinterpret_cast<uint32_t const*>(&y01);
    out.y = *reinterpret_cast<uint32_t const*>(&y23);
    *reinterpret_cast<uint2*>(y16) = out;   // 8-byte aligned: n % 128 == 0
  } else {
    float4 y;
    float* yv = &y.x;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      yv[t] = __fmul_rn(__fmul_rn(v[t], r), __half2float(svh[t]));
      if (has_bias) yv[t] = __fadd_rn(yv[t], __half2float(bias[t]));
      if (route) yv[t] = __fmul_rn(yv[t], *route);
    }
    *reinterpret_cast<float4*>(y32) = y;
  }
}

/// Epilogue of one 128-column group of one row by a warp (spec §4.3); lane l owns columns 4l..4l+3.
/// acc = ((0 + P_0) + P_1) + … + P_{S−1} in fp32, in this order (loads issued kBatch chunks at a time, adds
/// in order); butterflies; fp16 output y = fp16(fp16(v·r)·svh) (+ bias, fp16 add); fp32 output
/// y = (v·r)·svh (+ bias) (· route weight), every step rounded once. `src` is the lane's quad of P_0,
/// `cstride` the floats from P_s to P_{s+1}; y16 / y32 (one non-null) point at the lane's output quad.
template <int kBatch>
__device__ __forceinline__ void epilogue_warp(float const* src, int64_t cstride, int num_chunks, uint2 sv, uint2 bv,
                                              bool has_bias, float const* route, __half* y16, float* y32, int lane) {
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  for (int s0 = 0; s0 < num_chunks; s0 += kBatch) {
    float4 q[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (s0 + i < num_chunks) q[i] = __ldcg(reinterpret_cast<float4 const*>(src + (s0 + i) * cstride));
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (s0 + i < num_chunks) acc_add(v, q[i]);
  }
  epilogue_finish(v, sv, bv, has_bias, route, y16, y32, lane);
}

__device__ __forceinline__ void cp_async16(void* smem, void const* gmem, bool valid) {
  uint32_t const s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory"); }

__device__ __forceinline__ uint32_t ld_u32_or_zero(__half const* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<uint32_t const*>(p)) : 0u;
}

template <int kBits>
__device__ __forceinline__ uint32_t const* tile_words(int16_t const* trellis, int tiles_n, int tk, int tn) {
  return reinterpret_cast<uint32_t const*>(trellis) + (static_cast<int64_t>(tk) * tiles_n + tn) * (8 * kBits);
}

/// MoE GEMV launched over assignment rows (grid.z = A < E, see launch_exl3_gemv): the expert whose rows start at
/// `row`, −1 when none does (row inside an expert's rows, or past expert_offsets[E]). At most one e has
/// off[e] = row < off[e + 1] (offsets are non-decreasing). Every thread reaches both barriers; block-uniform.
__device__ __forceinline__ int gemv_row_expert(int32_t const* off, int num_experts, int64_t row) {
  __shared__ int found;
  if (threadIdx.x == 0) found = -1;
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += static_cast<int>(blockDim.x))
    if (off[e] == row && off[e + 1] > row) found = e;
  __syncthreads();
  return found;
}

/// GEMV: chunk partials for up to 16 rows at a time. grid (ceil(tiles_n / 4), S, Z), block 128, Z = 1 (dense),
/// E (MoE: z = expert) or A < E (MoE over few rows: z = an assignment row, the block of an expert's first row works
/// and the others exit, so a step touching 6 of 384 experts launches 6, not 384, column × chunk grids),
/// dynamic shared memory C·512 B (max(C, S)·512 B with the fused epilogue). The block's 4 warps share one
/// chunk of C k-tiles (C a multiple of 8): the A fragments of the row group (xh rows rg..rg+15, lane order
/// {a0, a1, a2, a3}) are staged once in shared memory and read with one 16-byte load per tile. Each warp owns one column tile and keeps a ring
/// of kGemvDepth tiles of trellis words in registers; the first ring is loaded before `pdl_wait` (weights
/// only), so the trellis stream starts while the input transform still runs.
template <int kBits, Codebook kCb>
__global__ void __launch_bounds__(kGemvWarps * 32, kGemvMinBlocks<kBits>) exl3_gemv_kernel(Exl3MmaParams const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kW = dx::kLaneWords<kBits>;
  constexpr int kLw = dx::kLoadWords<kBits>;
  constexpr int kD = kGemvDepth;
  constexpr int kTileWords = 8 * kBits;
  extern __shared__ uint4 gemv_sa[];   // [C][32] A fragments
  int const lane = threadIdx.x & 31;
  int const tn = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  int const chunk = blockIdx.y;
  int const C = p.chunk_tiles;
  int const t0 = chunk * C;
  bool const active = tn < p.tiles_n;
  // z = expert, or (grid.z < E) an assignment row whose expert is known after pdl_wait only.
  bool const by_row = p.expert_offsets && static_cast<int>(gridDim.z) < p.num_experts;
  int ex = static_cast<int>(blockIdx.z);
  if (by_row) {
    pdl_wait();
    ex = gemv_row_expert(p.expert_offsets, p.num_experts, blockIdx.z);
    if (ex < 0) return;   // block-uniform: no barrier or ticket of this block is awaited
  }
  int16_t const* trellis = p.expert_offsets ? p.trellis_e[ex] : p.trellis;
  int const first = dx::lane_first_bit<kBits>(lane);
  int const o = first & 31;
  int off[kW];   // the lane's word offsets inside a tile, circular
  {
    int idx = first >> 5;
#pragma unroll
    for (int q = 0; q < kW; ++q) {
      off[q] = idx;
      idx = (idx + 1 == kTileWords) ? 0 : idx + 1;
    }
  }
  int64_t const stride = static_cast<int64_t>(p.tiles_n) * kTileWords;   // words from k-tile t to t + 1
  uint32_t const* tile0 = reinterpret_cast<uint32_t const*>(trellis) +
                          (static_cast<int64_t>(t0) * p.tiles_n + (active ? tn : 0)) * kTileWords;
  uint32_t ring[kD][kW];
  auto load_ring = [&](uint32_t const* tp) {
#pragma unroll
    for (int i = 0; i < kD; ++i)
#pragma unroll
      for (int q = 0; q < kW; ++q) ring[i][q] = q < kLw ? __ldg(tp + i * stride + off[q]) : 0u;
  };
  if (active) load_ring(tile0);
  if (!by_row) pdl_wait();
  pdl_launch_dependents();
  int64_t r0 = 0, r1 = p.num_rows;
  if (p.expert_offsets) {
    r0 = p.expert_offsets[ex];
    r1 = p.expert_offsets[ex + 1];
  }
  int const g = lane >> 2, c = lane & 3;
  for (int64_t rg = r0; rg < r1; rg += 16) {
    // Stage the row group's A fragments of the chunk: entry (i, l) = xh rows rg+g(l), rg+g(l)+8 at
    // k = 16(t0+i) + 2c(l) {+0, +8}; rows past the group's end are zero.
    if (rg != r0) __syncthreads();
    if (p.x) {
      // Input transform here: one warp per (row, 128-block of the chunk); lane l's quad k = 128b + 4l..+3
      // is two k-pairs of tile i = 8b + l/4, in-tile k kc = 4(l%4), 4(l%4)+2 → entry (i, 4(r%8) + (kc%8)/2),
      // register (r ≥ 8) + 2(kc ≥ 8).
      uint32_t* sa32 = reinterpret_cast<uint32_t*>(gemv_sa);
      __half const* suh = p.suh_e ? p.suh_e[ex] : p.suh;
      int const units = 16 * (C / 8);
      for (int u = threadIdx.x >> 5; u < units; u += kGemvWarps) {
        int const r = u & 15, b = u >> 4;
        int64_t const row = rg + r;
        uint2 q = make_uint2(0u, 0u);
        if (row < r1) {
          int64_t const src = p.token_idx ? p.token_idx[row] : row;
          int64_t const kb = static_cast<int64_t>(t0) * 16 + 128 * b + 4 * lane;
          q = input_transform_warp(*reinterpret_cast<uint2 const*>(p.x + src * p.k + kb),
                                   *reinterpret_cast<uint2 const*>(suh + kb), lane);
        }
        int const i = 8 * b + (lane >> 2), kc = 4 * (lane & 3);
        int const base = (i * 32 + 4 * (r & 7)) * 4 + (r >> 3);
        sa32[base + ((kc & 7) >> 1) * 4 + 2 * (kc >> 3)] = q.x;
        sa32[base + (((kc + 2) & 7) >> 1) * 4 + 2 * ((kc + 2) >> 3)] = q.y;
      }
    } else {
      for (int e = threadIdx.x; e < C * 32; e += kGemvWarps * 32) {
        int const i = e >> 5, l = e & 31;
        int64_t const ra = rg + (l >> 2), rb = ra + 8;
        __half const* xa = p.xh + ra * p.k + (t0 + i) * 16 + 2 * (l & 3);
        __half const* xb = xa + 8 * p.k;
        gemv_sa[e] = make_uint4(ld_u32_or_zero(xa, ra < r1), ld_u32_or_zero(xb, rb < r1),
                                ld_u32_or_zero(xa + 8, ra < r1), ld_u32_or_zero(xb + 8, rb < r1));
      }
    }
    __syncthreads();
    if (!active) continue;
    if (rg != r0) load_ring(tile0);
    float acc[2][4] = {};
    uint32_t const* next = tile0 + kD * stride;
    for (int t = 0; t < C; t += kD) {
      bool const more = t + kD < C;
#pragma unroll
      for (int i = 0; i < kD; ++i) {
        uint4 const a = gemv_sa[(t + i) * 32 + lane];
        uint32_t frag[4];
        dx::decode_fragments<kBits, kCb>(ring[i], o, frag);
        if (more) {
#pragma unroll
          for (int q = 0; q < kW; ++q) ring[i][q] = q < kLw ? __ldg(next + i * stride + off[q]) : 0u;
        }
        dx::mma_m16n8k16(acc[0], a.x, a.y, a.z, a.w, frag[0], frag[1]);
        dx::mma_m16n8k16(acc[1], a.x, a.y, a.z, a.w, frag[2], frag[3]);
      }
      next += kD * stride;
    }
    bool const ok0 = rg + g < r1, ok1 = rg + g + 8 < r1;
    float* out = p.partial + (static_cast<int64_t>(chunk) * p.num_rows) * p.n + static_cast<int64_t>(tn) * 16 + 2 * c;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (ok0) *reinterpret_cast<float2*>(out + (rg + g) * p.n + 8 * h) = make_float2(acc[h][0], acc[h][1]);
      if (ok1) *reinterpret_cast<float2*>(out + (rg + g + 8) * p.n + 8 * h) = make_float2(acc[h][2], acc[h][3]);
    }
  }
  if (!p.tickets) return;
  // Fused epilogue (file comment): the block drawing the group's last ticket reduces it for every row.
  __shared__ uint32_t elected;
  __threadfence();   // this block's partials are visible device-wide before its ticket is taken
  __syncthreads();
  int const group = blockIdx.x >> 1;
  uint32_t* ticket = p.tickets + static_cast<int64_t>(ex) * (p.tiles_n / 8) + group;
  if (threadIdx.x == 0) {
    uint32_t const last = 2u * static_cast<uint32_t>(p.num_chunks) - 1u;
    elected = atomicAdd(ticket, 1u) == last ? 1u : 0u;
    if (elected) atomicExch(ticket, 0u);   // every arrival is in: back to zero for the next op
  }
  __syncthreads();
  if (!elected) return;
  __threadfence();
  // Rows and lane re-derived here rather than kept live across the main loop (its 64-register budget).
  int64_t const e0 = p.expert_offsets ? p.expert_offsets[ex] : 0;
  int64_t const e1 = p.expert_offsets ? p.expert_offsets[ex + 1] : p.num_rows;
  int const ln = threadIdx.x & 31;
  int64_t const col = static_cast<int64_t>(group) * 128 + 4 * ln;
  __half const* svh = p.svh_e ? p.svh_e[ex] : p.svh;
  uint2 const sv = __ldg(reinterpret_cast<uint2 const*>(svh + col));
  uint2 const bv = p.bias ? __ldg(reinterpret_cast<uint2 const*>(p.bias + col)) : make_uint2(0u, 0u);
  int64_t const cstride = p.num_rows * p.n;
  if (e1 - e0 < kGemvWarps) {
    // Fewer rows than warps: all 128 threads copy a row's S partial quads into shared memory at once
    // (cp.async: one L2 round trip, no registers; the A fragments are dead and the launch sized the space
    // max(C, S)·512 B), then warp 0 adds them in order.
    float4* buf = reinterpret_cast<float4*>(gemv_sa);
    for (int64_t row = e0; row < e1; ++row) {
      float const* src = p.partial + row * p.n + static_cast<int64_t>(group) * 128;
      for (int i = threadIdx.x; i < p.num_chunks * 32; i += kGemvWarps * 32)
        cp_async16(buf + i, src + (i >> 5) * cstride + 4 * (i & 31), true);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      if (threadIdx.x < 32) {
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c = 0; c < p.num_chunks; ++c) acc_add(v, buf[c * 32 + ln]);
        int64_t const at = row * p.n + col;
        epilogue_finish(v, sv, bv, p.bias != nullptr, p.route_weight ? p.route_weight + row : nullptr,
                        p.y16 ? p.y16 + at : nullptr, p.y32 ? p.y32 + at : nullptr, ln);
      }
      __syncthreads();
    }
    return;
  }
#pragma unroll 1
  for (int64_t row = e0 + (threadIdx.x >> 5); row < e1; row += kGemvWarps) {
    int64_t const at = row * p.n + col;
    epilogue_warp<4>(p.partial + at, cstride, p.num_chunks, sv, bv, p.bias != nullptr,
                     p.route_weight ? p.route_weight + row : nullptr, p.y16 ? p.y16 + at : nullptr,
                     p.y32 ? p.y32 + at : nullptr, ln);
  }
#endif
}

/// Grouped GEMM tile slots (MoE). Expert e's rows [off[e], off[e+1]) are cut into 128-row tiles from off[e];
/// its tiles take the launch's slots [B(e), B(e+1)) with B(e) = ⌊off[e]/128⌋ + e. B is strictly increasing, and
/// B(e+1) − B(e) = ⌊off[e+1]/128⌋ − ⌊off[e]/128⌋ + 1 ≥ ⌈(off[e+1] − off[e])/128⌉, so every tile has a slot; a
/// slot past its expert's last tile (at most one per expert, the one slot of an empty expert) and a slot
/// ≥ B(E) do nothing. B(E) ≤ ⌊A/128⌋ + E for A ≥ off[E] (exl3_grouped_gemm_slots): the host sizes the grid from
/// the capacity A, and the device finds a slot's expert from the offsets alone (no tile table, no host sync).
inline constexpr int64_t exl3_grouped_gemm_slots(int64_t num_assignments, int64_t num_experts) {
  return num_assignments / kGemmRows + num_experts;
}
__device__ __forceinline__ int64_t grouped_slot_base(int32_t const* off, int e) {
  return off[e] / kGemmRows + e;
}

/// The expert of grouped GEMM slot `slot`: the largest e < num_experts with B(e) ≤ slot, −1 if none (B(0) > slot).
/// A 256-ary search by the whole block: the candidates lo + i·step (i < 256) are tested at once and
/// __syncthreads_count of B(candidate) ≤ slot (a prefix, B increasing) narrows [lo, lo + count) to one step;
/// one round for E ≤ 256, two up to 65,536. Block-uniform result (every thread reaches the barrier).
__device__ __forceinline__ int grouped_slot_expert(int32_t const* off, int num_experts, int64_t slot) {
  constexpr int kThreads = kGemmWarps * 32;
  int lo = 0, count = num_experts;
  for (;;) {
    int const step = (count + kThreads - 1) / kThreads;
    int const i = static_cast<int>(threadIdx.x) * step;
    bool const le = i < count && grouped_slot_base(off, lo + i) <= slot;
    int const below = __syncthreads_count(le);
    if (below == 0) return -1;
    lo += (below - 1) * step;
    count = min(step, count - (below - 1) * step);
    if (step == 1) return lo;
  }
}

/// GEMM: the full chunk chain for 128 rows × 128 columns. Dense: grid (tiles_n / 8, ceil(num_rows / 128)).
/// Grouped (kGrouped, MoE): grid (tiles_n / 8, Y, Z), slot = blockIdx.z·Y + blockIdx.y; the slot's tile is rows
/// [off[e] + 128t, min(off[e] + 128(t + 1), off[e+1])) of expert e = grouped_slot_expert(slot), t = slot − B(e),
/// against trellis_e[e]; xh and the accumulators are indexed by assignment row.
/// Block 256, dynamic shared memory kGemmSmemBytes. Each warp owns one 16-column tile and all 128 rows
/// (8 m16 sub-tiles: every decoded B fragment feeds 16 MMAs). Pipeline per 64-k slab: the next slab's xh
/// (cp.async into the other buffer) and trellis words (registers) are in flight while the current slab is
/// decoded and multiplied. The current chunk's partial lives in registers; the running total
/// ((0 + P_0) + …) lives in shared memory in fragment order (each thread touches only its own entries),
/// updated at chunk ends — the same additions in the same order as the GEMV's epilogue.
///
/// Grouped GEMM == grouped GEMV bit for bit, row a of expert e (off[e] ≤ a < off[e+1]), output column c:
///   * operands: the same xh row (the transform kernel and the GEMV's fused staging both run
///     input_transform_warp on x[token_idx[a]] with suh of e), the same trellis words of trellis_e[e] decoded by
///     the same decode_fragments; ldmatrix.x4 of rows ms·16 + (lane & 15), k-halves lane >> 4 yields the mma A
///     registers {(g, 2c), (g + 8, 2c), (g, 2c + 8), (g + 8, 2c + 8)}, the GEMV's staged {a0, a1, a2, a3};
///   * an m16n8k16 output element depends on its A row and B column only, so the fragment's other rows (a
///     16-row group from off[e] in the GEMV, a 128-row tile here, zeros past off[e+1]) do not change it;
///   * chunks: S = exl3_num_chunks(tiles_k, tiles_n) and C = tiles_k / S in both (C a multiple of the 4-tile
///     slab); P_s is the mma chain over k-tiles sC .. sC + C − 1 ascending from +0 accumulators in both;
///   * sums: here acc = ((+0 + P_0) + P_1) + … + P_{S−1} in registers/shared memory, stored once, and the epilogue
///     with one chunk computes +0 + acc; the GEMV's epilogue computes ((+0 + P_0) + P_1) + … . +0 + acc = acc
///     because acc ≠ −0: +0 + P_0 is never −0 and a round-to-nearest sum is −0 only of two −0 addends (this
///     build does not flush subnormals). The finish (butterflies, ·r, ·svh, ·route weight) is the same code.
template <int kBits, Codebook kCb, bool kGrouped>
__global__ void __launch_bounds__(kGemmWarps * 32, 2) exl3_gemm_kernel(Exl3MmaParams const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kW = dx::kLaneWords<kBits>;
  constexpr int kLw = dx::kLoadWords<kBits>;
  constexpr int kTileWords = 8 * kBits;
  constexpr int kSlabTiles = kGemmSlabK / 16;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  __half* sa = reinterpret_cast<__half*>(gemm_smem);   // [2][128 rows][72]
  float* stot = reinterpret_cast<float*>(gemm_smem + 2 * kGemmSlabHalves * sizeof(__half));
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int const tn = blockIdx.x * kGemmWarps + warp;       // n is a multiple of 128: always < tiles_n
  int64_t row0, row_end;                               // the block's rows: [row0, min(row0 + 128, row_end))
  int16_t const* trellis;
  if constexpr (kGrouped) {
    // The offsets are written by a predecessor: the slot's expert (and so its trellis) is known after the wait.
    pdl_wait();
    pdl_launch_dependents();
    int64_t const slot = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
    int const e = grouped_slot_expert(p.expert_offsets, p.num_experts, slot);
    if (e < 0) return;
    row0 = p.expert_offsets[e] + (slot - grouped_slot_base(p.expert_offsets, e)) * kGemmRows;
    row_end = p.expert_offsets[e + 1];
    if (row0 >= row_end) return;
    trellis = p.trellis_e[e];
  } else {
    row0 = static_cast<int64_t>(blockIdx.y) * kGemmRows;
    row_end = p.num_rows;
    trellis = p.trellis;
  }
  int const first = dx::lane_first_bit<kBits>(lane);
  int const o = first & 31;
  int off[kW];
  {
    int idx = first >> 5;
#pragma unroll
    for (int q = 0; q < kW; ++q) {
      off[q] = idx;
      idx = (idx + 1 == kTileWords) ? 0 : idx + 1;
    }
  }
  int64_t const stride = static_cast<int64_t>(p.tiles_n) * kTileWords;
  uint32_t const* tp = reinterpret_cast<uint32_t const*>(trellis) + static_cast<int64_t>(tn) * kTileWords;
  uint32_t wcur[kSlabTiles][kW], wnext[kSlabTiles][kW];
  auto load_slab = [&](uint32_t (&w)[kSlabTiles][kW], int ts) {
#pragma unroll
    for (int i = 0; i < kSlabTiles; ++i)
#pragma unroll
      for (int q = 0; q < kW; ++q) w[i][q] = q < kLw ? __ldg(tp + (ts + i) * stride + off[q]) : 0u;
  };
  load_slab(wcur, 0);
  if constexpr (!kGrouped) {
    pdl_wait();
    pdl_launch_dependents();
  }
  // xh slab ts..ts+3 → buffer b: 128 rows × 8 uint4, 4 per thread; rows from row_end on are zero-filled.
  auto stage = [&](int ts, int b) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int const idx = threadIdx.x + i * kGemmWarps * 32;
      int const r = idx >> 3, cu = idx & 7;
      int64_t const row = row0 + r;
      bool const ok = row < row_end;
      cp_async16(sa + b * kGemmSlabHalves + r * kGemmLda + cu * 8, p.xh + (ok ? row : 0) * p.k + ts * 16 + cu * 8, ok);
    }
    cp_async_commit();
  };
  stage(0, 0);
  float cacc[8][2][4] = {};
  bool have_total = false;
  auto tot_index = [&](int ms, int h, int e) { return (((warp * 8 + ms) * 2 + h) * 4 + e) * 32 + lane; };
  int const nslabs = p.tiles_k / kSlabTiles;
  for (int s = 0; s < nslabs; ++s) {
    int const ts = s * kSlabTiles;
    bool const more = s + 1 < nslabs;
    if (more) {
      stage(ts + kSlabTiles, (s + 1) & 1);
      load_slab(wnext, ts + kSlabTiles);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (ts > 0 && ts % p.chunk_tiles == 0) {   // chunk end: total = total + P (total starts at 0)
#pragma unroll
      for (int ms = 0; ms < 8; ++ms)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            int const ix = tot_index(ms, h, e);
            stot[ix] = __fadd_rn(have_total ? stot[ix] : 0.f, cacc[ms][h][e]);
            cacc[ms][h][e] = 0.f;
          }
      have_total = true;
    }
    __half const* buf = sa + (s & 1) * kGemmSlabHalves;
#pragma unroll
    for (int i = 0; i < kSlabTiles; ++i) {
      uint32_t frag[4];
      dx::decode_fragments<kBits, kCb>(wcur[i], o, frag);
#pragma unroll
      for (int ms = 0; ms < 8; ++ms) {
        uint32_t a0, a1, a2, a3;
        __half const* src = buf + (ms * 16 + (lane & 15)) * kGemmLda + i * 16 + (lane >> 4) * 8;
        uint32_t const addr = static_cast<uint32_t>(__cvta_generic_to_shared(src));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(addr) : "memory");
        dx::mma_m16n8k16(cacc[ms][0], a0, a1, a2, a3, frag[0], frag[1]);
        dx::mma_m16n8k16(cacc[ms][1], a0, a1, a2, a3, frag[2], frag[3]);
      }
    }
    __syncthreads();   // buffer s & 1 is restaged at iteration s + 1
    if (more) {
#pragma unroll
      for (int i = 0; i < kSlabTiles; ++i)
#pragma unroll
        for (int q = 0; q < kW; ++q) wcur[i][q] = wnext[i][q];
    }
  }
  int const g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int ms = 0; ms < 8; ++ms)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = __fadd_rn(have_total ? stot[tot_index(ms, h, e)] : 0.f, cacc[ms][h][e]);
      int64_t const ra = row0 + ms * 16 + g, rb = ra + 8;
      float* out = p.partial + static_cast<int64_t>(tn) * 16 + 8 * h + 2 * c;
      if (ra < row_end) *reinterpret_cast<float2*>(out + ra * p.n) = make_float2(y[0], y[1]);
      if (rb < row_end) *reinterpret_cast<float2*>(out + rb * p.n) = make_float2(y[2], y[3]);
    }
#endif
}

/// W' [k, n] fp16 from the trellis: one warp per tile. grid (ceil(tiles_k·tiles_n / 4)), block 128.
template <int kBits, Codebook kCb>
__global__ void __launch_bounds__(128) exl3_reconstruct_kernel(int16_t const* __restrict__ trellis, __half* w,
                                                               int tiles_k, int tiles_n, int64_t n) {
  device::pdl_enter();
  int64_t const t = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (t >= static_cast<int64_t>(tiles_k) * tiles_n) return;
  int const lane = threadIdx.x & 31;
  int const tk = static_cast<int>(t / tiles_n), tn = static_cast<int>(t % tiles_n);
  int const first = dx::lane_first_bit<kBits>(lane);
  uint32_t wd[dx::kLaneWords<kBits>];
  dx::load_lane_words<kBits>(tile_words<kBits>(trellis, tiles_n, tk, tn), first, wd);
  uint32_t frag[4];
  dx::decode_fragments<kBits, kCb>(wd, first & 31, frag);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    int const pos = 8 * lane + j;
    uint16_t const bits = static_cast<uint16_t>(frag[j >> 1] >> (16 * (j & 1)));
    int64_t const r = 16 * tk + tessera::exl3::tile_row(pos), col = 16 * tn + tessera::exl3::tile_col(pos);
    w[r * n + col] = __ushort_as_half(bits);
  }
}

/// W'ᵀ [n, k] fp16 (k contiguous: the K-major operand of cuBLAS's TN kernels) from the trellis. A warp
/// takes 4 consecutive k-tiles of one column tile (kTTiles; tiles_k is a multiple of 8), their trellis
/// words loaded together; each decoded tile is transposed in shared memory, then lane l stores W'ᵀ row
/// 16·tn + l/2, k = 16·tk + 8·(l%2)..+7 as one 16-byte store, so every 32-byte sector is written whole
/// (the [k, n] kernel above scatters 2-byte stores). grid (ceil(tiles_k·tiles_n / 16)), block 128.
inline constexpr int kTTiles = 4;
template <int kBits, Codebook kCb>
__global__ void __launch_bounds__(128) exl3_reconstruct_t_kernel(int16_t const* __restrict__ trellis, __half* wt,
                                                                 int tiles_k, int tiles_n, int64_t k) {
  device::pdl_enter();
  __shared__ __align__(16) uint16_t st[4][16][24];   // [warp][col][row], rows padded to 48 B
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const t = (static_cast<int64_t>(blockIdx.x) * 4 + warp) * kTTiles;
  if (t >= static_cast<int64_t>(tiles_k) * tiles_n) return;
  int const tk0 = static_cast<int>(t % tiles_k), tn = static_cast<int>(t / tiles_k);
  int const first = dx::lane_first_bit<kBits>(lane);
  uint32_t wd[kTTiles][dx::kLaneWords<kBits>];
#pragma unroll
  for (int i = 0; i < kTTiles; ++i) dx::load_lane_words<kBits>(tile_words<kBits>(trellis, tiles_n, tk0 + i, tn), first, wd[i]);
  int const c = lane >> 1, h = lane & 1;
#pragma unroll
  for (int i = 0; i < kTTiles; ++i) {
    uint32_t frag[4];
    dx::decode_fragments<kBits, kCb>(wd[i], first & 31, frag);
    __syncwarp();   // the previous tile's reads of st are done
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int const pos = 8 * lane + j;
      st[warp][tessera::exl3::tile_col(pos)][tessera::exl3::tile_row(pos)] = static_cast<uint16_t>(frag[j >> 1] >> (16 * (j & 1)));
    }
    __syncwarp();
    uint4 const v = *reinterpret_cast<uint4 const*>(&st[warp][c][8 * h]);
    *reinterpret_cast<uint4*>(wt + (16 * static_cast<int64_t>(tn) + c) * k + 16 * static_cast<int64_t>(tk0 + i) + 8 * h) = v;
  }
}

/// Launchers (defined per (K, codebook) in the generated inst/ TUs).
template <int kBits, int kCb>
cudaError_t launch_exl3_gemv(Exl3MmaParams const& p, int num_experts, cudaStream_t stream) {
  // MoE with fewer assignment rows than experts: z over the rows (at most A experts have any).
  Exl3MmaParams q = p;
  q.num_experts = num_experts;
  int64_t const z = p.expert_offsets && p.num_rows < num_experts ? p.num_rows : num_experts;
  dim3 grid((p.tiles_n + kGemvWarps - 1) / kGemvWarps, p.num_chunks, static_cast<unsigned>(z));
  // A fragments of the chunk (C·512 B); the fused epilogue reuses the space for S partial quads of a row.
  int const slots = p.tickets && p.num_chunks > p.chunk_tiles ? p.num_chunks : p.chunk_tiles;
  size_t const smem = static_cast<size_t>(slots) * 32 * sizeof(uint4);
  return launch_pdl(exl3_gemv_kernel<kBits, static_cast<Codebook>(kCb)>, grid, dim3(kGemvWarps * 32), smem, stream, q);
}
template <int kBits, int kCb>
cudaError_t launch_exl3_gemm(Exl3MmaParams const& p, int, cudaStream_t stream) {
  constexpr auto kernel = exl3_gemm_kernel<kBits, static_cast<Codebook>(kCb), false>;
  static cudaError_t const attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kGemmSmemBytes));
  if (attr != cudaSuccess) return attr;
  dim3 grid((p.tiles_n + kGemmWarps - 1) / kGemmWarps, static_cast<unsigned>((p.num_rows + kGemmRows - 1) / kGemmRows));
  return launch_pdl(kernel, grid, dim3(kGemmWarps * 32), kGemmSmemBytes, stream, p);
}
/// Grouped GEMM over num_experts experts, p.num_rows = the assignment capacity A: the slots of
/// exl3_grouped_gemm_slots(A, E) as grid (tiles_n / 8, Y ≤ 65,535, Z), slot = blockIdx.z·Y + blockIdx.y.
template <int kBits, int kCb>
cudaError_t launch_exl3_grouped_gemm(Exl3MmaParams const& p, int num_experts, cudaStream_t stream) {
  constexpr auto kernel = exl3_gemm_kernel<kBits, static_cast<Codebook>(kCb), true>;
  static cudaError_t const attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kGemmSmemBytes));
  if (attr != cudaSuccess) return attr;
  Exl3MmaParams q = p;
  q.num_experts = num_experts;
  int64_t const slots = exl3_grouped_gemm_slots(p.num_rows, num_experts);
  int64_t const y = slots < 65535 ? slots : 65535;
  dim3 grid((p.tiles_n + kGemmWarps - 1) / kGemmWarps, static_cast<unsigned>(y), static_cast<unsigned>((slots + y - 1) / y));
  return launch_pdl(kernel, grid, dim3(kGemmWarps * 32), kGemmSmemBytes, stream, q);
}
template <int kBits, int kCb>
cudaError_t launch_exl3_reconstruct(int16_t const* trellis, __half* w, int tiles_k, int tiles_n, cudaStream_t stream) {
  int64_t const tiles = static_cast<int64_t>(tiles_k) * tiles_n;
  exl3_reconstruct_kernel<kBits, static_cast<Codebook>(kCb)>
      <<<static_cast<unsigned>((tiles + 3) / 4), 128, 0, stream>>>(trellis, w, tiles_k, tiles_n, 16LL * tiles_n);
  return cudaGetLastError();
}

template <int kBits, int kCb>
cudaError_t launch_exl3_reconstruct_t(int16_t const* trellis, __half* wt, int tiles_k, int tiles_n, cudaStream_t stream) {
  int64_t const tiles = static_cast<int64_t>(tiles_k) * tiles_n;
  exl3_reconstruct_t_kernel<kBits, static_cast<Codebook>(kCb)>
      <<<static_cast<unsigned>((tiles + 4 * kTTiles - 1) / (4 * kTTiles)), 128, 0, stream>>>(trellis, wt, tiles_k, tiles_n,
                                                                                         16LL * tiles_k);
  return cudaGetLastError();
}

using Exl3MmaLaunchFn = cudaError_t (*)(Exl3MmaParams const&, int, cudaStream_t);
using Exl3ReconstructFn = cudaError_t (*)(int16_t const*, __half*, int, int, cudaStream_t);

// clang-format off
#define TESSERA_EXL3_EXTERN_ONE(K, CB)                                                                   \
  extern template cudaError_t launch_exl3_gemv<K, CB>(Exl3MmaParams const&, int, cudaStream_t);         \
  extern template cudaError_t launch_exl3_gemm<K, CB>(Exl3MmaParams const&, int, cudaStream_t);         \
  extern template cudaError_t launch_exl3_grouped_gemm<K, CB>(Exl3MmaParams const&, int, cudaStream_t); \
  extern template cudaError_t launch_exl3_reconstruct<K, CB>(int16_t const*, __half*, int, int, cudaStream_t);     \
  extern template cudaError_t launch_exl3_reconstruct_t<K, CB>(int16_t const*, __half*, int, int, cudaStream_t);
#define TESSERA_EXL3_EXTERN_K(K) TESSERA_EXL3_EXTERN_ONE(K, 0) TESSERA_EXL3_EXTERN_ONE(K, 1) TESSERA_EXL3_EXTERN_ONE(K, 2)
// clang-format on
#ifndef TESSERA_EXL3_INSTANTIATING
TESSERA_EXL3_EXTERN_K(1) TESSERA_EXL3_EXTERN_K(2) TESSERA_EXL3_EXTERN_K(3) TESSERA_EXL3_EXTERN_K(4)
TESSERA_EXL3_EXTERN_K(5) TESSERA_EXL3_EXTERN_K(6) TESSERA_EXL3_EXTERN_K(7) TESSERA_EXL3_EXTERN_K(8)
#endif

}  // namespace tessera::kernels::exl3

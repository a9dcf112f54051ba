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
/// count, so choosing between them by row count keeps a row's result independent of the batch. No atomics.
///
/// Work split:
///   GEMV   block = 4 warps, warp = one 16-column tile × one chunk × its expert's rows in groups of 16.
///          Trellis words go straight from global memory to registers (a ring of kPrefetch tiles); xh
///          fragments are read from global/L2 (xh is small at these row counts).
///   GEMM   block = 8 warps, tile 64 rows × 128 columns; each warp owns one 16-column tile and all 64 rows
///          (4 m16 sub-tiles, so every decoded B fragment feeds 8 MMAs); xh slabs of 64 × 64 are staged
///          in shared memory and read with ldmatrix.x4.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tessera/device/exl3/decode.cuh"

namespace tessera::kernels::exl3 {

namespace dx = tessera::device::exl3;
using tessera::exl3::Codebook;

/// Operands of the GEMV/GEMM kernels. Dense layers: trellis set, expert arrays null, rows [0, num_rows).
/// MoE: trellis_e[e] per expert and rows [expert_offsets[e], expert_offsets[e+1]) (grid.z = expert).
struct Exl3MmaParams {
  __half const* xh = nullptr;                // [num_rows, k] input-transformed activations
  int16_t const* trellis = nullptr;          // [k/16, n/16, 16K] (dense)
  int16_t const* const* trellis_e = nullptr; // [E] → [k/16, n/16, 16K] (MoE)
  int32_t const* expert_offsets = nullptr;   // [E + 1] (MoE)
  float* partial = nullptr;                  // [S][num_rows][n] (GEMV) or [num_rows][n] (GEMM)
  int64_t num_rows = 0, k = 0, n = 0;
  int tiles_k = 0, tiles_n = 0;
  int num_chunks = 1;                        // S
  int chunk_tiles = 0;                       // C = tiles_k / S
};

inline constexpr int kGemvWarps = 4;
inline constexpr int kGemmWarps = 8;
inline constexpr int kGemmRows = 64;          // rows per GEMM block (4 m16 sub-tiles per warp)
inline constexpr int kGemmSlabK = 64;         // k per staged xh slab (4 k-tiles)
inline constexpr int kGemmLda = kGemmSlabK + 8;  // padded smem row (halves): ldmatrix rows hit distinct banks
inline constexpr int kPrefetch = 4;           // tiles in flight per warp in the GEMV ring

__device__ __forceinline__ uint32_t ld_u32_or_zero(__half const* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<uint32_t const*>(p)) : 0u;
}

template <int kBits>
__device__ __forceinline__ uint32_t const* tile_words(int16_t const* trellis, int tiles_n, int tk, int tn) {
  return reinterpret_cast<uint32_t const*>(trellis) + (static_cast<int64_t>(tk) * tiles_n + tn) * (8 * kBits);
}

/// GEMV: chunk partials for up to 16 rows at a time. grid (ceil(tiles_n / 4), S, E or 1), block 128.
template <int kBits, Codebook kCb>
__global__ void __launch_bounds__(kGemvWarps * 32) exl3_gemv_kernel(Exl3MmaParams const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kW = dx::kLaneWords<kBits>;
  int const lane = threadIdx.x & 31;
  int const tn = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (tn >= p.tiles_n) return;
  int const chunk = blockIdx.y;
  int64_t r0 = 0, r1 = p.num_rows;
  int16_t const* trellis = p.trellis;
  if (p.expert_offsets) {
    r0 = p.expert_offsets[blockIdx.z];
    r1 = p.expert_offsets[blockIdx.z + 1];
    trellis = p.trellis_e[blockIdx.z];
  }
  if (r1 <= r0) return;
  int const first = dx::lane_first_bit<kBits>(lane);
  int const o = first & 31;
  int const t0 = chunk * p.chunk_tiles, t1 = t0 + p.chunk_tiles;
  int const g = lane >> 2, c = lane & 3;
  for (int64_t rg = r0; rg < r1; rg += 16) {
    bool const ok0 = rg + g < r1, ok1 = rg + g + 8 < r1;
    __half const* x0 = p.xh + (rg + g) * p.k + 2 * c;
    __half const* x1 = x0 + 8 * p.k;
    float acc[2][4] = {};
    uint32_t ring[kPrefetch][kW];
#pragma unroll
    for (int i = 0; i < kPrefetch; ++i)
      if (t0 + i < t1) dx::load_lane_words<kBits>(tile_words<kBits>(trellis, p.tiles_n, t0 + i, tn), first, ring[i]);
    for (int t = t0; t < t1; t += kPrefetch) {
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        int const tk = t + i;
        if (tk < t1) {
          uint32_t frag[4];
          dx::decode_fragments<kBits, kCb>(ring[i], o, frag);
          if (tk + kPrefetch < t1)
            dx::load_lane_words<kBits>(tile_words<kBits>(trellis, p.tiles_n, tk + kPrefetch, tn), first, ring[i]);
          int const kk = tk * 16;
          uint32_t const a0 = ld_u32_or_zero(x0 + kk, ok0), a1 = ld_u32_or_zero(x1 + kk, ok1);
          uint32_t const a2 = ld_u32_or_zero(x0 + kk + 8, ok0), a3 = ld_u32_or_zero(x1 + kk + 8, ok1);
          dx::mma_m16n8k16(acc[0], a0, a1, a2, a3, frag[0], frag[1]);
          dx::mma_m16n8k16(acc[1], a0, a1, a2, a3, frag[2], frag[3]);
        }
      }
    }
    float* out = p.partial + (static_cast<int64_t>(chunk) * p.num_rows) * p.n + static_cast<int64_t>(tn) * 16 + 2 * c;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (ok0) *reinterpret_cast<float2*>(out + (rg + g) * p.n + 8 * h) = make_float2(acc[h][0], acc[h][1]);
      if (ok1) *reinterpret_cast<float2*>(out + (rg + g + 8) * p.n + 8 * h) = make_float2(acc[h][2], acc[h][3]);
    }
  }
#endif
}

/// GEMM: full chunk chain in registers for 64 rows × 128 columns. grid (ceil(tiles_n / 8),
/// ceil(num_rows / 64)), block 256.
template <int kBits, Codebook kCb>
__global__ void __launch_bounds__(kGemmWarps * 32) exl3_gemm_kernel(Exl3MmaParams const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kW = dx::kLaneWords<kBits>;
  __shared__ __align__(16) __half sa[kGemmRows * kGemmLda];   // [64 rows][64 k + 8 pad]
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int const tn = blockIdx.x * kGemmWarps + warp;
  bool const active = tn < p.tiles_n;
  int64_t const row0 = static_cast<int64_t>(blockIdx.y) * kGemmRows;
  int const first = dx::lane_first_bit<kBits>(lane);
  int const o = first & 31;
  float total[4][2][4] = {};
  float cacc[4][2][4] = {};
  int const slab_tiles = kGemmSlabK / 16;
  for (int ts = 0; ts < p.tiles_k; ts += slab_tiles) {
    __syncthreads();
    // Stage xh[row0 .. row0+63][16ts .. 16ts+63]: 64 rows × 8 uint4 = 512 uint4, two per thread.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int const idx = threadIdx.x + i * kGemmWarps * 32;
      int const r = idx >> 3, cu = idx & 7;
      int64_t const row = row0 + r;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row < p.num_rows) v = __ldg(reinterpret_cast<uint4 const*>(p.xh + row * p.k + ts * 16 + cu * 8));
      *reinterpret_cast<uint4*>(sa + r * kGemmLda + cu * 8) = v;
    }
    __syncthreads();
    if (!active) continue;
    uint32_t w[slab_tiles][kW];
#pragma unroll
    for (int i = 0; i < slab_tiles; ++i) dx::load_lane_words<kBits>(tile_words<kBits>(p.trellis, p.tiles_n, ts + i, tn), first, w[i]);
#pragma unroll
    for (int i = 0; i < slab_tiles; ++i) {
      int const tk = ts + i;
      if (tk % p.chunk_tiles == 0 && tk > 0) {
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) { total[a][b][e] = __fadd_rn(total[a][b][e], cacc[a][b][e]); cacc[a][b][e] = 0.f; }
      }
      uint32_t frag[4];
      dx::decode_fragments<kBits, kCb>(w[i], o, frag);
#pragma unroll
      for (int ms = 0; ms < 4; ++ms) {
        uint32_t a0, a1, a2, a3;
        __half const* src = sa + (ms * 16 + (lane & 15)) * kGemmLda + i * 16 + (lane >> 4) * 8;
        uint32_t const addr = static_cast<uint32_t>(__cvta_generic_to_shared(src));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(addr) : "memory");
        dx::mma_m16n8k16(cacc[ms][0], a0, a1, a2, a3, frag[0], frag[1]);
        dx::mma_m16n8k16(cacc[ms][1], a0, a1, a2, a3, frag[2], frag[3]);
      }
    }
  }
  if (!active) return;
  int const g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int ms = 0; ms < 4; ++ms)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float const* t = total[ms][h];
      float const* q = cacc[ms][h];
      int64_t const ra = row0 + ms * 16 + g, rb = ra + 8;
      float* out = p.partial + static_cast<int64_t>(tn) * 16 + 8 * h + 2 * c;
      if (ra < p.num_rows)
        *reinterpret_cast<float2*>(out + ra * p.n) = make_float2(__fadd_rn(t[0], q[0]), __fadd_rn(t[1], q[1]));
      if (rb < p.num_rows)
        *reinterpret_cast<float2*>(out + rb * p.n) = make_float2(__fadd_rn(t[2], q[2]), __fadd_rn(t[3], q[3]));
    }
#endif
}

/// W' [k, n] fp16 from the trellis: one warp per tile. grid (ceil(tiles_k·tiles_n / 4)), block 128.
template <int kBits, Codebook kCb>
__global__ void __launch_bounds__(128) exl3_reconstruct_kernel(int16_t const* __restrict__ trellis, __half* w,
                                                               int tiles_k, int tiles_n, int64_t n) {
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

/// Launchers (defined per (K, codebook) in the generated inst/ TUs).
template <int kBits, int kCb>
cudaError_t launch_exl3_gemv(Exl3MmaParams const& p, int num_experts, cudaStream_t stream) {
  dim3 grid((p.tiles_n + kGemvWarps - 1) / kGemvWarps, p.num_chunks, num_experts);
  exl3_gemv_kernel<kBits, static_cast<Codebook>(kCb)><<<grid, kGemvWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}
template <int kBits, int kCb>
cudaError_t launch_exl3_gemm(Exl3MmaParams const& p, int, cudaStream_t stream) {
  dim3 grid((p.tiles_n + kGemmWarps - 1) / kGemmWarps, static_cast<unsigned>((p.num_rows + kGemmRows - 1) / kGemmRows));
  exl3_gemm_kernel<kBits, static_cast<Codebook>(kCb)><<<grid, kGemmWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}
template <int kBits, int kCb>
cudaError_t launch_exl3_reconstruct(int16_t const* trellis, __half* w, int tiles_k, int tiles_n, cudaStream_t stream) {
  int64_t const tiles = static_cast<int64_t>(tiles_k) * tiles_n;
  exl3_reconstruct_kernel<kBits, static_cast<Codebook>(kCb)>
      <<<static_cast<unsigned>((tiles + 3) / 4), 128, 0, stream>>>(trellis, w, tiles_k, tiles_n, 16LL * tiles_n);
  return cudaGetLastError();
}

using Exl3MmaLaunchFn = cudaError_t (*)(Exl3MmaParams const&, int, cudaStream_t);
using Exl3ReconstructFn = cudaError_t (*)(int16_t const*, __half*, int, int, cudaStream_t);

// clang-format off
#define TESSERA_EXL3_EXTERN_ONE(K, CB)                                                                   \
  extern template cudaError_t launch_exl3_gemv<K, CB>(Exl3MmaParams const&, int, cudaStream_t);         \
  extern template cudaError_t launch_exl3_gemm<K, CB>(Exl3MmaParams const&, int, cudaStream_t);         \
  extern template cudaError_t launch_exl3_reconstruct<K, CB>(int16_t const*, __half*, int, int, cudaStream_t);
#define TESSERA_EXL3_EXTERN_K(K) TESSERA_EXL3_EXTERN_ONE(K, 0) TESSERA_EXL3_EXTERN_ONE(K, 1) TESSERA_EXL3_EXTERN_ONE(K, 2)
// clang-format on
#ifndef TESSERA_EXL3_INSTANTIATING
TESSERA_EXL3_EXTERN_K(1) TESSERA_EXL3_EXTERN_K(2) TESSERA_EXL3_EXTERN_K(3) TESSERA_EXL3_EXTERN_K(4)
TESSERA_EXL3_EXTERN_K(5) TESSERA_EXL3_EXTERN_K(6) TESSERA_EXL3_EXTERN_K(7) TESSERA_EXL3_EXTERN_K(8)
#endif

}  // namespace tessera::kernels::exl3

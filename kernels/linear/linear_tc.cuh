// SPDX-License-Identifier: Apache-2.0
/// Tensor-core bf16 linear kernels (include/tessera/ops/linear_tc.hpp): y = x · Wᵀ with mma.sync, sm_80+ PTX
/// (built for sm_90a, run on the H200).
///
/// Accumulation contract (what makes the result ref::dot_tc's, if the instruction is BlockAcc's block step):
/// every output element (r, o) is one fp32 accumulator register, +0 at the start, updated once per K block
///   d ← mma(x[r, 16b .. 16b+15], W[o, 16b .. 16b+15], d)     for b = 0, 1, …, ⌈K/16⌉ − 1 in this order,
/// one instruction per block (TcMma::kK16) or two m16n8k8 for k 16b..16b+7 then 16b+8..16b+15 (kK8x2, the
/// diagnostic). No split-K, no second accumulator, nothing added after the chain: the value stored is the
/// register itself (fp32) and/or its →bf16 (RNE, tessera::bf16_bits_from_float, the reference's rounding).
/// Which k of a block sit in which fragment register does not matter to the model: a block step adds the
/// truncated terms exactly, so only the SET of 16 k indices of one instruction counts, and each instruction
/// gets exactly the 16 consecutive k of one block.
///
/// Zero padding. Rows past M and columns past N are zero operands whose outputs are never stored (an output of
/// an m16n8 tile depends only on its own row of A and column of B). K past the end of the last block is staged
/// as +0 in BOTH x and W, so each padding product is +0·+0, and exactly ⌈K/16⌉ block steps run (no all-zero
/// block is ever issued: it would turn an accumulator of −0 into +0 in IEEE arithmetic, where BlockAcc keeps
/// it). BlockAcc's partial last block lets zero products take no part in the alignment exponent E. The
/// hardware cannot disagree for these padding products: even an adder that took a zero's exponent field as
/// the subnormal exponent −126 would give +0·+0 the exponent sum −252, which no nonzero bf16 product (≥ −252)
/// and no nonzero fp32 accumulator (≥ −126) lies below, so E is unchanged; the term itself is 0. (A ZERO
/// FACTOR TIMES A HUGE ONE in real data is a different matter: there the field-exponent reading would give
/// −126 + e_b, which can exceed E. The model says such a product takes no part; the GPU test measures it.)
///
/// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16, g = lane / 4, c = lane % 4), A = x rows (row-major),
/// B = W rows (K contiguous = "col" layout), C/D fp32:
///   a0 = A[g][2c, 2c+1]  a1 = A[g+8][2c, 2c+1]  a2 = A[g][2c+8, 2c+9]  a3 = A[g+8][2c+8, 2c+9]
///   b0 = B[2c, 2c+1][g]  b1 = B[2c+8, 2c+9][g]
///   d0, d1 = D[g][2c, 2c+1]    d2, d3 = D[g+8][2c, 2c+1]
/// m16n8k8 takes {a0, a1} with b0 for k 0..7 and {a2, a3} with b1 for k 8..15, the same registers.
/// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8×8 matrix i; register i of thread t holds row t/4,
/// elements 2(t%4), 2(t%4)+1 of matrix i, which is exactly the fragment order above.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/common/cuda_util.cuh"
#include "tessera/core/dtype.hpp"
#include "tessera/ops/linear_tc.hpp"

namespace tessera::kernels::tc_linear {

using ops::TcMma;

/// Kernel operands (bf16 as raw bits). y / y_bf16 may be null (not written). y_vec2 / ybf_vec2: two adjacent
/// outputs (even column) may be stored as one 8-byte / 4-byte store (even row stride, aligned base).
struct TcLinearParams {
  uint16_t const* x = nullptr;  // [m, k], row stride ldx
  uint16_t const* w = nullptr;  // [n, k], row stride ldw
  float* y = nullptr;           // [m, n], row stride ldy
  uint16_t* y_bf16 = nullptr;   // [m, n], row stride ldy_bf16
  int64_t m = 0, n = 0, k = 0, ldx = 0, ldw = 0, ldy = 0, ldy_bf16 = 0;
  bool y_vec2 = false, ybf_vec2 = false;
  bool y_round_bf16 = false;  // y holds →bf16(D) widened to fp32 instead of D
  // Block-scaled W (linear_tc_quant.cuh) instead of w: codes (row stride ldwq bytes) and ue8m0 scales.
  uint8_t const* wq = nullptr;
  uint8_t const* wscale = nullptr;
  int64_t ldwq = 0, ldwscale = 0;
};

// ---- GEMM tile: 128 × 128 outputs, K slabs of 32, 8 warps (2 along M × 4 along N, warp tile 64 × 32) ----
inline constexpr int kGemmBM = 128, kGemmBN = 128, kGemmBK = 32;
inline constexpr int kGemmWarps = 8;
inline constexpr int kGemmStages = 4;
/// Shared-memory row: 32 halves of K + 8 of padding = 80 B, so the 8 row addresses of one ldmatrix phase
/// (offsets 80·r mod 128 = 0, 80, 32, 112, 64, 16, 96, 48) hit 8 distinct 16-byte bank groups.
inline constexpr int kGemmLds = kGemmBK + 8;
inline constexpr int kGemmTileHalves = kGemmBM * kGemmLds;  // one operand slab (BM == BN)
static_assert(kGemmBM == kGemmBN);
/// 4 stages × (x slab + W slab) × 128 rows × 80 B = 80 KiB: two blocks per SM fit the H200's 228 KiB.
inline constexpr size_t kGemmSmemBytes = size_t{kGemmStages} * 2 * kGemmTileHalves * sizeof(uint16_t);
inline constexpr int kGemmGroupM = 8;  // block raster: 8 M-tiles share a sweep over N (W slabs reused in L2)

// ---- Skinny (decode) tile: one warp = 8 columns × 16 rows, K slabs of 256 ----
inline constexpr int kSkinnyCols = 8;
inline constexpr int kSkinnyRows = 16;
inline constexpr int kSkinnyBK = 256;
inline constexpr int kSkinnyStages = 8;
/// 256 halves + 8 of padding = 528 B per row: 528 mod 128 = 16, so an ldmatrix phase over 8 rows is
/// conflict-free. A W row slab is 512 B = one 16-byte cp.async per lane (coalesced).
inline constexpr int kSkinnyLds = kSkinnyBK + 8;
/// Dynamic shared memory: 8 stages × (8 W rows + min(M, 16) x rows) × 528 B; 38 KiB at M = 1, 99 KiB at
/// M ≥ 16 (7 stages = 28 KiB of W in flight per warp).
inline constexpr size_t skinny_tile_smem_bytes(int mats, int stages, int64_t xr, int bk = kSkinnyBK) {
  return size_t(stages) * size_t(mats * kSkinnyCols + xr) * size_t(bk + 8) * sizeof(uint16_t);
}
inline constexpr size_t skinny_smem_bytes(int64_t m) {
  return skinny_tile_smem_bytes(1, kSkinnyStages, m < kSkinnyRows ? m : kSkinnyRows);
}

using kernels::allow_smem;  // kernels/common/cuda_util.cuh

__device__ __forceinline__ uint32_t smem_addr(void const* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
/// 16 bytes global → shared, asynchronous; valid = false zero-fills the 16 bytes and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, void const* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

/// d ← mma(a, b, d) over one 16-wide K block.
template <TcMma kMma>
__device__ __forceinline__ void block_step(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kMma == TcMma::kK16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {  // k 0..7 of the block, then k 8..15
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[2]), "r"(a[3]), "r"(b1));
  }
#endif
}

/// Elements k0..k0+7 of row `row` of g (row stride ld) into 16 bytes of shared memory at dst (16-byte
/// aligned); elements of a row ≥ rows or at k ≥ k are +0. kVec16: one cp.async (k0 and ld multiples of 8, so
/// the chunk is wholly inside or wholly past K); otherwise 8 guarded 2-byte loads and one 16-byte store.
template <bool kVec16>
__device__ __forceinline__ void stage_chunk(uint16_t* dst, uint16_t const* g, int64_t ld, int64_t row, int64_t rows,
                                            int64_t k0, int64_t k) {
  bool const row_ok = row < rows;
  if constexpr (kVec16) {
    bool const ok = row_ok && k0 < k;
    cp_async16(smem_addr(dst), ok ? g + row * ld + k0 : g, ok);
  } else {
    uint16_t const* src = g + (row_ok ? row : 0) * ld + k0;
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t const lo = row_ok && k0 + 2 * j < k ? __ldg(src + 2 * j) : 0u;
      uint32_t const hi = row_ok && k0 + 2 * j + 1 < k ? __ldg(src + 2 * j + 1) : 0u;
      v[j] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

/// Stores D[row][col], D[row][col + 1] (col even) where they exist.
__device__ __forceinline__ void store_pair(TcLinearParams const& p, int64_t row, int64_t col, float v0, float v1) {
  if (row >= p.m || col >= p.n) return;
  bool const both = col + 1 < p.n;
  if (p.y) {
    float* d = p.y + row * p.ldy + col;
    if (p.y_round_bf16) v0 = round_to_bf16(v0), v1 = round_to_bf16(v1);
    if (both && p.y_vec2) {
      *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
    } else {
      d[0] = v0;
      if (both) d[1] = v1;
    }
  }
  if (p.y_bf16) {
    uint16_t* d = p.y_bf16 + row * p.ldy_bf16 + col;
    uint16_t const h0 = bf16_bits_from_float(v0), h1 = bf16_bits_from_float(v1);
    if (both && p.ybf_vec2) {
      *reinterpret_cast<uint32_t*>(d) = static_cast<uint32_t>(h0) | (static_cast<uint32_t>(h1) << 16);
    } else {
      d[0] = h0;
      if (both) d[1] = h1;
    }
  }
}

/// The x rows one thread stages in the GEMM tile: rows (tid / 4) + 64·i, i < kGemmXRowsPerThread, of the
/// block's 128, chunk tid % 4 of each 32-wide slab (W rows likewise).
inline constexpr int kGemmXRowsPerThread = kGemmBM * (kGemmBK / 8) / (kGemmWarps * 32);
static_assert(kGemmXRowsPerThread == 2);

/// One 32-wide K slab of the 128 × 128 block tile from shared memory: x rows sx and W rows sw (kGemmLds pitch, K
/// contiguous), block steps over the slab's first min(32, klen) K (klen ≤ 0: none; exactly ⌈k/16⌉ steps over a
/// whole walk). Warp (wm, wn) = (warp / 4, warp % 4) adds to acc[mt][nt], the m16n8 tile of block rows
/// 64·wm + 16·mt .., columns 32·wn + 8·nt .. (fragment layout of D).
template <TcMma kMma>
__device__ __forceinline__ void gemm_slab_mma(uint16_t const* sx, uint16_t const* sw, int64_t klen, float (&acc)[4][4][4]) {
  int const lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  int const wm = warp >> 2, wn = warp & 3;
#pragma unroll
  for (int kk = 0; kk < kGemmBK; kk += 16) {
    if (kk >= klen) break;
    uint32_t a[4][4], b[4][2];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
      ldmatrix_x4(a[mt], smem_addr(sx + (wm * 64 + mt * 16 + (lane & 15)) * kGemmLds + kk + (lane >> 4) * 8));
#pragma unroll
    for (int np = 0; np < 2; ++np) {  // n8 tiles 2np, 2np+1: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, …)
      uint32_t r[4];
      ldmatrix_x4(r, smem_addr(sw + (wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kGemmLds + kk +
                               ((lane >> 3) & 1) * 8));
      b[2 * np][0] = r[0];
      b[2 * np][1] = r[1];
      b[2 * np + 1][0] = r[2];
      b[2 * np + 1][1] = r[3];
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) block_step<kMma>(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
  }
}

/// One block's 128 × 128 tile, the main loop of linear_tc_gemm_kernel and of the grouped MoE kernels
/// (kernels/moe/moe_tc_cuda.cu): W rows n0 .. n0 + 127 of w ([n, k], row stride ldw; rows ≥ n staged as +0) against
/// 128 x rows of which this thread stages rows (tid / 4) + 64·i from xrow[i] (K contiguous) when xok[i], else +0
/// (xrow[i] must still be a valid global address). Warp (wm, wn) = (warp / 4, warp % 4) accumulates
///   acc[mt][nt] = the m16n8 tile of block rows 64·wm + 16·mt .., columns 32·wn + 8·nt .. (fragment layout of D),
/// one register chain per output over the ⌈k/16⌉ blocks in order. Pipeline: slab kt + 3 is in flight (cp.async)
/// while slab kt is multiplied; one __syncthreads per slab guards the ring, and one more at the end, so on return
/// the shared memory (kGemmSmemBytes, 16-byte aligned) may be reused. kVec16: 16-byte staging (k % 8 == 0,
/// ldw % 8 == 0, w and every x row 16-byte aligned); otherwise element loads, one chunk pair at a time.
template <TcMma kMma, bool kVec16>
__device__ __forceinline__ void gemm_block_tile(uint16_t* smem, uint16_t const* const (&xrow)[kGemmXRowsPerThread],
                                                bool const (&xok)[kGemmXRowsPerThread], uint16_t const* w,
                                                int64_t ldw, int64_t n0, int64_t n, int64_t k, float (&acc)[4][4][4]) {
  int const tid = static_cast<int>(threadIdx.x);
  auto slab_x = [&](int s) { return smem + s * 2 * kGemmTileHalves; };
  auto slab_w = [&](int s) { return smem + s * 2 * kGemmTileHalves + kGemmTileHalves; };
  // Slab kt → stage s: 128 rows × 4 chunks of 8 halves per operand, 2 chunks per thread per operand.
  auto stage_one = [&](int64_t k0, int s, int i) {
    int const r = (tid >> 2) + 64 * i, c = tid & 3;
    bool const ok = i == 0 ? xok[0] : xok[1];  // static indices: i is not unrolled on the element path
    uint16_t const* const x = i == 0 ? xrow[0] : xrow[1];
    stage_chunk<kVec16>(slab_x(s) + r * kGemmLds + c * 8, x, 0, 0, ok ? 1 : 0, k0 + c * 8, k);
    stage_chunk<kVec16>(slab_w(s) + r * kGemmLds + c * 8, w, ldw, n0 + r, n, k0 + c * 8, k);
  };
  auto stage = [&](int64_t kt, int s) {
    if constexpr (kVec16) {
#pragma unroll
      for (int i = 0; i < kGemmXRowsPerThread; ++i) stage_one(kt * kGemmBK, s, i);
    } else {  // element loads: one chunk pair at a time keeps the 64 accumulators clear of spills
#pragma unroll 1
      for (int i = 0; i < kGemmXRowsPerThread; ++i) stage_one(kt * kGemmBK, s, i);
    }
  };

#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  int64_t const slabs = (k + kGemmBK - 1) / kGemmBK;
#pragma unroll
  for (int s = 0; s < kGemmStages - 1; ++s) {
    if (s < slabs) stage(s, s);
    cp_async_commit();  // one group per slab, empty past the end, so wait_group counts stay uniform
  }
  for (int64_t kt = 0; kt < slabs; ++kt) {
    cp_async_wait<kGemmStages - 2>();  // slab kt has landed (this thread's part) …
    __syncthreads();                   // … everyone's part, and stage (kt − 1) % 4 is no longer being read
    if (kt + kGemmStages - 1 < slabs) stage(kt + kGemmStages - 1, static_cast<int>((kt + kGemmStages - 1) % kGemmStages));
    cp_async_commit();
    int const s = static_cast<int>(kt % kGemmStages);
    gemm_slab_mma<kMma>(slab_x(s), slab_w(s), k - kt * kGemmBK, acc);
  }
  cp_async_wait<0>();
  __syncthreads();
}

/// Block blockIdx.x's tile origin (m0, n0) of an M × N problem in kBM × kBN tiles on a 1-D grid of ⌈M/kBM⌉·⌈N/kBN⌉,
/// grouped raster: kGroupM M tiles share a sweep over N, so W slabs are reused in L2.
template <int kBM, int kBN, int kGroupM>
__device__ __forceinline__ void grouped_tile_origin(int64_t m, int64_t n, int64_t& m0, int64_t& n0) {
  int64_t const tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kBN - 1) / kBN;
  int64_t const per_group = kGroupM * tiles_n;
  int64_t const bid = blockIdx.x;
  int64_t const first_m = bid / per_group * kGroupM;
  int64_t const group_m = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
  int64_t const in_group = bid % per_group;
  m0 = (first_m + in_group % group_m) * kBM;
  n0 = in_group / group_m * kBN;
}

/// The block's tile origin (m0, n0) of a GEMM launch: grid ⌈M/128⌉·⌈N/128⌉ (1-D), grouped raster.
__device__ __forceinline__ void gemm_tile_origin(TcLinearParams const& p, int64_t& m0, int64_t& n0) {
  grouped_tile_origin<kGemmBM, kGemmBN, kGemmGroupM>(p.m, p.n, m0, n0);
}

/// The x rows this thread stages for the tile at m0 (gemm_block_tile's xrow / xok; rows ≥ M read row 0's address).
__device__ __forceinline__ void gemm_x_rows(TcLinearParams const& p, int64_t m0, uint16_t const* (&xrow)[kGemmXRowsPerThread],
                                            bool (&xok)[kGemmXRowsPerThread]) {
  int const tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int i = 0; i < kGemmXRowsPerThread; ++i) {
    int64_t const row = m0 + (tid >> 2) + 64 * i;
    xok[i] = row < p.m;
    xrow[i] = p.x + (xok[i] ? row : 0) * p.ldx;
  }
}

/// The block tile's outputs (acc in gemm_block_tile's layout) where they exist.
__device__ __forceinline__ void gemm_store(TcLinearParams const& p, int64_t m0, int64_t n0, float const (&acc)[4][4][4]) {
  int const lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  int const wm = warp >> 2, wn = warp & 3, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      int64_t const row = m0 + wm * 64 + mt * 16 + g, col = n0 + wn * 32 + nt * 8 + 2 * c;
      store_pair(p, row, col, acc[mt][nt][0], acc[mt][nt][1]);
      store_pair(p, row + 8, col, acc[mt][nt][2], acc[mt][nt][3]);
    }
}

/// GEMM: grid ⌈M/128⌉·⌈N/128⌉ (1-D, grouped raster), block 256, dynamic shared memory kGemmSmemBytes.
/// Block tile rows m0 .. m0 + 127 of x, columns n0 .. n0 + 127 of W (gemm_block_tile): 16 accumulator tiles =
/// 64 fp32 registers per thread.
template <TcMma kMma, bool kVec16>
__global__ void __launch_bounds__(kGemmWarps * 32, 2) linear_tc_gemm_kernel(TcLinearParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) uint16_t gemm_smem[];
  int64_t m0, n0;
  gemm_tile_origin(p, m0, n0);
  uint16_t const* xrow[kGemmXRowsPerThread];
  bool xok[kGemmXRowsPerThread];
  gemm_x_rows(p, m0, xrow, xok);
  float acc[4][4][4];
  gemm_block_tile<kMma, kVec16>(gemm_smem, xrow, xok, p.w, p.ldw, n0, p.n, p.k, acc);
  gemm_store(p, m0, n0, acc);
}

/// One warp's skinny tile, the main loop of linear_tc_skinny_kernel and of the grouped MoE kernels
/// (kernels/moe/moe_tc_cuda.cu): kMats weight matrices w[i] ([n, k], row stride ldw, K contiguous) share one set
/// of 1 ≤ xr ≤ 16 x rows (row j at xrow(j), K contiguous), and the warp accumulates
///   acc[i] = the m16n8 tile D[j][c] = Σ_k x_j[k]·w_i[n0 + c][k],   j < 16, c < 8,
/// one register chain per output over the ⌈k/16⌉ blocks in order (the contract at the top of this file), with
/// the fragment layout of D (d0, d1 = D[g][2c, 2c+1], d2, d3 = D[g+8][2c, 2c+1]). Rows j ≥ xr are zero
/// registers, W rows ≥ n and x/W elements at k ≥ k are staged as +0: the caller stores only j < xr, n0 + c < n.
/// Per 256-wide K slab it stages the kMats·8 W rows (coalesced: one 16-byte cp.async per lane and row) and the
/// xr x rows into a kStages ring, so kStages − 1 slabs are in flight. Shared memory: smem (16-byte aligned) ≥
/// skinny_tile_smem_bytes(kMats, kStages, xr) bytes. kVec16: 16-byte staging (k % 8 == 0, ldw % 8 == 0, every
/// w[i] and x row 16-byte aligned); otherwise element loads. All 32 lanes call it; everything is warp-uniform.
template <TcMma kMma, bool kVec16, int kMats, int kStages, int kBK = kSkinnyBK, class XRow>
__device__ __forceinline__ void skinny_warp_tile(uint16_t* smem, uint16_t const* const (&w)[kMats], int64_t ldw,
                                                 int64_t n0, int64_t n, int64_t k, int xr, XRow const& xrow,
                                                 float (&acc)[kMats][4]) {
  static_assert(kStages >= 2 && kMats >= 1 && kBK % 256 == 0, "a slab row is whole 16-byte chunks of every lane");
  constexpr int kLds = kBK + 8;  // ≡ 16 bytes mod 128: conflict-free ldmatrix phases (see kLds)
  int const lane = static_cast<int>(threadIdx.x & 31);
  int const stage_halves = (kMats * kSkinnyCols + xr) * kLds;
  auto slab_w = [&](int s, int i) { return smem + s * stage_halves + i * kSkinnyCols * kLds; };
  auto slab_x = [&](int s) { return smem + s * stage_halves + kMats * kSkinnyCols * kLds; };
  auto stage = [&](int64_t ks, int s) {
#pragma unroll
    for (int c = 0; c < kBK / 256; ++c) {  // a slab row is kBK / 256 runs of 512 contiguous bytes per warp
      int const off = c * 256 + lane * 8;
      int64_t const k0 = ks * kBK + off;
#pragma unroll
      for (int i = 0; i < kMats; ++i)
#pragma unroll
        for (int j = 0; j < kSkinnyCols; ++j)
          stage_chunk<kVec16>(slab_w(s, i) + j * kLds + off, w[i], ldw, n0 + j, n, k0, k);
      for (int j = 0; j < xr; ++j) stage_chunk<kVec16>(slab_x(s) + j * kLds + off, xrow(j), 0, 0, 1, k0, k);
    }
  };

#pragma unroll
  for (int i = 0; i < kMats; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  int const g = lane >> 2;
  int const arow = (lane & 15) < xr ? (lane & 15) : xr - 1;  // ldmatrix row address (clamped; zeroed below)
  bool const lo_ok = g < xr, hi_ok = g + 8 < xr;                // fragment rows g and g + 8 are staged

  int64_t const slabs = (k + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < slabs) stage(s, s);
    cp_async_commit();  // one group per slab, empty past the end, so wait_group counts stay uniform
  }
  for (int64_t ks = 0; ks < slabs; ++ks) {
    cp_async_wait<kStages - 2>();  // slab ks has landed (this lane's part) …
    __syncwarp();                  // … every lane's part, and stage (ks − 1) % kStages is no longer being read
    if (ks + kStages - 1 < slabs) stage(ks + kStages - 1, static_cast<int>((ks + kStages - 1) % kStages));
    cp_async_commit();
    int const s = static_cast<int>(ks % kStages);
    uint16_t const* sx = slab_x(s);
    int64_t const kbase = ks * kBK;
#pragma unroll 2
    for (int kk = 0; kk < kBK; kk += 32) {
      if (kbase + kk >= k) break;
      uint32_t b[kMats][4];  // per matrix: (n 0-7) × k kk+0..7, kk+8..15, kk+16..23, kk+24..31
#pragma unroll
      for (int i = 0; i < kMats; ++i)
        ldmatrix_x4(b[i], smem_addr(slab_w(s, i) + (lane & 7) * kLds + kk + (lane >> 3) * 8));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (kbase + kk + 16 * h >= k) break;  // exactly ⌈k/16⌉ block steps
        uint32_t a[4];
        ldmatrix_x4(a, smem_addr(sx + arow * kLds + kk + 16 * h + (lane >> 4) * 8));
        if (!lo_ok) a[0] = a[2] = 0u;
        if (!hi_ok) a[1] = a[3] = 0u;
#pragma unroll
        for (int i = 0; i < kMats; ++i) block_step<kMma>(acc[i], a, b[i][2 * h], b[i][2 * h + 1]);
      }
    }
  }
  cp_async_wait<0>();
}

/// Skinny (decode): grid (⌈N/8⌉, ⌈M/16⌉), block 32 (one warp), dynamic shared memory skinny_smem_bytes(M).
/// The warp owns columns 8·blockIdx.x .. +7 and rows 16·blockIdx.y .. +15 (skinny_warp_tile with one matrix):
/// one m16n8 accumulator tile (4 registers per thread), 7 slabs (28 KiB of W) in flight per warp; the x rows
/// of the tile that are not staged (M < 16, or the last group) are zero registers. One ldmatrix.x4 on W gives
/// the B fragments of two consecutive blocks.
template <TcMma kMma, bool kVec16, int kBK = kSkinnyBK, int kStages = kSkinnyStages>
__device__ __forceinline__ void skinny_tile(TcLinearParams const& p) {
  extern __shared__ __align__(16) uint16_t skinny_smem[];
  int const lane = static_cast<int>(threadIdx.x);
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  int64_t const r0 = static_cast<int64_t>(blockIdx.y) * kSkinnyRows;
  if (n0 >= p.n || r0 >= p.m) return;  // warp-uniform (a batch's grid covers its widest problem)
  int const xr = static_cast<int>(p.m - r0 < kSkinnyRows ? p.m - r0 : kSkinnyRows);  // x rows staged per slab
  uint16_t const* const w[1] = {p.w};
  float acc[1][4];
  skinny_warp_tile<kMma, kVec16, 1, kStages, kBK>(skinny_smem, w, p.ldw, n0, p.n, p.k, xr,
                                                   [&](int j) { return p.x + (r0 + j) * p.ldx; }, acc);
  int const g = lane >> 2, c = lane & 3;
  int64_t const col = n0 + 2 * c;
  store_pair(p, r0 + g, col, acc[0][0], acc[0][1]);
  store_pair(p, r0 + g + 8, col, acc[0][2], acc[0][3]);
}

template <TcMma kMma, bool kVec16, int kBK = kSkinnyBK, int kStages = kSkinnyStages>
__global__ void __launch_bounds__(32) linear_tc_skinny_kernel(TcLinearParams const p) {
  device::pdl_enter();
  skinny_tile<kMma, kVec16, kBK, kStages>(p);
}

/// Up to kTcMaxBatch independent skinny problems in one launch (grid.z = problem; grid.x, grid.y cover the
/// widest): the grouped output projection's 8 groups of 1024 columns are 8 × 128 warps at once instead of
/// 8 launches of 128 warps on 132 SMs. Each problem's outputs are those of its own single launch.
inline constexpr int kTcMaxBatch = 8;
struct TcLinearBatch {
  TcLinearParams p[kTcMaxBatch];
};

template <TcMma kMma, bool kVec16>
__global__ void __launch_bounds__(32) linear_tc_skinny_batch_kernel(TcLinearBatch const b) {
  device::pdl_enter();
  skinny_tile<kMma, kVec16>(b.p[blockIdx.z]);
}

}  // namespace tessera::kernels::tc_linear

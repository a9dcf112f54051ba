// SPDX-License-Identifier: Apache-2.0
/// Block-scaled weights on the skinny tensor-core tile, codes straight into registers (ops::TcQuantPath::kDirect):
/// the values of linear_tc_quant.cuh's ring path bit for bit, without the shared-memory round trip of the codes.
///
/// Fragment ↔ K: the mma B fragment of lane (g, c) holds, per 16-wide K block b, four operands of W row n0 + g at
/// fragment positions 2c, 2c+1 (b0) and 2c+8, 2c+9 (b1). The lane loads the four CONSECUTIVE codes
/// k = 16b + 4c … 16b + 4c + 3 (FP8: one 4-byte word; FP4: one 2-byte word, even k in the low nibble; in both the
/// word index in the row is 4b + c) and places k 16b+4c, +1 at 2c, 2c+1 and k 16b+4c+2, +3 at 2c+8, 2c+9. The
/// x rows are staged in shared memory with the same permutation inside every block (actual k = 4c + j goes to
/// position 2c + j for j < 2, 2c + 6 + j for j ≥ 2), so the A fragment pairs each x[k] with W[·][k]. A block
/// step's result depends only on the set of its 16 products (tc::block_step: one multi-term addition, exact
/// integer sum of aligned terms), so the permutation changes nothing; the block order is unchanged.
///
/// Decode per code as the ring path: the code's value (e4m3 by the hardware conversion, e2m1 from a 256-entry
/// table), widened, times 2^(s−127) in fp32, →bf16 (RNE). Per lane and matrix, kGroup blocks of codes are in flight while the previous kGroup are
/// multiplied (two named register sets). Shared memory per warp: the x rows (xr × (k + 8) halves), the table, the
/// scales of the warp's rows (as the ring path). Requires k % 32 == 0, k ≤ kTcQuantMaxK, 16-byte aligned x rows,
/// 4-byte aligned code rows, ops::tc_quant_direct_fits(xr, k). All 32 lanes call it; everything is warp-uniform.
#pragma once

#include <type_traits>

#include "kernels/linear/linear_tc_quant.cuh"

namespace tessera::kernels::tc_linear {

inline constexpr int kDirectGroup = 8;  // blocks per prefetch group (two groups in flight per lane and matrix)

template <DType kFmt>
inline constexpr size_t skinny_qd_smem_bytes(int mats, int64_t xr, int64_t k) {
  size_t const x = (size_t(xr) * size_t(k + 8) * 2 + 15) / 16 * 16;
  size_t const scales = size_t(mats) * kScaleRows<kFmt> * size_t(quant_scale_cols(k));
  return x + 1024 + (scales + 15) / 16 * 16;
}

template <DType kFmt, int kMats, class XRow>
__device__ __forceinline__ void skinny_warp_tile_qd(unsigned char* smem, QuantW const (&w)[kMats], int64_t n0, int64_t n,
                                                    int64_t k, int xr, XRow const& xrow, float (&acc)[kMats][4]) {
  using Word = std::conditional_t<kFmt == DType::kF8E4m3, uint32_t, uint16_t>;  // 4 codes
  constexpr int kG = kDirectGroup;
  int const lane = static_cast<int>(threadIdx.x & 31);
  int const g = lane >> 2, c = lane & 3;
  int64_t const xld = k + 8;
  uint16_t* const xs = reinterpret_cast<uint16_t*>(smem);
  uint32_t* const lut = reinterpret_cast<uint32_t*>(smem + (size_t(xr) * size_t(xld) * 2 + 15) / 16 * 16);
  unsigned char* const scales = reinterpret_cast<unsigned char*>(lut + 256);
  int64_t const scols = quant_scale_cols(k);
  int const nblocks = static_cast<int>(k / 16);
  int const ngroups = (nblocks + kG - 1) / kG;

  Word const* wrow[kMats];
#pragma unroll
  for (int i = 0; i < kMats; ++i)
    wrow[i] = n0 + g < n ? reinterpret_cast<Word const*>(w[i].q + (n0 + g) * w[i].ldq) + c : nullptr;
  auto load_group = [&](int grp, uint32_t (&buf)[kMats][kG]) {
#pragma unroll
    for (int i = 0; i < kMats; ++i)
#pragma unroll
      for (int j = 0; j < kG; ++j) {
        int const b = grp * kG + j;
        buf[i][j] = wrow[i] && b < nblocks ? static_cast<uint32_t>(__ldg(wrow[i] + 4 * b)) : 0u;
      }
  };
  uint32_t buf_a[kMats][kG], buf_b[kMats][kG];
  load_group(0, buf_a);  // in flight while x, the table and the scales are staged

  // x rows, block-permuted: the 8 values of a 16-byte chunk at k = 8t are k 16b + 8h + 0..7 (h = t % 2), i.e.
  // c' = 2h, 2h + 1; their pairs (j = 0, 1) and (j = 2, 3) land at 2c', 2c' + 8 as 4-byte words.
  for (int j = 0; j < xr; ++j) {
    uint16_t const* src = xrow(j);
    uint16_t* dst = xs + j * xld;
    for (int64_t t = lane; t < k / 8; t += 32) {
      uint4 const v = *reinterpret_cast<uint4 const*>(src + 8 * t);
      int64_t const base = (8 * t) & ~int64_t{15};
      int const h = static_cast<int>(t & 1);
      uint32_t const words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        int const cc = 2 * h + q / 2;
        int const pos = (q % 2 == 0) ? 2 * cc : 2 * cc + 8;
        *reinterpret_cast<uint32_t*>(dst + base + pos) = words[q];
      }
    }
  }
  stage_quant_scales_and_table<kFmt, kMats>(scales, lut, w, n0, n, k, lane);
  __syncwarp();

#pragma unroll
  for (int i = 0; i < kMats; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  int const arow = (lane & 15) < xr ? (lane & 15) : xr - 1;
  bool const lo_ok = g < xr, hi_ok = g + 8 < xr;
  uint32_t const xa = smem_addr(xs + arow * xld + (lane >> 4) * 8);
  // The scale row of matrix i for this lane: FP4 its W row, FP8 the warp's 32-row block.
  int const srow = kFmt == DType::kF4E2m1x2 ? g : 0;

  // A scale covers 32 K (two blocks): it is read and converted once per block pair (kG is even and groups start
  // on even blocks), not per block.
  static_assert(kG % 2 == 0, "scale pairs");
  unsigned char const* srows[kMats];
#pragma unroll
  for (int i = 0; i < kMats; ++i) srows[i] = scales + (i * kScaleRows<kFmt> + srow) * scols;
  auto compute_group = [&](int grp, uint32_t const (&buf)[kMats][kG]) {
    float sc[kMats];       // FP8: 2^(s−127) in fp32
    uint32_t sc2[kMats];   // FP4: 2^(s−127) as bf16x2
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      int const b = grp * kG + j;
      if (b >= nblocks) break;
      if (j % 2 == 0) {
#pragma unroll
        for (int i = 0; i < kMats; ++i) {
          uint8_t const sb = srows[i][b / 2];
          if constexpr (kFmt == DType::kF8E4m3) sc[i] = float_from_e8m0(sb);
          else sc2[i] = e8m0_bf16x2(sb);
        }
      }
      uint32_t a[4];
      ldmatrix_x4(a, xa + static_cast<uint32_t>(b) * 32u);
      if (!lo_ok) a[0] = a[2] = 0u;
      if (!hi_ok) a[1] = a[3] = 0u;
#pragma unroll
      for (int i = 0; i < kMats; ++i) {
        uint32_t const word = buf[i][j];
        uint32_t b0, b1;
        if constexpr (kFmt == DType::kF8E4m3) {
          b0 = scaled_e4m3x2(word, sc[i]);
          b1 = scaled_e4m3x2(word >> 16, sc[i]);
        } else {
          b0 = scaled_e2m1x2(lut[word & 0xFFu], sc2[i]);
          b1 = scaled_e2m1x2(lut[(word >> 8) & 0xFFu], sc2[i]);
        }
        block_step<TcMma::kK16>(acc[i], a, b0, b1);
      }
    }
  };
  for (int grp = 0; grp < ngroups; grp += 2) {
    if (grp + 1 < ngroups) load_group(grp + 1, buf_b);
    compute_group(grp, buf_a);
    if (grp + 1 < ngroups) {
      if (grp + 2 < ngroups) load_group(grp + 2, buf_a);
      compute_group(grp + 1, buf_b);
    }
  }
}

template <DType kFmt>
__device__ __forceinline__ void skinny_qd_tile(TcLinearParams const& p) {
  extern __shared__ __align__(16) unsigned char skinny_qd_smem[];
  int const lane = static_cast<int>(threadIdx.x);
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  if (n0 >= p.n) return;
  int const xr = static_cast<int>(p.m);
  QuantW const w[1] = {{p.wq, p.wscale, p.ldwq, p.ldwscale}};
  float acc[1][4];
  skinny_warp_tile_qd<kFmt, 1>(skinny_qd_smem, w, n0, p.n, p.k, xr, [&](int j) { return p.x + j * p.ldx; }, acc);
  int const g = lane >> 2, c = lane & 3;
  int64_t const col = n0 + 2 * c;
  store_pair(p, g, col, acc[0][0], acc[0][1]);
  store_pair(p, g + 8, col, acc[0][2], acc[0][3]);
}

template <DType kFmt>
__global__ void __launch_bounds__(32) linear_tc_skinny_qd_kernel(TcLinearParams const p) {
  skinny_qd_tile<kFmt>(p);
}
template <DType kFmt>
__global__ void __launch_bounds__(32) linear_tc_skinny_qd_batch_kernel(TcLinearBatch const b) {
  skinny_qd_tile<kFmt>(b.p[blockIdx.z]);
}

}  // namespace tessera::kernels::tc_linear

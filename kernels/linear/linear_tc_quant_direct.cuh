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
/// table), widened, times 2^(s−127) in fp32, →bf16 (RNE). Per lane and matrix, kDirectGroup blocks of codes are in
/// flight while the previous kDirectGroup are multiplied (two named register sets). The main loop is lean: groups of
/// kDirectGroup whole blocks load without bounds checks at immediate offsets from one pointer per group (W rows past n
/// read row n − 1, A rows past xr repeat row xr − 1; neither is stored), and the scales are converted once at
/// staging (FP4: bf16 bits per W row, FP8: fp32 per warp block), so a block pair reads its scale with one shared load.
/// Shared memory per warp: skinny_qd_smem_bytes (x rows xr × (k + 8) halves, the table, the scales). Requires
/// k % 32 == 0, k ≤ kTcQuantMaxK, 16-byte aligned x rows, 4-byte aligned code rows, ops::tc_quant_direct_fits(xr, k).
/// All 32 lanes call it; everything is warp-uniform.
#pragma once

#include <type_traits>

#include "kernels/linear/linear_tc_quant.cuh"

namespace tessera::kernels::tc_linear {

inline constexpr int kDirectGroup = 8;  // blocks per prefetch group (two groups in flight per lane and matrix)

/// Scales of one matrix as the direct tile holds them, converted once at staging: FP4 the bf16 bits of 2^(s−127)
/// (e8m0_bf16x2's half) per W row and 32 K, rows direct_scale_stride apart; FP8 fp32 2^(s−127) per 32 K of the
/// warp's 32-row block.
inline constexpr int64_t direct_scale_stride(int64_t k) { return ((k / 32 + 1) / 2 | 1) * 2; }  // odd words: 8 rows, 8 banks
template <DType kFmt>
inline constexpr size_t direct_scale_bytes(int64_t k) {
  return kFmt == DType::kF4E2m1x2 ? size_t(kSkinnyCols) * size_t(direct_scale_stride(k)) * 2 : size_t(k / 32) * 4;
}

/// Shared memory per warp: the x rows (16-byte aligned), the FP4 table (1 KiB), the scales of each matrix.
template <DType kFmt>
inline constexpr size_t skinny_qd_smem_bytes(int mats, int64_t xr, int64_t k) {
  size_t const x = (size_t(xr) * size_t(k + 8) * 2 + 15) / 16 * 16;
  return x + 1024 + size_t(mats) * ((direct_scale_bytes<kFmt>(k) + 15) / 16 * 16);
}

template <DType kFmt, int kMats, class XRow>
__device__ __forceinline__ void skinny_warp_tile_qd(unsigned char* smem, QuantW const (&w)[kMats], int64_t n0, int64_t n,
                                                    int64_t k, int xr, XRow const& xrow, float (&acc)[kMats][4]) {
  using Word = std::conditional_t<kFmt == DType::kF8E4m3, uint32_t, uint16_t>;  // 4 codes
  constexpr int kG = kDirectGroup;
  constexpr bool kFp4 = kFmt == DType::kF4E2m1x2;
  int const lane = static_cast<int>(threadIdx.x & 31);
  int const g = lane >> 2, c = lane & 3;
  int64_t const xld = k + 8;
  uint16_t* const xs = reinterpret_cast<uint16_t*>(smem);
  uint32_t* const lut = reinterpret_cast<uint32_t*>(smem + (size_t(xr) * size_t(xld) * 2 + 15) / 16 * 16);
  unsigned char* const scales = reinterpret_cast<unsigned char*>(lut + 256);
  size_t const mat_scale_bytes = (direct_scale_bytes<kFmt>(k) + 15) / 16 * 16;
  int const scols = static_cast<int>(k / 32);
  int const nblocks = static_cast<int>(k / 16);
  int const ngroups = (nblocks + kG - 1) / kG, nfull = nblocks / kG;  // groups [0, nfull) hold kG blocks

  // W rows past n read row n − 1 (their columns are never stored), so every load of a full group is unconditional.
  int64_t const wr = n0 + g < n ? n0 + g : n - 1;
  Word const* wp[kMats];
#pragma unroll
  for (int i = 0; i < kMats; ++i) wp[i] = reinterpret_cast<Word const*>(w[i].q + wr * w[i].ldq) + c;
  auto load_group = [&](int grp, uint32_t (&buf)[kMats][kG], auto checked) {
#pragma unroll
    for (int i = 0; i < kMats; ++i) {
      Word const* const base = wp[i] + 4 * kG * grp;
#pragma unroll
      for (int j = 0; j < kG; ++j) {
        if constexpr (decltype(checked)::value) buf[i][j] = grp * kG + j < nblocks ? static_cast<uint32_t>(__ldg(base + 4 * j)) : 0u;
        else buf[i][j] = static_cast<uint32_t>(__ldg(base + 4 * j));
      }
    }
  };
  uint32_t buf_a[kMats][kG], buf_b[kMats][kG];
  auto load = [&](int grp, uint32_t (&buf)[kMats][kG]) {
    if (grp < nfull) load_group(grp, buf, std::false_type{});
    else load_group(grp, buf, std::true_type{});
  };
  load(0, buf_a);  // in flight while x, the table and the scales are staged

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
  // Scales, converted once (rows past n: row n − 1's, never stored); FP4: the code table.
#pragma unroll
  for (int i = 0; i < kMats; ++i) {
    unsigned char* const dst = scales + i * mat_scale_bytes;
    if constexpr (kFp4) {
      int const su = static_cast<int>(direct_scale_stride(k));
      for (int e = lane; e < kSkinnyCols * scols; e += 32) {
        int const r = e / scols, col = e % scols;
        int64_t const row = n0 + r < n ? n0 + r : n - 1;
        reinterpret_cast<uint16_t*>(dst)[r * su + col] =
            static_cast<uint16_t>(e8m0_bf16x2(__ldg(w[i].s + row * w[i].lds + col)) & 0xFFFFu);
      }
    } else {
      for (int col = lane; col < scols; col += 32)
        reinterpret_cast<float*>(dst)[col] = float_from_e8m0(__ldg(w[i].s + (n0 / 32) * w[i].lds + col));
    }
  }
  if constexpr (kFp4)
    for (int b = lane; b < 256; b += 32)
      lut[b] = static_cast<uint32_t>(bf16_bits_from_float(float_from_fp4_e2m1(static_cast<uint8_t>(b & 15)))) |
               (static_cast<uint32_t>(bf16_bits_from_float(float_from_fp4_e2m1(static_cast<uint8_t>(b >> 4)))) << 16);
  __syncwarp();

#pragma unroll
  for (int i = 0; i < kMats; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  // A fragment rows past xr repeat row xr − 1: their accumulators are never stored (rows are independent in the mma).
  int const arow = (lane & 15) < xr ? (lane & 15) : xr - 1;
  uint32_t const xa = smem_addr(xs + arow * xld + (lane >> 4) * 8);
  // This lane's scale row of matrix i: FP4 its W row's bf16 bits, FP8 the warp block's fp32 values.
  uint16_t const* srow4[kMats];
  float const* srow8[kMats];
#pragma unroll
  for (int i = 0; i < kMats; ++i) {
    srow4[i] = reinterpret_cast<uint16_t const*>(scales + i * mat_scale_bytes) + g * direct_scale_stride(k);
    srow8[i] = reinterpret_cast<float const*>(scales + i * mat_scale_bytes);
  }

  // A scale covers 32 K (two blocks): read once per block pair (kG is even and groups start on even blocks).
  static_assert(kG % 2 == 0, "scale pairs");
  auto compute_group = [&](int grp, uint32_t const (&buf)[kMats][kG], auto checked) {
    [[maybe_unused]] float sc[kMats];       // FP8: 2^(s−127) in fp32
    [[maybe_unused]] uint32_t sc2[kMats];   // FP4: 2^(s−127) as bf16x2
    uint32_t const xg = xa + static_cast<uint32_t>(grp * kG) * 32u;
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      int const b = grp * kG + j;
      if constexpr (decltype(checked)::value)
        if (b >= nblocks) break;
      if (j % 2 == 0) {
#pragma unroll
        for (int i = 0; i < kMats; ++i) {
          if constexpr (kFp4) sc2[i] = static_cast<uint32_t>(srow4[i][b / 2]) * 0x10001u;
          else sc[i] = srow8[i][b / 2];
        }
      }
      uint32_t a[4];
      ldmatrix_x4(a, xg + static_cast<uint32_t>(j) * 32u);
#pragma unroll
      for (int i = 0; i < kMats; ++i) {
        uint32_t const word = buf[i][j];
        uint32_t b0, b1;
        if constexpr (kFp4) {
          b0 = scaled_e2m1x2(lut[word & 0xFFu], sc2[i]);
          b1 = scaled_e2m1x2(lut[(word >> 8) & 0xFFu], sc2[i]);
        } else {
          b0 = scaled_e4m3x2(word, sc[i]);
          b1 = scaled_e4m3x2(word >> 16, sc[i]);
        }
        block_step<TcMma::kK16>(acc[i], a, b0, b1);
      }
    }
  };
  auto compute = [&](int grp, uint32_t const (&buf)[kMats][kG]) {
    if (grp < nfull) compute_group(grp, buf, std::false_type{});
    else compute_group(grp, buf, std::true_type{});
  };
  for (int grp = 0; grp < ngroups; grp += 2) {
    if (grp + 1 < ngroups) load(grp + 1, buf_b);
    compute(grp, buf_a);
    if (grp + 1 < ngroups) {
      if (grp + 2 < ngroups) load(grp + 2, buf_a);
      compute(grp + 1, buf_b);
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

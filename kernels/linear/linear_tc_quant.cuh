// SPDX-License-Identifier: Apache-2.0
/// Block-scaled weights on the skinny tensor-core tile (LinearTcArgs::w_format; layouts in
/// include/tessera/ops/linear.hpp): FP8 e4m3 codes with 32×32-block ue8m0 scales and FP4 e2m1 codes (two per
/// byte, even k in the low nibble) with per-row-per-32 ue8m0 scales, decoded to bf16 in shared memory and fed
/// to the same mma.sync chain as bf16 weights.
///
/// Exactness: the decoded value is ops::scaled_weight = →bf16(code · 2^(s−127)). e4m3: two codes at a time by the
/// hardware conversion cvt.rn.f16x2.e4m3x2 (exact: every e4m3 value is an fp16 normal), widened to fp32, multiplied
/// by the power of two in fp32 (__fmul_rn, exact unless the product leaves fp32's range) and rounded once to bf16
/// (cvt.rn.bf16x2.f32 = RNE); e4m3 NaN codes are not weights (the NaN payload may differ). e2m1: four codes' bf16
/// values at a time in registers (bf16x2_from_e2m1x4: byte tables in prmt immediates; a shared table read by random
/// lanes costs ~3.5 bank wavefronts a read), times the scale as bf16 in one bf16x2 multiply
/// (scaled_e2m1x2: the product of a two-significant-bit value and a power of two is a bf16 value or overflows, so
/// it is the fp32 path's result). The mma then
/// sees exactly the bf16 operands a kBf16 weight holding those values would give it, in the same block order
/// (skinny_warp_tile's contract), so the outputs equal the bf16 path's and ref::dot_tc's bit for bit.
///
/// Staging: per K slab of kBK codes, the warp's 8 W rows per matrix arrive as raw bytes (kBK or kBK/2 per row,
/// coalesced 16-byte cp.async) in a kStages ring beside the x rows; each 256-wide part of a slab is decoded into
/// one bf16 buffer (8 rows × 264 halves per matrix, the conflict-free ldmatrix pitch of the bf16 tile) and
/// multiplied before the next part is decoded. Bytes in flight per warp: (kStages − 1) slabs of codes, half (FP8)
/// or a quarter (FP4) of the bf16 tile's for the same K. The scales of the warp's rows for the whole K walk are
/// read once into shared memory (≤ kTcQuantMaxK / 32 per row); rows ≥ n read scale code 127 (1.0) over their
/// zero-filled codes, so padding operands are +0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/linear/linear_tc.cuh"
#include "tessera/core/packed_codes.hpp"
#include "tessera/device/pdl.cuh"

namespace tessera::kernels::tc_linear {

/// One block-scaled weight operand: codes (row stride ldq bytes) and ue8m0 scales (row stride lds).
struct QuantW {
  uint8_t const* q = nullptr;
  uint8_t const* s = nullptr;
  int64_t ldq = 0, lds = 0;
};

template <DType kFmt>
inline constexpr int kCodesPerByte = kFmt == DType::kF4E2m1x2 ? 2 : 1;
/// Scale rows held per matrix: one per 32-row block (FP8) or one per W row (FP4).
template <DType kFmt>
inline constexpr int kScaleRows = kFmt == DType::kF4E2m1x2 ? kSkinnyCols : 1;

/// Scale columns held per row: ⌈k/256⌉·8, so a 256-wide part past K reads defined (1.0) scales.
inline constexpr int64_t quant_scale_cols(int64_t k) { return (k + 255) / 256 * 8; }

/// Shared memory of skinny_warp_tile_q: the ring (codes + x rows), the bf16 buffer, the scales.
template <DType kFmt>
inline constexpr size_t skinny_q_smem_bytes(int mats, int stages, int64_t xr, int bk, int64_t k) {
  size_t const stage = size_t(mats) * kSkinnyCols * size_t(bk / kCodesPerByte<kFmt>) + size_t(xr) * size_t(bk + 8) * 2;
  size_t const scales = size_t(mats) * kScaleRows<kFmt> * size_t(quant_scale_cols(k));
  return size_t(stages) * stage + size_t(mats) * kSkinnyCols * kSkinnyLds * 2 + (scales + 15) / 16 * 16;
}

/// Two codes' values (k, k + 1 in the low, high half) times sc, as bf16x2 bits.
__device__ __forceinline__ uint32_t scaled_bf16x2(float lo, float hi, float sc) {
  __nv_bfloat162 const b = __floats2bfloat162_rn(__fmul_rn(lo, sc), __fmul_rn(hi, sc));
  return *reinterpret_cast<uint32_t const*>(&b);
}
/// The ue8m0 scale 2^(s−127) as bf16 bits in both halves: exact, since bf16 has fp32's exponent range (s = 0 is
/// the subnormal 2^-127 = 0x0040, s = 255 NaN).
__device__ __forceinline__ uint32_t e8m0_bf16x2(uint32_t s) {
  uint32_t const h = s == 0 ? 0x0040u : s == 0xFFu ? 0x7FC0u : s << 7;
  return h | (h << 16);
}
/// Two e2m1 values (bf16 bits, k in the low half) times the scale (e8m0_bf16x2), as
/// bf16x2 bits, in one bf16x2 multiply. The same bits as scaled_bf16x2's fp32 product and rounding: an e2m1 value
/// has at most two significant bits, so v·2^(s−127) is itself a bf16 value (≥ 2^-128 in magnitude, within bf16's
/// subnormals) or beyond bf16's range, which both round to ±inf.
__device__ __forceinline__ uint32_t scaled_e2m1x2(uint32_t pair, uint32_t sc2) {
  __nv_bfloat162 const r = __hmul2(*reinterpret_cast<__nv_bfloat162 const*>(&pair), *reinterpret_cast<__nv_bfloat162 const*>(&sc2));
  return *reinterpret_cast<uint32_t const*>(&r);
}
/// The eight e2m1 codes of `word` (k ascending from the low nibble) times the scale (e8m0_bf16x2), as four bf16x2
/// words, o[j] = codes 2j, 2j + 1: decoded in registers (bf16x2_from_e2m1x4), then scaled_e2m1x2.
__device__ __forceinline__ void scaled_e2m1x8(uint32_t word, uint32_t sc2, uint32_t (&o)[4]) {
  bf16x2_from_e2m1x4(word, o[0], o[1]);
  bf16x2_from_e2m1x4(word >> 16, o[2], o[3]);
#pragma unroll
  for (int j = 0; j < 4; ++j) o[j] = scaled_e2m1x2(o[j], sc2);
}
/// The e4m3 codes in the low (k) and high (k + 1) byte of `pair` times sc, as bf16x2 bits: one cvt.rn.f16x2.e4m3x2
/// (exact) and two exact widenings instead of two table reads.
__device__ __forceinline__ uint32_t scaled_e4m3x2(uint32_t pair, float sc) {
  __half2_raw const h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3);
  float2 const f = __half22float2(__half2(h));
  return scaled_bf16x2(f.x, f.y, sc);
}
/// Both skinny block-scaled paths: the scales of the warp's rows for the whole K walk into `scales`
/// (quant_scale_cols(k) per row; rows ≥ n and columns past K read code 127 = 1.0). Threads t of nt (a warp: lane of
/// 32) share the work.
template <DType kFmt, int kMats>
__device__ __forceinline__ void stage_quant_scales(unsigned char* scales, QuantW const (&w)[kMats], int64_t n0, int64_t n,
                                                   int64_t k, int lane, int nt = 32) {
  int64_t const scols = quant_scale_cols(k);
  for (int i = 0; i < kMats; ++i)
    for (int j = 0; j < kScaleRows<kFmt>; ++j) {
      int64_t const row = kFmt == DType::kF4E2m1x2 ? n0 + j : n0 / 32;
      bool const row_ok = kFmt == DType::kF4E2m1x2 ? row < n : true;
      unsigned char* dst = scales + (i * kScaleRows<kFmt> + j) * scols;
      for (int64_t c = lane; c < scols; c += nt) dst[c] = row_ok && c < k / 32 ? __ldg(w[i].s + row * w[i].lds + c) : 127;
    }
}

/// kSkinnyCols × 16 accumulator tile of kMats block-scaled matrices against 1 ≤ xr ≤ 16 x rows: the contract of
/// skinny_warp_tile (linear_tc.cuh), with codes decoded as described at the top of this file. Requires k % 32 == 0,
/// k ≤ kTcQuantMaxK, 16-byte aligned codes with ldq % 16 == 0, and 16-byte aligned x rows. smem: 16-byte aligned,
/// ≥ skinny_q_smem_bytes<kFmt>(kMats, kStages, xr, kBK, k). All 32 lanes call it; everything is warp-uniform.
template <DType kFmt, int kMats, int kStages, int kBK, class XRow>
__device__ __forceinline__ void skinny_warp_tile_q(unsigned char* smem, QuantW const (&w)[kMats], int64_t n0, int64_t n,
                                                   int64_t k, int xr, XRow const& xrow, float (&acc)[kMats][4]) {
  constexpr int kCpb = kCodesPerByte<kFmt>;
  constexpr int kRowBytes = kBK / kCpb;  // codes of one W row per slab
  constexpr int kXLds = kBK + 8;
  static_assert(kBK % 256 == 0 && kStages >= 2 && kRowBytes % 16 == 0);
  int const lane = static_cast<int>(threadIdx.x & 31);
  int64_t const kbytes = k / kCpb;
  size_t const stage_bytes = size_t(kMats) * kSkinnyCols * kRowBytes + size_t(xr) * kXLds * 2;
  auto raw = [&](int s) { return smem + s * stage_bytes; };
  auto slab_x = [&](int s) { return reinterpret_cast<uint16_t*>(smem + s * stage_bytes + kMats * kSkinnyCols * kRowBytes); };
  uint16_t* const wbuf = reinterpret_cast<uint16_t*>(smem + kStages * stage_bytes);
  unsigned char* const scales = reinterpret_cast<unsigned char*>(wbuf + kMats * kSkinnyCols * kSkinnyLds);
  int64_t const scols = quant_scale_cols(k);

  auto stage = [&](int64_t ks, int s) {
    constexpr int kUnits = kMats * kSkinnyCols * (kRowBytes / 16);
    for (int t = lane; t < kUnits; t += 32) {
      int const row = t / (kRowBytes / 16), c = t % (kRowBytes / 16);  // row = i·kSkinnyCols + j
      int const i = row / kSkinnyCols, j = row % kSkinnyCols;
      int64_t const b0 = ks * kRowBytes + c * 16;
      bool const ok = n0 + j < n && b0 < kbytes;
      cp_async16(smem_addr(raw(s) + row * kRowBytes + c * 16), ok ? w[i].q + (n0 + j) * w[i].ldq + b0 : w[i].q, ok);
    }
    uint16_t* const sx = slab_x(s);
    for (int j = 0; j < xr; ++j)
      for (int c = lane; c < kBK / 8; c += 32) stage_chunk<true>(sx + j * kXLds + c * 8, xrow(j), 0, 0, 1, ks * kBK + c * 8, k);
  };

  int64_t const slabs = (k + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < slabs) stage(s, s);
    cp_async_commit();
  }
  stage_quant_scales<kFmt, kMats>(scales, w, n0, n, k, lane);  // while the first slabs are in flight
#pragma unroll
  for (int i = 0; i < kMats; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  int const g = lane >> 2;
  int const arow = (lane & 15) < xr ? (lane & 15) : xr - 1;
  bool const lo_ok = g < xr, hi_ok = g + 8 < xr;

  // Part u (256 codes) of ring stage s → wbuf: units of 16 code bytes (16 FP8 or 32 FP4 codes: one scale each).
  auto decode = [&](int s, int u, int64_t kpart) {
    constexpr int kUnitsPerRow = 256 / kCpb / 16;
    constexpr int kUnits = kMats * kSkinnyCols * kUnitsPerRow;
#pragma unroll
    for (int t0 = 0; t0 < kUnits; t0 += 32) {
      int const t = t0 + lane;
      if (kUnits % 32 != 0 && t >= kUnits) break;
      int const row = t / kUnitsPerRow, c = t % kUnitsPerRow;  // row = i·kSkinnyCols + j over the kMats matrices
      uint4 const r = *reinterpret_cast<uint4 const*>(raw(s) + row * kRowBytes + u * (256 / kCpb) + c * 16);
      int64_t const kb = (kpart + c * 16 * kCpb) / 32;
      int const srow = kFmt == DType::kF4E2m1x2 ? row : row / kSkinnyCols;  // scale rows per matrix: 8 (FP4) or 1 (FP8)
      uint8_t const sb = scales[srow * scols + kb];
      float const sc = float_from_e8m0(sb);
      uint32_t const sc2 = e8m0_bf16x2(sb);
      uint4* const dst = reinterpret_cast<uint4*>(wbuf + row * kSkinnyLds + c * 16 * kCpb);
      uint32_t const words[4] = {r.x, r.y, r.z, r.w};
      if constexpr (kFmt == DType::kF8E4m3) {
        uint32_t o[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          o[q] = scaled_e4m3x2(words[q / 2] >> (16 * (q % 2)), sc);
        }
        dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t o[4];
          scaled_e2m1x8(words[q], sc2, o);
          dst[q] = make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
    }
  };

  __syncwarp();  // scales written
  for (int64_t ks = 0; ks < slabs; ++ks) {
    cp_async_wait<kStages - 2>();
    __syncwarp();
    if (ks + kStages - 1 < slabs) stage(ks + kStages - 1, static_cast<int>((ks + kStages - 1) % kStages));
    cp_async_commit();
    int const s = static_cast<int>(ks % kStages);
    uint16_t const* sx = slab_x(s);
#pragma unroll 1
    for (int u = 0; u < kBK / 256; ++u) {
      int64_t const kpart = ks * kBK + u * 256;
      if (kpart >= k) break;
      decode(s, u, kpart);
      __syncwarp();
#pragma unroll 2
      for (int kk = 0; kk < 256; kk += 32) {
        if (kpart + kk >= k) break;
        uint32_t b[kMats][4];
#pragma unroll
        for (int i = 0; i < kMats; ++i)
          ldmatrix_x4(b[i], smem_addr(wbuf + (i * kSkinnyCols + (lane & 7)) * kSkinnyLds + kk + (lane >> 3) * 8));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (kpart + kk + 16 * h >= k) break;
          uint32_t a[4];
          ldmatrix_x4(a, smem_addr(sx + arow * kXLds + u * 256 + kk + 16 * h + (lane >> 4) * 8));
          if (!lo_ok) a[0] = a[2] = 0u;
          if (!hi_ok) a[1] = a[3] = 0u;
#pragma unroll
          for (int i = 0; i < kMats; ++i) block_step<TcMma::kK16>(acc[i], a, b[i][2 * h], b[i][2 * h + 1]);
        }
      }
      __syncwarp();  // every lane's ldmatrix of wbuf is done before the next part overwrites it
    }
  }
  cp_async_wait<0>();
}

/// The ring per format: FP8 256-code slabs (2 KiB of codes per warp and slab), FP4 512-code slabs (2 KiB), 8 stages.
template <DType kFmt>
inline constexpr int kQuantBK = kFmt == DType::kF4E2m1x2 ? 512 : 256;
inline constexpr int kQuantStages = 8;

template <DType kFmt>
__device__ __forceinline__ void skinny_q_tile(TcLinearParams const& p) {
  extern __shared__ __align__(16) unsigned char skinny_q_smem[];
  int const lane = static_cast<int>(threadIdx.x);
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  int64_t const r0 = static_cast<int64_t>(blockIdx.y) * kSkinnyRows;
  if (n0 >= p.n || r0 >= p.m) return;
  int const xr = static_cast<int>(p.m - r0 < kSkinnyRows ? p.m - r0 : kSkinnyRows);
  QuantW const w[1] = {{p.wq, p.wscale, p.ldwq, p.ldwscale}};
  float acc[1][4];
  skinny_warp_tile_q<kFmt, 1, kQuantStages, kQuantBK<kFmt>>(skinny_q_smem, w, n0, p.n, p.k, xr,
                                                            [&](int j) { return p.x + (r0 + j) * p.ldx; }, acc);
  int const g = lane >> 2, c = lane & 3;
  int64_t const col = n0 + 2 * c;
  store_pair(p, r0 + g, col, acc[0][0], acc[0][1]);
  store_pair(p, r0 + g + 8, col, acc[0][2], acc[0][3]);
}

template <DType kFmt>
__global__ void __launch_bounds__(32) linear_tc_skinny_q_kernel(TcLinearParams const p) {
  device::pdl_enter();
  skinny_q_tile<kFmt>(p);
}
template <DType kFmt>
__global__ void __launch_bounds__(32) linear_tc_skinny_q_batch_kernel(TcLinearBatch const b) {
  device::pdl_enter();
  skinny_q_tile<kFmt>(b.p[blockIdx.z]);
}

template <DType kFmt>
inline size_t skinny_q_launch_smem(int64_t m, int64_t k) {
  return skinny_q_smem_bytes<kFmt>(1, kQuantStages, m < kSkinnyRows ? m : kSkinnyRows, kQuantBK<kFmt>, k);
}

}  // namespace tessera::kernels::tc_linear

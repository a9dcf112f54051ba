// SPDX-License-Identifier: Apache-2.0
/// Block-scaled weights on the skinny tensor-core tile, one warp per 8 columns with the codes decoded in registers
/// (ops::TcQuantPath::kDirect): the values of linear_tc_quant.cuh's ring path bit for bit, without a bf16 copy of
/// the codes in shared memory.
///
/// Fragment ↔ K: the mma B fragment of lane (g, c) holds, per 16-wide K block b, four operands of W row n0 + g at
/// fragment positions 2c, 2c+1 (b0) and 2c+8, 2c+9 (b1). The lane reads the four CONSECUTIVE codes
/// k = 16b + 4c … 16b + 4c + 3 (FP8: one 4-byte word; FP4: one 2-byte word, even k in the low nibble; in both the
/// word index in the row is 4b + c) and places k 16b+4c, +1 at 2c, 2c+1 and k 16b+4c+2, +3 at 2c+8, 2c+9. The A
/// fragment of lane (g, c) holds x row g at the same positions (a0: 2c, 2c+1; a2: 2c+8, 2c+9), i.e. the four
/// consecutive x[16b + 4c … +3]: one 8-byte shared load from the x row as it is (a1, a3 hold rows g + 8, which
/// the direct tile never has: +0). A block step's result depends only on the set of its 16 products
/// (tc::block_step: one multi-term addition, exact integer sum of aligned terms), so this order of K inside the
/// block changes nothing; the block order is unchanged.
///
/// Decode per code as the ring path: the code's value (e4m3 by the hardware conversion, e2m1 in registers by
/// bf16x2_from_e2m1x4: byte tables in prmt immediates, no shared-memory table), widened, times 2^(s−127) in fp32,
/// →bf16 (RNE). The scales are converted once at staging (FP4: bf16 bits per W row, FP8: fp32 per warp block), so a
/// block pair reads its scale with one shared load. W rows past n read row n − 1 and A rows past xr repeat row
/// xr − 1; neither is stored.
///
/// Two ways to feed the chain (kRing, chosen per call by direct_ring_codes):
///   ring: per stage of 64 code bytes per W row (FP8: 4 blocks, FP4: 8), each lane cp.async's 16 bytes of its row
///     per matrix, and the x rows' slice of the stage rides along; kDirectRingStages stages (32 blocks) are in
///     flight ahead of the chain, in shared memory rather than registers;
///   registers: kDirectGroup blocks of codes per lane and matrix are loaded into registers while the previous
///     kDirectGroup are multiplied, and the x rows are staged whole first (one cp.async round trip).
/// Shared memory per warp: skinny_qd_smem_bytes. Requires k % 32 == 0, k ≤ kTcQuantMaxK, 16-byte aligned x rows,
/// 16-byte aligned code rows with a multiple of 16 bytes between them, ops::tc_quant_direct_fits(xr, k). All 32
/// lanes call it; everything is warp-uniform.
#pragma once

#include <type_traits>

#include "kernels/linear/linear_tc_quant.cuh"
#include "tessera/core/packed_codes.hpp"
#include "tessera/device/pdl.cuh"

namespace tessera::kernels::tc_linear {

inline constexpr int kDirectGroup = 8;  // register loads: blocks per prefetch group (two groups in flight per lane and matrix)

/// Code ring: per matrix, kDirectRingStages stages of the warp's 8 W rows × 64 code bytes, rows kDirectRingPitch
/// bytes apart; lane l copies row l / 4's 16 bytes at 16·(l % 4). A block costs the chain ~120 cycles (its decode
/// and loads at ~3 cycles an instruction: ncu, H100), so 32 blocks ahead cover a loaded DRAM round trip.
inline constexpr int kDirectRingPitch = 80;  // 20 words: the 8 rows start on banks 0, 20, 8, 28, 16, 4, 24, 12
inline constexpr int kDirectRingRowBytes = 64;
template <DType kFmt>
inline constexpr int kDirectRingStages = kFmt == DType::kF4E2m1x2 ? 4 : 8;
/// x in the ring: a stage's K slice of each x row (64 · codes per byte halves), rows 32 bytes apart modulo 128.
template <DType kFmt>
inline constexpr int kDirectRingXHalves = kDirectRingRowBytes * kCodesPerByte<kFmt>;
template <DType kFmt>
inline constexpr int kDirectRingXPitch = kDirectRingXHalves<kFmt> * 2 + 32;  // bytes
template <DType kFmt>
inline constexpr size_t direct_ring_bytes(int mats, int64_t xr) {
  return size_t(kDirectRingStages<kFmt>) * (size_t(mats) * kSkinnyCols * kDirectRingPitch + size_t(xr) * kDirectRingXPitch<kFmt>);
}

/// Scales of one matrix as the direct tile holds them, converted once at staging: FP4 the bf16 bits of 2^(s−127)
/// (e8m0_bf16x2's half) per W row and 32 K, rows direct_scale_stride apart; FP8 fp32 2^(s−127) per 32 K of the
/// warp's 32-row block.
inline constexpr int64_t direct_scale_stride(int64_t k) { return ((k / 32 + 1) / 2 | 1) * 2; }  // odd words: 8 rows, 8 banks
template <DType kFmt>
inline constexpr size_t direct_scale_bytes(int64_t k) {
  return kFmt == DType::kF4E2m1x2 ? size_t(kSkinnyCols) * size_t(direct_scale_stride(k)) * 2 : size_t(k / 32) * 4;
}

/// Halves between x rows staged whole (registers variant): k + 16, so that rows start 32 bytes apart modulo 128 and
/// the 8-byte A loads of up to four rows hit distinct banks (k % 32 == 0 keeps every row 16-byte aligned).
inline constexpr int64_t direct_x_pitch(int64_t k) { return k + 16; }

/// Shared memory per warp: the code ring with the x slices (ring) or the whole x rows (registers), then the scales
/// of each matrix.
template <DType kFmt>
inline constexpr size_t skinny_qd_smem_bytes(int mats, int64_t xr, int64_t k, bool ring) {
  size_t const x = ring ? direct_ring_bytes<kFmt>(mats, xr) : (size_t(xr) * size_t(direct_x_pitch(k)) * 2 + 15) / 16 * 16;
  return x + size_t(mats) * ((direct_scale_bytes<kFmt>(k) + 15) / 16 * 16);
}
/// The most any direct call takes (tc_quant_direct_fits: x rows within kTcDirectMaxXBytes, k ≤ kTcQuantMaxK).
template <DType kFmt>
inline constexpr size_t skinny_qd_max_smem_bytes(int mats) {
  size_t const x = direct_ring_bytes<kFmt>(mats, ops::kTcDirectMaxRows) > size_t(ops::kTcDirectMaxXBytes)
                       ? direct_ring_bytes<kFmt>(mats, ops::kTcDirectMaxRows) : size_t(ops::kTcDirectMaxXBytes);
  return x + size_t(mats) * ((direct_scale_bytes<kFmt>(ops::kTcQuantMaxK) + 15) / 16 * 16);
}

/// Whether a direct call over k streams its codes through the ring: from kDirectRingMinK on, unless
/// TESSERA_TC_DIRECT_RING=0 (read once; for benchmarks: same values either way). H100, M = 1, µs, registers (x staged
/// by ldmatrix rows, main 008b28b) → ring: FP8 w1/w3 5120×2304 35.2 → 26.8, w2 2304×5120 19.2 → 16.5, wo_b
/// 8192×5120 58.5 → 49.0, wq_a 5120×1280 34.8 → 26.3; FP4 30.2 → 23.9, 17.7 → 14.8, 51.3 → 40.7, 29.9 → 23.4. Below
/// 2,048 (wq_b 1280×32768: 4,096 warps, 80-block chains) the registers hold their own: FP8 25.0 either way. A ring 64
/// blocks deep with the x rows staged whole measured 19.2 / 13.8 / 35.0 / 18.7 µs (FP8) but holds ~20 KiB a warp,
/// which costs the MoE tiles their occupancy (bench/RESULTS.md, 2026-12-07 session 26).
inline constexpr int64_t kDirectRingMinK = 2048;
bool direct_ring_codes(int64_t k);

/// The direct tile's scales of kMats matrices into `scales` (matrix i at i · mat_bytes), converted once: FP4 the bf16
/// bits of 2^(s−127) per W row (lane (g, c) stages its row crow's), FP8 fp32 2^(s−127) of the warp's 32-row block.
/// Scale rows of whole aligned words (k % 128 == 0, 4-byte rows and base) load 4 scales a lane at a time, every load
/// of a round issued before the first is converted: a round trip per kDirectScaleWords words of a row, not one per
/// iteration of a dependent loop (k 5120, FP4: 40 serial loads a lane and matrix before).
/// Words a lane loads per matrix and round (FP4: 16 of a row; k = 5120 takes 3 rounds). 12 staged k ≤ 6144 in one round
/// but held 24 words and their addresses live: ptxas gave the joined routed FP4 + shared FP8 act kernel 168
/// registers (12 one-warp blocks an SM) against 64 before and 69 at 4.
inline constexpr int kDirectScaleWords = 4;
template <DType kFmt, int kMats>
__device__ __forceinline__ void stage_direct_scales(unsigned char* scales, size_t mat_bytes, QuantW const (&w)[kMats],
                                                    int64_t n0, int64_t crow, int64_t k, int lane) {
  constexpr bool kFp4 = kFmt == DType::kF4E2m1x2;
  int const g = lane >> 2, c = lane & 3;
  int const scols = static_cast<int>(k / 32);
  bool vec = scols % 4 == 0;
  uint8_t const* src[kMats];
#pragma unroll
  for (int i = 0; i < kMats; ++i) {
    src[i] = w[i].s + (kFp4 ? crow : n0 / 32) * w[i].lds;
    vec = vec && w[i].lds % 4 == 0 && (reinterpret_cast<uintptr_t>(w[i].s) & 3u) == 0;
  }
  auto h16 = [](uint32_t b) { return e8m0_bf16x2(b) & 0xFFFFu; };
  if (vec) {
    int const nw = scols / 4;
    int const first = kFp4 ? c : lane, step = kFp4 ? 4 : 32;  // FP4: the row's 4 lanes; FP8: the warp on one row
    for (int t0 = first; t0 < nw; t0 += step * kDirectScaleWords) {
      uint32_t v[kMats][kDirectScaleWords];
#pragma unroll
      for (int i = 0; i < kMats; ++i)
#pragma unroll
        for (int j = 0; j < kDirectScaleWords; ++j) {
          int const t = t0 + step * j;
          v[i][j] = t < nw ? __ldg(reinterpret_cast<uint32_t const*>(src[i]) + t) : 0u;
        }
#pragma unroll
      for (int i = 0; i < kMats; ++i)
#pragma unroll
        for (int j = 0; j < kDirectScaleWords; ++j) {
          int const t = t0 + step * j;
          if (t >= nw) break;
          uint32_t const b = v[i][j];
          if constexpr (kFp4) {
            uint32_t* const dst = reinterpret_cast<uint32_t*>(scales + i * mat_bytes) + (g * direct_scale_stride(k) + 4 * t) / 2;
            dst[0] = h16(b & 0xFFu) | h16(b >> 8 & 0xFFu) << 16;
            dst[1] = h16(b >> 16 & 0xFFu) | h16(b >> 24) << 16;
          } else {
            reinterpret_cast<float4*>(scales + i * mat_bytes)[t] =
                make_float4(float_from_e8m0(static_cast<uint8_t>(b)), float_from_e8m0(static_cast<uint8_t>(b >> 8)),
                            float_from_e8m0(static_cast<uint8_t>(b >> 16)), float_from_e8m0(static_cast<uint8_t>(b >> 24)));
          }
        }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kMats; ++i) {
    unsigned char* const dst = scales + i * mat_bytes;
    if constexpr (kFp4) {
      for (int col = c; col < scols; col += 4)
        reinterpret_cast<uint16_t*>(dst)[g * direct_scale_stride(k) + col] = static_cast<uint16_t>(h16(__ldg(src[i] + col)));
    } else {
      for (int col = lane; col < scols; col += 32) reinterpret_cast<float*>(dst)[col] = float_from_e8m0(__ldg(src[i] + col));
    }
  }
}

template <DType kFmt, int kMats, bool kRing, class XRow>
__device__ __forceinline__ void skinny_warp_tile_qd(unsigned char* smem, QuantW const (&w)[kMats], int64_t n0, int64_t n,
                                                    int64_t k, int xr, XRow const& xrow, float (&acc)[kMats][4]) {
  using Word = std::conditional_t<kFmt == DType::kF8E4m3, uint32_t, uint16_t>;  // 4 codes
  constexpr bool kFp4 = kFmt == DType::kF4E2m1x2;
  int const lane = static_cast<int>(threadIdx.x & 31);
  int const g = lane >> 2, c = lane & 3;
  int const arow = g < xr ? g : xr - 1;
  int const nblocks = static_cast<int>(k / 16);
  size_t const x_bytes = kRing ? direct_ring_bytes<kFmt>(kMats, xr) : (size_t(xr) * size_t(direct_x_pitch(k)) * 2 + 15) / 16 * 16;
  unsigned char* const scales = smem + x_bytes;
  size_t const mat_scale_bytes = (direct_scale_bytes<kFmt>(k) + 15) / 16 * 16;
  int64_t const crow = n0 + g < n ? n0 + g : n - 1;  // this lane's W row (and, in the ring, its copy row)

  // Ring: stage st holds code bytes [64·st, 64·st + 64) of every W row and x halves [kXH·st, kXH·st + kXH) of every
  // x row; one commit group per stage (empty past the end, so the wait counts stay uniform).
  constexpr int kS = kDirectRingStages<kFmt>;
  constexpr int kStageBlocks = kDirectRingRowBytes * kCodesPerByte<kFmt> / 16;
  constexpr int kCodeStage = kMats * kSkinnyCols * kDirectRingPitch;  // bytes
  constexpr int kXH = kDirectRingXHalves<kFmt>, kXUnits = kXH / 8, kXPitch = kDirectRingXPitch<kFmt>;
  int const x_stage = xr * kXPitch;
  int const stage_bytes = kCodeStage + x_stage;
  int const nstages = (nblocks + kStageBlocks - 1) / kStageBlocks, nfull_stages = nblocks / kStageBlocks;
  int64_t const kbytes = k / kCodesPerByte<kFmt>;
  int const cu = lane & 3;
  uint32_t const ring0 = smem_addr(smem);
  uint16_t const* xsrc[ops::kTcDirectMaxRows];
#pragma unroll
  for (int j = 0; j < ops::kTcDirectMaxRows; ++j) xsrc[j] = xrow(j < xr ? j : 0);
  // Per-lane copy sources and destinations, fixed for the K walk: W row crow of each matrix at byte 16·cu of a stage,
  // and x units t = lane, lane + 32 (row t / kXUnits, 16 bytes at 16·(t % kXUnits)), so a stage's issue is its
  // copies and one address add each (H100, M = 1, µs: FP8 w1/w3 26.9 → 22.7, wo_b 49.1 → 41.9; FP4 24.0 → 21.9).
  static_assert(ops::kTcDirectMaxRows * kXUnits <= 64, "x units of a stage: at most two per lane");
  uint8_t const* csrc[kMats];
#pragma unroll
  for (int i = 0; i < kMats; ++i) csrc[i] = w[i].q + crow * w[i].ldq + 16 * cu;
  uint32_t const cdst = static_cast<uint32_t>(g * kDirectRingPitch + 16 * cu);
  int const nxu = xr * kXUnits;  // ≤ 64
  uint16_t const* xcp[2];
  uint32_t xdst[2];
  int xoff[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int const t = lane + 32 * h < nxu ? lane + 32 * h : 0;
    int const j = t / kXUnits, u = t % kXUnits;
    uint16_t const* src = xsrc[0];
#pragma unroll
    for (int r = 1; r < ops::kTcDirectMaxRows; ++r) src = j == r ? xsrc[r] : src;
    xcp[h] = src;
    xoff[h] = 8 * u;
    xdst[h] = static_cast<uint32_t>(kCodeStage + j * kXPitch + 16 * u);
  }
  auto issue = [&](int st) {
    uint32_t const base = ring0 + static_cast<uint32_t>((st % kS) * stage_bytes);
    int64_t const cb = int64_t{st} * kDirectRingRowBytes;
    bool const ok = cb + 16 * cu < kbytes;
#pragma unroll
    for (int i = 0; i < kMats; ++i)
      cp_async16(base + static_cast<uint32_t>(i * kSkinnyCols * kDirectRingPitch) + cdst, ok ? csrc[i] + cb : w[i].q, ok);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (lane + 32 * h >= nxu) break;
      int64_t const xk = int64_t{st} * kXH + xoff[h];
      cp_async16(base + xdst[h], xk < k ? xcp[h] + xk : xcp[h], xk < k);
    }
  };
  uint16_t* const xs = reinterpret_cast<uint16_t*>(smem);  // registers variant: the x rows staged whole
  int64_t const xld = direct_x_pitch(k);
  if constexpr (kRing) {
#pragma unroll
    for (int q = 0; q < kS - 1; ++q) {
      if (q < nstages) issue(q);
      cp_async_commit();
    }
  } else {
    for (int j = 0; j < xr; ++j) {
      uint32_t const dst = smem_addr(xs + j * xld);
      for (int64_t t = lane; t < k / 8; t += 32) cp_async16(dst + static_cast<uint32_t>(16 * t), xsrc[j] + 8 * t, true);
    }
    cp_async_commit();
  }

  // Registers variant: every load of a full group is unconditional.
  constexpr int kG = kDirectGroup;
  int const ngroups = (nblocks + kG - 1) / kG, nfull = nblocks / kG;  // groups [0, nfull) hold kG blocks
  Word const* wp[kMats];
#pragma unroll
  for (int i = 0; i < kMats; ++i) wp[i] = reinterpret_cast<Word const*>(w[i].q + crow * w[i].ldq) + c;
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
  if constexpr (!kRing) load(0, buf_a);  // in flight while the scales are staged

  stage_direct_scales<kFmt, kMats>(scales, mat_scale_bytes, w, n0, crow, k, lane);
  if constexpr (!kRing) cp_async_wait<0>();  // the x rows
  __syncwarp();

#pragma unroll
  for (int i = 0; i < kMats; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  // This lane's scale row of matrix i: FP4 its W row's bf16 bits, FP8 the warp block's fp32 values.
  uint16_t const* srow4[kMats];
  float const* srow8[kMats];
#pragma unroll
  for (int i = 0; i < kMats; ++i) {
    srow4[i] = reinterpret_cast<uint16_t const*>(scales + i * mat_scale_bytes) + g * direct_scale_stride(k);
    srow8[i] = reinterpret_cast<float const*>(scales + i * mat_scale_bytes);
  }

  // The blocks [b0, b0 + kN) (b0 even): word(i, j) is matrix i's codes of block b0 + j for this lane, xg this lane's
  // x at block b0 (x of block b0 + j at xg + 16j). A scale covers 32 K (two blocks): read once per block pair.
  static_assert(kG % 2 == 0 && kStageBlocks % 2 == 0, "scale pairs");
  auto compute_blocks = [&]<int kN>(int b0, uint16_t const* xg, auto const& word, auto checked) {
    [[maybe_unused]] float sc[kMats];       // FP8: 2^(s−127) in fp32
    [[maybe_unused]] uint32_t sc2[kMats];   // FP4: 2^(s−127) as bf16x2
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      int const b = b0 + j;
      if constexpr (decltype(checked)::value)
        if (b >= nblocks) break;
      if (j % 2 == 0) {
#pragma unroll
        for (int i = 0; i < kMats; ++i) {
          if constexpr (kFp4) sc2[i] = static_cast<uint32_t>(srow4[i][b / 2]) * 0x10001u;
          else sc[i] = srow8[i][b / 2];
        }
      }
      uint2 const xv = *reinterpret_cast<uint2 const*>(xg + 16 * j);
      uint32_t const a[4] = {xv.x, 0u, xv.y, 0u};
#pragma unroll
      for (int i = 0; i < kMats; ++i) {
        uint32_t const wd = word(i, j);
        uint32_t f0, f1;
        if constexpr (kFp4) {
          bf16x2_from_e2m1x4(wd, f0, f1);
          f0 = scaled_e2m1x2(f0, sc2[i]);
          f1 = scaled_e2m1x2(f1, sc2[i]);
        } else {
          f0 = scaled_e4m3x2(wd, sc[i]);
          f1 = scaled_e4m3x2(wd >> 16, sc[i]);
        }
        block_step<TcMma::kK16>(acc[i], a, f0, f1);
      }
    }
  };

  if constexpr (kRing) {
    // Stage u: wait for this lane's copies of it, publish the warp's (the barrier also orders every lane's reads of
    // stage u − 1 before the refill of its slot), refill, multiply.
    for (int u = 0; u < nstages; ++u) {
      cp_async_wait<kS - 2>();
      __syncwarp();
      if (u + kS - 1 < nstages) issue(u + kS - 1);
      cp_async_commit();
      unsigned char const* const st = smem + (u % kS) * stage_bytes;
      unsigned char const* const wrow = st + g * kDirectRingPitch;
      uint16_t const* const xg = reinterpret_cast<uint16_t const*>(st + kCodeStage + arow * kXPitch) + 4 * c;
      auto const word = [&](int i, int j) -> uint32_t {
        unsigned char const* const r = wrow + i * kSkinnyCols * kDirectRingPitch;
        if constexpr (kFp4) return *reinterpret_cast<uint16_t const*>(r + 8 * j + 2 * c);
        else return *reinterpret_cast<uint32_t const*>(r + 16 * j + 4 * c);
      };
      if (u < nfull_stages) compute_blocks.template operator()<kStageBlocks>(u * kStageBlocks, xg, word, std::false_type{});
      else compute_blocks.template operator()<kStageBlocks>(u * kStageBlocks, xg, word, std::true_type{});
    }
    cp_async_wait<0>();  // the empty groups past the end
    return;
  }
  uint16_t const* const xa = xs + arow * xld + 4 * c;
  auto compute = [&](int grp, uint32_t const (&buf)[kMats][kG]) {
    auto const word = [&](int i, int j) { return buf[i][j]; };
    if (grp < nfull) compute_blocks.template operator()<kG>(grp * kG, xa + grp * kG * 16, word, std::false_type{});
    else compute_blocks.template operator()<kG>(grp * kG, xa + grp * kG * 16, word, std::true_type{});
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

template <DType kFmt, bool kRing>
__device__ __forceinline__ void skinny_qd_tile(TcLinearParams const& p) {
  extern __shared__ __align__(16) unsigned char skinny_qd_smem[];
  int const lane = static_cast<int>(threadIdx.x);
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  if (n0 >= p.n) return;
  int const xr = static_cast<int>(p.m);
  QuantW const w[1] = {{p.wq, p.wscale, p.ldwq, p.ldwscale}};
  float acc[1][4];
  skinny_warp_tile_qd<kFmt, 1, kRing>(skinny_qd_smem, w, n0, p.n, p.k, xr, [&](int j) { return p.x + j * p.ldx; }, acc);
  int const g = lane >> 2, c = lane & 3;
  int64_t const col = n0 + 2 * c;
  store_pair(p, g, col, acc[0][0], acc[0][1]);
  store_pair(p, g + 8, col, acc[0][2], acc[0][3]);
}

template <DType kFmt, bool kRing>
__global__ void __launch_bounds__(32) linear_tc_skinny_qd_kernel(TcLinearParams const p) {
  device::pdl_enter();
  skinny_qd_tile<kFmt, kRing>(p);
}
template <DType kFmt, bool kRing>
__global__ void __launch_bounds__(32) linear_tc_skinny_qd_batch_kernel(TcLinearBatch const b) {
  device::pdl_enter();
  skinny_qd_tile<kFmt, kRing>(b.p[blockIdx.z]);
}

}  // namespace tessera::kernels::tc_linear

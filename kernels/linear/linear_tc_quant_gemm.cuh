// SPDX-License-Identifier: Apache-2.0
/// Block-scaled weights on the 128 × 128 GEMM tile (prefill): gemm_block_tile's contract and values with W held as
/// FP8 e4m3 codes under 32×32-block ue8m0 scales or FP4 e2m1 codes under per-row-per-32 scales (the formats and
/// decode helpers of linear_tc_quant.cuh). The mma chain meets exactly the bf16 operands ops::scaled_weight gives,
/// slab by slab in the same order, so the outputs are those of the bf16 tile on the decoded matrix, i.e. of
/// decoding W to bf16 first, without writing and re-reading 2 bytes per weight (the codes are 1 or 0.5 bytes).
///
/// Per 32-wide K slab kt:
///   x rows     as gemm_block_tile: 16-byte cp.async into a kGemmStages ring (two chunks per thread);
///   W codes    the block's 128 rows as raw bytes (FP8 32 B, FP4 16 B per row), one 16-byte cp.async per thread
///              (FP8: row tid / 2, half tid % 2; FP4: threads < 128, row tid) into a kGemmStages ring; rows ≥ n
///              zero-filled;
///   decode     once slab kt has landed, thread tid turns the 16 codes of row tid / 2, K half tid % 2 into bf16
///              (scaled_e4m3x2 / scaled_e2m1x8, under the slab's scale read from global
///              memory; rows ≥ n under code 127 = 1.0, so +0) and stores them into the one bf16 W slab at the bf16
///              tile's pitch (kGemmLds);
///   multiply   after a barrier, gemm_slab_mma over the x slab and the bf16 W slab.
/// Two barriers per slab: the top one (the ring's) also orders the previous slab's multiply before the bf16 slab
/// is rewritten; the middle one publishes the decoded slab. Slabs kt + 1 .. kt + 3 are in flight meanwhile.
/// Requires k % 32 == 0, 16-byte aligned codes with ldq % 16 == 0, 16-byte aligned x rows (K contiguous), 256
/// threads. Shared memory: gemm_q_smem_bytes<kFmt>() (≤ kGemmSmemBytes), 16-byte aligned.
#pragma once

#include "kernels/linear/linear_tc_quant.cuh"
#include "tessera/device/pdl.cuh"

namespace tessera::kernels::tc_linear {

/// Code bytes of one W row per 32-wide slab.
template <DType kFmt>
inline constexpr int kGemmQRowBytes = kGemmBK / kCodesPerByte<kFmt>;

/// x ring + the bf16 W slab + the code ring.
template <DType kFmt>
inline constexpr size_t gemm_q_smem_bytes() {
  return size_t(kGemmStages + 1) * kGemmTileHalves * sizeof(uint16_t) + size_t(kGemmStages) * kGemmBN * kGemmQRowBytes<kFmt>;
}
static_assert(gemm_q_smem_bytes<DType::kF8E4m3>() <= kGemmSmemBytes && gemm_q_smem_bytes<DType::kF4E2m1x2>() <= kGemmSmemBytes);
static_assert(kGemmWarps * 32 == 2 * kGemmBN, "one thread per (W row, K half) of a slab");

template <DType kFmt>
__device__ __forceinline__ void gemm_block_tile_q(unsigned char* smem, uint16_t const* const (&xrow)[kGemmXRowsPerThread],
                                                  bool const (&xok)[kGemmXRowsPerThread], QuantW const& w, int64_t n0,
                                                  int64_t n, int64_t k, float (&acc)[4][4][4]) {
  static_assert(kFmt == DType::kF8E4m3 || kFmt == DType::kF4E2m1x2);
  constexpr int kRowBytes = kGemmQRowBytes<kFmt>;
  constexpr int kChunks = kGemmBN * kRowBytes / 16;  // 16-byte code chunks per slab: 256 (FP8), 128 (FP4)
  int const tid = static_cast<int>(threadIdx.x);
  uint16_t* const xring = reinterpret_cast<uint16_t*>(smem);
  uint16_t* const wbuf = xring + kGemmStages * kGemmTileHalves;
  unsigned char* const raw = reinterpret_cast<unsigned char*>(wbuf + kGemmTileHalves);
  auto slab_x = [&](int s) { return xring + s * kGemmTileHalves; };
  auto slab_raw = [&](int s) { return raw + s * (kGemmBN * kRowBytes); };

  auto stage = [&](int64_t kt, int s) {
    int64_t const k0 = kt * kGemmBK;
#pragma unroll
    for (int i = 0; i < kGemmXRowsPerThread; ++i) {
      int const r = (tid >> 2) + 64 * i, c = tid & 3;
      stage_chunk<true>(slab_x(s) + r * kGemmLds + c * 8, xrow[i], 0, 0, xok[i] ? 1 : 0, k0 + c * 8, k);
    }
    if (tid < kChunks) {
      int const r = tid / (kRowBytes / 16), c = tid % (kRowBytes / 16);
      bool const ok = n0 + r < n;
      cp_async16(smem_addr(slab_raw(s) + r * kRowBytes + c * 16), ok ? w.q + (n0 + r) * w.ldq + kt * kRowBytes + c * 16 : w.q,
                 ok);
    }
  };
  // Row tid / 2, K half tid % 2 of slab kt (stage s) → bf16 halves 16·h .. 16·h + 15 of that row of wbuf.
  auto decode = [&](int64_t kt, int s) {
    int const r = tid >> 1, h = tid & 1;
    int64_t const row = n0 + r;
    uint8_t const sb = row < n ? __ldg(w.s + (kFmt == DType::kF8E4m3 ? row / 32 : row) * w.lds + kt) : uint8_t{127};
    uint32_t v[8];
    if constexpr (kFmt == DType::kF8E4m3) {
      uint4 const q = *reinterpret_cast<uint4 const*>(slab_raw(s) + r * kRowBytes + 16 * h);
      float const sc = float_from_e8m0(sb);
      uint32_t const words[4] = {q.x, q.y, q.z, q.w};  // word j: k 16h + 4j .. + 3, lowest byte first
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[2 * j] = scaled_e4m3x2(words[j], sc);
        v[2 * j + 1] = scaled_e4m3x2(words[j] >> 16, sc);
      }
    } else {
      uint2 const q = *reinterpret_cast<uint2 const*>(slab_raw(s) + r * kRowBytes + 8 * h);
      uint32_t const sc2 = e8m0_bf16x2(sb);
      uint32_t const words[2] = {q.x, q.y};  // byte 4j + b: k 16h + 2(4j + b), + 1
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t o[4];
        scaled_e2m1x8(words[j], sc2, o);
#pragma unroll
        for (int b = 0; b < 4; ++b) v[4 * j + b] = o[b];
      }
    }
    uint4* const dst = reinterpret_cast<uint4*>(wbuf + r * kGemmLds + 16 * h);
    dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
    dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
  };

#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  int64_t const slabs = k / kGemmBK;
#pragma unroll
  for (int s = 0; s < kGemmStages - 1; ++s) {
    if (s < slabs) stage(s, s);
    cp_async_commit();  // one group per slab, empty past the end, so wait_group counts stay uniform
  }
  for (int64_t kt = 0; kt < slabs; ++kt) {
    cp_async_wait<kGemmStages - 2>();  // slab kt has landed (this thread's part) …
    __syncthreads();  // … everyone's; slab kt − 1's multiply is done: its stage and the bf16 slab are free
    if (kt + kGemmStages - 1 < slabs) stage(kt + kGemmStages - 1, static_cast<int>((kt + kGemmStages - 1) % kGemmStages));
    cp_async_commit();
    int const s = static_cast<int>(kt % kGemmStages);
    decode(kt, s);
    __syncthreads();  // the decoded slab is complete
    gemm_slab_mma<TcMma::kK16>(slab_x(s), wbuf, kGemmBK, acc);
  }
  cp_async_wait<0>();
  __syncthreads();
}

/// linear_tc_gemm_kernel on block-scaled W (p.wq, p.wscale): same grid, raster, block and stores; dynamic shared
/// memory gemm_q_smem_bytes<kFmt>().
template <DType kFmt>
__global__ void __launch_bounds__(kGemmWarps * 32, 2) linear_tc_gemm_q_kernel(TcLinearParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char gemm_q_smem[];
  int64_t m0, n0;
  gemm_tile_origin(p, m0, n0);
  uint16_t const* xrow[kGemmXRowsPerThread];
  bool xok[kGemmXRowsPerThread];
  gemm_x_rows(p, m0, xrow, xok);
  float acc[4][4][4];
  gemm_block_tile_q<kFmt>(gemm_q_smem, xrow, xok, QuantW{p.wq, p.wscale, p.ldwq, p.ldwscale}, n0, p.n, p.k, acc);
  gemm_store(p, m0, n0, acc);
}

}  // namespace tessera::kernels::tc_linear

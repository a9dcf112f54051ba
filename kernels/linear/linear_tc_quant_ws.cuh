// SPDX-License-Identifier: Apache-2.0
/// Block-scaled weights on the skinny tensor-core tile, warp-specialised (ops::TcQuantPath::kWarpSpec): the values
/// of linear_tc_quant.cuh's ring path bit for bit, with the decode taken off the mma chain's warp.
///
/// Why: an output's accumulator is one register chain over ⌈K/16⌉ block steps (linear_tc.cuh's contract: no
/// split-K), so a tile's time is at least that chain. In the one-warp ring path the same warp also copies and
/// decodes every code of the tile between its mma steps, which stretches the chain several times (FP8 K = 5120:
/// ~35 µs per tile on the H200, whatever N). Here a block of 1 + kWsProducerWarps warps owns one 8-column tile:
///   producers (warps 1..4): per 256-wide K part, cp.async the tile's codes and x rows into a code ring of kRaw
///     stages (each thread later decodes exactly the 16-byte units it copied, so its own cp.async.wait_group
///     orders them), decode them to bf16 (scaled_weight: table value × 2^(s−127) in fp32, →bf16 RNE) and the x
///     rows as they are into a bf16 ring of kWsStages stages (8·kMats W rows + xr x rows, kSkinnyLds pitch), then
///     bar.arrive on the stage's FULL barrier;
///   consumer (warp 0): bar.sync FULL, ldmatrix + block_step over the part's 16 blocks in K order, bar.arrive on
///     the stage's EMPTY barrier, on which the producers bar.sync before they refill it.
/// Named barriers: FULL s = 1 + s, EMPTY s = 1 + kWsStages + s (kWsThreads each), producers only = kWsProdBar.
/// Operands and block order are those of skinny_warp_tile_q: same outputs. Requires what tc_quant_ok requires
/// (k % 32 == 0, k ≤ kTcQuantMaxK, 16-byte aligned codes with ldq % 16 == 0, 16-byte aligned x rows).
#pragma once

#include "kernels/linear/linear_tc_quant.cuh"
#include "tessera/device/pdl.cuh"

namespace tessera::kernels::tc_linear {

inline constexpr int kWsProducerWarps = 4;
inline constexpr int kWsProducers = kWsProducerWarps * 32;
inline constexpr int kWsThreads = kWsProducers + 32;
inline constexpr int kWsPart = 256;   // K per ring stage
inline constexpr int kWsStages = 4;   // bf16 ring
inline constexpr int kWsProdBar = 1 + 2 * kWsStages;
/// Code-ring depth: 8 stages (7 parts of codes in flight per tile) up to 4 x rows, 4 above (the x rows ride in
/// the same ring: 512 B per row and stage).
inline constexpr int kWsRawDeep = 8, kWsRawShallow = 4, kWsDeepMaxRows = 4;

template <DType kFmt>
inline constexpr int kWsRowBytes = kWsPart / kCodesPerByte<kFmt>;  // code bytes of one W row per part

template <DType kFmt>
inline constexpr size_t skinny_ws_smem_bytes(int mats, int raw_stages, int64_t xr, int64_t k) {
  size_t const bf16_stage = size_t(mats * kSkinnyCols + xr) * kSkinnyLds * 2;
  size_t const raw_stage = size_t(mats) * kSkinnyCols * kWsRowBytes<kFmt> + size_t(xr) * kWsPart * 2;
  size_t const scales = size_t(mats) * kScaleRows<kFmt> * size_t(quant_scale_cols(k));
  return kWsStages * bf16_stage + size_t(raw_stages) * raw_stage + (scales + 15) / 16 * 16;
}

__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/// One 16-byte unit of codes (16 FP8 or 32 FP4 codes of one row, one scale code sb) → bf16 at dst (32 or 64 bytes).
template <DType kFmt>
__device__ __forceinline__ void ws_decode_unit(uint4 const r, uint8_t const sb, uint4* dst) {
  float const sc = float_from_e8m0(sb);
  uint32_t const sc2 = e8m0_bf16x2(sb);
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

/// The 8-column tile n0.. of kMats block-scaled matrices against 1 ≤ xr ≤ 16 x rows (xrow(j): bf16 row j, K
/// contiguous), by the whole block of kWsThreads. On return acc holds skinny_warp_tile_q's accumulators in warp 0
/// (fragment layout of D); the other warps' acc is unspecified. smem: 16-byte aligned, ≥
/// skinny_ws_smem_bytes<kFmt>(kMats, kRaw, xr, k).
template <DType kFmt, int kMats, int kRaw, class XRow>
__device__ __forceinline__ void skinny_block_tile_ws(unsigned char* smem, QuantW const (&w)[kMats], int64_t n0, int64_t n,
                                                     int64_t k, int xr, XRow const& xrow, float (&acc)[kMats][4]) {
  constexpr int kCpb = kCodesPerByte<kFmt>;
  constexpr int kRowBytes = kWsRowBytes<kFmt>;
  constexpr int kUnitsPerRow = kRowBytes / 16;
  constexpr int kCodeUnits = kMats * kSkinnyCols * kUnitsPerRow;
  static_assert(kRaw >= 2 && kRowBytes % 16 == 0);
  int const tid = static_cast<int>(threadIdx.x);
  int64_t const parts = (k + kWsPart - 1) / kWsPart;
  size_t const bf16_stage = size_t(kMats * kSkinnyCols + xr) * kSkinnyLds * 2;
  size_t const raw_stage = size_t(kCodeUnits) * 16 + size_t(xr) * kWsPart * 2;
  auto bring = [&](int s) { return reinterpret_cast<uint16_t*>(smem + s * bf16_stage); };
  auto raw = [&](int s) { return smem + kWsStages * bf16_stage + s * raw_stage; };
  unsigned char* const scales = smem + kWsStages * bf16_stage + kRaw * raw_stage;

  if (tid < 32) {  // ---- consumer: the mma chain ----
    int const lane = tid;
    int const g = lane >> 2;
    int const arow = (lane & 15) < xr ? (lane & 15) : xr - 1;
    bool const lo_ok = g < xr, hi_ok = g + 8 < xr;
#pragma unroll
    for (int i = 0; i < kMats; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
    for (int64_t u = 0; u < parts; ++u) {
      int const s = static_cast<int>(u % kWsStages);
      named_bar_sync(1 + s, kWsThreads);
      uint16_t const* const wb = bring(s);
      uint16_t const* const xb = wb + kMats * kSkinnyCols * kSkinnyLds;
      int64_t const kpart = u * kWsPart;
      // The part's fragments first (8 ldmatrix.x4 of W per matrix, 16 of x), then its 16 block steps back to back:
      // the chain waits only on itself, not on a shared-memory load per step.
      uint32_t b[kMats][kWsPart / 32][4], a[kWsPart / 16][4];
#pragma unroll
      for (int q = 0; q < kWsPart / 32; ++q)
#pragma unroll
        for (int i = 0; i < kMats; ++i)
          ldmatrix_x4(b[i][q], smem_addr(wb + (i * kSkinnyCols + (lane & 7)) * kSkinnyLds + 32 * q + (lane >> 3) * 8));
#pragma unroll
      for (int q = 0; q < kWsPart / 16; ++q) {
        ldmatrix_x4(a[q], smem_addr(xb + arow * kSkinnyLds + 16 * q + (lane >> 4) * 8));
        if (!lo_ok) a[q][0] = a[q][2] = 0u;
        if (!hi_ok) a[q][1] = a[q][3] = 0u;
      }
#pragma unroll
      for (int q = 0; q < kWsPart / 16; ++q) {
        if (kpart + 16 * q >= k) break;  // exactly ⌈k/16⌉ block steps
#pragma unroll
        for (int i = 0; i < kMats; ++i) block_step<TcMma::kK16>(acc[i], a[q], b[i][q / 2][2 * (q % 2)], b[i][q / 2][2 * (q % 2) + 1]);
      }
      if (u + kWsStages < parts) named_bar_arrive(1 + kWsStages + s, kWsThreads);
    }
    return;
  }

  // ---- producers: codes and x rows → code ring → bf16 ring ----
  // Unit t = pt + v·kWsProducers (v < kUnitIters) of every part belongs to this thread for the whole K walk:
  // row t / kUnitsPerRow (= i·8 + j), 16-byte column c = t % kUnitsPerRow. Its source row, ring offsets and
  // scale index are fixed here, so a part costs the copies and the decode alone (offsets fit 32 bits: k ≤
  // kTcQuantMaxK).
  constexpr int kUnitIters = (kCodeUnits + kWsProducers - 1) / kWsProducers;
  constexpr int kXUnitsPerRow = kWsPart / 8;  // 16-byte x chunks per row and part
  int const pt = tid - 32;
  int const kbytes = static_cast<int>(k / kCpb);
  int const scols = static_cast<int>(quant_scale_cols(k));
  int const x_units = xr * kXUnitsPerRow;
  uint8_t const* usrc[kUnitIters];  // the unit's codes in part 0, null when its row is ≥ n
  int ucol[kUnitIters], ubf[kUnitIters], usc[kUnitIters];
#pragma unroll
  for (int v = 0; v < kUnitIters; ++v) {
    int const t = pt + v * kWsProducers;
    int const row = t / kUnitsPerRow, c = t % kUnitsPerRow;  // t ≥ kCodeUnits: never used
    int const i = row / kSkinnyCols < kMats ? row / kSkinnyCols : 0, j = row % kSkinnyCols;
    usrc[v] = n0 + j < n ? w[i].q + (n0 + j) * w[i].ldq + c * 16 : nullptr;
    ucol[v] = c * 16;
    ubf[v] = row * kSkinnyLds + c * 16 * kCpb;
    usc[v] = (kFmt == DType::kF4E2m1x2 ? row : i) * scols + c * 16 * kCpb / 32;  // 8 scale rows per matrix (FP4) or 1
  }
  uint8_t const* const dummy = w[0].q;  // a valid address for the zero-filling copies
  auto issue = [&](int u, int rs) {
    unsigned char* const r = raw(rs);
    int const ub = u * kRowBytes;
#pragma unroll
    for (int v = 0; v < kUnitIters; ++v) {
      int const t = pt + v * kWsProducers;
      if (kCodeUnits % kWsProducers != 0 && t >= kCodeUnits) break;
      bool const ok = usrc[v] != nullptr && ub + ucol[v] < kbytes;
      cp_async16(smem_addr(r + t * 16), ok ? usrc[v] + ub : dummy, ok);
    }
    uint16_t* const xr_raw = reinterpret_cast<uint16_t*>(r + kCodeUnits * 16);
    for (int t = pt; t < x_units; t += kWsProducers) {
      int const j = t / kXUnitsPerRow, c = t % kXUnitsPerRow;
      int const xk = u * kWsPart + c * 8;
      bool const ok = xk < k;
      uint16_t const* const xs = xrow(j);
      cp_async16(smem_addr(xr_raw + j * kWsPart + c * 8), ok ? xs + xk : xs, ok);
    }
  };
  auto decode = [&](int u, int rs, int s) {
    unsigned char const* const r = raw(rs);
    uint16_t* const wb = bring(s);
#pragma unroll
    for (int v = 0; v < kUnitIters; ++v) {
      int const t = pt + v * kWsProducers;
      if (kCodeUnits % kWsProducers != 0 && t >= kCodeUnits) break;
      ws_decode_unit<kFmt>(*reinterpret_cast<uint4 const*>(r + t * 16), scales[usc[v] + u * (kWsPart / 32)],
                           reinterpret_cast<uint4*>(wb + ubf[v]));
    }
    uint16_t const* const xr_raw = reinterpret_cast<uint16_t const*>(r + kCodeUnits * 16);
    uint16_t* const xb = wb + kMats * kSkinnyCols * kSkinnyLds;
    for (int t = pt; t < x_units; t += kWsProducers) {
      int const j = t / kXUnitsPerRow, c = t % kXUnitsPerRow;
      *reinterpret_cast<uint4*>(xb + j * kSkinnyLds + c * 8) = *reinterpret_cast<uint4 const*>(xr_raw + j * kWsPart + c * 8);
    }
  };

  int const nparts = static_cast<int>(parts);
#pragma unroll
  for (int q = 0; q < kRaw - 1; ++q) {
    if (q < nparts) issue(q, q);
    cp_async_commit();  // one group per part, empty past the end: wait_group counts stay uniform
  }
  stage_quant_scales<kFmt, kMats>(scales, w, n0, n, k, pt, kWsProducers);  // first parts in flight
  named_bar_sync(kWsProdBar, kWsProducers);
  for (int u = 0; u < nparts; ++u) {
    int const q = u + kRaw - 1;
    if (q < nparts) issue(q, q % kRaw);  // the stage part u − 1 left (decoded by this thread)
    cp_async_commit();
    cp_async_wait<kRaw - 1>();  // this thread's units of part u have landed
    int const s = u % kWsStages;
    if (u >= kWsStages) named_bar_sync(1 + kWsStages + s, kWsThreads);  // the consumer is done with part u − S
    decode(u, u % kRaw, s);
    named_bar_arrive(1 + s, kWsThreads);
  }
  cp_async_wait<0>();
}

/// Skinny block-scaled tile, warp-specialised: grid (⌈N/8⌉, ⌈M/16⌉), block kWsThreads, dynamic shared memory
/// skinny_ws_smem_bytes<kFmt>(1, kRaw, min(M, 16), K).
template <DType kFmt, int kRaw>
__device__ __forceinline__ void skinny_ws_tile(TcLinearParams const& p) {
  extern __shared__ __align__(16) unsigned char skinny_ws_smem[];
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyCols;
  int64_t const r0 = static_cast<int64_t>(blockIdx.y) * kSkinnyRows;
  if (n0 >= p.n || r0 >= p.m) return;  // block-uniform
  int const xr = static_cast<int>(p.m - r0 < kSkinnyRows ? p.m - r0 : kSkinnyRows);
  QuantW const w[1] = {{p.wq, p.wscale, p.ldwq, p.ldwscale}};
  float acc[1][4];
  skinny_block_tile_ws<kFmt, 1, kRaw>(skinny_ws_smem, w, n0, p.n, p.k, xr,
                                      [&](int j) { return p.x + (r0 + j) * p.ldx; }, acc);
  if (threadIdx.x >= 32) return;
  int const lane = static_cast<int>(threadIdx.x);
  int const g = lane >> 2, c = lane & 3;
  int64_t const col = n0 + 2 * c;
  store_pair(p, r0 + g, col, acc[0][0], acc[0][1]);
  store_pair(p, r0 + g + 8, col, acc[0][2], acc[0][3]);
}

template <DType kFmt, int kRaw>
__global__ void __launch_bounds__(kWsThreads) linear_tc_skinny_ws_kernel(TcLinearParams const p) {
  device::pdl_enter();
  skinny_ws_tile<kFmt, kRaw>(p);
}
template <DType kFmt, int kRaw>
__global__ void __launch_bounds__(kWsThreads) linear_tc_skinny_ws_batch_kernel(TcLinearBatch const b) {
  device::pdl_enter();
  skinny_ws_tile<kFmt, kRaw>(b.p[blockIdx.z]);
}

/// The code-ring depth for a launch whose row groups have at most m_rows rows.
inline constexpr int ws_raw_stages(int64_t m_rows) { return m_rows <= kWsDeepMaxRows ? kWsRawDeep : kWsRawShallow; }

template <DType kFmt>
inline size_t skinny_ws_launch_smem(int64_t m, int64_t k) {
  int64_t const xr = m < kSkinnyRows ? m : kSkinnyRows;
  return skinny_ws_smem_bytes<kFmt>(1, ws_raw_stages(xr), xr, k);
}

}  // namespace tessera::kernels::tc_linear

// SPDX-License-Identifier: Apache-2.0
/// The GEMM tile on warpgroup MMA (wgmma.mma_async, sm_90a) for prefill-sized linears: y = x · Wᵀ with W bf16 or
/// block-scaled (FP8 e4m3 under 32×32-block ue8m0 scales, FP4 e2m1 under per-row-per-32 scales, decoded to bf16
/// inside the block as linear_tc_quant_gemm.cuh does).
///
/// Accumulation contract: linear_tc.cuh's. Every output element is one fp32 accumulator register, +0 at the start,
/// updated once per 16-wide K block in K order by one m64n256k16 instruction (exactly ⌈K/16⌉ of them; K past the
/// end staged as +0 in both operands), stored as is and/or →bf16 (RNE). The values are ref::dot_tc's when the
/// instruction's block step is tc::BlockAcc's, which verify_gpu_linear_tc and verify_gpu_linear_scaled assert on
/// every problem they run.
///
/// Block: 128 × 256 outputs, 256 threads = 2 warpgroups; warpgroup g owns rows 64g .. 64g + 63 of the block (128
/// fp32 accumulators per thread). Accumulator layout of m64nNk16 (PTX ISA): warp w of the warpgroup holds rows
/// 16w .. 16w + 15; with q = lane / 4, c = lane % 4, acc[4j], acc[4j + 1] are (row 16w + q, columns 8j + 2c, +1)
/// and acc[4j + 2], acc[4j + 3] the same columns of row 16w + q + 8.
///
/// Shared memory. K is staged in slabs of 64 (128 bytes of bf16 per row). A slab of R rows is R × 128 bytes in the
/// 128-byte swizzle: 16-byte chunk c (K 8c .. 8c + 7) of row r lies at r·128 + ((c ⊕ (r mod 8))·16), the tile base
/// 1024-byte aligned. That is the K-major SWIZZLE_128B layout a wgmma descriptor with stride byte offset 1024 (one
/// 8-row group) reads; k16 step j of the slab is the same descriptor with its start address + 32·j bytes (the
/// swizzle applies to the computed address bits 4–6 ⊕ 7–9, so the tile base must be 1024-aligned).
///   bf16 W:   4 stages × (x slab 16 KiB + W slab 32 KiB) = 192 KiB, filled by cp.async from all threads.
///   quant W:  4 stages of x slabs (64 KiB) + 4 stages of raw code rows (FP8 64 B, FP4 32 B per row, each row
///             padded by 16 B so the decode's row-per-thread reads are conflict-free) + 2 decoded bf16 W slabs
///             (64 KiB).
/// Pipeline (slab kt): wait until slab kt's cp.async group landed, fence.proxy.async (the generic-proxy writes —
/// cp.async, st.shared — become visible to wgmma's async proxy), barrier; stage slab kt + 2 into stage (kt + 2) mod 4
/// (quant: decode slab kt's codes into bf16 slab kt mod 2, fence, barrier); issue the slab's k16 steps as one wgmma
/// group and wait for group kt − 1 (wait_group 1). Every thread has thus seen group kt − 2 complete before iteration
/// kt's barrier, which is what frees stage (kt + 2) mod 4 and bf16 slab kt mod 2. Slabs kt + 1 and kt + 2 are in
/// flight while kt multiplies.
#pragma once

#include "kernels/linear/linear_tc.cuh"
#include "kernels/linear/linear_tc_quant.cuh"
#include "tessera/device/pdl.cuh"

namespace tessera::kernels::tc_linear {

inline constexpr int kWgBM = 128, kWgBN = 256, kWgBK = 64, kWgStages = 4, kWgThreads = 256;
inline constexpr int kWgGroupM = 8;  // block raster: 8 M-tiles share a sweep over N (W slabs reused in L2)
inline constexpr int kWgRowBytes = kWgBK * 2;               // 128: one swizzle row
inline constexpr int kWgXSlabBytes = kWgBM * kWgRowBytes;  // 16 KiB
inline constexpr int kWgWSlabBytes = kWgBN * kWgRowBytes;  // 32 KiB
inline constexpr int kWgXRowsPerThread = kWgBM * 8 / kWgThreads;  // 4: rows (tid / 8) + 32·i, chunk tid % 8
inline constexpr int kWgWRowsPerThread = kWgBN * 8 / kWgThreads;  // 8
static_assert(kWgXRowsPerThread == 4 && kWgWRowsPerThread == 8 && kWgThreads == 2 * 128);

/// Raw code bytes of one W row per slab, and the padded pitch of a row in the code ring.
template <DType kFmt>
inline constexpr int kWgCodeRowBytes = kWgBK / kCodesPerByte<kFmt>;
template <DType kFmt>
inline constexpr int kWgCodePitch = kWgCodeRowBytes<kFmt> + 16;

/// Dynamic shared memory of a launch, with 1 KiB to align the tile base.
template <DType kFmt>
inline constexpr size_t wgmma_smem_bytes() {
  if constexpr (kFmt == DType::kBf16)
    return size_t(kWgStages) * (kWgXSlabBytes + kWgWSlabBytes) + 1024;
  else
    return size_t(kWgStages) * kWgXSlabBytes + 2 * size_t(kWgWSlabBytes) + size_t(kWgStages) * kWgBN * kWgCodePitch<kFmt> +
           1024;
}
static_assert(wgmma_smem_bytes<DType::kBf16>() <= 227 * 1024 && wgmma_smem_bytes<DType::kF8E4m3>() <= 227 * 1024 &&
              wgmma_smem_bytes<DType::kF4E2m1x2>() <= 227 * 1024);

/// Byte offset of 16-byte chunk c of row r in a swizzled slab.
__device__ __forceinline__ uint32_t swizzle128(int r, int c) {
  return static_cast<uint32_t>(r * kWgRowBytes + ((c ^ (r & 7)) << 4));
}

/// The wgmma shared-memory matrix descriptor of a K-major SWIZZLE_128B tile at shared address addr (1024-aligned
/// tile base, + 32·j for k16 step j): start address >> 4 (bits 0–13), leading byte offset 16 >> 4 (bits 16–29;
/// unused by swizzled K-major layouts), stride byte offset 1024 >> 4 (bits 32–45), base offset 0, layout type 1 =
/// SWIZZLE_128B (bits 62–63).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
/// Orders this thread's earlier generic-proxy shared-memory writes before later async-proxy (wgmma) reads.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/// Keeps the compiler from moving reads of v across the asm statements around it (the accumulators are written
/// by the asynchronous wgmma: only wgmma_wait makes them final).
__device__ __forceinline__ void fence_operand(float& v) { asm volatile("" : "+f"(v)::"memory"); }

/// d[0..127] ← wgmma m64n256k16 (bf16 × bf16 + fp32 d) of the warpgroup's A and B descriptors when `on` (a guard
/// predicate, warpgroup-uniform: no branch around the instruction), else d unchanged.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool on = true) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p, q;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "setp.ne.b32 q, %131, 0;\n"
      "@q wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(1), "r"(on ? 1 : 0));
#else
  (void)d, (void)desc_a, (void)desc_b, (void)on;
  __trap();
#endif
}

/// The block's tile origin (m0, n0): grid ⌈M/128⌉·⌈N/256⌉ (1-D), grouped raster as gemm_tile_origin.
__device__ __forceinline__ void wgmma_tile_origin(TcLinearParams const& p, int64_t& m0, int64_t& n0) {
  grouped_tile_origin<kWgBM, kWgBN, kWgGroupM>(p.m, p.n, m0, n0);
}

/// One block's 128 × 256 tile: x rows xrow[i] (row (tid / 8) + 32·i of the block; xok[i] false: staged as +0) against
/// W rows n0 .. n0 + 255 (bf16 `w`, row stride ldw, when kFmt is kBf16; else the codes and scales of `q`), K = k.
/// kVec16: 16-byte cp.async staging (k % 8 == 0, 16-byte aligned rows); otherwise guarded element loads (bf16 W
/// only). acc: this thread's 128 accumulators (layout above). smem: the launch's dynamic shared memory.
/// kSkipIdle, live_rows: the warpgroup whose 64 rows all lie at or past live_rows issues no wgmma (empty commit
/// groups keep the pipeline's counts; both warpgroups still stage, decode and meet every barrier) and its
/// accumulators stay +0; such rows must not be stored. A stored row's chain is unchanged. Without kSkipIdle the
/// full slabs' wgmma are unconditional (the branch costs ptxas-inserted warpgroup.arrive instructions).
template <DType kFmt, bool kVec16, bool kSkipIdle = false>
__device__ __forceinline__ void wgmma_block_tile(unsigned char* smem_raw, uint16_t const* const (&xrow)[kWgXRowsPerThread],
                                                 bool const (&xok)[kWgXRowsPerThread], uint16_t const* w, int64_t ldw,
                                                 QuantW const& q, int64_t n0, int64_t n, int64_t k, float (&acc)[128],
                                                 int live_rows = kWgBM) {
  constexpr bool kQuant = kFmt != DType::kBf16;
  static_assert(!kQuant || kVec16, "block-scaled W stages x with 16-byte cp.async");
  int const tid = static_cast<int>(threadIdx.x), wg = tid >> 7;
  // Warpgroup-uniform; broadcast from lane 0 so the compiler knows it is warp-uniform: a wgmma under a branch it
  // takes for divergent makes ptxas serialise every wgmma of the kernel (C7520).
  bool const issue = __shfl_sync(0xFFFFFFFFu, wg * 64 < live_rows ? 1 : 0, 0) != 0;
  int const srow = tid >> 3, schunk = tid & 7;  // this thread's staging row (+ 32·i) and 16-byte chunk
  // 1024-aligned tile base in the shared window.
  uint32_t const base_addr = (smem_addr(smem_raw) + 1023u) & ~1023u;
  unsigned char* const base = smem_raw + (base_addr - smem_addr(smem_raw));
  // bf16 W: stage s = [x slab | W slab]; quant: x ring, then the two bf16 W slabs, the code ring.
  auto x_off = [&](int s) -> uint32_t {
    return kQuant ? static_cast<uint32_t>(s * kWgXSlabBytes) : static_cast<uint32_t>(s * (kWgXSlabBytes + kWgWSlabBytes));
  };
  auto w_off = [&](int s) -> uint32_t {  // bf16 W: ring stage s; quant: decoded slab s (0 or 1)
    return kQuant ? static_cast<uint32_t>(kWgStages * kWgXSlabBytes + s * kWgWSlabBytes)
                  : static_cast<uint32_t>(s * (kWgXSlabBytes + kWgWSlabBytes) + kWgXSlabBytes);
  };
  unsigned char* const raw = base + kWgStages * kWgXSlabBytes + 2 * kWgWSlabBytes;

  auto stage = [&](int64_t kt, int s) {
    int64_t const k0 = kt * kWgBK + schunk * 8;
#pragma unroll
    for (int i = 0; i < kWgXRowsPerThread; ++i) {
      int const r = srow + 32 * i;
      stage_chunk<kVec16>(reinterpret_cast<uint16_t*>(base + x_off(s) + swizzle128(r, schunk)), xrow[i], 0, 0,
                          xok[i] ? 1 : 0, k0, k);
    }
    if constexpr (!kQuant) {
#pragma unroll
      for (int i = 0; i < kWgWRowsPerThread; ++i) {
        int const r = srow + 32 * i;
        stage_chunk<kVec16>(reinterpret_cast<uint16_t*>(base + w_off(s) + swizzle128(r, schunk)), w, ldw, n0 + r, n, k0, k);
      }
    } else {
      constexpr int kRowBytes = kWgCodeRowBytes<kFmt>, kPitch = kWgCodePitch<kFmt>;
      constexpr int kPerRow = kRowBytes / 16;                       // 16-byte chunks per row: 4 (FP8), 2 (FP4)
      constexpr int kPerThread = kWgBN * kPerRow / kWgThreads;      // 4 (FP8), 2 (FP4)
      constexpr int kCodesPerChunk = 16 * kCodesPerByte<kFmt>;      // K indices a chunk covers
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        int const r = tid / kPerRow + (kWgThreads / kPerRow) * i, c = tid % kPerRow;
        bool const ok = n0 + r < n && kt * kWgBK + c * kCodesPerChunk < k;
        cp_async16(smem_addr(raw + s * (kWgBN * kPitch) + r * kPitch + c * 16),
                   ok ? q.q + (n0 + r) * q.ldq + kt * kRowBytes + c * 16 : q.q, ok);
      }
    }
  };
  // Slab kt's codes (ring stage s) of row tid → bf16 slab kt % 2, swizzled; rows ≥ n and K halves past k decode
  // zero codes under scale code 127 (1.0): +0.
  auto decode = [&](int64_t kt, int s) {
    if constexpr (kQuant) {
      constexpr int kPitch = kWgCodePitch<kFmt>;
      int const r = tid;
      int64_t const row = n0 + r;
      unsigned char const* src = raw + s * (kWgBN * kPitch) + r * kPitch;
      uint8_t sb[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sb[h] = row < n && kt * kWgBK + 32 * h < k
                    ? __ldg(q.s + (kFmt == DType::kF8E4m3 ? row / 32 : row) * q.lds + 2 * kt + h)
                    : uint8_t{127};
      unsigned char* const dst = base + w_off(static_cast<int>(kt & 1));
      if constexpr (kFmt == DType::kF8E4m3) {
        float const sc[2] = {float_from_e8m0(sb[0]), float_from_e8m0(sb[1])};
#pragma unroll
        for (int c2 = 0; c2 < 4; ++c2) {  // 16 codes = K 16·c2 .. + 15 = output chunks 2·c2, 2·c2 + 1
          uint4 const v = *reinterpret_cast<uint4 const*>(src + 16 * c2);
          uint32_t const words[4] = {v.x, v.y, v.z, v.w};  // word j: K 16·c2 + 4j .. + 3, lowest byte first
          float const f = sc[c2 >> 1];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              o[2 * j] = scaled_e4m3x2(words[2 * half + j], f);
              o[2 * j + 1] = scaled_e4m3x2(words[2 * half + j] >> 16, f);
            }
            *reinterpret_cast<uint4*>(dst + swizzle128(r, 2 * c2 + half)) = make_uint4(o[0], o[1], o[2], o[3]);
          }
        }
      } else {
        uint32_t const sc2[2] = {e8m0_bf16x2(sb[0]), e8m0_bf16x2(sb[1])};
#pragma unroll
        for (int c2 = 0; c2 < 2; ++c2) {  // 16 bytes = 32 codes = K 32·c2 .. + 31 = output chunks 4·c2 .. 4·c2 + 3
          uint4 const v = *reinterpret_cast<uint4 const*>(src + 16 * c2);
          uint32_t const words[4] = {v.x, v.y, v.z, v.w};  // byte b of word j: K 32·c2 + 8j + 2b, + 1
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            uint32_t o[4];
            scaled_e2m1x8(words[j], sc2[c2], o);
            *reinterpret_cast<uint4*>(dst + swizzle128(r, 4 * c2 + j)) = make_uint4(o[0], o[1], o[2], o[3]);
          }
        }
      }
    }
  };

#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  int64_t const slabs = (k + kWgBK - 1) / kWgBK;
#pragma unroll
  for (int s = 0; s < kWgStages - 2; ++s) {
    if (s < slabs) stage(s, s);
    cp_async_commit();  // one group per slab, empty past the end, so wait_group counts stay uniform
  }
  // Slab kt. kTail: the last slab when k % 64 ≠ 0, its ⌈(k mod 64)/16⌉ steps predicated; every other slab issues
  // its four wgmma unconditionally (a branch or a predicate around them makes ptxas add a warpgroup.arrive before
  // each, C7519).
  auto slab = [&](int64_t kt, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    int const s = static_cast<int>(kt % kWgStages);
    cp_async_wait<kWgStages - 3>();  // slab kt has landed (this thread's part)
    fence_proxy_async_shared();
    __syncthreads();  // everyone's part; wgmma group kt − 2 is complete in both warpgroups
    if (kt + kWgStages - 2 < slabs) stage(kt + kWgStages - 2, static_cast<int>((kt + kWgStages - 2) % kWgStages));
    cp_async_commit();
    if constexpr (kQuant) {
      decode(kt, s);
      fence_proxy_async_shared();
      __syncthreads();  // the decoded slab is complete
    }
    uint32_t const xa = base_addr + x_off(s) + static_cast<uint32_t>(wg * 64 * kWgRowBytes);
    uint32_t const wa = base_addr + (kQuant ? w_off(static_cast<int>(kt & 1)) : w_off(s));
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(acc[i]);
    wgmma_fence();
    if constexpr (kTail) {
      int const steps = static_cast<int>((k - kt * kWgBK + 15) / 16);
#pragma unroll
      for (int j = 0; j < kWgBK / 16; ++j)
        wgmma_m64n256k16(acc, wgmma_desc(xa + 32u * j), wgmma_desc(wa + 32u * j), issue && j < steps);
    } else if (!kSkipIdle || issue) {
#pragma unroll
      for (int j = 0; j < kWgBK / 16; ++j) wgmma_m64n256k16(acc, wgmma_desc(xa + 32u * j), wgmma_desc(wa + 32u * j));
    }
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(acc[i]);
    wgmma_wait<1>();
  };
  int64_t const full = k / kWgBK;
  for (int64_t kt = 0; kt < full; ++kt) slab(kt, std::false_type{});
  if (full < slabs) slab(full, std::true_type{});
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) fence_operand(acc[i]);
  cp_async_wait<0>();
  __syncthreads();  // both warpgroups' wgmma reads are done: the caller may reuse the shared memory
}

/// The tile's outputs (acc in the m64n256k16 layout of warpgroup tid / 128) where they exist.
__device__ __forceinline__ void wgmma_store(TcLinearParams const& p, int64_t m0, int64_t n0, float const (&acc)[128]) {
  int const tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  int64_t const row = m0 + (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < kWgBN / 8; ++j) {
    int64_t const col = n0 + 8 * j + 2 * (lane & 3);
    store_pair(p, row, col, acc[4 * j], acc[4 * j + 1]);
    store_pair(p, row + 8, col, acc[4 * j + 2], acc[4 * j + 3]);
  }
}

/// GEMM on wgmma: grid ⌈M/128⌉·⌈N/256⌉ (1-D, grouped raster), block kWgThreads, dynamic shared memory
/// wgmma_smem_bytes<kFmt>(). kFmt kBf16: W in p.w; kF8E4m3 / kF4E2m1x2: codes p.wq and scales p.wscale.
template <DType kFmt, bool kVec16>
__global__ void __launch_bounds__(kWgThreads, 1) linear_tc_wgmma_kernel(TcLinearParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char wgmma_smem[];
  int64_t m0, n0;
  wgmma_tile_origin(p, m0, n0);
  int const tid = static_cast<int>(threadIdx.x);
  uint16_t const* xrow[kWgXRowsPerThread];
  bool xok[kWgXRowsPerThread];
#pragma unroll
  for (int i = 0; i < kWgXRowsPerThread; ++i) {
    int64_t const row = m0 + (tid >> 3) + 32 * i;
    xok[i] = row < p.m;
    xrow[i] = p.x + (xok[i] ? row : 0) * p.ldx;
  }
  float acc[128];
  wgmma_block_tile<kFmt, kVec16>(wgmma_smem, xrow, xok, p.w, p.ldw, QuantW{p.wq, p.wscale, p.ldwq, p.ldwscale}, n0, p.n,
                                 p.k, acc);
  wgmma_store(p, m0, n0, acc);
}

}  // namespace tessera::kernels::tc_linear

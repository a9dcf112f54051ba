// SPDX-License-Identifier: Apache-2.0
/// Tensor-core bf16 linear (CUDA, kernels/linear/linear_tc_cuda.cu): y[M, N] = x[M, K] · W[N, K]ᵀ, x and W bf16
/// row-major with K contiguous, accumulated by mma.sync in fp32; the output is the raw fp32 accumulator and/or
/// its →bf16 (round to nearest even). Meant to equal ref::dot_tc (tc::BlockAcc) bit for bit:
///   * each output element has ONE fp32 accumulator, starting at +0, carried through the K blocks
///     [16b, 16b + 16) for b = 0, 1, …, ⌈K/16⌉ − 1 strictly in this order (no split-K, no partial sums added
///     later, no reordering of blocks), one m16n8k16 per block and output tile: d ← mma(a, b, d);
///   * exactly ⌈K/16⌉ block steps are issued; the last block of a K that is not a multiple of 16 is padded with
///     products whose BOTH factors are +0 (see kernels/linear/linear_tc.cuh for why that is BlockAcc's partial
///     last block);
///   * rows past M and columns past N are zero-padded operands whose outputs are never stored; an output element
///     depends only on its own row of x and column of W.
/// Whether the hardware instruction computes BlockAcc's block step is what verify/gpu_ops/linear_tc_test.cpp
/// measures; TcMma::kK8x2 (two m16n8k8 per 16-block) exists only so that test can tell which instruction
/// matches the model if m16n8k16 turned out to be split internally. ops::Linear<kCuda> runs its bf16-weight,
/// bf16-output calls here (kernels/linear/linear_cuda.cu).
#pragma once

#include <cstdint>
#include <span>

#include "tessera/core/context.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/status.hpp"

namespace tessera::ops {

/// The instruction behind one 16-wide K block: one m16n8k16, or (diagnostic) two m16n8k8 in K order.
enum class TcMma : int { kK16 = 0, kK8x2 = 1 };

/// Compiled tile variants.
///   kGemm    128 × 128 outputs per block of 8 warps (warp tile 64 × 32), K staged 32 at a time through a
///            4-stage cp.async ring in shared memory, fragments read with ldmatrix. For M ≥ kTcGemmMinRows.
///   kSkinny  decode: one warp per block owns 8 columns of W and 16 rows of x (rows past M are zeros in
///            registers); W is streamed with coalesced 16-byte cp.async through an 8-stage ring of 256-wide K
///            slabs. grid.y covers M in groups of 16 (M > 16 re-streams W once per group).
///   kWgmma   prefill on sm_90a: 128 × 256 outputs per block of 2 warpgroups, one wgmma m64n256k16 per 16-wide K
///            block and warpgroup, K staged 64 at a time in 128-byte-swizzled shared memory (4-stage cp.async ring;
///            block-scaled codes decoded to bf16 in the block): kernels/linear/linear_tc_wgmma.cuh. m16n8k16
///            contract (kK16 only). kAuto takes it for M ≥ kTcWgmmaMinRows (block-scaled W: M ≥
///            kTcWgmmaScaledMinRows) where tc_wgmma_available() and TESSERA_TC_WGMMA is not 0 (16-byte staging;
///            bf16 W with element loads stays on kGemm there).
enum class TcTile : int { kAuto = -1, kGemm = 0, kSkinny = 1, kWgmma = 2 };

inline constexpr int64_t kTcGemmMinRows = 64;
inline constexpr int64_t kTcWgmmaMinRows = 128;
/// Block-scaled W (FP8 / FP4 codes decoded in the block) takes the wgmma tile from this many rows. Below it the
/// in-block decode, not the MMA, sets the time, and the 128 × 256 block gives narrow N half the blocks of the
/// 128 × 128 mma.sync tile (H100, tc_bench --quant-gemm: FP8 w1/w3 at 512 rows 164 µs wgmma vs 134 µs mma.sync;
/// FP8 summed over the five DeepSeek-V4.1 shapes wgmma is 2 % slower at 512 rows, 2 % faster at 2048, 8 %
/// faster at 8192). bf16 W takes wgmma from kTcWgmmaMinRows: it is never slower there (1.0–1.6× mma.sync).
inline constexpr int64_t kTcWgmmaScaledMinRows = 2048;

/// true when the wgmma tile runs here: the build holds sm_90a code (gpu_arch 90a) and the current device is
/// compute capability 9.0.
bool tc_wgmma_available();
/// tc_wgmma_available() and TESSERA_TC_WGMMA is not 0 (read once): kAuto's prefill tiles (linears and the MoE
/// expert GEMMs) run on wgmma. For A/B timings only: the values never change.
bool tc_wgmma_auto();

/// The skinny tile's K slab and ring depth (k256x8: 256-wide slabs, 8 stages; …). Values are identical for every
/// choice (the block order does not depend on the staging); what differs is the length of each W row's
/// contiguous run per request (512 B to 2 KiB) and the shared memory per warp (occupancy). kAuto: kTcDefaultSlab.
/// The m16n8k8 diagnostic variant always runs k256x8.
enum class TcSlab : int { kAuto = -1, k256x8 = 0, k512x4 = 1, k1024x3 = 2, k512x6 = 3 };
inline constexpr TcSlab kTcDefaultSlab = TcSlab::k256x8;
/// The slab kAuto runs: kTcDefaultSlab, or TESSERA_TC_SLAB=256x8|512x4|1024x3|512x6 (read once; for benchmarks:
/// the values never change, only the speed).
TcSlab tc_default_slab();

/// How the skinny tile feeds block-scaled codes to the mma chain (same values either way: same operands, same
/// block order). kRing: each warp stages its 8 W rows' codes through a shared-memory ring and decodes them into a
/// bf16 buffer (linear_tc_quant.cuh). kDirect: each lane reads exactly the 4 codes of each
/// 16-wide block its mma fragment holds and decodes them there (from K = 2,048 the codes and x slices come through a
/// per-warp shared-memory ring 32 blocks deep, below it registers; linear_tc_quant_direct.cuh); M ≤ kTcDirectMaxRows
/// and the x rows within kTcDirectMaxXBytes.
/// kAuto: kDirect where it applies and N ≥ kTcDirectMinCols, else kWarpSpec (kRing with TESSERA_TC_WS=0). Per
/// warp the direct path walks K with the decode in front of each block's mma, so it is faster only with many warps
/// in flight: on the H200 (tc_bench --quant, M = 1)
/// wq_b 1280×32768 FP8 45 µs against 57 (FP4 39 against 72), but w1/w3 5120×2304 FP8 56 against 35, wo_b
/// 8192×5120 92 against 66; MoE routed experts (thousands of warps) take it at ≤ 4 rows (FP4, 1 token: 279
/// against 420 µs). kWarpSpec: one block of 1 + 4 warps per 8-column tile; four warps copy and decode the codes
/// into a bf16 ring and one warp runs the mma chain alone (linear_tc_quant_ws.cuh). H200, FP8, M = 1 (tc_bench
/// --quant, ring → warp-specialised, same machine): wkv 5120×512 36.1 → 18.1 µs, wq_a 5120×1280 35.6 → 20.4,
/// w1/w3 5120×2304 35.2 → 23.3, wo_b 8192×5120 65.7 → 64.2, w2 2304×5120 24.3 → 24.8; M = 16: 1.4–1.8x faster
/// on every shape. With e4m3 widened by cvt.rn.f16x2.e4m3x2 and the producers' units fixed per K walk (H100, FP8,
/// M = 1): wkv 16.1 µs, wq_a 17.3, wo_b 51.9, w1/w3 19.1; direct wq_b 27.4. With the direct tile's ring (H100,
/// M = 1, FP8 / FP4, warp-specialised → direct): wo_b 51.7 → 49.0 / 67.1 → 40.7, w2 2304×5120 21.6 → 16.5 / 26.6 →
/// 14.8, but w1/w3 19.1 → 26.8 / 25.3 → 23.9, wq_a 17.3 → 26.3 / 23.1 → 23.4, wkv 15.9 → 26.3 / 21.2 → 23.2: kAuto
/// takes it from N = 4,096. The chain itself is ~4 µs at K = 5120 (mma.sync m16n8k16 issues every 25.5 cycles on
/// one dependent accumulator: scripts/device/mma_latency.sh), so the tiles are still ~4-6x above it.
enum class TcQuantPath : int { kAuto = -1, kRing = 0, kDirect = 1, kWarpSpec = 2 };
inline constexpr int64_t kTcDirectMinCols = 4096;
inline constexpr int64_t kTcDirectMaxRows = 4;
inline constexpr int64_t kTcDirectMaxXBytes = 48 * 1024;
/// Whether kDirect takes m rows of k: the x rows (k + 16 halves each) fit its shared-memory budget.
inline constexpr bool tc_quant_direct_fits(int64_t m, int64_t k) {
  return m >= 1 && m <= kTcDirectMaxRows && m * (k + 16) * 2 <= kTcDirectMaxXBytes;
}

struct LinearTcDesc {
  int64_t m = 0, n = 0, k = 0;
  TcMma mma = TcMma::kK16;
  TcTile tile = TcTile::kAuto;  // kAuto: tc_tile_for(m)
  TcSlab slab = TcSlab::kAuto;  // skinny tile only
  TcQuantPath quant = TcQuantPath::kAuto;  // block-scaled weights only
};

struct LinearTcArgs {
  Bf16 const* x = nullptr;  // [m, k], row stride ldx ≥ k (elements)
  Bf16 const* w = nullptr;  // [n, k], row stride ldw ≥ k
  float* y = nullptr;       // [m, n] fp32 accumulators, row stride ldy ≥ n; null = not written
  Bf16* y_bf16 = nullptr;   // [m, n] →bf16 (RNE) of the accumulators, row stride ldy_bf16 ≥ n; null = not written
  int64_t ldx = 0, ldw = 0, ldy = 0, ldy_bf16 = 0;
  bool y_round_bf16 = false;  // y holds →bf16(accumulator) widened to fp32 (ops::Linear's bf16-output rows)
  /// Block-scaled W instead of w (ops::is_block_scaled; the weight value is ops::scaled_weight, so the result is
  /// that of w holding those bf16 values): kF8E4m3 codes [n, k] with 32×32-block scales [⌈n/32⌉, ⌈k/32⌉], or
  /// kF4E2m1x2 codes [n, k/2] with per-row-per-32 scales [n, ⌈k/32⌉]. m16n8k16 only, see tc_quant_ok.
  DType w_format = DType::kBf16;
  uint8_t const* w_q = nullptr;      // row stride ldw_q bytes
  uint8_t const* w_scale = nullptr;  // row stride ldw_scale bytes
  int64_t ldw_q = 0, ldw_scale = 0;
};

/// The largest k a block-scaled call takes (its scales are held in shared memory for the whole K walk).
inline constexpr int64_t kTcQuantMaxK = 16384;

/// true when a block-scaled call can run fused (codes decoded to bf16 inside the tile: the skinny tiles of
/// linear_tc_quant*.cuh below kTcGemmMinRows, the GEMM tile of linear_tc_quant_gemm.cuh from there on): m16n8k16,
/// k % 32 == 0 and ≤ kTcQuantMaxK, 16-byte aligned codes with ldw_q % 16 == 0, 16-byte x staging.
/// ops::Linear<kCuda> dequantises to bf16 scratch and runs the bf16 path otherwise.
/// Whether the fused tile runs `w_format`: FP4 and FP8, each asserted bit for bit against ref::dot_tc on the H200
/// (verify_gpu_linear_scaled, verify_gpu_moe_scaled). A format enters this list only after those suites pass on
/// the device; until then ops::Linear runs it through the exact decode-to-bf16 path. (The FP8 tile's decode
/// indexes shared memory by (row, unit): nvcc 13.0.88 miscompiled the equivalent i·8 + j form in the unrolled
/// loop, scripts/nvcc/.)
bool tc_quant_format_fused(DType w_format);

inline bool tc_quant_weight_ok(LinearTcDesc const& d, DType w_format, uint8_t const* w_q, int64_t ldw_q) {
  if (!tc_quant_format_fused(w_format)) return false;
  return (w_format == DType::kF8E4m3 || w_format == DType::kF4E2m1x2) && d.mma == TcMma::kK16 &&
         d.k % 32 == 0 && d.k <= kTcQuantMaxK && ldw_q % 16 == 0 && (reinterpret_cast<uintptr_t>(w_q) & 15u) == 0;
}
inline bool tc_quant_ok(LinearTcDesc const& d, LinearTcArgs const& a) {
  return tc_quant_weight_ok(d, a.w_format, a.w_q, a.ldw_q) && a.w_scale != nullptr && a.ldx % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0;
}

/// The tile variant a descriptor asks for: its own choice, or kGemm for M ≥ kTcGemmMinRows and kSkinny below
/// (tc_tile_run says whether kAuto's kGemm runs as kWgmma).
inline TcTile tc_tile_for(LinearTcDesc const& d) {
  if (d.tile != TcTile::kAuto) return d.tile;
  return d.m >= kTcGemmMinRows ? TcTile::kGemm : TcTile::kSkinny;
}

/// true when x and W can be staged with 16-byte cp.async (K, ldx, ldw multiples of 8 elements and 16-byte
/// aligned base pointers: every 8-element chunk of a row then lies wholly inside or wholly past K); otherwise
/// the variant loads element by element (same arithmetic, slower staging).
inline bool tc_vec16(LinearTcDesc const& d, LinearTcArgs const& a) {
  auto aligned = [](void const* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return d.k % 8 == 0 && a.ldx % 8 == 0 && a.ldw % 8 == 0 && aligned(a.x) && aligned(a.w);
}

/// The tile a call runs: tc_tile_for, with kAuto's kGemm taken by kWgmma from kTcWgmmaMinRows rows when the
/// wgmma tile is available, the call is m16n8k16 with 16-byte staging (tc_vec16, or block-scaled W) and
/// TESSERA_TC_WGMMA is not 0 (read once; for A/B timings: the values never change, only the speed).
TcTile tc_tile_run(LinearTcDesc const& d, LinearTcArgs const& a);

/// "gemm/k16/vec16" and the like: the compiled variant a call runs (logs, tests, benches).
char const* linear_tc_variant_name(LinearTcDesc const& d, LinearTcArgs const& a);

/// The block-scaled tiles' decode, pair by pair, for exhaustive tests (host arrays of n; synchronous): out[i] =
/// the bf16x2 bits the tiles feed the mma for the two codes of pairs[i] (FP8: low byte k, high byte k + 1; FP4: the
/// low byte's two nibbles, low nibble k) under scale code scales[i]. Each half should be
/// bf16(ops::scaled_weight(...)) of its code.
Status decode_block_scaled_pairs_cuda(DType fmt, uint16_t const* pairs, uint8_t const* scales, uint32_t* out, int64_t n);

/// Runs the variant on ctx.stream (device pointers). Checks shapes and strides; M, N or K = 0 is allowed
/// (K = 0 writes +0).
Status linear_tc_cuda(LinearTcDesc const& d, LinearTcArgs const& a, ExecContext& ctx);

/// Several independent problems: one launch when there are 2..8 of them, all on the skinny tile with the same
/// mma and staging (grid.z = problem: small-N problems such as the grouped output projection's 8 × 1024
/// columns fill the GPU together), otherwise one linear_tc_cuda per problem. Values are those of the
/// problems' own launches.
Status linear_tc_cuda_batch(std::span<LinearTcDesc const> d, std::span<LinearTcArgs const> a, ExecContext& ctx);

}  // namespace tessera::ops

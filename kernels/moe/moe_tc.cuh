// SPDX-License-Identifier: Apache-2.0
/// Tensor-core expert GEMMs of MoeExperts<kCuda> (ops::MoeTcPath::kSkinny / kGemm; kernels in moe_tc_cuda.cu,
/// routing in moe_route_cuda.cu, tile table and combine in moe_cuda.cu). Used when the weights and the model dtype
/// are bf16 (block-scaled routed experts: decoded inside the tiles, or, when asked, to bf16 before the GEMM tiles).
///
/// Math (ref::moe_expert_row_accumulate with md = bf16, every dot ref::dot_tc):
///   act[slot, i] = →bf16(w·(silu(min(g, L))·clamp(u, ±L))),  g = →bf16(W1[i]·x_tok), u = →bf16(W3[i]·x_tok)
///   ybuf[slot, o] = →bf16(W2[o]·act[slot])
/// (w = the routing weight; none for the shared expert; L ≤ 0: no clamp). Each dot is one mma.sync register
/// chain over the K blocks in order (kernels/linear/linear_tc.cuh: skinny_warp_tile / gemm_block_tile), which
/// equals ref::dot_tc of the bf16 operands (verify_gpu_linear_tc, H200). The operands must BE the reference's:
/// W is stored as bf16; x is converted to bf16 (exact only when every x value is bf16-representable: the
/// precondition of ops::MoeTcPath); act values are →bf16 by construction, stored as bf16 here (exact). So the
/// act and ybuf values equal those of the emulated kernels and of the CPU op bit for bit, whatever the tile
/// a row shares or the launch shape: an output depends only on its own x row and W row.
///
/// Layouts: slot = token·(top_k + 1) + s (s < top_k routed, s = top_k the shared expert); x_bf16 [rows, dim];
/// act [rows·(top_k + 1), inter] bf16 bits; ybuf [rows·(top_k + 1), dim] fp32 (→bf16 values).
/// Tiles (built on the device by moe_cuda.cu's moe_tiles_kernel, no host synchronisation): tiles t <
/// max_routed_tiles hold ≤ tile_rows consecutive sorted assignments of one expert (t ≥ *num_tiles: no tile);
/// tiles t ≥ max_routed_tiles hold ≤ tile_rows consecutive tokens of the shared expert. A block without a tile
/// exits. Rows of a block tile past the tile's count are zero operands and are never stored.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessera/core/status.hpp"
#include "tessera/ops/moe.hpp"

namespace tessera::kernels::moe_tc {

inline constexpr int kSkinnyTileRows = 8;  // assignments per kSkinny tile (one warp: m16 fragment rows 0..7)
inline constexpr int kGemmTileRows = 128;  // assignments per kGemm tile (the 128-row block tile)

/// One tile: up to tile_rows consecutive sorted assignments [start, start + count) of `expert` (routed) —
/// or, for the shared expert (expert = −1), tokens [start, start + count).
struct TileInfo {
  int32_t expert;
  int32_t start;
  int32_t count;
  int32_t pad;
};

struct MoeTcParams {
  uint16_t const* x = nullptr;            // [rows, dim] bf16 bits of x
  float const* weights = nullptr;         // [rows, top_k] routing weights
  ops::MoeExpertsDeviceWeights w;         // bf16 weights
  uint32_t const* vals_sorted = nullptr;  // [rows·top_k] assignments a = token·top_k + s, grouped by expert
  TileInfo const* tiles = nullptr;        // [max_routed_tiles]
  int32_t const* num_tiles = nullptr;     // [1]
  uint16_t* act = nullptr;                // [rows·(top_k + 1), inter] bf16 bits
  float* ybuf = nullptr;                  // [rows·(top_k + 1), dim]
  int64_t rows = 0, dim = 0, inter = 0, top_k = 1, max_routed_tiles = 0;
  int tile_rows = kSkinnyTileRows;  // kSkinnyTileRows (launch_skinny) or kGemmTileRows (launch_gemm)
  float limit = 0.f;
  bool shared = true;
  /// kF8E4m3 / kF4E2m1x2: routed tiles read block-scaled codes (w.w1/w3/w2) and scales (w.s1/s3/s2) and run in
  /// their own launches (kernels/linear/linear_tc_quant.cuh's tile); the shared expert's tiles stay bf16.
  DType routed_scaled = DType::kBf16;
  /// kF8E4m3 / kF4E2m1x2 (needs routed_scaled): the shared expert's token tiles read block-scaled codes
  /// (w.shared_w1/w3/w2) and scales (w.shared_s1/s3/s2) on the block-scaled tiles of that format, in launches of
  /// their own (launch_skinny, and launch_gemm_scaled on the wgmma tiles); launch_gemm, launch_gemm_decoded and
  /// launch_gemm_scaled on the mma.sync tiles take bf16 shared weights: the caller decodes them first.
  DType shared_scaled = DType::kBf16;
  int64_t tile0 = 0;  // the launch's first tile: blockIdx.y + tile0 is the tile index
  int32_t expert_lo = 0, expert_hi = 0x7FFFFFFF;  // routed tiles of experts outside [lo, hi) are skipped
  bool direct_ok = true;  // block-scaled routed tiles may take the direct (one warp per 8 columns) kernels
  bool warp_spec = false;  // block-scaled routed tiles take the warp-specialised kernels (linear_tc_quant_ws.cuh)
  /// wgmma kGemm tiles: a warpgroup whose 64 rows lie past the tile's count issues no wgmma (same values;
  /// the MoE op sets it unless TESSERA_MOE_WG_SKIP=0).
  bool wg_skip_idle = false;
};

/// xb[i] = →bf16(x[i]) (RNE) for i < n.
Status launch_convert_x(float const* x, uint16_t* xb, int64_t n, cudaStream_t st);
/// act then ybuf, tiles of ≤ kSkinnyTileRows assignments: grid (⌈N/8⌉, tiles), one warp per block.
Status launch_skinny(MoeTcParams const& p, cudaStream_t st);
/// act then ybuf, tiles of ≤ kGemmTileRows assignments: grid (⌈N/128⌉, tiles), 8 warps per block.
Status launch_gemm(MoeTcParams const& p, cudaStream_t st);
/// launch_gemm for block-scaled routed experts (p.routed_scaled): the routed tiles decode their W codes per K slab
/// (kernels/linear/linear_tc_quant_gemm.cuh); the shared expert's tiles decode its own codes on the wgmma tiles
/// (sm_90a), else run the bf16 kernels. Same values as launch_gemm_decoded, without the decoded copy of every expert.
Status launch_gemm_scaled(MoeTcParams const& p, cudaStream_t st);
/// launch_gemm for block-scaled routed experts (p.routed_scaled): per group of `group` experts in expert order,
/// their W1 / W3 / W2 decoded to bf16 (ops::scaled_weight, the values the skinny tiles use) into stream-ordered
/// memory, then launch_gemm restricted to the group's tiles (the shared expert's tiles with the first group).
Status launch_gemm_decoded(MoeTcParams const& p, int64_t experts, int64_t group, cudaStream_t st);
/// The block-scaled shared expert (p.shared_scaled) decoded to bf16 (ops::scaled_weight, the values its skinny
/// tiles use): W1 at out, W3 at out + inter·dim, W2 at out + 2·inter·dim; the bf16 weights of launch_gemm*.
Status launch_decode_shared(MoeTcParams const& p, uint16_t* out, cudaStream_t st);

}  // namespace tessera::kernels::moe_tc

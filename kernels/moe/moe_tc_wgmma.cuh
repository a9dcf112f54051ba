// SPDX-License-Identifier: Apache-2.0
/// The expert GEMMs of moe_tc_cuda.cu on the wgmma tile (kernels/linear/linear_tc_wgmma.cuh, sm_90a): the kGemm
/// tiles' work (≤ 128 assignments per tile, x rows gathered through the tile table) with a 128 × 256 block tile,
/// 2 warpgroups, one m64n256k16 per 16-wide K block. Same contract as the mma.sync kernels (every output one fp32
/// chain over the K blocks in order), so act and ybuf hold the same bits. Included by moe_tc_cuda.cu inside its
/// anonymous namespace (Tile, RowInfo, tile_at, row_info, expert_w, aligned16, act_bits, tile_q, gemm_rows).
///   act:  gate launch stores →bf16(g) into act; the up launch puts →bf16(u) of the block in shared memory (the
///         free staging ring: 128 × 256 × 2 B = 64 KiB) and replaces each g in act by the activation.
///   down: ybuf[slot] ← →bf16 of W2 · act.
#pragma once

/// f(row, column within the block tile, accumulator) for this thread's outputs of the m64n256k16 layout with
/// row < count and column < cols.
template <class F>
__device__ __forceinline__ void wg_for_each(float const (&acc)[128], int count, int cols, F&& f) {
  int const tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  int const row0 = (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2), col0 = 2 * (lane & 3);
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    int const row = row0 + ((i >> 1) & 1) * 8, lc = 8 * (i >> 2) + col0 + (i & 1);
    if (row < count && lc < cols) f(row, lc, acc[i]);
  }
}
/// wg_for_each's positions as a loop that is not unrolled (f(row, column)).
template <class F>
__device__ __forceinline__ void wg_for_each_slow(int count, int cols, F&& f) {
  int const tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  int const row0 = (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2), col0 = 2 * (lane & 3);
#pragma unroll 1
  for (int i = 0; i < 128; ++i) {
    int const row = row0 + ((i >> 1) & 1) * 8, lc = 8 * (i >> 2) + col0 + (i & 1);
    if (row < count && lc < cols) f(row, lc);
  }
}

/// The rows of tile t whose wgmma issue wg_pass keeps: its count with MoeTcParams::wg_skip_idle, else all.
__device__ __forceinline__ int wg_live_rows(MoeTcParams const& p, Tile const& t) {
  return p.wg_skip_idle ? t.count : kWgBM;
}

/// One wgmma block tile over the tile's gathered rows (x_row(rows_s[r]) for r < count, +0 past it) against W rows
/// n0 .. n0 + 255 of n (bf16 `w` with row stride k, or the block-scaled `q`), K = k. live_rows: wgmma_block_tile's
/// (the tile's count when MoeTcParams::wg_skip_idle, else all 128 rows).
template <DType kFmt, bool kVec16, class XRow>
__device__ __forceinline__ void wg_pass(Tile const& t, RowInfo const* rows_s, XRow const& x_row, unsigned char* smem,
                                        uint16_t const* w, QuantW const& q, int64_t n0, int64_t n, int64_t k,
                                        float (&acc)[128], int live_rows) {
  int const tid = static_cast<int>(threadIdx.x);
  uint16_t const* xrow[kWgXRowsPerThread];
  bool xok[kWgXRowsPerThread];
#pragma unroll
  for (int i = 0; i < kWgXRowsPerThread; ++i) {
    int const r = (tid >> 3) + 32 * i;
    xok[i] = r < t.count;
    xrow[i] = x_row(rows_s[xok[i] ? r : 0]);
  }
  wgmma_block_tile<kFmt, kVec16, true>(smem, xrow, xok, w, k, q, n0, n, k, acc, live_rows);
}

/// The act epilogue of the block tile at n0 (smem free: wgmma_block_tile ends with a barrier).
template <bool kUp>
__device__ __forceinline__ void wg_act_epilogue(MoeTcParams const& p, Tile const& t, RowInfo const* rows_s, unsigned char* smem,
                                                int64_t n0, float const (&acc)[128]) {
  int const cols = static_cast<int>(p.inter - n0 < kWgBN ? p.inter - n0 : kWgBN);
  auto out = [&](int row) { return p.act + static_cast<int64_t>(rows_s[row].slot) * p.inter + n0; };
  if constexpr (!kUp) {
    wg_for_each(acc, t.count, cols, [&](int row, int lc, float g) { out(row)[lc] = bf16_bits_from_float(g); });
  } else {
    auto* const us = reinterpret_cast<uint16_t*>(smem + 1024);  // past the alignment slack: any 16-byte address works
    wg_for_each(acc, t.count, cols, [&](int row, int lc, float u) { us[row * kWgBN + lc] = bf16_bits_from_float(u); });
    bool const routed = t.expert >= 0;
    wg_for_each_slow(t.count, cols, [&](int row, int lc) {
      uint16_t* const dst = out(row) + lc;
      float const u = float_from_bf16_bits(us[row * kWgBN + lc]);
      *dst = act_bits(float_from_bf16_bits(*dst), u, p.limit, routed, rows_s[row].wt);
    });
  }
}

/// act (kUp = false: gate; true: up and the activation) on the wgmma tile: W1 / W3 of the tile's expert (the shared
/// expert's for t.expert < 0), bf16 for kFmt kBf16, else codes of kFmt (tile_q: a launch over routed tiles has kFmt =
/// p.routed_scaled, one over the shared expert's tiles kFmt = p.shared_scaled).
template <DType kFmt, bool kUp>
__global__ void __launch_bounds__(kWgThreads, 1) moe_tc_act_wgmma_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char act_wgmma_smem[];
  __shared__ RowInfo rows_s[kGemmTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;  // block-uniform
  gemm_rows(p, t, rows_s);
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kWgBN;
  auto x_row = [&](RowInfo const& ri) { return p.x + static_cast<int64_t>(ri.token) * p.dim; };
  float acc[128];
  if constexpr (kFmt == DType::kBf16) {
    uint16_t const* const w = kUp ? expert_w(p.w.w3, p.w.shared_w3, t.expert) : expert_w(p.w.w1, p.w.shared_w1, t.expert);
    if (p.dim % 8 == 0 && aligned16(w))
      wg_pass<kFmt, true>(t, rows_s, x_row, act_wgmma_smem, w, QuantW{}, n0, p.inter, p.dim, acc, wg_live_rows(p, t));
    else
      wg_pass<kFmt, false>(t, rows_s, x_row, act_wgmma_smem, w, QuantW{}, n0, p.inter, p.dim, acc, wg_live_rows(p, t));
  } else {
    QuantW const q = tile_q<kFmt>(p, t, kUp ? 1 : 0, p.dim);
    wg_pass<kFmt, true>(t, rows_s, x_row, act_wgmma_smem, nullptr, q, n0, p.inter, p.dim, acc, wg_live_rows(p, t));
  }
  wg_act_epilogue<kUp>(p, t, rows_s, act_wgmma_smem, n0, acc);
}

/// down on the wgmma tile: ybuf[slot] ← →bf16(W2 · act[slot]) (W2 as the act kernel reads W1 / W3).
template <DType kFmt>
__global__ void __launch_bounds__(kWgThreads, 1) moe_tc_down_wgmma_kernel(MoeTcParams const p) {
  device::pdl_enter();
  extern __shared__ __align__(16) unsigned char down_wgmma_smem[];
  __shared__ RowInfo rows_s[kGemmTileRows];
  Tile t;
  if (!tile_at(p, p.tile0 + blockIdx.y, t)) return;
  gemm_rows(p, t, rows_s);
  int64_t const n0 = static_cast<int64_t>(blockIdx.x) * kWgBN;
  auto x_row = [&](RowInfo const& ri) { return p.act + static_cast<int64_t>(ri.slot) * p.inter; };
  float acc[128];
  if constexpr (kFmt == DType::kBf16) {
    uint16_t const* const w2 = expert_w(p.w.w2, p.w.shared_w2, t.expert);
    if (p.inter % 8 == 0 && aligned16(w2))
      wg_pass<kFmt, true>(t, rows_s, x_row, down_wgmma_smem, w2, QuantW{}, n0, p.dim, p.inter, acc, wg_live_rows(p, t));
    else
      wg_pass<kFmt, false>(t, rows_s, x_row, down_wgmma_smem, w2, QuantW{}, n0, p.dim, p.inter, acc, wg_live_rows(p, t));
  } else {
    wg_pass<kFmt, true>(t, rows_s, x_row, down_wgmma_smem, nullptr, tile_q<kFmt>(p, t, 2, p.inter), n0, p.dim, p.inter,
                        acc, wg_live_rows(p, t));
  }
  int const cols = static_cast<int>(p.dim - n0 < kWgBN ? p.dim - n0 : kWgBN);
  wg_for_each(acc, t.count, cols, [&](int row, int lc, float y) {
    p.ybuf[static_cast<int64_t>(rows_s[row].slot) * p.dim + n0 + lc] = device::round_md(y, true);
  });
}

/// Phase 0 (gate), 1 (up and the activation) or 2 (down) of the shared expert's gs tiles from ps.tile0, W in kShared.
template <DType kShared>
Status launch_wgmma_shared(MoeTcParams const& ps, int64_t ga, int64_t gd, int64_t gs, int phase, cudaStream_t st) {
  constexpr size_t kSmem = wgmma_smem_bytes<kShared>();
  dim3 const grid(static_cast<unsigned>(phase == 2 ? gd : ga), static_cast<unsigned>(gs));
  if (phase == 2) {
    TESSERA_TRY(cuda_status(allow_smem<moe_tc_down_wgmma_kernel<kShared>>(kSmem), "moe_tc down wgmma: shared memory attribute"));
    device::launch_pdl(moe_tc_down_wgmma_kernel<kShared>, grid, kWgThreads, kSmem, st, ps);
    return launch_status("moe_tc_down_wgmma_kernel<shared>");
  }
  if (phase == 0) {
    TESSERA_TRY(cuda_status(allow_smem<moe_tc_act_wgmma_kernel<kShared, false>>(kSmem), "moe_tc gate wgmma: shared memory attribute"));
    device::launch_pdl(moe_tc_act_wgmma_kernel<kShared, false>, grid, kWgThreads, kSmem, st, ps);
    return launch_status("moe_tc_act_wgmma_kernel<gate, shared>");
  }
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_act_wgmma_kernel<kShared, true>>(kSmem), "moe_tc act wgmma: shared memory attribute"));
  device::launch_pdl(moe_tc_act_wgmma_kernel<kShared, true>, grid, kWgThreads, kSmem, st, ps);
  return launch_status("moe_tc_act_wgmma_kernel<up, shared>");
}

/// The launches of one MoE GEMM step on the wgmma tile: routed tiles of kFmt (kBf16: routed and shared alike, from
/// tile p.tile0), the shared expert's tiles in launches of their own when kFmt is block-scaled: on its codes when
/// p.shared_scaled is block-scaled too, else bf16. Gate before up for every tile (up reads the g its tile's gate
/// launch stored), then down.
template <DType kFmt>
Status launch_wgmma(MoeTcParams const& p, cudaStream_t st) {
  constexpr size_t kSmem = wgmma_smem_bytes<kFmt>();
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_act_wgmma_kernel<kFmt, false>>(kSmem), "moe_tc gate wgmma: shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_act_wgmma_kernel<kFmt, true>>(kSmem), "moe_tc act wgmma: shared memory attribute"));
  TESSERA_TRY(cuda_status(allow_smem<moe_tc_down_wgmma_kernel<kFmt>>(kSmem), "moe_tc down wgmma: shared memory attribute"));
  constexpr bool kQuant = kFmt != DType::kBf16;
  // Block-scaled: routed tiles [0, max_routed_tiles) here, the shared expert's from max_routed_tiles in launches of
  // their own (its format); bf16: every tile in one launch.
  int64_t const gr = kQuant ? p.max_routed_tiles : grid_tiles(p);
  int64_t const gs = kQuant && p.shared ? ceil_div(p.rows, p.tile_rows) : 0;
  int64_t const ga = ceil_div(p.inter, kWgBN), gd = ceil_div(p.dim, kWgBN);
  TESSERA_TRY(check_grid(ga, std::max(gr, gs), "moe_tc act wgmma"));
  TESSERA_TRY(check_grid(gd, std::max(gr, gs), "moe_tc down wgmma"));
  MoeTcParams ps = p;  // the shared expert's tiles: indices max_routed_tiles …
  ps.tile0 = p.max_routed_tiles;
  auto grid = [](int64_t x, int64_t y) { return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y)); };
  // The shared expert's launch of each phase follows the routed one (its g before its up, its act before its down).
  auto shared_phase = [&](int phase) -> Status {
    if constexpr (kQuant) {
      if (gs <= 0) return {};
      if (p.shared_scaled == DType::kF8E4m3) return launch_wgmma_shared<DType::kF8E4m3>(ps, ga, gd, gs, phase, st);
      if (p.shared_scaled == DType::kF4E2m1x2) return launch_wgmma_shared<DType::kF4E2m1x2>(ps, ga, gd, gs, phase, st);
      return launch_wgmma_shared<DType::kBf16>(ps, ga, gd, gs, phase, st);
    }
    return {};
  };
  if (gr > 0) {
    device::launch_pdl(moe_tc_act_wgmma_kernel<kFmt, false>, grid(ga, gr), kWgThreads, kSmem, st, p);
    TESSERA_TRY(launch_status("moe_tc_act_wgmma_kernel<gate>"));
  }
  TESSERA_TRY(shared_phase(0));
  if (gr > 0) {
    device::launch_pdl(moe_tc_act_wgmma_kernel<kFmt, true>, grid(ga, gr), kWgThreads, kSmem, st, p);
    TESSERA_TRY(launch_status("moe_tc_act_wgmma_kernel<up>"));
  }
  TESSERA_TRY(shared_phase(1));
  if (gr > 0) {
    device::launch_pdl(moe_tc_down_wgmma_kernel<kFmt>, grid(gd, gr), kWgThreads, kSmem, st, p);
    TESSERA_TRY(launch_status("moe_tc_down_wgmma_kernel"));
  }
  return shared_phase(2);
}

// SPDX-License-Identifier: Apache-2.0
/// Host side of the tensor-core bf16 linear (include/tessera/ops/linear_tc.hpp): argument checks, the choice of
/// one of the 8 compiled variants {gemm, skinny} × {m16n8k16, 2 × m16n8k8} × {16-byte cp.async, element loads}
/// from the descriptor and the operands' alignment (plus the K-slab variants of the skinny tile and its
/// block-scaled FP8 / FP4 forms: the ring, direct and warp-specialised tiles of linear_tc_quant*.cuh), and the launch.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <span>
#include <string>

#include "kernels/common/cuda_util.cuh"
#include "kernels/linear/linear_tc.cuh"
#include "kernels/linear/linear_tc_quant.cuh"
#include "kernels/linear/linear_tc_quant_direct.cuh"
#include "kernels/linear/linear_tc_quant_gemm.cuh"
#include "kernels/linear/linear_tc_quant_ws.cuh"
#include "kernels/linear/linear_tc_wgmma.cuh"

namespace tessera::kernels::tc_linear {

bool direct_ring_codes(int64_t k) {
  static bool const ring = [] {
    char const* e = std::getenv("TESSERA_TC_DIRECT_RING");
    return !(e && std::string(e) == "0");
  }();
  return ring && k >= kDirectRingMinK;
}

namespace {

using Kernel = void (*)(TcLinearParams);

template <TcMma kMma, bool kVec16>
Status launch_gemm(TcLinearParams const& p, cudaStream_t stream) {
  constexpr Kernel kKernel = linear_tc_gemm_kernel<kMma, kVec16>;
  TESSERA_TRY(cuda_status(allow_smem<kKernel>(kGemmSmemBytes), "linear_tc gemm: shared memory attribute"));
  int64_t const blocks = ceil_div(p.m, kGemmBM) * ceil_div(p.n, kGemmBN);
  if (blocks > 0x7FFFFFFF) return invalid_argument("linear_tc gemm: more than 2^31 − 1 tiles");
  device::launch_pdl(kKernel, static_cast<unsigned>(blocks), kGemmWarps * 32, kGemmSmemBytes, stream, p);
  return launch_status("linear_tc_gemm_kernel");
}

/// Block-scaled W on the GEMM tile (linear_tc_quant_gemm.cuh): the codes decoded per K slab inside the block.
template <DType kFmt>
Status launch_gemm_q(TcLinearParams const& p, cudaStream_t stream) {
  constexpr Kernel kKernel = linear_tc_gemm_q_kernel<kFmt>;
  TESSERA_TRY(cuda_status(allow_smem<kKernel>(gemm_q_smem_bytes<kFmt>()), "linear_tc gemm (block-scaled): shared memory attribute"));
  int64_t const blocks = ceil_div(p.m, kGemmBM) * ceil_div(p.n, kGemmBN);
  if (blocks > 0x7FFFFFFF) return invalid_argument("linear_tc gemm: more than 2^31 − 1 tiles");
  device::launch_pdl(kKernel, static_cast<unsigned>(blocks), kGemmWarps * 32, gemm_q_smem_bytes<kFmt>(), stream, p);
  return launch_status("linear_tc_gemm_q_kernel");
}

template <TcMma kMma, bool kVec16>
Status launch_skinny(TcLinearParams const& p, cudaStream_t stream) {
  constexpr Kernel kKernel = linear_tc_skinny_kernel<kMma, kVec16>;
  TESSERA_TRY(cuda_status(allow_smem<kKernel>(skinny_smem_bytes(kSkinnyRows)), "linear_tc skinny: shared memory attribute"));
  int64_t const gx = ceil_div(p.n, kSkinnyCols), gy = ceil_div(p.m, kSkinnyRows);
  if (gx > 0x7FFFFFFF || gy > 65535) return invalid_argument("linear_tc skinny: grid too large");
  device::launch_pdl(kKernel, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), 32, skinny_smem_bytes(p.m),
                     stream, p);
  return launch_status("linear_tc_skinny_kernel");
}

using Launch = Status (*)(TcLinearParams const&, cudaStream_t);

/// The wgmma tile (linear_tc_wgmma.cuh): kFmt kBf16 (W bf16, kVec16 or element staging) or block-scaled codes.
template <DType kFmt, bool kVec16>
Status launch_wgmma(TcLinearParams const& p, cudaStream_t stream) {
  constexpr Kernel kKernel = linear_tc_wgmma_kernel<kFmt, kVec16>;
  constexpr size_t kSmem = wgmma_smem_bytes<kFmt>();
  TESSERA_TRY(cuda_status(allow_smem<kKernel>(kSmem), "linear_tc wgmma: shared memory attribute"));
  int64_t const blocks = ceil_div(p.m, kWgBM) * ceil_div(p.n, kWgBN);
  if (blocks > 0x7FFFFFFF) return invalid_argument("linear_tc wgmma: more than 2^31 − 1 tiles");
  device::launch_pdl(kKernel, static_cast<unsigned>(blocks), kWgThreads, kSmem, stream, p);
  return launch_status("linear_tc_wgmma_kernel");
}

/// Block-scaled W on the skinny tile (linear_tc_quant.cuh).
template <DType kFmt>
Status launch_skinny_q(TcLinearParams const& p, cudaStream_t stream) {
  constexpr Kernel kKernel = linear_tc_skinny_q_kernel<kFmt>;
  TESSERA_TRY(cuda_status(allow_smem<kKernel>(skinny_q_launch_smem<kFmt>(kSkinnyRows, ops::kTcQuantMaxK)),
                          "linear_tc skinny (block-scaled): shared memory attribute"));
  int64_t const gx = ceil_div(p.n, kSkinnyCols), gy = ceil_div(p.m, kSkinnyRows);
  if (gx > 0x7FFFFFFF || gy > 65535) return invalid_argument("linear_tc skinny: grid too large");
  device::launch_pdl(kKernel, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), 32,
                     skinny_q_launch_smem<kFmt>(p.m, p.k), stream, p);
  return launch_status("linear_tc_skinny_q_kernel");
}

/// Block-scaled W on the direct tile (linear_tc_quant_direct.cuh; codes through its ring from K = 2048, else loaded
/// into registers): M ≤ kTcDirectMaxRows, one row group.
template <DType kFmt, bool kRing>
Status launch_skinny_qd_with(TcLinearParams const& p, cudaStream_t stream) {
  constexpr Kernel kKernel = linear_tc_skinny_qd_kernel<kFmt, kRing>;
  TESSERA_TRY(cuda_status(allow_smem<kKernel>(skinny_qd_max_smem_bytes<kFmt>(1)),
                          "linear_tc skinny (block-scaled, direct): shared memory attribute"));
  int64_t const gx = ceil_div(p.n, kSkinnyCols);
  if (gx > 0x7FFFFFFF) return invalid_argument("linear_tc skinny: grid too large");
  device::launch_pdl(kKernel, static_cast<unsigned>(gx), 32, skinny_qd_smem_bytes<kFmt>(1, p.m, p.k, kRing), stream, p);
  return launch_status("linear_tc_skinny_qd_kernel");
}
template <DType kFmt>
Status launch_skinny_qd(TcLinearParams const& p, cudaStream_t stream) {
  return direct_ring_codes(p.k) ? launch_skinny_qd_with<kFmt, true>(p, stream) : launch_skinny_qd_with<kFmt, false>(p, stream);
}

/// Block-scaled W, warp-specialised (linear_tc_quant_ws.cuh): kRaw-deep code ring.
template <DType kFmt, int kRaw>
Status launch_skinny_ws_raw(TcLinearParams const& p, cudaStream_t stream) {
  constexpr Kernel kKernel = linear_tc_skinny_ws_kernel<kFmt, kRaw>;
  TESSERA_TRY(cuda_status(allow_smem<kKernel>(skinny_ws_smem_bytes<kFmt>(1, kRaw, kSkinnyRows, ops::kTcQuantMaxK)),
                          "linear_tc skinny (block-scaled, warp-specialised): shared memory attribute"));
  int64_t const gx = ceil_div(p.n, kSkinnyCols), gy = ceil_div(p.m, kSkinnyRows);
  if (gx > 0x7FFFFFFF || gy > 65535) return invalid_argument("linear_tc skinny: grid too large");
  device::launch_pdl(kKernel, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kWsThreads,
                     skinny_ws_launch_smem<kFmt>(p.m, p.k), stream, p);
  return launch_status("linear_tc_skinny_ws_kernel");
}
template <DType kFmt>
Status launch_skinny_ws(TcLinearParams const& p, cudaStream_t stream) {
  return ws_raw_stages(std::min<int64_t>(p.m, kSkinnyRows)) == kWsRawDeep ? launch_skinny_ws_raw<kFmt, kWsRawDeep>(p, stream)
                                                                          : launch_skinny_ws_raw<kFmt, kWsRawShallow>(p, stream);
}

/// The path a block-scaled call takes. kDirect when asked for and it fits; kAuto takes it for wide matrices
/// (N ≥ kTcDirectMinCols, enough warps to cover its per-warp latency) and kWarpSpec for the rest (kRing when
/// TESSERA_TC_WS=0: the values never change, only the speed). A kDirect request that does not fit runs kRing here
/// (batches); linear_tc_cuda refuses it.
ops::TcQuantPath quant_path(ops::LinearTcDesc const& d) {
  static bool const ws_auto = [] {
    char const* e = std::getenv("TESSERA_TC_WS");
    return !(e && std::string(e) == "0");
  }();
  bool const fits = ops::tc_quant_direct_fits(d.m, d.k) && (d.tile == ops::TcTile::kAuto || d.tile == ops::TcTile::kSkinny);
  if (d.quant == ops::TcQuantPath::kDirect) return fits ? ops::TcQuantPath::kDirect : ops::TcQuantPath::kRing;
  if (d.quant != ops::TcQuantPath::kAuto) return d.quant;
  if (fits && d.n >= ops::kTcDirectMinCols) return ops::TcQuantPath::kDirect;
  return ws_auto ? ops::TcQuantPath::kWarpSpec : ops::TcQuantPath::kRing;
}
bool quant_direct(ops::LinearTcDesc const& d) { return quant_path(d) == ops::TcQuantPath::kDirect; }

/// Skinny with another K slab / ring depth (m16n8k16 only): the same launch with kBK-wide slabs in kStages.
template <bool kVec16, int kBK, int kStages>
Status launch_skinny_slab(TcLinearParams const& p, cudaStream_t stream) {
  constexpr Kernel kKernel = linear_tc_skinny_kernel<TcMma::kK16, kVec16, kBK, kStages>;
  auto const bytes = [&](int64_t m) { return skinny_tile_smem_bytes(1, kStages, m < kSkinnyRows ? m : kSkinnyRows, kBK); };
  TESSERA_TRY(cuda_status(allow_smem<kKernel>(bytes(kSkinnyRows)), "linear_tc skinny: shared memory attribute"));
  int64_t const gx = ceil_div(p.n, kSkinnyCols), gy = ceil_div(p.m, kSkinnyRows);
  if (gx > 0x7FFFFFFF || gy > 65535) return invalid_argument("linear_tc skinny: grid too large");
  device::launch_pdl(kKernel, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), 32, bytes(p.m), stream, p);
  return launch_status("linear_tc_skinny_kernel");
}

/// Indexed [slab][vec16] for TcSlab k256x8, k512x4, k1024x3, k512x6.
constexpr Launch kSkinnySlab[4][2] = {
    {launch_skinny<TcMma::kK16, false>, launch_skinny<TcMma::kK16, true>},
    {launch_skinny_slab<false, 512, 4>, launch_skinny_slab<true, 512, 4>},
    {launch_skinny_slab<false, 1024, 3>, launch_skinny_slab<true, 1024, 3>},
    {launch_skinny_slab<false, 512, 6>, launch_skinny_slab<true, 512, 6>},
};

/// The compiled set, indexed [tile][mma][vec16].
constexpr Launch kLaunch[2][2][2] = {
    {{launch_gemm<TcMma::kK16, false>, launch_gemm<TcMma::kK16, true>},
     {launch_gemm<TcMma::kK8x2, false>, launch_gemm<TcMma::kK8x2, true>}},
    {{launch_skinny<TcMma::kK16, false>, launch_skinny<TcMma::kK16, true>},
     {launch_skinny<TcMma::kK8x2, false>, launch_skinny<TcMma::kK8x2, true>}},
};

/// decode_block_scaled_pairs_cuda: pair i through the tiles' decode helpers. FP4: the byte through both halves of
/// bf16x2_from_e2m1x4 (codes 0, 1 and 2, 3 of b · 0x101); halves that disagree give 0xDEADBEEF, which no pair
/// decodes to (e2m1 values have two significant bits).
__global__ void decode_pairs_kernel(DType fmt, uint16_t const* pairs, uint8_t const* scales, uint32_t* out, int64_t n) {
  device::pdl_enter();
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint8_t const sb = scales[i];
  if (fmt == DType::kF8E4m3) {
    out[i] = scaled_e4m3x2(pairs[i], float_from_e8m0(sb));
  } else {
    uint32_t p01 = 0, p23 = 0;
    bf16x2_from_e2m1x4((pairs[i] & 0xFFu) * 0x101u, p01, p23);
    out[i] = p01 == p23 ? scaled_e2m1x2(p01, e8m0_bf16x2(sb)) : 0xDEADBEEFu;
  }
}

}  // namespace
}  // namespace tessera::kernels::tc_linear

namespace tessera::ops {

Status decode_block_scaled_pairs_cuda(DType fmt, uint16_t const* pairs, uint8_t const* scales, uint32_t* out, int64_t n) {
  using kernels::cuda_status;
  if (fmt != DType::kF8E4m3 && fmt != DType::kF4E2m1x2)
    return invalid_argument("decode_block_scaled_pairs_cuda: FP8 e4m3 or FP4 e2m1 only");
  if (n <= 0) return {};
  uint16_t* dp = nullptr;
  uint8_t* ds = nullptr;
  uint32_t* dout = nullptr;
  auto release = [&] { cudaFree(dp), cudaFree(ds), cudaFree(dout); };
  size_t const un = static_cast<size_t>(n);
  cudaError_t e = cudaMalloc(&dp, un * 2);
  if (e == cudaSuccess) e = cudaMalloc(&ds, un);
  if (e == cudaSuccess) e = cudaMalloc(&dout, un * 4);
  if (e == cudaSuccess) e = cudaMemcpy(dp, pairs, un * 2, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(ds, scales, un, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    kernels::tc_linear::decode_pairs_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(fmt, dp, ds, dout, n);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(out, dout, un * 4, cudaMemcpyDeviceToHost);
  release();
  return cuda_status(e, "decode_block_scaled_pairs_cuda");
}

TcSlab tc_default_slab() {
  static TcSlab const slab = [] {
    char const* e = std::getenv("TESSERA_TC_SLAB");
    if (!e) return kTcDefaultSlab;
    std::string const v(e);
    if (v == "256x8") return TcSlab::k256x8;
    if (v == "512x4") return TcSlab::k512x4;
    if (v == "1024x3") return TcSlab::k1024x3;
    if (v == "512x6") return TcSlab::k512x6;
    return kTcDefaultSlab;
  }();
  return slab;
}

}  // namespace tessera::ops

namespace tessera::ops {

bool tc_wgmma_available() {
#if defined(TESSERA_SM90A)
  // Per device: 0 unknown, 1 yes, 2 no. Atomic: thread ranks ask concurrently (each writes the same answer).
  static std::atomic<int> cached[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return false;
  if (dev >= 64) return false;
  int known = cached[dev].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0, minor = 0;
    bool const ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
    known = ok && major == 9 && minor == 0 ? 1 : 2;
    cached[dev].store(known, std::memory_order_relaxed);
  }
  return known == 1;
#else
  return false;
#endif
}

bool tc_wgmma_auto() {
  static bool const env_on = [] {
    char const* e = std::getenv("TESSERA_TC_WGMMA");
    return !(e && std::string(e) == "0");
  }();
  return env_on && tc_wgmma_available();
}

TcTile tc_tile_run(LinearTcDesc const& d, LinearTcArgs const& a) {
  TcTile const t = tc_tile_for(d);
  if (d.tile != TcTile::kAuto || t != TcTile::kGemm || d.m < kTcWgmmaMinRows || d.mma != TcMma::kK16) return t;
  if (a.w_format != DType::kBf16 && d.m < kTcWgmmaScaledMinRows) return t;
  bool const staged16 = a.w_format != DType::kBf16 ? tc_quant_ok(d, a) : tc_vec16(d, a);
  return staged16 && tc_wgmma_auto() ? TcTile::kWgmma : t;
}

char const* linear_tc_variant_name(LinearTcDesc const& d, LinearTcArgs const& a) {
  static char const* const names[2][2][2] = {
      {{"gemm/k16/elem", "gemm/k16/vec16"}, {"gemm/k8x2/elem", "gemm/k8x2/vec16"}},
      {{"skinny/k16/elem", "skinny/k16/vec16"}, {"skinny/k8x2/elem", "skinny/k8x2/vec16"}}};
  static char const* const slab_names[4][2] = {{"skinny/k16/elem", "skinny/k16/vec16"},
                                               {"skinny/k16/elem/s512x4", "skinny/k16/vec16/s512x4"},
                                               {"skinny/k16/elem/s1024x3", "skinny/k16/vec16/s1024x3"},
                                               {"skinny/k16/elem/s512x6", "skinny/k16/vec16/s512x6"}};
  TcTile const tile = tc_tile_run(d, a);
  bool const wg = tile == TcTile::kWgmma;
  if (a.w_format == DType::kF8E4m3)
    return !tc_quant_ok(d, a) ? "unsupported/fp8" : wg ? "wgmma/k16/fp8" : tile == TcTile::kGemm ? "gemm/k16/fp8" : "skinny/k16/fp8";
  if (a.w_format == DType::kF4E2m1x2)
    return !tc_quant_ok(d, a) ? "unsupported/fp4" : wg ? "wgmma/k16/fp4" : tile == TcTile::kGemm ? "gemm/k16/fp4" : "skinny/k16/fp4";
  if (wg) return tc_vec16(d, a) ? "wgmma/k16/vec16" : "wgmma/k16/elem";
  TcSlab const slab = d.slab == TcSlab::kAuto ? tc_default_slab() : d.slab;
  if (tc_tile_for(d) == TcTile::kSkinny && d.mma == TcMma::kK16 && static_cast<int>(slab) >= 0 && static_cast<int>(slab) < 4)
    return slab_names[static_cast<int>(slab)][tc_vec16(d, a) ? 1 : 0];
  return names[static_cast<int>(tc_tile_for(d))][static_cast<int>(d.mma)][tc_vec16(d, a) ? 1 : 0];
}

namespace {
/// Checks one problem and fills its kernel parameters; `empty` when M or N is 0 (nothing to launch).
Status tc_params(LinearTcDesc const& d, LinearTcArgs const& a, kernels::tc_linear::TcLinearParams& p, bool& empty) {
  using namespace kernels::tc_linear;
  empty = false;
  if (d.m < 0 || d.n < 0 || d.k < 0) return invalid_argument("linear_tc: negative dimension");
  if (d.mma != TcMma::kK16 && d.mma != TcMma::kK8x2) return invalid_argument("linear_tc: unknown mma");
  TcTile const tile = tc_tile_for(d);
  if (tile != TcTile::kGemm && tile != TcTile::kSkinny && tile != TcTile::kWgmma) return invalid_argument("linear_tc: unknown tile");
  if (tile == TcTile::kWgmma && d.mma != TcMma::kK16) return invalid_argument("linear_tc: the wgmma tile is m16n8k16 only");
  if (tile == TcTile::kWgmma && !tc_wgmma_available())
    return not_supported("linear_tc: the wgmma tile needs an sm_90a build on a compute capability 9.0 device");
  if (static_cast<int>(d.slab) < -1 || static_cast<int>(d.slab) > 3) return invalid_argument("linear_tc: unknown slab");
  if (static_cast<int>(d.quant) < -1 || static_cast<int>(d.quant) > 2) return invalid_argument("linear_tc: unknown block-scaled path");
  if (d.m == 0 || d.n == 0) { empty = true; return {}; }
  if (!a.y && !a.y_bf16) return invalid_argument("linear_tc: no output (y and y_bf16 both null)");
  bool const quant = a.w_format != DType::kBf16;
  if (quant) {
    if (a.w_format != DType::kF8E4m3 && a.w_format != DType::kF4E2m1x2)
      return invalid_argument("linear_tc: w_format must be bf16, f8_e4m3 or f4_e2m1x2");
    if (!tc_quant_ok(d, a))
      return not_supported("linear_tc: block-scaled W runs on m16n8k16 tiles only, with k % 32 == 0, k <= " +
                           std::to_string(kTcQuantMaxK) + ", 16-byte aligned codes and x rows (ops::tc_quant_ok)");
    if (!a.x || !a.w_q || !a.w_scale) return invalid_argument("linear_tc: null x, w_q or w_scale");
    int64_t const row_bytes = a.w_format == DType::kF4E2m1x2 ? d.k / 2 : d.k;
    if (a.ldx < d.k || a.ldw_q < row_bytes || a.ldw_scale < (d.k + 31) / 32)
      return invalid_argument("linear_tc: ldx, ldw_q or ldw_scale too small for k");
  } else {
    if (!a.x || !a.w) return invalid_argument("linear_tc: null x or w");
    if (a.ldx < d.k || a.ldw < d.k) return invalid_argument("linear_tc: ldx and ldw must be ≥ k");
  }
  if ((a.y && a.ldy < d.n) || (a.y_bf16 && a.ldy_bf16 < d.n)) return invalid_argument("linear_tc: output stride < n");
  p.x = reinterpret_cast<uint16_t const*>(a.x);
  p.w = reinterpret_cast<uint16_t const*>(a.w);
  p.y = a.y;
  p.y_bf16 = reinterpret_cast<uint16_t*>(a.y_bf16);
  p.m = d.m; p.n = d.n; p.k = d.k;
  p.ldx = a.ldx; p.ldw = a.ldw; p.ldy = a.ldy; p.ldy_bf16 = a.ldy_bf16;
  p.wq = a.w_q; p.wscale = a.w_scale; p.ldwq = a.ldw_q; p.ldwscale = a.ldw_scale;
  p.y_vec2 = a.y && a.ldy % 2 == 0 && (reinterpret_cast<uintptr_t>(a.y) & 7u) == 0;
  p.y_round_bf16 = a.y_round_bf16;
  p.ybf_vec2 = a.y_bf16 && a.ldy_bf16 % 2 == 0 && (reinterpret_cast<uintptr_t>(a.y_bf16) & 3u) == 0;
  return {};
}
}  // namespace

Status linear_tc_cuda(LinearTcDesc const& d, LinearTcArgs const& a, ExecContext& ctx) {
  using namespace kernels::tc_linear;
  TcLinearParams p;
  bool empty = false;
  TESSERA_TRY(tc_params(d, a, p, empty));
  if (empty) return {};
  if (a.w_format != DType::kBf16) {
    ops::TcQuantPath const path = quant_path(d);
    if (d.quant == ops::TcQuantPath::kDirect && path != ops::TcQuantPath::kDirect)
      return not_supported("linear_tc: the direct block-scaled path takes at most " +
                           std::to_string(ops::kTcDirectMaxRows) + " rows whose x fits its shared memory");
    cudaStream_t const st = kernels::stream_of(ctx);
    bool const fp4 = a.w_format == DType::kF4E2m1x2;
    TcTile const tile = tc_tile_run(d, a);
    if (tile == TcTile::kWgmma)
      return fp4 ? launch_wgmma<DType::kF4E2m1x2, true>(p, st) : launch_wgmma<DType::kF8E4m3, true>(p, st);
    if (tile == TcTile::kGemm) return fp4 ? launch_gemm_q<DType::kF4E2m1x2>(p, st) : launch_gemm_q<DType::kF8E4m3>(p, st);
    if (path == ops::TcQuantPath::kDirect) return fp4 ? launch_skinny_qd<DType::kF4E2m1x2>(p, st) : launch_skinny_qd<DType::kF8E4m3>(p, st);
    if (path == ops::TcQuantPath::kWarpSpec) return fp4 ? launch_skinny_ws<DType::kF4E2m1x2>(p, st) : launch_skinny_ws<DType::kF8E4m3>(p, st);
    return fp4 ? launch_skinny_q<DType::kF4E2m1x2>(p, st) : launch_skinny_q<DType::kF8E4m3>(p, st);
  }
  if (tc_tile_run(d, a) == TcTile::kWgmma)
    return tc_vec16(d, a) ? launch_wgmma<DType::kBf16, true>(p, kernels::stream_of(ctx))
                          : launch_wgmma<DType::kBf16, false>(p, kernels::stream_of(ctx));
  TcSlab const slab = d.slab == TcSlab::kAuto ? tc_default_slab() : d.slab;
  if (tc_tile_for(d) == TcTile::kSkinny && d.mma == TcMma::kK16 && slab != TcSlab::k256x8)
    return kSkinnySlab[static_cast<int>(slab)][tc_vec16(d, a) ? 1 : 0](p, kernels::stream_of(ctx));
  return kLaunch[static_cast<int>(tc_tile_for(d))][static_cast<int>(d.mma)][tc_vec16(d, a) ? 1 : 0](p, kernels::stream_of(ctx));
}

Status linear_tc_cuda_batch(std::span<LinearTcDesc const> d, std::span<LinearTcArgs const> a, ExecContext& ctx) {
  using namespace kernels::tc_linear;
  using kernels::ceil_div, kernels::cuda_status, kernels::launch_status;
  if (d.size() != a.size()) return invalid_argument("linear_tc batch: descriptor and argument counts differ");
  bool one_launch = d.size() > 1 && d.size() <= static_cast<size_t>(kTcMaxBatch);
  for (size_t i = 0; one_launch && i < d.size(); ++i)
    one_launch = tc_tile_for(d[i]) == TcTile::kSkinny && d[i].mma == d[0].mma && a[i].w_format == a[0].w_format &&
                 (a[0].w_format != DType::kBf16 ? tc_quant_ok(d[i], a[i]) : tc_vec16(d[i], a[i]) == tc_vec16(d[0], a[0]));
  if (!one_launch) {
    for (size_t i = 0; i < d.size(); ++i) TESSERA_TRY(linear_tc_cuda(d[i], a[i], ctx));
    return {};
  }
  TcLinearBatch b{};
  int64_t gx = 0, gy = 0, mmax = 0;
  unsigned count = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    bool empty = false;
    TESSERA_TRY(tc_params(d[i], a[i], b.p[count], empty));
    if (empty) continue;
    gx = std::max(gx, ceil_div(d[i].n, kSkinnyCols));
    gy = std::max(gy, ceil_div(d[i].m, kSkinnyRows));
    mmax = std::max(mmax, d[i].m);
    ++count;
  }
  if (count == 0) return {};
  if (gx > 0x7FFFFFFF || gy > 65535) return invalid_argument("linear_tc skinny batch: grid too large");
  using BatchKernel = void (*)(TcLinearBatch);
  if (a[0].w_format != DType::kBf16) {
    int64_t kmax = 0;
    bool direct = true, ws = true;
    for (size_t i = 0; i < d.size(); ++i) {
      kmax = std::max(kmax, d[i].k);
      direct = direct && quant_direct(d[i]);
      ws = ws && quant_path(d[i]) == ops::TcQuantPath::kWarpSpec;
    }
    bool const fp4 = a[0].w_format == DType::kF4E2m1x2;
    if (ws) {  // every problem takes the warp-specialised path: one launch (smem for the widest)
      int64_t const xr = std::min<int64_t>(mmax, kSkinnyRows);
      bool const deep = ws_raw_stages(xr) == kWsRawDeep;
      // Each kernel opts into its largest launch's shared memory once (allow_smem), not on every call.
      auto ws_kernel = [&]<DType kFmt, int kRaw>() -> Result<BatchKernel> {
        constexpr BatchKernel kK = linear_tc_skinny_ws_batch_kernel<kFmt, kRaw>;
        TESSERA_TRY(cuda_status(allow_smem<kK>(skinny_ws_smem_bytes<kFmt>(1, kRaw, kSkinnyRows, ops::kTcQuantMaxK)),
                                "linear_tc skinny batch (block-scaled, warp-specialised): shared memory attribute"));
        return kK;
      };
      auto const kw = fp4 ? (deep ? ws_kernel.template operator()<DType::kF4E2m1x2, kWsRawDeep>()
                                  : ws_kernel.template operator()<DType::kF4E2m1x2, kWsRawShallow>())
                          : (deep ? ws_kernel.template operator()<DType::kF8E4m3, kWsRawDeep>()
                                  : ws_kernel.template operator()<DType::kF8E4m3, kWsRawShallow>());
      if (!kw) return kw.status();
      size_t const smem = fp4 ? skinny_ws_smem_bytes<DType::kF4E2m1x2>(1, deep ? kWsRawDeep : kWsRawShallow, xr, kmax)
                              : skinny_ws_smem_bytes<DType::kF8E4m3>(1, deep ? kWsRawDeep : kWsRawShallow, xr, kmax);
      device::launch_pdl(*kw, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), count), kWsThreads, smem,
                         kernels::stream_of(ctx), b);
      return launch_status("linear_tc_skinny_ws_batch_kernel");
    }
    if (direct) {  // every problem takes the direct path: one launch of it (its smem sized for the widest)
      // The widest direct call, once per kernel.
      auto qd_kernel = [&]<DType kFmt, bool kRing>() -> Result<BatchKernel> {
        constexpr BatchKernel kK = linear_tc_skinny_qd_batch_kernel<kFmt, kRing>;
        TESSERA_TRY(cuda_status(allow_smem<kK>(skinny_qd_max_smem_bytes<kFmt>(1)),
                                "linear_tc skinny batch (block-scaled, direct): shared memory attribute"));
        return kK;
      };
      int64_t kmin = d[0].k;  // one kernel for the launch: the ring when every problem's K takes it
      for (auto const& di : d) kmin = std::min(kmin, di.k);
      bool const ring = direct_ring_codes(kmin);
      auto const kq = fp4 ? (ring ? qd_kernel.template operator()<DType::kF4E2m1x2, true>()
                                  : qd_kernel.template operator()<DType::kF4E2m1x2, false>())
                          : (ring ? qd_kernel.template operator()<DType::kF8E4m3, true>()
                                  : qd_kernel.template operator()<DType::kF8E4m3, false>());
      if (!kq) return kq.status();
      BatchKernel const kd = *kq;
      size_t smem = 0;
      for (size_t i = 0; i < d.size(); ++i)
        smem = std::max(smem, fp4 ? skinny_qd_smem_bytes<DType::kF4E2m1x2>(1, d[i].m, d[i].k, ring)
                                  : skinny_qd_smem_bytes<DType::kF8E4m3>(1, d[i].m, d[i].k, ring));
      device::launch_pdl(kd, dim3(static_cast<unsigned>(gx), 1, count), 32, smem, kernels::stream_of(ctx), b);
      return launch_status("linear_tc_skinny_qd_batch_kernel");
    }
    constexpr BatchKernel kq4 = linear_tc_skinny_q_batch_kernel<DType::kF4E2m1x2>;
    constexpr BatchKernel kq8 = linear_tc_skinny_q_batch_kernel<DType::kF8E4m3>;
    BatchKernel const kq = fp4 ? kq4 : kq8;
    size_t const smem = fp4 ? skinny_q_launch_smem<DType::kF4E2m1x2>(mmax, kmax) : skinny_q_launch_smem<DType::kF8E4m3>(mmax, kmax);
    cudaError_t const e = fp4 ? allow_smem<kq4>(skinny_q_launch_smem<DType::kF4E2m1x2>(kSkinnyRows, ops::kTcQuantMaxK))
                              : allow_smem<kq8>(skinny_q_launch_smem<DType::kF8E4m3>(kSkinnyRows, ops::kTcQuantMaxK));
    TESSERA_TRY(cuda_status(e, "linear_tc skinny batch (block-scaled): shared memory attribute"));
    device::launch_pdl(kq, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), count), 32, smem,
                       kernels::stream_of(ctx), b);
    return launch_status("linear_tc_skinny_q_batch_kernel");
  }
  bool const vec16 = tc_vec16(d[0], a[0]);
  auto bf16_kernel = [&]<TcMma kMma, bool kVec>() -> Result<BatchKernel> {
    constexpr BatchKernel kK = linear_tc_skinny_batch_kernel<kMma, kVec>;
    TESSERA_TRY(cuda_status(allow_smem<kK>(skinny_smem_bytes(kSkinnyRows)), "linear_tc skinny batch: shared memory attribute"));
    return kK;
  };
  auto const kb = d[0].mma == TcMma::kK16 ? (vec16 ? bf16_kernel.template operator()<TcMma::kK16, true>()
                                                   : bf16_kernel.template operator()<TcMma::kK16, false>())
                                          : (vec16 ? bf16_kernel.template operator()<TcMma::kK8x2, true>()
                                                   : bf16_kernel.template operator()<TcMma::kK8x2, false>());
  if (!kb) return kb.status();
  BatchKernel const k = *kb;
  device::launch_pdl(k, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), count), 32, skinny_smem_bytes(mmax),
                     kernels::stream_of(ctx), b);
  return launch_status("linear_tc_skinny_batch_kernel");
}

}  // namespace tessera::ops

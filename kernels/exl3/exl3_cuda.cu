// SPDX-License-Identifier: Apache-2.0
/// CUDA entry points of the EXL3 family (include/tessera/ops/exl3.hpp): argument checks, the input
/// transform and epilogue kernels (bit-exact roundings of spec/exl3.md §4.3), the naive reference kernel
/// used to check big shapes, and dispatch of the (K, codebook) instantiations of exl3_kernels.cuh.
///
/// Input transform / epilogue: one warp per 128-block of a row, lane l holding elements 4l..4l+3.
/// Butterfly stages b = 0, 1 run inside the lane, b = 2..6 across lanes (shfl_xor by 2^(b−2)), in the
/// spec's order, each (lo, hi) → (lo + hi, lo − hi) in fp32.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <string>
#include <utility>

#include "kernels/exl3/exl3_kernels.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/exl3.hpp"

namespace tessera::kernels::exl3 {

namespace {

struct XformParams {
  __half const* x = nullptr;                 // [T, k]
  int32_t const* token_idx = nullptr;        // [rows] source row of x per output row (MoE), or null
  __half const* suh = nullptr;               // [k] (dense)
  __half const* const* suh_e = nullptr;      // [E] → [k] (MoE)
  int32_t const* expert_offsets = nullptr;   // [E + 1] (MoE)
  int num_experts = 0;
  __half* xh = nullptr;                      // [rows, k]
  int64_t rows = 0, k = 0;
};

struct EpilogueParams {
  float const* partial = nullptr;            // [S][rows][n]
  int num_chunks = 1;
  int64_t rows = 0, n = 0;
  __half const* svh = nullptr;               // [n] (dense)
  __half const* const* svh_e = nullptr;      // [E] → [n] (MoE)
  int32_t const* expert_offsets = nullptr;   // [E + 1] (MoE)
  int num_experts = 0;
  __half const* bias = nullptr;              // [n] or null
  float const* route_weight = nullptr;       // [rows] or null (fp32 output only)
  __half* y16 = nullptr;                     // [rows, n] fp16 output, or
  float* y32 = nullptr;                      // [rows, n] fp32 output
};

/// Expert e with off[e] <= row < off[e+1] (the last such e when experts are empty).
__device__ int expert_of(int32_t const* off, int num_experts, int64_t row) {
  int lo = 0, hi = num_experts;   // invariant: off[lo] <= row < off[hi]
  while (hi - lo > 1) {
    int const mid = (lo + hi) >> 1;
    if (off[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

/// xh = fp16(fwht(fp16(x·suh))·r). grid (rows, ceil(k/512)), block 128.
__global__ void __launch_bounds__(128) exl3_input_transform_kernel(XformParams const p) {
  int const lane = threadIdx.x & 31;
  int64_t const col = (static_cast<int64_t>(blockIdx.y) * 4 + (threadIdx.x >> 5)) * 128;
  if (col >= p.k) return;
  int64_t const row = blockIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  int64_t const src = p.token_idx ? p.token_idx[row] : row;
  __half const* suh = p.suh_e ? p.suh_e[expert_of(p.expert_offsets, p.num_experts, row)] : p.suh;
  uint2 const xv = *reinterpret_cast<uint2 const*>(p.x + src * p.k + col + 4 * lane);
  uint2 const sv = *reinterpret_cast<uint2 const*>(suh + col + 4 * lane);
  *reinterpret_cast<uint2*>(p.xh + row * p.k + col + 4 * lane) = input_transform_warp(xv, sv, lane);
}

/// acc = 0 + P_0 + … + P_{S−1} (in order), fwht, ·r, ·svh (+ bias) (· route weight). grid (rows, ceil(n/512)).
__global__ void __launch_bounds__(128) exl3_epilogue_kernel(EpilogueParams const p) {
  int const lane = threadIdx.x & 31;
  int64_t const col = (static_cast<int64_t>(blockIdx.y) * 4 + (threadIdx.x >> 5)) * 128;
  if (col >= p.n) return;
  int64_t const row = blockIdx.x;
  // Dense layers: svh and bias are weights, loaded before the wait so they arrive with the partials.
  uint2 sv = make_uint2(0u, 0u), bv = make_uint2(0u, 0u);
  if (!p.svh_e) sv = __ldg(reinterpret_cast<uint2 const*>(p.svh + col + 4 * lane));
  if (p.bias) bv = __ldg(reinterpret_cast<uint2 const*>(p.bias + col + 4 * lane));
  pdl_wait();
  pdl_launch_dependents();
  if (p.svh_e) sv = *reinterpret_cast<uint2 const*>(p.svh_e[expert_of(p.expert_offsets, p.num_experts, row)] + col + 4 * lane);
  // acc = ((0 + P_0) + P_1) + … in this order; the loads of a batch of 16 chunks are issued before their
  // adds so the S dependent L2 round trips become S/16.
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  float const* src = p.partial + row * p.n + col + 4 * lane;
  int64_t const cstride = p.rows * p.n;
  for (int s0 = 0; s0 < p.num_chunks; s0 += 16) {
    float4 q[16];
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (s0 + i < p.num_chunks) q[i] = __ldcg(reinterpret_cast<float4 const*>(src + (s0 + i) * cstride));
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (s0 + i < p.num_chunks) {
        v[0] = __fadd_rn(v[0], q[i].x); v[1] = __fadd_rn(v[1], q[i].y);
        v[2] = __fadd_rn(v[2], q[i].z); v[3] = __fadd_rn(v[3], q[i].w);
      }
  }
  fwht128_warp(v, lane);
  __half const* svh = reinterpret_cast<__half const*>(&sv);
  __half const* bias = reinterpret_cast<__half const*>(&bv);
  float const r = tessera::exl3::kHadScale;
  int64_t const base = row * p.n + col + 4 * lane;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    if (p.y16) {
      // __hmul/__hadd lower to mul.f16/add.f16, which ptxas may contract into one fma.rn.f16 (one
      // rounding instead of two: y differs from fp16(fp16(o·svh) + bias) by an ulp). The _rn forms forbid it.
      __half y = __hmul_rn(__float2half_rn(__fmul_rn(v[t], r)), svh[t]);
      if (p.bias) y = __hadd_rn(y, bias[t]);
      p.y16[base + t] = y;
    } else {
      float y = __fmul_rn(__fmul_rn(v[t], r), __half2float(svh[t]));
      if (p.bias) y = __fadd_rn(y, __half2float(bias[t]));
      if (p.route_weight) y = __fmul_rn(y, p.route_weight[row]);
      p.y32[base + t] = y;
    }
  }
}

/// Naive reference: one thread per output element, W' decoded element by element with the codec
/// primitives, fp32 FMA chain over k in index order. Writes acc [rows][n]. grid (ceil(n/128), rows).
__global__ void exl3_naive_acc_kernel(__half const* xh, int16_t const* trellis, float* acc, int64_t rows, int64_t k,
                                      int64_t n, int k2, int cb) {
  int64_t const col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t const row = blockIdx.y;
  if (col >= n || row >= rows) return;
  int64_t const tiles_n = n / 16;
  float a = 0.f;
  for (int64_t i = 0; i < k; ++i) {
    auto const* wd = reinterpret_cast<uint32_t const*>(trellis) + ((i / 16) * tiles_n + col / 16) * (4 * k2);
    uint32_t const s = tessera::exl3::tile_state(wd, k2, tessera::exl3::tile_pos(static_cast<int>(i % 16),
                                                                                 static_cast<int>(col % 16)));
    uint16_t const w = tessera::exl3::decode_state(static_cast<tessera::exl3::Codebook>(cb), s);
    a = __fmaf_rn(__half2float(xh[row * k + i]), __half2float(__ushort_as_half(w)), a);
  }
  acc[row * n + col] = a;
}

constexpr std::array<Exl3MmaLaunchFn, 24> kGemv = {
#define TESSERA_EXL3_ROW(K) &launch_exl3_gemv<K, 0>, &launch_exl3_gemv<K, 1>, &launch_exl3_gemv<K, 2>,
    TESSERA_EXL3_ROW(1) TESSERA_EXL3_ROW(2) TESSERA_EXL3_ROW(3) TESSERA_EXL3_ROW(4)
    TESSERA_EXL3_ROW(5) TESSERA_EXL3_ROW(6) TESSERA_EXL3_ROW(7) TESSERA_EXL3_ROW(8)
#undef TESSERA_EXL3_ROW
};
constexpr std::array<Exl3MmaLaunchFn, 24> kGemm = {
#define TESSERA_EXL3_ROW(K) &launch_exl3_gemm<K, 0>, &launch_exl3_gemm<K, 1>, &launch_exl3_gemm<K, 2>,
    TESSERA_EXL3_ROW(1) TESSERA_EXL3_ROW(2) TESSERA_EXL3_ROW(3) TESSERA_EXL3_ROW(4)
    TESSERA_EXL3_ROW(5) TESSERA_EXL3_ROW(6) TESSERA_EXL3_ROW(7) TESSERA_EXL3_ROW(8)
#undef TESSERA_EXL3_ROW
};
constexpr std::array<Exl3ReconstructFn, 24> kReconstruct = {
#define TESSERA_EXL3_ROW(K) &launch_exl3_reconstruct<K, 0>, &launch_exl3_reconstruct<K, 1>, &launch_exl3_reconstruct<K, 2>,
    TESSERA_EXL3_ROW(1) TESSERA_EXL3_ROW(2) TESSERA_EXL3_ROW(3) TESSERA_EXL3_ROW(4)
    TESSERA_EXL3_ROW(5) TESSERA_EXL3_ROW(6) TESSERA_EXL3_ROW(7) TESSERA_EXL3_ROW(8)
#undef TESSERA_EXL3_ROW
};

int table_index(ops::Exl3LayerDesc const& d) { return (d.k2 / 2 - 1) * 3 + static_cast<int>(d.codebook); }

Status cuda_status(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, std::string("exl3 ") + what + ": " + cudaGetErrorString(e));
}

size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }

/// Scratch from ctx when it is large enough, else a stream-ordered allocation freed after the op.
struct Scratch {
  void* ptr = nullptr;
  bool owned = false;
  cudaStream_t stream = nullptr;
  Status acquire(ExecContext& ctx, size_t bytes) {
    stream = reinterpret_cast<cudaStream_t>(ctx.stream);
    if (ctx.workspace && ctx.workspace_bytes >= bytes) { ptr = ctx.workspace; return {}; }
    owned = true;
    return cuda_status(cudaMallocAsync(&ptr, bytes == 0 ? 256 : bytes, stream), "workspace allocation");
  }
  ~Scratch() {
    if (owned && ptr) cudaFreeAsync(ptr, stream);
  }
};

Status check_device(DeviceInfo const& dev) {
  if (dev.sm != 0 && dev.sm < 90) return not_supported("exl3 CUDA kernels are built for sm_90a; device is sm_" + std::to_string(dev.sm));
  return {};
}

}  // namespace

bool gemv_fuses_transform(int64_t tiles_k, int64_t tiles_n) {
  // The fused staging costs ~10% of the GEMV's issue slots (C/8 warp transforms per 4·C tile decodes of a
  // block) and saves one launch (~2 µs): worth it up to ~2^17 tiles (≈ 20 µs of GEMV).
  return tiles_k * tiles_n <= (int64_t{1} << 17);
}

int exl3_num_chunks(int tiles_k, int tiles_n) {
  // S divides tiles_k / 8 (k is a multiple of 128), so every chunk is a multiple of the GEMV ring depth
  // (8 tiles); chunks are at most kGemvMaxChunkTiles long (the GEMV's shared A fragments); otherwise the
  // fewest chunks that give ≥ 3072 (column tile, chunk) warps, ~23 per SM of an H200, each with 8 tiles
  // (0.25–2 KiB) of trellis in flight. Depends on the layer shape only.
  int const groups = tiles_k / kGemvDepth;
  int best = groups;
  for (int s = 1; s <= groups; ++s) {
    if (groups % s || tiles_k / s > kGemvMaxChunkTiles) continue;
    best = s;
    if (static_cast<int64_t>(s) * tiles_n >= 3072) break;
  }
  return best;
}

}  // namespace tessera::kernels::exl3

namespace tessera::ops {

namespace kx = tessera::kernels::exl3;

static_assert(BackendOp<Exl3Gemm<Backend::kCuda>, Exl3GemmDesc, Exl3GemmArgs>);
static_assert(BackendOp<Exl3Dequant<Backend::kCuda>, Exl3LayerDesc, Exl3DequantArgs>);
static_assert(BackendOp<Exl3GroupedGemm<Backend::kCuda>, Exl3GroupedGemmDesc, Exl3GroupedGemmArgs>);

Status Exl3Dequant<Backend::kCuda>::check(Exl3LayerDesc const& d, DeviceInfo const& dev) {
  TESSERA_TRY(check_exl3_layer(d));
  if (!exl3_cuda_supports_k2(d.k2)) return not_supported("exl3 CUDA: half-integer rates are CPU-only");
  return kx::check_device(dev);
}

Status Exl3Dequant<Backend::kCuda>::run(Exl3LayerDesc const& d, Exl3DequantArgs const& a, ExecContext& ctx) {
  TESSERA_TRY(check(d, ctx.device));
  if (!a.trellis.data || !a.w.data || !a.w.is_contiguous() || a.w.shape[0] != d.k || a.w.shape[1] != d.n)
    return invalid_argument("exl3 dequant: trellis and w [k, n] (contiguous, device) required");
  auto stream = reinterpret_cast<cudaStream_t>(ctx.stream);
  return kx::cuda_status(kx::kReconstruct[kx::table_index(d)](a.trellis.data, reinterpret_cast<__half*>(a.w.data),
                                                              static_cast<int>(d.k / 16), static_cast<int>(d.n / 16), stream),
                         "reconstruct launch");
}

Status Exl3Gemm<Backend::kCuda>::check(Exl3GemmDesc const& d, DeviceInfo const& dev) {
  TESSERA_TRY(check_exl3_layer(d.layer));
  if (!exl3_cuda_supports_k2(d.layer.k2)) return not_supported("exl3 CUDA: half-integer rates are CPU-only");
  if (d.out_type != DType::kF16 && d.out_type != DType::kF32) return not_supported("exl3 gemm: output must be f16 or f32");
  if (d.num_rows < 0 || d.num_rows > 0x7FFFFFFF) return invalid_argument("exl3 gemm: row count out of range");
  return kx::check_device(dev);
}

namespace {
/// Tactics: 1 GEMV (chunk partials in the workspace), 2 GEMM (chain in registers), 3 naive reference.
int gemm_tactic(int64_t m, int impl_override) { return impl_override > 0 ? impl_override : (m <= 16 ? 1 : 2); }
size_t gemm_workspace(Exl3GemmDesc const& d, int tactic) {
  auto const m = static_cast<size_t>(d.num_rows);
  int const s = kx::exl3_num_chunks(static_cast<int>(d.layer.k / 16), static_cast<int>(d.layer.n / 16));
  size_t const chunks = tactic == 1 ? static_cast<size_t>(s) : 1;
  return kx::align256(m * static_cast<size_t>(d.layer.k) * 2) +
         kx::align256(chunks * m * static_cast<size_t>(d.layer.n) * 4);
}
}  // namespace

size_t Exl3Gemm<Backend::kCuda>::workspace_bytes(Exl3GemmDesc const& d) {
  return gemm_workspace(d, gemm_tactic(d.num_rows, -1));
}

Status Exl3Gemm<Backend::kCuda>::run(Exl3GemmDesc const& d, Exl3GemmArgs const& a, ExecContext& ctx) {
  TESSERA_TRY(check(d, ctx.device));
  Exl3LayerDesc const& l = d.layer;
  int64_t const m = d.num_rows;
  if (!a.trellis.data || !a.suh.data || !a.svh.data || !a.x.data || (d.has_bias && !a.bias.data))
    return invalid_argument("exl3 gemm: trellis, suh, svh, x (and bias when has_bias) required");
  if (a.x.shape[0] != m || a.x.shape[1] != l.k || !a.x.is_contiguous())
    return invalid_argument("exl3 gemm: x must be contiguous [m, k]");
  bool const f16 = d.out_type == DType::kF16;
  if (f16 ? (!a.y_f16.data || a.y_f16.shape[0] != m || a.y_f16.shape[1] != l.n)
          : (!a.y_f32.data || a.y_f32.shape[0] != m || a.y_f32.shape[1] != l.n))
    return invalid_argument("exl3 gemm: output must be [m, n] of the output dtype");
  if (m == 0) return {};
  int const tactic = gemm_tactic(m, ctx.impl_override);
  if (tactic < 1 || tactic > 3)
    return invalid_argument("exl3 gemm: impl_override " + std::to_string(ctx.impl_override) + " is not 1..3");
  kx::Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, gemm_workspace(d, tactic)));
  auto* xh = static_cast<__half*>(ws.ptr);
  auto* partial = reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + kx::align256(static_cast<size_t>(m * l.k) * 2));
  cudaStream_t stream = ws.stream;

  kx::XformParams xp;
  xp.x = reinterpret_cast<__half const*>(a.x.data);
  xp.suh = reinterpret_cast<__half const*>(a.suh.data);
  xp.xh = xh;
  xp.rows = m;
  xp.k = l.k;
  // Small layers: the GEMV applies the input transform itself while staging its A fragments (one launch
  // less); large ones keep the transform kernel (the GEMV's staging repeats it in every column block).
  bool const fuse = tactic == 1 && kx::gemv_fuses_transform(l.k / 16, l.n / 16);
  if (!fuse)
    TESSERA_TRY(kx::cuda_status(kx::launch_pdl(kx::exl3_input_transform_kernel,
                                                 dim3(static_cast<unsigned>(m), static_cast<unsigned>((l.k + 511) / 512)),
                                                 dim3(128), 0, stream, xp),
                                "input transform launch"));

  kx::Exl3MmaParams p;
  p.xh = xh;
  p.trellis = a.trellis.data;
  p.partial = partial;
  p.num_rows = m;
  p.k = l.k;
  p.n = l.n;
  p.tiles_k = static_cast<int>(l.k / 16);
  p.tiles_n = static_cast<int>(l.n / 16);
  p.num_chunks = kx::exl3_num_chunks(p.tiles_k, p.tiles_n);
  p.chunk_tiles = p.tiles_k / p.num_chunks;
  // Auto: GEMV up to 16 rows, GEMM above (identical bits either way, see exl3_kernels.cuh).
  int epilogue_chunks = 1;
  if (tactic == 1) {
    epilogue_chunks = p.num_chunks;
    if (fuse) {
      p.x = xp.x;
      p.suh = xp.suh;
    }
    TESSERA_TRY(kx::cuda_status(kx::kGemv[kx::table_index(l)](p, 1, stream), "gemv launch"));
  } else if (tactic == 2) {
    TESSERA_TRY(kx::cuda_status(kx::kGemm[kx::table_index(l)](p, 1, stream), "gemm launch"));
  } else {
    kx::exl3_naive_acc_kernel<<<dim3(static_cast<unsigned>((l.n + 127) / 128), static_cast<unsigned>(m)), 128, 0, stream>>>(
        xh, a.trellis.data, partial, m, l.k, l.n, l.k2, static_cast<int>(l.codebook));
    TESSERA_TRY(kx::cuda_status(cudaGetLastError(), "naive launch"));
  }

  kx::EpilogueParams ep;
  ep.partial = partial;
  ep.num_chunks = epilogue_chunks;
  ep.rows = m;
  ep.n = l.n;
  ep.svh = reinterpret_cast<__half const*>(a.svh.data);
  ep.bias = d.has_bias ? reinterpret_cast<__half const*>(a.bias.data) : nullptr;
  if (f16) ep.y16 = reinterpret_cast<__half*>(a.y_f16.data);
  else ep.y32 = a.y_f32.data;
  return kx::cuda_status(kx::launch_pdl(kx::exl3_epilogue_kernel,
                                        dim3(static_cast<unsigned>(m), static_cast<unsigned>((l.n + 511) / 512)), dim3(128),
                                        0, stream, ep),
                         "epilogue launch");
}

Status Exl3GroupedGemm<Backend::kCuda>::check(Exl3GroupedGemmDesc const& d, DeviceInfo const& dev) {
  TESSERA_TRY(check_exl3_layer(d.layer));
  if (!exl3_cuda_supports_k2(d.layer.k2)) return not_supported("exl3 CUDA: half-integer rates are CPU-only");
  if (d.num_experts <= 0 || d.num_experts > 65535 || d.num_assignments < 0 || d.num_tokens < 0)
    return invalid_argument("exl3 grouped gemm: expert/assignment counts out of range");
  return kx::check_device(dev);
}

size_t Exl3GroupedGemm<Backend::kCuda>::workspace_bytes(Exl3GroupedGemmDesc const& d) {
  auto const a = static_cast<size_t>(d.num_assignments);
  int const s = kx::exl3_num_chunks(static_cast<int>(d.layer.k / 16), static_cast<int>(d.layer.n / 16));
  return kx::align256(a * static_cast<size_t>(d.layer.k) * 2) +
         kx::align256(static_cast<size_t>(s) * a * static_cast<size_t>(d.layer.n) * 4);
}

Status Exl3GroupedGemm<Backend::kCuda>::run(Exl3GroupedGemmDesc const& d, Exl3GroupedGemmArgs const& a, ExecContext& ctx) {
  TESSERA_TRY(check(d, ctx.device));
  Exl3LayerDesc const& l = d.layer;
  if (!a.trellis || !a.suh || !a.svh || !a.expert_offsets || !a.token_idx || !a.x.data || !a.y.data)
    return invalid_argument("exl3 grouped gemm: pointer arrays, x and y required");
  if (a.y.shape[0] != d.num_assignments || a.y.shape[1] != l.n || a.x.shape[1] != l.k)
    return invalid_argument("exl3 grouped gemm: x [T, k] and y [A, n] required");
  if (d.num_assignments == 0) return {};
  kx::Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, workspace_bytes(d)));
  int64_t const rows = d.num_assignments;
  auto* xh = static_cast<__half*>(ws.ptr);
  auto* partial = reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + kx::align256(static_cast<size_t>(rows * l.k) * 2));
  cudaStream_t stream = ws.stream;
  int const e = static_cast<int>(d.num_experts);

  kx::XformParams xp;
  xp.x = reinterpret_cast<__half const*>(a.x.data);
  xp.token_idx = a.token_idx;
  xp.suh_e = reinterpret_cast<__half const* const*>(a.suh);
  xp.expert_offsets = a.expert_offsets;
  xp.num_experts = e;
  xp.xh = xh;
  xp.rows = rows;
  xp.k = l.k;
  kx::Exl3MmaParams p;
  if (kx::gemv_fuses_transform(l.k / 16, l.n / 16)) {
    // The GEMV applies the input transform (token gather, the expert's suh) while staging A fragments.
    p.x = xp.x;
    p.token_idx = xp.token_idx;
    p.suh_e = xp.suh_e;
  } else {
    TESSERA_TRY(kx::cuda_status(kx::launch_pdl(kx::exl3_input_transform_kernel,
                                                 dim3(static_cast<unsigned>(rows), static_cast<unsigned>((l.k + 511) / 512)),
                                                 dim3(128), 0, stream, xp),
                                "input transform launch"));
  }
  p.xh = xh;
  p.trellis_e = a.trellis;
  p.expert_offsets = a.expert_offsets;
  p.partial = partial;
  p.num_rows = rows;
  p.k = l.k;
  p.n = l.n;
  p.tiles_k = static_cast<int>(l.k / 16);
  p.tiles_n = static_cast<int>(l.n / 16);
  p.num_chunks = kx::exl3_num_chunks(p.tiles_k, p.tiles_n);
  p.chunk_tiles = p.tiles_k / p.num_chunks;
  TESSERA_TRY(kx::cuda_status(kx::kGemv[kx::table_index(l)](p, e, stream), "grouped gemv launch"));

  kx::EpilogueParams ep;
  ep.partial = partial;
  ep.num_chunks = p.num_chunks;
  ep.rows = rows;
  ep.n = l.n;
  ep.svh_e = reinterpret_cast<__half const* const*>(a.svh);
  ep.expert_offsets = a.expert_offsets;
  ep.num_experts = e;
  ep.route_weight = a.route_weight;
  ep.y32 = a.y.data;
  return kx::cuda_status(kx::launch_pdl(kx::exl3_epilogue_kernel,
                                        dim3(static_cast<unsigned>(rows), static_cast<unsigned>((l.n + 511) / 512)),
                                        dim3(128), 0, stream, ep),
                         "epilogue launch");
}

}  // namespace tessera::ops

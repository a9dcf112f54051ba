// SPDX-License-Identifier: Apache-2.0
/// CUDA entry points of the EXL3 family (include/tessera/ops/exl3.hpp): argument checks, the input
/// transform and epilogue kernels (bit-exact roundings of spec/exl3.md §4.3), the naive reference kernel
/// used to check big shapes, and dispatch of the (K, codebook) instantiations of exl3_kernels.cuh.
///
/// Input transform / epilogue: a warp per 128-block (of 8 rows, or of one row for the chunk-partials
/// epilogue), lane l holding elements 4l..4l+3.
/// Butterfly stages b = 0, 1 run inside the lane, b = 2..6 across lanes (shfl_xor by 2^(b−2)), in the
/// spec's order, each (lo, hi) → (lo + hi, lo − hi) in fp32.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
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

/// Rows per warp of the transform and decode-once epilogue kernels: their loads are issued together, so a
/// warp has 8 × 512 B in flight instead of one L2/DRAM round trip per 128 values.
constexpr int kRowsPerWarp = 8;

/// xh = fp16(fwht(fp16(x·suh))·r). grid (ceil(rows/8), ceil(k/512)), block 128: warp w transforms 128-block
/// 4·blockIdx.y + w of rows 8·blockIdx.x .. +7.
__global__ void __launch_bounds__(128) exl3_input_transform_kernel(XformParams const p) {
  int const lane = threadIdx.x & 31;
  int64_t const col = (static_cast<int64_t>(blockIdx.y) * 4 + (threadIdx.x >> 5)) * 128;
  if (col >= p.k) return;
  int64_t const row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerWarp;
  pdl_wait();
  pdl_launch_dependents();
  // MoE: rows up to expert_offsets[E] only (p.rows is the capacity).
  int64_t const rows = p.expert_offsets ? min(p.rows, static_cast<int64_t>(p.expert_offsets[p.num_experts])) : p.rows;
  uint2 xv[kRowsPerWarp], sv[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    int64_t const row = row0 + r;
    if (row >= rows) break;
    int64_t const src = p.token_idx ? p.token_idx[row] : row;
    __half const* suh = p.suh_e ? p.suh_e[expert_of(p.expert_offsets, p.num_experts, row)] : p.suh;
    xv[r] = *reinterpret_cast<uint2 const*>(p.x + src * p.k + col + 4 * lane);
    sv[r] = *reinterpret_cast<uint2 const*>(suh + col + 4 * lane);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    int64_t const row = row0 + r;
    if (row >= rows) break;
    *reinterpret_cast<uint2*>(p.xh + row * p.k + col + 4 * lane) = input_transform_warp(xv[r], sv[r], lane);
  }
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
  if (p.expert_offsets && row >= p.expert_offsets[p.num_experts]) return;   // MoE: past the assignments in use
  if (p.svh_e) sv = *reinterpret_cast<uint2 const*>(p.svh_e[expert_of(p.expert_offsets, p.num_experts, row)] + col + 4 * lane);
  int64_t const at = row * p.n + col + 4 * lane;
  epilogue_warp<16>(p.partial + at, p.rows * p.n, p.num_chunks, sv, bv, p.bias != nullptr,
                    p.route_weight ? p.route_weight + row : nullptr, p.y16 ? p.y16 + at : nullptr,
                    p.y32 ? p.y32 + at : nullptr, lane);
}

/// Epilogue of one accumulator (dense, S = 1: acc = 0 + P_0, the same chain as exl3_epilogue_kernel; GEMM,
/// naive and decode-once paths). grid
/// (ceil(rows/8), n/512), block 128: warp w finishes 128-column group 4·blockIdx.y + w of rows
/// 8·blockIdx.x .. +7, their acc loads issued together.
__global__ void __launch_bounds__(128) exl3_epilogue_acc_kernel(EpilogueParams const p) {
  int const lane = threadIdx.x & 31;
  int64_t const col = (static_cast<int64_t>(blockIdx.y) * 4 + (threadIdx.x >> 5)) * 128 + 4 * lane;
  if (col >= p.n) return;
  int64_t const row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerWarp;
  uint2 const sv = __ldg(reinterpret_cast<uint2 const*>(p.svh + col));
  uint2 const bv = p.bias ? __ldg(reinterpret_cast<uint2 const*>(p.bias + col)) : make_uint2(0u, 0u);
  pdl_wait();
  pdl_launch_dependents();
  float4 q[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
    if (row0 + r < p.rows) q[r] = __ldcg(reinterpret_cast<float4 const*>(p.partial + (row0 + r) * p.n + col));
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    int64_t const row = row0 + r;
    if (row >= p.rows) break;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    acc_add(v, q[r]);
    int64_t const at = row * p.n + col;
    epilogue_finish(v, sv, bv, p.bias != nullptr, nullptr, p.y16 ? p.y16 + at : nullptr, p.y32 ? p.y32 + at : nullptr,
                    lane);
  }
}

/// Naive reference: one thread per output element, W' decoded element by element with the codec
/// primitives, fp32 FMA chain over k in index order. Writes acc [rows][n]. grid (ceil(n/128), rows).
__global__ void exl3_naive_acc_kernel(__half const* xh, int16_t const* trellis, float* acc, int64_t rows, int64_t k,
                                      int64_t n, int k2, int cb) {
  device::pdl_enter();
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
constexpr std::array<Exl3MmaLaunchFn, 24> kGroupedGemm = {
#define TESSERA_EXL3_ROW(K) &launch_exl3_grouped_gemm<K, 0>, &launch_exl3_grouped_gemm<K, 1>, &launch_exl3_grouped_gemm<K, 2>,
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

constexpr std::array<Exl3ReconstructFn, 24> kReconstructT = {
#define TESSERA_EXL3_ROW(K) &launch_exl3_reconstruct_t<K, 0>, &launch_exl3_reconstruct_t<K, 1>, &launch_exl3_reconstruct_t<K, 2>,
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

/// Arrival counters of the GEMV's fused epilogue (exl3_kernels.cuh), one array per (device, stream): zero at
/// rest, because the block that draws a group's last ticket resets it, so successive ops on one stream reuse
/// them (each GEMV touches its counters only after pdl_wait, i.e. after the previous op completed) and ops
/// on different streams never share one. Grown stream-ordered on demand; never returned.
Status gemv_tickets(cudaStream_t stream, size_t count, uint32_t** out) {
  static std::mutex mu;
  struct Tickets {
    uint32_t* ptr = nullptr;
    size_t capacity = 0;
    bool plain = false;  // cudaMalloc'd while recording: never freed
  };
  static std::map<std::pair<int, cudaStream_t>, Tickets> pool;
  int dev = 0;
  TESSERA_TRY(cuda_status(cudaGetDevice(&dev), "device query"));
  std::lock_guard<std::mutex> lock(mu);
  auto& e = pool[{dev, stream}];
  if (e.capacity < count) {
    size_t const cap = std::max<size_t>(count, 4096);
    void* ptr = nullptr;
    cudaStreamCaptureStatus rec = cudaStreamCaptureStatusNone;
    TESSERA_TRY(cuda_status(cudaStreamIsCapturing(stream, &rec), "capture query"));
    if (rec != cudaStreamCaptureStatusNone) {
      // Grown while the stream records a graph: a stream-ordered allocation would belong to the graph, so a plain
      // one, zeroed by a recorded memset (each replay repeats it; the counters are zero at rest anyway). The old
      // array stays allocated: executables recorded before may still name it.
      TESSERA_TRY(cuda_status(cudaMalloc(&ptr, cap * sizeof(uint32_t)), "ticket allocation"));
      TESSERA_TRY(cuda_status(cudaMemsetAsync(ptr, 0, cap * sizeof(uint32_t), stream), "ticket reset"));
    } else {
      TESSERA_TRY(cuda_status(cudaMallocAsync(&ptr, cap * sizeof(uint32_t), stream), "ticket allocation"));
      TESSERA_TRY(cuda_status(cudaMemsetAsync(ptr, 0, cap * sizeof(uint32_t), stream), "ticket reset"));
      if (e.ptr && !e.plain) TESSERA_TRY(cuda_status(cudaFreeAsync(e.ptr, stream), "ticket release"));
    }
    e = {static_cast<uint32_t*>(ptr), cap, rec != cudaStreamCaptureStatusNone};
  }
  *out = e.ptr;
  return {};
}

// ---- Decode-once product: acc = xh · W' on cuBLASLt -------------------------------------------------------

/// Rows at which the heuristic picks the one algorithm of a layer shape, and the cuBLASLt workspace offered.
constexpr int64_t kLtPlanRows = 4096;
constexpr size_t kLtWorkspaceBytes = size_t{8} << 20;

Status lt_status(cublasStatus_t e, char const* what) {
  if (e == CUBLAS_STATUS_SUCCESS) return {};
  return Status(StatusCode::kCudaError, std::string("exl3 cuBLASLt ") + what + ": " + cublasLtGetStatusString(e));
}

/// One cuBLASLt handle per device (a handle holds no stream; calls on it may come from any thread).
Status lt_handle(int dev, cublasLtHandle_t* out) {
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(dev);
  if (it == handles.end()) {
    cublasLtHandle_t h = nullptr;
    TESSERA_TRY(lt_status(cublasLtCreate(&h), "create"));
    it = handles.emplace(dev, h).first;
  }
  *out = it->second;
  return {};
}

/// acc [m, n] = xh [m, k] · W' (all row-major; W' held as W'ᵀ [n, k]) in cuBLAS's column-major terms:
/// D (n × m, ld n) = op_T(A) · B with A = W'ᵀ as stored (k × n, ld k) and B = xh as stored (k × m, ld k) —
/// both operands K-major (the "TN" layout); fp16 A and B, fp32 C = D, fp32 compute and scale (alpha 1, beta 0).
struct LtProblem {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Status init(int64_t m, int64_t k, int64_t n) {
    TESSERA_TRY(lt_status(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc"));
    cublasOperation_t const ta = CUBLAS_OP_T;
    TESSERA_TRY(lt_status(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa"));
    TESSERA_TRY(lt_status(cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k), "layout W'"));
    TESSERA_TRY(lt_status(cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k), "layout xh"));
    return lt_status(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n), "layout acc");
  }
  ~LtProblem() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

/// The one algorithm a layer shape (k, n) uses at every row count: the first candidate of cuBLASLt's
/// heuristic at m = kLtPlanRows that neither splits k nor reduces partial results. cuBLAS's own choice
/// changes with m (tile shape, split-K); one fixed algorithm walks k in one order for every output tile, so
/// a row's acc does not depend on m or on the other rows within this path.
Status lt_algo(cublasLtHandle_t h, int dev, int64_t k, int64_t n, cublasLtMatmulAlgo_t* out) {
  static std::mutex mu;
  static std::map<std::tuple<int, int64_t, int64_t>, cublasLtMatmulAlgo_t> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto const key = std::make_tuple(dev, k, n);
  if (auto it = cache.find(key); it != cache.end()) {
    *out = it->second;
    return {};
  }
  LtProblem pr;
  TESSERA_TRY(pr.init(kLtPlanRows, k, n));
  cublasLtMatmulPreference_t pref = nullptr;
  TESSERA_TRY(lt_status(cublasLtMatmulPreferenceCreate(&pref), "preference"));
  uint64_t const ws = kLtWorkspaceBytes;
  uint32_t const scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme);
  cublasLtMatmulHeuristicResult_t res[16] = {};
  int count = 0;
  cublasStatus_t const hs = cublasLtMatmulAlgoGetHeuristic(h, pr.op, pr.a, pr.b, pr.c, pr.c, pref, 16, res, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  TESSERA_TRY(lt_status(hs, "heuristic"));
  for (int i = 0; i < count; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > kLtWorkspaceBytes) continue;
    int32_t splitk = 1;
    uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &written);
    cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &written);
    if (splitk > 1 || red != CUBLASLT_REDUCTION_SCHEME_NONE) continue;
    cache.emplace(key, res[i].algo);
    *out = res[i].algo;
    return {};
  }
  return not_supported("exl3: cuBLASLt offers no algorithm without split-K for k=" + std::to_string(k) +
                       " n=" + std::to_string(n));
}

/// acc = xh · W' with the layer shape's fixed algorithm (lt_algo); wt = W'ᵀ [n, k].
Status lt_gemm(__half const* xh, __half const* wt, float* acc, int64_t m, int64_t k, int64_t n, void* ws,
               cudaStream_t stream) {
  int dev = 0;
  TESSERA_TRY(cuda_status(cudaGetDevice(&dev), "device query"));
  cublasLtHandle_t h = nullptr;
  TESSERA_TRY(lt_handle(dev, &h));
  cublasLtMatmulAlgo_t algo;
  TESSERA_TRY(lt_algo(h, dev, k, n, &algo));
  LtProblem pr;
  TESSERA_TRY(pr.init(m, k, n));
  float const alpha = 1.f, beta = 0.f;
  return lt_status(cublasLtMatmul(h, pr.op, &alpha, wt, pr.a, xh, pr.b, &beta, acc, pr.c, acc, pr.c, &algo, ws,
                                  kLtWorkspaceBytes, stream),
                   "matmul");
}

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
  int64_t const rows = a.transposed ? d.n : d.k, cols = a.transposed ? d.k : d.n;
  if (!a.trellis.data || !a.w.data || !a.w.is_contiguous() || a.w.shape[0] != rows || a.w.shape[1] != cols)
    return invalid_argument("exl3 dequant: trellis and w [k, n] ([n, k] transposed; contiguous, device) required");
  auto stream = reinterpret_cast<cudaStream_t>(ctx.stream);
  return kx::cuda_status((a.transposed ? kx::kReconstructT : kx::kReconstruct)[kx::table_index(d)](a.trellis.data, reinterpret_cast<__half*>(a.w.data),
                                                              static_cast<int>(d.k / 16), static_cast<int>(d.n / 16), stream),
                         "reconstruct launch");
}

Status Exl3Gemm<Backend::kCuda>::check(Exl3GemmDesc const& d, DeviceInfo const& dev) {
  TESSERA_TRY(check_exl3_layer(d.layer));
  if (!exl3_cuda_supports_k2(d.layer.k2)) return not_supported("exl3 CUDA: half-integer rates are CPU-only");
  if (d.out_type != DType::kF16 && d.out_type != DType::kF32) return not_supported("exl3 gemm: output must be f16 or f32");
  if (d.num_rows < 0 || d.num_rows > 0x7FFFFFFF) return invalid_argument("exl3 gemm: row count out of range");
  TESSERA_TRY(check_exl3_chunk_n(d));
  return kx::check_device(dev);
}

namespace {
/// Tactics: 1 GEMV with the fused epilogue, 2 GEMM (chain in registers), 3 naive reference, 4 decode-once
/// (W' decoded to fp16 scratch once, acc = xh·W' on cuBLASLt), 5 GEMV then the epilogue kernel.
/// Auto: up to 16 rows the GEMV, its epilogue fused for one row of a small layer (≤ 2^17 tiles) and a
/// separate kernel otherwise (H200: fused saves 0.4–1.4 µs per op at one row of the ≤ 6 MB layers; at 2+
/// rows, or with ≥ 1000 column groups as on the head, the elected blocks' serial reduction costs more
/// than the second launch); 4 from kExl3DecodeOnceMinRows rows unless strict_rows; 2 otherwise.
int gemm_tactic(Exl3GemmDesc const& d, int impl_override) {
  if (impl_override > 0) return impl_override;
  if (d.num_rows <= 16) return d.num_rows == 1 && kx::gemv_fuses_transform(d.layer.k / 16, d.layer.n / 16) ? 1 : 5;
  return !d.strict_rows && d.num_rows >= kExl3DecodeOnceMinRows ? 4 : 2;
}
/// The chunk count S of the chunk chain: chosen for chunk_n (a part of a wider layer sums in its order), else n.
int gemm_chunks(Exl3GemmDesc const& d) {
  return kx::exl3_num_chunks(static_cast<int>(d.layer.k / 16), static_cast<int>((d.chunk_n ? d.chunk_n : d.layer.n) / 16));
}
size_t gemm_workspace(Exl3GemmDesc const& d, int tactic) {
  auto const m = static_cast<size_t>(d.num_rows), k = static_cast<size_t>(d.layer.k), n = static_cast<size_t>(d.layer.n);
  size_t const xh = kx::align256(m * k * 2);
  if (tactic == 4) return xh + kx::align256(k * n * 2) + kx::align256(m * n * 4) + kx::kLtWorkspaceBytes;
  int const s = gemm_chunks(d);
  size_t const chunks = tactic == 1 || tactic == 5 ? static_cast<size_t>(s) : 1;
  return xh + kx::align256(chunks * m * n * 4);
}
}  // namespace

size_t Exl3Gemm<Backend::kCuda>::workspace_bytes(Exl3GemmDesc const& d) {
  return gemm_workspace(d, gemm_tactic(d, -1));
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
  int const tactic = gemm_tactic(d, ctx.impl_override);
  if (tactic < 1 || tactic > 5)
    return invalid_argument("exl3 gemm: impl_override " + std::to_string(ctx.impl_override) + " is not 1..5");
  kx::Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, gemm_workspace(d, tactic)));
  auto* xh = static_cast<__half*>(ws.ptr);
  auto* partial = reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + kx::align256(static_cast<size_t>(m * l.k) * 2));
  cudaStream_t stream = ws.stream;
  bool const gemv = tactic == 1 || tactic == 5;

  kx::XformParams xp;
  xp.x = reinterpret_cast<__half const*>(a.x.data);
  xp.suh = reinterpret_cast<__half const*>(a.suh.data);
  xp.xh = xh;
  xp.rows = m;
  xp.k = l.k;
  // Small layers: the GEMV applies the input transform itself while staging its A fragments (one launch
  // less); large ones keep the transform kernel (the GEMV's staging repeats it in every column block).
  bool const fuse = gemv && kx::gemv_fuses_transform(l.k / 16, l.n / 16);
  if (!fuse)
    TESSERA_TRY(kx::cuda_status(kx::launch_pdl(kx::exl3_input_transform_kernel,
                                                 dim3(static_cast<unsigned>((m + kx::kRowsPerWarp - 1) / kx::kRowsPerWarp),
                                                      static_cast<unsigned>((l.k + 511) / 512)),
                                                 dim3(128), 0, stream, xp),
                                "input transform launch"));

  kx::EpilogueParams ep;
  ep.partial = partial;
  ep.num_chunks = 1;
  ep.rows = m;
  ep.n = l.n;
  ep.svh = reinterpret_cast<__half const*>(a.svh.data);
  ep.bias = d.has_bias ? reinterpret_cast<__half const*>(a.bias.data) : nullptr;
  if (f16) ep.y16 = reinterpret_cast<__half*>(a.y_f16.data);
  else ep.y32 = a.y_f32.data;

  if (tactic == 4) {
    // W'ᵀ bit-exact into scratch (spec §3), acc = xh·W' in fp32 on the tensor cores (cuBLASLt, one fixed
    // algorithm per layer shape), then the epilogue kernel with S = 1.
    auto* wt = reinterpret_cast<__half*>(partial);
    auto* acc = reinterpret_cast<float*>(reinterpret_cast<char*>(wt) + kx::align256(static_cast<size_t>(l.k * l.n) * 2));
    void* lt_ws = reinterpret_cast<char*>(acc) + kx::align256(static_cast<size_t>(m * l.n) * 4);
    TESSERA_TRY(kx::cuda_status(kx::kReconstructT[kx::table_index(l)](a.trellis.data, wt, static_cast<int>(l.k / 16),
                                                                      static_cast<int>(l.n / 16), stream),
                                "reconstruct launch"));
    TESSERA_TRY(kx::lt_gemm(xh, wt, acc, m, l.k, l.n, lt_ws, stream));
    ep.partial = acc;
  } else {
    kx::Exl3MmaParams p;
    p.xh = xh;
    p.trellis = a.trellis.data;
    p.partial = partial;
    p.num_rows = m;
    p.k = l.k;
    p.n = l.n;
    p.tiles_k = static_cast<int>(l.k / 16);
    p.tiles_n = static_cast<int>(l.n / 16);
    p.num_chunks = gemm_chunks(d);
    p.chunk_tiles = p.tiles_k / p.num_chunks;
    if (gemv) {
      ep.num_chunks = p.num_chunks;
      if (fuse) {
        p.x = xp.x;
        p.suh = xp.suh;
      }
      if (tactic == 1) {   // one launch: the GEMV's last block per column group runs the epilogue
        TESSERA_TRY(kx::gemv_tickets(stream, static_cast<size_t>(l.n / 128), &p.tickets));
        p.svh = ep.svh;
        p.bias = ep.bias;
        p.y16 = ep.y16;
        p.y32 = ep.y32;
      }
      TESSERA_TRY(kx::cuda_status(kx::kGemv[kx::table_index(l)](p, 1, stream), "gemv launch"));
      if (tactic == 1) return {};
    } else if (tactic == 2) {
      TESSERA_TRY(kx::cuda_status(kx::kGemm[kx::table_index(l)](p, 1, stream), "gemm launch"));
    } else {
      kx::exl3_naive_acc_kernel<<<dim3(static_cast<unsigned>((l.n + 127) / 128), static_cast<unsigned>(m)), 128, 0, stream>>>(
          xh, a.trellis.data, partial, m, l.k, l.n, l.k2, static_cast<int>(l.codebook));
      TESSERA_TRY(kx::cuda_status(cudaGetLastError(), "naive launch"));
    }
  }
  // One accumulator (GEMM, naive, decode-once): the row-batched kernel; chunk partials: the chain kernel.
  if (ep.num_chunks == 1)
    return kx::cuda_status(kx::launch_pdl(kx::exl3_epilogue_acc_kernel,
                                          dim3(static_cast<unsigned>((m + kx::kRowsPerWarp - 1) / kx::kRowsPerWarp),
                                               static_cast<unsigned>((l.n + 511) / 512)),
                                          dim3(128), 0, stream, ep),
                           "epilogue launch");
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

namespace {
/// Paths of the grouped op (ctx.impl_override): 1 GEMV with the epilogue fused, 2 grouped GEMM (the chunk chain
/// in registers, one accumulator per output), 5 GEMV then the epilogue kernel; any other value: auto (see
/// Exl3GroupedGemm<kCuda> in ops/exl3.hpp). One token of a small layer: 1 (one launch); from
/// kExl3GroupedGemmMinRows rows per expert on average: 2; otherwise 5.
/// TESSERA_EXL3_GEMM_MIN=n (n ≥ 1) replaces kExl3GroupedGemmMinRows (read once; for A/B runs: the paths give the
/// same bits, only the speed differs).
int grouped_path(Exl3GroupedGemmDesc const& d, int impl_override) {
  static int64_t const min_rows = [] {
    char const* e = std::getenv("TESSERA_EXL3_GEMM_MIN");
    int64_t const v = e ? std::atoll(e) : 0;
    return v >= 1 ? v : kExl3GroupedGemmMinRows;
  }();
  if (impl_override == 1 || impl_override == 2 || impl_override == 5) return impl_override;
  if (d.num_tokens == 1 && kx::gemv_fuses_transform(d.layer.k / 16, d.layer.n / 16)) return 1;
  return d.num_assignments >= min_rows * d.num_experts ? 2 : 5;
}
/// fp16 xh [A, k] + fp32 chunk partials [S][A][n] (GEMV) or accumulators [A][n] (grouped GEMM).
size_t grouped_workspace(Exl3GroupedGemmDesc const& d, int path) {
  auto const a = static_cast<size_t>(d.num_assignments);
  int const s = path == 2 ? 1 : kx::exl3_num_chunks(static_cast<int>(d.layer.k / 16), static_cast<int>(d.layer.n / 16));
  return kx::align256(a * static_cast<size_t>(d.layer.k) * 2) +
         kx::align256(static_cast<size_t>(s) * a * static_cast<size_t>(d.layer.n) * 4);
}
}  // namespace

size_t Exl3GroupedGemm<Backend::kCuda>::workspace_bytes(Exl3GroupedGemmDesc const& d) {
  return grouped_workspace(d, grouped_path(d, -1));
}

Status Exl3GroupedGemm<Backend::kCuda>::run(Exl3GroupedGemmDesc const& d, Exl3GroupedGemmArgs const& a, ExecContext& ctx) {
  TESSERA_TRY(check(d, ctx.device));
  Exl3LayerDesc const& l = d.layer;
  if (!a.trellis || !a.suh || !a.svh || !a.expert_offsets || !a.token_idx || !a.x.data || !a.y.data)
    return invalid_argument("exl3 grouped gemm: pointer arrays, x and y required");
  if (a.y.shape[0] != d.num_assignments || a.y.shape[1] != l.n || a.x.shape[1] != l.k)
    return invalid_argument("exl3 grouped gemm: x [T, k] and y [A, n] required");
  if (d.num_assignments == 0) return {};
  int const path = grouped_path(d, ctx.impl_override);
  kx::Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, grouped_workspace(d, path)));
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
  if (path != 2 && kx::gemv_fuses_transform(l.k / 16, l.n / 16)) {
    // The GEMV applies the input transform (token gather, the expert's suh) while staging A fragments.
    p.x = xp.x;
    p.token_idx = xp.token_idx;
    p.suh_e = xp.suh_e;
  } else {
    // The grouped GEMM always reads xh: each of its tiles is staged by tiles_n / 8 column blocks.
    TESSERA_TRY(kx::cuda_status(kx::launch_pdl(kx::exl3_input_transform_kernel,
                                                 dim3(static_cast<unsigned>((rows + kx::kRowsPerWarp - 1) / kx::kRowsPerWarp),
                                                      static_cast<unsigned>((l.k + 511) / 512)),
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
  if (path == 2) {
    // The whole chunk chain per output in the GEMM's registers: one accumulator [A][n] (the epilogue's S = 1).
    TESSERA_TRY(kx::cuda_status(kx::kGroupedGemm[kx::table_index(l)](p, e, stream), "grouped gemm launch"));
  } else {
    // Path 1: one launch, the GEMV's last block per (expert, column group) runs the epilogue (see gemm_tactic).
    if (path == 1) {
      TESSERA_TRY(kx::gemv_tickets(stream, static_cast<size_t>(e) * static_cast<size_t>(l.n / 128), &p.tickets));
      p.svh_e = reinterpret_cast<__half const* const*>(a.svh);
      p.route_weight = a.route_weight;
      p.y32 = a.y.data;
    }
    TESSERA_TRY(kx::cuda_status(kx::kGemv[kx::table_index(l)](p, e, stream), "grouped gemv launch"));
    if (path == 1) return {};
  }

  kx::EpilogueParams ep;
  ep.partial = partial;
  ep.num_chunks = path == 2 ? 1 : p.num_chunks;
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

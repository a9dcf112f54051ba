// SPDX-License-Identifier: Apache-2.0
/// Glue kernels of the GPU model's EXL3 linears (models/deepseek_v41/gpu_exl3.cpp; host twins there, same
/// arithmetic; the contract in models/deepseek_v41/exl3_linear.cpp):
///   to_f16        out[r, c] = →fp16(x[r·stride + c]) (RNE)
///   store_md      dst[r·stride + c] = →md(src[r·src_stride + c])
///   exl3_moe_act  act[a, i] = →fp16(→md(w_a·(silu(min(g, L))·clamp(u, ±L)))), g, u = →md(G / U[a, i])
///   moe_act       act[a, i] = →md(silu(min(g, L))·clamp(u, ±L)) in fp32 (the sharded shared expert)
///   moe_combine   out[t, :] = →md(Σ_{a in list(t)} →md(Y[a, :]) + →md(Ysh[t, :])), list(t) in ascending expert
///                 id, summed from +0 in fp32 in that order (MoeExperts' order)
///   moe_group     the routing grouped by expert and the combine lists (MoeGroupParams): one block of
///                 kGroupThreads, a stable counting sort of the slots by expert (ranks from warp matches and
///                 in-order scans, no atomics), so the arrays are a pure function of the routing
/// Each output element of the others depends only on its own row's inputs (row invariance).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "models/deepseek_v41/gpu_internal.hpp"
#include "tessera/device/arith.cuh"
#include "tessera/device/pdl.cuh"

namespace tessera::model::dsv41::gpu {

namespace {

__global__ void to_f16_kernel(float const* x, int64_t stride, int64_t cols, uint16_t* out) {
  device::pdl_enter();
  int64_t const r = blockIdx.y;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[r * cols + c] = __half_as_ushort(__float2half_rn(x[r * stride + c]));
}

__global__ void store_md_kernel(float const* src, int64_t src_stride, int64_t cols, float* dst, int64_t stride, bool bf16) {
  device::pdl_enter();
  int64_t const r = blockIdx.y;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[r * stride + c] = device::round_md(src[r * src_stride + c], bf16);
}

/// Out uint16_t: fp16 bits of the activation (EXL3 inputs); float: the activation itself.
/// Rows a = blockIdx.y, blockIdx.y + gridDim.y, … < rows (an expert step has tokens × top_k rows, past the 65,535
/// blocks of grid y), each row's values its own.
template <class Out>
__global__ void moe_act_kernel(float const* g, float const* u, float const* w, int32_t const* row_count, int64_t rows,
                               int64_t inter, float limit, bool bf16, Out* out) {
  device::pdl_enter();
  int64_t const used = row_count ? min(rows, static_cast<int64_t>(*row_count)) : rows;
  for (int64_t a = blockIdx.y; a < used; a += gridDim.y) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < inter;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float gv = device::round_md(g[a * inter + i], bf16), uv = device::round_md(u[a * inter + i], bf16);
      if (limit > 0.f) {
        uv = fminf(fmaxf(uv, -limit), limit);
        gv = fminf(gv, limit);
      }
      float y = __fmul_rn(device::silu(gv, bf16), uv);
      if (w) y = __fmul_rn(w[a], y);
      if constexpr (sizeof(Out) == 2) out[a * inter + i] = __half_as_ushort(__float2half_rn(device::round_md(y, bf16)));
      else out[a * inter + i] = device::round_md(y, bf16);
    }
  }
}

__global__ void moe_combine_kernel(float const* y, int64_t const* off, int32_t const* list, float const* ysh, int64_t D,
                                   bool bf16, float* out) {
  device::pdl_enter();
  int64_t const t = blockIdx.y;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < D;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int64_t j = off[t]; j < off[t + 1]; ++j) acc = __fadd_rn(acc, device::round_md(y[list[j] * D + o], bf16));
    if (ysh) acc = __fadd_rn(acc, device::round_md(ysh[t * D + o], bf16));
    out[t * D + o] = device::round_md(acc, bf16);
  }
}

constexpr int kGroupThreads = 512;
constexpr int kGroupWarps = kGroupThreads / 32;
static_assert(kMoeGroupMaxExperts <= kGroupThreads, "moe_group scans the expert counts one per thread");

/// Inclusive sum of v over the block in thread order; *total = the sum of the whole block. Every thread calls it.
__device__ int32_t block_inclusive_sum(int32_t v, int32_t* warp_sums, int32_t* total) {
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = 1; d < 32; d <<= 1) {
    int32_t const u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += u;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int32_t w = lane < kGroupWarps ? warp_sums[lane] : 0;
    for (int d = 1; d < 32; d <<= 1) {
      int32_t const u = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += u;
    }
    if (lane < kGroupWarps) warp_sums[lane] = w;
  }
  __syncthreads();
  int32_t const before = warp > 0 ? warp_sums[warp - 1] : 0;
  *total = warp_sums[kGroupWarps - 1];
  __syncthreads();  // warp_sums is free for the next call
  return before + v;
}

/// MoeGroupParams in one block. Thread t owns slots s ≡ t (mod kGroupThreads) in passes 1–2.
///   1. Tiles of kGroupThreads slots in order: a slot's rank among the earlier kept slots of its expert =
///      kept[e] (earlier tiles) + Σ of its expert's matches in the earlier warps of the tile + its matching lanes
///      below it (__match_any_sync), held in slot_assignment[s].
///   2. offsets = exclusive scan of kept over experts; slot_assignment[s] = offsets[e] + rank, token_idx and
///      route_weight at that a; identity and padding.
///   3. Tiles of kGroupThreads tokens: combine_offsets by a block scan of the kept slots per token; thread r
///      places token r's assignments at their rank in (expert id, a) order.
__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(MoeGroupParams const p) {
  device::pdl_enter();
  __shared__ int32_t warp_base[kGroupWarps][kMoeGroupMaxExperts];  // a tile's matches per warp, then their bases
  __shared__ int32_t kept[kMoeGroupMaxExperts + 1];                // kept slots per expert, then offsets
  __shared__ int32_t warp_sums[kGroupWarps];
  int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int const E = static_cast<int>(p.experts);
  int64_t const N = p.tokens, K = p.top_k, S = N * K;
  for (int e = tid; e < E; e += kGroupThreads) kept[e] = 0;
  for (int64_t t0 = 0; t0 < S; t0 += kGroupThreads) {
    for (int e = lane; e < E; e += 32) warp_base[warp][e] = 0;
    int64_t const s = t0 + tid;
    int32_t const id = s < S ? p.ids[s] : -1;
    int32_t const e = id >= 0 && id < E ? id : -1;
    unsigned const peers = __match_any_sync(0xffffffffu, e);
    int32_t const lane_rank = __popc(peers & ((1u << lane) - 1u));
    __syncwarp();
    if (e >= 0 && lane_rank == 0) warp_base[warp][e] = __popc(peers);
    __syncthreads();
    for (int x = tid; x < E; x += kGroupThreads) {
      int32_t run = kept[x];
      for (int w = 0; w < kGroupWarps; ++w) {
        int32_t const c = warp_base[w][x];
        warp_base[w][x] = run;
        run += c;
      }
      kept[x] = run;
    }
    __syncthreads();
    if (s < S) p.slot_assignment[s] = e >= 0 ? warp_base[warp][e] + lane_rank : -1;
    __syncthreads();
  }
  int32_t A = 0;
  int32_t const incl = block_inclusive_sum(tid < E ? kept[tid] : 0, warp_sums, &A);
  if (tid < E) kept[tid + 1] = incl;
  if (tid == 0) kept[0] = 0;
  __syncthreads();
  for (int e = tid; e <= E; e += kGroupThreads) p.offsets[e] = kept[e];
  for (int64_t s = tid; s < S; s += kGroupThreads) {
    int32_t const rank = p.slot_assignment[s];
    if (rank < 0) continue;
    int32_t const a = kept[p.ids[s]] + rank;
    p.slot_assignment[s] = a;
    p.token_idx[a] = static_cast<int32_t>(s / K);
    p.route_weight[a] = p.weights[s];
  }
  for (int64_t a = tid; a < S; a += kGroupThreads) {
    p.identity[a] = static_cast<int32_t>(a);
    if (a >= A) {
      p.token_idx[a] = 0;
      p.route_weight[a] = 0.f;
      p.combine_list[a] = 0;
    }
  }
  __syncthreads();  // slot_assignment of every slot is final (block-wide visibility of global writes)
  if (tid == 0) p.combine_offsets[0] = 0;
  int32_t carry = 0;
  for (int64_t r0 = 0; r0 < N; r0 += kGroupThreads) {
    int64_t const r = r0 + tid;
    int32_t const* sa = p.slot_assignment + (r < N ? r : 0) * K;
    int32_t const* ids = p.ids + (r < N ? r : 0) * K;
    int32_t n_kept = 0;
    if (r < N)
      for (int64_t i = 0; i < K; ++i) n_kept += sa[i] >= 0 ? 1 : 0;
    int32_t tile_total = 0;
    int32_t const end = carry + block_inclusive_sum(n_kept, warp_sums, &tile_total);
    if (r < N) {
      p.combine_offsets[r + 1] = end;
      int32_t const base = end - n_kept;
      for (int64_t i = 0; i < K; ++i) {
        if (sa[i] < 0) continue;
        int32_t rank = 0;
        for (int64_t j = 0; j < K; ++j)
          rank += sa[j] >= 0 && (ids[j] < ids[i] || (ids[j] == ids[i] && sa[j] < sa[i])) ? 1 : 0;
        p.combine_list[base + rank] = sa[i];
      }
    }
    carry += tile_total;
  }
}

Status status_of(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

dim3 grid_of(int64_t rows, int64_t cols) {
  return dim3(static_cast<unsigned>((cols + 255) / 256 < 64 ? (cols + 255) / 256 : 64), static_cast<unsigned>(rows));
}

/// grid_of with at most 65,535 blocks in y (kernels that stride over their rows).
dim3 grid_of_strided(int64_t rows, int64_t cols) { return grid_of(rows < 65535 ? rows : 65535, cols); }

}  // namespace

Status launch_to_f16(CUstream_st* stream, float const* x, int64_t stride, int64_t rows, int64_t cols, uint16_t* out) {
  if (rows == 0 || cols == 0) return {};
  if (rows > 65535) return invalid_argument("to_f16: more than 65535 rows");
  device::launch_pdl(to_f16_kernel, grid_of(rows, cols), 256, 0, stream, x, stride, cols, out);
  return status_of(cudaGetLastError(), "to_f16");
}

Status launch_store_md(CUstream_st* stream, float const* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst,
                       int64_t stride, bool bf16) {
  if (rows == 0 || cols == 0) return {};
  if (rows > 65535) return invalid_argument("store_md: more than 65535 rows");
  device::launch_pdl(store_md_kernel, grid_of(rows, cols), 256, 0, stream, src, src_stride, cols, dst, stride, bf16);
  return status_of(cudaGetLastError(), "store_md");
}

Status launch_exl3_moe_act(CUstream_st* stream, float const* g, float const* u, float const* w, int64_t rows,
                           int32_t const* row_count, int64_t inter, float limit, bool bf16, uint16_t* out) {
  if (rows == 0 || inter == 0) return {};
  device::launch_pdl(moe_act_kernel<uint16_t>, grid_of_strided(rows, inter), 256, 0, stream, g, u, w, row_count, rows,
                     inter, limit, bf16, out);
  return status_of(cudaGetLastError(), "exl3_moe_act");
}

Status launch_moe_act(CUstream_st* stream, float const* g, float const* u, int64_t rows, int64_t inter, float limit,
                      bool bf16, float* out) {
  if (rows == 0 || inter == 0) return {};
  device::launch_pdl(moe_act_kernel<float>, grid_of_strided(rows, inter), 256, 0, stream, g, u, nullptr, nullptr, rows,
                     inter, limit, bf16, out);
  return status_of(cudaGetLastError(), "moe_act");
}

Status launch_moe_combine(CUstream_st* stream, float const* y, int64_t const* off, int32_t const* list,
                          float const* ysh, int64_t tokens, int64_t D, bool bf16, float* out) {
  if (tokens == 0) return {};
  if (tokens > 65535) return invalid_argument("moe_combine: more than 65535 tokens");
  device::launch_pdl(moe_combine_kernel, grid_of(tokens, D), 256, 0, stream, y, off, list, ysh, D, bf16, out);
  return status_of(cudaGetLastError(), "moe_combine");
}

Status launch_moe_group(CUstream_st* stream, MoeGroupParams const& p) {
  TESSERA_TRY(check_moe_group(p));
  device::launch_pdl(moe_group_kernel, 1, kGroupThreads, 0, stream, p);
  return status_of(cudaGetLastError(), "moe_group");
}

}  // namespace tessera::model::dsv41::gpu

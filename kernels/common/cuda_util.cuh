// SPDX-License-Identifier: Apache-2.0
/// Host-side helpers shared by the op-family CUDA entry points: cudaError_t → Status, launch checks,
/// stream-ordered scratch (ctx.workspace when large enough, else cudaMallocAsync freed after the op), and
/// the warp-tiled sequential dot product used by every projection kernel.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "tessera/core/context.hpp"
#include "tessera/core/status.hpp"
#include "tessera/device/arith.cuh"
#include "tessera/device/pdl.cuh"

namespace tessera::kernels {

inline Status cuda_status(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}
/// The status of the last launch (configuration errors surface here, not in the kernel).
inline Status launch_status(char const* kernel) { return cuda_status(cudaGetLastError(), kernel); }

inline cudaStream_t stream_of(ExecContext const& ctx) { return reinterpret_cast<cudaStream_t>(ctx.stream); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }

/// Device scratch for one op: ctx.workspace when it is large enough, else a stream-ordered allocation
/// released (stream-ordered) when the op returns.
struct Scratch {
  void* ptr = nullptr;
  bool owned = false;
  cudaStream_t stream = nullptr;
  Status acquire(ExecContext& ctx, size_t bytes) {
    stream = stream_of(ctx);
    if (ctx.workspace && ctx.workspace_bytes >= bytes) { ptr = ctx.workspace; return {}; }
    owned = true;
    return cuda_status(cudaMallocAsync(&ptr, bytes == 0 ? 256 : bytes, stream), "workspace allocation");
  }
  ~Scratch() {
    if (owned && ptr) cudaFreeAsync(ptr, stream);
  }
};

/// Lane l of a warp gets, for its output o = o0 + l (o < n_out) and each of R input vectors x_r
/// (x + r·x_stride, read by all lanes at once), acc[r] = the dot product x_r·W[o, :] of length n in the order of
/// Acc: device::DotAcc is ref::dot's (32-wide chunks), device::TcDotAcc ref::dot_tc's (16-product tensor-core
/// blocks; ref::gemm_dot for a bf16 output). W is row-major with leading dimension ld. The warp stages
/// 32×32 tiles of W in `tile` (32·33 floats of shared memory owned by this warp) so global loads are
/// coalesced along k; the per-output arithmetic is the same whatever R, the tile or the launch shape. A tile
/// column starts at a multiple of 32, so it holds whole DotAcc chunks and whole 16-product TcDotAcc blocks
/// (TcDotAcc reads the column twice per block: tc::block_step).
template <int R, class W, class Acc = device::DotAcc>
__device__ __forceinline__ void warp_dot_rows(float const* x, int64_t x_stride, int n_x, W const* w, int64_t ld,
                                              int64_t n, int64_t o0, int64_t n_out, float* tile, float (&acc)[R]) {
  int const lane = threadIdx.x & 31;
  static_assert(device::kDotChunk == 32 && 32 % tc::kBlock == 0, "the 32-wide tiles hold whole chunks and blocks");
  Acc d[R];
  for (int64_t k0 = 0; k0 < n; k0 += 32) {
    int64_t const k = k0 + lane;
    for (int j = 0; j < 32; ++j) {
      int64_t const o = o0 + j;
      tile[j * 33 + lane] = (o < n_out && k < n) ? device::load_w(w + o * ld + k) : 0.f;
    }
    __syncwarp();
    int const kk = static_cast<int>(n - k0 < 32 ? n - k0 : 32);
    float const* trow = tile + lane * 33;
    if constexpr (Acc::kWholeChunk) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < n_x)
          d[r].chunk(kk, [&](int t) { return x[r * x_stride + k0 + t]; }, [trow](int t) { return trow[t]; });
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) d[r].begin();
      for (int t = 0; t < kk; ++t) {
        float const wv = trow[t];
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (r < n_x) d[r].step(x[r * x_stride + k0 + t], wv);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) d[r].end();
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = d[r].value();
}

/// warp_dot_rows with the R input vectors given by pointers (xr[r] for r < n_x; gathered token rows).
template <int R, class W, class Acc = device::DotAcc>
__device__ __forceinline__ void warp_dot_rows_ptr(float const* const* xr, int n_x, W const* w, int64_t ld, int64_t n,
                                                  int64_t o0, int64_t n_out, float* tile, float (&acc)[R]) {
  int const lane = threadIdx.x & 31;
  Acc d[R];
  for (int64_t k0 = 0; k0 < n; k0 += 32) {
    int64_t const k = k0 + lane;
    for (int j = 0; j < 32; ++j) {
      int64_t const o = o0 + j;
      tile[j * 33 + lane] = (o < n_out && k < n) ? device::load_w(w + o * ld + k) : 0.f;
    }
    __syncwarp();
    int const kk = static_cast<int>(n - k0 < 32 ? n - k0 : 32);
    float const* trow = tile + lane * 33;
    if constexpr (Acc::kWholeChunk) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < n_x) d[r].chunk(kk, [&](int t) { return xr[r][k0 + t]; }, [trow](int t) { return trow[t]; });
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) d[r].begin();
      for (int t = 0; t < kk; ++t) {
        float const wv = trow[t];
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (r < n_x) d[r].step(xr[r][k0 + t], wv);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) d[r].end();
    }
    __syncwarp();
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = d[r].value();
}


/// The N weights w[0, len) of one ref::dot chunk (N = 32) or one tensor-core block (N = 16), widened to fp32,
/// zeros from len on: 16-byte vector loads when the span is full and aligned (2 KB contiguous per warp when
/// lanes take consecutive chunks), scalar loads otherwise.
template <int N = 32, class W>
__device__ __forceinline__ void load_chunk(W const* w, int len, float (&v)[N]) {
  constexpr int kPerVec = 16 / static_cast<int>(sizeof(W));
  static_assert(N % kPerVec == 0, "whole vectors");
  if (len == N && (reinterpret_cast<uintptr_t>(w) & 15) == 0) {
    uint4 q[N / kPerVec];
#pragma unroll
    for (int i = 0; i < N / kPerVec; ++i) q[i] = __ldg(reinterpret_cast<uint4 const*>(w) + i);
#pragma unroll
    for (int i = 0; i < N / kPerVec; ++i) {
      uint32_t const u[4] = {q[i].x, q[i].y, q[i].z, q[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (sizeof(W) == 2) {
          v[i * 8 + 2 * j] = __uint_as_float(u[j] << 16);
          v[i * 8 + 2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
        } else {
          v[i * 4 + j] = __uint_as_float(u[j]);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int t = 0; t < N; ++t) v[t] = t < len ? device::load_w(w + t) : 0.f;
}

/// ref::dot(x_r, w, n) for R input vectors (x(r, k) gives element k of vector r; r < n_x) and one weight
/// row w, by one warp, with the memory parallelism a decode step needs: lane l runs the FMA chains of
/// chunks l, l + 32, … (ref::dot's 32-wide chunks, each from +0: no chunk depends on another, so all of a
/// lane's weight loads are in flight at once), then every lane adds the chunk sums in chunk order through
/// shuffles. Each value is the same fp32 sequence as ref::dot (and as warp_dot_rows): the split is over
/// independent chunks only. n ≤ 32 · 32 · kChunksPerLane. The R results are returned on every lane.
template <int R, int kChunksPerLane, class W, class X>
__device__ __forceinline__ void warp_dot_chunks(X const& x, int n_x, W const* w, int64_t n, float (&out)[R]) {
  static_assert(device::kDotChunk == 32 && device::kDotFma && !device::kDotCarry,
                "chunk-parallel evaluation needs ref::dot's independent 32-wide FMA chunks");
  int const lane = threadIdx.x & 31;
  int64_t const n_chunks = (n + 31) / 32;
  float part[kChunksPerLane][R];
#pragma unroll
  for (int j = 0; j < kChunksPerLane; ++j) {
    int64_t const c = static_cast<int64_t>(j) * 32 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) part[j][r] = 0.f;
    if (c < n_chunks) {
      int64_t const k0 = c * 32;
      int const len = static_cast<int>(n - k0 < 32 ? n - k0 : 32);
      float wv[32];
      load_chunk(w + k0, len, wv);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= n_x) break;
        float acc = 0.f;
#pragma unroll
        for (int t = 0; t < 32; ++t)
          if (t < len) acc = __fmaf_rn(x(r, k0 + t), wv[t], acc);
        part[j][r] = acc;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.f;
#pragma unroll
  for (int j = 0; j < kChunksPerLane; ++j) {
    if (static_cast<int64_t>(j) * 32 >= n_chunks) break;  // warp-uniform
    for (int s = 0; s < 32; ++s) {
      int64_t const c = static_cast<int64_t>(j) * 32 + s;
      if (c >= n_chunks) break;  // warp-uniform
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float const v = __shfl_sync(0xffffffffu, part[j][r], s);
        out[r] = c == 0 ? v : __fadd_rn(out[r], v);
      }
    }
  }
}

/// ref::dot(x_r, w, n) for R input vectors and one weight row by one warp, coalesced: each warp step reads
/// 512 contiguous bytes of w, one 16-byte vector per lane, so a 32-wide chunk of ref::dot spans L = 32/E
/// lanes (E = 8 bf16 or 4 fp32 weights per vector). A chunk's FMA chain runs across its L lanes in order
/// (lane q extends the chain of lane q − 1, passed by a shuffle), for G steps at once so G vectors per lane
/// are in flight; the chunk sums are then added in chunk order. The same fp32 operations as ref::dot
/// (each chunk from +0, sums in order). Needs n % 32 == 0 and w 16-byte aligned (else warp_dot_chunks).
/// The R results are returned on every lane.
template <int R, class W, class X>
__device__ __forceinline__ void warp_dot_coalesced(X const& x, int n_x, W const* w, int64_t n, float (&out)[R]) {
  static_assert(device::kDotChunk == 32 && device::kDotFma && !device::kDotCarry,
                "the lane split follows ref::dot's independent 32-wide FMA chunks");
  constexpr int E = 16 / static_cast<int>(sizeof(W));  // weights per lane per step
  constexpr int L = 32 / E;                            // lanes per chunk
  constexpr int C = 32 / L;                            // chunks per warp step
  constexpr int G = R >= 4 ? 4 : 8;                    // steps in flight (register budget)
  int const lane = threadIdx.x & 31, q = lane % L, cl = lane / L;
  int64_t const n_chunks = n / 32, steps = (n_chunks + C - 1) / C;
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.f;
  bool first = true;
  for (int64_t s0 = 0; s0 < steps; s0 += G) {
    uint4 v[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      int64_t const c = (s0 + g) * C + cl;
      v[g] = (s0 + g < steps && c < n_chunks) ? __ldg(reinterpret_cast<uint4 const*>(w + c * 32 + q * E))
                                             : make_uint4(0u, 0u, 0u, 0u);
    }
    float acc[G][R];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[g][r] = 0.f;
#pragma unroll
    for (int p = 0; p < L; ++p) {
      if (q == p) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          int64_t const c = (s0 + g) * C + cl;
          if (s0 + g >= steps || c >= n_chunks) continue;
          int64_t const k = c * 32 + q * E;
          uint32_t const u[4] = {v[g].x, v[g].y, v[g].z, v[g].w};
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r >= n_x) break;
#pragma unroll
            for (int e = 0; e < E; ++e) {
              float wv;
              if constexpr (sizeof(W) == 2) wv = __uint_as_float(e % 2 == 0 ? u[e / 2] << 16 : u[e / 2] & 0xffff0000u);
              else wv = __uint_as_float(u[e]);
              acc[g][r] = __fmaf_rn(x(r, k + e), wv, acc[g][r]);
            }
          }
        }
      }
      if (p + 1 < L) {
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float const prev = __shfl_up_sync(0xffffffffu, acc[g][r], 1);
            if (q == p + 1) acc[g][r] = prev;
          }
      }
    }
    // Lanes with q == L − 1 hold the chunk sums; add them in chunk order.
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int j = 0; j < C; ++j) {
        int64_t const c = (s0 + g) * C + j;
        if (s0 + g >= steps || c >= n_chunks) break;  // warp-uniform
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float const cs = __shfl_sync(0xffffffffu, acc[g][r], j * L + L - 1);
          out[r] = first ? cs : __fadd_rn(out[r], cs);
        }
        first = false;
      }
    }
  }
}

/// ref::dot(x_r, W[row], n) by one warp: the coalesced walk when the row allows it, else the chunk-per-lane one.
template <int R, int kChunksPerLane, class W, class X>
__device__ __forceinline__ void warp_dot_row(X const& x, int n_x, W const* w, int64_t n, float (&out)[R]) {
  if (n % 32 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0) warp_dot_coalesced<R>(x, n_x, w, n, out);
  else warp_dot_chunks<R, kChunksPerLane>(x, n_x, w, n, out);
}

/// The two tc::BlockAcc steps of one 32-wide warp step, by the whole warp: lane l holds the product a·b of
/// K index k0 + l, so lanes 0–15 hold block 2j and lanes 16–31 block 2j + 1. A block step is one multi-term
/// addition: given its grid E = max(ex(acc), the block's largest product exponent), its aligned terms are
/// exact integers, which the 16 lanes add in any order (xor-shuffle tree; |Σ| < 16·2^27 fits int32) before
/// tc::block_finish rounds once, on every lane alike. What stays sequential is the chain across blocks: block
/// 2j + 1's E depends on the accumulator after block 2j, so the two steps run one after the other (each: one
/// broadcast of the block's largest exponent, five shuffles of the sum). halves = 1 runs block 2j only (the
/// other holds no K index). acc must be the same on every lane (then so is the result, and every branch here
/// is warp-uniform). The same function of the operands as BlockAcc: block_exponent / aligned_term /
/// block_finish, and the ±inf / NaN path in K order.
__device__ __forceinline__ float warp_tc_block_pair(float acc, float a, float b, int halves) {
  int const lane = threadIdx.x & 31;
  double const p = tc::product_term(a, b);
  int e = tc::product_exponent(a, b);
#pragma unroll
  for (int h = 8; h > 0; h /= 2) {  // the largest exponent of each half
    int const o = __shfl_xor_sync(0xffffffffu, e, h);
    e = o > e ? o : e;
  }
  unsigned const nonfinite = __ballot_sync(0xffffffffu, tc::term_nonfinite(p));
  for (int half = 0; half < halves; ++half) {
    if (tc::block_nonfinite(acc, ((nonfinite >> (16 * half)) & 0xFFFFu) != 0)) {
      double s = acc;  // BlockAcc's ±inf / NaN path: fp64 in K order
      for (int i = 0; i < 16; ++i) s += __shfl_sync(0xffffffffu, p, 16 * half + i);
      acc = static_cast<float>(s);
      continue;
    }
    int const E = tc::block_exponent(acc, __shfl_sync(0xffffffffu, e, 16 * half));
    if (E == tc::kNoExponent) continue;  // acc and the block's products all zero
    int t = (lane >> 4) == half ? static_cast<int>(tc::aligned_term(p, E)) : 0;
#pragma unroll
    for (int h = 16; h > 0; h /= 2) t += __shfl_xor_sync(0xffffffffu, t, h);
    acc = tc::block_finish(acc, t, E);
  }
  return acc;
}

/// ref::dot_tc(x_r, w, n) (tc::BlockAcc's order: ref::gemm_dot for a bf16 output) for R input vectors and one
/// weight row by one warp: warp_dot_row's role for bf16 outputs. Lane l takes K index k0 + l of each 32-wide
/// step (coalesced: 64 contiguous bytes of bf16 weights per warp load, G steps of loads in flight), and the
/// warp runs the step's two blocks with warp_tc_block_pair, rows interleaved. Cost against ref::dot's
/// chunk-parallel walk: no FMA chains but, per row and 16 K, one fp64 product per lane, a handful of integer
/// operations, one exponent broadcast and five shuffles, and the chain across blocks is sequential (the
/// accumulator's exponent sets the next block's grid and is not known in advance), so a row's latency grows
/// with K/16 steps instead of K/1024 chunk rounds; parallelism is across rows of the tile and across outputs
/// (warps). The R results are returned on every lane.
template <int R, class W, class X>
__device__ __forceinline__ void warp_dot_row_tc(X const& x, int n_x, W const* w, int64_t n, float (&out)[R]) {
  static_assert(tc::kBlock == 16, "a warp step is two blocks of 16");
  constexpr int G = 8;  // warp steps of weight loads in flight
  int const lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.f;
  for (int64_t k0 = 0; k0 < n; k0 += 32 * G) {
    float wv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      int64_t const k = k0 + 32 * g + lane;
      wv[g] = k < n ? device::load_w(w + k) : 0.f;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      int64_t const kb = k0 + 32 * g, k = kb + lane;
      if (kb >= n) break;  // warp-uniform
      int const halves = n - kb > 16 ? 2 : 1;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= n_x) break;
        out[r] = warp_tc_block_pair(out[r], k < n ? x(r, k) : 0.f, wv[g], halves);
      }
    }
  }
}

/// warp_lane_sum with the lane width kVec (4 when n % 128 == 0, else 1) fixed at compile time, so comp[]
/// stays in registers and four iterations' loads are issued together (a runtime width kept comp[] in local
/// memory: ~24 µs per 5120-wide row on the H200).
template <int kVec, class Elem>
__device__ __forceinline__ float warp_lane_sum_vec(int64_t n, Elem&& v) {
  int const lane = threadIdx.x & 31;
  float comp[kVec];
#pragma unroll
  for (int c = 0; c < kVec; ++c) comp[c] = 0.f;
#pragma unroll 4
  for (int64_t v0 = lane * kVec; v0 < n; v0 += 32 * kVec)
#pragma unroll
    for (int c = 0; c < kVec; ++c) comp[c] = __fadd_rn(comp[c], v(v0 + c));
  float a = comp[0];
#pragma unroll
  for (int c = 1; c < kVec; ++c) a = __fadd_rn(a, comp[c]);
  for (int h = 16; h > 0; h /= 2) {
    float const b = __shfl_down_sync(0xffffffffu, a, h);
    if (lane < h) a = __fadd_rn(a, b);
  }
  return a;
}

/// ref::lane_sum of v(0..n) by one warp (all lanes call it; the result is valid on lane 0): ref::lane_sum's
/// 32 lanes are the warp's lanes, each summing its strided elements in order (4-wide when n % 128 == 0),
/// then the halving fold lane[t] += lane[t + h] as shuffles. Bitwise equal to device::lane_sum_seq.
template <class Elem>
__device__ __forceinline__ float warp_lane_sum(int64_t n, Elem&& v) {
  return n % 128 == 0 ? warp_lane_sum_vec<4>(n, v) : warp_lane_sum_vec<1>(n, v);
}

/// ref::rms_inv of x[0, n) by one warp (result valid on lane 0): bitwise equal to device::rms_inv_seq.
__device__ __forceinline__ float warp_rms_inv(float const* x, int64_t n, float eps) {
  float const ss = warp_lane_sum(n, [x](int64_t i) { return __fmul_rn(x[i], x[i]); });
  return device::rsqrt_ref(__fadd_rn(__fmul_rn(ss, __fdiv_rn(1.f, static_cast<float>(n))), eps));
}

/// Opts kKernel into `bytes` of dynamic shared memory (above the 48 KiB default) once per device (< 64).
template <auto kKernel>
cudaError_t allow_smem(size_t bytes) {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  uint64_t const bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

}  // namespace tessera::kernels

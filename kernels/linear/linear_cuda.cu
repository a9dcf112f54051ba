// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the linear family (include/tessera/ops/linear.hpp): y[r, o] = →md(ref::gemm_dot(x_r, W_o)),
/// or ref::bmm_dot for fma_chain. The dot order follows the output dtype as on the CPU: ref::dot's 32-wide FMA
/// chunks for fp32, the tensor-core blocks of ref::dot_tc (tc::BlockAcc: 16 products per multi-term addition,
/// truncated alignment, round toward zero) for bf16. Four launch shapes, one value per (row, output) whatever
/// the shape, so the result is bitwise the CPU's and row-invariant:
///   rows ≤ 8 (decode, verify windows): one warp per output (linear_chunks_kernel);
///   rows ≥ 32 (prefill): a 64×64 register-tiled SIMT GEMM (linear_gemm_kernel);
///   otherwise: 4 warps × 32 outputs × 8 rows over 32×32 shared tiles (linear_rows_kernel);
///   fma_chain (wo_a): one thread per (row, output) (linear_fma_chain_kernel).
/// Block-scaled FP8 / FP4 weights (ops::is_block_scaled) run like bf16 weights holding ops::scaled_weight: bf16-output
/// calls on the tensor-core tiles decoding the codes themselves (skinny tiles for decode shapes,
/// kernels/linear/linear_tc_quant*.cuh; the GEMM tile from kTcGemmMinRows rows, linear_tc_quant_gemm.cuh), other
/// calls (fp32 output, misaligned codes) after decoding W to bf16 in stream-ordered memory (linear_dequant_kernel).
/// bf16 weights with a bf16 output (desc.impl = kAuto) run on the tensor cores instead: x is copied to bf16
/// in stream-ordered scratch (linear_x_bf16_kernel; exact, x holds bf16 values) and ops::linear_tc_cuda
/// computes ref::dot_tc with mma.sync m16n8k16 (equal to tc::BlockAcc bit for bit, measured by
/// verify/gpu_ops/linear_tc_test.cpp), storing →bf16 widened to fp32. fma_chain is the same order in bf16
/// (ref::bmm_dot = ref::dot_tc), so wo_a goes there too.
#include <algorithm>
#include <span>
#include <vector>

#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/linear_tc.hpp"

namespace tessera::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 8;

struct LinearParams {
  float const* x = nullptr;  // [rows, in], row stride x_stride
  void const* w = nullptr;   // [out, in] fp32 or bf16
  float* y = nullptr;        // [rows, out], row stride y_stride
  int64_t rows = 0, in = 0, out = 0, x_stride = 0, y_stride = 0;
  bool bf16_out = false;
};

template <class W, class Acc>
__global__ void __launch_bounds__(kWarps * 32) linear_rows_kernel(LinearParams const p) {
  device::pdl_enter();
  __shared__ float tiles[kWarps][32 * 33];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 32;
  int64_t const r0 = static_cast<int64_t>(blockIdx.y) * kRows;
  if (o0 >= p.out) return;
  int const n_x = static_cast<int>(p.rows - r0 < kRows ? p.rows - r0 : kRows);
  float acc[kRows];
  warp_dot_rows<kRows, W, Acc>(p.x + r0 * p.x_stride, p.x_stride, n_x, static_cast<W const*>(p.w), p.in, p.in, o0,
                               p.out, tiles[warp], acc);
  int64_t const o = o0 + lane;
  if (o >= p.out) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (r < n_x) p.y[(r0 + r) * p.y_stride + o] = device::round_md(acc[r], p.bf16_out);
}

/// Few rows (decode, verify windows): one warp per output o, R rows per block row. fp32 output: ref::dot's
/// chunks spread over the lanes (warp_dot_row), every weight load of a row in flight at once instead of one
/// 32×32 tile per step. bf16 output (kTc): the tensor-core blocks with a lane per K index and the block chain
/// run by the whole warp (warp_dot_row_tc). The same values as linear_rows_kernel.
constexpr int kChunkRows = 4;
constexpr int kChunksPerLane = 8;  // in ≤ 8192

template <class W, int R, bool kTc>
__global__ void __launch_bounds__(kWarps * 32) linear_chunks_kernel(LinearParams const p) {
  device::pdl_enter();
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const o = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  int64_t const r0 = static_cast<int64_t>(blockIdx.y) * R;
  if (o >= p.out) return;
  int const n_x = static_cast<int>(p.rows - r0 < R ? p.rows - r0 : R);
  float const* x = p.x + r0 * p.x_stride;
  int64_t const xs = p.x_stride;
  auto xv = [x, xs](int r, int64_t k) { return __ldg(x + r * xs + k); };
  W const* w = static_cast<W const*>(p.w) + o * p.in;
  float acc[R];
  if constexpr (kTc) warp_dot_row_tc<R>(xv, n_x, w, p.in, acc);
  else warp_dot_row<R, kChunksPerLane>(xv, n_x, w, p.in, acc);
  if (lane < R && lane < n_x) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r == lane) p.y[(r0 + r) * p.y_stride + o] = device::round_md(acc[r], p.bf16_out);
  }
}

template <class W, bool kTc>
Status launch_linear_chunks(LinearParams const& p, cudaStream_t st) {
  dim3 const grid(static_cast<unsigned>(ceil_div(p.out, kWarps)), static_cast<unsigned>(ceil_div(p.rows, kChunkRows)));
  if (p.rows == 1)
    device::launch_pdl(linear_chunks_kernel<W, 1, kTc>, dim3(grid.x, 1), kWarps * 32, 0, st, p);
  else
    device::launch_pdl(linear_chunks_kernel<W, kChunkRows, kTc>, grid, kWarps * 32, 0, st, p);
  return launch_status("linear_chunks_kernel");
}

/// Many rows (prefill): a register-tiled SIMT GEMM. A block computes 64 rows × 64 outputs; each K step
/// stages one 32-wide chunk of x and W in shared memory (k-major, widened to fp32), and every thread carries
/// 4 × 4 outputs through it.
///   fp32 output: the chunk's FMA chains of the thread's outputs from +0, then the chunk sums added to the
///     totals in chunk order: ref::dot's order exactly (kDotFma, !kDotCarry), the values of linear_rows_kernel.
///   bf16 output (kTc): the K step is two 16-product blocks (a step starts at a multiple of 32, so at a block
///     boundary). Per block, pass 1 takes each output's largest product exponent and notes ±inf/NaN products,
///     pass 2 adds the aligned terms on the grid E = tc::block_exponent(total, that exponent) into an int32 per
///     output (exact: 16 terms below 2^27), and tc::block_finish rounds once: tc::block_step's arithmetic (so
///     ref::dot_tc's) with one exponent and one integer sum per output in registers and the operands read twice
///     from shared memory. The chain over blocks is sequential per output, as the order demands; parallelism
///     is the 64×64 outputs of the block. Cost against fp32: each product is taken apart twice (exponents,
///     then an fp64 product scaled and truncated to an integer) instead of one FMA.
constexpr int kGemmM = 64, kGemmN = 64, kGemmK = 32, kGemmThreads = 256;
constexpr int64_t kGemmMinRows = 32;  // below: linear_rows_kernel (8-row tiles) or the decode kernels

template <class W, bool kTc>
__global__ void __launch_bounds__(kGemmThreads) linear_gemm_kernel(LinearParams const p) {
  device::pdl_enter();
  static_assert(device::kDotChunk == kGemmK && device::kDotFma && !device::kDotCarry, "one K step = one chunk");
  static_assert(kGemmK % tc::kBlock == 0, "one K step = whole tensor-core blocks");
  __shared__ __align__(16) float xs[kGemmK][kGemmM + 4];
  __shared__ __align__(16) float ws[kGemmK][kGemmN + 4];
  int const tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  int64_t const r0 = static_cast<int64_t>(blockIdx.y) * kGemmM, o0 = static_cast<int64_t>(blockIdx.x) * kGemmN;
  W const* w = static_cast<W const*>(p.w);
  float total[4][4], chunk[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) total[i][j] = 0.f;
  for (int64_t k0 = 0; k0 < p.in; k0 += kGemmK) {
    int const len = static_cast<int>(p.in - k0 < kGemmK ? p.in - k0 : kGemmK);
#pragma unroll
    for (int i = 0; i < kGemmM * kGemmK / kGemmThreads; ++i) {
      int const idx = tid + i * kGemmThreads, r = idx / kGemmK, c = idx % kGemmK;
      int64_t const row = r0 + r, o = o0 + r;
      xs[c][r] = (row < p.rows && c < len) ? __ldg(p.x + row * p.x_stride + k0 + c) : 0.f;
      ws[c][r] = (o < p.out && c < len) ? device::load_w(w + o * p.in + k0 + c) : 0.f;
    }
    __syncthreads();
    if constexpr (kTc) {
      for (int b0 = 0; b0 < len; b0 += tc::kBlock) {
        int const b1 = b0 + tc::kBlock < len ? b0 + tc::kBlock : len;
        int emax[4][4], sum[4][4];
        unsigned nonfinite = 0;  // bit 4i + j: output (i, j) meets an ±inf/NaN product in this block
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) emax[i][j] = tc::kNoExponent, sum[i][j] = 0;
        for (int kk = b0; kk < b1; ++kk) {  // pass 1: the block's largest product exponent per output
          float4 const a = *reinterpret_cast<float4 const*>(&xs[kk][ty * 4]);
          float4 const b = *reinterpret_cast<float4 const*>(&ws[kk][tx * 4]);
          float const av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              int const e = tc::product_exponent(av[i], bv[j]);
              emax[i][j] = e > emax[i][j] ? e : emax[i][j];
              if (tc::product_nonfinite(av[i], bv[j])) nonfinite |= 1u << (4 * i + j);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) emax[i][j] = tc::block_exponent(total[i][j], emax[i][j]);  // E
        for (int kk = b0; kk < b1; ++kk) {  // pass 2: the aligned terms (a nonzero product implies E is set)
          float4 const a = *reinterpret_cast<float4 const*>(&xs[kk][ty * 4]);
          float4 const b = *reinterpret_cast<float4 const*>(&ws[kk][tx * 4]);
          float const av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (av[i] != 0.f && bv[j] != 0.f && !((nonfinite >> (4 * i + j)) & 1u))
                sum[i][j] += static_cast<int>(tc::aligned_term(tc::product_term(av[i], bv[j]), emax[i][j]));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (tc::block_nonfinite(total[i][j], (nonfinite >> (4 * i + j)) & 1u)) {
              double s = total[i][j];  // ±inf / NaN: fp64 in K order (tc::block_step)
              for (int kk = b0; kk < b1; ++kk) s += tc::product_term(xs[kk][ty * 4 + i], ws[kk][tx * 4 + j]);
              total[i][j] = static_cast<float>(s);
            } else {
              total[i][j] = tc::block_finish(total[i][j], sum[i][j], emax[i][j]);
            }
          }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) chunk[i][j] = 0.f;
      for (int kk = 0; kk < len; ++kk) {
        float4 const a = *reinterpret_cast<float4 const*>(&xs[kk][ty * 4]);
        float4 const b = *reinterpret_cast<float4 const*>(&ws[kk][tx * 4]);
        float const av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) chunk[i][j] = __fmaf_rn(av[i], bv[j], chunk[i][j]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) total[i][j] = k0 == 0 ? chunk[i][j] : __fadd_rn(total[i][j], chunk[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int64_t const row = r0 + ty * 4 + i;
    if (row >= p.rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int64_t const o = o0 + tx * 4 + j;
      if (o < p.out) p.y[row * p.y_stride + o] = device::round_md(total[i][j], p.bf16_out);
    }
  }
}

/// fma_chain order (ref::bmm_dot; small projections only: wo_a): one thread per (row, output). The block's
/// x row is staged in shared memory and each thread streams its weight row with 16-byte loads. fp32 output:
/// one FMA chain (ref::dot_fma_seq), the vectors a few ahead of the chain (the chain itself is sequential by
/// definition of the order). bf16 output: ref::dot_tc, one 16-weight block in registers at a time (two or
/// four vectors) run as tc::block_step (sequential across blocks by definition of the order).
template <class W>
__global__ void __launch_bounds__(128) linear_fma_chain_kernel(LinearParams const p) {
  device::pdl_enter();
  extern __shared__ float xs[];
  int64_t const o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, r = blockIdx.y;
  float const* x = p.x + r * p.x_stride;
  for (int64_t i = threadIdx.x; i < p.in; i += blockDim.x) xs[i] = x[i];
  __syncthreads();
  if (o >= p.out) return;
  W const* w = static_cast<W const*>(p.w) + o * p.in;
  constexpr int kPerVec = 16 / static_cast<int>(sizeof(W));
  float acc = 0.f;
  if (p.bf16_out) {
    for (int64_t k0 = 0; k0 < p.in; k0 += tc::kBlock) {
      int const len = static_cast<int>(p.in - k0 < tc::kBlock ? p.in - k0 : tc::kBlock);
      float wv[tc::kBlock];
      load_chunk<tc::kBlock>(w + k0, len, wv);  // zeros past len: zero products take no part
      acc = tc::block_step(acc, tc::kBlock, [&](int i) { return i < len ? xs[k0 + i] : 0.f; },
                           [&](int i) { return wv[i]; });
    }
    p.y[r * p.y_stride + o] = device::round_md(acc, true);
    return;
  }
  int64_t i = 0;
  if ((reinterpret_cast<uintptr_t>(w) & 15) == 0) {
    uint4 const* wv = reinterpret_cast<uint4 const*>(w);
    int64_t const nv = p.in / kPerVec;
#pragma unroll 4
    for (int64_t v = 0; v < nv; ++v) {
      uint4 const q = __ldg(wv + v);
      uint32_t const u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (sizeof(W) == 2) {
          acc = device::fma_step(acc, xs[v * 8 + 2 * j], __uint_as_float(u[j] << 16));
          acc = device::fma_step(acc, xs[v * 8 + 2 * j + 1], __uint_as_float(u[j] & 0xffff0000u));
        } else {
          acc = device::fma_step(acc, xs[v * 4 + j], __uint_as_float(u[j]));
        }
      }
    }
    i = nv * kPerVec;
  }
  for (; i < p.in; ++i) acc = device::fma_step(acc, xs[i], device::load_w(w + i));
  p.y[r * p.y_stride + o] = device::round_md(acc, p.bf16_out);
}

/// xb[r, i] = →bf16(x[r, i]) for the tensor-core path; rows of xb are ldxb apart. Grid-stride, one element
/// per thread step, coalesced along i.
__global__ void __launch_bounds__(256) linear_x_bf16_kernel(float const* x, int64_t x_stride, int64_t rows, int64_t in,
                                                            uint16_t* xb, int64_t ldxb) {
  device::pdl_enter();
  int64_t const total = rows * in;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t const r = t / in, i = t - r * in;
    xb[r * ldxb + i] = bf16_bits_from_float(__ldg(x + r * x_stride + i));
  }
}

/// The tensor-core path of bf16-weight (or block-scaled, fused) bf16-output calls that read one x (see the file
/// comment): x → bf16 once, then every (call, group) product in one batched launch (linear_tc_cuda_batch). Every
/// call has d[0]'s rows, in, groups and weight format and reads a[0]'s x: one call alone (run_linear_tc; a grouped
/// call's groups share the launch) or Linear<kCuda>::run_shared_x's set.
Status run_linear_tc_shared_x(std::span<ops::LinearDesc const> d, std::span<ops::LinearArgs const> a, ExecContext& ctx) {
  ops::LinearDesc const& d0 = d[0];
  int64_t const cols = d0.groups * d0.in;
  int64_t const ldxb = (cols + 7) / 8 * 8;  // 16-byte rows: the vec16 staging when in % 8 == 0
  Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, align256(static_cast<size_t>(d0.rows * ldxb) * sizeof(uint16_t))));
  auto* xb = static_cast<uint16_t*>(ws.ptr);
  int64_t const total = d0.rows * cols;
  unsigned const blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(total, 256), 8192));
  device::launch_pdl(linear_x_bf16_kernel, blocks, 256, 0, stream_of(ctx), a[0].x.data, a[0].x.stride[0], d0.rows, cols,
                     xb, ldxb);
  TESSERA_TRY(launch_status("linear_x_bf16_kernel"));
  bool const scaled = ops::is_block_scaled(d0.weight_dtype);
  std::vector<ops::LinearTcDesc> td;
  std::vector<ops::LinearTcArgs> ta;
  for (size_t i = 0; i < d.size(); ++i)
    for (int64_t g = 0; g < d[i].groups; ++g) {
      ops::LinearTcDesc& t = td.emplace_back();
      t.m = d[i].rows, t.n = d[i].out, t.k = d[i].in;
      ops::LinearTcArgs& u = ta.emplace_back();
      u.x = reinterpret_cast<Bf16 const*>(xb + g * d[i].in);
      if (scaled) {
        ops::LinearArgs const ga = ops::linear_group(d[i], a[i], g);
        u.w_format = d[i].weight_dtype;
        u.w_q = ga.w_q.data, u.ldw_q = ga.w_q.stride[0];
        u.w_scale = ga.w_scale.data, u.ldw_scale = ga.w_scale.stride[0];
      } else {
        u.w = a[i].w_bf16.data + g * d[i].out * a[i].w_bf16.stride[0];
        u.ldw = a[i].w_bf16.stride[0];
      }
      u.y = a[i].y.data + g * d[i].out;
      u.ldx = ldxb, u.ldy = a[i].y.stride[0];
      u.y_round_bf16 = true;
    }
  return ops::linear_tc_cuda_batch(td, ta, ctx);
}

Status run_linear_tc(ops::LinearDesc const& d, ops::LinearArgs const& a, ExecContext& ctx) {
  return run_linear_tc_shared_x({&d, 1}, {&a, 1}, ctx);
}

/// W[o, i] = ops::scaled_weight(...) as bf16 bits, [rows, cols] contiguous.
__global__ void __launch_bounds__(256) linear_dequant_kernel(DType fmt, uint8_t const* q, int64_t ldq, uint8_t const* s,
                                                             int64_t lds, int64_t rows, int64_t cols, uint16_t* out) {
  device::pdl_enter();
  int64_t const total = rows * cols;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t const r = t / cols, i = t - r * cols;
    out[t] = bf16_bits_from_float(ops::scaled_weight(fmt, q, ldq, s, lds, r, i));
  }
}

/// Block-scaled weights: the fused tiles when the call has a bf16 output they take (every group ops::tc_quant_ok),
/// otherwise the weights decoded to bf16 in stream-ordered memory and the bf16 call.
Status run_linear_scaled(ops::LinearDesc const& d, ops::LinearArgs const& a, ExecContext& ctx) {
  if (d.md == DType::kBf16 && d.impl == ops::LinearImpl::kAuto) {
    bool fused = true;
    for (int64_t g = 0; fused && g < d.groups; ++g) {
      ops::LinearArgs const ga = ops::linear_group(d, a, g);
      ops::LinearTcDesc const t{d.rows, d.out, d.in};
      fused = ops::tc_quant_weight_ok(t, d.weight_dtype, ga.w_q.data, ga.w_q.stride[0]);  // x: 16-byte scratch rows
    }
    if (fused) return run_linear_tc(d, a, ctx);
  }
  int64_t const wrows = d.groups * d.out;
  cudaStream_t const st = stream_of(ctx);
  void* wb = nullptr;  // own memory: the bf16 call below takes ctx.workspace for its x copy
  TESSERA_TRY(cuda_status(cudaMallocAsync(&wb, static_cast<size_t>(wrows * d.in) * sizeof(uint16_t), st), "linear: weight decode buffer"));
  unsigned const blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(wrows * d.in, 256), 65535));
  device::launch_pdl(linear_dequant_kernel, blocks, 256, 0, st, d.weight_dtype, a.w_q.data, a.w_q.stride[0], a.w_scale.data,
                                                a.w_scale.stride[0], wrows, d.in, static_cast<uint16_t*>(wb));
  auto bf16_call = [&]() -> Status {
    TESSERA_TRY(launch_status("linear_dequant_kernel"));
    ops::LinearDesc bd = d;
    bd.weight_dtype = DType::kBf16;
    ops::LinearArgs ba = a;
    ba.w_q = {};
    ba.w_scale = {};
    ba.w_bf16 = TensorView<Bf16 const, 2>(static_cast<Bf16 const*>(wb), {wrows, d.in}, a.y.device);
    return ops::Linear<Backend::kCuda>::run(bd, ba, ctx);
  };
  Status const s = bf16_call();
  cudaError_t const e = cudaFreeAsync(wb, st);
  TESSERA_TRY(s);
  return cuda_status(e, "linear: weight decode buffer release");
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<Linear<Backend::kCuda>, LinearDesc, LinearArgs>);

Status Linear<Backend::kCuda>::check(LinearDesc const& d, LinearArgs const& a) { return check_linear(d, a); }

Status Linear<Backend::kCuda>::run_shared_x(std::span<LinearDesc const> d, std::span<LinearArgs const> a,
                                            ExecContext& ctx) {
  using namespace kernels;
  if (d.size() != a.size()) return invalid_argument("linear (shared x): descriptor and argument counts differ");
  for (size_t i = 0; i < d.size(); ++i) TESSERA_TRY(check(d[i], a[i]));
  if (d.empty() || d[0].rows == 0) return {};
  DType const wt = d[0].weight_dtype;
  bool const scaled = is_block_scaled(wt);
  bool batch = d.size() >= 2 && (wt == DType::kBf16 || (scaled && d[0].rows < kTcGemmMinRows));
  for (size_t i = 0; batch && i < d.size(); ++i) {
    batch = d[i].rows == d[0].rows && d[i].in == d[0].in && d[i].groups == 1 && d[i].md == DType::kBf16 &&
            d[i].impl == LinearImpl::kAuto && d[i].weight_dtype == wt && a[i].x.data == a[0].x.data &&
            a[i].x.stride[0] == a[0].x.stride[0];
    if (batch && scaled)
      batch = tc_quant_weight_ok(LinearTcDesc{d[i].rows, d[i].out, d[i].in}, wt, a[i].w_q.data, a[i].w_q.stride[0]);
  }
  if (!batch) {
    for (size_t i = 0; i < d.size(); ++i) TESSERA_TRY(run(d[i], a[i], ctx));
    return {};
  }
  return run_linear_tc_shared_x(d, a, ctx);
}

Status Linear<Backend::kCuda>::run(LinearDesc const& d, LinearArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  LinearParams p;
  p.x = a.x.data;
  p.y = a.y.data;
  p.rows = d.rows; p.in = d.in; p.out = d.out;
  p.x_stride = a.x.stride[0];
  p.y_stride = a.y.stride[0];
  p.bf16_out = d.md == DType::kBf16;
  if (ops::is_block_scaled(d.weight_dtype)) return run_linear_scaled(d, a, ctx);
  if (d.weight_dtype == DType::kBf16 && p.bf16_out && d.impl == ops::LinearImpl::kAuto) return run_linear_tc(d, a, ctx);
  if (d.groups > 1) {  // the CUDA-core kernels: one call per group
    LinearDesc one = d;
    one.groups = 1;
    for (int64_t g = 0; g < d.groups; ++g) TESSERA_TRY(run(one, linear_group(d, a, g), ctx));
    return {};
  }
  if (d.fma_chain) {
    if (d.rows > 65535) return invalid_argument("linear (fma_chain): rows > 65535 per launch");
    if (d.in > 12288) return invalid_argument("linear (fma_chain): in > 12288 (the x row is staged in shared memory)");
    dim3 g(static_cast<unsigned>(ceil_div(d.out, 128)), static_cast<unsigned>(d.rows));
    size_t const smem = static_cast<size_t>(d.in) * sizeof(float);
    if (d.weight_dtype == DType::kBf16) {
      p.w = a.w_bf16.data;
      device::launch_pdl(linear_fma_chain_kernel<Bf16>, g, 128, smem, stream_of(ctx), p);
    } else {
      p.w = a.w.data;
      device::launch_pdl(linear_fma_chain_kernel<float>, g, 128, smem, stream_of(ctx), p);
    }
    return launch_status("linear_fma_chain_kernel");
  }
  bool const bf16_w = d.weight_dtype == DType::kBf16;
  p.w = bf16_w ? static_cast<void const*>(a.w_bf16.data) : static_cast<void const*>(a.w.data);
  if (d.rows <= 2 * kChunkRows && d.in <= 32 * 32 * kChunksPerLane) {
    cudaStream_t const st = stream_of(ctx);
    if (bf16_w) return p.bf16_out ? launch_linear_chunks<Bf16, true>(p, st) : launch_linear_chunks<Bf16, false>(p, st);
    return p.bf16_out ? launch_linear_chunks<float, true>(p, st) : launch_linear_chunks<float, false>(p, st);
  }
  if (d.rows >= kGemmMinRows) {
    dim3 const g(static_cast<unsigned>(ceil_div(d.out, kGemmN)), static_cast<unsigned>(ceil_div(d.rows, kGemmM)));
    if (g.y > 65535) return invalid_argument("linear: rows > 4194240 per launch");
    cudaStream_t const st = stream_of(ctx);
    if (bf16_w && p.bf16_out) device::launch_pdl(linear_gemm_kernel<Bf16, true>, g, kGemmThreads, 0, st, p);
    else if (bf16_w) device::launch_pdl(linear_gemm_kernel<Bf16, false>, g, kGemmThreads, 0, st, p);
    else if (p.bf16_out) device::launch_pdl(linear_gemm_kernel<float, true>, g, kGemmThreads, 0, st, p);
    else device::launch_pdl(linear_gemm_kernel<float, false>, g, kGemmThreads, 0, st, p);
    return launch_status("linear_gemm_kernel");
  }
  dim3 grid(static_cast<unsigned>(ceil_div(d.out, kWarps * 32)), static_cast<unsigned>(ceil_div(d.rows, kRows)));
  if (grid.y > 65535) return invalid_argument("linear: rows > 524280 per launch");
  if (bf16_w && p.bf16_out) device::launch_pdl(linear_rows_kernel<Bf16, device::TcDotAcc>, grid, kWarps * 32, 0,
                                               stream_of(ctx), p);
  else if (bf16_w) device::launch_pdl(linear_rows_kernel<Bf16, device::DotAcc>, grid, kWarps * 32, 0, stream_of(ctx),
                                      p);
  else if (p.bf16_out) device::launch_pdl(linear_rows_kernel<float, device::TcDotAcc>, grid, kWarps * 32, 0,
                                          stream_of(ctx), p);
  else device::launch_pdl(linear_rows_kernel<float, device::DotAcc>, grid, kWarps * 32, 0, stream_of(ctx), p);
  return launch_status("linear_rows_kernel");
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the partial interleaved RoPE family (include/tessera/ops/rope.hpp, ref/rope_ref.hpp), in
/// place, main and compress (YaRN) tables alike (the table is an input), forward and inverse.
/// Block (row, head tile): threads < R/2 form φ_p = f32(pos)·inv_freq_p (one fp32 product, as the reference) and
/// cos/sin →md into shared memory; then every (head, pair) of the tile rotates with separately rounded products.
/// A tile is heads_per_block heads: all of them from kRopeSplitMaxRows rows (one block per row, as many blocks as
/// rows), ⌈256 / (R/2)⌉ below, so a decode row's 64 heads spread over 8 blocks instead of one block walking 2,048
/// pairs in 8 dependent rounds (the cos/sin are recomputed per tile: 32 values). Each element's operations are the
/// same whatever the tiling.
/// cos/sin as ref::rope_cos_sin: bf16 takes cuda_math::cosf/sinf (CUDA's own, replayed identically on the CPU);
/// fp32 evaluates them in fp64 and rounds to fp32 (the CPU through glibc's fp64 cos/sin: equal except where
/// the two fp64 results straddle an fp32 rounding boundary).
#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/rope.hpp"

namespace tessera::kernels {

namespace {

struct RopeParams {
  float* x = nullptr;                 // [rows, heads·head_dim], row stride x_stride
  int64_t const* positions = nullptr; // [rows]
  float const* inv_freq = nullptr;    // [half]
  int64_t rows = 0, heads = 0, head_dim = 0, half = 0, x_stride = 0;
  int64_t heads_per_block = 0;        // heads of a block's tile (grid.y = ⌈heads / heads_per_block⌉)
  bool inverse = false, bf16 = false;
};

constexpr int kRopeThreads = 256;
constexpr int kRopePer = 8;             // pairs per thread loaded before the first store
constexpr int64_t kRopeSplitMaxRows = 64;  // below: head tiles of ~kRopeThreads pairs

__global__ void __launch_bounds__(kRopeThreads) rope_kernel(RopeParams const p) {
  device::pdl_enter();
  extern __shared__ float cs[];  // [2·half]: cos then sin
  int64_t const row = blockIdx.x;
  float const fp = static_cast<float>(p.positions[row]);
  for (int64_t j = threadIdx.x; j < p.half; j += blockDim.x) {
    float const phi = __fmul_rn(fp, p.inv_freq[j]);
    if (p.bf16) {  // CUDA's cosf/sinf, through the libdevice replay the CPU runs too (bitwise)
      cs[j] = round_to_bf16(cuda_math::cosf(phi));
      cs[p.half + j] = round_to_bf16(cuda_math::sinf(phi));
    } else {
      cs[j] = static_cast<float>(cos(static_cast<double>(phi)));
      cs[p.half + j] = static_cast<float>(sin(static_cast<double>(phi)));
    }
  }
  __syncthreads();
  int64_t const h0 = static_cast<int64_t>(blockIdx.y) * p.heads_per_block;
  int64_t const nh = p.heads - h0 < p.heads_per_block ? p.heads - h0 : p.heads_per_block;
  float* const x = p.x + row * p.x_stride + h0 * p.head_dim + p.head_dim - 2 * p.half;
  int64_t const total = nh * p.half;
  for (int64_t t0 = threadIdx.x; t0 < total; t0 += int64_t{kRopePer} * kRopeThreads) {
    float a[kRopePer], b[kRopePer];
#pragma unroll
    for (int q = 0; q < kRopePer; ++q) {
      int64_t const t = t0 + q * kRopeThreads;
      if (t >= total) break;
      float const* r = x + (t / p.half) * p.head_dim + 2 * (t % p.half);
      a[q] = r[0], b[q] = r[1];
    }
#pragma unroll
    for (int q = 0; q < kRopePer; ++q) {
      int64_t const t = t0 + q * kRopeThreads;
      if (t >= total) break;
      int64_t const j = t % p.half;
      float* r = x + (t / p.half) * p.head_dim + 2 * j;
      float const c = cs[j], s = p.inverse ? -cs[p.half + j] : cs[p.half + j];
      float const ac = __fmul_rn(a[q], c), bs = __fmul_rn(b[q], s), as = __fmul_rn(a[q], s), bc = __fmul_rn(b[q], c);
      r[0] = device::round_md(__fsub_rn(ac, bs), p.bf16);
      r[1] = device::round_md(__fadd_rn(as, bc), p.bf16);
    }
  }
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<Rope<Backend::kCuda>, RopeDesc, RopeArgs>);

Status Rope<Backend::kCuda>::check(RopeDesc const& d, RopeArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.rope_dim % 2 == 0 && d.rope_dim <= d.head_dim, "rope_dim must be even and <= head_dim");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.heads * d.head_dim}, "rope x"));
  TESSERA_TRY(check_shape(a.positions, {d.rows}, "rope positions"));
  TESSERA_TRY(check_shape(a.inv_freq, {d.rope_dim / 2}, "rope inv_freq"));
  return {};
}

Status Rope<Backend::kCuda>::run(RopeDesc const& d, RopeArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0 || d.heads == 0 || d.rope_dim == 0) return {};
  RopeParams p;
  p.x = a.x.data; p.positions = a.positions.data; p.inv_freq = a.inv_freq.data;
  p.rows = d.rows; p.heads = d.heads; p.head_dim = d.head_dim; p.half = d.rope_dim / 2;
  p.x_stride = d.heads * d.head_dim;
  p.inverse = d.inverse; p.bf16 = d.md == DType::kBf16;
  size_t const smem = static_cast<size_t>(d.rope_dim) * sizeof(float);
  if (smem > 48 * 1024) return invalid_argument("rope: rope_dim > 12288 is not supported by the CUDA kernel");
  p.heads_per_block = d.rows >= kRopeSplitMaxRows ? d.heads : (kRopeThreads + p.half - 1) / p.half;  // ≥ 1
  int64_t const tiles = ceil_div(d.heads, p.heads_per_block);
  if (d.rows > 0x7FFFFFFF || tiles > 65535) return invalid_argument("rope: grid too large");
  device::launch_pdl(rope_kernel, dim3(static_cast<unsigned>(d.rows), static_cast<unsigned>(tiles)), kRopeThreads, smem,
                     stream_of(ctx), p);
  return launch_status("rope_kernel");
}

}  // namespace tessera::ops

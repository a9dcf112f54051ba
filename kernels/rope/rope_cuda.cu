// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the partial interleaved RoPE family (include/tessera/ops/rope.hpp, ref/rope_ref.hpp), in
/// place, main and compress (YaRN) tables alike (the table is an input), forward and inverse.
/// One block per row: threads < R/2 form φ_p = f32(pos)·inv_freq_p (one fp32 product, as the reference)
/// and cos/sin →md into shared memory; then every (head, pair) rotates with separately rounded products.
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
  bool inverse = false, bf16 = false;
};

__global__ void __launch_bounds__(256) rope_kernel(RopeParams const p) {
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
  float* x = p.x + row * p.x_stride;
  int64_t const total = p.heads * p.half;
  for (int64_t t = threadIdx.x; t < total; t += blockDim.x) {
    int64_t const h = t / p.half, j = t % p.half;
    float* r = x + h * p.head_dim + p.head_dim - 2 * p.half + 2 * j;
    float const a = r[0], b = r[1];
    float const c = cs[j], s = p.inverse ? -cs[p.half + j] : cs[p.half + j];
    float const ac = __fmul_rn(a, c), bs = __fmul_rn(b, s), as = __fmul_rn(a, s), bc = __fmul_rn(b, c);
    r[0] = device::round_md(__fsub_rn(ac, bs), p.bf16);
    r[1] = device::round_md(__fadd_rn(as, bc), p.bf16);
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
  if (d.rows == 0 || d.rope_dim == 0) return {};
  RopeParams p;
  p.x = a.x.data; p.positions = a.positions.data; p.inv_freq = a.inv_freq.data;
  p.rows = d.rows; p.heads = d.heads; p.head_dim = d.head_dim; p.half = d.rope_dim / 2;
  p.x_stride = d.heads * d.head_dim;
  p.inverse = d.inverse; p.bf16 = d.md == DType::kBf16;
  size_t const smem = static_cast<size_t>(d.rope_dim) * sizeof(float);
  if (smem > 48 * 1024) return invalid_argument("rope: rope_dim > 12288 is not supported by the CUDA kernel");
  device::launch_pdl(rope_kernel, static_cast<unsigned>(d.rows), 256, smem, stream_of(ctx), p);
  return launch_status("rope_kernel");
}

}  // namespace tessera::ops

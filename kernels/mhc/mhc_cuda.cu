// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the mHC family (include/tessera/ops/mhc.hpp, ref/mhc_ref.hpp, spec §2.3).
///   MhcMix: one block per row. rsqrt(mean(x²)+eps) by warp 0 in ref::lane_sum's lane order; one warp per
///     mix output forms m_o = Σ_i (x_i·r)·fn[o, i] in ref::dot's order (f_i = x_i·r rounded as the
///     reference's f; coalesced lanes or chunks spread over the lanes, warp_dot_row; the mix is an fp32
///     island, so the order is ref::dot's in both model dtypes); thread 0 then runs the sigmoids, the softmax and the Sinkhorn iterations in the reference's exact order
///     (one column normalisation, then (iters−1)× row + column; the softmax denominator in warp-softmax lanes,
///     the row sums in lane_sum's order, the column sums sequentially). exp in the model dtype's arithmetic
///     (device::exp_md: expf for bf16, fmath::exp_rn for fp32, as ref::exp_md): bitwise on both sides.
///   MhcCollapse / MhcExpand: one thread per output element, Σ over streams in the reference's order.
///     No transcendental: bitwise equal to the CPU.
#include "kernels/common/cuda_util.cuh"
#include "tessera/core/fmath.hpp"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/mhc.hpp"

namespace tessera::kernels {

namespace {

constexpr int kMaxStreams = 8;

struct MhcMixParams {
  float const* x = nullptr;      // [rows, n·D]
  float const* fn = nullptr;     // [(2+n)n, n·D]
  float const* base = nullptr;   // [(2+n)n]
  float const* scale = nullptr;  // [3]
  float* pre = nullptr;          // [rows, n]
  float* post = nullptr;         // [rows, n]
  float* comb = nullptr;         // [rows, n·n]
  int64_t rows = 0, n = 0, d = 0;
  int iters = 1;
  float hc_eps = 0.f, norm_eps = 0.f;
  bool bf16 = false;  // the model dtype: selects exp's arithmetic (nothing is rounded to it)
};

constexpr int kMixThreads = 256;
constexpr int kMixChunksPerLane = 20;  // n·D ≤ 20480 on the chunk-parallel path (the released 4 × 5120)

__global__ void __launch_bounds__(kMixThreads) mhc_mix_kernel(MhcMixParams const p) {
  __shared__ float s_r;
  __shared__ float m[(2 + kMaxStreams) * kMaxStreams];
  int64_t const row = blockIdx.x;
  int64_t const n = p.n, nd = n * p.d, nm = (2 + n) * n;
  float const* x = p.x + row * nd;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == 0) {
    float const r = warp_rms_inv(x, nd, p.norm_eps);
    if (lane == 0) s_r = r;
  }
  __syncthreads();
  float const r = s_r;
  if (nd <= 32 * 32 * kMixChunksPerLane) {  // one warp per mix output, ref::dot's chunks over the lanes
    for (int64_t o = warp; o < nm; o += kMixThreads / 32) {
      float acc[1];
      warp_dot_row<1, kMixChunksPerLane>([x, r](int, int64_t k) { return __fmul_rn(x[k], r); }, 1, p.fn + o * nd,
                                            nd, acc);
      if (lane == 0) m[o] = acc[0];
    }
  } else {
    for (int64_t o = threadIdx.x; o < nm; o += blockDim.x) {
      float const* w = p.fn + o * nd;
      device::DotAcc acc;  // ref::dot(f, fn_o) with f_i = x_i·r
      for (int64_t c0 = 0; c0 < nd; c0 += device::kDotChunk) {
        int64_t const c1 = c0 + device::kDotChunk < nd ? c0 + device::kDotChunk : nd;
        acc.begin();
        for (int64_t i = c0; i < c1; ++i) acc.step(__fmul_rn(x[i], r), __ldg(w + i));
        acc.end();
      }
      m[o] = acc.value();
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float const* base = p.base;
  float* pre = p.pre + row * n;
  float* post = p.post + row * n;
  float* comb = p.comb + row * n * n;
  for (int64_t k = 0; k < n; ++k) {
    float const a = __fmul_rn(m[k], p.scale[0]);
    pre[k] = __fadd_rn(device::sigmoid(__fadd_rn(a, base[k]), p.bf16), p.hc_eps);
    float const b = __fmul_rn(m[n + k], p.scale[1]);
    post[k] = __fmul_rn(2.f, device::sigmoid(__fadd_rn(b, base[n + k]), p.bf16));
  }
  float c[kMaxStreams * kMaxStreams];
  for (int64_t j = 0; j < n; ++j) {
    float* rowc = c + j * n;
    float mx = -INFINITY;
    for (int64_t k = 0; k < n; ++k) {
      float const v = __fmul_rn(m[2 * n + j * n + k], p.scale[2]);
      rowc[k] = __fadd_rn(v, base[2 * n + j * n + k]);
      mx = device::std_max(mx, rowc[k]);
    }
    device::WarpSoftmaxSum sum;
    for (int64_t k = 0; k < n; ++k) {
      rowc[k] = device::exp_md(__fsub_rn(rowc[k], mx), p.bf16);
      sum.add(k, rowc[k]);
    }
    float const s = sum.value();
    for (int64_t k = 0; k < n; ++k) rowc[k] = __fadd_rn(__fdiv_rn(rowc[k], s), p.hc_eps);
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < n; ++k) {
      float s = 0.f;
      for (int64_t j = 0; j < n; ++j) s = __fadd_rn(s, c[j * n + k]);
      float const den = __fadd_rn(s, p.hc_eps);
      for (int64_t j = 0; j < n; ++j) c[j * n + k] = __fdiv_rn(c[j * n + k], den);
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float const s = device::lane_sum_seq(n, [row = c + j * n](int64_t k) { return row[k]; });
      float const den = __fadd_rn(s, p.hc_eps);
      for (int64_t k = 0; k < n; ++k) c[j * n + k] = __fdiv_rn(c[j * n + k], den);
    }
  };
  col_norm();
  for (int it = 0; it < p.iters - 1; ++it) { row_norm(); col_norm(); }
  for (int64_t i = 0; i < n * n; ++i) comb[i] = c[i];
}

struct MhcCollapseParams {
  float const* x = nullptr;    // [rows, n·D]
  float const* pre = nullptr;  // [rows, n]
  float* out = nullptr;        // [rows, D]
  int64_t rows = 0, n = 0, d = 0;
  bool bf16 = false;
};

__global__ void __launch_bounds__(256) mhc_collapse_kernel(MhcCollapseParams const p) {
  int64_t const row = blockIdx.y;
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.d) return;
  float const* x = p.x + row * p.n * p.d;
  float const* pre = p.pre + row * p.n;
  float s = 0.f;
  for (int64_t k = 0; k < p.n; ++k) s = device::dot_step(s, pre[k], x[k * p.d + i]);
  p.out[row * p.d + i] = device::round_md(s, p.bf16);
}

struct MhcExpandParams {
  float const* y = nullptr;     // [rows, D]
  float const* x = nullptr;     // [rows, n·D]
  float const* post = nullptr;  // [rows, n]
  float const* comb = nullptr;  // [rows, n·n]
  float* out = nullptr;         // [rows, n·D]
  int64_t rows = 0, n = 0, d = 0;
  bool bf16 = false;
};

__global__ void __launch_bounds__(256) mhc_expand_kernel(MhcExpandParams const p) {
  int64_t const row = blockIdx.y;
  int64_t const t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.n * p.d) return;
  int64_t const k = t / p.d, i = t % p.d;
  float const* x = p.x + row * p.n * p.d;
  float const* comb = p.comb + row * p.n * p.n;
  float mixed = 0.f;
  for (int64_t j = 0; j < p.n; ++j) mixed = device::fma_step(mixed, comb[j * p.n + k], x[j * p.d + i]);
  float const py = __fmul_rn(p.post[row * p.n + k], p.y[row * p.d + i]);
  p.out[row * p.n * p.d + t] = device::round_md(__fadd_rn(py, mixed), p.bf16);
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<MhcMix<Backend::kCuda>, MhcMixDesc, MhcMixArgs>);
static_assert(BackendOp<MhcCollapse<Backend::kCuda>, MhcCollapseDesc, MhcCollapseArgs>);
static_assert(BackendOp<MhcExpand<Backend::kCuda>, MhcExpandDesc, MhcExpandArgs>);

Status MhcMix<Backend::kCuda>::check(MhcMixDesc const& d, MhcMixArgs const& a) {
  int64_t n = d.streams, nm = (2 + n) * n;
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(n >= 1 && n <= kernels::kMaxStreams, "mhc_mix CUDA supports 1..8 streams");
  TESSERA_CHECK(d.dim > 0, "mhc_mix dim must be positive");
  TESSERA_CHECK(d.sinkhorn_iters >= 1, "mhc sinkhorn_iters must be >= 1");
  TESSERA_TRY(check_shape(a.x, {d.rows, n * d.dim}, "mhc_mix x"));
  TESSERA_TRY(check_shape(a.fn, {nm, n * d.dim}, "mhc_mix fn"));
  TESSERA_TRY(check_shape(a.base, {nm}, "mhc_mix base"));
  TESSERA_TRY(check_shape(a.scale, {3}, "mhc_mix scale"));
  TESSERA_TRY(check_shape(a.pre, {d.rows, n}, "mhc_mix pre"));
  TESSERA_TRY(check_shape(a.post, {d.rows, n}, "mhc_mix post"));
  return check_shape(a.comb, {d.rows, n * n}, "mhc_mix comb");
}

Status MhcMix<Backend::kCuda>::run(MhcMixDesc const& d, MhcMixArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  MhcMixParams p;
  p.x = a.x.data; p.fn = a.fn.data; p.base = a.base.data; p.scale = a.scale.data;
  p.pre = a.pre.data; p.post = a.post.data; p.comb = a.comb.data;
  p.rows = d.rows; p.n = d.streams; p.d = d.dim; p.iters = d.sinkhorn_iters;
  p.hc_eps = d.hc_eps; p.norm_eps = d.norm_eps; p.bf16 = d.md == DType::kBf16;
  mhc_mix_kernel<<<static_cast<unsigned>(d.rows), kMixThreads, 0, stream_of(ctx)>>>(p);
  return launch_status("mhc_mix_kernel");
}

Status MhcCollapse<Backend::kCuda>::check(MhcCollapseDesc const& d, MhcCollapseArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.x, {d.rows, d.streams * d.dim}, "mhc_collapse x"));
  TESSERA_TRY(check_shape(a.pre, {d.rows, d.streams}, "mhc_collapse pre"));
  return check_shape(a.out, {d.rows, d.dim}, "mhc_collapse out");
}

Status MhcCollapse<Backend::kCuda>::run(MhcCollapseDesc const& d, MhcCollapseArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0 || d.dim == 0) return {};
  if (d.rows > 65535) return invalid_argument("mhc_collapse: rows > 65535 per launch");
  MhcCollapseParams p;
  p.x = a.x.data; p.pre = a.pre.data; p.out = a.out.data;
  p.rows = d.rows; p.n = d.streams; p.d = d.dim; p.bf16 = d.md == DType::kBf16;
  dim3 grid(static_cast<unsigned>(ceil_div(d.dim, 256)), static_cast<unsigned>(d.rows));
  mhc_collapse_kernel<<<grid, 256, 0, stream_of(ctx)>>>(p);
  return launch_status("mhc_collapse_kernel");
}

Status MhcExpand<Backend::kCuda>::check(MhcExpandDesc const& d, MhcExpandArgs const& a) {
  int64_t n = d.streams;
  TESSERA_TRY(check_md(d.md));
  TESSERA_TRY(check_shape(a.y, {d.rows, d.dim}, "mhc_expand y"));
  TESSERA_TRY(check_shape(a.x, {d.rows, n * d.dim}, "mhc_expand x"));
  TESSERA_TRY(check_shape(a.post, {d.rows, n}, "mhc_expand post"));
  TESSERA_TRY(check_shape(a.comb, {d.rows, n * n}, "mhc_expand comb"));
  TESSERA_TRY(check_shape(a.out, {d.rows, n * d.dim}, "mhc_expand out"));
  TESSERA_CHECK(a.out.data != a.x.data || d.rows == 0, "mhc_expand out must not alias x");
  return {};
}

Status MhcExpand<Backend::kCuda>::run(MhcExpandDesc const& d, MhcExpandArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0 || d.dim == 0) return {};
  if (d.rows > 65535) return invalid_argument("mhc_expand: rows > 65535 per launch");
  MhcExpandParams p;
  p.y = a.y.data; p.x = a.x.data; p.post = a.post.data; p.comb = a.comb.data; p.out = a.out.data;
  p.rows = d.rows; p.n = d.streams; p.d = d.dim; p.bf16 = d.md == DType::kBf16;
  dim3 grid(static_cast<unsigned>(ceil_div(d.streams * d.dim, 256)), static_cast<unsigned>(d.rows));
  mhc_expand_kernel<<<grid, 256, 0, stream_of(ctx)>>>(p);
  return launch_status("mhc_expand_kernel");
}

}  // namespace tessera::ops

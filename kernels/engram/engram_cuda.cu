// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the Engram family (include/tessera/ops/engram.hpp, ref/engram_ref.hpp, spec §2.4).
///   EngramHash: one thread per row; the int64 products, xors and C++ truncating remainders of
///     ref::engram_hash_row (bitwise).
///   EngramGather: one block per (row, column) copies a table row (bitwise); an id outside the table
///     writes quiet NaNs, the device-side counterpart of the CPU's check.
///   EngramGate: one block per (row, stream): three sequential fp32 sums (Σh², Σκ², Σ(h·w)·κ, each in
///     index order as the reference) on three threads, then g = σ(copysign(sqrt(max(|dot|, 1e-6)), dot))
///     in the model dtype's arithmetic (device::sigmoid as ref::sigmoid: bitwise as the CPU) and
///     out = →md(h + g·v) over the row.
#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/engram.hpp"

namespace tessera::kernels {

namespace {

struct HashParams {
  int64_t const* lookback = nullptr;  // [rows, N]
  int64_t const* mult = nullptr;      // [N]
  int64_t const* primes = nullptr;    // [(N−1)·He]
  int64_t const* offsets = nullptr;   // [(N−1)·He]
  int64_t* ids = nullptr;             // [rows, (N−1)·He]
  int64_t rows = 0, n = 0, heads = 0;
};

__global__ void engram_hash_kernel(HashParams const p) {
  device::pdl_enter();
  int64_t const row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  int64_t const* tok = p.lookback + row * p.n;
  int64_t* ids = p.ids + row * (p.n - 1) * p.heads;
  int64_t h = tok[0] * p.mult[0];
  for (int64_t i = 1; i < p.n; ++i) {
    h ^= tok[i] * p.mult[i];
    for (int64_t hd = 0; hd < p.heads; ++hd) {
      int64_t const c = (i - 1) * p.heads + hd;
      ids[c] = h % p.primes[c] + p.offsets[c];
    }
  }
}

struct GatherParams {
  int64_t const* ids = nullptr;  // [rows, columns]
  float const* table = nullptr;  // [table_rows, head_dim]
  float* out = nullptr;          // [rows, columns·head_dim]
  int64_t rows = 0, columns = 0, table_rows = 0, head_dim = 0;
};

__global__ void __launch_bounds__(128) engram_gather_kernel(GatherParams const p) {
  device::pdl_enter();
  int64_t const rc = blockIdx.x;  // row·columns + column
  int64_t const id = p.ids[rc];
  float* dst = p.out + rc * p.head_dim;
  bool const ok = id >= 0 && id < p.table_rows;
  float const* src = p.table + (ok ? id : 0) * p.head_dim;
  for (int64_t i = threadIdx.x; i < p.head_dim; i += blockDim.x) dst[i] = ok ? src[i] : __int_as_float(0x7FC00000);
}

struct GateParams {
  float const* x = nullptr;   // [rows, n·D]
  float const* kv = nullptr;  // [rows, (n+1)·D]
  float const* w = nullptr;   // [n·D]
  float* out = nullptr;       // [rows, n·D]; may alias x
  int64_t rows = 0, n = 0, d = 0;
  float eps = 0.f, inv_sqrt_d = 0.f;
  bool bf16 = false;
};

__global__ void __launch_bounds__(256) engram_gate_kernel(GateParams const p) {
  device::pdl_enter();
  __shared__ float stat[3];
  __shared__ float s_g;
  int64_t const k = blockIdx.x, row = blockIdx.y;
  float const* h = p.x + row * p.n * p.d + k * p.d;
  float const* kk = p.kv + row * (p.n + 1) * p.d + k * p.d;
  float const* v = p.kv + row * (p.n + 1) * p.d + p.n * p.d;
  float const* w = p.w + k * p.d;
  int const warp = threadIdx.x >> 5;  // three statistics, one warp each, in ref::lane_sum's order
  if (warp == 0) {
    float const r = warp_rms_inv(h, p.d, p.eps);
    if (threadIdx.x == 0) stat[0] = r;
  } else if (warp == 1) {
    float const r = warp_rms_inv(kk, p.d, p.eps);
    if (threadIdx.x == 32) stat[1] = r;
  } else if (warp == 2) {
    float const s = warp_lane_sum(p.d, [&](int64_t i) { return __fmul_rn(__fmul_rn(h[i], w[i]), kk[i]); });
    if (threadIdx.x == 64) stat[2] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float const rstd = __fmul_rn(stat[0], stat[1]);
    float const dt = __fmul_rn(__fmul_rn(stat[2], rstd), p.inv_sqrt_d);
    s_g = device::sigmoid(copysignf(__fsqrt_rn(device::std_max(fabsf(dt), 1e-6f)), dt), p.bf16);
  }
  __syncthreads();
  float const g = s_g;
  float* out = p.out + row * p.n * p.d + k * p.d;
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x)
    out[i] = device::round_md(__fadd_rn(h[i], __fmul_rn(g, v[i])), p.bf16);
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<EngramHash<Backend::kCuda>, EngramHashDesc, EngramHashArgs>);
static_assert(BackendOp<EngramGather<Backend::kCuda>, EngramGatherDesc, EngramGatherArgs>);
static_assert(BackendOp<EngramGate<Backend::kCuda>, EngramGateDesc, EngramGateArgs>);

Status EngramHash<Backend::kCuda>::check(EngramHashDesc const& d, EngramHashArgs const& a) {
  int64_t c = (d.max_ngram - 1) * d.heads;
  TESSERA_CHECK(d.max_ngram >= 2 && d.heads >= 1, "engram_hash needs max_ngram >= 2 and heads >= 1");
  TESSERA_TRY(check_shape(a.lookback, {d.rows, d.max_ngram}, "engram_hash lookback"));
  TESSERA_TRY(check_shape(a.multipliers, {d.max_ngram}, "engram_hash multipliers"));
  TESSERA_TRY(check_shape(a.primes, {c}, "engram_hash primes"));
  TESSERA_TRY(check_shape(a.offsets, {c}, "engram_hash offsets"));
  return check_shape(a.ids, {d.rows, c}, "engram_hash ids");
}

Status EngramHash<Backend::kCuda>::run(EngramHashDesc const& d, EngramHashArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  HashParams p{a.lookback.data, a.multipliers.data, a.primes.data, a.offsets.data, a.ids.data, d.rows, d.max_ngram,
               d.heads};
  device::launch_pdl(engram_hash_kernel, static_cast<unsigned>(ceil_div(d.rows, 128)), 128, 0, stream_of(ctx), p);
  return launch_status("engram_hash_kernel");
}

Status EngramGather<Backend::kCuda>::check(EngramGatherDesc const& d, EngramGatherArgs const& a) {
  TESSERA_TRY(check_shape(a.ids, {d.rows, d.columns}, "engram_gather ids"));
  TESSERA_TRY(check_shape(a.table, {d.table_rows, d.head_dim}, "engram_gather table"));
  return check_shape(a.out, {d.rows, d.columns * d.head_dim}, "engram_gather out");
}

Status EngramGather<Backend::kCuda>::run(EngramGatherDesc const& d, EngramGatherArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0 || d.columns == 0 || d.head_dim == 0) return {};
  GatherParams p{a.ids.data, a.table.data, a.out.data, d.rows, d.columns, d.table_rows, d.head_dim};
  device::launch_pdl(engram_gather_kernel, static_cast<unsigned>(d.rows * d.columns), 128, 0, stream_of(ctx), p);
  return launch_status("engram_gather_kernel");
}

Status EngramGate<Backend::kCuda>::check(EngramGateDesc const& d, EngramGateArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.dim > 0 && d.streams >= 1, "engram_gate needs dim > 0 and streams >= 1");
  TESSERA_CHECK(d.rows <= 65535, "engram_gate CUDA: rows > 65535 per launch");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.streams * d.dim}, "engram_gate x"));
  TESSERA_TRY(check_shape(a.kv, {d.rows, (d.streams + 1) * d.dim}, "engram_gate kv"));
  TESSERA_TRY(check_shape(a.w, {d.streams * d.dim}, "engram_gate w"));
  return check_shape(a.out, {d.rows, d.streams * d.dim}, "engram_gate out");
}

Status EngramGate<Backend::kCuda>::run(EngramGateDesc const& d, EngramGateArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  GateParams p;
  p.x = a.x.data; p.kv = a.kv.data; p.w = a.w.data; p.out = a.out.data;
  p.rows = d.rows; p.n = d.streams; p.d = d.dim; p.eps = d.eps; p.bf16 = d.md == DType::kBf16;
  p.inv_sqrt_d = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.dim)));  // as ref::engram_gate_row
  dim3 grid(static_cast<unsigned>(d.streams), static_cast<unsigned>(d.rows));
  device::launch_pdl(engram_gate_kernel, grid, 256, 0, stream_of(ctx), p);
  return launch_status("engram_gate_kernel");
}

}  // namespace tessera::ops

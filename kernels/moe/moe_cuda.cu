// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the MoE family (include/tessera/ops/moe.hpp, ref/moe_ref.hpp, spec §2.6).
///   MoeRoute: one block per token. Thread e forms s_e = sqrt(softplus(x·W_e / temp)) (the dot sequential
///     in k as ref::dot; softplus with CUDA expf/log1pf, ≤ 2 ulp from glibc), biased_e = s_e + b_e (−∞ for a
///     masked expert); warp 0 selects the top-k by (value desc, id asc) in k warp-wide arg-max passes (an
///     exact total order, so ties go to the lower id as ref::topk_select), sets the cutoff-tie flag; thread 0
///     renormalises (sum in selection order), scales, and applies ref::moe_prune_row (stable order by weight).
///   MoeExperts: kernel A, grid (inter/128, top_k + 1 slots, rows): a = →md(w·(silu(min(g, L))·clamp(u, ±L)))
///     with g, u = →md(W1/W3 · x) as sequential dots; kernel B, grid (dim/128, rows): out_o = →md(Σ_e y_e,o
///     + y_shared,o) with y_e,o = →md(W2_e,o · a_e), the routed experts in ascending id then the shared one,
///     summed from +0 in fp32. Only silu's expf is not bitwise; a token's result never depends on other tokens.
#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/moe.hpp"

namespace tessera::kernels {

namespace {

constexpr int kMaxTopK = 16;

struct RouteParams {
  float const* x = nullptr;       // [rows, dim]
  float const* gate = nullptr;    // [experts, dim]
  float const* bias = nullptr;    // [experts] or null
  uint8_t const* mask = nullptr;  // [experts] or null; nonzero = never selected
  float* weights = nullptr;       // [rows, top_k]
  int32_t* ids = nullptr;         // [rows, top_k]
  uint8_t* cutoff_tie = nullptr;  // [rows]
  int64_t rows = 0, experts = 0, dim = 0, top_k = 1;
  float temp = 1.f, routed_scale = 1.f, prune_top_p = 1.f;
  int64_t prune_min_k = 0;
  bool norm = true, prune_renorm = true;
};

/// (v, i) better than (w, j): larger value, then lower index. −∞ and NaN never qualify (callers filter).
__device__ __forceinline__ bool better(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

__global__ void __launch_bounds__(256) moe_route_kernel(RouteParams const p) {
  extern __shared__ float smem[];
  float* s = smem;                    // [experts] unbiased scores
  float* biased = smem + p.experts;   // [experts]
  __shared__ int sel[kMaxTopK];
  __shared__ float kth;
  int64_t const row = blockIdx.x;
  float const* x = p.x + row * p.dim;
  for (int64_t e = threadIdx.x; e < p.experts; e += blockDim.x) {
    float const dot = device::dot_seq(x, p.gate + e * p.dim, p.dim);
    float const se = sqrtf(device::softplus(__fdiv_rn(dot, p.temp)));
    s[e] = se;
    biased[e] = (p.mask && p.mask[e]) ? -INFINITY : __fadd_rn(se, p.bias ? p.bias[e] : 0.f);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    int const lane = threadIdx.x;
    for (int64_t i = 0; i < p.top_k; ++i) {
      float bv = -INFINITY;
      int bi = -1;
      for (int64_t e = lane; e < p.experts; e += 32) {
        float const v = biased[e];
        if (!(v > -INFINITY)) continue;
        bool taken = false;
        for (int64_t j = 0; j < i; ++j) taken |= sel[j] == e;
        if (!taken && (bi < 0 || better(v, static_cast<int>(e), bv, bi))) { bv = v; bi = static_cast<int>(e); }
      }
      for (int off = 16; off > 0; off >>= 1) {
        float const ov = __shfl_xor_sync(0xffffffffu, bv, off);
        int const oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi >= 0 && (bi < 0 || better(ov, oi, bv, bi))) { bv = ov; bi = oi; }
      }
      if (lane == 0) { sel[i] = bi; kth = bv; }
      __syncwarp();
    }
    // Cutoff tie: an unselected finite score equal to the k-th.
    int tie = 0;
    for (int64_t e = lane; e < p.experts; e += 32) {
      float const v = biased[e];
      if (!(v > -INFINITY) || v != kth) continue;
      bool taken = false;
      for (int64_t j = 0; j < p.top_k; ++j) taken |= sel[j] == e;
      tie |= !taken;
    }
    tie = __any_sync(0xffffffffu, tie);
    if (lane == 0) p.cutoff_tie[row] = tie ? 1 : 0;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int64_t const k = p.top_k;
  int32_t* ids = p.ids + row * k;
  float* w = p.weights + row * k;
  float sum = 0.f;
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = sel[i];
    w[i] = sel[i] >= 0 ? s[sel[i]] : 0.f;
    sum = __fadd_rn(sum, w[i]);
  }
  if (p.norm && k > 1)
    for (int64_t i = 0; i < k; ++i) w[i] = __fdiv_rn(w[i], __fadd_rn(sum, 1e-20f));
  for (int64_t i = 0; i < k; ++i) w[i] = __fmul_rn(w[i], p.routed_scale);
  if (!(p.prune_top_p < 1.f)) return;
  // ref::moe_prune_row: stable order by weight descending (insertion sort is stable).
  int order[kMaxTopK];
  for (int64_t i = 0; i < k; ++i) {
    int64_t j = i;
    while (j > 0 && w[i] > w[order[j - 1]]) { order[j] = order[j - 1]; --j; }
    order[j] = static_cast<int>(i);
  }
  float total = 0.f;
  for (int64_t i = 0; i < k; ++i) total = __fadd_rn(total, w[i]);
  float const need = __fmul_rn(p.prune_top_p, total);
  int64_t const floor_k = p.prune_min_k > 1 ? p.prune_min_k : 1;
  float cum = 0.f;
  int64_t keep = 0;
  while (keep < k && (keep < floor_k || cum < need)) cum = __fadd_rn(cum, w[order[keep++]]);
  if (keep == k) return;
  for (int64_t j = keep; j < k; ++j) { ids[order[j]] = -1; w[order[j]] = 0.f; }
  if (p.prune_renorm) {
    float const scale = __fdiv_rn(total, cum);
    for (int64_t j = 0; j < keep; ++j) w[order[j]] = __fmul_rn(w[order[j]], scale);
  }
}

struct ExpertsParams {
  float const* x = nullptr;          // [rows, dim]
  int32_t const* ids = nullptr;      // [rows, top_k]
  float const* weights = nullptr;    // [rows, top_k]
  ops::MoeExpertsDeviceWeights w;
  float* act = nullptr;              // [rows, top_k + 1, inter] workspace
  float* out = nullptr;              // [rows, dim]
  int64_t rows = 0, experts = 0, dim = 0, inter = 0, top_k = 1;
  float limit = 0.f;
  bool shared = true, bf16 = false;
};

constexpr int kWarps = 4;

template <class W>
__global__ void __launch_bounds__(kWarps * 32) moe_act_kernel(ExpertsParams const p) {
  __shared__ float tiles[kWarps][32 * 33];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const slot = blockIdx.y, row = blockIdx.z;
  int64_t const o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 32;
  if (o0 >= p.inter) return;
  W const *w1, *w3;
  bool weighted = slot < p.top_k;
  float wt = 0.f;
  if (weighted) {
    int32_t const id = p.ids[row * p.top_k + slot];
    if (id < 0 || id >= p.experts) return;
    w1 = static_cast<W const*>(p.w.w1[id]);
    w3 = static_cast<W const*>(p.w.w3[id]);
    wt = p.weights[row * p.top_k + slot];
  } else {
    if (!p.shared) return;
    w1 = static_cast<W const*>(p.w.shared_w1);
    w3 = static_cast<W const*>(p.w.shared_w3);
  }
  float const* x = p.x + row * p.dim;
  float g[1], u[1];
  warp_dot_rows<1>(x, 0, 1, w1, p.dim, p.dim, o0, p.inter, tiles[warp], g);
  warp_dot_rows<1>(x, 0, 1, w3, p.dim, p.dim, o0, p.inter, tiles[warp], u);
  int64_t const i = o0 + lane;
  if (i >= p.inter) return;
  float gv = device::round_md(g[0], p.bf16), uv = device::round_md(u[0], p.bf16);
  if (p.limit > 0.f) { uv = device::std_clamp(uv, -p.limit, p.limit); gv = device::std_min(gv, p.limit); }
  float y = __fmul_rn(device::silu(gv), uv);
  if (weighted) y = __fmul_rn(wt, y);
  p.act[(row * (p.top_k + 1) + slot) * p.inter + i] = device::round_md(y, p.bf16);
}

template <class W>
__global__ void __launch_bounds__(kWarps * 32) moe_down_kernel(ExpertsParams const p) {
  __shared__ float tiles[kWarps][32 * 33];
  __shared__ int order[kMaxTopK];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t const row = blockIdx.y;
  int64_t const k = p.top_k;
  if (threadIdx.x == 0) {  // slots by ascending expert id (ids of a token are distinct; −1 slots skipped later)
    for (int64_t i = 0; i < k; ++i) {
      int32_t const id = p.ids[row * k + i];
      int64_t j = i;
      while (j > 0 && id < p.ids[row * k + order[j - 1]]) { order[j] = order[j - 1]; --j; }
      order[j] = static_cast<int>(i);
    }
  }
  __syncthreads();
  int64_t const o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 32;
  if (o0 >= p.dim) return;
  float total = 0.f;
  for (int64_t t = 0; t <= k; ++t) {
    W const* w2;
    int64_t slot;
    if (t < k) {
      slot = order[t];
      int32_t const id = p.ids[row * k + slot];
      if (id < 0 || id >= p.experts) continue;
      w2 = static_cast<W const*>(p.w.w2[id]);
    } else {
      if (!p.shared) break;
      slot = k;
      w2 = static_cast<W const*>(p.w.shared_w2);
    }
    float y[1];
    warp_dot_rows<1>(p.act + (row * (k + 1) + slot) * p.inter, 0, 1, w2, p.inter, p.inter, o0, p.dim, tiles[warp], y);
    total = __fadd_rn(total, device::round_md(y[0], p.bf16));
  }
  int64_t const o = o0 + lane;
  if (o < p.dim) p.out[row * p.dim + o] = device::round_md(total, p.bf16);
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<MoeRoute<Backend::kCuda>, MoeRouteDesc, MoeRouteArgs>);
static_assert(BackendOp<MoeExperts<Backend::kCuda>, MoeExpertsDesc, MoeExpertsArgs>);

Status MoeRoute<Backend::kCuda>::check(MoeRouteDesc const& d, MoeRouteArgs const& a) {
  TESSERA_CHECK(d.top_k >= 1 && d.top_k <= d.experts, "moe_route needs 1 <= top_k <= experts");
  TESSERA_CHECK(d.top_k <= kernels::kMaxTopK, "moe_route CUDA supports top_k <= 16");
  TESSERA_CHECK(d.experts * 2 * sizeof(float) <= 48 * 1024, "moe_route CUDA supports up to 6144 experts");
  TESSERA_CHECK(d.dim > 0, "moe_route dim must be positive");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "moe_route x"));
  TESSERA_TRY(check_shape(a.gate, {d.experts, d.dim}, "moe_route gate"));
  if (a.bias.data) TESSERA_TRY(check_shape(a.bias, {d.experts}, "moe_route bias"));
  if (a.expert_mask.data) TESSERA_TRY(check_shape(a.expert_mask, {d.experts}, "moe_route expert_mask"));
  TESSERA_TRY(check_shape(a.weights, {d.rows, d.top_k}, "moe_route weights"));
  TESSERA_TRY(check_shape(a.ids, {d.rows, d.top_k}, "moe_route ids"));
  TESSERA_CHECK(d.prune_top_p > 0.f && d.prune_top_p <= 1.f, "moe_route needs 0 < prune_top_p <= 1");
  TESSERA_CHECK(d.prune_min_k >= 0, "moe_route needs prune_min_k >= 0");
  return check_shape(a.cutoff_tie, {d.rows}, "moe_route cutoff_tie");
}

Status MoeRoute<Backend::kCuda>::run(MoeRouteDesc const& d, MoeRouteArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  RouteParams p;
  p.x = a.x.data; p.gate = a.gate.data; p.bias = a.bias.data; p.mask = a.expert_mask.data;
  p.weights = a.weights.data; p.ids = a.ids.data; p.cutoff_tie = a.cutoff_tie.data;
  p.rows = d.rows; p.experts = d.experts; p.dim = d.dim; p.top_k = d.top_k;
  p.temp = d.gate_temp; p.routed_scale = d.routed_scale; p.prune_top_p = d.prune_top_p;
  p.prune_min_k = d.prune_min_k; p.norm = d.norm_top_k; p.prune_renorm = d.prune_renorm;
  size_t const smem = static_cast<size_t>(d.experts) * 2 * sizeof(float);
  moe_route_kernel<<<static_cast<unsigned>(d.rows), 256, smem, stream_of(ctx)>>>(p);
  return launch_status("moe_route_kernel");
}

size_t MoeExperts<Backend::kCuda>::workspace_bytes(MoeExpertsDesc const& d) {
  return kernels::align256(static_cast<size_t>(d.rows * (d.top_k + 1) * d.inter) * sizeof(float));
}

Status MoeExperts<Backend::kCuda>::check(MoeExpertsDesc const& d, MoeExpertsArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.weight_dtype == DType::kF32 || d.weight_dtype == DType::kBf16,
                "moe_experts weight_dtype must be f32 or bf16");
  TESSERA_CHECK(d.top_k >= 1 && d.top_k <= kernels::kMaxTopK, "moe_experts CUDA supports 1 <= top_k <= 16");
  TESSERA_CHECK(d.dim > 0 && d.inter > 0, "moe_experts dim and inter must be positive");
  TESSERA_CHECK(d.rows <= 65535, "moe_experts CUDA: rows > 65535 per launch");
  TESSERA_TRY(check_shape(a.x, {d.rows, d.dim}, "moe_experts x"));
  TESSERA_TRY(check_shape(a.ids, {d.rows, d.top_k}, "moe_experts ids"));
  TESSERA_TRY(check_shape(a.weights, {d.rows, d.top_k}, "moe_experts weights"));
  TESSERA_TRY(check_shape(a.out, {d.rows, d.dim}, "moe_experts out"));
  TESSERA_CHECK(a.dev.w1 && a.dev.w3 && a.dev.w2, "moe_experts CUDA needs the device pointer arrays dev.w1/w3/w2");
  if (d.shared_expert)
    TESSERA_CHECK(a.dev.shared_w1 && a.dev.shared_w3 && a.dev.shared_w2,
                  "moe_experts CUDA needs dev.shared_w1/w3/w2 when shared_expert");
  return {};
}

Status MoeExperts<Backend::kCuda>::run(MoeExpertsDesc const& d, MoeExpertsArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.rows == 0) return {};
  Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, workspace_bytes(d)));
  ExpertsParams p;
  p.x = a.x.data; p.ids = a.ids.data; p.weights = a.weights.data; p.w = a.dev;
  p.act = static_cast<float*>(ws.ptr); p.out = a.out.data;
  p.rows = d.rows; p.experts = d.experts; p.dim = d.dim; p.inter = d.inter; p.top_k = d.top_k;
  p.limit = d.swiglu_limit; p.shared = d.shared_expert; p.bf16 = d.md == DType::kBf16;
  dim3 ga(static_cast<unsigned>(ceil_div(d.inter, kWarps * 32)), static_cast<unsigned>(d.top_k + 1),
          static_cast<unsigned>(d.rows));
  dim3 gb(static_cast<unsigned>(ceil_div(d.dim, kWarps * 32)), static_cast<unsigned>(d.rows));
  cudaStream_t const st = stream_of(ctx);
  if (d.weight_dtype == DType::kBf16) {
    moe_act_kernel<Bf16><<<ga, kWarps * 32, 0, st>>>(p);
    TESSERA_TRY(launch_status("moe_act_kernel"));
    moe_down_kernel<Bf16><<<gb, kWarps * 32, 0, st>>>(p);
  } else {
    moe_act_kernel<float><<<ga, kWarps * 32, 0, st>>>(p);
    TESSERA_TRY(launch_status("moe_act_kernel"));
    moe_down_kernel<float><<<gb, kWarps * 32, 0, st>>>(p);
  }
  return launch_status("moe_down_kernel");
}

}  // namespace tessera::ops

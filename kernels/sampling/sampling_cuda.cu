// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the keyed sampler (include/tessera/ops/sampling.hpp, ref/sampling_ref.hpp).
/// One block of 512 threads per row, three steps:
///   1. prepare: per-row parameter validation; output-token counts (one thread, in list order) and the
///      seen set; penalised + masked logits l in fp64 with separately rounded operations (bitwise the
///      CPU's l); for T > 0 the weights w = exp((l − max l)/T) (CUDA fp64 exp, ≤ 1 ulp from glibc), min-p,
///      and the segment of the row for the sort when top-k or top-p is on.
///   2. a stable segmented sort (CUB) of (w desc, id asc) for the rows that need one (others: empty).
///   3. finish: greedy = first index of the max of l (exact comparisons: bitwise the CPU's pick); else
///      top-k/top-p on the sorted weights, then the inverse-CDF draw with u = keyed_uniform(seed, key,
///      position) (bit-identical Philox) over the kept weights in ascending id. Sums are chunked (thread t
///      owns ids [tC, tC + C)) with a sequential scan of the chunk sums: a fixed order per vocabulary size,
///      independent of the other rows. Logprobs: log-softmax of the raw or processed logits; top entries
///      by (logprob desc, id asc) in n arg-max passes.
#include <cub/device/device_segmented_sort.cuh>

#include <climits>

#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/ops/sampling.hpp"

namespace tessera::kernels {

namespace {

constexpr int kThreads = 512;
constexpr double kNegInf = -__builtin_huge_val();

struct RowState {
  int32_t status;      // 0 ok, −2 invalid parameters
  int32_t npos;        // number of w > 0 (T > 0)
  int32_t needs_sort;  // top-k or top-p applies
  int32_t pad;
  double max_l;        // max of l
};

struct SampleParams {
  float const* logits = nullptr;            // [R, V], row stride logit_stride
  ops::SamplingRowParams const* params = nullptr;
  uint32_t const* mask = nullptr;           // [R, mask_stride] or null
  int64_t const* prompt_off = nullptr;      // [R+1] or null
  int32_t const* prompt_tok = nullptr;
  int64_t const* output_off = nullptr;      // [R+1] or null
  int32_t const* output_tok = nullptr;
  int32_t* tokens = nullptr;                // [R]
  float* logprobs = nullptr;                // [R] or null
  int32_t* top_ids = nullptr;               // [R, n] or null
  float* top_logprobs = nullptr;            // [R, n] or null
  int64_t rows = 0, vocab = 0, logit_stride = 0, mask_stride = 0;
  int32_t num_top = 0;
  bool processed = false;
  // Workspace.
  double* l = nullptr;          // [R, V]
  double* w = nullptr;          // [R, V]
  double* w_sorted = nullptr;   // [R, V]
  int32_t* ids = nullptr;       // [R, V] 0..V−1
  int32_t* ids_sorted = nullptr;// [R, V]
  int32_t* counts = nullptr;    // [R, V]
  uint8_t* seen = nullptr;      // [R, V]
  int64_t* seg_begin = nullptr; // [R]
  int64_t* seg_end = nullptr;   // [R]
  RowState* state = nullptr;    // [R]
};

__device__ double block_sum(double v, double* sh) {
  for (int off = 16; off > 0; off >>= 1) v = __dadd_rn(v, __shfl_down_sync(0xffffffffu, v, off));
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? sh[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1) v = __dadd_rn(v, __shfl_down_sync(0xffffffffu, v, off));
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  double const r = sh[0];
  __syncthreads();
  return r;
}

__device__ double block_max(double v, double* sh) {
  for (int off = 16; off > 0; off >>= 1) v = fmax(v, __shfl_down_sync(0xffffffffu, v, off));
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? sh[lane] : kNegInf;
    for (int off = 16; off > 0; off >>= 1) v = fmax(v, __shfl_down_sync(0xffffffffu, v, off));
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  double const r = sh[0];
  __syncthreads();
  return r;
}

__device__ long long block_min_ll(long long v, long long* sh) {
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_down_sync(0xffffffffu, v, off));
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? sh[lane] : LLONG_MAX;
    for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_down_sync(0xffffffffu, v, off));
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  long long const r = sh[0];
  __syncthreads();
  return r;
}

/// (v, i) better than (w, j): larger value, then lower index; i < 0 = none.
__device__ __forceinline__ bool better(double v, int i, double w, int j) {
  if (i < 0) return false;
  if (j < 0) return true;
  return v > w || (v == w && i < j);
}

/// Block-wide best (value desc, id asc) of the candidates the threads hold; returns the id (−1 = none).
__device__ int block_argbest(double v, int i, double* shv, int* shi, double* out_v) {
  for (int off = 16; off > 0; off >>= 1) {
    double const ov = __shfl_down_sync(0xffffffffu, v, off);
    int const oi = __shfl_down_sync(0xffffffffu, i, off);
    if (better(ov, oi, v, i)) { v = ov; i = oi; }
  }
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) { shv[warp] = v; shi[warp] = i; }
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? shv[lane] : 0.0;
    i = lane < kThreads / 32 ? shi[lane] : -1;
    for (int off = 16; off > 0; off >>= 1) {
      double const ov = __shfl_down_sync(0xffffffffu, v, off);
      int const oi = __shfl_down_sync(0xffffffffu, i, off);
      if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
    if (lane == 0) { shv[0] = v; shi[0] = i; }
  }
  __syncthreads();
  int const r = shi[0];
  if (out_v) *out_v = shv[0];
  __syncthreads();
  return r;
}

__device__ bool params_valid(ops::SamplingRowParams const& p) {
  return isfinite(p.temperature) && p.temperature >= 0.f && p.top_p > 0.f && p.top_p <= 1.f && p.min_p >= 0.f &&
         p.min_p <= 1.f && isfinite(p.repetition_penalty) && p.repetition_penalty > 0.f &&
         isfinite(p.presence_penalty) && isfinite(p.frequency_penalty) && p.position >= 0;
}

__global__ void __launch_bounds__(kThreads) sample_prepare_kernel(SampleParams const sp) {
  device::pdl_enter();
  __shared__ double shd[32];
  int64_t const row = blockIdx.x, V = sp.vocab;
  ops::SamplingRowParams const p = sp.params[row];
  RowState* st = sp.state + row;
  sp.seg_begin[row] = row * V;
  if (!params_valid(p)) {
    if (threadIdx.x == 0) *st = RowState{-2, 0, 0, 0, kNegInf};
    sp.seg_end[row] = row * V;
    return;
  }
  double* l = sp.l + row * V;
  double* w = sp.w + row * V;
  int32_t* counts = sp.counts + row * V;
  uint8_t* seen = sp.seen + row * V;
  float const* logits = sp.logits + row * sp.logit_stride;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) { counts[v] = 0; seen[v] = 0; sp.ids[row * V + v] = static_cast<int32_t>(v); }
  __syncthreads();
  if (sp.prompt_off)
    for (int64_t j = sp.prompt_off[row] + threadIdx.x; j < sp.prompt_off[row + 1]; j += kThreads) {
      int32_t const t = sp.prompt_tok[j];
      if (t >= 0 && t < V) seen[t] = 1;  // idempotent store
    }
  if (sp.output_off && threadIdx.x == 0)
    for (int64_t j = sp.output_off[row]; j < sp.output_off[row + 1]; ++j) {
      int32_t const t = sp.output_tok[j];
      if (t >= 0 && t < V) { ++counts[t]; seen[t] = 1; }
    }
  __syncthreads();
  bool const rep = p.repetition_penalty != 1.f;
  bool const freq = p.frequency_penalty != 0.f || p.presence_penalty != 0.f;
  double const rho = p.repetition_penalty;
  uint32_t const* mask = sp.mask ? sp.mask + row * sp.mask_stride : nullptr;
  double mx = kNegInf;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) {
    float const f = logits[v];
    double x = isnan(f) ? kNegInf : static_cast<double>(f);
    if (rep && seen[v]) x = x > 0 ? __ddiv_rn(x, rho) : __dmul_rn(x, rho);
    if (freq && counts[v] > 0)
      x = __dsub_rn(x, __dadd_rn(__dmul_rn(static_cast<double>(p.frequency_penalty), static_cast<double>(counts[v])),
                                 static_cast<double>(p.presence_penalty)));
    if (mask && !((mask[v >> 5] >> (v & 31)) & 1u)) x = kNegInf;
    l[v] = x;
    mx = fmax(mx, x);
  }
  mx = block_max(mx, shd);
  bool const sampled = p.temperature > 0.f;
  int64_t npos = 0;
  if (sampled && mx != kNegInf) {
    double const t = p.temperature;
    double const min_p = p.min_p;
    for (int64_t v = threadIdx.x; v < V; v += kThreads) {
      double x = l[v] == kNegInf ? 0.0 : exp(__ddiv_rn(__dsub_rn(l[v], mx), t));
      if (p.min_p > 0.f && x < min_p) x = 0.0;
      w[v] = x;
      npos += x > 0;
    }
    npos = static_cast<int64_t>(block_sum(static_cast<double>(npos), shd));  // integer counts: exact
  }
  bool const use_k = p.top_k > 0 && static_cast<int64_t>(p.top_k) < V;
  bool const use_p = p.top_p < 1.f;
  bool const needs_sort = sampled && mx != kNegInf && (use_k || use_p);
  if (threadIdx.x == 0) {
    *st = RowState{0, static_cast<int32_t>(npos), needs_sort ? 1 : 0, 0, mx};
    sp.seg_end[row] = row * V + (needs_sort ? V : 0);
  }
}

__global__ void __launch_bounds__(kThreads) sample_finish_kernel(SampleParams const sp) {
  device::pdl_enter();
  __shared__ double shd[32];
  __shared__ int shi[32];
  __shared__ long long shl[32];
  __shared__ double chunk[kThreads];
  int64_t const row = blockIdx.x, V = sp.vocab;
  RowState const st = sp.state[row];
  if (st.status != 0) {
    if (threadIdx.x == 0) sp.tokens[row] = st.status;
    return;
  }
  ops::SamplingRowParams const p = sp.params[row];
  double const* l = sp.l + row * V;
  double* w = sp.w + row * V;
  int64_t const C = (V + kThreads - 1) / kThreads;
  int64_t const lo = threadIdx.x * C, hi = lo + C < V ? lo + C : V;
  int tok = -1;
  if (!(p.temperature > 0.f)) {
    double bv = 0.0;
    int bi = -1;
    for (int64_t v = threadIdx.x; v < V; v += kThreads)
      if (l[v] != kNegInf && better(l[v], static_cast<int>(v), bv, bi)) { bv = l[v]; bi = static_cast<int>(v); }
    tok = block_argbest(bv, bi, shd, shi, nullptr);
  } else if (st.max_l != kNegInf) {
    if (st.needs_sort) {
      double const* ws = sp.w_sorted + row * V;
      int32_t const* is = sp.ids_sorted + row * V;
      int64_t const npos = st.npos;
      bool const use_k = p.top_k > 0 && static_cast<int64_t>(p.top_k) < V;
      int64_t keep = use_k ? (npos < p.top_k ? npos : p.top_k) : npos;
      if (p.top_p < 1.f) {
        int64_t const klo = lo < keep ? lo : keep, khi = hi < keep ? hi : keep;
        double s = 0.0;
        for (int64_t j = klo; j < khi; ++j) s = __dadd_rn(s, ws[j]);
        chunk[threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
          double acc = 0.0;
          for (int t = 0; t < kThreads; ++t) { double const c = chunk[t]; chunk[t] = acc; acc = __dadd_rn(acc, c); }
          shd[31] = acc;
        }
        __syncthreads();
        double const pt = __dmul_rn(static_cast<double>(p.top_p), shd[31]);
        double before = chunk[threadIdx.x];
        long long found = LLONG_MAX;
        for (int64_t j = klo; j < khi; ++j) {
          if (!(before < pt)) { found = j; break; }
          before = __dadd_rn(before, ws[j]);
        }
        __syncthreads();
        long long const j = block_min_ll(found, shl);
        int64_t const jj = j == LLONG_MAX ? keep : j;
        keep = jj > 1 ? jj : 1;
      }
      for (int64_t j = keep + threadIdx.x; j < npos; j += kThreads) w[is[j]] = 0.0;
      __syncthreads();
    }
    // Inverse-CDF draw in ascending id order.
    double s = 0.0;
    for (int64_t v = lo; v < hi; ++v)
      if (w[v] > 0) s = __dadd_rn(s, w[v]);
    chunk[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double acc = 0.0;
      for (int t = 0; t < kThreads; ++t) { double const c = chunk[t]; chunk[t] = acc; acc = __dadd_rn(acc, c); }
      shd[31] = acc;
    }
    __syncthreads();
    double const total = shd[31];
    if (total > 0) {
      double const target = __dmul_rn(keyed_uniform(p.seed, p.stream_key, p.position), total);
      double cum = chunk[threadIdx.x];
      long long found = LLONG_MAX, last = -1;
      for (int64_t v = lo; v < hi; ++v) {
        if (!(w[v] > 0)) continue;
        cum = __dadd_rn(cum, w[v]);
        last = v;
        if (cum > target) { found = v; break; }
      }
      __syncthreads();
      long long const f = block_min_ll(found, shl);
      if (f != LLONG_MAX) {
        tok = static_cast<int>(f);
      } else {
        long long const lst = -block_min_ll(-last, shl);  // rounding: u·total ≥ the summed mass → last kept id
        tok = static_cast<int>(lst);
      }
    }
  }
  if (threadIdx.x == 0) sp.tokens[row] = tok;
  if (tok < 0 || (!sp.logprobs && sp.num_top == 0)) return;
  // Log-softmax of the raw or processed logits.
  float const* logits = sp.logits + row * sp.logit_stride;
  double const tdiv = p.temperature > 0.f ? static_cast<double>(p.temperature) : 1.0;
  auto src = [&](int64_t v) -> double {
    if (!sp.processed) {
      float const f = logits[v];
      return isnan(f) ? kNegInf : static_cast<double>(f);
    }
    return l[v] == kNegInf ? kNegInf : __ddiv_rn(l[v], tdiv);
  };
  double m = kNegInf;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) m = fmax(m, src(v));
  m = block_max(m, shd);
  double s = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) {
    double const x = src(v);
    if (x != kNegInf) s = __dadd_rn(s, exp(__dsub_rn(x, m)));
  }
  s = block_sum(s, shd);
  double const lse = __dadd_rn(m, log(s));
  auto lp = [&](int64_t v) -> double {
    double const x = src(v);
    return x == kNegInf ? kNegInf : __dsub_rn(x, lse);
  };
  if (sp.logprobs && threadIdx.x == 0) sp.logprobs[row] = static_cast<float>(lp(tok));
  double pv = 0.0;
  int pi = -1;  // previous pick: candidates are strictly after it in (lp desc, id asc)
  for (int32_t j = 0; j < sp.num_top; ++j) {
    double bv = 0.0;
    int bi = -1;
    for (int64_t v = threadIdx.x; v < V; v += kThreads) {
      double const x = lp(v);
      if (pi >= 0 && !better(pv, pi, x, static_cast<int>(v))) continue;
      if (better(x, static_cast<int>(v), bv, bi)) { bv = x; bi = static_cast<int>(v); }
    }
    double best_v;
    int const best = block_argbest(bv, bi, shd, shi, &best_v);
    if (threadIdx.x == 0) {
      sp.top_ids[row * sp.num_top + j] = best;
      sp.top_logprobs[row * sp.num_top + j] = static_cast<float>(best_v);
    }
    pv = best_v;
    pi = best;
  }
}

}  // namespace

}  // namespace tessera::kernels

namespace tessera::ops {

static_assert(BackendOp<Sample<Backend::kCuda>, SampleDesc, SampleArgs>);

namespace {

struct SampleLayout {
  size_t l, w, w_sorted, ids, ids_sorted, counts, seen, seg_begin, seg_end, state, cub, total;
};

SampleLayout sample_layout(SampleDesc const& d) {
  using kernels::align256;
  size_t const n = static_cast<size_t>(d.num_rows * d.vocab_size);
  size_t cub_bytes = 0;
  cub::DeviceSegmentedSort::StableSortPairsDescending(nullptr, cub_bytes, static_cast<double const*>(nullptr),
                                                      static_cast<double*>(nullptr), static_cast<int32_t const*>(nullptr),
                                                      static_cast<int32_t*>(nullptr), static_cast<int64_t>(n),
                                                      static_cast<int64_t>(d.num_rows), static_cast<int64_t const*>(nullptr),
                                                      static_cast<int64_t const*>(nullptr));
  SampleLayout L{};
  size_t off = 0;
  auto take = [&](size_t bytes) { size_t const o = off; off += align256(bytes); return o; };
  L.l = take(n * 8); L.w = take(n * 8); L.w_sorted = take(n * 8);
  L.ids = take(n * 4); L.ids_sorted = take(n * 4); L.counts = take(n * 4); L.seen = take(n);
  L.seg_begin = take(static_cast<size_t>(d.num_rows) * 8); L.seg_end = take(static_cast<size_t>(d.num_rows) * 8);
  L.state = take(static_cast<size_t>(d.num_rows) * sizeof(kernels::RowState));
  L.cub = take(cub_bytes);
  L.total = off;
  return L;
}

}  // namespace

size_t Sample<Backend::kCuda>::workspace_bytes(SampleDesc const& d) { return sample_layout(d).total; }

Status Sample<Backend::kCuda>::check(SampleDesc const& d, SampleArgs const& a) {
  TESSERA_CHECK(d.num_rows >= 0 && d.vocab_size > 0 && d.vocab_size < (int64_t{1} << 31),
                "sample: num_rows must be ≥ 0 and 0 < vocab_size < 2^31");
  TESSERA_CHECK(d.num_top_logprobs >= 0 && d.num_top_logprobs <= d.vocab_size,
                "sample: num_top_logprobs must be in [0, vocab_size]");
  TESSERA_CHECK(a.logits.shape[0] == d.num_rows && a.logits.shape[1] == d.vocab_size && a.logits.stride[1] == 1,
                "sample: logits must be [num_rows, vocab_size] with unit inner stride");
  TESSERA_CHECK(a.params.shape[0] == d.num_rows, "sample: params must have num_rows entries");
  TESSERA_CHECK(a.tokens.shape[0] == d.num_rows, "sample: tokens must have num_rows entries");
  if (!a.mask.empty())
    TESSERA_CHECK(a.mask.shape[0] == d.num_rows && a.mask.shape[1] == (d.vocab_size + 31) / 32 && a.mask.stride[1] == 1,
                  "sample: mask must be [num_rows, ceil(vocab_size/32)] words");
  if (!a.logprobs.empty()) TESSERA_CHECK(a.logprobs.shape[0] == d.num_rows, "sample: logprobs must be [num_rows]");
  if (d.num_top_logprobs > 0)
    TESSERA_CHECK(a.top_ids.shape[0] == d.num_rows && a.top_ids.shape[1] == d.num_top_logprobs &&
                      a.top_logprobs.shape[0] == d.num_rows && a.top_logprobs.shape[1] == d.num_top_logprobs &&
                      a.top_ids.is_contiguous() && a.top_logprobs.is_contiguous(),
                  "sample: top_ids/top_logprobs must be contiguous [num_rows, num_top_logprobs]");
  TESSERA_CHECK(a.prompt_offsets.empty() || a.prompt_offsets.shape[0] == d.num_rows + 1,
                "sample: prompt_offsets must have num_rows + 1 entries");
  TESSERA_CHECK(a.output_offsets.empty() || a.output_offsets.shape[0] == d.num_rows + 1,
                "sample: output_offsets must have num_rows + 1 entries");
  return {};
}

Status Sample<Backend::kCuda>::run(SampleDesc const& d, SampleArgs const& a, ExecContext& ctx) {
  using namespace kernels;
  if (d.num_rows == 0) return {};
  SampleLayout const L = sample_layout(d);
  Scratch ws;
  TESSERA_TRY(ws.acquire(ctx, L.total));
  auto* base = static_cast<unsigned char*>(ws.ptr);
  SampleParams sp;
  sp.logits = a.logits.data; sp.params = a.params.data;
  sp.mask = a.mask.empty() ? nullptr : a.mask.data;
  sp.prompt_off = a.prompt_offsets.empty() ? nullptr : a.prompt_offsets.data;
  sp.prompt_tok = a.prompt_tokens.data;
  sp.output_off = a.output_offsets.empty() ? nullptr : a.output_offsets.data;
  sp.output_tok = a.output_tokens.data;
  sp.tokens = a.tokens.data;
  sp.logprobs = a.logprobs.empty() ? nullptr : a.logprobs.data;
  sp.top_ids = d.num_top_logprobs > 0 ? a.top_ids.data : nullptr;
  sp.top_logprobs = d.num_top_logprobs > 0 ? a.top_logprobs.data : nullptr;
  sp.rows = d.num_rows; sp.vocab = d.vocab_size;
  sp.logit_stride = a.logits.stride[0];
  sp.mask_stride = a.mask.empty() ? 0 : a.mask.stride[0];
  sp.num_top = d.num_top_logprobs;
  sp.processed = d.logprob_mode == LogprobMode::kProcessed;
  sp.l = reinterpret_cast<double*>(base + L.l);
  sp.w = reinterpret_cast<double*>(base + L.w);
  sp.w_sorted = reinterpret_cast<double*>(base + L.w_sorted);
  sp.ids = reinterpret_cast<int32_t*>(base + L.ids);
  sp.ids_sorted = reinterpret_cast<int32_t*>(base + L.ids_sorted);
  sp.counts = reinterpret_cast<int32_t*>(base + L.counts);
  sp.seen = base + L.seen;
  sp.seg_begin = reinterpret_cast<int64_t*>(base + L.seg_begin);
  sp.seg_end = reinterpret_cast<int64_t*>(base + L.seg_end);
  sp.state = reinterpret_cast<RowState*>(base + L.state);
  cudaStream_t const st = stream_of(ctx);
  device::launch_pdl(sample_prepare_kernel, static_cast<unsigned>(d.num_rows), kThreads, 0, st, sp);
  TESSERA_TRY(launch_status("sample_prepare_kernel"));
  size_t cub_bytes = L.total - L.cub;
  TESSERA_TRY(cuda_status(cub::DeviceSegmentedSort::StableSortPairsDescending(
                              base + L.cub, cub_bytes, static_cast<double const*>(sp.w), sp.w_sorted,
                              static_cast<int32_t const*>(sp.ids), sp.ids_sorted, d.num_rows * d.vocab_size,
                              d.num_rows, static_cast<int64_t const*>(sp.seg_begin),
                              static_cast<int64_t const*>(sp.seg_end), st),
                          "sample segmented sort"));
  device::launch_pdl(sample_finish_kernel, static_cast<unsigned>(d.num_rows), kThreads, 0, st, sp);
  return launch_status("sample_finish_kernel");
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// EXL3 linears in the GPU model, kept as stored (trellis + suh + svh in the backend's memory): the upload,
/// Forward::lin_exl3 (every projection and the head) and Forward::moe_exl3 (routed experts through
/// Exl3GroupedGemm over the routing grouped on the backend by moe_group, so no host round trip; the shared
/// expert through Exl3Gemm), plus the host twins of the glue kernels (kernels/dsv41/exl3_glue.cu). The
/// arithmetic is the CPU model's (exl3_linear.cpp):
///   y = →md(Exl3Gemm_f32(→fp16(x)))
/// Exl3Gemm / Exl3GroupedGemm are row-invariant (ops/exl3.hpp: a row's result never depends on the number of
/// rows or on the other rows), and the glue is elementwise per row, so batched == alone holds bit for bit, and so does
/// running a pass's rows in blocks (gpu::Exl3RowBlock), which bounds the scratch and the ops' workspaces by the block.
/// On the CPU backend the ops are the float64-summed reference, bit for bit the CPU model; on CUDA the
/// accumulation xh·W' is fp32 in the kernels' chunk order (spec/exl3.md §4.4), so CUDA agrees with the CPU
/// within a tolerance only.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "models/deepseek_v41/gpu_forward.hpp"
#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/ref/common_ref.hpp"

namespace tessera::model::dsv41 {

namespace gpu {

Status to_f16(Mem const& m, float const* x, int64_t stride, int64_t rows, int64_t cols, uint16_t* out) {
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_to_f16(m.stream, x, stride, rows, cols, out);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  to_f16_rows(x, stride, rows, cols, out);
  return {};
}

Status store_md(Mem const& m, float const* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst, int64_t stride,
                bool bf16) {
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_store_md(m.stream, src, src_stride, rows, cols, dst, stride, bf16);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float const v = src[r * src_stride + c];
      dst[r * stride + c] = bf16 ? round_to_bf16(v) : v;
    }
  return {};
}

Status exl3_moe_act(Mem const& m, float const* g, float const* u, float const* w, int64_t rows, int32_t const* row_count,
                    int64_t inter, float limit, bool bf16, uint16_t* out) {
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_exl3_moe_act(m.stream, g, u, w, rows, row_count, inter, limit, bf16, out);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  DType const md = bf16 ? DType::kBf16 : DType::kF32;
  int64_t const used = row_count ? std::min<int64_t>(rows, *row_count) : rows;
  for (int64_t a = 0; a < used; ++a)
    for (int64_t i = 0; i < inter; ++i) {  // moe_experts_mixed's activation, then →fp16
      float gv = ref::round_md(g[a * inter + i], md), uv = ref::round_md(u[a * inter + i], md);
      if (limit > 0.f) { uv = std::clamp(uv, -limit, limit); gv = std::min(gv, limit); }
      float y = ref::silu(gv, md) * uv;
      if (w) y = w[a] * y;
      out[a * inter + i] = f16_bits_from_float(ref::round_md(y, md));
    }
  return {};
}

Status moe_act(Mem const& m, float const* g, float const* u, int64_t rows, int64_t inter, float limit, bool bf16,
               float* out) {
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_moe_act(m.stream, g, u, rows, inter, limit, bf16, out);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  DType const md = bf16 ? DType::kBf16 : DType::kF32;
  for (int64_t a = 0; a < rows; ++a)
    for (int64_t i = 0; i < inter; ++i) {  // ref::moe_expert_row_accumulate's unweighted activation
      float gv = ref::round_md(g[a * inter + i], md), uv = ref::round_md(u[a * inter + i], md);
      if (limit > 0.f) { uv = std::clamp(uv, -limit, limit); gv = std::min(gv, limit); }
      out[a * inter + i] = ref::round_md(ref::silu(gv, md) * uv, md);
    }
  return {};
}

Status moe_combine(Mem const& m, float const* y, int64_t const* off, int32_t const* list, float const* ysh,
                   int64_t tokens, int64_t D, bool bf16, float* out) {
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_moe_combine(m.stream, y, off, list, ysh, tokens, D, bf16, out);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  DType const md = bf16 ? DType::kBf16 : DType::kF32;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < D; ++o) {
      float acc = 0.f;
      for (int64_t j = off[t]; j < off[t + 1]; ++j) acc += ref::round_md(y[list[j] * D + o], md);
      if (ysh) acc += ref::round_md(ysh[t * D + o], md);
      out[t * D + o] = ref::round_md(acc, md);
    }
  return {};
}

Status moe_group(Mem const& m, MoeGroupParams const& p) {
  TESSERA_TRY(check_moe_group(p));
  if (m.backend == Backend::kCuda) {
#if TESSERA_WITH_CUDA
    return launch_moe_group(m.stream, p);
#else
    return not_supported("Tessera was built without CUDA");
#endif
  }
  int64_t const N = p.tokens, K = p.top_k, E = p.experts, S = N * K;
  auto kept_expert = [&](int64_t s) { return p.ids[s] >= 0 && p.ids[s] < E ? p.ids[s] : -1; };
  std::fill(p.offsets, p.offsets + E + 1, 0);
  for (int64_t s = 0; s < S; ++s)
    if (kept_expert(s) >= 0) ++p.offsets[kept_expert(s) + 1];
  for (int64_t e = 0; e < E; ++e) p.offsets[e + 1] += p.offsets[e];
  int32_t const A = p.offsets[E];
  std::vector<int32_t> next(p.offsets, p.offsets + E);  // the next free assignment of each expert
  for (int64_t s = 0; s < S; ++s) {
    int32_t const e = kept_expert(s);
    p.slot_assignment[s] = -1;
    if (e < 0) continue;
    int32_t const a = next[static_cast<size_t>(e)]++;
    p.slot_assignment[s] = a;
    p.token_idx[a] = static_cast<int32_t>(s / K);
    p.route_weight[a] = p.weights[s];
  }
  for (int64_t a = 0; a < S; ++a) {
    p.identity[a] = static_cast<int32_t>(a);
    if (a >= A) {
      p.token_idx[a] = 0;
      p.route_weight[a] = 0.f;
      p.combine_list[a] = 0;
    }
  }
  std::vector<std::pair<int32_t, int32_t>> order;  // (expert id, a) of one token
  int64_t j = 0;
  p.combine_offsets[0] = 0;
  for (int64_t r = 0; r < N; ++r) {
    order.clear();
    for (int64_t s = r * K; s < (r + 1) * K; ++s)
      if (p.slot_assignment[s] >= 0) order.emplace_back(p.ids[s], p.slot_assignment[s]);
    std::sort(order.begin(), order.end());
    for (auto const& [id, a] : order) p.combine_list[j++] = a;
    p.combine_offsets[r + 1] = j;
  }
  return {};
}

namespace {
std::atomic<int64_t> exl3_row_block{Exl3RowBlock::kDefault};
}  // namespace

int64_t Exl3RowBlock::get() { return exl3_row_block.load(std::memory_order_relaxed); }
void Exl3RowBlock::set_for_test(int64_t rows) { exl3_row_block.store(std::max<int64_t>(rows, 1), std::memory_order_relaxed); }

Status upload_exl3(Mem const& mem, GpuWeights& w, Exl3Weight const& q, int64_t groups, DevTensor* out) {
  *out = {};
  std::vector<Exl3Weight> split;
  if (groups > 1 && q.kept_end >= 0)
    return not_supported("EXL3 group " + q.name + ": a part keeping outputs [" + std::to_string(q.kept_begin) + ", " +
                         std::to_string(q.kept_end) + ") of its covering blocks cannot be run as " +
                         std::to_string(groups) + " grouped slices");
  if (groups > 1) {
    try {
      split = exl3_split_outputs(q, groups);
    } catch (Error const& e) {
      return e.status();
    }
  }
  out->rows = q.outputs();
  out->cols = q.desc.k;
  out->dtype = DType::kI16;
  out->exl3 = q.desc;
  out->exl3.n = q.desc.n / groups;
  out->exl3_groups = groups;
  out->exl3_kept_begin = q.kept_begin;
  // Grouped slices are products of their own width on one rank as on all (the single-rank wo_a is uploaded in the
  // same o_lora_rank-wide slices), so only an ungrouped part sums in its whole group's chunk order.
  out->exl3_chunk_n = groups == 1 ? q.whole_n : 0;
  size_t const tbytes = q.trellis.nbytes(), kb = q.suh.size() * 2, nb = q.svh.size() * 2;
  auto alloc = [&](size_t bytes) -> Result<void*> {
    auto p = mem.alloc(bytes);
    if (!p) return p.status();
    w.allocations.push_back(*p);
    w.bytes += bytes;
    return p;
  };
  auto t = alloc(tbytes);
  if (!t) return t.status();
  out->p = *t;
  auto su = alloc(kb);
  if (!su) return su.status();
  out->suh = *su;
  auto sv = alloc(nb);
  if (!sv) return sv.status();
  out->svh = *sv;
  if (groups > 1) {
    size_t const part = tbytes / static_cast<size_t>(groups);
    for (int64_t g = 0; g < groups; ++g)
      TESSERA_TRY(mem.copy(static_cast<char*>(out->p) + g * part, split[static_cast<size_t>(g)].trellis.data(), part,
                           Mem::Copy::kHostToDev));
  } else {
    TESSERA_TRY(mem.copy(out->p, q.trellis.data(), tbytes, Mem::Copy::kHostToDev));
  }
  TESSERA_TRY(mem.copy(out->suh, q.suh.data(), kb, Mem::Copy::kHostToDev));
  TESSERA_TRY(mem.copy(out->svh, q.svh.data(), nb, Mem::Copy::kHostToDev));
  return mem.sync();  // the host copies (and `split`) are released on return
}

}  // namespace gpu

namespace fwd {

namespace {

Status exl3_gemm(ExecContext& ctx, ops::Exl3GemmDesc const& d, ops::Exl3GemmArgs const& a) {
  if (ctx.backend == Backend::kCpu) return ops::Exl3Gemm<Backend::kCpu>::run(d, a, ctx);
#if TESSERA_WITH_CUDA
  return ops::Exl3Gemm<Backend::kCuda>::run(d, a, ctx);
#else
  return not_supported("Tessera was built without CUDA");
#endif
}

Status exl3_grouped(ExecContext& ctx, ops::Exl3GroupedGemmDesc const& d, ops::Exl3GroupedGemmArgs const& a) {
  if (ctx.backend == Backend::kCpu) return ops::Exl3GroupedGemm<Backend::kCpu>::run(d, a, ctx);
#if TESSERA_WITH_CUDA
  return ops::Exl3GroupedGemm<Backend::kCuda>::run(d, a, ctx);
#else
  return not_supported("Tessera was built without CUDA");
#endif
}

/// Exl3Gemm with fp32 output of slice g of `w` on x16 [rows, k] → y [rows, n/G].
void gemm_slice(ExecContext& ctx, DevTensor const& w, int64_t g, uint16_t const* x16, int64_t rows, float* y) {
  ops::Exl3LayerDesc const& l = w.exl3;
  ops::Exl3GemmArgs a;
  a.x = TensorView<Fp16 const, 2>(reinterpret_cast<Fp16 const*>(x16), {rows, l.k}, kDev);
  a.trellis = TensorView<int16_t const, 3>(static_cast<int16_t const*>(w.p) + g * w.exl3_slice_words(),
                                           {l.k / 16, l.n / 16, 8 * l.k2}, kDev);
  a.suh = TensorView<Fp16 const, 1>(static_cast<Fp16 const*>(w.suh), {l.k}, kDev);
  a.svh = TensorView<Fp16 const, 1>(static_cast<Fp16 const*>(w.svh) + g * l.n, {l.n}, kDev);
  a.y_f32 = TensorView<float, 2>(y, {rows, l.n}, kDev);
  // strict_rows: the chunk chain at every row count, so chunked == one-shot and batched == alone stay exact
  // (the decode-once path from ops::kExl3DecodeOnceMinRows rows sums in cuBLAS's order). chunk_n: a rank's output
  // part sums in its whole group's chunk order.
  throw_if_error(exl3_gemm(ctx, ops::Exl3GemmDesc{l, rows, DType::kF32, false, true, w.exl3_chunk_n}, a));
}

}  // namespace

void Forward::lin_exl3(float const* x, int64_t x_stride, int64_t rows, DevTensor const& w, float* y, int64_t y_stride,
                       DType md, int64_t groups) {
  if (groups != w.exl3_groups)
    throw Error(invalid_argument("forward: an EXL3 weight stored in " + std::to_string(w.exl3_groups) +
                                 " output slices used with " + std::to_string(groups) + " groups"));
  if (rows == 0) return;
  // Outputs kept of each slice: all n, or (a rank's part cutting a block; one slice) rows of them from kept_begin.
  int64_t const k = w.exl3.k, n = w.exl3.n, kept = w.rows / groups, k0 = w.exl3_kept_begin;
  // Blocks of B rows: x16 B·k·2 B and acc B·n·4 B here, Exl3Gemm's xh B·k·2 B and partials B·n·4 B (one chunk above
  // 16 rows). wq_b (n 32768) at 8192 rows: acc 1 GiB + partials 1 GiB (a one-pass 32K prefill: 4 + 4 GiB).
  int64_t const B = std::min(rows, gpu::Exl3RowBlock::get());
  size_t const m = tmp_.mark();
  auto* x16 = tmp_.get<uint16_t>(B * k);
  auto* acc = tmp_.get<float>(B * n);
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    int64_t const nr = std::min(B, rows - r0);
    float const* xb = x + r0 * x_stride;
    float* yb = y + r0 * y_stride;
    for (int64_t g = 0; g < groups; ++g) {
      throw_if_error(gpu::to_f16(s_, xb + g * k, x_stride, nr, k, x16));
      gemm_slice(ctx_, w, g, x16, nr, acc);
      throw_if_error(gpu::store_md(s_, acc + k0, n, nr, kept, yb + g * kept, y_stride, md == DType::kBf16));
    }
  }
  tmp_.release(m);
}

float* Forward::exl3_routed(int64_t l, uint16_t const* x16, float const* rw, int32_t const* rid, int64_t N, int64_t K,
                            gpu::MoeGroupParams& gp) {
  ModelSpec const& s = m_.spec;
  gpu::GpuExperts const& me = m_.w.layers[static_cast<size_t>(l)].moe;
  int64_t const D = s.hidden_size, I = s.moe_inter, E = static_cast<int64_t>(me.w1.size());
  int64_t const S = N * K;  // slots: the capacity of the assignments (A ≤ S kept, A = offsets[E] on the backend only)
  bool const bf16 = b_.md == DType::kBf16;
  // The routing grouped by expert and the combine lists, on the backend's stream (gpu::MoeGroupParams).
  gp = {};
  gp.ids = rid;
  gp.weights = rw;
  gp.tokens = N;
  gp.top_k = K;
  gp.experts = E;
  gp.offsets = tmp_.get<int32_t>(E + 1);
  gp.slot_assignment = tmp_.get<int32_t>(S);
  gp.token_idx = tmp_.get<int32_t>(S);
  gp.route_weight = tmp_.get<float>(S);
  gp.identity = tmp_.get<int32_t>(S);
  gp.combine_offsets = tmp_.get<int64_t>(N + 1);
  gp.combine_list = tmp_.get<int32_t>(S);
  throw_if_error(gpu::moe_group(s_, gp));
  int32_t const* const kept = gp.offsets + E;  // A

  // Rows [A, S) of y, g, u and act are never written nor read: the grouped products cover rows [0, offsets[E]),
  // the activation rows below *kept, and the combine lists name assignments < A only.
  auto* y = tmp_.get<float>(S * D);
  if (S > 0) {
    auto* g = tmp_.get<float>(S * I);
    auto* u = tmp_.get<float>(S * I);
    auto* act = tmp_.get<uint16_t>(S * I);
    auto* const* P = static_cast<void const* const*>(me.exl3_ptrs);  // [3][3][E]
    auto grouped = [&](int j, ops::Exl3LayerDesc const& layer, uint16_t const* x, int64_t T, int32_t const* tok,
                       float* out) {
      ops::Exl3GroupedGemmArgs a;
      a.x = TensorView<Fp16 const, 2>(reinterpret_cast<Fp16 const*>(x), {T, layer.k}, kDev);
      a.trellis = reinterpret_cast<int16_t const* const*>(P + (3 * j + 0) * E);
      a.suh = reinterpret_cast<Fp16 const* const*>(P + (3 * j + 1) * E);
      a.svh = reinterpret_cast<Fp16 const* const*>(P + (3 * j + 2) * E);
      a.expert_offsets = gp.offsets;
      a.token_idx = tok;
      a.y = TensorView<float, 2>(out, {S, layer.n}, kDev);
      throw_if_error(exl3_grouped(ctx_, ops::Exl3GroupedGemmDesc{layer, E, T, S}, a));
    };
    grouped(0, me.w1.front().exl3, x16, N, gp.token_idx, g);
    grouped(1, me.w3.front().exl3, x16, N, gp.token_idx, u);
    throw_if_error(gpu::exl3_moe_act(s_, g, u, gp.route_weight, S, kept, I, s.swiglu_limit, bf16, act));
    grouped(2, me.w2.front().exl3, act, S, gp.identity, y);
  }
  return y;
}

void Forward::exl3_pairs(int64_t l, float const* xg, int32_t const* pid, float const* pw, int64_t P, float* out) {
  int64_t const D = m_.spec.hidden_size;
  bool const bf16 = b_.md == DType::kBf16;
  // Rows per launch of the glue kernels (≤ 65,535), and at most one moe_exl3 block's slots (Exl3RowBlock · top_k),
  // whose workspaces it bounds alike; the products are row-invariant.
  int64_t const kMaxRows = std::min<int64_t>(65535, gpu::Exl3RowBlock::get() * m_.spec.top_k);
  for (int64_t c0 = 0; c0 < P; c0 += kMaxRows) {
    int64_t const n = std::min(kMaxRows, P - c0);
    size_t const mk = tmp_.mark();
    auto* x16 = tmp_.get<uint16_t>(n * D);
    throw_if_error(gpu::to_f16(s_, xg + c0 * D, D, n, D, x16));
    gpu::MoeGroupParams gp;
    float const* y = exl3_routed(l, x16, pw + c0, pid + c0, n, 1, gp);
    // Pair j is token j with one slot: out[j] = →md(0 + →md(y_a)) for its assignment a, = →md(y_a) (0 + y = y up to
    // the sign of a zero, which the combine's sum from +0 cannot see).
    throw_if_error(gpu::moe_combine(s_, y, gp.combine_offsets, gp.combine_list, nullptr, n, D, bf16, out + c0 * D));
    tmp_.release(mk);
  }
}

void Forward::moe_exl3(int64_t l, float const* xa, float const* rw, int32_t const* rid, int64_t N, float* F) {
  ModelSpec const& s = m_.spec;
  gpu::GpuExperts const& me = m_.w.layers[static_cast<size_t>(l)].moe;
  int64_t const D = s.hidden_size, I = s.moe_inter;
  int64_t const K = s.top_k;
  bool const bf16 = b_.md == DType::kBf16;
  // Blocks of B tokens, B·K slots (v41-flash at 8192 tokens: 49,152 slots, 128 per expert): y 0.94 GiB, g / u 0.42 GiB
  // each, and each grouped product's workspace xh + slots·n·4 B on the grouped GEMM (w1 / w3 0.89 GiB, w2 1.15 GiB);
  // below ops::kExl3GroupedGemmMinRows slots per expert the GEMV's chunks·slots·n·4 B (40 chunks of n 2304, 18 of
  // n 5120: 16.9 GiB at this size). A token's routing, products and combine lie in its block.
  int64_t const B = gpu::Exl3RowBlock::get();
  for (int64_t t0 = 0; t0 < N; t0 += B) {
    int64_t const n = std::min(B, N - t0);
    size_t const mk = tmp_.mark();
    auto* x16 = tmp_.get<uint16_t>(n * D);
    throw_if_error(gpu::to_f16(s_, xa + t0 * D, D, n, D, x16));
    gpu::MoeGroupParams gp;
    float const* y = exl3_routed(l, x16, rw + t0 * K, rid + t0 * K, n, K, gp);
    // The shared expert (EXL3 too: GpuDsv41Model::create requires it with EXL3 routed experts).
    auto* gs = tmp_.get<float>(n * I);
    auto* us = tmp_.get<float>(n * I);
    auto* acts = tmp_.get<uint16_t>(n * I);
    auto* ysh = tmp_.get<float>(n * D);
    gemm_slice(ctx_, me.s1, 0, x16, n, gs);
    gemm_slice(ctx_, me.s3, 0, x16, n, us);
    throw_if_error(gpu::exl3_moe_act(s_, gs, us, nullptr, n, nullptr, I, s.swiglu_limit, bf16, acts));
    gemm_slice(ctx_, me.s2, 0, acts, n, ysh);
    throw_if_error(gpu::moe_combine(s_, y, gp.combine_offsets, gp.combine_list, ysh, n, D, bf16, F + t0 * D));
    tmp_.release(mk);
  }
}

}  // namespace fwd

}  // namespace tessera::model::dsv41

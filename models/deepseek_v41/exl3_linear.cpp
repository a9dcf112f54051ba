// SPDX-License-Identifier: Apache-2.0
/// EXL3 linears in the DeepSeek-V4.1 models (docs/deepseek-v41-gpu.md "EXL3 checkpoints"; architecture
/// note 18). An EXL3 linear W [out, in] of the model computes, for every row x (md values held in fp32):
///   y = →md(Exl3Gemm_f32(→fp16(x)))
/// →fp16 is RNE (exact for bf16 values inside fp16's normal range; beyond ±65504 the value is ±inf, as in
/// ExLlamaV3's fp16 activations); Exl3Gemm_f32 is spec/exl3.md §4.2 with the fp32 epilogue of §4.3 (xh and
/// the epilogue bit-exact, the accumulation xh·W' in fp32 on CUDA, float64 on the CPU backend); →md rounds
/// to the model dtype of the call's output (identity for fp32 outputs). Every step is row-wise, so a row's
/// result does not depend on the other rows (row invariance).
/// The MoE block with EXL3 experts keeps ops::MoeExperts' order (ref::moe_expert_row_accumulate) with each
/// expert dot replaced by the EXL3 linear: g, u = →md(EXL3), act = →md(w·silu(min(g, L))·clamp(u, ±L)),
/// y = →md(EXL3_w2(act)); routed y summed in ascending expert id from +0 in fp32, the shared expert last, →md.
#include <algorithm>
#include <cstring>

#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/core/thread_pool.hpp"
#include "tessera/ref/common_ref.hpp"

namespace tessera::model::dsv41 {

void to_f16_rows(float const* x, int64_t x_stride, int64_t rows, int64_t cols, uint16_t* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = f16_bits_from_float(x[r * x_stride + c]);
}

void linear_exl3(ExecContext& ctx, float const* x, int64_t rows, Exl3Weight const& q, float* out, DType md) {
  if (rows == 0) return;
  int64_t const k = q.desc.k, n = q.desc.n, m = q.outputs();
  std::vector<uint16_t> x16(static_cast<size_t>(rows * k));
  to_f16_rows(x, k, rows, k, x16.data());
  // A weight keeping outputs [kept_begin, kept_end) computes its n covering outputs, then keeps those columns.
  std::vector<float> full(m == n ? 0 : static_cast<size_t>(rows * n));
  float* y = m == n ? out : full.data();
  ops::Exl3GemmDesc d{q.desc, rows, DType::kF32, false};
  ops::Exl3GemmArgs a;
  a.x = TensorView<Fp16 const, 2>(reinterpret_cast<Fp16 const*>(x16.data()), {rows, k});
  a.trellis = q.trellis.view_as<int16_t const, 3>();
  a.suh = TensorView<Fp16 const, 1>(reinterpret_cast<Fp16 const*>(q.suh.data()), {k});
  a.svh = TensorView<Fp16 const, 1>(reinterpret_cast<Fp16 const*>(q.svh.data()), {n});
  a.y_f32 = TensorView<float, 2>(y, {rows, n});
  ExecContext cpu = ctx;
  cpu.backend = Backend::kCpu;
  throw_if_error(ops::Exl3Gemm<Backend::kCpu>::run(d, a, cpu));
  if (m != n)
    for (int64_t r = 0; r < rows; ++r) std::copy(y + r * n + q.kept_begin, y + r * n + q.kept_begin + m, out + r * m);
  if (md == DType::kBf16)
    for (int64_t i = 0; i < rows * m; ++i) out[i] = round_to_bf16(out[i]);
}

void linear(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w, Exl3Weight const* q, float* out, DType md) {
  if (q) linear_exl3(ctx, x, rows, *q, out, md);
  else linear(ctx, x, rows, w, out, md);
}

std::vector<Exl3Weight> exl3_split_outputs(Exl3Weight const& q, int64_t groups) {
  int64_t const n = q.desc.n, ng = n / groups;
  if (groups <= 0 || n % groups != 0 || ng % 128 != 0 || q.kept_end >= 0)
    throw Error(not_supported("EXL3 group " + q.name + ": " + std::to_string(n) + " outputs cannot be split into " +
                              std::to_string(groups) + " groups on 128-column Hadamard blocks (spec/exl3.md §1.4)"));
  int64_t const tk = q.desc.k / 16, tn = n / 16, tg = ng / 16, wpt = q.trellis.dim(2);
  std::vector<Exl3Weight> out(static_cast<size_t>(groups));
  int16_t const* src = q.trellis.data_as<int16_t>();
  for (int64_t g = 0; g < groups; ++g) {
    Exl3Weight& p = out[static_cast<size_t>(g)];
    p.desc = q.desc;
    p.desc.n = ng;
    p.name = q.name + " (group " + std::to_string(g) + ")";
    p.trellis = Tensor::zeros(DType::kI16, {tk, tg, wpt});
    int16_t* dst = p.trellis.data_as<int16_t>();
    // Tile columns [g·tg, (g+1)·tg) of every tile row: trellis[:, g·tg : (g+1)·tg, :].
    for (int64_t a = 0; a < tk; ++a)
      std::memcpy(dst + a * tg * wpt, src + (a * tn + g * tg) * wpt, static_cast<size_t>(tg * wpt) * sizeof(int16_t));
    p.suh = q.suh;
    p.svh.assign(q.svh.begin() + g * ng, q.svh.begin() + (g + 1) * ng);
  }
  return out;
}

void linear_exl3_grouped(ExecContext& ctx, float const* x, int64_t rows, Exl3Weight const& q, int64_t groups, float* out,
                         DType md) {
  std::vector<Exl3Weight> const parts = exl3_split_outputs(q, groups);
  int64_t const k = q.desc.k, ng = q.desc.n / groups;
  std::vector<float> xg(static_cast<size_t>(rows * k)), yg(static_cast<size_t>(rows * ng));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy(x + r * groups * k + g * k, x + r * groups * k + (g + 1) * k, xg.begin() + r * k);
    linear_exl3(ctx, xg.data(), rows, parts[static_cast<size_t>(g)], yg.data(), md);
    for (int64_t r = 0; r < rows; ++r)
      std::copy(yg.begin() + r * ng, yg.begin() + (r + 1) * ng, out + r * groups * ng + g * ng);
  }
}

void expert_act_mixed(ExecContext& ctx, float const* x, int64_t rows, Tensor const& w1, Exl3Weight const* q1,
                      Tensor const& w3, Exl3Weight const* q3, float const* weights, float limit, DType md, float* act) {
  int64_t const I = linear_out(w1, {q1, nullptr});
  std::vector<float> u(static_cast<size_t>(rows * I));
  linear(ctx, x, rows, w1, q1, act, md);
  linear(ctx, x, rows, w3, q3, u.data(), md);
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t i = 0; i < I; ++i) {
      float gv = act[j * I + i], uv = u[j * I + i];
      if (limit > 0.f) { uv = std::clamp(uv, -limit, limit); gv = std::min(gv, limit); }
      float v = ref::silu(gv, md) * uv;
      if (weights) v = weights[j] * v;
      act[j * I + i] = ref::round_md(v, md);
    }
}

bool layer_has_exl3_experts(Weights const& w, int64_t l, int64_t experts) {
  for (char const* wn : {"w1", "w3", "w2"}) {
    if (w.exl3_of(exl3_shared_key(l, wn))) return true;
    for (int64_t e = 0; e < experts; ++e)
      if (w.exl3_of(scaled_expert_key(l, e, wn))) return true;
  }
  return false;
}

void moe_experts_mixed(ExecContext& ctx, ModelSpec const& s, Weights const& wts, int64_t l, float const* x,
                       int32_t const* ids, float const* weights, int64_t rows, DType md, float* out) {
  LayerWeights const& lw = wts.layers[static_cast<size_t>(l)];
  int64_t const D = s.hidden_size, I = s.moe_inter, K = s.top_k, E = s.n_experts;
  float const limit = s.swiglu_limit;
  // y [rows·K + rows, D]: slot (r, i) at r·K + i, the shared expert of row r at rows·K + r.
  std::vector<float> y(static_cast<size_t>((rows * K + rows) * D), 0.f);
  auto expert = [&](ExpertWeights const& ew, std::string const& k1, std::string const& k3, std::string const& k2,
                    std::vector<int64_t> const& slots, std::vector<int64_t> const& src_rows, bool weighted) {
    int64_t const m = static_cast<int64_t>(slots.size());
    if (m == 0) return;
    std::vector<float> xe(static_cast<size_t>(m * D)), g(static_cast<size_t>(m * I)), ye(static_cast<size_t>(m * D)),
        wj(weighted ? static_cast<size_t>(m) : 0);
    for (int64_t j = 0; j < m; ++j) std::copy(x + src_rows[j] * D, x + (src_rows[j] + 1) * D, xe.begin() + j * D);
    for (int64_t j = 0; j < static_cast<int64_t>(wj.size()); ++j) wj[j] = weights[slots[j]];
    expert_act_mixed(ctx, xe.data(), m, ew.w1, wts.exl3_of(k1), ew.w3, wts.exl3_of(k3), weighted ? wj.data() : nullptr,
                     limit, md, g.data());
    linear(ctx, g.data(), m, ew.w2, wts.exl3_of(k2), ye.data(), md);
    for (int64_t j = 0; j < m; ++j) std::copy(ye.begin() + j * D, ye.begin() + (j + 1) * D, y.begin() + slots[j] * D);
  };
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> slots, src;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < K; ++i)
        if (ids[r * K + i] == e) { slots.push_back(r * K + i); src.push_back(r); }
    expert(lw.experts[static_cast<size_t>(e)], scaled_expert_key(l, e, "w1"), scaled_expert_key(l, e, "w3"),
           scaled_expert_key(l, e, "w2"), slots, src, true);
  }
  std::vector<int64_t> sh(static_cast<size_t>(rows)), shr(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) { sh[r] = rows * K + r; shr[r] = r; }
  expert(lw.shared, exl3_shared_key(l, "w1"), exl3_shared_key(l, "w3"), exl3_shared_key(l, "w2"), sh, shr, false);
  // Combine: ascending expert id (slots of id −1, pruned, skipped), shared last, →md.
  std::vector<std::pair<int32_t, int64_t>> order(static_cast<size_t>(K));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < K; ++i) order[i] = {ids[r * K + i], r * K + i};
    std::sort(order.begin(), order.end());
    for (int64_t o = 0; o < D; ++o) {
      float acc = 0.f;
      for (auto const& [id, slot] : order)
        if (id >= 0) acc += y[slot * D + o];
      acc += y[(rows * K + r) * D + o];
      out[r * D + o] = ref::round_md(acc, md);
    }
  }
}

Status check_exl3_weights(ModelSpec const& s, Weights const& w, bool sharded) {
  if (w.exl3.empty()) return {};
  if (sharded)
    // The rank's MoE (shard_moe) runs a layer's experts as EXL3 exactly when its shared expert is EXL3, so every
    // expert linear of such a layer must be EXL3 and no other layer may have one.
    for (int64_t l = 0; l < s.num_layers; ++l) {
      int64_t exl3 = 0, held = 0;
      for (char const* wn : {"w1", "w3", "w2"}) {
        exl3 += w.exl3_of(exl3_shared_key(l, wn)) != nullptr;
        ++held;
        for (int64_t e = 0; e < s.n_experts; ++e) {
          LayerWeights const& lw = w.layers[static_cast<size_t>(l)];
          bool const x = w.exl3_of(scaled_expert_key(l, e, wn)) != nullptr;
          if (!x && !lw.experts[static_cast<size_t>(e)].w1.defined() && !w.scaled_of(scaled_expert_key(l, e, wn)))
            continue;  // not held (a rank's host model): no linear to compare
          exl3 += x;
          ++held;
        }
      }
      if (exl3 != 0 && exl3 != held)
        return not_supported("layer " + std::to_string(l) + " mixes EXL3 and dense expert linears (" +
                             std::to_string(exl3) + " of " + std::to_string(held) +
                             " EXL3); a tensor/expert-parallel model needs all or none of a layer's experts in EXL3");
    }
  for (auto const& [key, q] : w.exl3) {
    if (key.size() > 5 && key.compare(key.size() - 5, 5, ".wo_a") == 0) {
      int64_t const ro = s.o_lora_rank;
      if (ro % 128 != 0)
        return not_supported("EXL3 group " + q.name + ": the grouped wo_a needs o_lora_rank a multiple of 128 "
                             "(each group is a 128-column-aligned output slice, spec/exl3.md §1.4), got " +
                             std::to_string(ro));
    }
  }
  return {};
}

}  // namespace tessera::model::dsv41

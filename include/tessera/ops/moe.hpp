// SPDX-License-Identifier: Apache-2.0
/// MoE family (spec/deepseek-v41.md §2.6): MoeRoute (sqrt-softplus scores in fp32, selection-only bias,
/// renormalisation, routed scaling; ties → lower expert id) and MoeExperts (clamped SwiGLU experts, the
/// routing weight applied before w2, routed outputs summed in ascending expert id from a zero fp32
/// buffer, the shared expert added last, →md). Reference: ref/moe_ref.hpp.
/// Expert pruning (spec/seed-notes.md §5, lossy, off by default): a static per-expert mask excludes
/// experts before top-k (MoeRouteArgs::expert_mask), and per-token top-p keeps the smallest
/// weight-ordered prefix of the selected experts reaching prune_top_p of their summed weight (at least
/// prune_min_k, at least 1); a dropped slot keeps its position with id −1 and weight 0, and MoeExperts
/// skips slots with id −1. A CUDA backend takes the same Desc fields and the same slot convention.
#pragma once

#include <span>

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

struct MoeRouteDesc {
  int64_t rows = 0, experts = 0, dim = 0, top_k = 1;
  float gate_temp = 1.f, routed_scale = 1.f;
  bool norm_top_k = true;
  // Per-token pruning (runs when prune_top_p < 1; ref::moe_prune_row); the defaults keep
  // every selected expert and leave ids and weights bit for bit as without pruning.
  float prune_top_p = 1.f;     // in (0, 1]; 1 = off
  int64_t prune_min_k = 0;     // keep at least max(1, prune_min_k) experts
  bool prune_renorm = true;    // kept weights ·= (selected sum / kept sum); false = original weights
  /// The model dtype: the router is fp32 either way; md selects softplus's exp and ln(1 + ·) (ref::softplus).
  DType md = DType::kF32;
  friend bool operator==(MoeRouteDesc const&, MoeRouteDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, MoeRouteDesc const& d) {
  return os << "MoeRouteDesc{"
            << " rows=" << d.rows
            << " experts=" << d.experts
            << " dim=" << d.dim
            << " top_k=" << d.top_k
            << " gate_temp=" << d.gate_temp
            << " routed_scale=" << d.routed_scale
            << " norm_top_k=" << d.norm_top_k
            << " md=" << dtype_name(d.md) << " }";
}

struct MoeRouteArgs {
  TensorView<float const, 2> x;      // [rows, dim] router input (md values)
  TensorView<float const, 2> gate;   // [experts, dim]
  TensorView<float const, 1> bias;   // [experts] selection-only bias; empty = none
  TensorView<float, 2> weights;      // [rows, top_k]
  TensorView<int32_t, 2> ids;        // [rows, top_k], descending biased score
  TensorView<uint8_t, 1> cutoff_tie; // [rows]
  TensorView<uint8_t const, 1> expert_mask;  // [experts] nonzero = pruned (never selected); empty = none
};

struct MoeExpertsDesc {
  int64_t rows = 0, experts = 0, dim = 0, inter = 0, top_k = 1;
  float swiglu_limit = 0.f;  // ≤ 0 disables the clamp
  bool shared_expert = true;
  DType md = DType::kF32;
  DType weight_dtype = DType::kF32;  // CUDA: kF32 or kBf16 (MoeExpertsArgs::dev); CPU: kF32 only
  friend bool operator==(MoeExpertsDesc const&, MoeExpertsDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, MoeExpertsDesc const& d) {
  return os << "MoeExpertsDesc{"
            << " rows=" << d.rows
            << " experts=" << d.experts
            << " dim=" << d.dim
            << " inter=" << d.inter
            << " top_k=" << d.top_k
            << " swiglu_limit=" << d.swiglu_limit
            << " shared_expert=" << d.shared_expert
            << " md=" << dtype_name(d.md)
            << " weight=" << dtype_name(d.weight_dtype) << " }";
}

/// Expert weights of the CUDA backend, fp32 or bf16 (MoeExpertsDesc::weight_dtype), all in device memory:
/// w1/w3/w2 are device arrays of `experts` pointers to [inter, dim] / [inter, dim] / [dim, inter].
struct MoeExpertsDeviceWeights {
  void const* const* w1 = nullptr;
  void const* const* w3 = nullptr;
  void const* const* w2 = nullptr;
  void const* shared_w1 = nullptr;  // [inter, dim]
  void const* shared_w3 = nullptr;  // [inter, dim]
  void const* shared_w2 = nullptr;  // [dim, inter]
};

struct MoeExpertsArgs {
  TensorView<float const, 2> x;                     // [rows, dim]
  TensorView<int32_t const, 2> ids;                 // [rows, top_k]; −1 = empty slot (pruned)
  TensorView<float const, 2> weights;               // [rows, top_k]
  std::span<TensorView<float const, 2> const> w1;   // experts × [inter, dim]
  std::span<TensorView<float const, 2> const> w3;   // experts × [inter, dim]
  std::span<TensorView<float const, 2> const> w2;   // experts × [dim, inter]
  TensorView<float const, 2> shared_w1, shared_w3;  // [inter, dim]
  TensorView<float const, 2> shared_w2;             // [dim, inter]
  TensorView<float, 2> out;                         // [rows, dim]
  MoeExpertsDeviceWeights dev;                      // CUDA backend only (the spans above are CPU-only)
};

template <Backend B> struct MoeRoute;
template <Backend B> struct MoeExperts;
template <> struct MoeRoute<Backend::kCpu> {
  static Status check(MoeRouteDesc const&, MoeRouteArgs const&);
  static Status run(MoeRouteDesc const&, MoeRouteArgs const&, ExecContext&);
};
template <> struct MoeExperts<Backend::kCpu> {
  static Status check(MoeExpertsDesc const&, MoeExpertsArgs const&);
  static Status run(MoeExpertsDesc const&, MoeExpertsArgs const&, ExecContext&);
};
static_assert(BackendOp<MoeRoute<Backend::kCpu>, MoeRouteDesc, MoeRouteArgs>);

// CUDA backend: kernels/moe/moe_cuda.cu (builds with CUDA only). Views hold device memory; check() validates
// shapes only (ids and the expert mask live on the device: an id outside [−1, experts) is skipped).
template <> struct MoeRoute<Backend::kCuda> {
  static Status check(MoeRouteDesc const&, MoeRouteArgs const&);
  static Status run(MoeRouteDesc const&, MoeRouteArgs const&, ExecContext&);
};
/// Routed experts (grouped over experts) then the shared expert per token; workspace_bytes(desc) of scratch
/// (activations, per-slot outputs, the expert sort), ctx.workspace when large enough, else stream-ordered.
template <> struct MoeExperts<Backend::kCuda> {
  static size_t workspace_bytes(MoeExpertsDesc const&);
  static Status check(MoeExpertsDesc const&, MoeExpertsArgs const&);
  static Status run(MoeExpertsDesc const&, MoeExpertsArgs const&, ExecContext&);
};

Status moe_route(ExecContext&, MoeRouteDesc const&, MoeRouteArgs const&);
Status moe_experts(ExecContext&, MoeExpertsDesc const&, MoeExpertsArgs const&);

}  // namespace tessera::ops

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

#include <algorithm>
#include <span>

#include <ostream>

#include "tessera/ops/linear.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

/// The CUDA backend's bound on top_k: a row's selection, weights and prune order live in per-thread arrays.
inline constexpr int kMoeCudaMaxTopK = 16;

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

/// How the CUDA backend evaluates the expert dots when weight_dtype and md are both bf16 (ref::dot_tc's order
/// either way, so every variant gives the same bits; fp32 weights or fp32 md always take kEmulated's kernels):
///   kEmulated  the order emulated on CUDA cores (TcDotAcc / warp_dot_row_tc): x and act may be any fp32 values;
///   kSkinny    mma.sync m16n8k16 (kernels/moe/moe_tc_cuda.cu), tiles of ≤ 8 assignments of one expert, one warp
///              per 8 output columns, W streamed once per tile (decode);
///   kGemm      mma.sync on 128-assignment × 128-column block tiles (prefill: W read once per 128 assignments);
///   kAuto      kGemm when the call has ≥ min(kMoeTcGemmMinPerExpert · experts, kMoeTcGemmMinAssignments)
///              assignments, else kSkinny. From one assignment per expert on average kGemm's one read of W per 128
///              assignments (the wgmma tile on sm_90a) beats kSkinny's one read per 8, though its block tile
///              multiplies 128 rows (H100, fp8 synthetic v41-flash, FP4 experts, ms for one layer + head, kSkinny →
///              kGemm: 384 experts prefill 128 / 256 / 1K tokens 13.6 / 21.0 / 56.6 → 8.4 / 12.0 / 20.8, decode
///              b64 16.1 → 12.4; 32 experts b64 8.5 → 6.8, b8 +3 … +9 %, b16 −2 … +4 % over two runs each).
///              With most experts holding one row, W is read once either way, and from 32 assignments the wgmma
///              tile is the faster reader (384 experts, top-6, two runs each: b4 2.41 → 2.52 / 2.62 ms, b5
///              2.86 / 2.77 → 2.75 / 2.75, b6 3.44 / 3.26 → 3.28 / 3.27, b7 3.61 / 3.50 → 3.35 / 3.32, b8 3.81 /
///              3.80 → 3.41 / 3.54, b16 6.34 / 6.43 → 5.55 / 5.64). Block-scaled routed experts whose tiles fit
///              the direct tile (moe_direct_tiles_fit) instead take kGemm from kMoeTcDirectGemmMinPerExpert
///              assignments per expert: below it kSkinny cuts each expert's assignments into tiles of at most
///              kTcDirectMaxRows, which read W once per 4 rather than once per 128 but at the one-warp tile's speed
///              (H100, 384 FP4 experts, one layer + head, kGemm → direct tiles: b8 3.47 / 3.34 → 2.47 / 2.45 ms,
///              b16 5.56 / 5.59 → 3.99 / 3.87, b32 9.43 / 9.56 → 7.28 / 7.00, b64 11.76 / 11.76 → 8.75 / 8.30,
///              b128 (2 per expert) 16.47 → 14.46 / 13.17; but b256 (4 per expert) 23.49 → 24.85 / 25.77 and a
///              256-token prefill 10.5 → 11.8 / 11.6: the crossover lies between 2 and 4, so kGemm from 3).
/// Block-scaled routed experts (MoeExpertsDesc::routed_scaled): kSkinny and kGemm decode their codes inside the
/// tiles (kGemm per 32-wide K slab of its 128-column block tile); with decode_group_experts > 0, kGemm instead
/// decodes groups of experts to bf16 (ops::scaled_weight, exact) in stream-ordered memory first and runs the bf16
/// block tiles on them. Same values either way.
/// PRECONDITION of kSkinny / kGemm (and of kAuto): every x value is bf16-representable (the model's MoE input
/// is →bf16 in bf16 mode; the activations are →bf16 by construction). x is rounded to bf16 on the device; a value
/// that is not bf16 would give the dot of its rounding, not ref::dot_tc of the fp32 value.
enum class MoeTcPath : int { kAuto = -1, kEmulated = 0, kSkinny = 1, kGemm = 2 };
inline constexpr int64_t kMoeTcGemmMinPerExpert = 1;
inline constexpr int64_t kMoeTcGemmMinAssignments = 32;
inline constexpr int64_t kMoeTcDirectGemmMinPerExpert = 3;

struct MoeExpertsDesc {
  int64_t rows = 0, experts = 0, dim = 0, inter = 0, top_k = 1;
  float swiglu_limit = 0.f;  // ≤ 0 disables the clamp
  bool shared_expert = true;
  DType md = DType::kF32;
  DType weight_dtype = DType::kF32;  // CUDA: kF32 or kBf16 (MoeExpertsArgs::dev); CPU: kF32 only
  MoeTcPath tc_path = MoeTcPath::kAuto;  // CUDA, bf16 weights and md only
  /// kF8E4m3 or kF4E2m1x2 when the ROUTED experts are block-scaled (the native release layout's FP4 experts;
  /// layouts and values as ops::Linear's block-scaled weights, ops::scaled_weight); the shared expert stays
  /// weight_dtype unless shared_scaled. The values are those of routed weights holding the decoded (bf16) values.
  ///   CUDA: codes in dev.w1/w3/w2, scales in dev.s1/s3/s2. Needs weight_dtype = md = kBf16, the kSkinny or kGemm
  ///         path, dim and inter multiples of 32 and ≤ kTcQuantMaxK, 16-byte aligned codes.
  ///   CPU:  MoeExpertsArgs::w1_scaled / w3_scaled / w2_scaled; each weight row is widened to its values and the
  ///         dots are ref::moe_expert_row_accumulate's (bit for bit the fp32 views of the decoded values).
  /// Any other value: not block-scaled.
  DType routed_scaled = DType::kF32;
  /// kGemm with block-scaled routed experts: 0 (default) decodes the codes inside the GEMM tiles; n > 0 decodes
  /// the experts to bf16 first, n at a time (3·dim·inter·2 bytes each), each group's tiles after its decode, groups
  /// in expert order (the cross-check of the in-tile decode; it writes and re-reads 2 bytes per weight).
  int64_t decode_group_experts = 0;
  /// Block-scaled routed experts: how codes reach the mma chain (ops::TcQuantPath; same values). kDirect: on
  /// kSkinny the tile table holds at most kTcDirectMaxRows assignments a tile (a tile's rows are distinct tokens),
  /// so any row count runs on the direct tile when moe_direct_tiles_fit; else kRing. kAuto: kDirect when
  /// moe_direct_tiles_fit, else kWarpSpec above kTcDirectMaxRows rows and kRing up to it (TESSERA_MOE_WS=0 / 1
  /// forces the one-warp choice / kWarpSpec at any row count).
  TcQuantPath routed_quant_path = TcQuantPath::kAuto;
  /// kF8E4m3 or kF4E2m1x2 when the SHARED expert is block-scaled (the native release stores it FP8 with 32 × 32
  /// ue8m0 blocks); its values are ops::scaled_weight's, as for routed_scaled. Any other value: weight_dtype.
  ///   CUDA: codes in dev.shared_w1/w3/w2, scales in dev.shared_s1/s3/s2; needs block-scaled routed experts (the
  ///         paths and alignment they need). kSkinny runs its token tiles on the block-scaled tile of its own
  ///         format (direct, warp-specialised or ring as the routed tiles); kGemm on the wgmma tiles (sm_90a, no
  ///         decode groups) decodes its codes inside the tiles as the routed experts', otherwise it decodes it to
  ///         bf16 in the call's workspace first (3·dim·inter·2 bytes) and runs the bf16 tiles. Same values.
  ///   CPU:  MoeExpertsArgs::shared_w1_scaled / shared_w3_scaled / shared_w2_scaled, rows widened.
  DType shared_scaled = DType::kF32;
  friend bool operator==(MoeExpertsDesc const&, MoeExpertsDesc const&) = default;
};

inline bool moe_routed_scaled(MoeExpertsDesc const& d) {
  return d.routed_scaled == DType::kF8E4m3 || d.routed_scaled == DType::kF4E2m1x2;
}
inline bool moe_shared_scaled(MoeExpertsDesc const& d) {
  return d.shared_expert && (d.shared_scaled == DType::kF8E4m3 || d.shared_scaled == DType::kF4E2m1x2);
}

/// Whether kSkinny's block-scaled routed tiles may run on the direct tile at this call's size: routed experts
/// block-scaled, routed_quant_path kAuto or kDirect, and the x rows of a tile (min(rows, kTcDirectMaxRows): a
/// tile's rows are distinct tokens) fit it for both dots (K = dim, then inter).
inline bool moe_direct_tiles_fit(MoeExpertsDesc const& d) {
  if (!moe_routed_scaled(d)) return false;
  if (d.routed_quant_path != TcQuantPath::kAuto && d.routed_quant_path != TcQuantPath::kDirect) return false;
  int64_t const r = std::min(d.rows, kTcDirectMaxRows);
  return tc_quant_direct_fits(r, d.dim) && tc_quant_direct_fits(r, d.inter);
}

/// The path a CUDA MoeExperts call runs: kEmulated unless weights and md are both bf16; then the descriptor's
/// choice, or for kAuto kGemm when rows·top_k ≥ min(min_per_expert·experts, min_assignments) (W read once per 128
/// assignments pays off, or the wgmma tile reads it faster), else kSkinny; when moe_direct_tiles_fit, kGemm from
/// rows·top_k ≥ min_per_expert_direct·experts instead.
inline MoeTcPath moe_tc_path_for(MoeExpertsDesc const& d, int64_t min_per_expert = kMoeTcGemmMinPerExpert,
                                 int64_t min_assignments = kMoeTcGemmMinAssignments,
                                 int64_t min_per_expert_direct = kMoeTcDirectGemmMinPerExpert) {
  if (d.weight_dtype != DType::kBf16 || d.md != DType::kBf16) return MoeTcPath::kEmulated;
  if (d.tc_path != MoeTcPath::kAuto) return d.tc_path;
  int64_t const gemm_from = moe_direct_tiles_fit(d) ? min_per_expert_direct * d.experts
                                                    : std::min(min_per_expert * d.experts, min_assignments);
  return d.rows * d.top_k >= gemm_from ? MoeTcPath::kGemm : MoeTcPath::kSkinny;
}

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
            << " weight=" << dtype_name(d.weight_dtype)
            << " tc_path=" << static_cast<int>(d.tc_path)
            << " routed_scaled=" << dtype_name(d.routed_scaled)
            << " shared_scaled=" << dtype_name(d.shared_scaled)
            << " routed_quant_path=" << static_cast<int>(d.routed_quant_path)
            << " decode_group_experts=" << d.decode_group_experts << " }";
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
  // MoeExpertsDesc::routed_scaled only: device arrays of `experts` pointers to the routed experts' ue8m0 scales
  // (FP8: [⌈inter/32⌉, ⌈dim/32⌉] for w1/w3, [⌈dim/32⌉, ⌈inter/32⌉] for w2; FP4: [inter, ⌈dim/32⌉], [dim, ⌈inter/32⌉]);
  // w1/w3/w2 then point to the codes ([inter, dim] / [dim, inter] bytes for FP8, half the columns for FP4).
  void const* const* s1 = nullptr;
  void const* const* s3 = nullptr;
  void const* const* s2 = nullptr;
  // MoeExpertsDesc::shared_scaled only: the shared expert's scales (layouts as the routed experts' above);
  // shared_w1/w3/w2 then point to its codes.
  void const* shared_s1 = nullptr;
  void const* shared_s3 = nullptr;
  void const* shared_s2 = nullptr;
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
  /// CPU backend with MoeExpertsDesc::routed_scaled: experts × the routed experts' codes and scales (w1 / w3
  /// logical [inter, dim], w2 [dim, inter]); w1 / w3 / w2 above are then not read.
  std::span<BlockScaledView const> w1_scaled, w3_scaled, w2_scaled;
  /// CPU backend with MoeExpertsDesc::shared_scaled: the shared expert's codes and scales; shared_w1 / w3 / w2
  /// above are then not read.
  BlockScaledView shared_w1_scaled, shared_w3_scaled, shared_w2_scaled;
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

// CUDA backend: kernels/moe/moe_route_cuda.cu (MoeRoute) and moe_cuda.cu (MoeExperts); builds with CUDA only.
// Views hold device memory; check() validates shapes only (ids and the expert mask live on the device: an id
// outside [−1, experts) is skipped).
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

// SPDX-License-Identifier: Apache-2.0
/// Dense bias-free linear family: y[r, o] = →md(Σ_i x[r, i]·W[o, i]) with W row-major [out, in] stored in
/// fp32 or bf16 (widened exactly), the sum in fp32 in the golden engine's GEMM order for the output dtype
/// (ref::gemm_dot: cuBLAS SGEMM's chunked FMA order for fp32, the tensor-core block order for bf16), so every
/// backend is bitwise equal to ref::linear_row over rows and every row is independent of the others.
/// Used for every projection and the LM head. Reference: ref/common_ref.hpp (linear_row).
#pragma once

#include <span>

#include <ostream>

#include "tessera/ops/op_common.hpp"

namespace tessera::ops {

/// Which CUDA kernels run a bf16-weight, bf16-output call (the tensor-core order, ref::dot_tc). Values are the
/// same either way; kSimt exists so tests and benches can compare the two. Other calls always run kSimt.
enum class LinearImpl : uint8_t {
  kAuto = 0,  // mma.sync m16n8k16 (ops::linear_tc_cuda) after x is copied to bf16
  kSimt = 1,  // the CUDA-core emulation of tc::BlockAcc (linear_chunks / rows / gemm / fma_chain kernels)
};

/// Block-scaled weights (the native release layout, spec/deepseek-v41.md §4.2), held as stored:
///   kF8E4m3    w_q [groups·out, in] e4m3 codes, w_scale [⌈groups·out/32⌉, ⌈in/32⌉] ue8m0, one per 32×32 block;
///   kF4E2m1x2  w_q [groups·out, in/2] e2m1 codes two per byte (even column in the low nibble), w_scale
///              [groups·out, ⌈in/32⌉] ue8m0, one per row and 32 columns.
/// They are a compressed store of bf16 weights: the weight's value is scaled_weight() = →bf16(code·2^(s−127))
/// (the product is exact in fp32; →bf16 is the identity for every product inside bf16's normal range, which is
/// the loader's dequantised value rounded as a bf16 model rounds its weights), and the op then behaves exactly
/// as with weight_dtype kBf16 holding those values.
inline bool is_block_scaled(DType t) { return t == DType::kF8E4m3 || t == DType::kF4E2m1x2; }

/// The bf16 value of weight (o, i) of a block-scaled weight (codes q with row stride ldq bytes, scales s with
/// row stride lds).
TESSERA_HOST_DEVICE inline float scaled_weight(DType t, uint8_t const* q, int64_t ldq, uint8_t const* s, int64_t lds,
                                               int64_t o, int64_t i) {
  if (t == DType::kF8E4m3)
    return round_to_bf16(float_from_fp8_e4m3(q[o * ldq + i]) * float_from_e8m0(s[(o / 32) * lds + i / 32]));
  uint8_t const b = q[o * ldq + i / 2];
  return round_to_bf16(float_from_fp4_e2m1(i % 2 ? b >> 4 : b & 0xF) * float_from_e8m0(s[o * lds + i / 32]));
}

/// Row o of a block-scaled weight as its bf16 values: out[i] = scaled_weight(t, q, ldq, s, lds, o, i) for i < in.
inline void scaled_weight_row(DType t, uint8_t const* q, int64_t ldq, uint8_t const* s, int64_t lds, int64_t o,
                              int64_t in, float* out) {
  for (int64_t i = 0; i < in; ++i) out[i] = scaled_weight(t, q, ldq, s, lds, o, i);
}

/// A block-scaled weight's codes and ue8m0 scales as views (the layouts above, of the weight's dtype); rows may
/// be strided (inner stride 1).
struct BlockScaledView {
  TensorView<uint8_t const, 2> q, scale;
};

struct LinearDesc {
  int64_t rows = 0, in = 0, out = 0;
  /// kF32 (LinearArgs::w), kBf16 (LinearArgs::w_bf16), or block-scaled kF8E4m3 / kF4E2m1x2 (w_q, w_scale)
  DType weight_dtype = DType::kF32;
  DType md = DType::kF32;            // rounding of y: kF32 = none, kBf16 = →bf16
  /// false: ref::gemm_dot's order (nn.Linear in the golden engine); true: ref::bmm_dot's (a torch.bmm in the
  /// golden engine: the grouped output projection wo_a; one FMA chain per output in fp32).
  bool fma_chain = false;
  LinearImpl impl = LinearImpl::kAuto;  // CUDA only; the CPU has one implementation
  /// The grouped form (the grouped output projection wo_a, spec §2.5.6): `groups` independent products,
  /// group g reading x columns [g·in, (g+1)·in) and W rows [g·out, (g+1)·out), writing y columns
  /// [g·out, (g+1)·out). x is [rows, groups·in], W [groups·out, in], y [rows, groups·out]. Each group's values
  /// are those of its own call with groups = 1.
  int64_t groups = 1;
  friend bool operator==(LinearDesc const&, LinearDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, LinearDesc const& d) {
  return os << "LinearDesc{ rows=" << d.rows << " in=" << d.in << " out=" << d.out
            << " weight=" << dtype_name(d.weight_dtype) << " md=" << dtype_name(d.md)
            << " fma_chain=" << d.fma_chain << " impl=" << (d.impl == LinearImpl::kSimt ? "simt" : "auto") << " groups=" << d.groups << " }";
}

/// Operands. With bf16 (or block-scaled) weights and a bf16 output every x value must be a bf16 value (the golden engine's bf16
/// nn.Linear sees bf16 activations; the tensor-core order is defined on bf16 operands): the CPU backend checks
/// this and refuses other x; the CUDA backend rounds x to bf16 (RNE), which is the identity on such values.
struct LinearArgs {
  TensorView<float const, 2> x;       // [rows, groups·in]; rows may be strided (inner stride 1)
  TensorView<float const, 2> w;       // [groups·out, in] when weight_dtype == kF32
  TensorView<Bf16 const, 2> w_bf16;   // [groups·out, in] when weight_dtype == kBf16
  TensorView<uint8_t const, 2> w_q;      // block-scaled codes (see is_block_scaled); rows may be strided
  TensorView<uint8_t const, 2> w_scale;  // their ue8m0 scales; rows may be strided
  TensorView<float, 2> y;             // [rows, groups·out]; rows may be strided (inner stride 1); must not alias x
};

/// Group g's operands of a grouped call (views into a's tensors).
LinearArgs linear_group(LinearDesc const& d, LinearArgs const& a, int64_t g);

template <Backend B> struct Linear;
template <> struct Linear<Backend::kCpu> {
  static Status check(LinearDesc const&, LinearArgs const&);
  static Status run(LinearDesc const&, LinearArgs const&, ExecContext&);
};
static_assert(BackendOp<Linear<Backend::kCpu>, LinearDesc, LinearArgs>);

// CUDA backend: kernels/linear/linear_cuda.cu (builds with CUDA only). Views hold device memory.
template <> struct Linear<Backend::kCuda> {
  static Status check(LinearDesc const&, LinearArgs const&);
  static Status run(LinearDesc const&, LinearArgs const&, ExecContext&);
  /// Several products of one input (the projections of one activation, e.g. a query down-projection and the KV
  /// projection): every d[i] has the same rows and in and every a[i].x is the same view. When all of them take
  /// the tensor-core path in one weight format (bf16, or one fused block-scaled format at skinny rows; bf16
  /// output, groups = 1), x is rounded to bf16 once and the products run as one batched launch, so their mma
  /// chains overlap instead of running one after another; otherwise each runs as run() would. Values are those
  /// of run() on each call alone. Checks every call first.
  static Status run_shared_x(std::span<LinearDesc const> d, std::span<LinearArgs const> a, ExecContext& ctx);
};

/// Shape and dtype checks shared by both backends (names the offending argument).
Status check_linear(LinearDesc const&, LinearArgs const&);

/// CPU entry point (ctx.backend must be kCpu); ops::dispatch<Linear> routes by backend.
Status linear(ExecContext&, LinearDesc const&, LinearArgs const&);

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// EXL3 op family (spec/exl3.md §2–§4, §5.2): y = ((((x·suh) H_k) W') H_n)·svh (+ bias), with W' decoded
/// from the 16×16-tile trellis code.
///   Exl3Dequant       trellis → W' fp16 [k, n] (bit-exact, ExLlamaV3's `reconstruct`)
///   Exl3Gemm          x [m, k] fp16 → y [m, n] fp16 or fp32; xh and the epilogue bit-exact, the
///                     accumulation in fp32 (order is implementation-defined, spec §4.4)
///   Exl3GroupedGemm   MoE: many experts' layers (same k, n, K, codebook) in one launch; assignment a
///                     multiplies token row token_idx[a] by expert e (rows of e are a in
///                     [expert_offsets[e], expert_offsets[e+1])) and scales its fp32 output by weight[a].
///                     num_assignments is a capacity: the rows computed are [0, expert_offsets[E]), read from
///                     the offsets in the backend's memory, so a count known only on the device needs no
///                     host round trip; rows from expert_offsets[E] on are neither read nor written
/// Row invariance: a row's result never depends on the other rows. On the CUDA backend it does not depend on
/// the number of rows m either, except across kExl3DecodeOnceMinRows: from that many rows Exl3Gemm decodes W'
/// once and multiplies on cuBLASLt, whose accumulation order differs from the chunk chain of the smaller
/// row counts (kernels/exl3/exl3_kernels.cuh); both are within the spec §7.4 bounds, and each is invariant
/// on its own side. `Exl3GemmDesc::strict_rows` keeps every row count on the chunk chain. Every path of
/// Exl3GroupedGemm sums on the chunk chain: its rows are invariant at every row count, and equal to Exl3Gemm's
/// chunk-chain rows times the routing weight.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "tessera/codec/exl3.hpp"
#include "tessera/core/context.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/status.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera::ops {

/// Shape of one EXL3 layer; everything that selects a kernel variant besides the row count.
struct Exl3LayerDesc {
  int64_t k = 0, n = 0;                              // in_features, out_features (multiples of 128)
  int k2 = 8;                                         // 2 · bits (even: K = 1..8; odd: MUL1 half rates)
  exl3::Codebook codebook = exl3::Codebook::kMul1;
  friend bool operator==(Exl3LayerDesc const&, Exl3LayerDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, Exl3LayerDesc const& d) {
  static char const* const kCb[] = {"3inst", "mcg", "mul1"};
  return os << kCb[static_cast<int>(d.codebook)] << " K" << d.k2 / 2 << (d.k2 % 2 ? ".5" : "") << " " << d.k
            << "x" << d.n;
}
/// Validates the layer shape (k, n multiples of 128, K in range); names the offending field.
Status check_exl3_layer(Exl3LayerDesc const& d);

struct Exl3DequantArgs {
  TensorView<int16_t const, 3> trellis;  // [k/16, n/16, 8·k2]
  TensorView<Fp16, 2> w;                  // [k, n] out: W', or [n, k]: W'ᵀ when transposed
  bool transposed = false;
};

/// Rows from which the CUDA Exl3Gemm decodes W' once to fp16 scratch and runs the product on cuBLASLt.
/// The in-loop GEMM decodes every 16×16 tile once per 128 rows (~43 instructions); decoding once costs the
/// same 43 plus a 1 KiB W' store and load per tile, which at the H200's 1.05 T warp-instructions/s against
/// 4.27 TB/s is ~250 instruction slots: ~295 per tile, paid back once ⌈m/128⌉ · 43 exceeds it (m ≈ 880).
inline constexpr int64_t kExl3DecodeOnceMinRows = 1024;

struct Exl3GemmDesc {
  Exl3LayerDesc layer;
  int64_t num_rows = 0;                   // m
  DType out_type = DType::kF16;           // kF16 or kF32
  bool has_bias = false;
  bool strict_rows = false;               // CUDA: the chunk-chain kernels at every m (no decode-once path)
  /// CUDA: the output width whose chunk count S the chunk chain uses, S = exl3_num_chunks(k/16, chunk_n/16)
  /// (kernels/exl3/exl3_kernels.cuh); 0 = layer.n. S depends on the layer's width, so an output part of a
  /// wider layer (tile columns [c0, c1), spec/exl3.md §1.4) passes the whole layer's n: each of its outputs is
  /// then summed in the whole layer's order, the whole product's bits. A multiple of 128, ≥ layer.n. The CPU
  /// reference sums in float64 whatever the split and only checks it.
  int64_t chunk_n = 0;
  friend bool operator==(Exl3GemmDesc const&, Exl3GemmDesc const&) = default;
};

inline std::ostream& operator<<(std::ostream& os, Exl3GemmDesc const& d) {
  return os << d.layer << " m=" << d.num_rows << (d.out_type == DType::kF32 ? " f32" : " f16")
            << (d.has_bias ? " +bias" : "") << (d.strict_rows ? " strict" : "")
            << (d.chunk_n ? " chunks-of-n=" + std::to_string(d.chunk_n) : std::string());
}
/// Validates Exl3GemmDesc::chunk_n against the layer (0, or a multiple of 128 not below layer.n).
Status check_exl3_chunk_n(Exl3GemmDesc const& d);

struct Exl3GemmArgs {
  TensorView<Fp16 const, 2> x;            // [m, k]
  TensorView<int16_t const, 3> trellis;   // [k/16, n/16, 8·k2]
  TensorView<Fp16 const, 1> suh;          // [k]
  TensorView<Fp16 const, 1> svh;          // [n]
  TensorView<Fp16 const, 1> bias;         // [n], or empty
  TensorView<Fp16, 2> y_f16;              // [m, n] when out_type == kF16
  TensorView<float, 2> y_f32;             // [m, n] when out_type == kF32
};

struct Exl3GroupedGemmDesc {
  Exl3LayerDesc layer;                    // shared by every expert of the launch
  int64_t num_experts = 0;                // E
  int64_t num_tokens = 0;                 // T, rows of x
  int64_t num_assignments = 0;            // A = rows of y, ≥ expert_offsets[E] (e.g. T · top_k)
  friend bool operator==(Exl3GroupedGemmDesc const&, Exl3GroupedGemmDesc const&) = default;
};

/// Pointer arrays live in the memory of the backend that runs the op (device memory for CUDA).
struct Exl3GroupedGemmArgs {
  TensorView<Fp16 const, 2> x;            // [T, k]
  int16_t const* const* trellis = nullptr;  // [E] → [k/16, n/16, 8·k2]
  Fp16 const* const* suh = nullptr;       // [E] → [k]
  Fp16 const* const* svh = nullptr;       // [E] → [n]
  int32_t const* expert_offsets = nullptr;  // [E + 1], assignments of expert e: [off[e], off[e+1]); off[E] ≤ A
  int32_t const* token_idx = nullptr;     // [A] row of x of each assignment (read below off[E] only)
  float const* route_weight = nullptr;    // [A] routing weight (nullptr = 1)
  TensorView<float, 2> y;                 // [A, n] fp32: route_weight[a] · epilogue_f32(row), rows a < off[E]
};

template <Backend B> struct Exl3Dequant;
template <Backend B> struct Exl3Gemm;
template <Backend B> struct Exl3GroupedGemm;

template <> struct Exl3Dequant<Backend::kCpu> {
  static Status check(Exl3LayerDesc const&);
  static Status run(Exl3LayerDesc const&, Exl3DequantArgs const&, ExecContext&);
};
template <> struct Exl3Gemm<Backend::kCpu> {
  static Status check(Exl3GemmDesc const&);
  static Status run(Exl3GemmDesc const&, Exl3GemmArgs const&, ExecContext&);
};
template <> struct Exl3GroupedGemm<Backend::kCpu> {
  static Status check(Exl3GroupedGemmDesc const&);
  static Status run(Exl3GroupedGemmDesc const&, Exl3GroupedGemmArgs const&, ExecContext&);
};

// CUDA backend: defined in kernels/exl3/exl3_cuda.cu (only in builds with CUDA).
template <> struct Exl3Dequant<Backend::kCuda> {
  static Status check(Exl3LayerDesc const&, DeviceInfo const&);
  static Status run(Exl3LayerDesc const&, Exl3DequantArgs const&, ExecContext&);
};
template <> struct Exl3Gemm<Backend::kCuda> {
  static Status check(Exl3GemmDesc const&, DeviceInfo const&);
  /// Device scratch: fp16 xh [m, k] + fp32 chunk partials [S or 1][m, n]; decode-once path: fp16 xh [m, k] +
  /// fp16 W'ᵀ [n, k] + fp32 acc [m, n] + 8 MiB for cuBLASLt.
  /// Tactics (ctx.impl_override): 1 GEMV with the epilogue fused (one launch), 2 GEMM, 3 naive reference,
  /// 4 decode-once (cuBLASLt), 5 GEMV then the epilogue kernel; auto: 1 for m = 1 on layers of ≤ 2^17
  /// tiles, 5 for other m ≤ 16, 4 for m ≥ kExl3DecodeOnceMinRows unless strict_rows, else 2.
  static size_t workspace_bytes(Exl3GemmDesc const&);
  static Status run(Exl3GemmDesc const&, Exl3GemmArgs const&, ExecContext&);
};
/// Average rows per expert (num_assignments / num_experts) from which the CUDA Exl3GroupedGemm takes the grouped
/// GEMM. Per expert of R rows the GEMV decodes every tile ⌈R/16⌉ times and stores and reloads S chunk partials
/// per output (S = 40 on the DeepSeek-V4.1 w1/w3: 360 KiB a row); the GEMM decodes ⌈R/128⌉ times and keeps the
/// chain in registers. Estimated from the dense H200 timings in bench/RESULTS.md (a 5120×2304 GEMV pass of one
/// row ≈ 11 µs; a 128-row GEMM block ≈ 220 µs, 18 column blocks an expert over 264 resident blocks ≈ 15 µs an
/// expert tile): equal cost near R ≈ 16–24 rows. Measured on the H100 at 384 experts (one exl3:2.8 v41-flash
/// layer, `scripts/device/thresholds.sh`): a 1K prefill (16 rows per expert) takes 24.4 ms a layer at 16 and 27.7
/// at 32; 512 tokens (8 rows) take 17.5 ms at 16 and 18.8 at 8. bench/RESULTS.md 2026-12-07 (session 24).
inline constexpr int64_t kExl3GroupedGemmMinRows = 16;

/// W' is never materialised (all experts' W' would not fit in scratch), and the host does not know the
/// per-expert row counts, which live in device memory. Paths (ctx.impl_override; 1, 2 and 5 give the same
/// bits, one summation order: kernels/exl3/exl3_kernels.cuh):
///   1  GEMV over each expert's rows with the epilogue fused into its last block per column group (one launch);
///   2  grouped GEMM: the chunk-chain GEMM over 128-row tiles of each expert's rows (tile slots mapped to
///      experts on the device), one fp32 accumulator per output, then the epilogue kernel;
///   5  GEMV writing S chunk partials per output, then the epilogue kernel.
/// Any other value: auto = 1 for one token on layers of ≤ 2^17 tiles, 2 from num_assignments ≥
/// kExl3GroupedGemmMinRows · num_experts, else 5.
template <> struct Exl3GroupedGemm<Backend::kCuda> {
  static Status check(Exl3GroupedGemmDesc const&, DeviceInfo const&);
  /// Device scratch of the auto path: fp16 xh [A, k] + fp32 chunk partials [S][A][n] (paths 1, 5) or
  /// accumulators [A][n] (path 2).
  static size_t workspace_bytes(Exl3GroupedGemmDesc const&);
  static Status run(Exl3GroupedGemmDesc const&, Exl3GroupedGemmArgs const&, ExecContext&);
};

/// Whether `k2` has compiled CUDA instantiations (integer K = 1..8; half rates are CPU-only).
constexpr bool exl3_cuda_supports_k2(int k2) { return k2 % 2 == 0 && k2 >= 2 && k2 <= 16; }

}  // namespace tessera::ops

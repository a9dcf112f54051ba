// SPDX-License-Identifier: Apache-2.0
/// Weight-layout detection: what each tensor of a checkpoint is, and which format its linear layers use.
///
/// Per tensor (spec/deepseek-v41.md §4.2, spec/exl3.md §1.1):
///   * native FP8: an F8_E4M3 `X.weight` [r, c] with an F8_E8M0 sibling `X.scale` [⌈r/32⌉, ⌈c/32⌉]
///     (one ue8m0 scale per 32×32 block);
///   * native FP4 experts: `X.weight` [r, c/2] stored as I8 (or F4, packed) holding two e2m1 codes per
///     byte (even column in the low nibble), with `X.scale` [r, c/32] F8_E8M0 (one scale per row per 32
///     columns);
///   * FP8 Engram tables: an F8_E4M3 `X.weight` [rows, de] with `X.scale` [rows, de/32] F8_E8M0;
///   * EXL3 groups P: `P.trellis` I16 [k/16, n/16, 16·K] + `P.suh` F16 [k] (or legacy `P.su` I16 [k/16])
///     + `P.svh` F16 [n] (or `P.sv` I16 [n/16]) + optional codebook marker `P.mcg` / `P.mul1` (I32, 0-d)
///     + optional `P.bias` [n]; K = trellis.shape[2] / 16. A last dimension ≡ 8 (mod 16) is a half-integer
///     rate (K + 0.5, MUL1 only, UNVERIFIED per spec/exl3.md §2.6): reported, flagged, never decoded here.
///   * everything else is dense (its stored dtype).
/// Bits per weight of an EXL3 group: `bits` = K exactly, the trellis bits per weight, which is what
/// ExLlamaV3's "bpw" counts (spec/exl3.md §5.1: scales and unquantized tensors excluded);
/// `bits_with_scales` = (trellis + suh/su + svh/sv + marker + bias bytes)·8 / (k·n), i.e. K plus
/// (2k + 2n)·8/(k·n) for suh/svh (spec/exl3.md §1.1 storage cost).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/status.hpp"
#include "tessera/io/safetensors.hpp"

namespace tessera::io {

/// The format of a checkpoint's linear layers. kMixed: both native FP8/FP4 linears and EXL3 groups.
/// Engram FP8 tables and dense embeddings, norms and routers do not change the layout.
enum class WeightLayout { kDense /*bf16/fp32/f16*/, kNativeFp8, kExl3, kMixed };

enum class TensorKind {
  kDense,
  kFp8Weight, kFp8Scale,          // 32×32-block FP8 linear and its ue8m0 scales
  kFp4Weight, kFp4Scale,          // packed e2m1 experts and their per-row, per-32 ue8m0 scales
  kEngramFp8Table, kEngramScale,  // FP8 Engram table rows and their per-32-channel scales
  kExl3Trellis, kExl3Suh, kExl3Svh, kExl3Su, kExl3Sv, kExl3Marker, kExl3Bias,
};

enum class Exl3Codebook { k3Inst, kMcg, kMul1 };

char const* to_string(WeightLayout l);
char const* to_string(TensorKind k);
char const* to_string(Exl3Codebook c);

/// One EXL3-quantized linear layer (spec/exl3.md §1.1).
struct Exl3Group {
  std::string prefix;              // P
  int64_t in_features = 0;         // k = 16 · trellis.shape[0]
  int64_t out_features = 0;        // n = 16 · trellis.shape[1]
  double bits = 0;                 // K (trellis bits per weight); x.5 for a half-integer rate
  bool half_rate_unverified = false;
  Exl3Codebook codebook = Exl3Codebook::k3Inst;
  bool legacy_signs = false;       // su/sv instead of suh/svh
  bool has_bias = false;
  /// The marker's stored value is the one of spec/exl3.md §1.1 (0xCBAC1FED mcg, 0x83DCD12D mul1); set by
  /// the Checkpoint overload of detect_layout, which reads it (true for 3INST and for the TensorInfo form).
  bool marker_value_ok = true;
  size_t trellis_bytes = 0;
  size_t overhead_bytes = 0;       // scales, marker, bias
  double bits_with_scales = 0;     // (trellis + overhead)·8 / (k·n)
};

struct LayoutReport {
  WeightLayout layout = WeightLayout::kDense;
  std::vector<TensorKind> kinds;   // parallel to the tensors passed in
  std::vector<Exl3Group> exl3_groups;  // sorted by prefix
  // Totals.
  size_t num_tensors = 0;
  size_t total_bytes = 0;
  int64_t dense_params = 0;
  size_t dense_bytes = 0;
  std::map<std::string, int64_t> dense_dtypes;  // dtype name → tensor count
  int64_t fp8_params = 0, fp4_params = 0, engram_fp8_params = 0;
  size_t fp8_bytes = 0, fp4_bytes = 0, engram_fp8_bytes = 0;  // weights + their scales
  int64_t exl3_params = 0;          // Σ k·n
  size_t exl3_bytes = 0;            // trellis + overhead
  double exl3_avg_bits = 0;         // Σ K·k·n / Σ k·n (ExLlamaV3's bpw)
  double exl3_avg_bits_with_scales = 0;
};

/// Classifies every tensor and checks each EXL3 group against spec/exl3.md §1.1's loader checklist;
/// an incomplete or inconsistent group (or FP8/FP4 scales of the wrong shape) is kMalformedInput naming
/// the tensor.
Result<LayoutReport> detect_layout(std::vector<TensorInfo> const& tensors);
/// The same, plus the codebook-marker values read from the checkpoint (`Exl3Group::marker_value_ok`).
Result<LayoutReport> detect_layout(Checkpoint const& checkpoint);

}  // namespace tessera::io

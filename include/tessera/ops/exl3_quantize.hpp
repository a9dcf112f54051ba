// SPDX-License-Identifier: Apache-2.0
/// Tessera's own EXL3 quantizer (no Hessian/LDLQ), the algorithm of tools/golden_exl3.py
/// `quantize_weight` (spec/exl3.md §7.2):
///   1. random signs σ_u [k], σ_v [n]; per-column RMS (normalised to mean 1) folded into sv = σ_v·rms_col;
///   2. W1 = (W / sv) H_n; per-row RMS of W1 folded into su = σ_u·rms_row / (−1.24371088);
///   3. W2 = H_k (W1 / su); one global scale g = RMS(codebook) / RMS(W2): W2·g, su / g;
///   4. every 16×16 tile of W2, permuted into stream order (§2.5), is coded by a least-squares tail-biting
///      Viterbi search over the 65536 trellis states (two passes: the first fixes the wrap-around edge,
///      the second finds the best closed path through it);
///   5. suh = fp16(su), svh = fp16(sv); the trellis is packed as ExLlamaV3 stores it.
/// W is [k, n] with y = x W (the transpose of a Hugging Face [out, in] weight). Deterministic: the result
/// depends only on W, the rate, the codebook and the seed (tiles are independent; threads never share one).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/core/status.hpp"

#include "tessera/codec/exl3.hpp"

namespace tessera::ops {

struct Exl3QuantizedLayer {
  int64_t k = 0, n = 0;
  int k2 = 0;
  exl3::Codebook codebook = exl3::Codebook::kMul1;
  std::vector<int16_t> trellis;    // [k/16, n/16, 8·k2]
  std::vector<uint16_t> suh, svh;  // [k], [n] fp16 bits
  double rel_mse = 0;              // Σ(W_hat − W)² / ΣW², W_hat the decoded layer in float64
};

/// Least-squares tail-biting path of one tile: `target` [256] in stream order, rate K (integer 1..8),
/// `table` the fp32 codebook [65536]; writes the 256 states. `scratch` is reused between calls.
void exl3_viterbi_tile(float const* target, int bits, float const* table, uint16_t* states,
                       std::vector<uint8_t>& scratch);

/// Quantizes W [k, n] (k, n multiples of 128) at integer rate `bits`. `progress(tiles_done)` is called
/// from worker threads as tiles finish (may be empty). Multithreaded over tiles (tessera::parallel_for).
Exl3QuantizedLayer exl3_quantize(float const* w, int64_t k, int64_t n, int bits, exl3::Codebook cb,
                                 uint64_t seed, std::function<void(int64_t)> const& progress = {});

/// Estimated relative MSE at `bits` from a deterministic sample of at most `max_tiles` tiles of the
/// rotated, scaled weight (the same preprocessing as exl3_quantize); used to allocate bits.
double exl3_estimate_rel_mse(float const* w, int64_t k, int64_t n, int bits, exl3::Codebook cb, uint64_t seed,
                             int64_t max_tiles);

}  // namespace tessera::ops

namespace tessera::ops {

/// Checkpoint conversion (the `tessera quantize` tool). Quantized: every 2-D `*.weight` whose dims are
/// multiples of 128 (F32/BF16/F16, or FP8 e4m3 with its 128×128 block scales `.weight_scale_inv` /
/// `.scale`), except embeddings, norms and MoE routers (`*.gate.weight`); the head (`lm_head.weight`,
/// `head.weight`) gets `head_bits`. Everything else is copied unchanged.
/// Bit allocation: every budgeted tensor starts at floor(bits); tensors are promoted by one bit in order of
/// the estimated squared-error reduction per added bit (relative MSE from a sample of tiles × ‖W‖²) while
/// Σ K·numel ≤ bits·Σ numel.
/// Output folder: `exl3-NNNNN.safetensors` shards of EXL3 groups (ExLlamaV3's tensor layout), each
/// written under a temporary name and renamed, so an interrupted run keeps every finished shard and a
/// rerun with the same options resumes (the plan is kept in `exl3_plan.json`); then
/// `model-unquantized.safetensors`, `model.safetensors.index.json`, and `config.json` /
/// `quantization_config.json` with `quantization_config` (spec/exl3.md §1.3).
struct Exl3CheckpointQuantOptions {
  std::string in, out;
  double bits = 2.8;
  exl3::Codebook codebook = exl3::Codebook::kMul1;
  int head_bits = 6;
  uint64_t seed = 0x5EED;
  int64_t sample_tiles = 48;           // per tensor and candidate K, for the allocation estimate
  size_t shard_bytes = size_t{256} << 20;
  /// Called as tiles finish: (tensor, tiles done in it, tiles in it, tensors done, tensors to quantize).
  std::function<void(std::string const&, int64_t, int64_t, int, int)> progress;
};

struct Exl3TensorReport {
  std::string name;                    // source tensor, e.g. "model.layers.0.mlp.up_proj.weight"
  std::string prefix;                  // EXL3 group key
  int64_t k = 0, n = 0;
  int bits = 0;
  double rel_mse = 0;                  // of the stored layer against the source weight
  bool resumed = false;                // taken from a shard of an earlier run
};

struct Exl3CheckpointQuantReport {
  std::vector<Exl3TensorReport> tensors;   // in name order
  double avg_bits = 0;                     // over the budgeted (non-head) tensors
  std::vector<std::string> copied;         // tensors stored unchanged
};

Result<Exl3CheckpointQuantReport> exl3_quantize_checkpoint(Exl3CheckpointQuantOptions const& opt);

}  // namespace tessera::ops

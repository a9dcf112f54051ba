// SPDX-License-Identifier: Apache-2.0
/// Synthetic DeepSeek-V4.1 checkpoints: random weights with the OLD tensor names and shapes of
/// spec/deepseek-v41.md §4.1 (the golden fixtures' naming: native names under `model.`, plus `lm_head`),
/// including the compressor / indexer / Engram tensors only on the layers that own them, and the value
/// distributions of tools/golden_v41.py (linear weights N(0, initializer_range), norms 1 + 0.1·N, sinks
/// N(0, 1), router biases 0.1·N, hc base 0.5·N, hc scale 1 + 0.2·N, Engram q/k weights 1 + 0.2·N,
/// lm_head 4·N(0, initializer_range), Engram scales 1), so a model run on it is numerically sane.
///
/// Values are a pure function of (seed, tensor name, element index) — a counter-based generator, so the
/// output is identical for a seed on every platform and independent of thread count and write order.
/// Tensors are produced one at a time while the file is written (peak memory ≈ the largest tensor).
/// A `SyntheticFormat` turns each planned tensor into stored tensors; `dense_format` stores f32 or bf16
/// (fp32 islands of §4.2 stay f32); quantized formats (native FP8/FP4, EXL3) plug in the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/dtype.hpp"
#include "tessera/core/status.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/config.hpp"

namespace tessera::model::dsv41 {

/// One weight of the checkpoint plan, before any storage format is applied.
struct TensorSpec {
  enum class Role {
    kEmbedding, kHead, kNorm, kLinear,   // kLinear: a 2-D projection (attention, compressor, indexer, experts, router)
    kExpertLinear,                       // a routed expert's w1/w2/w3
    kSink, kRouterBias, kHcFn, kHcBase, kHcScale, kEngramGateWeight, kEngramTable, kEngramScale,
  };
  std::string name;           // OLD name, e.g. model.layers.3.attn.wq_a.weight
  std::vector<int64_t> shape;
  Role role = Role::kLinear;
  float mean = 0.f;           // value = mean + stddev · N(0, 1)
  float stddev = 0.f;
  bool fp32_island = false;   // kept in f32 by a bf16 checkpoint (spec §4.2, _keep_in_fp32_modules_strict)
};

/// Every tensor of a checkpoint for `c`, in the OLD naming, sorted by name; with num_nextn_predict_layers
/// > 0 also the DSpark blocks `mtp.{b}.*` of spec §2.8 (native names: block 0 `main_proj` [D, |T|·D] and
/// `main_norm`, the last block `norm`, `markov_head.{embed,head}` [V, r], `confidence_head` [1, D + r]).
std::vector<TensorSpec> checkpoint_plan(Config const& c);

/// Engram primes per Engram layer, in column order (n-gram size 2..N, heads 0..He−1), by the search of
/// spec §2.4.1 (each (layer, size) restarts at engram_vocab_size − 1; each head takes the smallest unused
/// prime above the previous one). Their sums are the layers' `engram_num_embeddings`.
std::vector<std::vector<int64_t>> engram_primes(Config const& c);

/// Fills dst[0 .. end−begin) with fp32 elements [begin, end) of a tensor (row-major).
using ValueFn = std::function<void(float* dst, int64_t begin, int64_t end)>;

/// The element values of `spec` for `seed`: mean + stddev · N(0,1) from a counter-based generator.
ValueFn synthetic_values(TensorSpec const& spec, uint64_t seed);

/// A storage format: adds the stored form of one planned tensor to the writer (lazily: the values are
/// produced when the writer reaches the tensor).
class SyntheticFormat {
 public:
  virtual ~SyntheticFormat() = default;
  virtual std::string name() const = 0;
  virtual Status add(io::SafetensorsWriter& w, TensorSpec const& spec, ValueFn values) const = 0;
  /// The same with the whole plan at hand (a format whose stored tensors depend on a sibling, such as the
  /// FP8 Engram table's scales, or on the layer, such as EXL3's per-layer K, overrides this one).
  virtual Status add_planned(io::SafetensorsWriter& w, TensorSpec const& spec, std::vector<TensorSpec> const& plan,
                             uint64_t seed) const {
    (void)plan;
    return add(w, spec, synthetic_values(spec, seed));
  }
  /// The quantization_config this format writes into config.json, if any.
  virtual std::optional<QuantizationConfig> quantization_config() const { return std::nullopt; }
};

/// Dense storage: every tensor in `dtype` (kF32, kBf16 or kF16), fp32 islands in f32.
std::unique_ptr<SyntheticFormat> dense_format(DType dtype);

/// The native release layout (spec/deepseek-v41.md §4.2): the FP8 linears (attn.{wq_a,wq_b,wkv,wo_a,wo_b},
/// indexer.wq_b, shared experts, engram.wkv) as F8_E4M3 `X.weight` + F8_E8M0 `X.scale` [⌈r/32⌉, ⌈c/32⌉]
/// (scale = 2^⌈log2(amax/448)⌉ per 32×32 block, code = sat-RNE e4m3 of w/scale); routed experts as FP4
/// e2m1 packed two per I8 byte (even column in the low nibble) `X.weight` [r, c/2] + `X.scale` [r, c/32]
/// (scale = 2^⌈log2(amax/6)⌉ per row per 32 columns); Engram tables F8_E4M3 [rows, de] + `.scale` E8M0
/// [rows, de/32] (amax/448 per row per 32 channels); the rest bf16, fp32 islands (and the Engram q/k
/// weights) f32.
std::unique_ptr<SyntheticFormat> native_fp8_format();

/// EXL3 groups (spec/exl3.md §1.1) for every linear whose dimensions are multiples of 128 except the
/// router: `P.trellis` I16 [k/16, n/16, 16·K] of uniformly random bits (every 16-bit state is a valid
/// code), `P.suh` F16 [k] of random ±1, `P.svh` F16 [n] of random ±σ (σ = the tensor's planned stddev, so
/// W = diag(suh)·H·W'·H·diag(svh) has the planned RMS with MUL1's unit-RMS codebook), and the `P.mul1`
/// marker; the rest bf16 (fp32 islands f32). K per tensor follows §5.1/§5.3 of spec/exl3.md:
/// exl3_synthetic_bits.
std::unique_ptr<SyntheticFormat> exl3_format(double bits_per_weight);

/// EXL3 experts over the native FP8 trunk: the routed and shared experts as exl3_format(bits_per_weight) writes them
/// (at their exl3_synthetic_bits), every other tensor as native_fp8_format() does; config.json's quantization_config
/// is exl3 with the FP8 layout as original_quantization_config.
std::unique_ptr<SyntheticFormat> mixed_format(double bits_per_weight);

/// K of a tensor of the EXL3 synthetic format at `bpw`: head 6; attention projections 5 (6 on layer 0),
/// indexer wk 8, shared experts and Engram wkv 5; routed experts floor(bpw), promoted +1 per layer, end
/// layers first (distance to the nearer end of the released 40-layer stack, lower layer first on ties),
/// while the released model's bit budget bpw · Σ k·n allows. 0 for tensors that stay dense.
int exl3_synthetic_bits(std::string const& name, std::vector<int64_t> const& shape, double bpw);

/// Parses a make-synthetic `--format` value: fp32, bf16, fp8, exl3:B or mixed:B (B in [1, 8]).
Result<std::unique_ptr<SyntheticFormat>> synthetic_format(std::string const& spec);

/// The configurations make-synthetic knows.
/// tiny: spec §6 with `vocab_size` (the golden tiny model when 512).
/// v41-flash: the released dimensions with the first `layers` layers (their released compress ratios,
/// KV / index / candidate sources and Engram layers below `layers`), no DSpark layers, and Engram tables of
/// about `engram_rows` rows (engram_vocab_size ≈ engram_rows / columns; the rows are the prime sums).
/// `experts` > 0 replaces n_routed_experts (a scaled-down v41-flash for tests; must be ≥ the top-k 6).
Result<Config> synthetic_config(std::string const& preset, int64_t vocab_size, int64_t layers, int64_t engram_rows,
                                int64_t experts = 0);

/// Gives `c` `blocks` DSpark blocks (num_nextn_predict_layers, ratio-0 compress entries), keeping its
/// dspark_* fields; the noise token must lie in the vocabulary (make-synthetic --mtp).
Status enable_mtp(Config& c, int64_t blocks = 3);

struct SyntheticSummary {
  size_t num_tensors = 0;
  size_t bytes = 0;
};

/// Writes `<dir>/config.json` (to_json of `c` plus the format's quantization_config) and
/// `<dir>/model.safetensors`; creates `dir` if needed. A configuration whose Engram layers are the
/// released ones (1, 14 with the released compressed vocabulary) also gets the Engram hash data the
/// model needs (`engram_hash.multipliers` of Appendix A, and a synthetic `engram_hash.token_map`:
/// id ↦ splitmix64(id) mod V_c, not a tokenizer's map).
Result<SyntheticSummary> write_synthetic_checkpoint(Config const& c, std::string const& dir, uint64_t seed,
                                                    SyntheticFormat const& format);

}  // namespace tessera::model::dsv41

// SPDX-License-Identifier: Apache-2.0
/// EXL3 tensor groups of a checkpoint (spec/exl3.md §1 loader checklist). A group with key P is
/// `P.trellis` I16 [k/16, n/16, 16·K] plus `P.suh` F16 [k] (or legacy `P.su` I16 [k/16]) and `P.svh`
/// F16 [n] (or `P.sv` I16 [n/16]), an optional codebook marker `P.mcg` / `P.mul1` (I32 scalar; none =
/// 3INST) and an optional `P.bias` [n] (F16, or F32/BF16 converted to fp16 as ExLlamaV3 does at load).
/// K comes from the trellis shape only. MoE checkpoints hold one group per expert
/// (`….experts.<e>.w1`); `expert` gives e. Anything inconsistent is an error naming the tensor.
/// `quantization_config` (config.json) is parsed for its documented fields (§1.3).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/status.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/ops/exl3.hpp"
#include "tessera/ref/exl3_ref.hpp"

namespace tessera::io {
class SafetensorsFile;
class Checkpoint;
}  // namespace tessera::io

namespace tessera::ops {

/// What the loader reads: every tensor name, and a host view of a tensor by name (a safetensors
/// checkpoint, a shard set, or tensors in memory).
struct Exl3TensorSource {
  std::vector<std::string> names;
  std::function<Result<AnyTensorView>(std::string const&)> view;
};

struct Exl3Group {
  std::string prefix;                  // P, e.g. "layers.3.ffn.experts.17.w1"
  int expert = -1;                     // e of "….experts.<e>.…", or −1
  Exl3LayerDesc desc;                  // k, n, rate, codebook
  AnyTensorView trellis;               // I16 [k/16, n/16, 8·k2], a view into the source
  std::vector<uint16_t> suh, svh;      // [k], [n] fp16 bits (legacy packed signs expanded to ±1)
  std::vector<uint16_t> bias;          // [n] fp16 bits, empty when the layer has none
  bool legacy_signs = false;           // read from su/sv rather than suh/svh
  /// A host layer viewing this group's memory (valid while the group and its source live).
  ref::Exl3HostLayer host() const {
    ref::Exl3HostLayer L;
    L.k = desc.k; L.n = desc.n; L.k2 = desc.k2; L.codebook = desc.codebook;
    L.trellis = static_cast<int16_t const*>(trellis.data);
    L.suh = suh.data(); L.svh = svh.data(); L.bias = bias.empty() ? nullptr : bias.data();
    return L;
  }
};

struct Exl3LoadOptions {
  /// Accept the MUL1 half rates 1.5/2.5/3.5 (spec §2.6, unverified layout). Off: such groups are refused.
  bool allow_half_rates = false;
};

/// Sources over a safetensors file or a (sharded) checkpoint; the object must outlive the source.
Exl3TensorSource exl3_source(io::SafetensorsFile const& file);
Exl3TensorSource exl3_source(io::Checkpoint const& ckpt);

/// Every EXL3 group of `src`, sorted by prefix; fails on the first malformed group.
Result<std::vector<Exl3Group>> load_exl3_groups(Exl3TensorSource const& src, Exl3LoadOptions const& opt = {});

/// e of "….experts.<e>.…" in a group key, or −1.
int exl3_expert_index(std::string_view prefix);

/// config.json's `quantization_config` for EXL3 (spec §1.3).
struct Exl3QuantConfig {
  std::string quant_method;            // "exl3"
  std::string version;
  double bits = 0;                     // average bpw over the budgeted linears
  int head_bits = 6;
  std::string codebook;                // "mul1" / "mcg" / "3inst", empty when absent
  std::string out_scales;
};
/// Parses the `quantization_config` object of a config.json text; kNotFound when there is none,
/// kMalformedInput when it is not EXL3 or a field has the wrong type.
Result<Exl3QuantConfig> parse_exl3_quant_config(std::string_view config_json);

}  // namespace tessera::ops

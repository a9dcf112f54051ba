// SPDX-License-Identifier: Apache-2.0
/// Quantized storage formats of the synthetic DeepSeek-V4.1 checkpoints (synthetic.hpp): the native
/// release layout of spec/deepseek-v41.md §4.2 (FP8 e4m3 32×32 blocks with ue8m0 scales, FP4 e2m1
/// routed experts with per-row-per-32 ue8m0 scales, FP8 Engram tables) and EXL3 groups of
/// spec/exl3.md §1.1 with random trellis bits and per-tensor K by spec/exl3.md §5.1/§5.3.
///
/// Streaming: each stored tensor is produced when the writer reaches it. A weight and its `.scale` sibling
/// come from one quantisation pass: the writer emits "X.scale" just before "X.weight" (both 1-byte dtypes,
/// names in order), so the scale's producer keeps the weight codes for the weight's producer (one tensor
/// held at a time); a weight reached without them is quantised again, with identical bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "tessera/core/thread_pool.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"

namespace tessera::model::dsv41 {

namespace {

using Role = TensorSpec::Role;

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t name_key(std::string const& s, uint64_t seed) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
  return mix64(seed ^ h);
}
bool ends_with(std::string const& s, std::string const& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}
std::string strip_suffix(std::string const& s, std::string const& t) { return s.substr(0, s.size() - t.size()); }
/// Absolute layer of "model.layers.<i>.…", or −1.
int64_t layer_of(std::string const& name) {
  static std::string const kP = "model.layers.";
  if (name.rfind(kP, 0) != 0) return -1;
  return std::strtoll(name.c_str() + kP.size(), nullptr, 10);
}

/// Dense storage of one planned tensor: f32 for fp32 islands (and `force_f32`), else bf16.
Status add_dense(io::SafetensorsWriter& w, TensorSpec const& spec, ValueFn values, bool force_f32 = false) {
  DType const dt = spec.fp32_island || force_f32 ? DType::kF32 : DType::kBf16;
  return w.add(spec.name, dt, spec.shape, [dt, values = std::move(values)](void* dst, size_t nbytes) {
    int64_t const n = static_cast<int64_t>(nbytes / dtype_size(dt));
    parallel_for(n, [&](int64_t b, int64_t e) {
      std::vector<float> buf(static_cast<size_t>(e - b));
      values(buf.data(), b, e);
      for (int64_t k = 0; k < e - b; ++k) {
        if (dt == DType::kF32) static_cast<float*>(dst)[b + k] = buf[static_cast<size_t>(k)];
        else static_cast<uint16_t*>(dst)[b + k] = bf16_bits_from_float(buf[static_cast<size_t>(k)]);
      }
    }, 1 << 16);
    return Status{};
  });
}

/// Weight codes kept by a scale producer for its weight's producer.
struct Stash {
  std::mutex mu;
  std::string name;
  std::vector<uint8_t> codes;
};

/// How one planned 2-D tensor is quantised.
enum class Quant { kFp8Block, kFp4Row, kEngramFp8 };

/// Quantises rows × cols values into `codes` (fp8: one byte per value; fp4: two per byte, even column in
/// the low nibble) and `scales` (e8m0 codes), in the layout of `q`.
void quantise(Quant q, ValueFn const& values, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales) {
  // Rows per independent unit: a 32-row block for kFp8Block, one row otherwise.
  int64_t const unit = q == Quant::kFp8Block ? 32 : 1;
  int64_t const units = (rows + unit - 1) / unit, cb = (cols + 31) / 32;
  float const qmax = q == Quant::kFp4Row ? 6.f : 448.f;
  parallel_for(units, [&](int64_t b, int64_t e) {
    std::vector<float> v;
    for (int64_t u = b; u < e; ++u) {
      int64_t const r0 = u * unit, r1 = std::min(rows, r0 + unit);
      v.resize(static_cast<size_t>((r1 - r0) * cols));
      values(v.data(), r0 * cols, r1 * cols);
      for (int64_t j = 0; j < cb; ++j) {
        int64_t const c0 = j * 32, c1 = std::min(cols, c0 + 32);
        float amax = 0.f;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[static_cast<size_t>((r - r0) * cols + c)]));
        uint8_t const sc = amax > 0.f ? e8m0_ceil_pow2(amax / qmax) : uint8_t{127};
        float const s = float_from_e8m0(sc);
        scales[q == Quant::kFp8Block ? u * cb + j : r0 * cb + j] = sc;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            float const x = v[static_cast<size_t>((r - r0) * cols + c)] / s;  // s is a power of two: exact
            if (q == Quant::kFp4Row) {
              uint8_t const code = fp4_e2m1_from_float(x);
              uint8_t& byte = codes[(r * cols + c) / 2];
              byte = (c % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0u) | code) : static_cast<uint8_t>((byte & 0x0Fu) | (code << 4));
            } else {
              codes[r * cols + c] = fp8_e4m3_from_float_saturate(x);
            }
          }
      }
    }
  }, 1);
}

/// Adds `X.weight` codes and `X.scale` for `spec` (a 2-D weight named X.weight).
Status add_quantised(io::SafetensorsWriter& w, TensorSpec const& spec, ValueFn values, Quant q) {
  int64_t const rows = spec.shape[0], cols = spec.shape[1];
  if (q == Quant::kFp4Row && cols % 32 != 0)
    return invalid_argument(spec.name + ": FP4 experts need a multiple of 32 columns, got " + std::to_string(cols));
  std::string const base = strip_suffix(spec.name, ".weight");
  std::vector<int64_t> const wshape = q == Quant::kFp4Row ? std::vector<int64_t>{rows, cols / 2} : spec.shape;
  std::vector<int64_t> const sshape = q == Quant::kFp8Block ? std::vector<int64_t>{(rows + 31) / 32, (cols + 31) / 32}
                                                            : std::vector<int64_t>{rows, (cols + 31) / 32};
  size_t const code_bytes = static_cast<size_t>(q == Quant::kFp4Row ? rows * cols / 2 : rows * cols);
  size_t const scale_bytes = static_cast<size_t>(sshape[0] * sshape[1]);
  auto stash = std::make_shared<Stash>();
  std::string const wname = spec.name;
  TESSERA_TRY(w.add(base + ".scale", DType::kE8m0, sshape,
                    [=](void* dst, size_t nbytes) {
                      if (nbytes != scale_bytes) return invalid_argument("scale size mismatch");
                      std::lock_guard lk(stash->mu);
                      stash->codes.assign(code_bytes, 0);
                      quantise(q, values, rows, cols, stash->codes.data(), static_cast<uint8_t*>(dst));
                      stash->name = wname;
                      return Status{};
                    }));
  DType const wdt = q == Quant::kFp4Row ? DType::kI8 : DType::kF8E4m3;
  return w.add(spec.name, wdt, wshape, [=](void* dst, size_t nbytes) {
    if (nbytes != code_bytes) return invalid_argument("code size mismatch");
    std::lock_guard lk(stash->mu);
    if (stash->name == wname) {
      std::memcpy(dst, stash->codes.data(), code_bytes);
    } else {
      std::vector<uint8_t> sc(scale_bytes);
      std::memset(dst, 0, code_bytes);
      quantise(q, values, rows, cols, static_cast<uint8_t*>(dst), sc.data());
    }
    stash->name.clear();
    stash->codes = {};
    return Status{};
  });
}

bool is_fp8_linear(std::string const& n) {
  for (char const* s : {"attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
                        "attn.indexer.wq_b.weight", "shared_experts.w1.weight", "shared_experts.w2.weight",
                        "shared_experts.w3.weight", "engram.wkv.weight"})
    if (ends_with(n, std::string(".") + s)) return true;
  return false;
}

class NativeFp8Format final : public SyntheticFormat {
 public:
  std::string name() const override { return "fp8"; }
  Status add(io::SafetensorsWriter& w, TensorSpec const& spec, ValueFn values) const override {
    if (spec.role == Role::kExpertLinear) return add_quantised(w, spec, std::move(values), Quant::kFp4Row);
    if (spec.role == Role::kLinear && is_fp8_linear(spec.name))
      return add_quantised(w, spec, std::move(values), Quant::kFp8Block);
    return add_dense(w, spec, std::move(values), spec.role == Role::kEngramGateWeight);
  }
  Status add_planned(io::SafetensorsWriter& w, TensorSpec const& spec, std::vector<TensorSpec> const&,
                     uint64_t seed) const override {
    if (spec.role == Role::kEngramScale) return {};  // written with its table
    if (spec.role == Role::kEngramTable) return add_quantised(w, spec, synthetic_values(spec, seed), Quant::kEngramFp8);
    return add(w, spec, synthetic_values(spec, seed));
  }
  std::optional<QuantizationConfig> quantization_config() const override {
    QuantizationConfig q;
    q.quant_method = "fp8";
    q.fp8 = Fp8QuantizationConfig{"e4m3", "dynamic", {32, 32}, "ue8m0", "fp4"};
    return q;
  }
};

/// Budgeted weights (Σ k·n) of one layer of the released model, split into routed experts and the rest
/// weighted by the rest's K (spec/exl3.md §5.3).
struct LayerBudget {
  double expert_params = 0, other_bits = 0, other_params = 0;
};

LayerBudget released_layer_budget(Config const& c, int64_t l) {
  double const D = static_cast<double>(c.hidden_size), H = static_cast<double>(c.num_attention_heads);
  double const hd = static_cast<double>(c.head_dim), qr = static_cast<double>(c.q_lora_rank);
  double const ro = static_cast<double>(c.o_lora_rank), G = static_cast<double>(c.o_groups);
  double const I = static_cast<double>(c.moe_intermediate_size), E = static_cast<double>(c.n_routed_experts);
  double const Hi = static_cast<double>(c.index_n_heads), di = static_cast<double>(c.index_head_dim);
  LayerBudget b;
  double const ka = l == 0 ? 6 : 5;
  auto add = [&](double params, double k) { b.other_params += params; b.other_bits += params * k; };
  add(qr * D + H * hd * qr + hd * D + G * ro * (H * hd / G) + D * G * ro, ka);
  if (c.is_kv_source(l)) add(hd * D * (c.ratio(l) > 1 ? 2 : 1), ka);
  if (c.is_index_source(l)) add(Hi * di * qr, ka);
  if (c.is_index_source(l) && c.is_kv_source(l)) add(di * hd, 8);
  add(3 * I * D, 5);
  if (c.is_engram_layer(l)) {
    double const C = static_cast<double>((c.engram_max_ngram_size - 1) * c.engram_n_heads);
    add(static_cast<double>(c.hc_mult + 1) * D * C * static_cast<double>(c.engram_head_dim), 5);
  }
  b.expert_params = 3 * E * I * D;
  return b;
}

/// Routed-expert K of each released layer at `bpw` (spec/exl3.md §5.1 allocation, qgroup = one layer's
/// experts).
std::vector<int> released_expert_bits(double bpw) {
  Config const c = released_config();
  int64_t const L = c.num_hidden_layers;
  int const base = std::clamp(static_cast<int>(std::floor(bpw)), 1, 8);
  double total = 0, used = 0, per_layer = 0;
  for (int64_t l = 0; l < L; ++l) {
    LayerBudget b = released_layer_budget(c, l);
    total += b.expert_params + b.other_params;
    used += b.other_bits + base * b.expert_params;
    per_layer = b.expert_params;
  }
  double left = bpw * total - used;
  std::vector<int64_t> order(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) order[static_cast<size_t>(l)] = l;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return std::min(a, L - 1 - a) < std::min(b, L - 1 - b); });
  std::vector<int> k(static_cast<size_t>(L), base);
  for (int64_t l : order) {
    if (base >= 8 || left < per_layer) break;
    k[static_cast<size_t>(l)] = base + 1;
    left -= per_layer;
  }
  return k;
}

class Exl3Format final : public SyntheticFormat {
 public:
  explicit Exl3Format(double bpw) : bpw_(bpw) {}
  std::string name() const override {
    char buf[32];
    std::snprintf(buf, sizeof buf, "exl3:%.2f", bpw_);
    return buf;
  }
  Status add(io::SafetensorsWriter& w, TensorSpec const& spec, ValueFn values) const override {
    int const K = exl3_synthetic_bits(spec.name, spec.shape, bpw_);
    if (K == 0) return add_dense(w, spec, std::move(values), spec.role == Role::kEngramGateWeight);
    std::string const p = strip_suffix(spec.name, ".weight");
    int64_t const n = spec.shape[0], k = spec.shape[1];
    uint64_t const key = name_key(spec.name, seed_);
    TESSERA_TRY(w.add(p + ".trellis", DType::kI16, {k / 16, n / 16, 16 * K}, [key](void* dst, size_t nbytes) {
      int64_t const words = static_cast<int64_t>(nbytes / 8);
      parallel_for(words, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          uint64_t const r = mix64(key ^ mix64(static_cast<uint64_t>(i)));
          std::memcpy(static_cast<uint8_t*>(dst) + i * 8, &r, 8);
        }
      }, 1 << 16);
      for (size_t i = static_cast<size_t>(words) * 8; i < nbytes; ++i) static_cast<uint8_t*>(dst)[i] = 0x5A;
      return Status{};
    }));
    auto signs = [](uint64_t skey, float mag) {
      uint16_t const pos = f16_bits_from_float(mag);
      return [skey, pos](void* dst, size_t nbytes) {
        auto* out = static_cast<uint16_t*>(dst);
        for (size_t i = 0; i < nbytes / 2; ++i)
          out[i] = static_cast<uint16_t>(pos | ((mix64(skey ^ i) & 1u) ? 0x8000u : 0u));
        return Status{};
      };
    };
    TESSERA_TRY(w.add(p + ".suh", DType::kF16, {k}, signs(mix64(key ^ 1), 1.f)));
    TESSERA_TRY(w.add(p + ".svh", DType::kF16, {n}, signs(mix64(key ^ 2), spec.stddev)));
    return w.add(p + ".mul1", DType::kI32, {}, [](void* dst, size_t) {
      int32_t const v = static_cast<int32_t>(0x83DCD12Du);
      std::memcpy(dst, &v, 4);
      return Status{};
    });
  }
  Status add_planned(io::SafetensorsWriter& w, TensorSpec const& spec, std::vector<TensorSpec> const&,
                     uint64_t seed) const override {
    seed_ = seed;
    return add(w, spec, synthetic_values(spec, seed));
  }
  std::optional<QuantizationConfig> quantization_config() const override {
    QuantizationConfig q;
    q.quant_method = "exl3";
    Exl3QuantizationConfig e;
    e.version = "tessera-synthetic";
    e.bits = bpw_;
    e.head_bits = 6;
    e.out_scales = "always";
    e.codebook = "mul1";
    q.exl3 = e;
    return q;
  }

 private:
  double bpw_;
  mutable uint64_t seed_ = 0;
};

/// EXL3 experts over the native FP8 trunk: the routed and shared experts as Exl3Format writes them, every other
/// tensor as NativeFp8Format does (FP8 projections and Engram tables, the rest bf16 / f32). config.json names exl3
/// with the trunk's FP8 layout as original_quantization_config.
class MixedFormat final : public SyntheticFormat {
 public:
  explicit MixedFormat(double bpw) : exl3_(bpw), bpw_(bpw) {}
  std::string name() const override {
    char buf[32];
    std::snprintf(buf, sizeof buf, "mixed:%.2f", bpw_);
    return buf;
  }
  static bool is_expert(TensorSpec const& spec) {
    return spec.role == Role::kExpertLinear || spec.name.find(".shared_experts.") != std::string::npos;
  }
  Status add(io::SafetensorsWriter& w, TensorSpec const& spec, ValueFn values) const override {
    return is_expert(spec) ? exl3_.add(w, spec, std::move(values)) : fp8_.add(w, spec, std::move(values));
  }
  Status add_planned(io::SafetensorsWriter& w, TensorSpec const& spec, std::vector<TensorSpec> const& plan,
                     uint64_t seed) const override {
    return is_expert(spec) ? exl3_.add_planned(w, spec, plan, seed) : fp8_.add_planned(w, spec, plan, seed);
  }
  std::optional<QuantizationConfig> quantization_config() const override {
    QuantizationConfig q = *exl3_.quantization_config();
    q.exl3->original_quantization_config = fp8_.quantization_config()->fp8;
    return q;
  }

 private:
  Exl3Format exl3_;
  NativeFp8Format fp8_;
  double bpw_;
};

}  // namespace

int exl3_synthetic_bits(std::string const& name, std::vector<int64_t> const& shape, double bpw) {
  if (shape.size() != 2 || shape[0] % 128 != 0 || shape[1] % 128 != 0) return 0;
  if (!ends_with(name, ".weight") || ends_with(name, ".ffn.gate.weight") || ends_with(name, "embed.weight") ||
      ends_with(name, "norm.weight"))
    return 0;
  if (name == "lm_head.weight") return 6;
  int64_t const l = layer_of(name);
  if (l < 0) return 0;
  if (name.find(".ffn.experts.") != std::string::npos) {
    static std::mutex mu;
    static double cached_bpw = -1;
    static std::vector<int> cached;
    std::lock_guard lk(mu);
    if (cached_bpw != bpw) {
      cached = released_expert_bits(bpw);
      cached_bpw = bpw;
    }
    return l < static_cast<int64_t>(cached.size()) ? cached[static_cast<size_t>(l)] : static_cast<int>(std::floor(bpw));
  }
  if (ends_with(name, ".attn.indexer.wk.weight")) return 8;
  if (name.find(".attn.") != std::string::npos) return l == 0 ? 6 : 5;
  if (name.find(".shared_experts.") != std::string::npos || ends_with(name, ".engram.wkv.weight")) return 5;
  return 0;
}

std::unique_ptr<SyntheticFormat> native_fp8_format() { return std::make_unique<NativeFp8Format>(); }
std::unique_ptr<SyntheticFormat> exl3_format(double bpw) { return std::make_unique<Exl3Format>(bpw); }
std::unique_ptr<SyntheticFormat> mixed_format(double bpw) { return std::make_unique<MixedFormat>(bpw); }

Result<std::unique_ptr<SyntheticFormat>> synthetic_format(std::string const& spec) {
  if (spec == "fp32") return dense_format(DType::kF32);
  if (spec == "bf16") return dense_format(DType::kBf16);
  if (spec == "fp8") return native_fp8_format();
  for (std::string const prefix : {"exl3:", "mixed:"}) {
    if (spec.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    char const* const num = spec.c_str() + prefix.size();
    double const b = std::strtod(num, &end);
    if (end == num || *end != '\0' || !(b >= 1.0 && b <= 8.0))
      return invalid_argument("--format " + prefix + "B needs B in [1, 8], got '" + spec + "'");
    return prefix == "exl3:" ? exl3_format(b) : mixed_format(b);
  }
  return invalid_argument("--format must be fp32, bf16, fp8, exl3:B or mixed:B, got '" + spec + "'");
}

}  // namespace tessera::model::dsv41

// SPDX-License-Identifier: Apache-2.0
/// Synthetic DeepSeek-V4.1 checkpoints (see include/tessera/models/deepseek_v41/synthetic.hpp): the OLD
/// tensor plan of spec/deepseek-v41.md §4.1, the golden generator's initial distributions, a counter-based
/// normal generator, dense storage, and the make-synthetic presets.
#include "tessera/models/deepseek_v41/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tessera/core/thread_pool.hpp"

namespace tessera::model::dsv41 {

namespace {

using Role = TensorSpec::Role;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t fnv1a(std::string const& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
  return h;
}

/// Standard normal for counter `i` of stream `key`: Box–Muller on two 32-bit uniforms of one 64-bit hash,
/// u1 ∈ (0, 1] so the log is finite. Computed in double, so it does not depend on the FP environment.
float normal_at(uint64_t key, uint64_t i) {
  uint64_t r = splitmix64(key ^ splitmix64(i));
  double u1 = (static_cast<double>(r >> 32) + 1.0) / 4294967296.0;
  double u2 = static_cast<double>(r & 0xFFFFFFFFu) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

bool is_prime(int64_t x) {
  if (x < 2) return false;
  for (int64_t d = 2; d * d <= x; ++d)
    if (x % d == 0) return false;
  return true;
}

class DenseFormat final : public SyntheticFormat {
 public:
  explicit DenseFormat(DType dt) : dt_(dt) {}
  std::string name() const override { return std::string(dtype_name(dt_)); }
  Status add(io::SafetensorsWriter& w, TensorSpec const& spec, ValueFn values) const override {
    DType const dt = spec.fp32_island ? DType::kF32 : dt_;
    return w.add(spec.name, dt, spec.shape, [dt, values = std::move(values)](void* dst, size_t nbytes) {
      int64_t const n = static_cast<int64_t>(nbytes / dtype_size(dt));
      parallel_for(
          n,
          [&](int64_t b, int64_t e) {
            constexpr int64_t kChunk = 4096;
            float buf[kChunk];
            for (int64_t c = b; c < e; c += kChunk) {
              int64_t m = std::min(kChunk, e - c);
              values(buf, c, c + m);
              if (dt == DType::kF32) {
                std::memcpy(static_cast<float*>(dst) + c, buf, static_cast<size_t>(m) * 4);
              } else {
                auto* out = static_cast<uint16_t*>(dst) + c;
                for (int64_t k = 0; k < m; ++k)
                  out[k] = dt == DType::kBf16 ? bf16_bits_from_float(buf[k]) : f16_bits_from_float(buf[k]);
              }
            }
          },
          1 << 16);
      return Status{};
    });
  }

 private:
  DType dt_;
};

}  // namespace

std::vector<std::vector<int64_t>> engram_primes(Config const& c) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> used;
  for (size_t l = 0; l < c.engram_layer_ids.size(); ++l) {
    std::vector<int64_t> layer;
    for (int64_t size = 2; size <= c.engram_max_ngram_size; ++size) {
      int64_t cur = c.engram_vocab_size - 1;
      for (int64_t h = 0; h < c.engram_n_heads; ++h) {
        int64_t p = cur + 1;
        while (!is_prime(p) || std::find(used.begin(), used.end(), p) != used.end()) ++p;
        used.push_back(p);
        layer.push_back(p);
        cur = p;
      }
    }
    out.push_back(std::move(layer));
  }
  return out;
}

std::vector<TensorSpec> checkpoint_plan(Config const& c) {
  float const ir = static_cast<float>(c.initializer_range);
  int64_t const D = c.hidden_size, n = c.hc_mult, H = c.num_attention_heads, hd = c.head_dim;
  int64_t const qr = c.q_lora_rank, G = c.o_groups, ro = c.o_lora_rank, E = c.n_routed_experts;
  int64_t const I = c.moe_intermediate_size, Hi = c.index_n_heads, di = c.index_head_dim;
  std::vector<TensorSpec> plan;
  auto add = [&](std::string name, std::vector<int64_t> shape, Role role) {
    TensorSpec s{std::move(name), std::move(shape), role};
    switch (role) {
      case Role::kEmbedding: case Role::kLinear: case Role::kExpertLinear: case Role::kHcFn: case Role::kEngramTable:
        s.stddev = ir; break;
      case Role::kHead: s.stddev = 4.f * ir; break;  // golden: lm_head ×4
      case Role::kNorm: s.mean = 1.f; s.stddev = 0.1f; break;
      case Role::kSink: s.stddev = 1.f; s.fp32_island = true; break;
      case Role::kRouterBias: s.stddev = 0.1f; s.fp32_island = true; break;
      case Role::kHcBase: s.stddev = 0.5f; s.fp32_island = true; break;
      case Role::kHcScale: s.mean = 1.f; s.stddev = 0.2f; s.fp32_island = true; break;
      case Role::kEngramGateWeight: s.mean = 1.f; s.stddev = 0.2f; break;
      case Role::kEngramScale: s.mean = 1.f; break;
    }
    if (role == Role::kHcFn) s.fp32_island = true;
    plan.push_back(std::move(s));
  };
  add("model.embed.weight", {c.vocab_size, D}, Role::kEmbedding);
  add("model.norm.weight", {D}, Role::kNorm);
  add("lm_head.weight", {c.vocab_size, D}, Role::kHead);
  auto primes = engram_primes(c);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string const L = "model.layers." + std::to_string(i) + ".";
    for (char const* site : {"attn", "ffn"}) {  // mHC: fn [(2+n)n, nD], base [(2+n)n], scale [3] (§2.3)
      add(L + "hc_" + site + "_fn", {(2 + n) * n, n * D}, Role::kHcFn);
      add(L + "hc_" + site + "_base", {(2 + n) * n}, Role::kHcBase);
      add(L + "hc_" + site + "_scale", {3}, Role::kHcScale);
    }
    add(L + "attn_norm.weight", {D}, Role::kNorm);
    add(L + "ffn_norm.weight", {D}, Role::kNorm);
    add(L + "attn.wq_a.weight", {qr, D}, Role::kLinear);
    add(L + "attn.q_norm.weight", {qr}, Role::kNorm);
    add(L + "attn.wq_b.weight", {H * hd, qr}, Role::kLinear);
    add(L + "attn.wkv.weight", {hd, D}, Role::kLinear);
    add(L + "attn.kv_norm.weight", {hd}, Role::kNorm);
    add(L + "attn.wo_a.weight", {G * ro, H * hd / G}, Role::kLinear);
    add(L + "attn.wo_b.weight", {D, G * ro}, Role::kLinear);
    add(L + "attn.attn_sink", {H}, Role::kSink);
    bool const kv = c.is_kv_source(i), index = c.is_index_source(i);
    if (kv) {
      add(L + "attn.compressor.wkv.weight", {hd, D}, Role::kLinear);
      if (c.ratio(i) > 1) add(L + "attn.compressor.wgate.weight", {hd, D}, Role::kLinear);
      add(L + "attn.compressor.norm.weight", {hd}, Role::kNorm);
    }
    if (index) {
      add(L + "attn.indexer.wq_b.weight", {Hi * di, qr}, Role::kLinear);
      add(L + "attn.indexer.weights_proj.weight", {Hi, D}, Role::kLinear);
    }
    if (index && kv) {
      add(L + "attn.indexer.wk.weight", {di, hd}, Role::kLinear);
      add(L + "attn.indexer.k_norm.weight", {di}, Role::kNorm);
    }
    add(L + "ffn.gate.weight", {E, D}, Role::kLinear);
    add(L + "ffn.gate.bias", {E}, Role::kRouterBias);
    add(L + "ffn.gate.bias_vl", {E}, Role::kRouterBias);
    for (int64_t e = 0; e < E; ++e) {
      std::string const X = L + "ffn.experts." + std::to_string(e) + ".";
      add(X + "w1.weight", {I, D}, Role::kExpertLinear);
      add(X + "w3.weight", {I, D}, Role::kExpertLinear);
      add(X + "w2.weight", {D, I}, Role::kExpertLinear);
    }
    add(L + "ffn.shared_experts.w1.weight", {I, D}, Role::kLinear);  // exactly one shared MLP of width I
    add(L + "ffn.shared_experts.w3.weight", {I, D}, Role::kLinear);
    add(L + "ffn.shared_experts.w2.weight", {D, I}, Role::kLinear);
    if (int64_t ei = c.engram_index(i); ei >= 0) {  // §2.4.3
      int64_t const C = (c.engram_max_ngram_size - 1) * c.engram_n_heads, de = c.engram_head_dim;
      int64_t rows = c.engram_num_embeddings[static_cast<size_t>(ei)];
      if (rows == 0)
        for (int64_t p : primes[static_cast<size_t>(ei)]) rows += p;
      add(L + "engram.wkv.weight", {(n + 1) * D, C * de}, Role::kLinear);
      add(L + "engram.q_weight", {n, D}, Role::kEngramGateWeight);
      add(L + "engram.k_weight", {n, D}, Role::kEngramGateWeight);
      add(L + "engram.embed.weight", {rows, de}, Role::kEngramTable);
      add(L + "engram.embed.scale", {rows, (de + 31) / 32}, Role::kEngramScale);
    }
  }
  // DSpark blocks `mtp.{b}.*` (spec §2.8; native names, no embed/head copies: those are the target's).
  int64_t const Ed = c.dspark_n_routed_experts, T = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  int64_t const r = c.dspark_markov_rank, NB = c.num_nextn_predict_layers;
  for (int64_t b = 0; b < NB; ++b) {
    std::string const M = "mtp." + std::to_string(b) + ".";
    for (char const* site : {"attn", "ffn"}) {
      add(M + "hc_" + site + "_fn", {(2 + n) * n, n * D}, Role::kHcFn);
      add(M + "hc_" + site + "_base", {(2 + n) * n}, Role::kHcBase);
      add(M + "hc_" + site + "_scale", {3}, Role::kHcScale);
    }
    add(M + "attn_norm.weight", {D}, Role::kNorm);
    add(M + "ffn_norm.weight", {D}, Role::kNorm);
    add(M + "attn.wq_a.weight", {qr, D}, Role::kLinear);
    add(M + "attn.q_norm.weight", {qr}, Role::kNorm);
    add(M + "attn.wq_b.weight", {H * hd, qr}, Role::kLinear);
    add(M + "attn.wkv.weight", {hd, D}, Role::kLinear);
    add(M + "attn.kv_norm.weight", {hd}, Role::kNorm);
    add(M + "attn.wo_a.weight", {G * ro, H * hd / G}, Role::kLinear);
    add(M + "attn.wo_b.weight", {D, G * ro}, Role::kLinear);
    add(M + "attn.attn_sink", {H}, Role::kSink);
    add(M + "ffn.gate.weight", {Ed, D}, Role::kLinear);
    add(M + "ffn.gate.bias", {Ed}, Role::kRouterBias);
    for (int64_t e = 0; e < Ed; ++e) {
      std::string const X = M + "ffn.experts." + std::to_string(e) + ".";
      add(X + "w1.weight", {I, D}, Role::kExpertLinear);
      add(X + "w3.weight", {I, D}, Role::kExpertLinear);
      add(X + "w2.weight", {D, I}, Role::kExpertLinear);
    }
    add(M + "ffn.shared_experts.w1.weight", {I, D}, Role::kLinear);
    add(M + "ffn.shared_experts.w3.weight", {I, D}, Role::kLinear);
    add(M + "ffn.shared_experts.w2.weight", {D, I}, Role::kLinear);
    if (b == 0) {
      add(M + "main_proj.weight", {D, T * D}, Role::kLinear);
      add(M + "main_norm.weight", {D}, Role::kNorm);
    }
    if (b == NB - 1) {
      add(M + "norm.weight", {D}, Role::kNorm);
      add(M + "markov_head.embed.weight", {c.vocab_size, r}, Role::kEmbedding);
      add(M + "markov_head.head.weight", {c.vocab_size, r}, Role::kLinear);
      add(M + "confidence_head.weight", {1, D + r}, Role::kLinear);
      plan.back().fp32_island = true;  // the confidence head runs in fp32 (spec §2.8)
    }
  }
  std::sort(plan.begin(), plan.end(), [](auto const& a, auto const& b) { return a.name < b.name; });
  return plan;
}

Status enable_mtp(Config& c, int64_t blocks) {
  if (blocks < 1) return invalid_argument("--mtp: the number of DSpark blocks must be >= 1");
  if (c.dspark_noise_token_id < 0 || c.dspark_noise_token_id >= c.vocab_size)
    return invalid_argument("--mtp: dspark_noise_token_id " + std::to_string(c.dspark_noise_token_id) +
                            " is outside the vocabulary of " + std::to_string(c.vocab_size));
  if (c.dspark_target_layer_ids.empty()) return invalid_argument("--mtp: the config has no dspark_target_layer_ids");
  c.num_nextn_predict_layers = blocks;
  c.compress_ratios.resize(static_cast<size_t>(c.num_hidden_layers + blocks), 0);  // draft layers: ratio 0
  return {};
}

ValueFn synthetic_values(TensorSpec const& spec, uint64_t seed) {
  uint64_t const key = splitmix64(seed ^ fnv1a(spec.name));
  float const mean = spec.mean, sd = spec.stddev;
  return [key, mean, sd](float* dst, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      dst[i - begin] = sd == 0.f ? mean : mean + sd * normal_at(key, static_cast<uint64_t>(i));
  };
}

std::unique_ptr<SyntheticFormat> dense_format(DType dtype) { return std::make_unique<DenseFormat>(dtype); }

Result<Config> synthetic_config(std::string const& preset, int64_t vocab_size, int64_t layers, int64_t engram_rows,
                                int64_t experts) {
  if (vocab_size <= 0) return invalid_argument("--vocab-size must be positive");
  if (experts != 0 && preset != "v41-flash") return invalid_argument("--experts applies to --preset v41-flash only");
  if (experts != 0 && (experts < 6 || experts > 384)) return invalid_argument("--experts must be in 6..384");
  if (preset == "tiny") {
    if (layers != 0) return invalid_argument("--layers applies to --preset v41-flash only (tiny has 7 layers)");
    if (engram_rows != 0) return invalid_argument("--engram-rows applies to --preset v41-flash only");
    try {
      return tiny_config(vocab_size);
    } catch (Error const& e) {
      return e.status();
    }
  }
  if (preset != "v41-flash") return invalid_argument("unknown preset '" + preset + "' (tiny, v41-flash)");
  if (layers == 0) layers = 2;
  if (layers < 1 || layers > 40) return invalid_argument("--layers must be in 1..40");
  if (engram_rows == 0) engram_rows = 65536;
  Config const rel = released_config();
  auto below = [&](std::vector<int64_t> const& v) {
    std::string s = "[";
    for (int64_t x : v)
      if (x < layers) s += (s.size() > 1 ? "," : "") + std::to_string(x);
    return s + "]";
  };
  std::string ratios = "[";
  for (int64_t i = 0; i < layers; ++i) ratios += (i ? "," : "") + std::to_string(rel.compress_ratios[static_cast<size_t>(i)]);
  ratios += "]";
  std::vector<int64_t> kv;
  for (int64_t x : rel.kv_source_layer_ids)
    if (x < layers) kv.push_back(x);
  int64_t const cand = rel.candidate_source_layer_id < layers ? rel.candidate_source_layer_id : (kv.empty() ? -1 : kv.back());
  int64_t const columns = (rel.engram_max_ngram_size - 1) * rel.engram_n_heads;
  int64_t const engram_vocab = std::max<int64_t>(2, engram_rows / columns);
  std::string const text = "{\"vocab_size\":" + std::to_string(vocab_size) + ",\"num_hidden_layers\":" +
                           std::to_string(layers) + ",\"compress_ratios\":" + ratios +
                           ",\"kv_source_layer_ids\":" + below(rel.kv_source_layer_ids) +
                           ",\"index_source_layer_ids\":" + below(rel.index_source_layer_ids) +
                           ",\"candidate_source_layer_id\":" + std::to_string(cand) +
                           (experts ? ",\"n_routed_experts\":" + std::to_string(experts) : std::string()) +
                           ",\"engram_layer_ids\":" + below({1, 14}) + ",\"engram_vocab_size\":" +
                           std::to_string(engram_vocab) + ",\"num_nextn_predict_layers\":0" +
                           ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":16,\"beta_fast\":32,\"beta_slow\":1,"
                           "\"original_max_position_embeddings\":65536}}";
  auto c = parse_config(text);
  if (!c) return c.status();
  // Table rows = the prime sums (Appendix A's rule), now that the primes are known.
  auto primes = engram_primes(*c);
  for (size_t l = 0; l < primes.size(); ++l) {
    int64_t s = 0;
    for (int64_t p : primes[l]) s += p;
    c->engram_num_embeddings[l] = s;
  }
  return c;
}

Result<SyntheticSummary> write_synthetic_checkpoint(Config const& config, std::string const& dir, uint64_t seed,
                                                    SyntheticFormat const& format) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create (" + ec.message() + ")");
  Config c = config;
  if (auto q = format.quantization_config()) c.quantization_config = q;
  // Fill in table sizes left at 0 so that config.json and the tensors agree.
  auto primes = engram_primes(c);
  for (size_t l = 0; l < primes.size(); ++l)
    if (c.engram_num_embeddings[l] == 0)
      for (int64_t p : primes[l]) c.engram_num_embeddings[l] += p;

  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("family", "deepseek_v41");
  w.set_metadata("generator", "tessera make-synthetic");
  w.set_metadata("storage", format.name());
  w.set_metadata("seed", std::to_string(seed));
  SyntheticSummary sum;
  auto const plan = checkpoint_plan(c);
  for (auto const& spec : plan) TESSERA_TRY(format.add_planned(w, spec, plan, seed));
  // Engram hash data for the released Engram layers (Appendix A multipliers; synthetic token map).
  bool released_engram = !c.engram_layer_ids.empty() && c.engram_compressed_vocab_size == 99092 &&
                         c.engram_max_ngram_size == 4;
  for (int64_t l : c.engram_layer_ids) released_engram = released_engram && (l == 1 || l == 14);
  if (released_engram) {
    int64_t const Le = static_cast<int64_t>(c.engram_layer_ids.size()), N = c.engram_max_ngram_size;
    Tensor mult = Tensor::zeros(DType::kI64, {Le, N});
    for (int64_t e = 0; e < Le; ++e) {
      static constexpr int64_t kL1[4] = {76632096046245, 4839876093313, 35959672319349, 73987337458391};
      static constexpr int64_t kL14[4] = {67716810739261, 51510806800915, 30921347202721, 82619226485591};
      int64_t const* m = c.engram_layer_ids[static_cast<size_t>(e)] == 1 ? kL1 : kL14;
      for (int64_t i = 0; i < N; ++i) mult.data_as<int64_t>()[e * N + i] = m[i];
    }
    Tensor map = Tensor::zeros(DType::kI64, {c.vocab_size});
    for (int64_t t = 0; t < c.vocab_size; ++t)
      map.data_as<int64_t>()[t] =
          static_cast<int64_t>(splitmix64(static_cast<uint64_t>(t)) % static_cast<uint64_t>(c.engram_compressed_vocab_size));
    TESSERA_TRY(w.add("engram_hash.multipliers", mult));
    TESSERA_TRY(w.add("engram_hash.token_map", map));
  }
  sum.num_tensors = w.size();
  TESSERA_TRY(w.write((fs::path(dir) / "model.safetensors").string()));
  sum.bytes = static_cast<size_t>(fs::file_size(fs::path(dir) / "model.safetensors", ec));

  std::string const cfg = (fs::path(dir) / "config.json").string(), tmp = cfg + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << to_json(c) << "\n";
    if (!out) return io_error(tmp + ": write failed");
  }
  fs::rename(tmp, cfg, ec);
  if (ec) return io_error(cfg + ": cannot rename into place (" + ec.message() + ")");
  return sum;
}

}  // namespace tessera::model::dsv41

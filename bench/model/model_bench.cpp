// SPDX-License-Identifier: Apache-2.0
/// End-to-end speed of the DeepSeek-V4.1 model on a checkpoint (a synthetic v41-flash one on the H200):
/// prefill tok/s per prompt length and decode tok/s per batch size, each next to its roofline.
///
///   bench_model --model DIR [--model DIR2] [--device cuda|cpu] [--dtype bf16|fp32] [--prefill 1024,8192]
///               [--batches 1,4,16,64] [--context 128] [--steps 8] [--copy-gbps 4270] [--tc-tflops 754]
///               [--full-layers 40] [--dequantize-weights]
///
/// --dequantize-weights: the GPU model holds a native checkpoint's FP8/FP4 weights dequantised to the model
/// dtype (ModelOptions::dequantize_weights) instead of as stored (the default in bf16 numerics); the load line
/// reports the device bytes of the weights either way (device_weight_gb).
///
/// Rooflines. Decode is bound by the bytes of weights one step reads: every dense tensor of the trunk,
/// one embedding row, the LM head, and the routed experts the batch selects (uniform routing: a batch of B
/// rows touches E·(1 − (1 − k/E)^B) of the E experts of a layer), once per step, divided by the B tokens
/// of the step. Two byte counts: the weights as the model stores them on the device (FP8/FP4 and EXL3 as stored
/// in bf16 numerics on CUDA, else dequantised: the projections in the model dtype, the fp32 islands in fp32)
/// and the weights as the checkpoint stores them (fp8/fp4/EXL3 bytes incl. scales). Prefill is bound by the
/// FLOPs of the linears (2 · params touched per token; attention FLOPs are not counted, so the reported
/// fraction is a lower bound). Ceilings are the H200's measured 4.27 TB/s copy and 754 TFLOP/s bf16 GEMM.
///
/// Per-layer costs: with two checkpoints of L1 < L2 layers (same preset), the step time is fitted as
/// fixed + per_layer · L, and the 40-layer step is extrapolated from the fit; with one checkpoint the
/// whole step time is scaled by 40 / L (pessimistic: the LM head is scaled too). One JSON object per line.
///
/// State: the first line gives the GPU model's decode state of one sequence at 1M tokens for the released
/// v41-flash layer layout at full depth (GpuDsv41Model::state_bytes_for): bytes per token and the fixed part.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<int64_t> parse_list(std::string const& s) {
  std::vector<int64_t> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) v.push_back(std::stoll(s.substr(i, j - i)));
    i = j + 1;
  }
  return v;
}

bool ends_with(std::string const& s, std::string_view t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

/// Weight bytes of one checkpoint, split by how a decode step touches them.
struct WeightBytes {
  double dense_stored = 0, dense_file = 0;        // read fully every step
  double expert_stored = 0, expert_file = 0;      // all routed experts of all layers
  double embed_row_stored = 0, embed_row_file = 0;  // one embedding row
  double head_stored = 0, head_file = 0;          // the LM head (read fully every step)
  double linear_params_dense = 0;                 // params of the trunk's linears (for FLOPs)
  double linear_params_expert = 0;                // params of one routed expert, summed over layers
};

/// The device model stores these projections in the model dtype (gpu_model.cpp), the rest in fp32.
bool stored_in_model_dtype(std::string const& group) {
  for (char const* s : {"wq_a", "wq_b", "attn.wkv", "wo_a", "wo_b", "compressor.wkv", "compressor.wgate",
                        "indexer.wq_b", "indexer.weights_proj", "indexer.wk", "engram.wkv", "lm_head",
                        "ffn.experts.", "shared_experts."})
    if (group.find(s) != std::string::npos) return true;
  return false;
}

/// as_stored: the device holds block-scaled (FP8/FP4) weights and EXL3 groups as stored (bf16 numerics without
/// --dequantize-weights), so their stored bytes are their file bytes; otherwise the logical tensor in the model
/// dtype (fp32 islands fp32).
Result<WeightBytes> weight_bytes(std::string const& dir, ModelSpec const& spec, bool bf16, bool as_stored) {
  auto ck = io::Checkpoint::open(dir);
  if (!ck) return ck.status();
  WeightBytes wb;
  // The release's packed FP4 experts: an I8 [r, c/2] `X.weight` beside an F8_E8M0 `X.scale` (two e2m1 codes a
  // byte; the loader's CheckpointSource::scaled rule).
  std::set<std::string> e8m0_scales;
  for (io::TensorInfo const& t : ck->tensors())
    if (t.dtype == DType::kE8m0 && ends_with(t.name, ".scale")) e8m0_scales.insert(t.name);
  for (io::TensorInfo const& t : ck->tensors()) {
    std::string const& n = t.name;
    if (n.rfind("mtp.", 0) == 0 || n.rfind("engram_hash.", 0) == 0 || n.rfind("static.", 0) == 0) continue;
    // Group = the tensor without its storage suffix (".weight", ".scale", EXL3 parts).
    std::string group = n;
    for (char const* suf : {".weight", ".scale", ".trellis", ".suh", ".svh", ".mul1", ".mcg", ".su", ".sv"})
      if (ends_with(n, suf)) {
        group = n.substr(0, n.size() - std::strlen(suf));
        break;
      }
    bool const is_scale_or_part = !ends_with(n, ".weight") && group != n;
    bool const trellis = ends_with(n, ".trellis");  // EXL3 [in/16, out/16, 16·K]: in·out weights
    bool const fp4_packed = t.dtype == DType::kI8 && t.shape.size() == 2 && ends_with(n, ".weight") &&
                            e8m0_scales.count(group + ".scale") > 0;
    bool const quantized = group != n && (!ends_with(n, ".weight") || t.dtype == DType::kF8E4m3 ||
                                          t.dtype == DType::kF4E2m1x2 || fp4_packed);
    double numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<double>(d);
    if (t.dtype == DType::kF4E2m1x2 || fp4_packed) numel *= 2;
    if (trellis && t.shape.size() == 3) numel = static_cast<double>(t.shape[0]) * static_cast<double>(t.shape[1]) * 256.0;
    bool const expert = n.find(".ffn.experts.") != std::string::npos;
    bool const embed = n.rfind("model.embed.", 0) == 0 || n.rfind("embed.", 0) == 0;
    bool const engram_table = n.find("engram.embed.") != std::string::npos;
    double const file = static_cast<double>(t.nbytes);
    // Stored on the device: the logical tensor once (its parts/scales are folded into it on load).
    double stored = 0;
    if (as_stored && quantized) stored = file;
    else if (!is_scale_or_part || trellis) stored = numel * ((bf16 && stored_in_model_dtype(group)) ? 2.0 : 4.0);
    bool const linear = stored_in_model_dtype(group) && (ends_with(n, ".weight") || trellis);
    if (group == "lm_head") {
      wb.head_stored += stored;
      wb.head_file += file;
    } else if (expert) {
      wb.expert_stored += stored;
      wb.expert_file += file;
      if (linear) wb.linear_params_expert += numel / static_cast<double>(spec.n_experts);
    } else if (embed) {
      double const rows = t.shape.empty() ? 1 : static_cast<double>(t.shape[0]);
      wb.embed_row_stored += stored / rows;
      wb.embed_row_file += file / rows;
    } else if (engram_table) {
      // A token gathers (max_ngram − 1) · heads rows per Engram layer: negligible, not counted.
    } else {
      wb.dense_stored += stored;
      wb.dense_file += file;
      if (linear) wb.linear_params_dense += numel;
    }
  }
  return wb;
}

struct Args {
  std::vector<std::string> models;
  std::string device = "cuda", dtype = "bf16";
  std::vector<int64_t> prefill = {1024, 8192}, batches = {1, 4, 16, 64};
  int64_t context = 128, steps = 8;
  double copy_gbps = 4270, tc_tflops = 754;
  int64_t full_layers = 40;
  bool dequantize_weights = false;
};

struct Measured {
  int64_t layers = 0;
  std::map<int64_t, double> prefill_s;  // prompt length -> seconds for the one-chunk prefill
  std::map<int64_t, double> step_s;     // batch -> seconds per decode step (min over steps)
};

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(3 + g() % static_cast<uint64_t>(vocab - 3));
  return v;
}

Measured measure(LanguageModel& m, Args const& a, int64_t layers) {
  Measured r;
  r.layers = layers;
  int64_t const V = m.info().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V) * 64);
  {  // warm-up: first launches, pool growth
    auto st = m.new_sequence();
    auto tok = random_tokens(32, V, 1);
    SequenceStep s{st.get(), tok, 1, logits.data()};
    throw_if_error(m.forward({&s, 1}));
  }
  for (int64_t L : a.prefill) {
    if (L + 1 > m.info().max_context) continue;
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      auto st = m.new_sequence();
      auto tok = random_tokens(L, V, 100 + static_cast<uint64_t>(rep));
      SequenceStep s{st.get(), tok, 1, logits.data()};
      auto t0 = Clock::now();
      throw_if_error(m.forward({&s, 1}));
      best = std::min(best, since(t0));
    }
    r.prefill_s[L] = best;
    std::printf("{\"bench\":\"prefill\",\"layers\":%lld,\"tokens\":%lld,\"s\":%.4f,\"tok_s\":%.1f}\n",
                static_cast<long long>(layers), static_cast<long long>(L), best, static_cast<double>(L) / best);
    std::fflush(stdout);
  }
  for (int64_t B : a.batches) {
    std::vector<std::unique_ptr<SequenceState>> seqs;
    for (int64_t b = 0; b < B; ++b) {
      seqs.push_back(m.new_sequence());
      auto tok = random_tokens(a.context, V, 1000 + static_cast<uint64_t>(b));
      SequenceStep s{seqs.back().get(), tok, 1, logits.data()};
      throw_if_error(m.forward({&s, 1}));
    }
    std::vector<float> step_logits(static_cast<size_t>(B) * static_cast<size_t>(V));
    std::vector<int32_t> next(static_cast<size_t>(B), 7);
    double best = 1e30, total = 0;
    for (int64_t it = 0; it <= a.steps; ++it) {
      std::vector<SequenceStep> steps;
      for (int64_t b = 0; b < B; ++b)
        steps.push_back({seqs[static_cast<size_t>(b)].get(), std::span<int32_t const>(&next[static_cast<size_t>(b)], 1), 1,
                         step_logits.data() + b * V});
      auto t0 = Clock::now();
      throw_if_error(m.forward(steps));
      double const dt = since(t0);
      if (it > 0) {  // step 0 warms this batch's shapes
        best = std::min(best, dt);
        total += dt;
      }
      for (int64_t b = 0; b < B; ++b) {
        float const* row = step_logits.data() + b * V;
        next[static_cast<size_t>(b)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
      }
    }
    r.step_s[B] = best;
    std::printf("{\"bench\":\"decode\",\"layers\":%lld,\"batch\":%lld,\"context\":%lld,\"step_ms_min\":%.3f,"
                "\"step_ms_mean\":%.3f,\"tok_s\":%.1f}\n",
                static_cast<long long>(layers), static_cast<long long>(B), static_cast<long long>(a.context),
                best * 1e3, total / static_cast<double>(a.steps) * 1e3, static_cast<double>(B) / best);
    std::fflush(stdout);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string const k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_model: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--model") a.models.push_back(val());
    else if (k == "--device") a.device = val();
    else if (k == "--dtype") a.dtype = val();
    else if (k == "--prefill") a.prefill = parse_list(val());
    else if (k == "--batches") a.batches = parse_list(val());
    else if (k == "--context") a.context = std::stoll(val());
    else if (k == "--steps") a.steps = std::stoll(val());
    else if (k == "--copy-gbps") a.copy_gbps = std::stod(val());
    else if (k == "--tc-tflops") a.tc_tflops = std::stod(val());
    else if (k == "--full-layers") a.full_layers = std::stoll(val());
    else if (k == "--dequantize-weights") a.dequantize_weights = true;
    else {
      std::fprintf(stderr, "bench_model: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.models.empty() || a.models.size() > 2 || (a.dtype != "bf16" && a.dtype != "fp32") || a.steps < 1) {
    std::fprintf(stderr, "usage: bench_model --model DIR [--model DIR2] [--device cuda|cpu] [--dtype bf16|fp32] ...\n");
    return 2;
  }
  {  // Decode state per token at 1M context, full depth (state_bytes_for of the released layer layout)
    auto cfg = synthetic_config("v41-flash", 129280, a.full_layers, 1024);
    auto full = cfg ? spec_from_config(*cfg) : Result<ModelSpec>(cfg.status());
    if (full) {
      ModelOptions o;
      int64_t const n = int64_t{1} << 20;
      size_t const at0 = GpuDsv41Model::state_bytes_for(*full, o, 0), at1 = GpuDsv41Model::state_bytes_for(*full, o, n);
      std::printf("{\"bench\":\"state\",\"layers_full\":%lld,\"tokens\":%lld,\"bytes_per_token\":%.1f,"
                  "\"fixed_mb\":%.2f,\"total_gb\":%.3f}\n",
                  static_cast<long long>(a.full_layers), static_cast<long long>(n),
                  static_cast<double>(at1 - at0) / static_cast<double>(n), static_cast<double>(at0) / 1e6,
                  static_cast<double>(at1) / 1e9);
    }
  }
  bool const bf16 = a.dtype == "bf16";
  std::vector<Measured> runs;
  std::vector<WeightBytes> bytes;
  std::vector<ModelSpec> specs;
  for (auto const& dir : a.models) {
    auto folder = open_model_folder(dir);
    if (!folder) {
      std::fprintf(stderr, "bench_model: %s\n", folder.status().to_string().c_str());
      return 1;
    }
    auto wb = weight_bytes(dir, folder->spec, bf16, bf16 && !a.dequantize_weights && a.device == "cuda");
    if (!wb) {
      std::fprintf(stderr, "bench_model: %s\n", wb.status().to_string().c_str());
      return 1;
    }
    ModelOptions opts;
    opts.numerics = bf16 ? Numerics::kBf16 : Numerics::kFp32;
    opts.dequantize_weights = a.dequantize_weights;
    auto t0 = Clock::now();
    auto m = load_model_on(dir, opts, a.device);
    if (!m) {
      std::fprintf(stderr, "bench_model: %s\n", m.status().to_string().c_str());
      return 1;
    }
    ModelSpec const& s = folder->spec;
    auto const* gm = dynamic_cast<GpuDsv41Model const*>(m->get());
    std::printf("{\"bench\":\"load\",\"model\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"layers\":%lld,"
                "\"experts\":%lld,\"top_k\":%lld,\"load_s\":%.2f,\"dense_stored_gb\":%.4f,\"dense_file_gb\":%.4f,"
                "\"experts_stored_gb\":%.3f,\"experts_file_gb\":%.3f,\"device_weight_gb\":%.3f}\n",
                dir.c_str(), a.device.c_str(), a.dtype.c_str(), static_cast<long long>(s.num_layers),
                static_cast<long long>(s.n_experts), static_cast<long long>(s.top_k), since(t0), wb->dense_stored / 1e9,
                wb->dense_file / 1e9, wb->expert_stored / 1e9, wb->expert_file / 1e9,
                gm ? static_cast<double>(gm->weight_bytes()) / 1e9 : 0.0);
    std::fflush(stdout);
    runs.push_back(measure(**m, a, s.num_layers));
    bytes.push_back(*wb);
    specs.push_back(s);
  }

  // Per-layer fit (two checkpoints) or scaling (one), then rooflines for the full-depth model.
  auto per_layer = [&](auto get) -> std::pair<double, double> {  // (fixed, per layer)
    if (runs.size() == 2 && runs[0].layers != runs[1].layers) {
      double const t0 = get(runs[0]), t1 = get(runs[1]);
      double const pl = (t1 - t0) / static_cast<double>(runs[1].layers - runs[0].layers);
      return {t0 - pl * static_cast<double>(runs[0].layers), pl};
    }
    return {0.0, get(runs.back()) / static_cast<double>(runs.back().layers)};
  };
  // Bytes and params per layer from the larger checkpoint (the head and embedding counted once).
  WeightBytes const& wb = bytes.back();
  ModelSpec const& s = specs.back();
  double const Lb = static_cast<double>(s.num_layers), Lf = static_cast<double>(a.full_layers);
  double const dense_layer_stored = wb.dense_stored / Lb, dense_layer_file = wb.dense_file / Lb;
  double const expert_layer_stored = wb.expert_stored / Lb, expert_layer_file = wb.expert_file / Lb;
  double const E = static_cast<double>(s.n_experts), K = static_cast<double>(s.top_k);
  for (int64_t B : a.batches) {
    bool have = true;
    for (auto const& r : runs) have = have && r.step_s.count(B);
    if (!have) continue;
    auto [fixed, layer] = per_layer([&](Measured const& r) { return r.step_s.at(B); });
    double const touched = 1.0 - std::pow(1.0 - K / E, static_cast<double>(B));
    auto per_token = [&](double dense_l, double expert_l, double head, double emb) {
      return (Lf * (dense_l + expert_l * touched) + head + emb * static_cast<double>(B)) / static_cast<double>(B);
    };
    double const tok_stored = per_token(dense_layer_stored, expert_layer_stored, wb.head_stored, wb.embed_row_stored);
    double const tok_file = per_token(dense_layer_file, expert_layer_file, wb.head_file, wb.embed_row_file);
    double const step_full = fixed + layer * Lf;
    double const tps = static_cast<double>(B) / step_full;
    double const roof_stored = a.copy_gbps * 1e9 / tok_stored, roof_file = a.copy_gbps * 1e9 / tok_file;
    double const layer_bytes = (dense_layer_stored + expert_layer_stored * touched);
    std::printf("{\"bench\":\"decode_full\",\"layers_full\":%lld,\"batch\":%lld,\"layer_ms\":%.3f,\"fixed_ms\":%.3f,"
                "\"layer_gbps_stored\":%.1f,\"tok_s\":%.2f,\"roofline_tok_s_stored\":%.1f,\"pct_stored\":%.2f,"
                "\"roofline_tok_s_file\":%.1f,\"pct_file\":%.2f,\"bytes_per_token_stored_gb\":%.3f,"
                "\"bytes_per_token_file_gb\":%.3f}\n",
                static_cast<long long>(a.full_layers), static_cast<long long>(B), layer * 1e3, fixed * 1e3,
                layer_bytes / layer / 1e9, tps, roof_stored, 100.0 * tps / roof_stored, roof_file, 100.0 * tps / roof_file,
                tok_stored / 1e9, tok_file / 1e9);
  }
  double const flops_tok_layer =
      2.0 * (wb.linear_params_dense / Lb + K * wb.linear_params_expert / Lb);
  for (int64_t L : a.prefill) {
    bool have = true;
    for (auto const& r : runs) have = have && r.prefill_s.count(L);
    if (!have) continue;
    auto [fixed, layer] = per_layer([&](Measured const& r) { return r.prefill_s.at(L); });
    double const layer_tflops = flops_tok_layer * static_cast<double>(L) / layer / 1e12;
    double const full_s = fixed + layer * Lf;
    std::printf("{\"bench\":\"prefill_full\",\"layers_full\":%lld,\"tokens\":%lld,\"layer_ms\":%.2f,\"fixed_ms\":%.2f,"
                "\"tok_s\":%.1f,\"linear_tflops_per_layer\":%.2f,\"pct_of_tc_peak\":%.2f,"
                "\"linear_gflop_per_token_layer\":%.3f}\n",
                static_cast<long long>(a.full_layers), static_cast<long long>(L), layer * 1e3, fixed * 1e3,
                static_cast<double>(L) / full_s, layer_tflops, 100.0 * layer_tflops / a.tc_tflops, flops_tok_layer / 1e9);
  }
  return 0;
}

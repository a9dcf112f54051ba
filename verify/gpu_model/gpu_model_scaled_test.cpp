// SPDX-License-Identifier: Apache-2.0
/// The GPU model on a native-layout checkpoint (`make-synthetic --format fp8`: FP8 e4m3 projections with
/// 32×32 ue8m0 scales, FP4 routed experts) in bf16 numerics keeps its block-scaled projections as stored
/// (codes + scales through ops::Linear's kF8E4m3 weights) and computes exactly what it computes with them
/// dequantised to bf16 (ModelOptions::dequantize_weights) and what the CPU model computes: every logits row
/// of a prefill past the window and the compressor groups, then single-token decode steps, bit for bit.
/// The FP4 routed experts are kept as stored too (MoeExpertsDesc::routed_scaled; the CPU op widens their rows), and
/// beside them the FP8 shared expert (MoeExpertsDesc::shared_scaled; GpuDsv41Model::shared_expert_dtype). The
/// CPU model with ModelOptions::weights_as_stored holds the same stored forms and gives the same logits. Which
/// weights were kept is checked through GpuDsv41Model::projection_dtype / routed_experts_dtype and the weight
/// bytes (the saving is exactly Σ b·rows·cols − codes − scales over the kept ones, b the dequantised copy's bytes a
/// value: 2, or 4 for the CPU backend's fp32 experts, less the experts' tables of scale pointers); the grouped wo_a is kept when its
/// groups start on 32-row scale blocks (o_lora_rank % 32 == 0) and dequantised otherwise.
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string_view>
#include <unistd.h>

#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "verify/gpu_model/gpu_model_fixture.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;
using verify::bitwise_equal;

namespace {

constexpr Backend kBackend = verify::kGpuModelOnCpu ? Backend::kCpu : Backend::kCuda;

/// A tiny-preset FP8 checkpoint (Engram hash data from the golden tiny fixture), removed with the object.
struct Fp8Checkpoint {
  std::filesystem::path dir;
  ModelSpec spec;
  CheckpointSource src;
  explicit Fp8Checkpoint(Config const& c) {
    dir = std::filesystem::temp_directory_path() /
          ("tessera_gpu_model_fp8_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    throw_if_error(write_synthetic_checkpoint(c, dir.string(), 41, *native_fp8_format()).status());
    spec = spec_from_config(c).value_or_throw();
    throw_if_error(src.open((dir / "model.safetensors").string()));
    throw_if_error(src.open(verify::tiny_dir("fp32") + "/golden.safetensors"));
  }
  ~Fp8Checkpoint() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

/// Logits of a prefill of `prompt` (every row), then of `decode` single-token steps, in order.
std::vector<float> prefill_then_decode(LanguageModel& m, std::vector<int32_t> const& prompt,
                                       std::vector<int32_t> const& decode) {
  int64_t const V = m.info().vocab_size, S = static_cast<int64_t>(prompt.size());
  std::vector<float> out(static_cast<size_t>((S + static_cast<int64_t>(decode.size())) * V));
  auto st = m.new_sequence();
  SequenceStep pre{st.get(), prompt, S, out.data()};
  throw_if_error(m.forward({&pre, 1}));
  for (size_t k = 0; k < decode.size(); ++k) {
    float* row = out.data() + (S + static_cast<int64_t>(k)) * V;
    SequenceStep step{st.get(), std::span<int32_t const>(&decode[k], 1), 1, row};
    throw_if_error(m.forward({&step, 1}));
  }
  return out;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

char const* const kProjections[] = {"wq_a", "wq_b", "wkv", "wo_a", "wo_b", "c_wkv", "c_wgate",
                                    "i_wq_b", "i_weights_proj", "i_wk", "e_wkv"};

/// The checks of the file comment on `c` (its wo_a kept as stored iff `wo_a_kept`).
void scaled_equals_dequantised(Config const& c, bool wo_a_kept) {
  Fp8Checkpoint ck(c);
  ModelOptions o;
  o.numerics = Numerics::kBf16;
  auto cpu = Dsv41Model::create(ck.spec, ck.src, o).value_or_throw();
  auto kept = GpuDsv41Model::create(ck.spec, ck.src, o, kBackend).value_or_throw();
  ModelOptions od = o;
  od.dequantize_weights = true;
  auto deq = GpuDsv41Model::create(ck.spec, ck.src, od, kBackend).value_or_throw();

  // Which projections are held as stored: exactly the scaled ones the forward can view (all but a wo_a
  // whose groups split scale blocks); the dequantising model holds all of them as bf16.
  Weights const hw = load_weights(ck.spec, ck.src, Numerics::kBf16, {.keep_scaled_projections = true}).value_or_throw();
  BOOST_REQUIRE(!hw.scaled.empty());
  bool const fp8_kept = kBackend == Backend::kCpu || ops::tc_quant_format_fused(DType::kF8E4m3);
  size_t saved = 0;
  int64_t n_kept = 0;
  for (int64_t l = 0; l < ck.spec.num_layers; ++l)
    for (char const* field : kProjections) {
      std::string const key = scaled_weight_key(l, field);
      auto dk = kept->projection_dtype(key), dd = deq->projection_dtype(key);
      BOOST_TEST(dk.ok() == dd.ok(), key);
      if (!dk.ok() || !dd.ok()) continue;
      BOOST_TEST((*dd == DType::kBf16), key);
      auto it = hw.scaled.find(key);
      // CUDA keeps FP8 only where the fused tile runs it (ops::tc_quant_format_fused); the CPU backend keeps all.
      bool const stored = it != hw.scaled.end() && (std::string(field) != "wo_a" || wo_a_kept) && fp8_kept;
      BOOST_TEST((*dk == (stored ? DType::kF8E4m3 : DType::kBf16)), key);
      if (!stored) continue;
      ScaledWeight const& sw = it->second;
      saved += static_cast<size_t>(2 * sw.rows * sw.cols) - sw.codes.nbytes() - sw.scales.nbytes();
      ++n_kept;
    }
  // The synthetic FP8 layout: the five attention projections of every layer, the indexer's wq_b and the
  // Engram wkv are FP8; the head, the compressor and the rest of the indexer are bf16.
  BOOST_TEST(hw.scaled.count(scaled_weight_key(0, "wq_a")) == 1u);
  BOOST_TEST(hw.scaled.count(scaled_weight_key(1, "e_wkv")) == 1u);
  BOOST_TEST(hw.scaled.count(scaled_weight_key(1, "i_wq_b")) == 1u);
  BOOST_TEST(hw.scaled.count(scaled_weight_key(1, "c_wkv")) == 0u);
  BOOST_TEST(hw.scaled.count(scaled_head_key()) == 0u);
  BOOST_TEST((kept->projection_dtype(scaled_head_key()).value_or_throw() == DType::kBf16));
  BOOST_TEST((kept->projection_dtype(scaled_weight_key(0, "wo_a")).value_or_throw() ==
              (wo_a_kept && fp8_kept ? DType::kF8E4m3 : DType::kBf16)));
  BOOST_TEST(!kept->projection_dtype(scaled_weight_key(0, "c_wkv")).ok());  // layer 0 has no compressor
  BOOST_TEST(!kept->projection_dtype("layers.0.nothing").ok());
  int64_t const L = ck.spec.num_layers;
  BOOST_TEST(n_kept == (fp8_kept ? (wo_a_kept ? 5 : 4) * L + static_cast<int64_t>(ck.spec.index_source_layers.size()) +
                                         static_cast<int64_t>(ck.spec.engram_layers.size())
                                   : 0));
  // Routed experts: FP4 in the checkpoint; kept as stored on both backends (MoeExpertsDesc::routed_scaled), the
  // dequantised copies fp32 on the CPU backend (its op's dense expert dtype) and bf16 on CUDA.
  WeightLoadOptions eo;
  eo.experts_as_stored = [](DType t) { return t == DType::kF4E2m1x2; };
  Weights const he = load_weights(ck.spec, ck.src, Numerics::kBf16, eo).value_or_throw();
  for (int64_t l = 0; l < L; ++l)  // recorded instead of loaded: no fp32 host copy
    BOOST_TEST(!he.layers[static_cast<size_t>(l)].experts.front().w1.defined());
  for (int64_t l = 0; l < L; ++l) {
    BOOST_TEST((kept->routed_experts_dtype(l).value_or_throw() == DType::kF4E2m1x2), "layer " << l);
    BOOST_TEST((deq->routed_experts_dtype(l).value_or_throw() == (kBackend == Backend::kCuda ? DType::kBf16 : DType::kF32)));
    size_t const dense_bytes = kBackend == Backend::kCuda ? 2 : 4;
    saved -= 3 * static_cast<size_t>(ck.spec.n_experts) * sizeof(void*);  // the layer's table of scale pointers
    for (int64_t e = 0; e < ck.spec.n_experts; ++e)
      for (char const* wn : {"w1", "w3", "w2"}) {
        ScaledWeight const& sw = he.scaled.at(scaled_expert_key(l, e, wn));
        BOOST_TEST((sw.dtype == DType::kF4E2m1x2));
        saved += static_cast<size_t>(dense_bytes * sw.rows * sw.cols) - sw.codes.nbytes() - sw.scales.nbytes();
      }
  }
  BOOST_TEST(he.scaled.count(scaled_weight_key(0, "wq_a")) == 0u);  // projections are not asked for here
  BOOST_TEST(he.scaled.count(scaled_shared_key(0, "w1")) == 0u);    // nor the shared expert
  // The shared expert: FP8 in the checkpoint, recorded instead of loaded beside routed experts kept as stored, and
  // held so by the kept model where FP8 runs (CUDA: the fused tile; the CPU backend: always) unless
  // TESSERA_SHARED_AS_STORED=0.
  char const* const shared_env = std::getenv("TESSERA_SHARED_AS_STORED");
  bool const shared_kept = fp8_kept && !(shared_env && std::string_view(shared_env) == "0");
  std::printf("gpu_model_scaled: shared expert held %s\n", shared_kept ? "FP8 as stored" : "dense");
  WeightLoadOptions so = eo;
  so.shared_expert_as_stored = [](DType t) { return t == DType::kF8E4m3; };
  Weights const hs = load_weights(ck.spec, ck.src, Numerics::kBf16, so).value_or_throw();
  for (int64_t l = 0; l < L; ++l) {
    BOOST_TEST(!hs.layers[static_cast<size_t>(l)].shared.w1.defined());
    DType const dense = kBackend == Backend::kCuda ? DType::kBf16 : DType::kF32;
    BOOST_TEST((kept->shared_expert_dtype(l).value_or_throw() == (shared_kept ? DType::kF8E4m3 : dense)), "layer " << l);
    BOOST_TEST((deq->shared_expert_dtype(l).value_or_throw() == dense));
    if (!shared_kept) continue;
    size_t const dense_bytes = kBackend == Backend::kCuda ? 2 : 4;
    for (char const* wn : {"w1", "w3", "w2"}) {
      ScaledWeight const& sw = hs.scaled.at(scaled_shared_key(l, wn));
      BOOST_TEST((sw.dtype == DType::kF8E4m3));
      saved += static_cast<size_t>(dense_bytes * sw.rows * sw.cols) - sw.codes.nbytes() - sw.scales.nbytes();
    }
  }
  BOOST_TEST(!kept->shared_expert_dtype(L).ok());
  // Without routed experts kept as stored the shared expert loads dequantised (its block-scaled path rides on theirs).
  WeightLoadOptions so_only;
  so_only.shared_expert_as_stored = so.shared_expert_as_stored;
  Weights const hso = load_weights(ck.spec, ck.src, Numerics::kBf16, so_only).value_or_throw();
  BOOST_TEST(hso.layers.front().shared.w1.defined());
  BOOST_TEST(hso.scaled.count(scaled_shared_key(0, "w1")) == 0u);
  BOOST_TEST(saved > 0u);
  BOOST_TEST(deq->weight_bytes() - kept->weight_bytes() == saved);

  // Prefill of 40 tokens (past the 16-token window, several compressor groups), then 6 decode steps.
  int64_t const V = c.vocab_size;
  auto const prompt = random_tokens(40, V, 7), decode = random_tokens(6, V, 8);
  auto const a = prefill_then_decode(*cpu, prompt, decode);
  auto const b = prefill_then_decode(*kept, prompt, decode);
  auto const d = prefill_then_decode(*deq, prompt, decode);
  BOOST_TEST(bitwise_equal(b, d), "stored-form projections != dequantised projections");
  BOOST_TEST(bitwise_equal(b, a), "stored-form projections != CPU model");
  BOOST_TEST(bitwise_equal(d, a), "dequantised projections != CPU model");

  // The CPU model holding the same weights as stored (ModelOptions::weights_as_stored): every projection and
  // routed expert the checkpoint stores block-scaled is held as codes + scales only, each saving exactly
  // 4·rows·cols − codes − scales fp32 bytes, and the logits are the dequantised CPU model's.
  ModelOptions os = o;
  os.weights_as_stored = true;
  auto cpu_stored = Dsv41Model::create(ck.spec, ck.src, os).value_or_throw();
  size_t cpu_saved = 0;
  for (auto const& [key, sw] : hw.scaled) cpu_saved += static_cast<size_t>(4 * sw.rows * sw.cols) - sw.codes.nbytes() - sw.scales.nbytes();
  for (auto const& [key, sw] : he.scaled) cpu_saved += static_cast<size_t>(4 * sw.rows * sw.cols) - sw.codes.nbytes() - sw.scales.nbytes();
  BOOST_TEST(cpu->weight_bytes() - cpu_stored->weight_bytes() == cpu_saved);
  BOOST_TEST(bitwise_equal(prefill_then_decode(*cpu_stored, prompt, decode), a), "CPU model with weights as stored != dequantised");
  ModelOptions of32 = os;
  of32.numerics = Numerics::kFp32;
  BOOST_TEST(!Dsv41Model::create(ck.spec, ck.src, of32).ok());  // a stored weight's value is bf16

  // fp32 numerics keep reading fp32 weights.
  auto f32 = GpuDsv41Model::create(ck.spec, ck.src, {}, kBackend).value_or_throw();
  BOOST_TEST((f32->projection_dtype(scaled_weight_key(0, "wq_a")).value_or_throw() == DType::kF32));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_model_scaled)

// The tiny preset: o_lora_rank 16, so the grouped wo_a (2 groups of 16 rows, splitting a 32-row scale
// block) is uploaded dequantised and every other FP8 projection as stored.
BOOST_AUTO_TEST_CASE(fp8_projections_as_stored_equal_dequantised_and_cpu) {
  scaled_equals_dequantised(tiny_config(512), false);
}

// o_lora_rank 32: the grouped wo_a (2 groups of 32 rows) runs as stored too.
BOOST_AUTO_TEST_CASE(fp8_grouped_wo_a_as_stored_equals_dequantised_and_cpu) {
  Config c = tiny_config(512);
  c.o_lora_rank = 32;
  scaled_equals_dequantised(c, true);
}

BOOST_AUTO_TEST_SUITE_END()

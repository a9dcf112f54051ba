// SPDX-License-Identifier: Apache-2.0
/// Synthetic DeepSeek-V4.1 checkpoints: the tiny plan equals the golden tiny checkpoint's names, shapes and
/// (bf16) dtypes exactly; Engram primes match spec Appendix/§6; output is a pure function of the seed; the
/// value distributions follow the golden generator; the v41-flash plan has the released shapes and the
/// per-layer tensors only where the released layer kinds own them.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/ops/exl3_loader.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/common/golden.hpp"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::model::dsv41;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tessera_synth_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read_file(fs::path const& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dsv41_synthetic)

BOOST_AUTO_TEST_CASE(engram_primes_tiny_and_released) {
  auto tiny = engram_primes(tiny_config());
  BOOST_REQUIRE(tiny.size() == 2u);
  BOOST_TEST((tiny[0] == std::vector<int64_t>{67, 71, 73, 79, 83, 89}));
  BOOST_TEST((tiny[1] == std::vector<int64_t>{97, 101, 103, 107, 109, 113}));
  auto rel = parse_config(R"({"engram_layer_ids":[1,14]})").value_or_throw();
  auto p = engram_primes(rel);
  int64_t s0 = 0, s1 = 0;
  for (int64_t x : p[0]) s0 += x;
  for (int64_t x : p[1]) s1 += x;
  BOOST_TEST(s0 == 384006168);  // spec Appendix A
  BOOST_TEST(s1 == 384016682);
  BOOST_TEST(p[0][0] == 16000057);
  BOOST_TEST(p[1][23] == 16000889);
}

BOOST_AUTO_TEST_CASE(tiny_matches_golden_checkpoint) {
  for (char const* variant : {"fp32", "bf16"}) {
    TempDir td;
    auto fmt = dense_format(std::string(variant) == "fp32" ? DType::kF32 : DType::kBf16);
    auto sum = write_synthetic_checkpoint(tiny_config(), td.path.string(), 11, *fmt);
    BOOST_REQUIRE_MESSAGE(sum.ok(), sum.status().to_string());
    auto mine = io::Checkpoint::open(td.path.string()).value_or_throw();
    auto gold = io::Checkpoint::open(verify::golden_dir() + "/v41-tiny/" + variant).value_or_throw();
    BOOST_REQUIRE(mine.tensors().size() == gold.tensors().size());
    BOOST_TEST(sum->num_tensors == gold.tensors().size());
    for (size_t i = 0; i < gold.tensors().size(); ++i) {
      auto const& a = mine.tensors()[i];
      auto const& b = gold.tensors()[i];
      BOOST_TEST(a.name == b.name);
      BOOST_TEST((a.shape == b.shape), a.name);
      BOOST_TEST((a.dtype == b.dtype), a.name);
    }
    // config.json reads back to the tiny configuration.
    auto cfg = load_config(td.path.string());
    BOOST_REQUIRE_MESSAGE(cfg.ok(), cfg.status().to_string());
    BOOST_TEST(to_json(*cfg) == to_json(tiny_config()));
  }
}

BOOST_AUTO_TEST_CASE(deterministic_for_a_seed) {
  TempDir a, b, c;
  auto fmt = dense_format(DType::kBf16);
  BOOST_REQUIRE(write_synthetic_checkpoint(tiny_config(), a.path.string(), 5, *fmt).ok());
  BOOST_REQUIRE(write_synthetic_checkpoint(tiny_config(), b.path.string(), 5, *fmt).ok());
  BOOST_REQUIRE(write_synthetic_checkpoint(tiny_config(), c.path.string(), 6, *fmt).ok());
  std::string fa = read_file(a.path / "model.safetensors"), fb = read_file(b.path / "model.safetensors");
  std::string fc = read_file(c.path / "model.safetensors");
  BOOST_TEST(fa.size() > 1000000u);
  BOOST_TEST((fa == fb));
  BOOST_TEST((fa != fc));
  // The values are the same for every chunking: the generator is indexed by element.
  TensorSpec spec{"x", {1000}, TensorSpec::Role::kLinear, 0.f, 1.f};
  auto f = synthetic_values(spec, 3);
  std::vector<float> whole(1000), parts(1000);
  f(whole.data(), 0, 1000);
  f(parts.data(), 0, 333);
  f(parts.data() + 333, 333, 1000);
  BOOST_TEST(std::memcmp(whole.data(), parts.data(), 4000) == 0);
}

BOOST_AUTO_TEST_CASE(value_distributions) {
  TempDir td;
  auto fmt = dense_format(DType::kF32);
  BOOST_REQUIRE(write_synthetic_checkpoint(tiny_config(), td.path.string(), 1, *fmt).ok());
  auto ck = io::Checkpoint::open(td.path.string()).value_or_throw();
  auto stats = [&](std::string const& name) {
    auto t = ck.load_f32(name).value_or_throw();
    double s = 0, s2 = 0;
    int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) s += t.data_as<float>()[i];
    double m = s / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) s2 += (t.data_as<float>()[i] - m) * (t.data_as<float>()[i] - m);
    return std::pair{m, std::sqrt(s2 / static_cast<double>(n))};
  };
  // Large tensors: mean and std within a few standard errors of the golden generator's N(mean, std).
  auto check = [&](std::string const& name, double mean, double sd) {
    auto [m, s] = stats(name);
    double n = static_cast<double>(ck.view(name)->numel());
    BOOST_TEST(std::abs(m - mean) < 5 * sd / std::sqrt(n), name << " mean " << m);
    BOOST_TEST(std::abs(s - sd) < 5 * sd / std::sqrt(2 * n), name << " std " << s);
  };
  check("model.embed.weight", 0.0, 0.05);
  check("lm_head.weight", 0.0, 0.2);
  check("model.layers.3.ffn.experts.7.w2.weight", 0.0, 0.05);
  check("model.layers.2.hc_attn_fn", 0.0, 0.05);
  check("model.layers.1.engram.q_weight", 1.0, 0.2);
  auto [sm, ss] = stats("model.layers.1.engram.embed.scale");
  BOOST_TEST(sm == 1.0);
  BOOST_TEST(ss == 0.0);
}

BOOST_AUTO_TEST_CASE(v41_flash_plan) {
  auto c = synthetic_config("v41-flash", 129280, 21, 0).value_or_throw();
  BOOST_TEST(c.num_hidden_layers == 21);
  BOOST_TEST((c.kv_source_layer_ids == std::vector<int64_t>{2, 8, 14, 20}));
  BOOST_TEST((c.index_source_layer_ids == std::vector<int64_t>{2, 8, 14, 20}));
  BOOST_TEST(c.candidate_source_layer_id == 20);
  BOOST_TEST((c.engram_layer_ids == std::vector<int64_t>{1, 14}));
  BOOST_TEST(c.engram_num_embeddings[0] > 60000);
  BOOST_TEST(c.engram_num_embeddings[0] < 70000);
  auto plan = checkpoint_plan(c);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto const& s : plan) shapes[s.name] = s.shape;
  using V = std::vector<int64_t>;
  BOOST_TEST((shapes.at("model.embed.weight") == V{129280, 5120}));
  BOOST_TEST((shapes.at("model.layers.0.hc_attn_fn") == V{24, 20480}));
  BOOST_TEST((shapes.at("model.layers.0.attn.wq_b.weight") == V{32768, 1280}));
  BOOST_TEST((shapes.at("model.layers.0.attn.wo_a.weight") == V{8192, 4096}));
  BOOST_TEST((shapes.at("model.layers.0.attn.wo_b.weight") == V{5120, 8192}));
  BOOST_TEST((shapes.at("model.layers.2.attn.indexer.wq_b.weight") == V{4096, 1280}));
  BOOST_TEST((shapes.at("model.layers.2.attn.indexer.wk.weight") == V{128, 512}));
  BOOST_TEST((shapes.at("model.layers.5.ffn.experts.383.w2.weight") == V{5120, 2304}));
  BOOST_TEST((shapes.at("model.layers.14.engram.wkv.weight") == V{25600, 6144}));
  BOOST_TEST((shapes.at("model.layers.14.engram.embed.scale")[1] == 8));
  BOOST_TEST(shapes.count("model.layers.2.attn.compressor.wgate.weight") == 1u);   // ratio 2
  BOOST_TEST(shapes.count("model.layers.20.attn.compressor.wgate.weight") == 0u);  // ratio 1: no gate
  BOOST_TEST(shapes.count("model.layers.20.attn.compressor.wkv.weight") == 1u);
  BOOST_TEST(shapes.count("model.layers.3.attn.compressor.wkv.weight") == 0u);     // consumer
  BOOST_TEST(shapes.count("model.layers.3.attn.indexer.wq_b.weight") == 0u);
  BOOST_TEST(shapes.count("model.layers.1.engram.wkv.weight") == 1u);
  BOOST_TEST(shapes.count("model.layers.2.engram.wkv.weight") == 0u);
  auto two = synthetic_config("v41-flash", 129280, 0, 0).value_or_throw();  // default 2 layers
  BOOST_TEST(two.num_hidden_layers == 2);
  BOOST_TEST(two.kv_source_layer_ids.empty());
  BOOST_TEST((two.engram_layer_ids == std::vector<int64_t>{1}));
  BOOST_TEST(!synthetic_config("tiny", 512, 3, 0).ok());
  BOOST_TEST(!synthetic_config("huge", 512, 0, 0).ok());
  BOOST_TEST(!synthetic_config("v41-flash", 512, 41, 0).ok());
}

// The native layout on the tiny plan: every stored FP8 / FP4 code dequantised with its ue8m0 scale is the
// planned value within the format's rounding (e4m3: half an ulp, 2^-4 relative for normals, 2^-10·s for
// subnormals; e2m1: at most s, its widest half-gap); every scale is the smallest power of two ≥ amax/qmax.
BOOST_AUTO_TEST_CASE(native_fp8_dequantises_to_the_plan) {
  TempDir td;
  Config const c = tiny_config();
  auto fmt = native_fp8_format();
  BOOST_REQUIRE(write_synthetic_checkpoint(c, td.path.string(), 9, *fmt).ok());
  auto ck = io::Checkpoint::open(td.path.string()).value_or_throw();
  std::map<std::string, TensorSpec> plan;
  for (auto const& s : checkpoint_plan(c)) plan[s.name] = s;
  int fp8 = 0, fp4 = 0, table = 0;
  for (auto const& [name, spec] : plan) {
    auto const* ti = ck.find(name);
    BOOST_REQUIRE_MESSAGE(ti || spec.role == TensorSpec::Role::kEngramScale, name);
    if (!ti || (ti->dtype != DType::kF8E4m3 && ti->dtype != DType::kI8)) continue;
    std::string const sname = name.substr(0, name.size() - 7) + ".scale";
    auto const* si = ck.find(sname);
    BOOST_REQUIRE_MESSAGE(si && si->dtype == DType::kE8m0, sname);
    Tensor w = ck.load(name).value_or_throw(), sc = ck.load(sname).value_or_throw();
    int64_t const rows = spec.shape[0], cols = spec.shape[1];
    std::vector<float> v(static_cast<size_t>(rows * cols));
    synthetic_values(spec, 9)(v.data(), 0, rows * cols);
    bool const fp4_row = ti->dtype == DType::kI8, block = !fp4_row && spec.role != TensorSpec::Role::kEngramTable;
    BOOST_TEST((sc.dim(0) == (block ? (rows + 31) / 32 : rows)));
    BOOST_TEST(sc.dim(1) == (cols + 31) / 32);
    float const qmax = fp4_row ? 6.f : 448.f;
    std::vector<float> amax(static_cast<size_t>(sc.numel()), 0.f);
    auto sidx = [&](int64_t r, int64_t col) { return (block ? r / 32 : r) * sc.dim(1) + col / 32; };
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < cols; ++col)
        amax[sidx(r, col)] = std::max(amax[sidx(r, col)], std::fabs(v[r * cols + col]));
    int bad = 0;
    for (int64_t i = 0; i < sc.numel(); ++i) {
      float const s = float_from_e8m0(sc.data_as<uint8_t>()[i]);
      if (!(s >= amax[i] / qmax && (s / 2 < amax[i] / qmax))) ++bad;
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < cols; ++col) {
        float const s = float_from_e8m0(sc.data_as<uint8_t>()[sidx(r, col)]), x = v[r * cols + col];
        uint8_t const* b = w.data_as<uint8_t>();
        float const d = fp4_row ? float_from_fp4_e2m1(col % 2 ? b[(r * cols + col) / 2] >> 4 : b[(r * cols + col) / 2] & 0xF) * s
                                : float_from_fp8_e4m3(b[r * cols + col]) * s;
        float const tol = fp4_row ? s : std::max(std::fabs(x) * 0.0625f, s * 0.0009765625f);
        if (!(std::fabs(d - x) <= tol)) ++bad;
      }
    BOOST_TEST(bad == 0, name << ": " << bad << " bad codes or scales");
    (fp4_row ? fp4 : spec.role == TensorSpec::Role::kEngramTable ? table : fp8) += 1;
  }
  BOOST_TEST(fp4 == 7 * 8 * 3);           // every routed expert of the 7 layers
  BOOST_TEST(fp8 > 7 * 5);                // attention, shared experts, indexer, engram wkv
  BOOST_TEST(table == 2);                 // the tiny model's two Engram layers
  BOOST_TEST((ck.find("model.embed.weight")->dtype == DType::kBf16));
  BOOST_TEST((ck.find("model.layers.0.hc_attn_fn")->dtype == DType::kF32));
  BOOST_TEST(ck.find("model.layers.0.attn.compressor.wkv.weight") == nullptr);  // tiny layer 0: window only
}

// EXL3 K allocation follows spec/exl3.md §5.3 and its budget: head 6, attention 5 (6 on layer 0), indexer
// wk 8, experts floor(bpw) promoted end layers first until the released budget is spent.
BOOST_AUTO_TEST_CASE(exl3_bits_allocation) {
  using V = std::vector<int64_t>;
  BOOST_TEST(exl3_synthetic_bits("lm_head.weight", V{129280, 5120}, 2.8) == 6);
  BOOST_TEST(exl3_synthetic_bits("model.layers.0.attn.wq_b.weight", V{32768, 1280}, 2.8) == 6);
  BOOST_TEST(exl3_synthetic_bits("model.layers.3.attn.wq_b.weight", V{32768, 1280}, 2.8) == 5);
  BOOST_TEST(exl3_synthetic_bits("model.layers.2.attn.indexer.wk.weight", V{128, 512}, 2.8) == 8);
  BOOST_TEST(exl3_synthetic_bits("model.layers.2.attn.indexer.weights_proj.weight", V{32, 5120}, 2.8) == 0);
  BOOST_TEST(exl3_synthetic_bits("model.layers.2.ffn.gate.weight", V{384, 5120}, 2.8) == 0);
  BOOST_TEST(exl3_synthetic_bits("model.embed.weight", V{129280, 5120}, 2.8) == 0);
  // Average over the released budget lands within one layer's experts of the target, below it.
  Config const rel = released_config();
  double bits = 0, params = 0;
  for (auto const& s : checkpoint_plan([&] {
         Config c = rel;
         c.n_routed_experts = 1;  // one expert per layer stands for all: experts of a layer share K
         return c;
       }())) {
    int const k = exl3_synthetic_bits(s.name, s.shape, 2.8);
    if (k == 0 || s.name == "lm_head.weight") continue;
    double const w = static_cast<double>(s.shape[0] * s.shape[1]) * (s.role == TensorSpec::Role::kExpertLinear ? 384 : 1);
    bits += k * w;
    params += w;
  }
  double const avg = bits / params;
  BOOST_TEST(avg <= 2.8);
  BOOST_TEST(avg > 2.8 - 0.05);
  int two = 0, three = 0;
  for (int l = 0; l < 40; ++l) {
    int k = exl3_synthetic_bits("model.layers." + std::to_string(l) + ".ffn.experts.0.w1.weight", V{2304, 5120}, 2.8);
    two += k == 2;
    three += k == 3;
  }
  BOOST_TEST(two + three == 40);
  BOOST_TEST(exl3_synthetic_bits("model.layers.0.ffn.experts.0.w1.weight", V{2304, 5120}, 2.8) == 3);   // end layers first
  BOOST_TEST(exl3_synthetic_bits("model.layers.20.ffn.experts.0.w1.weight", V{2304, 5120}, 2.8) == 2);  // middle last
  BOOST_TEST(!synthetic_format("exl3:9").ok());
  BOOST_TEST(!synthetic_format("int4").ok());
  BOOST_TEST(synthetic_format("exl3:2.8").ok());
  BOOST_TEST(!synthetic_format("mixed:0.5").ok());
  BOOST_TEST(!synthetic_format("mixed:").ok());
  auto mixed = synthetic_format("mixed:2.8");
  BOOST_TEST_REQUIRE(mixed.ok());
  BOOST_TEST((*mixed)->name() == "mixed:2.80");
  auto q = (*mixed)->quantization_config();
  BOOST_TEST_REQUIRE(q.has_value());
  BOOST_TEST(q->quant_method == "exl3");
  BOOST_TEST_REQUIRE(q->exl3.has_value());
  BOOST_TEST(q->exl3->original_quantization_config.has_value());  // the FP8 trunk's layout
}

// The loader reads the native layout dequantised (code · scale) with logical shapes, and the CPU model
// runs on it (the Engram hash data from the golden tiny fixture).
BOOST_AUTO_TEST_CASE(native_fp8_loads_dequantised) {
  TempDir td;
  Config const c = tiny_config();
  auto fmt = native_fp8_format();
  BOOST_REQUIRE(write_synthetic_checkpoint(c, td.path.string(), 4, *fmt).ok());
  CheckpointSource src;
  BOOST_REQUIRE(src.open((td.path / "model.safetensors").string()).ok());
  auto ck = io::Checkpoint::open(td.path.string()).value_or_throw();
  for (std::string const name : {"model.layers.2.attn.wq_b.weight", "model.layers.2.ffn.experts.3.w2.weight"}) {
    auto plan = checkpoint_plan(c);
    auto it = std::find_if(plan.begin(), plan.end(), [&](TensorSpec const& t) { return t.name == name; });
    BOOST_REQUIRE(it != plan.end());
    BOOST_TEST((src.shape(name).value_or_throw() == it->shape));
    Tensor got = src.load_f32(name).value_or_throw();
    Tensor raw = ck.load(name).value_or_throw();
    Tensor sc = ck.load(name.substr(0, name.size() - 7) + ".scale").value_or_throw();
    bool const fp4 = raw.dtype() == DType::kI8;
    int64_t const rows = it->shape[0], cols = it->shape[1];
    int bad = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        uint8_t const* b = raw.data_as<uint8_t>();
        float const code = fp4 ? float_from_fp4_e2m1((b[(r * cols + j) / 2] >> (4 * (j % 2))) & 0xF)
                               : float_from_fp8_e4m3(b[r * cols + j]);
        float const s = float_from_e8m0(sc.data_as<uint8_t>()[fp4 ? r * sc.dim(1) + j / 32 : (r / 32) * sc.dim(1) + j / 32]);
        bad += got.data_as<float>()[r * cols + j] != code * s;
      }
    BOOST_TEST(bad == 0, name);
  }
  BOOST_REQUIRE(src.open(verify::golden_dir() + "/v41-tiny/fp32/golden.safetensors").ok());
  auto spec = spec_from_config(c).value_or_throw();
  auto m = Dsv41Model::create(spec, src, {}).value_or_throw();
  auto st = m->new_sequence();
  std::vector<int32_t> toks = {5, 17, 300, 2, 9};
  std::vector<float> logits(static_cast<size_t>(5 * c.vocab_size));
  model::SequenceStep step{st.get(), toks, 5, logits.data()};
  BOOST_REQUIRE(m->forward({&step, 1}).ok());
  int finite = 0;
  for (float v : logits) finite += std::isfinite(v) ? 1 : 0;
  BOOST_TEST(finite == static_cast<int>(logits.size()));
}

// load_scaled gives the stored form of the native layout: FP8 linears as kF8E4m3 codes + [⌈r/32⌉, ⌈c/32⌉]
// scales, FP4 experts as kF4E2m1x2 [r, c/2] + [r, c/32], whose code · scale is load_f32's value; a dense
// tensor is not scaled. load_weights records the stored projections only when asked, never the experts.
BOOST_AUTO_TEST_CASE(native_fp8_load_scaled) {
  TempDir td;
  Config const c = tiny_config();
  BOOST_REQUIRE(write_synthetic_checkpoint(c, td.path.string(), 4, *native_fp8_format()).ok());
  CheckpointSource src;
  BOOST_REQUIRE(src.open((td.path / "model.safetensors").string()).ok());
  for (std::string const name : {"model.layers.2.attn.wq_b.weight", "model.layers.2.ffn.experts.3.w2.weight"}) {
    ScaledWeight sw = src.load_scaled(name).value_or_throw();
    Tensor f = src.load_f32(name).value_or_throw();
    bool const fp4 = name.find("experts") != std::string::npos;
    BOOST_TEST_REQUIRE(sw.present());
    BOOST_TEST((sw.dtype == (fp4 ? DType::kF4E2m1x2 : DType::kF8E4m3)));
    BOOST_TEST((std::vector<int64_t>{sw.rows, sw.cols} == f.shape()));
    BOOST_TEST((sw.codes.shape() == std::vector<int64_t>{sw.rows, fp4 ? sw.cols / 2 : sw.cols}));
    BOOST_TEST((sw.scales.shape() == std::vector<int64_t>{fp4 ? sw.rows : (sw.rows + 31) / 32, (sw.cols + 31) / 32}));
    int bad = 0;
    uint8_t const* q = sw.codes.data_as<uint8_t>();
    uint8_t const* s8 = sw.scales.data_as<uint8_t>();
    int64_t const cb = sw.scales.dim(1);
    for (int64_t r = 0; r < sw.rows; ++r)
      for (int64_t j = 0; j < sw.cols; ++j) {
        float const code = fp4 ? float_from_fp4_e2m1((q[(r * sw.cols + j) / 2] >> (4 * (j % 2))) & 0xF)
                               : float_from_fp8_e4m3(q[r * sw.cols + j]);
        float const s = float_from_e8m0(s8[(fp4 ? r : r / 32) * cb + j / 32]);
        bad += f.data_as<float>()[r * sw.cols + j] != code * s;
      }
    BOOST_TEST(bad == 0, name);
  }
  BOOST_TEST(!src.load_scaled("model.layers.2.attn.q_norm.weight").value_or_throw().present());
  BOOST_TEST(!src.load_scaled("lm_head.weight").value_or_throw().present());  // the synthetic head is bf16
  BOOST_TEST(!src.load_scaled("model.layers.2.attn.nothing.weight").ok());

  BOOST_REQUIRE(src.open(verify::golden_dir() + "/v41-tiny/fp32/golden.safetensors").ok());
  auto spec = spec_from_config(c).value_or_throw();
  BOOST_TEST(load_weights(spec, src, Numerics::kBf16).value_or_throw().scaled.empty());
  Weights w = load_weights(spec, src, Numerics::kBf16, {.keep_scaled_projections = true}).value_or_throw();
  std::set<std::string> keys;
  for (auto const& [k, sw] : w.scaled) keys.insert(k);
  std::set<std::string> want;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    for (char const* f : {"wq_a", "wq_b", "wkv", "wo_a", "wo_b"}) want.insert(scaled_weight_key(l, f));
    if (spec.is_index_source(l)) want.insert(scaled_weight_key(l, "i_wq_b"));
    if (spec.engram_index(l) >= 0) want.insert(scaled_weight_key(l, "e_wkv"));
  }
  BOOST_TEST((keys == want));
  // The recorded form's bf16 value is the loaded (bf16-rounded) tensor.
  ScaledWeight const& e = w.scaled.at(scaled_weight_key(1, "e_wkv"));
  Tensor const& et = w.layers[1].e_wkv;
  int bad = 0;
  for (int64_t r = 0; r < e.rows; ++r)
    for (int64_t j = 0; j < e.cols; ++j) {
      float const v = float_from_fp8_e4m3(e.codes.data_as<uint8_t>()[r * e.cols + j]) *
                      float_from_e8m0(e.scales.data_as<uint8_t>()[(r / 32) * e.scales.dim(1) + j / 32]);
      bad += round_to_bf16(v) != et.data_as<float>()[r * e.cols + j];
    }
  BOOST_TEST(bad == 0);
}

// Routed experts as stored (WeightLoadOptions::experts_as_stored): a layer whose experts are all FP4 and
// accepted is recorded instead of loaded dequantised (empty ExpertWeights, the recorded values those of the
// dequantised load); a predicate that refuses the dtype gives today's dequantised load and records nothing.
BOOST_AUTO_TEST_CASE(routed_experts_as_stored_skip_the_dequantised_copy) {
  TempDir td;
  Config const c = tiny_config();
  BOOST_REQUIRE(write_synthetic_checkpoint(c, td.path.string(), 4, *native_fp8_format()).ok());
  CheckpointSource src;
  BOOST_REQUIRE(src.open((td.path / "model.safetensors").string()).ok());
  BOOST_REQUIRE(src.open(verify::golden_dir() + "/v41-tiny/fp32/golden.safetensors").ok());
  auto spec = spec_from_config(c).value_or_throw();
  Weights const full = load_weights(spec, src, Numerics::kBf16).value_or_throw();
  WeightLoadOptions take, refuse;
  std::vector<DType> asked;
  take.experts_as_stored = [&](DType t) { asked.push_back(t); return t == DType::kF4E2m1x2; };
  refuse.experts_as_stored = [](DType) { return false; };
  Weights const kept = load_weights(spec, src, Numerics::kBf16, take).value_or_throw();
  Weights const dense = load_weights(spec, src, Numerics::kBf16, refuse).value_or_throw();
  BOOST_TEST(asked.size() == static_cast<size_t>(spec.num_layers));  // once per layer
  BOOST_TEST(std::all_of(asked.begin(), asked.end(), [](DType t) { return t == DType::kF4E2m1x2; }));
  BOOST_TEST(dense.scaled.empty());
  BOOST_TEST(kept.scaled.size() == static_cast<size_t>(3 * spec.num_layers * spec.n_experts));
  int64_t bad = 0;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    auto const& kl = kept.layers[static_cast<size_t>(l)];
    BOOST_TEST(kl.shared.w1.defined());  // the shared expert always loads dequantised
    for (int64_t e = 0; e < spec.n_experts; ++e) {
      BOOST_TEST(!kl.experts[static_cast<size_t>(e)].w1.defined());
      BOOST_TEST(dense.layers[static_cast<size_t>(l)].experts[static_cast<size_t>(e)].w2.defined());
      for (char const* wn : {"w1", "w3", "w2"}) {
        ScaledWeight const& sw = kept.scaled.at(scaled_expert_key(l, e, wn));
        auto const& ew = full.layers[static_cast<size_t>(l)].experts[static_cast<size_t>(e)];
        Tensor const& t = std::string(wn) == "w1" ? ew.w1 : std::string(wn) == "w3" ? ew.w3 : ew.w2;
        for (int64_t r = 0; r < sw.rows; ++r)
          for (int64_t j = 0; j < sw.cols; ++j) {
            uint8_t const b = sw.codes.data_as<uint8_t>()[(r * sw.cols + j) / 2];
            float const v = float_from_fp4_e2m1(j % 2 ? b >> 4 : b & 0xF) *
                            float_from_e8m0(sw.scales.data_as<uint8_t>()[r * sw.scales.dim(1) + j / 32]);
            bad += round_to_bf16(v) != t.data_as<float>()[r * sw.cols + j];
          }
      }
    }
  }
  BOOST_TEST(bad == 0);
}

// A scale of the wrong shape is refused, naming the scale, the tensor and the expected shape, by
// load_scaled and load_f32 alike.
BOOST_AUTO_TEST_CASE(scaled_weight_with_misshapen_scale_is_refused) {
  TempDir td;
  fs::create_directories(td.path);
  io::SafetensorsWriter w;
  BOOST_REQUIRE(w.add("x.weight", Tensor::zeros(DType::kF8E4m3, {40, 64})).ok());
  BOOST_REQUIRE(w.add("x.scale", Tensor::zeros(DType::kE8m0, {1, 2})).ok());
  BOOST_REQUIRE(w.write((td.path / "bad.safetensors").string()).ok());
  CheckpointSource src;
  BOOST_REQUIRE(src.open((td.path / "bad.safetensors").string()).ok());
  auto a = src.load_scaled("x.weight");
  auto b = src.load_f32("x.weight");
  BOOST_TEST_REQUIRE(!a.ok());
  BOOST_TEST_REQUIRE(!b.ok());
  for (std::string const& m : {a.status().message(), b.status().message()}) {
    BOOST_TEST(m.find("x.scale") != std::string::npos, m);
    BOOST_TEST(m.find("x.weight") != std::string::npos, m);
    BOOST_TEST(m.find("[2, 2]") != std::string::npos, m);
  }
}

// EXL3 synthetic groups are what the EXL3 loader reads (ops/exl3_loader.hpp): every group complete with
// the planned K, MUL1, suh = ±1 and svh = ±σ; random trellis bits decode (Exl3Gemm, CPU) to a layer whose
// outputs have RMS √k·σ·rms(x) (the MUL1 codebook has unit RMS and the Hadamards are orthonormal).
BOOST_AUTO_TEST_CASE(exl3_groups_load_and_multiply) {
  TempDir td;
  auto c = synthetic_config("v41-flash", 256, 1, 0, 6).value_or_throw();
  auto fmt = exl3_format(2.8);
  BOOST_REQUIRE(write_synthetic_checkpoint(c, td.path.string(), 2, *fmt).ok());
  auto ck = io::Checkpoint::open(td.path.string()).value_or_throw();
  auto groups = ops::load_exl3_groups(ops::exl3_source(ck)).value_or_throw();
  BOOST_TEST(groups.size() == 5u + 3u * 7u + 1u);  // attention, 6 experts + shared, head
  ops::Exl3Group const* head = nullptr;
  for (auto const& g : groups) {
    int const k = exl3_synthetic_bits(g.prefix + ".weight", {g.desc.n, g.desc.k}, 2.8);
    BOOST_TEST(g.desc.k2 == 2 * k, g.prefix);
    BOOST_TEST((g.desc.codebook == exl3::Codebook::kMul1), g.prefix);
    int bad = 0;
    for (uint16_t b : g.suh) bad += (b & 0x7FFFu) != 0x3C00u;
    uint16_t const mag = g.svh.empty() ? 0 : static_cast<uint16_t>(g.svh[0] & 0x7FFFu);
    for (uint16_t b : g.svh) bad += (b & 0x7FFFu) != mag;
    BOOST_TEST(bad == 0, g.prefix);
    if (g.prefix == "lm_head") head = &g;
  }
  BOOST_REQUIRE(head);
  float const sigma = 4.f * static_cast<float>(c.initializer_range);
  BOOST_TEST((head->svh[0] & 0x7FFFu) == f16_bits_from_float(sigma));
  int64_t const m = 4, k = head->desc.k, n = head->desc.n;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<Fp16> x(static_cast<size_t>(m * k));
  double xs = 0;
  for (auto& v : x) {
    v = Fp16::from_float(nd(rng));
    xs += static_cast<double>(v.to_float()) * v.to_float();
  }
  std::vector<float> y(static_cast<size_t>(m * n));
  ops::Exl3GemmDesc d{head->desc, m, DType::kF32, false};
  ops::Exl3GemmArgs a;
  a.x = TensorView<Fp16 const, 2>(x.data(), {m, k});
  a.trellis = head->trellis.as<int16_t const, 3>().value_or_throw();
  a.suh = TensorView<Fp16 const, 1>(reinterpret_cast<Fp16 const*>(head->suh.data()), {k});
  a.svh = TensorView<Fp16 const, 1>(reinterpret_cast<Fp16 const*>(head->svh.data()), {n});
  a.y_f32 = TensorView<float, 2>(y.data(), {m, n});
  ExecContext ctx;
  BOOST_REQUIRE(ops::Exl3Gemm<Backend::kCpu>::run(d, a, ctx).ok());
  double ys = 0;
  for (float v : y) ys += static_cast<double>(v) * v;
  double const rms = std::sqrt(ys / static_cast<double>(y.size()));
  double const want = std::sqrt(static_cast<double>(k)) * sigma * std::sqrt(xs / static_cast<double>(x.size()));
  BOOST_TEST_MESSAGE("exl3 synthetic head: output RMS " << rms << ", expected " << want);
  BOOST_TEST(rms > 0.9 * want);
  BOOST_TEST(rms < 1.1 * want);
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// Checkpoint quantization (ops::exl3_quantize_checkpoint) end to end on a small synthetic checkpoint:
/// tensor selection (BF16 and FP8-with-block-scales linears and an F32 head quantized; norms, embeddings
/// and the router copied byte for byte), bit allocation within the average budget, the output loaded back
/// through the safetensors reader and the EXL3 loader with the reported error reproduced from the stored
/// layer, config.json's quantization_config, and resumption. Also: our quantizer on the fixture
/// quantizer's own weights (golden/exl3/exl3_golden_quantized.safetensors w_orig) reaches its error.
#include <boost/test/unit_test.hpp>

#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "tessera/io/safetensors.hpp"
#include "tessera/ops/exl3_loader.hpp"
#include "tessera/ops/exl3_quantize.hpp"
#include "verify/common/golden.hpp"
#include "verify/common/random.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

Tensor host_tensor(DType dt, std::vector<int64_t> shape, std::vector<float> const& v) {
  Tensor t = Tensor::empty(dt, std::move(shape)).value_or_throw();
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dt) {
      case DType::kF32: t.data_as<float>()[i] = v[i]; break;
      case DType::kBf16: t.data_as<uint16_t>()[i] = bf16_bits_from_float(v[i]); break;
      case DType::kF16: t.data_as<uint16_t>()[i] = f16_bits_from_float(v[i]); break;
      case DType::kF8E4m3: t.data_as<uint8_t>()[i] = fp8_e4m3_from_float(v[i]); break;
      default: break;
    }
  }
  return t;
}

/// W [k, n] (y = x W) as the stored layer reproduces it.
std::vector<double> stored_dense(ops::Exl3Group const& g) {
  auto L = g.host();
  auto w = ref::exl3_decode_inner(L);
  return ref::exl3_dense_weight(L, w.data());
}

double rel_mse(std::vector<double> const& a, std::vector<float> const& ref_kn) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref_kn[i]) * (a[i] - ref_kn[i]);
    den += static_cast<double>(ref_kn[i]) * ref_kn[i];
  }
  return num / den;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(exl3_quantize_checkpoint)

BOOST_AUTO_TEST_CASE(convert_load_and_resume) {
  uint64_t seed = verify::test_seed(61);
  fs::path const dir = fs::temp_directory_path() / ("tessera_exl3_q_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "in");
  // Source tensors in Hugging Face [out, in] layout.
  auto up = verify::randn(256 * 128, seed + 1, 0.02f);       // BF16 [256, 128]
  auto down = verify::randn(128 * 128, seed + 3, 1.0f);      // FP8 [128, 128] with a 1×1 block scale
  auto head = verify::randn(128 * 128, seed + 4, 0.03f);     // F32 [128, 128]
  auto norm = verify::randn(128, seed + 5, 1.0f);
  auto emb = verify::randn(128 * 128, seed + 6, 1.0f);
  auto router = verify::randn(128 * 128, seed + 7, 1.0f);
  io::SafetensorsWriter w;
  BOOST_TEST_REQUIRE(w.add("model.layers.0.mlp.up_proj.weight", host_tensor(DType::kBf16, {256, 128}, up)).ok());
  BOOST_TEST_REQUIRE(w.add("model.layers.0.mlp.down_proj.weight", host_tensor(DType::kF8E4m3, {128, 128}, down)).ok());
  BOOST_TEST_REQUIRE(w.add("model.layers.0.mlp.down_proj.weight_scale_inv", host_tensor(DType::kF32, {1, 1}, {0.01f})).ok());
  BOOST_TEST_REQUIRE(w.add("lm_head.weight", host_tensor(DType::kF32, {128, 128}, head)).ok());
  BOOST_TEST_REQUIRE(w.add("model.norm.weight", host_tensor(DType::kF32, {128}, norm)).ok());
  BOOST_TEST_REQUIRE(w.add("model.embed_tokens.weight", host_tensor(DType::kBf16, {128, 128}, emb)).ok());
  BOOST_TEST_REQUIRE(w.add("model.layers.0.mlp.gate.weight", host_tensor(DType::kF32, {128, 128}, router)).ok());
  BOOST_TEST_REQUIRE(w.write((dir / "in" / "model.safetensors").string()).ok());
  std::ofstream(dir / "in" / "config.json")
      << R"({"model_type":"toy","quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}})";

  ops::Exl3CheckpointQuantOptions opt;
  opt.in = (dir / "in").string();
  opt.out = (dir / "out").string();
  opt.bits = 2.5;
  opt.head_bits = 3;
  opt.sample_tiles = 4;
  auto r = ops::exl3_quantize_checkpoint(opt);
  BOOST_TEST_REQUIRE(r.ok(), r.status().to_string());
  BOOST_TEST(r->tensors.size() == 3u);
  BOOST_TEST(r->copied.size() == 3u);
  BOOST_TEST((r->avg_bits > 2.0 && r->avg_bits <= 2.5), "average bits " << r->avg_bits);

  auto ck = io::Checkpoint::open(opt.out);
  BOOST_TEST_REQUIRE(ck.ok(), ck.status().to_string());
  auto groups = ops::load_exl3_groups(ops::exl3_source(*ck));
  BOOST_TEST_REQUIRE(groups.ok(), groups.status().to_string());
  BOOST_TEST_REQUIRE(groups->size() == 3u);
  auto src = io::Checkpoint::open(opt.in).value_or_throw();
  for (auto const& t : r->tensors) {
    ops::Exl3Group const* g = nullptr;
    for (auto const& x : *groups) if (x.prefix == t.prefix) g = &x;
    BOOST_TEST_REQUIRE(g != nullptr, t.prefix);
    BOOST_TEST(g->desc.k2 == 2 * t.bits);
    BOOST_TEST((g->desc.codebook == exl3::Codebook::kMul1));
    BOOST_TEST(g->desc.k == t.k);
    BOOST_TEST(g->desc.n == t.n);
    if (t.name == "lm_head.weight") BOOST_TEST(t.bits == 3);
    else BOOST_TEST((t.bits == 2 || t.bits == 3));
    // The source weight as [k, n], FP8 scaled, against the stored layer: the report's error.
    Tensor s = src.load_f32(t.name).value_or_throw();
    float const scale = t.name.find("down_proj") != std::string::npos ? 0.01f : 1.f;
    std::vector<float> kn(static_cast<size_t>(t.k * t.n));
    for (int64_t oo = 0; oo < t.n; ++oo)
      for (int64_t i = 0; i < t.k; ++i) kn[i * t.n + oo] = s.data_as<float>()[oo * t.k + i] * scale;
    double const e = rel_mse(stored_dense(*g), kn);
    BOOST_TEST(std::abs(e - t.rel_mse) <= 1e-9 * t.rel_mse, t.name << ": " << e << " vs reported " << t.rel_mse);
    BOOST_TEST(e < (t.bits == 2 ? 0.09 : 0.035), t.name << " relative MSE " << e);
  }
  for (char const* name : {"model.norm.weight", "model.embed_tokens.weight", "model.layers.0.mlp.gate.weight"}) {
    auto a = ck->view(name);
    auto b = src.view(name);
    BOOST_TEST_REQUIRE((a.ok() && b.ok()));
    BOOST_TEST((a->nbytes() == b->nbytes() && std::memcmp(a->data, b->data, a->nbytes()) == 0), name);
  }
  std::ifstream cf(dir / "out" / "config.json");
  std::stringstream ss;
  ss << cf.rdbuf();
  auto qc = ops::parse_exl3_quant_config(ss.str());
  BOOST_TEST_REQUIRE(qc.ok(), qc.status().to_string());
  BOOST_TEST(qc->codebook == "mul1");
  BOOST_TEST(qc->head_bits == 3);
  BOOST_TEST(std::abs(qc->bits - r->avg_bits) < 0.006);
  BOOST_TEST(ss.str().find("original_quantization_config") != std::string::npos);

  // A rerun with the same options resumes: nothing is quantized again, the report is unchanged.
  auto r2 = ops::exl3_quantize_checkpoint(opt);
  BOOST_TEST_REQUIRE(r2.ok(), r2.status().to_string());
  for (size_t i = 0; i < r2->tensors.size(); ++i) {
    BOOST_TEST(r2->tensors[i].resumed);
    BOOST_TEST(r2->tensors[i].rel_mse == r->tensors[i].rel_mse);
    BOOST_TEST(r2->tensors[i].bits == r->tensors[i].bits);
  }
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(fixture_weights_reach_fixture_quality) {
  // golden_exl3.py's own quantizer (same algorithm, different random signs): mul1 K4 and 3inst K2 at
  // 128×128; ours must be within 15% of its relative MSE (manifest.json rel_mse_vs_w_orig).
  std::string const dir = verify::golden_dir() + "/exl3/";
  auto f = io::SafetensorsFile::open(dir + "exl3_golden_quantized.safetensors");
  BOOST_TEST_REQUIRE(f.ok(), f.status().to_string());
  std::ifstream mf(dir + "manifest.json");
  std::stringstream ss;
  ss << mf.rdbuf();
  auto manifest = boost::json::parse(ss.str()).as_object();
  auto const& fixtures = manifest.at("files").at("exl3_golden_quantized.safetensors").at("fixtures").as_array();
  BOOST_TEST_REQUIRE(fixtures.size() == 2u);
  for (auto const& fv : fixtures) {
    auto const& fx = fv.as_object();
    std::string const prefix(fx.at("prefix").as_string());
    double const theirs = fx.at("rel_mse_vs_w_orig").to_number<double>();
    int const bits = static_cast<int>(fx.at("bits").to_number<double>());
    auto cb = fx.at("codebook").as_string() == "mul1" ? exl3::Codebook::kMul1 : exl3::Codebook::k3Inst;
    auto v = f->view("golden." + prefix + ".w_orig");
    BOOST_TEST_REQUIRE(v.ok());
    auto const* w = static_cast<float const*>(v->data);
    auto q = ops::exl3_quantize(w, 128, 128, bits, cb, 11);
    std::printf("%s: relative MSE %.5f (fixture quantizer %.5f)\n", prefix.c_str(), q.rel_mse, theirs);
    BOOST_TEST(q.rel_mse <= 1.15 * theirs, prefix << ": " << q.rel_mse << " vs " << theirs);
  }
}

BOOST_AUTO_TEST_SUITE_END()

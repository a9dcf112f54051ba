// SPDX-License-Identifier: Apache-2.0
/// Weight-layout detection: EXL3 groups of the golden fixtures agree with the generator's manifest
/// (prefix, codebook, K, k, n, half-rate flag); bits with scales follow K + (2k+2n+marker)·8/(k·n);
/// synthetic native FP8 / FP4 / Engram checkpoints classify; malformed groups and scales are refused.
#include <boost/test/unit_test.hpp>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "tessera/io/layout.hpp"
#include "tessera/io/safetensors.hpp"
#include "verify/common/golden.hpp"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::io;

namespace {

TensorInfo info(std::string name, DType dt, std::vector<int64_t> shape) {
  TensorInfo t;
  t.name = std::move(name);
  t.dtype = dt;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.nbytes = static_cast<size_t>(n) * dtype_size(dt);
  t.file = "mem";
  return t;
}

/// A valid EXL3 group P with k=256, n=128, K=3, MUL1 marker and a bias.
std::vector<TensorInfo> exl3(std::string const& p) {
  return {info(p + ".trellis", DType::kI16, {16, 8, 48}), info(p + ".suh", DType::kF16, {256}),
          info(p + ".svh", DType::kF16, {128}), info(p + ".mul1", DType::kI32, {}),
          info(p + ".bias", DType::kF16, {128})};
}

void expect_error(std::vector<TensorInfo> const& ts, std::string const& needle) {
  auto r = detect_layout(ts);
  BOOST_TEST_INFO("expected: " << needle);
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST_INFO("message: " << r.status().message());
  BOOST_TEST((r.status().code() == StatusCode::kMalformedInput));
  BOOST_TEST(r.status().message().find(needle) != std::string::npos);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(io_layout)

BOOST_AUTO_TEST_CASE(golden_exl3_matches_manifest) {
  std::string const dir = verify::golden_dir() + "/exl3/";
  std::ifstream in(dir + "manifest.json");
  std::stringstream ss;
  ss << in.rdbuf();
  auto manifest = boost::json::parse(ss.str()).as_object();
  int files_checked = 0;
  for (auto const& [fname, fv] : manifest.at("files").as_object()) {
    auto ck = Checkpoint::open(dir + std::string(fname));
    BOOST_REQUIRE_MESSAGE(ck.ok(), ck.status().to_string());
    auto rep = detect_layout(ck->tensors());
    BOOST_REQUIRE_MESSAGE(rep.ok(), rep.status().to_string());
    auto const& fixtures = fv.as_object().at("fixtures").as_array();
    BOOST_TEST(rep->exl3_groups.size() == fixtures.size());
    BOOST_TEST((rep->layout == (fixtures.empty() ? WeightLayout::kDense : WeightLayout::kExl3)));
    std::map<std::string, Exl3Group> by_prefix;
    for (auto const& g : rep->exl3_groups) by_prefix[g.prefix] = g;
    for (auto const& fx : fixtures) {
      auto const& o = fx.as_object();
      std::string prefix(o.at("prefix").as_string());
      BOOST_REQUIRE_MESSAGE(by_prefix.count(prefix), prefix);
      Exl3Group const& g = by_prefix[prefix];
      BOOST_TEST(g.bits == o.at("bits").to_number<double>(), prefix);
      BOOST_TEST(g.in_features == o.at("k").to_number<int64_t>());
      BOOST_TEST(g.out_features == o.at("n").to_number<int64_t>());
      BOOST_TEST(std::string(to_string(g.codebook)) == std::string(o.at("codebook").as_string()));
      BOOST_TEST(g.half_rate_unverified == o.at("half_rate_unverified").as_bool());
      // Trellis bytes = k·n·K/8; overhead = suh + svh (2 bytes each) + marker (4 bytes) + bias (2 bytes each).
      double kn = static_cast<double>(g.in_features * g.out_features);
      BOOST_TEST(static_cast<double>(g.trellis_bytes) == kn * g.bits / 8.0);
      size_t overhead = 2 * static_cast<size_t>(g.in_features + g.out_features) +
                        (g.codebook == Exl3Codebook::k3Inst ? 0 : 4) + (g.has_bias ? 2 * static_cast<size_t>(g.out_features) : 0);
      BOOST_TEST(g.overhead_bytes == overhead);
      BOOST_TEST(g.bits_with_scales == g.bits + static_cast<double>(overhead) * 8.0 / kn);
      BOOST_TEST(g.has_bias == (std::string(o.at("mode").as_string()) != "random-trellis"));
    }
    ++files_checked;
  }
  BOOST_TEST(files_checked == 4);
  // The golden markers carry the spec's values; a changed value is flagged.
  auto ck = Checkpoint::open(dir + "exl3_golden_128x128.safetensors").value_or_throw();
  auto rep = detect_layout(ck).value_or_throw();
  for (auto const& g : rep.exl3_groups) BOOST_TEST(g.marker_value_ok, g.prefix);
  fs::path tmp = fs::temp_directory_path() / ("tessera_marker_" + std::to_string(::getpid()) + ".safetensors");
  SafetensorsWriter w;
  for (char const* part : {"trellis", "suh", "svh"}) BOOST_REQUIRE(w.add(std::string("m.") + part, ck.load(std::string("mul1_K2.") + part).value_or_throw()).ok());
  Tensor marker = Tensor::zeros(DType::kI32, {});
  marker.data_as<int32_t>()[0] = 12345;
  BOOST_REQUIRE(w.add("m.mul1", marker).ok());
  BOOST_REQUIRE(w.write(tmp.string()).ok());
  auto odd = detect_layout(Checkpoint::open(tmp.string()).value_or_throw()).value_or_throw();
  fs::remove(tmp);
  BOOST_REQUIRE(odd.exl3_groups.size() == 1u);
  BOOST_TEST(!odd.exl3_groups[0].marker_value_ok);
}

BOOST_AUTO_TEST_CASE(golden_tiny_is_dense) {
  auto ck = Checkpoint::open(verify::golden_dir() + "/v41-tiny/bf16").value_or_throw();
  auto rep = detect_layout(ck.tensors()).value_or_throw();
  BOOST_TEST((rep.layout == WeightLayout::kDense));
  BOOST_TEST(rep.dense_dtypes["bf16"] == 289);
  BOOST_TEST(rep.dense_dtypes["f32"] == 63);
  BOOST_TEST(rep.exl3_groups.empty());
  for (auto k : rep.kinds) BOOST_TEST((k == TensorKind::kDense));
}

BOOST_AUTO_TEST_CASE(native_fp8_fp4_engram) {
  std::vector<TensorInfo> ts = {
      info("layers.0.attn.wq_a.weight", DType::kF8E4m3, {70, 96}),  // 32×32 blocks, ragged rows
      info("layers.0.attn.wq_a.scale", DType::kE8m0, {3, 3}),
      info("layers.0.ffn.experts.0.w1.weight", DType::kI8, {64, 48}),  // 96 FP4 columns
      info("layers.0.ffn.experts.0.w1.scale", DType::kE8m0, {64, 3}),
      info("layers.1.engram.embed.weight", DType::kF8E4m3, {100, 64}),
      info("layers.1.engram.embed.scale", DType::kE8m0, {100, 2}),
      info("layers.0.attn_norm.weight", DType::kBf16, {64}),
      info("layers.0.hc_attn_fn", DType::kF32, {24, 256}),
  };
  auto rep = detect_layout(ts);
  BOOST_REQUIRE_MESSAGE(rep.ok(), rep.status().to_string());
  BOOST_TEST((rep->layout == WeightLayout::kNativeFp8));
  std::vector<TensorKind> want = {TensorKind::kFp8Weight, TensorKind::kFp8Scale, TensorKind::kFp4Weight,
                                  TensorKind::kFp4Scale, TensorKind::kEngramFp8Table, TensorKind::kEngramScale,
                                  TensorKind::kDense, TensorKind::kDense};
  BOOST_TEST((rep->kinds == want));
  BOOST_TEST(rep->fp8_params == 70 * 96);
  BOOST_TEST(rep->fp4_params == 64 * 96);
  BOOST_TEST(rep->engram_fp8_params == 100 * 64);
  BOOST_TEST(rep->dense_params == 64 + 24 * 256);
  // Engram tables alone (float linears) leave the layout dense; EXL3 + FP8 is mixed.
  std::vector<TensorInfo> eng(ts.begin() + 4, ts.end());
  BOOST_TEST((detect_layout(eng)->layout == WeightLayout::kDense));
  auto mixed = ts;
  for (auto& t : exl3("layers.2.attn.wo_b")) mixed.push_back(t);
  auto m = detect_layout(mixed);
  BOOST_REQUIRE(m.ok());
  BOOST_TEST((m->layout == WeightLayout::kMixed));
  auto only = exl3("layers.2.attn.wo_b");
  only.push_back(info("model.embed.weight", DType::kBf16, {512, 64}));
  auto e = detect_layout(only).value_or_throw();
  BOOST_TEST((e.layout == WeightLayout::kExl3));
  BOOST_REQUIRE(e.exl3_groups.size() == 1u);
  BOOST_TEST(e.exl3_groups[0].bits == 3.0);
  BOOST_TEST((e.exl3_groups[0].codebook == Exl3Codebook::kMul1));
  BOOST_TEST(e.exl3_avg_bits == 3.0);
  // Legacy packed signs.
  std::vector<TensorInfo> legacy = {info("p.trellis", DType::kI16, {8, 8, 32}), info("p.su", DType::kI16, {8}),
                                    info("p.sv", DType::kI16, {8})};
  auto l = detect_layout(legacy).value_or_throw();
  BOOST_TEST(l.exl3_groups[0].legacy_signs);
  BOOST_TEST((l.kinds[1] == TensorKind::kExl3Su));
}

BOOST_AUTO_TEST_CASE(malformed_groups_and_scales) {
  auto g = exl3("P");
  auto with = [&](size_t i, TensorInfo t) { auto v = g; v[i] = std::move(t); return v; };
  auto without = [&](size_t i) { auto v = g; v.erase(v.begin() + static_cast<long>(i)); return v; };
  expect_error(with(0, info("P.trellis", DType::kI32, {16, 8, 48})), "tensor 'P.trellis' must be I16 of rank 3");
  expect_error(with(0, info("P.trellis", DType::kI16, {16, 8, 50})), "has last dimension 50");
  expect_error(with(0, info("P.trellis", DType::kI16, {16, 8, 144})), "has last dimension 144");
  expect_error(with(0, info("P.trellis", DType::kI16, {12, 8, 48})), "k = 192, n = 128");
  expect_error(without(1), "has neither 'P.suh' nor 'P.su'");
  expect_error(without(2), "has neither 'P.svh' nor 'P.sv'");
  expect_error(with(1, info("P.suh", DType::kF16, {128})), "tensor 'P.suh' must be F16 [256]");
  expect_error(with(2, info("P.svh", DType::kF32, {128})), "tensor 'P.svh' must be F16 [128]");
  expect_error(with(3, info("P.mul1", DType::kI32, {1})), "tensor 'P.mul1' must be an I32 scalar");
  expect_error(with(4, info("P.bias", DType::kF16, {256})), "tensor 'P.bias' must be F16/F32/BF16 [128]");
  auto both = g;
  both.push_back(info("P.mcg", DType::kI32, {}));
  expect_error(both, "'P.mul1' are both present");
  auto su_too = g;
  su_too.push_back(info("P.su", DType::kI16, {16}));
  expect_error(su_too, "'P.su' are both present");
  auto half = without(3);
  half[0] = info("P.trellis", DType::kI16, {16, 8, 40});
  expect_error(half, "half-integer rate, which exists only with the mul1 codebook");
  expect_error({info("w.weight", DType::kF8E4m3, {64, 64})}, "tensor 'w.weight' is F8_E4M3 but has no 'w.scale'");
  expect_error({info("w.weight", DType::kF8E4m3, {64, 64}), info("w.scale", DType::kF32, {2, 2})}, "not F8_E8M0");
  expect_error({info("w.weight", DType::kF8E4m3, {64, 64}), info("w.scale", DType::kE8m0, {2, 3})},
               "tensor 'w.scale' should be [2, 2] (32x32 blocks");
  expect_error({info("e.weight", DType::kI8, {64, 48}), info("e.scale", DType::kE8m0, {64, 2})},
               "tensor 'e.scale' should be [64, 3]");
  // A lone .trellis (no scales) is not a group.
  auto lone = detect_layout({info("example.k4.trellis", DType::kI16, {64})}).value_or_throw();
  BOOST_TEST((lone.layout == WeightLayout::kDense));
}

BOOST_AUTO_TEST_SUITE_END()

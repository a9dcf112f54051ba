// SPDX-License-Identifier: Apache-2.0
/// EXL3 loader tests (spec/exl3.md §1 loader checklist) on checkpoints built in memory: detection,
/// codebook markers, K from the trellis shape, legacy packed signs, bias conversion, expert indices,
/// half-rate refusal, and a clear error naming the tensor for every malformed group.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tessera/ops/exl3.hpp"
#include "tessera/ops/exl3_loader.hpp"

using namespace tessera;
using tessera::ops::Exl3TensorSource;

namespace {

struct Mem {
  struct T { DType dtype; std::vector<int64_t> shape; std::vector<char> bytes; };
  std::map<std::string, T> t;
  template <class V>
  void add(std::string const& name, DType dt, std::vector<int64_t> shape, V fill) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    T x{dt, shape, std::vector<char>(static_cast<size_t>(n) * dtype_size(dt))};
    for (int64_t i = 0; i < n; ++i) {
      auto v = fill(i);
      std::memcpy(x.bytes.data() + i * dtype_size(dt), &v, dtype_size(dt));
    }
    t[name] = std::move(x);
  }
  void group(std::string const& p, int64_t k, int64_t n, int64_t last, char const* marker) {
    add(p + ".trellis", DType::kI16, {k / 16, n / 16, last}, [](int64_t i) { return static_cast<int16_t>(i * 7919); });
    add(p + ".suh", DType::kF16, {k}, [](int64_t) { return uint16_t{0x2000}; });
    add(p + ".svh", DType::kF16, {n}, [](int64_t) { return uint16_t{0x3C00}; });
    if (marker) {
      uint32_t v = std::string(marker) == "mul1" ? exl3::kMulMul1 : exl3::kMulMcg;
      add(p + "." + marker, DType::kI32, {}, [v](int64_t) { return v; });
    }
  }
  Exl3TensorSource source() const {
    Exl3TensorSource s;
    for (auto const& kv : t) s.names.push_back(kv.first);
    s.view = [this](std::string const& name) -> Result<AnyTensorView> {
      auto it = t.find(name);
      if (it == t.end()) return not_found(name);
      AnyTensorView v;
      v.data = const_cast<char*>(it->second.bytes.data());
      v.dtype = it->second.dtype;
      v.rank = static_cast<int>(it->second.shape.size());
      int64_t acc = 1;
      for (int i = v.rank - 1; i >= 0; --i) { v.shape[i] = it->second.shape[i]; v.stride[i] = acc; acc *= v.shape[i]; }
      return v;
    };
    return s;
  }
};

std::string load_error(Mem const& m, ops::Exl3LoadOptions opt = {}) {
  auto r = ops::load_exl3_groups(m.source(), opt);
  return r.ok() ? std::string("ok") : r.status().message();
}

bool has(std::string const& s, std::string const& sub) { return s.find(sub) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_SUITE(exl3_loader)

BOOST_AUTO_TEST_CASE(detects_groups_codebooks_and_rates) {
  Mem m;
  m.group("layers.0.attn.wq", 256, 128, 48, "mul1");              // K = 3, MUL1
  m.group("layers.1.ffn.experts.17.w1", 128, 384, 16, "mcg");     // K = 1, MCG, expert 17
  m.group("head", 128, 256, 128, nullptr);                        // K = 8, 3INST
  m.add("head.bias", DType::kF32, {256}, [](int64_t i) { return 0.5f + static_cast<float>(i); });
  m.add("norm.weight", DType::kF32, {128}, [](int64_t) { return 1.f; });
  auto r = ops::load_exl3_groups(m.source());
  BOOST_TEST_REQUIRE(r.ok(), r.status().to_string());
  BOOST_TEST_REQUIRE(r->size() == 3u);
  auto const& head = (*r)[0];
  auto const& wq = (*r)[1];
  auto const& w1 = (*r)[2];
  BOOST_TEST(head.prefix == "head");
  BOOST_TEST(head.desc.k2 == 16);
  BOOST_TEST((head.desc.codebook == exl3::Codebook::k3Inst));
  BOOST_TEST(head.bias.size() == 256u);
  BOOST_TEST(head.bias[3] == f16_bits_from_float(3.5f));
  BOOST_TEST(wq.desc.k == 256);
  BOOST_TEST(wq.desc.n == 128);
  BOOST_TEST(wq.desc.k2 == 6);
  BOOST_TEST((wq.desc.codebook == exl3::Codebook::kMul1));
  BOOST_TEST(wq.expert == -1);
  BOOST_TEST(w1.expert == 17);
  BOOST_TEST((w1.desc.codebook == exl3::Codebook::kMcg));
  BOOST_TEST(w1.desc.k2 == 2);
  BOOST_TEST(w1.suh[5] == 0x2000);
  BOOST_TEST(ops::exl3_expert_index("layers.3.ffn.experts.x.w1") == -1);
  BOOST_TEST(ops::exl3_expert_index("model.layers.3.mlp.experts.250.up_proj") == 250);
}

BOOST_AUTO_TEST_CASE(legacy_packed_signs) {
  Mem m;
  m.add("p.trellis", DType::kI16, {8, 8, 32}, [](int64_t i) { return static_cast<int16_t>(i); });
  m.add("p.su", DType::kI16, {8}, [](int64_t i) { return static_cast<uint16_t>(i == 1 ? 0x0005 : 0); });
  m.add("p.sv", DType::kI16, {8}, [](int64_t) { return uint16_t{0x8000}; });
  auto r = ops::load_exl3_groups(m.source());
  BOOST_TEST_REQUIRE(r.ok(), r.status().to_string());
  auto const& g = (*r)[0];
  BOOST_TEST(g.legacy_signs);
  BOOST_TEST(g.suh[16] == 0xBC00);   // word 1 bit 0 set → −1
  BOOST_TEST(g.suh[17] == 0x3C00);
  BOOST_TEST(g.suh[18] == 0xBC00);
  BOOST_TEST(g.svh[15] == 0xBC00);
  BOOST_TEST(g.svh[14] == 0x3C00);
}

BOOST_AUTO_TEST_CASE(half_rates_refused_unless_allowed) {
  Mem m;
  m.group("p", 128, 128, 40, "mul1");   // 2.5 bits
  std::string e = load_error(m);
  BOOST_TEST(has(e, "p.trellis"), e);
  BOOST_TEST(has(e, "unverified"), e);
  ops::Exl3LoadOptions opt;
  opt.allow_half_rates = true;
  auto r = ops::load_exl3_groups(m.source(), opt);
  BOOST_TEST_REQUIRE(r.ok());
  BOOST_TEST((*r)[0].desc.k2 == 5);
  Mem m3;
  m3.group("q", 128, 128, 40, nullptr);  // half rate without MUL1
  BOOST_TEST(has(load_error(m3, opt), "mul1 marker"));
}

BOOST_AUTO_TEST_CASE(malformed_groups_name_the_tensor) {
  {
    Mem m; m.group("a", 128, 128, 48, nullptr); m.t.erase("a.svh");
    std::string e = load_error(m);
    BOOST_TEST((has(e, "a.svh") && has(e, "missing")), e);
  }
  {
    Mem m; m.group("b", 128, 128, 48, "mul1");
    m.add("b.mcg", DType::kI32, {}, [](int64_t) { return exl3::kMulMcg; });
    BOOST_TEST(has(load_error(m), "both"));
  }
  {
    Mem m; m.group("c", 128, 128, 144, nullptr);   // K = 9
    std::string e = load_error(m);
    BOOST_TEST((has(e, "c.trellis") && has(e, "144")), e);
  }
  {
    Mem m; m.group("d", 96, 128, 32, nullptr);     // k = 96
    std::string e = load_error(m);
    BOOST_TEST((has(e, "d.trellis") && has(e, "128")), e);
  }
  {
    Mem m; m.group("e", 128, 128, 32, nullptr);
    m.add("e.suh", DType::kF16, {64}, [](int64_t) { return uint16_t{0x3C00}; });
    std::string e = load_error(m);
    BOOST_TEST((has(e, "e.suh") && has(e, "[64]")), e);
  }
  {
    Mem m; m.group("f", 128, 128, 32, nullptr);
    m.add("g.suh", DType::kF16, {128}, [](int64_t) { return uint16_t{0x3C00}; });
    BOOST_TEST(has(load_error(m), "g.suh"));
  }
  {
    Mem m; m.group("h", 128, 128, 32, "mul1");
    m.add("h.mul1", DType::kI32, {}, [](int64_t) { return 12345; });
    std::string e = load_error(m);
    BOOST_TEST((has(e, "h.mul1") && has(e, "12345")), e);
  }
  {
    Mem m; m.group("i", 128, 128, 32, nullptr);
    m.add("i.trellis", DType::kF16, {8, 8, 32}, [](int64_t) { return uint16_t{0}; });
    BOOST_TEST(has(load_error(m), "i.trellis"));
  }
}

BOOST_AUTO_TEST_CASE(quantization_config) {
  auto c = ops::parse_exl3_quant_config(
      R"({"model_type":"x","quantization_config":{"quant_method":"exl3","version":"1.4.1","bits":2.8,"head_bits":6,"codebook":"mul1","out_scales":"always","calibration":{"rows":250,"cols":2048}}})");
  BOOST_TEST_REQUIRE(c.ok(), c.status().to_string());
  BOOST_TEST(c->bits == 2.8);
  BOOST_TEST(c->head_bits == 6);
  BOOST_TEST(c->codebook == "mul1");
  BOOST_TEST(c->version == "1.4.1");
  BOOST_TEST((ops::parse_exl3_quant_config(R"({"a":1})").status().code() == StatusCode::kNotFound));
  BOOST_TEST(!ops::parse_exl3_quant_config(R"({"quantization_config":{"quant_method":"fp8"}})").ok());
  BOOST_TEST(!ops::parse_exl3_quant_config(R"({"quantization_config":{"quant_method":"exl3","bits":"x"}})").ok());
  BOOST_TEST(!ops::parse_exl3_quant_config("{not json").ok());
}

BOOST_AUTO_TEST_CASE(dequant_transposed_is_the_transpose) {
  // Exl3Dequant with `transposed` writes W'ᵀ [n, k]: element (j, i) equals W'(i, j), every codebook.
  int64_t const k = 256, n = 128;
  for (int cb = 0; cb < 3; ++cb) {
    int const k2 = 6;
    std::mt19937_64 g(91 + cb);
    std::vector<int16_t> trellis(static_cast<size_t>((k / 16) * (n / 16) * 8 * k2));
    for (auto& v : trellis) v = static_cast<int16_t>(g());
    ops::Exl3LayerDesc const d{k, n, k2, static_cast<exl3::Codebook>(cb)};
    std::vector<uint16_t> w(static_cast<size_t>(k * n)), wt(w.size());
    TensorView<int16_t const, 3> tv(trellis.data(), {k / 16, n / 16, 8 * k2}, Device::kCpu);
    ExecContext ctx;
    Status s = ops::Exl3Dequant<Backend::kCpu>::run(d, {tv, TensorView<Fp16, 2>(reinterpret_cast<Fp16*>(w.data()), {k, n}, Device::kCpu)}, ctx);
    BOOST_TEST_REQUIRE(s.ok(), s.to_string());
    s = ops::Exl3Dequant<Backend::kCpu>::run(d, {tv, TensorView<Fp16, 2>(reinterpret_cast<Fp16*>(wt.data()), {n, k}, Device::kCpu), true}, ctx);
    BOOST_TEST_REQUIRE(s.ok(), s.to_string());
    bool same = true;
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < n; ++j) same = same && wt[static_cast<size_t>(j * k + i)] == w[static_cast<size_t>(i * n + j)];
    BOOST_TEST(same, "cb " << cb);
    s = ops::Exl3Dequant<Backend::kCpu>::run(d, {tv, TensorView<Fp16, 2>(reinterpret_cast<Fp16*>(wt.data()), {k, n}, Device::kCpu), true}, ctx);
    BOOST_TEST(!s.ok(), "a [k, n] view is refused when transposed");
  }
}

BOOST_AUTO_TEST_SUITE_END()

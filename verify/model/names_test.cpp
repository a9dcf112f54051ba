// SPDX-License-Identifier: Apache-2.0
/// Loading by NEW (spec §8.2) and native names gives the same model as the OLD golden names: the golden
/// weights are served under renamed keys (NEW: fused gate_up_proj/down_proj experts, attn_hc/ffn_hc,
/// self_attn.*, mlp.*, model.engram_tables.<i>; native: no `model.` prefix, head.weight) and the logits
/// must be bit-identical.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <map>
#include <regex>

#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;
using tessera::model::SequenceStep;

namespace {

/// Serves `base` under renamed keys: name → (base name) or a fused expert tensor built on the fly.
class RenamedSource final : public WeightSource {
 public:
  RenamedSource(WeightSource const& base, bool new_names) : base_(base) {
    auto const& names = all_names();
    for (auto const& n : names) {
      std::string r = new_names ? to_new(n) : to_native(n);
      if (!r.empty()) map_[r] = n;
    }
    if (new_names)
      for (int l = 0; l < 7; ++l) {
        fused_["model.layers." + std::to_string(l) + ".mlp.experts.gate_up_proj"] = {l, true};
        fused_["model.layers." + std::to_string(l) + ".mlp.experts.down_proj"] = {l, false};
      }
  }
  bool contains(std::string const& n) const override { return map_.count(n) || fused_.count(n); }
  Result<std::vector<int64_t>> shape(std::string const& n) const override {
    if (auto f = fused_.find(n); f != fused_.end()) return f->second.second ? std::vector<int64_t>{8, 128, 64} : std::vector<int64_t>{8, 64, 64};
    auto it = map_.find(n);
    if (it == map_.end()) return not_found(n);
    return base_.shape(it->second);
  }
  Result<DType> dtype(std::string const& n) const override {
    auto it = map_.find(n);
    return it == map_.end() ? Result<DType>(DType::kF32) : base_.dtype(it->second);
  }
  Result<Tensor> load_f32(std::string const& n) const override {
    if (auto f = fused_.find(n); f != fused_.end()) {
      int l = f->second.first;
      bool gu = f->second.second;
      Tensor out = Tensor::zeros(DType::kF32, gu ? std::vector<int64_t>{8, 128, 64} : std::vector<int64_t>{8, 64, 64});
      for (int e = 0; e < 8; ++e) {
        std::string p = "model.layers." + std::to_string(l) + ".ffn.experts." + std::to_string(e) + ".";
        std::vector<std::string> parts = gu ? std::vector<std::string>{p + "w1.weight", p + "w3.weight"} : std::vector<std::string>{p + "w2.weight"};
        size_t off = static_cast<size_t>(e) * (gu ? 128 : 64) * 64;
        for (auto const& part : parts) {
          Tensor t = base_.load_f32(part).value_or_throw();
          std::memcpy(out.data_as<float>() + off, t.data(), t.nbytes());
          off += static_cast<size_t>(t.numel());
        }
      }
      return out;
    }
    auto it = map_.find(n);
    if (it == map_.end()) return not_found(n);
    return base_.load_f32(it->second);
  }
  Result<Tensor> load_i64(std::string const& n) const override {
    auto it = map_.find(n);
    return it == map_.end() ? Result<Tensor>(not_found(n)) : base_.load_i64(it->second);
  }
  std::string describe() const override { return "renamed(" + base_.describe() + ")"; }

 private:
  static std::vector<std::string> const& all_names() {
    static std::vector<std::string> names = [] {
      std::vector<std::string> v;
      auto ck = io::Checkpoint::open(verify::tiny_dir("fp32") + "/model.safetensors").value_or_throw();
      for (auto const& t : ck.tensors()) v.push_back(t.name);
      for (char const* s : {"static.engram.multipliers", "static.engram.token_map", "static.engram.primes", "static.engram.offsets"})
        v.push_back(s);
      return v;
    }();
    return names;
  }
  static std::string to_native(std::string n) {
    if (n.rfind("static.", 0) == 0) return n;
    if (n == "lm_head.weight") return "head.weight";
    return n.substr(6);  // drop "model."
  }
  static std::string to_new(std::string n) {
    if (n.rfind("static.", 0) == 0) return n;
    if (std::regex_search(n, std::regex(R"(ffn\.experts\.)"))) return "";  // served fused
    static std::pair<char const*, char const*> const rules[] = {
        {R"(^model\.embed\.)", "model.embed_tokens."},
        {R"(\.attn_norm\.)", ".input_layernorm."}, {R"(\.ffn_norm\.)", ".post_attention_layernorm."},
        {R"(\.hc_attn_(fn|base|scale)$)", ".attn_hc.$1"}, {R"(\.hc_ffn_(fn|base|scale)$)", ".ffn_hc.$1"},
        {R"(\.attn\.compressor\.wkv\.)", ".self_attn.compressor.kv_proj."},
        {R"(\.attn\.compressor\.wgate\.)", ".self_attn.compressor.gate_proj."},
        {R"(\.attn\.compressor\.norm\.)", ".self_attn.compressor.kv_norm."},
        {R"(\.attn\.indexer\.wq_b\.)", ".self_attn.indexer.q_b_proj."}, {R"(\.attn\.indexer\.wk\.)", ".self_attn.indexer.k_proj."},
        {R"(\.attn\.indexer\.)", ".self_attn.indexer."},
        {R"(\.attn\.wq_a\.)", ".self_attn.q_a_proj."}, {R"(\.attn\.q_norm\.)", ".self_attn.q_a_norm."},
        {R"(\.attn\.wq_b\.)", ".self_attn.q_b_proj."}, {R"(\.attn\.wkv\.)", ".self_attn.kv_proj."},
        {R"(\.attn\.kv_norm\.)", ".self_attn.kv_norm."}, {R"(\.attn\.wo_a\.)", ".self_attn.o_a_proj."},
        {R"(\.attn\.wo_b\.)", ".self_attn.o_b_proj."}, {R"(\.attn\.attn_sink$)", ".self_attn.sinks"},
        {R"(\.ffn\.gate\.bias$)", ".mlp.gate.e_score_correction_bias"}, {R"(\.ffn\.gate\.bias_vl$)", ".mlp.gate.e_score_correction_bias_vl"},
        {R"(\.ffn\.gate\.weight$)", ".mlp.gate.weight"},
        {R"(\.ffn\.shared_experts\.w1\.)", ".mlp.shared_experts.gate_proj."}, {R"(\.ffn\.shared_experts\.w3\.)", ".mlp.shared_experts.up_proj."},
        {R"(\.ffn\.shared_experts\.w2\.)", ".mlp.shared_experts.down_proj."},
    };
    std::smatch m;
    if (std::regex_match(n, m, std::regex(R"(model\.layers\.(\d+)\.engram\.embed\.weight)")))
      return "model.engram_tables." + m[1].str() + ".weight";
    for (auto const& [re, rep] : rules) n = std::regex_replace(n, std::regex(re), rep);
    return n;
  }
  WeightSource const& base_;
  std::map<std::string, std::string> map_;
  std::map<std::string, std::pair<int, bool>> fused_;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(dsv41_names)

BOOST_AUTO_TEST_CASE(new_and_native_names_load_the_same_model) {
  auto const& base = verify::tiny_weights("fp32");
  auto& ref = verify::tiny_model("fp32");
  std::vector<int32_t> toks;
  for (auto t : verify::tiny_files("fp32").ints("prompt.5")) toks.push_back(static_cast<int32_t>(t));
  toks.resize(40);
  std::vector<float> want(40 * 512), got(40 * 512);
  auto s0 = ref.new_sequence();
  SequenceStep a{s0.get(), toks, 40, want.data()};
  BOOST_REQUIRE(ref.forward({&a, 1}).ok());
  for (bool new_names : {true, false}) {
    RenamedSource src(base, new_names);
    BOOST_TEST(src.contains(new_names ? "model.layers.3.self_attn.q_a_proj.weight" : "layers.3.attn.wq_a.weight"));
    auto m = Dsv41Model::create(tiny_golden_spec(), src, {}).value_or_throw();
    auto s1 = m->new_sequence();
    SequenceStep b{s1.get(), toks, 40, got.data()};
    BOOST_REQUIRE(m->forward({&b, 1}).ok());
    BOOST_TEST((std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0), (new_names ? "NEW" : "native"));
  }
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// DeepSeek-V4.1 config (spec/deepseek-v41.md §1.1, §6): the golden tiny config parses to the §6 values and
/// its derived fields equal what transformers derived (the golden's own `layer_types`, `dspark_target_layer_ids`,
/// `rope_parameters`); released defaults derive the released lists; every validation error fires.
#include <boost/test/unit_test.hpp>

#include <string>

#include "tessera/models/deepseek_v41/config.hpp"
#include "verify/common/golden.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;
using V = std::vector<int64_t>;

namespace {

void expect_error(std::string const& json, std::string const& needle) {
  auto r = parse_config(json);
  BOOST_TEST_INFO("config: " << json);
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST_INFO("message: " << r.status().message());
  BOOST_TEST((r.status().code() == StatusCode::kMalformedInput));
  BOOST_TEST(r.status().message().find(needle) != std::string::npos);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dsv41_config)

BOOST_AUTO_TEST_CASE(golden_tiny) {
  for (char const* variant : {"fp32", "bf16"}) {
    auto r = load_config(verify::golden_dir() + "/v41-tiny/" + variant);
    BOOST_REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    Config const& c = *r;
    BOOST_TEST(c.model_type == "deepseek_v41_text");
    BOOST_TEST(c.vocab_size == 512);
    BOOST_TEST(c.hidden_size == 64);
    BOOST_TEST(c.num_attention_heads == 4);
    BOOST_TEST(c.head_dim == 64);
    BOOST_TEST(c.qk_rope_head_dim == 16);
    BOOST_TEST(c.q_lora_rank == 32);
    BOOST_TEST(c.o_groups == 2);
    BOOST_TEST(c.o_lora_rank == 16);
    BOOST_TEST(c.num_hidden_layers == 7);
    BOOST_TEST((c.compress_ratios == V{0, 2, 2, 2, 1, 1, 1}));
    BOOST_TEST((c.kv_source_layer_ids == V{1, 4}));
    BOOST_TEST((c.index_source_layer_ids == V{1, 3, 4, 5}));
    BOOST_TEST(c.candidate_source_layer_id == 4);
    BOOST_TEST(c.candidate_topk_blocks == 3);
    BOOST_TEST(c.candidate_block_size == 4);
    BOOST_TEST(c.index_n_heads == 4);
    BOOST_TEST(c.index_head_dim == 32);
    BOOST_TEST(c.index_topk == 6);
    BOOST_TEST(c.sliding_window == 16);
    BOOST_TEST(c.max_position_embeddings == 512);
    BOOST_TEST(c.n_routed_experts == 8);
    BOOST_TEST(c.num_experts_per_tok == 2);
    BOOST_TEST(c.moe_intermediate_size == 64);
    BOOST_TEST(c.swiglu_limit == 0.6);
    BOOST_TEST(c.hc_mult == 4);
    BOOST_TEST(c.hc_sinkhorn_iters == 20);
    BOOST_TEST(c.hc_eps == 1e-6);
    BOOST_TEST(c.rms_norm_eps == 1e-20);
    BOOST_TEST((c.engram_layer_ids == V{1, 5}));
    BOOST_TEST((c.engram_num_embeddings == V{462, 630}));
    BOOST_TEST(c.engram_vocab_size == 64);
    BOOST_TEST(c.engram_n_heads == 2);
    BOOST_TEST(c.engram_head_dim == 32);
    BOOST_TEST(c.engram_compressed_vocab_size == 256);
    BOOST_TEST(c.num_nextn_predict_layers == 0);
    BOOST_TEST(c.eos_token_id.empty());
    BOOST_TEST(!c.bos_token_id.has_value());
    BOOST_TEST(c.initializer_range == 0.05);
    // Derived, as transformers derived them (recorded in the golden config).
    BOOST_TEST((c.dspark_target_layer_ids == V{3, 5, 6}));
    BOOST_TEST((c.layer_types == std::vector<std::string>{"sliding_attention", "shared_compressed_attention",
                                                          "sliding_attention", "sliding_attention",
                                                          "shared_compressed_attention", "sliding_attention",
                                                          "sliding_attention"}));
    BOOST_TEST(c.rope_main.rope_type == "default");
    BOOST_TEST(c.rope_main.rope_theta == 10000.0);
    BOOST_TEST(c.rope_main.partial_rotary_factor == 0.25);
    BOOST_TEST(c.rope_compress.rope_type == "yarn");
    BOOST_TEST(c.rope_compress.rope_theta == 160000.0);
    BOOST_TEST(c.rope_compress.factor == 4.0);
    BOOST_TEST(c.rope_compress.original_max_position_embeddings == 128);
    BOOST_TEST(c.rope_compress.beta_fast == 32.0);
    BOOST_TEST(c.rope_compress.beta_slow == 1.0);
    BOOST_TEST(c.rope_compress.attention_factor == 1.0);
    BOOST_TEST(!c.quantization_config.has_value());
    // The §6 preset equals the golden configuration.
    BOOST_TEST(to_json(tiny_config()) == to_json(c));
  }
}

BOOST_AUTO_TEST_CASE(released_defaults) {
  Config c = released_config();
  V ratios = {0, 0};
  ratios.insert(ratios.end(), 18, 2);
  ratios.insert(ratios.end(), 20, 1);
  ratios.insert(ratios.end(), 3, 0);  // num_nextn_predict_layers draft entries, padded with 0
  BOOST_TEST((c.compress_ratios == ratios));
  BOOST_TEST((c.kv_source_layer_ids == V{2, 8, 14, 20}));
  BOOST_TEST((c.index_source_layer_ids == V{2, 8, 14, 20, 24, 28, 32, 36}));
  BOOST_TEST(c.candidate_source_layer_id == 20);
  BOOST_TEST((c.dspark_target_layer_ids == V{37, 38, 39}));
  BOOST_TEST(c.layer_types.size() == 40u);
  BOOST_TEST(c.layer_types[2] == "shared_compressed_attention");
  BOOST_TEST(c.layer_types[3] == "sliding_attention");
  BOOST_TEST(c.engram_layer_ids.empty());
  BOOST_TEST(c.vocab_size == 129280);
  BOOST_TEST(c.rope_main.partial_rotary_factor == 0.125);
  BOOST_TEST(c.rope_compress.rope_type == "default");
  BOOST_TEST((c.eos_token_id == V{1}));
  // The released config.json: YaRN on compress, Engram at layers 1 and 14, FP8 quantization.
  auto r = parse_config(R"({"model_type":"deepseek_v41","image_token_id":129264,"text_config":{
      "rope_scaling":{"type":"yarn","factor":16,"beta_fast":32,"beta_slow":1,"original_max_position_embeddings":65536},
      "engram_layer_ids":[1,14],"engram_num_embeddings":[384006168,384016682],"num_local_experts":384,
      "compress_ratios":[0,0,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,0,0,0]},
      "quantization_config":{"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic",
      "weight_block_size":[32,32],"scale_fmt":"ue8m0","expert_dtype":"fp4"}})");
  BOOST_REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  BOOST_TEST((r->kv_source_layer_ids == V{2, 8, 14, 20}));
  BOOST_TEST(r->rope_compress.rope_type == "yarn");
  BOOST_TEST(r->rope_compress.factor == 16.0);
  BOOST_TEST(r->rope_compress.original_max_position_embeddings == 65536);
  BOOST_TEST(r->rope_compress.rope_theta == 160000.0);
  BOOST_TEST(r->rope_main.rope_type == "default");
  BOOST_TEST((r->engram_num_embeddings == V{384006168, 384016682}));
  BOOST_REQUIRE(r->quantization_config.has_value());
  BOOST_REQUIRE(r->quantization_config->fp8.has_value());
  BOOST_TEST((r->quantization_config->fp8->weight_block_size == V{32, 32}));
  BOOST_TEST(r->quantization_config->fp8->scale_fmt == "ue8m0");
  BOOST_TEST(r->quantization_config->fp8->expert_dtype == "fp4");
  // Round trip through to_json.
  auto back = parse_config(to_json(*r));
  BOOST_REQUIRE(back.ok());
  BOOST_TEST(to_json(*back) == to_json(*r));
}

BOOST_AUTO_TEST_CASE(derivations_small) {
  auto five = parse_config(R"({"num_hidden_layers":5,"num_nextn_predict_layers":0})").value_or_throw();
  BOOST_TEST((five.compress_ratios == V{0, 0, 2, 2, 1}));
  BOOST_TEST((five.kv_source_layer_ids == V{2, 4}));     // first layer of each run of equal non-zero ratios
  BOOST_TEST((five.index_source_layer_ids == V{2, 4}));  // a copy of the KV sources
  BOOST_TEST(five.candidate_source_layer_id == 4);       // the last KV source
  BOOST_TEST((five.dspark_target_layer_ids == V{0, 1, 3}));
  auto one = parse_config(R"({"num_hidden_layers":1,"num_nextn_predict_layers":0})").value_or_throw();
  BOOST_TEST((one.compress_ratios == V{0}));
  BOOST_TEST(one.kv_source_layer_ids.empty());
  BOOST_TEST(one.candidate_source_layer_id == -1);
  auto three = parse_config(R"({"num_hidden_layers":3})").value_or_throw();
  BOOST_TEST((three.compress_ratios == V{0, 0, 2, 0, 0, 0}));
  auto eng = parse_config(R"({"engram_layer_ids":[1,14]})").value_or_throw();
  BOOST_TEST((eng.engram_num_embeddings == V{0, 0}));
  auto eos = parse_config(R"({"eos_token_id":[1,2]})").value_or_throw();
  BOOST_TEST((eos.eos_token_id == V{1, 2}));
}

BOOST_AUTO_TEST_CASE(forms_and_preference) {
  // golden_text_config is preferred over text_config; text_config over the top level.
  auto g = parse_config(R"({"hidden_size":1,"text_config":{"hidden_size":2},"golden_text_config":{"hidden_size":3}})");
  BOOST_REQUIRE(g.ok());
  BOOST_TEST(g->hidden_size == 3);
  auto t = parse_config(R"({"hidden_size":1,"text_config":{"hidden_size":2}})");
  BOOST_TEST(t->hidden_size == 2);
  auto n = parse_config(R"({"hidden_size":6,"text_config":null,"unknown_key":{"x":[1]}})");
  BOOST_TEST(n->hidden_size == 6);
  // Only rope_parameters (transformers v5 form): thetas and the compress YaRN come from it.
  auto v5 = parse_config(R"({"rope_parameters":{"main":{"rope_type":"default","rope_theta":20000.0},
      "compress":{"rope_type":"yarn","rope_theta":150000.0,"factor":8.0,"original_max_position_embeddings":4096,
      "beta_fast":16.0,"beta_slow":2.0,"attention_factor":1.0}}})");
  BOOST_REQUIRE_MESSAGE(v5.ok(), v5.status().to_string());
  BOOST_TEST(v5->rope_main.rope_theta == 20000.0);
  BOOST_TEST(v5->rope_compress.rope_theta == 150000.0);
  BOOST_TEST(v5->rope_compress.rope_type == "yarn");
  BOOST_TEST(v5->rope_compress.factor == 8.0);
  BOOST_TEST(v5->rope_compress.original_max_position_embeddings == 4096);
  BOOST_TEST(v5->rope_compress.beta_fast == 16.0);
  BOOST_TEST(v5->rope_compress.beta_slow == 2.0);
  auto alias = parse_config(R"({"num_local_experts":16,"intermediate_size":99,"num_experts_per_tok":2})");
  BOOST_TEST(alias->n_routed_experts == 16);
  BOOST_TEST(alias->moe_intermediate_size == 99);
  // EXL3 quantization_config (spec/exl3.md §1.3).
  auto e = parse_config(R"({"text_config":{},"quantization_config":{"quant_method":"exl3","version":"1.4.2",
      "bits":2.93,"head_bits":6,"calibration":{"rows":250,"cols":2048},"out_scales":"always","codebook":"mul1",
      "original_quantization_config":{"quant_method":"fp8","weight_block_size":[32,32],"scale_fmt":"ue8m0"}}})");
  BOOST_REQUIRE_MESSAGE(e.ok(), e.status().to_string());
  auto const& q = *e->quantization_config;
  BOOST_TEST(q.quant_method == "exl3");
  BOOST_REQUIRE(q.exl3.has_value());
  BOOST_TEST(q.exl3->bits == 2.93);
  BOOST_TEST(q.exl3->codebook == "mul1");
  BOOST_TEST(q.exl3->version == "1.4.2");
  BOOST_TEST((q.exl3->original_quantization_config->weight_block_size == V{32, 32}));
  BOOST_TEST(to_json(*parse_config(to_json(*e))) == to_json(*e));
}

BOOST_AUTO_TEST_CASE(validation_errors) {
  std::string const base = R"("num_hidden_layers":5,"num_nextn_predict_layers":1,)";
  auto cfg = [&](std::string s) { return "{" + base + s + "}"; };
  expect_error("[1]", "not a JSON object");
  expect_error("{", "not valid JSON");
  expect_error(cfg(R"("compress_ratios":[0,0,2,2])"), "compress_ratios has 4 entries");
  expect_error(cfg(R"("compress_ratios":[0,0,2,2,1,0,0])"), "compress_ratios has 7 entries");
  expect_error(cfg(R"("kv_source_layer_ids":[2,5])"), "kv_source_layer_ids: layer 5 is out of range");
  expect_error(cfg(R"("kv_source_layer_ids":[0,2])"), "kv_source_layer_ids: layer 0 has compress ratio 0");
  expect_error(cfg(R"("kv_source_layer_ids":[2,4],"index_source_layer_ids":[1])"),
               "index_source_layer_ids: layer 1 has compress ratio 0");
  expect_error(cfg(R"("compress_ratios":[0,1,2,2,1],"kv_source_layer_ids":[2,4],"index_source_layer_ids":[1,2])"),
               "index_source_layer_ids: layer 1 has no KV source at or before it");
  expect_error(cfg(R"("kv_source_layer_ids":[2,4],"index_source_layer_ids":[2],"candidate_source_layer_id":4)"),
               "candidate_source_layer_id 4 is not an index source");
  expect_error(cfg(R"("kv_source_layer_ids":[4],"index_source_layer_ids":[4])"),
               "layer 2 has compress ratio 2 but no KV source at or before it");
  expect_error(cfg(R"("engram_layer_ids":[1],"engram_num_embeddings":[1,2])"),
               "engram_num_embeddings has 2 entries but engram_layer_ids has 1");
  expect_error(cfg(R"("engram_layer_ids":[7])"), "engram_layer_ids: layer 7 is out of range");
  // Wrong JSON types name the key.
  expect_error(cfg(R"("vocab_size":"512")"), "vocab_size must be an integer, got a string");
  expect_error(cfg(R"("vocab_size":512.0)"), "vocab_size must be an integer, got a number");
  expect_error(cfg(R"("hidden_size":null)"), "hidden_size must be an integer, got null");
  expect_error(cfg(R"("rope_theta":"x")"), "rope_theta must be a number");
  expect_error(cfg(R"("norm_topk_prob":1)"), "norm_topk_prob must be a boolean");
  expect_error(cfg(R"("scoring_func":3)"), "scoring_func must be a string");
  expect_error(cfg(R"("compress_ratios":"0,0")"), "compress_ratios must be a list of integers, got a string");
  expect_error(cfg(R"("compress_ratios":[0,0,2,2,"1"])"), "compress_ratios must be a list of integers, found a string");
  expect_error(cfg(R"("rope_scaling":3)"), "rope_scaling must be an object or null");
  expect_error(cfg(R"("rope_scaling":{"rope_type":"yarn","factor":"4"})"), "rope_scaling.factor must be a number");
  expect_error(cfg(R"("rope_scaling":{"rope_type":"linear","factor":4})"), "rope_type 'linear' is not supported");
  expect_error(cfg(R"("eos_token_id":"x")"), "eos_token_id must be an integer, a list of integers or null");
  expect_error(cfg(R"("candidate_source_layer_id":"4")"), "candidate_source_layer_id must be an integer or null");
  expect_error(R"({"text_config":3})", "text_config must be an object, got an integer");
  expect_error(R"({"text_config":{"vocab_size":true}})", "text_config.vocab_size must be an integer, got a boolean");
  expect_error(R"({"quantization_config":{"quant_method":"fp8","weight_block_size":32}})",
               "quantization_config.weight_block_size must be a list of integers");
  // Sizes Tessera's kernels rely on.
  expect_error(cfg(R"("hidden_size":0)"), "hidden_size must be positive");
  expect_error(cfg(R"("qk_rope_head_dim":15)"), "qk_rope_head_dim must be even");
  expect_error(cfg(R"("num_experts_per_tok":500)"), "num_experts_per_tok exceeds n_routed_experts");
  auto missing = load_config("/nonexistent/dir");
  BOOST_TEST((missing.status().code() == StatusCode::kNotFound));
}

BOOST_AUTO_TEST_SUITE_END()

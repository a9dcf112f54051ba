// SPDX-License-Identifier: Apache-2.0
/// Seeded schema fuzzing on the real DeepSeek vocabulary (129,280 ids): random schemas
/// (verify/grammar/schema_fuzz.hpp) compiled for response_format and for tool arguments
/// (tool_choice required / named, parallel calls on/off, with and without the reasoning prefix),
/// decoded to EOS by adversarial token choosers with no dead state at any step (non-empty masks, EOS
/// exactly when complete, a single-byte token whenever incomplete), and the output checked by
/// independent code: JSON parse + SchemaValidator, and the strict DSML parser for tool calls.
/// Unsupported keywords anywhere in a schema are compile errors naming the keyword; the vocabulary
/// preconditions that make dead states impossible are enforced.
#include <boost/test/unit_test.hpp>

#include <functional>
#include <map>

#include <boost/json.hpp>

#include "tessera/models/common/grammar.hpp"
#include "verify/common/random.hpp"
#include "verify/grammar/dsml_parse.hpp"
#include "verify/grammar/grammar_vocab.hpp"
#include "verify/grammar/schema_fuzz.hpp"
#include "verify/grammar/schema_validator.hpp"

using namespace tessera;
using model::Grammar;
using model::GrammarMatcher;
using model::GrammarOptions;
using model::GrammarVocabulary;
namespace json = boost::json;

namespace {

std::shared_ptr<GrammarVocabulary const> deepseek() {
  static auto v = [] {
    auto tv = verify::deepseek_vocab();
    BOOST_TEST_REQUIRE(!tv.bytes.empty(), "golden/tokenizer/deepseek-v3-tokenizer.json is missing");
    return GrammarVocabulary::build(tv.bytes, {tv.eos}, tv.excluded).value_or_throw();
  }();
  return v;
}

std::vector<float> random_logits(std::mt19937_64& rng, int64_t n) {
  std::vector<float> l(static_cast<size_t>(n));
  std::normal_distribution<float> d(0.f, 2.f);
  for (auto& x : l) x = d(rng);
  return l;
}

verify::Chooser chooser(int k) { return static_cast<verify::Chooser>(k % verify::kNumChoosers); }

/// The JSON after the reasoning prefix ("…</think>") when `thinking`.
std::string json_part(std::string const& text, bool thinking) {
  if (!thinking) return text;
  size_t const e = text.find("</think>");
  BOOST_REQUIRE_MESSAGE(e != std::string::npos, "no </think> in " << text);
  return text.substr(e + 8);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grammar_fuzz)

BOOST_AUTO_TEST_CASE(random_schemas_decode_to_valid_json_without_dead_states) {
  auto const vocab = deepseek();
  std::mt19937_64 rng(verify::test_seed(60606));
  constexpr int kSchemas = 160, kWalks = 3;
  int walks = 0, rejected = 0, steps = 0;
  std::map<int, int> by_chooser;
  for (int i = 0; i < kSchemas; ++i) {
    verify::SchemaFuzzer gen(rng, false);
    json::value const schema = gen.root(1 + i % 4);
    GrammarOptions opt;
    opt.max_whitespace = std::array{0, 2, 8}[i % 3];
    opt.thinking_prefix = i % 5 == 0;
    opt.max_depth = i % 7 == 0 ? 6 : 40;
    std::string const what = "schema " + std::to_string(i) + " " + json::serialize(schema);
    auto g = Grammar::from_json_schema(schema, vocab, opt);
    if (!g.ok()) {
      // The only rejection a generated schema may get: nesting the depth bound cannot fit.
      BOOST_TEST(g.status().message().find("no finite value") != std::string::npos, what << " → " << g.status().message());
      BOOST_TEST(opt.max_depth == 6, what << " rejected at max_depth 40");
      ++rejected;
      continue;
    }
    verify::SchemaValidator const val(schema);
    for (int w = 0; w < kWalks; ++w) {
      int const c = i * kWalks + w;
      auto const logits = random_logits(rng, vocab->size());
      int const explore = static_cast<int>(rng() % 60);
      auto const r = verify::fuzz_walk(GrammarMatcher(*g), *vocab, chooser(c), logits, rng, explore, 3000,
                                       what + " chooser " + std::to_string(c % verify::kNumChoosers));
      BOOST_TEST_REQUIRE(r.finished, what << ": walk " << w << " did not finish: " << r.text);
      std::string const text = json_part(r.text, opt.thinking_prefix);
      json::error_code ec;
      json::value const v = json::parse(text, ec);
      BOOST_TEST_REQUIRE(!ec, what << ": not JSON: " << text);
      std::string const err = val.validate(v);
      BOOST_TEST(err.empty(), what << ": " << err << " in " << text);
      ++walks;
      ++by_chooser[c % verify::kNumChoosers];
      steps += r.steps;
    }
  }
  BOOST_TEST(rejected <= kSchemas / 10);
  BOOST_TEST(walks >= (kSchemas - rejected) * kWalks);
  for (int k = 0; k < verify::kNumChoosers; ++k) BOOST_TEST(by_chooser[k] > 0);
  BOOST_TEST_MESSAGE(walks << " walks over " << kSchemas - rejected << " schemas (" << rejected
                           << " rejected for depth), " << steps << " tokens");
}

BOOST_AUTO_TEST_CASE(random_tool_schemas_give_valid_calls_without_dead_states) {
  auto const vocab = deepseek();
  std::mt19937_64 rng(verify::test_seed(70707));
  constexpr int kCases = 90, kWalks = 2;
  char const* const names[] = {"get_weather", "search", "t0", "ünï_tool", "a b", "x"};
  int walks = 0, calls_seen = 0;
  for (int i = 0; i < kCases; ++i) {
    verify::SchemaFuzzer gen(rng, true);
    int const nt = 1 + i % 3;
    std::vector<int> order{0, 1, 2, 3, 4, 5};
    std::shuffle(order.begin(), order.end(), rng);
    json::array tools;
    std::map<std::string, json::value> params;  // null = no parameters
    for (int t = 0; t < nt; ++t) {
      std::string const name = names[order[t]];
      json::object fn{{"name", name}};
      int const k = static_cast<int>(rng() % 8);
      if (k == 0) {
        params[name] = nullptr;
      } else if (k == 1) {
        fn["parameters"] = nullptr;
        params[name] = nullptr;
      } else {
        json::value p = gen.object_root(1 + i % 3);
        fn["parameters"] = p;
        params[name] = p;
      }
      tools.push_back(json::object{{"type", "function"}, {"function", fn}});
    }
    bool const named = i % 2 == 1;
    std::string const target_name = named ? std::string(names[order[rng() % nt]]) : std::string();
    json::value const choice = named ? json::value(json::object{{"type", "function"},
                                                                {"function", json::object{{"name", target_name}}}})
                                     : json::value("required");
    bool const parallel = rng() % 2 == 0;
    bool const thinking = i % 4 == 0;
    std::string const what = "case " + std::to_string(i) + " tools " + json::serialize(tools) +
                             " choice " + json::serialize(choice) + (parallel ? " parallel" : "");
    auto f = model::tool_call_matcher_factory(tools, &choice, vocab, GrammarOptions{.thinking_prefix = thinking},
                                              parallel);
    BOOST_TEST_REQUIRE(f.ok(), what << " → " << f.status().to_string());
    BOOST_TEST_REQUIRE(static_cast<bool>(*f));
    for (int w = 0; w < kWalks; ++w) {
      int const c = i * kWalks + w;
      auto const logits = random_logits(rng, vocab->size());
      auto const r = verify::fuzz_walk((*f)(), *vocab, chooser(c), logits, rng, static_cast<int>(rng() % 80), 4000,
                                       what + " chooser " + std::to_string(c % verify::kNumChoosers));
      BOOST_TEST_REQUIRE(r.finished, what << ": walk " << w << " did not finish: " << r.text);
      std::vector<verify::Call> calls;
      std::string why;
      BOOST_TEST_REQUIRE(verify::parse_dsml(r.text, thinking, &calls, &why), what << ": " << why << " in: " << r.text);
      BOOST_TEST(!calls.empty());
      if (!parallel) BOOST_TEST(calls.size() == 1u);
      for (auto const& call : calls) {
        BOOST_TEST_REQUIRE(params.count(call.name) == 1u, what << ": undeclared tool " << call.name);
        if (named) BOOST_TEST(call.name == target_name);
        json::error_code ec;
        json::value const args = json::parse(call.arguments, ec);
        BOOST_TEST_REQUIRE(!ec, what << ": arguments are not JSON: " << call.arguments);
        BOOST_TEST_REQUIRE(args.is_object());
        json::value const& p = params[call.name];
        if (p.is_null()) {
          BOOST_TEST(args.as_object().empty(), what << ": arguments for a tool without parameters: " << call.arguments);
        } else {
          std::string const err = verify::SchemaValidator(p).validate(args);
          BOOST_TEST(err.empty(), what << ": " << call.name << ": " << err << " in " << call.arguments);
        }
        ++calls_seen;
      }
      ++walks;
    }
  }
  BOOST_TEST(walks == kCases * kWalks);
  BOOST_TEST_MESSAGE(walks << " tool-call walks, " << calls_seen << " calls");
}

/// Near the nesting bound: any-value and recursive schemas, and tools with free or nested
/// parameters, under max_depth 4 … 9, driven by the chooser that opens '{' / '[' whenever it can. A
/// container or key may only start when a value fits below the bound, so no walk dead-ends.
BOOST_AUTO_TEST_CASE(depth_bound_never_dead_ends) {
  auto const vocab = deepseek();
  std::mt19937_64 rng(verify::test_seed(12121));
  char const* const schemas[] = {
      R"({"type":"object"})",
      R"({"type":"array"})",
      R"(true)",
      R"({"type":"object","additionalProperties":{"type":"array","items":{"type":"object"}}})",
      R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"next":{"$ref":"#/$defs/n"},
          "kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["v"]}},"$ref":"#/$defs/n"})",
      R"({"anyOf":[{"type":"array","items":{"type":"array","items":{"type":"array"}}},{"type":"object"}]})",
      R"({"type":"object","properties":{"a":{"type":"object"},"b":{"type":"array","items":{"type":"object"}}}})",
  };
  char const* const params[] = {
      R"({"type":"object"})",
      R"({"type":"object","additionalProperties":{"type":"object","additionalProperties":{"type":"array"}}})",
      R"({"type":"object","additionalProperties":{"type":"integer"}})",
      R"({"type":"object","properties":{"a":{"type":"object"},"b":{"type":"array","items":{"type":"array"}}}})",
  };
  int walks = 0, rejected = 0;
  for (int depth = 4; depth <= 9; ++depth) {
    GrammarOptions opt;
    opt.max_depth = depth;
    opt.max_whitespace = depth % 2 ? 2 : 0;
    std::vector<std::pair<std::string, std::function<GrammarMatcher()>>> cases;
    for (char const* sc : schemas) {
      auto g = Grammar::from_json_schema(sc, vocab, opt);
      if (!g.ok()) {
        BOOST_TEST(g.status().message().find("no finite value") != std::string::npos, g.status().message());
        ++rejected;
        continue;
      }
      cases.push_back({std::string(sc), [g = *g] { return GrammarMatcher(g); }});
    }
    for (char const* pc : params) {
      json::value const tools = json::array{json::object{
          {"type", "function"}, {"function", json::object{{"name", "t"}, {"parameters", json::parse(pc)}}}}};
      json::value const choice = "required";
      auto f = model::tool_call_matcher_factory(tools, &choice, vocab, opt);
      if (!f.ok()) {
        BOOST_TEST(f.status().message().find("no finite value") != std::string::npos, f.status().message());
        ++rejected;
        continue;
      }
      cases.push_back({std::string("tool ") + pc, *f});
    }
    for (auto const& [name, make] : cases) {
      for (int w = 0; w < 3; ++w) {
        auto const logits = random_logits(rng, vocab->size());
        std::string const what = name + " max_depth " + std::to_string(depth);
        auto const r = verify::fuzz_walk(make(), *vocab, w == 2 ? verify::Chooser::kSingleByte : verify::Chooser::kNesting,
                                         logits, rng, 40 + 40 * w, 4000, what);
        BOOST_TEST_REQUIRE(r.finished, what << ": did not finish: " << verify::escaped(r.text));
        if (name.rfind("tool ", 0) != 0) {
          json::error_code ec;
          json::value const v = json::parse(r.text, ec);
          BOOST_TEST_REQUIRE(!ec, what << ": not JSON: " << r.text);
          BOOST_TEST(verify::SchemaValidator(json::parse(name)).validate(v).empty(), what << ": " << r.text);
        }
        ++walks;
      }
    }
  }
  BOOST_TEST(walks > 150);
  BOOST_TEST_MESSAGE(walks << " walks near the depth bound, " << rejected << " grammars rejected as too deep");
}

/// An unsupported keyword planted at a random reachable place of a random schema is a compile error
/// that names the keyword, for response_format and for tool parameters alike.
BOOST_AUTO_TEST_CASE(unsupported_keywords_anywhere_are_named_errors) {
  auto const vocab = deepseek();
  std::mt19937_64 rng(verify::test_seed(80808));
  std::pair<char const*, json::value> const bad[] = {
      {"pattern", "^a"},           {"multipleOf", 3},          {"not", json::object{}},
      {"if", json::object{}},      {"prefixItems", json::array{}}, {"patternProperties", json::object{}},
      {"minProperties", 1},        {"uniqueItems", true},      {"contains", json::object{}},
      {"propertyNames", json::object{}}};
  // Reachable sub-schema objects (not inside enum/const values, not unreferenced $defs).
  std::function<void(json::value&, std::vector<json::object*>&)> collect = [&](json::value& s,
                                                                                std::vector<json::object*>& out) {
    if (!s.is_object()) return;
    json::object& o = s.as_object();
    if (o.contains("$ref")) return;  // its target may be shared; the planted keyword sits next to $ref instead
    out.push_back(&o);
    if (o.contains("const") || o.contains("enum")) return;
    if (auto* p = o.if_contains("properties"); p && p->is_object())
      for (auto& kv : p->as_object()) collect(kv.value(), out);
    if (auto* x = o.if_contains("items")) collect(*x, out);
    // additionalProperties is compiled only for objects without declared properties.
    auto const* p = o.if_contains("properties");
    if (auto* x = o.if_contains("additionalProperties"); x && (!p || !p->is_object() || p->as_object().empty()))
      collect(*x, out);
    for (char const* k : {"anyOf", "oneOf", "allOf"})
      if (auto* a = o.if_contains(k); a && a->is_array())
        for (auto& x : a->as_array()) collect(x, out);
  };
  int planted = 0;
  for (int i = 0; i < 120; ++i) {
    verify::SchemaFuzzer gen(rng, i % 2 == 1);
    json::value schema = i % 2 ? gen.object_root(3) : gen.root(3);
    std::vector<json::object*> spots;
    collect(schema, spots);
    if (spots.empty()) continue;
    auto const& [kw, val] = bad[rng() % std::size(bad)];
    (*spots[rng() % spots.size()])[kw] = val;
    std::string message;
    if (i % 2 == 0) {
      auto g = Grammar::from_json_schema(schema, vocab);
      BOOST_TEST_REQUIRE(!g.ok(), json::serialize(schema));
      message = g.status().message();
    } else {
      json::value const tools = json::array{json::object{
          {"type", "function"}, {"function", json::object{{"name", "t"}, {"parameters", schema}}}}};
      json::value const choice = "required";
      auto f = model::tool_call_matcher_factory(tools, &choice, vocab);
      BOOST_TEST_REQUIRE(!f.ok(), json::serialize(schema));
      message = f.status().message();
    }
    BOOST_TEST(message.find(kw) != std::string::npos, json::serialize(schema) << " → " << message);
    BOOST_TEST(message.find("not supported") != std::string::npos, message);
    ++planted;
  }
  BOOST_TEST(planted > 100);
}

/// Tool arguments never carry ｜DSML｜: enum/const values containing it are not offered, and a property
/// left with no value is a compile error.
BOOST_AUTO_TEST_CASE(enum_values_with_dsml_markup_are_not_generated_in_tool_arguments) {
  auto const vocab = deepseek();
  std::string const bar = verify::kDsmlBar;
  json::value const tools = json::array{json::object{
      {"type", "function"},
      {"function", json::object{{"name", "t"},
                                {"parameters", json::object{{"type", "object"},
                                                            {"properties", json::object{{"m", json::object{
                                                                {"enum", json::array{"ok", "a" + bar + "b",
                                                                                     json::array{"x" + bar}}}}}}},
                                                            {"required", json::array{"m"}}}}}}}};
  json::value const choice = "required";
  auto f = model::tool_call_matcher_factory(tools, &choice, vocab);
  BOOST_TEST_REQUIRE(f.ok(), f.status().to_string());
  std::mt19937_64 rng(verify::test_seed(90909));
  for (int w = 0; w < 12; ++w) {
    auto const logits = random_logits(rng, vocab->size());
    auto const r = verify::fuzz_walk((*f)(), *vocab, chooser(w), logits, rng, static_cast<int>(rng() % 40), 2000,
                                     "dsml enum walk " + std::to_string(w));
    BOOST_TEST_REQUIRE(r.finished);
    std::vector<verify::Call> calls;
    std::string why;
    BOOST_TEST_REQUIRE(verify::parse_dsml(r.text, false, &calls, &why), why << " in: " << r.text);
    for (auto const& c : calls) BOOST_TEST(json::parse(c.arguments).at("m") == json::value("ok"), c.arguments);
  }
  json::value const only_dsml = json::array{json::object{
      {"type", "function"},
      {"function", json::object{{"name", "t"},
                                {"parameters", json::object{{"properties", json::object{{"m", json::object{
                                                                {"const", "a" + bar}}}}}}}}}}};
  auto e = model::tool_call_matcher_factory(only_dsml, &choice, vocab);
  BOOST_TEST_REQUIRE(!e.ok());
  BOOST_TEST(e.status().message().find("DSML") != std::string::npos, e.status().message());
}

/// The preconditions that make an empty mask impossible: an EOS id and a single-byte token for
/// every byte UTF-8 text can contain.
BOOST_AUTO_TEST_CASE(vocabulary_preconditions) {
  auto tv = verify::synthetic_vocab();
  auto no_eos = GrammarVocabulary::build(tv.bytes, {}, tv.excluded);
  BOOST_TEST_REQUIRE(!no_eos.ok());
  BOOST_TEST(no_eos.status().message().find("no EOS id") != std::string::npos);
  auto missing = tv.bytes;
  missing['{'] = "{{";  // '{' now exists only inside longer tokens
  auto gap = GrammarVocabulary::build(missing, {tv.eos}, tv.excluded);
  BOOST_TEST_REQUIRE(!gap.ok());
  BOOST_TEST(gap.status().message().find("0x7B") != std::string::npos, gap.status().message());
  auto excluded = tv.excluded;
  excluded.push_back(0xE4);  // an excluded single byte does not count
  BOOST_TEST(!GrammarVocabulary::build(tv.bytes, {tv.eos}, excluded).ok());
  auto high = tv.bytes;
  high[0xF8] = "";  // bytes UTF-8 never contains are not needed
  high[0xC0] = "";
  BOOST_TEST(GrammarVocabulary::build(high, {tv.eos}, tv.excluded).ok());
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// JSON-schema constrained decoding: random walks over many schemas always end in JSON that parses
/// and validates (independent validator), masks agree token by token with accept_token, no dead
/// ends, token-boundary cases (split UTF-8, escapes, multi-token spans), whitespace bounds, EOS
/// only when complete, rollback, and clear errors for unsupported or unsatisfiable schemas.
#include <boost/test/unit_test.hpp>

#include <boost/json.hpp>

#include "tessera/models/common/grammar.hpp"
#include "verify/common/random.hpp"
#include "verify/grammar/grammar_vocab.hpp"
#include "verify/grammar/schema_validator.hpp"
#include "verify/grammar/walk.hpp"

using namespace tessera;
using model::Grammar;
using model::GrammarMatcher;
using model::GrammarOptions;
using model::GrammarVocabulary;

namespace {

std::shared_ptr<GrammarVocabulary const> small_vocab() {
  static auto v = [] {
    auto tv = verify::synthetic_vocab();
    return GrammarVocabulary::build(tv.bytes, {tv.eos}, tv.excluded).value_or_throw();
  }();
  return v;
}

std::shared_ptr<Grammar const> compile(std::string const& schema, GrammarOptions opt = {}) {
  auto g = Grammar::from_json_schema(schema, small_vocab(), opt);
  BOOST_REQUIRE_MESSAGE(g.ok(), g.status().to_string());
  return *g;
}

char const* const kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
        "tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":3}},
        "required":["name","age","tags"],"additionalProperties":false})",
    R"({"type":"object","properties":{"unit":{"enum":["celsius","fahrenheit"]},"ok":{"const":true},
        "k":{"enum":[1,"two",null]}},"required":["unit","ok","k"]})",
    R"({"anyOf":[{"type":"string","minLength":2,"maxLength":5},{"type":"null"},
        {"type":"number","minimum":-2.5,"exclusiveMaximum":3}]})",
    R"({"$defs":{"node":{"type":"object","properties":{"id":{"type":"integer"},
        "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["id"]}},
        "$ref":"#/$defs/node"})",
    R"({"type":"array","items":{"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2},
        "minItems":2,"maxItems":4})",
    R"({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"string"},
        "c":{"type":["integer","null"],"exclusiveMinimum":5,"maximum":9}},"required":["b"]})",
    R"({"type":"object","additionalProperties":{"type":"integer","minimum":-3,"maximum":1000}})",
    R"({"type":"object","properties":{"q\"uote":{"type":"string"},"nl\nkey":{"type":"boolean"},
        "\u00fcn\u00ef":{"type":"null"}},"required":["q\"uote","nl\nkey","\u00fcn\u00ef"]})",
    R"({"type":"number"})",
    R"({"oneOf":[{"type":"integer","minimum":100},{"type":"string","const":"x"}]})",
    R"({"type":"object"})",
    R"({"type":"array","minItems":1,"maxItems":3})",
    R"({"type":"string","minLength":3,"maxLength":6})",
    R"({"definitions":{"v":{"anyOf":[{"type":"integer"},{"type":"array","items":{"$ref":"#/definitions/v"}}]}},
        "type":"object","properties":{"tree":{"$ref":"#/definitions/v"}},"required":["tree"]})",
    R"({"type":"integer","minimum":10,"maximum":12})",
    R"({"type":"number","minimum":0.25,"maximum":0.75})",
    R"({"type":"object","properties":{"e":{"enum":[1,12,123,-1,"a","ab",true,[1,2]]},"f":{"type":"boolean"}},
        "required":["e","f"]})",
    R"({"type":"array","items":{"enum":[1,12,123]},"minItems":2,"maxItems":5})",
};

}  // namespace

BOOST_AUTO_TEST_SUITE(grammar_json)

BOOST_AUTO_TEST_CASE(random_walks_parse_and_validate) {
  uint64_t const seed = verify::test_seed(2026);
  auto const& vocab = *small_vocab();
  int total = 0;
  for (size_t si = 0; si < std::size(kSchemas); ++si) {
    boost::json::value const schema = boost::json::parse(kSchemas[si]);
    verify::SchemaValidator const val(schema);
    for (int max_ws : {0, 2}) {
      auto const g = compile(kSchemas[si], GrammarOptions{.max_whitespace = max_ws});
      std::mt19937_64 rng(seed + si * 100 + max_ws);
      for (int w = 0; w < 12; ++w) {
        bool const check_all = w < 2;
        auto const r =
            verify::random_walk(GrammarMatcher(g), vocab, rng, 5 + w * 6, 600, check_all);
        BOOST_TEST_REQUIRE(r.finished,
                           "schema " << si << " walk " << w << " did not finish: " << r.text);
        boost::system::error_code ec;
        boost::json::value const v = boost::json::parse(r.text, ec);
        BOOST_TEST_REQUIRE(!ec, "schema " << si << ": not JSON: " << r.text);
        std::string const err = val.validate(v);
        BOOST_TEST(err.empty(), "schema " << si << ": " << err << " in " << r.text);
        if (max_ws == 0)
          BOOST_TEST(
              (r.text.find_first_of(" \n\t\r") == std::string::npos ||
               r.text.find('"') != std::string::npos),  // whitespace may only sit inside strings
              "schema " << si << ": whitespace with max_whitespace 0: " << r.text);
        ++total;
      }
    }
  }
  BOOST_TEST_MESSAGE(total << " walks");
}

BOOST_AUTO_TEST_CASE(json_object_mode) {
  auto g = Grammar::json_object(small_vocab()).value_or_throw();
  std::mt19937_64 rng(verify::test_seed(7));
  for (int w = 0; w < 15; ++w) {
    auto const r =
        verify::random_walk(GrammarMatcher(g), *small_vocab(), rng, 10 + w * 3, 800, w < 2);
    BOOST_TEST_REQUIRE(r.finished);
    boost::system::error_code ec;
    boost::json::value const v = boost::json::parse(r.text, ec);
    BOOST_TEST_REQUIRE(!ec, "not JSON: " << r.text);
    BOOST_TEST(v.is_object());
  }
}

BOOST_AUTO_TEST_CASE(token_boundaries_utf8_and_escapes) {
  auto const g = compile(R"({"type":"string"})");
  auto ok = [&](std::vector<std::string> const& pieces) {
    GrammarMatcher m(g);
    for (auto const& p : pieces)
      if (!m.accept_bytes(p)) return false;
    return m.is_complete();
  };
  BOOST_TEST(ok({"\"", "\xE4\xB8", "\xAD", "\""}));        // 中 split across tokens
  BOOST_TEST(ok({"\"\xF0", "\x9F\x98", "\x80\""}));        // 😀 split in three
  BOOST_TEST(ok({"\"", "\\", "u00", "e9", "\\n\\\"\""}));  // escapes split
  BOOST_TEST(!ok({"\"\xC0\x80\""}));                       // overlong NUL
  BOOST_TEST(!ok({"\"\xED\xA0\x80\""}));                   // UTF-8 surrogate
  BOOST_TEST(!ok({"\"\\ud800\""}));                        // surrogate escape (not generated)
  BOOST_TEST(!ok({"\"\n\""}));                             // raw control character
  BOOST_TEST(!ok({"\"\\x\""}));                            // bad escape
  BOOST_TEST(!ok({"\"\xE4\xB8\""}));                       // truncated character
  GrammarMatcher m(g);
  BOOST_TEST(m.accept_bytes("\"ab"));
  BOOST_TEST(!m.is_complete());
  auto const vocab = small_vocab();
  auto const mask = m.mask();
  int32_t const eos = vocab->eos_ids()[0];
  BOOST_TEST(!((mask[eos >> 5] >> (eos & 31)) & 1));  // EOS only when complete
  BOOST_TEST(!m.accept_token(eos));
  // A token spanning the end of the string and JSON after it.
  auto const g2 = compile(
      R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}})");
  GrammarMatcher m2(g2);
  for (char const* p : {"[{\"", "id", "\":\"", "x", "\"},{\"", "id", "\":\"", "y", "\"}", "]"})
    BOOST_TEST(m2.accept_bytes(p));
  BOOST_TEST(m2.is_complete());
  BOOST_TEST(m2.accept_token(eos));
  BOOST_TEST(m2.is_terminated());
  BOOST_TEST(!m2.accept_token(eos));
}

BOOST_AUTO_TEST_CASE(whitespace_is_bounded) {
  auto const g =
      compile(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})",
              GrammarOptions{.max_whitespace = 2});
  GrammarMatcher m(g);
  BOOST_TEST(m.accept_bytes("{  "));
  BOOST_TEST(!m.accept_bytes(" "));
  BOOST_TEST(m.accept_bytes("\"a\" :\n\t1 }"));
  BOOST_TEST(m.is_complete());
  BOOST_TEST(m.accept_bytes("\n\n"));
  BOOST_TEST(!m.accept_bytes(" "));
  auto const g0 =
      compile(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})",
              GrammarOptions{.max_whitespace = 0});
  GrammarMatcher m0(g0);
  BOOST_TEST(!m0.accept_bytes("{ "));
  BOOST_TEST(m0.accept_bytes("{\"a\":-0}"));
}

BOOST_AUTO_TEST_CASE(numbers_and_bounds) {
  auto const gi = compile(R"({"type":"integer","minimum":10,"maximum":12})");
  auto acc = [](std::shared_ptr<Grammar const> const& g, char const* s) {
    GrammarMatcher m(g);
    return m.accept_bytes(s) && m.is_complete();
  };
  BOOST_TEST(acc(gi, "10"));
  BOOST_TEST(acc(gi, "12"));
  BOOST_TEST(!acc(gi, "13"));
  BOOST_TEST(!acc(gi, "1"));
  GrammarMatcher m(gi);
  BOOST_TEST(!m.accept_bytes("2"));  // no completion of "2…" lies in [10, 12]
  BOOST_TEST(!m.accept_bytes("-"));
  BOOST_TEST(!acc(gi, "10.5"));
  auto const gn = compile(R"({"type":"number","exclusiveMinimum":-1,"maximum":0.5})");
  BOOST_TEST(acc(gn, "0.5"));
  BOOST_TEST(acc(gn, "-0.999999"));
  BOOST_TEST(!acc(gn, "-1"));
  BOOST_TEST(!acc(gn, "0.51"));
  BOOST_TEST(!acc(gn, "1e-3"));  // bounded numbers are written without exponent
  auto const gu = compile(R"({"type":"number"})");
  BOOST_TEST(acc(gu, "-12.5e+3"));
  BOOST_TEST(!acc(gu, "01"));
  BOOST_TEST(!acc(gu, "1."));
  BOOST_TEST(!acc(gu, "+1"));
}

BOOST_AUTO_TEST_CASE(rollback_restores_masks) {
  auto const g = compile(kSchemas[0]);
  auto const& vocab = *small_vocab();
  std::mt19937_64 rng(verify::test_seed(5));
  GrammarMatcher m(g);
  std::vector<std::vector<uint32_t>> masks{m.mask()};
  for (int i = 0; i < 25 && !m.is_complete(); ++i) {
    auto const mask = m.mask();
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < vocab.size(); ++id)
      if (((mask[id >> 5] >> (id & 31)) & 1) && !vocab.is_eos(id)) allowed.push_back(id);
    BOOST_REQUIRE(!allowed.empty());
    BOOST_REQUIRE(m.accept_token(allowed[rng() % allowed.size()]));
    masks.push_back(m.mask());
  }
  size_t const n = m.num_steps();
  for (size_t back : {size_t{3}, size_t{5}, n - 8}) {
    if (back > m.num_steps()) continue;
    BOOST_REQUIRE(m.rollback(back));
    BOOST_TEST(m.mask() == masks[m.num_steps()]);
  }
  BOOST_TEST(!m.rollback(m.num_steps() + 1));
  GrammarMatcher trimmed = m;
  size_t const steps = trimmed.num_steps();
  trimmed.trim_history(2);
  BOOST_TEST(trimmed.num_steps() == std::min<size_t>(steps, 2));
  BOOST_TEST(trimmed.mask() == masks[steps]);
  BOOST_TEST(!trimmed.rollback(3));
  BOOST_REQUIRE(m.rollback(m.num_steps()));
  BOOST_TEST(m.mask() == masks[0]);
}

BOOST_AUTO_TEST_CASE(draft_masks_match_serial_masks) {
  auto const g = compile(kSchemas[0]);
  auto const& vocab = *small_vocab();
  std::vector<int32_t> ids;
  std::string const text = "{\"name\":\"ab\",\"age\":12,\"tags\":[]}";
  for (char ch : text) ids.push_back(static_cast<unsigned char>(ch));  // byte tokens are ids 0..255
  GrammarMatcher serial(g);
  std::vector<std::vector<uint32_t>> want;
  for (int32_t id : ids) {
    want.push_back(serial.mask());
    BOOST_REQUIRE(serial.accept_token(id));
  }
  want.push_back(serial.mask());
  GrammarMatcher m(g);
  BOOST_REQUIRE(m.accept_token(ids[0]));
  std::vector<int32_t> const draft = {'"', 'n', '!', 'm', 'e'};  // "n!" starts no declared key
  std::vector<uint32_t> masks((draft.size() + 1) * vocab.mask_words(), 0xdeadbeefu);
  size_t const n = m.fill_draft_masks(draft, masks.data());
  BOOST_TEST(n == 2u);
  for (size_t r = 0; r <= n; ++r)
    BOOST_TEST(
        std::equal(want[r + 1].begin(), want[r + 1].end(), masks.begin() + r * vocab.mask_words()));
  BOOST_TEST(masks[(n + 1) * vocab.mask_words()] == 0xdeadbeefu);
  BOOST_TEST(m.num_steps() == 1u);
  BOOST_TEST(m.mask() == want[1]);
}

BOOST_AUTO_TEST_CASE(invalid_schemas_give_clear_errors) {
  struct Case {
    char const* schema;
    char const* needle;
  };
  Case const cases[] = {
      {R"({"type":"string","pattern":"^a+$"})", "pattern"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})",
       "\"b\" is not a declared property"},
      {R"({"enum":[]})", "enum"},
      {R"({"type":"array","minItems":3,"maxItems":2})", "minItems > maxItems"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "admits no integer"},
      {R"({"$ref":"#/$defs/missing"})", "unresolvable $ref"},
      {R"({"type":"object","properties":{"x":{"$ref":"#"}},"required":["x"]})", "no finite value"},
      {R"({"type":"wat"})", "unknown type"},
      {R"({"type":"number","multipleOf":3})", "multipleOf"},
      {R"({"type":"object",)", "not valid JSON"},
      {R"(false)", "admits no value"},
  };
  for (auto const& c : cases) {
    auto g = Grammar::from_json_schema(c.schema, small_vocab());
    BOOST_TEST_REQUIRE(!g.ok(), c.schema);
    BOOST_TEST(g.status().message().find(c.needle) != std::string::npos,
               c.schema << " → " << g.status().message());
  }
}

BOOST_AUTO_TEST_CASE(vocabulary_and_byte_level_decoding) {
  std::string out;
  BOOST_TEST(model::byte_level_decode("\xC4\xA0the", &out));  // Ġthe
  BOOST_TEST(out == " the");
  BOOST_TEST(model::byte_level_decode("\xC4\x8A", &out));  // Ċ
  BOOST_TEST(out == "\n");
  BOOST_TEST(!model::byte_level_decode("\xE4\xB8\xAD", &out));  // not in the 256-symbol alphabet
  auto bad = GrammarVocabulary::build({"a", "b"}, {5});
  BOOST_TEST(!bad.ok());
  auto const v = small_vocab();
  auto const tv = verify::synthetic_vocab();
  BOOST_TEST(v->is_excluded(tv.excluded[0]));
  BOOST_TEST(v->is_eos(tv.eos));
  // An excluded token is never allowed, even where its bytes would fit (inside a string).
  GrammarMatcher m(compile(R"({"type":"string"})"));
  BOOST_TEST(m.accept_bytes("\""));
  auto const mask = m.mask();
  int32_t const x = tv.excluded[0];
  BOOST_TEST(!((mask[x >> 5] >> (x & 31)) & 1));
  BOOST_TEST(!m.accept_token(x));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(grammar_real_vocab)

/// The DeepSeek vocabulary (129,280 ids): walks over a schema and the DSML grammar, checking the
/// mask bit of 1,500 allowed tokens (all when fewer) and 1,500 random ids against accept_token per
/// step.
BOOST_AUTO_TEST_CASE(deepseek_vocabulary_masks_agree_with_accept) {
  auto tv = verify::deepseek_vocab();
  BOOST_TEST_REQUIRE(!tv.bytes.empty(), "golden/tokenizer/deepseek-v3-tokenizer.json is missing");
  auto const vocab = GrammarVocabulary::build(tv.bytes, {tv.eos}, tv.excluded).value_or_throw();
  std::vector<std::shared_ptr<Grammar const>> grammars;
  grammars.push_back(
      Grammar::from_json_schema(
          R"({"type":"object","properties":{"title":{"type":"string","maxLength":30},"n":{"type":"number"},
          "xs":{"type":"array","items":{"type":"integer","minimum":-5,"maximum":500}}},"required":["title","n","xs"]})",
          vocab)
          .value_or_throw());
  std::vector<model::ToolSpec> tools = {
      {"get_weather",
       R"({"type":"object","properties":{"location":{"type":"string"},"days":{"type":"integer"}},"required":["location"]})"}};
  grammars.push_back(
      Grammar::tool_calls(tools, vocab, GrammarOptions{.thinking_prefix = true}).value_or_throw());
  std::mt19937_64 rng(verify::test_seed(4242));
  for (auto const& g : grammars) {
    GrammarMatcher m(g);
    std::string text, target;
    bool have_target = false;
    for (int step = 0; step < 200; ++step) {
      auto const mask = m.mask();
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
      BOOST_REQUIRE_MESSAGE(!allowed.empty(), "dead end after " << text);
      std::vector<int32_t> probe;  // up to 1,500 allowed tokens and 1,500 random ids
      for (int k = 0; k < 1500; ++k) {
        probe.push_back(allowed.size() <= 1500
                            ? (k < static_cast<int>(allowed.size()) ? allowed[k] : allowed[0])
                            : allowed[rng() % allowed.size()]);
        probe.push_back(static_cast<int32_t>(rng() % vocab->size()));
      }
      for (int32_t id : probe) {
        bool const acc = m.accept_token(id);
        if (acc) BOOST_REQUIRE(m.rollback(1));
        BOOST_TEST(acc == (((mask[id >> 5] >> (id & 31)) & 1) != 0),
                   "token " << id << " after " << text);
      }
      if (step == 25) {
        auto c = m.shortest_completion();
        BOOST_REQUIRE(c.has_value());
        target = *c;
        have_target = true;
      }
      int32_t pick = allowed[rng() % allowed.size()];
      if (have_target) {
        pick = -1;
        for (int32_t id : allowed) {
          if (vocab->is_eos(id)) {
            if (target.empty()) pick = id;
            continue;
          }
          std::string const& b = vocab->token_bytes(id);
          if (!target.empty() && target.compare(0, b.size(), b) == 0 &&
              (pick < 0 || vocab->is_eos(pick) || b.size() > vocab->token_bytes(pick).size()))
            pick = id;
        }
        BOOST_REQUIRE(pick >= 0);
      } else if (vocab->is_eos(pick)) {
        continue;
      }
      BOOST_REQUIRE(m.accept_token(pick));
      if (vocab->is_eos(pick)) break;
      text += vocab->token_bytes(pick);
      if (have_target) target.erase(0, vocab->token_bytes(pick).size());
    }
    BOOST_TEST(m.is_terminated(), "walk did not finish: " << text);
  }
}

BOOST_AUTO_TEST_SUITE_END()

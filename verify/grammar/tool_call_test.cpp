// SPDX-License-Identifier: Apache-2.0
/// DSML tool-call constraint (spec/chat-format.md §2.1, §3.1, §3.2): random walks under tool_choice
/// `required`, named, parallel_tool_calls false and the thinking prefix always give a block that a
/// strict parser written from §3.2 accepts, naming a declared tool, with arguments (rebuilt as the
/// reference parser does) that parse as JSON and satisfy the tool's schema.
#include <boost/test/unit_test.hpp>

#include <map>

#include <boost/json.hpp>

#include "tessera/models/common/grammar.hpp"
#include "verify/common/random.hpp"
#include "verify/grammar/dsml_parse.hpp"
#include "verify/grammar/grammar_vocab.hpp"
#include "verify/grammar/schema_validator.hpp"
#include "verify/grammar/walk.hpp"

using namespace tessera;
using model::GrammarMatcher;
using model::GrammarOptions;
using model::GrammarVocabulary;

namespace {

std::string const kDsml =
    "\xEF\xBD\x9C"
    "DSML"
    "\xEF\xBD\x9C";

std::shared_ptr<GrammarVocabulary const> small_vocab() {
  static auto v = [] {
    auto tv = verify::synthetic_vocab();
    return GrammarVocabulary::build(tv.bytes, {tv.eos}, tv.excluded).value_or_throw();
  }();
  return v;
}

char const* const kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "location":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},
     "days":{"type":"integer","minimum":1,"maximum":7}},"required":["location"]}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
     "query":{"type":"string","maxLength":12},
     "filters":{"type":"object","properties":{"lang":{"type":"string"}},"required":["lang"]}},
     "required":["query","filters"],"additionalProperties":false}}},
  {"type":"function","function":{"name":"noargs"}},
  {"type":"function","function":{"name":"free","parameters":{"type":"object"}}}
])";

void check_walks(boost::json::value const* choice, bool parallel, bool thinking, int walks,
                 uint64_t seed, std::string const& only_name = "", bool expect_variety = true) {
  boost::json::value const tools = boost::json::parse(kTools);
  auto f = model::tool_call_matcher_factory(tools, choice, small_vocab(),
                                            GrammarOptions{.thinking_prefix = thinking}, parallel);
  BOOST_REQUIRE_MESSAGE(f.ok(), f.status().to_string());
  BOOST_REQUIRE(static_cast<bool>(*f));
  std::map<std::string, boost::json::value const*> schemas;
  for (auto const& t : tools.as_array()) {
    auto const& fn = t.at("function").as_object();
    schemas[std::string(fn.at("name").as_string())] = fn.if_contains("parameters");
  }
  std::mt19937_64 rng(seed);
  std::map<std::string, int> used;
  for (int w = 0; w < walks; ++w) {
    auto const r = verify::random_walk((*f)(), *small_vocab(), rng, 10 + (w % 8) * 8, 900, w < 2);
    BOOST_TEST_REQUIRE(r.finished, "walk " << w << " did not finish: " << r.text);
    std::vector<verify::Call> calls;
    std::string why;
    BOOST_TEST_REQUIRE(verify::parse_dsml(r.text, thinking, &calls, &why), why << " in: " << r.text);
    BOOST_TEST(!calls.empty());
    if (!parallel) BOOST_TEST(calls.size() == 1u);
    for (auto const& c : calls) {
      BOOST_TEST_REQUIRE(schemas.count(c.name) == 1u, "undeclared tool " << c.name);
      if (!only_name.empty()) BOOST_TEST(c.name == only_name);
      ++used[c.name];
      boost::system::error_code ec;
      boost::json::value const args = boost::json::parse(c.arguments, ec);
      BOOST_TEST_REQUIRE(!ec, "arguments are not JSON: " << c.arguments);
      BOOST_TEST(args.is_object());
      if (auto const* s = schemas[c.name]) {
        std::string const err = verify::SchemaValidator(*s).validate(args);
        BOOST_TEST(err.empty(), c.name << ": " << err << " in " << c.arguments);
      } else {
        BOOST_TEST(args.as_object().empty());
      }
    }
  }
  if (only_name.empty() && expect_variety)
    BOOST_TEST(used.size() >= 3u, "walks should reach most tools");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grammar_tools)

BOOST_AUTO_TEST_CASE(required_any_tool) {
  boost::json::value const choice = "required";
  check_walks(&choice, true, false, 40, verify::test_seed(101));
}

BOOST_AUTO_TEST_CASE(named_tool_single_call) {
  boost::json::value const choice =
      boost::json::parse(R"({"type":"function","function":{"name":"search"}})");
  check_walks(&choice, false, false, 20, verify::test_seed(202), "search");
}

BOOST_AUTO_TEST_CASE(required_after_reasoning) {
  boost::json::value const choice = "required";
  check_walks(&choice, true, true, 20, verify::test_seed(303), "", /*expect_variety=*/false);
}

BOOST_AUTO_TEST_CASE(exact_reference_text_is_accepted) {
  // §2.5 F / §1.7 shapes, fed as raw bytes.
  boost::json::value const tools = boost::json::parse(kTools);
  boost::json::value const choice = "required";
  auto f = model::tool_call_matcher_factory(tools, &choice, small_vocab()).value_or_throw();
  GrammarMatcher m = f();
  std::string const text =
      "\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"get_weather\">\n<" + kDsml +
      " parameter name=\"location\" string=\"true\">Bei \"jing\" <x></" + kDsml + " parameter>\n<" +
      kDsml + " parameter name=\"days\" string=\"false\">3</" + kDsml + " parameter>\n</" + kDsml +
      " invoke>\n<" + kDsml + " invoke name=\"noargs\">\n\n</" + kDsml + " invoke>\n</" + kDsml +
      " calls>";
  for (char ch : text) BOOST_REQUIRE(m.accept_bytes(std::string(1, ch)));
  BOOST_TEST(m.is_complete());
  // Undeclared name, a missing required parameter, a schema violation and DSML in a value are
  // rejected.
  auto rejects = [&](std::string const& t) {
    GrammarMatcher x = f();
    return !x.accept_bytes(t);
  };
  BOOST_TEST(rejects("\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"nope\""));
  BOOST_TEST(rejects("\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"get_weather\">\n</"));
  BOOST_TEST(rejects("\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"get_weather\">\n<" +
                     kDsml + " parameter name=\"days\" string=\"false\">9"));
  BOOST_TEST(rejects("\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"get_weather\">\n<" +
                     kDsml + " parameter name=\"location\" string=\"true\">a" + kDsml));
  BOOST_TEST(rejects("\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"search\">\n<" +
                     kDsml + " parameter name=\"query\" string=\"true\">0123456789abc"));
}

BOOST_AUTO_TEST_CASE(factory_choices_and_errors) {
  boost::json::value const tools = boost::json::parse(kTools);
  boost::json::value const aut = "auto", none = "none";
  auto a = model::tool_call_matcher_factory(tools, &aut, small_vocab());
  BOOST_TEST_REQUIRE(a.ok());
  BOOST_TEST(!static_cast<bool>(*a));
  auto n = model::tool_call_matcher_factory(tools, &none, small_vocab());
  BOOST_TEST_REQUIRE(n.ok());
  BOOST_TEST(!static_cast<bool>(*n));
  boost::json::value const bad =
      boost::json::parse(R"({"type":"function","function":{"name":"missing"}})");
  auto e = model::tool_call_matcher_factory(tools, &bad, small_vocab());
  BOOST_TEST_REQUIRE(!e.ok());
  BOOST_TEST(e.status().message().find("\"missing\" is not among the tools") != std::string::npos);
  boost::json::value const req = "required";
  boost::json::value const bad_tools = boost::json::parse(
      R"([{"type":"function","function":{"name":"t","parameters":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}}])");
  auto e2 = model::tool_call_matcher_factory(bad_tools, &req, small_vocab());
  BOOST_TEST_REQUIRE(!e2.ok());
  BOOST_TEST(e2.status().message().find("pattern") != std::string::npos);
  BOOST_TEST(e2.status().message().find("tools[0].function.parameters/properties/a") !=
             std::string::npos);
  boost::json::value const quote_tools =
      boost::json::parse(R"([{"type":"function","function":{"name":"a\"b"}}])");
  BOOST_TEST(!model::tool_call_matcher_factory(quote_tools, &req, small_vocab()).ok());
  // response_format factories
  auto rf = model::response_format_matcher_factory(boost::json::parse(R"({"type":"json_object"})"),
                                                   small_vocab());
  BOOST_TEST_REQUIRE(rf.ok());
  GrammarMatcher m = (*rf)();
  BOOST_TEST(m.accept_bytes("{\"k\": [1, true]}"));
  BOOST_TEST(m.is_complete());
  boost::json::value const resp_style =
      boost::json::parse(R"({"type":"function","name":"noargs"})");
  auto rn = model::tool_call_matcher_factory(tools, &resp_style, small_vocab());
  BOOST_TEST_REQUIRE(rn.ok());
  GrammarMatcher nm = (*rn)();
  BOOST_TEST(nm.accept_bytes("\n\n<" + kDsml + " calls>\n<" + kDsml +
                             " invoke name=\"noargs\">\n\n</" + kDsml + " invoke>\n</" + kDsml +
                             " calls>"));
  BOOST_TEST(nm.is_complete());
  model::prewarm_grammar_caches(small_vocab());
  auto rt = model::response_format_matcher_factory(boost::json::parse(R"({"type":"text"})"),
                                                   small_vocab());
  BOOST_TEST_REQUIRE(rt.ok());
  BOOST_TEST(!static_cast<bool>(*rt));
  auto rs = model::response_format_matcher_factory(
      boost::json::parse(
          R"({"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"boolean"}}})"),
      small_vocab());
  BOOST_TEST_REQUIRE(rs.ok());
  GrammarMatcher b = (*rs)();
  BOOST_TEST(!b.accept_bytes("1"));
  BOOST_TEST(b.accept_bytes("false"));
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// Request constraints (servers/openai/routes/constraints.cpp): whatever allowed token is taken at each
/// step, the engine is never handed an empty mask while the constraint is not done, and a complete text
/// ends the reply (json_object `{}` then the whitespace bound; an object schema whose properties are all
/// optional — the shape that once returned HTTP 500 "every token is masked"). A vocabulary without an
/// end-of-sequence id is refused with a clear error.
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <random>

#include "servers/openai/routes/constraints.hpp"
#include "servers/openai/routes/request.hpp"
#include "servers/openai/routes/text.hpp"
#include "verify/common/random.hpp"

using namespace tessera;
using namespace tessera::server;

namespace {

/// Takes random allowed tokens (favouring whitespace, then closing bytes, when `close` says so) until
/// done() or max_steps; fails on an empty mask. Returns whether the constraint reported done.
bool walk(TokenConstraint& c, TextCodec const& codec, int32_t eos, std::mt19937_64& rng, int max_steps, std::string& text) {
  int64_t const V = codec.vocab_size();
  std::vector<uint32_t> mask(static_cast<size_t>((V + 31) / 32));
  for (int step = 0; step < max_steps; ++step) {
    if (c.done()) return true;
    std::fill(mask.begin(), mask.end(), 0u);
    c.fill_mask(mask.data());
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < V; ++id)
      if ((mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1) allowed.push_back(id);
    BOOST_REQUIRE_MESSAGE(!allowed.empty(), "empty mask while not done, after \"" << text << "\"");
    // Prefer whitespace and closing bytes so walks reach the end of the text and its whitespace bound;
    // after 60 steps close: the end token when allowed, then closing bytes.
    std::vector<double> w;
    bool const closing = step >= 60;
    for (int32_t id : allowed) {
      std::string const b = codec.token_bytes(id);
      bool const close = b == "}" || b == "]" || b == "\"";
      bool const ws = b == " " || b == "\n";
      w.push_back(closing ? (id == eos ? 1e6 : close ? 1e3 : ws ? 10.0 : 1.0) : (ws || close ? 50.0 : 1.0));
    }
    int32_t const id = allowed[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
    text += codec.token_bytes(id);
    c.accept(id);
  }
  return c.done();
}

}  // namespace

BOOST_AUTO_TEST_CASE(constraint_never_hands_out_an_empty_mask) {
  auto codec = make_byte_codec();
  std::mt19937_64 rng(verify::test_seed(611));
  char const* const schemas[] = {R"({"type":"object","properties":{"zz":{"type":"string"}}})", R"({"type":"object"})",
                                 R"({"type":"array","maxItems":2})", R"({"type":"integer","maximum":50})"};
  // A vocabulary without an end-of-sequence id is refused up front, naming the reason (the server takes
  // the tokenizer's end-of-sentence token when config.json names no EOS).
  auto none = ConstraintFactory::create(*codec, {});
  BOOST_TEST(!none.ok());
  if (!none.ok()) BOOST_TEST(none.status().message().find("EOS") != std::string::npos);
  for (bool with_eos : {true}) {
    std::vector<int32_t> eos;
    if (with_eos) eos.push_back(static_cast<int32_t>(codec->vocab_size() - 1));
    auto f = ConstraintFactory::create(*codec, eos).value_or_throw();
    int ended = 0, total = 0;
    for (int kind = 0; kind < 1 + static_cast<int>(std::size(schemas)); ++kind)
      for (int rep = 0; rep < 12; ++rep) {
        ApiRequest r;
        r.render.thinking = false;
        if (kind == 0) {
          r.response_format = "json_object";
        } else {
          r.response_format = "json_schema";
          r.render.response_schema = boost::json::parse(schemas[kind - 1]);
        }
        auto c = f->for_request(r);
        BOOST_REQUIRE(std::holds_alternative<std::shared_ptr<TokenConstraint>>(c));
        auto con = std::get<std::shared_ptr<TokenConstraint>>(c);
        BOOST_REQUIRE(con);
        std::string text;
        ended += walk(*con, *codec, with_eos ? eos[0] : -1, rng, 400, text);
        ++total;
      }
    BOOST_TEST_INFO("with_eos=" << with_eos);
    BOOST_TEST(ended == total);  // every walk reaches the end of its text within 400 tokens
  }
}

// SPDX-License-Identifier: Apache-2.0
/// Seeded random JSON schemas over the subset the grammar compiler accepts, and an adversarial
/// constrained-decoding walk that checks the no-dead-state invariant at every step.
///
/// Schemas: objects with declared properties (unusual keys: quotes, escapes, non-ASCII, empty),
/// random `required` subsets and every `additionalProperties` form; free-key objects; arrays with
/// item counts; strings with lengths; integers and numbers with inclusive/exclusive bounds; booleans,
/// null, type lists, enums of mixed values, const, anyOf, type-disjoint oneOf, single-member allOf,
/// `true`/`{}` (any value) and `$ref` into `$defs` (recursive through optional paths) or to `#`.
///
/// Walk: a chooser picks among the allowed tokens of each mask (greedy on fixed random logits like a
/// tiny random model at temperature 0, uniform, longest token, whitespace first, single bytes,
/// nesting first, or EOS as soon as allowed); after `explore` steps it follows a shortest completion.
/// Every step checks: the mask is non-empty; EOS is allowed iff the state is complete; a state that is
/// not complete allows a single-byte token; sampled mask bits equal accept_token.
#pragma once

#include <algorithm>
#include <bit>
#include <random>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include "tessera/models/common/grammar.hpp"

namespace tessera::verify {

namespace json = boost::json;

class SchemaFuzzer {
 public:
  /// `dsml_keys`: property names DSML can carry (no '"'), for tool parameters.
  SchemaFuzzer(std::mt19937_64& rng, bool dsml_keys) : rng_(rng), dsml_keys_(dsml_keys) {}

  /// A root schema (any kind of value) with its `$defs`, nesting up to `depth` levels.
  json::value root(int depth) {
    defs_ = {};
    json::value s = coin(0.1) ? self_referencing_object() : schema(depth);
    if (!defs_.empty() && s.is_object()) s.as_object()["$defs"] = defs_;
    return s;
  }
  /// A root object schema (tool parameters): declared properties, or a free-key / empty object.
  json::value object_root(int depth) {
    defs_ = {};
    json::value s;
    int const k = pick(10);
    if (k == 0) {
      s = json::object{{"type", "object"}};
    } else if (k == 1) {
      s = json::object{{"type", "object"}, {"additionalProperties", false}};
    } else if (k == 2) {
      s = json::object{{"type", "object"}, {"additionalProperties", schema(depth - 1)}};
    } else {
      s = declared_object(depth);
    }
    if (!defs_.empty()) s.as_object()["$defs"] = defs_;
    return s;
  }

 private:
  std::mt19937_64& rng_;
  bool dsml_keys_;
  json::object defs_;

  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  std::string key() {
    static char const* const plain[] = {"a", "b", "name", "id", "value", "x y", "ключ", "中文",
                                        "emoji😀", "", "k</think>", "tab\tkey", "back\\slash",
                                        "nl\nkey", "$ref", "type", "unit", "z9"};
    static char const* const quoted[] = {"q\"uote", "\"", "a\"b\"c"};
    if (!dsml_keys_ && coin(0.1)) return quoted[pick(3)];
    return plain[pick(static_cast<int>(std::size(plain)))];
  }

  json::value literal(int depth) {
    static char const* const strings[] = {"",       "a",   "ab",       "celsius", "q\"",
                                          "b\\s",   "l\nb", "ctrl\x01", "über",    "中文",
                                          "😀",     "1",   "true",     "null",    " spaced "};
    switch (pick(depth > 0 ? 8 : 6)) {
      case 0:
      case 1:
        return json::value(strings[pick(static_cast<int>(std::size(strings)))]);
      case 2: {
        static int64_t const ints[] = {0, 1, -1, 12, 123, -40, 9007199254740993LL, 100000};
        return json::value(ints[pick(static_cast<int>(std::size(ints)))]);
      }
      case 3: {
        static double const ds[] = {1.5, -0.25, 2.0, 1e20, 3.125e-5, -7.75};
        return json::value(ds[pick(static_cast<int>(std::size(ds)))]);
      }
      case 4:
        return json::value(coin(0.5));
      case 5:
        return json::value(nullptr);
      case 6: {
        json::array a;
        for (int i = pick(3); i > 0; --i) a.push_back(literal(depth - 1));
        return a;
      }
      default: {
        json::object o;
        for (int i = pick(3); i > 0; --i) o[key()] = literal(depth - 1);
        return o;
      }
    }
  }

  json::value string_schema() {
    json::object o{{"type", "string"}};
    if (coin(0.5)) {
      int64_t const mn = pick(4);
      if (coin(0.2))
        o["minLength"] = static_cast<double>(mn);  // integral doubles are counts too
      else
        o["minLength"] = mn;
      if (coin(0.6)) o["maxLength"] = mn + pick(7);
    } else if (coin(0.4)) {
      o["maxLength"] = pick(6);
    }
    return o;
  }

  json::value integer_schema() {
    json::object o{{"type", "integer"}};
    int const k = pick(6);
    int64_t const lo = static_cast<int64_t>(pick(2001)) - 1000;
    if (k == 1) o["minimum"] = lo;
    if (k == 2) o["maximum"] = lo;
    if (k == 3) {
      o["minimum"] = lo;
      o["maximum"] = lo + pick(30);
    }
    if (k == 4) {
      o["exclusiveMinimum"] = lo;
      o["exclusiveMaximum"] = lo + 2 + pick(5);
    }
    if (k == 5) {
      o["minimum"] = static_cast<double>(lo) + 0.5;  // fractional bounds on integers
      o["maximum"] = static_cast<double>(lo) + 3000000000000.25;
    }
    return o;
  }

  json::value number_schema() {
    json::object o{{"type", "number"}};
    int const k = pick(5);
    double const lo = (pick(4001) - 2000) / 8.0;
    if (k == 1) o["minimum"] = lo;
    if (k == 2) o["exclusiveMaximum"] = lo;
    if (k == 3) {
      o["minimum"] = lo;
      o["maximum"] = lo + pick(100) / 16.0 + 0.001;
    }
    if (k == 4) {
      o["exclusiveMinimum"] = lo;
      o["exclusiveMaximum"] = lo + 0.0625 * (1 + pick(4));
    }
    return o;
  }

  json::value leaf() {
    switch (pick(13)) {
      case 0:
      case 1:
        return string_schema();
      case 2:
        return integer_schema();
      case 3:
        return number_schema();
      case 4:
        return json::object{{"type", "boolean"}};
      case 5:
        return json::object{{"type", "null"}};
      case 6: {
        json::object o = string_schema().as_object();
        o["type"] = json::array{"string", "null"};
        return o;
      }
      case 7: {
        json::array e;
        for (int i = 1 + pick(5); i > 0; --i) e.push_back(literal(1));
        return json::object{{"enum", e}};
      }
      case 8:
        return json::object{{"const", literal(2)}};
      case 9:
        return json::object{{"type", json::array{"integer", "string"}}, {"minimum", 0}, {"maxLength", 4}};
      case 10:
        return json::object{{"type", "number"}};
      case 11:
        return coin(0.5) ? json::value(true) : json::value(json::object{});
      default:  // enum strings that are prefixes of each other
        return json::object{{"type", "string"}, {"enum", json::array{"x", "xy", "xyz", "y"}}};
    }
  }

  json::value declared_object(int depth) {
    json::object props;
    int const n = pick(6);
    for (int i = 0; i < n; ++i) props[key()] = schema(depth - 1);
    json::object o;
    if (coin(0.85)) o["type"] = "object";
    o["properties"] = props;
    json::array req;
    for (auto const& kv : props)
      if (coin(0.45)) req.push_back(json::value(kv.key()));
    if (!req.empty() || coin(0.2)) o["required"] = req;
    int const ap = pick(4);
    if (ap == 1) o["additionalProperties"] = false;
    if (ap == 2) o["additionalProperties"] = true;
    if (ap == 3) o["additionalProperties"] = leaf();
    return o;
  }

  /// A `$defs` entry used through `$ref`; recursive entries recurse only through optional paths.
  json::value ref(int depth) {
    std::string const name = "d" + std::to_string(defs_.size());
    if (defs_.size() < 4 && coin(0.5)) {
      json::object node{{"type", "object"},
                        {"properties",
                         json::object{{"v", leaf()},
                                      {"next", json::object{{"$ref", "#/$defs/" + name}}},
                                      {"kids", json::object{{"type", "array"},
                                                            {"items", json::object{{"$ref", "#/$defs/" + name}}},
                                                            {"maxItems", 2}}}}},
                        {"required", json::array{"v"}}};
      defs_[name] = json::object{};  // reserve the name before recursing
      defs_[name] = node;
    } else {
      defs_[name] = json::object{};
      defs_[name] = schema(depth - 1);
    }
    return json::object{{"$ref", "#/$defs/" + name}};
  }

  json::value self_referencing_object() {
    return json::object{{"type", "object"},
                        {"properties", json::object{{"label", string_schema()},
                                                    {"child", json::object{{"$ref", "#"}}}}},
                        {"required", json::array{"label"}}};
  }

  json::value schema(int depth) {
    if (depth <= 0) return leaf();
    switch (pick(12)) {
      case 0:
      case 1:
      case 2:
        return declared_object(depth);
      case 3: {
        json::object o{{"type", "object"}};
        if (coin(0.7)) o["additionalProperties"] = coin(0.2) ? json::value(false) : schema(depth - 1);
        return o;
      }
      case 4:
      case 5: {
        json::object o{{"type", "array"}};
        if (coin(0.9)) o["items"] = schema(depth - 1);
        if (coin(0.5)) {
          int64_t const mn = pick(3);
          o["minItems"] = mn;
          if (coin(0.6)) o["maxItems"] = mn + pick(4);
        } else if (coin(0.3)) {
          o["maxItems"] = pick(3);
        }
        return o;
      }
      case 6: {
        json::array alts;
        for (int i = 2 + pick(2); i > 0; --i) alts.push_back(schema(depth - 1));
        return json::object{{"anyOf", alts}};
      }
      case 7: {
        // Type-disjoint alternatives: the grammar compiles oneOf as anyOf.
        std::vector<char const*> types = {"string", "integer", "boolean", "null", "array", "object"};
        std::shuffle(types.begin(), types.end(), rng_);
        json::array alts;
        for (int i = 0, n = 2 + pick(2); i < n; ++i) {
          json::object a{{"type", types[i]}};
          if (std::string_view(types[i]) == "array") a["items"] = leaf();
          if (std::string_view(types[i]) == "string" && coin(0.5)) a["maxLength"] = 3;
          alts.push_back(a);
        }
        return json::object{{"oneOf", alts}};
      }
      case 8:
        return json::object{{"allOf", json::array{schema(depth - 1)}}};
      case 9:
        return ref(depth);
      default:
        return leaf();
    }
  }
};

/// Printable ASCII as is, everything else as \xNN (failure messages of byte strings).
inline std::string escaped(std::string const& s) {
  std::string o;
  static char const* hex = "0123456789abcdef";
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      o.push_back(static_cast<char>(c));
    } else {
      o += "\\x";
      o.push_back(hex[c >> 4]);
      o.push_back(hex[c & 15]);
    }
  }
  return o;
}

enum class Chooser { kGreedyLogits, kUniform, kLongest, kWhitespace, kSingleByte, kNesting, kEagerEos };
inline constexpr int kNumChoosers = 7;

struct FuzzWalk {
  std::string text;  // bytes of the accepted tokens (EOS excluded)
  bool finished = false;
  int steps = 0;
  int64_t allowed_total = 0;  // sum of mask popcounts
};

/// One constrained decoding run to EOS (see the file comment for the per-step checks). `logits`
/// (vocabulary size) drives kGreedyLogits.
inline FuzzWalk fuzz_walk(model::GrammarMatcher m, model::GrammarVocabulary const& v, Chooser how,
                          std::vector<float> const& logits, std::mt19937_64& rng, int explore,
                          int max_steps, std::string const& what) {
  FuzzWalk r;
  std::vector<uint32_t> mask(v.mask_words());
  std::vector<int32_t> allowed;
  std::string target;
  bool have_target = false;
  auto is_ws = [](std::string const& b) {
    return !b.empty() && b.find_first_not_of(" \n\r\t") == std::string::npos;
  };
  for (; r.steps < max_steps; ++r.steps) {
    m.fill_mask(mask.data());
    allowed.clear();
    bool eos_allowed = false, single_byte = false;
    for (int64_t w = 0; w < v.mask_words(); ++w)
      for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
        int32_t const id = static_cast<int32_t>(w * 32 + std::countr_zero(bits));
        allowed.push_back(id);
        if (v.is_eos(id)) eos_allowed = true;
        else if (v.token_bytes(id).size() == 1) single_byte = true;
      }
    r.allowed_total += static_cast<int64_t>(allowed.size());
    BOOST_REQUIRE_MESSAGE(!allowed.empty(), what << ": dead state (no token allowed) after \"" << escaped(r.text) << "\"");
    bool const complete = m.is_complete();
    BOOST_REQUIRE_MESSAGE(eos_allowed == complete, what << ": EOS allowed " << eos_allowed << " but complete "
                                                        << complete << " after \"" << escaped(r.text) << "\"");
    BOOST_REQUIRE_MESSAGE(complete || single_byte,
                          what << ": no single-byte token allowed in an incomplete state after \""
                               << escaped(r.text) << "\"");
    for (int k = 0; k < 6; ++k) {  // sampled mask bits against accept_token
      int32_t const id = k < 3 ? allowed[rng() % allowed.size()] : static_cast<int32_t>(rng() % v.size());
      bool const bit = (mask[id >> 5] >> (id & 31)) & 1;
      bool const acc = m.accept_token(id);
      if (acc) BOOST_REQUIRE(m.rollback(1));  // also undoes an accepted EOS
      BOOST_REQUIRE_MESSAGE(acc == bit, what << ": mask bit " << bit << " but accept_token " << acc << " for token "
                                             << id << " after \"" << escaped(r.text) << "\"");
    }
    if (r.steps >= explore && !have_target) {
      auto c = m.shortest_completion();
      BOOST_REQUIRE_MESSAGE(c.has_value(), what << ": no completion found after \"" << escaped(r.text) << "\"");
      target = *c;
      have_target = true;
    }
    int32_t pick = -1;
    if (have_target) {
      // Follow the completion: among the tokens that spell a prefix of it, the chooser's preference.
      std::vector<int32_t> fit;
      for (int32_t id : allowed) {
        if (v.is_eos(id)) {
          if (target.empty()) fit.push_back(id);
          continue;
        }
        std::string const& b = v.token_bytes(id);
        if (!target.empty() && target.compare(0, b.size(), b) == 0) fit.push_back(id);
      }
      BOOST_REQUIRE_MESSAGE(!fit.empty(), what << ": no token follows the completion \"" << escaped(target) << "\"");
      pick = fit[rng() % fit.size()];
      if (how == Chooser::kLongest || how == Chooser::kGreedyLogits)
        for (int32_t id : fit)
          if (!v.is_eos(id) && v.token_bytes(id).size() > v.token_bytes(pick).size()) pick = id;
    } else {
      std::vector<int32_t> pref;
      switch (how) {
        case Chooser::kGreedyLogits:
          pick = allowed[0];
          for (int32_t id : allowed)
            if (logits[id] > logits[pick]) pick = id;
          break;
        case Chooser::kUniform:
          pick = allowed[rng() % allowed.size()];
          break;
        case Chooser::kLongest:
          for (int32_t id : allowed)
            if (pick < 0 || v.token_bytes(id).size() > v.token_bytes(pick).size()) pick = id;
          break;
        case Chooser::kWhitespace:
          for (int32_t id : allowed)
            if (is_ws(v.token_bytes(id))) pref.push_back(id);
          break;
        case Chooser::kSingleByte:
          for (int32_t id : allowed)
            if (v.token_bytes(id).size() == 1) pref.push_back(id);
          break;
        case Chooser::kNesting:
          for (int32_t id : allowed)
            if (v.token_bytes(id).find_first_of("{[") != std::string::npos) pref.push_back(id);
          break;
        case Chooser::kEagerEos:
          for (int32_t id : allowed)
            if (v.is_eos(id)) pref.push_back(id);
          break;
      }
      if (pick < 0) pick = pref.empty() ? allowed[rng() % allowed.size()] : pref[rng() % pref.size()];
      // Random choosers stop early sometimes; the greedy one only when EOS wins on its logit.
      if (how != Chooser::kGreedyLogits && how != Chooser::kEagerEos && eos_allowed && !v.is_eos(pick) &&
          rng() % 4 == 0)
        pick = v.eos_ids()[0];
    }
    BOOST_REQUIRE_MESSAGE(m.accept_token(pick), what << ": the matcher rejected allowed token " << pick);
    if (v.is_eos(pick)) {
      BOOST_REQUIRE(m.is_terminated());
      r.finished = true;
      return r;
    }
    r.text += v.token_bytes(pick);
    if (have_target) target.erase(0, v.token_bytes(pick).size());
  }
  return r;
}

}  // namespace tessera::verify

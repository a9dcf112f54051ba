// SPDX-License-Identifier: Apache-2.0
/// Token-mask cost of the grammar matcher on the real DeepSeek vocabulary (129,280 ids,
/// ByteLevel-decoded from golden/tokenizer/deepseek-v3-tokenizer.json): for several JSON schemas,
/// json_object and a DSML tool grammar, decode with random token weights (a stand-in for a model),
/// time fill_mask at every step on one core, and print median / p99 / max microseconds per token.
/// "cold" = a fresh Grammar (empty state cache), "warm" = the same Grammar again; vocab_caches
/// "first_use" = the vocabulary's shared leaf cache was empty too (the first requests after
/// start-up), "warm" = it was filled by earlier grammars. One JSON object per line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "tessera/models/common/grammar.hpp"
#include "verify/grammar/grammar_vocab.hpp"

using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

struct Stats {
  std::vector<double> us;
  void add(double x) { us.push_back(x); }
  double pct(double p) {
    if (us.empty()) return 0;
    std::vector<double> v = us;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
  }
};

/// Generates up to `max_tokens` tokens (then steers to completion) and times every mask.
void run(std::string const& name, std::shared_ptr<model::Grammar const> const& g, int walks,
         int explore, uint64_t seed, Stats& st, int* tokens_out, int* bad_out) {
  auto const& v = g->vocab();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::vector<uint32_t> mask(v.mask_words());
  for (int w = 0; w < walks; ++w) {
    model::GrammarMatcher m(g);
    std::string target;
    bool have_target = false;
    for (int step = 0; step < 4000; ++step) {
      auto const t0 = Clock::now();
      m.fill_mask(mask.data());
      st.add(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      ++*tokens_out;
      if (step >= explore && !have_target) {
        auto c = m.shortest_completion();
        if (!c) {
          ++*bad_out;
          break;
        }
        target = *c;
        have_target = true;
      }
      // Random Gumbel-style choice among allowed tokens; steer along the completion once finishing.
      int32_t best = -1;
      double best_w = -1;
      for (int32_t id = 0; id < v.size(); ++id) {
        if (!((mask[id >> 5] >> (id & 31)) & 1)) continue;
        double x = U(rng);
        if (have_target) {
          if (v.is_eos(id))
            x = target.empty() ? 2.0 : -1.0;
          else {
            std::string const& b = v.token_bytes(id);
            x = (!target.empty() && target.compare(0, b.size(), b) == 0) ? x * double(b.size())
                                                                         : -1.0;
          }
        } else if (v.is_eos(id)) {
          x *= 0.5;
        }
        if (x > best_w) {
          best_w = x;
          best = id;
        }
      }
      if (best < 0 || best_w < 0) {
        ++*bad_out;
        break;
      }
      if (!m.accept_token(best)) {
        ++*bad_out;
        break;
      }
      if (v.is_eos(best)) break;
      if (have_target) target.erase(0, v.token_bytes(best).size());
    }
  }
  (void)name;
}

}  // namespace

int main() {
  auto const t0 = Clock::now();
  auto tv = verify::deepseek_vocab();
  if (tv.bytes.empty()) {
    std::printf("{\"error\": \"golden/tokenizer/deepseek-v3-tokenizer.json not found\"}\n");
    return 77;
  }
  auto const t1 = Clock::now();
  auto vocab = model::GrammarVocabulary::build(tv.bytes, {tv.eos}, tv.excluded).value_or_throw();
  auto const t2 = Clock::now();
  std::printf(
      "{\"what\": \"vocabulary\", \"tokens\": %lld, \"trie_nodes\": %zu, \"load_ms\": %.1f, "
      "\"trie_ms\": %.1f}\n",
      static_cast<long long>(vocab->size()), vocab->trie_nodes(),
      std::chrono::duration<double, std::milli>(t1 - t0).count(),
      std::chrono::duration<double, std::milli>(t2 - t1).count());

  struct Case {
    char const* name;
    char const* schema;
  };
  Case const cases[] = {
      {"person",
       R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
         "email":{"type":"string","maxLength":40},"tags":{"type":"array","items":{"type":"string"},"maxItems":4}},
         "required":["name","age","email","tags"],"additionalProperties":false})"},
      {"enum_anyof", R"({"type":"object","properties":{"unit":{"enum":["celsius","fahrenheit"]},
         "value":{"anyOf":[{"type":"number"},{"type":"null"}]},"note":{"type":"string"}},"required":["unit","value","note"]})"},
      {"recursive",
       R"({"$defs":{"n":{"type":"object","properties":{"id":{"type":"integer"},"label":{"type":"string"},
         "kids":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":3}},"required":["id","label","kids"]}},"$ref":"#/$defs/n"})"},
      {"json_object", nullptr},
      {"enum300", nullptr},
  };
  std::string enum300 =
      R"({"type":"array","items":{"type":"object","properties":{"code":{"enum":[)";
  for (int i = 0; i < 300; ++i)
    enum300 += (i ? ",\"c" : "\"c") + std::to_string(i * 7919 % 1000) + "\"";
  enum300 += R"(]},"n":{"type":"integer"}},"required":["code","n"]},"maxItems":6})";
  std::string const tools = R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "location":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},
      "required":["location"]}}},
    {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
      "query":{"type":"string"},"limit":{"type":"integer"},"filters":{"type":"object","properties":{"lang":{"type":"string"}}}},
      "required":["query"]}}}])";
  Stats all;
  for (int pass = 0; pass < 2; ++pass) {
    for (int k = 0; k < 6; ++k) {
      std::string name;
      std::shared_ptr<model::Grammar const> g;
      if (k < 5) {
        name = cases[k].name;
        if (k == 4)
          g = model::Grammar::from_json_schema(enum300, vocab).value_or_throw();
        else if (cases[k].schema)
          g = model::Grammar::from_json_schema(cases[k].schema, vocab).value_or_throw();
        else
          g = model::Grammar::json_object(vocab).value_or_throw();
      } else {
        name = "dsml_tools_required";
        std::vector<model::ToolSpec> specs;
        boost::json::value const tj = boost::json::parse(tools);
        for (auto const& t : tj.as_array())
          specs.push_back({std::string(t.at("function").at("name").as_string()),
                           boost::json::serialize(t.at("function").at("parameters"))});
        g = model::Grammar::tool_calls(specs, vocab).value_or_throw();
      }
      Stats st;
      int tokens = 0, bad = 0;
      auto const a = Clock::now();
      run(name, g, 3, 120, 1000 + k, st, &tokens, &bad);  // cold: fresh caches
      double const cold_ms = std::chrono::duration<double, std::milli>(Clock::now() - a).count();
      Stats warm;
      int wt = 0;
      run(name, g, 3, 120, 2000 + k, warm, &wt, &bad);  // warm: same grammar, caches filled
      if (pass == 1)
        for (double x : warm.us) all.add(x);
      {
        std::printf(
            "{\"what\": \"mask\", \"vocab_caches\": \"%s\", \"grammar\": \"%s\", \"tokens_cold\": "
            "%d, \"cold_median_us\": %.1f, "
            "\"cold_p99_us\": %.1f, \"cold_max_us\": %.1f, \"cold_total_ms\": %.1f, "
            "\"tokens_warm\": %d, "
            "\"warm_median_us\": %.1f, \"warm_p99_us\": %.1f, \"warm_max_us\": %.1f, \"failures\": "
            "%d}\n",
            pass == 0 ? "first_use" : "warm", name.c_str(), tokens, st.pct(0.5), st.pct(0.99),
            st.pct(1.0), cold_ms, wt, warm.pct(0.5), warm.pct(0.99), warm.pct(1.0), bad);
      }
      if (bad) return 1;
    }
  }
  {  // start-up cost of prewarm_grammar_caches on a fresh vocabulary
    auto fresh = model::GrammarVocabulary::build(tv.bytes, {tv.eos}, tv.excluded).value_or_throw();
    auto const p0 = Clock::now();
    model::prewarm_grammar_caches(fresh);
    std::printf("{\"what\": \"prewarm\", \"ms\": %.1f}\n",
                std::chrono::duration<double, std::milli>(Clock::now() - p0).count());
  }
  std::printf(
      "{\"what\": \"mask_all_warm\", \"tokens\": %zu, \"median_us\": %.1f, \"p99_us\": %.1f}\n",
      all.us.size(), all.pct(0.5), all.pct(0.99));
  return 0;
}

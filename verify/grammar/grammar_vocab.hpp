// SPDX-License-Identifier: Apache-2.0
/// Vocabularies for grammar tests and benches: a small synthetic byte-level vocabulary with tokens
/// that span JSON tokens, split UTF-8 and escapes, and DSML pieces; and the real DeepSeek-V3 BPE
/// vocabulary (golden/tokenizer/deepseek-v3-tokenizer.json, ByteLevel-decoded) with the V4.1
/// special ids of spec/chat-format.md §1.4 that matter here (EOS 1, <think> 128821, </think>
/// 128822, ｜DSML｜ 128825).
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "tessera/models/common/grammar.hpp"
#include "verify/common/golden.hpp"

namespace tessera::verify {

struct TestVocab {
  std::vector<std::string> bytes;
  int32_t eos = -1;
  std::vector<int32_t> excluded;
};

inline TestVocab synthetic_vocab() {
  TestVocab v;
  for (int b = 0; b < 256; ++b) v.bytes.push_back(std::string(1, static_cast<char>(b)));
  char const* multi[] = {
      "{\"",
      "\":",
      "\",",
      "\"}",
      "},",
      "}]",
      "[{",
      "\": \"",
      "\", \"",
      "\":\"",
      "true",
      "false",
      "null",
      "nu",
      "ll",
      "tr",
      "ue",
      "12",
      "345",
      "-1",
      "0.",
      ".5",
      "e+",
      "E-1",
      "\"},{\"",
      "\":[",
      "\"]}",
      ",\"",
      "\"]",
      "[\"",
      "name",
      "age",
      "id",
      "tags",
      "children",
      " the",
      "hello",
      "ab",
      "xyz",
      "\xC3\xA9",
      "\xE4\xB8\xAD\xE6\x96\x87",
      "\xE4\xB8",
      "\xAD",
      "\\\"",
      "\\\\",
      "\\n",
      "\\u00",
      "e9",
      "\\ud83d",
      "  ",
      "\n  ",
      " \"",
      "\": ",
      ", ",
      "{}",
      "[]",
      "\"\"",
      "00",
      "10",
      "11",
      "1e5",
      "99",
      "q\\\"uote",
      "nl\\nkey",
      "\xC3\xBCn\xC3\xAF",
      "celsius",
      "fahrenheit",
      "two",
      "\xEF\xBD\x9C"
      "DSML"
      "\xEF\xBD\x9C",
      "</",
      " calls",
      ">\n",
      " invoke",
      " name=\"",
      "\">\n",
      " parameter",
      " string=\"",
      "true\">",
      "false\">",
      "\n\n",
      "</think>",
      "think",
      "get_weather",
      "location",
      "unit",
      "Beijing",
      "days",
      "search",
      "query",
      "filters",
      "lang",
      "noargs",
      "free",
      "\"}\n",
      "}}",
      "\xF0\x9F\x98\x80",
      "\xF0",
      "\x9F\x98",
      "\x80",
      "\xC0\x80",
      "\xED\xA0\x80",
      "\\u",
      "d800",
      "00e9",
      "\n\n<",
      "\xE2\x80\xA6",
  };
  for (char const* m : multi) v.bytes.emplace_back(m);
  v.bytes.push_back("name");  // a duplicate byte string
  v.eos = static_cast<int32_t>(v.bytes.size());
  v.bytes.push_back(
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>");
  v.excluded.push_back(static_cast<int32_t>(v.bytes.size()));
  v.bytes.push_back("<\xEF\xBD\x9CUser\xEF\xBD\x9C>");
  return v;
}

/// The DeepSeek V3 vocabulary at the V4.1 size (129,280): base BPE ids decoded to raw bytes;
/// special ids excluded except EOS and the three text-bearing tokens the grammars use.
inline TestVocab deepseek_vocab() {
  TestVocab v;
  std::ifstream in(golden_dir() + "/tokenizer/deepseek-v3-tokenizer.json");
  if (!in) return v;
  std::stringstream ss;
  ss << in.rdbuf();
  boost::json::value const j = boost::json::parse(ss.str());
  v.bytes.assign(129280, std::string());
  for (auto const& kv : j.at("model").at("vocab").as_object()) {
    int64_t const id = kv.value().to_number<int64_t>();
    std::string b;
    if (id >= 0 && id < 129280 && model::byte_level_decode(kv.key(), &b)) v.bytes[id] = b;
  }
  v.eos = 1;
  v.bytes[1] =
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  v.bytes[128821] = "<think>";
  v.bytes[128822] = "</think>";
  v.bytes[128825] =
      "\xEF\xBD\x9C"
      "DSML"
      "\xEF\xBD\x9C";
  v.excluded = {0, 2};
  for (int32_t id = 128000; id < 129280; ++id)
    if (id != 128821 && id != 128822 && id != 128825) v.excluded.push_back(id);
  return v;
}

}  // namespace tessera::verify

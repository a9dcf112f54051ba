// SPDX-License-Identifier: Apache-2.0
/// The DeepSeek-V4.1 added-token table (spec/chat-format.md §1.4) and the tokenizer loader that overlays it
/// on a V3/V4 tokenizer.json, whose base vocabulary and merges V4.1 shares (§1.5).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tessera/models/deepseek_v41/chat.hpp"

namespace tessera::models::deepseek_v41::chat {

namespace {

std::string placeholder_mm(int n) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "<|place_holder_mm_span_%04d|>", n);
  return buf;
}

}  // namespace

std::vector<AddedToken> v41_added_tokens() {
  std::vector<AddedToken> t;
  t.reserve(1283);
  // special: dropped by skip_special decoding; normalized mirrors the V4 file (false for special tokens).
  auto add = [&](TokenId id, std::string content, bool special, bool normalized) {
    AddedToken a;
    a.id = id;
    a.content = std::move(content);
    a.special = special;
    a.normalized = normalized;
    t.push_back(std::move(a));
  };
  add(0, std::string(kBos), true, false);
  add(1, std::string(kEos), true, false);
  add(2, "<｜▁pad▁｜>", true, false);
  for (int n = 0; n <= 798; ++n) add(128000 + n, "<｜place▁holder▁no▁" + std::to_string(n) + "｜>", true, false);
  add(128799, std::string(kSystem), false, true);
  char const* const plain[] = {
      "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>",
      "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
      "<｜tool▁sep｜>", "<｜begin▁of▁repo▁name｜>", "<｜end▁of▁repo▁name｜>", "<｜begin▁of▁file▁name｜>",
      "<｜end▁of▁file▁name｜>", "<｜begin▁of▁file｜>", "<｜end▁of▁file｜>", "<think>", "</think>",
      "<｜place▁holder▁for▁copy｜>", "<｜place▁holder▁for▁pointer▁replace｜>", "｜DSML｜", "<｜begin▁sys｜>",
      "<｜end▁sys｜>", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
      "<｜task｜>", "<｜political｜>", "<｜entity｜>", "<｜title｜>", "<｜safety｜>", "<｜answer｜>", "<｜search｜>",
      "<dsml:", "</dsml:", "<｜search▁begin｜>", "<｜search▁end｜>", "<｜extracted_url｜>", "<｜read_url｜>"};
  TokenId id = 128800;
  for (char const* s : plain) add(id++, s, false, true);
  add(id++, "<｜end_of_query｜>", true, false);   // 128846
  for (int n = 21; n <= 435; ++n) add(id++, placeholder_mm(n), true, false);   // 128847‥129261
  add(id++, "<｜rl_image_pad｜>", true, false);     // 129262
  add(id++, "<｜rl_image_start｜>", true, false);   // 129263
  add(id++, std::string(kImagePlaceholder), false, false);   // 129264
  for (int n = 436; n <= 441; ++n) add(id++, placeholder_mm(n), true, false);  // 129265‥129270
  for (char const* s : {"<｜/polygon｜>", "<｜polygon｜>", "<｜/point｜>", "<｜point｜>", "<｜/box｜>", "<｜box｜>",
                        "<｜/ref｜>", "<｜ref｜>"})
    add(id++, s, true, false);                     // 129271‥129278
  add(id++, placeholder_mm(442), true, false);     // 129279
  return t;
}

Result<Tokenizer> load_tokenizer(std::string const& path, Overlay overlay) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("tokenizer: cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  TokenizerOptions with_table;
  with_table.added_tokens_override = v41_added_tokens();
  if (overlay == Overlay::kAlways) return Tokenizer::from_json(text, path, with_table);
  auto tok = Tokenizer::from_json(text, path);
  if (!tok || overlay == Overlay::kNever) return tok;
  auto const* sys = tok->added_token(128799);
  if (sys && sys->content == kSystem) return tok;
  return Tokenizer::from_json(text, path, with_table);
}

Result<SpecialIds> special_ids(Tokenizer const& tok) {
  SpecialIds ids{};
  struct Want {
    TokenId* dst;
    std::string_view content;
  };
  Want const wants[] = {{&ids.bos, kBos}, {&ids.eos, kEos}, {&ids.system, kSystem}, {&ids.user, kUser},
                        {&ids.assistant, kAssistant}, {&ids.think_start, kThinkStart},
                        {&ids.think_end, kThinkEnd}, {&ids.dsml, kDsml}, {&ids.latest_reminder, kLatestReminder},
                        {&ids.image, kImagePlaceholder}};
  for (auto const& w : wants) {
    auto id = tok.token_id(w.content);
    if (!id || !tok.added_token(*id))
      return not_found("tokenizer has no added token \"" + std::string(w.content) +
                       "\" (a V3/V4 file needs the V4.1 overlay: chat::load_tokenizer)");
    *w.dst = *id;
  }
  return ids;
}

}  // namespace tessera::models::deepseek_v41::chat

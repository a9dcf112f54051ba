// SPDX-License-Identifier: Apache-2.0
/// The model module's DeepSeek-V4.1 chat format behind the routes' interfaces: `chat::encode_conversation`
/// (byte-exact with the reference encoder), tokenized in safe mode with a real tokenizer (user text never
/// becomes special tokens) or through the codec otherwise, and the streaming tolerant `chat::OutputParser`
/// (spec/chat-format.md §2–§3).
#include "servers/openai/routes/deepseek_chat.hpp"

#include <random>

#include <boost/json.hpp>

namespace tessera::server {
namespace chat = models::deepseek_v41::chat;
namespace {

std::string new_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static char const* kHex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

class DeepseekChatFormat final : public ChatFormat {
 public:
  explicit DeepseekChatFormat(models::Tokenizer const* tok) : tok_(tok) {}

  Result<std::string> render(std::vector<ChatMessage> const& messages, ChatRenderOptions const& opt) const override {
    auto p = prompt(messages, opt);
    if (!p.ok()) return p.status();
    return p->text();
  }
  Result<std::vector<int32_t>> encode(std::vector<ChatMessage> const& messages, ChatRenderOptions const& opt,
                                      TextCodec const& codec) const override {
    auto p = prompt(messages, opt);
    if (!p.ok()) return p.status();
    if (tok_) return chat::tokenize_prompt(*p, *tok_, chat::TokenizeMode::kSafe);
    return codec.encode(p->text(), true);
  }

 private:
  Result<chat::Prompt> prompt(std::vector<ChatMessage> const& messages, ChatRenderOptions const& opt) const {
    std::vector<chat::Message> ms;
    ms.reserve(messages.size());
    for (auto const& m : messages) {
      chat::Message c;
      c.role = m.role;
      c.content = m.content;
      c.reasoning_content = m.reasoning;
      for (auto const& t : m.tool_calls) c.tool_calls.push_back({t.id, t.name, t.arguments});
      c.tool_call_id = m.tool_call_id;
      ms.push_back(std::move(c));
    }
    std::vector<chat::Tool> tools;
    for (auto const& t : opt.tools) tools.push_back({boost::json::serialize(t)});
    chat::EncodeOptions o;
    o.thinking = opt.thinking;
    o.reasoning_effort = opt.effort;
    o.drop_thinking = opt.drop_thinking;
    if (opt.response_schema) o.response_format_json = boost::json::serialize(*opt.response_schema);
    return chat::encode_conversation(ms, tools, o);
  }
  models::Tokenizer const* tok_;
};

class DeepseekOutputParser final : public OutputParser {
 public:
  explicit DeepseekOutputParser(bool thinking) : p_(chat::OutputParser::Options{thinking}) {}
  void feed(std::string_view text, OutputDelta& out) override { take(p_.feed(text), out); }
  void finish(OutputDelta& out) override { take(p_.finish(), out); }
  int tool_call_count() const override { return static_cast<int>(p_.message().tool_calls.size()); }

 private:
  void take(chat::ParseDelta const& d, OutputDelta& out) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (auto const& t : d.tool_calls) {
      OutputDelta::Tool x;
      x.index = t.index;
      x.begin = t.begin;
      if (t.begin) x.id = new_call_id();
      x.name = t.name;
      x.arguments = t.arguments;
      out.tools.push_back(std::move(x));
    }
  }
  chat::OutputParser p_;
};

}  // namespace

std::unique_ptr<ChatFormat> make_deepseek_chat_format(models::Tokenizer const* tok) {
  return std::make_unique<DeepseekChatFormat>(tok);
}
std::unique_ptr<OutputParser> make_deepseek_output_parser(bool thinking, bool /*parse_tools*/) {
  // DSML is always parsed: markup never reaches content, and undeclared calls surface as tool_calls.
  return std::make_unique<DeepseekOutputParser>(thinking);
}

std::vector<int32_t> tokenizer_eos_ids(TextCodec const& codec) {
  if (auto id = codec.special_id("<｜end▁of▁sentence｜>")) return {*id};
  return {};
}

}  // namespace tessera::server

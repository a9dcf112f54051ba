// SPDX-License-Identifier: Apache-2.0
/// `TextCodec` over the byte-level BPE `models::Tokenizer` (spec/chat-format.md §1): special tokens typed
/// in prompts become their ids (exact mode), token bytes are raw (the routes assemble UTF-8).
#include "servers/openai/routes/tokenizer_codec.hpp"

namespace tessera::server {
namespace {

class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(models::Tokenizer tok, std::string name) : tok_(std::move(tok)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(tok_.vocab_size()); }
  std::vector<int32_t> encode(std::string_view text, bool special) const override {
    auto r = tok_.encode(text, special);
    if (!r.ok()) throw Error(r.status());  // only invalid UTF-8 fails; request bodies are validated before
    return std::move(*r);
  }
  std::string token_bytes(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= tok_.vocab_size()) return {};
    return tok_.token_bytes(id);
  }
  std::optional<int32_t> special_id(std::string_view token) const override {
    auto id = tok_.token_id(token);
    if (!id || !tok_.added_token(*id)) return std::nullopt;
    return *id;
  }

 private:
  models::Tokenizer tok_;
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<TextCodec>> load_tokenizer_codec(std::string const& path, models::TokenizerOptions const& options) {
  auto tok = models::Tokenizer::from_file(path, options);
  if (!tok.ok()) return tok.status();
  return std::unique_ptr<TextCodec>(std::make_unique<TokenizerCodec>(std::move(*tok), path));
}

}  // namespace tessera::server

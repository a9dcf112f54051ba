// SPDX-License-Identifier: Apache-2.0
/// Request → grammar constraint (see constraints.hpp).
#include "servers/openai/routes/constraints.hpp"

#include <algorithm>
#include <vector>

#include <boost/json.hpp>

namespace tessera::server {
namespace {

/// A grammar matcher as the engine's constraint. The text is done when the grammar has accepted an end
/// token, or — for a model without an end-of-sequence id, whose vocabulary has nothing to end with — when
/// the text is complete and no further byte is allowed (e.g. `{}` followed by the whitespace bound):
/// the engine must never be handed an empty mask.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<model::Grammar const> g, int64_t vocab, bool has_eos)
      : m_(std::move(g)), words_(static_cast<size_t>((vocab + 31) / 32)), has_eos_(has_eos) {}
  void fill_mask(uint32_t* words) override { m_.fill_mask(words); }
  void accept(int32_t token) override { m_.accept_token(token); }
  bool done() const override {
    if (m_.is_terminated()) return true;
    if (has_eos_ || !m_.is_complete()) return false;
    std::vector<uint32_t> mask(words_);
    m_.fill_mask(mask.data());
    return std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; });
  }

 private:
  model::GrammarMatcher m_;
  size_t words_;
  bool has_eos_;
};

}  // namespace

bool wants_constraint(ApiRequest const& r) {
  return r.chat && (r.tool_choice == "required" || r.tool_choice == "function" || r.response_format == "json_schema" ||
                    r.response_format == "json_object");
}

Result<std::shared_ptr<ConstraintFactory const>> ConstraintFactory::create(TextCodec const& codec, std::vector<int32_t> const& eos_ids) {
  std::vector<std::string> bytes(static_cast<size_t>(codec.vocab_size()));
  for (int64_t v = 0; v < codec.vocab_size(); ++v) bytes[v] = codec.token_bytes(static_cast<int32_t>(v));
  std::vector<int32_t> keep;
  for (char const* t : {"</think>", "｜DSML｜"})
    if (auto id = codec.special_id(t)) keep.push_back(*id);
  std::vector<int32_t> excluded;
  for (int32_t id : codec.special_ids())
    if (std::find(keep.begin(), keep.end(), id) == keep.end() && std::find(eos_ids.begin(), eos_ids.end(), id) == eos_ids.end())
      excluded.push_back(id);
  auto vocab = model::GrammarVocabulary::build(std::move(bytes), eos_ids, std::move(excluded));
  if (!vocab.ok()) return vocab.status();
  auto f = std::make_shared<ConstraintFactory>();
  f->vocab_ = std::move(*vocab);
  f->has_eos_ = !eos_ids.empty();
  return std::shared_ptr<ConstraintFactory const>(std::move(f));
}

std::variant<std::shared_ptr<TokenConstraint>, ApiError> ConstraintFactory::for_request(ApiRequest const& r) const {
  model::GrammarOptions opt;
  opt.thinking_prefix = r.chat && r.render.thinking;
  Result<std::shared_ptr<model::Grammar const>> g = Status(StatusCode::kInternal, "no grammar");
  std::string param;
  if (r.chat && (r.tool_choice == "required" || r.tool_choice == "function")) {
    std::vector<model::ToolSpec> tools;
    for (auto const& fn : r.render.tools) {
      auto const& o = fn.as_object();
      std::string name(o.at("name").as_string());
      if (r.tool_choice == "function" && name != r.tool_choice_name) continue;
      auto p = o.find("parameters");
      tools.push_back({name, p != o.end() && !p->value().is_null() ? boost::json::serialize(p->value()) : std::string()});
    }
    g = model::Grammar::tool_calls(tools, vocab_, opt, r.parallel_tool_calls ? 0 : 1);
    param = "tools";
  } else if (r.chat && r.response_format == "json_schema") {
    g = model::Grammar::from_json_schema(*r.render.response_schema, vocab_, opt);
    param = "response_format.json_schema.schema";
  } else if (r.chat && r.response_format == "json_object") {
    g = model::Grammar::json_object(vocab_, opt);
    param = "response_format";
  } else {
    return std::shared_ptr<TokenConstraint>();
  }
  if (!g.ok()) return ApiError{400, "cannot constrain decoding: " + g.status().message(), "invalid_request_error", param, ""};
  return std::shared_ptr<TokenConstraint>(std::make_shared<GrammarConstraint>(std::move(*g), vocab_->size(), has_eos_));
}

}  // namespace tessera::server

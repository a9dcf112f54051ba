// SPDX-License-Identifier: Apache-2.0
/// Grammars of whole replies: a JSON value (response_format) and the DSML tool-call block of
/// spec/chat-format.md §2.1/§3.1 for tool_choice `required` / named:
///
///   [REASONING "</think>"]                      (GrammarOptions::thinking_prefix)
///   "\n\n<｜DSML｜ calls>\n"
///   ( "<｜DSML｜ invoke name=\"" NAME "\">\n" PARAMS "</｜DSML｜ invoke>\n" ){1, max_calls}
///   "</｜DSML｜ calls>"                           then EOS
///   PARAMS := "\n"                                (no parameter: `name="t">\n\n</｜DSML｜
///   invoke>`)
///           | ( "<｜DSML｜ parameter name=\"" KEY "\" string=\"true\">" RAW "</｜DSML｜
///           parameter>\n"
///             | "<｜DSML｜ parameter name=\"" KEY "\" string=\"false\">" JSON "</｜DSML｜
///             parameter>\n" )+
///
/// KEY: a declared property (raw bytes), each at most once, any order, all `required` present.
/// string="true" is offered when the property's schema admits strings: RAW is the unescaped text
/// (UTF-8, never containing `｜DSML｜`, within min/maxLength; enum/const strings verbatim).
/// string="false" is offered for every property: JSON is a value of the property's schema (strings
/// in it never contain `｜DSML｜`). The reference parser rebuilds `arguments` as {"KEY":
/// json.dumps(RAW) | JSON, …}, which then satisfies the tool's schema. REASONING is UTF-8 text
/// without `｜DSML｜`. A tool whose parameters declare no properties takes at most one parameter
/// (any key without `"`), since a finite state cannot rule out a repeated free key.
#include <boost/json.hpp>

#include "models/common/grammar/grammar_impl.hpp"
#include "models/common/grammar/schema.hpp"

namespace tessera::model {

using namespace grammar_detail;
namespace json = boost::json;

namespace {

constexpr char kDsml[] =
    "\xEF\xBD\x9C"
    "DSML"
    "\xEF\xBD\x9C";  // ｜DSML｜ (U+FF5C bars)
std::string const kParamEnd = std::string("</") + kDsml + " parameter>\n";

int32_t free_text(GrammarDef& g, std::string terminator, int64_t min = 0,
                  int64_t max = kUnbounded) {
  Node n;
  n.kind = NodeKind::kFreeText;
  n.lit = std::move(terminator);
  n.forbidden = {kDsml};
  n.min = min;
  n.max = max;
  return g.add(std::move(n));
}

/// The string="true" value node of a property schema, or kNone if the schema admits no string.
Result<int32_t> raw_node(GrammarDef& g, SchemaCompiler& sc, json::value const& schema,
                         std::string const& path, int depth = 0) {
  if (depth > 16) return kNone;
  auto r = sc.resolve(schema, path);
  if (!r) return r.status();
  json::value const& s = **r;
  if (s.is_bool()) return s.get_bool() ? free_text(g, kParamEnd) : kNone;
  if (!s.is_object()) return kNone;
  json::object const& o = s.get_object();
  // String enum/const values verbatim, each followed by the parameter end (one literal trie).
  auto raw_values = [&](std::vector<json::value const*> const& vs) -> int32_t {
    std::vector<std::string> lits;
    for (auto const* v : vs)
      if (v->is_string() && std::string_view(v->get_string()).find(kDsml) == std::string_view::npos)
        lits.push_back(std::string(v->get_string()) + kParamEnd);
    return lits.empty() ? kNone : g.literal_set(std::move(lits));
  };
  if (auto const* c = o.if_contains("const")) return raw_values({c});
  if (auto const* e = o.if_contains("enum")) {
    std::vector<json::value const*> vs;
    if (e->is_array())
      for (auto const& v : e->get_array()) vs.push_back(&v);
    return raw_values(vs);
  }
  for (char const* kw : {"anyOf", "oneOf", "allOf"}) {
    if (auto const* a = o.if_contains(kw); a && a->is_array()) {
      std::vector<int32_t> alts;
      for (auto const& v : a->get_array()) {
        auto n = raw_node(g, sc, v, path, depth + 1);
        if (!n) return n.status();
        if (*n != kNone) alts.push_back(*n);
      }
      return alts.empty() ? kNone : g.alt(std::move(alts));
    }
  }
  bool admits = false;
  if (auto const* t = o.if_contains("type")) {
    if (t->is_string())
      admits = t->get_string() == "string";
    else if (t->is_array())
      for (auto const& x : t->get_array())
        admits = admits || (x.is_string() && x.get_string() == "string");
  } else {
    admits = !o.contains("properties") && !o.contains("items");
  }
  if (!admits) return kNone;
  // The counts the JSON path compiles (SchemaCompiler validated them: non-negative integral numbers).
  auto count = [&](char const* k, int64_t d) -> int64_t {
    auto const* v = o.if_contains(k);
    if (!v) return d;
    if (v->is_int64()) return v->get_int64();
    if (v->is_uint64()) return static_cast<int64_t>(v->get_uint64());
    if (v->is_double()) return static_cast<int64_t>(v->get_double());
    return d;
  };
  return free_text(g, kParamEnd, count("minLength", 0), count("maxLength", kUnbounded));
}

Status check_name(std::string const& name, std::string const& what) {
  if (name.find('"') != std::string::npos || name.find(kDsml) != std::string::npos)
    return invalid_argument(what + " \"" + name +
                            "\" contains '\"' or ｜DSML｜, which DSML cannot carry");
  return {};
}

/// The DSML parameter list of one tool.
Result<int32_t> dsml_params(GrammarDef& g, json::value const& params, std::string const& path) {
  Node n;
  n.kind = NodeKind::kDsmlParams;
  n.helpers.assign(kNumDsmlHelpers, kNone);
  n.helpers[kParamOpen] = g.literal(std::string("<") + kDsml + " parameter name=\"");
  n.helpers[kStringTrue] = g.literal(" string=\"true\">");
  n.helpers[kStringFalse] = g.literal(" string=\"false\">");
  n.helpers[kParamClose] = g.literal(kParamEnd);
  n.helpers[kNewline] = g.literal("\n");
  if (params.is_null()) return g.add(std::move(n));
  SchemaCompiler sc(g, params, kDsml);
  auto r = sc.resolve(params, path);
  if (!r) return r.status();
  json::value const& s = **r;
  if (!s.is_object())
    return invalid_argument(path + ": tool parameters must be a JSON schema object");
  json::object const& o = s.get_object();
  if (auto const* t = o.if_contains("type"); t && !(t->is_string() && t->get_string() == "object"))
    return invalid_argument(path + "/type: tool parameters must be of type \"object\"");
  // The parameter list is built from properties / required / additionalProperties alone: keywords that
  // would constrain the object as a whole cannot be honoured here.
  TESSERA_TRY(SchemaCompiler::check_supported(o, path));
  for (char const* kw : {"anyOf", "oneOf", "allOf", "enum", "const"})
    if (o.contains(kw))
      return invalid_argument("schema error at " + path + ": keyword \"" + kw +
                              "\" at the root of tool parameters is not supported by constrained decoding");
  auto const* props = o.if_contains("properties");
  if (props && !props->is_object())
    return invalid_argument(path + "/properties: must be an object");
  if (props && !props->get_object().empty()) {
    if (props->get_object().size() > 64)
      return invalid_argument(path + "/properties: more than 64 properties");
    for (auto const& kv : props->get_object()) {
      std::string const key(kv.key());
      TESSERA_TRY(check_name(key, path + ": property"));
      std::string const p = path + "/properties/" + key;
      auto jv = sc.compile(kv.value(), p);
      if (!jv) return jv.status();
      auto rv = raw_node(g, sc, kv.value(), p);
      if (!rv) return rv.status();
      n.keys.push_back(key);
      n.children.push_back(*jv);
      n.raw.push_back(*rv);
    }
    if (auto const* req = o.if_contains("required")) {
      if (!req->is_array())
        return invalid_argument(path + "/required: must be an array of strings");
      for (auto const& rq : req->get_array()) {
        size_t i = 0;
        while (rq.is_string() && i < n.keys.size() && n.keys[i] != rq.get_string()) ++i;
        if (!rq.is_string() || i == n.keys.size())
          return invalid_argument(path + "/required: " + json::serialize(rq) +
                                  " is not a declared property");
        n.required |= uint64_t{1} << i;
      }
    }
    return g.add(std::move(n));
  }
  auto const* ap = o.if_contains("additionalProperties");
  if (ap && ap->is_bool() && !ap->get_bool()) return g.add(std::move(n));  // no parameters at all
  json::value const any = true;
  json::value const& vs = (ap && !ap->is_bool()) ? *ap : any;
  auto jv = sc.compile(vs, path + "/additionalProperties");
  if (!jv) return jv.status();
  auto rv = raw_node(g, sc, vs, path + "/additionalProperties");
  if (!rv) return rv.status();
  n.helpers[kFreeKey] = free_text(g, "\"");
  n.helpers[kFreeJson] = *jv;
  n.helpers[kFreeRaw] = *rv;
  return g.add(std::move(n));
}

std::unique_ptr<GrammarDef> new_def(GrammarOptions const& opt) {
  auto d = std::make_unique<GrammarDef>();
  d->max_depth = opt.max_depth;
  d->max_ws = opt.max_whitespace;
  return d;
}

int32_t thinking(GrammarDef& g) { return free_text(g, "</think>"); }

Result<std::shared_ptr<Grammar const>> finish(std::unique_ptr<GrammarDef> d,
                                              std::shared_ptr<GrammarVocabulary const> vocab) {
  if (!vocab) return invalid_argument("grammar: no vocabulary");
  if (d->max_depth < 4 || d->max_depth > 1000)
    return invalid_argument("grammar: max_depth must be in [4, 1000]");
  if (d->max_ws < 0 || d->max_ws > 64)
    return invalid_argument("grammar: max_whitespace must be in [0, 64]");
  TESSERA_TRY(d->finalize());
  return make_grammar(std::move(d), std::move(vocab));
}

Result<std::shared_ptr<Grammar const>> json_root(std::unique_ptr<GrammarDef> d, int32_t value,
                                                 GrammarOptions const& opt,
                                                 std::shared_ptr<GrammarVocabulary const> vocab) {
  Node ws;
  ws.kind = NodeKind::kWs;
  int32_t const w1 = d->add(ws), w2 = d->add(ws);
  std::vector<int32_t> parts;
  if (opt.thinking_prefix) parts.push_back(thinking(*d));
  parts.insert(parts.end(), {w1, value, w2});
  d->root = d->seq(std::move(parts));
  return finish(std::move(d), std::move(vocab));
}

}  // namespace

Result<std::shared_ptr<Grammar const>> Grammar::from_json_schema(
    json::value const& schema, std::shared_ptr<GrammarVocabulary const> vocab,
    GrammarOptions const& opt) {
  auto d = new_def(opt);
  int32_t value;
  {
    SchemaCompiler sc(*d, schema);
    auto r = sc.compile(schema, "");
    if (!r) return r.status();
    value = *r;
  }
  return json_root(std::move(d), value, opt, std::move(vocab));
}

Result<std::shared_ptr<Grammar const>> Grammar::from_json_schema(
    std::string_view schema_json, std::shared_ptr<GrammarVocabulary const> vocab,
    GrammarOptions const& opt) {
  boost::system::error_code ec;
  json::value const v = json::parse(schema_json, ec);
  if (ec) return invalid_argument("schema is not valid JSON: " + ec.message());
  return from_json_schema(v, std::move(vocab), opt);
}

Result<std::shared_ptr<Grammar const>> Grammar::json_object(
    std::shared_ptr<GrammarVocabulary const> vocab, GrammarOptions const& opt) {
  json::value const schema = {{"type", "object"}};
  return from_json_schema(schema, std::move(vocab), opt);
}

Result<std::shared_ptr<Grammar const>> Grammar::tool_calls(
    std::span<ToolSpec const> tools, std::shared_ptr<GrammarVocabulary const> vocab,
    GrammarOptions const& opt, int max_calls) {
  if (tools.empty())
    return invalid_argument("tools: at least one tool is needed for a tool-call grammar");
  auto d = new_def(opt);
  GrammarDef& g = *d;
  std::vector<int32_t> invokes;
  for (size_t i = 0; i < tools.size(); ++i) {
    ToolSpec const& t = tools[i];
    std::string const path = "tools[" + std::to_string(i) + "].function.parameters";
    if (t.name.empty())
      return invalid_argument("tools[" + std::to_string(i) + "].function.name: empty");
    TESSERA_TRY(check_name(t.name, "tools[" + std::to_string(i) + "].function.name"));
    json::value params;
    if (!t.parameters_json.empty()) {
      boost::system::error_code ec;
      params = json::parse(t.parameters_json, ec);
      if (ec) return invalid_argument(path + ": not valid JSON: " + ec.message());
    }
    auto p = dsml_params(g, params, path);
    if (!p) return p.status();
    invokes.push_back(g.seq(
        {g.literal(t.name + "\">\n"), *p, g.literal(std::string("</") + kDsml + " invoke>\n")}));
  }
  Node rep;
  rep.kind = NodeKind::kRepeat;
  rep.item =
      g.seq({g.literal(std::string("<") + kDsml + " invoke name=\""), g.alt(std::move(invokes))});
  rep.min = 1;
  rep.max = max_calls > 0 ? max_calls : kUnbounded;
  int32_t const calls = g.add(std::move(rep));
  std::vector<int32_t> parts;
  if (opt.thinking_prefix) parts.push_back(thinking(g));
  parts.push_back(g.literal(std::string("\n\n<") + kDsml + " calls>\n"));
  parts.push_back(calls);
  parts.push_back(g.literal(std::string("</") + kDsml + " calls>"));
  g.root = g.seq(std::move(parts));
  return finish(std::move(d), std::move(vocab));
}

Result<std::function<GrammarMatcher()>> tool_call_matcher_factory(
    json::value const& tools_json, json::value const* choice,
    std::shared_ptr<GrammarVocabulary const> vocab, GrammarOptions const& opt,
    bool parallel_tool_calls) {
  std::string named;
  if (choice && !choice->is_null()) {
    if (choice->is_string()) {
      std::string_view const c = choice->get_string();
      if (c == "auto" || c == "none") return std::function<GrammarMatcher()>();
      if (c != "required")
        return invalid_argument(
            "tool_choice: expected \"none\", \"auto\", \"required\" or an object");
    } else if (choice->is_object()) {
      // Chat Completions: {"type":"function","function":{"name":…}}; Responses:
      // {"type":"function","name":…}.
      auto const* f = choice->get_object().if_contains("function");
      auto const* nm = f && f->is_object() ? f->get_object().if_contains("name")
                                           : choice->get_object().if_contains("name");
      if (!nm || !nm->is_string())
        return invalid_argument("tool_choice.function.name: missing or not a string");
      named = std::string(nm->get_string());
    } else {
      return invalid_argument("tool_choice: expected a string or an object");
    }
  } else {
    return std::function<GrammarMatcher()>();
  }
  if (!tools_json.is_array() || tools_json.get_array().empty())
    return invalid_argument("tools: tool_choice requires a non-empty tools array");
  std::vector<ToolSpec> specs;
  size_t i = 0;
  for (auto const& t : tools_json.get_array()) {
    std::string const at = "tools[" + std::to_string(i++) + "]";
    if (!t.is_object()) return invalid_argument(at + ": must be an object");
    auto const* ty = t.get_object().if_contains("type");
    if (ty && !(ty->is_string() && ty->get_string() == "function"))
      return invalid_argument(at + ".type: only \"function\" tools are supported");
    auto const* f = t.get_object().if_contains("function");
    if (!f || !f->is_object()) return invalid_argument(at + ".function: missing");
    auto const* nm = f->get_object().if_contains("name");
    if (!nm || !nm->is_string())
      return invalid_argument(at + ".function.name: missing or not a string");
    ToolSpec s{std::string(nm->get_string()), {}};
    if (auto const* p = f->get_object().if_contains("parameters"); p && !p->is_null())
      s.parameters_json = json::serialize(*p);
    if (named.empty() || s.name == named) specs.push_back(std::move(s));
  }
  if (specs.empty())
    return invalid_argument("tool_choice.function.name: \"" + named + "\" is not among the tools");
  auto g = Grammar::tool_calls(specs, std::move(vocab), opt, parallel_tool_calls ? 0 : 1);
  if (!g) return g.status();
  std::shared_ptr<Grammar const> gp = *g;
  return std::function<GrammarMatcher()>([gp] { return GrammarMatcher(gp); });
}

void prewarm_grammar_caches(std::shared_ptr<GrammarVocabulary const> const& vocab) {
  // The leaf tables every request meets first: text inside a JSON string, reasoning text before
  // </think>, and a raw DSML parameter value. Each costs one walk of the vocabulary trie.
  std::vector<uint32_t> mask(vocab->mask_words());
  if (auto g = Grammar::json_object(vocab, GrammarOptions{.thinking_prefix = true}); g.ok()) {
    GrammarMatcher m(*g);
    m.fill_mask(mask.data());
    if (m.accept_bytes("x</think>{\"k\": \"v")) m.fill_mask(mask.data());
  }
  ToolSpec const tool{"t", R"({"type":"object","properties":{"a":{"type":"string"}}})"};
  if (auto g = Grammar::tool_calls(std::span<ToolSpec const>(&tool, 1), vocab); g.ok()) {
    GrammarMatcher m(*g);
    if (m.accept_bytes(std::string("\n\n<") + kDsml + " calls>\n<" + kDsml +
                       " invoke name=\"t\">\n<" + kDsml +
                       " parameter name=\"a\" string=\"true\">v"))
      m.fill_mask(mask.data());
  }
}

Result<std::function<GrammarMatcher()>> response_format_matcher_factory(
    json::value const& rf, std::shared_ptr<GrammarVocabulary const> vocab,
    GrammarOptions const& opt) {
  if (!rf.is_object()) return invalid_argument("response_format: must be an object");
  auto const* t = rf.get_object().if_contains("type");
  if (!t || !t->is_string())
    return invalid_argument("response_format.type: missing or not a string");
  Result<std::shared_ptr<Grammar const>> g = invalid_argument("unset");
  if (t->get_string() == "text") return std::function<GrammarMatcher()>();
  if (t->get_string() == "json_object") {
    g = Grammar::json_object(std::move(vocab), opt);
  } else if (t->get_string() == "json_schema") {
    auto const* js = rf.get_object().if_contains("json_schema");
    auto const* s = js && js->is_object() ? js->get_object().if_contains("schema") : nullptr;
    if (!s) return invalid_argument("response_format.json_schema.schema: missing");
    g = Grammar::from_json_schema(*s, std::move(vocab), opt);
  } else {
    return invalid_argument(
        "response_format.type: expected \"text\", \"json_object\" or \"json_schema\"");
  }
  if (!g) return g.status();
  std::shared_ptr<Grammar const> gp = *g;
  return std::function<GrammarMatcher()>([gp] { return GrammarMatcher(gp); });
}

}  // namespace tessera::model

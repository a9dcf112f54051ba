// SPDX-License-Identifier: Apache-2.0
/// JSON schema → grammar nodes. Supported (the OpenAI strict-mode subset and a little more):
///   type (string or list), object {properties, required, additionalProperties}, array {items,
///   minItems, maxItems}, string {minLength, maxLength (code points; an escape counts as one)},
///   integer/number {minimum, maximum, exclusiveMinimum, exclusiveMaximum (number or draft-4
///   boolean)}, boolean, null, enum, const, anyOf, oneOf (compiled as anyOf), allOf with one
///   member, $ref to "#", "#/$defs/…" or "#/definitions/…" (recursion allowed), nested freely.
/// Semantics chosen for generation:
///   * an object with `properties` admits only those keys (additionalProperties is treated as
///   false;
///     OpenAI strict mode requires false anyway), in any order, each at most once, `required` ones
///     mandatory; without `properties` it admits any keys with values of `additionalProperties` (or
///     any value; `false` → only `{}`); at most 64 declared properties;
///   * keys and const/enum strings are emitted in the canonical escaping of
///   json.dumps(ensure_ascii=False)
///     (`"`, `\`, \b \f \n \r \t escaped, other C0 as \u00XX); const/enum arrays and objects as
///     compact JSON text;
///   * strings: \u escapes of surrogates are not generated (non-BMP text is raw UTF-8);
///   * numbers: at most 20 integer, 20 fraction and 2 exponent digits (always a finite double);
///     integers ≤ 18 digits (int64-safe). With bounds: non-integers without exponent, ≤ 12 integer
///     and ≤ 6 fraction digits, bounds rounded to 10^-6;
///   * `format`, `description`, `title`, `default`, `examples`, `$schema`, `$id`, `strict` are
///   ignored;
///     `pattern`, `patternProperties`, `multipleOf`, `prefixItems`, `not`, `if`, `uniqueItems:
///     true`, `contains`, `minContains`, `maxContains`, `minProperties`, `maxProperties`,
///     `propertyNames`, `dependentRequired`, `dependentSchemas`, `dependencies`,
///     `unevaluatedProperties`, `unevaluatedItems`, `$dynamicRef`, `$recursiveRef` are rejected with
///     an error naming the keyword and its location;
///   * with a forbidden string (｜DSML｜ in tool arguments), const/enum values containing it are
///     dropped (an error when none is left).
#include <charconv>
#include <cmath>
#include <unordered_map>

#include <boost/json.hpp>

#include "models/common/grammar/grammar_impl.hpp"
#include "models/common/grammar/schema.hpp"

namespace tessera::model::grammar_detail {

namespace json = boost::json;

std::string json_escape(std::string_view s) {
  std::string o;
  static char const* hex = "0123456789abcdef";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\b':
        o += "\\b";
        break;
      case '\f':
        o += "\\f";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      default:
        if (c < 0x20) {
          o += "\\u00";
          o += hex[c >> 4];
          o += hex[c & 15];
        } else
          o += static_cast<char>(c);
    }
  }
  return o;
}

std::string json_text(json::value const& v) {
  switch (v.kind()) {
    case json::kind::null:
      return "null";
    case json::kind::bool_:
      return v.get_bool() ? "true" : "false";
    case json::kind::int64:
      return std::to_string(v.get_int64());
    case json::kind::uint64:
      return std::to_string(v.get_uint64());
    case json::kind::double_: {
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, v.get_double());
      std::string s(buf, r.ptr);
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    case json::kind::string: {
      std::string s(1, '"');
      s.append(json_escape(v.get_string()));
      s.push_back('"');
      return s;
    }
    case json::kind::array: {
      std::string s = "[";
      bool first = true;
      for (auto const& e : v.get_array()) {
        if (!first) s += ",";
        first = false;
        s += json_text(e);
      }
      return s + "]";
    }
    case json::kind::object: {
      std::string s = "{";
      bool first = true;
      for (auto const& kv : v.get_object()) {
        if (!first) s += ",";
        first = false;
        s.push_back('"');
        s.append(json_escape(kv.key()));
        s.append("\":");
        s.append(json_text(kv.value()));
      }
      return s + "}";
    }
  }
  return "null";
}

namespace {

struct CompileError {
  std::string msg;
};

[[noreturn]] void fail(std::string const& path, std::string const& what) {
  throw CompileError{"schema error at " + (path.empty() ? std::string("#") : path) + ": " + what};
}

bool as_number(json::value const& v, double* out) {
  if (v.is_int64()) {
    *out = static_cast<double>(v.get_int64());
    return true;
  }
  if (v.is_uint64()) {
    *out = static_cast<double>(v.get_uint64());
    return true;
  }
  if (v.is_double()) {
    *out = v.get_double();
    return true;
  }
  return false;
}

int64_t get_count(json::object const& o, char const* key, std::string const& path, int64_t dflt) {
  auto const* v = o.if_contains(key);
  if (!v) return dflt;
  double d;
  if (!as_number(*v, &d) || d < 0 || d != std::floor(d) || d > 1e15)
    fail(path + "/" + key, "must be a non-negative integer");
  return static_cast<int64_t>(d);
}

void require_supported(json::object const& o, std::string const& path) {
  for (char const* kw :
       {"pattern", "patternProperties", "multipleOf", "prefixItems", "not", "if", "contains",
        "minContains", "maxContains", "minProperties", "maxProperties", "propertyNames", "dependentRequired",
        "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"})
    if (o.contains(kw))
      fail(path, std::string("keyword \"") + kw + "\" is not supported by constrained decoding");
  if (auto const* u = o.if_contains("uniqueItems"); u && u->is_bool() && u->get_bool())
    fail(path, "keyword \"uniqueItems\": true is not supported by constrained decoding");
}

}  // namespace

struct SchemaCompiler::Impl {
  GrammarDef& g;
  json::value const& root;
  std::unordered_map<std::string, int32_t> refs;
  int32_t any_value = kNone;
  std::string forbid;

  int32_t compile(json::value const& s, std::string const& path);
  int32_t compile_ref(std::string const& ref, std::string const& path);
  int32_t compile_typed(json::object const& o, std::string const& type, std::string const& path);
  int32_t any();
  int32_t string_node(int64_t min, int64_t max);
  int32_t number_node(json::object const& o, bool integer, std::string const& path);
};

SchemaCompiler::SchemaCompiler(GrammarDef& g, json::value const& root, std::string forbid)
    : impl_(new Impl{g, root, {}, kNone, std::move(forbid)}) {}
SchemaCompiler::~SchemaCompiler() { delete impl_; }

Result<int32_t> SchemaCompiler::compile(json::value const& schema, std::string const& path) {
  try {
    return impl_->compile(schema, path);
  } catch (CompileError const& e) {
    return invalid_argument(e.msg);
  }
}

Result<json::value const*> SchemaCompiler::resolve(json::value const& schema,
                                                   std::string const& path) {
  json::value const* s = &schema;
  for (int hops = 0; hops < 32; ++hops) {
    if (!s->is_object()) return s;
    auto const* r = s->get_object().if_contains("$ref");
    if (!r) return s;
    if (!r->is_string())
      return invalid_argument("schema error at " + path + ": $ref must be a string");
    std::string const ref(r->get_string());
    json::value const* t = nullptr;
    if (ref == "#") {
      t = &impl_->root;
    } else {
      for (char const* pre : {"#/$defs/", "#/definitions/"}) {
        std::string const p(pre);
        if (ref.rfind(p, 0) != 0 || !impl_->root.is_object()) continue;
        auto const* defs = impl_->root.get_object().if_contains(p.substr(2, p.size() - 3));
        if (defs && defs->is_object()) t = defs->get_object().if_contains(ref.substr(p.size()));
      }
    }
    if (!t)
      return invalid_argument("schema error at " + path + ": unresolvable $ref \"" + ref + "\"");
    s = t;
  }
  return invalid_argument("schema error at " + path + ": $ref chain too long");
}

Status SchemaCompiler::check_supported(json::object const& schema, std::string const& path) {
  try {
    require_supported(schema, path);
    return {};
  } catch (CompileError const& e) {
    return invalid_argument(e.msg);
  }
}

int32_t SchemaCompiler::Impl::any() {
  if (any_value != kNone) return any_value;
  // any = object | array | string | number | true | false | null (recursive through node ids).
  any_value = g.alt({});
  Node obj;
  obj.kind = NodeKind::kObject;
  obj.helpers = {string_node(0, kUnbounded)};
  obj.item = any_value;
  int32_t const o = g.add(std::move(obj));
  Node arr;
  arr.kind = NodeKind::kArray;
  arr.item = any_value;
  int32_t const a = g.add(std::move(arr));
  Node num;
  num.kind = NodeKind::kNumber;
  int32_t const n = g.add(std::move(num));
  int32_t const str = string_node(0, kUnbounded);
  g.nodes[any_value].children = {
      o, a, str, n, g.literal("true"), g.literal("false"), g.literal("null")};
  return any_value;
}

int32_t SchemaCompiler::Impl::string_node(int64_t min, int64_t max) {
  Node n;
  n.kind = NodeKind::kString;
  n.min = min;
  n.max = max;
  if (!forbid.empty()) n.forbidden = {forbid};
  return g.add(std::move(n));
}

int32_t SchemaCompiler::Impl::compile_ref(std::string const& ref, std::string const& path) {
  if (auto it = refs.find(ref); it != refs.end()) return it->second;
  int32_t const placeholder = g.alt({});
  refs[ref] = placeholder;
  json::value const* t = nullptr;
  if (ref == "#") {
    t = &root;
  } else {
    for (char const* pre : {"#/$defs/", "#/definitions/"}) {
      std::string const p(pre);
      if (ref.rfind(p, 0) != 0 || !root.is_object()) continue;
      auto const* defs = root.get_object().if_contains(p.substr(2, p.size() - 3));
      if (defs && defs->is_object()) t = defs->get_object().if_contains(ref.substr(p.size()));
    }
  }
  if (!t)
    fail(path, "unresolvable $ref \"" + ref + "\" (only #, #/$defs/NAME and #/definitions/NAME)");
  int32_t const target = compile(*t, ref.substr(1));
  g.nodes[placeholder].children = {target};
  return placeholder;
}

int32_t SchemaCompiler::Impl::compile(json::value const& s, std::string const& path) {
  if (s.is_bool()) {
    if (!s.get_bool()) fail(path, "schema `false` admits no value");
    return any();
  }
  if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
  json::object const& o = s.get_object();
  require_supported(o, path);
  if (auto const* r = o.if_contains("$ref")) {
    if (!r->is_string()) fail(path + "/$ref", "must be a string");
    return compile_ref(std::string(r->get_string()), path);
  }
  // const/enum values as compact JSON text; values containing the forbidden string (｜DSML｜ inside tool
  // arguments) are never generated.
  auto allowed = [&](std::string const& text) { return forbid.empty() || text.find(forbid) == std::string::npos; };
  if (auto const* c = o.if_contains("const")) {
    std::string text = json_text(*c);
    if (!allowed(text))
      fail(path + "/const", "the value contains \"" + forbid + "\", which DSML tool arguments cannot carry");
    return g.literal(std::move(text));
  }
  if (auto const* e = o.if_contains("enum")) {
    if (!e->is_array() || e->get_array().empty()) fail(path + "/enum", "must be a non-empty array");
    std::vector<std::string> values;
    for (auto const& v : e->get_array())
      if (std::string text = json_text(v); allowed(text)) values.push_back(std::move(text));
    if (values.empty())
      fail(path + "/enum", "every value contains \"" + forbid + "\", which DSML tool arguments cannot carry");
    return g.literal_set(std::move(values));
  }
  for (char const* kw : {"anyOf", "oneOf"}) {
    if (auto const* a = o.if_contains(kw)) {
      if (!a->is_array() || a->get_array().empty())
        fail(path + "/" + kw, "must be a non-empty array");
      std::vector<int32_t> alts;
      size_t i = 0;
      for (auto const& v : a->get_array())
        alts.push_back(compile(v, path + "/" + kw + "/" + std::to_string(i++)));
      return g.alt(std::move(alts));
    }
  }
  if (auto const* a = o.if_contains("allOf")) {
    if (!a->is_array() || a->get_array().size() != 1)
      fail(path + "/allOf", "only a single-member allOf is supported");
    return compile(a->get_array()[0], path + "/allOf/0");
  }
  auto const* t = o.if_contains("type");
  if (!t) {
    if (o.contains("properties") || o.contains("additionalProperties") || o.contains("required"))
      return compile_typed(o, "object", path);
    if (o.contains("items") || o.contains("minItems") || o.contains("maxItems"))
      return compile_typed(o, "array", path);
    return any();
  }
  if (t->is_string()) return compile_typed(o, std::string(t->get_string()), path);
  if (t->is_array()) {
    if (t->get_array().empty()) fail(path + "/type", "must not be empty");
    std::vector<int32_t> alts;
    for (auto const& x : t->get_array()) {
      if (!x.is_string()) fail(path + "/type", "entries must be strings");
      alts.push_back(compile_typed(o, std::string(x.get_string()), path));
    }
    return alts.size() == 1 ? alts[0] : g.alt(std::move(alts));
  }
  fail(path + "/type", "must be a string or an array of strings");
}

int32_t SchemaCompiler::Impl::number_node(json::object const& o, bool integer,
                                          std::string const& path) {
  Node n;
  n.kind = NodeKind::kNumber;
  n.integer = integer;
  double lo = -INFINITY, hi = INFINITY;
  bool lo_x = false, hi_x = false;
  double d;
  if (auto const* v = o.if_contains("minimum")) {
    if (!as_number(*v, &d)) fail(path + "/minimum", "must be a number");
    lo = d;
  }
  if (auto const* v = o.if_contains("maximum")) {
    if (!as_number(*v, &d)) fail(path + "/maximum", "must be a number");
    hi = d;
  }
  if (auto const* v = o.if_contains("exclusiveMinimum")) {
    if (v->is_bool())
      lo_x = v->get_bool();
    else if (as_number(*v, &d)) {
      if (d >= lo || std::isinf(lo)) {
        lo = d;
        lo_x = true;
      }
    } else
      fail(path + "/exclusiveMinimum", "must be a number");
  }
  if (auto const* v = o.if_contains("exclusiveMaximum")) {
    if (v->is_bool())
      hi_x = v->get_bool();
    else if (as_number(*v, &d)) {
      if (d <= hi || std::isinf(hi)) {
        hi = d;
        hi_x = true;
      }
    } else
      fail(path + "/exclusiveMaximum", "must be a number");
  }
  if (std::isinf(lo) && std::isinf(hi)) {
    n.int_cap = integer ? 18 : 20;
    n.frac_cap = 20;
    return g.add(std::move(n));
  }
  n.bounded = true;
  n.int_cap = integer ? 18 : 12;
  n.frac_cap = integer ? 0 : 6;
  long double const scale = integer ? 1.0L : 1e6L;
  long double const lim = integer ? 9.99e17L : 9.99e17L;  // |value| in units
  auto to_units = [&](double x, bool is_lo, bool excl) -> int64_t {
    if (std::isinf(x)) return is_lo ? -static_cast<int64_t>(lim) : static_cast<int64_t>(lim);
    long double const u = static_cast<long double>(x) * scale;
    if (std::fabs(u) > lim)
      fail(path, "bound " + std::to_string(x) + " is outside the supported range");
    long double const r = std::nearbyint(u);
    bool const exact = std::fabs(u - r) <= 1e-9L * std::max<long double>(1.0L, std::fabs(u));
    int64_t v;
    if (exact)
      v = static_cast<int64_t>(r) + (excl ? (is_lo ? 1 : -1) : 0);
    else
      v = static_cast<int64_t>(is_lo ? std::ceil(u) : std::floor(u));
    return v;
  };
  n.lo_units = to_units(lo, true, lo_x);
  n.hi_units = to_units(hi, false, hi_x);
  if (n.lo_units > n.hi_units)
    fail(path,
         std::string("the range admits no ") + (integer ? "integer" : "number with ≤ 6 decimals"));
  return g.add(std::move(n));
}

int32_t SchemaCompiler::Impl::compile_typed(json::object const& o, std::string const& type,
                                            std::string const& path) {
  if (type == "null") return g.literal("null");
  if (type == "boolean") return g.literal_set({"true", "false"});
  if (type == "integer") return number_node(o, true, path);
  if (type == "number") return number_node(o, false, path);
  if (type == "string") {
    int64_t const mn = get_count(o, "minLength", path, 0),
                  mx = get_count(o, "maxLength", path, kUnbounded);
    if (mn > mx) fail(path, "minLength > maxLength");
    if (mx != kUnbounded && mx > 100000) fail(path + "/maxLength", "above the supported 100000");
    return string_node(mn, mx);
  }
  if (type == "array") {
    Node n;
    n.kind = NodeKind::kArray;
    n.min = get_count(o, "minItems", path, 0);
    n.max = get_count(o, "maxItems", path, kUnbounded);
    if (n.min > n.max) fail(path, "minItems > maxItems");
    if (n.max != kUnbounded && n.max > 1000000) n.max = kUnbounded;
    auto const* it = o.if_contains("items");
    if (it && it->is_array())
      fail(path + "/items", "tuple form is not supported (use prefixItems-free schemas)");
    n.item = it ? compile(*it, path + "/items") : any();
    return g.add(std::move(n));
  }
  if (type == "object") {
    Node n;
    n.kind = NodeKind::kObject;
    auto const* props = o.if_contains("properties");
    if (props && !props->is_object()) fail(path + "/properties", "must be an object");
    if (props && !props->get_object().empty()) {
      if (props->get_object().size() > 64)
        fail(path + "/properties", "more than 64 properties are not supported");
      for (auto const& kv : props->get_object()) {
        n.keys.push_back(json_escape(kv.key()));
        n.children.push_back(compile(kv.value(), path + "/properties/" + std::string(kv.key())));
      }
      if (auto const* req = o.if_contains("required")) {
        if (!req->is_array()) fail(path + "/required", "must be an array of strings");
        for (auto const& r : req->get_array()) {
          if (!r.is_string()) fail(path + "/required", "must be an array of strings");
          std::string const k = json_escape(r.get_string());
          size_t i = 0;
          while (i < n.keys.size() && n.keys[i] != k) ++i;
          if (i == n.keys.size()) {
            std::string msg(1, '"');
            msg.append(r.get_string().data(), r.get_string().size());
            msg.append("\" is not a declared property");
            fail(path + "/required", msg);
          }
          n.required |= uint64_t{1} << i;
        }
      }
      return g.add(std::move(n));
    }
    if (auto const* req = o.if_contains("required");
        req && req->is_array() && !req->get_array().empty())
      fail(path + "/required", "required keys need declared properties");
    auto const* ap = o.if_contains("additionalProperties");
    if (ap && ap->is_bool() && !ap->get_bool()) return g.literal("{}");
    n.helpers = {string_node(0, kUnbounded)};
    n.item = (ap && !ap->is_bool()) ? compile(*ap, path + "/additionalProperties") : any();
    return g.add(std::move(n));
  }
  fail(path + "/type", "unknown type \"" + type + "\"");
}

}  // namespace tessera::model::grammar_detail

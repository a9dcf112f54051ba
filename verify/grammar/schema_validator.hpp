// SPDX-License-Identifier: Apache-2.0
/// A small JSON-schema validator for the subset the grammar supports, written from the JSON Schema
/// definitions independently of the grammar compiler: type, enum, const, anyOf, oneOf (exactly
/// one), allOf, $ref (#, #/$defs/…, #/definitions/…), properties/required/additionalProperties,
/// items, minItems/maxItems, minLength/maxLength (code points), minimum/maximum/exclusive bounds.
#pragma once

#include <cmath>
#include <string>

#include <boost/json.hpp>

namespace tessera::verify {

class SchemaValidator {
 public:
  explicit SchemaValidator(boost::json::value const& root) : root_(root) {}

  /// Empty string = valid; otherwise the first violation found.
  std::string validate(boost::json::value const& v) const { return check(v, root_, "$", 0); }

 private:
  boost::json::value const& root_;

  static bool num(boost::json::value const& v, double* d) {
    if (v.is_int64()) {
      *d = double(v.get_int64());
      return true;
    }
    if (v.is_uint64()) {
      *d = double(v.get_uint64());
      return true;
    }
    if (v.is_double()) {
      *d = v.get_double();
      return true;
    }
    return false;
  }
  static bool equal(boost::json::value const& a, boost::json::value const& b) {
    double x, y;
    if (num(a, &x) && num(b, &y)) return x == y;
    if (a.kind() != b.kind()) return false;
    if (a.is_array()) {
      auto const& p = a.get_array();
      auto const& q = b.get_array();
      if (p.size() != q.size()) return false;
      for (size_t i = 0; i < p.size(); ++i)
        if (!equal(p[i], q[i])) return false;
      return true;
    }
    if (a.is_object()) {
      auto const& p = a.get_object();
      auto const& q = b.get_object();
      if (p.size() != q.size()) return false;
      for (auto const& kv : p) {
        auto const* o = q.if_contains(kv.key());
        if (!o || !equal(kv.value(), *o)) return false;
      }
      return true;
    }
    return a == b;
  }
  static size_t code_points(boost::json::string const& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }
  bool has_type(boost::json::value const& v, std::string_view t) const {
    double d;
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_bool();
    if (t == "string") return v.is_string();
    if (t == "array") return v.is_array();
    if (t == "object") return v.is_object();
    if (t == "number") return num(v, &d);
    if (t == "integer")
      return num(v, &d) && std::floor(d) == d &&
             (v.is_int64() || v.is_uint64() || std::fabs(d) < 1e15);
    return false;
  }
  boost::json::value const* deref(std::string const& ref) const {
    if (ref == "#") return &root_;
    for (std::string pre : {"#/$defs/", "#/definitions/"}) {
      if (ref.rfind(pre, 0) != 0) continue;
      auto const* defs = root_.as_object().if_contains(pre.substr(2, pre.size() - 3));
      if (defs) return defs->as_object().if_contains(ref.substr(pre.size()));
    }
    return nullptr;
  }

  std::string check(boost::json::value const& v, boost::json::value const& s, std::string const& at,
                    int depth) const {
    if (depth > 200) return at + ": recursion too deep";
    if (s.is_bool()) return s.get_bool() ? "" : at + ": schema false";
    auto const& o = s.as_object();
    if (auto const* r = o.if_contains("$ref")) {
      auto const* t = deref(std::string(r->as_string()));
      if (!t) return at + ": bad $ref";
      return check(v, *t, at, depth + 1);
    }
    if (auto const* c = o.if_contains("const"); c && !equal(v, *c)) return at + ": const mismatch";
    if (auto const* e = o.if_contains("enum")) {
      bool hit = false;
      for (auto const& x : e->as_array()) hit = hit || equal(v, x);
      if (!hit) return at + ": not in enum";
    }
    if (auto const* a = o.if_contains("anyOf")) {
      bool hit = false;
      for (auto const& x : a->as_array()) hit = hit || check(v, x, at, depth + 1).empty();
      if (!hit) return at + ": matches no anyOf alternative";
    }
    if (auto const* a = o.if_contains("oneOf")) {
      int hits = 0;
      for (auto const& x : a->as_array()) hits += check(v, x, at, depth + 1).empty();
      if (hits != 1) return at + ": matches " + std::to_string(hits) + " oneOf alternatives";
    }
    if (auto const* a = o.if_contains("allOf"))
      for (auto const& x : a->as_array())
        if (auto e = check(v, x, at, depth + 1); !e.empty()) return e;
    if (auto const* t = o.if_contains("type")) {
      bool ok = false;
      if (t->is_string())
        ok = has_type(v, t->as_string());
      else
        for (auto const& x : t->as_array()) ok = ok || has_type(v, x.as_string());
      if (!ok) return at + ": wrong type";
    }
    double d, b;
    if (num(v, &d)) {
      if (auto const* x = o.if_contains("minimum"); x && num(*x, &b) && d < b)
        return at + ": below minimum";
      if (auto const* x = o.if_contains("maximum"); x && num(*x, &b) && d > b)
        return at + ": above maximum";
      if (auto const* x = o.if_contains("exclusiveMinimum"); x && num(*x, &b) && d <= b)
        return at + ": not above exclusiveMinimum";
      if (auto const* x = o.if_contains("exclusiveMaximum"); x && num(*x, &b) && d >= b)
        return at + ": not below exclusiveMaximum";
    }
    if (v.is_string()) {
      size_t const n = code_points(v.get_string());
      if (auto const* x = o.if_contains("minLength"); x && num(*x, &b) && n < b)
        return at + ": shorter than minLength";
      if (auto const* x = o.if_contains("maxLength"); x && num(*x, &b) && n > b)
        return at + ": longer than maxLength";
    }
    if (v.is_array()) {
      auto const& arr = v.get_array();
      if (auto const* x = o.if_contains("minItems"); x && num(*x, &b) && arr.size() < b)
        return at + ": too few items";
      if (auto const* x = o.if_contains("maxItems"); x && num(*x, &b) && arr.size() > b)
        return at + ": too many items";
      if (auto const* it = o.if_contains("items"))
        for (size_t i = 0; i < arr.size(); ++i)
          if (auto e = check(arr[i], *it, at + "[" + std::to_string(i) + "]", depth + 1);
              !e.empty())
            return e;
    }
    if (v.is_object()) {
      auto const& obj = v.get_object();
      auto const* props = o.if_contains("properties");
      if (auto const* req = o.if_contains("required"))
        for (auto const& r : req->as_array())
          if (!obj.contains(r.as_string()))
            return at + ": missing required " + std::string(r.as_string());
      auto const* ap = o.if_contains("additionalProperties");
      for (auto const& kv : obj) {
        std::string const sub = at + "." + std::string(kv.key());
        auto const* ps = props ? props->as_object().if_contains(kv.key()) : nullptr;
        if (ps) {
          if (auto e = check(kv.value(), *ps, sub, depth + 1); !e.empty()) return e;
        } else if (ap) {
          if (auto e = check(kv.value(), *ap, sub, depth + 1); !e.empty()) return e;
        }
      }
    }
    return "";
  }
};

}  // namespace tessera::verify

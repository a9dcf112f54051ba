// SPDX-License-Identifier: Apache-2.0
/// JSON schema → grammar nodes (see schema.cpp for the supported subset and its generation
/// semantics).
#pragma once

#include <string>
#include <string_view>

#include <boost/json/fwd.hpp>

#include "tessera/core/status.hpp"

#include "models/common/grammar/grammar_impl.hpp"

namespace tessera::model::grammar_detail {

/// Canonical JSON string escaping (json.dumps, ensure_ascii=False), without the quotes.
std::string json_escape(std::string_view s);
/// Compact JSON text of a value (doubles in shortest round-trip form with a ".0" when integral).
std::string json_text(boost::json::value const& v);

/// Compiles schemas into `g`, resolving $ref against `root` (which must outlive the compiler).
class SchemaCompiler {
 public:
  /// `forbid` (optional) is a byte string no JSON string value may contain raw.
  SchemaCompiler(GrammarDef& g, boost::json::value const& root, std::string forbid = {});
  ~SchemaCompiler();
  SchemaCompiler(SchemaCompiler const&) = delete;
  SchemaCompiler& operator=(SchemaCompiler const&) = delete;
  /// The node of a JSON value satisfying `schema`; `path` names it in errors (JSON pointer).
  Result<int32_t> compile(boost::json::value const& schema, std::string const& path);
  /// Fails naming the first keyword of `schema` (itself, not its sub-schemas) that constrained
  /// decoding does not support.
  static Status check_supported(boost::json::object const& schema, std::string const& path);
  /// Follows $ref chains to the schema object they name.
  Result<boost::json::value const*> resolve(boost::json::value const& schema,
                                            std::string const& path);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace tessera::model::grammar_detail

// SPDX-License-Identifier: Apache-2.0
/// Strict JSON parsing for checkpoint headers and index files: Boost.JSON, plus detection of duplicate
/// object keys (Boost.JSON's DOM keeps the last of equal keys silently; a checkpoint header with two
/// entries of one name is ambiguous and therefore malformed). One SAX pass (`basic_parser`) keeps the set
/// of keys of every open object; a second pass builds the DOM. Internal to ops/io.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "tessera/core/status.hpp"

namespace tessera::io::detail {

/// SAX handler that fails on the first key repeated inside one object and remembers where.
class DuplicateKeyHandler {
 public:
  static constexpr std::size_t max_object_size = std::size_t(-1);
  static constexpr std::size_t max_array_size = std::size_t(-1);
  static constexpr std::size_t max_key_size = std::size_t(-1);
  static constexpr std::size_t max_string_size = std::size_t(-1);

  std::string duplicate;  // the repeated key, empty if none
  std::string parent;     // the key of the object that holds it ("<root>" at the top)

  bool on_document_begin(boost::json::error_code&) { return true; }
  bool on_document_end(boost::json::error_code&) { return true; }
  bool on_object_begin(boost::json::error_code&) {
    frames_.push_back({true, {}, {}, frame_name()});
    return true;
  }
  bool on_object_end(std::size_t, boost::json::error_code&) {
    frames_.pop_back();
    return true;
  }
  bool on_array_begin(boost::json::error_code&) {
    frames_.push_back({false, {}, {}, frame_name()});
    return true;
  }
  bool on_array_end(std::size_t, boost::json::error_code&) {
    frames_.pop_back();
    return true;
  }
  bool on_key_part(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    key_.append(s.data(), s.size());
    return true;
  }
  bool on_key(boost::json::string_view s, std::size_t, boost::json::error_code& ec) {
    key_.append(s.data(), s.size());
    Frame& f = frames_.back();
    if (!f.keys.insert(key_).second) {
      duplicate = key_;
      parent = f.name;
      ec = boost::json::error::test_failure;
      return false;
    }
    f.last_key = std::move(key_);
    key_.clear();
    return true;
  }
  bool on_string_part(boost::json::string_view, std::size_t, boost::json::error_code&) { return true; }
  bool on_string(boost::json::string_view, std::size_t, boost::json::error_code&) { return true; }
  bool on_number_part(boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_int64(std::int64_t, boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_uint64(std::uint64_t, boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_double(double, boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_bool(bool, boost::json::error_code&) { return true; }
  bool on_null(boost::json::error_code&) { return true; }
  bool on_comment_part(boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_comment(boost::json::string_view, boost::json::error_code&) { return true; }

 private:
  struct Frame {
    bool is_object;
    std::set<std::string, std::less<>> keys;
    std::string last_key;
    std::string name;
  };
  std::string frame_name() const {
    if (frames_.empty()) return "<root>";
    Frame const& f = frames_.back();
    return f.is_object ? f.last_key : f.name + "[]";
  }
  std::vector<Frame> frames_;
  std::string key_;
};

/// Parses `text` as one JSON document with no duplicate keys in any object. `what` names the source in
/// messages ("model.safetensors: header").
inline Result<boost::json::value> parse_json_strict(std::string_view text, std::string const& what) {
  boost::json::parse_options opt;
  opt.max_depth = 64;
  {
    boost::json::basic_parser<DuplicateKeyHandler> p(opt);
    boost::json::error_code ec;
    std::size_t n = p.write_some(false, text.data(), text.size(), ec);
    if (!ec && n < text.size()) ec = boost::json::error::extra_data;
    if (ec) {
      if (!p.handler().duplicate.empty())
        return malformed(what + ": duplicate key '" + p.handler().duplicate + "' in object '" +
                         p.handler().parent + "'");
      return malformed(what + ": not valid JSON (" + ec.message() + " near byte " + std::to_string(n) + ")");
    }
  }
  boost::json::error_code ec;
  boost::json::value v = boost::json::parse(boost::json::string_view(text.data(), text.size()), ec, {}, opt);
  if (ec) return malformed(what + ": not valid JSON (" + ec.message() + ")");
  return v;
}

}  // namespace tessera::io::detail

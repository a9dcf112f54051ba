// SPDX-License-Identifier: Apache-2.0
/// Subcommands of the `tessera` tool. Each is a function taking its own argv (after the subcommand
/// name) and returning the process exit code; `ArgParser` gives them uniform option handling.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::cli {

/// `--name value`, `--name=value` and `--flag` options plus positionals; unknown options are errors.
class ArgParser {
 public:
  ArgParser(std::vector<std::string> args, std::vector<std::string> value_options,
            std::vector<std::string> flag_options = {});
  /// Empty when the arguments parsed; otherwise a message naming the offending argument.
  std::string const& error() const { return error_; }
  bool has(std::string_view name) const;
  std::optional<std::string> get(std::string_view name) const;
  std::string get_or(std::string_view name, std::string fallback) const;
  std::vector<std::string> const& positionals() const { return positionals_; }

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::string> positionals_;
  std::string error_;
};

using CommandFn = int (*)(std::vector<std::string> const& args);

struct Command {
  char const* name;     // e.g. "inspect" or "verify golden"
  char const* summary;  // one line for `tessera --help`
  CommandFn run;
};

}  // namespace tessera::cli

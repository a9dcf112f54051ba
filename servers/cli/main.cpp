// SPDX-License-Identifier: Apache-2.0
/// `tessera`: one binary, many subcommands. Multi-word commands ("verify golden") match longest first.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "tessera/core/status.hpp"
#include "tessera/ops/registry.hpp"

namespace tessera::cli {

ArgParser::ArgParser(std::vector<std::string> args, std::vector<std::string> value_options,
                     std::vector<std::string> flag_options) {
  auto is_in = [](std::vector<std::string> const& v, std::string const& s) {
    for (auto const& x : v) if (x == s) return true;
    return false;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string const& a = args[i];
    if (a.rfind("--", 0) != 0 || a == "--") { positionals_.push_back(a); continue; }
    std::string name = a.substr(2), value;
    bool has_eq = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_eq = true;
    }
    if (is_in(flag_options, name)) {
      if (has_eq) { error_ = "option --" + name + " takes no value"; return; }
      values_[name] = "1";
    } else if (is_in(value_options, name)) {
      if (!has_eq) {
        if (i + 1 >= args.size()) { error_ = "option --" + name + " needs a value"; return; }
        value = args[++i];
      }
      values_[name] = value;
    } else {
      error_ = "unknown option --" + name;
      return;
    }
  }
}
bool ArgParser::has(std::string_view name) const { return values_.find(name) != values_.end(); }
std::optional<std::string> ArgParser::get(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}
std::string ArgParser::get_or(std::string_view name, std::string fallback) const {
  auto v = get(name);
  return v ? *v : fallback;
}

static int cmd_version(std::vector<std::string> const&) {
  auto b = ops::build_info();
  std::printf("tessera %s (cuda %s, nccl %s, pcre2 %s)\n", b.version.c_str(), b.with_cuda ? "on" : "off",
              b.with_nccl ? "on" : "off", b.with_pcre2 ? "on" : "off");
  return 0;
}

// Subcommands defined in their own files (servers/cli/cmd_*.cpp).
// [declarations]
int cmd_plan(std::vector<std::string> const& args);
int cmd_calibrate(std::vector<std::string> const& args);
int cmd_prune(std::vector<std::string> const& args);
int cmd_verify_retention(std::vector<std::string> const& args);
int cmd_make_synthetic(std::vector<std::string> const& args);
int cmd_inspect(std::vector<std::string> const& args);
int cmd_generate(std::vector<std::string> const& args);
int cmd_verify_golden(std::vector<std::string> const& args);
int cmd_serve(std::vector<std::string> const& args);
int cmd_verify_exl3(std::vector<std::string> const& args);
int cmd_quantize(std::vector<std::string> const& args);
int cmd_verify_engines(std::vector<std::string> const& args);
int cmd_verify_invariance(std::vector<std::string> const& args);
int cmd_verify_soak(std::vector<std::string> const& args);

static Command const kCommands[] = {
    {"version", "print the version and what this build contains", cmd_version},
    {"inspect", "show a checkpoint: config, tensors, weight layout, EXL3 bits per weight", cmd_inspect},
    {"make-synthetic", "write a seeded random DeepSeek-V4.1 checkpoint (tiny or v41-flash dimensions)", cmd_make_synthetic},
    {"generate", "greedy token ids from a DeepSeek-V4.1 model folder on the CPU", cmd_generate},
    {"verify golden", "golden parity gate of a model folder against golden.safetensors", cmd_verify_golden},
    {"serve", "run the OpenAI-compatible HTTP server", cmd_serve},
    {"verify engines", "token-diff the greedy replies of two OpenAI-compatible servers", cmd_verify_engines},
    {"verify invariance", "exactness gates on a model: chunked prefill, batched == alone, restore, keyed sampling", cmd_verify_invariance},
    {"verify soak", "bounded mixed traffic against a server: errors, slot leaks, one reply per greedy body", cmd_verify_soak},
    {"verify exl3", "EXL3 test ladder on the golden fixtures (spec/exl3.md §7.4)", cmd_verify_exl3},
    {"quantize", "quantize a bf16/fp32/FP8 checkpoint to EXL3 (--bits AVG, per-tensor K)", cmd_quantize},
    {"calibrate", "record per-layer expert selection counts and weights over a prompts file", cmd_calibrate},
    {"prune", "write a checkpoint keeping the most-used routed experts (--keep fraction)", cmd_prune},
    {"verify retention", "teacher-forced top-1 agreement, KL and routing overlap of a pruned model", cmd_verify_retention},
    {"plan", "tensor/expert-parallel sharding plan of a checkpoint: ranges, collectives, bytes per rank", cmd_plan},
    // [commands]
};

static void print_help() {
  std::printf("usage: tessera <command> [options]\n\ncommands:\n");
  for (auto const& c : kCommands) std::printf("  %-22s %s\n", c.name, c.summary);
}

}  // namespace tessera::cli

int main(int argc, char** argv) {
  using namespace tessera::cli;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_help();
    return args.empty() ? 2 : 0;
  }
  Command const* best = nullptr;
  size_t best_words = 0;
  for (auto const& c : kCommands) {
    // Split the command name into words and match them against the leading arguments.
    std::vector<std::string> words;
    for (char const* p = c.name; *p;) {
      char const* q = std::strchr(p, ' ');
      size_t len = q ? static_cast<size_t>(q - p) : std::strlen(p);
      words.emplace_back(p, len);
      p += len + (q ? 1 : 0);
    }
    if (words.size() > args.size() || words.size() <= best_words) continue;
    bool match = true;
    for (size_t i = 0; i < words.size(); ++i) match = match && args[i] == words[i];
    if (match) { best = &c; best_words = words.size(); }
  }
  if (!best) {
    std::fprintf(stderr, "tessera: unknown command '%s' (see tessera --help)\n", args[0].c_str());
    return 2;
  }
  try {
    return best->run(std::vector<std::string>(args.begin() + static_cast<long>(best_words), args.end()));
  } catch (tessera::Error const& e) {
    std::fprintf(stderr, "tessera %s: %s\n", best->name, e.what());
    return 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "tessera %s: internal error: %s\n", best->name, e.what());
    return 1;
  }
}

// SPDX-License-Identifier: Apache-2.0
/// `tessera make-synthetic --out DIR --preset tiny|v41-flash [--layers L] [--format fp32|bf16|fp8|exl3:B|mixed:B]
/// [--seed S] [--vocab-size V] [--engram-rows N] [--experts E]`: writes config.json + model.safetensors of
/// seeded random weights in the OLD naming (models/deepseek_v41/synthetic.hpp), streamed tensor by tensor.
/// tiny = spec/deepseek-v41.md §6 with `--vocab-size` (default 512); v41-flash = the released dimensions
/// with the first L layers (default 2), `--experts` scales the routed experts down (tests). `--format`:
/// dense fp32/bf16, the native release layout fp8 (FP8 + ue8m0 blocks, FP4 experts, FP8 Engram tables),
/// EXL3 groups at an average of B bits (random trellis codes), or mixed:B (EXL3 routed and shared experts over the
/// FP8 trunk); `--dtype` is the older spelling of the
/// dense formats. `--mtp` adds `--mtp-blocks` (default 3) DSpark blocks `mtp.*` with the shapes of spec §2.8
/// (the drafter of models/deepseek_v41/dspark.hpp).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"

namespace tessera::cli {

namespace {

constexpr char kUsage[] =
    "usage: tessera make-synthetic --out DIR --preset tiny|v41-flash [--layers L]\n"
    "                              [--format fp32|bf16|fp8|exl3:B|mixed:B] [--seed S] [--vocab-size V]\n"
    "                              [--engram-rows N] [--experts E] [--mtp [--mtp-blocks N]]\n";

/// A non-negative integer option, or -1 with a message.
int64_t int_option(ArgParser const& ap, char const* name, int64_t fallback) {
  auto v = ap.get(name);
  if (!v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || x < 0) {
    std::fprintf(stderr, "tessera make-synthetic: --%s needs a non-negative integer, got '%s'\n", name, v->c_str());
    return -1;
  }
  return x;
}

}  // namespace

int cmd_make_synthetic(std::vector<std::string> const& args) {
  ArgParser ap(args, {"out", "preset", "layers", "dtype", "format", "seed", "vocab-size", "engram-rows", "experts",
                      "mtp-blocks"}, {"mtp"});
  if (!ap.error().empty() || !ap.positionals().empty() || !ap.has("out") || !ap.has("preset")) {
    std::fprintf(stderr, "%s%s", ap.error().empty() ? "" : (ap.error() + "\n").c_str(), kUsage);
    return 2;
  }
  std::string const preset = *ap.get("preset");
  int64_t const layers = int_option(ap, "layers", 0);
  int64_t const seed = int_option(ap, "seed", 0);
  int64_t const vocab = int_option(ap, "vocab-size", preset == "tiny" ? 512 : 129280);
  int64_t const rows = int_option(ap, "engram-rows", 0);
  int64_t const experts = int_option(ap, "experts", 0);
  if (layers < 0 || seed < 0 || vocab < 0 || rows < 0 || experts < 0) return 2;
  if (ap.has("dtype") && ap.has("format")) {
    std::fprintf(stderr, "tessera make-synthetic: give --format or --dtype, not both\n");
    return 2;
  }
  std::string const dt = ap.has("format") ? *ap.get("format") : ap.get_or("dtype", "fp32");
  if (ap.has("dtype") && dt != "fp32" && dt != "bf16") {
    std::fprintf(stderr, "tessera make-synthetic: --dtype must be fp32 or bf16, got '%s'\n", dt.c_str());
    return 2;
  }
  auto format = model::dsv41::synthetic_format(dt);
  if (!format) {
    std::fprintf(stderr, "tessera make-synthetic: %s\n", format.status().to_string().c_str());
    return 2;
  }
  auto config = model::dsv41::synthetic_config(preset, vocab, layers, rows, experts);
  if (!config) {
    std::fprintf(stderr, "tessera make-synthetic: %s\n", config.status().to_string().c_str());
    return 2;
  }
  if (ap.has("mtp")) {
    int64_t const blocks = int_option(ap, "mtp-blocks", 3);
    if (blocks < 0) return 2;
    if (Status st = model::dsv41::enable_mtp(*config, blocks); !st.ok()) {
      std::fprintf(stderr, "tessera make-synthetic: %s\n", st.to_string().c_str());
      return 2;
    }
  }
  auto sum = model::dsv41::write_synthetic_checkpoint(*config, *ap.get("out"), static_cast<uint64_t>(seed), **format);
  if (!sum) {
    std::fprintf(stderr, "tessera make-synthetic: %s\n", sum.status().to_string().c_str());
    return 1;
  }
  std::printf("wrote %s: preset %s, %lld layers, vocab %lld, %s, seed %lld: %zu tensors, %zu bytes\n",
              ap.get("out")->c_str(), preset.c_str(), static_cast<long long>(config->num_hidden_layers),
              static_cast<long long>(config->vocab_size), dt.c_str(), static_cast<long long>(seed), sum->num_tensors,
              sum->bytes);
  return 0;
}

}  // namespace tessera::cli

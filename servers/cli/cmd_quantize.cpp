// SPDX-License-Identifier: Apache-2.0
/// `tessera quantize --in CKPT --out DIR --bits B [--codebook mul1|mcg|3inst] [--head-bits 6] [--seed N]
/// [--sample-tiles N]`: converts a bf16/fp32/FP8 checkpoint to EXL3 (ops::exl3_quantize_checkpoint), with a
/// progress bar on a terminal and a per-tensor relative-MSE report. Rerunning with the same options
/// resumes after an interruption.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "tessera/ops/exl3_quantize.hpp"

namespace tessera::cli {

int cmd_quantize(std::vector<std::string> const& args) {
  ArgParser p(args, {"in", "out", "bits", "codebook", "head-bits", "seed", "sample-tiles"});
  if (!p.error().empty() || !p.positionals().empty() || !p.has("in") || !p.has("out") || !p.has("bits")) {
    std::fprintf(stderr,
                 "usage: tessera quantize --in CKPT --out DIR --bits AVG [--codebook mul1|mcg|3inst] [--head-bits 6]"
                 " [--seed N] [--sample-tiles N]\n%s\n",
                 p.error().c_str());
    return 2;
  }
  ops::Exl3CheckpointQuantOptions o;
  o.in = *p.get("in");
  o.out = *p.get("out");
  try {
    o.bits = std::stod(*p.get("bits"));
    o.head_bits = std::stoi(p.get_or("head-bits", "6"));
    o.seed = std::stoull(p.get_or("seed", "24301"), nullptr, 0);
    o.sample_tiles = std::stoll(p.get_or("sample-tiles", "48"));
  } catch (std::exception const&) {
    std::fprintf(stderr, "tessera quantize: --bits, --head-bits, --seed and --sample-tiles take numbers\n");
    return 2;
  }
  std::string const cb = p.get_or("codebook", "mul1");
  if (cb == "mul1") o.codebook = exl3::Codebook::kMul1;
  else if (cb == "mcg") o.codebook = exl3::Codebook::kMcg;
  else if (cb == "3inst") o.codebook = exl3::Codebook::k3Inst;
  else {
    std::fprintf(stderr, "tessera quantize: --codebook must be mul1, mcg or 3inst (got '%s')\n", cb.c_str());
    return 2;
  }
  bool const tty = isatty(2);
  auto last = std::chrono::steady_clock::now();
  if (tty) {
    o.progress = [&](std::string const& name, int64_t done, int64_t total, int tensors_done, int tensors) {
      auto now = std::chrono::steady_clock::now();
      if (done != total && now - last < std::chrono::milliseconds(100)) return;
      last = now;
      int const width = 30;
      int const fill = static_cast<int>(width * done / std::max<int64_t>(total, 1));
      std::fprintf(stderr, "\r[%-*s] %3d%% tensor %d/%d %.60s\033[K", width, std::string(static_cast<size_t>(fill), '#').c_str(),
                   static_cast<int>(100 * done / std::max<int64_t>(total, 1)), tensors_done + 1, tensors, name.c_str());
    };
  }
  auto r = ops::exl3_quantize_checkpoint(o);
  if (tty) std::fprintf(stderr, "\r\033[K");
  if (!r.ok()) {
    std::fprintf(stderr, "tessera quantize: %s\n", r.status().to_string().c_str());
    return 1;
  }
  std::printf("| tensor | k x n | bits | relative MSE |\n|---|---|---|---|\n");
  for (auto const& t : r->tensors)
    std::printf("| %s | %lldx%lld | %d | %.6f%s |\n", t.name.c_str(), static_cast<long long>(t.k),
                static_cast<long long>(t.n), t.bits, t.rel_mse, t.resumed ? " (resumed)" : "");
  std::printf("quantize: %zu tensors to EXL3 (%s), %.3f average bits, %zu tensors copied -> %s\n", r->tensors.size(),
              cb.c_str(), r->avg_bits, r->copied.size(), o.out.c_str());
  return 0;
}

}  // namespace tessera::cli

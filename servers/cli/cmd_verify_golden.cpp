// SPDX-License-Identifier: Apache-2.0
/// `tessera verify golden --model DIR --golden DIR [--dtype fp32|bf16] [--device cpu|cuda]`: the golden
/// parity gate (on the CPU reference model, or the GPU model with --device cuda) of
/// models/deepseek_v41/golden_gate (free-running greedy and teacher-forced logits against every golden
/// step, near-tie certification, derived tolerances). One line per prompt and per disagreement, then
/// exactly one final line `golden: <exact>/<total> steps exact, <ties> near-ties, max_abs_err <x>,
/// max_rel_err <y>, cutoff ties met <n>`. Exit 0 only if the gate passes.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"

namespace tessera::cli {

Result<model::dsv41::Numerics> numerics_for(std::string const& dir, std::string const& flag);

int cmd_verify_golden(std::vector<std::string> const& args) {
  ArgParser p(args, {"model", "golden", "dtype", "device"});
  if (!p.error().empty() || !p.has("model") || !p.has("golden")) {
    std::fprintf(stderr,
                 "usage: tessera verify golden --model DIR --golden DIR [--dtype fp32|bf16] [--device cpu|cuda]\n%s\n",
                 p.error().c_str());
    return 2;
  }
  std::string dir = *p.get("model"), gdir = *p.get("golden");
  auto num = numerics_for(dir, p.get_or("dtype", ""));
  if (!num) throw Error(num.status());
  model::dsv41::ModelOptions o;
  o.numerics = *num;
  std::string const device = p.get_or("device", "cpu");
  auto m = model::dsv41::load_model_on(dir, o, device).value_or_throw();
  model::dsv41::CheckpointSource golden;
  std::string gfile = std::filesystem::is_directory(gdir) ? gdir + "/golden.safetensors" : gdir;
  throw_if_error(golden.open(gfile));
  std::printf("model %s (%s, %s), golden %s\n", dir.c_str(), m->info().dtype.c_str(), m->info().device.c_str(),
              gfile.c_str());
  model::dsv41::GoldenGateHooks hooks;
  if (auto* cpu = dynamic_cast<model::dsv41::Dsv41Model*>(m.get())) {
    hooks.set_boundary_ulps = [cpu](int u) { cpu->set_boundary_ulps(u); };
    hooks.ties = [](model::SequenceState const& s) { return &static_cast<model::dsv41::Dsv41State const&>(s).ties(); };
    hooks.boundaries = [](model::SequenceState const& s) {
      return &static_cast<model::dsv41::Dsv41State const&>(s).quant_boundaries();
    };
  } else {
    auto* gpu = static_cast<model::dsv41::GpuDsv41Model*>(m.get());
    hooks.set_boundary_ulps = [gpu](int u) { gpu->set_boundary_ulps(u); };
    hooks.ties = &model::dsv41::GpuDsv41Model::ties;
    hooks.boundaries = &model::dsv41::GpuDsv41Model::quant_boundaries;
  }
  auto rep = model::dsv41::run_golden_gate(*m, *num == model::dsv41::Numerics::kBf16, hooks, golden,
                                           [](std::string const& s) { std::printf("%s\n", s.c_str()); })
                 .value_or_throw();
  for (auto const& r : rep.reasons) std::printf("FAIL: %s\n", r.c_str());
  std::printf("%s\n", rep.summary_line().c_str());
  return rep.pass ? 0 : 1;
}

}  // namespace tessera::cli

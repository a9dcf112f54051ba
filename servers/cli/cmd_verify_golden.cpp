// SPDX-License-Identifier: Apache-2.0
/// `tessera verify golden --model DIR --golden DIR [--dtype fp32|bf16] [--tp N --ep M …]`: the golden parity gate of
/// models/deepseek_v41/golden_gate (free-running greedy and teacher-forced logits against every golden
/// step, near-tie certification, derived tolerances). One line per prompt and per disagreement, then
/// exactly one final line `golden: <exact>/<total> steps exact, <ties> near-ties, max_abs_err <x>,
/// max_rel_err <y>, cutoff ties met <n>`. Exit 0 only if the gate passes. With --tp/--ep the model runs
/// sharded over in-process ranks (models/deepseek_v41/sharded.hpp).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "servers/cli/parallel_flags.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"

namespace tessera::cli {

Result<model::dsv41::Numerics> numerics_for(std::string const& dir, std::string const& flag);

int cmd_verify_golden(std::vector<std::string> const& args) {
  std::vector<std::string> opts{"model", "golden", "dtype"};
  for (auto const& n : parallel_flag_names()) opts.push_back(n);
  ArgParser p(args, opts);
  auto par = parse_parallel_flags(p);
  if (!p.error().empty() || !p.has("model") || !p.has("golden") || !par) {
    std::fprintf(stderr, "usage: tessera verify golden --model DIR --golden DIR [--dtype fp32|bf16] %s\n%s\n",
                 parallel_usage(), !par ? par.status().message().c_str() : p.error().c_str());
    return 2;
  }
  std::string dir = *p.get("model"), gdir = *p.get("golden");
  auto num = numerics_for(dir, p.get_or("dtype", ""));
  if (!num) throw Error(num.status());
  model::dsv41::ModelOptions o;
  o.numerics = *num;
  auto m = model::dsv41::load_model(dir, o).value_or_throw();
  model::dsv41::CheckpointSource golden;
  std::string gfile = std::filesystem::is_directory(gdir) ? gdir + "/golden.safetensors" : gdir;
  throw_if_error(golden.open(gfile));
  std::printf("model %s (%s), golden %s\n", dir.c_str(), m->info().dtype.c_str(), gfile.c_str());
  auto log = [](std::string const& s) { std::printf("%s\n", s.c_str()); };
  model::dsv41::GoldenReport rep;
  if (par->tp > 1 || par->ep > 1) {
    // Ranks as threads over the in-process communicator (docs/multi-gpu.md).
    auto sm = model::dsv41::ShardedModel::create(*m, *par).value_or_throw();
    std::printf("in-process ranks: %d (tp %d, ep %d); attention %s\n", sm->world(), par->tp, par->ep,
                sm->plan().attention_mode().c_str());
    rep = model::dsv41::run_golden_gate_sharded(*sm, golden, log).value_or_throw();
  } else {
    rep = model::dsv41::run_golden_gate(*m, golden, log).value_or_throw();
  }
  for (auto const& r : rep.reasons) std::printf("FAIL: %s\n", r.c_str());
  std::printf("%s\n", rep.summary_line().c_str());
  return rep.pass ? 0 : 1;
}

}  // namespace tessera::cli

// SPDX-License-Identifier: Apache-2.0
/// `tessera generate --model DIR --prompt-ids 1,2,3 --max-new-tokens N [--dtype fp32|bf16] [--ignore-eos]
/// [--draft none|lookup] [--draft-k K] [--temperature T --top-p P --top-k K --seed S]`: greedy (first index
/// of the max) or keyed-sampled decoding with the CPU DeepSeek-V4.1 model, optionally drafted (exact: the
/// same ids as --draft none; acceptance stats on stderr); prints the generated ids, comma-separated. The dtype defaults to the checkpoint's (bf16 if lm_head is stored bf16).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "servers/cli/prune_flags.hpp"
#include "tessera/models/common/drafter.hpp"
#include "tessera/models/deepseek_v41/dspark.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"

namespace tessera::cli {

/// fp32 unless `flag` says bf16, or, when empty, the checkpoint stores lm_head in bf16.
Result<model::dsv41::Numerics> numerics_for(std::string const& dir, std::string const& flag) {
  using model::dsv41::Numerics;
  if (flag == "fp32") return Numerics::kFp32;
  if (flag == "bf16") return Numerics::kBf16;
  if (!flag.empty()) return invalid_argument("--dtype must be fp32 or bf16, got '" + flag + "'");
  model::dsv41::CheckpointSource src;
  std::string f = dir + "/model.safetensors";
  TESSERA_TRY(src.open(std::filesystem::exists(f) ? f : dir));
  auto dt = src.dtype("lm_head.weight");
  if (!dt) dt = src.dtype("head.weight");
  return dt && *dt == DType::kBf16 ? Numerics::kBf16 : Numerics::kFp32;
}

static Result<std::vector<int32_t>> parse_ids(std::string const& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    std::string tok = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    try {
      size_t used = 0;
      long v = std::stol(tok, &used);
      if (used != tok.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(tok);
      ids.push_back(static_cast<int32_t>(v));
    } catch (std::exception const&) {
      return invalid_argument("--prompt-ids: '" + tok + "' is not a token id");
    }
    if (j == std::string::npos) break;
    i = j + 1;
  }
  if (ids.empty()) return invalid_argument("--prompt-ids is empty");
  return ids;
}

int cmd_generate(std::vector<std::string> const& args) {
  std::vector<std::string> opts{"model", "prompt-ids", "max-new-tokens", "dtype", "draft", "draft-k", "temperature",
                                "top-p", "top-k", "seed", "device"};
  for (auto const& n : prune_flag_names()) opts.push_back(n);
  ArgParser p(args, opts, {"ignore-eos"});
  if (!p.error().empty() || !p.has("model") || !p.has("prompt-ids")) {
    std::fprintf(stderr, "usage: tessera generate --model DIR --prompt-ids 1,2,3 [--max-new-tokens N] "
                         "[--dtype fp32|bf16] [--device cpu|cuda] [--ignore-eos] [--draft none|lookup|dspark] [--draft-k K] "
                         "[--temperature T --top-p P --top-k K --seed S]\n         %s\n%s\n", prune_usage(),
                 p.error().c_str());
    return 2;
  }
  std::string dir = *p.get("model");
  auto ids = parse_ids(*p.get("prompt-ids"));
  if (!ids) throw Error(ids.status());
  long n = std::stol(p.get_or("max-new-tokens", "16"));
  auto num = numerics_for(dir, p.get_or("dtype", ""));
  if (!num) throw Error(num.status());
  model::dsv41::ModelOptions o;
  o.numerics = *num;
  auto prune = parse_prune_flags(p);
  if (!prune) throw Error(prune.status());
  o.prune = std::move(*prune);
  auto m = model::dsv41::load_model_on(dir, o, p.get_or("device", "cpu")).value_or_throw();
  // Decoding goes through the drafting Generator; --draft none is the serial loop (k = 0 every round).
  std::string draft = p.get_or("draft", "none");
  std::unique_ptr<model::Drafter> drafter;
  auto* cpu_model = dynamic_cast<model::dsv41::Dsv41Model*>(m.get());
  auto st = m->new_sequence();
  if (draft == "lookup") {
    drafter = model::make_lookup_drafter();
  } else if (draft == "dspark") {
    if (!cpu_model) throw Error(not_supported("--draft dspark runs on the CPU model only (--device cpu)"));
    if (!cpu_model->has_dspark())
      throw Error(not_supported("--draft dspark: " + dir + " has no DSpark weights (mtp.*; make-synthetic --mtp writes them)"));
    drafter = model::dsv41::make_dspark_drafter(*cpu_model, static_cast<model::dsv41::Dsv41State const&>(*st));
  } else if (draft != "none") throw Error(invalid_argument("--draft must be none, lookup or dspark, got '" + draft + "'"));
  if (drafter && o.prune.active() && o.prune.scope == model::dsv41::ExpertPruning::Scope::kDecode)
    throw Error(invalid_argument("--draft with decode-scope expert pruning is not exact (a verify window is not a "
                                 "one-token decode chunk, so it is not pruned); use --draft none or prune every scope"));
  model::DepthPolicy pol;
  if (p.has("draft-k")) pol.fixed_k = std::stol(*p.get("draft-k"));
  if (pol.fixed_k > pol.max_k) pol.max_k = pol.fixed_k;
  model::GenerateOptions go;
  go.max_new_tokens = n;
  go.ignore_eos = p.has("ignore-eos");
  go.sampling.temperature = std::stof(p.get_or("temperature", "0"));
  go.sampling.top_p = std::stof(p.get_or("top-p", "1"));
  go.sampling.top_k = static_cast<int32_t>(std::stol(p.get_or("top-k", "0")));
  go.sampling.seed = std::stoull(p.get_or("seed", "0"));
  model::Generator gen(*m, drafter.get(), pol);
  model::DraftStats stats;
  auto out = gen.generate(*st, *ids, go, &stats).value_or_throw();
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
  std::printf("\n");
  if (drafter)
    std::fprintf(stderr, "draft=%s rounds=%lld drafted=%lld accepted=%lld tokens/round=%.3f acceptance=%.3f "
                         "forward=%.3fs\n", draft.c_str(), static_cast<long long>(stats.rounds),
                 static_cast<long long>(stats.drafted), static_cast<long long>(stats.accepted),
                 stats.tokens_per_round(), stats.acceptance(), stats.forward_s);
  return 0;
}

}  // namespace tessera::cli

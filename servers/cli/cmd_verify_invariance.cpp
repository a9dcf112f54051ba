// SPDX-License-Identifier: Apache-2.0
/// `tessera verify invariance`: the exactness gates (verify/harness/invariance.hpp) on a model.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "servers/openai/engine/stub_model.hpp"
#include "verify/harness/invariance.hpp"
#include "tessera/models/deepseek_v41/dspark.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"

namespace tessera::cli {

int cmd_verify_invariance(std::vector<std::string> const& args) {
  ArgParser a(args, {"model", "device", "numerics", "decode-tokens", "prompt-lengths", "seed", "report-json"}, {"help"});
  if (!a.error().empty() || a.has("help") || !a.has("model") || !a.positionals().empty()) {
    if (!a.error().empty()) std::fprintf(stderr, "tessera verify invariance: %s\n", a.error().c_str());
    std::fprintf(stderr,
                 "usage: tessera verify invariance --model DIR|stub [--device cpu|cuda] [--numerics fp32|bf16] [--decode-tokens 16]\n"
                 "         [--prompt-lengths 5,37,130,600] [--seed S] [--report-json F]\n"
                 "Runs the exactness gates (chunked prefill, batched == alone, snapshot/restore, keyed sampling,\n"
                 "drafted == serial, graph == eager: --device cuda only); exit 1 if any gate fails.\n");
    return a.has("help") && a.error().empty() ? 0 : 2;
  }
  harness::InvarianceOptions o;
  if (auto v = a.get("decode-tokens")) {
    o.decode_tokens = std::strtoll(v->c_str(), nullptr, 10);
    if (o.decode_tokens < 1 || o.decode_tokens > 4096) { std::fprintf(stderr, "tessera verify invariance: --decode-tokens must be in [1, 4096]\n"); return 2; }
  }
  if (auto v = a.get("prompt-lengths")) {
    o.prompt_lengths.clear();
    for (size_t p = 0; p < v->size();) {
      size_t q = v->find(',', p);
      std::string t = v->substr(p, q == std::string::npos ? std::string::npos : q - p);
      char* end = nullptr;
      long long n = std::strtoll(t.c_str(), &end, 10);
      if (t.empty() || *end || n < 1) { std::fprintf(stderr, "tessera verify invariance: --prompt-lengths: bad length '%s'\n", t.c_str()); return 2; }
      o.prompt_lengths.push_back(n);
      p = q == std::string::npos ? v->size() : q + 1;
    }
  }
  if (auto v = a.get("seed")) o.prompt_seed = std::strtoull(v->c_str(), nullptr, 10);
  std::string const device = a.get_or("device", "cpu");
  if (device != "cpu" && device != "cuda") { std::fprintf(stderr, "tessera verify invariance: --device must be cpu or cuda\n"); return 2; }
  std::string const dir = *a.get("model");
  std::unique_ptr<model::LanguageModel> m;
  if (dir == "stub") {
    if (device != "cpu") { std::fprintf(stderr, "tessera verify invariance: the stub model runs on the CPU only\n"); return 2; }
    server::StubModelConfig sc;
    for (int t = 32; t < 127; ++t) sc.allowed_tokens.push_back(t);
    m = std::make_unique<server::StubModel>(sc);
  } else {
    std::string const numerics = a.get_or("numerics", "fp32");
    if (numerics != "fp32" && numerics != "bf16") { std::fprintf(stderr, "tessera verify invariance: --numerics must be fp32 or bf16\n"); return 2; }
    model::dsv41::ModelOptions mo;
    mo.numerics = numerics == "bf16" ? model::dsv41::Numerics::kBf16 : model::dsv41::Numerics::kFp32;
    auto loaded = model::dsv41::load_model_on(dir, mo, device);
    if (!loaded.ok()) { std::fprintf(stderr, "tessera verify invariance: --model %s: %s\n", dir.c_str(), loaded.status().message().c_str()); return 2; }
    if (auto* dm = dynamic_cast<model::dsv41::Dsv41Model*>(loaded->get()); dm && dm->has_dspark())
      o.dspark = [dm](model::SequenceState& st) -> std::unique_ptr<model::Drafter> {
        auto* ds = dynamic_cast<model::dsv41::Dsv41State*>(&st);
        return ds ? model::dsv41::make_dspark_drafter(*dm, *ds) : nullptr;
      };
    if (auto* gm = dynamic_cast<model::dsv41::GpuDsv41Model*>(loaded->get())) {
      o.set_graphs = [gm](bool on) { return gm->set_cuda_graphs(on); };
      o.graph_counts = [gm](bool* replayed) {
        auto const c = gm->graph_counts();
        *replayed = c.updates > 0;
        return std::to_string(c.launches) + " segments launched, " + std::to_string(c.updates) + " updated in place, " +
               std::to_string(c.instantiations) + " instantiated";
      };
    }
    m = std::move(*loaded);
  }
  auto const& info = m->info();
  std::printf("model %s (%s, vocab %lld, context %lld, %s %s)\n", info.name.c_str(), info.model_type.c_str(),
              static_cast<long long>(info.vocab_size), static_cast<long long>(info.max_context), info.device.c_str(), info.dtype.c_str());
  auto gates = harness::run_invariance(*m, o);
  std::fputs(harness::invariance_text(gates).c_str(), stdout);
  if (auto f = a.get("report-json")) {
    std::ofstream out(*f, std::ios::binary);
    out << harness::invariance_jsonl(gates);
    if (!out) { std::fprintf(stderr, "tessera verify invariance: cannot write '%s'\n", f->c_str()); return 2; }
  }
  for (auto const& g : gates) if (g.verdict == harness::Verdict::kFail) return 1;
  return 0;
}

}  // namespace tessera::cli

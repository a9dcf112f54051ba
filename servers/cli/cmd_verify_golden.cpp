// SPDX-License-Identifier: Apache-2.0
/// `tessera verify golden --model DIR --golden DIR [--dtype fp32|bf16] [--device cpu|cuda] [--tp N --ep M …]`:
/// the golden parity gate (on the CPU reference model, or the GPU model with --device cuda) of
/// models/deepseek_v41/golden_gate (free-running greedy and teacher-forced logits against every golden
/// step, near-tie certification, derived tolerances). One line per prompt and per disagreement, then
/// exactly one final line `golden: <exact>/<total> steps exact, <ties> near-ties, max_abs_err <x>,
/// max_rel_err <y>, cutoff ties met <n>`. Exit 0 only if the gate passes. With --tp/--ep the model runs
/// sharded over in-process ranks (models/deepseek_v41/sharded.hpp): CPU rank models, or with --device cuda
/// GPU rank models (threads on the visible GPUs, rank r on device r mod count).
/// `--dump-taps FILE --dump-prompt N` instead runs one prefill of golden prompt N and writes every module
/// tap of the model (named like the golden engine's module dumps: `model.layers.L.out0`, `…attn.out0`, …)
/// to a safetensors file, to localise the first divergence against the reference engine's own dumps (CPU
/// model only). `--dump-full` makes that prefill run over the prompt followed by its `gen_manual` tokens: the
/// one-shot forward the golden's `debug.*` tensors were recorded on (prompt 4). `--pin-golden out0,out1,…` then
/// replaces those module outputs (named after `model.layers.L.`) with the golden's `debug.*` tensors as they are
/// produced, so each layer runs on the reference's own input and its taps show that layer's arithmetic alone.
/// The file also holds the prefill's `logits` [tokens, vocab] and, with `--dump-steps K`, `logits.step1` … of
/// the K single-token decode steps (the golden's `full_logits` and `step_logits` paths respectively).
#include <cstdio>
#include <map>
#include <set>
#include <filesystem>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "servers/cli/parallel_flags.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"

namespace tessera::cli {

Result<model::dsv41::Numerics> numerics_for(std::string const& dir, std::string const& flag);

int cmd_verify_golden(std::vector<std::string> const& args) {
  std::vector<std::string> opts{"model", "golden", "dtype", "device", "dump-taps", "dump-prompt", "dump-steps",
                                "pin-golden"};
  for (auto const& n : parallel_flag_names()) opts.push_back(n);
  ArgParser p(args, opts, {"dump-full"});
  auto par = parse_parallel_flags(p);
  if (!p.error().empty() || !p.has("model") || !p.has("golden") || !par) {
    std::fprintf(stderr, "usage: tessera verify golden --model DIR --golden DIR [--dtype fp32|bf16] [--device cpu|cuda] %s\n%s\n",
                 parallel_usage(), !par ? par.status().message().c_str() : p.error().c_str());
    return 2;
  }
  std::string dir = *p.get("model"), gdir = *p.get("golden");
  auto num = numerics_for(dir, p.get_or("dtype", ""));
  if (!num) throw Error(num.status());
  model::dsv41::ModelOptions o;
  o.numerics = *num;
  std::string const device = p.get_or("device", "cpu");
  bool const sharded = par->tp > 1 || par->ep > 1;
  // Sharded: the CPU model holds the host weights the rank models are sliced from (GPU ranks upload their slices);
  // in bf16 it holds block-scaled weights as stored, so the ranks hold stored slices (rank_host_options).
  auto lm = sharded ? std::unique_ptr<model::LanguageModel>(model::dsv41::load_rank_host_model(dir, o).value_or_throw())
                    : model::dsv41::load_model_on(dir, o, device).value_or_throw();
  auto* m = dynamic_cast<model::dsv41::Dsv41Model*>(lm.get());  // null for the GPU model
  model::dsv41::CheckpointSource golden;
  std::string gfile = std::filesystem::is_directory(gdir) ? gdir + "/golden.safetensors" : gdir;
  throw_if_error(golden.open(gfile));
  std::printf("model %s (%s, %s), golden %s\n", dir.c_str(), lm->info().dtype.c_str(),
              sharded ? device.c_str() : lm->info().device.c_str(), gfile.c_str());
  if (p.has("dump-taps")) {
    if (!m) throw Error(not_supported("--dump-taps: module taps exist on the CPU model only (--device cpu)"));
    std::string const pk = "prompt." + p.get_or("dump-prompt", "0");
    if (!golden.contains(pk)) throw Error(invalid_argument("--dump-prompt: the golden has no " + pk));
    Tensor ids = golden.load_i64(pk).value_or_throw();
    std::vector<int32_t> toks(ids.data_as<int64_t>(), ids.data_as<int64_t>() + ids.numel());
    if (p.has("dump-full")) {
      Tensor gen = golden.load_i64("gen_manual." + p.get_or("dump-prompt", "0")).value_or_throw();
      toks.insert(toks.end(), gen.data_as<int64_t>(), gen.data_as<int64_t>() + gen.numel());
    }
    io::SafetensorsWriter w;
    std::map<std::string, int> seen;
    m->set_debug_tap([&](std::string const& n, std::vector<int64_t> const& shape, std::span<float const> v) {
      Tensor t = Tensor::from_floats(std::vector<float>(v.begin(), v.end()), shape);
      int const k = seen[n]++;
      throw_if_error(w.add(k ? n + "." + std::to_string(k) : n, t));
    });
    std::set<std::string> pins;
    std::string const pin_list = p.get_or("pin-golden", "");
    for (size_t b = 0; b < pin_list.size();) {
      size_t e = pin_list.find(',', b);
      if (e == std::string::npos) e = pin_list.size();
      if (e > b) pins.insert(pin_list.substr(b, e - b));
      b = e + 1;
    }
    if (!pins.empty()) {
      if (!p.has("dump-full")) throw Error(invalid_argument("--pin-golden needs --dump-full (the golden's debug forward)"));
      m->set_debug_pin([&](std::string const& n, std::span<float> v) {
        std::string const pre = "model.layers.";
        if (n.rfind(pre, 0) != 0) return;
        size_t const dot = n.find('.', pre.size());
        if (dot == std::string::npos || !pins.count(n.substr(dot + 1)) || !golden.contains("debug." + n)) return;
        Tensor g = golden.load_f32("debug." + n).value_or_throw();
        if (static_cast<size_t>(g.numel()) != v.size())
          throw Error(invalid_argument("--pin-golden: debug." + n + " has " + std::to_string(g.numel()) + " values, the tap " +
                                       std::to_string(v.size())));
        std::copy(g.data_as<float>(), g.data_as<float>() + g.numel(), v.begin());
      });
    }
    auto st = m->new_sequence();
    std::vector<float> lg(toks.size() * static_cast<size_t>(m->info().vocab_size));
    model::SequenceStep step{st.get(), toks, static_cast<int64_t>(toks.size()), lg.data()};
    throw_if_error(m->forward({&step, 1}));
    throw_if_error(w.add("logits", Tensor::from_floats(lg, {static_cast<int64_t>(toks.size()), m->info().vocab_size})));
    // Then --dump-steps single-token decode steps on the golden's own greedy tokens (taps suffixed .1, .2, …).
    std::string const gk = "gen_manual." + p.get_or("dump-prompt", "0");
    int64_t const steps = std::stoll(p.get_or("dump-steps", "0"));
    if (steps > 0) {
      Tensor gen = golden.load_i64(gk).value_or_throw();
      for (int64_t i = 0; i < steps && i < gen.numel(); ++i) {
        int32_t const t = static_cast<int32_t>(gen.data_as<int64_t>()[i]);
        model::SequenceStep one{st.get(), std::span<int32_t const>(&t, 1), 1, lg.data()};
        throw_if_error(m->forward({&one, 1}));
        throw_if_error(w.add("logits.step" + std::to_string(i + 1),
                             Tensor::from_floats(std::vector<float>(lg.begin(), lg.begin() + m->info().vocab_size),
                                                 {m->info().vocab_size})));
      }
    }
    m->set_debug_tap({});
    m->set_debug_pin({});
    throw_if_error(w.write(*p.get("dump-taps")));
    std::printf("wrote %zu taps of %s (%zu tokens) to %s\n", w.size(), pk.c_str(), toks.size(),
                p.get("dump-taps")->c_str());
    return 0;
  }
  auto log = [](std::string const& s) { std::printf("%s\n", s.c_str()); };
  model::dsv41::GoldenReport rep;
  if (sharded) {
    // Ranks as threads over the in-process communicator (docs/multi-gpu.md): CPU rank models, or GPU rank
    // models with --device cuda.
    auto sm = (device == "cuda" ? model::dsv41::ShardedModel::create_gpu(*m, *par, Backend::kCuda, o)
                                : model::dsv41::ShardedModel::create(*m, *par))
                  .value_or_throw();
    std::printf("in-process ranks: %d (tp %d, ep %d, %s); attention %s\n", sm->world(), par->tp, par->ep,
                sm->info().device.c_str(), sm->plan().attention_mode().c_str());
    rep = model::dsv41::run_golden_gate_sharded(*sm, golden, log).value_or_throw();
  } else {
    model::dsv41::GoldenGateHooks hooks;
    if (m) {
      hooks.set_boundary_ulps = [m](int u) { m->set_boundary_ulps(u); };
      hooks.ties = [](model::SequenceState const& s) { return &static_cast<model::dsv41::Dsv41State const&>(s).ties(); };
      hooks.boundaries = [](model::SequenceState const& s) {
        return &static_cast<model::dsv41::Dsv41State const&>(s).quant_boundaries();
      };
    } else {
      auto* gpu = static_cast<model::dsv41::GpuDsv41Model*>(lm.get());
      hooks.set_boundary_ulps = [gpu](int u) { gpu->set_boundary_ulps(u); };
      hooks.ties = &model::dsv41::GpuDsv41Model::ties;
      hooks.boundaries = &model::dsv41::GpuDsv41Model::quant_boundaries;
    }
    rep = model::dsv41::run_golden_gate(*lm, *num == model::dsv41::Numerics::kBf16, hooks, golden, log).value_or_throw();
  }
  for (auto const& r : rep.reasons) std::printf("FAIL: %s\n", r.c_str());
  std::printf("%s\n", rep.summary_line().c_str());
  return rep.pass ? 0 : 1;
}

}  // namespace tessera::cli

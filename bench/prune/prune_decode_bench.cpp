// SPDX-License-Identifier: Apache-2.0
/// CPU decode time of the golden tiny model (fp32) with and without per-token expert pruning
/// (spec/seed-notes.md §5): greedy token-by-token decode after a prefill, median of repeats, plus the
/// mean number of routed experts each decode row kept. CPU numbers only (the GPU path does not exist yet).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/golden_gate.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model::dsv41;

int main() {
  ModelOptions o;
  auto m = load_model(verify::tiny_dir("fp32"), o).value_or_throw();
  std::vector<int32_t> prompt;
  for (auto x : verify::tiny_files("fp32").ints("prompt.4")) prompt.push_back(static_cast<int32_t>(x));
  int64_t V = m->spec().vocab_size, K = m->spec().top_k;
  int const steps = 64, repeats = 5;
  std::printf("tiny fp32, prompt %zu tokens, %d decode steps, top_k %lld, median of %d\n", prompt.size(), steps,
              static_cast<long long>(K), repeats);
  for (float tp : {1.f, 0.9f, 0.6f, 0.5f}) {
    throw_if_error(m->set_pruning({tp, 1, true, ExpertPruning::Scope::kDecode, {}}));
    int64_t kept = 0, rows = 0;
    m->set_debug_tap([&](std::string const& n, std::vector<int64_t> const& shape, std::span<float const> v) {
      if (shape.size() != 2 || shape[0] != 1 || n.find(".ffn.gate.out1") == std::string::npos) return;
      for (float id : v) kept += id >= 0;
      ++rows;
    });
    std::vector<double> ms;
    for (int rep = 0; rep < repeats; ++rep) {
      auto st = m->new_sequence();
      std::vector<float> logits(prompt.size() * V);
      model::SequenceStep pre{st.get(), prompt, static_cast<int64_t>(prompt.size()), logits.data()};
      throw_if_error(m->forward({&pre, 1}));
      std::vector<int32_t> cur{static_cast<int32_t>(argmax_first(logits.data() + (prompt.size() - 1) * V, V))};
      if (rep > 0) m->set_debug_tap({});
      auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        model::SequenceStep step{st.get(), cur, 1, logits.data()};
        throw_if_error(m->forward({&step, 1}));
        cur[0] = static_cast<int32_t>(argmax_first(logits.data(), V));
      }
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("prune_top_p %.2f min_k 1: %.3f ms/token, mean routed experts kept per decode row %.3f of %lld\n", tp,
                ms[repeats / 2], rows ? static_cast<double>(kept) / rows : 0.0, static_cast<long long>(K));
  }
  return 0;
}

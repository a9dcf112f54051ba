// SPDX-License-Identifier: Apache-2.0
/// MhcMix CUDA (kernels/mhc/mhc_cuda.cu: rms pass, chunk-sum blocks, chunk-order finish) on the released shape
/// n = 4, D = 5120 (fn fp32 [24, 20480] = 1.97 MB), 20 Sinkhorn iterations, at rows 1, 4, 16, 64.
/// Each row count is first checked against the CPU op bit for bit (pre, post, comb; a FAIL row is not timed),
/// then timed with cudaEvents, medians of the iterations:
///   cold = one op after a 256 MiB L2 flush (fn and x come from DRAM, as in a decode step where the layer's
///          other weights pass through L2 between the two mixes; includes the three launches' latency);
///   hot  = back-to-back ops (fn resident in the 60 MB L2), per op.
/// GB/s is the fn stream only (1.97 MB / t), and % of the 4270 GB/s copy bandwidth measured on the H200
/// (bench/RESULTS.md). Usage: mhc_bench [--iters N] [--fp32] (model dtype: bf16 by default; it selects exp's
/// arithmetic only, the mix is fp32 either way).
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/ops/mhc.hpp"

using namespace tessera;

namespace {

constexpr double kCopyBandwidth = 4270e9;  // bytes/s, H200 measured copy (bench/RESULTS.md)

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t const e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

struct Dev {
  float* p = nullptr;
  explicit Dev(std::vector<float> const& h) {
    CK(cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(float)));
    CK(cudaMemcpy(p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t n) { CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float))); }
  Dev(Dev const&) = delete;
  ~Dev() { cudaFree(p); }
  std::vector<float> get(size_t n) const {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};

std::vector<float> randn(size_t n, uint64_t seed, float sd) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

int64_t bit_diffs(std::vector<float> const& a, std::vector<float> const& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  return n;
}

double median(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  DType md = DType::kBf16;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--fp32")) md = DType::kF32;
    else {
      std::fprintf(stderr, "usage: mhc_bench [--iters N] [--fp32]\n");
      return 2;
    }
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "mhc_bench: no CUDA device\n");
    return 77;
  }
  int64_t const n = 4, dim = 5120, nd = n * dim, nm = (2 + n) * n, max_rows = 64;
  double const fn_bytes = static_cast<double>(nm * nd) * sizeof(float);
  auto const x = randn(static_cast<size_t>(max_rows * nd), 1, 1.5f);
  auto const fn = randn(static_cast<size_t>(nm * nd), 2, 1.f / std::sqrt(static_cast<float>(nd)));
  auto const base = randn(static_cast<size_t>(nm), 3, 0.5f);
  std::vector<float> const scale = {0.7f, 1.3f, 2.1f};
  Dev dx(x), dfn(fn), dbase(base), dscale(scale), dpre(max_rows * n), dpost(max_rows * n), dcomb(max_rows * n * n);
  void* flush = nullptr;
  size_t const flush_bytes = size_t{256} << 20;
  CK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t ea, eb;
  CK(cudaEventCreate(&ea));
  CK(cudaEventCreate(&eb));
  ExecContext gctx;
  gctx.backend = Backend::kCuda;

  std::printf("MhcMix CUDA, n = %lld, D = %lld, fn %.2f MB fp32, md %s, %d iterations (medians)\n\n",
              static_cast<long long>(n), static_cast<long long>(dim), fn_bytes / 1e6,
              std::string(dtype_name(md)).c_str(), iters);
  std::printf("| rows | check | cold µs | cold fn GB/s | %% of 4270 | hot µs | hot fn GB/s | %% of 4270 |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---:|\n");
  int failed = 0;
  for (int64_t const rows : {int64_t{1}, int64_t{4}, int64_t{16}, int64_t{64}}) {
    ops::MhcMixDesc const d{rows, n, dim, 20, 1e-6f, 1e-20f, md};
    ops::MhcMixArgs const ga{TensorView<float const, 2>(dx.p, {rows, nd}, Device::kCuda),
                             TensorView<float const, 2>(dfn.p, {nm, nd}, Device::kCuda),
                             TensorView<float const, 1>(dbase.p, {nm}, Device::kCuda),
                             TensorView<float const, 1>(dscale.p, {3}, Device::kCuda),
                             TensorView<float, 2>(dpre.p, {rows, n}, Device::kCuda),
                             TensorView<float, 2>(dpost.p, {rows, n}, Device::kCuda),
                             TensorView<float, 2>(dcomb.p, {rows, n * n}, Device::kCuda)};
    auto run = [&] {
      auto const s = ops::MhcMix<Backend::kCuda>::run(d, ga, gctx);
      if (!s.ok()) {
        std::fprintf(stderr, "mhc_mix: %s\n", s.to_string().c_str());
        std::exit(1);
      }
    };
    if (auto const s = ops::MhcMix<Backend::kCuda>::check(d, ga); !s.ok()) {
      std::fprintf(stderr, "mhc_mix check: %s\n", s.to_string().c_str());
      return 1;
    }
    // Bitwise check against the CPU op.
    std::vector<float> pre(rows * n), post(rows * n), comb(rows * n * n);
    ExecContext cctx;
    auto const cs = ops::MhcMix<Backend::kCpu>::run(
        d,
        ops::MhcMixArgs{TensorView<float const, 2>(x.data(), {rows, nd}),
                        TensorView<float const, 2>(fn.data(), {nm, nd}),
                        TensorView<float const, 1>(base.data(), {nm}), TensorView<float const, 1>(scale.data(), {3}),
                        TensorView<float, 2>(pre.data(), {rows, n}), TensorView<float, 2>(post.data(), {rows, n}),
                        TensorView<float, 2>(comb.data(), {rows, n * n})},
        cctx);
    if (!cs.ok()) {
      std::fprintf(stderr, "mhc_mix CPU: %s\n", cs.to_string().c_str());
      return 1;
    }
    run();
    CK(cudaDeviceSynchronize());
    int64_t const bad = bit_diffs(dpre.get(pre.size()), pre) + bit_diffs(dpost.get(post.size()), post) +
                        bit_diffs(dcomb.get(comb.size()), comb);
    if (bad != 0) {
      std::printf("| %lld | FAIL (%lld bits differ) | | | | | | |\n", static_cast<long long>(rows),
                  static_cast<long long>(bad));
      ++failed;
      continue;
    }
    std::vector<float> cold, hot;
    for (int i = 0; i < iters; ++i) {
      CK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes));
      CK(cudaEventRecord(ea));
      run();
      CK(cudaEventRecord(eb));
      CK(cudaEventSynchronize(eb));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ea, eb));
      cold.push_back(ms * 1000.f);
    }
    constexpr int kReps = 20;
    for (int i = 0; i < iters; ++i) {
      CK(cudaEventRecord(ea));
      for (int r = 0; r < kReps; ++r) run();
      CK(cudaEventRecord(eb));
      CK(cudaEventSynchronize(eb));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ea, eb));
      hot.push_back(ms * 1000.f / kReps);
    }
    double const tc = median(cold), th = median(hot);
    double const gc = fn_bytes / (tc * 1e-6) / 1e9, gh = fn_bytes / (th * 1e-6) / 1e9;
    std::printf("| %lld | bitwise | %.1f | %.0f | %.1f %% | %.1f | %.0f | %.1f %% |\n", static_cast<long long>(rows),
                tc, gc, 100.0 * gc * 1e9 / kCopyBandwidth, th, gh, 100.0 * gh * 1e9 / kCopyBandwidth);
  }
  cudaEventDestroy(ea);
  cudaEventDestroy(eb);
  cudaFree(flush);
  return failed ? 1 : 0;
}

// SPDX-License-Identifier: Apache-2.0
/// EXL3 dequant-matmul benchmark on the DeepSeek-V4.1 shapes (spec/exl3.md §5.3), beside cuBLAS bf16 of the
/// same shape in the same run. Decode: batch 1, 2, 4, 8 at K = 2, 3, 4 (MUL1): achieved trellis GB/s
/// against the H200's 4.27 TB/s copy bandwidth. Prefill: M = 512..8192, TFLOP/s = 2·M·k·n / t.
/// Every row is checked before it is timed: decode rows against the naive reference kernel (spec §7.4
/// bounds), prefill rows by bitwise equality of sampled rows with the single-row path (row invariance) and
/// that row against the naive kernel. L2 is flushed (a 256 MiB memset) before every timed launch; the
/// median of the iterations is reported. Prints markdown tables ready for bench/RESULTS.md.
/// Usage: exl3_bench [--quick]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/ops/exl3.hpp"
#include "verify/exl3/exl3_test_util.hpp"

using namespace tessera;
using namespace tessera::verify::exl3;
namespace x3 = tessera::exl3;

namespace {

constexpr double kCopyBandwidth = 4.27e12;   // bytes/s, H200 measured copy (bench/RESULTS.md)

struct Timer {
  void* flush = nullptr;
  size_t flush_bytes = size_t{256} << 20;
  cudaEvent_t a{}, b{};
  Timer() {
    cudaMalloc(&flush, flush_bytes);
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Timer() {
    cudaFree(flush);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  /// Median microseconds of `iters` launches of fn, each after an L2 flush.
  double median_us(std::function<void()> const& fn, int iters) {
    fn();
    cudaDeviceSynchronize();
    std::vector<float> t;
    for (int i = 0; i < iters; ++i) {
      cudaMemsetAsync(flush, i & 0xFF, flush_bytes);
      cudaEventRecord(a);
      fn();
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

struct Shape { int64_t k, n; char const* name; };

/// One EXL3 layer on the device plus a reusable workspace and output.
struct Bench {
  HostLayer h;
  DevLayer d;
  Tensor ws;
  Bench(int64_t k, int64_t n, int bits, uint64_t seed)
      : h(random_layer(k, n, 2 * bits, x3::Codebook::kMul1, seed, false)), d(h) {}
  Status run(Tensor const& x, Tensor& y, int tactic) {
    int64_t const m = x.dim(0);
    ops::Exl3GemmDesc desc{{h.k, h.n, h.k2, h.cb}, m, DType::kF16, false};
    ops::Exl3GemmArgs a = d.args(x);
    a.y_f16 = y.view_as<Fp16, 2>();
    ExecContext ctx;
    ctx.backend = Backend::kCuda;
    ctx.impl_override = tactic;
    size_t need = ops::Exl3Gemm<Backend::kCuda>::workspace_bytes(desc);
    if (tactic == 1) need = std::max(need, (size_t{64} << 20));
    if (!ws.defined() || ws.nbytes() < need) ws = Tensor::empty(DType::kU8, {static_cast<int64_t>(need)}, Device::kCuda).value_or_throw();
    ctx.workspace = ws.data();
    ctx.workspace_bytes = ws.nbytes();
    return ops::Exl3Gemm<Backend::kCuda>::run(desc, a, ctx);
  }
  double trellis_bytes() const { return static_cast<double>(h.trellis.size()) * 2 + 2.0 * (h.k + h.n); }
};

std::vector<uint16_t> download16(Tensor const& t) {
  Tensor h = t.to(Device::kCpu).value_or_throw();
  return std::vector<uint16_t>(h.data_as<uint16_t>(), h.data_as<uint16_t>() + h.numel());
}

/// cuBLAS bf16 y[m, n] = x[m, k] · W[n, k]^T with fp32 compute.
struct Cublas {
  cublasHandle_t handle{};
  Cublas() { cublasCreate(&handle); }
  ~Cublas() { cublasDestroy(handle); }
  cublasStatus_t gemm(void const* w, void const* x, void* y, int64_t m, int64_t k, int64_t n) {
    float const alpha = 1.f, beta = 0.f;
    return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                        &alpha, w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF, static_cast<int>(k), &beta, y,
                        CUDA_R_16BF, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: benchmark skipped\n");
    return 77;
  }
  bool const quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int const iters = quick ? 5 : 20;
  Shape const shapes[] = {{5120, 2304, "expert w1/w3 5120x2304"}, {2304, 5120, "expert w2 2304x5120"},
                          {5120, 1280, "wq_a 5120x1280"},         {1280, 32768, "wq_b 1280x32768"},
                          {4096, 1024, "wo_a 4096x1024"},         {8192, 5120, "wo_b 8192x5120"},
                          {5120, 129280, "head 5120x129280"}};
  Timer timer;
  Cublas cublas;
  int failures = 0;

  std::printf("\n### EXL3 decode GEMV (MUL1) vs cuBLAS bf16, H200, L2 flushed, median of %d\n\n", iters);
  std::printf("| shape | K | batch | check | EXL3 us | trellis GB/s | %% of 4.27 TB/s | cuBLAS bf16 us | speedup |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (auto const& sh : shapes) {
    Tensor wbf = Tensor::empty(DType::kBf16, {sh.n, sh.k}, Device::kCuda).value_or_throw();
    cudaMemset(wbf.data(), 0x3C, wbf.nbytes());
    for (int bits : {2, 3, 4}) {
      Bench b(sh.k, sh.n, bits, 1000 + bits);
      for (int64_t m : {1, 2, 4, 8}) {
        Tensor x = upload(random_x(m, sh.k, 77 + m), DType::kF16, {m, sh.k});
        Tensor y = Tensor::empty(DType::kF16, {m, sh.n}, Device::kCuda).value_or_throw();
        Tensor yr = Tensor::empty(DType::kF16, {m, sh.n}, Device::kCuda).value_or_throw();
        Status s = b.run(x, y, 0);
        Status s2 = b.run(x, yr, 3);
        bool ok = s.ok() && s2.ok();
        std::string why = ok ? "" : (s.ok() ? s2.to_string() : s.to_string());
        if (ok) {
          Bounds bd = spec_bounds(download16(y), download16(yr));
          ok = bd.ok();
          if (!ok) why = bd.text();
        }
        if (!ok) {
          ++failures;
          std::printf("| %s | %d | %lld | FAIL: %s | | | | | |\n", sh.name, bits, static_cast<long long>(m), why.c_str());
          continue;
        }
        double const us = timer.median_us([&] { (void)b.run(x, y, 0); }, iters);
        Tensor xb = Tensor::empty(DType::kBf16, {m, sh.k}, Device::kCuda).value_or_throw();
        Tensor yb = Tensor::empty(DType::kBf16, {m, sh.n}, Device::kCuda).value_or_throw();
        cudaMemset(xb.data(), 0x3C, xb.nbytes());
        double const cu = timer.median_us([&] { cublas.gemm(wbf.data(), xb.data(), yb.data(), m, sh.k, sh.n); }, iters);
        double const gbs = b.trellis_bytes() / (us * 1e-6) / 1e9;
        std::printf("| %s | %d | %lld | ok | %.1f | %.0f | %.1f | %.1f | %.2fx |\n", sh.name, bits,
                    static_cast<long long>(m), us, gbs, 100.0 * gbs * 1e9 / kCopyBandwidth, cu, cu / us);
        std::fflush(stdout);
      }
    }
  }

  std::printf("\n### EXL3 prefill GEMM (MUL1 K=3) vs cuBLAS bf16, H200, median of %d\n\n", iters);
  std::printf("| shape | M | check | EXL3 us | EXL3 TFLOP/s | cuBLAS bf16 us | cuBLAS TFLOP/s | EXL3 / cuBLAS |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  Shape const prefill[] = {shapes[0], shapes[1], shapes[5]};
  for (auto const& sh : prefill) {
    Bench b(sh.k, sh.n, 3, 2000);
    Tensor wbf = Tensor::empty(DType::kBf16, {sh.n, sh.k}, Device::kCuda).value_or_throw();
    cudaMemset(wbf.data(), 0x3C, wbf.nbytes());
    for (int64_t m : {512, 1024, 2048, 4096, 8192}) {
      if (quick && m > 2048) continue;
      auto xs = random_x(m, sh.k, 300 + m);
      Tensor x = upload(xs, DType::kF16, {m, sh.k});
      Tensor y = Tensor::empty(DType::kF16, {m, sh.n}, Device::kCuda).value_or_throw();
      bool ok = b.run(x, y, 0).ok();
      std::string why = ok ? "" : "launch failed";
      if (ok) {
        auto all = download16(y);
        for (int64_t r : {int64_t{0}, m / 2 + 3, m - 1}) {
          std::vector<uint16_t> one(xs.begin() + r * sh.k, xs.begin() + (r + 1) * sh.k);
          Tensor x1 = upload(one, DType::kF16, {1, sh.k});
          Tensor y1 = Tensor::empty(DType::kF16, {1, sh.n}, Device::kCuda).value_or_throw();
          Tensor y1r = Tensor::empty(DType::kF16, {1, sh.n}, Device::kCuda).value_or_throw();
          ok = ok && b.run(x1, y1, 0).ok() && b.run(x1, y1r, 3).ok();
          auto g1 = download16(y1);
          if (!std::equal(g1.begin(), g1.end(), all.begin() + r * sh.n)) { ok = false; why = "row " + std::to_string(r) + " differs from its single-row result"; }
          Bounds bd = spec_bounds(g1, download16(y1r));
          if (!bd.ok()) { ok = false; why = bd.text(); }
        }
      }
      if (!ok) {
        ++failures;
        std::printf("| %s | %lld | FAIL: %s | | | | | |\n", sh.name, static_cast<long long>(m), why.c_str());
        continue;
      }
      double const flop = 2.0 * static_cast<double>(m) * sh.k * sh.n;
      double const us = timer.median_us([&] { (void)b.run(x, y, 0); }, iters);
      Tensor xb = Tensor::empty(DType::kBf16, {m, sh.k}, Device::kCuda).value_or_throw();
      Tensor yb = Tensor::empty(DType::kBf16, {m, sh.n}, Device::kCuda).value_or_throw();
      cudaMemset(xb.data(), 0x3C, xb.nbytes());
      double const cu = timer.median_us([&] { cublas.gemm(wbf.data(), xb.data(), yb.data(), m, sh.k, sh.n); }, iters);
      std::printf("| %s | %lld | ok | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", sh.name, static_cast<long long>(m), us,
                  flop / (us * 1e-6) / 1e12, cu, flop / (cu * 1e-6) / 1e12, 100.0 * cu / us);
      std::fflush(stdout);
    }
  }
  std::printf("\n%d row(s) failed their correctness check\n", failures);
  return failures ? 1 : 0;
}

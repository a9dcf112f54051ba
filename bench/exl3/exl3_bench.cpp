// SPDX-License-Identifier: Apache-2.0
/// EXL3 dequant-matmul benchmark on the DeepSeek-V4.1 shapes (spec/exl3.md §5.3), beside cuBLAS bf16 of the
/// same shape in the same run. Decode: batch 1, 2, 4, 8 at K = 2, 3, 4 (MUL1): achieved trellis GB/s
/// against the H200's 4.27 TB/s copy bandwidth. Prefill: M = 512..8192, TFLOP/s = 2·M·k·n / t.
/// Every row is checked before it is timed: decode rows against the naive reference kernel (spec §7.4
/// bounds) and the fused GEMV epilogue against the unfused one (bitwise); prefill rows by bitwise equality
/// of sampled rows with the same row alone through the same path (row invariance: the decode-once path at
/// m ≥ kExl3DecodeOnceMinRows, the GEMM below) and that row against the naive kernel. The prefill table also
/// times the chunk-chain GEMM (strict_rows) beside the default path. Two timings per decode row, medians:
///   * call: one op after an L2 flush (a 256 MiB memset), events around it — includes the launch latency
///     of an isolated call (the "empty kernel" floor row measures that floor for one launch);
///   * stream: R back-to-back ops over R distinct copies of the weights (R·bytes ≥ 3× the 60 MB L2, so
///     every copy streams from DRAM), divided by R — the steady state of a decode step's layer sequence.
/// cuBLAS is timed the same two ways. MoE (--moe): the grouped op on the routed-expert shapes, the GEMV with chunk
/// partials against the grouped GEMM, checked bitwise against each other first. Prints markdown tables ready for
/// bench/RESULTS.md.
/// Usage: exl3_bench [--quick] [--decode|--prefill|--moe] [--shape SUBSTR] [--bits K] [--batch M] [--iters N]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
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
  /// Median microseconds per op of `reps` back-to-back ops fn(0..reps−1) after one L2 flush.
  double median_stream_us(std::function<void(int)> const& fn, int reps, int iters) {
    for (int r = 0; r < reps; ++r) fn(r);
    cudaDeviceSynchronize();
    std::vector<float> t;
    for (int i = 0; i < iters; ++i) {
      cudaMemsetAsync(flush, i & 0xFF, flush_bytes);
      cudaEventRecord(a);
      for (int r = 0; r < reps; ++r) fn(r);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      t.push_back(ms * 1000.f / static_cast<float>(reps));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

/// Copies of a weight so that `copies · bytes` ≥ 3 × 60 MB (L2), 2..64 of them.
int stream_copies(double bytes) {
  return static_cast<int>(std::clamp(std::ceil(180e6 / bytes), 2.0, 64.0));
}

struct Shape { int64_t k, n; char const* name; };

/// One EXL3 layer on the device plus a reusable workspace and output.
struct Bench {
  HostLayer h;
  DevLayer d;
  Tensor ws;
  Bench(int64_t k, int64_t n, int bits, uint64_t seed)
      : h(random_layer(k, n, 2 * bits, x3::Codebook::kMul1, seed, false)), d(h) {}
  std::vector<Tensor> copies;   // extra trellis copies for the stream timing
  Status run(Tensor const& x, Tensor& y, int tactic, int copy = 0, bool strict = false) {
    int64_t const m = x.dim(0);
    ops::Exl3GemmDesc desc{{h.k, h.n, h.k2, h.cb}, m, DType::kF16, false, strict};
    ops::Exl3GemmArgs a = d.args(x);
    if (copy > 0) a.trellis = copies[static_cast<size_t>(copy - 1)].view_as<int16_t const, 3>();
    a.y_f16 = y.view_as<Fp16, 2>();
    ExecContext ctx;
    ctx.backend = Backend::kCuda;
    ctx.impl_override = tactic;
    size_t need = ops::Exl3Gemm<Backend::kCuda>::workspace_bytes(desc);
    if (tactic == 1 || tactic == 5) need = std::max(need, (size_t{64} << 20));
    if (tactic == 4) need = std::max(need, ops::Exl3Gemm<Backend::kCuda>::workspace_bytes({desc.layer, std::max<int64_t>(m, ops::kExl3DecodeOnceMinRows), DType::kF16}));
    if (!ws.defined() || ws.nbytes() < need) ws = Tensor::empty(DType::kU8, {static_cast<int64_t>(need)}, Device::kCuda).value_or_throw();
    ctx.workspace = ws.data();
    ctx.workspace_bytes = ws.nbytes();
    return ops::Exl3Gemm<Backend::kCuda>::run(desc, a, ctx);
  }
  double trellis_bytes() const { return static_cast<double>(h.trellis.size()) * 2 + 2.0 * (h.k + h.n); }
  void make_copies(int count) {
    while (static_cast<int>(copies.size()) < count - 1) {
      Tensor t = Tensor::empty(DType::kI16, {h.k / 16, h.n / 16, 8 * h.k2}, Device::kCuda).value_or_throw();
      cudaMemcpy(t.data(), d.trellis.data(), t.nbytes(), cudaMemcpyDeviceToDevice);
      copies.push_back(std::move(t));
    }
  }
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


struct Options {
  bool quick = false, decode = true, prefill = true, moe = true;
  std::string shape;   // substring filter on the shape name
  int bits = 0;        // 0 = 2, 3, 4
  int64_t batch = 0;   // 0 = all
  int iters = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--quick") { o.quick = true; o.iters = 5; }
    else if (a == "--decode") o.prefill = o.moe = false;
    else if (a == "--prefill") o.decode = o.moe = false;
    else if (a == "--moe") o.decode = o.prefill = false;
    else if (a == "--shape") o.shape = next();
    else if (a == "--bits") o.bits = std::stoi(next());
    else if (a == "--batch") o.batch = std::stoll(next());
    else if (a == "--iters") o.iters = std::stoi(next());
    else std::fprintf(stderr, "exl3_bench: ignoring unknown argument %s\n", a.c_str());
  }
  return o;
}

/// MoE grouped products (Exl3GroupedGemm) on the DeepSeek-V4.1 routed experts as the model calls them: 384
/// experts, top-6 distinct uniform experts per token, MUL1 K = 3 (or --bits); w1/w3 gather token rows of x [T, 5120],
/// w2 reads act [A, 2304] through the identity. Distinct trellis addresses per expert (8 random layers repeated).
/// Paths: 5 = GEMV writing S chunk partials + the epilogue kernel, 2 = grouped GEMM (chain in registers) + the
/// epilogue kernel; their fp32 outputs must agree bit for bit. One L2 flush per call. Returns the failures.
int moe_table(Timer& timer, Options const& opt) {
  int64_t const E = 384, top_k = 6;
  int const bits = opt.bits ? opt.bits : 3;
  Shape const moe_shapes[] = {{5120, 2304, "expert w1/w3 5120x2304"}, {2304, 5120, "expert w2 2304x5120"}};
  std::printf("\n### EXL3 MoE grouped products (MUL1 K=%d, 384 experts, top-6), median of %d\n\n", bits, opt.iters);
  std::printf("GEMV = the GEMV writing S chunk partials (S = k/128 here) + the epilogue kernel; grouped GEMM = the chunk "
              "chain in registers over 128-row tiles of each expert's rows + the epilogue kernel; auto takes the GEMM "
              "from %lld rows per expert on average.\n\n",
              static_cast<long long>(ops::kExl3GroupedGemmMinRows));
  std::printf("| shape | tokens | assignments | rows/expert | auto | check | GEMV us | grouped GEMM us | GEMV / GEMM |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  int failures = 0;
  for (auto const& sh : moe_shapes) {
    if (!opt.shape.empty() && !std::strstr(sh.name, opt.shape.c_str())) continue;
    std::vector<DevLayer> base;
    for (int i = 0; i < 8; ++i) base.emplace_back(random_layer(sh.k, sh.n, 2 * bits, x3::Codebook::kMul1, 4000 + i, false));
    int64_t const words = (sh.k / 16) * (sh.n / 16) * 16 * bits;
    Tensor trel = Tensor::empty(DType::kI16, {E * words}, Device::kCuda).value_or_throw();
    std::vector<int16_t const*> tp;
    std::vector<Fp16 const*> sp, vp;
    for (int64_t e = 0; e < E; ++e) {
      DevLayer const& b = base[static_cast<size_t>(e % 8)];
      int16_t* dst = trel.data_as<int16_t>() + e * words;
      cudaMemcpy(dst, b.trellis.data(), static_cast<size_t>(words) * 2, cudaMemcpyDeviceToDevice);
      tp.push_back(dst);
      sp.push_back(b.suh.data_as<Fp16>());
      vp.push_back(b.svh.data_as<Fp16>());
    }
    Tensor tpd = upload_ptrs(tp), spd = upload_ptrs(sp), vpd = upload_ptrs(vp);
    bool const down = sh.k == 2304;
    for (int64_t T : {64, 256, 512, 1024, 2048, 4096, 8192}) {
      if (opt.batch && T != opt.batch) continue;
      if (opt.quick && T > 2048) continue;
      std::mt19937 g(static_cast<uint32_t>(T));
      std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int64_t> picked;
        while (static_cast<int64_t>(picked.size()) < top_k) {
          int64_t const e = static_cast<int64_t>(g() % static_cast<uint32_t>(E));
          if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
        }
        for (int64_t e : picked) by_expert[static_cast<size_t>(e)].push_back(static_cast<int32_t>(t));
      }
      std::vector<int32_t> off{0}, tok;
      for (auto const& r : by_expert) {
        tok.insert(tok.end(), r.begin(), r.end());
        off.push_back(static_cast<int32_t>(tok.size()));
      }
      int64_t const A = static_cast<int64_t>(tok.size());
      if (down)
        for (int64_t a = 0; a < A; ++a) tok[static_cast<size_t>(a)] = static_cast<int32_t>(a);
      int64_t const xrows = down ? A : T;
      Tensor x = upload(random_x(xrows, sh.k, 5 + T), DType::kF16, {xrows, sh.k});
      Tensor offd = upload(off, DType::kI32, {E + 1}), tokd = upload(tok, DType::kI32, {A});
      Tensor y5 = Tensor::empty(DType::kF32, {A, sh.n}, Device::kCuda).value_or_throw();
      Tensor y2 = Tensor::empty(DType::kF32, {A, sh.n}, Device::kCuda).value_or_throw();
      // Scratch for either path: xh + at most k/128 chunk partials per output (exl3_num_chunks ≤ tiles_k / 8).
      size_t const ws_bytes = static_cast<size_t>(A * sh.k) * 2 + 256 + static_cast<size_t>(sh.k / 128) * static_cast<size_t>(A * sh.n) * 4 + 256;
      Tensor ws = Tensor::empty(DType::kU8, {static_cast<int64_t>(ws_bytes)}, Device::kCuda).value_or_throw();
      ops::Exl3GroupedGemmDesc const desc{{sh.k, sh.n, 2 * bits, x3::Codebook::kMul1}, E, xrows, A};
      auto run = [&](int path, Tensor& y) {
        ops::Exl3GroupedGemmArgs a;
        a.x = x.view_as<Fp16 const, 2>();
        a.trellis = static_cast<int16_t const* const*>(tpd.data());
        a.suh = static_cast<Fp16 const* const*>(spd.data());
        a.svh = static_cast<Fp16 const* const*>(vpd.data());
        a.expert_offsets = offd.data_as<int32_t>();
        a.token_idx = tokd.data_as<int32_t>();
        a.y = y.view_as<float, 2>();
        ExecContext ctx;
        ctx.backend = Backend::kCuda;
        ctx.impl_override = path;
        ctx.workspace = ws.data();
        ctx.workspace_bytes = ws.nbytes();
        return ops::Exl3GroupedGemm<Backend::kCuda>::run(desc, a, ctx);
      };
      bool const auto_gemm = A >= ops::kExl3GroupedGemmMinRows * E;
      char const* const auto_name = auto_gemm ? "GEMM" : "GEMV";
      double const per_expert = static_cast<double>(A) / static_cast<double>(E);
      Status s5 = run(5, y5), s2 = run(2, y2);
      std::string why = !s5.ok() ? s5.to_string() : !s2.ok() ? s2.to_string() : std::string();
      if (why.empty() && cudaDeviceSynchronize() != cudaSuccess) why = "device error";
      if (why.empty()) {
        Tensor h5 = y5.to(Device::kCpu).value_or_throw(), h2 = y2.to(Device::kCpu).value_or_throw();
        if (std::memcmp(h5.data(), h2.data(), h5.nbytes()) != 0) why = "grouped GEMM differs from the GEMV";
      }
      if (!why.empty()) {
        ++failures;
        std::printf("| %s | %lld | %lld | %.1f | %s | FAIL: %s | | | |\n", sh.name, static_cast<long long>(T),
                    static_cast<long long>(A), per_expert, auto_name, why.c_str());
        continue;
      }
      double const us5 = timer.median_us([&] { (void)run(5, y5); }, opt.iters);
      double const us2 = timer.median_us([&] { (void)run(2, y2); }, opt.iters);
      std::printf("| %s | %lld | %lld | %.1f | %s | ok | %.1f | %.1f | %.2fx |\n", sh.name, static_cast<long long>(T),
                  static_cast<long long>(A), per_expert, auto_name, us5, us2, us5 / us2);
      std::fflush(stdout);
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: benchmark skipped\n");
    return 77;
  }
  Options const opt = parse(argc, argv);
  int const iters = opt.iters;
  Shape const shapes[] = {{5120, 2304, "expert w1/w3 5120x2304"}, {2304, 5120, "expert w2 2304x5120"},
                          {5120, 1280, "wq_a 5120x1280"},         {1280, 32768, "wq_b 1280x32768"},
                          {4096, 1024, "wo_a 4096x1024"},         {8192, 5120, "wo_b 8192x5120"},
                          {5120, 129280, "head 5120x129280"}};
  auto selected = [&](Shape const& sh) { return opt.shape.empty() || std::strstr(sh.name, opt.shape.c_str()); };
  std::vector<int> const bit_list = opt.bits ? std::vector<int>{opt.bits} : std::vector<int>{2, 3, 4};
  Timer timer;
  Cublas cublas;
  int failures = 0;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  if (opt.decode) {
    Tensor tiny = Tensor::empty(DType::kU8, {256}, Device::kCuda).value_or_throw();
    double const floor_call = timer.median_us([&] { cudaMemsetAsync(tiny.data(), 0, 4); }, iters);
    double const floor_stream = timer.median_stream_us([&](int) { cudaMemsetAsync(tiny.data(), 0, 4); }, 16, iters);
    std::printf("\nTiming floor (a 4-byte cudaMemsetAsync): call %.1f us, stream %.2f us per op\n", floor_call,
                floor_stream);
    std::printf("\n### EXL3 decode GEMV (MUL1) vs cuBLAS bf16, H200, median of %d\n\n", iters);
    std::printf("call = one op after an L2 flush; stream = back-to-back ops over distinct weight copies (DRAM), per op.\n\n");
    std::printf("unfused = the GEMV then the epilogue kernel (two launches); the default fuses the epilogue into the GEMV "
                "at batch 1 on layers of <= 2^17 tiles and is the unfused path otherwise.\n\n");
    std::printf("| shape | K | batch | check | call us | stream us | unfused stream us | stream GB/s | %% of 4.27 TB/s "
                "| cuBLAS call us | cuBLAS stream us | speedup call | speedup stream |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (auto const& sh : shapes) {
    if (!opt.decode || !selected(sh)) continue;
    Tensor wbf = Tensor::empty(DType::kBf16, {sh.n, sh.k}, Device::kCuda).value_or_throw();
    cudaMemset(wbf.data(), 0x3C, wbf.nbytes());
    int const bf_copies = stream_copies(static_cast<double>(wbf.nbytes()));
    std::vector<Tensor> wbf_copies;
    for (int c = 1; c < bf_copies; ++c) {
      wbf_copies.push_back(Tensor::empty(DType::kBf16, {sh.n, sh.k}, Device::kCuda).value_or_throw());
      cudaMemcpy(wbf_copies.back().data(), wbf.data(), wbf.nbytes(), cudaMemcpyDeviceToDevice);
    }
    auto wbf_ptr = [&](int c) { return c == 0 ? wbf.data() : wbf_copies[static_cast<size_t>(c - 1)].data(); };
    for (int bits : bit_list) {
      Bench b(sh.k, sh.n, bits, 1000 + bits);
      int const copies = stream_copies(b.trellis_bytes());
      b.make_copies(copies);
      for (int64_t m : {1, 2, 4, 8}) {
        if (opt.batch && m != opt.batch) continue;
        Tensor x = upload(random_x(m, sh.k, 77 + m), DType::kF16, {m, sh.k});
        Tensor y = Tensor::empty(DType::kF16, {m, sh.n}, Device::kCuda).value_or_throw();
        Tensor yr = Tensor::empty(DType::kF16, {m, sh.n}, Device::kCuda).value_or_throw();
        Tensor yu = Tensor::empty(DType::kF16, {m, sh.n}, Device::kCuda).value_or_throw();
        Status s = b.run(x, y, 0);
        Status s2 = b.run(x, yr, 3);
        Status s3 = b.run(x, yu, 5);
        bool ok = s.ok() && s2.ok() && s3.ok();
        std::string why = ok ? "" : (!s.ok() ? s.to_string() : !s2.ok() ? s2.to_string() : s3.to_string());
        if (ok) {
          auto const yv = download16(y);
          Bounds bd = spec_bounds(yv, download16(yr));
          ok = bd.ok();
          if (!ok) why = bd.text();
          if (ok && yv != download16(yu)) { ok = false; why = "fused epilogue differs from the unfused one"; }
        }
        if (!ok) {
          ++failures;
          std::printf("| %s | %d | %lld | FAIL: %s | | | | | | | | | |\n", sh.name, bits, static_cast<long long>(m),
                      why.c_str());
          continue;
        }
        double const us = timer.median_us([&] { (void)b.run(x, y, 0); }, iters);
        double const us_s = timer.median_stream_us([&](int c) { (void)b.run(x, y, 0, c); }, copies, iters);
        double const us_u = timer.median_stream_us([&](int c) { (void)b.run(x, yu, 5, c); }, copies, iters);
        Tensor xb = Tensor::empty(DType::kBf16, {m, sh.k}, Device::kCuda).value_or_throw();
        Tensor yb = Tensor::empty(DType::kBf16, {m, sh.n}, Device::kCuda).value_or_throw();
        cudaMemset(xb.data(), 0x3C, xb.nbytes());
        double const cu = timer.median_us([&] { cublas.gemm(wbf.data(), xb.data(), yb.data(), m, sh.k, sh.n); }, iters);
        double const cu_s = timer.median_stream_us(
            [&](int c) { cublas.gemm(wbf_ptr(c), xb.data(), yb.data(), m, sh.k, sh.n); }, bf_copies, iters);
        double const gbs = b.trellis_bytes() / (us_s * 1e-6) / 1e9;
        std::printf("| %s | %d | %lld | ok | %.1f | %.2f | %.2f | %.0f | %.1f | %.1f | %.2f | %.2fx | %.2fx |\n", sh.name,
                    bits, static_cast<long long>(m), us, us_s, us_u, gbs, 100.0 * gbs * 1e9 / kCopyBandwidth, cu, cu_s,
                    cu / us, cu_s / us_s);
        std::fflush(stdout);
      }
    }
  }

  if (opt.prefill) {
    std::printf("\n### EXL3 prefill GEMM (MUL1 K=3) vs cuBLAS bf16, H200, median of %d\n\n", iters);
    std::printf("path: decode-once = W' decoded to fp16 scratch once + cuBLASLt (m >= %lld); GEMM = the chunk-chain "
                "GEMM (decode in the loop), also timed as \"strict\" at every M.\n\n",
                static_cast<long long>(ops::kExl3DecodeOnceMinRows));
    std::printf("| shape | M | path | check | EXL3 us | EXL3 TFLOP/s | strict GEMM us | cuBLAS bf16 us | cuBLAS TFLOP/s "
                "| EXL3 / cuBLAS |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  }
  Shape const prefill[] = {shapes[0], shapes[1], shapes[5]};
  for (auto const& sh : prefill) {
    if (!opt.prefill || !selected(sh)) continue;
    Bench b(sh.k, sh.n, 3, 2000);
    Tensor wbf = Tensor::empty(DType::kBf16, {sh.n, sh.k}, Device::kCuda).value_or_throw();
    cudaMemset(wbf.data(), 0x3C, wbf.nbytes());
    for (int64_t m : {512, 1024, 2048, 4096, 8192}) {
      if (opt.quick && m > 2048) continue;
      if (opt.batch && m != opt.batch) continue;
      auto xs = random_x(m, sh.k, 300 + m);
      Tensor x = upload(xs, DType::kF16, {m, sh.k});
      Tensor y = Tensor::empty(DType::kF16, {m, sh.n}, Device::kCuda).value_or_throw();
      bool const once = m >= ops::kExl3DecodeOnceMinRows;
      bool ok = b.run(x, y, 0).ok();
      std::string why = ok ? "" : "launch failed";
      if (ok) {
        auto all = download16(y);
        for (int64_t r : {int64_t{0}, m / 2 + 3, m - 1}) {
          std::vector<uint16_t> one(xs.begin() + r * sh.k, xs.begin() + (r + 1) * sh.k);
          Tensor x1 = upload(one, DType::kF16, {1, sh.k});
          Tensor y1 = Tensor::empty(DType::kF16, {1, sh.n}, Device::kCuda).value_or_throw();
          Tensor y1r = Tensor::empty(DType::kF16, {1, sh.n}, Device::kCuda).value_or_throw();
          ok = ok && b.run(x1, y1, once ? 4 : 0).ok() && b.run(x1, y1r, 3).ok();
          auto g1 = download16(y1);
          if (!std::equal(g1.begin(), g1.end(), all.begin() + r * sh.n)) { ok = false; why = "row " + std::to_string(r) + " differs from its single-row result"; }
          Bounds bd = spec_bounds(g1, download16(y1r));
          if (!bd.ok()) { ok = false; why = bd.text(); }
        }
      }
      if (!ok) {
        ++failures;
        std::printf("| %s | %lld | %s | FAIL: %s | | | | | | |\n", sh.name, static_cast<long long>(m),
                    once ? "decode-once" : "GEMM", why.c_str());
        continue;
      }
      double const flop = 2.0 * static_cast<double>(m) * sh.k * sh.n;
      double const us = timer.median_us([&] { (void)b.run(x, y, 0); }, iters);
      double const us_strict = timer.median_us([&] { (void)b.run(x, y, 0, 0, true); }, std::max(3, iters / 4));
      Tensor xb = Tensor::empty(DType::kBf16, {m, sh.k}, Device::kCuda).value_or_throw();
      Tensor yb = Tensor::empty(DType::kBf16, {m, sh.n}, Device::kCuda).value_or_throw();
      cudaMemset(xb.data(), 0x3C, xb.nbytes());
      double const cu = timer.median_us([&] { cublas.gemm(wbf.data(), xb.data(), yb.data(), m, sh.k, sh.n); }, iters);
      std::printf("| %s | %lld | %s | ok | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", sh.name,
                  static_cast<long long>(m), once ? "decode-once" : "GEMM", us, flop / (us * 1e-6) / 1e12, us_strict, cu,
                  flop / (cu * 1e-6) / 1e12, 100.0 * cu / us);
      std::fflush(stdout);
    }
  }
  if (opt.moe) failures += moe_table(timer, opt);
  std::printf("\n%d row(s) failed their correctness check\n", failures);
  return failures ? 1 : 0;
}

// SPDX-License-Identifier: Apache-2.0
/// Tensor-core bf16 linear (ops::linear_tc_cuda, mma.sync in the exact K order of ref::dot_tc) against cuBLAS
/// bf16 (cublasGemmEx, CUBLAS_COMPUTE_32F, default algorithm, bf16 output: what torch's F.linear calls) in the
/// same run, on the DeepSeek-V4.1 linear shapes (K × N): expert w1/w3 5120×2304, expert w2 2304×5120, wo_b
/// 8192×5120, wq_a 5120×1280, wq_b 1280×32768.
///   prefill  M = 512 … 8192 (GEMM tile): TFLOP/s = 2·M·N·K / t, and % of 754 TFLOP/s (the H200's dense bf16
///            figure this project uses).
///   decode   M = 1, 4, 8, 16 (skinny tile): GB/s = (W + x + y bytes) / t, and % of the 4.27 TB/s copy
///            bandwidth measured on the H200 (bench/RESULTS.md). Two timings, medians of the iterations:
///            call = one op after a 256 MiB L2 flush (includes one launch latency); stream = R back-to-back ops
///            over R distinct copies of W (R·|W| ≥ 3× the 60 MB L2, so every copy streams from DRAM), per op.
/// Every row is checked before it is timed: sampled outputs of one launch (fp32 accumulator and →bf16) must
/// equal ref::dot_tc bit for bit (a FAIL row is not timed); the table also says how many of those sampled
/// bf16 outputs cuBLAS gives differently (cuBLAS follows the same model on the H200 for its bf16 output:
/// verify/gpu_ops/tensor_core_test.cpp). Prints markdown tables for bench/RESULTS.md.
///   moe      MoeExperts<kCuda> (ops/moe.hpp) on the Flash expert shape (dim 5120, inter 2304, bf16 weights, md bf16),
///            16 experts allocated, top-6 + the shared expert, tokens 1, 4, 16, 64: one call (sort, tiles, x → bf16,
///            act, down, combine) per path (kSkinny / kGemm on the tensor cores, kEmulated), after an L2 flush;
///            GB/s = expert weight bytes touched (3 matrices × 23.6 MB × (distinct routed experts + 1)) / time.
///            check: the three paths' outputs are equal bit for bit (each equals the CPU op: verify_gpu_moe_tc). Beside
///            them the routed experts block-scaled (FP4, MoeExpertsDesc::routed_scaled) on kSkinny.
///   quant    the skinny tile on block-scaled weights (FP8 e4m3 + 32×32-block ue8m0, FP4 e2m1 + per-row-per-32
///            ue8m0; linear_tc_quant.cuh) beside bf16 on the same shapes, M = 1, 4, 16, stream timing: time, GB/s of
///            the bytes read (codes + scales + x + y) and the speedup over bf16. check: every output of the
///            block-scaled launch equals the bf16 launch on the decoded weights (ops::scaled_weight) bit for bit.
///   quant-gemm  the GEMM tiles on block-scaled weights (codes decoded per K slab in the tile; the mma.sync tile of
///            linear_tc_quant_gemm.cuh and the wgmma tile of linear_tc_wgmma.cuh), FP8 and FP4, M = 512, 2048, 8192,
///            beside the bf16 tiles on the decoded weights and cuBLAS bf16 in the same run: time and TFLOP/s. check:
///            every block-scaled output and the bf16 wgmma tile's equal the bf16 mma.sync tile's bit for bit.
///   (prefill times the mma.sync and the wgmma tile side by side, each sampled against ref::dot_tc.)
/// Usage: tc_bench [--quick] [--decode|--prefill|--moe|--slabs|--quant|--quant-gemm] [--shape SUBSTR] [--batch M] [--iters N] [--quant-path ring|direct|ws|auto]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ref/common_ref.hpp"

using namespace tessera;

namespace {

constexpr double kCopyBandwidth = 4.27e12;  // bytes/s, H200 measured copy (bench/RESULTS.md)
constexpr double kPeakBf16 = 754e12;        // FLOP/s, the dense bf16 tensor-core figure used for percentages

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t const e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

struct Timer {
  void* flush = nullptr;
  size_t flush_bytes = size_t{256} << 20;
  cudaEvent_t a{}, b{};
  Timer() {
    CK(cudaMalloc(&flush, flush_bytes));
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
    CK(cudaDeviceSynchronize());
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
    CK(cudaDeviceSynchronize());
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

/// Copies of W so that copies · bytes ≥ 3 × 60 MB (L2), 2..64 of them.
int stream_copies(double bytes) { return static_cast<int>(std::clamp(std::ceil(180e6 / bytes), 2.0, 64.0)); }

struct Shape {
  int64_t k, n;
  char const* name;
};

/// n bf16 values: a pool of 2^20 normal(0, 1) bf16 values drawn from by a fast generator (bench data only).
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  static std::vector<uint16_t> pool = [] {
    std::mt19937_64 g(12345);
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<uint16_t> p(size_t{1} << 20);
    for (auto& v : p) v = bf16_bits_from_float(d(g));
    return p;
  }();
  std::vector<uint16_t> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    x = pool[s & ((size_t{1} << 20) - 1)];
  }
  return v;
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { CK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  Dev(Dev const&) = delete;
  Dev(Dev&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  ~Dev() { if (p) cudaFree(p); }
  void upload(std::vector<T> const& h) { CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> get(size_t count) const {
    std::vector<T> h(count);
    CK(cudaMemcpy(h.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

/// cuBLAS bf16 y[m, n] = x[m, k] · W[n, k]ᵀ with fp32 compute, bf16 output (column-major C[n, m]).
struct Cublas {
  cublasHandle_t handle{};
  Cublas() { cublasCreate(&handle); }
  ~Cublas() { cublasDestroy(handle); }
  cublasStatus_t gemm(void const* w, void const* x, void* y, int64_t m, int64_t k, int64_t n) {
    float const alpha = 1.f, beta = 0.f;
    return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                        static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF,
                        static_cast<int>(k), &beta, y, CUDA_R_16BF, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
  }
};

Status run_tc(uint16_t const* w, uint16_t const* x, float* y, uint16_t* yb, int64_t m, int64_t k, int64_t n,
              ops::TcSlab slab = ops::TcSlab::kAuto, ops::TcTile tile = ops::TcTile::kAuto) {
  ops::LinearTcDesc d{m, n, k};
  d.slab = slab;
  d.tile = tile;
  ops::LinearTcArgs a;
  a.x = reinterpret_cast<Bf16 const*>(x);
  a.w = reinterpret_cast<Bf16 const*>(w);
  a.ldx = a.ldw = k;
  a.y = y;
  a.ldy = n;
  a.y_bf16 = reinterpret_cast<Bf16*>(yb);
  a.ldy_bf16 = n;
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  return ops::linear_tc_cuda(d, a, ctx);
}

/// The skinny tile on block-scaled W (codes [n, k or k/2] contiguous, scales [srows, ⌈k/32⌉]), bf16 output.
/// --quant-path ring|direct|ws|auto: how block-scaled codes reach the mma chain (ops::TcQuantPath).
ops::TcQuantPath g_quant_path = ops::TcQuantPath::kAuto;

Status run_q(DType fmt, uint8_t const* q, uint8_t const* sc, uint16_t const* x, uint16_t* yb, int64_t m, int64_t k, int64_t n,
             ops::TcTile tile = ops::TcTile::kAuto) {
  ops::LinearTcDesc d{m, n, k};
  d.tile = tile;
  d.quant = g_quant_path == ops::TcQuantPath::kDirect && !ops::tc_quant_direct_fits(m, k) ? ops::TcQuantPath::kRing : g_quant_path;
  ops::LinearTcArgs a;
  a.x = reinterpret_cast<Bf16 const*>(x);
  a.ldx = k;
  a.w_format = fmt;
  a.w_q = q, a.ldw_q = fmt == DType::kF4E2m1x2 ? k / 2 : k;
  a.w_scale = sc, a.ldw_scale = (k + 31) / 32;
  a.y_bf16 = reinterpret_cast<Bf16*>(yb);
  a.ldy_bf16 = n;
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  return ops::linear_tc_cuda(d, a, ctx);
}

/// Random block-scaled codes of one shape for both formats (e4m3 NaN codes replaced, scales 2^-4 … 2^3) and their
/// decoded bf16 weights (ops::scaled_weight), the reference the block-scaled launches are checked against.
struct ScaledCodes {
  std::vector<uint8_t> q8, q4, s8, s4;
  std::vector<uint16_t> w8, w4;
};
ScaledCodes scaled_codes(Shape const& sh, uint64_t seed) {
  ScaledCodes c;
  int64_t const kb = (sh.k + 31) / 32;
  std::mt19937_64 g(seed);
  c.q8.resize(static_cast<size_t>(sh.n * sh.k));
  c.q4.resize(static_cast<size_t>(sh.n * sh.k / 2));
  for (auto& b : c.q8) { b = static_cast<uint8_t>(g()); if ((b & 0x7F) == 0x7F) b &= 0xFE; }
  for (auto& b : c.q4) b = static_cast<uint8_t>(g());
  c.s8.resize(static_cast<size_t>((sh.n + 31) / 32 * kb));
  c.s4.resize(static_cast<size_t>(sh.n * kb));
  for (auto& b : c.s8) b = static_cast<uint8_t>(123 + g() % 8);
  for (auto& b : c.s4) b = static_cast<uint8_t>(123 + g() % 8);
  auto decoded = [&](DType fmt) {
    std::vector<uint16_t> w(static_cast<size_t>(sh.n * sh.k));
    bool const fp4 = fmt == DType::kF4E2m1x2;
    for (int64_t o = 0; o < sh.n; ++o)
      for (int64_t i = 0; i < sh.k; ++i)
        w[static_cast<size_t>(o * sh.k + i)] = bf16_bits_from_float(ops::scaled_weight(
            fmt, fp4 ? c.q4.data() : c.q8.data(), fp4 ? sh.k / 2 : sh.k, fp4 ? c.s4.data() : c.s8.data(), kb, o, i));
    return w;
  };
  c.w8 = decoded(DType::kF8E4m3);
  c.w4 = decoded(DType::kF4E2m1x2);
  return c;
}

struct Check {
  bool ok = true;
  std::string why;
  int samples = 0, cublas_differ = 0;
};

/// One launch with both outputs; `samples` outputs (row 0 and M − 1 included) against ref::dot_tc, and the
/// same outputs of cuBLAS's bf16 result.
Check check(Dev<uint16_t> const& dw, std::vector<uint16_t> const& hw, Dev<uint16_t> const& dx,
            std::vector<uint16_t> const& hx, Cublas& cublas, int64_t m, int64_t k, int64_t n, int samples,
            ops::TcTile tile = ops::TcTile::kAuto) {
  Check c;
  Dev<float> y(static_cast<size_t>(m * n));
  Dev<uint16_t> yb(static_cast<size_t>(m * n)), yc(static_cast<size_t>(m * n));
  Status const s = run_tc(dw.p, dx.p, y.p, yb.p, m, k, n, ops::TcSlab::kAuto, tile);
  if (!s.ok()) return {false, s.to_string()};
  if (cublas.gemm(dw.p, dx.p, yc.p, m, k, n) != CUBLAS_STATUS_SUCCESS) return {false, "cuBLAS failed"};
  CK(cudaDeviceSynchronize());
  std::mt19937_64 g(static_cast<uint64_t>(m * 131 + n * 7 + k));
  std::vector<float> xr(static_cast<size_t>(k)), wr(static_cast<size_t>(k));
  for (int i = 0; i < samples; ++i) {
    int64_t const r = i == 0 ? 0 : i == 1 ? m - 1 : static_cast<int64_t>(g() % static_cast<uint64_t>(m));
    int64_t const o = static_cast<int64_t>(g() % static_cast<uint64_t>(n));
    for (int64_t j = 0; j < k; ++j) {
      xr[static_cast<size_t>(j)] = float_from_bf16_bits(hx[static_cast<size_t>(r * k + j)]);
      wr[static_cast<size_t>(j)] = float_from_bf16_bits(hw[static_cast<size_t>(o * k + j)]);
    }
    float const want = ref::dot_tc(xr.data(), wr.data(), k);
    float got = 0.f;
    uint16_t got_b = 0, got_c = 0;
    size_t const at = static_cast<size_t>(r * n + o);
    CK(cudaMemcpy(&got, y.p + at, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&got_b, yb.p + at, 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&got_c, yc.p + at, 2, cudaMemcpyDeviceToHost));
    ++c.samples;
    c.cublas_differ += got_c != bf16_bits_from_float(want);
    if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(want) || got_b != bf16_bits_from_float(want)) {
      c.ok = false;
      char b[160];
      std::snprintf(b, sizeof b, "[%lld, %lld] %.9g vs ref::dot_tc %.9g", static_cast<long long>(r),
                    static_cast<long long>(o), static_cast<double>(got), static_cast<double>(want));
      if (c.why.empty()) c.why = b;
    }
  }
  return c;
}

struct Options {
  bool quick = false, decode = true, prefill = true, moe = true, slabs = false, quant = false, quant_gemm = false;
  std::string shape;
  int64_t batch = 0;
  int iters = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--quick") { o.quick = true; o.iters = 5; }
    else if (a == "--decode") { o.prefill = false; o.moe = false; }
    else if (a == "--prefill") { o.decode = false; o.moe = false; }
    else if (a == "--moe") { o.decode = false; o.prefill = false; }
    else if (a == "--slabs") { o.decode = false; o.prefill = false; o.moe = false; o.slabs = true; }
    else if (a == "--quant") { o.decode = false; o.prefill = false; o.moe = false; o.quant = true; }
    else if (a == "--quant-gemm") { o.decode = false; o.prefill = false; o.moe = false; o.quant_gemm = true; }
    else if (a == "--quant-path") {
      std::string const v = next();
      g_quant_path = v == "ring"     ? ops::TcQuantPath::kRing
                     : v == "direct" ? ops::TcQuantPath::kDirect
                     : v == "ws"     ? ops::TcQuantPath::kWarpSpec
                                     : ops::TcQuantPath::kAuto;
    }
    else if (a == "--shape") o.shape = next();
    else if (a == "--batch") o.batch = std::stoll(next());
    else if (a == "--iters") o.iters = std::stoi(next());
    else std::fprintf(stderr, "tc_bench: ignoring unknown argument %s\n", a.c_str());
  }
  return o;
}

/// The MoE rows (see the header): returns the number of failed checks.
int bench_moe(Timer& timer, Options const& opt) {
  constexpr int64_t kDim = 5120, kInter = 2304, kExperts = 16, kTopK = 6;
  std::printf("\n### MoeExperts CUDA, Flash expert shape (%lldx%lld bf16), %lld experts allocated, top-%lld + "
              "shared, median of %d\n\n",
              static_cast<long long>(kDim), static_cast<long long>(kInter), static_cast<long long>(kExperts),
              static_cast<long long>(kTopK), opt.iters);
  std::printf("GB/s = expert weight bytes touched / call time (one call after an L2 flush, launch included).\n\n");
  std::printf("fp4 = the routed experts block-scaled (FP4 e2m1 codes + per-row-per-32 ue8m0 scales, routed_scaled; the "
              "shared expert bf16), kSkinny: MB and GB/s count the bytes it reads; its values equal the CPU op on the "
              "decoded weights (asserted by verify_gpu_moe_scaled, not re-checked here).\n\n");
  std::printf("| tokens | experts touched | weight MB | check | skinny us | GB/s | %% of 4.27 TB/s | gemm us | GB/s | "
              "%% | emulated us | GB/s | %% | fp4 MB | fp4 us | fp4 GB/s | fp4 %% | fp4 speedup vs skinny |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  size_t const mat = static_cast<size_t>(kDim * kInter);
  std::vector<Dev<uint16_t>> w;  // [3 · (experts + 1)]: w1, w3, w2 of expert e at 3e .. 3e + 2; the shared last
  std::vector<uint64_t> p1, p3, p2;
  for (int64_t e = 0; e <= kExperts; ++e)
    for (int m = 0; m < 3; ++m) {
      w.emplace_back(mat);
      w.back().upload(random_bf16(mat, static_cast<uint64_t>(1000 + 3 * e + m)));
      (m == 0 ? p1 : m == 1 ? p3 : p2).push_back(reinterpret_cast<uint64_t>(w.back().p));
    }
  Dev<uint64_t> t1(p1.size()), t3(p3.size()), t2(p2.size());
  t1.upload(p1); t3.upload(p3); t2.upload(p2);
  ops::MoeExpertsDeviceWeights dev;
  dev.w1 = reinterpret_cast<void const* const*>(t1.p);
  dev.w3 = reinterpret_cast<void const* const*>(t3.p);
  dev.w2 = reinterpret_cast<void const* const*>(t2.p);
  dev.shared_w1 = reinterpret_cast<void const*>(p1.back());
  dev.shared_w3 = reinterpret_cast<void const*>(p3.back());
  dev.shared_w2 = reinterpret_cast<void const*>(p2.back());
  // FP4 routed experts: codes [rows, cols/2], scales [rows, cols/32] per matrix.
  std::vector<Dev<uint8_t>> q;
  std::vector<uint64_t> c1, c3, c2, s1, s3, s2;
  std::mt19937_64 gq(99);
  auto put_q = [&](size_t bytes, bool scale) {
    std::vector<uint8_t> h(bytes);
    for (auto& b : h) b = static_cast<uint8_t>(scale ? 122 + gq() % 3 : gq());
    q.emplace_back(bytes);
    q.back().upload(h);
    return reinterpret_cast<uint64_t>(q.back().p);
  };
  q.reserve(6 * kExperts);
  for (int64_t e = 0; e < kExperts; ++e) {
    c1.push_back(put_q(mat / 2, false)); s1.push_back(put_q(mat / 32, true));
    c3.push_back(put_q(mat / 2, false)); s3.push_back(put_q(mat / 32, true));
    c2.push_back(put_q(mat / 2, false)); s2.push_back(put_q(mat / 32, true));
  }
  Dev<uint64_t> tc1(c1.size()), tc3(c3.size()), tc2(c2.size()), ts1(s1.size()), ts3(s3.size()), ts2(s2.size());
  tc1.upload(c1); tc3.upload(c3); tc2.upload(c2); ts1.upload(s1); ts3.upload(s3); ts2.upload(s2);
  ops::MoeExpertsDeviceWeights dev4 = dev;
  dev4.w1 = reinterpret_cast<void const* const*>(tc1.p);
  dev4.w3 = reinterpret_cast<void const* const*>(tc3.p);
  dev4.w2 = reinterpret_cast<void const* const*>(tc2.p);
  dev4.s1 = reinterpret_cast<void const* const*>(ts1.p);
  dev4.s3 = reinterpret_cast<void const* const*>(ts3.p);
  dev4.s2 = reinterpret_cast<void const* const*>(ts2.p);
  int failures = 0;
  std::mt19937_64 g(77);
  for (int64_t tokens : {1, 4, 16, 64}) {
    if (opt.batch && tokens != opt.batch) continue;
    std::vector<float> x(static_cast<size_t>(tokens * kDim)), wts(static_cast<size_t>(tokens * kTopK));
    auto const xb = random_bf16(x.size(), static_cast<uint64_t>(500 + tokens));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float_from_bf16_bits(xb[i]) * 0.5f;  // bf16-valued
    std::vector<int32_t> ids(static_cast<size_t>(tokens * kTopK));
    std::vector<bool> touched(kExperts, false);
    for (int64_t r = 0; r < tokens; ++r) {
      std::vector<int32_t> perm(kExperts);
      for (int64_t e = 0; e < kExperts; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      std::shuffle(perm.begin(), perm.end(), g);
      for (int64_t i = 0; i < kTopK; ++i) {
        ids[static_cast<size_t>(r * kTopK + i)] = perm[static_cast<size_t>(i)];
        touched[static_cast<size_t>(perm[static_cast<size_t>(i)])] = true;
        wts[static_cast<size_t>(r * kTopK + i)] = 0.1f + 0.05f * static_cast<float>(i);
      }
    }
    int64_t const n_touched = std::count(touched.begin(), touched.end(), true);
    double const bytes = 3.0 * 2.0 * static_cast<double>(mat) * static_cast<double>(n_touched + 1);
    Dev<float> dx(x.size()), dwt(wts.size()), dout(static_cast<size_t>(tokens * kDim));
    Dev<int32_t> di(ids.size());
    dx.upload(x); dwt.upload(wts); di.upload(ids);
    ops::MoeExpertsDesc d{tokens, kExperts, kDim, kInter, kTopK, 7.f, true, DType::kBf16, DType::kBf16};
    ops::MoeTcPath const paths[3] = {ops::MoeTcPath::kSkinny, ops::MoeTcPath::kGemm, ops::MoeTcPath::kEmulated};
    size_t ws_bytes = 0;
    for (auto path : paths) {
      d.tc_path = path;
      ws_bytes = std::max(ws_bytes, ops::MoeExperts<Backend::kCuda>::workspace_bytes(d));
    }
    Dev<unsigned char> ws(ws_bytes);
    ops::MoeExpertsArgs a;
    a.x = TensorView<float const, 2>(dx.p, {tokens, kDim}, Device::kCuda);
    a.ids = TensorView<int32_t const, 2>(di.p, {tokens, kTopK}, Device::kCuda);
    a.weights = TensorView<float const, 2>(dwt.p, {tokens, kTopK}, Device::kCuda);
    a.out = TensorView<float, 2>(dout.p, {tokens, kDim}, Device::kCuda);
    a.dev = dev;
    ExecContext ctx;
    ctx.backend = Backend::kCuda;
    ctx.workspace = ws.p;
    ctx.workspace_bytes = ws_bytes;
    double us[3] = {0, 0, 0};
    std::vector<float> outs[3];
    std::string why;
    for (int i = 0; i < 3; ++i) {
      d.tc_path = paths[i];
      Status const s = ops::dispatch<ops::MoeExperts>(ctx, d, a);
      if (!s.ok()) { why = s.to_string(); break; }
      CK(cudaDeviceSynchronize());
      outs[i] = dout.get(static_cast<size_t>(tokens * kDim));
      us[i] = timer.median_us([&] { (void)ops::dispatch<ops::MoeExperts>(ctx, d, a); }, opt.iters);
    }
    if (why.empty() && (std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4) != 0 ||
                        std::memcmp(outs[0].data(), outs[2].data(), outs[0].size() * 4) != 0))
      why = "paths differ";
    if (!why.empty()) {
      ++failures;
      std::printf("| %lld | %lld | %.0f | FAIL: %s | | | | | | | | | |\n", static_cast<long long>(tokens),
                  static_cast<long long>(n_touched + 1), bytes / 1e6, why.c_str());
      continue;
    }
    auto gbs = [&](double t) { return bytes / (t * 1e-6) / 1e9; };
    ops::MoeExpertsDesc d4 = d;
    d4.tc_path = ops::MoeTcPath::kAuto;
    d4.routed_scaled = DType::kF4E2m1x2;
    ops::MoeExpertsArgs a4 = a;
    a4.dev = dev4;
    double const bytes4 = 3.0 * (static_cast<double>(mat) * (0.5 + 1.0 / 32.0) * static_cast<double>(n_touched) + 2.0 * static_cast<double>(mat));
    double us4 = 0;
    Status const s4 = ops::dispatch<ops::MoeExperts>(ctx, d4, a4);
    if (s4.ok()) us4 = timer.median_us([&] { (void)ops::dispatch<ops::MoeExperts>(ctx, d4, a4); }, opt.iters);
    else ++failures;
    std::printf("| %lld | %lld | %.0f | ok | %.1f | %.0f | %.1f | %.1f | %.0f | %.1f | %.1f | %.0f | %.1f | %.0f | %s | %.0f | %.1f | %.2fx |\n",
                static_cast<long long>(tokens), static_cast<long long>(n_touched + 1), bytes / 1e6, us[0], gbs(us[0]),
                100.0 * gbs(us[0]) * 1e9 / kCopyBandwidth, us[1], gbs(us[1]), 100.0 * gbs(us[1]) * 1e9 / kCopyBandwidth,
                us[2], gbs(us[2]), 100.0 * gbs(us[2]) * 1e9 / kCopyBandwidth, bytes4 / 1e6,
                s4.ok() ? std::to_string(us4).substr(0, 6).c_str() : s4.to_string().c_str(),
                s4.ok() ? bytes4 / (us4 * 1e-6) / 1e9 : 0.0, s4.ok() ? 100.0 * bytes4 / (us4 * 1e-6) / kCopyBandwidth : 0.0,
                s4.ok() ? us[0] / us4 : 0.0);
    std::fflush(stdout);
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
  Shape const shapes[] = {{5120, 2304, "w1/w3 5120x2304"}, {2304, 5120, "w2 2304x5120"},
                          {8192, 5120, "wo_b 8192x5120"},  {5120, 1280, "wq_a 5120x1280"},
                          {1280, 32768, "wq_b 1280x32768"}};
  auto selected = [&](Shape const& sh) { return opt.shape.empty() || std::strstr(sh.name, opt.shape.c_str()); };
  Timer timer;
  Cublas cublas;
  int failures = 0;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  if (opt.decode) {
    std::printf("\n### Tensor-core linear, decode (skinny tile) vs cuBLAS bf16, H200, median of %d\n\n", iters);
    std::printf("GB/s = (W + x + y bytes) / stream time. check: sampled outputs == ref::dot_tc (fp32 and bf16); "
                "cuBLAS≠: sampled bf16 outputs where cuBLAS differs from ref::dot_tc.\n\n");
    std::printf("| shape | M | check | cuBLAS≠ | call us | stream us | GB/s | %% of 4.27 TB/s | cuBLAS call us | "
                "cuBLAS stream us | cuBLAS GB/s | cuBLAS %% | speedup (stream) |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (auto const& sh : shapes) {
      if (!selected(sh)) continue;
      auto const hw = random_bf16(static_cast<size_t>(sh.n * sh.k), 1 + sh.n);
      double const wbytes = 2.0 * static_cast<double>(sh.n * sh.k);
      int const copies = stream_copies(wbytes);
      std::vector<Dev<uint16_t>> dws;
      for (int c = 0; c < copies; ++c) {
        dws.emplace_back(static_cast<size_t>(sh.n * sh.k));
        dws.back().upload(hw);
      }
      for (int64_t m : {1, 4, 8, 16}) {
        if (opt.batch && m != opt.batch) continue;
        auto const hx = random_bf16(static_cast<size_t>(m * sh.k), 100 + m);
        Dev<uint16_t> dx(hx.size()), yb(static_cast<size_t>(m * sh.n)), yc(static_cast<size_t>(m * sh.n));
        dx.upload(hx);
        Check const c = check(dws[0], hw, dx, hx, cublas, m, sh.k, sh.n, 256);
        if (!c.ok) {
          ++failures;
          std::printf("| %s | %lld | FAIL: %s | | | | | | | | | | |\n", sh.name, static_cast<long long>(m), c.why.c_str());
          continue;
        }
        double const bytes = wbytes + 2.0 * static_cast<double>(m * sh.k + m * sh.n);
        auto tc = [&](int cp) { (void)run_tc(dws[static_cast<size_t>(cp)].p, dx.p, nullptr, yb.p, m, sh.k, sh.n); };
        auto cb = [&](int cp) { cublas.gemm(dws[static_cast<size_t>(cp)].p, dx.p, yc.p, m, sh.k, sh.n); };
        double const us = timer.median_us([&] { tc(0); }, iters);
        double const us_s = timer.median_stream_us(tc, copies, iters);
        double const cu = timer.median_us([&] { cb(0); }, iters);
        double const cu_s = timer.median_stream_us(cb, copies, iters);
        double const gbs = bytes / (us_s * 1e-6) / 1e9, cgbs = bytes / (cu_s * 1e-6) / 1e9;
        std::printf("| %s | %lld | ok | %d/%d | %.1f | %.2f | %.0f | %.1f | %.1f | %.2f | %.0f | %.1f | %.2fx |\n",
                    sh.name, static_cast<long long>(m), c.cublas_differ, c.samples, us, us_s, gbs,
                    100.0 * gbs * 1e9 / kCopyBandwidth, cu, cu_s, cgbs, 100.0 * cgbs * 1e9 / kCopyBandwidth,
                    cu_s / us_s);
        std::fflush(stdout);
      }
    }
  }

  if (opt.decode || opt.slabs) {
    std::printf("\n### Skinny tile: K slab × ring depth (same bits; GB/s of the stream, median of %d)\n\n", iters);
    std::printf("| shape | M | s256x8 | s512x4 | s1024x3 | s512x6 | outputs equal |\n|---|---|---|---|---|---|---|\n");
    ops::TcSlab const slabs[4] = {ops::TcSlab::k256x8, ops::TcSlab::k512x4, ops::TcSlab::k1024x3, ops::TcSlab::k512x6};
    for (auto const& sh : shapes) {
      if (!selected(sh)) continue;
      auto const hw = random_bf16(static_cast<size_t>(sh.n * sh.k), 1 + sh.n);
      double const wbytes = 2.0 * static_cast<double>(sh.n * sh.k);
      int const copies = stream_copies(wbytes);
      std::vector<Dev<uint16_t>> dws;
      for (int c = 0; c < copies; ++c) {
        dws.emplace_back(static_cast<size_t>(sh.n * sh.k));
        dws.back().upload(hw);
      }
      for (int64_t m : {1, 4, 16}) {
        if (opt.batch && m != opt.batch) continue;
        auto const hx = random_bf16(static_cast<size_t>(m * sh.k), 100 + m);
        Dev<uint16_t> dx(hx.size()), yb(static_cast<size_t>(m * sh.n));
        dx.upload(hx);
        double const bytes = wbytes + 2.0 * static_cast<double>(m * sh.k + m * sh.n);
        double gbs[4] = {0, 0, 0, 0};
        std::vector<uint16_t> outs[4];
        bool equal = true;
        for (int v = 0; v < 4; ++v) {
          if (!run_tc(dws[0].p, dx.p, nullptr, yb.p, m, sh.k, sh.n, slabs[v]).ok()) { equal = false; continue; }
          CK(cudaDeviceSynchronize());
          outs[v] = yb.get(static_cast<size_t>(m * sh.n));
          if (v > 0 && outs[v] != outs[0]) equal = false;
          auto tc = [&](int cp) { (void)run_tc(dws[static_cast<size_t>(cp)].p, dx.p, nullptr, yb.p, m, sh.k, sh.n, slabs[v]); };
          gbs[v] = bytes / (timer.median_stream_us(tc, copies, iters) * 1e-6) / 1e9;
        }
        if (!equal) ++failures;
        std::printf("| %s | %lld | %.0f | %.0f | %.0f | %.0f | %s |\n", sh.name, static_cast<long long>(m), gbs[0], gbs[1],
                    gbs[2], gbs[3], equal ? "yes" : "NO");
        std::fflush(stdout);
      }
    }
  }

  if (opt.quant) {
    std::printf("\n### Skinny tile on block-scaled weights vs bf16 (stream timing, median of %d)\n\n", iters);
    std::printf("GB/s = bytes read (codes + scales + x + y) / time; speedup = bf16 time / block-scaled time. check: the "
                "block-scaled outputs equal the bf16 launch on the decoded weights, all outputs.\n\n");
    std::printf("| shape | M | bf16 us | bf16 GB/s | fp8 us | fp8 GB/s | fp8 %% of 4.27 TB/s | fp8 speedup | fp4 us | "
                "fp4 GB/s | fp4 %% of 4.27 TB/s | fp4 speedup | check |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::vector<Shape> qshapes(std::begin(shapes), std::end(shapes));
    qshapes.push_back({5120, 512, "wkv 5120x512"});
    if (!opt.quick) qshapes.push_back({5120, 129280, "head 5120x129280"});
    for (auto const& sh : qshapes) {
      if (!selected(sh)) continue;
      ScaledCodes const codes = scaled_codes(sh, static_cast<uint64_t>(sh.n * 31 + sh.k));
      auto const& [q8, q4, s8, s4, w8, w4] = codes;
      double const wb16 = 2.0 * static_cast<double>(sh.n * sh.k);
      int const copies = stream_copies(wb16 / 4);
      std::vector<Dev<uint16_t>> dw16;
      std::vector<Dev<uint8_t>> dq8, dq4, ds8, ds4;
      for (int c = 0; c < copies; ++c) {
        dq8.emplace_back(q8.size()); dq8.back().upload(q8);
        dq4.emplace_back(q4.size()); dq4.back().upload(q4);
        ds8.emplace_back(s8.size()); ds8.back().upload(s8);
        ds4.emplace_back(s4.size()); ds4.back().upload(s4);
        if (c < stream_copies(wb16)) dw16.emplace_back(static_cast<size_t>(sh.n * sh.k));
      }
      for (auto& d : dw16) d.upload(w8);
      for (int64_t m : {1, 4, 16}) {
        if (opt.batch && m != opt.batch) continue;
        auto const hx = random_bf16(static_cast<size_t>(m * sh.k), 300 + m);
        Dev<uint16_t> dx(hx.size()), y16(static_cast<size_t>(m * sh.n)), yq(static_cast<size_t>(m * sh.n));
        dx.upload(hx);
        bool ok = true;
        // Check: fp8 against bf16 on w8, then fp4 against bf16 on w4 (copy 0 of dw16 reloaded).
        bool const fp8_fused = ops::tc_quant_format_fused(DType::kF8E4m3);  // else FP8 has no fused tile to time
        for (DType fmt : {DType::kF8E4m3, DType::kF4E2m1x2}) {
          if (fmt == DType::kF8E4m3 && !fp8_fused) continue;
          bool const fp4 = fmt == DType::kF4E2m1x2;
          dw16[0].upload(fp4 ? w4 : w8);
          ok = ok && run_tc(dw16[0].p, dx.p, nullptr, y16.p, m, sh.k, sh.n).ok();
          ok = ok && run_q(fmt, fp4 ? dq4[0].p : dq8[0].p, fp4 ? ds4[0].p : ds8[0].p, dx.p, yq.p, m, sh.k, sh.n).ok();
          CK(cudaDeviceSynchronize());
          ok = ok && y16.get(static_cast<size_t>(m * sh.n)) == yq.get(static_cast<size_t>(m * sh.n));
        }
        dw16[0].upload(w8);
        if (!ok) ++failures;
        double const xy = 2.0 * static_cast<double>(m * sh.k + m * sh.n);
        auto t16 = [&](int cp) { (void)run_tc(dw16[static_cast<size_t>(cp)].p, dx.p, nullptr, y16.p, m, sh.k, sh.n); };
        auto t8 = [&](int cp) { (void)run_q(DType::kF8E4m3, dq8[static_cast<size_t>(cp)].p, ds8[static_cast<size_t>(cp)].p, dx.p, yq.p, m, sh.k, sh.n); };
        auto t4 = [&](int cp) { (void)run_q(DType::kF4E2m1x2, dq4[static_cast<size_t>(cp)].p, ds4[static_cast<size_t>(cp)].p, dx.p, yq.p, m, sh.k, sh.n); };
        double const us16 = timer.median_stream_us(t16, static_cast<int>(dw16.size()), iters);
        double const us8 = fp8_fused ? timer.median_stream_us(t8, copies, iters) : 0.0;
        double const us4 = timer.median_stream_us(t4, copies, iters);
        double const b8 = static_cast<double>(q8.size() + s8.size()) + xy, b4 = static_cast<double>(q4.size() + s4.size()) + xy;
        auto gbs = [](double bytes, double us) { return bytes / (us * 1e-6) / 1e9; };
        char fp8_cols[96] = "n/a (no fused FP8 tile) | | | ";  // ops::tc_quant_format_fused(kF8E4m3) false
        if (fp8_fused)
          std::snprintf(fp8_cols, sizeof fp8_cols, "%.1f | %.0f | %.1f | %.2fx", us8, gbs(b8, us8),
                        100.0 * gbs(b8, us8) * 1e9 / kCopyBandwidth, us16 / us8);
        std::printf("| %s | %lld | %.1f | %.0f | %s | %.1f | %.0f | %.1f | %.2fx | %s |\n", sh.name,
                    static_cast<long long>(m), us16, gbs(wb16 + xy, us16), fp8_cols, us4, gbs(b4, us4),
                    100.0 * gbs(b4, us4) * 1e9 / kCopyBandwidth, us16 / us4, ok ? "ok" : "FAIL");
        std::fflush(stdout);
      }
    }
  }

  if (opt.prefill) {
    bool const wg = ops::tc_wgmma_available();
    std::printf("\n### Tensor-core linear, prefill: the mma.sync GEMM tile and the wgmma tile vs cuBLAS bf16, median of %d\n\n",
                iters);
    std::printf("check: sampled outputs of each tile equal ref::dot_tc bit for bit (fp32 and bf16); cuBLAS≠: sampled bf16 "
                "outputs where cuBLAS differs from ref::dot_tc.%s\n\n", wg ? "" : " (wgmma: not available here)");
    std::printf("| shape | M | check | cuBLAS≠ | mma.sync us | TFLOP/s | wgmma us | TFLOP/s | %% of 754 | cuBLAS us | "
                "cuBLAS TFLOP/s | wgmma vs cuBLAS |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (auto const& sh : shapes) {
      if (!selected(sh)) continue;
      int64_t const mmax = opt.quick ? 2048 : 8192;
      auto const hw = random_bf16(static_cast<size_t>(sh.n * sh.k), 7 + sh.n);
      auto const hx = random_bf16(static_cast<size_t>(mmax * sh.k), 9 + sh.k);
      Dev<uint16_t> dw(hw.size()), dx(hx.size()), yb(static_cast<size_t>(mmax * sh.n)), yc(static_cast<size_t>(mmax * sh.n));
      dw.upload(hw);
      dx.upload(hx);
      for (int64_t m : {512, 1024, 2048, 4096, 8192}) {
        if (m > mmax || (opt.batch && m != opt.batch)) continue;
        Check const c = check(dw, hw, dx, hx, cublas, m, sh.k, sh.n, 64, ops::TcTile::kGemm);
        Check const cw = wg ? check(dw, hw, dx, hx, cublas, m, sh.k, sh.n, 64, ops::TcTile::kWgmma) : Check{};
        if (!c.ok || !cw.ok) {
          ++failures;
          std::printf("| %s | %lld | FAIL: %s | | | | | | | | | |\n", sh.name, static_cast<long long>(m),
                      (!c.ok ? "mma.sync " + c.why : "wgmma " + cw.why).c_str());
          continue;
        }
        double const flop = 2.0 * static_cast<double>(m) * static_cast<double>(sh.k) * static_cast<double>(sh.n);
        auto tflops = [&](double us) { return flop / (us * 1e-6) / 1e12; };
        double const us = timer.median_us(
            [&] { (void)run_tc(dw.p, dx.p, nullptr, yb.p, m, sh.k, sh.n, ops::TcSlab::kAuto, ops::TcTile::kGemm); }, iters);
        double const uw = wg ? timer.median_us([&] {
          (void)run_tc(dw.p, dx.p, nullptr, yb.p, m, sh.k, sh.n, ops::TcSlab::kAuto, ops::TcTile::kWgmma);
        }, iters) : 0.0;
        double const cu = timer.median_us([&] { cublas.gemm(dw.p, dx.p, yc.p, m, sh.k, sh.n); }, iters);
        std::printf("| %s | %lld | ok | %d/%d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", sh.name,
                    static_cast<long long>(m), c.cublas_differ, c.samples, us, tflops(us), uw, wg ? tflops(uw) : 0.0,
                    wg ? 100.0 * tflops(uw) * 1e12 / kPeakBf16 : 0.0, cu, tflops(cu), wg ? 100.0 * cu / uw : 0.0);
        std::fflush(stdout);
      }
    }
  }
  if (opt.quant_gemm) {
    std::printf("\n### GEMM tile on block-scaled weights (prefill) vs the bf16 tile on the decoded weights and cuBLAS bf16, "
                "median of %d\n\n", iters);
    std::printf("TFLOP/s = 2·M·N·K / time. check: every output of the block-scaled launch equals the bf16 tile's on the "
                "decoded weights (ops::scaled_weight) bit for bit; that tile equals ref::dot_tc (the prefill table).\n\n");
    bool const wg = ops::tc_wgmma_available();
    std::printf("mma.sync: the 128 × 128 tile (kGemm); wgmma: the 128 × 256 tile (kWgmma%s), each checked the same way.\n\n",
                wg ? "" : ", not available here");
    std::printf("| shape | M | bf16 tile us | TFLOP/s | fp8 us | TFLOP/s | fp4 us | TFLOP/s | wgmma bf16 us | TFLOP/s | "
                "wgmma fp8 us | TFLOP/s | wgmma fp4 us | TFLOP/s | cuBLAS bf16 us | TFLOP/s | check |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (auto const& sh : shapes) {
      if (!selected(sh)) continue;
      int64_t const mmax = opt.quick ? 2048 : 8192;
      ScaledCodes const codes = scaled_codes(sh, static_cast<uint64_t>(sh.n * 37 + sh.k));
      auto const& [q8, q4, s8, s4, w8, w4] = codes;
      Dev<uint8_t> dq8(q8.size()), dq4(q4.size()), ds8(s8.size()), ds4(s4.size());
      dq8.upload(q8), dq4.upload(q4), ds8.upload(s8), ds4.upload(s4);
      Dev<uint16_t> dw(w8.size());
      auto const hx = random_bf16(static_cast<size_t>(mmax * sh.k), 17 + sh.k);
      Dev<uint16_t> dx(hx.size()), y16(static_cast<size_t>(mmax * sh.n)), yq(static_cast<size_t>(mmax * sh.n)),
          yc(static_cast<size_t>(mmax * sh.n));
      dx.upload(hx);
      for (int64_t m : {512, 2048, 8192}) {
        if (m > mmax || (opt.batch && m != opt.batch)) continue;
        bool ok = true;
        using ops::TcTile;
        std::vector<TcTile> tiles{TcTile::kGemm};
        if (wg) tiles.push_back(TcTile::kWgmma);
        for (DType fmt : {DType::kF8E4m3, DType::kF4E2m1x2}) {  // fused vs the bf16 mma.sync tile on the decoded weights
          bool const fp4 = fmt == DType::kF4E2m1x2;
          dw.upload(fp4 ? w4 : w8);
          ok = ok && run_tc(dw.p, dx.p, nullptr, y16.p, m, sh.k, sh.n, ops::TcSlab::kAuto, TcTile::kGemm).ok();
          CK(cudaDeviceSynchronize());
          auto const want = y16.get(static_cast<size_t>(m * sh.n));
          for (TcTile t : tiles) {
            ok = ok && run_q(fmt, fp4 ? dq4.p : dq8.p, fp4 ? ds4.p : ds8.p, dx.p, yq.p, m, sh.k, sh.n, t).ok();
            CK(cudaDeviceSynchronize());
            ok = ok && want == yq.get(static_cast<size_t>(m * sh.n));
            if (t == TcTile::kWgmma) {  // the bf16 wgmma tile on the decoded weights too
              ok = ok && run_tc(dw.p, dx.p, nullptr, yq.p, m, sh.k, sh.n, ops::TcSlab::kAuto, TcTile::kWgmma).ok();
              CK(cudaDeviceSynchronize());
              ok = ok && want == yq.get(static_cast<size_t>(m * sh.n));
            }
          }
        }
        if (!ok) ++failures;
        double const flop = 2.0 * static_cast<double>(m) * static_cast<double>(sh.k) * static_cast<double>(sh.n);
        auto tf = [&](double us) { return us > 0 ? flop / (us * 1e-6) / 1e12 : 0.0; };
        auto t16 = [&](TcTile t) {
          return timer.median_us([&] { (void)run_tc(dw.p, dx.p, nullptr, y16.p, m, sh.k, sh.n, ops::TcSlab::kAuto, t); }, iters);
        };
        auto tq = [&](DType f, TcTile t) {
          bool const fp4 = f == DType::kF4E2m1x2;
          return timer.median_us([&] { (void)run_q(f, fp4 ? dq4.p : dq8.p, fp4 ? ds4.p : ds8.p, dx.p, yq.p, m, sh.k, sh.n, t); },
                                 iters);
        };
        double const us16 = t16(TcTile::kGemm), us8 = tq(DType::kF8E4m3, TcTile::kGemm), us4 = tq(DType::kF4E2m1x2, TcTile::kGemm);
        double const uw16 = wg ? t16(TcTile::kWgmma) : 0.0, uw8 = wg ? tq(DType::kF8E4m3, TcTile::kWgmma) : 0.0,
                     uw4 = wg ? tq(DType::kF4E2m1x2, TcTile::kWgmma) : 0.0;
        double const cu = timer.median_us([&] { cublas.gemm(dw.p, dx.p, yc.p, m, sh.k, sh.n); }, iters);
        std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | "
                    "%.1f | %s |\n",
                    sh.name, static_cast<long long>(m), us16, tf(us16), us8, tf(us8), us4, tf(us4), uw16, tf(uw16), uw8,
                    tf(uw8), uw4, tf(uw4), cu, tf(cu), ok ? "ok" : "FAIL");
        std::fflush(stdout);
      }
    }
  }
  if (opt.moe) failures += bench_moe(timer, opt);
  std::printf("\n%d row(s) failed their correctness check\n", failures);
  return failures ? 1 : 0;
}

// SPDX-License-Identifier: Apache-2.0
/// EXL3 CUDA kernels against the CPU reference (include/tessera/ref/exl3_ref.hpp):
///   * W' (and W'ᵀ) from the device reconstruct equals the CPU decode bit for bit, every K and codebook;
///   * the naive reference kernel (tactic 3: per-element decode, fp32 FMA chain over k) equals a CPU
///     emulation of the same chain followed by the CPU epilogue bit for bit — this pins the device input
///     transform, decode and fp16/fp32 epilogues to the spec's roundings;
///   * GEMV (tactic 1) and GEMM (tactic 2) give identical bits (one summation order, see
///     kernels/exl3/exl3_kernels.cuh), and a row's result does not depend on the batch;
///   * both are within the spec §7.4 bounds of the float64 CPU reference;
///   * the MoE grouped path equals the dense path per expert times the routing weight, bit for bit, and with
///     num_assignments past expert_offsets[E] the rows below are unchanged and the rows past untouched;
///   * the grouped GEMM (impl_override 2: the chunk chain over 128-row tiles of each expert's rows) equals the
///     grouped GEMV (5) and the fused GEMV (1) bit for bit on uneven experts (0 to 200 rows), K = 2, 3, every
///     codebook, and the auto path choice follows kExl3GroupedGemmMinRows;
///   * DeepSeek-V4.1's real shapes against the naive kernel;
///   * the GEMV with its epilogue fused (tactic 1, one launch) equals GEMV + epilogue kernel (tactic 5) bit
///     for bit, dense and MoE, on both of its reduction paths (fewer rows than warps, and more) and on
///     repeated calls (the arrival counters return to zero);
///   * an output part of a wide layer with Exl3GemmDesc::chunk_n = the whole layer's n equals the whole layer's
///     columns bit for bit (its own width would choose another chunk count);
///   * the decode-once path (tactic 4: W' to fp16 scratch, cuBLASLt) is within the spec §7.4 bounds on the
///     fixtures and random layers, and row-invariant on its own side: a row alone equals the same row inside
///     m = 2048 (and inside m = 1024 at another position) bit for bit.
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/ops/exl3.hpp"
#include "tessera/ops/exl3_loader.hpp"
#include "verify/common/golden.hpp"
#include "tessera/ref/exl3_ref.hpp"
#include "verify/common/random.hpp"
#include "verify/exl3/exl3_test_util.hpp"

namespace x3 = tessera::exl3;
using namespace tessera;
using namespace tessera::verify::exl3;

namespace {

std::vector<uint16_t> run_dense(HostLayer const& h, DevLayer const& d, std::vector<uint16_t> const& x, int64_t m,
                                DType out, int tactic, std::vector<float>* y32 = nullptr, bool strict = false,
                                int64_t chunk_n = 0) {
  Tensor xd = upload(x, DType::kF16, {m, h.k});
  ops::Exl3GemmDesc desc{{h.k, h.n, h.k2, h.cb}, m, out, !h.bias.empty(), strict, chunk_n};
  Tensor y = Tensor::empty(out, {m, h.n}, Device::kCuda).value_or_throw();
  ops::Exl3GemmArgs a = d.args(xd);
  if (out == DType::kF16) a.y_f16 = y.view_as<Fp16, 2>();
  else a.y_f32 = y.view_as<float, 2>();
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  ctx.impl_override = tactic;
  Status s = ops::Exl3Gemm<Backend::kCuda>::run(desc, a, ctx);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  BOOST_TEST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  Tensor yh = y.to(Device::kCpu).value_or_throw();
  if (out == DType::kF32) {
    if (y32) y32->assign(yh.data_as<float>(), yh.data_as<float>() + m * h.n);
    return {};
  }
  return std::vector<uint16_t>(yh.data_as<uint16_t>(), yh.data_as<uint16_t>() + m * h.n);
}

std::vector<uint16_t> run_dense(HostLayer const& h, std::vector<uint16_t> const& x, int64_t m, DType out, int tactic,
                                std::vector<float>* y32 = nullptr) {
  return run_dense(h, DevLayer(h), x, m, out, tactic, y32);
}

/// A grouped MoE problem on the device: experts of the given row counts (assignments grouped by expert, random
/// tokens of x [T, k] and routing weights), y with capacity rows past expert_offsets[E] whose token_idx would fault
/// and whose weights are NaN.
struct GroupedProblem {
  int64_t k = 0, n = 0, tokens = 0, used = 0, cap = 0;
  int k2 = 0;
  x3::Codebook cb = x3::Codebook::kMul1;
  std::vector<HostLayer> ex;
  std::vector<DevLayer> dev;
  std::vector<uint16_t> x;
  std::vector<int32_t> off{0}, tok;
  std::vector<float> wgt;
  Tensor tpd, spd, vpd, offd, tokd, wd, xd, y;

  GroupedProblem(int64_t k_, int64_t n_, int k2_, x3::Codebook cb_, std::vector<int> const& counts, int64_t tokens_,
                 int64_t spare, uint64_t seed)
      : k(k_), n(n_), tokens(tokens_), k2(k2_), cb(cb_) {
    std::mt19937 g(static_cast<uint32_t>(seed));
    for (size_t e = 0; e < counts.size(); ++e) {
      ex.push_back(random_layer(k, n, k2, cb, seed + 31 * e, false));
      for (int i = 0; i < counts[e]; ++i) {
        tok.push_back(static_cast<int32_t>(g() % static_cast<uint32_t>(tokens)));
        wgt.push_back(0.25f + 0.125f * static_cast<float>(g() % 7));
      }
      off.push_back(static_cast<int32_t>(tok.size()));
    }
    used = static_cast<int64_t>(tok.size());
    cap = used + spare;
    tok.resize(static_cast<size_t>(cap), 0x7FFFFFFF);
    wgt.resize(static_cast<size_t>(cap), std::numeric_limits<float>::quiet_NaN());
    x = random_x(tokens, k, seed + 99);
    std::vector<int16_t const*> tp;
    std::vector<Fp16 const*> sp, vp;
    for (auto const& h : ex) {
      dev.emplace_back(h);
      tp.push_back(dev.back().trellis.data_as<int16_t>());
      sp.push_back(dev.back().suh.data_as<Fp16>());
      vp.push_back(dev.back().svh.data_as<Fp16>());
    }
    tpd = upload_ptrs(tp); spd = upload_ptrs(sp); vpd = upload_ptrs(vp);
    offd = upload(off, DType::kI32, {static_cast<int64_t>(off.size())});
    tokd = upload(tok, DType::kI32, {cap});
    wd = upload(wgt, DType::kF32, {cap});
    xd = upload(x, DType::kF16, {tokens, k});
    y = Tensor::empty(DType::kF32, {cap, n}, Device::kCuda).value_or_throw();
  }
  int64_t experts() const { return static_cast<int64_t>(ex.size()); }
  ops::Exl3GroupedGemmDesc desc() const { return {{k, n, k2, cb}, experts(), tokens, cap}; }
  /// y [cap, n] of the grouped op with ctx.impl_override = impl, y filled with 0xFF bytes before.
  std::vector<float> run(int impl) {
    ops::Exl3GroupedGemmArgs a;
    a.x = xd.view_as<Fp16 const, 2>();
    a.trellis = static_cast<int16_t const* const*>(tpd.data());
    a.suh = static_cast<Fp16 const* const*>(spd.data());
    a.svh = static_cast<Fp16 const* const*>(vpd.data());
    a.expert_offsets = offd.data_as<int32_t>();
    a.token_idx = tokd.data_as<int32_t>();
    a.route_weight = wd.data_as<float>();
    a.y = y.view_as<float, 2>();
    BOOST_TEST_REQUIRE(cudaMemset(y.data(), 0xFF, y.nbytes()) == cudaSuccess);
    ExecContext ctx;
    ctx.backend = Backend::kCuda;
    ctx.impl_override = impl;
    Status s = ops::Exl3GroupedGemm<Backend::kCuda>::run(desc(), a, ctx);
    BOOST_TEST_REQUIRE(s.ok(), s.to_string());
    BOOST_TEST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    Tensor yh = y.to(Device::kCpu).value_or_throw();
    return std::vector<float>(yh.data_as<float>(), yh.data_as<float>() + cap * n);
  }
};

/// Floats of a and b whose bits differ among the first `count`.
int64_t bit_mismatches(float const* a, float const* b, int64_t count) {
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) bad += std::memcmp(a + i, b + i, 4) != 0;
  return bad;
}

size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }

}  // namespace

BOOST_AUTO_TEST_SUITE(exl3_gpu)

BOOST_AUTO_TEST_CASE(reconstruct_bitwise_every_k_and_codebook) {
  uint64_t seed = tessera::verify::test_seed(501);
  for (int bits = 1; bits <= 8; ++bits)
    for (int cb = 0; cb < 3; ++cb) {
      HostLayer h = random_layer(256, 384, 2 * bits, static_cast<x3::Codebook>(cb), seed + bits * 3 + cb, false);
      DevLayer d(h);
      Tensor w = Tensor::empty(DType::kF16, {h.k, h.n}, Device::kCuda).value_or_throw();
      ExecContext ctx;
      ctx.backend = Backend::kCuda;
      ops::Exl3DequantArgs a{d.trellis.view_as<int16_t const, 3>(), w.view_as<Fp16, 2>()};
      Status s = ops::Exl3Dequant<Backend::kCuda>::run({h.k, h.n, h.k2, h.cb}, a, ctx);
      BOOST_TEST_REQUIRE(s.ok(), s.to_string());
      Tensor wh = w.to(Device::kCpu).value_or_throw();
      std::vector<uint16_t> ref = ref::exl3_decode_inner(h.host());
      BOOST_TEST(std::memcmp(wh.data(), ref.data(), ref.size() * 2) == 0, "K" << bits << " cb" << cb);
      // W'ᵀ [n, k] (the decode-once path's operand).
      Tensor wt = Tensor::empty(DType::kF16, {h.n, h.k}, Device::kCuda).value_or_throw();
      ops::Exl3DequantArgs at{d.trellis.view_as<int16_t const, 3>(), wt.view_as<Fp16, 2>(), true};
      s = ops::Exl3Dequant<Backend::kCuda>::run({h.k, h.n, h.k2, h.cb}, at, ctx);
      BOOST_TEST_REQUIRE(s.ok(), s.to_string());
      Tensor wth = wt.to(Device::kCpu).value_or_throw();
      std::vector<uint16_t> reft(ref.size());
      for (int64_t i = 0; i < h.k; ++i)
        for (int64_t j = 0; j < h.n; ++j) reft[static_cast<size_t>(j * h.k + i)] = ref[static_cast<size_t>(i * h.n + j)];
      BOOST_TEST(std::memcmp(wth.data(), reft.data(), reft.size() * 2) == 0, "transposed K" << bits << " cb" << cb);
    }
}

BOOST_AUTO_TEST_CASE(golden_fixtures_every_k_and_codebook) {
  // The integer-rate fixtures of golden/exl3 (128×128 and 256×512, 3 codebooks × K = 1..8): device W'
  // equals golden w_inner bit for bit; the naive kernel equals the CPU FMA chain bit for bit (fp16 and
  // fp32); GEMV and GEMM agree bitwise and lie within the spec §7.4 bounds of golden y_ideal.
  int fixtures = 0;
  for (char const* file : {"exl3_golden_128x128.safetensors", "exl3_golden_256x512.safetensors"}) {
    auto f = io::SafetensorsFile::open(tessera::verify::golden_dir() + "/exl3/" + file);
    BOOST_TEST_REQUIRE(f.ok(), f.status().to_string());
    ops::Exl3LoadOptions opt;
    opt.allow_half_rates = true;
    auto groups = ops::load_exl3_groups(ops::exl3_source(*f), opt);
    BOOST_TEST_REQUIRE(groups.ok(), groups.status().to_string());
    for (auto const& g : *groups) {
      if (g.desc.k2 % 2) continue;   // half rates: CPU only
      ++fixtures;
      HostLayer h;
      h.k = g.desc.k; h.n = g.desc.n; h.k2 = g.desc.k2; h.cb = g.desc.codebook;
      auto const* tp = static_cast<int16_t const*>(g.trellis.data);
      h.trellis.assign(tp, tp + g.trellis.numel());
      h.suh = g.suh;
      h.svh = g.svh;
      DevLayer d(h);
      std::string const G = "golden." + g.prefix + ".";
      // W'.
      Tensor w = Tensor::empty(DType::kF16, {h.k, h.n}, Device::kCuda).value_or_throw();
      ExecContext ctx;
      ctx.backend = Backend::kCuda;
      Status s = ops::Exl3Dequant<Backend::kCuda>::run({h.k, h.n, h.k2, h.cb}, {d.trellis.view_as<int16_t const, 3>(), w.view_as<Fp16, 2>()}, ctx);
      BOOST_TEST_REQUIRE(s.ok(), s.to_string());
      Tensor wh = w.to(Device::kCpu).value_or_throw();
      auto gw = f->view(G + "w_inner");
      BOOST_TEST_REQUIRE(gw.ok());
      BOOST_TEST(std::memcmp(wh.data(), gw->data, gw->nbytes()) == 0, g.prefix << " W'");
      // Layer.
      auto gx = f->view(G + "x");
      BOOST_TEST_REQUIRE(gx.ok());
      int64_t const m = gx->shape[0];
      std::vector<uint16_t> x(static_cast<uint16_t const*>(gx->data), static_cast<uint16_t const*>(gx->data) + m * h.k);
      std::vector<uint16_t> c16;
      std::vector<float> c32, n32;
      cpu_fma_chain_forward(h, x, m, c16, c32);
      auto n16 = run_dense(h, d, x, m, DType::kF16, 3);
      run_dense(h, d, x, m, DType::kF32, 3, &n32);
      BOOST_TEST(first_mismatch(n16, c16) == -1, g.prefix << " naive fp16");
      BOOST_TEST((std::memcmp(n32.data(), c32.data(), c32.size() * 4) == 0), g.prefix << " naive fp32");
      auto g1 = run_dense(h, d, x, m, DType::kF16, 1);
      auto g2 = run_dense(h, d, x, m, DType::kF16, 2);
      auto g5 = run_dense(h, d, x, m, DType::kF16, 5);
      BOOST_TEST(first_mismatch(g1, g2) == -1, g.prefix << " GEMV vs GEMM");
      BOOST_TEST(first_mismatch(g1, g5) == -1, g.prefix << " fused vs unfused GEMV epilogue");
      std::vector<float> f1, f5;
      run_dense(h, d, x, m, DType::kF32, 1, &f1);
      run_dense(h, d, x, m, DType::kF32, 5, &f5);
      BOOST_TEST((std::memcmp(f1.data(), f5.data(), f1.size() * 4) == 0), g.prefix << " fused vs unfused fp32");
      auto gi = f->view(G + "y_ideal");
      BOOST_TEST_REQUIRE(gi.ok());
      std::vector<double> ideal(static_cast<float const*>(gi->data), static_cast<float const*>(gi->data) + m * h.n);
      for (int tactic : {1, 4}) {
        auto const yt = tactic == 1 ? g1 : run_dense(h, d, x, m, DType::kF16, 4);
        std::vector<float> yv(yt.size());
        for (size_t i = 0; i < yt.size(); ++i) yv[i] = float_from_f16_bits(yt[i]);
        Bounds b = spec_bounds_values(yv, ideal);
        BOOST_TEST(b.ok(), g.prefix << " " << file << " tactic " << tactic << ": " << b.text());
      }
    }
  }
  BOOST_TEST(fixtures == 48);
}

BOOST_AUTO_TEST_CASE(naive_kernel_bitwise_vs_cpu_chain) {
  uint64_t seed = tessera::verify::test_seed(502);
  for (int bits : {1, 2, 3, 4, 5, 6, 7, 8})
    for (int cb = 0; cb < 3; ++cb) {
      HostLayer h = random_layer(256, 256, 2 * bits, static_cast<x3::Codebook>(cb), seed + 11 * bits + cb, cb == 1);
      int64_t const m = 3;
      auto x = random_x(m, h.k, seed + 7 * bits + cb);
      std::vector<uint16_t> y16_ref;
      std::vector<float> y32_ref;
      cpu_fma_chain_forward(h, x, m, y16_ref, y32_ref);
      auto y16 = run_dense(h, x, m, DType::kF16, 3);
      std::vector<float> y32;
      run_dense(h, x, m, DType::kF32, 3, &y32);
      BOOST_TEST(first_mismatch(y16, y16_ref) == -1, "f16 K" << bits << " cb" << cb << " at " << first_mismatch(y16, y16_ref));
      BOOST_TEST((std::memcmp(y32.data(), y32_ref.data(), y32.size() * 4) == 0), "f32 K" << bits << " cb" << cb);
    }
}

BOOST_AUTO_TEST_CASE(gemv_gemm_identical_and_within_spec_bounds) {
  uint64_t seed = tessera::verify::test_seed(503);
  for (int bits = 1; bits <= 8; ++bits)
    for (int cb = 0; cb < 3; ++cb) {
      HostLayer h = random_layer(512, 256, 2 * bits, static_cast<x3::Codebook>(cb), seed + 13 * bits + cb, bits == 3);
      for (int64_t m : {1, 7, 16, 33}) {
        auto x = random_x(m, h.k, seed + m + 100 * bits + cb);
        auto g1 = run_dense(h, x, m, DType::kF16, 1);
        auto g2 = run_dense(h, x, m, DType::kF16, 2);
        BOOST_TEST(first_mismatch(g1, g2) == -1, "GEMV vs GEMM K" << bits << " cb" << cb << " m" << m);
        std::vector<uint16_t> ref(static_cast<size_t>(m * h.n));
        ref::exl3_forward_f16(h.host(), x.data(), m, ref.data());
        Bounds b = spec_bounds(g1, ref);
        BOOST_TEST(b.ok(), "K" << bits << " cb" << cb << " m" << m << ": " << b.text());
      }
    }
}

BOOST_AUTO_TEST_CASE(fused_gemv_epilogue_bitwise) {
  // Tactic 1 (epilogue in the GEMV's last block per column group) against tactic 5 (GEMV, then the
  // epilogue kernel) and the GEMM. m = 1, 3 take the shared-memory reduction (fewer rows than warps), 4, 9,
  // 16 the per-warp one; 5120×256 has S = 40 chunks of C = 8 tiles (the fused launch sizes its shared
  // memory by S), 512×256 S < C. Each call runs twice: the arrival counters must be back at zero.
  uint64_t seed = tessera::verify::test_seed(507);
  struct Shape { int64_t k, n; };
  for (Shape sh : {Shape{512, 256}, Shape{5120, 256}})
    for (int bits = 1; bits <= 8; ++bits)
      for (int cb = 0; cb < 3; ++cb) {
        if (sh.k > 512 && cb != 2 && bits % 3) continue;   // the long shape: MUL1 all K, others K = 3, 6
        HostLayer h = random_layer(sh.k, sh.n, 2 * bits, static_cast<x3::Codebook>(cb), seed + 17 * bits + cb, bits % 2 == 0);
        DevLayer d(h);
        for (int64_t m : {1, 3, 4, 9, 16}) {
          auto x = random_x(m, h.k, seed + 3 * m + 100 * bits + cb);
          auto u = run_dense(h, d, x, m, DType::kF16, 5);
          auto g = run_dense(h, d, x, m, DType::kF16, 2);
          for (int rep = 0; rep < 2; ++rep) {
            auto f = run_dense(h, d, x, m, DType::kF16, 1);
            BOOST_TEST(first_mismatch(f, u) == -1, sh.k << "x" << sh.n << " K" << bits << " cb" << cb << " m" << m
                                                          << " rep " << rep << " at " << first_mismatch(f, u));
            BOOST_TEST(first_mismatch(f, g) == -1, "fused GEMV vs GEMM K" << bits << " cb" << cb << " m" << m);
          }
          std::vector<float> f32, u32;
          run_dense(h, d, x, m, DType::kF32, 1, &f32);
          run_dense(h, d, x, m, DType::kF32, 5, &u32);
          BOOST_TEST((std::memcmp(f32.data(), u32.data(), f32.size() * 4) == 0), "fp32 K" << bits << " cb" << cb << " m" << m);
          std::vector<uint16_t> ref(static_cast<size_t>(m * h.n));
          ref::exl3_forward_f16(h.host(), x.data(), m, ref.data());
          Bounds b = spec_bounds(u, ref);
          BOOST_TEST(b.ok(), "K" << bits << " cb" << cb << " m" << m << ": " << b.text());
        }
      }
}

BOOST_AUTO_TEST_CASE(decode_once_within_spec_bounds) {
  // Tactic 4 on every K and codebook (bias on some), fp16 against the float64-accumulated CPU reference
  // and fp32 against the naive kernel, both within the spec §7.4 bounds.
  uint64_t seed = tessera::verify::test_seed(508);
  for (int bits = 1; bits <= 8; ++bits)
    for (int cb = 0; cb < 3; ++cb) {
      HostLayer h = random_layer(512, 384, 2 * bits, static_cast<x3::Codebook>(cb), seed + 19 * bits + cb, bits % 3 == 0);
      DevLayer d(h);
      for (int64_t m : {1, 37, 300}) {
        auto x = random_x(m, h.k, seed + 5 * m + 100 * bits + cb);
        auto y = run_dense(h, d, x, m, DType::kF16, 4);
        std::vector<uint16_t> ref(static_cast<size_t>(m * h.n));
        ref::exl3_forward_f16(h.host(), x.data(), m, ref.data());
        Bounds b = spec_bounds(y, ref);
        BOOST_TEST(b.ok(), "f16 K" << bits << " cb" << cb << " m" << m << ": " << b.text());
        std::vector<float> y32, n32;
        run_dense(h, d, x, m, DType::kF32, 4, &y32);
        run_dense(h, d, x, m, DType::kF32, 3, &n32);
        Bounds b32 = spec_bounds_values(y32, std::vector<double>(n32.begin(), n32.end()));
        BOOST_TEST(b32.ok(), "f32 K" << bits << " cb" << cb << " m" << m << ": " << b32.text());
      }
    }
}

BOOST_AUTO_TEST_CASE(decode_once_row_invariance) {
  // m = 2048 takes the decode-once path by default. A row alone through it, and the same row at another
  // position inside m = 1024 (other companions), equal the row inside m = 2048 bit for bit. Across
  // kExl3DecodeOnceMinRows (the row alone through the GEMV) the rows agree within the spec §7.4 bounds only;
  // strict_rows keeps m = 2048 on the chunk chain, bit for bit equal to the GEMV.
  uint64_t seed = tessera::verify::test_seed(509);
  struct Shape { int64_t k, n; int bits; };
  for (Shape sh : {Shape{5120, 2304, 3}, Shape{8192, 5120, 4}}) {
    HostLayer h = random_layer(sh.k, sh.n, 2 * sh.bits, x3::Codebook::kMul1, seed + sh.k, true);
    DevLayer d(h);
    int64_t const m = 2048;
    BOOST_TEST_REQUIRE(m >= ops::kExl3DecodeOnceMinRows);
    auto x = random_x(m, h.k, seed + 1);
    auto all = run_dense(h, d, x, m, DType::kF16, 0);
    auto all4 = run_dense(h, d, x, m, DType::kF16, 4);
    BOOST_TEST(first_mismatch(all, all4) == -1, sh.k << "x" << sh.n << ": auto at m=2048 is the decode-once path");
    // m = 1024: rows 1024..2047 of x, with row r of x (r < 1024) placed at position 1023 - r % 1024.
    int64_t const half = 1024;
    std::vector<uint16_t> xs(x.begin() + half * h.k, x.end());
    std::vector<int64_t> const rows{0, 517, 1023};
    for (int64_t r : rows) std::copy(x.begin() + r * h.k, x.begin() + (r + 1) * h.k, xs.begin() + (half - 1 - r) * h.k);
    auto part = run_dense(h, d, xs, half, DType::kF16, 4);
    auto strict = run_dense(h, d, x, m, DType::kF16, 0, nullptr, true);
    for (int64_t r : rows) {
      std::vector<uint16_t> one(x.begin() + r * h.k, x.begin() + (r + 1) * h.k);
      std::vector<uint16_t> const row(all.begin() + r * h.n, all.begin() + (r + 1) * h.n);
      auto alone4 = run_dense(h, d, one, 1, DType::kF16, 4);
      BOOST_TEST(first_mismatch(alone4, row) == -1, sh.k << "x" << sh.n << " row " << r << " alone vs in m=2048");
      std::vector<uint16_t> const moved(part.begin() + (half - 1 - r) * h.n, part.begin() + (half - r) * h.n);
      BOOST_TEST(first_mismatch(moved, row) == -1, sh.k << "x" << sh.n << " row " << r << " in m=1024 vs m=2048");
      auto alone = run_dense(h, d, one, 1, DType::kF16, 0);   // GEMV
      Bounds b = spec_bounds(row, alone);
      BOOST_TEST(b.ok(), sh.k << "x" << sh.n << " row " << r << " decode-once vs GEMV: " << b.text());
      std::vector<uint16_t> const srow(strict.begin() + r * h.n, strict.begin() + (r + 1) * h.n);
      BOOST_TEST(first_mismatch(srow, alone) == -1, sh.k << "x" << sh.n << " row " << r << " strict m=2048 vs GEMV");
    }
  }
}

BOOST_AUTO_TEST_CASE(row_invariance) {
  uint64_t seed = tessera::verify::test_seed(504);
  HostLayer h = random_layer(1024, 512, 6, x3::Codebook::kMul1, seed, true);
  int64_t const m = 41;
  auto x = random_x(m, h.k, seed + 1);
  auto all = run_dense(h, x, m, DType::kF16, 0);        // GEMM
  for (int64_t r : {0, 17, 40}) {
    std::vector<uint16_t> one(x.begin() + r * h.k, x.begin() + (r + 1) * h.k);
    auto y1 = run_dense(h, one, 1, DType::kF16, 0);     // GEMV
    std::vector<uint16_t> row(all.begin() + r * h.n, all.begin() + (r + 1) * h.n);
    BOOST_TEST(first_mismatch(y1, row) == -1, "row " << r);
  }
}

BOOST_AUTO_TEST_CASE(output_part_sums_in_the_whole_layers_order) {
  // A rank's output part of a wide layer (spec/exl3.md §1.4: tile columns [n0/16, n1/16) of every tile row,
  // svh[n0:n1], suh whole) is a layer of its own width, whose chunk count S = exl3_num_chunks(k/16, n/16) differs from
  // the whole layer's; with Exl3GemmDesc::chunk_n = the whole layer's n it sums in the whole layer's chunk chain, so
  // its outputs are the whole product's columns bit for bit, at every tactic the row count picks (1 fused GEMV, 5 GEMV
  // + epilogue, 2 GEMM). k = 1024 (64 tile rows), n = 24576: S = 2 for the whole layer, 8 for a 2048-column part.
  uint64_t seed = tessera::verify::test_seed(507);
  HostLayer const h = random_layer(1024, 24576, 4, x3::Codebook::kMul1, seed, false);
  int64_t const n0 = 1024, n1 = 3072, wpt = 8 * h.k2, tn = h.n / 16;
  HostLayer p = h;
  p.n = n1 - n0;
  p.trellis.clear();
  for (int64_t a = 0; a < h.k / 16; ++a)
    p.trellis.insert(p.trellis.end(), h.trellis.begin() + (a * tn + n0 / 16) * wpt, h.trellis.begin() + (a * tn + n1 / 16) * wpt);
  p.svh.assign(h.svh.begin() + n0, h.svh.begin() + n1);
  DevLayer const dh(h), dp(p);
  for (int64_t m : {1, 3, 33}) {
    auto const x = random_x(m, h.k, seed + static_cast<uint64_t>(m));
    std::vector<float> whole, part, own;
    run_dense(h, dh, x, m, DType::kF32, 0, &whole);
    run_dense(p, dp, x, m, DType::kF32, 0, &part, false, h.n);
    run_dense(p, dp, x, m, DType::kF32, 0, &own);
    int64_t differ = 0, own_differ = 0;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < p.n; ++j) {
        float const w = whole[static_cast<size_t>(r * h.n + n0 + j)];
        differ += std::memcmp(&w, &part[static_cast<size_t>(r * p.n + j)], 4) != 0;
        own_differ += std::memcmp(&w, &own[static_cast<size_t>(r * p.n + j)], 4) != 0;
      }
    BOOST_TEST(differ == 0, "m=" << m << ": " << differ << " outputs of the part differ from the whole layer's");
    BOOST_TEST_MESSAGE("m=" << m << ": the part in its own chunk order differs in " << own_differ << " of " << m * p.n);
  }
  // chunk_n must be a multiple of 128 not below the layer's n.
  ExecContext ctx;
  for (int64_t bad : {int64_t{1024}, p.n + 64})
    BOOST_TEST(!ops::Exl3Gemm<Backend::kCuda>::check(ops::Exl3GemmDesc{{p.k, p.n, p.k2, p.cb}, 1, DType::kF32, false, false, bad},
                                                     ctx.device).ok(), "chunk_n " << bad);
}

BOOST_AUTO_TEST_CASE(moe_grouped_equals_dense_per_expert) {
  uint64_t seed = tessera::verify::test_seed(505);
  int const num_experts = 5, tokens = 9, top_k = 2;
  int64_t const k = 256, n = 384;
  std::vector<HostLayer> ex;
  for (int e = 0; e < num_experts; ++e) ex.push_back(random_layer(k, n, 6, x3::Codebook::kMul1, seed + e, false));
  auto x = random_x(tokens, k, seed + 99);
  // Assignments grouped by expert; expert 3 gets none.
  std::mt19937 g(static_cast<uint32_t>(seed));
  std::vector<std::vector<int>> rows(num_experts);
  for (int t = 0; t < tokens; ++t) {
    int e0 = static_cast<int>(g() % 4), e1 = (e0 + 1 + static_cast<int>(g() % 3)) % 5;
    if (e0 == 3) e0 = 4;
    if (e1 == 3 || e1 == e0) e1 = (e0 == 0) ? 1 : 0;
    rows[e0].push_back(t);
    rows[e1].push_back(t);
  }
  std::vector<int32_t> off{0}, tok;
  std::vector<float> wgt;
  for (int e = 0; e < num_experts; ++e) {
    for (int t : rows[e]) { tok.push_back(t); wgt.push_back(0.25f + 0.125f * static_cast<float>(g() % 5)); }
    off.push_back(static_cast<int32_t>(tok.size()));
  }
  int64_t const a_count = static_cast<int64_t>(tok.size());
  BOOST_TEST_REQUIRE(a_count == tokens * top_k);
  std::vector<DevLayer> dev;
  for (auto const& h : ex) dev.emplace_back(h);
  std::vector<int16_t const*> tp;
  std::vector<Fp16 const*> sp, vp;
  for (auto const& d : dev) {
    tp.push_back(d.trellis.data_as<int16_t>());
    sp.push_back(d.suh.data_as<Fp16>());
    vp.push_back(d.svh.data_as<Fp16>());
  }
  Tensor tpd = upload_ptrs(tp), spd = upload_ptrs(sp), vpd = upload_ptrs(vp);
  Tensor offd = upload(off, DType::kI32, {num_experts + 1}), tokd = upload(tok, DType::kI32, {a_count});
  Tensor wd = upload(wgt, DType::kF32, {a_count});
  Tensor xd = upload(x, DType::kF16, {tokens, k});
  Tensor y = Tensor::empty(DType::kF32, {a_count, n}, Device::kCuda).value_or_throw();
  ops::Exl3GroupedGemmDesc desc{{k, n, 6, x3::Codebook::kMul1}, num_experts, tokens, a_count};
  ops::Exl3GroupedGemmArgs a;
  a.x = xd.view_as<Fp16 const, 2>();
  a.trellis = static_cast<int16_t const* const*>(tpd.data());
  a.suh = static_cast<Fp16 const* const*>(spd.data());
  a.svh = static_cast<Fp16 const* const*>(vpd.data());
  a.expert_offsets = offd.data_as<int32_t>();
  a.token_idx = tokd.data_as<int32_t>();
  a.route_weight = wd.data_as<float>();
  a.y = y.view_as<float, 2>();
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  // Separate epilogue kernel (impl_override 5, the default at 9 tokens) first, then fused (1): bit for bit equal.
  ctx.impl_override = 5;
  Status s = ops::Exl3GroupedGemm<Backend::kCuda>::run(desc, a, ctx);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  Tensor yu = y.to(Device::kCpu).value_or_throw();
  cudaMemset(y.data(), 0xFF, y.nbytes());
  ctx.impl_override = 1;
  s = ops::Exl3GroupedGemm<Backend::kCuda>::run(desc, a, ctx);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  BOOST_TEST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  Tensor yh = y.to(Device::kCpu).value_or_throw();
  BOOST_TEST(std::memcmp(yh.data(), yu.data(), yh.nbytes()) == 0, "MoE fused vs unfused epilogue");
  // num_assignments as a capacity past expert_offsets[E] (a count known on the device only): rows below it as
  // above, bit for bit; rows past it neither written (the 0xFF filler stays) nor read (their token_idx would
  // fault, their weight is NaN).
  {
    int64_t const cap = a_count + 7;
    std::vector<int32_t> tok_cap = tok;
    std::vector<float> w_cap = wgt;
    tok_cap.resize(static_cast<size_t>(cap), 0x7FFFFFFF);
    w_cap.resize(static_cast<size_t>(cap), std::numeric_limits<float>::quiet_NaN());
    Tensor tokc = upload(tok_cap, DType::kI32, {cap}), wc = upload(w_cap, DType::kF32, {cap});
    Tensor yc = Tensor::empty(DType::kF32, {cap, n}, Device::kCuda).value_or_throw();
    ops::Exl3GroupedGemmArgs ac = a;
    ac.token_idx = tokc.data_as<int32_t>();
    ac.route_weight = wc.data_as<float>();
    ac.y = yc.view_as<float, 2>();
    ops::Exl3GroupedGemmDesc desc_cap = desc;
    desc_cap.num_assignments = cap;
    for (int impl : {5, 1}) {
      BOOST_TEST_REQUIRE(cudaMemset(yc.data(), 0xFF, yc.nbytes()) == cudaSuccess);
      ctx.impl_override = impl;
      s = ops::Exl3GroupedGemm<Backend::kCuda>::run(desc_cap, ac, ctx);
      BOOST_TEST_REQUIRE(s.ok(), s.to_string());
      BOOST_TEST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      Tensor ych = yc.to(Device::kCpu).value_or_throw();
      BOOST_TEST(std::memcmp(ych.data(), yu.data(), yu.nbytes()) == 0, "capacity rows, impl " << impl);
      std::vector<uint8_t> filler(static_cast<size_t>((cap - a_count) * n * 4), 0xFF);
      BOOST_TEST(std::memcmp(static_cast<uint8_t const*>(ych.data()) + yu.nbytes(), filler.data(), filler.size()) == 0,
                 "rows past expert_offsets[E] written, impl " << impl);
    }
  }
  for (int e = 0; e < num_experts; ++e) {
    int64_t const cnt = off[e + 1] - off[e];
    if (cnt == 0) continue;
    std::vector<uint16_t> xe;
    for (int64_t i = off[e]; i < off[e + 1]; ++i) xe.insert(xe.end(), x.begin() + tok[i] * k, x.begin() + (tok[i] + 1) * k);
    std::vector<float> ye;
    run_dense(ex[e], xe, cnt, DType::kF32, 1, &ye);
    bool same = true;
    for (int64_t i = 0; i < cnt; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float const want = ye[i * n + j] * wgt[off[e] + i];
        same = same && std::memcmp(&want, yh.data_as<float>() + (off[e] + i) * n + j, 4) == 0;
      }
    BOOST_TEST(same, "expert " << e);
  }
}

BOOST_AUTO_TEST_CASE(moe_grouped_gemm_equals_gemv_bitwise) {
  // The grouped GEMM (impl_override 2) against the GEMV + epilogue kernel (5) and the fused GEMV (1) on the same
  // inputs: fp32 outputs bit for bit (mismatches counted, none allowed), and against the dense op per expert (the
  // GEMV, tactic 5) times the routing weight. Experts of 15, 0, 200, 1, 17, 129, 16, 128, 0 rows: empty experts
  // first-but-one, inside and last, row tiles cut at 128 from offsets that are not multiples of 128, experts of one
  // tile and of two (128 + 72, 128 + 1, 128 exactly); 37 capacity rows past expert_offsets[E] stay unwritten.
  // K = 2, 3 × the three codebooks at 256×512 (S = 2 chunks of 8 k-tiles) and 512×256 (S = 4); MUL1 K3 at
  // 512×24576 (S = 2 chunks of 16 k-tiles: a chunk spans 4 of the GEMM's 64-k slabs). Auto (−1) takes the GEMM
  // here (506 rows over 9 experts).
  uint64_t const seed = tessera::verify::test_seed(510);
  std::vector<int> const counts{15, 0, 200, 1, 17, 129, 16, 128, 0};
  struct Case { int64_t k, n; int bits; int cb; };
  std::vector<Case> cases;
  for (Case sh : {Case{256, 512, 0, 0}, Case{512, 256, 0, 0}})
    for (int bits : {2, 3})
      for (int cb = 0; cb < 3; ++cb) cases.push_back({sh.k, sh.n, bits, cb});
  cases.push_back({512, 24576, 3, 2});
  for (Case const& c : cases) {
    GroupedProblem pr(c.k, c.n, 2 * c.bits, static_cast<x3::Codebook>(c.cb), counts, 64, 37,
                      seed + 1000 * static_cast<uint64_t>(c.k / 256 + 8 * c.bits + 64 * c.cb) + static_cast<uint64_t>(c.n));
    BOOST_TEST_REQUIRE(pr.used >= ops::kExl3GroupedGemmMinRows * pr.experts());
    std::string const name = std::to_string(c.k) + "x" + std::to_string(c.n) + " K" + std::to_string(c.bits) + " cb" +
                             std::to_string(c.cb);
    auto const gemv = pr.run(5);
    auto const gemm = pr.run(2);
    auto const fused = pr.run(1);
    auto const dflt = pr.run(-1);
    int64_t const used = pr.used * c.n;
    BOOST_TEST(bit_mismatches(gemm.data(), gemv.data(), used) == 0, name << ": grouped GEMM vs GEMV");
    BOOST_TEST(bit_mismatches(fused.data(), gemv.data(), used) == 0, name << ": fused GEMV vs GEMV");
    BOOST_TEST(bit_mismatches(dflt.data(), gemv.data(), used) == 0, name << ": auto vs GEMV");
    std::vector<uint8_t> const filler(static_cast<size_t>((pr.cap - pr.used) * c.n * 4), 0xFF);
    for (auto const* y : {&gemv, &gemm, &fused})
      BOOST_TEST(std::memcmp(y->data() + used, filler.data(), filler.size()) == 0, name << ": rows past expert_offsets[E] written");
    for (size_t e = 0; e < counts.size(); ++e) {
      int64_t const cnt = counts[e];
      if (cnt == 0) continue;
      std::vector<uint16_t> xe;
      for (int64_t i = pr.off[e]; i < pr.off[e + 1]; ++i)
        xe.insert(xe.end(), pr.x.begin() + pr.tok[static_cast<size_t>(i)] * c.k, pr.x.begin() + (pr.tok[static_cast<size_t>(i)] + 1) * c.k);
      std::vector<float> ye;
      run_dense(pr.ex[e], pr.dev[e], xe, cnt, DType::kF32, 5, &ye);
      for (int64_t i = 0; i < cnt; ++i)
        for (int64_t j = 0; j < c.n; ++j) ye[static_cast<size_t>(i * c.n + j)] *= pr.wgt[static_cast<size_t>(pr.off[e] + i)];
      BOOST_TEST(bit_mismatches(ye.data(), gemm.data() + pr.off[e] * c.n, cnt * c.n) == 0,
                 name << ": expert " << e << " (" << cnt << " rows) vs the dense op");
    }
  }
  // The auto choice, seen through the scratch it asks: the grouped GEMM (xh + one fp32 accumulator per output) from
  // kExl3GroupedGemmMinRows rows per expert on average, the GEMV (xh + S = 40 chunk partials) below; one token: the
  // fused GEMV. DeepSeek-V4.1 w1: 5120 → 2304, 384 experts.
  int64_t const k = 5120, n = 2304, experts = 384, a = ops::kExl3GroupedGemmMinRows * experts;
  auto const bytes = [&](int64_t rows, size_t chunks) {
    return align256(static_cast<size_t>(rows * k) * 2) + align256(chunks * static_cast<size_t>(rows * n) * 4);
  };
  ops::Exl3GroupedGemmDesc d{{k, n, 6, x3::Codebook::kMul1}, experts, a / 6, a};
  BOOST_TEST(ops::Exl3GroupedGemm<Backend::kCuda>::workspace_bytes(d) == bytes(a, 1));
  d.num_assignments = a - 1;
  BOOST_TEST(ops::Exl3GroupedGemm<Backend::kCuda>::workspace_bytes(d) == bytes(a - 1, 40));
  d.num_tokens = 1;
  d.num_assignments = 6;
  BOOST_TEST(ops::Exl3GroupedGemm<Backend::kCuda>::workspace_bytes(d) == bytes(6, 40));
}

BOOST_AUTO_TEST_CASE(moe_gemv_few_rows_over_many_experts) {
  // Fewer assignment rows than experts (a decode step: 6 of 384): the GEMV's grid runs over the rows and the
  // block of an expert's first row does its work. Against the dense op per expert times the routing weight, and
  // the fused (1), unfused (5) and auto paths bit for bit; capacity rows past expert_offsets[E] stay unwritten.
  // Cases: 40 experts with rows at the first, inside (3 rows at once) and the last, 3 spare rows (A = 10 < 40);
  // one token's 6 rows over 64 experts (auto = the fused GEMV); one row, one expert of 24, no spare.
  uint64_t const seed = tessera::verify::test_seed(511);
  struct Case { std::vector<int> counts; int64_t tokens, spare, k, n; };
  auto sparse = [](int experts, std::vector<std::pair<int, int>> const& rows) {
    std::vector<int> c(static_cast<size_t>(experts), 0);
    for (auto [e, r] : rows) c[static_cast<size_t>(e)] = r;
    return c;
  };
  std::vector<Case> const cases{
      {sparse(40, {{0, 1}, {5, 1}, {17, 3}, {18, 1}, {39, 1}}), 4, 3, 256, 384},
      {sparse(64, {{2, 1}, {9, 1}, {30, 1}, {31, 1}, {47, 1}, {63, 1}}), 1, 0, 512, 256},
      {sparse(24, {{11, 1}}), 1, 0, 256, 512}};
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    Case const& c = cases[ci];
    GroupedProblem pr(c.k, c.n, 6, x3::Codebook::kMul1, c.counts, c.tokens, c.spare, seed + 97 * ci);
    BOOST_TEST_REQUIRE(pr.cap < pr.experts());
    auto const fused = pr.run(1);
    auto const gemv = pr.run(5);
    auto const dflt = pr.run(-1);
    int64_t const used = pr.used * c.n;
    BOOST_TEST(bit_mismatches(fused.data(), gemv.data(), used) == 0, "case " << ci << ": fused vs unfused");
    BOOST_TEST(bit_mismatches(dflt.data(), gemv.data(), used) == 0, "case " << ci << ": auto vs unfused");
    std::vector<uint8_t> const filler(static_cast<size_t>((pr.cap - pr.used) * c.n * 4), 0xFF);
    for (auto const* y : {&gemv, &fused})
      BOOST_TEST(std::memcmp(y->data() + used, filler.data(), filler.size()) == 0,
                 "case " << ci << ": rows past expert_offsets[E] written");
    int checked = 0;
    for (size_t e = 0; e < c.counts.size(); ++e) {
      int64_t const cnt = c.counts[e];
      if (cnt == 0) continue;
      std::vector<uint16_t> xe;
      for (int64_t i = pr.off[e]; i < pr.off[e + 1]; ++i)
        xe.insert(xe.end(), pr.x.begin() + pr.tok[static_cast<size_t>(i)] * c.k,
                  pr.x.begin() + (pr.tok[static_cast<size_t>(i)] + 1) * c.k);
      std::vector<float> ye;
      run_dense(pr.ex[e], pr.dev[e], xe, cnt, DType::kF32, 5, &ye);
      for (int64_t i = 0; i < cnt; ++i)
        for (int64_t j = 0; j < c.n; ++j) ye[static_cast<size_t>(i * c.n + j)] *= pr.wgt[static_cast<size_t>(pr.off[e] + i)];
      BOOST_TEST(bit_mismatches(ye.data(), fused.data() + pr.off[e] * c.n, cnt * c.n) == 0,
                 "case " << ci << ": expert " << e << " (" << cnt << " rows) vs the dense op");
      ++checked;
    }
    BOOST_TEST(checked > 0);
  }
}

BOOST_AUTO_TEST_CASE(real_shapes_vs_naive_kernel) {
  uint64_t seed = tessera::verify::test_seed(506);
  struct Shape { int64_t k, n; char const* name; };
  Shape const shapes[] = {{5120, 2304, "expert w1/w3"}, {2304, 5120, "expert w2"}, {5120, 1280, "wq_a"},
                          {1280, 32768, "wq_b"},         {4096, 1024, "wo_a group"}, {8192, 5120, "wo_b"},
                          {5120, 129280, "head"}};
  for (auto const& sh : shapes)
    for (int bits : {2, 3, 4}) {
      HostLayer h = random_layer(sh.k, sh.n, 2 * bits, x3::Codebook::kMul1, seed + bits, false);
      DevLayer d(h);
      int64_t const m = 2;
      auto x = random_x(m, h.k, seed + 5 + bits);
      auto naive = run_dense(h, d, x, m, DType::kF16, 3);
      auto gemv = run_dense(h, d, x, m, DType::kF16, 1);
      auto gemm = run_dense(h, d, x, m, DType::kF16, 2);
      auto gemv5 = run_dense(h, d, x, m, DType::kF16, 5);
      auto once = run_dense(h, d, x, m, DType::kF16, 4);
      BOOST_TEST(first_mismatch(gemv, gemm) == -1, sh.name << " K" << bits);
      BOOST_TEST(first_mismatch(gemv, gemv5) == -1, sh.name << " K" << bits << " fused vs unfused");
      Bounds b = spec_bounds(gemv, naive);
      BOOST_TEST(b.ok(), sh.name << " K" << bits << ": " << b.text());
      Bounds b4 = spec_bounds(once, naive);
      BOOST_TEST(b4.ok(), sh.name << " K" << bits << " decode-once: " << b4.text());
    }
}

BOOST_AUTO_TEST_SUITE_END()

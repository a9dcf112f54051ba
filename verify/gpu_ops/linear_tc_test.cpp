// SPDX-License-Identifier: Apache-2.0
/// The tensor-core bf16 linear (ops::linear_tc_cuda: mma.sync on the H200) against ref::dot_tc, the exact model
/// of the tensor-core accumulation (tc::BlockAcc), bit for bit: every fp32 accumulator and every →bf16 output.
///
/// Every problem runs through the (tile, instruction) variants: gemm and skinny tiles, each with one
/// m16n8k16 per 16-wide K block (the production instruction, ASSERTED: zero mismatches) and with two m16n8k8
/// per block (diagnostic only: if m16n8k16 were split internally the k8 variant would be the one that matches),
/// the skinny tile's other K slabs, and the wgmma tile (one m64n256k16 per block, ASSERTED; where
/// ops::tc_wgmma_available).
/// Mismatches are counted per variant and per input category and printed as a table at the end, with how many
/// of the mismatching elements other adder models would have produced (16-blocks with 24 or 26 alignment
/// bits, 8- or 32-blocks), so one run says which instruction follows which model.
///
/// Inputs. Random shapes (M ∈ {1, 2, 3, 8, 16, 17, 64, 127, 256, 1100}, N not multiples of 8, K = 0..5120
/// with K not a multiple of 16, strided and misaligned rows that force the element-load path; unused row
/// padding holds NaN so a read past K shows), each with normal(0, 1) bf16 values and with values whose
/// exponents are spread over 2^±24 (where the truncation of the aligned terms bites). Then edge categories:
/// zeros, signed zeros, bf16 subnormals, results in fp32's subnormal range, accumulators walking across
/// binades, cancellation (exact and near, across and inside blocks), a zero factor times a huge one (the model
/// says such a product takes no part in the alignment exponent), large exponent sums, sums past FLT_MAX (the
/// hardware gives ±inf there, and +0 for a negative sum below the smallest subnormal: tc::block_finish).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/tensor_core.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "tessera/ref/common_ref.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;
using ops::TcMma;
using ops::TcTile;

namespace {

constexpr uint16_t kPadBits = 0x7FC1;   // NaN in the unused part of strided rows
constexpr uint32_t kSentinel = 0x7FBADBADu;  // NaN preset in y: an output never written shows as a mismatch

template <class F>
void parallel_for(int64_t n, F const& f) {
  unsigned const threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int64_t i0; (i0 = next.fetch_add(16)) < n;)
        for (int64_t i = i0; i < std::min(n, i0 + 16); ++i) f(i);
    });
  for (auto& th : pool) th.join();
}

using ModelFn = float (*)(float const*, float const*, int64_t);
template <int kB, int kA>
float model_dot(float const* a, float const* b, int64_t n) {
  tc::BlockAccT<kB, kA> acc;
  for (int64_t i = 0; i < n; ++i) acc.step(a[i], b[i]);
  return acc.value();
}
struct AltModel {
  char const* name;
  ModelFn fn;
};
/// Other adders a mismatching element is tried against (diagnosis only; ref::dot_tc is block 16, 25 bits).
AltModel const kAlt[] = {{"blk8", model_dot<8, 25>},
                         {"al24", model_dot<16, 24>},
                         {"al26", model_dot<16, 26>},
                         {"blk32", model_dot<32, 25>},
                         {"blk8al24", model_dot<8, 24>}};
constexpr int kNumAlt = sizeof(kAlt) / sizeof(kAlt[0]);
constexpr int64_t kExamineCap = 512;  // mismatching elements per (problem, variant) tried against kAlt

/// One problem on the host: bf16 bit images as uploaded (x starts x_off elements into its buffer; rows have
/// strides ldx ≥ k and ldw ≥ k, the gap filled with kPadBits) and the same values as floats.
struct Problem {
  std::string category;
  int64_t m = 0, n = 0, k = 0, ldx = 0, ldw = 0, ldy = 0, x_off = 0;
  std::vector<uint16_t> xb, wb;
  std::vector<float> xf, wf;
  bool asserted = true;  // false: a diagnostic category (reported, not asserted)
  float const* xrow(int64_t r) const { return xf.data() + x_off + r * ldx; }
  float const* wrow(int64_t o) const { return wf.data() + o * ldw; }
};

using Gen = std::function<float(std::mt19937_64&, bool is_w, int64_t row, int64_t kk)>;

/// Fills a problem from `gen` (values are rounded to bf16: gen should return bf16 values already).
Problem make_problem(std::string cat, int64_t m, int64_t n, int64_t k, int64_t pad_x, int64_t pad_w, int64_t pad_y,
                     int64_t x_off, uint64_t seed, Gen const& gen) {
  Problem p;
  p.category = std::move(cat);
  p.m = m; p.n = n; p.k = k;
  p.ldx = k + pad_x; p.ldw = k + pad_w; p.ldy = n + pad_y; p.x_off = x_off;
  std::mt19937_64 g(seed);
  auto fill = [&](std::vector<uint16_t>& bits, std::vector<float>& vals, int64_t rows, int64_t ld, int64_t off,
                  bool is_w) {
    bits.assign(static_cast<size_t>(off + rows * ld), kPadBits);
    vals.assign(bits.size(), std::numeric_limits<float>::quiet_NaN());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i) {
        uint16_t const b = bf16_bits_from_float(gen(g, is_w, r, i));
        size_t const at = static_cast<size_t>(off + r * ld + i);
        bits[at] = b;
        vals[at] = float_from_bf16_bits(b);
      }
  };
  fill(p.xb, p.xf, m, p.ldx, x_off, false);
  fill(p.wb, p.wf, n, p.ldw, 0, true);
  return p;
}

struct Tally {
  int64_t elems = 0, fp32 = 0, bf16 = 0, examined = 0;
  int64_t explained[kNumAlt] = {};
  void add(Tally const& t) {
    elems += t.elems; fp32 += t.fp32; bf16 += t.bf16; examined += t.examined;
    for (int i = 0; i < kNumAlt; ++i) explained[i] += t.explained[i];
  }
};

struct Variant {
  TcTile tile;
  TcMma mma;
  ops::TcSlab slab = ops::TcSlab::k256x8;
};
/// The skinny tile's other slabs (512/1024-wide K slabs, 3–6 stages) must give the same bits as every variant.
Variant const kVariants[] = {{TcTile::kGemm, TcMma::kK16},   {TcTile::kSkinny, TcMma::kK16},
                             {TcTile::kGemm, TcMma::kK8x2},  {TcTile::kSkinny, TcMma::kK8x2},
                             {TcTile::kSkinny, TcMma::kK16, ops::TcSlab::k512x4},
                             {TcTile::kSkinny, TcMma::kK16, ops::TcSlab::k1024x3},
                             {TcTile::kSkinny, TcMma::kK16, ops::TcSlab::k512x6},
                             {TcTile::kWgmma, TcMma::kK16}};

/// Tallies by variant name ("gemm/k16/vec16", …) and by "category | variant" (printed by the last case).
std::map<std::string, Tally> g_by_variant, g_by_category;

struct GpuResult {
  std::vector<float> y;
  std::vector<uint16_t> yb;
};

/// Runs one variant on the uploaded problem; y has row stride p.ldy, yb row stride p.n.
GpuResult run_variant(Problem const& p, DeviceBuffer<uint16_t> const& dx, DeviceBuffer<uint16_t> const& dw,
                      Variant v, bool want_f32, bool want_bf16, std::string* name) {
  std::vector<float> ys(static_cast<size_t>(p.m * p.ldy), std::bit_cast<float>(kSentinel));
  std::vector<uint16_t> ybs(static_cast<size_t>(p.m * p.n), uint16_t{0x7FAB});
  DeviceBuffer<float> dy(ys);
  DeviceBuffer<uint16_t> dyb(ybs);
  ops::LinearTcDesc d{p.m, p.n, p.k, v.mma, v.tile, v.slab};
  ops::LinearTcArgs a;
  a.x = reinterpret_cast<Bf16 const*>(dx.data() + p.x_off);
  a.w = reinterpret_cast<Bf16 const*>(dw.data());
  a.ldx = p.ldx;
  a.ldw = p.ldw;
  if (want_f32) { a.y = dy.data(); a.ldy = p.ldy; }
  if (want_bf16) { a.y_bf16 = reinterpret_cast<Bf16*>(dyb.data()); a.ldy_bf16 = p.n; }
  if (name) *name = ops::linear_tc_variant_name(d, a);
  ExecContext ctx = cuda_ctx();
  Status const s = ops::linear_tc_cuda(d, a, ctx);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  return {dy.get(), dyb.get()};
}

std::string hex32(float f) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", std::bit_cast<uint32_t>(f));
  return b;
}

/// All variants of one problem against ref::dot_tc; asserts the m16n8k16 variants (when p.asserted).
void check_problem(Problem const& p) {
  std::vector<float> ref(static_cast<size_t>(p.m * p.n));
  parallel_for(p.m * p.n, [&](int64_t e) {
    int64_t const r = e / p.n, o = e % p.n;
    ref[static_cast<size_t>(e)] = ref::dot_tc(p.xrow(r), p.wrow(o), p.k);
  });
  DeviceBuffer<uint16_t> dx(p.xb), dw(p.wb);
  std::string line;
  for (Variant const v : kVariants) {
    if (v.tile == TcTile::kWgmma && !ops::tc_wgmma_available()) continue;  // sm_90a builds on compute capability 9.0
    std::string name;
    GpuResult const got = run_variant(p, dx, dw, v, true, true, &name);
    Tally t;
    std::vector<int64_t> bad;
    for (int64_t r = 0; r < p.m; ++r)
      for (int64_t o = 0; o < p.n; ++o) {
        float const want = ref[static_cast<size_t>(r * p.n + o)];
        float const y = got.y[static_cast<size_t>(r * p.ldy + o)];
        uint16_t const yb = got.yb[static_cast<size_t>(r * p.n + o)];
        ++t.elems;
        if (std::bit_cast<uint32_t>(y) != std::bit_cast<uint32_t>(want)) {
          ++t.fp32;
          bad.push_back(r * p.n + o);
        }
        t.bf16 += yb != bf16_bits_from_float(want);
      }
    // Which other adder would have produced the mismatching accumulators (first kExamineCap of them).
    if (!bad.empty()) {
      int64_t const nb = std::min<int64_t>(static_cast<int64_t>(bad.size()), kExamineCap);
      std::vector<uint8_t> hit(static_cast<size_t>(nb * kNumAlt), 0);
      parallel_for(nb, [&](int64_t i) {
        int64_t const e = bad[static_cast<size_t>(i)], r = e / p.n, o = e % p.n;
        float const y = got.y[static_cast<size_t>(r * p.ldy + o)];
        for (int a = 0; a < kNumAlt; ++a)
          hit[static_cast<size_t>(i * kNumAlt + a)] =
              std::bit_cast<uint32_t>(kAlt[a].fn(p.xrow(r), p.wrow(o), p.k)) == std::bit_cast<uint32_t>(y);
      });
      t.examined = nb;
      for (int64_t i = 0; i < nb; ++i)
        for (int a = 0; a < kNumAlt; ++a) t.explained[a] += hit[static_cast<size_t>(i * kNumAlt + a)];
      for (size_t i = 0; i < std::min<size_t>(bad.size(), 2); ++i) {
        int64_t const e = bad[i], r = e / p.n, o = e % p.n;
        float const y = got.y[static_cast<size_t>(r * p.ldy + o)];
        std::printf("    %s [%lld, %lld]: got %s (%.9g), ref::dot_tc %s (%.9g)\n", name.c_str(),
                    static_cast<long long>(r), static_cast<long long>(o), hex32(y).c_str(), static_cast<double>(y),
                    hex32(ref[static_cast<size_t>(e)]).c_str(), static_cast<double>(ref[static_cast<size_t>(e)]));
      }
    }
    g_by_variant[name].add(t);
    std::string const vk = std::string(v.tile == TcTile::kGemm ? "gemm" : v.tile == TcTile::kWgmma ? "wgmma" : "skinny") +
                           (v.mma == TcMma::kK16 ? "/k16" : "/k8x2");
    g_by_category[p.category + " | " + vk].add(t);
    line += " " + name + " " + std::to_string(t.fp32) + "/" + std::to_string(t.bf16);
    if (v.mma == TcMma::kK16 && p.asserted) {
      BOOST_TEST_INFO(p.category << " M " << p.m << " N " << p.n << " K " << p.k << " ldx " << p.ldx << " ldw "
                                 << p.ldw << " ldy " << p.ldy << " x_off " << p.x_off << " variant " << name);
      BOOST_TEST(t.fp32 == 0);
      BOOST_TEST_INFO(p.category << " M " << p.m << " N " << p.n << " K " << p.k << " variant " << name);
      BOOST_TEST(t.bf16 == 0);
    }
  }
  std::printf("%-18s M %5lld N %5lld K %5lld ldx %5lld ldw %5lld ldy %5lld off %lld | fp32/bf16 mismatches:%s\n",
              p.category.c_str(), static_cast<long long>(p.m), static_cast<long long>(p.n),
              static_cast<long long>(p.k), static_cast<long long>(p.ldx), static_cast<long long>(p.ldw),
              static_cast<long long>(p.ldy), static_cast<long long>(p.x_off), line.c_str());
  std::fflush(stdout);
}

float normal_bf16(std::mt19937_64& g) { return round_to_bf16(std::normal_distribution<float>(0.f, 1.f)(g)); }
float spread_bf16(std::mt19937_64& g, int spread) {
  int const e = std::uniform_int_distribution<int>(-spread, spread)(g);
  return round_to_bf16(std::ldexp(std::normal_distribution<float>(0.f, 1.f)(g), e));
}
/// ±(1 + f/128)·2^e, e uniform in [lo, hi] (a normal bf16 value for −126 ≤ e ≤ 127).
float pow2_bf16(std::mt19937_64& g, int lo, int hi) {
  int const e = std::uniform_int_distribution<int>(lo, hi)(g);
  int const f = std::uniform_int_distribution<int>(0, 127)(g);
  float const s = (g() & 1) ? -1.f : 1.f;
  return s * std::ldexp(1.f + static_cast<float>(f) / 128.f, e);
}
/// A bf16 subnormal: exponent field 0, fraction 1..127, random sign (2^−133 .. 127·2^−133).
float subnormal_bf16(std::mt19937_64& g) {
  uint16_t const f = static_cast<uint16_t>(std::uniform_int_distribution<int>(1, 127)(g));
  return float_from_bf16_bits(static_cast<uint16_t>(((g() & 1) << 15) | f));
}
float signed_zero(std::mt19937_64& g) { return (g() & 1) ? -0.f : 0.f; }
double uni(std::mt19937_64& g) { return std::uniform_real_distribution<double>(0.0, 1.0)(g); }

}  // namespace

BOOST_AUTO_TEST_SUITE(linear_tc)

BOOST_AUTO_TEST_CASE(argument_checks) {
  ExecContext ctx = cuda_ctx();
  ops::LinearTcDesc d{0, 8, 16};
  ops::LinearTcArgs a;
  BOOST_TEST(ops::linear_tc_cuda(d, a, ctx).ok());  // M = 0: nothing to do
  d.m = 4;
  BOOST_TEST(!ops::linear_tc_cuda(d, a, ctx).ok());  // no output, no operands
  DeviceBuffer<uint16_t> buf(size_t{64 * 16});
  DeviceBuffer<float> y(size_t{64});
  a.x = a.w = reinterpret_cast<Bf16 const*>(buf.data());
  a.y = y.data();
  a.ldx = 8;  // < k
  a.ldw = 16;
  a.ldy = 8;
  BOOST_TEST(!ops::linear_tc_cuda(d, a, ctx).ok());
  a.ldx = 16;
  BOOST_TEST(ops::linear_tc_cuda(d, a, ctx).ok());
  BOOST_TEST((ops::tc_tile_for({63, 1, 1}) == TcTile::kSkinny));
  BOOST_TEST((ops::tc_tile_for({64, 1, 1}) == TcTile::kGemm));
  BOOST_TEST((ops::tc_tile_for({1, 1, 1, TcMma::kK16, TcTile::kGemm}) == TcTile::kGemm));
  // The wgmma tile: m16n8k16 only; where it cannot run it is refused, never run wrong.
  ops::LinearTcDesc dw{4, 8, 16, TcMma::kK8x2, TcTile::kWgmma};
  BOOST_TEST((ops::linear_tc_cuda(dw, a, ctx).code() == StatusCode::kInvalidArgument));
  dw.mma = TcMma::kK16;
  BOOST_TEST((ops::linear_tc_cuda(dw, a, ctx).ok() == ops::tc_wgmma_available()));
  ops::LinearTcDesc const big{4096, 4096, 4096};
  char const* const env = std::getenv("TESSERA_TC_WGMMA");
  bool const auto_wgmma = ops::tc_wgmma_available() && !(env && std::string(env) == "0");
  BOOST_TEST((ops::tc_tile_run(big, a) == (auto_wgmma ? TcTile::kWgmma : TcTile::kGemm)));
  BOOST_TEST((ops::tc_tile_run({127, 8, 16}, a) == TcTile::kGemm));
}

BOOST_AUTO_TEST_CASE(random_shapes_match_dot_tc) {
  // (N, K): N off the 8-column tiles, K from 0 to 5120, most not multiples of 16 (K % 8 == 0 ones run the
  // 16-byte path, the others the element path).
  int64_t const nk[][2] = {{136, 5120}, {72, 1031}, {264, 4104}, {40, 100}, {9, 24},   {520, 2056},
                           {24, 1},     {17, 15},   {33, 17},    {200, 33}, {128, 1280}, {64, 5112}};
  int64_t const ms[] = {1, 2, 3, 8, 16, 17, 64, 127, 256};
  uint64_t seed = 1000;
  int idx = 0;
  for (int const spread : {0, 24})
    for (int64_t const m : ms)
      for (auto const& s : nk) {
        ++idx;
        // Strides: every 4th problem has x rows 3 elements longer (element path), every 4th W rows 8 longer
        // and y rows 1 longer (scalar stores), every 4th x starts 1 element into its buffer (misaligned).
        int64_t const pad_x = idx % 4 == 1 ? 3 : 0, pad_w = idx % 4 == 2 ? 8 : 0, pad_y = idx % 4 == 2 ? 1 : 0;
        int64_t const off = idx % 4 == 3 ? 1 : 0;
        Gen gen = [spread](std::mt19937_64& g, bool, int64_t, int64_t) {
          return spread ? spread_bf16(g, spread) : normal_bf16(g);
        };
        check_problem(make_problem(spread ? "spread24" : "normal", m, s[0], s[1], pad_x, pad_w, pad_y, off, seed++, gen));
      }
  // DeepSeek-V4.1 decode rows on real widths, K = 0, and more than 8 row tiles (the grouped raster of the
  // GEMM tile wraps).
  int64_t const extra[][3] = {{1, 1280, 5120}, {4, 2304, 5120}, {16, 1280, 5120}, {3, 10, 0}, {1100, 136, 264}};
  for (int const spread : {0, 24})
    for (auto const& s : extra) {
      Gen gen = [spread](std::mt19937_64& g, bool, int64_t, int64_t) {
        return spread ? spread_bf16(g, spread) : normal_bf16(g);
      };
      check_problem(make_problem(spread ? "spread24" : "normal", s[0], s[1], s[2], 0, 0, 0, 0, seed++, gen));
    }
}

BOOST_AUTO_TEST_CASE(edge_cases_match_dot_tc) {
  uint64_t seed = 5000;
  // Each category on a skinny-sized and a GEMM-sized problem (every variant runs both anyway), K with a tail.
  int64_t const shapes[][3] = {{19, 24, 200}, {70, 40, 1000}};
  auto run = [&](char const* cat, Gen const& gen, bool asserted = true) {
    for (auto const& s : shapes) {
      Problem p = make_problem(cat, s[0], s[1], s[2], 0, 0, 0, 0, seed++, gen);
      p.asserted = asserted;
      check_problem(p);
    }
  };
  // Zeros: every other x row and every third W row entirely +0 (their outputs are +0), the rest normal.
  run("zeros", [](std::mt19937_64& g, bool is_w, int64_t row, int64_t) {
    bool const zero = is_w ? row % 3 == 0 : row % 2 == 0;
    return zero ? 0.f : normal_bf16(g);
  });
  // Signed zeros: half of all entries ±0, whole rows of −0 in both operands.
  run("signed_zeros", [](std::mt19937_64& g, bool is_w, int64_t row, int64_t) {
    if (row % 5 == (is_w ? 1 : 2)) return -0.f;
    return uni(g) < 0.5 ? signed_zero(g) : normal_bf16(g);
  });
  // bf16 subnormals beside normal values of moderate and of tiny exponents.
  run("subnormal", [](std::mt19937_64& g, bool, int64_t, int64_t) {
    double const u = uni(g);
    if (u < 0.4) return subnormal_bf16(g);
    if (u < 0.7) return pow2_bf16(g, -30, 30);
    return pow2_bf16(g, -110, -90);
  });
  // Only subnormals: every product lies below 2^−250; the accumulator stays 0 or ±tiny.
  run("subnormal_only", [](std::mt19937_64& g, bool, int64_t, int64_t) { return subnormal_bf16(g); });
  // Products of 2^−150 .. 2^−118: accumulators in and around fp32's subnormal range (round toward zero there).
  run("underflow", [](std::mt19937_64& g, bool, int64_t, int64_t) { return pow2_bf16(g, -75, -59); });
  // Accumulators walking across binades: x = ±2^j, W's block b around 2^(E_b) with E_b a random walk per row,
  // signs biased by block so the sum grows then shrinks (products truncated against a larger accumulator and
  // the accumulator truncated against larger products).
  run("binade_walk", [](std::mt19937_64& g, bool is_w, int64_t row, int64_t kk) {
    if (!is_w) return std::ldexp((g() & 1) ? 1.f : -1.f, static_cast<int>(g() % 3));
    int64_t const b = kk / 16;
    uint64_t h = static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(b) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    int const e = static_cast<int>(h % 41) - 20;
    float const v = std::fabs(pow2_bf16(g, e - 2, e));
    bool const up = (b / 3) % 2 == 0;
    return (uni(g) < 0.8) == up ? v : -v;
  });
  // Accumulator just below a power of two, then small terms: x = 1, W = 2^−i patterns.
  run("binade_edge", [](std::mt19937_64& g, bool is_w, int64_t row, int64_t kk) {
    if (!is_w) return 1.f;
    int const shift = static_cast<int>((kk + row) % 26);
    float const v = std::ldexp(1.f, -shift) * ((g() % 4 == 0) ? 1.5f : 1.f);
    return (kk % 16 == 15 && g() % 3 == 0) ? -v : v;
  });
  // Exact cancellation: the second half of K repeats x and negates W (K/2 = 100 or 500: blocks straddle the
  // halves for 100), spread exponents so the aligned terms are truncated. make_problem calls the generator row
  // by row in K order, so the first half of the current row is remembered in `first`.
  for (auto const& s : shapes) {
    int64_t const half = s[2] / 2;
    auto first = std::make_shared<std::vector<float>>(static_cast<size_t>(half));
    Gen exact = [half, first](std::mt19937_64& g, bool is_w, int64_t, int64_t kk) {
      if (kk < half) return (*first)[static_cast<size_t>(kk)] = spread_bf16(g, 20);
      float const v = (*first)[static_cast<size_t>(kk - half)];
      return is_w ? -v : v;
    };
    check_problem(make_problem("cancel_exact", s[0], s[1], s[2], 0, 0, 0, 0, seed++, exact));
    // Near cancellation: the same with one element of the second half moved by one bf16 step.
    Gen near = [half, first](std::mt19937_64& g, bool is_w, int64_t row, int64_t kk) {
      if (kk < half) return (*first)[static_cast<size_t>(kk)] = spread_bf16(g, 20);
      float v = (*first)[static_cast<size_t>(kk - half)];
      if (is_w) v = -v;
      if (kk - half == (row * 7) % half && v != 0.f)
        v = float_from_bf16_bits(static_cast<uint16_t>(bf16_bits_from_float(v) + 1));
      return v;
    };
    check_problem(make_problem("cancel_near", s[0], s[1], s[2], 0, 0, 0, 0, seed++, near));
  }
  // Cancellation inside a block: pairs (p, −p) at k = 2i, 2i + 1 plus one small term per block.
  auto last = std::make_shared<float>(0.f);
  run("cancel_in_block", [last](std::mt19937_64& g, bool is_w, int64_t, int64_t kk) {
    if (kk % 16 == 15) return pow2_bf16(g, -30, -20);
    if (kk % 2 == 0) return *last = pow2_bf16(g, -4, 4);
    return is_w ? -*last : *last;
  });
  // A zero factor times a huge one: x has ±0 where W holds ±2^100..2^127, the other products are small. If
  // the hardware took a zero's exponent as −126, these products would raise E to −26..+1 and truncate the rest.
  run("zero_x_huge", [](std::mt19937_64& g, bool is_w, int64_t, int64_t kk) {
    bool const slot = kk % 5 == 2;
    if (slot) return is_w ? pow2_bf16(g, 100, 127) : signed_zero(g);
    return pow2_bf16(g, -20, -5);
  });
  run("huge_x_zero", [](std::mt19937_64& g, bool is_w, int64_t, int64_t kk) {
    bool const slot = kk % 7 == 3;
    if (slot) return is_w ? signed_zero(g) : pow2_bf16(g, 110, 127);
    return pow2_bf16(g, -40, -25);
  });
  // Large exponent sums (products up to 2^118, sums well inside fp32).
  run("large", [](std::mt19937_64& g, bool, int64_t, int64_t) { return pow2_bf16(g, 50, 58); });
  // Overflow past FLT_MAX (products ~2^126, same sign): ±inf, as measured on the H200.
  run("overflow", [](std::mt19937_64& g, bool, int64_t, int64_t) { return std::fabs(pow2_bf16(g, 62, 63)); });
}

BOOST_AUTO_TEST_CASE(output_modes_agree) {
  // fp32 only, bf16 only and both from one launch give the same bits; strided fp32 rows; both load paths.
  // Small enough for compute-sanitizer (scripts/device/tc.sh runs memcheck and racecheck on this case).
  Gen gen = [](std::mt19937_64& g, bool, int64_t, int64_t) { return spread_bf16(g, 24); };
  for (int64_t const m : {5, 130})
    for (int64_t const k : {520, 519}) {
      Problem p = make_problem("modes", m, 72, k, 0, 0, 3, 0, 77 + m + k, gen);
      DeviceBuffer<uint16_t> dx(p.xb), dw(p.wb);
      for (Variant const v : kVariants) {
        GpuResult const both = run_variant(p, dx, dw, v, true, true, nullptr);
        GpuResult const f32 = run_variant(p, dx, dw, v, true, false, nullptr);
        GpuResult const b16 = run_variant(p, dx, dw, v, false, true, nullptr);
        BOOST_TEST(count_bit_diffs(both.y, f32.y, "fp32 only") == 0);
        BOOST_TEST((both.yb == b16.yb));
        // Untouched outputs keep their presets.
        BOOST_TEST(std::all_of(f32.yb.begin(), f32.yb.end(), [](uint16_t b) { return b == 0x7FAB; }));
        BOOST_TEST(std::all_of(b16.y.begin(), b16.y.end(),
                               [](float f) { return std::bit_cast<uint32_t>(f) == kSentinel; }));
      }
    }
}

BOOST_AUTO_TEST_CASE(summary) {
  std::printf("\n### linear_tc vs ref::dot_tc: mismatching outputs per variant\n\n");
  std::printf("Alternative adders tried on up to %lld mismatching accumulators per problem and variant.\n\n",
              static_cast<long long>(kExamineCap));
  auto header = [](char const* first) {
    std::printf("| %s | outputs | fp32 mismatches | bf16 mismatches | examined |", first);
    for (auto const& a : kAlt) std::printf(" = %s |", a.name);
    std::printf("\n|---|---|---|---|---|");
    for (int i = 0; i < kNumAlt; ++i) std::printf("---|");
    std::printf("\n");
  };
  auto row = [](std::string const& k, Tally const& t) {
    std::printf("| %s | %lld | %lld | %lld | %lld |", k.c_str(), static_cast<long long>(t.elems),
                static_cast<long long>(t.fp32), static_cast<long long>(t.bf16), static_cast<long long>(t.examined));
    for (int i = 0; i < kNumAlt; ++i) std::printf(" %lld |", static_cast<long long>(t.explained[i]));
    std::printf("\n");
  };
  header("variant");
  std::map<std::string, Tally> by_instr;
  for (auto const& [k, t] : g_by_variant) {
    row(k, t);
    by_instr[k.find("k16") != std::string::npos ? "ALL m16n8k16" : "ALL 2 x m16n8k8"].add(t);
  }
  for (auto const& [k, t] : by_instr) row(k, t);
  std::printf("\n");
  header("category | variant");
  for (auto const& [k, t] : g_by_category) row(k, t);
  std::printf("\n");
  std::fflush(stdout);
  BOOST_TEST(!g_by_variant.empty());
}

BOOST_AUTO_TEST_SUITE_END()

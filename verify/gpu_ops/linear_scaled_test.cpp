// SPDX-License-Identifier: Apache-2.0
/// Block-scaled weights (FP8 e4m3 with 32×32-block ue8m0 scales, FP4 e2m1 with per-row-per-32 scales) on the GPU:
///  * the fused tiles (ops::linear_tc_cuda with LinearTcArgs::w_format): the skinny tile on each path (ring,
///    warp-specialised, direct where it fits) and the GEMM tile (M ≥ 64) against ref::dot_tc over the decoded weights ops::scaled_weight, bit for bit (fp32 accumulators and →bf16
///    outputs), on random codes over every byte value but NaN, scales around 2^0 and over 2^-127 … 2^63,
///    M = 1..16 and 17 (two row groups), N off the 8- and 32-row blocks, K from 32 to kTcQuantMaxK, strided codes;
///  * calls the fused tile does not take are refused (not_supported), never run wrong; a format without a
///    verified fused tile (ops::tc_quant_format_fused) is refused there and takes ops::Linear's decode-to-bf16 path;
///  * one-hot x rows show which decoded weight every K position meets (a diagnosis of the tile's layout);
///  * ops::Linear<kCuda> with block-scaled weights (decode and prefill rows on the fused tiles, the decode-to-bf16
///    path for md fp32, the grouped output projection's 8 groups) against Linear<kCpu>, bit for bit;
///  * Linear<kCuda>::run_shared_x (several projections of one x in one launch) against each call on the CPU.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/thread_pool.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "tessera/ref/common_ref.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;

namespace {

/// A block-scaled weight on the host: codes [n, ldq bytes], scales [srows, lds] and the decoded values [n, k].
struct ScaledW {
  DType fmt = DType::kF8E4m3;
  int64_t n = 0, k = 0, ldq = 0, lds = 0;
  std::vector<uint8_t> q, s;
  std::vector<float> w;
};

ScaledW make_scaled(DType fmt, int64_t n, int64_t k, int64_t q_pad, bool extreme_scales, uint64_t seed) {
  std::mt19937_64 g(seed);
  ScaledW r;
  r.fmt = fmt;
  r.n = n, r.k = k;
  int64_t const row_bytes = fmt == DType::kF4E2m1x2 ? k / 2 : k;
  r.ldq = row_bytes + q_pad;
  r.lds = (k + 31) / 32 + 1;  // one spare scale column: strided scale rows
  int64_t const srows = fmt == DType::kF8E4m3 ? (n + 31) / 32 : n;
  r.q.assign(static_cast<size_t>(n * r.ldq), 0xEE);
  r.s.assign(static_cast<size_t>(srows * r.lds), 0xFF);  // NaN scale in the spare column: a stray read shows
  // "All" scales: every code up to 2^63 (2^(190−127)): subnormal and tiny products included, sums kept finite
  // (beyond, ±inf and NaN outputs compare by their encodings, which carry no meaning).
  std::uniform_int_distribution<int> byte(0, 255), near(117, 137), any(0, 190);
  for (int64_t o = 0; o < n; ++o)
    for (int64_t b = 0; b < row_bytes; ++b) {
      int v = byte(g);
      if (fmt == DType::kF8E4m3 && (v & 0x7F) == 0x7F) v &= 0xFE;  // e4m3 NaN codes are not weights
      r.q[static_cast<size_t>(o * r.ldq + b)] = static_cast<uint8_t>(v);
    }
  for (int64_t sr = 0; sr < srows; ++sr)
    for (int64_t c = 0; c < (k + 31) / 32; ++c)
      r.s[static_cast<size_t>(sr * r.lds + c)] = static_cast<uint8_t>(extreme_scales ? any(g) : near(g));
  r.w.resize(static_cast<size_t>(n * k));
  for (int64_t o = 0; o < n; ++o)
    for (int64_t i = 0; i < k; ++i)
      r.w[static_cast<size_t>(o * k + i)] = ops::scaled_weight(fmt, r.q.data(), r.ldq, r.s.data(), r.lds, o, i);
  return r;
}

std::vector<uint16_t> random_x(int64_t m, int64_t ldx, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(static_cast<size_t>(m * ldx), 0x7FC1);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < ldx; ++i) x[static_cast<size_t>(r * ldx + i)] = bf16_bits_from_float(nd(g));
  return x;
}

int64_t g_outputs = 0;

/// The formats the fused tile runs (ops::tc_quant_format_fused): FP4 and FP8.
std::vector<DType> fused_formats() {
  std::vector<DType> f;
  for (DType t : {DType::kF8E4m3, DType::kF4E2m1x2})
    if (ops::tc_quant_format_fused(t)) f.push_back(t);
  return f;
}

/// The fused tile on one problem against ref::dot_tc; returns the mismatch count (fp32 + bf16).
int64_t check_fused(ScaledW const& w, int64_t m, uint64_t seed, std::string const& what,
                    ops::TcQuantPath path = ops::TcQuantPath::kRing, ops::TcTile tile = ops::TcTile::kAuto) {
  int64_t const ldx = w.k + 8;
  auto const xb = random_x(m, ldx, seed);
  std::vector<float> xf(xb.size());
  for (size_t i = 0; i < xb.size(); ++i) xf[i] = float_from_bf16_bits(xb[i]);
  DeviceBuffer<uint16_t> dx(xb);
  DeviceBuffer<uint8_t> dq(w.q), ds(w.s);
  DeviceBuffer<float> dy(std::vector<float>(static_cast<size_t>(m * w.n), -7.f));
  DeviceBuffer<uint16_t> dyb(std::vector<uint16_t>(static_cast<size_t>(m * w.n), 0x7FAB));
  ops::LinearTcDesc d{m, w.n, w.k};
  d.quant = path;
  d.tile = tile;
  ops::LinearTcArgs a;
  a.x = reinterpret_cast<Bf16 const*>(dx.data());
  a.ldx = ldx;
  a.w_format = w.fmt;
  a.w_q = dq.data(), a.ldw_q = w.ldq;
  a.w_scale = ds.data(), a.ldw_scale = w.lds;
  a.y = dy.data(), a.ldy = w.n;
  a.y_bf16 = reinterpret_cast<Bf16*>(dyb.data()), a.ldy_bf16 = w.n;
  BOOST_REQUIRE(ops::tc_quant_ok(d, a));
  ExecContext ctx = cuda_ctx();
  Status const s = ops::linear_tc_cuda(d, a, ctx);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  auto const y = dy.get();
  auto const yb = dyb.get();
  // The reference on the CPU pool (rows split across tasks, each dot_tc whole in one task): the 2,304 × 5,120
  // problems are ~10^10 BlockAcc steps, minutes on one core.
  std::vector<float> ref_y(static_cast<size_t>(m * w.n));
  parallel_for(m, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t o = 0; o < w.n; ++o)
        ref_y[static_cast<size_t>(r * w.n + o)] = ref::dot_tc(xf.data() + r * ldx, w.w.data() + o * w.k, w.k);
  });
  int64_t bad = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < w.n; ++o) {
      float const want = ref_y[static_cast<size_t>(r * w.n + o)];
      float const got = y[static_cast<size_t>(r * w.n + o)];
      bool const ok32 = std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want);
      bool const ok16 = yb[static_cast<size_t>(r * w.n + o)] == bf16_bits_from_float(want);
      if ((!ok32 || !ok16) && bad < 2)
        std::printf("    %s [%lld, %lld]: got %08x, ref::dot_tc %08x\n", what.c_str(), static_cast<long long>(r),
                    static_cast<long long>(o), std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want));
      bad += !ok32 + !ok16;
    }
  g_outputs += m * w.n;
  ops::TcTile const ran = ops::tc_tile_run(d, a);
  std::printf("%-40s %s M %3lld N %5lld K %5lld ldq %5lld | mismatches %lld\n", what.c_str(),
              ran == ops::TcTile::kWgmma                ? "wgmma "
              : ran == ops::TcTile::kGemm               ? "gemm  "
              : path == ops::TcQuantPath::kDirect       ? "direct"
              : path == ops::TcQuantPath::kWarpSpec     ? "wspec "
                                                        : "ring  ",
              static_cast<long long>(m),
              static_cast<long long>(w.n), static_cast<long long>(w.k), static_cast<long long>(w.ldq),
              static_cast<long long>(bad));
  return bad;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(linear_scaled)

BOOST_AUTO_TEST_CASE(fused_tile_matches_dot_tc) {
  // (N, K, code row padding): N off the 8-column tiles and 32-row scale blocks; K from one scale block to the
  // largest; padded code rows (stride a multiple of 16 bytes).
  int64_t const shapes[][3] = {{40, 32, 0}, {72, 96, 16}, {136, 5120, 0}, {33, 1280, 32}, {264, 2304, 0},
                               {17, 16384, 0}, {8, 544, 16}};
  int64_t const ms[] = {1, 2, 5, 8, 16, 17, 40};
  uint64_t seed = 7000;
  for (DType fmt : fused_formats())
    for (bool extreme : {false, true})
      for (auto const& sh : shapes) {
        // FP4 codes: the packed row stride must stay a multiple of 16 bytes.
        ScaledW const w = make_scaled(fmt, sh[0], sh[1], sh[2], extreme, seed++);
        for (int64_t m : ms) {
          char const* const what = fmt == DType::kF8E4m3 ? (extreme ? "fp8 all-scales" : "fp8 scales~1")
                                                         : (extreme ? "fp4 all-scales" : "fp4 scales~1");
          BOOST_TEST_INFO(what << " M " << m << " N " << w.n << " K " << w.k);
          BOOST_TEST(check_fused(w, m, seed++, what) == 0);
          BOOST_TEST(check_fused(w, m, seed++, what, ops::TcQuantPath::kWarpSpec) == 0);
          if (ops::tc_quant_direct_fits(m, w.k)) BOOST_TEST(check_fused(w, m, seed++, what, ops::TcQuantPath::kDirect) == 0);
        }
      }
  // Real DeepSeek-V4.1-Flash decode shapes.
  int64_t const real[][2] = {{1280, 5120}, {2304, 5120}, {5120, 2304}, {1024, 4096}, {5120, 8192}};
  for (DType fmt : fused_formats())
    for (auto const& sh : real) {
      ScaledW const w = make_scaled(fmt, sh[0], sh[1], 0, false, seed++);
      for (int64_t m : {int64_t{1}, int64_t{4}, int64_t{16}}) {
        BOOST_TEST_INFO("real shape " << sh[0] << "x" << sh[1] << " M " << m);
        BOOST_TEST(check_fused(w, m, seed++, fmt == DType::kF8E4m3 ? "fp8 real" : "fp4 real") == 0);
        BOOST_TEST(check_fused(w, m, seed++, fmt == DType::kF8E4m3 ? "fp8 real" : "fp4 real", ops::TcQuantPath::kWarpSpec) == 0);
        if (ops::tc_quant_direct_fits(m, w.k))
          BOOST_TEST(check_fused(w, m, seed++, fmt == DType::kF8E4m3 ? "fp8 real" : "fp4 real", ops::TcQuantPath::kDirect) == 0);
      }
    }
  std::printf("fused block-scaled tile: %lld outputs compared\n", static_cast<long long>(g_outputs));
}

// The GEMM tiles (M ≥ kTcGemmMinRows: codes decoded per K slab inside the block: the mma.sync 128 × 128 tile and,
// where ops::tc_wgmma_available, the wgmma 128 × 256 tile) against
// ref::dot_tc: N off the 128-column tiles and the 32-row scale blocks, one to 160 K slabs, M off the 128-row tiles,
// scales near 1 and over the whole range (±inf products included), padded code rows; a real Flash shape.
BOOST_AUTO_TEST_CASE(gemm_tile_matches_dot_tc) {
  int64_t const shapes[][3] = {{40, 32, 0}, {136, 96, 16}, {264, 544, 0}, {33, 1280, 32}, {130, 5120, 0}};
  int64_t const ms[] = {64, 130, 257};
  uint64_t seed = 9100;
  for (DType fmt : fused_formats())
    for (bool extreme : {false, true})
      for (auto const& sh : shapes) {
        ScaledW const w = make_scaled(fmt, sh[0], sh[1], sh[2], extreme, seed++);
        for (int64_t m : ms) {
          char const* const what = fmt == DType::kF8E4m3 ? (extreme ? "fp8 gemm all-scales" : "fp8 gemm scales~1")
                                                         : (extreme ? "fp4 gemm all-scales" : "fp4 gemm scales~1");
          BOOST_TEST_INFO(what << " M " << m << " N " << w.n << " K " << w.k);
          BOOST_TEST(check_fused(w, m, seed++, what, ops::TcQuantPath::kRing, ops::TcTile::kGemm) == 0);
          if (ops::tc_wgmma_available())
            BOOST_TEST(check_fused(w, m, seed++, what, ops::TcQuantPath::kRing, ops::TcTile::kWgmma) == 0);
        }
      }
  for (DType fmt : fused_formats()) {
    ScaledW const w = make_scaled(fmt, 2304, 5120, 0, false, seed++);
    BOOST_TEST(check_fused(w, 200, seed++, fmt == DType::kF8E4m3 ? "fp8 gemm real" : "fp4 gemm real", ops::TcQuantPath::kRing,
                           ops::TcTile::kGemm) == 0);
    if (ops::tc_wgmma_available())
      BOOST_TEST(check_fused(w, 300, seed++, fmt == DType::kF8E4m3 ? "fp8 wgmma real" : "fp4 wgmma real",
                             ops::TcQuantPath::kRing, ops::TcTile::kWgmma) == 0);
  }
}

// Which decoded weight each K position meets: x rows one-hot at k = base + r, so y[r][o] = W[o][k] exactly (one
// product per output; +0 for a −0 weight). Prints the positions whose weight is not W[o][k]. (An FP8 build whose
// decode index nvcc 13.0.88 miscompiled showed K positions 0–15 right, 16–31 meeting values of no weight of the
// tile and 32–63 zeros: scripts/nvcc/.)
// Every code under every scale code, through the tiles' decode helpers (scaled_e4m3x2; the FP4 table entry and
// scaled_e2m1x2), against ops::scaled_weight: the same bf16 bits, ±inf where the product overflows included.
// NaN (e4m3 codes 0x7F / 0xFF, scale code 255) only has to stay NaN: its payload carries no meaning.
BOOST_AUTO_TEST_CASE(decode_helpers_exhaustive) {
  for (DType fmt : fused_formats()) {
    std::vector<uint16_t> pairs;
    std::vector<uint8_t> sc;
    for (int s = 0; s < 256; ++s)
      for (int c = 0; c < 256; ++c) {
        pairs.push_back(fmt == DType::kF8E4m3 ? static_cast<uint16_t>(c | ((255 - c) << 8)) : static_cast<uint16_t>(c));
        sc.push_back(static_cast<uint8_t>(s));
      }
    std::vector<uint32_t> out(pairs.size(), 0);
    Status const st = ops::decode_block_scaled_pairs_cuda(fmt, pairs.data(), sc.data(), out.data(), static_cast<int64_t>(pairs.size()));
    BOOST_REQUIRE_MESSAGE(st.ok(), st.to_string());
    int64_t bad = 0, nan_pairs = 0;
    for (size_t i = 0; i < pairs.size(); ++i) {
      uint8_t q[2] = {static_cast<uint8_t>(pairs[i] & 0xFF), static_cast<uint8_t>(pairs[i] >> 8)};
      uint8_t const s = sc[i];
      for (int h = 0; h < 2; ++h) {
        // Code h of the pair as a one-row weight: FP8 byte q[h]; FP4 nibble h of the low byte.
        float want;
        if (fmt == DType::kF8E4m3) {
          want = ops::scaled_weight(fmt, &q[h], 1, &s, 1, 0, 0);
        } else {
          want = ops::scaled_weight(fmt, &q[0], 1, &s, 1, 0, h);
        }
        uint16_t const got = static_cast<uint16_t>(out[i] >> (16 * h));
        float const gotf = float_from_bf16_bits(got);
        if (want != want || gotf != gotf) {
          nan_pairs += 1;
          bad += (want != want) != (gotf != gotf);
          continue;
        }
        if (got != bf16_bits_from_float(want)) {
          if (bad < 4)
            std::printf("  %s code %02x scale %u: got %04x, scaled_weight %04x\n", fmt == DType::kF8E4m3 ? "fp8" : "fp4",
                        fmt == DType::kF8E4m3 ? q[h] : (q[0] >> (4 * h)) & 15, static_cast<unsigned>(s), got,
                        bf16_bits_from_float(want));
          ++bad;
        }
      }
    }
    std::printf("decode helpers %s: %zu codes x scales, %lld NaN, %lld differ\n", fmt == DType::kF8E4m3 ? "fp8" : "fp4",
                2 * pairs.size(), static_cast<long long>(nan_pairs), static_cast<long long>(bad));
    BOOST_TEST(bad == 0);
  }
}

BOOST_AUTO_TEST_CASE(fused_tile_k_positions) {
  for (DType fmt : fused_formats()) {
    ScaledW const w = make_scaled(fmt, 8, 64, 0, false, 4242);
    int64_t const m = 16, ldx = w.k + 8;
    for (int64_t base : {0, 16, 32, 48}) {
      std::vector<uint16_t> xb(static_cast<size_t>(m * ldx), 0);
      for (int64_t r = 0; r < m; ++r) xb[static_cast<size_t>(r * ldx + base + r)] = bf16_bits_from_float(1.f);
      DeviceBuffer<uint16_t> dx(xb);
      DeviceBuffer<uint8_t> dq(w.q), ds(w.s);
      DeviceBuffer<float> dy(std::vector<float>(static_cast<size_t>(m * w.n), -7.f));
      ops::LinearTcDesc d{m, w.n, w.k};
      ops::LinearTcArgs a;
      a.x = reinterpret_cast<Bf16 const*>(dx.data()), a.ldx = ldx;
      a.w_format = fmt;
      a.w_q = dq.data(), a.ldw_q = w.ldq, a.w_scale = ds.data(), a.ldw_scale = w.lds;
      a.y = dy.data(), a.ldy = w.n;
      ExecContext ctx = cuda_ctx();
      Status const st = ops::linear_tc_cuda(d, a, ctx);
      BOOST_REQUIRE_MESSAGE(st.ok(), st.to_string());
      auto const y = dy.get();
      int64_t bad = 0;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t o = 0; o < w.n; ++o) {
          // ref::dot_tc of the one-hot row: the weight itself, +0 for a −0 weight (+0 + −0 = +0).
          std::vector<float> xrow(static_cast<size_t>(w.k), 0.f);
          xrow[static_cast<size_t>(base + r)] = 1.f;
          float const want = ref::dot_tc(xrow.data(), w.w.data() + o * w.k, w.k), got = y[static_cast<size_t>(r * w.n + o)];
          if (std::bit_cast<uint32_t>(want) == std::bit_cast<uint32_t>(got)) continue;
          ++bad;
          if (o == 0) {  // which weight of row 0 it met instead
            int64_t at = -1;
            for (int64_t kk = 0; kk < w.k && at < 0; ++kk)
              if (std::bit_cast<uint32_t>(w.w[static_cast<size_t>(kk)]) == std::bit_cast<uint32_t>(got)) at = kk;
            std::printf("  %s k %lld: got %g (= W[0][%lld]), want %g\n", fmt == DType::kF8E4m3 ? "fp8" : "fp4",
                        static_cast<long long>(base + r), static_cast<double>(got), static_cast<long long>(at),
                        static_cast<double>(want));
          }
        }
      BOOST_TEST_INFO((fmt == DType::kF8E4m3 ? "fp8" : "fp4") << " k positions from " << base);
      BOOST_TEST(bad == 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(fused_tile_refuses_what_it_does_not_take) {
  ScaledW const w = make_scaled(DType::kF8E4m3, 16, 64, 0, false, 1);
  DeviceBuffer<uint8_t> dq(w.q), ds(w.s);
  DeviceBuffer<uint16_t> dx(random_x(64, 72, 2));
  DeviceBuffer<float> dy(std::vector<float>(64 * 16, 0.f));
  ExecContext ctx = cuda_ctx();
  auto run = [&](ops::LinearTcDesc d, int64_t ldq) {
    ops::LinearTcArgs a;
    a.x = reinterpret_cast<Bf16 const*>(dx.data()), a.ldx = 72;
    a.w_format = DType::kF8E4m3;
    a.w_q = dq.data(), a.ldw_q = ldq, a.w_scale = ds.data(), a.ldw_scale = w.lds;
    a.y = dy.data(), a.ldy = 16;
    return ops::linear_tc_cuda(d, a, ctx);
  };
  if (!ops::tc_quant_format_fused(DType::kF8E4m3)) {  // FP8 has no verified fused tile: refused, never run
    BOOST_TEST((run({1, 16, 64}, w.ldq).code() == StatusCode::kNotSupported));
    return;
  }
  BOOST_TEST(run({1, 16, 64}, w.ldq).ok());
  BOOST_TEST(run({64, 16, 64}, w.ldq).ok());  // GEMM-sized: the block-scaled GEMM tile
  {  // kAuto's prefill tile on block-scaled W: mma.sync below kTcWgmmaScaledMinRows rows, wgmma from there where it runs
    ops::LinearTcArgs a;
    a.x = reinterpret_cast<Bf16 const*>(dx.data()), a.ldx = 72;
    a.w_format = DType::kF8E4m3;
    a.w_q = dq.data(), a.ldw_q = w.ldq, a.w_scale = ds.data(), a.ldw_scale = w.lds;
    char const* const env = std::getenv("TESSERA_TC_WGMMA");
    bool const auto_wgmma = ops::tc_wgmma_available() && !(env && std::string(env) == "0");
    BOOST_TEST((ops::tc_tile_run({ops::kTcWgmmaScaledMinRows - 1, 16, 64}, a) == ops::TcTile::kGemm));
    BOOST_TEST((ops::tc_tile_run({ops::kTcWgmmaScaledMinRows, 16, 64}, a) ==
                (auto_wgmma ? ops::TcTile::kWgmma : ops::TcTile::kGemm)));
  }
  BOOST_TEST((run({1, 16, 48}, w.ldq).code() == StatusCode::kNotSupported));   // k % 32 != 0
  BOOST_TEST((run({1, 8, 64}, 72).code() == StatusCode::kNotSupported));       // code rows not 16-byte strided
  BOOST_TEST((run({1, 16, 64, ops::TcMma::kK8x2}, w.ldq).code() == StatusCode::kNotSupported));
}

BOOST_AUTO_TEST_CASE(linear_op_cuda_equals_cpu) {
  struct Case {
    DType fmt;
    int64_t rows, in, out, groups;
    DType md;
  };
  Case const cases[] = {
      {DType::kF8E4m3, 1, 1280, 136, 1, DType::kBf16},    {DType::kF8E4m3, 3, 5120, 72, 1, DType::kBf16},
      {DType::kF8E4m3, 17, 544, 40, 1, DType::kBf16},     {DType::kF8E4m3, 64, 1280, 72, 1, DType::kBf16},
      {DType::kF8E4m3, 130, 96, 33, 1, DType::kBf16},     {DType::kF8E4m3, 5, 100, 40, 1, DType::kBf16},
      {DType::kF8E4m3, 4, 512, 64, 8, DType::kBf16},      {DType::kF8E4m3, 70, 256, 32, 8, DType::kBf16},
      {DType::kF8E4m3, 3, 1280, 72, 1, DType::kF32},      {DType::kF4E2m1x2, 1, 2304, 136, 1, DType::kBf16},
      {DType::kF4E2m1x2, 8, 5120, 48, 1, DType::kBf16},   {DType::kF4E2m1x2, 100, 512, 40, 1, DType::kBf16},
      {DType::kF4E2m1x2, 2, 100, 24, 1, DType::kBf16},    {DType::kF4E2m1x2, 6, 256, 16, 4, DType::kBf16},
      {DType::kF4E2m1x2, 4, 512, 24, 1, DType::kF32}};
  uint64_t seed = 9100;
  for (Case const& c : cases) {
    ScaledW const w = make_scaled(c.fmt, c.groups * c.out, c.in, c.fmt == DType::kF4E2m1x2 ? 0 : 16, false, seed++);
    int64_t const cols = c.groups * c.in, ldx = cols + 3;
    auto const xb = random_x(c.rows, ldx, seed++);
    std::vector<float> x(xb.size());
    for (size_t i = 0; i < xb.size(); ++i) x[i] = float_from_bf16_bits(xb[i]);
    int64_t const ldy = c.groups * c.out + 1;
    std::vector<float> y_cpu(static_cast<size_t>(c.rows * ldy), -5.f);
    int64_t const qcols = c.fmt == DType::kF4E2m1x2 ? c.in / 2 : c.in;
    int64_t const srows = c.fmt == DType::kF8E4m3 ? (c.groups * c.out + 31) / 32 : c.groups * c.out;
    ops::LinearDesc const d{c.rows, c.in, c.out, c.fmt, c.md, false, ops::LinearImpl::kAuto, c.groups};
    ops::LinearArgs a;
    a.x = TensorView<float const, 2>(x.data(), {c.rows, cols}, {ldx, 1});
    a.w_q = TensorView<uint8_t const, 2>(w.q.data(), {c.groups * c.out, qcols}, {w.ldq, 1});
    a.w_scale = TensorView<uint8_t const, 2>(w.s.data(), {srows, (c.in + 31) / 32}, {w.lds, 1});
    a.y = TensorView<float, 2>(y_cpu.data(), {c.rows, c.groups * c.out}, {ldy, 1});
    ExecContext cpu;
    Status s = ops::dispatch<ops::Linear>(cpu, d, a);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());

    DeviceBuffer<float> dx(x);
    DeviceBuffer<uint8_t> dq(w.q), ds(w.s);
    DeviceBuffer<float> dy(std::vector<float>(y_cpu.size(), -5.f));
    ops::LinearArgs g;
    g.x = TensorView<float const, 2>(dx.data(), {c.rows, cols}, {ldx, 1}, Device::kCuda);
    g.w_q = TensorView<uint8_t const, 2>(dq.data(), {c.groups * c.out, qcols}, {w.ldq, 1}, Device::kCuda);
    g.w_scale = TensorView<uint8_t const, 2>(ds.data(), {srows, (c.in + 31) / 32}, {w.lds, 1}, Device::kCuda);
    g.y = TensorView<float, 2>(dy.data(), {c.rows, c.groups * c.out}, {ldy, 1}, Device::kCuda);
    ExecContext gpu = cuda_ctx();
    s = ops::dispatch<ops::Linear>(gpu, d, g);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    auto const y_gpu = dy.get();
    int64_t bad = 0;
    for (size_t i = 0; i < y_cpu.size(); ++i) bad += std::bit_cast<uint32_t>(y_cpu[i]) != std::bit_cast<uint32_t>(y_gpu[i]);
    std::printf("Linear %s rows %lld in %lld out %lld groups %lld md %s: %lld of %zu differ\n",
                c.fmt == DType::kF8E4m3 ? "fp8" : "fp4", static_cast<long long>(c.rows), static_cast<long long>(c.in),
                static_cast<long long>(c.out), static_cast<long long>(c.groups), std::string(dtype_name(c.md)).c_str(),
                static_cast<long long>(bad), y_cpu.size());
    BOOST_TEST_INFO("rows " << c.rows << " in " << c.in << " out " << c.out << " groups " << c.groups);
    BOOST_TEST(bad == 0);
  }
}

// Linear<kCuda>::run_shared_x: the projections of one x (the attention block's wq_a and wkv) in one batched launch,
// each output against Linear<kCpu> on that call alone, bit for bit; a set the batch does not take (md fp32, two
// weight formats) runs call by call with the same values. x rows are strided; y rows too.
BOOST_AUTO_TEST_CASE(linear_shared_x_equals_each_call) {
  struct Set {
    std::vector<DType> fmts;  // per call (kBf16: a bf16 weight)
    std::vector<int64_t> outs;
    int64_t rows, in;
    DType md;
  };
  std::vector<Set> const sets = {
      {{DType::kF8E4m3, DType::kF8E4m3}, {1280, 512}, 1, 5120, DType::kBf16},      // wq_a | wkv, decode
      {{DType::kF8E4m3, DType::kF8E4m3}, {136, 40}, 5, 1280, DType::kBf16},
      {{DType::kF4E2m1x2, DType::kF4E2m1x2, DType::kF4E2m1x2}, {72, 24, 256}, 16, 512, DType::kBf16},
      {{DType::kBf16, DType::kBf16}, {96, 40}, 3, 256, DType::kBf16},
      {{DType::kBf16, DType::kBf16}, {72, 33}, 70, 128, DType::kBf16},           // GEMM rows: call by call
      {{DType::kF8E4m3, DType::kF8E4m3}, {64, 32}, 2, 256, DType::kF32},         // md fp32: call by call
      {{DType::kF8E4m3, DType::kBf16}, {32, 40}, 4, 256, DType::kBf16}};         // two formats: call by call
  uint64_t seed = 9900;
  for (Set const& st : sets) {
    size_t const n = st.fmts.size();
    int64_t const ldx = st.in + 5;
    auto const xb = random_x(st.rows, ldx, seed++);
    std::vector<float> x(xb.size());
    for (size_t i = 0; i < xb.size(); ++i) x[i] = float_from_bf16_bits(xb[i]);
    DeviceBuffer<float> dx(x);
    std::vector<ScaledW> ws;
    std::vector<std::vector<uint16_t>> wb;  // bf16 weights
    std::vector<ops::LinearDesc> d;
    std::vector<ops::LinearArgs> g;
    std::vector<std::vector<float>> y_cpu;
    std::vector<DeviceBuffer<uint8_t>> dq, ds;
    std::vector<DeviceBuffer<uint16_t>> dwb;
    std::vector<DeviceBuffer<float>> dy;
    std::vector<int64_t> ldy;
    ws.reserve(n), wb.reserve(n), dq.reserve(n), ds.reserve(n), dwb.reserve(n), dy.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      DType const f = st.fmts[i];
      int64_t const out = st.outs[i];
      ldy.push_back(out + 2);
      ops::LinearDesc const di{st.rows, st.in, out, f, st.md};
      ops::LinearArgs a, ga;
      a.x = TensorView<float const, 2>(x.data(), {st.rows, st.in}, {ldx, 1});
      ga.x = TensorView<float const, 2>(dx.data(), {st.rows, st.in}, {ldx, 1}, Device::kCuda);
      ws.push_back(make_scaled(f == DType::kBf16 ? DType::kF8E4m3 : f, out, st.in, 0, false, seed++));
      ScaledW const& w = ws.back();
      if (f == DType::kBf16) {  // the decoded values as a bf16 weight
        wb.emplace_back(w.w.size());
        for (size_t e = 0; e < w.w.size(); ++e) wb.back()[e] = bf16_bits_from_float(w.w[e]);
        a.w_bf16 = TensorView<Bf16 const, 2>(reinterpret_cast<Bf16 const*>(wb.back().data()), {out, st.in});
        dwb.emplace_back(wb.back());
        ga.w_bf16 = TensorView<Bf16 const, 2>(reinterpret_cast<Bf16 const*>(dwb.back().data()), {out, st.in}, Device::kCuda);
      } else {
        wb.emplace_back();
        int64_t const qcols = f == DType::kF4E2m1x2 ? st.in / 2 : st.in;
        int64_t const srows = f == DType::kF8E4m3 ? (out + 31) / 32 : out;
        a.w_q = TensorView<uint8_t const, 2>(w.q.data(), {out, qcols}, {w.ldq, 1});
        a.w_scale = TensorView<uint8_t const, 2>(w.s.data(), {srows, (st.in + 31) / 32}, {w.lds, 1});
        dq.emplace_back(w.q);
        ds.emplace_back(w.s);
        ga.w_q = TensorView<uint8_t const, 2>(dq.back().data(), {out, qcols}, {w.ldq, 1}, Device::kCuda);
        ga.w_scale = TensorView<uint8_t const, 2>(ds.back().data(), {srows, (st.in + 31) / 32}, {w.lds, 1}, Device::kCuda);
      }
      y_cpu.emplace_back(static_cast<size_t>(st.rows * ldy.back()), -5.f);
      a.y = TensorView<float, 2>(y_cpu.back().data(), {st.rows, out}, {ldy.back(), 1});
      ExecContext cpu;
      Status const s = ops::dispatch<ops::Linear>(cpu, di, a);
      BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
      dy.emplace_back(std::vector<float>(y_cpu.back().size(), -5.f));
      ga.y = TensorView<float, 2>(dy.back().data(), {st.rows, out}, {ldy.back(), 1}, Device::kCuda);
      d.push_back(di);
      g.push_back(ga);
    }
    ExecContext gpu = cuda_ctx();
    Status const s = ops::Linear<Backend::kCuda>::run_shared_x(d, g, gpu);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    for (size_t i = 0; i < n; ++i) {
      auto const y = dy[i].get();
      int64_t bad = 0;
      for (size_t e = 0; e < y.size(); ++e) bad += std::bit_cast<uint32_t>(y[e]) != std::bit_cast<uint32_t>(y_cpu[i][e]);
      std::printf("Linear shared x: call %zu of %zu (%s, rows %lld in %lld out %lld md %s): %lld of %zu differ\n", i + 1, n,
                  std::string(dtype_name(st.fmts[i])).c_str(), static_cast<long long>(st.rows),
                  static_cast<long long>(st.in), static_cast<long long>(st.outs[i]),
                  std::string(dtype_name(st.md)).c_str(), static_cast<long long>(bad), y.size());
      BOOST_TEST_INFO("call " << i << " rows " << st.rows << " out " << st.outs[i]);
      BOOST_TEST(bad == 0);
    }
  }
  // Calls that do not share x, or disagree on rows / in, are refused by check or run alone: a mismatched in is
  // refused (check_linear), never run over the wrong columns.
  ScaledW const w = make_scaled(DType::kF8E4m3, 32, 64, 0, false, 1);
  DeviceBuffer<uint8_t> dq(w.q), ds(w.s);
  DeviceBuffer<float> dx(std::vector<float>(64, 0.5f)), dy(std::vector<float>(32, 0.f));
  ops::LinearArgs a;
  a.x = TensorView<float const, 2>(dx.data(), {1, 64}, Device::kCuda);
  a.w_q = TensorView<uint8_t const, 2>(dq.data(), {32, 64}, {w.ldq, 1}, Device::kCuda);
  a.w_scale = TensorView<uint8_t const, 2>(ds.data(), {1, 2}, {w.lds, 1}, Device::kCuda);
  a.y = TensorView<float, 2>(dy.data(), {1, 32}, Device::kCuda);
  ops::LinearDesc const good{1, 64, 32, DType::kF8E4m3, DType::kBf16}, bad_in{1, 96, 32, DType::kF8E4m3, DType::kBf16};
  std::vector<ops::LinearDesc> dd = {good, bad_in};
  std::vector<ops::LinearArgs> aa = {a, a};
  ExecContext gpu = cuda_ctx();
  BOOST_TEST(!ops::Linear<Backend::kCuda>::run_shared_x(dd, aa, gpu).ok());
}

BOOST_AUTO_TEST_SUITE_END()

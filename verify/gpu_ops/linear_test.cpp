// SPDX-License-Identifier: Apache-2.0
/// CUDA linear y = →md(x·Wᵀ) against the CPU backend and ref::linear_row / ref::bmm_dot: bitwise (no
/// transcendental; both follow the output dtype's order: ref::dot's chunks or one FMA chain for fp32,
/// ref::dot_tc's tensor-core blocks for bf16), fp32 and bf16-stored weights, md fp32 and bf16; row invariance
/// (a row alone = the same row in a batch of 19 and of 70, strided outputs); odd shapes that are not multiples
/// of the 32×32 tiles.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <tuple>

#include "tessera/ops/linear.hpp"
#include "tessera/ref/common_ref.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;

namespace {

struct Case {
  int64_t rows, in, out;
  DType wdt, md;
  bool fma_chain = false;
  ops::LinearImpl impl = ops::LinearImpl::kAuto;
};

/// CUDA output of `c` on host inputs x [rows, in], w [out, in] (already bf16 values when wdt is bf16).
std::vector<float> run_cuda(Case const& c, std::vector<float> const& x, std::vector<float> const& w) {
  DeviceBuffer<float> dx(x), dy(static_cast<size_t>(c.rows * c.out));
  DeviceBuffer<float> dw;
  DeviceBuffer<Bf16> dwb;
  ops::LinearDesc d{c.rows, c.in, c.out, c.wdt, c.md, c.fma_chain, c.impl};
  ops::LinearArgs a;
  a.x = dx.cview<2>({c.rows, c.in});
  a.y = dy.view<2>({c.rows, c.out});
  if (c.wdt == DType::kBf16) {
    std::vector<Bf16> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = Bf16::from_float(w[i]);
    dwb.upload(wb);
    a.w_bf16 = dwb.cview<2>({c.out, c.in});
  } else {
    dw.upload(w);
    a.w = dw.cview<2>({c.out, c.in});
  }
  ExecContext ctx = cuda_ctx();
  auto s = ops::dispatch<ops::Linear>(ctx, d, a);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  return dy.get();
}

}  // namespace

/// Shapes cover every kernel of each order: decode-sized launches (rows ≤ 8, in ≤ 8192: one warp per
/// output, chunks over the lanes in fp32, a lane per K index in bf16), 8-row tiles (9–31 rows, or in > 8192),
/// the 64 × 64 register-tiled GEMM (≥ 32 rows) with partial row, output and K tiles, full and partial
/// 32-chunks and 16-blocks (in = 1031, 8200, 1030: a last block of 7, 8 or 6; 300: a 32-step with one block),
/// aligned and unaligned weight rows (16-byte vector loads or scalar), the released in = 5120 / 8192. bf16
/// weights with a bf16 output run both CUDA implementations: the tensor cores (kAuto: skinny tile below 64
/// rows, 128 × 128 GEMM tile from 64) and the CUDA-core emulation (kSimt); x then holds bf16 values.
BOOST_AUTO_TEST_CASE(linear_matches_cpu_bitwise) {
  uint64_t const seed = test_seed(501);
  for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 96}, {3, 300, 200}, {17, 1031, 257},
                               {9, 2048, 4100}, {1, 5120, 70}, {8, 8192, 37}, {2, 8200, 33}, {5, 4096, 129},
                               {1, 1030, 5}, {32, 64, 64}, {70, 1031, 97}, {130, 5120, 200}}) {
    for (bool fma_chain : {false, true})
    for (DType wdt : {DType::kF32, DType::kBf16})
      for (DType md : {DType::kF32, DType::kBf16}) {
        Case c{rows, in, out, wdt, md, fma_chain};
        auto x = randn(static_cast<size_t>(rows * in), seed + rows, 1.f);
        auto w = randn(static_cast<size_t>(out * in), seed + 7 * in, 0.05f);
        if (wdt == DType::kBf16)
          for (auto& v : w) v = round_to_bf16(v);
        bool const tc_order = wdt == DType::kBf16 && md == DType::kBf16;
        if (tc_order)
          for (auto& v : x) v = round_to_bf16(v);
        std::vector<float> cpu(static_cast<size_t>(rows * out)), ref(cpu.size());
        ops::LinearDesc d{rows, in, out, wdt, md, fma_chain};
        ops::LinearArgs a;
        std::vector<Bf16> wb(w.size());
        for (size_t i = 0; i < w.size(); ++i) wb[i] = Bf16::from_float(w[i]);
        a.x = TensorView<float const, 2>(x.data(), {rows, in});
        a.w = TensorView<float const, 2>(w.data(), {out, in});
        a.w_bf16 = TensorView<Bf16 const, 2>(wb.data(), {out, in});
        a.y = TensorView<float, 2>(cpu.data(), {rows, out});
        ExecContext cctx;
        auto s = ops::dispatch<ops::Linear>(cctx, d, a);
        BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
        for (int64_t r = 0; r < rows; ++r) {
          if (fma_chain)
            for (int64_t o = 0; o < out; ++o)
              ref[r * out + o] = ref::round_md(ref::bmm_dot(&x[r * in], &w[o * in], in, md), md);
          else
            ref::linear_row(&x[r * in], w.data(), in, out, &ref[r * out], md);
        }
        BOOST_TEST_REQUIRE(count_bit_diffs(cpu, ref, "cpu vs ref") == 0);
        for (auto impl : {ops::LinearImpl::kAuto, ops::LinearImpl::kSimt}) {
          if (impl == ops::LinearImpl::kSimt && !tc_order) continue;  // one implementation only
          c.impl = impl;
          auto gpu = run_cuda(c, x, w);
          BOOST_TEST_INFO("rows=" << rows << " in=" << in << " out=" << out << " w=" << dtype_name(wdt)
                                  << " md=" << dtype_name(md) << " fma_chain=" << fma_chain
                                  << " impl=" << (impl == ops::LinearImpl::kSimt ? "simt" : "auto"));
          BOOST_TEST(count_bit_diffs(gpu, cpu, "gpu vs cpu") == 0);
        }
      }
  }
}

/// The tensor-core path on the model's shapes and row counts around its tile switch (skinny below 64 rows,
/// GEMM from 64; partial 128-row and 128-column tiles), and the grouped output projection's views (wo_a:
/// W rows [g·out, (g + 1)·out) of one tensor, fma_chain): equal to ref::dot_tc bit for bit; K not a multiple
/// of 8 (element staging) and of 16 (a padded last block). Values with a wide exponent range (scales 2^−20
/// to 2^20 on x) so the blocks' alignment truncation bites.
BOOST_AUTO_TEST_CASE(linear_tensor_core_path_matches_ref) {
  uint64_t const seed = test_seed(503);
  for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 5120, 160}, {2, 1280, 1000}, {7, 8192, 136},
                               {16, 4096, 128}, {63, 5120, 130}, {64, 5120, 130}, {65, 1030, 257}, {129, 1031, 129},
                               {300, 5120, 96}, {4100, 64, 40}}) {
    auto x = randn(static_cast<size_t>(rows * in), seed + rows, 1.f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = round_to_bf16(std::ldexp(x[i], static_cast<int>(i % 41) - 20));
    int64_t const groups = 3;  // W holds `groups` blocks of `out` rows; each group is a view at row g·out
    auto w = randn(static_cast<size_t>(groups * out * in), seed + 7 * in, 0.05f);
    for (auto& v : w) v = round_to_bf16(v);
    std::vector<Bf16> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = Bf16::from_float(w[i]);
    DeviceBuffer<float> dx(x), dy(static_cast<size_t>(rows * out));
    DeviceBuffer<Bf16> dwb(wb);
    for (bool fma_chain : {false, true})
      for (int64_t g = 0; g < groups; ++g) {
        ops::LinearArgs a;
        a.x = dx.cview<2>({rows, in});
        a.w_bf16 = TensorView<Bf16 const, 2>(dwb.data() + g * out * in, {out, in}, Device::kCuda);
        a.y = dy.view<2>({rows, out});
        ExecContext ctx = cuda_ctx();
        auto s = ops::dispatch<ops::Linear>(ctx, ops::LinearDesc{rows, in, out, DType::kBf16, DType::kBf16, fma_chain}, a);
        BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
        auto y = dy.get();
        std::vector<float> ref(y.size());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t o = 0; o < out; ++o)
            ref[r * out + o] = round_to_bf16(ref::dot_tc(&x[r * in], &w[(g * out + o) * in], in));
        BOOST_TEST_INFO("rows=" << rows << " in=" << in << " out=" << out << " group=" << g << " fma_chain=" << fma_chain);
        BOOST_TEST(count_bit_diffs(y, ref, "tensor cores vs ref::dot_tc") == 0);
      }
  }
}

BOOST_AUTO_TEST_CASE(linear_row_invariant) {
  uint64_t const seed = test_seed(502);
  int64_t const in = 777, out = 333;
  auto w = randn(static_cast<size_t>(out * in), seed, 0.05f);
  for (int64_t rows : {19, 70}) {
    auto x = randn(static_cast<size_t>(rows * in), seed + rows);
    auto batch = run_cuda({rows, in, out, DType::kF32, DType::kBf16}, x, w);
    for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
      auto alone = run_cuda({1, in, out, DType::kF32, DType::kBf16}, row_slice(x, in, r), w);
      BOOST_TEST(count_bit_diffs(alone, row_slice(batch, out, r), "alone vs batch") == 0);
    }
  }
  // The tensor-core path: a row alone (skinny tile) = the same row in batches of 19 (skinny, two row groups),
  // 70 and 200 (GEMM tiles), with in = 776 (vec16 staging) and 777 (element staging).
  for (int64_t tin : {776, 777}) {
    auto wt = randn(static_cast<size_t>(out * tin), seed + tin, 0.05f);
    for (auto& v : wt) v = round_to_bf16(v);
    for (int64_t rows : {19, 70, 200}) {
      auto x = randn(static_cast<size_t>(rows * tin), seed + rows + tin);
      for (auto& v : x) v = round_to_bf16(v);
      auto batch = run_cuda({rows, tin, out, DType::kBf16, DType::kBf16}, x, wt);
      for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
        auto alone = run_cuda({1, tin, out, DType::kBf16, DType::kBf16}, row_slice(x, tin, r), wt);
        BOOST_TEST(count_bit_diffs(alone, row_slice(batch, out, r), "tensor cores: alone vs batch") == 0);
      }
    }
  }
  // Strided views: y rows written into a wider buffer, x read from a wider one.
  int64_t const rows = 5;
  auto xw = randn(static_cast<size_t>(rows * (in + 13)), seed + 99);
  DeviceBuffer<float> dx(xw), dw(w), dy(std::vector<float>(static_cast<size_t>(rows * (out + 3)), -7.f));
  ops::LinearArgs a;
  a.x = TensorView<float const, 2>(dx.data(), {rows, in}, {in + 13, 1}, Device::kCuda);
  a.w = dw.cview<2>({out, in});
  a.y = TensorView<float, 2>(dy.data(), {rows, out}, {out + 3, 1}, Device::kCuda);
  ExecContext ctx = cuda_ctx();
  auto s = ops::dispatch<ops::Linear>(ctx, ops::LinearDesc{rows, in, out, DType::kF32, DType::kF32}, a);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  auto y = dy.get();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> ref(static_cast<size_t>(out));
    ref::linear_row(&xw[r * (in + 13)], w.data(), in, out, ref.data(), DType::kF32);
    BOOST_TEST(count_bit_diffs(std::vector<float>(y.begin() + r * (out + 3), y.begin() + r * (out + 3) + out), ref,
                               "strided") == 0);
    for (int64_t j = out; j < out + 3; ++j) BOOST_TEST(y[r * (out + 3) + j] == -7.f);
  }
}

/// The grouped form on the device: both implementations against the CPU op bit for bit, the released wo_a shape
/// (8 groups of 1024 outputs over 4096 inputs: one batched tensor-core launch), 9 groups (more than one batch
/// holds: one launch per group), odd widths (element staging), decode and prefill row counts.
BOOST_AUTO_TEST_CASE(linear_grouped_matches_cpu) {
  uint64_t const seed = test_seed(504);
  for (auto [rows, in, out, G] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 4096, 1024, 8}, {3, 4096, 1024, 8},
                                  {1, 200, 72, 9}, {5, 203, 37, 2}, {70, 256, 136, 8}, {16, 1024, 64, 4}}) {
    auto x = randn(static_cast<size_t>(rows * G * in), seed + rows + G, 1.f);
    for (auto& v : x) v = round_to_bf16(v);
    auto w = randn(static_cast<size_t>(G * out * in), seed + 3 * in + G, 0.05f);
    for (auto& v : w) v = round_to_bf16(v);
    std::vector<Bf16> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = Bf16::from_float(w[i]);
    DeviceBuffer<float> dx(x), dy(static_cast<size_t>(rows * G * out));
    DeviceBuffer<Bf16> dwb(wb);
    for (bool fma_chain : {true, false})
      for (DType md : {DType::kBf16, DType::kF32}) {
        std::vector<float> cpu(static_cast<size_t>(rows * G * out));
        ops::LinearArgs ca;
        ca.x = TensorView<float const, 2>(x.data(), {rows, G * in});
        ca.w_bf16 = TensorView<Bf16 const, 2>(wb.data(), {G * out, in});
        ca.y = TensorView<float, 2>(cpu.data(), {rows, G * out});
        ExecContext cctx;
        ops::LinearDesc d{rows, in, out, DType::kBf16, md, fma_chain, ops::LinearImpl::kAuto, G};
        auto s = ops::dispatch<ops::Linear>(cctx, d, ca);
        BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
        for (auto impl : {ops::LinearImpl::kAuto, ops::LinearImpl::kSimt}) {
          d.impl = impl;
          ops::LinearArgs a;
          a.x = dx.cview<2>({rows, G * in});
          a.w_bf16 = dwb.cview<2>({G * out, in});
          a.y = dy.view<2>({rows, G * out});
          ExecContext ctx = cuda_ctx();
          s = ops::dispatch<ops::Linear>(ctx, d, a);
          BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
          BOOST_TEST_INFO("rows=" << rows << " in=" << in << " out=" << out << " groups=" << G << " md=" << dtype_name(md)
                                  << " fma_chain=" << fma_chain << " impl=" << (impl == ops::LinearImpl::kSimt ? "simt" : "auto"));
          BOOST_TEST(count_bit_diffs(dy.get(), cpu, "grouped gpu vs cpu") == 0);
        }
      }
  }
}

BOOST_AUTO_TEST_CASE(linear_rejects_bad_shapes) {
  DeviceBuffer<float> dx(size_t{12}), dw(size_t{12}), dy(size_t{12});
  ops::LinearArgs a;
  a.x = dx.cview<2>({3, 4});
  a.w = dw.cview<2>({3, 4});
  a.y = dy.view<2>({3, 4});  // out is 3, y says 4
  ExecContext ctx = cuda_ctx();
  auto s = ops::dispatch<ops::Linear>(ctx, ops::LinearDesc{3, 4, 3, DType::kF32, DType::kF32}, a);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.to_string().find("linear y") != std::string::npos);
}

// SPDX-License-Identifier: Apache-2.0
/// CompressPool<Backend::kCuda> against CompressPool<Backend::kCpu> (ref/compressor_ref.hpp):
///   * seeded random a, g for ratios 2, 4 and 128, fp32 and bf16, within the named tolerance (expf);
///   * gates constant over a group's tokens make every softmax weight exactly 1/r (expf(0) = 1), so the
///     pooled latents must equal the CPU bit for bit (the accumulation order);
///   * tokens arriving in chunks (the model's buffer: leftover tokens wait, groups complete mid-chunk)
///     give the same latents, bit for bit, as pooling the whole prompt at once;
///   * ratio 1 and host views are refused.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include "tessera/ops/backend_route.hpp"
#include "tessera/ops/compressor.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_attn/gpu_attn_util.hpp"

using namespace tessera;
using namespace tessera::verify;
using namespace tessera::verify::gpu_attn;

namespace {

/// latent within (kPoolUlpsF32 + 2r) fp32 ulps of Σ_i |a_i·w_i| (w the CPU softmax weights); bf16 adds one
/// bf16 ulp of that sum and one of |latent|.
constexpr double kPoolUlpsF32 = 8.0;

std::vector<float> pool_cpu(std::vector<float> const& a, std::vector<float> const& g, int64_t groups, int64_t r,
                            int64_t dim, DType md) {
  std::vector<float> out(static_cast<size_t>(groups * dim));
  ExecContext ctx;
  Status s = ops::compress_pool(ctx, {groups, r, dim, md},
                                {TensorView<float const, 2>(a.data(), {groups * r, dim}),
                                 TensorView<float const, 2>(g.data(), {groups * r, dim}),
                                 TensorView<float, 2>(out.data(), {groups, dim})});
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  return out;
}

std::vector<float> pool_gpu(std::vector<float> const& a, std::vector<float> const& g, int64_t groups, int64_t r,
                            int64_t dim, DType md) {
  DevBuf<float> da(a), dg(g), out(groups * dim);
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  Status s = ops::run_on_backend<ops::CompressPool>(
      ctx, ops::CompressPoolDesc{groups, r, dim, md},
      ops::CompressPoolArgs{da.cview<2>({groups * r, dim}), dg.cview<2>({groups * r, dim}), out.view<2>({groups, dim})});
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  return out.host();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_compressor)

BOOST_AUTO_TEST_CASE(random_groups_vs_cpu) {
  uint64_t const seed = test_seed(0xC0);
  struct Shape { int64_t groups, r, dim; };
  for (DType md : {DType::kF32, DType::kBf16})
    for (Shape s : {Shape{7, 2, 300}, Shape{5, 4, 512}, Shape{2, 128, 64}}) {
      auto a = randn(static_cast<size_t>(s.groups * s.r * s.dim), seed + 1);
      auto g = randn(static_cast<size_t>(s.groups * s.r * s.dim), seed + 2, 2.f);
      std::vector<float> cpu = pool_cpu(a, g, s.groups, s.r, s.dim, md), gpu = pool_gpu(a, g, s.groups, s.r, s.dim, md);
      int64_t bad = 0;
      for (int64_t j = 0; j < s.groups; ++j)
        for (int64_t c = 0; c < s.dim; ++c) {
          float mx = -INFINITY;
          for (int64_t i = 0; i < s.r; ++i) mx = std::max(mx, g[(j * s.r + i) * s.dim + c]);
          double den = 0.0, mag = 0.0;
          for (int64_t i = 0; i < s.r; ++i) den += std::exp(static_cast<double>(g[(j * s.r + i) * s.dim + c]) - mx);
          for (int64_t i = 0; i < s.r; ++i) {
            size_t const x = static_cast<size_t>((j * s.r + i) * s.dim + c);
            mag += std::fabs(a[x]) * std::exp(static_cast<double>(g[x]) - mx) / den;
          }
          float const u = cpu[j * s.dim + c], v = gpu[j * s.dim + c];
          double tol = (kPoolUlpsF32 + 2.0 * s.r) * kF32Eps * mag;
          if (md == DType::kBf16) tol += kBf16Eps * (mag + std::fabs(u));
          bad += !(std::fabs(static_cast<double>(u) - v) <= tol);
        }
      BOOST_TEST(bad == 0);
      BOOST_TEST_MESSAGE(dtype_name(md) << " r=" << s.r << ": " << cpu.size() - bit_mismatches(cpu, gpu) << "/"
                                        << cpu.size() << " bit-identical");
    }
}

BOOST_AUTO_TEST_CASE(exact_weights_are_bitwise) {
  uint64_t const seed = test_seed(0xC1);
  for (DType md : {DType::kF32, DType::kBf16})
    for (int64_t r : {2, 4, 8}) {
      int64_t const groups = 6, dim = 200;
      auto a = randn(static_cast<size_t>(groups * r * dim), seed + 1);
      auto gcol = randn(static_cast<size_t>(groups * dim), seed + 2, 3.f);
      std::vector<float> g(static_cast<size_t>(groups * r * dim));
      for (int64_t j = 0; j < groups; ++j)
        for (int64_t i = 0; i < r; ++i)
          for (int64_t c = 0; c < dim; ++c) g[(j * r + i) * dim + c] = gcol[j * dim + c];
      BOOST_TEST(bit_mismatches(pool_cpu(a, g, groups, r, dim, md), pool_gpu(a, g, groups, r, dim, md)) == 0);
    }
}

BOOST_AUTO_TEST_CASE(groups_completing_mid_chunk) {
  uint64_t const seed = test_seed(0xC2);
  int64_t const r = 4, dim = 96, tokens = 45;   // 11 complete groups, one token left in the buffer
  auto a = randn(static_cast<size_t>(tokens * dim), seed + 1);
  auto g = randn(static_cast<size_t>(tokens * dim), seed + 2);
  for (DType md : {DType::kF32, DType::kBf16}) {
    std::vector<float> whole = pool_gpu(std::vector<float>(a.begin(), a.begin() + 44 * dim),
                                        std::vector<float>(g.begin(), g.begin() + 44 * dim), 11, r, dim, md);
    // Chunks of 3, 1, 6, 7, 1, ... tokens: the buffer keeps the leftover rows, complete groups are pooled.
    std::vector<float> buf_a, buf_g, chunked;
    int64_t const sizes[] = {3, 1, 6, 7, 1, 9, 5, 13};
    int64_t t = 0;
    for (int64_t n : sizes) {
      buf_a.insert(buf_a.end(), a.begin() + t * dim, a.begin() + (t + n) * dim);
      buf_g.insert(buf_g.end(), g.begin() + t * dim, g.begin() + (t + n) * dim);
      t += n;
      int64_t const groups = static_cast<int64_t>(buf_a.size()) / dim / r;
      if (groups == 0) continue;
      std::vector<float> ca(buf_a.begin(), buf_a.begin() + groups * r * dim);
      std::vector<float> cg(buf_g.begin(), buf_g.begin() + groups * r * dim);
      std::vector<float> lat = pool_gpu(ca, cg, groups, r, dim, md);
      chunked.insert(chunked.end(), lat.begin(), lat.end());
      buf_a.erase(buf_a.begin(), buf_a.begin() + groups * r * dim);
      buf_g.erase(buf_g.begin(), buf_g.begin() + groups * r * dim);
    }
    BOOST_TEST(t == tokens);
    BOOST_TEST(static_cast<int64_t>(buf_a.size()) == dim);
    BOOST_TEST(bit_mismatches(whole, chunked) == 0);
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments) {
  uint64_t const seed = test_seed(0xC3);
  auto a = randn(64, seed);
  DevBuf<float> da(a), out(16);
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  Status s = ops::run_on_backend<ops::CompressPool>(
      ctx, ops::CompressPoolDesc{4, 1, 16, DType::kF32},
      ops::CompressPoolArgs{da.cview<2>({4, 16}), da.cview<2>({4, 16}), out.view<2>({4, 16})});
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("ratio") != std::string::npos);
  s = ops::run_on_backend<ops::CompressPool>(
      ctx, ops::CompressPoolDesc{1, 4, 16, DType::kF32},
      ops::CompressPoolArgs{TensorView<float const, 2>(a.data(), {4, 16}), da.cview<2>({4, 16}), out.view<2>({1, 16})});
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("compress_pool kv") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

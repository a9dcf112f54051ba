// SPDX-License-Identifier: Apache-2.0
/// ref::dot_tc (tc::BlockAcc, the model of the H200's bf16 tensor-core accumulation) against cuBLAS itself: bf16
/// GEMMs y = x·Wᵀ called as torch's F.linear calls them (cublasGemmEx, op T on W, CUBLAS_COMPUTE_32F, default
/// algorithm), for the shapes of the tiny model's linear layers (prefill rows and single decode rows) and
/// larger ones. bf16 output (what the golden engine's GEMMs produce): every element must equal
/// →bf16(ref::dot_tc); fp32 output (the raw accumulator, when cuBLAS keeps the same kernel family): measured and
/// reported. Inputs: normal(0, 1) bf16 values (the model's regime) and values with exponents spread over
/// 2^±24, where the truncation of the aligned terms bites on most blocks.
#include <boost/test/unit_test.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tessera/core/dtype.hpp"
#include "tessera/ref/common_ref.hpp"

using namespace tessera;

namespace {

std::vector<float> random_bf16(size_t n, std::mt19937& g, int spread) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> e(-spread, spread);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16(spread ? std::ldexp(nd(g), e(g)) : nd(g));
  return v;
}

/// y [M, N] = x [M, K] · W [N, K]ᵀ on the GPU, bf16 inputs; fp32 or bf16 output.
std::vector<float> cublas_linear(cublasHandle_t h, std::vector<float> const& x, std::vector<float> const& w, int M,
                                 int N, int K, bool bf16_out) {
  std::vector<uint16_t> xb(x.size()), wb(w.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_bits_from_float(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wb[i] = bf16_bits_from_float(w[i]);
  void *dx = nullptr, *dw = nullptr, *dy = nullptr;
  size_t const ybytes = static_cast<size_t>(M) * N * (bf16_out ? 2 : 4);
  BOOST_REQUIRE(cudaMalloc(&dx, xb.size() * 2) == cudaSuccess);
  BOOST_REQUIRE(cudaMalloc(&dw, wb.size() * 2) == cudaSuccess);
  BOOST_REQUIRE(cudaMalloc(&dy, ybytes) == cudaSuccess);
  cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice);
  float const alpha = 1.f, beta = 0.f;
  // Column-major: C[N, M] = op(A)[N, K] · B[K, M] with A = W (K × N, transposed), B = x (K × M).
  cublasStatus_t const st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, dw, CUDA_R_16BF, K, dx,
                                         CUDA_R_16BF, K, &beta, dy, bf16_out ? CUDA_R_16BF : CUDA_R_32F, N,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  BOOST_REQUIRE(st == CUBLAS_STATUS_SUCCESS);
  std::vector<float> y(static_cast<size_t>(M) * N);
  if (bf16_out) {
    std::vector<uint16_t> yb(y.size());
    cudaMemcpy(yb.data(), dy, ybytes, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < y.size(); ++i) y[i] = float_from_bf16_bits(yb[i]);
  } else {
    cudaMemcpy(y.data(), dy, ybytes, cudaMemcpyDeviceToHost);
  }
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  return y;
}

struct Count {
  int64_t differ = 0, total = 0;
};

Count compare(cublasHandle_t h, int M, int N, int K, int spread, bool bf16_out, uint32_t seed) {
  std::mt19937 g(seed);
  auto x = random_bf16(static_cast<size_t>(M) * K, g, spread), w = random_bf16(static_cast<size_t>(N) * K, g, spread);
  auto y = cublas_linear(h, x, w, M, N, K, bf16_out);
  Count c;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float want = ref::dot_tc(&x[static_cast<size_t>(m) * K], &w[static_cast<size_t>(n) * K], K);
      if (bf16_out) want = round_to_bf16(want);
      float const got = y[static_cast<size_t>(m) * N + n];
      c.differ += std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(want);
      ++c.total;
    }
  return c;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tensor_core_model)

BOOST_AUTO_TEST_CASE(bf16_gemms_follow_the_block_model) {
  cublasHandle_t h = nullptr;
  BOOST_REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  // (M, N, K): the tiny model's wq_a, wq_b, wkv, wo_b, experts, Engram wkv and LM head, prefill (65 rows) and
  // decode (1 row); then larger GEMMs.
  int const shapes[][3] = {{65, 32, 64}, {65, 256, 32}, {65, 64, 64}, {65, 64, 32}, {65, 320, 192}, {65, 512, 64},
                           {1, 32, 64},  {1, 256, 32},  {1, 64, 64},  {1, 512, 64},  {4, 64, 66},   {257, 1024, 512},
                           {1, 4096, 2048}};
  uint32_t seed = 1;
  for (bool const bf16_out : {true, false})
    for (int const spread : {0, 24})
      for (auto const& s : shapes) {
        Count const c = compare(h, s[0], s[1], s[2], spread, bf16_out, seed++);
        BOOST_TEST_MESSAGE("M " << s[0] << " N " << s[1] << " K " << s[2] << (bf16_out ? " bf16" : " fp32")
                                << " out, exponent spread " << spread << ": " << c.differ << " of " << c.total
                                << " differ from ref::dot_tc");
        if (bf16_out) BOOST_TEST(c.differ == 0, "M " << s[0] << " N " << s[1] << " K " << s[2] << " spread " << spread);
      }
  cublasDestroy(h);
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// The CPU versions of the device math against the GPU itself, bitwise: ref::cuda_expf against CUDA's expf
/// (random fp32 bit patterns with |x| < 110, a dense sweep of the softmax range [−30, 0], the neighbourhood
/// of 0 where the reduced argument turns negative, and the underflow edge); fmath::exp_rn, log1p, log1p_rn
/// device against host; the kernels' sigmoid, SiLU and softplus against ref::sigmoid / silu / softplus, in the
/// fp32 and the bf16 arithmetic; CUDA's own log1pf, sinf and cosf against their libdevice replays
/// (cuda_math, run on the CPU and on the device).
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tessera/core/cuda_math.hpp"
#include "tessera/core/fmath.hpp"
#include "tessera/ops/device_math.hpp"
#include "tessera/ref/common_ref.hpp"

using namespace tessera;

namespace {

std::vector<float> on_device(ops::DeviceMathFn fn, std::vector<float> const& x) {
  std::vector<float> y(x.size());
  auto s = ops::eval_device_math_cuda(fn, x.data(), y.data(), static_cast<int64_t>(x.size()));
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  return y;
}

template <class F>
void expect_bitwise(char const* what, std::vector<float> const& x, std::vector<float> const& got, F&& host) {
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    float const want = host(x[i]);
    if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(got[i]) && !(std::isnan(want) && std::isnan(got[i]))) {
      if (bad < 5)
        BOOST_TEST_MESSAGE(what << " x = " << std::hexfloat << x[i] << ": device " << got[i] << ", host " << want);
      ++bad;
    }
  }
  BOOST_TEST(bad == 0, what << ": " << bad << " of " << x.size() << " differ");
}

std::vector<float> exp_inputs() {
  std::vector<float> x;
  std::mt19937 g(2026);
  while (x.size() < (size_t{1} << 22)) {
    float const v = std::bit_cast<float>(static_cast<uint32_t>(g()));
    if (std::fabs(v) < 110.f) x.push_back(v);
  }
  for (int i = 0; i <= (1 << 21); ++i) x.push_back(-30.f * static_cast<float>(i) / static_cast<float>(1 << 21));
  for (uint32_t b = 0; b < (1u << 20); ++b) {  // |x| in [2^-24, ~2^-24·2^(2^20/2^23)): reduced argument near 0
    x.push_back(std::bit_cast<float>(0x33800000u + b));
    x.push_back(-std::bit_cast<float>(0x33800000u + b));
  }
  for (float v = -104.f; v < -86.f; v = std::nextafter(v, 0.f) + 1e-4f) x.push_back(v);
  return x;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(device_math)

BOOST_AUTO_TEST_CASE(expf_equals_the_cpu_replay) {
  auto const x = exp_inputs();
  expect_bitwise("expf", x, on_device(ops::DeviceMathFn::kExpf, x), [](float v) { return ref::cuda_expf(v); });
}

BOOST_AUTO_TEST_CASE(exp_rn_and_activations_equal_the_cpu) {
  auto const x = exp_inputs();
  expect_bitwise("exp_rn", x, on_device(ops::DeviceMathFn::kExpRn, x), [](float v) { return fmath::exp_rn(v); });
  expect_bitwise("sigmoid", x, on_device(ops::DeviceMathFn::kSigmoid, x), [](float v) { return ref::sigmoid(v); });
  expect_bitwise("silu", x, on_device(ops::DeviceMathFn::kSilu, x), [](float v) { return ref::silu(v); });
  expect_bitwise("softplus", x, on_device(ops::DeviceMathFn::kSoftplus, x), [](float v) { return ref::softplus(v); });
}

BOOST_AUTO_TEST_CASE(log1p_device_equals_host) {
  std::mt19937 g(7);
  std::uniform_real_distribution<float> frac(-0.999f, 1.f), expo(-40.f, 30.f);
  std::vector<float> x;
  for (int i = 0; i < (1 << 21); ++i) {
    x.push_back(frac(g));
    x.push_back(std::exp2(expo(g)));
  }
  expect_bitwise("fmath::log1p", x, on_device(ops::DeviceMathFn::kLog1p, x), [](float v) { return fmath::log1p(v); });
  expect_bitwise("fmath::log1p_rn", x, on_device(ops::DeviceMathFn::kLog1pRn, x), [](float v) { return fmath::log1p_rn(v); });
}

BOOST_AUTO_TEST_CASE(bf16_activations_equal_the_cpu) {
  auto const x = exp_inputs();
  DType const bf16 = DType::kBf16;
  expect_bitwise("sigmoid bf16", x, on_device(ops::DeviceMathFn::kSigmoidBf16, x), [&](float v) { return ref::sigmoid(v, bf16); });
  expect_bitwise("silu bf16", x, on_device(ops::DeviceMathFn::kSiluBf16, x), [&](float v) { return ref::silu(v, bf16); });
  expect_bitwise("softplus bf16", x, on_device(ops::DeviceMathFn::kSoftplusBf16, x),
                 [&](float v) { return ref::softplus(v, bf16); });
}

BOOST_AUTO_TEST_CASE(log1pf_equals_its_libdevice_replay) {
  // CUDA's log1pf (torch's softplus in the golden engine) against cuda_math::log1pf on the CPU and on the device:
  // the softplus inputs expf(x) for x ≤ 20, (−1, 1), tiny values, and random bit patterns above −1.
  std::mt19937 g(17);
  std::vector<float> x;
  for (float v = -30.f; v <= 20.f; v += 1.f / 4096) x.push_back(ref::cuda_expf(v));
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  for (int i = 0; i < (1 << 21); ++i) x.push_back(unit(g));
  for (uint32_t b = 0; b < (1u << 20); ++b) x.push_back(std::bit_cast<float>(0x33000000u + 7 * b));
  while (x.size() < (size_t{1} << 23)) {
    float const v = std::bit_cast<float>(static_cast<uint32_t>(g()));
    if (v > -1.f) x.push_back(v);
  }
  auto const hw = on_device(ops::DeviceMathFn::kLog1pf, x);
  expect_bitwise("log1pf vs cuda_math::log1pf (host)", x, hw, [](float v) { return cuda_math::log1pf(v); });
  expect_bitwise("cuda_math::log1pf device vs host", x, on_device(ops::DeviceMathFn::kReplayLog1pf, x),
                 [](float v) { return cuda_math::log1pf(v); });
}

BOOST_AUTO_TEST_CASE(sinf_cosf_equal_their_libdevice_replay) {
  // CUDA's sinf/cosf (torch.sin/cos of the RoPE angles in the golden engine) against cuda_math on both sides: the
  // RoPE angles pos·inv_freq of every position below 65536 for a spread of frequencies, random |x| < 1e5
  // (Cody–Waite reduction) and random bit patterns (Payne–Hanek above 105615).
  std::mt19937 g(23);
  std::vector<float> x;
  for (int pos = 0; pos < 65536; ++pos)
    for (float f : {1.f, 0.5623413f, 0.31622776f, 0.17782794f, 0.1f, 1e-2f, 1e-3f, 1.3335214e-4f})
      x.push_back(static_cast<float>(pos) * f);
  std::uniform_real_distribution<float> near(-1e5f, 1e5f);
  for (int i = 0; i < (1 << 21); ++i) x.push_back(near(g));
  while (x.size() < (size_t{1} << 23)) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(g())));
  expect_bitwise("sinf vs cuda_math::sinf (host)", x, on_device(ops::DeviceMathFn::kSinf, x),
                 [](float v) { return cuda_math::sinf(v); });
  expect_bitwise("cosf vs cuda_math::cosf (host)", x, on_device(ops::DeviceMathFn::kCosf, x),
                 [](float v) { return cuda_math::cosf(v); });
  expect_bitwise("cuda_math::sinf device vs host", x, on_device(ops::DeviceMathFn::kReplaySinf, x),
                 [](float v) { return cuda_math::sinf(v); });
  expect_bitwise("cuda_math::cosf device vs host", x, on_device(ops::DeviceMathFn::kReplayCosf, x),
                 [](float v) { return cuda_math::cosf(v); });
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// Tensor views, owning tensors, Result/Status and the thread pool's coverage and error propagation.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "tessera/core/compare.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/core/thread_pool.hpp"

using namespace tessera;

BOOST_AUTO_TEST_SUITE(tensor)

BOOST_AUTO_TEST_CASE(view_indexing_and_slicing) {
  std::vector<float> buf(24);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i) + 0.5f;
  TensorView<float, 3> v(buf.data(), {2, 3, 4});
  BOOST_TEST(v.numel() == 24);
  BOOST_TEST(v.is_contiguous());
  BOOST_TEST(v(1, 2, 3) == 23.5f);
  BOOST_TEST(v[1](0, 1) == 13.5f);
  auto s = v.slice(1, 2);
  BOOST_TEST(s.shape[0] == 1);
  BOOST_TEST(s(0, 0, 0) == 12.5f);
  TensorView<float const, 3> c = v;
  BOOST_TEST(c(0, 1, 0) == 4.5f);
}

BOOST_AUTO_TEST_CASE(owning_tensor_and_type_checks) {
  Tensor t = Tensor::from_floats({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  BOOST_TEST(t.nbytes() == 24u);
  auto ok = t.view().as<float, 2>();
  BOOST_REQUIRE(ok.ok());
  BOOST_TEST((*ok)(1, 2) == 6.f);
  auto bad = t.view().as<int32_t, 2>();
  BOOST_TEST(!bad.ok());
  BOOST_TEST(bad.status().message().find("dtype f32") != std::string::npos);
  BOOST_TEST((!t.view().as<float, 3>().ok()));
  BOOST_TEST(!Tensor::empty(DType::kF32, {-1, 2}).ok());
  BOOST_TEST(!Tensor::empty(DType::kF32, {INT64_MAX, 4}).ok());
  auto copy = t.to(Device::kCpu);
  BOOST_REQUIRE(copy.ok());
  BOOST_TEST(copy->data_as<float>()[5] == 6.f);
  BOOST_TEST(copy->data() != t.data());
  if (cuda_device_count() == 0) BOOST_TEST(!Tensor::empty(DType::kF32, {4}, Device::kCuda).ok());
}

BOOST_AUTO_TEST_CASE(thread_pool_covers_every_index_once) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 7, 64, 1000, 4097}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) BOOST_REQUIRE_EQUAL(h.load(), 1);
  }
  BOOST_CHECK_THROW(pool.parallel_for(100, [](int64_t b, int64_t) {
                      if (b > 0) throw std::runtime_error("boom");
                    }),
                    std::runtime_error);
  // Nested calls run inline instead of deadlocking.
  std::atomic<int> total{0};
  pool.parallel_for(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) pool.parallel_for(10, [&](int64_t x, int64_t y) { total += static_cast<int>(y - x); });
  });
  BOOST_TEST(total.load() == 80);
}

BOOST_AUTO_TEST_CASE(compare_metrics) {
  std::vector<float> a = {1.f, 2.f, 3.f}, b = {1.f, 2.f, 3.5f};
  auto s = compare::stats<float, float>(a, b, 0.1, 0.0);
  BOOST_TEST(s.max_abs == 0.5);
  BOOST_TEST(s.argmax_abs == 2u);
  BOOST_TEST(s.num_mismatch == 1u);
  BOOST_TEST((!compare::allclose<float, float>(a, b, 0.1, 0.0)));
  BOOST_TEST((compare::allclose<float, float>(a, b, 0.0, 0.15)));
  BOOST_TEST((compare::first_bitwise_mismatch<float>(a, b) == 2u));
  BOOST_TEST((compare::first_bitwise_mismatch<float>(a, a) == SIZE_MAX));
}

BOOST_AUTO_TEST_CASE(result_and_status) {
  Result<int> r = 5;
  BOOST_TEST(r.ok());
  Result<int> e = malformed("header of x.safetensors is not JSON");
  BOOST_TEST(!e.ok());
  BOOST_TEST(e.status().to_string() == "malformed input: header of x.safetensors is not JSON");
  BOOST_CHECK_THROW(std::move(e).value_or_throw(), Error);
}

BOOST_AUTO_TEST_SUITE_END()

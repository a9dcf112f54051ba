// SPDX-License-Identifier: Apache-2.0
/// The GPU build launches a kernel and the host reads back exactly what it wrote.
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <vector>

#include "tessera/ops/device_smoke.hpp"

BOOST_AUTO_TEST_CASE(write_index_pattern_reads_back) {
  constexpr int64_t n = 1 << 20;  // 4096 blocks of 256: more blocks than SMs, last block full
  std::vector<int32_t> out(n, -1);
  tessera::DeviceInfo info;
  auto s = tessera::ops::write_index_pattern_cuda(out.data(), n, 3, 7, &info);
  BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::printf("device: %s sm_%d, %d SMs, %.1f GiB\n", info.name.c_str(), info.sm, info.num_sms,
              static_cast<double>(info.global_memory) / (1 << 30));
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += out[i] != static_cast<int32_t>(3 * i + 7);
  BOOST_TEST(bad == 0);
  BOOST_TEST(info.sm >= 70);
}

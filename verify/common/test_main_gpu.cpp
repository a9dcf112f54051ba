// SPDX-License-Identifier: Apache-2.0
/// Test main for GPU suites: exits 77 (Meson's "skipped") when no CUDA device is usable, otherwise runs
/// Boost.Test. Header-only Boost.Test, compiled once for every GPU test executable.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/included/unit_test.hpp>

#include <cstdio>

#include "tessera/core/tensor.hpp"

static bool init_unit_test() {
  boost::unit_test::framework::master_test_suite().p_name.value = "tessera_gpu";
  return true;
}

int main(int argc, char* argv[]) {
  if (tessera::cuda_device_count() == 0) {
    std::printf("no CUDA device: GPU suite skipped\n");
    return 77;
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}

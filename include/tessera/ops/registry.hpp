// SPDX-License-Identifier: Apache-2.0
/// What this build of Tessera contains: backends and, per op family, the compiled implementations.
#pragma once

#include <string>

#include "tessera/core/config.hpp"

namespace tessera::ops {

struct BuildInfo {
  std::string version;
  bool with_cuda = false, with_nccl = false, with_pcre2 = false;
};

BuildInfo build_info();

}  // namespace tessera::ops

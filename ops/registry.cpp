// SPDX-License-Identifier: Apache-2.0
/// The list of compiled implementations per op family, built by plain code (no static-initialiser
/// registration, which static libraries drop silently).
#include "tessera/ops/registry.hpp"

namespace tessera::ops {

BuildInfo build_info() {
  BuildInfo b;
  b.version = TESSERA_VERSION;
  b.with_cuda = TESSERA_WITH_CUDA != 0;
  b.with_nccl = TESSERA_WITH_NCCL != 0;
  b.with_pcre2 = TESSERA_WITH_PCRE2 != 0;
  return b;
}

}  // namespace tessera::ops

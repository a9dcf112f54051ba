// SPDX-License-Identifier: Apache-2.0
/// Where the shared fixtures live: $TESSERA_SHARED_DIR, else the build's configured shared/ path
/// (<source>/../shared by default). Fixtures are read in place and never copied into the repository.
#pragma once

#include <cstdlib>
#include <string>

#include "tessera/core/config.hpp"

namespace tessera::verify {

inline std::string shared_dir() {
  if (char const* env = std::getenv("TESSERA_SHARED_DIR")) return env;
  return TESSERA_SHARED_DIR;
}
inline std::string golden_dir() { return shared_dir() + "/golden"; }

}  // namespace tessera::verify

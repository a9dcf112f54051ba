// SPDX-License-Identifier: Apache-2.0
/// Model families known to this build.
#pragma once

#include <string>
#include <vector>

namespace tessera::model {

/// `model_type` values of config.json that Tessera loads.
std::vector<std::string> supported_model_types();

}  // namespace tessera::model

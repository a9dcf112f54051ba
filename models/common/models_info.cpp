// SPDX-License-Identifier: Apache-2.0
/// Names of the model families this build can load.
#include "tessera/models/common/models_info.hpp"

namespace tessera::model {

std::vector<std::string> supported_model_types() { return {"deepseek_v41", "deepseek_v41_text"}; }

}  // namespace tessera::model

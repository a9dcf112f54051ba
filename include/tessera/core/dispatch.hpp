// SPDX-License-Identifier: Apache-2.0
/// Runtime value → template argument over a fixed set of instantiations (replaces macro dispatch).
///   dispatch_value<1, 2, 3, 4>(bits, [&](auto kBits) { return run<decltype(kBits)::value>(...); });
/// Returns kNotSupported (with the value in the message) when `value` is not in the set.
#pragma once

#include <string>
#include <type_traits>

#include "tessera/core/status.hpp"

namespace tessera {

template <auto... kValues, class V, class F>
Status dispatch_value(V value, F&& f) {
  Status s(StatusCode::kNotSupported, "no compiled instantiation for value " + std::to_string(value));
  bool hit = ((value == kValues && ((s = f(std::integral_constant<decltype(kValues), kValues>{})), true)) || ...);
  (void)hit;
  return s;
}

}  // namespace tessera

// SPDX-License-Identifier: Apache-2.0
/// Concepts that pin the shape of op families so backends cannot drift apart.
#pragma once

#include <concepts>

#include "tessera/core/context.hpp"
#include "tessera/core/status.hpp"

namespace tessera {

/// A backend functor of an op family: `static Status run(Desc const&, Args const&, ExecContext&)`.
template <class F, class Desc, class Args>
concept BackendOp = requires(Desc const& d, Args const& a, ExecContext& c) {
  { F::run(d, a, c) } -> std::same_as<Status>;
};

}  // namespace tessera

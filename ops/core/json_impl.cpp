// SPDX-License-Identifier: Apache-2.0
/// Boost.JSON in its header-only form, compiled once for all of Tessera (works where only the Boost
/// headers are installed).
#include <boost/json/src.hpp>

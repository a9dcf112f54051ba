// SPDX-License-Identifier: Apache-2.0
/// Boost.Test in its header-only form, compiled once and linked into every CPU test executable.
#define BOOST_TEST_MODULE tessera
#include <boost/test/included/unit_test.hpp>

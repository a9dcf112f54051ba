// SPDX-License-Identifier: Apache-2.0
/// Build configuration and portability macros shared by host (g++) and device (nvcc) code.
/// Every ABI-affecting macro comes from the generated tessera_build_config.hpp, never from per-target flags.
#pragma once

#include "tessera_build_config.hpp"

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#define TESSERA_DEVICE __device__
#define TESSERA_FORCEINLINE __forceinline__
#else
#define TESSERA_HOST_DEVICE
#define TESSERA_DEVICE
#define TESSERA_FORCEINLINE inline __attribute__((always_inline))
#endif

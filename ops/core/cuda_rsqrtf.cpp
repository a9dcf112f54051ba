// SPDX-License-Identifier: Apache-2.0
/// ref::rsqrt: CUDA's rsqrtf on the CPU. The table (scripts/gen_cuda_rsqrt_table.py, measured on an H200)
/// holds, for each of the 2^24 fp32 values x' in [1, 4), the int8 offset in ulps of rsqrtf(x') from the
/// correctly rounded 1/√x'; it is embedded zlib-compressed (295 KB) and inflated once (16 MiB) on first use.
/// A positive normal x = x'·4^k (x' in [1, 4)) gives rsqrtf(x) = rsqrtf(x')·2^−k exactly.
#include <zlib.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <vector>

#include "tessera/ref/common_ref.hpp"

namespace tessera::data {
extern unsigned char const kCudaRsqrtfSm90[];
extern std::size_t const kCudaRsqrtfSm90_size;
}  // namespace tessera::data

namespace tessera::ref {
namespace {

constexpr size_t kEntries = size_t{1} << 24;

std::vector<int8_t> const& offsets() {
  static std::vector<int8_t> const table = [] {
    std::vector<int8_t> t(kEntries);
    uLongf len = kEntries;
    int const rc = uncompress(reinterpret_cast<Bytef*>(t.data()), &len, data::kCudaRsqrtfSm90,
                              static_cast<uLong>(data::kCudaRsqrtfSm90_size));
    if (rc != Z_OK || len != kEntries) {
      std::fprintf(stderr, "tessera: the embedded CUDA rsqrtf table is corrupt (zlib %d, %lu bytes)\n", rc,
                   static_cast<unsigned long>(len));
      std::abort();
    }
    return t;
  }();
  return table;
}

}  // namespace

float rsqrt(float x) {
  uint32_t const b = std::bit_cast<uint32_t>(x);
  uint32_t const exp_field = b >> 23;  // sign bit included: negative inputs fall outside 1..254
  if (exp_field == 0 || exp_field >= 255) return rsqrt_correctly_rounded(x);
  // x = m·2^e with m in [1, 2); x' = m (e even) or 2m (e odd) lies in [1, 4) and x = x'·4^k.
  int32_t const e = static_cast<int32_t>(exp_field) - 127;
  int32_t const k = e >= 0 ? e / 2 : -((1 - e) / 2);
  uint32_t const xp_bits = (b & 0x007FFFFFu) | (static_cast<uint32_t>(127 + (e - 2 * k)) << 23);
  float const xp = std::bit_cast<float>(xp_bits);
  float const y_exact = rsqrt_correctly_rounded(xp);
  float const y = std::bit_cast<float>(std::bit_cast<uint32_t>(y_exact) +
                                       static_cast<uint32_t>(static_cast<int32_t>(offsets()[xp_bits - 0x3F800000u])));
  return std::ldexp(y, -k);
}

}  // namespace tessera::ref

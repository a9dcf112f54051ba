// SPDX-License-Identifier: Apache-2.0
/// ref::cuda_expf: CUDA's expf on the CPU, bit for bit. CUDA's expf (what torch.exp, softmax, sigmoid, SiLU and
/// softplus call on the GPU) is a short sequence of IEEE fp32 operations around one hardware instruction,
/// ex2.approx.ftz.f32 (MUFU.EX2):
///   t = sat(fma(x, log2(e)/252, ½));  c = fma_rd(t, 252, 2^23 + 2^22 + 1);  j = c − (2^23 + 2^22 + 127)
///   r = fma(x, L_hi, −j);  r = fma(x, L_lo, r)             (L_hi + L_lo = log2(e); j = ⌊x·log2(e)⌋, |j| ≤ 126)
///   expf(x) = ex2(r) · 2^j                                 (2^j from c's low bits shifted into the exponent)
/// This replica matches CUDA's expf on every fp32 input with |x| < 110 on an H200 (scripts/cuda_ex2_measure.cu,
/// checked there). ex2 itself depends on r only through q = trunc(|r|·2^23)·2^-23 and its sign (properties
/// P1–P3 in that file), so the measured grids ex2(±i·2^-23), i < 2^23, determine it. They ship as int8 offsets
/// from the rounded libm exp2 plus verbatim exceptions near rounding midpoints (scripts/gen_cuda_expf_table.py;
/// 0.33 MB zlib, inflated once to 16 MiB on first use).
#include <zlib.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "tessera/ref/common_ref.hpp"

namespace tessera::data {
extern unsigned char const kCudaEx2Sm90[];
extern std::size_t const kCudaEx2Sm90_size;
}  // namespace tessera::data

namespace tessera::ref {
namespace {

constexpr uint32_t kGrid = uint32_t{1} << 23;

struct Ex2Table {
  uint64_t digest = 0;
  std::unordered_map<uint32_t, uint32_t> exceptions;  // sign<<31 | i → ex2 bits
  std::vector<int8_t> offsets;                        // y+ offsets [kGrid], then y- offsets [kGrid]
};

[[noreturn]] void corrupt(char const* why) {
  std::fprintf(stderr, "tessera: the embedded CUDA ex2 table is corrupt (%s)\n", why);
  std::abort();
}

Ex2Table const& table() {
  static Ex2Table const t = [] {
    Ex2Table r;
    uLongf cap = 16 + 4 + 8 * 4096 + 2 * kGrid;
    std::vector<unsigned char> raw(cap);
    int const rc = uncompress(raw.data(), &cap, data::kCudaEx2Sm90, static_cast<uLong>(data::kCudaEx2Sm90_size));
    if (rc != Z_OK) corrupt("zlib");
    if (cap < 20 || std::memcmp(raw.data(), "TSEX2v1", 8) != 0) corrupt("header");
    uint32_t n_exc = 0;
    std::memcpy(&r.digest, raw.data() + 8, 8);
    std::memcpy(&n_exc, raw.data() + 16, 4);
    size_t const body = 20 + size_t{8} * n_exc;
    if (cap != body + 2 * size_t{kGrid}) corrupt("size");
    for (uint32_t e = 0; e < n_exc; ++e) {
      uint32_t kv[2];
      std::memcpy(kv, raw.data() + 20 + size_t{8} * e, 8);
      r.exceptions.emplace(kv[0], kv[1]);
    }
    r.offsets.assign(reinterpret_cast<int8_t const*>(raw.data() + body),
                     reinterpret_cast<int8_t const*>(raw.data() + body) + 2 * size_t{kGrid});
    return r;
  }();
  return t;
}

/// ex2 at the grid point (negative ? −1 : 1)·i·2^-23.
float ex2_grid(bool negative, uint32_t i) {
  Ex2Table const& t = table();
  uint32_t const key = (negative ? 0x80000000u : 0u) | i;
  if (!t.exceptions.empty()) {
    if (auto it = t.exceptions.find(key); it != t.exceptions.end()) return std::bit_cast<float>(it->second);
  }
  double const r = std::ldexp(static_cast<double>(i), -23);
  float const base = static_cast<float>(std::exp2(negative ? -r : r));
  int8_t const off = t.offsets[(negative ? kGrid : 0u) + i];
  return std::bit_cast<float>(std::bit_cast<uint32_t>(base) + static_cast<uint32_t>(static_cast<int32_t>(off)));
}

float flush_subnormal(float y) { return std::fabs(y) < 0x1p-126f ? std::copysign(0.f, y) : y; }

}  // namespace

float cuda_ex2(float r) {
  if (std::isnan(r)) return r;
  if (std::fabs(r) < 0x1p-126f) return 1.f;  // ftz: subnormal inputs count as zero
  if (r >= 128.f) return INFINITY;
  if (r <= -128.f) return 0.f;  // 2^-128 flushes
  float const a = std::fabs(r);
  float const q = std::trunc(a * 0x1p23f) * 0x1p-23f;
  if (r > 0.f) {
    float const n = std::floor(q);
    return std::ldexp(ex2_grid(false, static_cast<uint32_t>((q - n) * 0x1p23f)), static_cast<int>(n));
  }
  if (a < 1.f) return ex2_grid(true, static_cast<uint32_t>(q * 0x1p23f));
  float const n = std::floor(q);
  return flush_subnormal(std::ldexp(ex2_grid(true, static_cast<uint32_t>((q - n) * 0x1p23f)), -static_cast<int>(n)));
}

float cuda_expf(float x) {
  float t = std::fma(x, std::bit_cast<float>(0x3BBB989Du), 0.5f);  // log2(e)/252
  t = t > 0.f ? (t < 1.f ? t : 1.f) : 0.f;                          // cvt.sat (NaN → 0)
  // fma_rd(t, 252, 12582913): t·252 + 12582913 is exact in double and lies in [2^23, 2^24), where fp32 steps by
  // 1, so rounding down is floor.
  float const c = static_cast<float>(std::floor(static_cast<double>(t) * 252.0 + 12582913.0));
  float const j = c - 12583039.f;
  float r = std::fma(x, std::bit_cast<float>(0x3FB8AA3Bu), -j);  // L_hi
  r = std::fma(x, std::bit_cast<float>(0x32A57060u), r);         // L_lo
  float const scale = std::bit_cast<float>(std::bit_cast<uint32_t>(c) << 23);
  return cuda_ex2(r) * scale;
}

uint64_t cuda_ex2_table_digest() { return table().digest; }

uint64_t cuda_ex2_grid_digest() {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int s = 0; s < 2; ++s) {
    for (uint32_t i = 0; i < kGrid; ++i) {
      uint32_t const b = std::bit_cast<uint32_t>(ex2_grid(s == 1, i));
      for (int k = 0; k < 4; ++k) {
        h ^= (b >> (8 * k)) & 0xFFu;
        h *= 0x100000001b3ull;
      }
    }
  }
  return h;
}

}  // namespace tessera::ref

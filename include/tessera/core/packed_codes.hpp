// SPDX-License-Identifier: Apache-2.0
/// Register decodes of packed codes, shared by the CUDA kernels and their host tests: each equals the per-code
/// conversion of dtype.hpp bit for bit (verify/core/dtype_test.cpp checks every input word).
#pragma once

#include <cstdint>
#include <type_traits>

#include "tessera/core/config.hpp"

namespace tessera {

/// Byte select (PTX prmt.b32 in its default mode, CUDA __byte_perm) for selector nibbles 0–7: byte i of the result
/// is byte (s >> 4i) & 7 of the 8 bytes hi:lo (lo = bytes 0–3). Callers never set a nibble's bit 3 (prmt's
/// sign-replicate mode), so the two agree.
TESSERA_HOST_DEVICE constexpr uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t s) {
#if defined(__CUDA_ARCH__)
  if (!std::is_constant_evaluated()) return __byte_perm(lo, hi, s);
#endif
  uint64_t const v = (uint64_t{hi} << 32) | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
}
/// Four e2m1 codes (code i in bits 4i..4i+3 of w, higher bits ignored) as the bf16 bits of their values, two per
/// word, the lower code in the low half: p01 = codes 0, 1; p23 = codes 2, 3. Equal to
/// bf16_bits_from_float(float_from_fp4_e2m1(code)) for every code (−0 for code 8). The magnitude m = code & 7
/// indexes two 8-byte tables held as immediates, bf16(m) = 0000 3F00 3F80 3FC0 4000 4040 4080 40C0 split into low
/// bytes (00 00 80 C0 00 40 80 C0) and high bytes (00 3F 3F 3F 40 40 40 40); the sign selects 0x80 or 0x00 into
/// bit 15. Five byte selects (prmt) and four logic or shift operations, no memory: a shared 256-entry table read by
/// 32 random lanes costs ~3.5 bank wavefronts a read.
TESSERA_HOST_DEVICE constexpr void bf16x2_from_e2m1x4(uint32_t w, uint32_t& p01, uint32_t& p23) {
  uint32_t const mag = w & 0x7777u;
  uint32_t const lo = byte_perm(0xC0800000u, 0xC0804000u, mag);
  uint32_t const hi = byte_perm(0x3F3F3F00u, 0x40404040u, mag) | byte_perm(0x80808080u, 0u, (~w >> 1) & 0x4444u);
  p01 = byte_perm(lo, hi, 0x5140u);
  p23 = byte_perm(lo, hi, 0x7362u);
}
}  // namespace tessera

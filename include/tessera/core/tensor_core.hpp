// SPDX-License-Identifier: Apache-2.0
/// The accumulation of a bf16 × bf16 → fp32 tensor-core GEMM on the H100/H200, written in exact integer and fp64
/// operations so that the CPU references and every CUDA kernel compute it bit for bit alike (ref::dot_tc).
///
/// K is walked in blocks of kBlock = 16 consecutive indices. One block step turns the fp32 accumulator c and the
/// block's products p_i = a_i·b_i (exact) into
///   d = RZ_fp32( T(c) + Σ_i T(p_i) ),
/// where T is the multi-term adder's alignment: every term is truncated toward zero to a multiple of
///   q = 2^(E − 25),  E = max(e_c, max_i e_i),  e_i = ex(a_i) + ex(b_i),  e_c = ex(c),
///   ex(x) = max(⌊log2|x|⌋, −126),
/// over the nonzero terms only (a product with a zero factor, or c = 0, takes no part). The significand of a
/// product lies in [1, 4), so the exponent sum, not the product's own exponent, sets the alignment: 23 + 2
/// fraction bits below 2^E are kept. The truncated terms are added exactly and the sum is rounded toward zero
/// to fp32 once. The GEMM output is then →bf16 (round to nearest even) from the final d.
/// This is the adder model of Khattak & Mikaitis, "Accurate models of NVIDIA tensor cores" (2025; H100 = H200:
/// fma size 16, 2 extra alignment bits, round toward zero). On golden/v41-tiny the bf16 model built on it
/// reproduces every module output of the golden engine's prompt-4 debug forward and the full_logits of prompts
/// 0-5 bit for bit; blocks of 8 or 32 (hundreds of differing module outputs), 24 alignment bits (full_logits
/// differ on 25 argmaxes) or cuBLAS's fp32 order do not. 26 or more bits cannot be told apart from 25 there.
///
/// Exactness: |p_i| < 4·2^(e_i) and |c| < 2·2^(e_c), so each truncated term is m·q with |m| < 2^27 and the 17
/// terms sum to |Σ m| < 2^32 (exact in int64); bf16 × bf16 products are exact in fp64 (16 significant bits) and
/// scaling by a power of two is exact there, so m = trunc(p·2^(25 − E)) is computed exactly.
#pragma once

#include <cstdint>

#include "tessera/core/config.hpp"
#include "tessera/core/fmath.hpp"

#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace tessera::tc {

inline constexpr int kBlock = 16;      // products per multi-term addition
inline constexpr int kAlignBits = 25;  // fraction bits kept below 2^E

/// max(⌊log2|x|⌋, −126) for finite nonzero x: the exponent the adder aligns with (−126 for subnormals).
TESSERA_HOST_DEVICE inline int exponent_of(float x) {
  int const biased = static_cast<int>((fmath::bits_of(x) >> 23) & 0xFFu);
  return biased == 0 ? -126 : biased - 127;
}

/// v rounded toward zero to fp32 (subnormal results included; beyond FLT_MAX it gives ±FLT_MAX).
TESSERA_HOST_DEVICE inline float round_toward_zero(double v) {
#if defined(__CUDA_ARCH__)
  return __double2float_rz(v);
#else
  float f = static_cast<float>(v);  // nearest
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.f);
  return f;
#endif
}

/// Σ a_i·b_i of bf16 values in the tensor-core order above, fed one pair at a time in K order: step() per index
/// (or step_at() with explicit K indices for a sparse row), value() at the end; a partial last block is a block
/// padded with zero products. Block and Align are the adder's two parameters (BlockAcc: the H200's); other
/// values serve the tests. Align ≤ 54 keeps each of at most 65 aligned terms below 2^56 and their sum below 2^63.
template <int Block, int Align>
struct BlockAccT {
  static_assert(Block >= 1 && Block <= 64 && Align >= 1 && Align <= 54);
  float acc = 0.f;
  double prod[Block];
  int prod_exp[Block];
  int n = 0;             // products held for the current block
  int64_t block = 0;     // the current block's index (step_at)
  bool nonfinite = false;

  TESSERA_HOST_DEVICE void step(float a, float b) {
    if (a != 0.f && b != 0.f) {
      prod[n] = static_cast<double>(a) * static_cast<double>(b);
      prod_exp[n] = exponent_of(a) + exponent_of(b);
      if (!(prod[n] - prod[n] == 0.0)) nonfinite = true;  // an ±inf or NaN operand
    } else {
      prod[n] = 0.0;
      prod_exp[n] = INT32_MIN;
    }
    if (++n == Block) flush();
  }

  /// The product at K index k of a sparse row (indices strictly increasing; the absent ones are zero products):
  /// the current block ends where k leaves it.
  TESSERA_HOST_DEVICE void step_at(int64_t k, float a, float b) {
    int64_t const blk = k / Block;
    if (blk != block && n > 0) flush();
    block = blk;
    step(a, b);
  }

  /// One block step: acc ← RZ(T(acc) + Σ_i T(p_i)).
  TESSERA_HOST_DEVICE void flush() {
    if (nonfinite) {  // ±inf / NaN propagate as in IEEE arithmetic; no finite rounding is left to model
      double s = acc;
      for (int i = 0; i < n; ++i) s += prod[i];
      acc = static_cast<float>(s);
      n = 0;
      return;
    }
    int emax = acc != 0.f ? exponent_of(acc) : INT32_MIN;
    for (int i = 0; i < n; ++i) emax = prod_exp[i] > emax ? prod_exp[i] : emax;
    int const count = n;
    n = 0;
    if (emax == INT32_MIN) return;  // acc and every product zero
    double const up = fmath::pow2_f64(Align - emax);  // 1/q
    auto aligned = [up](double t) {                   // sign(t)·trunc(|t|/q), exact
      double const m = t * up;
      return m < 0 ? -static_cast<int64_t>(-m) : static_cast<int64_t>(m);
    };
    int64_t sum = acc != 0.f ? aligned(static_cast<double>(acc)) : 0;
    for (int i = 0; i < count; ++i)
      if (prod[i] != 0.0) sum += aligned(prod[i]);
    if (sum == 0) {
      acc = 0.f;
      return;
    }
    // |Σ m| cut toward zero to 24 significant bits (exact in fp64 from there), scaled by q, then onto the fp32
    // grid toward zero (which only cuts further in the subnormal range).
    uint64_t mag = sum < 0 ? static_cast<uint64_t>(-sum) : static_cast<uint64_t>(sum);
    int bits = 0;
    for (uint64_t t = mag; t; t >>= 1) ++bits;
    if (bits > 24) mag &= ~((uint64_t{1} << (bits - 24)) - 1);
    double const v = static_cast<double>(mag) * fmath::pow2_f64(emax - Align);
    acc = round_toward_zero(sum < 0 ? -v : v);
  }

  TESSERA_HOST_DEVICE float value() {
    if (n) flush();
    return acc;
  }
};

using BlockAcc = BlockAccT<kBlock, kAlignBits>;

}  // namespace tessera::tc

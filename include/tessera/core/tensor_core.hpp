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

/// v rounded toward zero to fp32 (subnormal results included; beyond FLT_MAX it gives ±FLT_MAX: IEEE RZ; the
/// adder itself differs at both ends, see block_finish).
TESSERA_HOST_DEVICE inline float round_toward_zero(double v) {
#if defined(__CUDA_ARCH__)
  return __double2float_rz(v);
#else
  float f = static_cast<float>(v);  // nearest
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.f);
  return f;
#endif
}

/// The pieces of one block step, shared by BlockAccT below and the CUDA kernels that split a block over lanes or
/// run it in two passes over operands they can read twice (kernels/common/cuda_util.cuh): whoever evaluates a
/// step from these gets the same fp32 result, because the only additions between rounding points are sums of
/// exact integers (the aligned terms), which any order or grouping gives exactly.

/// The exponent a term of zero value carries: it takes no part in E.
inline constexpr int kNoExponent = INT32_MIN;

/// The exponent sum ex(a) + ex(b) that aligns the product a·b; kNoExponent when a factor is zero (such a product
/// takes no part, even against an ±inf or NaN factor).
TESSERA_HOST_DEVICE inline int product_exponent(float a, float b) {
  return (a != 0.f && b != 0.f) ? exponent_of(a) + exponent_of(b) : kNoExponent;
}

/// The product a·b as a term: exact in fp64 for fp32 factors (at most 48 significant bits, exponents within
/// fp64's range); 0 when a factor is zero.
TESSERA_HOST_DEVICE inline double product_term(float a, float b) {
  return (a != 0.f && b != 0.f) ? static_cast<double>(a) * static_cast<double>(b) : 0.0;
}

/// true for an ±inf or NaN term: then the step leaves the finite model (see block_nonfinite).
TESSERA_HOST_DEVICE inline bool term_nonfinite(double t) { return !(t - t == 0.0); }

/// term_nonfinite(product_term(a, b)) without the product: both factors nonzero and one of them ±inf or NaN
/// (a product of finite fp32 values is finite in fp64).
TESSERA_HOST_DEVICE inline bool product_nonfinite(float a, float b) {
  auto nonfinite = [](float v) { return ((fmath::bits_of(v) >> 23) & 0xFFu) == 0xFFu; };
  return a != 0.f && b != 0.f && (nonfinite(a) || nonfinite(b));
}

/// E of a step: max(ex(acc), the block's largest product exponent emax_products); kNoExponent when acc and every
/// product are zero (the step then leaves acc as it is).
TESSERA_HOST_DEVICE inline int block_exponent(float acc, int emax_products) {
  int const ea = acc != 0.f ? exponent_of(acc) : kNoExponent;
  return ea > emax_products ? ea : emax_products;
}

/// sign(t)·trunc(|t|·2^(Align − E)): the term t (a product_term, or the accumulator) on the grid q = 2^(E − Align),
/// in units of q. Exact: t·2^(Align − E) is t scaled by a power of two, and |t| < 4·2^E keeps it below 2^(Align+2).
template <int Align = kAlignBits>
TESSERA_HOST_DEVICE inline int64_t aligned_term(double t, int E) {
  double const m = t * fmath::pow2_f64(Align - E);
  return m < 0 ? -static_cast<int64_t>(-m) : static_cast<int64_t>(m);
}

/// The end of a step: acc ← RZ_fp32(T(acc) + products), products = Σ_i aligned_term(p_i, E) over the block (in any
/// order: an exact integer sum), E = block_exponent(acc, ·). E = kNoExponent leaves acc; a zero sum gives +0.
/// |Σ m| is cut toward zero to 24 significant bits (exact in fp64 from there), scaled by q, then put onto the
/// fp32 grid toward zero (which only cuts further in the subnormal range).
template <int Align = kAlignBits>
TESSERA_HOST_DEVICE inline float block_finish(float acc, int64_t products, int E) {
  if (E == kNoExponent) return acc;
  int64_t const sum = products + (acc != 0.f ? aligned_term<Align>(static_cast<double>(acc), E) : 0);
  if (sum == 0) return 0.f;
  uint64_t mag = sum < 0 ? static_cast<uint64_t>(-sum) : static_cast<uint64_t>(sum);
  int bits = 0;
  for (uint64_t t = mag; t; t >>= 1) ++bits;
  if (bits > 24) mag &= ~((uint64_t{1} << (bits - 24)) - 1);
  double const v = static_cast<double>(mag) * fmath::pow2_f64(E - Align);
  // The two ends of the fp32 range, as the H200's mma.sync gives them (verify_gpu_linear_tc, categories
  // subnormal_only and overflow): a nonzero sum below the smallest fp32 subnormal comes out +0 whatever its
  // sign, and one at or beyond 2^128 comes out ±inf, where IEEE round-toward-zero would give −0 and ±FLT_MAX.
  if (v >= 0x1p128) return fmath::float_of(sum < 0 ? 0xFF800000u : 0x7F800000u);
  float const r = round_toward_zero(sum < 0 ? -v : v);
  return r == 0.f ? 0.f : r;
}

/// A step that meets an ±inf or NaN product, or an accumulator already ±inf or NaN (which only such a product can
/// have made: finite steps round toward zero and stay finite): no finite rounding is left to model, and IEEE
/// arithmetic propagates them: acc ← fp32(acc + t_0 + t_1 + …) in fp64, in K order.
TESSERA_HOST_DEVICE inline bool block_nonfinite(float acc, bool any_nonfinite_product) {
  return any_nonfinite_product || !(acc - acc == 0.f);
}

/// One block step from operands the caller can read twice (a(i), b(i) for i < len ≤ Block, K order): a first
/// pass finds E, a second adds the aligned terms. The same arithmetic as BlockAccT::flush without holding the
/// products, for kernels where a thread carries many outputs at once.
template <int Align = kAlignBits, class A, class B>
TESSERA_HOST_DEVICE inline float block_step(float acc, int len, A&& a, B&& b) {
  int emax = kNoExponent;
  bool nonfinite = false;
  for (int i = 0; i < len; ++i) {
    float const x = a(i), y = b(i);
    int const e = product_exponent(x, y);
    emax = e > emax ? e : emax;
    nonfinite = nonfinite || product_nonfinite(x, y);
  }
  if (block_nonfinite(acc, nonfinite)) {
    double s = acc;
    for (int i = 0; i < len; ++i) s += product_term(a(i), b(i));
    return static_cast<float>(s);
  }
  int const E = block_exponent(acc, emax);
  if (E == kNoExponent) return acc;
  int64_t sum = 0;
  for (int i = 0; i < len; ++i) sum += aligned_term<Align>(product_term(a(i), b(i)), E);
  return block_finish<Align>(acc, sum, E);
}

/// Σ a_i·b_i of bf16 values in the tensor-core order above, fed one pair at a time in K order: step() per index
/// (or step_at() with explicit K indices for a sparse row), value() at the end; a partial last block is a block
/// padded with zero products (a block of zero products leaves acc exactly as it is: acc is a whole number of
/// grid steps on its own grid). Block and Align are the adder's two parameters (BlockAcc: the H200's); other
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
    prod[n] = product_term(a, b);
    prod_exp[n] = product_exponent(a, b);
    if (term_nonfinite(prod[n])) nonfinite = true;  // an ±inf or NaN operand
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
    int const count = n;
    n = 0;
    if (block_nonfinite(acc, nonfinite)) {
      double s = acc;
      for (int i = 0; i < count; ++i) s += prod[i];
      acc = static_cast<float>(s);
      return;
    }
    int emax = kNoExponent;
    for (int i = 0; i < count; ++i) emax = prod_exp[i] > emax ? prod_exp[i] : emax;
    int const E = block_exponent(acc, emax);
    if (E == kNoExponent) return;  // acc and every product zero
    int64_t sum = 0;
    for (int i = 0; i < count; ++i) sum += aligned_term<Align>(prod[i], E);
    acc = block_finish<Align>(acc, sum, E);
  }

  TESSERA_HOST_DEVICE float value() {
    if (n) flush();
    return acc;
  }
};

using BlockAcc = BlockAccT<kBlock, kAlignBits>;

}  // namespace tessera::tc

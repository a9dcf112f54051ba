// SPDX-License-Identifier: Apache-2.0
/// ref::dot_tc (tc::BlockAcc, the H200 tensor-core accumulation of bf16 GEMMs) against an independent, integer-only
/// formulation of the same adder (significands and exponents taken apart bit by bit, terms shifted onto the grid
/// 2^(E − 25) of the block's largest exponent sum, summed in 128-bit integers, the result cut to 24 bits and
/// assembled into fp32 bits by hand), on random bf16 vectors with wide exponent spreads, zeros, subnormals and
/// both signs; and hand-derived cases for each rule: truncation of the aligned terms (not exact addition), the
/// exponent sum (not the product's own exponent) setting the alignment, rounding toward zero, blocks of 16. Also
/// the two shapes in which the CUDA kernels evaluate the same steps (two passes per block, tc::block_step; one
/// product per lane with an int32 shuffle-tree sum, as warp_dot_row_tc), against ref::dot_tc.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tessera/ref/common_ref.hpp"

using namespace tessera;

namespace {

struct Parts {
  uint64_t sig = 0;  // integer significand (24 bits for normals)
  int e = 0;         // value = sig · 2^e
  int ex = 0;        // the adder's exponent: max(⌊log2|x|⌋, −126)
  bool neg = false;
};
Parts parts(float x) {
  uint32_t const b = std::bit_cast<uint32_t>(x);
  Parts p;
  p.neg = (b >> 31) != 0;
  uint32_t const biased = (b >> 23) & 0xFF, frac = b & 0x7FFFFF;
  p.sig = biased ? (frac | 0x800000u) : frac;
  p.e = (biased ? static_cast<int>(biased) : 1) - 127 - 23;
  p.ex = biased ? static_cast<int>(biased) - 127 : -126;
  return p;
}

/// fp32 bits of ±S·2^k rounded toward zero (S ≥ 0, 128-bit), with the adder's two ends as measured on the H200:
/// a value at or beyond 2^128 gives ±inf, one that truncates to zero gives +0.
float assemble_rz(unsigned __int128 s, int k, bool neg) {
  if (s == 0) return 0.f;
  int msb = 127;
  while (!((s >> msb) & 1)) --msb;
  int exp = msb + k;  // value in [2^exp, 2^(exp+1))
  uint32_t bits;
  if (exp >= -126) {
    int const drop = msb - 23;  // keep 24 bits
    uint64_t const m = static_cast<uint64_t>(drop >= 0 ? s >> drop : s << -drop);
    if (exp > 127) return neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    bits = (static_cast<uint32_t>(exp + 127) << 23) | (static_cast<uint32_t>(m) & 0x7FFFFF);
  } else {
    int const shift = -149 - k;  // the subnormal quantum 2^-149
    unsigned __int128 const m = shift >= 0 ? (shift >= 128 ? 0 : s >> shift) : s << -shift;
    bits = static_cast<uint32_t>(m);
    if (bits == 0) return 0.f;
  }
  if (neg) bits |= 0x80000000u;
  return std::bit_cast<float>(bits);
}

/// One block step of the adder, formulated on integer significands.
float block_step_int(float c, float const* a, float const* b, int n) {
  if (!std::isfinite(c)) {  // an overflowed accumulator (±inf) only meets finite products here: IEEE keeps it
    double s = c;
    for (int i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
    return static_cast<float>(s);
  }
  std::vector<Parts> pa, pb;
  int emax = INT32_MIN;
  for (int i = 0; i < n; ++i) {
    if (a[i] == 0.f || b[i] == 0.f) continue;
    pa.push_back(parts(a[i]));
    pb.push_back(parts(b[i]));
    emax = std::max(emax, pa.back().ex + pb.back().ex);
  }
  Parts const pc = parts(c);
  if (c != 0.f) emax = std::max(emax, pc.ex);
  if (emax == INT32_MIN) return 0.f;
  int const grid = emax - 25;  // every term becomes a whole multiple of 2^grid, truncated toward zero
  auto on_grid = [grid](unsigned __int128 sig, int e) -> __int128 {
    int const sh = e - grid;
    if (sh >= 0) return static_cast<__int128>(sig << sh);
    return sh <= -127 ? 0 : static_cast<__int128>(sig >> -sh);
  };
  __int128 sum = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    __int128 const t = on_grid(static_cast<unsigned __int128>(pa[i].sig) * pb[i].sig, pa[i].e + pb[i].e);
    sum += (pa[i].neg != pb[i].neg) ? -t : t;
  }
  if (c != 0.f) {
    __int128 const t = on_grid(pc.sig, pc.e);
    sum += pc.neg ? -t : t;
  }
  bool const neg = sum < 0;
  return assemble_rz(static_cast<unsigned __int128>(neg ? -sum : sum), grid, neg);
}

float dot_int(std::vector<float> const& a, std::vector<float> const& b) {
  float acc = 0.f;
  for (size_t k = 0; k < a.size(); k += 16) {
    int const n = static_cast<int>(std::min<size_t>(16, a.size() - k));
    acc = block_step_int(acc, &a[k], &b[k], n);
  }
  return acc;
}

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

/// bf16 values with exponents spread over 2^-spread … 2^spread, some zeros, some subnormal bf16 values.
std::vector<float> random_bf16(size_t n, std::mt19937& g, int spread) {
  std::uniform_real_distribution<float> m(1.f, 2.f);
  std::uniform_int_distribution<int> e(-spread, spread), kind(0, 19), sign(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) {
    int const k = kind(g);
    if (k == 0) x = 0.f;
    else if (k == 1) x = std::ldexp(m(g), -130);  // subnormal in bf16 and fp32
    else x = std::ldexp(m(g), e(g));
    if (sign(g)) x = -x;
    x = round_to_bf16(x);
  }
  return v;
}

/// Equal bits, or both NaN (the NaN a fp64 → fp32 conversion produces is the platform's, not the model's).
bool same(float x, float y) { return bits(x) == bits(y) || (std::isnan(x) && std::isnan(y)); }

/// ref::dot_tc as the two-pass form the CUDA tile kernels use: tc::block_step on each 16-wide block, the last
/// one padded with zero operands to 16 when `pad`.
float dot_two_pass(std::vector<float> const& a, std::vector<float> const& b, bool pad) {
  float acc = 0.f;
  int64_t const n = static_cast<int64_t>(a.size());
  for (int64_t k0 = 0; k0 < n; k0 += tc::kBlock) {
    int const len = static_cast<int>(std::min<int64_t>(tc::kBlock, n - k0));
    acc = tc::block_step(acc, pad ? tc::kBlock : len, [&](int i) { return i < len ? a[k0 + i] : 0.f; },
                         [&](int i) { return i < len ? b[k0 + i] : 0.f; });
  }
  return acc;
}

/// ref::dot_tc as the warp-per-output CUDA kernels split it (warp_dot_row_tc / warp_tc_block_pair): 32-wide
/// steps, lane l holding the product of index k0 + l (zero past n), each half-warp's block run in turn with its
/// 16 aligned terms summed as int32 in the xor-shuffle tree's order; a step whose second half holds no index
/// runs one block only. Records the largest |Σ| of a block's terms in max_sum.
float dot_lane_split(std::vector<float> const& a, std::vector<float> const& b, int64_t& max_sum) {
  int64_t const n = static_cast<int64_t>(a.size());
  float acc = 0.f;
  for (int64_t kb = 0; kb < n; kb += 32) {
    double p[32];
    int e[32];
    bool nf[32];
    for (int l = 0; l < 32; ++l) {
      float const x = kb + l < n ? a[kb + l] : 0.f, y = kb + l < n ? b[kb + l] : 0.f;
      p[l] = tc::product_term(x, y);
      e[l] = tc::product_exponent(x, y);
      nf[l] = tc::term_nonfinite(p[l]);
    }
    int const halves = n - kb > 16 ? 2 : 1;
    for (int half = 0; half < halves; ++half) {
      bool any_nf = false;
      int emax = tc::kNoExponent;
      for (int l = 16 * half; l < 16 * half + 16; ++l) {
        any_nf = any_nf || nf[l];
        emax = std::max(emax, e[l]);
      }
      if (tc::block_nonfinite(acc, any_nf)) {
        double s = acc;
        for (int l = 16 * half; l < 16 * half + 16; ++l) s += p[l];
        acc = static_cast<float>(s);
        continue;
      }
      int const E = tc::block_exponent(acc, emax);
      if (E == tc::kNoExponent) continue;
      int32_t t[32];
      for (int l = 0; l < 32; ++l) t[l] = l / 16 == half ? static_cast<int32_t>(tc::aligned_term(p[l], E)) : 0;
      for (int h = 16; h > 0; h /= 2) {  // __shfl_xor_sync: every lane adds its partner's value
        int32_t u[32];
        for (int l = 0; l < 32; ++l) u[l] = t[l] + t[l ^ h];
        std::copy(u, u + 32, t);
      }
      int64_t exact = 0;
      for (int l = 16 * half; l < 16 * half + 16; ++l) exact += tc::aligned_term(p[l], E);
      BOOST_TEST(t[0] == exact);  // the int32 tree loses nothing
      max_sum = std::max<int64_t>(max_sum, exact < 0 ? -exact : exact);
      acc = tc::block_finish(acc, t[0], E);
    }
  }
  return acc;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tensor_core_order)

BOOST_AUTO_TEST_CASE(matches_the_integer_formulation) {
  std::mt19937 g(7);
  int64_t compared = 0;
  for (int spread : {0, 3, 12, 40, 120})
    for (size_t n : {1, 2, 15, 16, 17, 31, 32, 33, 64, 100, 256})
      for (int rep = 0; rep < 40; ++rep) {
        auto a = random_bf16(n, g, spread), b = random_bf16(n, g, spread);
        float const want = dot_int(a, b);
        float const got = ref::dot_tc(a.data(), b.data(), static_cast<int64_t>(n));
        BOOST_TEST(bits(got) == bits(want), "n " << n << " spread " << spread << ": " << got << " vs " << want);
        ++compared;
      }
  BOOST_TEST(compared == 5 * 11 * 40);
}

BOOST_AUTO_TEST_CASE(aligned_terms_are_truncated_not_added_exactly) {
  // 1 − 2^-26: the small term is −½ of the grid step 2^-25 and is truncated to 0, so the block gives 1.
  // An exact sum rounded toward zero would give 1 − 2^-24, and round-to-nearest 1.
  std::vector<float> a{1.f, -std::ldexp(1.f, -26)}, b{1.f, 1.f};
  BOOST_TEST(ref::dot_tc(a.data(), b.data(), 2) == 1.f);
  BOOST_TEST(dot_int(a, b) == 1.f);
}

BOOST_AUTO_TEST_CASE(the_exponent_sum_sets_the_grid) {
  // 1.5·1.5 = 2.25 has exponent sum 0 (not its own exponent 1), so the grid is 2^-25 and −2^-25 survives:
  // 2.25 − 2^-25 rounds toward zero to 2.25 − 2^-22. A grid from the product's own exponent (2^-24) would drop
  // the term and give 2.25.
  std::vector<float> a{1.5f, -std::ldexp(1.f, -25)}, b{1.5f, 1.f};
  float const want = std::nextafter(2.25f, 0.f);
  BOOST_TEST(ref::dot_tc(a.data(), b.data(), 2) == want);
  BOOST_TEST(dot_int(a, b) == want);
}

BOOST_AUTO_TEST_CASE(the_block_sum_rounds_toward_zero) {
  // 1 + 3·2^-25 is ¾ of an ulp above 1: round-to-nearest would give 1 + 2^-23, the adder gives 1; negated, −1.
  std::vector<float> a{1.f, 3.f * std::ldexp(1.f, -25)}, b{1.f, 1.f};
  BOOST_TEST(ref::dot_tc(a.data(), b.data(), 2) == 1.f);
  std::vector<float> an{-1.f, -3.f * std::ldexp(1.f, -25)};
  BOOST_TEST(ref::dot_tc(an.data(), b.data(), 2) == -1.f);
}

BOOST_AUTO_TEST_CASE(the_ends_of_the_range_follow_the_hardware) {
  // Measured on the H200 (verify_gpu_linear_tc, mma.sync m16n8k16): a negative block sum below the smallest fp32
  // subnormal gives +0, not IEEE RZ's −0; a sum at or beyond 2^128 gives ±inf, not ±FLT_MAX.
  float const tiny = std::ldexp(1.f, -80);  // tiny·tiny = 2^-160 < 2^-149
  std::vector<float> a{-tiny, -tiny}, b{tiny, tiny};
  BOOST_TEST(bits(ref::dot_tc(a.data(), b.data(), 2)) == 0u);
  BOOST_TEST(bits(dot_int(a, b)) == 0u);
  float const big = std::ldexp(1.f, 64);  // big·big = 2^128, two of them 2^129
  std::vector<float> p{big, big}, n{-big, -big}, q{big, big};
  BOOST_TEST(bits(ref::dot_tc(p.data(), q.data(), 2)) == 0x7F800000u);
  BOOST_TEST(bits(ref::dot_tc(n.data(), q.data(), 2)) == 0xFF800000u);
  BOOST_TEST(bits(dot_int(p, q)) == 0x7F800000u);
  // Just below 2^128 stays finite: (2 − 2^-7)·2^63 squared is below FLT_MAX·(1 + 2^-24).
  float const under = std::ldexp(255.f / 128.f, 63);
  std::vector<float> u{under}, v{under};
  BOOST_TEST(std::isfinite(ref::dot_tc(u.data(), v.data(), 1)));
}

BOOST_AUTO_TEST_CASE(blocks_of_sixteen) {
  // Fifteen products 2^-26 and one 1.0 in one block: the grid is 2^-25, each 2^-26 is half a step and is cut
  // to 0, the block gives 1. Sixteen products 2^-26 in block 0 and 1.0 in block 1: block 0 sums exactly to
  // 2^-22, which is a whole number of steps on block 1's grid, so the result is 1 + 2^-22.
  std::vector<float> small(16, std::ldexp(1.f, -26)), ones(17, 1.f);
  std::vector<float> same_block(small);
  same_block[15] = 1.f;  // 15 small products and 1.0 share block 0
  BOOST_TEST(ref::dot_tc(same_block.data(), ones.data(), 16) == 1.f);
  std::vector<float> next_block(small);
  next_block.push_back(1.f);  // block 0: sixteen 2^-26; block 1: 1.0
  BOOST_TEST(ref::dot_tc(next_block.data(), ones.data(), 17) == 1.f + std::ldexp(1.f, -22));
  BOOST_TEST(dot_int(next_block, ones) == 1.f + std::ldexp(1.f, -22));
}

BOOST_AUTO_TEST_CASE(sparse_steps_follow_their_column_blocks) {
  // step_at(k, …) over a sparse row equals the dense dot with zero products at the absent indices.
  std::mt19937 g(11);
  for (int rep = 0; rep < 200; ++rep) {
    auto a = random_bf16(70, g, 20), b = random_bf16(70, g, 20);
    std::vector<float> dense_a(70, 0.f);
    tc::BlockAcc sparse;
    for (int k = 0; k < 70; ++k)
      if ((k * 7 + rep) % 3 != 0) {
        dense_a[k] = a[k];
        sparse.step_at(k, a[k], b[k]);
      }
    BOOST_TEST(bits(sparse.value()) == bits(ref::dot_tc(dense_a.data(), b.data(), 70)));
  }
}

BOOST_AUTO_TEST_CASE(gemm_order_follows_the_output_dtype) {
  std::mt19937 g(3);
  auto a = random_bf16(64, g, 4), b = random_bf16(64, g, 4);
  BOOST_TEST(bits(ref::gemm_dot(a.data(), b.data(), 64, DType::kBf16)) == bits(ref::dot_tc(a.data(), b.data(), 64)));
  BOOST_TEST(bits(ref::gemm_dot(a.data(), b.data(), 64, DType::kF32)) == bits(ref::dot(a.data(), b.data(), 64)));
  BOOST_TEST(bits(ref::bmm_dot(a.data(), b.data(), 64, DType::kBf16)) == bits(ref::dot_tc(a.data(), b.data(), 64)));
  BOOST_TEST(bits(ref::bmm_dot(a.data(), b.data(), 64, DType::kF32)) ==
             bits(ref::dot_fma_seq(a.data(), b.data(), 64)));
}

BOOST_AUTO_TEST_CASE(the_kernel_formulations_equal_block_acc) {
  // The CUDA kernels evaluate each block step from tc's pieces in two other shapes: two passes over operands
  // read twice (tc::block_step: tile kernels, the SIMT GEMM, q·k, fma_chain) and one product per lane with the
  // block's terms summed as int32 by shuffles (warp_dot_row_tc). Both must be ref::dot_tc bit for bit,
  // including partial last blocks, steps with an empty second half, zeros, subnormals and wide exponent spreads.
  std::mt19937 g(29);
  int64_t compared = 0, max_sum = 0;
  for (int spread : {0, 3, 12, 40, 120})
    for (size_t n : {1, 15, 16, 17, 31, 32, 33, 40, 48, 64, 100, 255, 256, 1000})
      for (int rep = 0; rep < 25; ++rep) {
        auto a = random_bf16(n, g, spread), b = random_bf16(n, g, spread);
        float const want = ref::dot_tc(a.data(), b.data(), static_cast<int64_t>(n));
        BOOST_TEST(bits(dot_two_pass(a, b, false)) == bits(want), "two-pass n " << n << " spread " << spread);
        BOOST_TEST(bits(dot_two_pass(a, b, true)) == bits(want), "padded two-pass n " << n << " spread " << spread);
        BOOST_TEST(bits(dot_lane_split(a, b, max_sum)) == bits(want), "lane split n " << n << " spread " << spread);
        ++compared;
      }
  BOOST_TEST(compared == 5 * 14 * 25);
  BOOST_TEST(max_sum < (int64_t{1} << 31));  // the bound that lets the shuffle tree run in int32
  BOOST_TEST_MESSAGE("largest |sum of a block's aligned terms|: " << max_sum);
}

BOOST_AUTO_TEST_CASE(a_block_of_zero_products_leaves_the_accumulator) {
  // Padding a partial block (or running a block with no K index) with zero products changes nothing: acc is a
  // whole number of grid steps on its own grid 2^(ex(acc) − 25) (24 significant bits), and the cut to 24 bits
  // keeps it. Normal and subnormal accumulators of both signs.
  std::mt19937 g(5);
  std::uniform_real_distribution<float> m(1.f, 2.f);
  std::uniform_int_distribution<int> e(-149, 127);
  float const zeros[16] = {};
  for (int rep = 0; rep < 20000; ++rep) {
    float acc = std::ldexp(m(g), e(g));
    if (rep % 2) acc = -acc;
    if (!std::isfinite(acc) || acc == 0.f) continue;
    float const got = tc::block_step(acc, tc::kBlock, [&](int i) { return zeros[i]; }, [&](int i) { return zeros[i]; });
    BOOST_TEST(bits(got) == bits(acc), acc);
  }
}

BOOST_AUTO_TEST_CASE(non_finite_operands_propagate_alike) {
  // ±inf and NaN operands: BlockAcc leaves the finite model from that block on (fp64 sum in K order); the
  // two-pass and lane-split forms must give the same class of result (the same ±inf, or NaN), and a zero factor
  // against ±inf or NaN still takes no part.
  std::mt19937 g(13);
  float const specials[] = {INFINITY, -INFINITY, NAN};
  std::uniform_int_distribution<int> pick(0, 2);
  for (size_t n : {5, 16, 40, 100})
    for (int rep = 0; rep < 60; ++rep) {
      auto a = random_bf16(n, g, 8), b = random_bf16(n, g, 8);
      std::uniform_int_distribution<size_t> at(0, n - 1);
      int const count = 1 + rep % 3;
      for (int c = 0; c < count; ++c) (rep % 2 ? a : b)[at(g)] = specials[pick(g)];
      if (rep % 5 == 0) { size_t const k = at(g); a[k] = INFINITY; b[k] = 0.f; }  // 0·inf: no part
      int64_t max_sum = 0;
      float const want = ref::dot_tc(a.data(), b.data(), static_cast<int64_t>(n));
      BOOST_TEST(same(dot_two_pass(a, b, false), want));
      BOOST_TEST(same(dot_two_pass(a, b, true), want));
      BOOST_TEST(same(dot_lane_split(a, b, max_sum), want));
    }
  std::vector<float> a{1.f, INFINITY, 2.f}, b{1.f, 0.f, 3.f};  // the zero factor hides the inf
  BOOST_TEST(ref::dot_tc(a.data(), b.data(), 3) == 7.f);
  BOOST_TEST(dot_two_pass(a, b, true) == 7.f);
}

BOOST_AUTO_TEST_SUITE_END()

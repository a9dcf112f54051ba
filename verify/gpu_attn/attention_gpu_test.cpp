// SPDX-License-Identifier: Apache-2.0
/// Attention<Backend::kCuda> against Attention<Backend::kCpu> (ref/attention_ref.hpp) on seeded random
/// key sets built the way the model builds them (window entries in position order, then the selected
/// compressed entries in entry order; prompts longer than the window; decode and prefill rows):
///   * fp32 and bf16 within the named tolerances below (the only non-exact step is expf);
///   * with scale 0 and a sink of −200 every exp argument is 0 or under the underflow bound, so expf is
///     exact and the probabilities and outputs must equal the CPU bit for bit (the accumulation order);
///   * empty visible sets and fully masked rows (the sink takes all the mass) give exact zeros;
///   * rows over the 2048-key tile take the multi-pass path and still match;
///   * a row's bits do not depend on the batch or the chunk split;
///   * bad arguments give errors, a bad key id poisons only its row;
///   * bf16 on the tensor cores (AttentionDesc::max_row_keys ≤ 1024, attention_tc.cuh) equals the CUDA-core
///     kernel bit for bit (outputs and probabilities) in each variant (16 or 32 heads per block, keys read as fp32
///     or from a bf16 copy), every case above and
///     sparse logit-row columns (key_cols) at head_dim 64–512, 3–64 heads and rows of up to 1024 keys; a row over
///     its bound or with columns that do not increase is poisoned.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "tessera/ops/attention.hpp"
#include "tessera/ops/backend_route.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_attn/gpu_attn_util.hpp"

using namespace tessera;
using namespace tessera::verify;
using namespace tessera::verify::gpu_attn;

namespace {

/// Tolerances against the CPU backend (expf on the device vs std::exp on the host, ≤ 2 ulp each):
/// fp32 p within kProbUlpsF32 ulps of p; o within (kOutUlpsF32 + 2·nk) ulps of Σ|p_u·k_u[i]|.
/// bf16: p within one bf16 ulp; o within one bf16 ulp of Σ|p_u·k_u[i]| plus one of |o|, plus the fp32 term.
constexpr float kProbUlpsF32 = 8.f;
constexpr float kOutUlpsF32 = 8.f;

struct AttnCase {
  ops::AttentionDesc d;
  std::vector<float> q, keys, sinks;
  std::vector<int64_t> off;
  std::vector<int32_t> ids;
  std::vector<int32_t> cols, sink_cols;  // optional logit-row columns (bf16)
};

/// The kernel a GPU run takes: the CUDA-core kernel (max_row_keys 0) or, for bf16, the tensor-core kernel
/// (max_row_keys = the longest row).
enum class Path { kCudaCores, kTensorCores };

int64_t longest_row(AttnCase const& c) {
  int64_t m = 0;
  for (size_t r = 0; r + 1 < c.off.size(); ++r) m = std::max(m, c.off[r + 1] - c.off[r]);
  return m;
}

/// S chunk rows at positions p0.. with n_old cached window keys before them (window W) and t_c compressed
/// entries of ratio `ratio`, each row selecting up to `topk` visible entries at random (sorted ids).
AttnCase window_case(uint64_t seed, int64_t S, int64_t p0, int64_t n_old, int64_t W, int64_t t_c, int64_t ratio,
                     int64_t topk, int64_t heads, int64_t hd, DType md) {
  AttnCase c;
  int64_t const nk = n_old + S + t_c;
  c.d = {S, heads, hd, nk, static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))), md};
  c.q = randn(static_cast<size_t>(S * heads * hd), seed + 1);
  c.keys = randn(static_cast<size_t>(nk * hd), seed + 2);
  c.sinks = randn(static_cast<size_t>(heads), seed + 3);
  std::mt19937_64 g(seed + 4);
  c.off.assign(1, 0);
  for (int64_t r = 0; r < S; ++r) {
    int64_t const p = p0 + r;
    for (int64_t i = 0; i < n_old; ++i)
      if (p0 - n_old + i > p - W) c.ids.push_back(static_cast<int32_t>(i));
    for (int64_t j = 0; j <= r; ++j)
      if (p0 + j > p - W) c.ids.push_back(static_cast<int32_t>(n_old + j));
    int64_t const vis = std::min<int64_t>((p + 1) / ratio, t_c);
    // A random subset of min(vis, topk) visible entries, in entry order.
    std::vector<int32_t> e;
    int64_t need = std::min(vis, topk);
    for (int64_t x = 0; x < vis; ++x)
      if (static_cast<int64_t>(g() % static_cast<uint64_t>(vis - x)) < need) {
        e.push_back(static_cast<int32_t>(x));
        --need;
      }
    for (int32_t x : e) c.ids.push_back(static_cast<int32_t>(n_old + S + x));
    c.off.push_back(static_cast<int64_t>(c.ids.size()));
  }
  return c;
}

struct AttnOut {
  std::vector<float> out, probs;
};

AttnOut run_cpu(AttnCase const& c) {
  AttnOut o;
  int64_t const nnz = static_cast<int64_t>(c.ids.size()), w = c.d.heads * c.d.head_dim;
  o.out.assign(static_cast<size_t>(c.d.rows * w), 0.f);
  o.probs.assign(static_cast<size_t>(c.d.heads * nnz), 0.f);
  ops::AttentionArgs a{TensorView<float const, 2>(c.q.data(), {c.d.rows, w}),
                       TensorView<float const, 2>(c.keys.data(), {c.d.num_keys, c.d.head_dim}),
                       TensorView<int64_t const, 1>(c.off.data(), {c.d.rows + 1}),
                       TensorView<int32_t const, 1>(c.ids.data(), {nnz}),
                       TensorView<float const, 1>(c.sinks.data(), {c.d.heads}),
                       TensorView<float, 2>(o.out.data(), {c.d.rows, w}),
                       TensorView<float, 2>(o.probs.data(), {c.d.heads, nnz})};
  if (!c.cols.empty()) {
    a.key_cols = TensorView<int32_t const, 1>(c.cols.data(), {nnz});
    a.sink_cols = TensorView<int32_t const, 1>(c.sink_cols.data(), {c.d.rows});
  }
  ExecContext ctx;
  Status s = ops::attention(ctx, c.d, a);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  return o;
}

ops::AttentionArgs dev_args(AttnCase const& c, DevBuf<float> const& q, DevBuf<float> const& k,
                            DevBuf<int64_t> const& off, DevBuf<int32_t> const& ids, DevBuf<float> const& sinks,
                            DevBuf<float> const& out, DevBuf<float> const* probs) {
  int64_t const nnz = static_cast<int64_t>(c.ids.size()), w = c.d.heads * c.d.head_dim;
  ops::AttentionArgs a{q.cview<2>({c.d.rows, w}), k.cview<2>({c.d.num_keys, c.d.head_dim}),
                       off.cview<1>({c.d.rows + 1}), ids.cview<1>({nnz}), sinks.cview<1>({c.d.heads}),
                       out.view<2>({c.d.rows, w}), {}};
  if (probs) a.probs = probs->view<2>({c.d.heads, nnz});
  return a;
}

/// The tensor-core kernel's variants, forced through ExecContext::impl_override: 16 or 32 heads per block, keys read
/// as fp32 or from the launch's bf16 copy, P·V's channels split over 2, 4 or 8 blocks (head_dim 512; no split at
/// other head dims) (attention_cuda.cu).
constexpr int kTcVariants[] = {1, 2, 3, 4, 5, 6, 7, 8};
char const* tc_variant_name(int v) {
  static char const* const names[] = {"auto", "16 heads, fp32 keys", "32 heads, fp32 keys", "16 heads, bf16 keys",
                                      "32 heads, bf16 keys", "16 heads, fp32 keys, channels / 8",
                                      "16 heads, fp32 keys, channels / 2", "16 heads, bf16 keys, channels / 8",
                                      "16 heads, bf16 keys, channels / 4"};
  return names[v];
}

/// variant (tensor cores): one of kTcVariants (0: the launch's own choice).
AttnOut run_gpu(AttnCase const& c, bool with_probs = true, Path path = Path::kCudaCores, int variant = 0) {
  int64_t const nnz = static_cast<int64_t>(c.ids.size());
  DevBuf<float> q(c.q), k(c.keys), sinks(c.sinks), out(c.d.rows * c.d.heads * c.d.head_dim), probs(c.d.heads * nnz);
  DevBuf<int64_t> off(c.off);
  DevBuf<int32_t> ids(c.ids), cols(c.cols), sink_cols(c.sink_cols);
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  if (variant > 0) ctx.impl_override = variant;
  ops::AttentionArgs a = dev_args(c, q, k, off, ids, sinks, out, with_probs ? &probs : nullptr);
  if (!c.cols.empty()) {
    a.key_cols = cols.cview<1>({nnz});
    a.sink_cols = sink_cols.cview<1>({c.d.rows});
  }
  ops::AttentionDesc d = c.d;
  d.max_row_keys = path == Path::kTensorCores ? std::max<int64_t>(1, longest_row(c)) : 0;
  Status s = ops::Attention<Backend::kCuda>::validate(d, a);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  s = ops::run_on_backend<ops::Attention>(ctx, d, a);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  return {out.host(), with_probs ? probs.host() : std::vector<float>{}};
}

/// GPU within the named tolerances of the CPU; returns the number of bit-identical outputs.
int64_t expect_close(AttnCase const& c, AttnOut const& cpu, AttnOut const& gpu) {
  bool const bf = c.d.md == DType::kBf16;
  int64_t const H = c.d.heads, hd = c.d.head_dim, nnz = static_cast<int64_t>(c.ids.size());
  int64_t bad_p = 0, bad_o = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < nnz; ++i) {
      float const a = cpu.probs[h * nnz + i], b = gpu.probs[h * nnz + i];
      float const tol = (bf ? kBf16Eps : kProbUlpsF32 * kF32Eps) * std::fabs(a) + 1e-38f;
      if (!(std::fabs(a - b) <= tol)) {
        if (bad_p++ < 5) std::printf("p[h=%lld, %lld]: cpu %.9g gpu %.9g\n", (long long)h, (long long)i, a, b);
      }
    }
  for (int64_t r = 0; r < c.d.rows; ++r) {
    int64_t const k0 = c.off[r], k1 = c.off[r + 1];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t x = 0; x < hd; ++x) {
        double mag = 0.0;
        for (int64_t u = k0; u < k1; ++u)
          mag += std::fabs(static_cast<double>(cpu.probs[h * nnz + u]) * c.keys[c.ids[u] * hd + x]);
        float const a = cpu.out[(r * H + h) * hd + x], b = gpu.out[(r * H + h) * hd + x];
        double tol = (kOutUlpsF32 + 2.0 * (k1 - k0)) * kF32Eps * mag;
        if (bf) tol += kBf16Eps * (mag + std::fabs(a));
        if (!(std::fabs(static_cast<double>(a) - b) <= tol)) {
          if (bad_o++ < 5)
            std::printf("o[r=%lld h=%lld i=%lld]: cpu %.9g gpu %.9g tol %.3g\n", (long long)r, (long long)h,
                        (long long)x, a, b, tol);
        }
      }
  }
  BOOST_TEST(bad_p == 0);
  BOOST_TEST(bad_o == 0);
  return static_cast<int64_t>(cpu.out.size()) - bit_mismatches(cpu.out, gpu.out);
}

/// Rows [r0, r1) of `c` as a case of their own (offsets rebased, same key pool).
AttnCase slice_rows(AttnCase const& c, int64_t r0, int64_t r1) {
  AttnCase s = c;
  int64_t const w = c.d.heads * c.d.head_dim;
  s.d.rows = r1 - r0;
  s.q.assign(c.q.begin() + r0 * w, c.q.begin() + r1 * w);
  s.ids.assign(c.ids.begin() + c.off[r0], c.ids.begin() + c.off[r1]);
  s.off.clear();
  for (int64_t r = r0; r <= r1; ++r) s.off.push_back(c.off[r] - c.off[r0]);
  return s;
}

/// bf16: the tensor-core kernel gives the CUDA-core kernel's bits (outputs and probabilities) in each variant.
void expect_tc_equal(AttnCase const& c, AttnOut const& cuda_cores, bool with_probs = true) {
  if (c.d.md != DType::kBf16) return;
  for (int v : kTcVariants) {
    AttnOut const t = run_gpu(c, with_probs, Path::kTensorCores, v);
    BOOST_TEST(bit_mismatches(t.out, cuda_cores.out) == 0, tc_variant_name(v));
    if (with_probs) BOOST_TEST(bit_mismatches(t.probs, cuda_cores.probs) == 0, tc_variant_name(v));
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_attention)

BOOST_AUTO_TEST_CASE(random_prefill_and_decode_vs_cpu) {
  uint64_t const seed = test_seed(0xA77E);
  struct Shape { int64_t S, p0, n_old, W, t_c, ratio, topk, heads, hd; };
  // prefill longer than the window; prefill after a cached window; decode (1 row); odd head_dim (scalar
  // loads); the released head_dim 512 (two output channels per thread).
  Shape const shapes[] = {{40, 0, 0, 16, 20, 2, 6, 4, 64},  {23, 57, 15, 16, 29, 2, 6, 3, 64},
                          {1, 130, 15, 16, 65, 2, 6, 4, 64}, {19, 11, 10, 8, 12, 1, 5, 2, 30},
                          {7, 300, 127, 128, 150, 2, 16, 2, 512}};
  for (DType md : {DType::kF32, DType::kBf16})
    for (Shape const& s : shapes) {
      AttnCase c = window_case(seed + static_cast<uint64_t>(s.S * 131 + s.hd), s.S, s.p0, s.n_old, s.W, s.t_c,
                               s.ratio, s.topk, s.heads, s.hd, md);
      AttnOut cpu = run_cpu(c), gpu = run_gpu(c);
      int64_t exact = expect_close(c, cpu, gpu);
      BOOST_TEST_MESSAGE(dtype_name(md) << " S=" << s.S << " hd=" << s.hd << ": " << exact << "/" << cpu.out.size()
                                        << " outputs bit-identical to the CPU");
      // Without the probs output the kernel gives the same bits.
      AttnOut np = run_gpu(c, false);
      BOOST_TEST(bit_mismatches(np.out, gpu.out) == 0);
      if (s.hd % 64 == 0) expect_tc_equal(c, gpu);
    }
}

BOOST_AUTO_TEST_CASE(exact_exp_is_bitwise) {
  uint64_t const seed = test_seed(0xB17);
  for (DType md : {DType::kF32, DType::kBf16}) {
    AttnCase c = window_case(seed, 33, 20, 15, 16, 30, 2, 8, 4, 64, md);
    c.d.scale = 0.f;                         // every logit is ±0: expf(0) = 1 exactly
    for (float& s : c.sinks) s = -200.f;     // expf(−200) = 0 exactly
    AttnOut cpu = run_cpu(c), gpu = run_gpu(c);
    BOOST_TEST(bit_mismatches(cpu.probs, gpu.probs) == 0);
    BOOST_TEST(bit_mismatches(cpu.out, gpu.out) == 0);
    expect_tc_equal(c, gpu);
  }
}

BOOST_AUTO_TEST_CASE(empty_and_fully_masked_rows) {
  uint64_t const seed = test_seed(0xE0);
  for (DType md : {DType::kF32, DType::kBf16}) {
    AttnCase c = window_case(seed, 6, 30, 15, 16, 10, 2, 4, 4, 64, md);
    // Row 0 sees nothing (an empty visible set), row 3 had every key masked (also an empty list); row 5
    // keeps a single key.
    std::vector<int32_t> ids;
    std::vector<int64_t> off{0};
    for (int64_t r = 0; r < c.d.rows; ++r) {
      if (r != 0 && r != 3) {
        int64_t const end = r == 5 ? c.off[r] + 1 : c.off[r + 1];
        for (int64_t i = c.off[r]; i < end; ++i) ids.push_back(c.ids[i]);
      }
      off.push_back(static_cast<int64_t>(ids.size()));
    }
    c.ids = ids;
    c.off = off;
    AttnOut cpu = run_cpu(c), gpu = run_gpu(c);
    expect_close(c, cpu, gpu);
    expect_tc_equal(c, gpu);
    int64_t const w = c.d.heads * c.d.head_dim;
    for (int64_t r : {0, 3})
      for (int64_t i = 0; i < w; ++i) BOOST_TEST(std::bit_cast<uint32_t>(gpu.out[r * w + i]) == 0u);
    // All rows empty: nnz = 0.
    AttnCase e = c;
    e.ids.clear();
    std::fill(e.off.begin(), e.off.end(), 0);
    AttnOut ge = run_gpu(e);
    for (float v : ge.out) BOOST_TEST(std::bit_cast<uint32_t>(v) == 0u);
    expect_tc_equal(e, ge);
  }
}

BOOST_AUTO_TEST_CASE(rows_longer_than_a_tile) {
  uint64_t const seed = test_seed(0x7113);
  for (DType md : {DType::kF32, DType::kBf16}) {
    // Row 1 lists 2500 keys (two tiles of 2048), row 0 and 2 a few.
    AttnCase c;
    int64_t const nk = 3000, hd = 64, H = 2;
    c.d = {3, H, hd, nk, 0.125f, md};
    c.q = randn(static_cast<size_t>(3 * H * hd), seed + 1);
    c.keys = randn(static_cast<size_t>(nk * hd), seed + 2);
    c.sinks = randn(static_cast<size_t>(H), seed + 3);
    c.off = {0};
    for (int64_t r = 0; r < 3; ++r) {
      int64_t const n = r == 1 ? 2500 : 7;
      for (int64_t i = 0; i < n; ++i) c.ids.push_back(static_cast<int32_t>((i * 7 + r) % nk));
      c.off.push_back(static_cast<int64_t>(c.ids.size()));
    }
    AttnOut cpu = run_cpu(c), gpu = run_gpu(c);
    expect_close(c, cpu, gpu);
    AttnOut alone = run_gpu(slice_rows(c, 1, 2));
    int64_t const w = H * hd;
    BOOST_TEST(bit_mismatches(alone.out, std::vector<float>(gpu.out.begin() + w, gpu.out.begin() + 2 * w)) == 0);
    // Exact exps over the multi-tile path: bit-equal.
    c.d.scale = 0.f;
    for (float& s : c.sinks) s = -200.f;
    cpu = run_cpu(c);
    gpu = run_gpu(c);
    BOOST_TEST(bit_mismatches(cpu.probs, gpu.probs) == 0);
    BOOST_TEST(bit_mismatches(cpu.out, gpu.out) == 0);
  }
}

BOOST_AUTO_TEST_CASE(row_invariance) {
  uint64_t const seed = test_seed(0x2013);
  for (DType md : {DType::kF32, DType::kBf16}) {
    AttnCase c = window_case(seed, 29, 40, 15, 16, 35, 2, 8, 4, 64, md);
    AttnOut all = run_gpu(c, false);
    int64_t const w = c.d.heads * c.d.head_dim;
    std::vector<float> alone, split;
    for (int64_t r = 0; r < c.d.rows; ++r) {
      AttnOut o = run_gpu(slice_rows(c, r, r + 1), false);
      alone.insert(alone.end(), o.out.begin(), o.out.end());
    }
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 5}, {5, 6}, {6, 29}}) {
      AttnOut o = run_gpu(slice_rows(c, b, e), false);
      split.insert(split.end(), o.out.begin(), o.out.end());
    }
    BOOST_TEST(static_cast<int64_t>(alone.size()) == c.d.rows * w);
    BOOST_TEST(bit_mismatches(all.out, alone) == 0);
    BOOST_TEST(bit_mismatches(all.out, split) == 0);
    expect_tc_equal(c, all, false);
  }
}

/// AttentionArgs::row_ends: each row's keys at its own base with unread slots between rows (filled with ids out of
/// range, so a stray read poisons the row) give the CSR call's outputs bit for bit, on the CPU op, the CUDA-core
/// kernel and (bf16) the tensor-core kernel. The GPU model lists several sequences' keys this way in one call.
BOOST_AUTO_TEST_CASE(row_ends_with_gaps_equal_csr) {
  uint64_t const seed = test_seed(0x5E9);
  for (DType md : {DType::kF32, DType::kBf16}) {
    AttnCase const c = window_case(seed, 9, 40, 15, 16, 35, 2, 8, 4, 64, md);
    int64_t const rows = c.d.rows, w = c.d.heads * c.d.head_dim;
    std::vector<int64_t> begin, end;
    std::vector<int32_t> ids;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < 3 + r % 2; ++g) ids.push_back(static_cast<int32_t>(c.d.num_keys + 100 + g));
      begin.push_back(static_cast<int64_t>(ids.size()));
      for (int64_t i = c.off[r]; i < c.off[r + 1]; ++i) ids.push_back(c.ids[i]);
      end.push_back(static_cast<int64_t>(ids.size()));
    }
    int64_t const nnz = static_cast<int64_t>(ids.size());
    // CPU: CSR vs begin / end.
    AttnOut const csr_cpu = run_cpu(c);
    std::vector<float> out_cpu(static_cast<size_t>(rows * w), -3.f);
    ops::AttentionArgs a{TensorView<float const, 2>(c.q.data(), {rows, w}),
                         TensorView<float const, 2>(c.keys.data(), {c.d.num_keys, c.d.head_dim}),
                         TensorView<int64_t const, 1>(begin.data(), {rows}), TensorView<int32_t const, 1>(ids.data(), {nnz}),
                         TensorView<float const, 1>(c.sinks.data(), {c.d.heads}),
                         TensorView<float, 2>(out_cpu.data(), {rows, w}), {}};
    a.row_ends = TensorView<int64_t const, 1>(end.data(), {rows});
    ExecContext cpu;
    Status s = ops::attention(cpu, c.d, a);
    BOOST_TEST_REQUIRE(s.ok(), s.to_string());
    BOOST_TEST(bit_mismatches(csr_cpu.out, out_cpu) == 0);
    // GPU, each kernel: CSR vs begin / end.
    for (Path path : {Path::kCudaCores, Path::kTensorCores}) {
      if (path == Path::kTensorCores && md != DType::kBf16) continue;
      AttnOut const csr = run_gpu(c, false, path);
      DevBuf<float> q(c.q), k(c.keys), sinks(c.sinks), out(rows * w);
      DevBuf<int64_t> db(begin), de(end);
      DevBuf<int32_t> di(ids);
      ops::AttentionArgs g{q.cview<2>({rows, w}), k.cview<2>({c.d.num_keys, c.d.head_dim}), db.cview<1>({rows}),
                           di.cview<1>({nnz}), sinks.cview<1>({c.d.heads}), out.view<2>({rows, w}), {}};
      g.row_ends = de.cview<1>({rows});
      ops::AttentionDesc d = c.d;
      d.max_row_keys = path == Path::kTensorCores ? std::max<int64_t>(1, longest_row(c)) : 0;
      ExecContext ctx;
      ctx.backend = Backend::kCuda;
      s = ops::Attention<Backend::kCuda>::validate(d, g);
      BOOST_TEST_REQUIRE(s.ok(), s.to_string());
      s = ops::run_on_backend<ops::Attention>(ctx, d, g);
      BOOST_TEST_REQUIRE(s.ok(), s.to_string());
      BOOST_TEST(bit_mismatches(csr.out, out.host()) == 0);
    }
  }
}

/// Sparse logit-row columns as the model lays them out (window columns, then compressed entries' columns after
/// a gap), with gaps inside and across 16-column blocks: the CPU within tolerance, the tensor-core kernel equal to
/// the CUDA-core kernel bit for bit, a row alone equal to its batch row, on the tensor cores.
BOOST_AUTO_TEST_CASE(tensor_cores_on_sparse_columns) {
  uint64_t const seed = test_seed(0x7C0);
  struct Shape { int64_t rows, heads, hd, max_nk, num_keys; };
  Shape const shapes[] = {{5, 3, 64, 40, 90}, {4, 20, 128, 200, 300}, {3, 16, 256, 130, 160},
                          {2, 64, 512, 640, 700}, {2, 4, 64, 1024, 1100}};
  for (Shape const& s : shapes) {
    AttnCase c;
    c.d = {s.rows, s.heads, s.hd, s.num_keys, static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd))),
           DType::kBf16};
    c.q = randn(static_cast<size_t>(s.rows * s.heads * s.hd), seed + 1 + static_cast<uint64_t>(s.hd), 2.f);
    c.keys = randn(static_cast<size_t>(s.num_keys * s.hd), seed + 2 + static_cast<uint64_t>(s.hd));
    c.sinks = randn(static_cast<size_t>(s.heads), seed + 3);
    std::mt19937_64 g(seed + 4 + static_cast<uint64_t>(s.heads));
    c.off = {0};
    for (int64_t r = 0; r < s.rows; ++r) {
      int64_t const n = r == 0 ? s.max_nk : static_cast<int64_t>(g() % static_cast<uint64_t>(s.max_nk + 1));
      int32_t col = static_cast<int32_t>(g() % 5);
      for (int64_t i = 0; i < n; ++i) {
        c.ids.push_back(static_cast<int32_t>(g() % static_cast<uint64_t>(s.num_keys)));
        c.cols.push_back(col);
        // Mostly adjacent columns; now and then a gap inside a block or past one, and one long jump (the
        // window's end to the compressed entries).
        uint64_t const roll = g() % 16;
        col += roll < 11 ? 1 : roll < 14 ? 2 + static_cast<int32_t>(g() % 6) : 17 + static_cast<int32_t>(g() % 40);
        if (i == n / 2) col += 300;
      }
      c.sink_cols.push_back(col + static_cast<int32_t>(g() % 3));
      c.off.push_back(static_cast<int64_t>(c.ids.size()));
    }
    AttnOut const cpu = run_cpu(c), cuda_cores = run_gpu(c);
    expect_close(c, cpu, cuda_cores);
    for (int v : kTcVariants) {
      AttnOut const t = run_gpu(c, true, Path::kTensorCores, v);
      int64_t const out_diff = bit_mismatches(t.out, cuda_cores.out), p_diff = bit_mismatches(t.probs, cuda_cores.probs);
      BOOST_TEST(out_diff == 0, tc_variant_name(v));
      BOOST_TEST(p_diff == 0, tc_variant_name(v));
      BOOST_TEST_MESSAGE("tensor cores (" << tc_variant_name(v) << "), heads " << s.heads << " hd " << s.hd << " rows "
                                          << s.rows << ": " << out_diff << " of " << t.out.size()
                                          << " outputs differ from the CUDA-core kernel");
      AttnCase one = slice_rows(c, 1, 2);
      one.cols.assign(c.cols.begin() + c.off[1], c.cols.begin() + c.off[2]);
      one.sink_cols = {c.sink_cols[1]};
      AttnOut const alone = run_gpu(one, false, Path::kTensorCores, v % 4 + 1);  // another variant
      int64_t const w = s.heads * s.hd;
      BOOST_TEST(bit_mismatches(alone.out, std::vector<float>(t.out.begin() + w, t.out.begin() + 2 * w)) == 0);
    }
  }
}

/// The tensor-core kernel's guards: a row over max_row_keys, or whose columns do not increase, gets NaN; the
/// other rows keep their values.
BOOST_AUTO_TEST_CASE(tensor_cores_poison_bad_rows) {
  uint64_t const seed = test_seed(0x7C1);
  AttnCase c = window_case(seed, 6, 30, 15, 16, 10, 2, 4, 4, 64, DType::kBf16);
  for (int64_t r = 0; r < c.d.rows; ++r) {
    for (int64_t i = c.off[r]; i < c.off[r + 1]; ++i) c.cols.push_back(static_cast<int32_t>(i - c.off[r]));
    c.sink_cols.push_back(static_cast<int32_t>(c.off[r + 1] - c.off[r]));
  }
  AttnOut const good = run_gpu(c, false, Path::kTensorCores);
  int64_t const nnz = static_cast<int64_t>(c.ids.size()), w = c.d.heads * c.d.head_dim;
  BOOST_REQUIRE(c.off[3] - c.off[2] >= 2);
  std::vector<int32_t> cols = c.cols;
  std::swap(cols[static_cast<size_t>(c.off[2])], cols[static_cast<size_t>(c.off[2] + 1)]);  // row 2 decreasing
  DevBuf<float> q(c.q), k(c.keys), sinks(c.sinks), out(c.d.rows * w);
  DevBuf<int64_t> off(c.off);
  DevBuf<int32_t> ids(c.ids), dcols(cols), dsink(c.sink_cols);
  ops::AttentionArgs a = dev_args(c, q, k, off, ids, sinks, out, nullptr);
  a.key_cols = dcols.cview<1>({nnz});
  a.sink_cols = dsink.cview<1>({c.d.rows});
  ops::AttentionDesc d = c.d;
  d.max_row_keys = longest_row(c);
  BOOST_TEST(!ops::Attention<Backend::kCuda>::validate(d, a).ok());
  // A bound one below the longest rows' length: those rows are over it.
  int64_t const longest = longest_row(c);
  d.max_row_keys = longest - 1;
  for (int v : kTcVariants) {
    ExecContext ctx;
    ctx.backend = Backend::kCuda;
    ctx.impl_override = v;
    BOOST_TEST_REQUIRE(ops::Attention<Backend::kCuda>::run(d, a, ctx).ok());
    std::vector<float> o = out.host();
    for (int64_t r = 0; r < c.d.rows; ++r) {
      bool any_nan = false, same = true;
      for (int64_t i = 0; i < w; ++i) {
        any_nan |= std::isnan(o[r * w + i]);
        same &= std::bit_cast<uint32_t>(o[r * w + i]) == std::bit_cast<uint32_t>(good.out[r * w + i]);
      }
      bool const poisoned = r == 2 || c.off[r + 1] - c.off[r] == longest;
      BOOST_TEST(any_nan == poisoned, tc_variant_name(v) << ", row " << r);
      if (!poisoned) BOOST_TEST(same, tc_variant_name(v) << ", row " << r);
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments) {
  uint64_t const seed = test_seed(0xBAD);
  AttnCase c = window_case(seed, 4, 10, 5, 8, 6, 2, 3, 2, 32, DType::kF32);
  int64_t const nnz = static_cast<int64_t>(c.ids.size());
  DevBuf<float> q(c.q), k(c.keys), sinks(c.sinks), out(c.d.rows * c.d.heads * c.d.head_dim);
  DevBuf<int64_t> off(c.off);
  DevBuf<int32_t> good_ids(c.ids);
  ops::AttentionArgs a = dev_args(c, q, k, off, good_ids, sinks, out, nullptr);
  ExecContext ctx;
  ctx.backend = Backend::kCuda;
  // A host view.
  ops::AttentionArgs h = a;
  h.q = TensorView<float const, 2>(c.q.data(), {c.d.rows, c.d.heads * c.d.head_dim});
  Status s = ops::run_on_backend<ops::Attention>(ctx, c.d, h);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("attention q") != std::string::npos);
  // head_dim beyond the compiled range.
  ops::AttentionDesc big = c.d;
  big.head_dim = 2048;
  BOOST_TEST(!ops::Attention<Backend::kCuda>::check(big, a).ok());
  // A key id out of range: validate names it; run poisons that row only.
  std::vector<int32_t> ids = c.ids;
  ids[static_cast<size_t>(c.off[2])] = static_cast<int32_t>(c.d.num_keys + 3);
  DevBuf<int32_t> bad_ids(ids);
  a.key_ids = bad_ids.cview<1>({nnz});
  s = ops::Attention<Backend::kCuda>::validate(c.d, a);
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("key id out of range") != std::string::npos);
  s = ops::Attention<Backend::kCuda>::run(c.d, a, ctx);
  BOOST_TEST_REQUIRE(s.ok(), s.to_string());
  std::vector<float> o = out.host();
  int64_t const w = c.d.heads * c.d.head_dim;
  for (int64_t r = 0; r < c.d.rows; ++r) {
    bool any_nan = false;
    for (int64_t i = 0; i < w; ++i) any_nan |= std::isnan(o[r * w + i]);
    BOOST_TEST(any_nan == (r == 2));
  }
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// MoeExperts<kCuda> on the tensor cores (bf16 weights, md = bf16: ops::MoeTcPath kSkinny and kGemm,
/// kernels/moe/moe_tc_cuda.cu) against the CPU op, BIT FOR BIT: every output of every path (and of the
/// emulated path, kEmulated, and of kAuto) equals MoeExperts<kCpu> (ref::dot_tc in each dot), on bf16-valued
/// inputs with no zeros (the paths' precondition). Shapes: K multiples of 16 (the Flash 5120 × 2304 with few
/// experts), multiples of 8 but not 16 (200 × 72: 16-byte staging, a partial last K block), odd (203 × 37:
/// element staging); rows 1, 2, 5, 16, 64, 300; experts with 0, 1, 9 and 200 assignments (one or several
/// tiles of 8, two tiles of 128), a pruned slot (id −1). Row invariance: a token alone, and the last rows as
/// a smaller batch, give the bits they get in the full batch.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "tessera/ops/moe.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;
using ops::MoeTcPath;

namespace {

/// n bf16-valued normal(0, sd) values, none zero (a zero after rounding becomes ±sd/64).
std::vector<float> bf16_values(size_t n, uint64_t seed, float sd) {
  auto v = randn(n, seed, sd);
  for (size_t i = 0; i < n; ++i) {
    v[i] = round_to_bf16(v[i]);
    if (v[i] == 0.f) v[i] = round_to_bf16((i % 2 ? -sd : sd) / 64.f);
  }
  return v;
}

char const* path_name(MoeTcPath p) {
  switch (p) {
    case MoeTcPath::kAuto: return "auto";
    case MoeTcPath::kEmulated: return "emulated";
    case MoeTcPath::kSkinny: return "skinny";
    case MoeTcPath::kGemm: return "gemm";
  }
  return "?";
}

struct Problem {
  int64_t rows = 0, experts = 0, dim = 0, inter = 0, k = 0;
  float limit = 0.f;
  std::vector<float> x, wts;
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> w1, w3, w2;  // [experts] = shared
  // Device copies (bf16) and pointer tables.
  std::vector<DeviceBuffer<Bf16>> dw;
  DeviceBuffer<uint64_t> t1, t3, t2;
  ops::MoeExpertsDeviceWeights dev;

  ops::MoeExpertsDesc desc(int64_t nr, MoeTcPath path) const {
    ops::MoeExpertsDesc d{nr, experts, dim, inter, k, limit, true, DType::kBf16, DType::kBf16};
    d.tc_path = path;
    return d;
  }

  void upload() {
    dw.reserve(3 * (experts + 1));
    auto put = [&](std::vector<float> const& h) {
      std::vector<Bf16> hb(h.size());
      for (size_t i = 0; i < h.size(); ++i) hb[i] = Bf16::from_float(h[i]);
      dw.emplace_back(hb);
      return reinterpret_cast<uint64_t>(dw.back().data());
    };
    std::vector<uint64_t> p1, p3, p2;
    for (int64_t e = 0; e <= experts; ++e) {
      p1.push_back(put(w1[e]));
      p3.push_back(put(w3[e]));
      p2.push_back(put(w2[e]));
    }
    t1.upload(p1); t3.upload(p3); t2.upload(p2);
    dev.w1 = reinterpret_cast<void const* const*>(t1.data());
    dev.w3 = reinterpret_cast<void const* const*>(t3.data());
    dev.w2 = reinterpret_cast<void const* const*>(t2.data());
    dev.shared_w1 = reinterpret_cast<void const*>(p1[experts]);
    dev.shared_w3 = reinterpret_cast<void const*>(p3[experts]);
    dev.shared_w2 = reinterpret_cast<void const*>(p2[experts]);
  }

  std::vector<float> cpu() const {
    ops::MoeExpertsDesc d{rows, experts, dim, inter, k, limit, true, DType::kBf16, DType::kF32};
    std::vector<TensorView<float const, 2>> v1, v3, v2;
    for (int64_t e = 0; e < experts; ++e) {
      v1.emplace_back(w1[e].data(), std::array<int64_t, 2>{inter, dim});
      v3.emplace_back(w3[e].data(), std::array<int64_t, 2>{inter, dim});
      v2.emplace_back(w2[e].data(), std::array<int64_t, 2>{dim, inter});
    }
    std::vector<float> out(rows * dim, -3.f);
    ops::MoeExpertsArgs a;
    a.x = TensorView<float const, 2>(x.data(), {rows, dim});
    a.ids = TensorView<int32_t const, 2>(ids.data(), {rows, k});
    a.weights = TensorView<float const, 2>(wts.data(), {rows, k});
    a.w1 = v1; a.w3 = v3; a.w2 = v2;
    a.shared_w1 = TensorView<float const, 2>(w1[experts].data(), {inter, dim});
    a.shared_w3 = TensorView<float const, 2>(w3[experts].data(), {inter, dim});
    a.shared_w2 = TensorView<float const, 2>(w2[experts].data(), {dim, inter});
    a.out = TensorView<float, 2>(out.data(), {rows, dim});
    ExecContext c;
    auto s = ops::dispatch<ops::MoeExperts>(c, d, a);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    return out;
  }

  /// Rows [r0, r0 + nr) as one CUDA call on `path`.
  std::vector<float> gpu(int64_t r0, int64_t nr, MoeTcPath path) const {
    DeviceBuffer<float> dx(std::vector<float>(x.begin() + r0 * dim, x.begin() + (r0 + nr) * dim));
    DeviceBuffer<int32_t> di(std::vector<int32_t>(ids.begin() + r0 * k, ids.begin() + (r0 + nr) * k));
    DeviceBuffer<float> dwt(std::vector<float>(wts.begin() + r0 * k, wts.begin() + (r0 + nr) * k));
    DeviceBuffer<float> dout(std::vector<float>(static_cast<size_t>(nr * dim), -5.f));
    ops::MoeExpertsArgs a;
    a.x = dx.cview<2>({nr, dim});
    a.ids = di.cview<2>({nr, k});
    a.weights = dwt.cview<2>({nr, k});
    a.out = dout.view<2>({nr, dim});
    a.dev = dev;
    ExecContext c = cuda_ctx();
    auto s = ops::dispatch<ops::MoeExperts>(c, desc(nr, path), a);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    return dout.get();
  }
};

/// Random problem; `counts` (optional) fixes the assignments of experts 0, 1, … (slot 0 of consecutive rows
/// first, then slot 1, …); the other slots draw distinct experts from the rest. One slot is pruned (−1).
Problem make(int64_t rows, int64_t experts, int64_t dim, int64_t inter, int64_t k, float limit, uint64_t seed,
             std::vector<int64_t> const& counts = {}) {
  Problem p;
  p.rows = rows; p.experts = experts; p.dim = dim; p.inter = inter; p.k = k; p.limit = limit;
  p.x = bf16_values(static_cast<size_t>(rows * dim), seed, 1.f);
  p.wts = randn(static_cast<size_t>(rows * k), seed + 1, 0.3f, 0.5f);
  p.ids.assign(static_cast<size_t>(rows * k), -2);
  int64_t next = 0;  // fixed assignments fill (row, slot) in slot-major order
  for (size_t e = 0; e < counts.size(); ++e)
    for (int64_t c = 0; c < counts[e]; ++c, ++next) {
      int64_t const slot = next / rows, row = next % rows;
      BOOST_REQUIRE(slot < k);
      p.ids[row * k + slot] = static_cast<int32_t>(e);
    }
  std::mt19937_64 g(seed + 2);
  int64_t const free0 = static_cast<int64_t>(counts.size());
  BOOST_REQUIRE(experts - free0 >= k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < k; ++s) {
      if (p.ids[r * k + s] != -2) continue;
      int32_t e;
      do {
        e = static_cast<int32_t>(free0 + static_cast<int64_t>(g() % static_cast<uint64_t>(experts - free0)));
      } while (std::find(&p.ids[r * k], &p.ids[r * k + k], e) != &p.ids[r * k + k]);
      p.ids[r * k + s] = e;
    }
  int64_t const pruned = (rows / 2) * k + k - 1;  // a pruned slot
  p.ids[pruned] = -1;
  p.wts[pruned] = 0.f;
  float const s1 = 1.f / std::sqrt(static_cast<float>(dim)), s2 = 1.f / std::sqrt(static_cast<float>(inter));
  for (int64_t e = 0; e <= experts; ++e) {
    p.w1.push_back(bf16_values(static_cast<size_t>(inter * dim), seed + 10 + e, 2.f * s1));
    p.w3.push_back(bf16_values(static_cast<size_t>(inter * dim), seed + 1000 + e, 2.f * s1));
    p.w2.push_back(bf16_values(static_cast<size_t>(dim * inter), seed + 2000 + e, 2.f * s2));
  }
  p.upload();
  return p;
}

/// Every path against the CPU op, bitwise; row invariance on the tensor-core paths.
void check_all(Problem const& p) {
  auto const cpu = p.cpu();
  int64_t nonzero = 0;
  for (float v : cpu) nonzero += v != 0.f;
  BOOST_TEST(nonzero > static_cast<int64_t>(cpu.size()) / 2);  // the comparison is not between zeros
  for (MoeTcPath path : {MoeTcPath::kSkinny, MoeTcPath::kGemm, MoeTcPath::kEmulated, MoeTcPath::kAuto}) {
    if (path == MoeTcPath::kEmulated && p.dim * p.inter * p.rows > int64_t{5120} * 2304 * 5) continue;  // slow path
    BOOST_TEST_INFO("rows=" << p.rows << " dim=" << p.dim << " inter=" << p.inter << " experts=" << p.experts
                            << " k=" << p.k << " limit=" << p.limit << " path=" << path_name(path));
    auto const gpu = p.gpu(0, p.rows, path);
    int64_t const diff = count_bit_diffs(gpu, cpu, "moe_tc vs cpu");
    std::printf("moe_tc rows=%lld dim=%lld inter=%lld limit=%g path=%s (runs %s): %lld/%lld outputs differ from the CPU\n",
                static_cast<long long>(p.rows), static_cast<long long>(p.dim), static_cast<long long>(p.inter),
                static_cast<double>(p.limit), path_name(path),
                path_name(ops::moe_tc_path_for(p.desc(p.rows, path))), static_cast<long long>(diff),
                static_cast<long long>(gpu.size()));
    BOOST_TEST(diff == 0);
    if (path != MoeTcPath::kSkinny && path != MoeTcPath::kGemm) continue;
    // Row invariance: sub-batches against the same rows of the CPU output (= of this batch's GPU output).
    auto rows_of = [&](int64_t r0, int64_t nr) {
      return std::vector<float>(cpu.begin() + r0 * p.dim, cpu.begin() + (r0 + nr) * p.dim);
    };
    int64_t const one = p.rows / 2;  // the row with the pruned slot
    BOOST_TEST(count_bit_diffs(p.gpu(one, 1, path), rows_of(one, 1), "moe_tc alone") == 0);
    if (p.rows > 2) BOOST_TEST(count_bit_diffs(p.gpu(0, 2, path), rows_of(0, 2), "moe_tc first two") == 0);
    if (p.rows > 1) {
      int64_t const nt = std::min<int64_t>(5, p.rows - 1);
      BOOST_TEST(count_bit_diffs(p.gpu(p.rows - nt, nt, path), rows_of(p.rows - nt, nt), "moe_tc tail") == 0);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(moe_tc_small_dims_bitwise) {
  uint64_t const seed = test_seed(611);
  // 200 × 72: K multiples of 8, not of 16 (16-byte staging, a partial last block in both GEMMs);
  // 203 × 37: odd K (element staging, unaligned rows).
  for (auto const& [dim, inter] : {std::pair<int64_t, int64_t>{200, 72}, {203, 37}})
    for (int64_t rows : {1, 2, 5, 16, 64})
      for (float limit : {0.f, 1.f}) check_all(make(rows, 12, dim, inter, 3, limit, seed + rows));
}

BOOST_AUTO_TEST_CASE(moe_tc_skewed_assignments_bitwise) {
  uint64_t const seed = test_seed(612);
  // 300 rows × top-2: experts 0, 1, 2, 3 get 0, 1, 9, 200 assignments (no tile; one row; two tiles of 8
  // / one of 128 with 9 rows; 25 tiles of 8 / a full 128 tile and a 72-row one), the rest spread over 12.
  for (auto const& [dim, inter] : {std::pair<int64_t, int64_t>{200, 72}, {203, 37}})
    check_all(make(300, 16, dim, inter, 2, 1.f, seed + dim, {0, 1, 9, 200}));
}

BOOST_AUTO_TEST_CASE(moe_tc_flash_shape_bitwise) {
  uint64_t const seed = test_seed(613);
  // DeepSeek-V4.1-Flash expert shape (dim 5120, inter 2304), 6 experts top-2 plus the shared one: the CPU
  // reference costs 35 M emulated products per (row, expert), so 5 rows; batches of 1 and 2 rows are
  // check_all's sub-batches (row 2 alone, rows 0-1, rows 1-4), each against the CPU rows.
  check_all(make(5, 6, 5120, 2304, 2, 7.f, seed));
}

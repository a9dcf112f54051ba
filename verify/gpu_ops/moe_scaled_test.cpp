// SPDX-License-Identifier: Apache-2.0
/// MoeExperts<kCuda> with block-scaled routed experts (MoeExpertsDesc::routed_scaled: FP4 e2m1 with per-row-per-32
/// ue8m0 scales, as the native release layout stores them; FP8 e4m3 with 32×32-block scales, refused where
/// ops::tc_quant_format_fused does not allow it; the shared expert bf16, or block-scaled in either format as
/// MoeExpertsDesc::shared_scaled, the release storing it FP8) against the CPU op on the decoded weights (ops::scaled_weight), BIT FOR BIT, on bf16-valued inputs:
/// the Flash expert shape (5120 × 2304) and small ones, rows 1, 2, 5, 16, 48, 64 (experts with one or several tiles of
/// 8 assignments, a pruned slot), kAuto, kSkinny and kGemm (codes decoded in the tiles; and the experts decoded to
/// bf16 first, in groups of one expert and of all); a token alone and the first two rows as their own batch give their bits in the full batch; calls the
/// path does not take are refused.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "tessera/ops/linear.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "tessera/ops/moe.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_ops/device_buffer.hpp"

using namespace tessera;
using namespace tessera::verify;
using ops::MoeTcPath;

namespace {

std::vector<float> bf16_values(size_t n, uint64_t seed, float sd) {
  auto v = randn(n, seed, sd);
  for (auto& x : v) x = round_to_bf16(x);
  return v;
}

/// One block-scaled matrix [rows, cols]: codes, scales and the decoded values.
struct QMat {
  std::vector<uint8_t> q, s;
  std::vector<float> w;
};

QMat make_q(DType fmt, int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 g(seed);
  bool const fp4 = fmt == DType::kF4E2m1x2;
  int64_t const qcols = fp4 ? cols / 2 : cols, kb = (cols + 31) / 32, srows = fp4 ? rows : (rows + 31) / 32;
  QMat m;
  m.q.resize(static_cast<size_t>(rows * qcols));
  for (auto& b : m.q) {
    b = static_cast<uint8_t>(g());
    if (!fp4 && (b & 0x7F) == 0x7F) b &= 0xFE;  // e4m3 NaN codes are not weights
  }
  // Scales so that the decoded values have roughly the size of the bf16 experts' (codes up to 6 or 448).
  int const base = fp4 ? 122 : 116;
  m.s.resize(static_cast<size_t>(srows * kb));
  for (auto& b : m.s) b = static_cast<uint8_t>(base + g() % 3);
  m.w.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m.w[static_cast<size_t>(r * cols + c)] = ops::scaled_weight(fmt, m.q.data(), qcols, m.s.data(), kb, r, c);
  return m;
}

struct Problem {
  DType fmt = DType::kF4E2m1x2;
  DType shared_fmt = DType::kBf16;              // kF8E4m3 / kF4E2m1x2: the shared expert block-scaled (sq*)
  int64_t rows = 0, experts = 0, dim = 0, inter = 0, k = 0;
  float limit = 0.f;
  std::vector<float> x, wts;
  std::vector<int32_t> ids;
  std::vector<QMat> q1, q3, q2;                 // routed
  std::vector<float> sh1, sh3, sh2;             // shared (bf16 values; the decoded sq* when block-scaled)
  QMat sq1, sq3, sq2;                           // shared, block-scaled
  std::vector<DeviceBuffer<uint8_t>> bufs;      // codes and scales
  std::vector<DeviceBuffer<Bf16>> shared_bufs;
  DeviceBuffer<uint64_t> t1, t3, t2, u1, u3, u2;
  ops::MoeExpertsDeviceWeights dev;

  ops::MoeExpertsDesc desc(int64_t nr, MoeTcPath path) const {
    ops::MoeExpertsDesc d{nr, experts, dim, inter, k, limit, true, DType::kBf16, DType::kBf16};
    d.tc_path = path;
    d.routed_scaled = fmt;
    if (shared_fmt != DType::kBf16) d.shared_scaled = shared_fmt;
    return d;
  }

  void upload() {
    bufs.reserve(6 * static_cast<size_t>(experts) + 6);  // addresses of the elements are kept: no reallocation
    auto put = [&](std::vector<uint8_t> const& h) {
      bufs.emplace_back(h);
      return reinterpret_cast<uint64_t>(bufs.back().data());
    };
    std::vector<uint64_t> p1, p3, p2, s1, s3, s2;
    for (int64_t e = 0; e < experts; ++e) {
      p1.push_back(put(q1[e].q)); s1.push_back(put(q1[e].s));
      p3.push_back(put(q3[e].q)); s3.push_back(put(q3[e].s));
      p2.push_back(put(q2[e].q)); s2.push_back(put(q2[e].s));
    }
    t1.upload(p1); t3.upload(p3); t2.upload(p2); u1.upload(s1); u3.upload(s3); u2.upload(s2);
    dev.w1 = reinterpret_cast<void const* const*>(t1.data());
    dev.w3 = reinterpret_cast<void const* const*>(t3.data());
    dev.w2 = reinterpret_cast<void const* const*>(t2.data());
    dev.s1 = reinterpret_cast<void const* const*>(u1.data());
    dev.s3 = reinterpret_cast<void const* const*>(u3.data());
    dev.s2 = reinterpret_cast<void const* const*>(u2.data());
    if (shared_fmt != DType::kBf16) {  // codes and scales of the shared expert
      dev.shared_w1 = reinterpret_cast<void const*>(put(sq1.q)); dev.shared_s1 = reinterpret_cast<void const*>(put(sq1.s));
      dev.shared_w3 = reinterpret_cast<void const*>(put(sq3.q)); dev.shared_s3 = reinterpret_cast<void const*>(put(sq3.s));
      dev.shared_w2 = reinterpret_cast<void const*>(put(sq2.q)); dev.shared_s2 = reinterpret_cast<void const*>(put(sq2.s));
      return;
    }
    shared_bufs.reserve(3);
    for (auto const* h : {&sh1, &sh3, &sh2}) {
      std::vector<Bf16> hb(h->size());
      for (size_t i = 0; i < h->size(); ++i) hb[i] = Bf16::from_float((*h)[i]);
      shared_bufs.emplace_back(hb);
    }
    dev.shared_w1 = shared_bufs[0].data();
    dev.shared_w3 = shared_bufs[1].data();
    dev.shared_w2 = shared_bufs[2].data();
  }

  std::vector<float> cpu() const {
    ops::MoeExpertsDesc d{rows, experts, dim, inter, k, limit, true, DType::kBf16, DType::kF32};
    std::vector<TensorView<float const, 2>> v1, v3, v2;
    for (int64_t e = 0; e < experts; ++e) {
      v1.emplace_back(q1[e].w.data(), std::array<int64_t, 2>{inter, dim});
      v3.emplace_back(q3[e].w.data(), std::array<int64_t, 2>{inter, dim});
      v2.emplace_back(q2[e].w.data(), std::array<int64_t, 2>{dim, inter});
    }
    std::vector<float> out(static_cast<size_t>(rows * dim), -3.f);
    ops::MoeExpertsArgs a;
    a.x = TensorView<float const, 2>(x.data(), {rows, dim});
    a.ids = TensorView<int32_t const, 2>(ids.data(), {rows, k});
    a.weights = TensorView<float const, 2>(wts.data(), {rows, k});
    a.w1 = v1; a.w3 = v3; a.w2 = v2;
    a.shared_w1 = TensorView<float const, 2>(sh1.data(), {inter, dim});
    a.shared_w3 = TensorView<float const, 2>(sh3.data(), {inter, dim});
    a.shared_w2 = TensorView<float const, 2>(sh2.data(), {dim, inter});
    a.out = TensorView<float, 2>(out.data(), {rows, dim});
    ExecContext c;
    auto s = ops::dispatch<ops::MoeExperts>(c, d, a);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    return out;
  }

  Status gpu(int64_t r0, int64_t nr, MoeTcPath path, std::vector<float>* out,
             ops::TcQuantPath quant = ops::TcQuantPath::kAuto, int64_t decode_group = 0) const {
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
    ops::MoeExpertsDesc d = desc(nr, path);
    d.routed_quant_path = quant;
    d.decode_group_experts = decode_group;
    Status const s = ops::dispatch<ops::MoeExperts>(c, d, a);
    if (s.ok() && out) *out = dout.get();
    return s;
  }
};

Problem make(DType fmt, int64_t rows, int64_t experts, int64_t dim, int64_t inter, int64_t k, float limit, uint64_t seed,
             DType shared_fmt = DType::kBf16) {
  Problem p;
  p.fmt = fmt;
  p.shared_fmt = shared_fmt;
  p.rows = rows; p.experts = experts; p.dim = dim; p.inter = inter; p.k = k; p.limit = limit;
  p.x = bf16_values(static_cast<size_t>(rows * dim), seed, 1.f);
  p.wts = randn(static_cast<size_t>(rows * k), seed + 1, 0.3f, 0.5f);
  std::mt19937_64 g(seed + 2);
  p.ids.resize(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < k; ++s) {
      int32_t e;
      do {
        e = static_cast<int32_t>(g() % static_cast<uint64_t>(experts));
      } while (std::find(&p.ids[r * k], &p.ids[r * k + s], e) != &p.ids[r * k + s]);
      p.ids[r * k + s] = e;
    }
  int64_t const pruned = (rows / 2) * k + k - 1;
  p.ids[pruned] = -1;
  p.wts[pruned] = 0.f;
  for (int64_t e = 0; e < experts; ++e) {
    p.q1.push_back(make_q(fmt, inter, dim, seed + 10 + e));
    p.q3.push_back(make_q(fmt, inter, dim, seed + 1000 + e));
    p.q2.push_back(make_q(fmt, dim, inter, seed + 2000 + e));
  }
  float const s1 = 1.f / std::sqrt(static_cast<float>(dim)), s2 = 1.f / std::sqrt(static_cast<float>(inter));
  p.sh1 = bf16_values(static_cast<size_t>(inter * dim), seed + 3, 2.f * s1);
  p.sh3 = bf16_values(static_cast<size_t>(inter * dim), seed + 4, 2.f * s1);
  p.sh2 = bf16_values(static_cast<size_t>(dim * inter), seed + 5, 2.f * s2);
  if (shared_fmt != DType::kBf16) {
    p.sq1 = make_q(shared_fmt, inter, dim, seed + 3);
    p.sq3 = make_q(shared_fmt, inter, dim, seed + 4);
    p.sq2 = make_q(shared_fmt, dim, inter, seed + 5);
    p.sh1 = p.sq1.w;
    p.sh3 = p.sq3.w;
    p.sh2 = p.sq2.w;
  }
  p.upload();
  return p;
}

void check(Problem const& p) {
  auto const cpu = p.cpu();
  int64_t nonzero = 0;
  for (float v : cpu) nonzero += v != 0.f;
  BOOST_TEST(nonzero > static_cast<int64_t>(cpu.size()) / 2);
  std::string const fmt = std::string(p.fmt == DType::kF8E4m3 ? "fp8" : "fp4") +
                          (p.shared_fmt == DType::kBf16 ? "" : p.shared_fmt == DType::kF8E4m3 ? "+shared fp8" : "+shared fp4");
  for (MoeTcPath path : {MoeTcPath::kAuto, MoeTcPath::kSkinny, MoeTcPath::kGemm}) {
    std::vector<float> gpu;
    Status const s = p.gpu(0, p.rows, path, &gpu);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    int64_t const diff = count_bit_diffs(gpu, cpu, "moe block-scaled vs cpu");
    std::printf("moe %s routed rows=%lld experts=%lld dim=%lld inter=%lld path=%s: %lld/%zu outputs differ from the CPU\n",
                fmt.c_str(), static_cast<long long>(p.rows), static_cast<long long>(p.experts), static_cast<long long>(p.dim),
                static_cast<long long>(p.inter),
                path == MoeTcPath::kAuto ? (ops::moe_tc_path_for(p.desc(p.rows, path)) == MoeTcPath::kGemm ? "auto(gemm)" : "auto")
                : path == MoeTcPath::kSkinny ? "skinny" : "gemm",
                static_cast<long long>(diff), gpu.size());
    BOOST_TEST_INFO(fmt << " rows " << p.rows << " dim " << p.dim << " inter " << p.inter);
    BOOST_TEST(diff == 0);
  }
  // kGemm decoding the experts to bf16 first: one expert per group (every group boundary, the shared expert with
  // the first group) and all in one group. (Without decode groups kGemm decodes the codes in its tiles, above.)
  for (int64_t group : {int64_t{1}, p.experts}) {
    std::vector<float> grouped;
    Status const s = p.gpu(0, p.rows, MoeTcPath::kGemm, &grouped, ops::TcQuantPath::kAuto, group);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    int64_t const diff = count_bit_diffs(grouped, cpu, "moe block-scaled gemm, experts decoded first, vs cpu");
    std::printf("moe %s routed rows=%lld gemm, decoded first in groups of %lld: %lld/%zu outputs differ from the CPU\n",
                fmt.c_str(), static_cast<long long>(p.rows), static_cast<long long>(group), static_cast<long long>(diff),
                grouped.size());
    BOOST_TEST(diff == 0);
  }
  // One quantised path forced on the same call: the CPU's bits.
  auto check_quant_path = [&](MoeTcPath path, ops::TcQuantPath quant, char const* name) {
    std::vector<float> out;
    Status const s = p.gpu(0, p.rows, path, &out, quant);
    BOOST_REQUIRE_MESSAGE(s.ok(), s.to_string());
    int64_t const diff = count_bit_diffs(out, cpu, (std::string("moe block-scaled ") + name + " vs cpu").c_str());
    std::printf("moe %s routed rows=%lld %s path: %lld/%zu outputs differ from the CPU\n", fmt.c_str(),
                static_cast<long long>(p.rows), name, static_cast<long long>(diff), out.size());
    BOOST_TEST_INFO(fmt << " rows " << p.rows << " " << name);
    BOOST_TEST(diff == 0);
  };
  // The ring path (codes through shared memory): the direct path's bits, which kAuto took where rows ≤
  // kTcDirectMaxRows.
  check_quant_path(MoeTcPath::kAuto, ops::TcQuantPath::kRing, "ring");
  // The direct path (one warp per 8 columns; codes through its shared-memory ring from K = 2048, else registers)
  // wherever its x rows fit: kAuto takes it up to kTcDirectMaxRows tokens; above that its tiles hold at most that
  // many assignments. The same bits at every row count.
  int64_t const dr = std::min<int64_t>(p.rows, ops::kTcDirectMaxRows);
  if (ops::tc_quant_direct_fits(dr, p.dim) && ops::tc_quant_direct_fits(dr, p.inter))
    check_quant_path(MoeTcPath::kSkinny, ops::TcQuantPath::kDirect, "direct");
  // The warp-specialised path (four warps decode, one runs the mma chain) on the skinny tiles.
  check_quant_path(MoeTcPath::kSkinny, ops::TcQuantPath::kWarpSpec, "warp-specialised");
  auto rows_of = [&](int64_t r0, int64_t nr) {
    return std::vector<float>(cpu.begin() + r0 * p.dim, cpu.begin() + (r0 + nr) * p.dim);
  };
  std::vector<float> part;
  int64_t const one = p.rows / 2;
  BOOST_REQUIRE(p.gpu(one, 1, MoeTcPath::kAuto, &part).ok());
  BOOST_TEST(count_bit_diffs(part, rows_of(one, 1), "moe block-scaled alone") == 0);
  if (p.rows > 2) {
    BOOST_REQUIRE(p.gpu(0, 2, MoeTcPath::kAuto, &part).ok());
    BOOST_TEST(count_bit_diffs(part, rows_of(0, 2), "moe block-scaled first two") == 0);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(moe_scaled)

std::vector<DType> fused_formats() {
  std::vector<DType> f;
  for (DType t : {DType::kF4E2m1x2, DType::kF8E4m3})
    if (ops::tc_quant_format_fused(t)) f.push_back(t);
  return f;
}

BOOST_AUTO_TEST_CASE(flash_expert_shape) {
  for (DType fmt : fused_formats())
    for (int64_t rows : {1, 2, 4, 5, 48})  // 48 rows: 288 assignments, kAuto takes kGemm (≥ 32 per expert)
      check(make(fmt, rows, 8, 5120, 2304, 6, 10.f, 300 + static_cast<uint64_t>(rows)));
}

BOOST_AUTO_TEST_CASE(small_shapes_many_rows) {
  uint64_t seed = 800;
  for (DType fmt : fused_formats())
    for (int64_t rows : {1, 16, 64}) {
      check(make(fmt, rows, 6, 256, 96, 4, 0.f, seed++));  // ≥ 8 assignments per expert at 16 and 64 rows: several tiles
      check(make(fmt, rows, 20, 544, 160, 6, 7.f, seed++));
    }
}

// The shared expert block-scaled (MoeExpertsDesc::shared_scaled): every routed × shared pair of fused formats on
// small shapes (one row: the direct tiles; 16 and 64 rows: warp-specialised; kGemm: on sm_90a the wgmma tiles on
// the shared expert's codes, with decode groups and on the mma.sync tiles the shared expert decoded to bf16 first),
// and the release's pair, FP4 routed + FP8 shared, at the Flash expert shape.
BOOST_AUTO_TEST_CASE(block_scaled_shared_expert) {
  uint64_t seed = 900;
  for (DType fmt : fused_formats())
    for (DType sfmt : fused_formats())
      for (int64_t rows : {1, 16, 64}) {
        check(make(fmt, rows, 6, 256, 96, 4, 0.f, seed++, sfmt));
        check(make(fmt, rows, 20, 544, 160, 6, 7.f, seed++, sfmt));
      }
  if (ops::tc_quant_format_fused(DType::kF4E2m1x2) && ops::tc_quant_format_fused(DType::kF8E4m3))
    for (int64_t rows : {1, 2, 5, 48})
      check(make(DType::kF4E2m1x2, rows, 8, 5120, 2304, 6, 10.f, 950 + static_cast<uint64_t>(rows), DType::kF8E4m3));
}

BOOST_AUTO_TEST_CASE(refuses_what_it_does_not_take) {
  Problem const p = make(DType::kF4E2m1x2, 4, 6, 256, 96, 4, 0.f, 77);
  BOOST_TEST((p.gpu(0, 4, MoeTcPath::kEmulated, nullptr).code() == StatusCode::kInvalidArgument));
  BOOST_TEST((p.gpu(0, 4, MoeTcPath::kGemm, nullptr, ops::TcQuantPath::kAuto, -1).code() == StatusCode::kInvalidArgument));
  Problem q = make(DType::kF4E2m1x2, 4, 6, 256, 96, 4, 0.f, 78);
  q.dev.s2 = nullptr;
  BOOST_TEST((q.gpu(0, 4, MoeTcPath::kAuto, nullptr).code() == StatusCode::kInvalidArgument));
  // A block-scaled shared expert without its scales, or with codes off 16-byte alignment.
  Problem sh = make(DType::kF4E2m1x2, 4, 6, 256, 96, 4, 0.f, 80, DType::kF8E4m3);
  sh.dev.shared_s3 = nullptr;
  BOOST_TEST((sh.gpu(0, 4, MoeTcPath::kAuto, nullptr).code() == StatusCode::kInvalidArgument));
  Problem sa = make(DType::kF4E2m1x2, 4, 6, 256, 96, 4, 0.f, 81, DType::kF8E4m3);
  sa.dev.shared_w2 = static_cast<uint8_t const*>(sa.dev.shared_w2) + 4;
  BOOST_TEST((sa.gpu(0, 4, MoeTcPath::kAuto, nullptr).code() == StatusCode::kInvalidArgument));
  if (!ops::tc_quant_format_fused(DType::kF8E4m3)) {  // no verified fused FP8 tile: refused
    Problem const r = make(DType::kF8E4m3, 4, 6, 256, 96, 4, 0.f, 79);
    BOOST_TEST((r.gpu(0, 4, MoeTcPath::kAuto, nullptr).code() == StatusCode::kNotSupported));
  }
}

BOOST_AUTO_TEST_SUITE_END()

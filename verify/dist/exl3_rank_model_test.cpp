// SPDX-License-Identifier: Apache-2.0
/// EXL3 weights on ranks (docs/multi-gpu.md "EXL3 weights on ranks"): CPU rank models of a synthetic exl3:2.5
/// checkpoint (`make-synthetic --format exl3:B`) whose every projection, head and expert linear is an EXL3 group.
/// Dimensions: hidden 128, head_dim 128, o_lora_rank 128, moe_inter 128, 4 heads in 2 o-groups, vocabulary 512, so
/// the TP 2 / TP 4 parts of wq_b, wo_a and the LM head are whole 128-column blocks (exact tile-column slices), while
/// wo_b's rows (64 / 32 a rank) and the shared expert's rows (64 / 32) cut a block (the rank holds the covering block
/// and keeps its rows of its outputs). The all-reduce at TP 2 cuts wo_b's inputs on its o-groups (128 each).
/// What is checked, and why:
///   * every rank's EXL3 parts equal the group cut by hand per spec/exl3.md §1.4, byte for byte (written here
///     element by element, independent of slice_exl3): output rows [n0, n1) → covering blocks [b0, b1), trellis
///     [:, b0/16 : b1/16, :], svh[b0:b1], suh whole, kept [n0 − b0, n1 − b0), the group's n recorded (whole_n);
///     input columns → trellis [k0/16 : k1/16], suh[k0:k1], svh whole; held routed experts whole, the others absent;
///   * the bytes a rank holds in EXL3 form are exactly those parts', which plan_memory counts for the checkpoint's
///     EXL3 tensors (trellis, suh, svh), and its dense tensors of the split weights stay undefined (no dequantised copy);
///   * gather plans (TP 2, TP 4 head gather, EP 2, TP = EP = 2): chunked prefill + decode logits of the rank models
///     (thread ranks, in-process communicator) equal the single-rank model's bit for bit (fp32 and, at TP = EP = 2,
///     bf16): a part's outputs are bits of the whole EXL3 product (each output is its column's float64 sum over all
///     inputs and its own 128-block's output Hadamard);
///   * TP 2 all-reduce (wo_b an input split): the rank-order sum of fp32 partial products differs from the single
///     product in rounding only; gate as docs/multi-gpu.md's all-reduce: teacher-forced top-1 agreement outside
///     near-ties (top-1/top-2 gap ≤ 1e-3);
///   * rank host models (load_rank_host_model, one per rank) hold the same EXL3 parts and dense tensors as the parts
///     cut from the whole host model, byte for byte, and their rank models give the single-rank logits bit for bit;
///   * refused with a clear error: an input split off 128-input blocks, a layer mixing EXL3 and dense expert linears.
/// The GPU rank models of the same checkpoint: exl3_gpu_rank_model_test.cpp (verify_dist_gpu_model_cpu / _gpu_model).
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <random>

#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/dist/rank_host_check.hpp"
#include "verify/dist/synthetic_folder.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;

namespace {

struct Exl3Folder : verify::SyntheticFolder {
  Exl3Folder() : SyntheticFolder("exl3_rank", verify::exl3_rank_config(), 47, *exl3_format(2.5), true) {}
};

Exl3Folder& folder() {
  static Exl3Folder f;
  return f;
}

ModelOptions opts(Numerics n) {
  ModelOptions o;
  o.numerics = n;
  return o;
}

/// The whole single-rank model (EXL3 linears as stored), one per numerics.
Dsv41Model const& full(Numerics n) {
  static std::unique_ptr<Dsv41Model> m[2];
  auto& p = m[n == Numerics::kBf16];
  if (!p) p = load_model(folder().dir.string(), opts(n)).value_or_throw();
  return *p;
}

dist::ShardingPlan plan_of(dist::ParallelConfig c) { return dist::make_plan(model_dims(full(Numerics::kFp32).spec()), c).value_or_throw(); }

dist::ParallelConfig allreduce(int tp) {
  dist::ParallelConfig c = verify::tp_ep(tp, 1);
  c.attn = dist::AttnCombine::kAllReduce;
  return c;
}

/// The whole model's weights (rank_weights of the one-rank plan cuts nothing).
Weights whole_weights(Dsv41Model const& m) {
  RankShard one{dist::make_plan(model_dims(m.spec()), verify::tp_ep(1, 1)).value_or_throw(), 0, nullptr};
  return rank_weights(m, one).value_or_throw();
}

/// spec/exl3.md §1.4 by hand. Output rows [n0, n1): the covering 128-blocks [b0, b1); input columns [k0, k1).
Exl3Weight hand_part(Exl3Weight const& q, WeightPart p) {
  int64_t const k = q.desc.k, n = q.desc.n, wpt = q.trellis.dim(2);
  Exl3Weight o;
  o.desc = q.desc;
  o.name = q.name;
  int16_t const* t = q.trellis.data_as<int16_t>();
  auto at = [&](int64_t a, int64_t b, int64_t w) { return t[(a * (n / 16) + b) * wpt + w]; };
  if (p.cols) {
    o.desc.k = p.end - p.begin;
    o.trellis = Tensor::zeros(DType::kI16, {o.desc.k / 16, n / 16, wpt});
    int16_t* d = o.trellis.data_as<int16_t>();
    for (int64_t a = p.begin / 16; a < p.end / 16; ++a)
      for (int64_t b = 0; b < n / 16; ++b)
        for (int64_t w = 0; w < wpt; ++w) d[((a - p.begin / 16) * (n / 16) + b) * wpt + w] = at(a, b, w);
    for (int64_t i = p.begin; i < p.end; ++i) o.suh.push_back(q.suh[i]);
    o.svh = q.svh;
    return o;
  }
  int64_t const b0 = p.begin - p.begin % 128, b1 = std::min(n, p.end + (128 - p.end % 128) % 128);
  o.desc.n = b1 - b0;
  o.trellis = Tensor::zeros(DType::kI16, {k / 16, o.desc.n / 16, wpt});
  int16_t* d = o.trellis.data_as<int16_t>();
  for (int64_t a = 0; a < k / 16; ++a)
    for (int64_t b = b0 / 16; b < b1 / 16; ++b)
      for (int64_t w = 0; w < wpt; ++w) d[(a * (o.desc.n / 16) + b - b0 / 16) * wpt + w] = at(a, b, w);
  o.suh = q.suh;
  for (int64_t j = b0; j < b1; ++j) o.svh.push_back(q.svh[j]);
  o.whole_n = n;
  if (p.begin != b0 || p.end != b1) {
    o.kept_begin = p.begin - b0;
    o.kept_end = p.end - b0;
  }
  return o;
}

bool same_exl3(Exl3Weight const& a, Exl3Weight const& b) {
  return a.desc.k == b.desc.k && a.desc.n == b.desc.n && a.desc.k2 == b.desc.k2 && a.desc.codebook == b.desc.codebook &&
         a.kept_begin == b.kept_begin && a.kept_end == b.kept_end && a.whole_n == b.whole_n && a.suh == b.suh &&
         a.svh == b.svh && verify::same_bytes(a.trellis, b.trellis);
}

size_t exl3_bytes(Exl3Weight const& q) { return q.trellis.nbytes() + 2 * (q.suh.size() + q.svh.size()); }

/// The EXL3 part rank `rank` of `plan` holds under `key` by hand: nullopt when it holds none (another rank's expert).
std::optional<Exl3Weight> expected(Exl3Weight const& q, std::string const& key, RankParts const& parts,
                                   dist::ShardingPlan const& plan, int rank) {
  auto ends = [&](char const* s) { return key.size() >= std::strlen(s) && key.compare(key.size() - std::strlen(s), std::string::npos, s) == 0; };
  std::optional<WeightPart> p;
  if (ends(".wq_b")) p = parts.wq_b;
  else if (ends(".wo_a")) p = parts.wo_a;
  else if (ends(".wo_b")) p = parts.wo_b;
  else if (ends(".shared.w1") || ends(".shared.w3")) p = parts.shared_in;
  else if (ends(".shared.w2")) p = parts.shared_out;
  else if (key == "lm_head") p = parts.lm_head;
  size_t const e = key.find(".experts.");
  if (e != std::string::npos && plan.cfg.ep > 1 &&
      !plan.ranks[static_cast<size_t>(rank)].experts.contains(std::stoll(key.substr(e + 9))))
    return std::nullopt;
  return p ? hand_part(q, *p) : q;
}

/// The checkpoint's EXL3 group tensors: `P.trellis`, `P.suh`, `P.svh` (the codebook markers left out).
std::vector<io::TensorInfo> exl3_tensors() {
  std::vector<io::TensorInfo> out;
  auto const ckpt = io::Checkpoint::open(folder().checkpoint()).value_or_throw();
  for (auto const& t : ckpt.tensors())
    for (char const* suffix : {".trellis", ".suh", ".svh"})
      if (t.name.size() > std::strlen(suffix) && t.name.compare(t.name.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
        out.push_back(t);
  BOOST_TEST_REQUIRE(!out.empty());
  return out;
}

/// Checks every rank's EXL3 parts of `cfg` against the hand cut; counts the parts with kept rows and the exact slices.
void check_parts(Numerics n, dist::ParallelConfig cfg, int* kept_seen, int* exact_seen) {
  Dsv41Model const& m = full(n);
  Weights const all = whole_weights(m);
  auto const plan = plan_of(cfg);
  auto const memory = plan_memory(plan, m.spec(), exl3_tensors());
  for (int r = 0; r < plan.world; ++r) {
    RankShard sh{plan, r, nullptr};
    Weights const w = rank_weights(m, sh).value_or_throw();
    RankParts const parts = rank_parts(m.spec(), plan, r, m.engram()).value_or_throw();
    size_t want_bytes = 0, held = 0;
    for (auto const& [key, q] : all.exl3) {
      auto const want = expected(q, key, parts, plan, r);
      Exl3Weight const* got = w.exl3_of(key);
      BOOST_TEST((got != nullptr) == want.has_value(), verify::tp_ep_name(cfg) << " rank " << r << " " << key);
      if (!got || !want) continue;
      BOOST_TEST(same_exl3(*got, *want), verify::tp_ep_name(cfg) << " rank " << r << " " << key);
      want_bytes += exl3_bytes(*want);
      if (want->kept_end >= 0) ++*kept_seen;
      else if (want->desc.n != q.desc.n || want->desc.k != q.desc.k) ++*exact_seen;
    }
    for (auto const& [key, q] : w.exl3) held += exl3_bytes(q);
    BOOST_TEST(w.exl3.size() <= all.exl3.size());
    BOOST_TEST(held == want_bytes, verify::tp_ep_name(cfg) << " rank " << r << ": EXL3 bytes held");
    // plan_memory of the checkpoint's EXL3 tensors (trellis, suh, svh; markers aside) counts exactly these parts.
    BOOST_TEST(held == memory[static_cast<size_t>(r)], verify::tp_ep_name(cfg) << " rank " << r << ": plan_memory");
    // No dense copy of a split EXL3 weight.
    for (auto const& L : w.layers) {
      BOOST_TEST(!L.wq_b.defined());
      BOOST_TEST(!L.wo_b.defined());
      BOOST_TEST(!L.shared.w1.defined());
    }
    BOOST_TEST(!w.lm_head.defined());
  }
}

std::vector<int32_t> tokens() {
  std::mt19937 rng(11);
  std::vector<int32_t> t(26);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 512u);
  return t;
}

std::vector<float> single_logits(Numerics n) {
  static std::vector<float> cache[2];
  auto& c = cache[n == Numerics::kBf16];
  if (c.empty()) {
    auto one = load_model(folder().dir.string(), opts(n)).value_or_throw();
    c = verify::schedule_logits(*one, tokens());
  }
  return c;
}

std::vector<std::vector<float>> rank_logits(Numerics n, dist::ParallelConfig cfg) {
  Dsv41Model const& m = full(n);
  auto const plan = plan_of(cfg);
  std::vector<Dsv41Model const*> hosts(static_cast<size_t>(plan.world), &m);
  return verify::run_ranks(hosts, plan, tokens());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_exl3_rank_model)

BOOST_AUTO_TEST_CASE(parts_are_the_groups_cut_per_spec) {
  int kept = 0, exact = 0;
  for (auto c : {verify::tp_ep(2, 1), verify::tp_ep(4, 1), verify::tp_ep(1, 2), verify::tp_ep(2, 2), allreduce(2)})
    check_parts(Numerics::kFp32, c, &kept, &exact);
  // Both kinds of part met: covering blocks with kept rows (wo_b, shared expert) and exact block slices.
  BOOST_TEST(kept > 0);
  BOOST_TEST(exact > 0);
}

BOOST_AUTO_TEST_CASE(gather_plans_bit_exact) {
  for (auto c : {verify::tp_ep(2, 1), verify::tp_ep(4, 1), verify::tp_ep(1, 2), verify::tp_ep(2, 2)}) {
    auto const got = rank_logits(Numerics::kFp32, c);
    for (size_t r = 0; r < got.size(); ++r)
      BOOST_TEST(verify::bitwise_equal(got[r], single_logits(Numerics::kFp32)), verify::tp_ep_name(c) << " rank " << r);
  }
  auto const b = rank_logits(Numerics::kBf16, verify::tp_ep(2, 2));
  for (size_t r = 0; r < b.size(); ++r)
    BOOST_TEST(verify::bitwise_equal(b[r], single_logits(Numerics::kBf16)), "bf16 tp2 ep2 rank " << r);
}

BOOST_AUTO_TEST_CASE(allreduce_top1) {
  auto const got = rank_logits(Numerics::kFp32, allreduce(2));
  auto const& want = single_logits(Numerics::kFp32);
  int64_t const V = 512;
  verify::Top1 const t = verify::top1_agreement(want, got[0], V, 1e-3f);
  BOOST_TEST_MESSAGE("exl3 tp2 all-reduce: top-1 " << t.agree << "/" << t.rows << ", near-ties " << t.ties
                                                   << ", max |dlogit| " << t.max_diff);
  BOOST_TEST(t.rows > 0);
  BOOST_TEST(t.agree + t.ties == t.rows);
  for (size_t r = 1; r < got.size(); ++r) BOOST_TEST(verify::bitwise_equal(got[r], got[0]));
}

BOOST_AUTO_TEST_CASE(input_split_partials_sum_to_the_product) {
  // wo_b's two 128-input parts (the TP 2 all-reduce): Σ_r partial_r = the whole product up to fp32 rounding of the
  // partial epilogues (measured relative to the largest output; a wrong suh / tile-row cut is O(1)).
  Weights const all = whole_weights(full(Numerics::kFp32));
  Exl3Weight const& q = *all.exl3_of(scaled_weight_key(2, "wo_b"));
  int64_t const rows = 3, k = q.desc.k, n = q.desc.n;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(rows * k)), whole(static_cast<size_t>(rows * n)), sum(whole.size(), 0.f);
  for (auto& v : x) v = nd(rng);
  ExecContext ctx;
  linear_exl3(ctx, x.data(), rows, q, whole.data(), DType::kF32);
  for (int64_t k0 = 0; k0 < k; k0 += 128) {
    Exl3Weight const part = slice_exl3(q, WeightPart{k0, k0 + 128, true}).value_or_throw();
    std::vector<float> xp(static_cast<size_t>(rows * 128)), yp(whole.size());
    for (int64_t r = 0; r < rows; ++r) std::copy(&x[r * k + k0], &x[r * k + k0 + 128], &xp[r * 128]);
    linear_exl3(ctx, xp.data(), rows, part, yp.data(), DType::kF32);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += yp[i];
  }
  double err = 0, scale = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    err = std::max(err, std::abs(double(sum[i]) - whole[i]));
    scale = std::max(scale, std::abs(double(whole[i])));
  }
  BOOST_TEST(err <= 1e-5 * scale, "max error " << err << " of " << scale);
}

BOOST_AUTO_TEST_CASE(rank_host_models) {
  auto mf = open_model_folder(folder().dir.string()).value_or_throw();
  for (auto c : {verify::tp_ep(2, 1), verify::tp_ep(2, 2)}) {
    auto const plan = plan_of(c);
    std::vector<std::unique_ptr<Dsv41Model>> hosts;
    std::vector<Dsv41Model const*> ptrs;
    for (int r = 0; r < plan.world; ++r) {
      hosts.push_back(load_rank_host_model(mf.spec, mf.src, opts(Numerics::kFp32), plan, r).value_or_throw());
      ptrs.push_back(hosts.back().get());
      RankShard sh{plan, r, nullptr};
      Weights const got = rank_weights(*hosts.back(), sh).value_or_throw();
      Weights const want = rank_weights(full(Numerics::kFp32), sh).value_or_throw();
      auto const g = verify::tensors_of(got), w = verify::tensors_of(want);
      for (size_t i = 0; i < g.size(); ++i) BOOST_TEST(verify::same_bytes(*g[i].second, *w[i].second), g[i].first);
      BOOST_TEST(got.exl3.size() == want.exl3.size());
      for (auto const& [key, q] : want.exl3) {
        Exl3Weight const* o = got.exl3_of(key);
        BOOST_TEST((o && same_exl3(*o, q)), verify::tp_ep_name(c) << " rank " << r << " " << key);
      }
      BOOST_TEST(hosts.back()->weight_bytes() < full(Numerics::kFp32).weight_bytes());
    }
    auto const logits = verify::run_ranks(ptrs, plan, tokens());
    for (size_t r = 0; r < logits.size(); ++r)
      BOOST_TEST(verify::bitwise_equal(logits[r], single_logits(Numerics::kFp32)), verify::tp_ep_name(c) << " rank " << r);
  }
}

BOOST_AUTO_TEST_CASE(refusals) {
  Weights const all = whole_weights(full(Numerics::kFp32));
  Exl3Weight const& wo_b = *all.exl3_of(scaled_weight_key(0, "wo_b"));
  auto bad = slice_exl3(wo_b, WeightPart{0, 64, true});
  BOOST_TEST((bad.status().code() == StatusCode::kNotSupported));
  BOOST_TEST(bad.status().message().find("128") != std::string::npos, bad.status().message());
  auto twice = slice_exl3(slice_exl3(wo_b, WeightPart{0, 64, false}).value_or_throw(), WeightPart{0, 32, false});
  BOOST_TEST((twice.status().code() == StatusCode::kNotSupported));
  // A layer whose routed experts are EXL3 and whose shared w2 is dense.
  Weights mixed = all;
  Exl3Weight const q = *mixed.exl3_of(exl3_shared_key(1, "w2"));
  mixed.exl3.erase(exl3_shared_key(1, "w2"));
  mixed.layers[1].shared.w2 = exl3_effective_weight(q);
  Status const s = check_exl3_weights(full(Numerics::kFp32).spec(), mixed, true);
  BOOST_TEST((s.code() == StatusCode::kNotSupported));
  BOOST_TEST(s.message().find("layer 1 mixes EXL3 and dense expert linears") != std::string::npos, s.message());
  BOOST_TEST(check_exl3_weights(full(Numerics::kFp32).spec(), all, true).ok());
}

BOOST_AUTO_TEST_SUITE_END()

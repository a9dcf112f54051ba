// SPDX-License-Identifier: Apache-2.0
/// The host model of the CLI's sharded paths (`serve --tp/--ep` in threads or one process per rank, `verify golden
/// --tp/--ep`): rank_host_options / load_rank_host_model on a model folder written by make-synthetic's FP8 format
/// (FP8 e4m3 projections with 32×32 ue8m0 blocks, FP4 e2m1 routed experts).
///  * The options: weights_as_stored exactly in bf16 numerics (fp32 refuses it), every other option kept.
///  * bf16: every rank of TP 2, TP 4, EP 2, EP 4, TP = EP = 2 holds the checkpoint's bytes: its stored slices are
///    plan_memory of the block-scaled tensors byte for byte, and its weight bytes are the dense-sliced rank's less
///    exactly Σ (4·values − codes − scales) over them; the ranks' logits equal the single-rank dequantised model's
///    bit for bit.
///  * fp32: the host model holds no stored form and the weight bytes of the plain fp32 model.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <random>

#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/common/random.hpp"
#include "verify/dist/rank_host_check.hpp"
#include "verify/dist/synthetic_folder.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;

namespace {

using verify::tp_ep_name;
dist::ParallelConfig cfg(int tp, int ep) { return verify::tp_ep(tp, ep); }
std::string name_of(dist::ParallelConfig const& c) { return tp_ep_name(c); }

ModelOptions opts(Numerics n) {
  ModelOptions o;
  o.numerics = n;
  return o;
}

/// The FP8-format synthetic folder of the wide block configuration, with the golden Engram hash data.
struct Fp8Folder : verify::SyntheticFolder {
  Fp8Folder() : SyntheticFolder("rank_host", verify::wide_block_config(), 71, *native_fp8_format(), true) {}
  std::vector<io::TensorInfo> tensors() const { return io::Checkpoint::open(checkpoint()).value_or_throw().tensors(); }
};

Fp8Folder& folder() {
  static Fp8Folder f;
  return f;
}

/// The checkpoint tensors a weights_as_stored model holds as stored: FP8 projections (not the shared experts or the
/// Engram tables, which the loader dequantises) and FP4 routed experts, codes and scales.
std::vector<io::TensorInfo> stored_tensors(std::vector<io::TensorInfo> const& all) {
  std::vector<io::TensorInfo> out;
  for (auto const& t : all) {
    bool const quant = t.dtype == DType::kF8E4m3 || t.dtype == DType::kI8 || t.dtype == DType::kE8m0;
    if (quant && t.name.find("shared_experts") == std::string::npos && t.name.find("engram.embed") == std::string::npos)
      out.push_back(t);
  }
  return out;
}

size_t stored_bytes(Weights const& w) {
  size_t b = 0;
  for (auto const& [key, sw] : w.scaled) b += sw.codes.nbytes() + sw.scales.nbytes();
  return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_rank_host_model)

BOOST_AUTO_TEST_CASE(options_hold_weights_as_stored_in_bf16_only) {
  ModelOptions o = opts(Numerics::kBf16);
  o.max_rollback = 7;
  o.prune.top_p = 0.5f;
  ModelOptions const b = rank_host_options(o);
  BOOST_TEST(b.weights_as_stored);
  BOOST_TEST(b.max_rollback == 7);
  BOOST_TEST(b.prune.top_p == 0.5f);
  BOOST_TEST((b.numerics == Numerics::kBf16));
  ModelOptions f = opts(Numerics::kFp32);
  f.weights_as_stored = true;  // refused by the fp32 model: the helper clears it
  BOOST_TEST(!rank_host_options(f).weights_as_stored);
}

BOOST_AUTO_TEST_CASE(bf16_ranks_hold_the_stored_slices_bit_for_bit) {
  Fp8Folder& f = folder();
  auto host = load_rank_host_model(f.dir.string(), opts(Numerics::kBf16)).value_or_throw();
  auto dense = load_model(f.dir.string(), opts(Numerics::kBf16)).value_or_throw();
  ModelSpec const& spec = host->spec();
  auto const want_tensors = stored_tensors(f.tensors());
  BOOST_TEST_REQUIRE(!want_tensors.empty());
  // One rank: the host model holds every stored tensor of the checkpoint, and nothing of it dense.
  auto const one = dist::make_plan(model_dims(spec), cfg(1, 1)).value_or_throw();
  Weights const whole = rank_weights(*host, RankShard{one, 0, nullptr}).value_or_throw();
  size_t file_bytes = 0;
  for (auto const& t : want_tensors) file_bytes += t.nbytes;
  BOOST_TEST(stored_bytes(whole) == file_bytes);
  BOOST_TEST(host->weight_bytes() < dense->weight_bytes());

  std::mt19937_64 g(verify::test_seed(72));
  std::vector<int32_t> toks(32);
  for (auto& t : toks) t = static_cast<int32_t>(g() % 512);
  auto const base = verify::schedule_logits(*dense, toks);
  for (auto const& c : {cfg(2, 1), cfg(4, 1), cfg(1, 2), cfg(1, 4), cfg(2, 2)}) {
    auto const plan = dist::make_plan(model_dims(spec), c).value_or_throw();
    auto const want = plan_memory(plan, spec, want_tensors);
    auto stored_ranks = ShardedModel::create(*host, c).value_or_throw();
    auto dense_ranks = ShardedModel::create(*dense, c).value_or_throw();
    for (int r = 0; r < plan.world; ++r) {
      Weights const rw = rank_weights(*host, RankShard{plan, r, nullptr}).value_or_throw();
      BOOST_TEST(stored_bytes(rw) == want[static_cast<size_t>(r)], "plan_memory, rank " << r << " " << name_of(c));
      size_t saved = 0;
      for (auto const& [key, sw] : rw.scaled) saved += 4 * static_cast<size_t>(sw.rows * sw.cols) - sw.codes.nbytes() - sw.scales.nbytes();
      auto const& s = static_cast<Dsv41Model&>(stored_ranks->rank_model(r));
      auto const& d = static_cast<Dsv41Model&>(dense_ranks->rank_model(r));
      BOOST_TEST_REQUIRE(s.weight_bytes() < d.weight_bytes());
      BOOST_TEST(d.weight_bytes() - s.weight_bytes() == saved, "rank " << r << " " << name_of(c));
    }
    BOOST_TEST(verify::bitwise_equal(verify::schedule_logits(*stored_ranks, toks), base), name_of(c) << ": ranks vs one dense rank");
  }
}

BOOST_AUTO_TEST_CASE(fp32_host_model_keeps_dense_weights) {
  Fp8Folder& f = folder();
  auto host = load_rank_host_model(f.dir.string(), opts(Numerics::kFp32)).value_or_throw();
  auto plain = load_model(f.dir.string(), opts(Numerics::kFp32)).value_or_throw();
  auto const one = dist::make_plan(model_dims(host->spec()), cfg(1, 1)).value_or_throw();
  BOOST_TEST(rank_weights(*host, RankShard{one, 0, nullptr}).value_or_throw().scaled.empty());
  BOOST_TEST(host->weight_bytes() == plain->weight_bytes());
}

BOOST_AUTO_TEST_SUITE_END()

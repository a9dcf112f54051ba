// SPDX-License-Identifier: Apache-2.0
/// A rank's host model reads only what its rank holds (load_rank_host_model with a plan and rank, load_rank_host; one
/// process per rank): its routed experts and its parts of the tensor-parallel split tensors (rank_parts).
///  * Checkpoints: an FP8-format synthetic folder (FP8 projections, shared expert and Engram tables, FP4 routed
///    experts) and a bf16 one of verify::wide_block_config (8 heads, 4 o-groups of o_lora_rank 32, hidden 128, 8
///    routed experts), and an FP8 folder of the tiny preset (4 heads, 2 o-groups of o_lora_rank 16, hidden 64), whose
///    TP 2 wo_a, TP 4 wo_b and TP 2 all-reduce wo_b parts split 32-row / 32-column scale blocks (the dense fallback).
///  * Plans: TP 2, TP 4, EP 2, EP 4, TP = EP = 2 (Engram sharded), TP 2 and TP = EP = 2 with Engram replicated, TP 2 and
///    TP 4 under the attention all-reduce (wo_b columns); numerics bf16 (block-scaled weights as stored) and fp32.
///  * Every rank: the weights rank_weights makes from its own host model equal those it cuts from the whole host
///    model, tensor for tensor and byte for byte (dense tensors, stored codes and scales); the host holds exactly its
///    rank model's bytes, fewer than the whole host, and records its part (held_part) when a tensor is cut; the
///    checkpoint bytes it reads are the whole host's less, for every split tensor, its bytes outside the rank's rows or
///    columns (and outside the scale rows / columns covering them), less the other ranks' experts: computed here from
///    the plan and the checkpoint's header, and below the whole read; the rank models built from the per-rank hosts,
///    run as threads over the in-process communicator, give the single-rank model's logits bit for bit (all-reduce:
///    the logits of the rank models of the whole host).
///  * Bad input: a rank outside the plan, a plan of other dimensions, a host model asked for another rank's experts
///    or parts, a forward on a host model holding experts or parts, parts outside their tensors, an expert range
///    outside the checkpoint.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "tessera/models/deepseek_v41/engram_tables.hpp"
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
namespace fs = std::filesystem;

namespace {

using verify::bitwise_equal;
using verify::check_same_weights;
using verify::CountedSources;
using verify::run_ranks;
using verify::schedule_logits;

dist::ParallelConfig cfg(int tp, int ep, dist::AttnCombine a = dist::AttnCombine::kGather,
                         dist::EngramPlacement e = dist::EngramPlacement::kSharded) {
  dist::ParallelConfig c = verify::tp_ep(tp, ep);
  c.attn = a;
  c.engram = e;
  return c;
}
std::string name_of(dist::ParallelConfig const& c) {
  return verify::tp_ep_name(c) + (c.attn == dist::AttnCombine::kAllReduce ? " all-reduce" : "") +
         (c.engram == dist::EngramPlacement::kSharded ? "" : " engram-replicated");
}

ModelOptions numerics(Numerics n) {
  ModelOptions o;
  o.numerics = n;
  return o;
}
ModelOptions bf16() { return numerics(Numerics::kBf16); }

struct Fp8Folder : verify::SyntheticFolder {
  Fp8Folder() : SyntheticFolder("rank_loader", verify::wide_block_config(), 81, *native_fp8_format(), true) {}
};

Fp8Folder& folder() {
  static Fp8Folder f;
  return f;
}

bool has(std::string const& s, char const* sub) { return s.find(sub) != std::string::npos; }

/// Rows [begin, end) or columns [begin, end) (cols) of a checkpoint tensor.
struct Cut {
  int64_t begin = 0, end = 0;
  bool cols = false;
};

/// The part of checkpoint tensor `n` (the synthetic checkpoints' OLD names) that rank `me` of `p` reads, when it reads
/// less than the whole tensor: the plan's ranges of the split weights; for the `.scale` of a block-scaled weight the
/// scale rows (FP8: [r0/32, ⌈r1/32⌉); FP4: [r0, r1)) or scale columns [c0/32, ⌈c1/32⌉) that cover the weight's part;
/// an Engram table and (fp8 tables, spec §2.4.3) its per-row scales: the rows its hash columns index (offsets and
/// primes of `et`).
std::optional<Cut> cut_of(std::string const& n, std::map<std::string, io::TensorInfo> const& ckpt, ModelSpec const& s,
                          dist::ShardingPlan const& p, dist::RankPlan const& me, EngramTables const& et) {
  bool const scale = n.ends_with(".scale");
  std::string const w = scale ? n.substr(0, n.size() - 5) + "weight" : n;
  bool const tp = p.cfg.tp > 1, allreduce = !me.gather_heads && p.cfg.attn == dist::AttnCombine::kAllReduce;
  int64_t const hd = s.head_dim, ro = s.o_lora_rank;
  std::optional<Cut> c;
  if (tp && has(w, "attn.wq_b.weight"))
    c = Cut{me.heads.begin * hd, me.heads.end * hd};
  else if (tp && has(w, "attn.attn_sink"))
    c = Cut{me.heads.begin, me.heads.end};
  else if (tp && !me.gather_heads && has(w, "attn.wo_a.weight"))
    c = Cut{me.groups.begin * ro, me.groups.end * ro};
  else if (tp && has(w, "attn.wo_b.weight"))
    c = allreduce ? Cut{me.groups.begin * ro, me.groups.end * ro, true} : Cut{me.wo_b_rows.begin, me.wo_b_rows.end};
  else if (tp && (has(w, "shared_experts.w1.weight") || has(w, "shared_experts.w3.weight")))
    c = Cut{me.shared_inter.begin, me.shared_inter.end};
  else if (tp && has(w, "shared_experts.w2.weight"))
    c = Cut{me.shared_rows.begin, me.shared_rows.end};
  else if (tp && (w == "lm_head.weight" || w == "head.weight"))
    c = Cut{me.vocab.begin, me.vocab.end};
  else if (p.cfg.engram == dist::EngramPlacement::kSharded && p.world > 1 && has(w, "engram.embed.weight") &&
           (!scale || ckpt.at(w).dtype == DType::kF8E4m3)) {  // the scales of an fp8 table only are read
    int64_t const l = std::stoll(w.substr(w.find("layers.") + 7));
    int64_t const C = et.columns(), ei = s.engram_index(l);
    c = Cut{0, 0};
    if (me.engram_cols.size() > 0) {
      int64_t const first = ei * C + me.engram_cols.begin, last = ei * C + me.engram_cols.end - 1;
      c = Cut{et.offsets[first], et.offsets[last] + et.primes[last]};
    }
    return c;  // the table's per-row scales: the same rows
  }
  if (!c || !scale) return c;
  bool const fp8 = ckpt.at(w).dtype == DType::kF8E4m3;
  if (c->cols || fp8) return Cut{c->begin / 32, (c->end + 31) / 32, c->cols};
  return c;
}

/// Stored bytes of the checkpoint's routed-expert tensors (codes and scales) of experts outside [e0, e1).
size_t expert_bytes_outside(std::map<std::string, io::TensorInfo> const& ckpt, int64_t e0, int64_t e1) {
  size_t b = 0;
  for (auto const& [n, t] : ckpt) {
    size_t const p = n.find(".experts.");
    if (p == std::string::npos) continue;
    int64_t const e = std::stoll(n.substr(p + 9));
    if (e < e0 || e >= e1) b += t.nbytes;
  }
  return b;
}

/// Bytes rank `r` of `plan` reads, given `whole_read` for the whole host model: whole_read less every split tensor's
/// bytes outside its part, less the other ranks' experts.
size_t expected_read(size_t whole_read, std::map<std::string, io::TensorInfo> const& ckpt, ModelSpec const& s,
                     dist::ShardingPlan const& plan, int r, EngramTables const& et) {
  dist::RankPlan const& me = plan.ranks[static_cast<size_t>(r)];
  size_t skipped = 0;
  for (auto const& [n, t] : ckpt) {
    auto const c = cut_of(n, ckpt, s, plan, me, et);
    if (!c) continue;
    int64_t const extent = t.shape[c->cols ? 1 : 0];
    skipped += t.nbytes - t.nbytes / static_cast<size_t>(extent) * static_cast<size_t>(c->end - c->begin);
  }
  dist::Range const mine = plan.cfg.ep > 1 ? me.experts : dist::Range{0, s.n_experts};
  return whole_read - skipped - expert_bytes_outside(ckpt, mine.begin, mine.end);
}

/// A synthetic checkpoint folder and the models every plan is checked against, in one numerics.
struct Subject {
  fs::path dir;
  ModelOptions opts;
  std::string what;
  ModelSpec spec;
  std::unique_ptr<Dsv41Model> whole;  // the host model of the whole checkpoint (load_rank_host_model)
  size_t whole_read = 0;              // checkpoint bytes it reads
  std::vector<float> base;            // the single-rank model's logits
  std::vector<int32_t> toks;
  Subject(fs::path d, ModelOptions o, std::string w) : dir(std::move(d)), opts(std::move(o)), what(std::move(w)) {
    whole = load_rank_host_model(dir.string(), opts).value_or_throw();
    spec = whole->spec();
    BOOST_TEST_REQUIRE(whole->held_part() == nullptr);
    std::mt19937_64 g(verify::test_seed(82));
    toks.resize(32);
    for (auto& t : toks) t = static_cast<int32_t>(g() % 512);
    base = schedule_logits(*load_model(dir.string(), opts).value_or_throw(), toks);  // bf16: dequantised
    CountedSources all(dir);
    (void)Dsv41Model::create(spec, all.both, rank_host_options(opts)).value_or_throw();
    whole_read = all.counting.bytes_read();
    BOOST_TEST_REQUIRE(whole_read <= [&] {
      size_t b = 0;
      for (auto const& [n, t] : all.counting.tensors()) b += t.nbytes;
      return b;
    }());
  }
};

/// Every rank of plan `c` on `sub`: see the file comment. Returns the number of parts held as stored and of parts
/// that fell back to values (block-scaled projections whose part splits a scale block), over all ranks.
std::pair<int, int> check_plan(Subject const& sub, dist::ParallelConfig const& c) {
  ModelSpec const& spec = sub.spec;
  auto const plan = dist::make_plan(model_dims(spec), c).value_or_throw();
  EngramTables const et = engram_layout(spec);
  std::vector<std::unique_ptr<Dsv41Model>> hosts;
  std::vector<Dsv41Model const*> host_ptrs, whole_ptrs;
  int stored = 0, fallback = 0;
  bool same = true;
  for (int r = 0; r < plan.world; ++r) {
    std::string const what = sub.what + " " + name_of(c) + " rank " + std::to_string(r);
    BOOST_TEST_CONTEXT(what) {
      CountedSources s(sub.dir);
      hosts.push_back(load_rank_host_model(spec, s.both, sub.opts, plan, r).value_or_throw());
      Dsv41Model const& host = *hosts.back();
      host_ptrs.push_back(&host);
      whole_ptrs.push_back(sub.whole.get());
      RankShard const sh{plan, r, nullptr};
      Weights const got = rank_weights(host, sh).value_or_throw();
      same = check_same_weights(got, rank_weights(*sub.whole, sh).value_or_throw(), what) && same;
      // The part is recorded exactly when a tensor is cut: TP, or Engram tables sharded over several ranks.
      bool const cut = c.tp > 1 || (c.engram == dist::EngramPlacement::kSharded && plan.world > 1);
      BOOST_TEST((host.held_part() != nullptr) == cut);
      if (host.held_part()) BOOST_TEST(host.held_part()->rank == r);
      // Held: exactly the rank model's weights (the rank model shares them), fewer than the whole host.
      auto const from_whole = make_rank_model(*sub.whole, std::make_shared<RankShard>(sh), nullptr).value_or_throw();
      BOOST_TEST(host.weight_bytes() == from_whole->weight_bytes());
      BOOST_TEST(host.weight_bytes() < sub.whole->weight_bytes());
      // Read: the rank's parts and experts, the replicated tensors whole.
      size_t const expect = expected_read(sub.whole_read, s.counting.tensors(), spec, plan, r, et);
      BOOST_TEST(s.counting.bytes_read() == expect);
      BOOST_TEST(s.counting.bytes_read() < sub.whole_read);
      // Split projections stored block-scaled: held as stored parts, or (a part splitting a scale block) as values.
      for (int64_t l = 0; l < spec.num_layers && c.tp > 1 && rank_host_options(sub.opts).weights_as_stored; ++l)
        for (char const* f : {"wq_b", "wo_a", "wo_b"}) {
          auto const dt = s.counting.scaled_dtype("model.layers." + std::to_string(l) + ".attn." + f + ".weight");
          if (!dt.ok() || *dt == DType::kF32) continue;
          (got.scaled_of(scaled_weight_key(l, f)) ? stored : fallback) += 1;
        }
    }
  }
  // Rank models of weights other than the plan's may read past their tensors: run only the ones that must be equal.
  BOOST_TEST_REQUIRE(same, sub.what << " " << name_of(c) << ": rank weights differ");
  auto const sliced = run_ranks(host_ptrs, plan, sub.toks);
  bool const exact = plan.bit_exact();
  auto const want = exact ? std::vector<std::vector<float>>(static_cast<size_t>(plan.world), sub.base)
                          : run_ranks(whole_ptrs, plan, sub.toks);
  for (int r = 0; r < plan.world; ++r)
    BOOST_TEST(bitwise_equal(sliced[static_cast<size_t>(r)], want[static_cast<size_t>(r)]),
               sub.what << " " << name_of(c) << " rank " << r << (exact ? " vs one rank" : " vs the whole host's ranks"));
  return {stored, fallback};
}

using dist::AttnCombine;
using dist::EngramPlacement;

std::vector<dist::ParallelConfig> all_plans() {
  return {cfg(2, 1), cfg(4, 1), cfg(1, 2), cfg(1, 4), cfg(2, 2),
          cfg(2, 1, AttnCombine::kGather, EngramPlacement::kReplicated),
          cfg(2, 2, AttnCombine::kGather, EngramPlacement::kReplicated),
          cfg(2, 1, AttnCombine::kAllReduce), cfg(4, 1, AttnCombine::kAllReduce)};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_rank_loader)

BOOST_AUTO_TEST_CASE(fp8_rank_hosts_read_their_parts_bf16_as_stored) {
  Subject const sub(folder().dir, bf16(), "fp8 bf16");
  int stored = 0, fallback = 0;
  for (auto const& c : all_plans()) {
    auto const [s, f] = check_plan(sub, c);
    stored += s;
    fallback += f;
  }
  BOOST_TEST(stored > 0);
  BOOST_TEST(fallback == 0);  // the wide configuration's parts are whole scale blocks
}

BOOST_AUTO_TEST_CASE(fp8_rank_hosts_read_their_parts_fp32_values) {
  Subject const sub(folder().dir, numerics(Numerics::kFp32), "fp8 fp32");
  for (auto const& c : {cfg(2, 1), cfg(1, 2), cfg(2, 2), cfg(4, 1, AttnCombine::kAllReduce)}) (void)check_plan(sub, c);
}

BOOST_AUTO_TEST_CASE(bf16_rank_hosts_read_their_parts) {
  verify::SyntheticFolder const f("rank_loader_bf16", verify::wide_block_config(), 83, *dense_format(DType::kBf16), true);
  Subject const sub(f.dir, bf16(), "bf16 bf16");
  for (auto const& c : all_plans()) (void)check_plan(sub, c);
  Subject const sub32(f.dir, numerics(Numerics::kFp32), "bf16 fp32");
  for (auto const& c : {cfg(2, 2), cfg(2, 1, AttnCombine::kAllReduce)}) (void)check_plan(sub32, c);
}

BOOST_AUTO_TEST_CASE(misaligned_parts_fall_back_to_values) {
  // The tiny preset: TP 2 splits wo_a's 32-row blocks (16 rows a rank), TP 4 wo_b's (16 rows a rank; heads gathered,
  // wo_a whole), the TP 2 all-reduce wo_b's 32-column blocks.
  verify::SyntheticFolder const f("rank_loader_tiny", tiny_config(512), 84, *native_fp8_format(), true);
  Subject const sub(f.dir, bf16(), "tiny fp8 bf16");
  int stored = 0, fallback = 0;
  for (auto const& c : {cfg(2, 1), cfg(4, 1), cfg(2, 2), cfg(2, 1, AttnCombine::kAllReduce)}) {
    auto const [s, fb] = check_plan(sub, c);
    stored += s;
    fallback += fb;
  }
  BOOST_TEST(stored > 0);    // wq_b
  BOOST_TEST(fallback > 0);  // wo_a, wo_b
}

BOOST_AUTO_TEST_CASE(load_rank_host_opens_the_folder_for_its_rank) {
  Fp8Folder& f = folder();
  auto h = load_rank_host(f.dir.string(), bf16(), cfg(2, 2), 1).value_or_throw();
  BOOST_TEST(h.plan.world == 2);
  auto const [e0, e1] = h.model->held_routed_experts();
  BOOST_TEST(e0 == h.plan.ranks[1].experts.begin);
  BOOST_TEST(e1 == h.plan.ranks[1].experts.end);
  BOOST_TEST(!rank_weights(*h.model, RankShard{h.plan, 1, nullptr}).value_or_throw().scaled.empty());  // bf16: stored
  BOOST_TEST_REQUIRE(h.model->held_part() != nullptr);
  BOOST_TEST(h.model->held_part()->rank == 1);
  BOOST_TEST(h.model->held_part()->plan.world == 2);
}

BOOST_AUTO_TEST_CASE(plans_the_checkpoint_cannot_serve_are_refused) {
  Fp8Folder& f = folder();
  auto mf = open_model_folder(f.dir.string()).value_or_throw();
  auto const plan = dist::make_plan(model_dims(mf.spec), cfg(2, 2)).value_or_throw();
  auto msg = [](auto const& r) { return r.ok() ? std::string() : r.status().message(); };

  auto outside = load_rank_host_model(mf.spec, mf.src, bf16(), plan, 2);
  BOOST_TEST(msg(outside).find("rank 2 is outside the plan's 2 ranks") != std::string::npos, msg(outside));

  dist::ModelDims other = model_dims(mf.spec);
  other.experts = 16;
  auto const other_plan = dist::make_plan(other, cfg(2, 2)).value_or_throw();
  auto dims = load_rank_host_model(mf.spec, mf.src, bf16(), other_plan, 0);
  BOOST_TEST(msg(dims).find("other dimensions than the checkpoint's (16 routed experts") != std::string::npos, msg(dims));

  // Rank 0's host model holds experts [0, 4): rank 1's rank model cannot be sliced from it, and it runs no forward.
  auto host0 = load_rank_host_model(mf.spec, mf.src, bf16(), plan, 0).value_or_throw();
  auto other_rank = rank_weights(*host0, RankShard{plan, 1, nullptr});
  BOOST_TEST(msg(other_rank).find("rank 1 needs routed experts [4, 8), the model holds [0, 4)") != std::string::npos,
             msg(other_rank));
  auto st = host0->new_sequence();
  int32_t const tok = 1;
  std::vector<float> lg(static_cast<size_t>(host0->info().vocab_size));
  SequenceStep step{st.get(), std::span<int32_t const>(&tok, 1), 1, lg.data()};
  Status const fw = host0->forward(std::span<SequenceStep>(&step, 1));
  BOOST_TEST(fw.message().find("holds routed experts [0, 4) of 8 only") != std::string::npos, fw.message());

  ModelOptions bad = bf16();
  bad.routed_experts_begin = 6;
  bad.routed_experts_end = 9;
  auto range = Dsv41Model::create(mf.spec, mf.src, bad);
  BOOST_TEST(msg(range).find("routed experts [6, 9) are not a range of the checkpoint's 8 routed experts") != std::string::npos,
             msg(range));
}

BOOST_AUTO_TEST_CASE(host_models_holding_parts_serve_only_their_rank) {
  Fp8Folder& f = folder();
  auto mf = open_model_folder(f.dir.string()).value_or_throw();
  auto msg = [](auto const& r) { return r.ok() ? std::string() : r.status().message(); };
  auto const tp2 = dist::make_plan(model_dims(mf.spec), cfg(2, 1)).value_or_throw();
  auto const tp4 = dist::make_plan(model_dims(mf.spec), cfg(4, 1)).value_or_throw();
  auto host0 = load_rank_host_model(mf.spec, mf.src, bf16(), tp2, 0).value_or_throw();
  BOOST_TEST_REQUIRE(host0->held_part() != nullptr);
  auto const [e0, e1] = host0->held_routed_experts();
  BOOST_TEST((e0 == 0 && e1 == 8));  // TP alone: every expert, the split tensors cut

  // Another rank of the plan, or a rank of another plan with other parts, is refused; the model runs no forward.
  auto r1 = rank_weights(*host0, RankShard{tp2, 1, nullptr});
  BOOST_TEST(msg(r1).find("holds the split tensors' parts of rank 0 of a tp 2 ep 1 Engram-sharded plan (a rank's host "
                          "model); rank 1 of this tp 2 ep 1 Engram-sharded plan needs other parts") != std::string::npos,
             msg(r1));
  auto other_plan = rank_weights(*host0, RankShard{tp4, 0, nullptr});
  BOOST_TEST(msg(other_plan).find("rank 0 of this tp 4 ep 1 Engram-sharded plan needs other parts") != std::string::npos,
             msg(other_plan));
  auto one = dist::make_plan(model_dims(mf.spec), cfg(1, 1)).value_or_throw();
  BOOST_TEST(!rank_weights(*host0, RankShard{one, 0, nullptr}).ok());  // one rank needs the whole tensors
  BOOST_TEST(!ShardedModel::create(*host0, cfg(2, 1)).ok());
  auto st = host0->new_sequence();
  int32_t const tok = 1;
  std::vector<float> lg(static_cast<size_t>(host0->info().vocab_size));
  SequenceStep step{st.get(), std::span<int32_t const>(&tok, 1), 1, lg.data()};
  Status const fw = host0->forward(std::span<SequenceStep>(&step, 1));
  BOOST_TEST(fw.message().find("holds rank 0's parts of the split weights of a tp 2 ep 1 plan only") != std::string::npos,
             fw.message());
  Status const one_seq = host0->forward_one(static_cast<Dsv41State&>(*st), std::span<int32_t const>(&tok, 1), 1, lg.data());
  BOOST_TEST(one_seq.message() == fw.message());
  BOOST_TEST(st->length() == 0);
  // Its own rank is served (rank_loader's plans check the bytes).
  BOOST_TEST(rank_weights(*host0, RankShard{tp2, 0, nullptr}).ok());
  // A host of one rank of a one-rank plan cuts nothing and is a whole model.
  auto whole = load_rank_host_model(mf.spec, mf.src, bf16(), one, 0).value_or_throw();
  BOOST_TEST(whole->held_part() == nullptr);

  auto outside = rank_parts(mf.spec, tp2, 2, engram_layout(mf.spec));
  BOOST_TEST(msg(outside).find("rank parts: rank 2 is outside the plan's 2 ranks") != std::string::npos, msg(outside));
}

BOOST_AUTO_TEST_CASE(parts_outside_their_tensors_are_refused) {
  Fp8Folder& f = folder();
  auto mf = open_model_folder(f.dir.string()).value_or_throw();
  ModelSpec const& s = mf.spec;
  auto msg = [](auto const& r) { return r.ok() ? std::string() : r.status().message(); };
  auto const plan = dist::make_plan(model_dims(s), cfg(2, 1)).value_or_throw();
  RankParts const good = rank_parts(s, plan, 0, engram_layout(s)).value_or_throw();
  auto load = [&](RankParts const& p, bool as_stored) {
    WeightLoadOptions o;
    o.keep_scaled_projections = o.projections_as_stored = as_stored;
    o.parts = p;
    return load_weights(s, mf.src, Numerics::kBf16, o);
  };
  BOOST_TEST(load(good, true).ok());
  int64_t const q_rows = s.num_heads * s.head_dim;
  for (bool as_stored : {true, false}) {
    BOOST_TEST_CONTEXT("as stored " << as_stored) {
      RankParts p = good;
      p.wq_b = WeightPart{0, q_rows + 32};
      auto r = load(p, as_stored);
      BOOST_TEST(msg(r).find("tensor model.layers.0.attn.wq_b.weight of shape [" + std::to_string(q_rows)) !=
                     std::string::npos, msg(r));
      BOOST_TEST(msg(r).find("has no rows [0, " + std::to_string(q_rows + 32) + ") (a rank's part)") != std::string::npos,
                 msg(r));
      p = good;
      p.wo_b = WeightPart{64, 32, true};
      r = load(p, as_stored);
      BOOST_TEST(msg(r).find("attn.wo_b.weight") != std::string::npos, msg(r));
      BOOST_TEST(msg(r).find("has no columns [64, 32)") != std::string::npos, msg(r));
    }
  }
  RankParts p = good;
  p.attn_sink = WeightPart{0, 4, true};  // a 1-D tensor has no columns
  BOOST_TEST(msg(load(p, true)).find("attn.attn_sink of shape [8] has no columns [0, 4)") != std::string::npos,
             msg(load(p, true)));
  p = good;
  p.lm_head = WeightPart{-1, 10};
  BOOST_TEST(msg(load(p, true)).find("lm_head.weight") != std::string::npos, msg(load(p, true)));
  p = good;
  p.e_table = {std::nullopt};
  BOOST_TEST(msg(load(p, true)).find("rank parts give Engram table parts of 1 layers, the model has " +
                                     std::to_string(s.num_layers)) != std::string::npos, msg(load(p, true)));
  p = good;
  int64_t const l = s.engram_layers.front();
  p.e_table[static_cast<size_t>(l)] = WeightPart{0, s.engram_num_embeddings.front() + 1};
  BOOST_TEST(msg(load(p, true)).find("layers." + std::to_string(l) + ".engram.embed.weight") != std::string::npos,
             msg(load(p, true)));
}

BOOST_AUTO_TEST_SUITE_END()

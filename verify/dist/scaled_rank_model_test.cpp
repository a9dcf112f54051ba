// SPDX-License-Identifier: Apache-2.0
/// Rank models holding block-scaled weights as stored (ModelOptions::weights_as_stored, rank_weights' stored
/// slices) on native-layout synthetic checkpoints (`make-synthetic --format fp8`: FP8 e4m3 projections with 32×32
/// ue8m0 blocks, FP4 e2m1 routed experts with per-row-per-32 scales), in bf16 numerics. Built into
/// verify_dist_gpu_model_cpu (TESSERA_GPU_MODEL_ON_CPU: the GPU model on the CPU op backends, CI) and
/// verify_dist_gpu_model (CUDA; the CPU rank model checks run on the CPU suite only).
///  * scaled_slice_aligned on FP8 / FP4 row and column ranges.
///  * "wide" (8 heads in 4 o-groups of o_lora_rank 32, hidden 128, 8 experts): every split of TP 2 / 4 falls on
///    scale blocks, so every rank holds its wq_b / wo_a / wo_b slices and its routed experts as stored. At TP 2,
///    TP 4, EP 2, EP 4, TP = EP = 2, 4 (Engram sharded and replicated) the GPU rank models' logits equal the
///    single-rank GPU model's on the same stored weights bit for bit; the CPU rank models' equal the single-rank
///    CPU model's holding the same stored weights (itself equal to the dequantised CPU model and the GPU model),
///    and the GPU ranks' equal the CPU ranks'. The all-reduce plans (TP 2, 4) on stored wo_b column slices equal
///    the same plans on dense slices.
///  * Memory: each rank's weight bytes are exactly the dense-sliced rank's minus Σ (dense bytes − codes − scales)
///    over its stored slices (less the device tables of expert scale pointers), for the CPU and the GPU rank
///    model; the stored bytes a rank holds (plus bf16 for a dense fallback) equal plan_memory of the checkpoint's
///    block-scaled tensors.
///  * "tiny" (o_lora_rank 16, hidden 64): TP 2 splits wo_a's 32-row blocks and TP 4 wo_b's (16 rows a rank), the
///    TP 2 all-reduce wo_b's 32-column blocks: those tensors fall back to the dense slice of their values (equal to
///    the dequantised model's rows, no stored form, bf16 on the GPU rank) while the aligned ones stay stored; the
///    exact plans are still bit for bit.
///  * GPU rank models built, at EP 2, EP 4 and TP = EP = 2, each from a host model holding only its rank's routed
///    experts (load_rank_host_model, the host released after) give the single-rank GPU model's logits bit for bit.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <thread>
#include <unistd.h>

#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/common/random.hpp"
#include "verify/gpu_model/gpu_model_fixture.hpp"
#include "verify/dist/synthetic_folder.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;
namespace fs = std::filesystem;

namespace {

constexpr Backend kBackend = verify::kGpuModelOnCpu ? Backend::kCpu : Backend::kCuda;

dist::ParallelConfig cfg(int tp, int ep, dist::AttnCombine a = dist::AttnCombine::kGather,
                         dist::EngramPlacement e = dist::EngramPlacement::kSharded) {
  dist::ParallelConfig c;
  c.tp = tp;
  c.ep = ep;
  c.attn = a;
  c.engram = e;
  return c;
}

std::string name_of(dist::ParallelConfig const& c) {
  return "tp" + std::to_string(c.tp) + " ep" + std::to_string(c.ep) +
         (c.attn == dist::AttnCombine::kAllReduce ? " all-reduce" : " gather") +
         (c.engram == dist::EngramPlacement::kSharded ? " engram-sharded" : " engram-replicated");
}

ModelOptions bf16(bool as_stored) {
  ModelOptions o;
  o.numerics = Numerics::kBf16;
  o.weights_as_stored = as_stored;
  return o;
}

/// An FP8 synthetic checkpoint (Engram hash data from the golden tiny fixture) and the models of it: the CPU model
/// holding the block-scaled weights as stored (the ranks' host weights), the same dequantised, and the single-rank
/// GPU model on the backend under test (which keeps them as stored itself).
struct Fp8Models {
  fs::path dir;
  ModelSpec spec;
  CheckpointSource src;
  std::vector<io::TensorInfo> tensors;
  std::unique_ptr<Dsv41Model> stored, dense;
  std::unique_ptr<GpuDsv41Model> gpu;

  Fp8Models(Config const& c, uint64_t seed) {
    dir = fs::temp_directory_path() / ("tessera_scaled_rank_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
    throw_if_error(write_synthetic_checkpoint(c, dir.string(), seed, *native_fp8_format()).status());
    spec = spec_from_config(c).value_or_throw();
    throw_if_error(src.open((dir / "model.safetensors").string()));
    throw_if_error(src.open(verify::tiny_dir("fp32") + "/golden.safetensors"));
    tensors = io::Checkpoint::open((dir / "model.safetensors").string()).value_or_throw().tensors();
    stored = Dsv41Model::create(spec, src, bf16(true)).value_or_throw();
    dense = Dsv41Model::create(spec, src, bf16(false)).value_or_throw();
    gpu = GpuDsv41Model::create(spec, src, bf16(false), kBackend).value_or_throw();
  }
  ~Fp8Models() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

Fp8Models& wide() {
  static Fp8Models m(verify::wide_block_config(), 51);
  return m;
}

Fp8Models& tiny() {
  static Fp8Models m(tiny_config(512), 52);
  return m;
}

/// Logits of a fixed schedule: prefill chunks of 7, 1 and 12 tokens (logits for every row), then 6 decode steps.
std::vector<float> schedule_logits(LanguageModel& m, std::vector<int32_t> const& toks) {
  int64_t const V = m.info().vocab_size;
  auto st = m.new_sequence();
  std::vector<float> all;
  size_t pos = 0;
  for (size_t chunk : {7u, 1u, 12u, 1u, 1u, 1u, 1u, 1u, 1u}) {
    std::vector<float> lg(chunk * V);
    SequenceStep s{st.get(), std::span<int32_t const>(toks.data() + pos, chunk), static_cast<int64_t>(chunk), lg.data()};
    throw_if_error(m.forward(std::span<SequenceStep>(&s, 1)));
    all.insert(all.end(), lg.begin(), lg.end());
    pos += chunk;
  }
  return all;
}

std::vector<int32_t> tokens(uint64_t seed, size_t n) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % 512);
  return t;
}

/// Rank r's shard of `plan` (no communicator: for rank_weights only).
RankShard shard_of(dist::ShardingPlan const& plan, int r) { return RankShard{plan, r, nullptr}; }

/// The split projections' keys of layer l.
std::vector<std::string> split_keys(int64_t l) {
  return {scaled_weight_key(l, "wq_b"), scaled_weight_key(l, "wo_a"), scaled_weight_key(l, "wo_b")};
}

/// Bytes of the stored forms in `w`.
size_t stored_bytes(Weights const& w) {
  size_t b = 0;
  for (auto const& [key, sw] : w.scaled) b += sw.codes.nbytes() + sw.scales.nbytes();
  return b;
}

/// The checkpoint tensors the CPU model holds as stored: FP8 projections (not the shared experts, not the Engram
/// tables, which the loader dequantises) and FP4 routed experts, codes and scales.
std::vector<io::TensorInfo> stored_tensors(std::vector<io::TensorInfo> const& all) {
  std::vector<io::TensorInfo> out;
  for (auto const& t : all) {
    bool const quant = t.dtype == DType::kF8E4m3 || t.dtype == DType::kI8 || t.dtype == DType::kE8m0;
    if (quant && t.name.find("shared_experts") == std::string::npos && t.name.find("engram.embed") == std::string::npos)
      out.push_back(t);
  }
  return out;
}

/// Logits of every plan in `configs`: the GPU rank models' equal the single-rank GPU model's; on the CPU suite
/// the CPU rank models' equal the single-rank stored (and dense) CPU model's and the GPU ranks'.
void check_exact_plans(Fp8Models& m, std::vector<dist::ParallelConfig> const& configs, uint64_t seed, std::string const& what) {
  auto const toks = tokens(verify::test_seed(seed), 32);
  auto const gpu_base = schedule_logits(*m.gpu, toks);
  std::vector<float> cpu_base;
  if (verify::kGpuModelOnCpu) {
    cpu_base = schedule_logits(*m.stored, toks);
    BOOST_TEST(verify::bitwise_equal(cpu_base, schedule_logits(*m.dense, toks)), what << ": stored CPU model vs dequantised");
    BOOST_TEST(verify::bitwise_equal(cpu_base, gpu_base), what << ": stored CPU model vs the GPU model");
  }
  for (auto const& c : configs) {
    auto g = ShardedModel::create_gpu(*m.stored, c, kBackend).value_or_throw();
    BOOST_TEST_REQUIRE(g->plan().bit_exact());
    auto const got = schedule_logits(*g, toks);
    BOOST_TEST(verify::bitwise_equal(got, gpu_base), what << " " << name_of(c) << ": GPU ranks vs the single-rank GPU model");
    if (!verify::kGpuModelOnCpu) continue;
    auto cpu = ShardedModel::create(*m.stored, c).value_or_throw();
    auto const cpu_got = schedule_logits(*cpu, toks);
    BOOST_TEST(verify::bitwise_equal(cpu_got, cpu_base), what << " " << name_of(c) << ": CPU ranks vs the single-rank CPU model");
    BOOST_TEST(verify::bitwise_equal(got, cpu_got), what << " " << name_of(c) << ": GPU ranks vs CPU ranks");
  }
}

/// The memory checks of the file comment for `c` on `m`; `fallbacks` are the split keys expected dense per rank.
void check_rank_memory(Fp8Models& m, dist::ParallelConfig const& c, std::set<std::string> const& fallbacks) {
  auto const plan = dist::make_plan(model_dims(m.spec), c).value_or_throw();
  auto const want = plan_memory(plan, m.spec, stored_tensors(m.tensors));
  auto stored_gpu = ShardedModel::create_gpu(*m.stored, c, kBackend).value_or_throw();
  auto dense_gpu = ShardedModel::create_gpu(*m.dense, c, kBackend).value_or_throw();
  auto stored_cpu = ShardedModel::create(*m.stored, c).value_or_throw();
  auto dense_cpu = ShardedModel::create(*m.dense, c).value_or_throw();
  int64_t const L = m.spec.num_layers;
  for (int r = 0; r < plan.world; ++r) {
    RankShard const sh = shard_of(plan, r);
    Weights const rw = rank_weights(*m.stored, sh).value_or_throw();
    // Which forms the rank holds: the split projections stored unless they fall back, experts of its range only.
    size_t fallback_bf16 = 0;
    for (int64_t l = 0; l < L; ++l)
      for (std::string const& key : split_keys(l)) {
        std::string const field = key.substr(key.rfind('.') + 1);
        bool const back = fallbacks.count(field) > 0;
        BOOST_TEST(rw.scaled.count(key) == (back ? 0u : 1u), key << " rank " << r << " " << name_of(c));
        Tensor const* t = field == "wq_b" ? &rw.layers[l].wq_b : field == "wo_a" ? &rw.layers[l].wo_a : &rw.layers[l].wo_b;
        BOOST_TEST(t->defined() == back, key << " rank " << r);
        if (back && t->defined()) fallback_bf16 += static_cast<size_t>(2 * t->numel());
        // The GPU model reads the grouped wo_a in views of o_lora_rank rows: as stored only when those start on
        // 32-row blocks (the single-rank rule), else it uploads the values as bf16.
        bool const gpu_stored = !back && (field != "wo_a" || m.spec.o_lora_rank % 32 == 0);
        DType const dt = static_cast<GpuDsv41Model&>(stored_gpu->rank_model(r)).projection_dtype(key).value_or_throw();
        BOOST_TEST((dt == (gpu_stored ? DType::kF8E4m3 : DType::kBf16)), key << " rank " << r);
      }
    dist::Range const held = c.ep > 1 ? plan.ranks[r].experts : dist::Range{0, m.spec.n_experts};
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t e = 0; e < m.spec.n_experts; ++e)
        BOOST_TEST(rw.scaled.count(scaled_expert_key(l, e, "w2")) == (held.contains(e) ? 1u : 0u));
      BOOST_TEST((static_cast<GpuDsv41Model&>(stored_gpu->rank_model(r)).routed_experts_dtype(l).value_or_throw() ==
                  DType::kF4E2m1x2));
    }
    // plan_memory of the stored tensors: exactly the stored slices held, plus bf16 for the dense fallbacks.
    BOOST_TEST(stored_bytes(rw) + fallback_bf16 == want[static_cast<size_t>(r)], "plan_memory rank " << r << " " << name_of(c));

    // The dense-sliced rank less the stored one: Σ (dense bytes − codes − scales) over the stored slices, dense
    // bytes 4 a value on the CPU model; on the GPU model 2 (bf16 projections) and the backend's expert dtype (the
    // CPU op's fp32, CUDA's bf16), less one device table of 3·held scale pointers per layer.
    auto& sg = static_cast<GpuDsv41Model&>(stored_gpu->rank_model(r));
    size_t cpu_saved = 0, gpu_saved = 0;
    size_t const expert_bytes = kBackend == Backend::kCpu ? 4 : 2;
    for (auto const& [key, sw] : rw.scaled) {
      size_t const n = static_cast<size_t>(sw.rows * sw.cols), held_bytes = sw.codes.nbytes() + sw.scales.nbytes();
      bool const expert = key.find(".experts.") != std::string::npos;
      cpu_saved += 4 * n - held_bytes;
      if (expert) gpu_saved += expert_bytes * n - held_bytes;
      else if (sg.projection_dtype(key).value_or_throw() == sw.dtype) gpu_saved += 2 * n - held_bytes;
    }
    gpu_saved -= static_cast<size_t>(L * 3 * held.size()) * sizeof(void*);
    auto& dg = static_cast<GpuDsv41Model&>(dense_gpu->rank_model(r));
    auto& sc = static_cast<Dsv41Model&>(stored_cpu->rank_model(r));
    auto& dc = static_cast<Dsv41Model&>(dense_cpu->rank_model(r));
    BOOST_TEST(sg.weight_bytes() < dg.weight_bytes());
    BOOST_TEST(dg.weight_bytes() - sg.weight_bytes() == gpu_saved, "GPU rank " << r << " " << name_of(c));
    BOOST_TEST(sc.weight_bytes() < dc.weight_bytes());
    BOOST_TEST(dc.weight_bytes() - sc.weight_bytes() == cpu_saved, "CPU rank " << r << " " << name_of(c));
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dist_scaled_rank_model)

BOOST_AUTO_TEST_CASE(block_alignment_of_slices) {
  using dist::Range;
  BOOST_TEST(scaled_slice_aligned(DType::kF8E4m3, 64, Range{0, 32}, false));
  BOOST_TEST(scaled_slice_aligned(DType::kF8E4m3, 64, Range{32, 64}, true));
  BOOST_TEST(scaled_slice_aligned(DType::kF8E4m3, 70, Range{64, 70}, false));   // the tensor's last, partial block
  BOOST_TEST(!scaled_slice_aligned(DType::kF8E4m3, 64, Range{16, 32}, false));  // starts inside a block
  BOOST_TEST(!scaled_slice_aligned(DType::kF8E4m3, 64, Range{0, 16}, true));    // ends inside one
  BOOST_TEST(scaled_slice_aligned(DType::kF4E2m1x2, 64, Range{3, 17}, false));  // FP4: a scale row per row
  BOOST_TEST(!scaled_slice_aligned(DType::kF4E2m1x2, 64, Range{16, 48}, true)); // but 32-column scales
}

BOOST_AUTO_TEST_CASE(wide_exact_plans_on_stored_slices_bit_for_bit) {
  Fp8Models& m = wide();
  BOOST_TEST_REQUIRE(!m.stored->spec().engram_layers.empty());
  check_exact_plans(m,
                    {cfg(2, 1), cfg(4, 1), cfg(1, 2), cfg(1, 4), cfg(2, 2), cfg(4, 4),
                     cfg(2, 2, dist::AttnCombine::kGather, dist::EngramPlacement::kReplicated)},
                    61, "fp8 wide");
}

BOOST_AUTO_TEST_CASE(wide_ranks_hold_stored_slices_and_count_them) {
  Fp8Models& m = wide();
  for (auto const& c : {cfg(2, 1), cfg(4, 1), cfg(1, 2), cfg(1, 4), cfg(2, 2), cfg(4, 4),
                        cfg(2, 2, dist::AttnCombine::kAllReduce)})
    check_rank_memory(m, c, {});
}

BOOST_AUTO_TEST_CASE(wide_all_reduce_on_stored_column_slices) {
  // The all-reduce plan's wo_b columns [g0·32, g1·32) are whole blocks: held stored; not bit-exact by construction
  // (another fp32 order), so the check is the dense-sliced ranks' bits: the same plan on the same values.
  Fp8Models& m = wide();
  auto const toks = tokens(verify::test_seed(62), 32);
  for (int tp : {2, 4}) {
    auto const c = cfg(tp, tp, dist::AttnCombine::kAllReduce);
    auto stored = ShardedModel::create_gpu(*m.stored, c, kBackend).value_or_throw();
    auto dense = ShardedModel::create_gpu(*m.dense, c, kBackend).value_or_throw();
    BOOST_TEST_REQUIRE(!stored->plan().bit_exact());
    auto const got = schedule_logits(*stored, toks);
    BOOST_TEST(verify::bitwise_equal(got, schedule_logits(*dense, toks)), name_of(c) << ": stored vs dense slices");
    if (verify::kGpuModelOnCpu) {
      auto cpu = ShardedModel::create(*m.stored, c).value_or_throw();
      BOOST_TEST(verify::bitwise_equal(got, schedule_logits(*cpu, toks)), name_of(c) << ": GPU ranks vs CPU ranks");
    }
  }
}

BOOST_AUTO_TEST_CASE(misaligned_slices_fall_back_to_dense) {
  Fp8Models& m = tiny();
  BOOST_TEST_REQUIRE(m.spec.o_lora_rank == 16);
  BOOST_TEST_REQUIRE(m.spec.hidden_size == 64);
  // TP 2: wo_a rows [0, 16) / [16, 32) split its one 32-row block; wq_b (128 rows a rank) and wo_b (32) stay stored.
  check_rank_memory(m, cfg(2, 1), {"wo_a"});
  // TP 4 gathers head outputs (2 o-groups): wo_a is replicated (stored whole), wo_b has 16 rows a rank.
  check_rank_memory(m, cfg(4, 4), {"wo_b"});
  // The TP 2 all-reduce: wo_a as above, wo_b columns [0, 16) / [16, 32) split its 32-column blocks.
  check_rank_memory(m, cfg(2, 2, dist::AttnCombine::kAllReduce), {"wo_a", "wo_b"});
  // The fallback slice holds the stored tensor's values (dequantize_scaled), which are the dequantised model's.
  auto const one = dist::make_plan(model_dims(m.spec), cfg(1, 1)).value_or_throw();
  Weights const whole = rank_weights(*m.stored, shard_of(one, 0)).value_or_throw();
  Weights const dense = rank_weights(*m.dense, shard_of(one, 0)).value_or_throw();
  auto const plan = dist::make_plan(model_dims(m.spec), cfg(2, 1)).value_or_throw();
  for (int r = 0; r < 2; ++r) {
    Weights const rw = rank_weights(*m.stored, shard_of(plan, r)).value_or_throw();
    for (int64_t l = 0; l < m.spec.num_layers; ++l) {
      Tensor const all = dequantize_scaled(whole.scaled.at(scaled_weight_key(l, "wo_a")));
      Tensor const& got = rw.layers[static_cast<size_t>(l)].wo_a;
      BOOST_TEST_REQUIRE(got.dim(0) == 16);
      size_t const bytes = got.nbytes(), off = static_cast<size_t>(r) * bytes;
      BOOST_TEST(std::memcmp(got.data(), all.data_as<unsigned char>() + off, bytes) == 0, "layer " << l << " rank " << r);
      BOOST_TEST(std::memcmp(got.data(), dense.layers[static_cast<size_t>(l)].wo_a.data_as<unsigned char>() + off, bytes) == 0);
    }
  }
  check_exact_plans(m, {cfg(2, 1), cfg(4, 1), cfg(2, 2), cfg(4, 4), cfg(1, 4)}, 63, "fp8 tiny");
}

BOOST_AUTO_TEST_CASE(gpu_ranks_from_rank_host_models) {
  // One process per rank (serve --device cuda under the launch variables) builds its GPU rank model from a host model
  // holding only its routed experts (load_rank_host_model) and releases the host model after; here the ranks are
  // threads over the in-process communicator, so on the CPU op backends only (CUDA ranks need device buffers).
  if (!verify::kGpuModelOnCpu) return;
  Fp8Models& m = wide();
  auto const toks = tokens(verify::test_seed(64), 32);
  auto const base = schedule_logits(*m.gpu, toks);
  for (auto const& c : {cfg(1, 2), cfg(1, 4), cfg(2, 2)}) {
    auto const plan = dist::make_plan(model_dims(m.spec), c).value_or_throw();
    int const n = plan.world;
    auto comms = dist::InProcessCommunicator::create(n);
    std::vector<std::unique_ptr<ThreadPool>> pools;
    std::vector<std::unique_ptr<GpuDsv41Model>> ranks;
    for (int r = 0; r < n; ++r) {
      auto host = load_rank_host_model(m.spec, m.src, bf16(false), plan, r).value_or_throw();
      auto const [e0, e1] = host->held_routed_experts();
      BOOST_TEST((e1 - e0 == m.spec.n_experts / n), name_of(c) << " rank " << r);
      pools.push_back(std::make_unique<ThreadPool>(1));
      ModelOptions o = bf16(false);
      o.pool = pools.back().get();
      auto sh = std::make_shared<RankShard>(RankShard{plan, r, comms[static_cast<size_t>(r)].get()});
      ranks.push_back(GpuDsv41Model::create_rank(*host, sh, o, kBackend).value_or_throw());
    }
    std::vector<std::vector<float>> got(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          got[static_cast<size_t>(r)] = schedule_logits(*ranks[static_cast<size_t>(r)], toks);
        } catch (std::exception const& e) {
          errors[static_cast<size_t>(r)] = e.what();
          comms[static_cast<size_t>(r)]->abort(e.what());
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      BOOST_TEST_REQUIRE(errors[static_cast<size_t>(r)].empty(), name_of(c) << " rank " << r << ": " << errors[static_cast<size_t>(r)]);
      BOOST_TEST(verify::bitwise_equal(got[static_cast<size_t>(r)], base), name_of(c) << " rank " << r << " vs one GPU rank");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// SPDX-License-Identifier: Apache-2.0
/// EXL3 checkpoints in the models (`make-synthetic --format exl3:B`): a tiny config widened to 128-multiple
/// dimensions so that every projection, the head and the routed and shared experts are EXL3 groups.
/// What is checked, and why:
///   * bitwise: the GPU model on the CPU op backends == the CPU model (both run y = →md(Exl3Gemm_f32(→fp16(x)))
///     on the float64-summed reference op, in the same order); batched == alone on the backend under test
///     (Exl3Gemm / Exl3GroupedGemm and the glue are row-invariant); decoded-dense GPU model == decoded-dense
///     CPU model (ModelOptions::dequantize_weights: the dense paths, already bitwise);
///   * tolerance kExl3VsDense (relative RMS of the logits): EXL3 vs the same model given the decoded dense
///     weights. The two are different arithmetic by definition (fp16 rounding of x and of xh = H·(x·suh),
///     spec/exl3.md §4.3, against a dense product over W rounded to fp32/bf16);
///   * tolerance kCudaVsCpu (CUDA only): the CUDA kernels accumulate xh·W' in fp32 in their chunk order,
///     the CPU reference in float64 (spec/exl3.md §4.4), so CUDA agrees with the CPU model within a tolerance;
///   * as stored: projections, head and experts are held as kI16 trellis (less memory than decoded);
///   * malformed groups: a clear error naming the tensor;
///   * pruned routing (slots of id −1): the routed experts run over a count of assignments known on the backend
///     only (gpu::moe_group): bitwise the pruned CPU model on the CPU backends, batched == alone on both;
///   * gpu::moe_group on the backend under test (the CUDA kernel in the GPU build) == the plain grouping of
///     moe_group_cases.hpp, every array at its full capacity;
///   * bitwise: a pass's EXL3 path in row blocks (gpu::Exl3RowBlock) == in one block, on the backend under test.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <random>
#include <unistd.h>

#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "models/deepseek_v41/gpu_internal.hpp"
#include "models/deepseek_v41/model_internal.hpp"
#include "verify/dist/synthetic_folder.hpp"  // verify::exl3_rank_config
#include "verify/gpu_model/gpu_model_fixture.hpp"
#include "verify/gpu_model/moe_group_cases.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;
using verify::bitwise_equal;

namespace {

constexpr Backend kBackend = verify::kGpuModelOnCpu ? Backend::kCpu : Backend::kCuda;
/// One EXL3 linear vs the dense product over its effective weight, relative RMS: x and xh are rounded to fp16
/// (relative 2^−11 each, ~4e-4 RMS after the Hadamard mixes them), the fp32 dense product is exact to ~1e-7.
constexpr double kExl3VsDenseLinear = 2e-3;
/// End to end (logits of the random tiny model), EXL3 vs decoded dense and CUDA vs CPU: a per-linear difference
/// of 1e-3 (or CUDA's 1e-6) flips router / indexer top-k selections of a random-weight model now and then, and a
/// flipped expert moves a logit row by O(its size); measured 0.12–0.14 for EXL3 vs dense on the CPU. So the bound
/// is loose (agreement in bulk) and the per-linear bound above carries the precision.
constexpr double kEndToEnd = 0.3;
/// CUDA vs CPU end to end: measured 0.056 (bf16) and 0.082 (fp32) on the H200 (2026-12-03, same seeds, fixed
/// inputs); bounded at under twice that, so a kernel change that moves more than the summation order shows.
constexpr double kCudaVsCpu = 0.15;

/// A synthetic exl3:2.5 checkpoint of verify::exl3_rank_config (or another format: mixed:2.5), Engram hash data from
/// the golden tiny fixture.
struct Exl3Checkpoint {
  std::filesystem::path dir;
  ModelSpec spec;
  CheckpointSource src;
  explicit Exl3Checkpoint(SyntheticFormat const& format = *exl3_format(2.5)) {
    dir = std::filesystem::temp_directory_path() /
          ("tessera_exl3_model_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    Config const c = verify::exl3_rank_config();
    throw_if_error(write_synthetic_checkpoint(c, dir.string(), 43, format).status());
    spec = spec_from_config(c).value_or_throw();
    throw_if_error(src.open((dir / "model.safetensors").string()));
    throw_if_error(src.open(verify::tiny_dir("fp32") + "/golden.safetensors"));
  }
  ~Exl3Checkpoint() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

Exl3Checkpoint& ckpt() {
  static Exl3Checkpoint c;
  return c;
}

std::vector<int32_t> tokens(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % 512u);
  return t;
}

/// Logits of a prefill (every row) then single-token decode steps.
std::vector<float> prefill_then_decode(LanguageModel& m, std::vector<int32_t> const& prompt,
                                       std::vector<int32_t> const& decode) {
  int64_t const V = m.info().vocab_size, S = static_cast<int64_t>(prompt.size());
  std::vector<float> out(static_cast<size_t>((S + static_cast<int64_t>(decode.size())) * V));
  auto st = m.new_sequence();
  SequenceStep pre{st.get(), prompt, S, out.data()};
  throw_if_error(m.forward({&pre, 1}));
  for (size_t k = 0; k < decode.size(); ++k) {
    SequenceStep step{st.get(), std::span<int32_t const>(&decode[k], 1), 1, out.data() + (S + static_cast<int64_t>(k)) * V};
    throw_if_error(m.forward({&step, 1}));
  }
  return out;
}

/// Elements of a and b whose bits differ (every element of the longer when the sizes differ).
size_t bit_mismatches(std::vector<float> const& a, std::vector<float> const& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

/// gpu::Exl3RowBlock at `rows` for the guard's lifetime; the default again on exit, a failed check's exception included.
struct RowBlockGuard {
  explicit RowBlockGuard(int64_t rows) { gpu::Exl3RowBlock::set_for_test(rows); }
  ~RowBlockGuard() { gpu::Exl3RowBlock::set_for_test(gpu::Exl3RowBlock::kDefault); }
  RowBlockGuard(RowBlockGuard const&) = delete;
  RowBlockGuard& operator=(RowBlockGuard const&) = delete;
};

double rel_rms(std::vector<float> const& a, std::vector<float> const& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

/// Batched == alone (row invariance): the 40-token `prompt` and a 23-token prompt in one pass, each equal bit for bit
/// to its run alone.
void expect_batched_equals_alone(GpuDsv41Model& gpu, std::vector<int32_t> const& prompt) {
  BOOST_TEST_REQUIRE(prompt.size() == 40u);
  auto const p2 = tokens(23, 9);
  auto const alone1 = verify::run_all(gpu, prompt, 40), alone2 = verify::run_all(gpu, p2, 23);
  int64_t const V = gpu.info().vocab_size;
  std::vector<float> b1(static_cast<size_t>(40 * V)), b2(static_cast<size_t>(23 * V));
  auto s1 = gpu.new_sequence(), s2 = gpu.new_sequence();
  SequenceStep steps[] = {{s1.get(), prompt, 40, b1.data()}, {s2.get(), p2, 23, b2.data()}};
  throw_if_error(gpu.forward(steps));
  BOOST_TEST(bitwise_equal(b1, alone1), "batched != alone (sequence 1)");
  BOOST_TEST(bitwise_equal(b2, alone2), "batched != alone (sequence 2)");
}

/// Graph == eager (CUDA): prefill then decode with every layer and the head launched as recorded graphs equals the
/// eager run bit for bit, and the decode steps replay executables updated in place (the EXL3 GEMV's ticket counters
/// and the decode-once product inside recorded segments). The CPU op backends refuse the mode.
void expect_graph_equals_eager(GpuDsv41Model& gpu, std::vector<int32_t> const& prompt, std::vector<int32_t> const& decode) {
  if (kBackend == Backend::kCpu) {
    BOOST_TEST((gpu.set_cuda_graphs(true).code() == StatusCode::kNotSupported));
    BOOST_TEST(!gpu.cuda_graphs());
    return;
  }
  bool const was_on = gpu.cuda_graphs();
  throw_if_error(gpu.set_cuda_graphs(false));
  auto const eager = prefill_then_decode(gpu, prompt, decode);
  throw_if_error(gpu.set_cuda_graphs(true));
  auto const graphed = prefill_then_decode(gpu, prompt, decode);
  auto const c = gpu.graph_counts();
  throw_if_error(gpu.set_cuda_graphs(was_on));
  BOOST_TEST(bitwise_equal(graphed, eager), "graph replay != eager");
  BOOST_TEST(c.updates > 0);
  BOOST_TEST(c.launches == c.updates + c.instantiations);
  BOOST_TEST_MESSAGE("graph == eager: " << c.launches << " segments launched, " << c.updates << " updated in place, "
                                        << c.instantiations << " instantiated");
}

void exl3_model_checks(Numerics num) {
  Exl3Checkpoint& ck = ckpt();
  ModelOptions o;
  o.numerics = num;
  ModelOptions od = o;
  od.dequantize_weights = true;
  auto cpu = Dsv41Model::create(ck.spec, ck.src, o).value_or_throw();
  auto cpu_dense = Dsv41Model::create(ck.spec, ck.src, od).value_or_throw();
  auto gpu = GpuDsv41Model::create(ck.spec, ck.src, o, kBackend).value_or_throw();
  auto gpu_dense = GpuDsv41Model::create(ck.spec, ck.src, od, kBackend).value_or_throw();

  // Held as stored: every projection the layer has, the head and the experts are trellis (kI16).
  BOOST_TEST((gpu->projection_dtype(scaled_head_key()).value_or_throw() == DType::kI16));
  for (int64_t l = 0; l < ck.spec.num_layers; ++l) {
    for (char const* f : {"wq_a", "wq_b", "wkv", "wo_a", "wo_b"})
      BOOST_TEST((gpu->projection_dtype(scaled_weight_key(l, f)).value_or_throw() == DType::kI16), l << " " << f);
    BOOST_TEST((gpu->routed_experts_dtype(l).value_or_throw() == DType::kI16), "layer " << l);
  }
  BOOST_TEST(gpu->weight_bytes() < gpu_dense->weight_bytes());

  auto const prompt = tokens(40, 7), decode = tokens(6, 8);
  auto const a = prefill_then_decode(*cpu, prompt, decode);
  auto const b = prefill_then_decode(*gpu, prompt, decode);
  auto const ad = prefill_then_decode(*cpu_dense, prompt, decode);
  auto const bd = prefill_then_decode(*gpu_dense, prompt, decode);
  if (kBackend == Backend::kCpu) {
    BOOST_TEST(bitwise_equal(b, a), "GPU model (CPU backends) on EXL3 != CPU model");
  } else {
    double const e = rel_rms(b, a);
    BOOST_TEST(e <= kCudaVsCpu, "CUDA vs CPU model on EXL3: relative RMS " << e);
    BOOST_TEST_MESSAGE("CUDA vs CPU model on EXL3: relative RMS " << e);
  }
  BOOST_TEST(bitwise_equal(bd, ad), "decoded-dense GPU model != decoded-dense CPU model");
  double const ed = rel_rms(a, ad);
  BOOST_TEST_MESSAGE("EXL3 vs decoded dense (" << (num == Numerics::kBf16 ? "bf16" : "fp32") << "): relative RMS " << ed);
  BOOST_TEST(ed <= kEndToEnd);
  BOOST_TEST(ed > 0.0);  // different arithmetic: the fp16 roundings of x and xh are real

  expect_batched_equals_alone(*gpu, prompt);
  expect_graph_equals_eager(*gpu, prompt, decode);
  // Chunked prefill == one shot on the CPU model (its EXL3 linears are row-wise too).
  BOOST_TEST(bitwise_equal(verify::run_chunked(*cpu, prompt, 7), verify::run_all(*cpu, prompt, 40)));
}

/// gpu::moe_group of case c on the backend's memory, copied back.
verify::moe_group::Output moe_group_on(gpu::Mem const& mem, verify::moe_group::Case const& c) {
  verify::moe_group::Output o(c);
  std::vector<void*> blocks;
  auto put = [&](void const* host, size_t bytes) {
    void* d = mem.alloc(std::max<size_t>(bytes, 4)).value_or_throw();
    blocks.push_back(d);
    if (bytes) throw_if_error(mem.copy(d, host, bytes, gpu::Mem::Copy::kHostToDev));
    return d;
  };
  auto get = [&](auto& v, void const* d) {
    if (!v.empty()) throw_if_error(mem.copy(v.data(), d, v.size() * sizeof(v[0]), gpu::Mem::Copy::kDevToHost));
  };
  gpu::MoeGroupParams p;
  p.ids = static_cast<int32_t const*>(put(c.ids.data(), c.ids.size() * 4));
  p.weights = static_cast<float const*>(put(c.weights.data(), c.weights.size() * 4));
  p.tokens = c.tokens;
  p.top_k = c.top_k;
  p.experts = c.experts;
  // Outputs start as the host's −9 filler, so an entry the backend leaves unwritten shows.
  p.offsets = static_cast<int32_t*>(put(o.offsets.data(), o.offsets.size() * 4));
  p.slot_assignment = static_cast<int32_t*>(put(o.slot_assignment.data(), o.slot_assignment.size() * 4));
  p.token_idx = static_cast<int32_t*>(put(o.token_idx.data(), o.token_idx.size() * 4));
  p.route_weight = static_cast<float*>(put(o.route_weight.data(), o.route_weight.size() * 4));
  p.identity = static_cast<int32_t*>(put(o.identity.data(), o.identity.size() * 4));
  p.combine_offsets = static_cast<int64_t*>(put(o.combine_offsets.data(), o.combine_offsets.size() * 8));
  p.combine_list = static_cast<int32_t*>(put(o.combine_list.data(), o.combine_list.size() * 4));
  throw_if_error(gpu::moe_group(mem, p));
  get(o.offsets, p.offsets);
  get(o.slot_assignment, p.slot_assignment);
  get(o.token_idx, p.token_idx);
  get(o.route_weight, p.route_weight);
  get(o.identity, p.identity);
  get(o.combine_offsets, p.combine_offsets);
  get(o.combine_list, p.combine_list);
  throw_if_error(mem.sync());
  for (void* b : blocks) mem.free(b);
  return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_model_exl3)

// The routing grouped on the backend (the CUDA kernel in the GPU build) == the plain grouping, bit for bit.
BOOST_AUTO_TEST_CASE(exl3_moe_group_equals_reference) {
  gpu::Mem mem;
  mem.backend = kBackend;
  DeviceInfo info;
  throw_if_error(mem.open(&info));
  for (auto const& c : verify::moe_group::cases())
    BOOST_TEST(verify::moe_group::first_difference(c, moe_group_on(mem, c)) == "", c.name);
  mem.close();
}

// The expert activation over more rows than grid y holds (an expert step has tokens × top_k rows: 10,923 tokens at
// top-6 pass 65,535): 70,001 rows of fresh random g, u, w in one call equal the same rows in two calls split at
// 35,000, bit for bit; with a kept-row count on the backend of 66,000, the rows past it keep their filler.
BOOST_AUTO_TEST_CASE(exl3_moe_act_past_65535_rows) {
  gpu::Mem mem;
  mem.backend = kBackend;
  DeviceInfo info;
  throw_if_error(mem.open(&info));
  int64_t const rows = 70001, inter = 32, split = 35000, kept = 66000;
  std::mt19937 rng(4242);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> g(static_cast<size_t>(rows * inter)), u(g.size()), w(static_cast<size_t>(rows));
  for (auto* v : {&g, &u, &w})
    for (float& x : *v) x = nd(rng);
  std::vector<void*> blocks;
  auto put = [&](void const* host, size_t bytes) {
    void* d = mem.alloc(bytes).value_or_throw();
    blocks.push_back(d);
    throw_if_error(mem.copy(d, host, bytes, gpu::Mem::Copy::kHostToDev));
    return d;
  };
  std::vector<uint16_t> filler(g.size(), 0x7e00);  // fp16 NaN: a row left unwritten shows
  auto* dg = static_cast<float const*>(put(g.data(), g.size() * 4));
  auto* du = static_cast<float const*>(put(u.data(), u.size() * 4));
  auto* dw = static_cast<float const*>(put(w.data(), w.size() * 4));
  auto* whole = static_cast<uint16_t*>(put(filler.data(), filler.size() * 2));
  auto* halves = static_cast<uint16_t*>(put(filler.data(), filler.size() * 2));
  auto* counted = static_cast<uint16_t*>(put(filler.data(), filler.size() * 2));
  int32_t const kept32 = static_cast<int32_t>(kept);
  auto* dkept = static_cast<int32_t const*>(put(&kept32, 4));
  for (bool bf16 : {false, true}) {
    throw_if_error(gpu::exl3_moe_act(mem, dg, du, dw, rows, nullptr, inter, 7.f, bf16, whole));
    throw_if_error(gpu::exl3_moe_act(mem, dg, du, dw, split, nullptr, inter, 7.f, bf16, halves));
    throw_if_error(gpu::exl3_moe_act(mem, dg + split * inter, du + split * inter, dw + split, rows - split, nullptr, inter,
                                     7.f, bf16, halves + split * inter));
    throw_if_error(gpu::exl3_moe_act(mem, dg, du, dw, rows, dkept, inter, 7.f, bf16, counted));
    std::vector<uint16_t> a(g.size()), b(g.size()), c(g.size());
    throw_if_error(mem.copy(a.data(), whole, a.size() * 2, gpu::Mem::Copy::kDevToHost));
    throw_if_error(mem.copy(b.data(), halves, b.size() * 2, gpu::Mem::Copy::kDevToHost));
    throw_if_error(mem.copy(c.data(), counted, c.size() * 2, gpu::Mem::Copy::kDevToHost));
    throw_if_error(mem.sync());
    BOOST_TEST((a == b), (bf16 ? "bf16" : "fp32") << ": one call over " << rows << " rows != two calls");
    BOOST_TEST(std::equal(c.begin(), c.begin() + kept * inter, a.begin()));
    BOOST_TEST(std::all_of(c.begin() + kept * inter, c.end(), [](uint16_t x) { return x == 0x7e00; }));
    BOOST_TEST(std::none_of(a.begin(), a.end(), [](uint16_t x) { return x == 0x7e00; }));  // every row written
  }
  for (void* p : blocks) mem.free(p);
  mem.close();
}

// Pruned routing: top_p 0.5 leaves slots of id −1, so the routed products run on fewer assignments than
// N · top_k, their count known on the backend only.
BOOST_AUTO_TEST_CASE(exl3_pruned_routing) {
  Exl3Checkpoint& ck = ckpt();
  ModelOptions o;
  o.numerics = Numerics::kFp32;
  ModelOptions op = o;
  op.prune = ExpertPruning{0.5f, 1, true, ExpertPruning::Scope::kAll, {}};
  auto gpu = GpuDsv41Model::create(ck.spec, ck.src, op, kBackend).value_or_throw();
  auto gpu_full = GpuDsv41Model::create(ck.spec, ck.src, o, kBackend).value_or_throw();
  auto const prompt = tokens(40, 7), decode = tokens(6, 8);
  auto const b = prefill_then_decode(*gpu, prompt, decode);
  BOOST_TEST(!bitwise_equal(b, prefill_then_decode(*gpu_full, prompt, decode)), "top_p 0.5 pruned nothing");
  if (kBackend == Backend::kCpu) {
    auto cpu = Dsv41Model::create(ck.spec, ck.src, op).value_or_throw();
    BOOST_TEST(bitwise_equal(b, prefill_then_decode(*cpu, prompt, decode)), "pruned GPU model (CPU backends) != CPU model");
  }
  auto const p2 = tokens(23, 9);
  auto const alone1 = verify::run_all(*gpu, prompt, 40), alone2 = verify::run_all(*gpu, p2, 23);
  int64_t const V = ck.spec.vocab_size;
  std::vector<float> b1(static_cast<size_t>(40 * V)), b2(static_cast<size_t>(23 * V));
  auto s1 = gpu->new_sequence(), s2 = gpu->new_sequence();
  SequenceStep steps[] = {{s1.get(), prompt, 40, b1.data()}, {s2.get(), p2, 23, b2.data()}};
  throw_if_error(gpu->forward(steps));
  BOOST_TEST(bitwise_equal(b1, alone1), "pruned: batched != alone (sequence 1)");
  BOOST_TEST(bitwise_equal(b2, alone2), "pruned: batched != alone (sequence 2)");
}

BOOST_AUTO_TEST_CASE(exl3_bf16) { exl3_model_checks(Numerics::kBf16); }
BOOST_AUTO_TEST_CASE(exl3_fp32) { exl3_model_checks(Numerics::kFp32); }

// A pass's EXL3 path in row blocks (gpu::Exl3RowBlock: lin_exl3's rows, moe_exl3's tokens) == in one block (the default
// 8192), bit for bit: a 43-token prefill then 3 decode steps (which read the state the prefill committed) in blocks of 7
// (6 × 7 + 1) and of 20 (20 + 20 + 3), and a batched pass of 40 + 23 rows in blocks of 7 (blocks straddling the two
// sequences) == each sequence alone in one block; bf16 and fp32. On CUDA the block changes the products' tactics
// (Exl3Gemm: GEMV up to 16 rows, the chunk-chain GEMM above; Exl3GroupedGemm: the fused GEMV at one token), which
// their row invariance hides.
BOOST_AUTO_TEST_CASE(exl3_row_blocks_equal_one_block) {
  Exl3Checkpoint& ck = ckpt();
  auto const prompt = tokens(43, 11), decode = tokens(3, 12), p1 = tokens(40, 7), p2 = tokens(23, 9);
  int64_t const V = ck.spec.vocab_size;
  for (Numerics num : {Numerics::kBf16, Numerics::kFp32}) {
    BOOST_TEST_CONTEXT((num == Numerics::kBf16 ? "bf16" : "fp32")) {
      ModelOptions o;
      o.numerics = num;
      auto m = GpuDsv41Model::create(ck.spec, ck.src, o, kBackend).value_or_throw();
      BOOST_TEST_REQUIRE(gpu::Exl3RowBlock::get() == gpu::Exl3RowBlock::kDefault);
      auto const whole = prefill_then_decode(*m, prompt, decode);
      auto const alone1 = verify::run_all(*m, p1, 40), alone2 = verify::run_all(*m, p2, 23);
      for (int64_t rows : {7, 20}) {
        RowBlockGuard guard(rows);
        BOOST_TEST_REQUIRE(gpu::Exl3RowBlock::get() == rows);
        auto const blocked = prefill_then_decode(*m, prompt, decode);
        size_t const bad = bit_mismatches(blocked, whole);
        BOOST_TEST(bad == 0u, "blocks of " << rows << ": " << bad << " of " << whole.size() << " logits differ");
        if (rows != 7) continue;
        std::vector<float> b1(static_cast<size_t>(40 * V)), b2(static_cast<size_t>(23 * V));
        auto s1 = m->new_sequence(), s2 = m->new_sequence();
        SequenceStep steps[] = {{s1.get(), p1, 40, b1.data()}, {s2.get(), p2, 23, b2.data()}};
        throw_if_error(m->forward(steps));
        size_t const bad1 = bit_mismatches(b1, alone1), bad2 = bit_mismatches(b2, alone2);
        BOOST_TEST(bad1 == 0u, "batched in blocks of 7, sequence 1: " << bad1 << " of " << alone1.size() << " differ");
        BOOST_TEST(bad2 == 0u, "batched in blocks of 7, sequence 2: " << bad2 << " of " << alone2.size() << " differ");
      }
      BOOST_TEST(gpu::Exl3RowBlock::get() == gpu::Exl3RowBlock::kDefault);
      BOOST_TEST(std::all_of(whole.begin(), whole.end(), [](float v) { return std::isfinite(v); }));
    }
  }
}

/// EXL3 experts over the FP8 trunk (`make-synthetic --format mixed:B`): the routed and shared experts are trellis
/// groups, the projections FP8 blocks (held as stored in bf16), in one model; the GPU model on the CPU op backends ==
/// the CPU model bit for bit (CUDA: within kCudaVsCpu), batched == alone.
BOOST_AUTO_TEST_CASE(mixed_exl3_experts_fp8_trunk) {
  static Exl3Checkpoint ck(*mixed_format(2.5));
  for (Numerics num : {Numerics::kBf16, Numerics::kFp32}) {
    BOOST_TEST_CONTEXT((num == Numerics::kBf16 ? "bf16" : "fp32")) {
      ModelOptions o;
      o.numerics = num;
      auto cpu = Dsv41Model::create(ck.spec, ck.src, o).value_or_throw();
      auto gpu = GpuDsv41Model::create(ck.spec, ck.src, o, kBackend).value_or_throw();
      for (int64_t l = 0; l < ck.spec.num_layers; ++l) {
        BOOST_TEST((gpu->routed_experts_dtype(l).value_or_throw() == DType::kI16), "layer " << l);
        for (char const* f : {"wq_a", "wq_b", "wkv", "wo_a", "wo_b"}) {
          DType const t = gpu->projection_dtype(scaled_weight_key(l, f)).value_or_throw();
          // FP8 blocks: as stored in bf16 numerics, decoded to fp32 in fp32 numerics; never a trellis.
          BOOST_TEST((t == (num == Numerics::kBf16 ? DType::kF8E4m3 : DType::kF32)), l << " " << f);
        }
      }
      auto const prompt = tokens(40, 7), decode = tokens(6, 8);
      auto const a = prefill_then_decode(*cpu, prompt, decode);
      auto const b = prefill_then_decode(*gpu, prompt, decode);
      bool finite = true;
      for (float v : a) finite &= std::isfinite(v);
      BOOST_TEST(finite);
      if (kBackend == Backend::kCpu) {
        BOOST_TEST(bitwise_equal(b, a), "GPU model (CPU backends) on the mixed checkpoint != CPU model");
      } else {
        double const e = rel_rms(b, a);
        BOOST_TEST(e <= kCudaVsCpu, "CUDA vs CPU model on the mixed checkpoint: relative RMS " << e);
        BOOST_TEST_MESSAGE("CUDA vs CPU model on the mixed checkpoint: relative RMS " << e);
      }
      expect_batched_equals_alone(*gpu, prompt);
      expect_graph_equals_eager(*gpu, prompt, decode);
    }
  }
}

// Per linear: linear_exl3 (the EXL3 product) vs x·Wᵀ over exl3_effective_weight, in fp32, for every EXL3 linear
// of layer 1 (attention, indexer, compressor, experts) and the head.
BOOST_AUTO_TEST_CASE(exl3_linear_vs_effective_dense_weight) {
  Weights const w = load_weights(ckpt().spec, ckpt().src, Numerics::kFp32, {.keep_exl3 = true}).value_or_throw();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  ExecContext ctx;
  int checked = 0;
  for (auto const& [key, q] : w.exl3) {
    if (key.rfind("layers.1.", 0) != 0 && key != scaled_head_key()) continue;
    int64_t const rows = 3, k = q.desc.k, n = q.desc.n;
    std::vector<float> x(static_cast<size_t>(rows * k)), ye(static_cast<size_t>(rows * n)), yd(ye.size());
    for (auto& v : x) v = nd(rng);
    linear_exl3(ctx, x.data(), rows, q, ye.data(), DType::kF32);
    Tensor const dense = exl3_effective_weight(q);
    linear(ctx, x.data(), rows, dense, yd.data(), DType::kF32);
    double const e = rel_rms(ye, yd);
    BOOST_TEST(e <= kExl3VsDenseLinear, key << ": relative RMS " << e);
    ++checked;
  }
  BOOST_TEST(checked > 10);
}

// A malformed group names its tensor: the loader's checks run on the group standing for the weight.
BOOST_AUTO_TEST_CASE(exl3_malformed_group_names_the_tensor) {
  auto const dir = std::filesystem::temp_directory_path() / ("tessera_exl3_bad_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string const file = (dir / "bad.safetensors").string();
  io::SafetensorsWriter w;
  auto zero = [](void* d, size_t n) { std::memset(d, 0, n); return Status{}; };
  throw_if_error(w.add("model.layers.0.attn.wq_a.trellis", DType::kI16, {8, 8, 40}, zero));  // 16·K = 40: no K
  throw_if_error(w.add("model.layers.0.attn.wq_a.suh", DType::kF16, {128}, zero));
  throw_if_error(w.add("model.layers.0.attn.wq_a.svh", DType::kF16, {128}, zero));
  throw_if_error(w.add("model.layers.0.attn.wkv.trellis", DType::kI16, {8, 8, 32}, zero));
  throw_if_error(w.add("model.layers.0.attn.wkv.suh", DType::kF16, {64}, zero));  // should be [128]
  throw_if_error(w.add("model.layers.0.attn.wkv.svh", DType::kF16, {128}, zero));
  throw_if_error(w.write(file));
  CheckpointSource src;
  throw_if_error(src.open(file));
  BOOST_TEST(src.is_exl3("model.layers.0.attn.wq_a.weight"));
  auto bad_k = src.load_exl3("model.layers.0.attn.wq_a.weight");
  BOOST_TEST(!bad_k.ok());
  BOOST_TEST(bad_k.status().message().find("model.layers.0.attn.wq_a.trellis") != std::string::npos,
             bad_k.status().message());
  auto bad_s = src.load_exl3("model.layers.0.attn.wkv.weight");
  BOOST_TEST(!bad_s.ok());
  BOOST_TEST(bad_s.status().message().find("model.layers.0.attn.wkv.suh") != std::string::npos, bad_s.status().message());
  // A well-formed group of the wrong shape for its weight: the model's loader names both.
  ModelSpec spec = spec_from_config(verify::exl3_rank_config()).value_or_throw();
  spec.q_lora_rank = 256;
  auto lw = load_weights(spec, ckpt().src, Numerics::kFp32, {.keep_exl3 = true});
  BOOST_TEST(!lw.ok());
  BOOST_TEST(lw.status().message().find("model.layers.0.attn.wq_a") != std::string::npos, lw.status().message());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

BOOST_AUTO_TEST_SUITE_END()

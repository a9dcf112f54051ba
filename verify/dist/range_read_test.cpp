// SPDX-License-Identifier: Apache-2.0
/// Row-range reads of checkpoint tensors (io::Checkpoint::load_rows / load_f32_rows, WeightSource::load_f32_rows /
/// load_scaled_rows): what a rank needs of a tensor-parallel row split, read without the other rows.
///  * For TP 2, 4 and TP = EP = 2, every rank's rows of wq_b (heads), attn_sink (heads), wo_a (groups), wo_b
///    (output rows), the shared expert's w1 / w3 (intermediate rows) and w2 (output rows) and the LM head
///    (vocabulary rows), on an FP8-format and on a bf16 synthetic checkpoint: the range read's values (fp32) and
///    stored bytes (dense stored dtype; FP8 codes and the scale rows covering them) equal the rows of the whole
///    read, byte for byte, and the bytes read are exactly the range's rows (+ its scale rows), strictly fewer
///    than the whole tensor's when the range is a proper part.
///  * Under the all-reduce plan (TP 2, 4) every rank's wo_b columns of its o-groups, read alone, likewise (FP8:
///    codes and the scale columns covering them).
///  * The default WeightSource implementation (whole read, then the rows) gives the same bytes.
///  * A range outside the tensor, an FP8 stored read that is not whole 32-row / 32-column scale blocks and a stored
///    column read of packed FP4 are refused with a message naming the tensor (FP8 values of such a range still
///    read: load_f32_rows / load_f32_cols).
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "tessera/models/deepseek_v41/synthetic.hpp"
#include "verify/dist/synthetic_folder.hpp"
#include "verify/model/fixture.hpp"

using namespace tessera;
using namespace tessera::model;
using namespace tessera::model::dsv41;

namespace {

dist::ParallelConfig cfg(int tp, int ep) { return verify::tp_ep(tp, ep); }

/// A synthetic checkpoint of the tiny preset widened so that TP 4 splits whole FP8 blocks of some tensors and
/// partial blocks of others (8 heads of head_dim 64; o_lora_rank 32; hidden 128).
struct Folder : verify::SyntheticFolder {
  Config config;
  CheckpointSource src;
  io::Checkpoint ckpt;
  Folder(std::string const& tag, SyntheticFormat const& format)
      : SyntheticFolder("range_read_" + tag, verify::wide_block_config(), 91, format, false),
        config(verify::wide_block_config()) {
    throw_if_error(src.open(checkpoint()));
    ckpt = io::Checkpoint::open(checkpoint()).value_or_throw();
  }
};

/// Forwards the whole-tensor reads only, so the range reads take WeightSource's default path.
class WholeOnlySource final : public WeightSource {
 public:
  explicit WholeOnlySource(WeightSource const& s) : s_(s) {}
  bool contains(std::string const& n) const override { return s_.contains(n); }
  Result<std::vector<int64_t>> shape(std::string const& n) const override { return s_.shape(n); }
  Result<DType> dtype(std::string const& n) const override { return s_.dtype(n); }
  Result<Tensor> load_f32(std::string const& n) const override { return s_.load_f32(n); }
  Result<Tensor> load_i64(std::string const& n) const override { return s_.load_i64(n); }
  Result<ScaledWeight> load_scaled(std::string const& n) const override { return s_.load_scaled(n); }
  std::string describe() const override { return s_.describe(); }

 private:
  WeightSource const& s_;
};

/// Bytes of rows [r0, r1) of a row-major tensor.
bool same_rows(Tensor const& part, Tensor const& whole, int64_t r0, int64_t r1) {
  size_t const row = whole.dim(0) ? whole.nbytes() / static_cast<size_t>(whole.dim(0)) : 0;
  return part.dim(0) == r1 - r0 && part.nbytes() == static_cast<size_t>(r1 - r0) * row &&
         std::memcmp(part.data(), whole.data_as<unsigned char>() + static_cast<size_t>(r0) * row, part.nbytes()) == 0;
}

bool same_bytes(Tensor const& a, Tensor const& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

struct Split {
  std::string name;
  dist::Range rows;
};

/// The rank's row ranges of the TP-split tensors that are split by rows (wo_b in the gather modes).
std::vector<Split> row_splits(ModelSpec const& s, dist::RankPlan const& me) {
  std::vector<Split> out;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    std::string const p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "attn.wq_b.weight", {me.heads.begin * s.head_dim, me.heads.end * s.head_dim}});
    out.push_back({p + "attn.attn_sink", me.heads});
    if (!me.gather_heads) out.push_back({p + "attn.wo_a.weight", {me.groups.begin * s.o_lora_rank, me.groups.end * s.o_lora_rank}});
    out.push_back({p + "attn.wo_b.weight", me.wo_b_rows});
    out.push_back({p + "ffn.shared_experts.w1.weight", me.shared_inter});
    out.push_back({p + "ffn.shared_experts.w3.weight", me.shared_inter});
    out.push_back({p + "ffn.shared_experts.w2.weight", me.shared_rows});
  }
  out.push_back({"head.weight", me.vocab});
  return out;
}

/// The checkpoint name present among `n` and its "model."-less / lm_head spellings.
std::string present_name(CheckpointSource const& src, std::string const& n) {
  for (std::string const& c : {n, "model." + n, n == "head.weight" ? std::string("lm_head.weight") : n})
    if (src.contains(c)) return c;
  BOOST_FAIL("the synthetic checkpoint has no tensor " + n);
  return {};
}

/// Checks every rank's row reads of `f` under the plans; `fp8`: the attention projections and the shared expert are
/// stored block-scaled (the synthetic LM head stays bf16).
void check_rank_reads(Folder const& f, bool fp8) {
  ModelSpec const spec = spec_from_config(f.config).value_or_throw();
  WholeOnlySource const whole_only(f.src);
  size_t stored_reads = 0, fallbacks = 0;
  for (auto const& c : {cfg(2, 1), cfg(4, 1), cfg(2, 2)}) {
    auto const plan = dist::make_plan(model_dims(spec), c).value_or_throw();
    for (int rank = 0; rank < plan.world; ++rank) {
      size_t read = 0, whole_bytes = 0;
      for (Split const& sp : row_splits(spec, plan.ranks[static_cast<size_t>(rank)])) {
        std::string const n = present_name(f.src, sp.name);
        std::string const what = "tp" + std::to_string(c.tp) + " ep" + std::to_string(c.ep) + " rank " +
                                 std::to_string(rank) + " " + n;
        BOOST_TEST_CONTEXT(what) {
          int64_t const r0 = sp.rows.begin, r1 = sp.rows.end;
          Tensor const all = f.src.load_f32(n).value_or_throw();
          BOOST_REQUIRE(r1 <= all.dim(0));
          BOOST_TEST(same_rows(f.src.load_f32_rows(n, r0, r1).value_or_throw(), all, r0, r1));
          BOOST_TEST(same_bytes(whole_only.load_f32_rows(n, r0, r1).value_or_throw(),
                                f.src.load_f32_rows(n, r0, r1).value_or_throw()));
          ScaledWeight const sw = f.src.load_scaled(n).value_or_throw();
          BOOST_TEST(sw.present() == (f.ckpt.find(n)->dtype == DType::kF8E4m3));
          if (!sw.present()) {
            io::TensorInfo const& t = *f.ckpt.find(n);
            Tensor const rows = f.ckpt.load_rows(n, r0, r1).value_or_throw();
            BOOST_TEST(same_rows(rows, f.ckpt.load(n).value_or_throw(), r0, r1));
            size_t const expect = t.nbytes / static_cast<size_t>(t.shape[0]) * static_cast<size_t>(r1 - r0);
            BOOST_TEST(rows.nbytes() == expect);
            read += rows.nbytes();
            whole_bytes += t.nbytes;
            continue;
          }
          int64_t const cb = (sw.cols + 31) / 32;
          if (!scaled_slice_aligned(sw.dtype, sw.rows, sp.rows, false)) {
            auto refused = f.src.load_scaled_rows(n, r0, r1);
            BOOST_TEST(!refused.ok());
            BOOST_TEST(refused.status().message().find("not whole 32-row scale blocks") != std::string::npos);
            BOOST_TEST(refused.status().message().find(n) != std::string::npos);
            BOOST_TEST(!whole_only.load_scaled_rows(n, r0, r1).ok());
            ++fallbacks;
            continue;
          }
          ScaledWeight const part = f.src.load_scaled_rows(n, r0, r1).value_or_throw();
          int64_t const s0 = r0 / 32, s1 = (r1 + 31) / 32;
          BOOST_TEST((part.dtype == sw.dtype && part.rows == r1 - r0 && part.cols == sw.cols));
          BOOST_TEST(same_rows(part.codes, sw.codes, r0, r1));
          BOOST_TEST(same_rows(part.scales, sw.scales, s0, s1));
          ScaledWeight const def = whole_only.load_scaled_rows(n, r0, r1).value_or_throw();
          BOOST_TEST((same_bytes(def.codes, part.codes) && same_bytes(def.scales, part.scales)));
          size_t const expect = static_cast<size_t>((r1 - r0) * sw.cols + (s1 - s0) * cb);
          BOOST_TEST(part.codes.nbytes() + part.scales.nbytes() == expect);
          read += expect;
          whole_bytes += sw.codes.nbytes() + sw.scales.nbytes();
          ++stored_reads;
        }
      }
      BOOST_TEST_CONTEXT("tp" << c.tp << " ep" << c.ep << " rank " << rank) {
        BOOST_TEST(read > 0u);
        BOOST_TEST(read < whole_bytes);  // every plan here splits every listed tensor
      }
    }
  }
  if (fp8) {
    BOOST_TEST(stored_reads > 0u);
    BOOST_TEST(fallbacks > 0u);  // TP 4 splits the shared expert w1 / w3 32-row blocks in two (16 rows a rank)
  }
}

/// Columns [c0, c1) of a 2-D row-major tensor, byte for byte.
bool same_cols(Tensor const& part, Tensor const& whole, int64_t c0, int64_t c1) {
  size_t const es = dtype_size(whole.dtype()), row = static_cast<size_t>(whole.dim(1)) * es,
               n = static_cast<size_t>(c1 - c0) * es;
  if (part.dtype() != whole.dtype() || part.shape() != std::vector<int64_t>{whole.dim(0), c1 - c0}) return false;
  for (int64_t r = 0; r < whole.dim(0); ++r)
    if (std::memcmp(part.data_as<unsigned char>() + static_cast<size_t>(r) * n,
                    whole.data_as<unsigned char>() + static_cast<size_t>(r) * row + static_cast<size_t>(c0) * es, n) != 0)
      return false;
  return true;
}

/// Under the all-reduce plan a rank applies wo_b's columns of its o-groups, [g0·ro, g1·ro): read alone they equal
/// the whole read's columns (values, stored bytes, FP8 codes and the scale columns covering them), in exactly
/// rows·(c1 − c0) code bytes (+ ⌈rows/32⌉·(⌈c1/32⌉ − c0/32) scale bytes).
void check_allreduce_wo_b_cols(Folder const& f, bool fp8) {
  ModelSpec const spec = spec_from_config(f.config).value_or_throw();
  WholeOnlySource const whole_only(f.src);
  for (int tp : {2, 4}) {
    dist::ParallelConfig c = cfg(tp, 1);
    c.attn = dist::AttnCombine::kAllReduce;
    auto const plan = dist::make_plan(model_dims(spec), c).value_or_throw();
    for (int rank = 0; rank < plan.world; ++rank) {
      dist::RankPlan const& me = plan.ranks[static_cast<size_t>(rank)];
      BOOST_REQUIRE(!me.gather_heads);
      int64_t const c0 = me.groups.begin * spec.o_lora_rank, c1 = me.groups.end * spec.o_lora_rank;
      for (int64_t l = 0; l < spec.num_layers; ++l) {
        std::string const n = present_name(f.src, "layers." + std::to_string(l) + ".attn.wo_b.weight");
        BOOST_TEST_CONTEXT("tp" << tp << " all-reduce rank " << rank << " " << n) {
          Tensor const all = f.src.load_f32(n).value_or_throw();
          BOOST_TEST(same_cols(f.src.load_f32_cols(n, c0, c1).value_or_throw(), all, c0, c1));
          BOOST_TEST(same_bytes(whole_only.load_f32_cols(n, c0, c1).value_or_throw(),
                                f.src.load_f32_cols(n, c0, c1).value_or_throw()));
          ScaledWeight const sw = f.src.load_scaled(n).value_or_throw();
          BOOST_TEST(sw.present() == fp8);
          if (!sw.present()) {
            io::TensorInfo const& t = *f.ckpt.find(n);
            Tensor const cols = f.ckpt.load_cols(n, c0, c1).value_or_throw();
            BOOST_TEST(same_cols(cols, f.ckpt.load(n).value_or_throw(), c0, c1));
            BOOST_TEST(cols.nbytes() == t.nbytes / static_cast<size_t>(t.shape[1]) * static_cast<size_t>(c1 - c0));
            BOOST_TEST(cols.nbytes() < t.nbytes);
            continue;
          }
          BOOST_REQUIRE(scaled_slice_aligned(sw.dtype, sw.cols, dist::Range{c0, c1}, true));  // o_lora_rank 32: whole blocks
          ScaledWeight const part = f.src.load_scaled_cols(n, c0, c1).value_or_throw();
          int64_t const s0 = c0 / 32, s1 = (c1 + 31) / 32;
          BOOST_TEST((part.dtype == sw.dtype && part.rows == sw.rows && part.cols == c1 - c0));
          BOOST_TEST(same_cols(part.codes, sw.codes, c0, c1));
          BOOST_TEST(same_cols(part.scales, sw.scales, s0, s1));
          ScaledWeight const def = whole_only.load_scaled_cols(n, c0, c1).value_or_throw();
          BOOST_TEST((same_bytes(def.codes, part.codes) && same_bytes(def.scales, part.scales)));
          size_t const expect = static_cast<size_t>(sw.rows * (c1 - c0) + (sw.rows + 31) / 32 * (s1 - s0));
          BOOST_TEST(part.codes.nbytes() + part.scales.nbytes() == expect);
          BOOST_TEST(expect < sw.codes.nbytes() + sw.scales.nbytes());
        }
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(range_read)

BOOST_AUTO_TEST_CASE(fp8_rank_rows_equal_whole_rows) {
  Folder const f("fp8", *native_fp8_format());
  check_rank_reads(f, true);
  check_allreduce_wo_b_cols(f, true);
}

BOOST_AUTO_TEST_CASE(bf16_rank_rows_equal_whole_rows) {
  Folder const f("bf16", *dense_format(DType::kBf16));
  check_rank_reads(f, false);
  check_allreduce_wo_b_cols(f, false);
}

BOOST_AUTO_TEST_CASE(ranges_outside_the_tensor_are_refused) {
  Folder const f("bad", *native_fp8_format());
  std::string const wq_b = present_name(f.src, "layers.0.attn.wq_b.weight");
  std::string const sink = present_name(f.src, "layers.0.attn.attn_sink");
  int64_t const rows = f.src.shape(wq_b).value_or_throw()[0];
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, rows + 32}, {-32, 32}, {64, 32}}) {
    BOOST_TEST_CONTEXT("rows [" << r0 << ", " << r1 << ")") {
      auto a = f.src.load_scaled_rows(wq_b, r0, r1);
      BOOST_TEST(!a.ok());
      BOOST_TEST(a.status().message().find(wq_b) != std::string::npos);
      auto b = f.src.load_f32_rows(wq_b, r0, r1);
      BOOST_TEST(!b.ok());
      BOOST_TEST(b.status().message().find(wq_b) != std::string::npos);
      auto c = f.ckpt.load_rows(sink, r0, r1);
      BOOST_TEST(!c.ok());
      BOOST_TEST(c.status().message().find(sink) != std::string::npos);
    }
  }
  // FP8 rows [16, 48): half of two scale blocks. As stored it is refused; its values read (both blocks' scales).
  auto misaligned = f.src.load_scaled_rows(wq_b, 16, 48);
  BOOST_TEST(!misaligned.ok());
  BOOST_TEST(misaligned.status().message().find("not whole 32-row scale blocks") != std::string::npos);
  BOOST_TEST(same_rows(f.src.load_f32_rows(wq_b, 16, 48).value_or_throw(), f.src.load_f32(wq_b).value_or_throw(), 16, 48));
  BOOST_TEST(!f.src.load_f32_rows("layers.0.attn.no_such.weight", 0, 1).ok());
  // Columns: FP8 [16, 48) refused as stored, read as values; outside the tensor, 1-D and packed FP4 refused.
  std::string const wo_b = present_name(f.src, "layers.0.attn.wo_b.weight");
  int64_t const cols = f.src.shape(wo_b).value_or_throw()[1];
  auto half_blocks = f.src.load_scaled_cols(wo_b, 16, 48);
  BOOST_TEST(!half_blocks.ok());
  BOOST_TEST(half_blocks.status().message().find("not whole 32-column scale blocks") != std::string::npos);
  BOOST_TEST(same_cols(f.src.load_f32_cols(wo_b, 16, 48).value_or_throw(), f.src.load_f32(wo_b).value_or_throw(), 16, 48));
  for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, cols + 32}, {-32, 32}, {64, 32}}) {
    BOOST_TEST_CONTEXT("columns [" << c0 << ", " << c1 << ")") {
      auto a = f.src.load_scaled_cols(wo_b, c0, c1);
      BOOST_TEST(!a.ok());
      BOOST_TEST(a.status().message().find(wo_b) != std::string::npos);
      auto b = f.src.load_f32_cols(wo_b, c0, c1);
      BOOST_TEST(!b.ok());
      BOOST_TEST(b.status().message().find(wo_b) != std::string::npos);
    }
  }
  BOOST_TEST(!f.ckpt.load_cols(sink, 0, 1).ok());
  bool saw_fp4 = false;
  for (auto const& t : f.ckpt.tensors())
    if (!saw_fp4 && t.dtype == DType::kI8 && t.name.find(".experts.") != std::string::npos) {  // packed FP4 codes
      auto fp4 = f.src.load_scaled_cols(t.name, 0, 32);
      BOOST_TEST(!fp4.ok());
      BOOST_TEST(fp4.status().message().find("FP8 only") != std::string::npos);
      saw_fp4 = true;
    }
  BOOST_TEST(saw_fp4);
}

BOOST_AUTO_TEST_SUITE_END()

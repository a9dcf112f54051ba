// SPDX-License-Identifier: Apache-2.0
/// Helpers of the rank host model tests (rank_loader_test.cpp): a WeightSource that counts the checkpoint bytes each
/// read asks for, whole or in part; weights compared tensor for tensor and byte for byte; a chunked prefill + decode
/// schedule run on rank models as threads over the in-process communicator.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tessera/models/deepseek_v41/golden_gate.hpp"  // argmax_first
#include "tessera/models/deepseek_v41/loader.hpp"
#include "tessera/models/deepseek_v41/sharded.hpp"
#include "verify/gpu_model/gpu_model_fixture.hpp"  // verify::bitwise_equal
#include "verify/model/fixture.hpp"

namespace tessera::verify {

/// A WeightSource over one checkpoint file that adds up the stored bytes every successful read asks for:
///   whole read (load_f32, load_i64, load_scaled)   the tensor's bytes;
///   rows [r0, r1)                                  (r1 − r0) · its row bytes;
///   columns [c0, c1) of a 2-D tensor               rows · (c1 − c0) · its element bytes;
/// and for a block-scaled weight (scaled_dtype not kF32: `X.weight` codes with an `X.scale` E8M0 tensor) the bytes of
/// the scales that cover the part: all of them for a whole read, FP8 scale rows [r0/32, ⌈r1/32⌉) or scale columns
/// [c0/32, ⌈c1/32⌉) of every scale row, FP4 scale rows [r0, r1). A column read of packed FP4 values is a whole read
/// (CheckpointSource has no narrower one). Reads are counted every time they happen, so a tensor read twice counts
/// twice. Header queries (contains, shape, dtype, scaled_dtype) and a stored read of a tensor that is not stored
/// block-scaled (an empty ScaledWeight) read nothing.
class CountingSource final : public model::dsv41::WeightSource {
 public:
  explicit CountingSource(std::filesystem::path const& file) {
    throw_if_error(src_.open(file.string()));
    auto const ckpt = io::Checkpoint::open(file.string()).value_or_throw();
    for (auto const& t : ckpt.tensors()) info_[t.name] = t;
  }
  bool contains(std::string const& n) const override { return src_.contains(n); }
  Result<std::vector<int64_t>> shape(std::string const& n) const override { return src_.shape(n); }
  Result<DType> dtype(std::string const& n) const override { return src_.dtype(n); }
  Result<DType> scaled_dtype(std::string const& n) const override { return src_.scaled_dtype(n); }
  Result<Tensor> load_f32(std::string const& n) const override { return count(src_.load_f32(n), n, whole()); }
  Result<Tensor> load_i64(std::string const& n) const override { return count(src_.load_i64(n), n, whole()); }
  Result<model::dsv41::ScaledWeight> load_scaled(std::string const& n) const override {
    return count(src_.load_scaled(n), n, whole());
  }
  Result<Tensor> load_f32_rows(std::string const& n, int64_t r0, int64_t r1) const override {
    return count(src_.load_f32_rows(n, r0, r1), n, {r0, r1, false});
  }
  Result<model::dsv41::ScaledWeight> load_scaled_rows(std::string const& n, int64_t r0, int64_t r1) const override {
    return count(src_.load_scaled_rows(n, r0, r1), n, {r0, r1, false});
  }
  Result<Tensor> load_f32_cols(std::string const& n, int64_t c0, int64_t c1) const override {
    bool const fp4 = format_of(n) == DType::kF4E2m1x2;
    return count(src_.load_f32_cols(n, c0, c1), n, fp4 ? whole() : Part{c0, c1, true});
  }
  Result<model::dsv41::ScaledWeight> load_scaled_cols(std::string const& n, int64_t c0, int64_t c1) const override {
    return count(src_.load_scaled_cols(n, c0, c1), n, {c0, c1, true});
  }
  std::string describe() const override { return src_.describe(); }

  size_t bytes_read() const { return read_; }
  /// The checkpoint's tensors (name, dtype, shape, stored bytes).
  std::map<std::string, io::TensorInfo> const& tensors() const { return info_; }

 private:
  struct Part {
    int64_t begin = 0, end = -1;  // end −1: the whole tensor
    bool cols = false;
  };
  static Part whole() { return {}; }
  DType format_of(std::string const& n) const {
    auto d = src_.scaled_dtype(n);
    return d ? *d : DType::kF32;
  }
  /// Stored bytes of part p of tensor t.
  static size_t bytes_of(io::TensorInfo const& t, Part p) {
    if (p.end < 0) return t.nbytes;
    int64_t const n = t.shape[p.cols ? 1 : 0];
    return n == 0 ? 0 : t.nbytes / static_cast<size_t>(n) * static_cast<size_t>(p.end - p.begin);
  }
  template <class R>
  R count(R r, std::string const& n, Part p) const {
    auto it = info_.find(n);
    if (!r.ok() || it == info_.end()) return r;
    if constexpr (std::is_same_v<R, Result<model::dsv41::ScaledWeight>>)
      if (!r->present()) return r;  // not stored block-scaled: nothing was read
    read_ += bytes_of(it->second, p);
    DType const fmt = format_of(n);
    if (fmt == DType::kF32) return r;
    io::TensorInfo const& scale = info_.at(n.substr(0, n.size() - 6) + "scale");
    bool const fp8 = fmt == DType::kF8E4m3;
    Part const sp = p.end < 0 ? p
                    : p.cols ? Part{p.begin / 32, (p.end + 31) / 32, true}
                    : fp8    ? Part{p.begin / 32, (p.end + 31) / 32, false}
                             : p;
    read_ += bytes_of(scale, sp);
    return r;
  }
  model::dsv41::CheckpointSource src_;
  std::map<std::string, io::TensorInfo> info_;
  mutable size_t read_ = 0;
};

/// The folder's checkpoint (counted) with the Engram hash data of the golden tiny fixture (second source, not counted).
struct CountedSources {
  CountingSource counting;
  model::dsv41::CheckpointSource engram;
  struct Both final : model::dsv41::WeightSource {
    WeightSource const* a;
    WeightSource const* b;
    WeightSource const& pick(std::string const& n) const { return a->contains(n) ? *a : *b; }
    bool contains(std::string const& n) const override { return a->contains(n) || b->contains(n); }
    Result<std::vector<int64_t>> shape(std::string const& n) const override { return pick(n).shape(n); }
    Result<DType> dtype(std::string const& n) const override { return pick(n).dtype(n); }
    Result<DType> scaled_dtype(std::string const& n) const override { return pick(n).scaled_dtype(n); }
    Result<Tensor> load_f32(std::string const& n) const override { return pick(n).load_f32(n); }
    Result<Tensor> load_i64(std::string const& n) const override { return pick(n).load_i64(n); }
    Result<model::dsv41::ScaledWeight> load_scaled(std::string const& n) const override { return pick(n).load_scaled(n); }
    Result<Tensor> load_f32_rows(std::string const& n, int64_t r0, int64_t r1) const override {
      return pick(n).load_f32_rows(n, r0, r1);
    }
    Result<model::dsv41::ScaledWeight> load_scaled_rows(std::string const& n, int64_t r0, int64_t r1) const override {
      return pick(n).load_scaled_rows(n, r0, r1);
    }
    Result<Tensor> load_f32_cols(std::string const& n, int64_t c0, int64_t c1) const override {
      return pick(n).load_f32_cols(n, c0, c1);
    }
    Result<model::dsv41::ScaledWeight> load_scaled_cols(std::string const& n, int64_t c0, int64_t c1) const override {
      return pick(n).load_scaled_cols(n, c0, c1);
    }
    std::string describe() const override { return a->describe(); }
  } both;
  explicit CountedSources(std::filesystem::path const& dir) : counting(dir / "model.safetensors") {
    throw_if_error(engram.open(tiny_dir("fp32") + "/golden.safetensors"));
    both.a = &counting;
    both.b = &engram;
  }
};

/// Every tensor of `w` by name (undefined ones included).
inline std::vector<std::pair<std::string, Tensor const*>> tensors_of(model::dsv41::Weights const& w) {
  using model::dsv41::LayerWeights;
  static constexpr std::pair<char const*, Tensor LayerWeights::*> kFields[] = {
      {"hc_attn_fn", &LayerWeights::hc_attn_fn}, {"hc_attn_base", &LayerWeights::hc_attn_base},
      {"hc_attn_scale", &LayerWeights::hc_attn_scale}, {"hc_ffn_fn", &LayerWeights::hc_ffn_fn},
      {"hc_ffn_base", &LayerWeights::hc_ffn_base}, {"hc_ffn_scale", &LayerWeights::hc_ffn_scale},
      {"attn_norm", &LayerWeights::attn_norm}, {"ffn_norm", &LayerWeights::ffn_norm}, {"wq_a", &LayerWeights::wq_a},
      {"q_norm", &LayerWeights::q_norm}, {"wq_b", &LayerWeights::wq_b}, {"wkv", &LayerWeights::wkv},
      {"kv_norm", &LayerWeights::kv_norm}, {"wo_a", &LayerWeights::wo_a}, {"wo_b", &LayerWeights::wo_b},
      {"attn_sink", &LayerWeights::attn_sink}, {"c_wkv", &LayerWeights::c_wkv}, {"c_wgate", &LayerWeights::c_wgate},
      {"c_norm", &LayerWeights::c_norm}, {"i_wq_b", &LayerWeights::i_wq_b},
      {"i_weights_proj", &LayerWeights::i_weights_proj}, {"i_wk", &LayerWeights::i_wk},
      {"i_k_norm", &LayerWeights::i_k_norm}, {"gate", &LayerWeights::gate}, {"gate_bias", &LayerWeights::gate_bias},
      {"e_table", &LayerWeights::e_table}, {"e_wkv", &LayerWeights::e_wkv}, {"e_qk", &LayerWeights::e_qk}};
  std::vector<std::pair<std::string, Tensor const*>> out{{"embed", &w.embed}, {"norm", &w.norm}, {"lm_head", &w.lm_head}};
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights const& L = w.layers[l];
    std::string const p = "layers." + std::to_string(l) + ".";
    for (auto const& [name, field] : kFields) out.emplace_back(p + name, &(L.*field));
    for (size_t e = 0; e < L.experts.size(); ++e)
      for (auto [wn, t] : {std::pair{"w1", &L.experts[e].w1}, {"w3", &L.experts[e].w3}, {"w2", &L.experts[e].w2}})
        out.emplace_back(p + "experts." + std::to_string(e) + "." + wn, t);
    for (auto [wn, t] : {std::pair{"w1", &L.shared.w1}, {"w3", &L.shared.w3}, {"w2", &L.shared.w2}})
      out.emplace_back(p + "shared." + wn, t);
  }
  return out;
}

inline bool same_bytes(Tensor const& a, Tensor const& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

/// `got` and `want` hold the same tensors and stored forms, byte for byte (each difference is a failed assertion);
/// whether they do.
inline bool check_same_weights(model::dsv41::Weights const& got, model::dsv41::Weights const& want,
                               std::string const& what) {
  auto const g = tensors_of(got), w = tensors_of(want);
  BOOST_TEST_REQUIRE(g.size() == w.size(), what);
  size_t differ = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!same_bytes(*g[i].second, *w[i].second)) {
      ++differ;
      BOOST_TEST_MESSAGE(what << ": " << g[i].first << " differs");
    }
  BOOST_TEST(differ == 0u, what << ": dense tensors");
  BOOST_TEST(got.scaled.size() == want.scaled.size(), what);
  bool same = differ == 0 && got.scaled.size() == want.scaled.size() && got.exl3.empty();
  for (auto const& [key, sw] : want.scaled) {
    model::dsv41::ScaledWeight const* o = got.scaled_of(key);
    BOOST_TEST(o != nullptr, what << ": " << key);
    if (!o) {
      same = false;
      continue;
    }
    bool const shape = o->dtype == sw.dtype && o->rows == sw.rows && o->cols == sw.cols;
    bool const codes = same_bytes(o->codes, sw.codes), scales = same_bytes(o->scales, sw.scales);
    BOOST_TEST(shape, what << ": " << key);
    BOOST_TEST(codes, what << ": " << key << " codes");
    BOOST_TEST(scales, what << ": " << key << " scales");
    same = same && shape && codes && scales;
  }
  BOOST_TEST(got.exl3.empty());
  return same;
}

/// Top-1 agreement of `got` with `want` row by row (rows of V logits): a disagreement counts as a near-tie when
/// want's top-1/top-2 gap is at most `tie` (the golden gate's fp32 tie bound), so a plan that is not bit-exact passes
/// when agree + ties == rows.
struct Top1 {
  int agree = 0, ties = 0, rows = 0;
  double max_diff = 0;
};
inline Top1 top1_agreement(std::vector<float> const& want, std::vector<float> const& got, int64_t V, float tie) {
  Top1 t;
  for (size_t r = 0; r < want.size() / static_cast<size_t>(V); ++r, ++t.rows) {
    float const *x = &want[r * V], *y = &got[r * V];
    int64_t const ia = model::dsv41::argmax_first(x, V);
    float second = -INFINITY;
    for (int64_t j = 0; j < V; ++j) {
      if (j != ia) second = std::max(second, x[j]);
      t.max_diff = std::max(t.max_diff, std::fabs(double(x[j]) - y[j]));
    }
    if (ia == model::dsv41::argmax_first(y, V)) ++t.agree;
    else if (x[ia] - second <= tie) ++t.ties;
  }
  return t;
}

/// Logits of prefill chunks of 7, 1 and 12 tokens (every row) and 6 decode steps.
inline std::vector<float> schedule_logits(model::LanguageModel& m, std::vector<int32_t> const& toks) {
  int64_t const V = m.info().vocab_size;
  auto st = m.new_sequence();
  std::vector<float> all;
  size_t pos = 0;
  for (size_t chunk : {7u, 1u, 12u, 1u, 1u, 1u, 1u, 1u, 1u}) {
    std::vector<float> lg(chunk * V);
    model::SequenceStep s{st.get(), std::span<int32_t const>(toks.data() + pos, chunk), static_cast<int64_t>(chunk),
                          lg.data()};
    throw_if_error(m.forward(std::span<model::SequenceStep>(&s, 1)));
    all.insert(all.end(), lg.begin(), lg.end());
    pos += chunk;
  }
  return all;
}

/// Runs the schedule on rank models made from hosts[r] (one per rank) as threads over an in-process group; every
/// rank's logits.
inline std::vector<std::vector<float>> run_ranks(std::vector<model::dsv41::Dsv41Model const*> const& hosts,
                                                 dist::ShardingPlan const& plan, std::vector<int32_t> const& toks) {
  int const n = plan.world;
  auto comms = dist::InProcessCommunicator::create(n);
  std::vector<std::unique_ptr<ThreadPool>> pools;
  std::vector<std::unique_ptr<model::dsv41::Dsv41Model>> ranks;
  for (int r = 0; r < n; ++r) {
    pools.push_back(std::make_unique<ThreadPool>(1));
    auto sh = std::make_shared<model::dsv41::RankShard>(model::dsv41::RankShard{plan, r, comms[static_cast<size_t>(r)].get()});
    ranks.push_back(model::dsv41::make_rank_model(*hosts[static_cast<size_t>(r)], sh, pools.back().get()).value_or_throw());
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        out[static_cast<size_t>(r)] = schedule_logits(*ranks[static_cast<size_t>(r)], toks);
      } catch (std::exception const& e) {
        errors[static_cast<size_t>(r)] = e.what();
        comms[static_cast<size_t>(r)]->abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    BOOST_TEST_REQUIRE(errors[static_cast<size_t>(r)].empty(), "rank " << r << ": " << errors[static_cast<size_t>(r)]);
  return out;
}

}  // namespace tessera::verify

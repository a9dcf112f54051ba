// SPDX-License-Identifier: Apache-2.0
/// The DeepSeek-V4.1 GPU model (gpu_model.hpp): the weight upload and the LanguageModel face (sequences,
/// batches, clone, truncate, state sizes) on the backend's memory (gpu_mem.cpp). The forward is
/// gpu_forward.cpp and gpu_attention.cpp (gpu_forward.hpp).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "models/deepseek_v41/gpu_impl.hpp"
#include "models/deepseek_v41/model_internal.hpp"
#include "tessera/core/thread_pool.hpp"
#include "tessera/ops/linear.hpp"
#include "tessera/ops/linear_tc.hpp"
#include "tessera/ref/rope_ref.hpp"

namespace tessera::model::dsv41 {

namespace {

using Copy = gpu::Mem::Copy;

/// Rows of one pass at most: the per-launch row bound of several CUDA families (MoeExperts, mHC collapse /
/// expand, EngramGate, the fma-chain linear).
constexpr int64_t kMaxPassRows = 65535;

/// Backend memory for a weight, owned (and counted) by `w`.
Result<void*> alloc_weight(gpu::Mem const& mem, gpu::GpuWeights& w, size_t bytes) {
  auto p = mem.alloc(bytes);
  if (!p) return p.status();
  w.allocations.push_back(*p);
  w.bytes += bytes;
  return p;
}

/// Uploads `t` (fp32 host values) as `as` (kF32, or kBf16 for values that are bf16 already).
Status upload_tensor(gpu::Mem const& mem, gpu::GpuWeights& w, Tensor const& t, DType as, gpu::DevTensor* out) {
  *out = {};
  if (!t.defined() || t.data() == nullptr || t.numel() == 0) return {};  // a weight the layer does not have
  out->rows = t.rank() >= 1 ? t.dim(0) : 1;
  out->cols = t.rank() >= 2 ? t.numel() / t.dim(0) : 1;
  out->dtype = as;
  size_t const n = static_cast<size_t>(t.numel());
  size_t const bytes = n * (as == DType::kBf16 ? 2 : 4);
  auto p = alloc_weight(mem, w, bytes);
  if (!p) return p.status();
  out->p = *p;
  float const* src = t.data_as<float>();
  if (as == DType::kBf16) {
    std::vector<uint16_t> b(n);
    parallel_for(static_cast<int64_t>(n), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) b[static_cast<size_t>(i)] = bf16_bits_from_float(src[i]);
    }, 1 << 16);
    TESSERA_TRY(mem.copy(out->p, b.data(), bytes, Copy::kHostToDev));
    return mem.sync();  // `b` is released on return
  }
  TESSERA_TRY(mem.copy(out->p, src, bytes, Copy::kHostToDev));
  return mem.sync();
}

/// Uploads a block-scaled weight as stored: its codes and scales, each contiguous (checked by the loader).
Status upload_scaled(gpu::Mem const& mem, gpu::GpuWeights& w, ScaledWeight const& sw, gpu::DevTensor* out) {
  *out = {};
  out->rows = sw.rows;
  out->cols = sw.cols;
  out->dtype = sw.dtype;
  out->scale_stride = sw.scales.dim(1);
  auto q = alloc_weight(mem, w, sw.codes.nbytes());
  if (!q) return q.status();
  out->p = *q;
  auto sc = alloc_weight(mem, w, sw.scales.nbytes());
  if (!sc) return sc.status();
  out->scale = *sc;
  TESSERA_TRY(mem.copy(out->p, sw.codes.data(), sw.codes.nbytes(), Copy::kHostToDev));
  TESSERA_TRY(mem.copy(out->scale, sw.scales.data(), sw.scales.nbytes(), Copy::kHostToDev));
  return mem.sync();
}

/// Whether the forward can read `sw` as stored when it views it in row blocks of `row_block` rows (0: whole;
/// the grouped wo_a: o_lora_rank rows per group): an FP8 view must start on a 32-row scale block
/// (ops::Linear's grouped FP8 form needs out % 32 == 0); FP4 scales are per row.
bool scaled_rows_viewable(ScaledWeight const& sw, int64_t row_block) {
  return sw.dtype != DType::kF8E4m3 || row_block % 32 == 0;
}

/// Whether MoeExperts on `backend` runs routed experts block-scaled in `format` for `spec` (MoeExpertsDesc::
/// routed_scaled): the CPU backend any format; CUDA the fused formats at dims that are multiples of 32 within
/// the fused tile's K.
bool routed_scaled_runs(ModelSpec const& spec, Backend backend, DType format) {
  if (backend == Backend::kCpu) return ops::is_block_scaled(format);
  return ops::tc_quant_format_fused(format) && spec.hidden_size % 32 == 0 && spec.moe_inter % 32 == 0 &&
         spec.hidden_size <= ops::kTcQuantMaxK && spec.moe_inter <= ops::kTcQuantMaxK;
}

/// The held routed experts [e0, e0 + E) of layer l in EXL3 (every w1/w3/w2 recorded in Weights::exl3, one layer
/// shape per projection, and the shared expert EXL3 too): true; none of them EXL3: false; anything else kNotSupported.
Result<bool> routed_exl3(Weights const& h, int64_t l, int64_t e0, int64_t E) {
  int64_t n = 0;
  for (int64_t e = e0; e < e0 + E; ++e)
    for (char const* wn : {"w1", "w3", "w2"}) n += h.exl3_of(scaled_expert_key(l, e, wn)) != nullptr;
  int64_t sh = 0;
  for (char const* wn : {"w1", "w3", "w2"}) sh += h.exl3_of(exl3_shared_key(l, wn)) != nullptr;
  if (n == 0 && sh == 0) return false;
  std::string const where = "layer " + std::to_string(l) + ": the GPU model runs EXL3 experts only when ";
  if (n != 3 * E || sh != 3)
    return not_supported(where + "every routed and shared expert linear is EXL3 (found " + std::to_string(n) + " of " +
                         std::to_string(3 * E) + " routed, " + std::to_string(sh) + " of 3 shared)");
  for (char const* wn : {"w1", "w3", "w2"}) {
    Exl3Weight const& q0 = *h.exl3_of(scaled_expert_key(l, e0, wn));
    for (int64_t e = e0 + 1; e < e0 + E; ++e) {
      Exl3Weight const& q = *h.exl3_of(scaled_expert_key(l, e, wn));
      if (!(q.desc == q0.desc))
        return not_supported(where + "all experts of a projection share K and codebook (one grouped launch); " + q.name +
                             " differs from " + q0.name);
    }
  }
  return true;
}

Status upload_floats(gpu::Mem const& mem, gpu::GpuWeights& w, std::vector<float> const& v, gpu::DevTensor* out) {
  Tensor t = Tensor::zeros(DType::kF32, {static_cast<int64_t>(v.size())});
  std::memcpy(t.data(), v.data(), v.size() * 4);
  return upload_tensor(mem, w, t, DType::kF32, out);
}

}  // namespace

GpuDsv41Model::Impl::~Impl() {
  (void)mem.sync();
  free_expert_masks();
  for (void* p : w.allocations) mem.free(p);
  mem.close();
}

void GpuDsv41Model::Impl::free_expert_masks() {
  for (void* p : expert_masks) mem.free(p);
  expert_masks.clear();
}

Status GpuDsv41Model::Impl::upload(Weights const& h, int64_t held_experts) {
  DType const lin = md == DType::kBf16 ? DType::kBf16 : DType::kF32;  // projections
  // Experts: the CPU backend's MoeExperts reads fp32 weights only (the values are the same).
  DType const ex = mem.backend == Backend::kCpu ? DType::kF32 : lin;
  auto up = [&](Tensor const& t, gpu::DevTensor* o, DType as = DType::kF32) { return upload_tensor(mem, w, t, as, o); };
  // A projection: as stored when h.scaled has it (bf16 numerics, where its bf16 value is the tensor's) and
  // the forward's row views of it are block-aligned; else the dequantised tensor as `lin` (made from the stored
  // form when the host weights hold only that: this loader's projections_as_stored, a CPU model with
  // weights_as_stored and its rank slices).
  // The routed experts' block-scaled dtype when layer l's were loaded as stored (load_weights with
  // experts_as_stored, which leaves their ExpertWeights empty); kF32 when they were loaded dequantised.
  auto routed_scaled_dtype = [&](Weights const& hw, int64_t l, int64_t E) {
    if (E == 0 || hw.layers[static_cast<size_t>(l)].experts[static_cast<size_t>(first_expert)].w1.defined()) return DType::kF32;
    return hw.scaled.at(scaled_expert_key(l, first_expert, "w1")).dtype;
  };
  auto up_proj = [&](std::string const& key, Tensor const& t, gpu::DevTensor* o, int64_t row_block = 0) {
    // EXL3 as stored (both backends, both numerics); the grouped wo_a in its row_block-wide output slices.
    if (Exl3Weight const* q = h.exl3_of(key)) return gpu::upload_exl3(mem, w, *q, row_block ? q->desc.n / row_block : 1, o);
    ScaledWeight const* sw = h.scaled_of(key);
    // CUDA keeps a stored form only when decode shapes run it fused (else each call would decode W to bf16
    // first, slower than holding bf16); the CPU backend takes every stored form.
    if (md == DType::kBf16 && sw && scaled_rows_viewable(*sw, row_block) &&
        (mem.backend == Backend::kCpu || ops::tc_quant_format_fused(sw->dtype)))
      return upload_scaled(mem, w, *sw, o);
    return upload_tensor(mem, w, dense_weight(t, sw), lin, o);
  };
  TESSERA_TRY(up(h.embed, &w.embed));
  TESSERA_TRY(up(h.norm, &w.norm));
  TESSERA_TRY(up_proj(scaled_head_key(), h.lm_head, &w.lm_head));
  w.layers.resize(h.layers.size());
  for (size_t l = 0; l < h.layers.size(); ++l) {
    LayerWeights const& s = h.layers[l];
    gpu::GpuLayerWeights& d = w.layers[l];
    for (auto [src, dst] : {std::pair{&s.hc_attn_fn, &d.hc_attn_fn}, {&s.hc_attn_base, &d.hc_attn_base},
                            {&s.hc_attn_scale, &d.hc_attn_scale}, {&s.hc_ffn_fn, &d.hc_ffn_fn},
                            {&s.hc_ffn_base, &d.hc_ffn_base}, {&s.hc_ffn_scale, &d.hc_ffn_scale},
                            {&s.attn_norm, &d.attn_norm}, {&s.ffn_norm, &d.ffn_norm}, {&s.q_norm, &d.q_norm},
                            {&s.kv_norm, &d.kv_norm}, {&s.attn_sink, &d.attn_sink}, {&s.c_norm, &d.c_norm},
                            {&s.i_k_norm, &d.i_k_norm}, {&s.gate, &d.gate}, {&s.gate_bias, &d.gate_bias},
                            {&s.e_table, &d.e_table}, {&s.e_qk, &d.e_qk}})
      TESSERA_TRY(up(*src, dst));
    struct Proj {
      char const* field;
      Tensor const* src;
      gpu::DevTensor* dst;
    };
    for (Proj const& p : {Proj{"wq_a", &s.wq_a, &d.wq_a}, {"wq_b", &s.wq_b, &d.wq_b}, {"wkv", &s.wkv, &d.wkv},
                          {"wo_b", &s.wo_b, &d.wo_b}, {"c_wkv", &s.c_wkv, &d.c_wkv},
                          {"c_wgate", &s.c_wgate, &d.c_wgate}, {"i_wq_b", &s.i_wq_b, &d.i_wq_b},
                          {"i_weights_proj", &s.i_weights_proj, &d.i_weights_proj}, {"i_wk", &s.i_wk, &d.i_wk},
                          {"e_wkv", &s.e_wkv, &d.e_wkv}})
      TESSERA_TRY(up_proj(scaled_weight_key(static_cast<int64_t>(l), p.field), *p.src, p.dst));
    // wo_a runs grouped (gpu_attention.cpp): o_groups views of o_lora_rank rows.
    TESSERA_TRY(up_proj(scaled_weight_key(static_cast<int64_t>(l), "wo_a"), s.wo_a, &d.wo_a, spec.o_lora_rank));
    gpu::GpuExperts& m = d.moe;
    // Held experts [e0, e0 + E), at local index e − e0 in the device tables.
    size_t const e0 = static_cast<size_t>(first_expert);
    size_t const E = held_experts < 0 ? s.experts.size() - e0 : static_cast<size_t>(held_experts);
    m.w1.resize(E);
    m.w3.resize(E);
    m.w2.resize(E);
    std::vector<void const*> ptrs(3 * E), sptrs(3 * E);
    // Routed experts as stored (CUDA, bf16 numerics) when every one of them is recorded in one block-scaled
    // dtype and the block-scaled expert path takes the shape (ops::MoeExpertsDesc::routed_scaled); else dequantised.
    auto rx = routed_exl3(h, static_cast<int64_t>(l), first_expert, static_cast<int64_t>(E));
    if (!rx) return rx.status();
    m.routed_exl3 = *rx;
    // Held as stored but not run so on this backend (CUDA outside the fused tile's shapes): dequantised.
    DType rq = m.routed_exl3 ? DType::kF32 : routed_scaled_dtype(h, static_cast<int64_t>(l), static_cast<int64_t>(E));
    if (rq != DType::kF32 && (md != DType::kBf16 || !routed_scaled_runs(spec, mem.backend, rq))) rq = DType::kF32;
    std::vector<void const*> xptrs(m.routed_exl3 ? 9 * E : 0);
    for (size_t e = 0; e < E; ++e) {
      if (m.routed_exl3) {
        int j = 0;
        for (auto [wn, dst] : {std::pair{"w1", &m.w1[e]}, {"w3", &m.w3[e]}, {"w2", &m.w2[e]}}) {
          TESSERA_TRY(gpu::upload_exl3(mem, w, *h.exl3_of(scaled_expert_key(static_cast<int64_t>(l), static_cast<int64_t>(e0 + e), wn)),
                                       1, dst));
          xptrs[(3 * j + 0) * E + e] = dst->p;
          xptrs[(3 * j + 1) * E + e] = dst->suh;
          xptrs[(3 * j + 2) * E + e] = dst->svh;
          ++j;
        }
      } else if (rq != DType::kF32) {
        auto const key = [&](char const* wn) { return scaled_expert_key(static_cast<int64_t>(l), static_cast<int64_t>(e0 + e), wn); };
        TESSERA_TRY(upload_scaled(mem, w, h.scaled.at(key("w1")), &m.w1[e]));
        TESSERA_TRY(upload_scaled(mem, w, h.scaled.at(key("w3")), &m.w3[e]));
        TESSERA_TRY(upload_scaled(mem, w, h.scaled.at(key("w2")), &m.w2[e]));
      } else {
        auto const held = [&](char const* wn, Tensor const& t) {
          return dense_weight(t, h.scaled_of(scaled_expert_key(static_cast<int64_t>(l), static_cast<int64_t>(e0 + e), wn)));
        };
        TESSERA_TRY(up(held("w1", s.experts[e0 + e].w1), &m.w1[e], ex));
        TESSERA_TRY(up(held("w3", s.experts[e0 + e].w3), &m.w3[e], ex));
        TESSERA_TRY(up(held("w2", s.experts[e0 + e].w2), &m.w2[e], ex));
      }
      ptrs[e] = m.w1[e].p;
      ptrs[E + e] = m.w3[e].p;
      ptrs[2 * E + e] = m.w2[e].p;
      sptrs[e] = m.w1[e].scale;
      sptrs[E + e] = m.w3[e].scale;
      sptrs[2 * E + e] = m.w2[e].scale;
    }
    m.routed_scaled = rq;
    if (m.routed_exl3) {
      for (auto [wn, dst] : {std::pair{"w1", &m.s1}, {"w3", &m.s3}, {"w2", &m.s2}})
        TESSERA_TRY(gpu::upload_exl3(mem, w, *h.exl3_of(exl3_shared_key(static_cast<int64_t>(l), wn)), 1, dst));
      auto p = alloc_weight(mem, w, xptrs.size() * sizeof(void*));
      if (!p) return p.status();
      m.exl3_ptrs = *p;
      TESSERA_TRY(mem.copy(m.exl3_ptrs, xptrs.data(), xptrs.size() * sizeof(void*), Copy::kHostToDev));
      TESSERA_TRY(mem.sync());
    } else {
      // The shared expert as stored where the routed experts run block-scaled (MoeExpertsDesc::shared_scaled rides
      // on their paths) and its format runs; else dense: its tensor, or its stored form dequantised (same values).
      auto const skey = [&](char const* wn) { return scaled_shared_key(static_cast<int64_t>(l), wn); };
      ScaledWeight const* const sq[3] = {h.scaled_of(skey("w1")), h.scaled_of(skey("w3")), h.scaled_of(skey("w2"))};
      bool const keep = rq != DType::kF32 && sq[0] && sq[1] && sq[2] && sq[1]->dtype == sq[0]->dtype &&
                        sq[2]->dtype == sq[0]->dtype && routed_scaled_runs(spec, mem.backend, sq[0]->dtype);
      gpu::DevTensor* const dst[3] = {&m.s1, &m.s3, &m.s2};
      Tensor const* const dense[3] = {&s.shared.w1, &s.shared.w3, &s.shared.w2};
      for (int j = 0; j < 3; ++j)
        TESSERA_TRY(keep ? upload_scaled(mem, w, *sq[j], dst[j]) : up(dense_weight(*dense[j], sq[j]), dst[j], ex));
      m.shared_scaled = keep ? sq[0]->dtype : DType::kF32;
    }
    if (E > 0) {
      auto p = alloc_weight(mem, w, ptrs.size() * sizeof(void*));
      if (!p) return p.status();
      m.ptrs = *p;
      TESSERA_TRY(mem.copy(m.ptrs, ptrs.data(), ptrs.size() * sizeof(void*), Copy::kHostToDev));
      if (rq != DType::kF32) {
        auto sp = alloc_weight(mem, w, sptrs.size() * sizeof(void*));
        if (!sp) return sp.status();
        m.scale_ptrs = *sp;
        TESSERA_TRY(mem.copy(m.scale_ptrs, sptrs.data(), sptrs.size() * sizeof(void*), Copy::kHostToDev));
      }
      TESSERA_TRY(mem.sync());
    }
  }
  TESSERA_TRY(upload_floats(mem, w, main_inv_freq, &w.main_inv_freq));
  TESSERA_TRY(upload_floats(mem, w, compress_inv_freq, &w.compress_inv_freq));
  return {};
}

size_t GpuDsv41State::memory_bytes() const {
  size_t b = history_.size() * sizeof(int64_t);
  for (auto const& l : layers_)
    b += l.window.capacity() + l.raw_kv.capacity() + l.raw_gate.capacity() + l.ckv.bytes() + l.index_k.bytes();
  return b;
}

Result<std::unique_ptr<GpuDsv41Model>> GpuDsv41Model::create(ModelSpec spec, WeightSource const& src, ModelOptions opts,
                                                             Backend backend) {
  if (backend == Backend::kCuda && !cuda_model_available())
    return not_supported("--device cuda: this build has no CUDA support or no CUDA device is visible");
  TESSERA_TRY(spec.validate());
  TESSERA_TRY(check_pruning(opts.prune, spec));  // before the (long) load
  std::unique_ptr<GpuDsv41Model> m(new GpuDsv41Model());
  m->impl_ = std::make_unique<Impl>();
  Impl& I = *m->impl_;
  I.md = opts.numerics == Numerics::kBf16 ? DType::kBf16 : DType::kF32;
  // bf16 numerics keep the block-scaled projections as stored (upload); fp32 numerics read fp32 weights.
  WeightLoadOptions wo;
  wo.keep_scaled_projections = I.md == DType::kBf16 && !opts.dequantize_weights;
  // Their fp32 host copies are not made: upload takes the stored form, or dequantize_scaled of it where a
  // projection runs dense (dense_weight), the same values (4 B a weight of host memory at load: ~0.5 GB a Flash layer).
  wo.projections_as_stored = wo.keep_scaled_projections;
  wo.keep_exl3 = !opts.dequantize_weights;  // EXL3 linears run as stored (gpu_exl3.cpp), in either numerics
  // Routed experts stay as stored where MoeExperts runs them so (routed_scaled_runs: the CPU op any format, CUDA
  // the fused tiles).
  if (wo.keep_scaled_projections)
    wo.experts_as_stored = [spec, backend](DType t) { return routed_scaled_runs(spec, backend, t); };
  // The shared expert too, beside routed experts kept as stored (TESSERA_SHARED_AS_STORED=0: dense, the A/B).
  char const* const shared_env = std::getenv("TESSERA_SHARED_AS_STORED");
  if (wo.keep_scaled_projections && !(shared_env && std::string_view(shared_env) == "0"))
    wo.shared_expert_as_stored = [spec, backend](DType t) { return routed_scaled_runs(spec, backend, t); };
  auto hw = load_weights(spec, src, opts.numerics, wo);
  if (!hw) return hw.status();
  TESSERA_TRY(check_exl3_weights(spec, *hw, false));
  auto e = load_engram_tables(spec, src);
  if (!e) return e.status();
  I.engram = std::move(*e);
  I.spec = spec;  // upload reads it
  TESSERA_TRY(I.finish_create(*m, *hw, backend, std::move(opts), -1));
  return m;
}

Result<std::unique_ptr<GpuDsv41Model>> GpuDsv41Model::create_rank(Dsv41Model const& full,
                                                                  std::shared_ptr<RankShard const> shard,
                                                                  ModelOptions opts, Backend backend) {
  if (!shard || !shard->comm) return invalid_argument("create_rank: a rank shard with a communicator is required");
  if (backend == Backend::kCuda && !cuda_model_available())
    return not_supported("--device cuda: this build has no CUDA support or no CUDA device is visible");
  if (opts.numerics != full.numerics())
    return invalid_argument("create_rank: the rank's numerics must be the full model's");
  dist::MemorySpace const want = backend == Backend::kCuda ? dist::MemorySpace::kDevice : dist::MemorySpace::kHost;
  if (shard->comm->memory_space() != want)
    return invalid_argument("create_rank: the " + shard->comm->name() + " communicator takes " +
                            (want == dist::MemorySpace::kDevice ? "host" : "device") + " buffers; the " +
                            (backend == Backend::kCuda ? "CUDA" : "CPU") + " backend's are in " +
                            (want == dist::MemorySpace::kDevice ? "device" : "host") + " memory");
  ModelSpec const& spec = full.spec();
  TESSERA_TRY(check_pruning(opts.prune, spec));
  auto hw = rank_weights(full, *shard);  // shares the replicated tensors with `full`; copies the slices (EXL3: parts)
  if (!hw) return hw.status();
  TESSERA_TRY(check_exl3_weights(spec, *hw, true));  // the CPU rank model's rules for EXL3 parts
  std::unique_ptr<GpuDsv41Model> m(new GpuDsv41Model());
  m->impl_ = std::make_unique<Impl>();
  Impl& I = *m->impl_;
  I.md = opts.numerics == Numerics::kBf16 ? DType::kBf16 : DType::kF32;
  I.engram = full.engram();
  I.spec = spec;
  dist::Range const held = shard->plan.cfg.ep > 1 ? shard->me().experts : dist::Range{0, spec.n_experts};
  I.first_expert = held.begin;
  I.shard = std::move(shard);
  TESSERA_TRY(I.finish_create(*m, *hw, backend, std::move(opts), held.size()));
  I.info.device += " (rank " + std::to_string(I.shard->rank) + " of " + std::to_string(I.shard->plan.world) + ")";
  return m;
}

Status GpuDsv41Model::Impl::finish_create(GpuDsv41Model& m, Weights const& host, Backend backend, ModelOptions o,
                                          int64_t held_experts) {
  main_inv_freq = ref::rope_inv_freq_default(spec.rope_theta, spec.rope_dim);
  compress_inv_freq = spec.yarn ? ref::rope_inv_freq_yarn(spec.compress_rope_theta, spec.rope_dim, spec.yarn_factor,
                                                           spec.yarn_beta_fast, spec.yarn_beta_slow,
                                                           spec.yarn_original_max_pos)
                                : ref::rope_inv_freq_default(spec.compress_rope_theta, spec.rope_dim);
  mem.backend = backend;
  TESSERA_TRY(mem.open(&ctx.device));
  ctx.backend = backend;
  ctx.stream = mem.stream;
  ctx.pool = o.pool;
  pool = std::make_shared<gpu::DevicePool>(mem);
  TESSERA_TRY(upload(host, held_experts));
  info.name = spec.name;
  info.model_type = "deepseek_v41";
  info.vocab_size = spec.vocab_size;
  info.max_context = spec.max_position_embeddings;
  info.eos_token_ids = spec.eos_token_ids;
  info.device = backend == Backend::kCuda ? "cuda" : "cpu";
  info.dtype = md == DType::kBf16 ? "bf16" : "fp32";
  ExpertPruning prune = std::move(o.prune);
  using Graphs = ModelOptions::CudaGraphs;
  Graphs mode = o.cuda_graphs;
  if (char const* e = std::getenv("TESSERA_CUDA_GRAPHS"); e && std::string(e) == "0") mode = Graphs::kOff;
  else if (e && std::string(e) == "1" && mode == Graphs::kOff) mode = Graphs::kAuto;
  opts = std::move(o);
  TESSERA_TRY(m.set_pruning(std::move(prune)));
  if (mode != Graphs::kOff)  // kAuto takes the mode where the model can record; kOn insists
    if (Status st = m.set_cuda_graphs(true); !st.ok() && (mode == Graphs::kOn || st.code() != StatusCode::kNotSupported))
      return st;
  return {};
}

Status GpuDsv41Model::set_pruning(ExpertPruning p) {
  Impl& I = *impl_;
  TESSERA_TRY(check_pruning(p, I.spec));
  std::vector<void*> masks;
  Status st;
  for (auto const& row : p.expert_mask) {
    auto d = I.mem.alloc(row.size());
    if (!d) { st = d.status(); break; }
    masks.push_back(*d);
    if (st = I.mem.copy(*d, row.data(), row.size(), Copy::kHostToDev); !st.ok()) break;
  }
  if (st.ok()) st = I.mem.sync();  // the uploads are done, and no forward still reads the old masks
  if (!st.ok()) {
    for (void* d : masks) I.mem.free(d);
    return st;
  }
  I.free_expert_masks();
  I.expert_masks = std::move(masks);
  I.opts.prune = std::move(p);
  return {};
}

ExpertPruning const& GpuDsv41Model::pruning() const { return impl_->opts.prune; }

void GpuDsv41Model::set_route_observer(RouteObserver observer) { impl_->route_observer = std::move(observer); }

Status GpuDsv41Model::set_cuda_graphs(bool on) {
  Impl& I = *impl_;
  if (!on) {
    TESSERA_TRY(I.mem.sync());  // no launched graph still runs when its executable goes
    I.graphs.reset();
    return {};
  }
  if (I.mem.backend != Backend::kCuda) return not_supported("CUDA graphs: the model runs on the CPU op backends");
  if (I.shard) return not_supported("CUDA graphs: a rank model's collectives run between the recorded segments");
  if (!I.graphs) I.graphs = std::make_unique<gpu::GraphCapture>();
  return {};
}

bool GpuDsv41Model::cuda_graphs() const { return impl_->graphs != nullptr; }

GpuDsv41Model::GraphCounts GpuDsv41Model::graph_counts() const {
  if (!impl_->graphs) return {};
  auto const& c = impl_->graphs->counts();
  return {c.launches, c.updates, c.instantiations};
}

GpuDsv41Model::~GpuDsv41Model() = default;

ModelInfo const& GpuDsv41Model::info() const { return impl_->info; }

std::unique_ptr<SequenceState> GpuDsv41Model::new_sequence() {
  auto st = std::make_unique<GpuDsv41State>();
  st->pool_ = impl_->pool;
  st->layers_.resize(static_cast<size_t>(impl_->spec.num_layers));
  return st;
}

Status GpuDsv41Model::forward(std::span<SequenceStep> batch) {
  for (auto const& step : batch) {
    if (!dynamic_cast<GpuDsv41State*>(step.state)) return invalid_argument("forward: a step has no DeepSeek-V4.1 GPU state");
    if (step.num_logit_rows < 0 || step.num_logit_rows > static_cast<int64_t>(step.tokens.size()))
      return invalid_argument("forward: num_logit_rows must be in [0, tokens.size()]");
    if (step.num_logit_rows > 0 && !step.logits) return invalid_argument("forward: logits buffer missing");
    for (int32_t t : step.tokens)
      if (t < 0 || t >= impl_->spec.vocab_size)
        return invalid_argument("forward: token id " + std::to_string(t) + " outside the vocabulary");
  }
  // Before any step runs: a batch refused for its length advances no state.
  TESSERA_TRY(check_batch_positions(batch, impl_->spec.max_position_embeddings));
  // Passes: maximal runs of consecutive steps with distinct states and at most kMaxPassRows rows (one step
  // with more runs alone). A batch of distinct states within the bound is one pass: one forward over the
  // layers, and a failure leaves every state as it was; a later pass runs after the earlier ones committed.
  std::vector<SequenceStep> pass;
  int64_t rows = 0;
  for (auto const& step : batch) {
    int64_t const S = static_cast<int64_t>(step.tokens.size());
    if (S == 0) continue;
    bool const repeat = std::any_of(pass.begin(), pass.end(), [&](SequenceStep const& p) { return p.state == step.state; });
    if (!pass.empty() && (repeat || rows + S > kMaxPassRows)) {
      TESSERA_TRY(impl_->forward_pass(pass));
      pass.clear();
      rows = 0;
    }
    pass.push_back(step);
    rows += S;
  }
  if (!pass.empty()) TESSERA_TRY(impl_->forward_pass(pass));
  return {};
}

Result<std::unique_ptr<SequenceState>> GpuDsv41Model::clone(SequenceState const& state) {
  auto const* s = dynamic_cast<GpuDsv41State const*>(&state);
  if (!s) return invalid_argument("clone: the state was not created by a DeepSeek-V4.1 GPU model");
  auto out = std::make_unique<GpuDsv41State>();
  out->pool_ = impl_->pool;
  out->length_ = s->length_;
  out->history_ = s->history_;
  out->ties_ = s->ties_;
  out->boundaries_ = s->boundaries_;
  out->layers_.resize(s->layers_.size());
  gpu::Mem const& mem = impl_->mem;
  for (size_t l = 0; l < s->layers_.size(); ++l) {
    gpu::GpuLayerState const& a = s->layers_[l];
    gpu::GpuLayerState& b = out->layers_[l];
    b.n_window = a.n_window;
    b.n_raw = a.n_raw;
    b.entries = a.entries;
    TESSERA_TRY(b.ckv.assign(*impl_->pool, mem, a.ckv, a.entries));
    TESSERA_TRY(b.index_k.assign(*impl_->pool, mem, a.index_k, a.entries));
    for (auto [src, dst] : {std::pair{&a.window, &b.window}, {&a.raw_kv, &b.raw_kv}, {&a.raw_gate, &b.raw_gate}}) {
      if (!*src) continue;
      auto blk = gpu::DevBlock::make(*impl_->pool, src->capacity());
      if (!blk) return blk.status();
      TESSERA_TRY(mem.copy(blk->get(), src->get(), src->capacity(), Copy::kDevToDev));
      *dst = std::move(*blk);
    }
  }
  TESSERA_TRY(mem.sync());
  return std::unique_ptr<SequenceState>(std::move(out));
}

Status GpuDsv41Model::truncate(SequenceState& state, int64_t length) {
  auto* st = dynamic_cast<GpuDsv41State*>(&state);
  if (!st) return invalid_argument("truncate: the state was not created by a DeepSeek-V4.1 GPU model");
  if (length < 0 || length > st->length_) return invalid_argument("truncate: length outside [0, current length]");
  if (length == st->length_) return {};
  int64_t const back = st->length_ - length;
  if (back > impl_->opts.max_rollback)
    return not_supported("truncate: " + std::to_string(back) + " tokens back exceeds max_rollback " +
                         std::to_string(impl_->opts.max_rollback));
  ModelSpec const& s = impl_->spec;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    gpu::GpuLayerState& ls = st->layers_[static_cast<size_t>(l)];
    // Every buffer holds the sequence's tail: dropping the last `back` positions drops its last rows.
    ls.n_window = std::max<int64_t>(0, ls.n_window - back);
    if (!s.is_kv_source(l)) continue;
    int64_t const r = s.compress_ratios[static_cast<size_t>(l)];
    ls.entries = length / r;
    ls.ckv.shrink(ls.entries);
    ls.index_k.shrink(ls.entries);
    if (r > 1) ls.n_raw = std::max<int64_t>(0, ls.n_raw - back);
  }
  st->history_.resize(static_cast<size_t>(length));
  auto& ev = st->ties_.events;
  for (auto it = ev.begin(); it != ev.end();) {
    if (it->position >= length) {
      (it->site == CutoffTie::Site::kIndexer ? st->ties_.indexer
                                             : it->site == CutoffTie::Site::kRouter ? st->ties_.router : st->ties_.candidate) -= 1;
      it = ev.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(st->boundaries_, [&](QuantBoundary const& b) { return b.position >= length; });
  st->length_ = length;
  return {};
}

size_t GpuDsv41Model::state_bytes_for(int64_t n) const { return state_bytes_for(impl_->spec, impl_->opts, n); }

size_t GpuDsv41Model::state_bytes_for(ModelSpec const& s, ModelOptions const& opts, int64_t n) {
  size_t b = static_cast<size_t>(n) * sizeof(int64_t);
  int64_t const hd = s.head_dim, W = s.sliding_window, R = opts.max_rollback;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    b += static_cast<size_t>((W - 1 + R) * hd * 4);
    if (!s.is_kv_source(l)) continue;
    int64_t const r = s.compress_ratios[static_cast<size_t>(l)], T = n / r;
    // Whole pages of the paged families, the address tables aside.
    auto paged = [&](int64_t row_bytes) {
      return static_cast<size_t>(gpu::PagedRows::page_bytes_for(T, row_bytes, opts.state_page_bytes));
    };
    b += paged(gpu::ckv_entry_bytes(hd));
    if (r > 1) b += static_cast<size_t>(2 * (R + r) * hd * 4);
    if (s.is_index_source(l)) b += paged(gpu::index_key_bytes(s.index_head_dim));
  }
  return b;
}

TieCounts const* GpuDsv41Model::ties(SequenceState const& s) {
  auto const* g = dynamic_cast<GpuDsv41State const*>(&s);
  return g ? &g->ties_ : nullptr;
}
std::vector<QuantBoundary> const* GpuDsv41Model::quant_boundaries(SequenceState const& s) {
  auto const* g = dynamic_cast<GpuDsv41State const*>(&s);
  return g ? &g->boundaries_ : nullptr;
}
void GpuDsv41Model::set_boundary_ulps(int ulps) { impl_->opts.boundary_ulps = ulps; }
size_t GpuDsv41Model::pool_bytes() const { return impl_->pool->bytes_held(); }
size_t GpuDsv41Model::weight_bytes() const { return impl_->w.bytes; }

Result<DType> GpuDsv41Model::projection_dtype(std::string const& key) const {
  gpu::GpuWeights const& w = impl_->w;
  gpu::DevTensor const* t = nullptr;
  if (key == scaled_head_key()) t = &w.lm_head;
  for (size_t l = 0; l < w.layers.size() && !t; ++l) {
    gpu::GpuLayerWeights const& d = w.layers[l];
    for (auto [field, dt] : {std::pair{"wq_a", &d.wq_a}, {"wq_b", &d.wq_b}, {"wkv", &d.wkv}, {"wo_a", &d.wo_a},
                             {"wo_b", &d.wo_b}, {"c_wkv", &d.c_wkv}, {"c_wgate", &d.c_wgate}, {"i_wq_b", &d.i_wq_b},
                             {"i_weights_proj", &d.i_weights_proj}, {"i_wk", &d.i_wk}, {"e_wkv", &d.e_wkv}})
      if (key == scaled_weight_key(static_cast<int64_t>(l), field)) t = dt;
  }
  if (!t || !t->p) return not_found("projection_dtype: no projection weight '" + key + "'");
  return t->dtype;
}

Result<DType> GpuDsv41Model::shared_expert_dtype(int64_t layer) const {
  gpu::GpuWeights const& w = impl_->w;
  if (layer < 0 || layer >= static_cast<int64_t>(w.layers.size()))
    return not_found("shared_expert_dtype: no layer " + std::to_string(layer));
  gpu::GpuExperts const& m = w.layers[static_cast<size_t>(layer)].moe;
  return m.shared_scaled != DType::kF32 ? m.shared_scaled : m.s1.dtype;
}

Result<DType> GpuDsv41Model::routed_experts_dtype(int64_t layer) const {
  gpu::GpuWeights const& w = impl_->w;
  if (layer < 0 || layer >= static_cast<int64_t>(w.layers.size()) || w.layers[static_cast<size_t>(layer)].moe.w1.empty())
    return not_found("routed_experts_dtype: no routed experts in layer " + std::to_string(layer));
  gpu::GpuExperts const& m = w.layers[static_cast<size_t>(layer)].moe;
  return m.routed_scaled != DType::kF32 ? m.routed_scaled : m.w1.front().dtype;
}

}  // namespace tessera::model::dsv41

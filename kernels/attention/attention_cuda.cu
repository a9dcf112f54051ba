// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of the CSA2 attention family (include/tessera/ops/attention.hpp, spec/deepseek-v41.md
/// §2.5.5), the arithmetic of ref/attention_ref.hpp step for step:
///   l_u = →md(→md(q_h·k_u)·scale);  m = max(σ_h, max_u l_u);  e_u = exp(l_u − m);
///   s = Σ_u e_u + exp(σ_h − m);  p_u = →md(e_u / s);  o_h[i] = →md(Σ_u p_u·k_u[i]).
/// fp32: q_h·k_u and Σ_u p_u·k_u are sequential FMA chains, exp is fmath::exp_rn, s is summed in key order with
/// the sink last. bf16: both products in ref::dot_tc's tensor-core blocks (q·k as tc::block_step over 16
/// channels at a time; P·V on the keys' logit-row columns, key_cols, via tc::BlockAcc::step_at, whose buffered
/// block may span two key tiles), exp is the device's expf, s is ref::warp_softmax_sum over key_cols and the
/// sink's column (device::WarpSoftmaxSum).
/// One block of kThreads per (query row, head): thread t computes the logits of keys t, t+kThreads, … of a
/// tile of kTile keys (shared memory), the max is a block reduction (exact: max has no rounding), the sum
/// is one thread walking the tiles in key order, and thread t owns output channels t, t+kThreads, ….
/// Rows with more than kTile keys recompute the logits per pass (the same bits each time), so a row's
/// result never depends on the tile size, the other rows or the launch shape. No atomics.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/attention/attention_tc.cuh"
#include "kernels/common/cuda_util.cuh"
#include "tessera/core/concepts.hpp"
#include "tessera/core/fmath.hpp"
#include "tessera/device/arith.cuh"
#include "tessera/device/op_launch.cuh"
#include "tessera/ops/attention.hpp"

namespace tessera::kernels::attention {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 2048;      // keys held in shared memory at once (8 KiB of logits + 8 KiB of ids)
constexpr int kMaxAcc = 4;       // output channels per thread: head_dim ≤ kThreads·kMaxAcc = 1024

struct AttentionParams {
  float const* q = nullptr;            // [rows, heads·hd], row stride q_stride
  float const* keys = nullptr;         // [num_keys, hd], row stride key_stride
  int64_t const* row_offsets = nullptr;  // [rows + 1] (with row_ends: [rows])
  int64_t const* row_ends = nullptr;     // optional [rows]: row r ends at row_ends[r]
  int32_t const* key_ids = nullptr;    // [nnz]
  float const* sinks = nullptr;        // [heads]
  float* out = nullptr;                // [rows, heads·hd], row stride out_stride
  float* probs = nullptr;              // optional [heads, nnz], row stride probs_stride
  int32_t const* key_cols = nullptr;   // bf16: [nnz] logit-row column of each listed key (null: the listed index)
  int32_t const* sink_cols = nullptr;  // bf16: [rows] the sink's column (null: the row's key count)
  int64_t q_stride = 0, key_stride = 0, out_stride = 0, probs_stride = 0;
  int64_t rows = 0, heads = 0, hd = 0, num_keys = 0, nnz = 0;
  int64_t max_keys = 0;                // AttentionDesc::max_row_keys (0: none)
  float scale = 0.f;
  bool bf16 = false;
  bool vec4 = false;                   // hd, key_stride multiples of 4 and keys 16-byte aligned
};

__device__ __forceinline__ float round_md(float x, bool bf16) { return bf16 ? round_to_bf16(x) : x; }

__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionParams const p) {
  device::pdl_enter();
  extern __shared__ float q_s[];           // [hd]
  __shared__ float l_s[kTile];             // logits, then exps, then probabilities of the current tile
  __shared__ int32_t id_s[kTile];          // key ids of the current tile (−1 = out of range)
  __shared__ int32_t col_s[kTile];         // bf16: their logit-row columns
  __shared__ float red_s[kThreads / 32];
  __shared__ float sum_s;

  int const tid = threadIdx.x;
  int64_t const row = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  float const* qh = p.q + row * p.q_stride + h * p.hd;
  float* oh = p.out + row * p.out_stride + h * p.hd;
  for (int64_t i = tid; i < p.hd; i += kThreads) q_s[i] = round_md(qh[i], p.bf16);  // bf16: q enters as bf16

  int64_t const k0 = p.row_offsets[row], k1 = p.row_ends ? p.row_ends[row] : p.row_offsets[row + 1];
  if (k0 < 0 || k1 < k0 || k1 > p.nnz || (p.max_keys > 0 && k1 - k0 > p.max_keys)) {  // inconsistent: poison the row
    for (int64_t i = tid; i < p.hd; i += kThreads) oh[i] = NAN;
    return;
  }
  int64_t const nk = k1 - k0;
  int64_t const ntiles = (nk + kTile - 1) / kTile;
  float const sink = p.sinks[h];
  __syncthreads();

  // Fills id_s/l_s for keys [t0, t0 + len) of the row: l = →md(→md(q·k)·scale), NaN for a bad id.
  auto logits_tile = [&](int64_t t0, int len) {
    for (int u = tid; u < len; u += kThreads) {
      int32_t id = p.key_ids[k0 + t0 + u];
      float l = NAN;
      if (id >= 0 && id < p.num_keys) {
        float d;
        if (p.bf16) {  // ref::dot_tc: tc::block_step per 16 channels (the key's channels read twice, from L1)
          float const* k = p.keys + id * p.key_stride;
          d = 0.f;
          for (int64_t b0 = 0; b0 < p.hd; b0 += tc::kBlock) {
            int const bl = static_cast<int>(p.hd - b0 < tc::kBlock ? p.hd - b0 : tc::kBlock);
            d = tc::block_step(d, bl, [&](int i) { return q_s[b0 + i]; }, [&](int i) { return round_to_bf16(k[b0 + i]); });
          }
        } else {
          d = device::fma_dot_row(q_s, p.keys + id * p.key_stride, p.hd, p.vec4);
        }
        l = round_md(__fmul_rn(round_md(d, p.bf16), p.scale), p.bf16);
      } else {
        id = -1;
      }
      id_s[u] = id;
      l_s[u] = l;
      if (p.bf16) col_s[u] = p.key_cols ? p.key_cols[k0 + t0 + u] : static_cast<int32_t>(t0 + u);
    }
  };
  auto tile_len = [&](int64_t t) { return static_cast<int>(nk - t * kTile < kTile ? nk - t * kTile : kTile); };

  // Pass 1: m = max(σ_h, max_u l_u) (fmaxf skips NaN exactly like std::max(m, l) in the reference).
  float mx = -INFINITY;
  for (int64_t t = 0; t < ntiles; ++t) {
    if (t > 0) __syncthreads();
    int const len = tile_len(t);
    logits_tile(t * kTile, len);
    for (int u = tid; u < len; u += kThreads) mx = fmaxf(mx, l_s[u]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((tid & 31) == 0) red_s[tid >> 5] = mx;
  __syncthreads();
  mx = sink;
  for (int w = 0; w < kThreads / 32; ++w) mx = fmaxf(mx, red_s[w]);

  // Pass 2: e_u = exp(l_u − m) and s = Σ_u e_u + exp(σ_h − m), one thread in key order (bf16: in the lanes of
  // the keys' columns, the sink in its column last).
  float sum = 0.f;
  device::WarpSoftmaxSum lanes;
  for (int64_t t = 0; t < ntiles; ++t) {
    int const len = tile_len(t);
    if (ntiles > 1) {
      __syncthreads();
      logits_tile(t * kTile, len);
    }
    for (int u = tid; u < len; u += kThreads) l_s[u] = device::exp_md(__fsub_rn(l_s[u], mx), p.bf16);
    __syncthreads();
    if (tid == 0) {
      if (p.bf16)
        for (int u = 0; u < len; ++u) lanes.add(col_s[u], l_s[u]);
      else
        for (int u = 0; u < len; ++u) sum = __fadd_rn(sum, l_s[u]);
    }
  }
  if (tid == 0) {
    float const es = device::exp_md(__fsub_rn(sink, mx), p.bf16);
    if (p.bf16) {
      lanes.add(p.sink_cols ? p.sink_cols[row] : nk, es);
      sum_s = lanes.value();
    } else {
      sum_s = __fadd_rn(sum, es);
    }
  }
  __syncthreads();
  sum = sum_s;

  // Pass 3: p_u = →md(e_u / s); o[i] = →md(Σ_u p_u·k_u[i]) in key order (bf16: tensor-core blocks of columns).
  float acc[kMaxAcc];
  tc::BlockAcc tc_acc[kMaxAcc];
  for (int a = 0; a < kMaxAcc; ++a) acc[a] = 0.f;
  for (int64_t t = 0; t < ntiles; ++t) {
    int const len = tile_len(t);
    if (ntiles > 1) {
      __syncthreads();
      logits_tile(t * kTile, len);
      for (int u = tid; u < len; u += kThreads) l_s[u] = device::exp_md(__fsub_rn(l_s[u], mx), p.bf16);
    }
    for (int u = tid; u < len; u += kThreads) {
      float const pu = round_md(__fdiv_rn(l_s[u], sum), p.bf16);
      l_s[u] = pu;
      if (p.probs) p.probs[h * p.probs_stride + k0 + t * kTile + u] = pu;
    }
    __syncthreads();
    for (int a = 0; a < kMaxAcc; ++a) {
      int64_t const i = tid + static_cast<int64_t>(a) * kThreads;
      if (i >= p.hd) break;
      if (p.bf16) {
        for (int u = 0; u < len; ++u) {
          int32_t const id = id_s[u];
          tc_acc[a].step_at(col_s[u], l_s[u], id >= 0 ? round_to_bf16(p.keys[id * p.key_stride + i]) : NAN);
        }
        continue;
      }
      float s = acc[a];
      for (int u = 0; u < len; ++u) {
        int32_t const id = id_s[u];
        float const kv = id >= 0 ? p.keys[id * p.key_stride + i] : NAN;
        s = device::fma_step(s, l_s[u], kv);
      }
      acc[a] = s;
    }
  }
  for (int a = 0; a < kMaxAcc; ++a) {
    int64_t const i = tid + static_cast<int64_t>(a) * kThreads;
    if (i < p.hd) oh[i] = p.bf16 ? round_to_bf16(tc_acc[a].value()) : acc[a];
  }
}

}  // namespace

}  // namespace tessera::kernels::attention

namespace tessera::ops {

static_assert(BackendOp<Attention<Backend::kCuda>, AttentionDesc, AttentionArgs>);

Status Attention<Backend::kCuda>::check(AttentionDesc const& d, AttentionArgs const& a) {
  TESSERA_TRY(check_md(d.md));
  TESSERA_CHECK(d.rows >= 0 && d.heads >= 1 && d.head_dim >= 1 && d.num_keys >= 0, "attention: bad sizes in desc");
  TESSERA_CHECK(d.max_row_keys >= 0, "attention max_row_keys must be non-negative");
  TESSERA_CHECK(d.head_dim <= static_cast<int64_t>(kernels::attention::kThreads) * kernels::attention::kMaxAcc,
                "attention (CUDA): head_dim above 1024 is not compiled");
  TESSERA_TRY(check_shape(a.q, {d.rows, d.heads * d.head_dim}, "attention q"));
  TESSERA_TRY(check_shape(a.keys, {d.num_keys, d.head_dim}, "attention keys"));
  bool const ends = a.row_ends.data != nullptr;
  TESSERA_TRY(check_shape(a.row_offsets, {ends ? d.rows : d.rows + 1}, "attention row_offsets"));
  if (ends) {
    TESSERA_TRY(check_shape(a.row_ends, {d.rows}, "attention row_ends"));
    TESSERA_TRY(device::check_on_device(a.row_ends, "attention row_ends"));
  }
  TESSERA_TRY(check_shape(a.sinks, {d.heads}, "attention sinks"));
  TESSERA_TRY(check_shape(a.out, {d.rows, d.heads * d.head_dim}, "attention out"));
  TESSERA_TRY(check_shape(a.key_ids, {-1}, "attention key_ids"));
  int64_t const nnz = a.key_ids.shape[0];
  if (a.probs.data) TESSERA_TRY(check_shape(a.probs, {d.heads, nnz}, "attention probs"));
  TESSERA_CHECK(!a.key_cols.data == !a.sink_cols.data, "attention key_cols and sink_cols come together");
  if (a.key_cols.data) {
    TESSERA_TRY(check_shape(a.key_cols, {nnz}, "attention key_cols"));
    TESSERA_TRY(check_shape(a.sink_cols, {d.rows}, "attention sink_cols"));
    TESSERA_TRY(device::check_on_device(a.key_cols, "attention key_cols"));
    TESSERA_TRY(device::check_on_device(a.sink_cols, "attention sink_cols"));
  }
  TESSERA_TRY(device::check_on_device(a.q, "attention q"));
  TESSERA_TRY(device::check_on_device(a.keys, "attention keys"));
  TESSERA_TRY(device::check_on_device(a.row_offsets, "attention row_offsets"));
  TESSERA_TRY(device::check_on_device(a.key_ids, "attention key_ids"));
  TESSERA_TRY(device::check_on_device(a.sinks, "attention sinks"));
  TESSERA_TRY(device::check_on_device(a.out, "attention out"));
  return device::check_on_device(a.probs, "attention probs");
}

Status Attention<Backend::kCuda>::validate(AttentionDesc const& d, AttentionArgs const& a) {
  TESSERA_TRY(check(d, a));
  bool const ends = a.row_ends.data != nullptr;
  std::vector<int64_t> off(static_cast<size_t>(ends ? d.rows : d.rows + 1)), end(static_cast<size_t>(d.rows));
  std::vector<int32_t> ids(static_cast<size_t>(a.key_ids.shape[0]));
  if (!off.empty()) TESSERA_TRY(cuda_memcpy(off.data(), a.row_offsets.data, off.size() * sizeof(int64_t), false, true));
  if (ends && !end.empty()) TESSERA_TRY(cuda_memcpy(end.data(), a.row_ends.data, end.size() * sizeof(int64_t), false, true));
  if (!ends) {
    TESSERA_CHECK(off[0] == 0, "attention row_offsets must start at 0");
    TESSERA_CHECK(off.back() == static_cast<int64_t>(ids.size()), "attention row_offsets must end at key_ids length");
    for (int64_t r = 0; r < d.rows; ++r) end[static_cast<size_t>(r)] = off[static_cast<size_t>(r) + 1];
  }
  if (!ids.empty()) TESSERA_TRY(cuda_memcpy(ids.data(), a.key_ids.data, ids.size() * sizeof(int32_t), false, true));
  for (int64_t r = 0; r < d.rows; ++r) {
    int64_t const b = off[static_cast<size_t>(r)], e = end[static_cast<size_t>(r)];
    TESSERA_CHECK(0 <= b && b <= e && e <= static_cast<int64_t>(ids.size()), "attention row ranges must lie in key_ids in order");
    for (int64_t i = b; i < e; ++i)
      TESSERA_CHECK(ids[static_cast<size_t>(i)] >= 0 && ids[static_cast<size_t>(i)] < d.num_keys, "attention key id out of range");
    TESSERA_CHECK(d.max_row_keys == 0 || e - b <= d.max_row_keys,
                  "attention row " + std::to_string(r) + " lists more keys than max_row_keys");
  }
  if (a.key_cols.data) {
    std::vector<int32_t> cols(ids.size()), sink(static_cast<size_t>(d.rows));
    if (!cols.empty())
      TESSERA_TRY(cuda_memcpy(cols.data(), a.key_cols.data, cols.size() * sizeof(int32_t), false, true));
    if (!sink.empty()) TESSERA_TRY(cuda_memcpy(sink.data(), a.sink_cols.data, sink.size() * sizeof(int32_t), false, true));
    for (int64_t r = 0; r < d.rows; ++r) {
      int64_t last = -1;
      for (int64_t i = off[static_cast<size_t>(r)]; i < end[static_cast<size_t>(r)]; ++i) {
        TESSERA_CHECK(cols[static_cast<size_t>(i)] > last, "attention key_cols must increase within a row");
        last = cols[static_cast<size_t>(i)];
      }
      TESSERA_CHECK(sink[static_cast<size_t>(r)] > last, "attention sink column must follow the row's key columns");
    }
  }
  return {};
}

namespace {

/// The tensor-core kernel's variant: m-tiles of 16 heads per block and where it reads the keys.
struct TcVariant {
  int mtiles = 1;
  bool bf16_keys = false;
  int csplit = 1;  // channel split: blocks per (row, head tile), each with HD / csplit channels of P·V (HD 512, MT 1)
};

/// The device's SM count (ctx.device, else the current device's), 0 when unknown.
int device_sms(ExecContext const& ctx) {
  int sms = ctx.device.num_sms;
  if (sms <= 0) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 0;
  }
  return sms;
}

/// The channel split of a one-m-tile launch at HD 512: the largest of 8, 4, 2 that keeps rows · head tiles · split
/// within two blocks per SM, else 1. A decode row of 64 heads has 4 (row, head tile) blocks, each with one chain
/// per head and 8 channels per lane of P·V; split 8 runs it on 32 blocks.
int attention_tc_auto_csplit(AttentionDesc const& d, ExecContext const& ctx) {
  namespace k = kernels::attention_tc;
  int const sms = device_sms(ctx);
  if (sms <= 0) return 1;
  int64_t const blocks = d.rows * ((d.heads + k::kHeadTile - 1) / k::kHeadTile);
  for (int c = 8; c >= 2; c /= 2)
    if (blocks * c <= 2 * static_cast<int64_t>(sms)) return c;
  return 1;
}

/// 2 m-tiles when the launch still has two blocks per SM with 32 heads a block (prefill, wide batches: each block
/// reads its keys once per 32 heads instead of 16) and the shared memory fits, else 1.
template <int HD>
int attention_tc_auto_mtiles(AttentionDesc const& d, ExecContext const& ctx) {
  namespace k = kernels::attention_tc;
  if (d.heads <= k::kHeadTile) return 1;
  int const sms = device_sms(ctx);
  if (sms <= 0) return 1;
  int64_t const blocks2 = d.rows * ((d.heads + 2 * k::kHeadTile - 1) / (2 * k::kHeadTile));
  bool const fits = static_cast<size_t>(k::Smem<HD, 2>(static_cast<int>(d.max_row_keys)).total) <= device::smem_optin_bytes(ctx);
  return fits && blocks2 >= 2 * static_cast<int64_t>(sms) ? 2 : 1;
}

/// ctx.impl_override 1 … 4 forces a variant (tests): 1 / 2 m-tiles with fp32 key reads, 3 / 4 with bf16 keys; 5 … 8
/// one m-tile with the channel split 8 / 2 (fp32 keys) and 8 / 4 (bf16 keys) at HD 512 (no split at other HD).
/// Otherwise TESSERA_ATTN_MTILES=1|2, TESSERA_ATTN_BF16_KEYS=0|1 and TESSERA_ATTN_CSPLIT=1|2|4|8 (benchmarks), else
/// the channel split of attention_tc_auto_csplit with one m-tile, and bf16 keys when the rows list
/// at least as many keys as the pool holds (the conversion reads the pool once, 6 bytes a value; each listing then
/// reads 2 bytes a value instead of 4, twice per block) and, with bf16 keys only, attention_tc_auto_mtiles: the
/// 2-m-tile fp32-key variant holds two m-tiles of fp32 key fragments (a 4-byte spill at HD 512) and
/// ran an 8K prefill slower than the one-m-tile fp32-key kernel before it (H100: 79.7 against 74.5 ms a layer;
/// bf16 keys with 2 m-tiles 62.2, with 1 m-tile 63.2).
/// The values never depend on the variant.
template <int HD>
TcVariant attention_tc_variant(AttentionDesc const& d, ExecContext const& ctx) {
  static int const forced_mtiles = [] {
    char const* e = std::getenv("TESSERA_ATTN_MTILES");
    return e && (std::string(e) == "1" || std::string(e) == "2") ? std::atoi(e) : 0;
  }();
  static int const forced_bf16 = [] {
    char const* e = std::getenv("TESSERA_ATTN_BF16_KEYS");
    return e && (std::string(e) == "0" || std::string(e) == "1") ? std::atoi(e) : -1;
  }();
  static int const forced_csplit = [] {
    char const* e = std::getenv("TESSERA_ATTN_CSPLIT");
    int const c = e ? std::atoi(e) : 0;
    return c == 1 || c == 2 || c == 4 || c == 8 ? c : 0;
  }();
  int const o = ctx.impl_override;
  if (o >= 1 && o <= 4) return {(o - 1) % 2 + 1, o >= 3, 1};
  if (o >= 5 && o <= 8) return {1, o >= 7, HD == 512 ? (o % 2 == 1 ? 8 : o == 6 ? 2 : 4) : 1};
  TcVariant v;
  v.bf16_keys = forced_bf16 >= 0 ? forced_bf16 == 1 : d.rows * d.max_row_keys >= d.num_keys;
  v.mtiles = forced_mtiles ? forced_mtiles : v.bf16_keys ? attention_tc_auto_mtiles<HD>(d, ctx) : 1;
  if (v.mtiles == 1 && HD == 512) v.csplit = forced_csplit ? forced_csplit : attention_tc_auto_csplit(d, ctx);
  return v;
}

/// The tensor-core kernel for head_dim HD, MT m-tiles, the key source and the channel split CS (attention_tc.cuh):
/// CS blocks per (row, MT·16 heads).
template <int HD, int MT, bool kBf16Keys, int CS = 1>
Status run_attention_tc(AttentionDesc const& d, AttentionArgs const& a, ExecContext& ctx) {
  namespace k = kernels::attention_tc;
  k::Params p;
  p.q = a.q.data;
  p.keys = a.keys.data;
  p.row_offsets = a.row_offsets.data;
  p.row_ends = a.row_ends.data;
  p.key_ids = a.key_ids.data;
  p.sinks = a.sinks.data;
  p.out = a.out.data;
  p.probs = a.probs.data;
  p.key_cols = a.key_cols.data;
  p.sink_cols = a.sink_cols.data;
  p.q_stride = d.heads * HD;
  p.key_stride = HD;
  p.out_stride = d.heads * HD;
  p.probs_stride = a.probs.data ? a.probs.stride[0] : 0;
  p.rows = d.rows;
  p.heads = d.heads;
  p.num_keys = d.num_keys;
  p.nnz = a.key_ids.shape[0];
  p.max_keys = static_cast<int>(d.max_row_keys);
  p.scale = d.scale;
  size_t const smem = static_cast<size_t>(k::Smem<HD, MT>(p.max_keys).total);
  TESSERA_TRY(device::allow_dynamic_smem(k::attention_tc_kernel<HD, MT, kBf16Keys, CS>, smem, ctx,
                                         "attention (CUDA, tensor cores)"));
  int64_t const blocks = d.rows * ((d.heads + MT * k::kHeadTile - 1) / (MT * k::kHeadTile)) * CS;
  TESSERA_CHECK(blocks < (int64_t{1} << 31), "attention (CUDA): rows·heads exceeds the grid");
  kernels::Scratch scratch;  // ctx.workspace or a stream-ordered allocation, alive until the kernel has run
  if constexpr (kBf16Keys) {
    int64_t const n = d.num_keys * HD;
    TESSERA_TRY(scratch.acquire(ctx, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(uint16_t)));
    auto* kb = static_cast<uint16_t*>(scratch.ptr);
    if (n > 0) {
      int64_t const grid = std::min<int64_t>((n + 255) / 256, int64_t{4096});
      device::launch_pdl(k::keys_to_bf16_kernel, static_cast<unsigned>(grid), 256, 0, ctx.stream, a.keys.data, n, kb);
      TESSERA_TRY(device::launch_status("attention (CUDA) bf16 keys"));
    }
    p.keys_bf16 = kb;
  }
  device::launch_pdl(k::attention_tc_kernel<HD, MT, kBf16Keys, CS>, static_cast<unsigned>(blocks), k::kThreads, smem,
                     ctx.stream, p);
  return device::launch_status("attention (CUDA) tensor-core kernel");
}

/// One m-tile with the channel split cs ∈ {2, 4, 8}.
template <int HD, bool kBf16Keys>
Status run_attention_tc_split(int cs, AttentionDesc const& d, AttentionArgs const& a, ExecContext& ctx) {
  return cs == 8   ? run_attention_tc<HD, 1, kBf16Keys, 8>(d, a, ctx)
         : cs == 4 ? run_attention_tc<HD, 1, kBf16Keys, 4>(d, a, ctx)
                   : run_attention_tc<HD, 1, kBf16Keys, 2>(d, a, ctx);
}

template <int HD>
Status run_attention_tc(AttentionDesc const& d, AttentionArgs const& a, ExecContext& ctx) {
  TcVariant const v = attention_tc_variant<HD>(d, ctx);
  if constexpr (HD == 512)
    if (v.csplit > 1)
      return v.bf16_keys ? run_attention_tc_split<HD, true>(v.csplit, d, a, ctx)
                         : run_attention_tc_split<HD, false>(v.csplit, d, a, ctx);
  if (v.bf16_keys)
    return v.mtiles == 2 ? run_attention_tc<HD, 2, true>(d, a, ctx) : run_attention_tc<HD, 1, true>(d, a, ctx);
  return v.mtiles == 2 ? run_attention_tc<HD, 2, false>(d, a, ctx) : run_attention_tc<HD, 1, false>(d, a, ctx);
}

}  // namespace

Status Attention<Backend::kCuda>::run(AttentionDesc const& d, AttentionArgs const& a, ExecContext& ctx) {
  namespace k = kernels::attention;
  if (d.rows == 0) return {};
  // bf16 with a row bound the tensor-core kernel holds: mma.sync (bitwise the same values as below).
  if (d.md == DType::kBf16 && d.max_row_keys > 0 && d.max_row_keys <= kernels::attention_tc::kMaxKeys &&
      reinterpret_cast<uintptr_t>(a.keys.data) % 8 == 0) {
    switch (d.head_dim) {
      case 64: return run_attention_tc<64>(d, a, ctx);
      case 128: return run_attention_tc<128>(d, a, ctx);
      case 256: return run_attention_tc<256>(d, a, ctx);
      case 512: return run_attention_tc<512>(d, a, ctx);
      default: break;
    }
  }
  k::AttentionParams p;
  p.q = a.q.data;
  p.keys = a.keys.data;
  p.row_offsets = a.row_offsets.data;
  p.row_ends = a.row_ends.data;
  p.key_ids = a.key_ids.data;
  p.sinks = a.sinks.data;
  p.out = a.out.data;
  p.probs = a.probs.data;
  p.key_cols = a.key_cols.data;
  p.sink_cols = a.sink_cols.data;
  p.q_stride = d.heads * d.head_dim;
  p.key_stride = d.head_dim;
  p.out_stride = d.heads * d.head_dim;
  p.probs_stride = a.probs.data ? a.probs.stride[0] : 0;
  p.rows = d.rows;
  p.heads = d.heads;
  p.hd = d.head_dim;
  p.num_keys = d.num_keys;
  p.nnz = a.key_ids.shape[0];
  p.max_keys = d.max_row_keys;
  p.scale = d.scale;
  p.bf16 = d.md == DType::kBf16;
  p.vec4 = d.head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(a.keys.data) % 16 == 0;
  size_t const smem = static_cast<size_t>(d.head_dim) * sizeof(float);
  TESSERA_TRY(device::allow_dynamic_smem(k::attention_kernel, smem, ctx, "attention (CUDA)"));
  int64_t const blocks = d.rows * d.heads;
  TESSERA_CHECK(blocks < (int64_t{1} << 31), "attention (CUDA): rows·heads exceeds the grid");
  device::launch_pdl(k::attention_kernel, static_cast<unsigned>(blocks), k::kThreads, smem, ctx.stream, p);
  return device::launch_status("attention (CUDA) kernel");
}

}  // namespace tessera::ops

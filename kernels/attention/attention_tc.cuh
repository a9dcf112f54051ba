// SPDX-License-Identifier: Apache-2.0
/// bf16 CSA2 attention on the tensor cores (include/tessera/ops/attention.hpp, ref/attention_ref.hpp): the same
/// values as the CUDA-core kernel of attention_cuda.cu, bit for bit, for head_dim HD ∈ {64, 128, 256, 512} and rows
/// of at most AttentionDesc::max_row_keys ≤ kMaxKeys listed keys.
///
/// One block of kWarps warps per (query row, tile of MT·16 heads): each 16 heads are the M = 16 rows of one
/// mma.sync m16n8k16 (rows past `heads` are zero), and the MT m-tiles share every key fragment a warp loads, so a
/// row's keys are read twice (logits, P·V) per MT·16 heads. MT = 1 gives the most blocks (decode rows); MT = 2
/// halves the key traffic of prefill rows (the released 64 heads: 4 → 2 blocks per row). CS > 1 (channel split,
/// MT = 1, decode: rows · head tiles well below the SM count) gives each (row, head tile) CS blocks; each computes
/// steps 1–2 for the tile whole and step 3 for its HD / CS channels, so a decode row of the released shape (64
/// heads of 512) runs on 32 blocks instead of 4. Each head's chains are the same for every MT and CS, so the bits do
/// not depend on them.
///   1. logits: D[h][u] = Σ_i q[h][i]·k_u[i] as the mma chain over 16-channel blocks i = 0, 16, … (ref::dot_tc's
///      order, which the chain is: linear_tc.cuh), N = 8 keys per tile; l = →bf16(→bf16(D)·scale) into p_s.
///   2. softmax per head (one warp): m = max(σ_h, max_u l_u) (exact in any order); e_u = expf(l_u − m); the
///      denominator as ref::warp_softmax_sum: lane t sums, in listed order, the e_u of the keys whose column
///      ≡ t (mod 32) (lane lists built once per block), the sink's lane adds exp(σ_h − m) last, then the
///      halving tree lane[t] + lane[t + 16], …; p_u = →bf16(e_u / s).
///   3. P·V: the key axis in the logit row's 16-column blocks (tc::BlockAcc::step_at): block j holds the listed
///      keys whose column / 16 is its index; its A operand is p at the keys' positions col % 16 (absent
///      positions +0: zero products take no part), its B operand those keys' rows; one chain per 8 channels,
///      d ← mma(P_j, V_j, d) for the blocks in column order. o = →bf16(d).
/// Operands enter as bf16 (→bf16 of the fp32 inputs, the op's contract). With kBf16Keys the key rows are read from
/// Params::keys_bf16, the same →bf16 of every key value made once per launch (keys_to_bf16_kernel), so a listed key
/// costs half the bytes of its fp32 row; the operands, and so the bits, are the same. A row whose CSR offsets are inconsistent,
/// which lists more than max_row_keys keys, a key id out of range or columns that do not increase gets NaN in
/// its output, as the CUDA-core kernel does for the first two. No atomics; a row's result depends on nothing else.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/linear/linear_tc.cuh"
#include "tessera/core/dtype.hpp"
#include "tessera/device/pdl.cuh"

namespace tessera::kernels::attention_tc {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kHeadTile = 16;   // heads per m-tile: the M of one mma tile
constexpr int kMaxKeys = 1024;  // listed keys per row (p_s holds MT·16 heads × R fp32)
constexpr int kMaxMTiles = 2;   // m-tiles per block (MT ∈ {1, 2})

struct Params {
  float const* q = nullptr;              // [rows, heads·HD], row stride q_stride
  float const* keys = nullptr;           // [num_keys, HD], row stride key_stride (8-byte aligned, even stride)
  uint16_t const* keys_bf16 = nullptr;   // kBf16Keys: [num_keys, HD] →bf16 of keys (bits), row stride key_stride
  int64_t const* row_offsets = nullptr;  // [rows + 1] (with row_ends: [rows])
  int64_t const* row_ends = nullptr;     // optional [rows]: row r ends at row_ends[r]
  int32_t const* key_ids = nullptr;      // [nnz]
  float const* sinks = nullptr;          // [heads]
  float* out = nullptr;                  // [rows, heads·HD], row stride out_stride
  float* probs = nullptr;                // optional [heads, nnz], row stride probs_stride
  int32_t const* key_cols = nullptr;     // [nnz] logit-row column of each listed key (null: the listed index)
  int32_t const* sink_cols = nullptr;    // [rows] the sink's column (null: the row's key count)
  int64_t q_stride = 0, key_stride = 0, out_stride = 0, probs_stride = 0;
  int64_t rows = 0, heads = 0, num_keys = 0, nnz = 0;
  int max_keys = 0;                      // the rows' bound; the shared arrays hold R = round_up(max_keys, 32)
  float scale = 0.f;
};

/// Shared memory, in bytes, for HD, MT m-tiles and a bound of max_keys listed keys per row (HD = 512, MT = 2,
/// 1,024 keys: 203 KB; MT = 1: 122 KB).
template <int HD, int MT>
struct Smem {
  static constexpr int kQld = HD + 8;  // bf16 per q row: (2·HD + 16) mod 128 = 16, conflict-free ldmatrix phases
  int R, q_off, p_off, id_off, col_off, slot_off, perm_off, lane_off, total;
  __host__ __device__ explicit Smem(int max_keys) {
    R = (max_keys + 31) / 32 * 32;
    q_off = 0;
    p_off = q_off + MT * kHeadTile * kQld * 2;       // float [MT·16][R]: logits, exps, probabilities
    id_off = p_off + MT * kHeadTile * R * 4;         // int32 [R]: key ids
    col_off = id_off + R * 4;                        // int32 [R]: columns
    slot_off = col_off + R * 4;                      // int16 [R][16]: block j, position → listed key (−1: none)
    perm_off = slot_off + R * 16 * 2;                // int16 [R]: listed keys grouped by column lane, listed order
    lane_off = perm_off + R * 2;                     // int32 [33] lane list starts, [32] fill, nb, flags
    total = lane_off + (33 + 32 + 4) * 4;
  }
};

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(bf16_bits_from_float(lo)) | (static_cast<uint32_t>(bf16_bits_from_float(hi)) << 16);
}

/// keys_bf16[i] = →bf16(keys[i]) (RNE bits, as pack_bf16x2) for the n values of a contiguous key pool.
__global__ void keys_to_bf16_kernel(float const* keys, int64_t n, uint16_t* out) {
  device::pdl_enter();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = bf16_bits_from_float(keys[i]);
}

template <int HD, int MT, bool kBf16Keys, int CS = 1>
__global__ void __launch_bounds__(kThreads) attention_tc_kernel(Params const p) {
  device::pdl_enter();
  static_assert(HD % (64 * CS) == 0 && HD <= 512, "HD / CS: whole n8 tiles per warp in P·V, 8 accumulators at most");
  static_assert(MT >= 1 && MT <= kMaxMTiles && (CS == 1 || MT == 1));
  constexpr int kBlockHeads = MT * kHeadTile;
  using tc_linear::block_step;
  using tc_linear::ldmatrix_x4;
  using tc_linear::smem_addr;
  constexpr int kQld = Smem<HD, MT>::kQld;
  constexpr int kKb = HD / 16;             // 16-channel blocks of q·k
  constexpr int kNt = HD / 8 / kWarps / CS;  // P·V n8 tiles per warp
  constexpr int kCh = HD / CS;               // channels of this block's P·V and output
  extern __shared__ __align__(16) unsigned char smem[];
  Smem<HD, MT> const L(p.max_keys);
  int const R = L.R;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + L.q_off);
  float* p_s = reinterpret_cast<float*>(smem + L.p_off);
  int32_t* id_s = reinterpret_cast<int32_t*>(smem + L.id_off);
  int32_t* col_s = reinterpret_cast<int32_t*>(smem + L.col_off);
  int16_t* slot_s = reinterpret_cast<int16_t*>(smem + L.slot_off);
  int16_t* perm_s = reinterpret_cast<int16_t*>(smem + L.perm_off);
  int32_t* lane_start = reinterpret_cast<int32_t*>(smem + L.lane_off);  // [33]
  int32_t* lane_fill = lane_start + 33;                                 // [32]
  int32_t* misc = lane_fill + 32;                                       // [0] blocks, [1] bad

  int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int const g = lane >> 2, c2 = (lane & 3) * 2;
  int64_t const tiles = (p.heads + kBlockHeads - 1) / kBlockHeads;
  int const cs = static_cast<int>(blockIdx.x % CS);  // channels [cs·kCh, cs·kCh + kCh)
  int64_t const bx = blockIdx.x / CS;
  int64_t const row = bx / tiles, h0 = (bx % tiles) * kBlockHeads;
  int const hn = static_cast<int>(p.heads - h0 < kBlockHeads ? p.heads - h0 : kBlockHeads);
  int64_t const k0 = p.row_offsets[row], k1 = p.row_ends ? p.row_ends[row] : p.row_offsets[row + 1];
  auto poison = [&] {
    for (int i = tid; i < hn * kCh; i += kThreads) p.out[row * p.out_stride + (h0 + i / kCh) * HD + cs * kCh + i % kCh] = NAN;
  };
  if (k0 < 0 || k1 < k0 || k1 > p.nnz || k1 - k0 > p.max_keys) {
    poison();
    return;
  }
  int const nk = static_cast<int>(k1 - k0);

  // q of the block's heads as bf16 (rows past `heads` +0); the row's ids and columns.
  for (int i = tid; i < kBlockHeads * HD; i += kThreads) {
    int const hl = i / HD, c = i % HD;
    q_s[hl * kQld + c] = hl < hn ? bf16_bits_from_float(p.q[row * p.q_stride + (h0 + hl) * HD + c]) : 0;
  }
  bool bad = false;
  for (int u = tid; u < nk; u += kThreads) {
    int32_t const id = p.key_ids[k0 + u];
    bad = bad || id < 0 || id >= p.num_keys;
    id_s[u] = id;
    col_s[u] = p.key_cols ? p.key_cols[k0 + u] : u;
  }
  if (tid < 32) lane_fill[tid] = 0;
  if (__syncthreads_or(bad)) {
    poison();
    return;
  }

  // Block table (warp 0) and column-lane lists (warp 1). Blocks: key u opens one when u = 0 or its column / 16
  // differs from key u−1's; columns must increase (else the row is poisoned).
  unsigned const full = 0xffffffffu;
  unsigned const lt_mask = (1u << lane) - 1u;
  if (warp == 0) {
    int blocks = 0;
    bool order_bad = false;
    for (int b = 0; b < nk; b += 32) {
      int const u = b + lane;
      bool const in = u < nk;
      int const col = in ? col_s[u] : 0;
      int const prev = in && u > 0 ? col_s[u - 1] : -1;
      order_bad = order_bad || (in && u > 0 && col <= prev);
      unsigned const opens = __ballot_sync(full, in && (u == 0 || (col >> 4) != (prev >> 4)));
      blocks += __popc(opens);
    }
    order_bad = __any_sync(full, order_bad);
    if (lane == 0) misc[0] = blocks, misc[1] = order_bad;
  } else if (warp == 1) {
    for (int b = 0; b < nk; b += 32) {  // counts per lane
      int const u = b + lane;
      int const key = u < nk ? (col_s[u] & 31) : 32 + lane;
      unsigned const same = __match_any_sync(full, key);
      if (u < nk && (same & lt_mask) == 0) lane_fill[key] += __popc(same);
      __syncwarp();
    }
    int const count = lane_fill[lane];
    int start = count;
    for (int o = 1; o < 32; o <<= 1) {
      int const v = __shfl_up_sync(full, start, o);
      if (lane >= o) start += v;
    }
    start -= count;
    lane_start[lane] = start;
    if (lane == 31) lane_start[32] = start + count;
    lane_fill[lane] = 0;
    __syncwarp();
    for (int b = 0; b < nk; b += 32) {  // stable placement: listed order within each lane
      int const u = b + lane;
      int const key = u < nk ? (col_s[u] & 31) : 32 + lane;
      unsigned const same = __match_any_sync(full, key);
      if (u < nk) perm_s[lane_start[key] + lane_fill[key] + __popc(same & lt_mask)] = static_cast<int16_t>(u);
      __syncwarp();
      if (u < nk && (same & lt_mask) == 0) lane_fill[key] += __popc(same);
      __syncwarp();
    }
  }
  __syncthreads();
  if (misc[1]) {
    poison();
    return;
  }
  int const nb = misc[0];
  for (int i = tid; i < nb * 16; i += kThreads) slot_s[i] = -1;
  __syncthreads();
  if (warp == 0) {
    int j = -1;
    for (int b = 0; b < nk; b += 32) {
      int const u = b + lane;
      bool const in = u < nk;
      int const col = in ? col_s[u] : 0;
      bool const open = in && (u == 0 || (col >> 4) != (col_s[u - 1] >> 4));
      unsigned const opens = __ballot_sync(full, open);
      int const mine = j + __popc(opens & (lt_mask | (1u << lane)));
      if (in) slot_s[mine * 16 + (col & 15)] = static_cast<int16_t>(u);
      j += __popc(opens);
    }
  }

  // 1. Logits, 8 keys per warp tile; the key fragments feed the MT m-tiles' chains in turn.
  int const ntiles = (nk + 7) / 8;
  for (int t = warp; t < ntiles; t += kWarps) {
    int const un = t * 8 + g;
    int64_t const kro = un < nk ? static_cast<int64_t>(id_s[un]) * p.key_stride : -1;  // the key row's offset
    float d[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) d[mt][0] = d[mt][1] = d[mt][2] = d[mt][3] = 0.f;
    constexpr int kU = kKb < 8 ? kKb : 8;
#pragma unroll
    for (int kb0 = 0; kb0 < kKb; kb0 += kU) {
      uint32_t b[kU][2];
#pragma unroll
      for (int i = 0; i < kU; ++i) {
        if constexpr (kBf16Keys) {
          uint16_t const* kr = p.keys_bf16 + (kro >= 0 ? kro : 0);
          b[i][0] = kro >= 0 ? __ldg(reinterpret_cast<uint32_t const*>(kr + (kb0 + i) * 16 + c2)) : 0u;
          b[i][1] = kro >= 0 ? __ldg(reinterpret_cast<uint32_t const*>(kr + (kb0 + i) * 16 + 8 + c2)) : 0u;
        } else {
          float const* kr = p.keys + (kro >= 0 ? kro : 0);
          float2 lo = make_float2(0.f, 0.f), hi = lo;
          if (kro >= 0) {
            lo = __ldg(reinterpret_cast<float2 const*>(kr + (kb0 + i) * 16 + c2));
            hi = __ldg(reinterpret_cast<float2 const*>(kr + (kb0 + i) * 16 + 8 + c2));
          }
          b[i][0] = pack_bf16x2(lo.x, lo.y);
          b[i][1] = pack_bf16x2(hi.x, hi.y);
        }
      }
#pragma unroll
      for (int i = 0; i < kU; ++i)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t a[4];
          ldmatrix_x4(a, smem_addr(q_s + (mt * kHeadTile + (lane & 15)) * kQld + (kb0 + i) * 16 + (lane >> 4) * 8));
          block_step<ops::TcMma::kK16>(d[mt], a, b[i][0], b[i][1]);
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int const u = t * 8 + c2 + (i & 1);
        if (u < nk)
          p_s[(mt * kHeadTile + g + (i >> 1) * 8) * R + u] = round_to_bf16(__fmul_rn(round_to_bf16(d[mt][i]), p.scale));
      }
  }
  __syncthreads();

  // 2. Softmax per head, one warp each.
  int64_t const sink_col = p.sink_cols ? p.sink_cols[row] : nk;
  for (int hl = warp; hl < kBlockHeads; hl += kWarps) {
    float* ph = p_s + hl * R;
    if (hl >= hn) {  // padding rows of the tile: zero probabilities
      for (int u = lane; u < nk; u += 32) ph[u] = 0.f;
      continue;
    }
    int64_t const h = h0 + hl;
    float const sink = p.sinks[h];
    float mx = -INFINITY;
    for (int u = lane; u < nk; u += 32) mx = fmaxf(mx, ph[u]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(full, mx, o));
    mx = fmaxf(sink, mx);
    for (int u = lane; u < nk; u += 32) ph[u] = expf(__fsub_rn(ph[u], mx));
    __syncwarp();
    float s = 0.f;
    for (int i = lane_start[lane]; i < lane_start[lane + 1]; ++i) s = __fadd_rn(s, ph[perm_s[i]]);
    if ((sink_col & 31) == lane) s = __fadd_rn(s, expf(__fsub_rn(sink, mx)));
    for (int o = 16; o > 0; o >>= 1) {
      float const v = __shfl_down_sync(full, s, o);
      if (lane < o) s = __fadd_rn(s, v);
    }
    s = __shfl_sync(full, s, 0);
    for (int u = lane; u < nk; u += 32) {
      float const pu = round_to_bf16(__fdiv_rn(ph[u], s));
      ph[u] = pu;
      if (p.probs && cs == 0) p.probs[h * p.probs_stride + k0 + u] = pu;
    }
  }
  __syncthreads();

  // 3. P·V over the column blocks in order; n8 tiles kNt·w + i of the block's kCh channels per warp (a warp's channels are
  // contiguous: its loads of one key row fill whole 32-byte sectors), for each m-tile. The
  // next block's operands are loaded before the current block's mma chain steps; a block's value fragments (bf16
  // pairs, as the mma takes them) feed the MT m-tiles' chains.
  float acc[MT][kNt][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < kNt; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
  auto load_block = [&](int j, uint32_t (&a)[MT][4], uint32_t (&v)[kNt][2]) {
    int16_t const* sl = slot_s + j * 16;
    int const us[4] = {sl[c2], sl[c2 + 1], sl[c2 + 8], sl[c2 + 9]};
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float pv[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) pv[r][e] = us[e] >= 0 ? p_s[(mt * kHeadTile + g + 8 * r) * R + us[e]] : 0.f;
      a[mt][0] = pack_bf16x2(pv[0][0], pv[0][1]);
      a[mt][1] = pack_bf16x2(pv[1][0], pv[1][1]);
      a[mt][2] = pack_bf16x2(pv[0][2], pv[0][3]);
      a[mt][3] = pack_bf16x2(pv[1][2], pv[1][3]);
    }
    int64_t kro[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) kro[e] = us[e] >= 0 ? static_cast<int64_t>(id_s[us[e]]) * p.key_stride : -1;
#pragma unroll
    for (int i = 0; i < kNt; ++i) {
      int const ch = cs * kCh + (warp * kNt + i) * 8 + g;
      if constexpr (kBf16Keys) {
        uint32_t x[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = kro[e] >= 0 ? __ldg(p.keys_bf16 + kro[e] + ch) : 0u;
        v[i][0] = x[0] | (x[1] << 16);
        v[i][1] = x[2] | (x[3] << 16);
      } else {
        float x[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = kro[e] >= 0 ? __ldg(p.keys + kro[e] + ch) : 0.f;
        v[i][0] = pack_bf16x2(x[0], x[1]);
        v[i][1] = pack_bf16x2(x[2], x[3]);
      }
    }
  };
  auto mma_block = [&](uint32_t const (&a)[MT][4], uint32_t const (&v)[kNt][2]) {
#pragma unroll
    for (int i = 0; i < kNt; ++i)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) block_step<ops::TcMma::kK16>(acc[mt][i], a[mt], v[i][0], v[i][1]);
  };
  if (nb > 0) {  // two register sets, named (not indexed) so they stay in registers
    uint32_t a0[MT][4], a1[MT][4];
    uint32_t v0[kNt][2], v1[kNt][2];
    load_block(0, a0, v0);
    for (int j = 0; j < nb; j += 2) {
      if (j + 1 < nb) load_block(j + 1, a1, v1);
      mma_block(a0, v0);
      if (j + 1 < nb) {
        if (j + 2 < nb) load_block(j + 2, a0, v0);
        mma_block(a1, v1);
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < kNt; ++i) {
      int const ch = cs * kCh + (warp * kNt + i) * 8 + c2;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        int const hl = mt * kHeadTile + g + 8 * r;
        if (hl >= hn) continue;
        float* o = p.out + row * p.out_stride + (h0 + hl) * HD + ch;
        o[0] = round_to_bf16(acc[mt][i][2 * r]);
        o[1] = round_to_bf16(acc[mt][i][2 * r + 1]);
      }
    }
}

}  // namespace tessera::kernels::attention_tc

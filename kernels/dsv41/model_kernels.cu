// SPDX-License-Identifier: Apache-2.0
/// Glue kernels of the DeepSeek-V4.1 GPU model (models/deepseek_v41/gpu_*.cpp), the parts of the CPU
/// model's forward that are not an op family:
///   embed_streams   X[r, k·D + d] = E[tok_r, d] for every stream k; pre[r] = one-hot(0) (spec §2.1)
///   scale_inplace   x_i ← rn(x_i · s) (the indexer's weights · Hi^(−1/2), §2.5.4)
///   build_key_lists the CSR key lists of the sink attention (§2.5.5; per-row counts, a block scan, then the
///                   ids) over the pool
///                   [old window rows | chunk rows | compressed entries]: per query row at p = pos0 + r,
///                   the old window rows with position > p − W (rows hold positions wpos0 + i), the chunk
///                   rows j ≤ r with pos0 + j > p − W, then the selected compressed entries e < T in
///                   ascending entry order (compact pools: the row's own selection slots and their gather table). Exactly the lists the CPU model builds, in the same order; in bf16
///                   also each key's logit-row column and each row's sink column (key_column / sink_column).
///   key_lists_batched  the same lists for several sequences in one launch, each row at a fixed slot r·row_cap
///                   (one block per row; no scan).
///   copy_rows       dst_i[c] = src_i[c] for a table of row copies (the batched pass's ring commits and
///                   its gather of logit rows): one block per row.
#include <cuda_runtime.h>

#include <cstdint>

#include "models/deepseek_v41/gpu_internal.hpp"
#include "tessera/device/pdl.cuh"

namespace tessera::model::dsv41::gpu {

namespace {

__global__ void embed_streams_kernel(float const* emb, int32_t const* tok, int64_t n, int64_t D, float* X, float* pre) {
  device::pdl_enter();
  int64_t const r = blockIdx.x;
  float const* e = emb + static_cast<int64_t>(tok[r]) * D;
  float* x = X + r * n * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float const v = e[d];
    for (int64_t k = 0; k < n; ++k) x[k * D + d] = v;
  }
  if (threadIdx.x < n) pre[r * n + threadIdx.x] = threadIdx.x == 0 ? 1.f : 0.f;
}

__global__ void scale_kernel(float* x, int64_t count, float s) {
  device::pdl_enter();
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = __fmul_rn(x[i], s);
}

/// Valid selections of row r: ids in [0, T).
__device__ int64_t count_selected(int32_t const* sel, int64_t K, int64_t T) {
  int64_t c = 0;
  for (int64_t i = 0; i < K; ++i) c += (sel[i] >= 0 && sel[i] < T) ? 1 : 0;
  return c;
}

/// One warp per row: counts[r] = the length of row r's key list (window + chunk rows + valid selections).
__global__ void key_counts_kernel(KeyListParams p, int64_t* counts) {
  device::pdl_enter();
  int64_t const r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  int const lane = static_cast<int>(threadIdx.x % 32);
  if (r >= p.rows) return;
  int64_t c = 0;
  if (p.selected) {
    int32_t const* sel = p.selected + r * p.top_k;
    for (int64_t i = lane; i < p.top_k; i += 32) c += (sel[i] >= 0 && sel[i] < p.entries) ? 1 : 0;
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xFFFFFFFFu, c, o);
  }
  if (lane == 0) {
    int64_t i0, j0;
    key_list_ranges(p, r, i0, j0);
    counts[r] = (p.n_old - i0) + (r - j0 + 1) + c;
  }
}

/// One block: offsets[0] = 0, offsets[r+1] = offsets[r] + counts[r], a block-wide scan over chunks of
/// blockDim.x rows (integer sums: exact in any order).
__global__ void __launch_bounds__(1024) key_offsets_kernel(KeyListParams p, int64_t const* counts) {
  device::pdl_enter();
  __shared__ int64_t part[1024];
  __shared__ int64_t carry;
  int const t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  if (t == 0) { carry = 0; p.offsets[0] = 0; }
  __syncthreads();
  for (int64_t base = 0; base < p.rows; base += n) {
    int64_t const r = base + t;
    part[t] = r < p.rows ? counts[r] : 0;
    __syncthreads();
    for (int o = 1; o < n; o <<= 1) {  // Hillis–Steele inclusive scan
      int64_t const v = t >= o ? part[t - o] : 0;
      __syncthreads();
      part[t] += v;
      __syncthreads();
    }
    if (r < p.rows) p.offsets[r + 1] = carry + part[t];
    __syncthreads();
    if (t == n - 1) carry += part[t];
    __syncthreads();
  }
  if (!p.row_begin) return;
  for (int64_t r = t; r < p.rows; r += n) {  // the block's offsets writes are visible after the barriers above
    p.row_begin[r] = p.slot_base + p.offsets[r];
    p.row_end[r] = p.slot_base + p.offsets[r + 1];
  }
}

/// One block per row: window and chunk ids, then the selected entries placed by rank (ascending ids).
__global__ void key_fill_kernel(KeyListParams p) {
  device::pdl_enter();
  int64_t const r = blockIdx.x;
  int64_t i0, j0;
  key_list_ranges(p, r, i0, j0);
  int32_t* out = p.key_ids + p.offsets[r];
  int64_t const nw = p.n_old - i0, nc = r - j0 + 1;
  for (int64_t t = threadIdx.x; t < nw; t += blockDim.x) out[t] = static_cast<int32_t>(p.id_base + i0 + t);
  for (int64_t t = threadIdx.x; t < nc; t += blockDim.x) out[nw + t] = static_cast<int32_t>(p.id_base + p.n_old + j0 + t);
  if (!p.selected) return;
  int32_t const* sel = p.selected + r * p.top_k;
  int64_t const count = p.gather ? count_selected(sel, p.top_k, p.entries) : 0;
  for (int64_t i = threadIdx.x; i < p.top_k; i += blockDim.x) {
    if (p.gather && i >= count) p.gather[r * p.top_k + i] = -1;  // ranks of valid ids are < count: no overlap
    int32_t const e = sel[i];
    if (e < 0 || e >= p.entries) continue;
    int64_t rank = 0;  // selections are distinct, so the rank among valid ids is the sorted slot
    for (int64_t j = 0; j < p.top_k; ++j) rank += (sel[j] >= 0 && sel[j] < p.entries && sel[j] < e) ? 1 : 0;
    if (p.gather) {
      p.gather[r * p.top_k + rank] = e;
      out[nw + nc + rank] = static_cast<int32_t>(p.id_base + p.n_old + p.rows + r * p.top_k + rank);
    } else {
      out[nw + nc + rank] = static_cast<int32_t>(p.id_base + p.n_old + p.rows + e);
    }
  }
}

/// bf16: the column of every listed key of row r (after key_fill_kernel) and the row's sink column.
__global__ void key_cols_kernel(KeyListParams p) {
  device::pdl_enter();
  int64_t const r = blockIdx.x;
  int64_t const k0 = p.offsets[r], k1 = p.offsets[r + 1];
  for (int64_t i = k0 + threadIdx.x; i < k1; i += blockDim.x) p.key_cols[i] = key_column(p, r, p.key_ids[i] - p.id_base);
  if (threadIdx.x == 0) p.sink_cols[r] = sink_column(p, r);
}

/// build_key_lists_batched: the sequences' KeyListParams by value; block b lists row b − first[i] of sequence i
/// (first[i] ≤ b < first[i + 1]) at its slot r·row_cap: the lengths, ids, gather slots and columns key_counts /
/// key_fill / key_cols give, without the scan.
struct KeyListBatch {
  KeyListParams seq[kKeyListBatch];
  int64_t first[kKeyListBatch + 1];
  int n;
};
static_assert(sizeof(KeyListBatch) <= 4000, "kernel parameters stay under 4 KiB");

__global__ void __launch_bounds__(128) key_lists_batched_kernel(KeyListBatch const b) {
  device::pdl_enter();
  __shared__ int64_t warp_count[4];
  int i = 0;
  while (i + 1 < b.n && static_cast<int64_t>(blockIdx.x) >= b.first[i + 1]) ++i;  // block-uniform
  KeyListParams const& p = b.seq[i];
  int64_t const r = static_cast<int64_t>(blockIdx.x) - b.first[i];
  int const t = static_cast<int>(threadIdx.x), lane = t & 31;
  int64_t i0, j0;
  key_list_ranges(p, r, i0, j0);
  int64_t const nw = p.n_old - i0, nc = r - j0 + 1;
  int32_t* const out = p.key_ids + r * p.row_cap;
  for (int64_t k = t; k < nw; k += blockDim.x) out[k] = static_cast<int32_t>(p.id_base + i0 + k);
  for (int64_t k = t; k < nc; k += blockDim.x) out[nw + k] = static_cast<int32_t>(p.id_base + p.n_old + j0 + k);
  int64_t c = 0;  // valid selections among this thread's (integer sum: exact in any order)
  if (p.selected) {
    int32_t const* sel = p.selected + r * p.top_k;
    for (int64_t k = t; k < p.top_k; k += blockDim.x) c += (sel[k] >= 0 && sel[k] < p.entries) ? 1 : 0;
  }
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xFFFFFFFFu, c, o);
  if (lane == 0) warp_count[t >> 5] = c;
  __syncthreads();
  int64_t const count = warp_count[0] + warp_count[1] + warp_count[2] + warp_count[3];
  int64_t const part0 = p.id_base + p.n_old + p.rows;  // pool row of the compressed part
  if (p.selected) {
    int32_t const* sel = p.selected + r * p.top_k;
    for (int64_t k = t; k < p.top_k; k += blockDim.x) {
      int64_t const u = r * p.top_k + k;
      if (p.gather && p.unpack_src) p.unpack_dst[u] = static_cast<int32_t>(part0 + u);
      if (p.gather && k >= count) {  // ranks of valid ids are < count
        p.gather[u] = -1;
        if (p.unpack_src) p.unpack_src[u] = -1;
      }
      int32_t const e = sel[k];
      if (e < 0 || e >= p.entries) continue;
      int64_t rank = 0;  // selections are distinct: the rank among valid ids is the sorted slot
      for (int64_t j = 0; j < p.top_k; ++j) rank += (sel[j] >= 0 && sel[j] < p.entries && sel[j] < e) ? 1 : 0;
      if (p.gather) {
        p.gather[r * p.top_k + rank] = e;
        if (p.unpack_src) p.unpack_src[r * p.top_k + rank] = static_cast<int32_t>(p.unpack_base + e);
        out[nw + nc + rank] = static_cast<int32_t>(part0 + r * p.top_k + rank);
      } else {
        out[nw + nc + rank] = static_cast<int32_t>(part0 + e);
      }
    }
  }
  if (p.unpack_src && !p.gather && r == 0)
    for (int64_t e = t; e < p.entries; e += blockDim.x) {
      p.unpack_src[e] = static_cast<int32_t>(p.unpack_base + e);
      p.unpack_dst[e] = static_cast<int32_t>(part0 + e);
    }
  int64_t const len = nw + nc + count;
  if (t == 0) {
    p.row_begin[r] = p.slot_base + r * p.row_cap;
    p.row_end[r] = p.slot_base + r * p.row_cap + len;
  }
  if (!p.key_cols) return;
  __syncthreads();  // the block's ids and gather slots are written (global memory, visible within the block)
  for (int64_t k = t; k < len; k += blockDim.x) p.key_cols[r * p.row_cap + k] = key_column(p, r, out[k] - p.id_base);
  if (t == 0) p.sink_cols[r] = sink_column(p, r);
}

__global__ void copy_rows_kernel(RowCopy const* table, int64_t cols) {
  device::pdl_enter();
  RowCopy const c = table[blockIdx.x];
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) c.dst[i] = c.src[i];
}

struct WindowGatherBatch {
  WindowGather seq[kWindowGatherBatch];
  int64_t first[kWindowGatherBatch + 1];  // pool rows before sequence i
  int n;
  int64_t cols;
};
static_assert(sizeof(WindowGatherBatch) <= 4000, "kernel parameters stay under 4 KiB");

/// Block b: pool row b of the batch (sequence i, row j): a ring row or a chunk row, copied as is.
__global__ void __launch_bounds__(128) window_gather_kernel(WindowGatherBatch const b) {
  device::pdl_enter();
  int i = 0;
  while (i + 1 < b.n && static_cast<int64_t>(blockIdx.x) >= b.first[i + 1]) ++i;  // block-uniform
  WindowGather const& g = b.seq[i];
  int64_t const j = static_cast<int64_t>(blockIdx.x) - b.first[i];
  float const* src = j < g.n_old ? g.ring + ((g.p0 + j) % g.cap) * b.cols : g.chunk + (j - g.n_old) * b.cols;
  float* dst = g.dst + j * b.cols;
  if (b.cols % 4 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    for (int64_t k = threadIdx.x; k < b.cols / 4; k += blockDim.x)
      reinterpret_cast<float4*>(dst)[k] = reinterpret_cast<float4 const*>(src)[k];
  } else {
    for (int64_t k = threadIdx.x; k < b.cols; k += blockDim.x) dst[k] = src[k];
  }
}

Status status_of(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return {};
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

Status launch_embed_streams(CUstream_st* stream, float const* emb, int32_t const* tokens, int64_t rows, int64_t n,
                            int64_t D, float* X, float* pre) {
  if (rows == 0) return {};
  device::launch_pdl(embed_streams_kernel, static_cast<unsigned>(rows), 256, 0, stream, emb, tokens, n, D, X, pre);
  return status_of(cudaGetLastError(), "embed_streams");
}

Status launch_scale_inplace(CUstream_st* stream, float* x, int64_t count, float s) {
  if (count == 0) return {};
  device::launch_pdl(scale_kernel, static_cast<unsigned>((count + 255) / 256), 256, 0, stream, x, count, s);
  return status_of(cudaGetLastError(), "scale_inplace");
}

Status launch_build_key_lists(CUstream_st* stream, KeyListParams const& p) {
  if (p.rows == 0) return {};
  if (!p.counts) return Status(StatusCode::kInternal, "build_key_lists: no counts scratch");
  device::launch_pdl(key_counts_kernel, static_cast<unsigned>((p.rows + 7) / 8), 256, 0, stream, p, p.counts);
  TESSERA_TRY(status_of(cudaGetLastError(), "key_counts"));
  device::launch_pdl(key_offsets_kernel, 1, 1024, 0, stream, p, p.counts);
  TESSERA_TRY(status_of(cudaGetLastError(), "key_offsets"));
  device::launch_pdl(key_fill_kernel, static_cast<unsigned>(p.rows), 128, 0, stream, p);
  TESSERA_TRY(status_of(cudaGetLastError(), "key_fill"));
  if (!p.key_cols) return {};
  device::launch_pdl(key_cols_kernel, static_cast<unsigned>(p.rows), 128, 0, stream, p);
  return status_of(cudaGetLastError(), "key_cols");
}

Status launch_build_key_lists_batched(CUstream_st* stream, KeyListParams const* seqs, int n) {
  if (n < 1 || n > kKeyListBatch) return Status(StatusCode::kInternal, "build_key_lists_batched: 1 to 16 sequences a launch");
  KeyListBatch b{};
  b.n = n;
  b.first[0] = 0;
  for (int i = 0; i < n; ++i) {
    b.seq[i] = seqs[i];
    b.first[i + 1] = b.first[i] + seqs[i].rows;
  }
  if (b.first[n] == 0) return {};
  if (b.first[n] > 0x7FFFFFFF) return invalid_argument("build_key_lists_batched: more than 2^31 − 1 rows");
  device::launch_pdl(key_lists_batched_kernel, static_cast<unsigned>(b.first[n]), 128, 0, stream, b);
  return status_of(cudaGetLastError(), "key_lists_batched");
}

Status launch_window_gather(CUstream_st* stream, WindowGather const* seqs, int n, int64_t cols) {
  if (n < 1 || n > kWindowGatherBatch) return Status(StatusCode::kInternal, "window_gather: 1 to 32 sequences a launch");
  WindowGatherBatch b{};
  b.n = n;
  b.cols = cols;
  b.first[0] = 0;
  for (int i = 0; i < n; ++i) {
    b.seq[i] = seqs[i];
    b.first[i + 1] = b.first[i] + seqs[i].n_old + seqs[i].chunk_rows;
  }
  if (b.first[n] == 0) return {};
  if (b.first[n] > 0x7FFFFFFF) return invalid_argument("window_gather: more than 2^31 − 1 rows");
  device::launch_pdl(window_gather_kernel, static_cast<unsigned>(b.first[n]), 128, 0, stream, b);
  return status_of(cudaGetLastError(), "window_gather");
}

Status launch_copy_rows(CUstream_st* stream, RowCopy const* table, int64_t count, int64_t cols) {
  if (count == 0) return {};
  if (count > 0x7FFFFFFF) return invalid_argument("copy_rows: more than 2^31 − 1 rows");
  device::launch_pdl(copy_rows_kernel, static_cast<unsigned>(count), 128, 0, stream, table, cols);
  return status_of(cudaGetLastError(), "copy_rows");
}

}  // namespace tessera::model::dsv41::gpu

// SPDX-License-Identifier: Apache-2.0
/// CUDA backend of AttentionKeyList (include/tessera/ops/attention_keys.hpp): the attention's per-row key
/// lists built on the device from the window positions and the device-resident top-k.
///   count kernel (one block of kCountThreads): thread t owns the contiguous rows [t·C, (t+1)·C); it counts
///     each row's keys (window: old entries with old_pos > p − W, chunk rows j ∈ (r − W, r] with
///     pos[j] > p − W; top-k: picks with 0 ≤ e < entries), an exclusive scan of the per-thread totals
///     (integers, exact) places its rows, and it writes their row_offsets.
///   fill kernel (one block per row): thread 0 writes the window ids in order; the top-k picks are sorted
///     ascending by a bitonic network in shared memory (invalid picks sort last as INT32_MAX) and written.
/// Writes past the key_ids length are dropped (a row whose offsets then exceed the list is poisoned by the
/// attention kernel instead of read out of bounds). Integer work only; no atomics.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "tessera/device/op_launch.cuh"
#include "tessera/ops/attention_keys.hpp"

namespace tessera::kernels::attention {

namespace {

constexpr int kCountThreads = 512;
constexpr int kFillThreads = 256;

struct KeyListParams {
  int64_t const* old_pos = nullptr;  // [n_old]
  int64_t const* pos = nullptr;      // [rows]
  int32_t const* selected = nullptr; // [rows, top_k] or null
  int64_t* row_offsets = nullptr;    // [rows + 1]
  int32_t* key_ids = nullptr;        // [cap]
  int64_t rows = 0, n_old = 0, window = 1, entries = 0, top_k = 0, cap = 0;
  int32_t sort_len = 1;              // power of two ≥ top_k
};

__device__ int64_t window_count(KeyListParams const& p, int64_t r) {
  int64_t const lim = p.pos[r] - p.window;
  int64_t n = 0;
  for (int64_t i = 0; i < p.n_old; ++i) n += p.old_pos[i] > lim;
  for (int64_t j = r - p.window + 1 > 0 ? r - p.window + 1 : 0; j <= r; ++j) n += p.pos[j] > lim;
  return n;
}

__device__ int64_t topk_count(KeyListParams const& p, int64_t r) {
  int64_t n = 0;
  for (int64_t i = 0; i < p.top_k; ++i) {
    int32_t const e = p.selected[r * p.top_k + i];
    n += e >= 0 && e < p.entries;
  }
  return n;
}

__global__ void __launch_bounds__(kCountThreads) key_count_kernel(KeyListParams const p) {
  device::pdl_enter();
  __shared__ int64_t scan_s[kCountThreads];
  int const tid = threadIdx.x;
  int64_t const chunk = (p.rows + kCountThreads - 1) / kCountThreads;
  int64_t const r0 = tid * chunk < p.rows ? tid * chunk : p.rows;
  int64_t const r1 = r0 + chunk < p.rows ? r0 + chunk : p.rows;
  int64_t total = 0;
  for (int64_t r = r0; r < r1; ++r) total += window_count(p, r) + (p.selected ? topk_count(p, r) : 0);
  scan_s[tid] = total;
  __syncthreads();
  for (int o = 1; o < kCountThreads; o <<= 1) {   // inclusive Hillis–Steele scan (integers: exact)
    int64_t const add = tid >= o ? scan_s[tid - o] : 0;
    __syncthreads();
    scan_s[tid] += add;
    __syncthreads();
  }
  int64_t base = scan_s[tid] - total;
  if (tid == 0) p.row_offsets[0] = 0;
  for (int64_t r = r0; r < r1; ++r) {
    base += window_count(p, r) + (p.selected ? topk_count(p, r) : 0);
    p.row_offsets[r + 1] = base;
  }
}

__global__ void __launch_bounds__(kFillThreads) key_fill_kernel(KeyListParams const p) {
  device::pdl_enter();
  extern __shared__ int32_t sel_s[];   // [sort_len]
  __shared__ int64_t n_window_s;
  int const tid = threadIdx.x;
  int64_t const r = blockIdx.x;
  int64_t const base = p.row_offsets[r];
  if (tid == 0) {
    int64_t const lim = p.pos[r] - p.window;
    int64_t n = base;
    for (int64_t i = 0; i < p.n_old; ++i)
      if (p.old_pos[i] > lim) {
        if (n < p.cap) p.key_ids[n] = static_cast<int32_t>(i);
        ++n;
      }
    for (int64_t j = r - p.window + 1 > 0 ? r - p.window + 1 : 0; j <= r; ++j)
      if (p.pos[j] > lim) {
        if (n < p.cap) p.key_ids[n] = static_cast<int32_t>(p.n_old + j);
        ++n;
      }
    n_window_s = n;
  }
  if (!p.selected) return;
  for (int i = tid; i < p.sort_len; i += kFillThreads) {
    int32_t e = i < p.top_k ? p.selected[r * p.top_k + i] : INT32_MAX;
    sel_s[i] = e >= 0 && e < p.entries ? e : INT32_MAX;
  }
  __syncthreads();
  for (int size = 2; size <= p.sort_len; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < p.sort_len; i += kFillThreads) {
        int const j = i ^ stride;
        if (j <= i) continue;
        bool const up = (i & size) == 0;
        if ((sel_s[i] > sel_s[j]) == up) {
          int32_t const t = sel_s[i];
          sel_s[i] = sel_s[j];
          sel_s[j] = t;
        }
      }
      __syncthreads();
    }
  int64_t const n0 = n_window_s;
  int64_t const id0 = p.n_old + p.rows;
  for (int i = tid; i < p.top_k; i += kFillThreads) {
    int32_t const e = sel_s[i];
    if (e != INT32_MAX && n0 + i < p.cap) p.key_ids[n0 + i] = static_cast<int32_t>(id0 + e);
  }
}

}  // namespace

}  // namespace tessera::kernels::attention

namespace tessera::ops {

static_assert(BackendOp<AttentionKeyList<Backend::kCuda>, AttentionKeyListDesc, AttentionKeyListArgs>);

Status AttentionKeyList<Backend::kCuda>::check(AttentionKeyListDesc const& d, AttentionKeyListArgs const& a) {
  TESSERA_TRY(check_attention_key_list(d, a));
  TESSERA_CHECK(d.top_k <= kAttentionKeyListTopKMax, "attention_key_list (CUDA): top_k above 8192 is not compiled");
  TESSERA_TRY(device::check_on_device(a.old_pos, "attention_key_list old_pos"));
  TESSERA_TRY(device::check_on_device(a.pos, "attention_key_list pos"));
  TESSERA_TRY(device::check_on_device(a.selected, "attention_key_list selected"));
  TESSERA_TRY(device::check_on_device(a.row_offsets, "attention_key_list row_offsets"));
  return device::check_on_device(a.key_ids, "attention_key_list key_ids");
}

Status AttentionKeyList<Backend::kCuda>::run(AttentionKeyListDesc const& d, AttentionKeyListArgs const& a,
                                             ExecContext& ctx) {
  namespace k = kernels::attention;
  k::KeyListParams p;
  p.old_pos = a.old_pos.data;
  p.pos = a.pos.data;
  p.selected = d.top_k > 0 ? a.selected.data : nullptr;
  p.row_offsets = a.row_offsets.data;
  p.key_ids = a.key_ids.data;
  p.rows = d.rows;
  p.n_old = d.n_old;
  p.window = d.window;
  p.entries = d.entries;
  p.top_k = d.top_k;
  p.cap = a.key_ids.shape[0];
  int32_t len = 1;
  while (len < d.top_k) len <<= 1;
  p.sort_len = len;
  device::launch_pdl(k::key_count_kernel, 1, k::kCountThreads, 0, ctx.stream, p);
  TESSERA_TRY(device::launch_status("attention_key_list (CUDA) count kernel"));
  if (d.rows == 0) return {};
  size_t const smem = p.selected ? static_cast<size_t>(len) * sizeof(int32_t) : 0;
  device::launch_pdl(k::key_fill_kernel, static_cast<unsigned>(d.rows), k::kFillThreads, smem, ctx.stream, p);
  return device::launch_status("attention_key_list (CUDA) fill kernel");
}

}  // namespace tessera::ops

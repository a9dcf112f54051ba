// SPDX-License-Identifier: Apache-2.0
/// Block-wide exact top-k selection with the lower-index-wins tie rule of ref::topk_select
/// (include/tessera/ref/indexer_ref.hpp): among the n items with value > −inf (NaN never qualifies),
/// the k best in the order (value desc, index asc).
///
/// Method (one block per row, kTopkThreads threads, all integer bookkeeping):
///   1. n_elig = #{v_i > −inf}. If n_elig ≤ k every eligible item is selected, no cutoff tie.
///   2. Otherwise an MSB-first radix select over the order-preserving 32-bit key of each value (4 passes of
///      8 bits, shared-memory histograms) finds T, the key of the k-th best value, and need_eq, how many of
///      the items with key T are inside the top k. Items with key > T are all selected.
///   3. The items equal to T are taken in index order: thread t owns the contiguous index range
///      [t·C, (t+1)·C) (C = ⌈n / kTopkThreads⌉); an exclusive scan of the per-thread counts gives each
///      item's rank among the T-valued items, and it is selected iff that rank < need_eq.
///   cutoff_tie = (#items with key T) > need_eq: a (k+1)-th eligible value equals the k-th.
/// The key maps +0 and −0 to the same key (float ==), so key equality is value equality. Histogram
/// counts use shared-memory integer atomics: counts are exact whatever the order, and no value depends
/// on them beyond the selected set, which depends only on (value, index) pairs: a row selects the same
/// set whatever the launch shape or the other rows.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace tessera::kernels::indexer {

constexpr int kTopkThreads = 512;

/// Order-preserving key: v < w ⟺ key(v) < key(w) for non-NaN floats, with key(−0) = key(+0).
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t const b = __float_as_uint(v == 0.f ? 0.f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct TopkShared {
  int32_t hist[256];
  int32_t cnt[kTopkThreads];   // per-thread counts, then their exclusive prefix sums
  int32_t cnt2[kTopkThreads];
  uint32_t prefix;
  int32_t rem, eq_total, n_elig;
};

struct TopkCut {
  bool all = false;       // n_elig ≤ k: every eligible item selected
  uint32_t key = 0;       // T
  int32_t need_eq = 0;    // items with key T that are selected
  int32_t take = 0;       // number selected = min(k, n_elig)
  bool tie = false;       // cutoff tie
};

/// Exclusive prefix sums of a[0..kTopkThreads) in place; returns the total. Thread 0 walks the array.
__device__ __forceinline__ int32_t block_exclusive_scan(int32_t* a, int32_t* total_slot) {
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int t = 0; t < kTopkThreads; ++t) {
      int32_t const c = a[t];
      a[t] = run;
      run += c;
    }
    *total_slot = run;
  }
  __syncthreads();
  return *total_slot;
}

/// Steps 1–2: the cut of the k best eligible items among get(0..n).
template <class Get>
__device__ TopkCut topk_cut(int64_t n, int64_t k, Get const& get, TopkShared& sh) {
  int const tid = threadIdx.x;
  int32_t mine = 0;
  for (int64_t i = tid; i < n; i += kTopkThreads) mine += get(i) > -INFINITY ? 1 : 0;
  sh.cnt[tid] = mine;
  TopkCut cut;
  int32_t const n_elig = block_exclusive_scan(sh.cnt, &sh.n_elig);
  if (n_elig <= k) {
    cut.all = true;
    cut.take = n_elig;
    return cut;
  }
  uint32_t prefix = 0, pmask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (tid < 256) sh.hist[tid] = 0;
    __syncthreads();
    for (int64_t i = tid; i < n; i += kTopkThreads) {
      float const v = get(i);
      if (!(v > -INFINITY)) continue;
      uint32_t const key = order_key(v);
      if ((key & pmask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int32_t rem = shift == 24 ? static_cast<int32_t>(k) : sh.rem;
      int32_t cum = 0;
      for (int dgt = 255; dgt >= 0; --dgt) {
        int32_t const c = sh.hist[dgt];
        if (cum + c >= rem) {
          sh.prefix = prefix | (static_cast<uint32_t>(dgt) << shift);
          sh.rem = rem - cum;
          sh.eq_total = c;
          break;
        }
        cum += c;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    pmask |= 255u << shift;
  }
  cut.key = prefix;
  cut.need_eq = sh.rem;
  cut.take = static_cast<int32_t>(k);
  cut.tie = sh.eq_total > sh.rem;
  __syncthreads();   // sh.rem / sh.eq_total are read by every thread before anyone reuses the scratch
  return cut;
}

/// Step 3: calls emit(i, selected, rank) for every item i < n (rank = its position among the selected
/// items in index order, valid when selected). Each thread visits its contiguous index range in order.
template <class Get, class Emit>
__device__ void topk_emit(int64_t n, TopkCut const& cut, Get const& get, Emit const& emit, TopkShared& sh) {
  int const tid = threadIdx.x;
  int64_t const chunk = (n + kTopkThreads - 1) / kTopkThreads;
  int64_t const b = tid * chunk < n ? tid * chunk : n;
  int64_t const e = b + chunk < n ? b + chunk : n;
  auto klass = [&](float v) -> int {   // 0 = not eligible / below, 1 = above the cut, 2 = equal to it
    if (!(v > -INFINITY)) return 0;
    if (cut.all) return 1;
    uint32_t const key = order_key(v);
    return key > cut.key ? 1 : key == cut.key ? 2 : 0;
  };
  int32_t gt = 0, eq = 0;
  for (int64_t i = b; i < e; ++i) {
    int const c = klass(get(i));
    gt += c == 1;
    eq += c == 2;
  }
  sh.cnt[tid] = eq;
  block_exclusive_scan(sh.cnt, &sh.n_elig);
  int32_t const eq_before = sh.cnt[tid];
  int32_t eq_take = cut.need_eq - eq_before;
  eq_take = eq_take < 0 ? 0 : eq_take > eq ? eq : eq_take;
  sh.cnt2[tid] = gt + eq_take;
  block_exclusive_scan(sh.cnt2, &sh.n_elig);
  int32_t rank = sh.cnt2[tid];
  int32_t eq_seen = 0;
  for (int64_t i = b; i < e; ++i) {
    int const c = klass(get(i));
    bool sel = c == 1;
    if (c == 2) sel = eq_seen++ < eq_take;
    emit(i, sel, rank);
    rank += sel;
  }
}

}  // namespace tessera::kernels::indexer

// SPDX-License-Identifier: Apache-2.0
/// CPU reference of an EXL3 linear layer (spec/exl3.md §2–§4), written the plain way:
///   W' = decode(trellis)                         fp16 [k, n], tile [tk, tn] at rows 16tk.., cols 16tn..
///   xh = fp16(H128(fp16(x·suh))·r)               fp16 [m, k]   (bit-exact, §4.3)
///   acc = xh W'                                   fp32 [m, n]   (summed in float64, rounded once)
///   y  = epilogue(acc, svh) (+ bias)              fp16: fp16(fp16(H128(acc)·r)·svh); fp32: (H128(acc)·r)·svh
/// plus the float64 dense weight W = diag(suh) H W' H diag(svh) used by the quantizer's error report.
/// Values in fp16 are passed as their uint16 bit patterns. Row invariance: every output row depends only
/// on its own input row.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tessera/codec/exl3.hpp"
#include "tessera/core/thread_pool.hpp"

namespace tessera::ref {

/// Host view of one EXL3 layer. All pointers are contiguous host memory.
struct Exl3HostLayer {
  int64_t k = 0, n = 0;                                // in_features, out_features (multiples of 128)
  int k2 = 0;                                          // 2 · bits per weight
  exl3::Codebook codebook = exl3::Codebook::kMul1;
  int16_t const* trellis = nullptr;                    // [k/16, n/16, 8·k2]
  uint16_t const* suh = nullptr;                       // [k] fp16
  uint16_t const* svh = nullptr;                       // [n] fp16
  uint16_t const* bias = nullptr;                      // [n] fp16, or nullptr
  int64_t tiles_k() const { return k / exl3::kTileDim; }
  int64_t tiles_n() const { return n / exl3::kTileDim; }
  int words_per_tile() const { return exl3::words16_per_tile(k2); }
};

/// The 256 states of one tile (8·k2 int16 words), in stream order.
inline void exl3_tile_states(int16_t const* tile, int k2, uint16_t* states) {
  uint32_t wd[64];
  auto const* u = reinterpret_cast<uint16_t const*>(tile);
  for (int j = 0; j < 4 * k2; ++j) wd[j] = exl3::tile_word32(u, j);
  for (int p = 0; p < exl3::kTileSize; ++p) states[p] = static_cast<uint16_t>(exl3::tile_state(wd, k2, p));
}

/// The fp16 table of a codebook for all 65536 states.
inline std::vector<uint16_t> exl3_codebook_table(exl3::Codebook cb) {
  std::vector<uint16_t> t(65536);
  for (uint32_t s = 0; s < 65536; ++s) t[s] = exl3::decode_state(cb, s);
  return t;
}

/// Decodes tile rows [tk_begin, tk_end) of W' into `w` (fp16 bits, row-major [k, n], full matrix).
inline void exl3_decode_rows(Exl3HostLayer const& L, uint16_t const* table, int64_t tk_begin, int64_t tk_end,
                             uint16_t* w) {
  int64_t const tn = L.tiles_n();
  uint16_t st[exl3::kTileSize];
  for (int64_t a = tk_begin; a < tk_end; ++a)
    for (int64_t b = 0; b < tn; ++b) {
      exl3_tile_states(L.trellis + (a * tn + b) * L.words_per_tile(), L.k2, st);
      for (int p = 0; p < exl3::kTileSize; ++p)
        w[(16 * a + exl3::tile_row(p)) * L.n + 16 * b + exl3::tile_col(p)] = table[st[p]];
    }
}

/// W' in fp16 bits [k, n] (what ExLlamaV3's `reconstruct` writes), parallel over tile rows.
inline std::vector<uint16_t> exl3_decode_inner(Exl3HostLayer const& L) {
  std::vector<uint16_t> table = exl3_codebook_table(L.codebook);
  std::vector<uint16_t> w(static_cast<size_t>(L.k * L.n));
  parallel_for(L.tiles_k(), [&](int64_t a, int64_t b) { exl3_decode_rows(L, table.data(), a, b, w.data()); });
  return w;
}

/// xh [m, k] from x [m, k] (fp16 bits), per 128 block (§4.3).
inline void exl3_input_transform(uint16_t const* x, int64_t m, int64_t k, uint16_t const* suh, uint16_t* xh) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; c += exl3::kHadDim)
      exl3::input_transform128(x + r * k + c, suh + c, xh + r * k + c);
}

/// acc[m, n] = xh W', each element summed in float64 in index order and rounded once to fp32.
inline void exl3_matmul_acc(uint16_t const* xh, int64_t m, int64_t k, uint16_t const* w, int64_t n,
                            float* acc) {
  std::vector<float> wf(static_cast<size_t>(k * n));
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = float_from_f16_bits(w[i]);
  for (int64_t r = 0; r < m; ++r) {
    std::vector<double> row(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < k; ++i) {
      double const a = float_from_f16_bits(xh[r * k + i]);
      float const* wr = wf.data() + i * n;
      for (int64_t j = 0; j < n; ++j) row[j] += a * wr[j];
    }
    for (int64_t j = 0; j < n; ++j) acc[r * n + j] = static_cast<float>(row[j]);
  }
}

/// fp16 epilogue over [m, n] accumulators.
inline void exl3_epilogue_f16(float const* acc, int64_t m, int64_t n, uint16_t const* svh, uint16_t* y) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; c += exl3::kHadDim) exl3::epilogue128_f16(acc + r * n + c, svh + c, y + r * n + c);
}

/// fp32 epilogue over [m, n] accumulators.
inline void exl3_epilogue_f32(float const* acc, int64_t m, int64_t n, uint16_t const* svh, float* y) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; c += exl3::kHadDim) exl3::epilogue128_f32(acc + r * n + c, svh + c, y + r * n + c);
}

/// fp16(y + bias): the fp32 sum of two fp16 values rounded once equals __hadd (a double rounding cannot
/// reach an fp16 midpoint here, see spec §1.1: bias is added after everything else).
inline void exl3_add_bias_f16(uint16_t* y, int64_t m, int64_t n, uint16_t const* bias) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j)
      y[r * n + j] = f16_bits_from_float(float_from_f16_bits(y[r * n + j]) + float_from_f16_bits(bias[j]));
}
inline void exl3_add_bias_f32(float* y, int64_t m, int64_t n, uint16_t const* bias) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += float_from_f16_bits(bias[j]);
}

/// The whole layer with fp16 output: y [m, n] fp16 bits (bias added when the layer has one).
inline void exl3_forward_f16(Exl3HostLayer const& L, uint16_t const* x, int64_t m, uint16_t* y) {
  std::vector<uint16_t> xh(static_cast<size_t>(m * L.k));
  exl3_input_transform(x, m, L.k, L.suh, xh.data());
  std::vector<uint16_t> w = exl3_decode_inner(L);
  std::vector<float> acc(static_cast<size_t>(m * L.n));
  exl3_matmul_acc(xh.data(), m, L.k, w.data(), L.n, acc.data());
  exl3_epilogue_f16(acc.data(), m, L.n, L.svh, y);
  if (L.bias) exl3_add_bias_f16(y, m, L.n, L.bias);
}

/// The whole layer with fp32 output.
inline void exl3_forward_f32(Exl3HostLayer const& L, uint16_t const* x, int64_t m, float* y) {
  std::vector<uint16_t> xh(static_cast<size_t>(m * L.k));
  exl3_input_transform(x, m, L.k, L.suh, xh.data());
  std::vector<uint16_t> w = exl3_decode_inner(L);
  std::vector<float> acc(static_cast<size_t>(m * L.n));
  exl3_matmul_acc(xh.data(), m, L.k, w.data(), L.n, acc.data());
  exl3_epilogue_f32(acc.data(), m, L.n, L.svh, y);
  if (L.bias) exl3_add_bias_f32(y, m, L.n, L.bias);
}

/// H/sqrt(128) over blocks of 128 of a float64 vector with stride `stride` (length `len`).
inline void rot128_f64(double* v, int64_t len, int64_t stride) {
  double const s = 1.0 / std::sqrt(128.0);
  double t[exl3::kHadDim];
  for (int64_t b = 0; b < len; b += exl3::kHadDim) {
    for (int i = 0; i < exl3::kHadDim; ++i) t[i] = v[(b + i) * stride];
    for (int h = 1; h < exl3::kHadDim; h <<= 1)
      for (int j = 0; j < exl3::kHadDim; ++j)
        if ((j & h) == 0) {
          double const lo = t[j], hi = t[j + h];
          t[j] = lo + hi;
          t[j + h] = lo - hi;
        }
    for (int i = 0; i < exl3::kHadDim; ++i) v[(b + i) * stride] = t[i] * s;
  }
}

/// W = diag(suh) H_k W' H_n diag(svh) in float64, [k, n] row-major (y = x W).
inline std::vector<double> exl3_dense_weight(Exl3HostLayer const& L, uint16_t const* w_inner) {
  std::vector<double> w(static_cast<size_t>(L.k * L.n));
  for (size_t i = 0; i < w.size(); ++i) w[i] = float_from_f16_bits(w_inner[i]);
  parallel_for(L.n, [&](int64_t a, int64_t b) {
    for (int64_t j = a; j < b; ++j) rot128_f64(w.data() + j, L.k, L.n);
  });
  parallel_for(L.k, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      double* row = w.data() + i * L.n;
      rot128_f64(row, L.n, 1);
      double const su = float_from_f16_bits(L.suh[i]);
      for (int64_t j = 0; j < L.n; ++j) row[j] *= su * float_from_f16_bits(L.svh[j]);
    }
  });
  return w;
}

}  // namespace tessera::ref

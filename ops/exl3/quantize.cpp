// SPDX-License-Identifier: Apache-2.0
/// EXL3 quantizer: rotation with random signs and RMS scales, then a least-squares tail-biting Viterbi
/// search per 16×16 tile (include/tessera/ops/exl3_quantize.hpp; tools/golden_exl3.py quantize_weight).
///
/// Trellis search. A state s is 16 bits; the next state is s' = ((s << K) | v) & 0xFFFF, so s' is
/// reachable from every s whose low 16−K bits ("edge" e = s mod E, E = 2^(16−K)) equal s' >> K. The
/// forward pass keeps cost[e] = least squared error of a path whose last state has out-edge e:
///   cand[s'] = cost[s' >> K] + (table[s'] − target_p)²,  cost'[e'] = min over hi of cand[hi·E + e'],
/// and records the minimising hi (K bits, one byte) per step and edge. Tail-biting: pass 1 runs the
/// positions in the order 128..255, 0..127 from a free start and backtracks to the in-edge of position 0;
/// pass 2 starts from exactly that edge, runs 0..255 and backtracks from the same edge, which closes the
/// circle (the last state's out-edge is the first state's in-edge).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>

#include "tessera/core/thread_pool.hpp"
#include "tessera/ops/exl3_quantize.hpp"
#include "tessera/ref/exl3_ref.hpp"

namespace tessera::ops {

namespace {

constexpr int kStates = 65536;

/// One forward pass over `order`; cost [E] in/out; back [256][E]. K is a template argument so the
/// inner loops have constant trip counts (one broadcast vector per in-edge at K = 2, 3).
/// kBits = 0: K at run time (faster with GCC at K >= 4 than the constant form).
template <int kBits>
void viterbi_forward(float const* target, int const* order, float const* __restrict table, float* __restrict cost,
                     float* __restrict cand, int32_t* __restrict arg, uint8_t* __restrict back, int bits) {
  int const nk = kBits ? 1 << kBits : 1 << bits, e_count = 65536 / nk;
  for (int step = 0; step < exl3::kTileSize; ++step) {
    float const t = target[order[step]];
    // cand[s] for s ascending: its in-edge s >> K runs through cost[] with each value repeated nk times.
    for (int q = 0; q < e_count; ++q) {
      float const c = cost[q];
      float const* tb = table + q * nk;
      float* cd = cand + q * nk;
      for (int v = 0; v < nk; ++v) {
        float const d = tb[v] - t;
        cd[v] = c + d * d;
      }
    }
    // cost'[e] = min over hi of cand[hi·E + e]; the first minimising hi wins ties.
    uint8_t* bk = back + static_cast<size_t>(step) * e_count;
    std::copy(cand, cand + e_count, cost);
    std::fill(arg, arg + e_count, 0);
    for (int hi = 1; hi < nk; ++hi) {
      float const* __restrict row = cand + static_cast<size_t>(hi) * e_count;
      for (int e = 0; e < e_count; ++e) {
        float const r = row[e], c = cost[e];
        int32_t const m = -static_cast<int32_t>(r < c);    // all ones where row hi is strictly better
        cost[e] = r < c ? r : c;
        arg[e] = (arg[e] & ~m) | (hi & m);
      }
    }
    for (int e = 0; e < e_count; ++e) bk[e] = static_cast<uint8_t>(arg[e]);
  }
}

/// Walks back from out-edge `edge` at step 255 down to step `stop`; writes states; returns the in-edge of
/// the state at step `stop`.
int viterbi_backtrack(uint8_t const* back, int const* order, int bits, int edge, int stop, uint16_t* states) {
  int const e_count = 1 << (16 - bits);
  for (int step = exl3::kTileSize - 1; step >= stop; --step) {
    int const s = back[static_cast<size_t>(step) * e_count + edge] * e_count + edge;
    states[order[step]] = static_cast<uint16_t>(s);
    edge = s >> bits;
  }
  return edge;
}

struct Prepared {
  std::vector<float> w2;            // [k, n] rotated and scaled weight, target of the trellis
  std::vector<double> su, sv;       // [k], [n]
};

/// Steps 1–3 of the algorithm (float64 throughout).
Prepared prepare(float const* w, int64_t k, int64_t n, exl3::Codebook cb, uint64_t seed) {
  Prepared p;
  std::mt19937_64 rng(seed);
  std::vector<double> su_sign(static_cast<size_t>(k)), sv_sign(static_cast<size_t>(n));
  for (auto& s : su_sign) s = (rng() >> 63) ? -1.0 : 1.0;
  for (auto& s : sv_sign) s = (rng() >> 63) ? -1.0 : 1.0;
  std::vector<double> a(static_cast<size_t>(k * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = w[i];
  // Column RMS, normalised to mean 1, into sv.
  std::vector<double> col(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) col[j] += a[i * n + j] * a[i * n + j];
  double mean = 0;
  for (auto& c : col) { c = std::sqrt(c / static_cast<double>(k)); mean += c; }
  mean /= static_cast<double>(n);
  p.sv.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    p.sv[j] = sv_sign[j] * (col[j] < 1e-30 ? 0.1 : col[j] / std::max(mean, 1e-30));
  parallel_for(k, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      double* row = a.data() + i * n;
      for (int64_t j = 0; j < n; ++j) row[j] /= p.sv[j];
      ref::rot128_f64(row, n, 1);
    }
  });
  p.su.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += a[i * n + j] * a[i * n + j];
    double r = std::sqrt(ss / static_cast<double>(n));
    p.su[i] = su_sign[i] * (r < 1e-30 ? 0.1 : r) / -exl3::kCodebookScale;
    for (int64_t j = 0; j < n; ++j) a[i * n + j] /= p.su[i];
  }
  parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) ref::rot128_f64(a.data() + j, k, n);
  });
  double ss = 0, cs = 0;
  for (double v : a) ss += v * v;
  std::vector<uint16_t> table = ref::exl3_codebook_table(cb);
  for (uint16_t t : table) { double v = float_from_f16_bits(t); cs += v * v; }
  double const g = std::sqrt(cs / kStates) / std::max(std::sqrt(ss / static_cast<double>(a.size())), 1e-300);
  p.w2.resize(a.size());
  for (size_t i = 0; i < a.size(); ++i) p.w2[i] = static_cast<float>(a[i] * g);
  for (auto& s : p.su) s /= g;
  return p;
}

/// Target of tile (a, b) in stream order.
void tile_target(std::vector<float> const& w2, int64_t n, int64_t a, int64_t b, float* t) {
  for (int p = 0; p < exl3::kTileSize; ++p)
    t[p] = w2[(16 * a + exl3::tile_row(p)) * n + 16 * b + exl3::tile_col(p)];
}

std::vector<float> float_table(exl3::Codebook cb) {
  std::vector<uint16_t> t = ref::exl3_codebook_table(cb);
  std::vector<float> f(t.size());
  for (size_t i = 0; i < t.size(); ++i) f[i] = float_from_f16_bits(t[i]);
  return f;
}

}  // namespace

void exl3_viterbi_tile(float const* target, int bits, float const* table, uint16_t* states,
                       std::vector<uint8_t>& scratch) {
  int const e_count = 1 << (16 - bits);
  size_t const back_bytes = static_cast<size_t>(exl3::kTileSize) * e_count;
  size_t const need = back_bytes + sizeof(float) * (kStates + 2 * e_count) + 64;
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* back = scratch.data();
  auto* cand = reinterpret_cast<float*>(scratch.data() + ((back_bytes + 63) & ~size_t{63}));
  float* cost = cand + kStates;
  auto* arg = reinterpret_cast<int32_t*>(cost + e_count);
  int order1[exl3::kTileSize], order2[exl3::kTileSize];
  for (int i = 0; i < exl3::kTileSize; ++i) { order1[i] = (i + 128) & 255; order2[i] = i; }
  auto forward = [&](int const* order) {
    switch (bits) {
      case 1: viterbi_forward<1>(target, order, table, cost, cand, arg, back, bits); break;
      case 2: viterbi_forward<2>(target, order, table, cost, cand, arg, back, bits); break;
      case 3: viterbi_forward<3>(target, order, table, cost, cand, arg, back, bits); break;
      default: viterbi_forward<0>(target, order, table, cost, cand, arg, back, bits); break;
    }
  };
  std::fill(cost, cost + e_count, 0.f);
  forward(order1);
  int const last = static_cast<int>(std::min_element(cost, cost + e_count) - cost);
  int const pre = viterbi_backtrack(back, order1, bits, last, 128, states);   // in-edge of position 0
  std::fill(cost, cost + e_count, std::numeric_limits<float>::infinity());
  cost[pre] = 0.f;
  forward(order2);
  viterbi_backtrack(back, order2, bits, pre, 0, states);
}

Exl3QuantizedLayer exl3_quantize(float const* w, int64_t k, int64_t n, int bits, exl3::Codebook cb, uint64_t seed,
                                 std::function<void(int64_t)> const& progress) {
  Exl3QuantizedLayer q;
  q.k = k; q.n = n; q.k2 = 2 * bits; q.codebook = cb;
  Prepared p = prepare(w, k, n, cb, seed);
  std::vector<float> const table = float_table(cb);
  int64_t const tk = k / 16, tn = n / 16, words = exl3::words16_per_tile(q.k2);
  q.trellis.resize(static_cast<size_t>(tk * tn * words));
  std::atomic<int64_t> done{0};
  parallel_for(tk * tn, [&](int64_t b, int64_t e) {
    std::vector<uint8_t> scratch;
    float target[exl3::kTileSize];
    uint16_t st[exl3::kTileSize], codes[exl3::kTileSize];
    for (int64_t t = b; t < e; ++t) {
      tile_target(p.w2, n, t / tn, t % tn, target);
      exl3_viterbi_tile(target, bits, table.data(), st, scratch);
      for (int i = 0; i < exl3::kTileSize; ++i) codes[i] = static_cast<uint16_t>(st[i] & ((1u << bits) - 1));
      exl3::pack_tile(codes, q.k2, reinterpret_cast<uint16_t*>(q.trellis.data() + t * words));
      int64_t d = ++done;
      if (progress) progress(d);
    }
  });
  q.suh.resize(static_cast<size_t>(k));
  q.svh.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < k; ++i) q.suh[i] = f16_bits_from_float(static_cast<float>(p.su[i]));
  for (int64_t j = 0; j < n; ++j) q.svh[j] = f16_bits_from_float(static_cast<float>(p.sv[j]));
  // Error of the layer as stored (fp16 scales, decoded W') against W.
  ref::Exl3HostLayer L;
  L.k = k; L.n = n; L.k2 = q.k2; L.codebook = cb;
  L.trellis = q.trellis.data(); L.suh = q.suh.data(); L.svh = q.svh.data();
  std::vector<uint16_t> wi = ref::exl3_decode_inner(L);
  std::vector<double> wd = ref::exl3_dense_weight(L, wi.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < wd.size(); ++i) {
    double d = wd[i] - static_cast<double>(w[i]);
    num += d * d;
    den += static_cast<double>(w[i]) * w[i];
  }
  q.rel_mse = den > 0 ? num / den : num;
  return q;
}

double exl3_estimate_rel_mse(float const* w, int64_t k, int64_t n, int bits, exl3::Codebook cb, uint64_t seed,
                             int64_t max_tiles) {
  Prepared p = prepare(w, k, n, cb, seed);
  std::vector<float> const table = float_table(cb);
  int64_t const tk = k / 16, tn = n / 16, total = tk * tn;
  int64_t const count = std::min(total, std::max<int64_t>(max_tiles, 1));
  std::vector<double> num(static_cast<size_t>(count)), den(static_cast<size_t>(count));
  parallel_for(count, [&](int64_t b, int64_t e) {
    std::vector<uint8_t> scratch;
    float target[exl3::kTileSize];
    uint16_t st[exl3::kTileSize];
    for (int64_t i = b; i < e; ++i) {
      int64_t const t = i * total / count;        // evenly spaced tiles
      tile_target(p.w2, n, t / tn, t % tn, target);
      exl3_viterbi_tile(target, bits, table.data(), st, scratch);
      double s = 0, d = 0;
      for (int j = 0; j < exl3::kTileSize; ++j) {
        double diff = table[st[j]] - target[j];
        s += diff * diff;
        d += static_cast<double>(target[j]) * target[j];
      }
      num[i] = s;
      den[i] = d;
    }
  });
  double sn = 0, sd = 0;
  for (int64_t i = 0; i < count; ++i) { sn += num[i]; sd += den[i]; }
  return sd > 0 ? sn / sd : sn;
}

}  // namespace tessera::ops

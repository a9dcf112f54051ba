// SPDX-License-Identifier: Apache-2.0
/// Weight-layout detection (see include/tessera/io/layout.hpp): EXL3 groups checked against the loader
/// checklist of spec/exl3.md §1.1, native FP8 / FP4 / Engram FP8 tensors recognised by their ue8m0 `.scale`
/// siblings and the scale shapes of spec/deepseek-v41.md §4.2.
#include "tessera/io/layout.hpp"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace tessera::io {

char const* to_string(WeightLayout l) {
  switch (l) {
    case WeightLayout::kDense: return "dense";
    case WeightLayout::kNativeFp8: return "native-fp8";
    case WeightLayout::kExl3: return "exl3";
    case WeightLayout::kMixed: return "mixed";
  }
  return "?";
}

char const* to_string(TensorKind k) {
  switch (k) {
    case TensorKind::kDense: return "dense";
    case TensorKind::kFp8Weight: return "fp8-weight";
    case TensorKind::kFp8Scale: return "fp8-scale";
    case TensorKind::kFp4Weight: return "fp4-weight";
    case TensorKind::kFp4Scale: return "fp4-scale";
    case TensorKind::kEngramFp8Table: return "engram-fp8-table";
    case TensorKind::kEngramScale: return "engram-scale";
    case TensorKind::kExl3Trellis: return "exl3-trellis";
    case TensorKind::kExl3Suh: return "exl3-suh";
    case TensorKind::kExl3Svh: return "exl3-svh";
    case TensorKind::kExl3Su: return "exl3-su";
    case TensorKind::kExl3Sv: return "exl3-sv";
    case TensorKind::kExl3Marker: return "exl3-marker";
    case TensorKind::kExl3Bias: return "exl3-bias";
  }
  return "?";
}

char const* to_string(Exl3Codebook c) {
  switch (c) {
    case Exl3Codebook::k3Inst: return "3inst";
    case Exl3Codebook::kMcg: return "mcg";
    case Exl3Codebook::kMul1: return "mul1";
  }
  return "?";
}

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
std::string dims(std::vector<int64_t> const& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}
int64_t numel(TensorInfo const& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Index {
 public:
  explicit Index(std::vector<TensorInfo> const& t) : t_(t) {
    order_.resize(t.size());
    for (size_t i = 0; i < t.size(); ++i) order_[i] = i;
    std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return t_[a].name < t_[b].name; });
  }
  /// Index of the tensor named `name`, or -1.
  long find(std::string const& name) const {
    auto it = std::lower_bound(order_.begin(), order_.end(), name,
                               [&](size_t i, std::string const& n) { return t_[i].name < n; });
    return it != order_.end() && t_[*it].name == name ? static_cast<long>(*it) : -1;
  }

 private:
  std::vector<TensorInfo> const& t_;
  std::vector<size_t> order_;
};

Status exl3_group(std::vector<TensorInfo> const& ts, Index const& idx, size_t ti, LayoutReport& rep) {
  TensorInfo const& tr = ts[ti];
  std::string const p = tr.name.substr(0, tr.name.size() - std::string_view(".trellis").size());
  auto bad = [&](std::string const& tensor, std::string const& msg) {
    return malformed("EXL3 group '" + p + "': tensor '" + tensor + "' " + msg + " (" + tr.file + ")");
  };
  // A group needs the trellis and scales on both sides (spec/exl3.md §1.1); a lone `.trellis` (e.g. the
  // worked-example tiles of exl3_tables.safetensors) is an ordinary tensor, a half-present group an error.
  bool const in_scale = idx.find(p + ".suh") >= 0 || idx.find(p + ".su") >= 0;
  bool const out_scale = idx.find(p + ".svh") >= 0 || idx.find(p + ".sv") >= 0;
  if (!in_scale && !out_scale) return {};
  if (tr.dtype != DType::kI16 || tr.shape.size() != 3)
    return bad(tr.name, "must be I16 of rank 3, is " + std::string(safetensors_dtype_string(tr.dtype)) + " " + dims(tr.shape));
  int64_t const last = tr.shape[2];
  Exl3Group g;
  g.prefix = p;
  g.in_features = 16 * tr.shape[0];
  g.out_features = 16 * tr.shape[1];
  if (last % 16 == 0 && last / 16 >= 1 && last / 16 <= 8) {
    g.bits = static_cast<double>(last / 16);
  } else if (last % 16 == 8 && last / 16 >= 1 && last / 16 <= 3) {
    g.bits = static_cast<double>(last / 16) + 0.5;
    g.half_rate_unverified = true;
  } else {
    return bad(tr.name, "has last dimension " + std::to_string(last) + "; need 16·K with K in 1..8 (or 16·K+8, K in 1..3)");
  }
  if (g.in_features <= 0 || g.out_features <= 0 || g.in_features % 128 || g.out_features % 128)
    return bad(tr.name, "gives k = " + std::to_string(g.in_features) + ", n = " + std::to_string(g.out_features) +
                            "; both must be positive multiples of 128");
  rep.kinds[ti] = TensorKind::kExl3Trellis;
  g.trellis_bytes = tr.nbytes;

  // Codebook marker: none = 3INST, mcg = MCG, mul1 = MUL1, both = error.
  long const mcg = idx.find(p + ".mcg"), mul1 = idx.find(p + ".mul1");
  if (mcg >= 0 && mul1 >= 0) return bad(p + ".mcg", "and '" + p + ".mul1' are both present");
  if (long m = mcg >= 0 ? mcg : mul1; m >= 0) {
    TensorInfo const& mk = ts[static_cast<size_t>(m)];
    if (mk.dtype != DType::kI32 || !mk.shape.empty()) return bad(mk.name, "must be an I32 scalar (shape [])");
    g.codebook = mcg >= 0 ? Exl3Codebook::kMcg : Exl3Codebook::kMul1;
    rep.kinds[static_cast<size_t>(m)] = TensorKind::kExl3Marker;
    g.overhead_bytes += mk.nbytes;
  }
  if (g.half_rate_unverified && g.codebook != Exl3Codebook::kMul1)
    return bad(tr.name, "has a half-integer rate, which exists only with the mul1 codebook");

  // Input / output scales: suh/svh F16, or legacy packed signs su/sv I16 [dim/16].
  auto scales = [&](char const* h, char const* s, int64_t dim, TensorKind kh, TensorKind ks) -> Status {
    long ih = idx.find(p + "." + h), is = idx.find(p + "." + s);
    if (ih >= 0 && is >= 0) return bad(p + "." + h, std::string("and '") + p + "." + s + "' are both present");
    if (ih < 0 && is < 0) return bad(tr.name, std::string("has neither '") + p + "." + h + "' nor '" + p + "." + s + "'");
    if (ih >= 0) {
      TensorInfo const& t = ts[static_cast<size_t>(ih)];
      if (t.dtype != DType::kF16 || t.shape != std::vector<int64_t>{dim})
        return bad(t.name, "must be F16 [" + std::to_string(dim) + "], is " +
                               std::string(safetensors_dtype_string(t.dtype)) + " " + dims(t.shape));
      rep.kinds[static_cast<size_t>(ih)] = kh;
      g.overhead_bytes += t.nbytes;
    } else {
      TensorInfo const& t = ts[static_cast<size_t>(is)];
      if (t.dtype != DType::kI16 || t.shape != std::vector<int64_t>{dim / 16})
        return bad(t.name, "must be I16 [" + std::to_string(dim / 16) + "], is " +
                               std::string(safetensors_dtype_string(t.dtype)) + " " + dims(t.shape));
      rep.kinds[static_cast<size_t>(is)] = ks;
      g.overhead_bytes += t.nbytes;
      g.legacy_signs = true;
    }
    return {};
  };
  TESSERA_TRY(scales("suh", "su", g.in_features, TensorKind::kExl3Suh, TensorKind::kExl3Su));
  TESSERA_TRY(scales("svh", "sv", g.out_features, TensorKind::kExl3Svh, TensorKind::kExl3Sv));
  if (long ib = idx.find(p + ".bias"); ib >= 0) {
    TensorInfo const& t = ts[static_cast<size_t>(ib)];
    bool ok_type = t.dtype == DType::kF16 || t.dtype == DType::kF32 || t.dtype == DType::kBf16;
    if (!ok_type || t.shape != std::vector<int64_t>{g.out_features})
      return bad(t.name, "must be F16/F32/BF16 [" + std::to_string(g.out_features) + "], is " +
                             std::string(safetensors_dtype_string(t.dtype)) + " " + dims(t.shape));
    rep.kinds[static_cast<size_t>(ib)] = TensorKind::kExl3Bias;
    g.has_bias = true;
    g.overhead_bytes += t.nbytes;
  }
  double const weights = static_cast<double>(g.in_features) * static_cast<double>(g.out_features);
  g.bits_with_scales = static_cast<double>(g.trellis_bytes + g.overhead_bytes) * 8.0 / weights;
  rep.exl3_groups.push_back(g);
  return {};
}

/// `X.weight` with an e8m0 sibling `X.scale` (or `X.weight_scale_inv`): FP8 32×32, FP4 experts or an
/// FP8 Engram table.
Status scaled_weight(std::vector<TensorInfo> const& ts, Index const& idx, size_t wi, LayoutReport& rep) {
  TensorInfo const& w = ts[wi];
  bool const fp8 = w.dtype == DType::kF8E4m3;
  bool const fp4 = w.dtype == DType::kI8 || w.dtype == DType::kF4E2m1x2;
  if (!fp8 && !fp4) return {};  // float weights: a `.scale` next to them is unused (golden Engram tables)
  std::string const base = w.name.substr(0, w.name.size() - std::string_view(".weight").size());
  long si = idx.find(base + ".scale");
  if (si < 0) si = idx.find(w.name + "_scale_inv");
  if (si < 0) {
    if (fp8) return malformed("tensor '" + w.name + "' is F8_E4M3 but has no '" + base + ".scale' (" + w.file + ")");
    return {};  // a plain int8 tensor
  }
  TensorInfo const& s = ts[static_cast<size_t>(si)];
  if (s.dtype != DType::kE8m0)
    return malformed("tensor '" + s.name + "' scales '" + w.name + "' but is " +
                     std::string(safetensors_dtype_string(s.dtype)) + ", not F8_E8M0 (" + s.file + ")");
  if (w.shape.size() != 2) return malformed("tensor '" + w.name + "' has a scale but is not 2-D: " + dims(w.shape));
  int64_t const r = w.shape[0], c = w.shape[1];
  if (fp4) {
    int64_t const cols = 2 * c;  // two e2m1 values per byte
    if (cols % 32 || s.shape != std::vector<int64_t>{r, cols / 32})
      return malformed("tensor '" + s.name + "' should be [" + std::to_string(r) + ", " + std::to_string(cols / 32) +
                       "] (one ue8m0 per row per 32 of the " + std::to_string(cols) + " FP4 columns of '" + w.name +
                       "'), is " + dims(s.shape));
    rep.kinds[wi] = TensorKind::kFp4Weight;
    rep.kinds[static_cast<size_t>(si)] = TensorKind::kFp4Scale;
    rep.fp4_params += r * cols;
    rep.fp4_bytes += w.nbytes + s.nbytes;
    return {};
  }
  bool const engram = w.name.find("engram") != std::string::npos;
  bool const per_row = c % 32 == 0 && s.shape == std::vector<int64_t>{r, c / 32};
  bool const blocks = s.shape == std::vector<int64_t>{ceil_div(r, 32), ceil_div(c, 32)};
  if (per_row && (engram || !blocks)) {
    rep.kinds[wi] = TensorKind::kEngramFp8Table;
    rep.kinds[static_cast<size_t>(si)] = TensorKind::kEngramScale;
    rep.engram_fp8_params += r * c;
    rep.engram_fp8_bytes += w.nbytes + s.nbytes;
    return {};
  }
  if (!blocks)
    return malformed("tensor '" + s.name + "' should be [" + std::to_string(ceil_div(r, 32)) + ", " +
                     std::to_string(ceil_div(c, 32)) + "] (32x32 blocks of '" + w.name + "' " + dims(w.shape) +
                     "), is " + dims(s.shape));
  rep.kinds[wi] = TensorKind::kFp8Weight;
  rep.kinds[static_cast<size_t>(si)] = TensorKind::kFp8Scale;
  rep.fp8_params += r * c;
  rep.fp8_bytes += w.nbytes + s.nbytes;
  return {};
}

}  // namespace

Result<LayoutReport> detect_layout(std::vector<TensorInfo> const& ts) {
  LayoutReport rep;
  rep.kinds.assign(ts.size(), TensorKind::kDense);
  rep.num_tensors = ts.size();
  Index idx(ts);
  for (size_t i = 0; i < ts.size(); ++i) {
    rep.total_bytes += ts[i].nbytes;
    if (ends_with(ts[i].name, ".trellis")) TESSERA_TRY(exl3_group(ts, idx, i, rep));
  }
  for (size_t i = 0; i < ts.size(); ++i)
    if (ends_with(ts[i].name, ".weight") && rep.kinds[i] == TensorKind::kDense) TESSERA_TRY(scaled_weight(ts, idx, i, rep));
  std::sort(rep.exl3_groups.begin(), rep.exl3_groups.end(), [](auto const& a, auto const& b) { return a.prefix < b.prefix; });

  double wsum = 0, bsum = 0, osum = 0;
  for (auto const& g : rep.exl3_groups) {
    double const w = static_cast<double>(g.in_features) * static_cast<double>(g.out_features);
    wsum += w;
    bsum += g.bits * w;
    osum += g.bits_with_scales * w;
    rep.exl3_params += g.in_features * g.out_features;
    rep.exl3_bytes += g.trellis_bytes + g.overhead_bytes;
  }
  if (wsum > 0) {
    rep.exl3_avg_bits = bsum / wsum;
    rep.exl3_avg_bits_with_scales = osum / wsum;
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    if (rep.kinds[i] != TensorKind::kDense) continue;
    rep.dense_params += numel(ts[i]) * (ts[i].dtype == DType::kF4E2m1x2 ? 2 : 1);
    rep.dense_bytes += ts[i].nbytes;
    rep.dense_dtypes[std::string(dtype_name(ts[i].dtype))] += 1;
  }
  bool const native = rep.fp8_params > 0 || rep.fp4_params > 0;
  bool const exl3 = !rep.exl3_groups.empty();
  rep.layout = native && exl3 ? WeightLayout::kMixed
               : exl3         ? WeightLayout::kExl3
               : native       ? WeightLayout::kNativeFp8
                              : WeightLayout::kDense;
  return rep;
}

Result<LayoutReport> detect_layout(Checkpoint const& ck) {
  auto rep = detect_layout(ck.tensors());
  if (!rep) return rep;
  for (auto& g : rep->exl3_groups) {
    if (g.codebook == Exl3Codebook::k3Inst) continue;
    bool const mcg = g.codebook == Exl3Codebook::kMcg;
    auto v = ck.view(g.prefix + (mcg ? ".mcg" : ".mul1"));
    if (!v) return v.status();
    int32_t value = 0;
    std::memcpy(&value, v->data, 4);
    g.marker_value_ok = static_cast<uint32_t>(value) == (mcg ? 0xCBAC1FEDu : 0x83DCD12Du);
  }
  return rep;
}

}  // namespace tessera::io

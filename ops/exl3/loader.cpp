// SPDX-License-Identifier: Apache-2.0
/// EXL3 group detection and validation (spec/exl3.md §1.1 loader checklist, §1.2 legacy signs, §1.3
/// quantization_config). Validates every shape and dtype before copying the scales.
#include <algorithm>
#include <boost/json.hpp>
#include <map>
#include <set>

#include "tessera/io/safetensors.hpp"
#include "tessera/ops/exl3_loader.hpp"

namespace tessera::ops {

namespace {

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

std::string dims_str(AnyTensorView const& v) { return shape_to_string(v.dims()); }

Status bad(std::string const& tensor, std::string const& what) { return malformed("EXL3 tensor '" + tensor + "': " + what); }

/// fp16 scales [len] from `P.<h>` (F16) or legacy `P.<packed>` (I16 [len/16]).
Status read_scales(Exl3TensorSource const& src, std::set<std::string> const& names, std::string const& prefix,
                   char const* h, char const* packed, int64_t len, std::vector<uint16_t>& out, bool& legacy) {
  std::string const hn = prefix + "." + h, pn = prefix + "." + packed;
  if (names.count(hn)) {
    auto v = src.view(hn);
    if (!v.ok()) return bad(hn, v.status().message());
    if (v->dtype != DType::kF16 || v->rank != 1 || v->shape[0] != len)
      return bad(hn, "expected F16 [" + std::to_string(len) + "], found " + std::string(dtype_name(v->dtype)) + " " +
                         dims_str(*v));
    auto const* p = static_cast<uint16_t const*>(v->data);
    out.assign(p, p + len);
    return {};
  }
  if (names.count(pn)) {
    auto v = src.view(pn);
    if (!v.ok()) return bad(pn, v.status().message());
    if (v->dtype != DType::kI16 || v->rank != 1 || v->shape[0] * 16 != len)
      return bad(pn, "expected packed signs I16 [" + std::to_string(len / 16) + "], found " +
                         std::string(dtype_name(v->dtype)) + " " + dims_str(*v));
    auto const* p = static_cast<uint16_t const*>(v->data);
    out.resize(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) out[i] = exl3::legacy_sign_f16(p[i / 16], static_cast<int>(i % 16));
    legacy = true;
    return {};
  }
  return malformed("EXL3 group '" + prefix + "': missing " + hn + " (or legacy " + pn + ")");
}

Status read_marker(Exl3TensorSource const& src, std::string const& name, uint32_t expect) {
  auto v = src.view(name);
  if (!v.ok()) return bad(name, v.status().message());
  if ((v->dtype != DType::kI32 && v->dtype != DType::kU32) || v->numel() != 1 || v->rank > 1)
    return bad(name, "codebook marker must be an I32 scalar, found " + std::string(dtype_name(v->dtype)) + " " +
                         dims_str(*v));
  uint32_t value = *static_cast<uint32_t const*>(v->data);
  if (value != expect)
    return not_supported("EXL3 tensor '" + name + "': marker value " + std::to_string(value) +
                         " is not the v1.4.1 multiplier " + std::to_string(expect) +
                         " (pre-October-2025 experimental checkpoints are unsupported)");
  return {};
}

Result<Exl3Group> load_group(Exl3TensorSource const& src, std::set<std::string> const& names, std::string const& prefix,
                             Exl3LoadOptions const& opt) {
  Exl3Group g;
  g.prefix = prefix;
  g.expert = exl3_expert_index(prefix);
  std::string const tn = prefix + ".trellis";
  auto tv = src.view(tn);
  if (!tv.ok()) return bad(tn, tv.status().message());
  AnyTensorView const& t = *tv;
  if (t.dtype != DType::kI16 || t.rank != 3)
    return bad(tn, "expected I16 rank 3 [k/16, n/16, 16*K], found " + std::string(dtype_name(t.dtype)) + " " + dims_str(t));
  int64_t const last = t.shape[2];
  bool const mcg = names.count(prefix + ".mcg") > 0, mul1 = names.count(prefix + ".mul1") > 0;
  if (mcg && mul1) return bad(prefix + ".mcg", "both the mcg and the mul1 marker are present");
  g.desc.codebook = mcg ? exl3::Codebook::kMcg : mul1 ? exl3::Codebook::kMul1 : exl3::Codebook::k3Inst;
  if (last % 16 == 0 && last >= 16 && last <= 128) {
    g.desc.k2 = static_cast<int>(last / 8);
  } else if (last % 16 == 8 && last >= 24 && last <= 56) {
    if (!mul1) return bad(tn, "half-integer rate (last dim " + std::to_string(last) + ") without the mul1 marker");
    if (!opt.allow_half_rates)
      return not_supported("EXL3 tensor '" + tn + "': half-integer rate " + std::to_string(last / 16.0) +
                           " bits (last dim " + std::to_string(last) +
                           ") has an unverified layout (spec/exl3.md §2.6); refused");
    g.desc.k2 = static_cast<int>(last / 8);
  } else {
    return bad(tn, "last dim " + std::to_string(last) + " is not 16*K for K = 1..8");
  }
  g.desc.k = 16 * t.shape[0];
  g.desc.n = 16 * t.shape[1];
  if (g.desc.k % 128 || g.desc.n % 128 || g.desc.k <= 0 || g.desc.n <= 0)
    return bad(tn, "shape " + dims_str(t) + " gives k = " + std::to_string(g.desc.k) + ", n = " +
                       std::to_string(g.desc.n) + ", not multiples of 128");
  if (!t.data) return bad(tn, "no data");
  g.trellis = t;
  if (mcg) TESSERA_TRY(read_marker(src, prefix + ".mcg", exl3::kMulMcg));
  if (mul1) TESSERA_TRY(read_marker(src, prefix + ".mul1", exl3::kMulMul1));
  bool lu = false, lv = false;
  TESSERA_TRY(read_scales(src, names, prefix, "suh", "su", g.desc.k, g.suh, lu));
  TESSERA_TRY(read_scales(src, names, prefix, "svh", "sv", g.desc.n, g.svh, lv));
  g.legacy_signs = lu || lv;
  std::string const bn = prefix + ".bias";
  if (names.count(bn)) {
    auto b = src.view(bn);
    if (!b.ok()) return bad(bn, b.status().message());
    if (b->rank != 1 || b->shape[0] != g.desc.n ||
        (b->dtype != DType::kF16 && b->dtype != DType::kF32 && b->dtype != DType::kBf16))
      return bad(bn, "expected F16/F32/BF16 [" + std::to_string(g.desc.n) + "], found " +
                         std::string(dtype_name(b->dtype)) + " " + dims_str(*b));
    g.bias.resize(static_cast<size_t>(g.desc.n));
    for (int64_t j = 0; j < g.desc.n; ++j)
      g.bias[j] = b->dtype == DType::kF16 ? static_cast<uint16_t const*>(b->data)[j]
                                          : f16_bits_from_float(load_as_float(b->data, b->dtype, static_cast<size_t>(j)));
  }
  return g;
}

}  // namespace

Exl3TensorSource exl3_source(io::SafetensorsFile const& file) {
  Exl3TensorSource s;
  for (auto const& t : file.tensors()) s.names.push_back(t.name);
  s.view = [&file](std::string const& name) { return file.view(name); };
  return s;
}

Exl3TensorSource exl3_source(io::Checkpoint const& ckpt) {
  Exl3TensorSource s;
  for (auto const& t : ckpt.tensors()) s.names.push_back(t.name);
  s.view = [&ckpt](std::string const& name) { return ckpt.view(name); };
  return s;
}

int exl3_expert_index(std::string_view prefix) {
  std::string_view const key = ".experts.";
  size_t pos = prefix.find(key);
  if (pos == std::string_view::npos) return -1;
  size_t i = pos + key.size();
  int e = 0, digits = 0;
  while (i < prefix.size() && prefix[i] >= '0' && prefix[i] <= '9' && digits < 9) e = e * 10 + (prefix[i++] - '0'), ++digits;
  if (digits == 0 || (i < prefix.size() && prefix[i] != '.')) return -1;
  return e;
}

Result<std::vector<Exl3Group>> load_exl3_groups(Exl3TensorSource const& src, Exl3LoadOptions const& opt) {
  if (!src.view) return invalid_argument("EXL3 loader: tensor source has no view function");
  std::set<std::string> names(src.names.begin(), src.names.end());
  std::set<std::string> prefixes;
  for (auto const& nm : names)
    if (ends_with(nm, ".trellis")) prefixes.insert(nm.substr(0, nm.size() - 8));
  // Parts of a group whose trellis is missing: a truncated or mis-merged checkpoint.
  for (auto const& nm : names)
    for (char const* part : {".suh", ".svh", ".su", ".sv", ".mcg", ".mul1"})
      if (ends_with(nm, part) && !prefixes.count(nm.substr(0, nm.size() - std::string_view(part).size())))
        return malformed("EXL3 tensor '" + nm + "' has no matching '" +
                         nm.substr(0, nm.size() - std::string_view(part).size()) + ".trellis'");
  std::vector<Exl3Group> out;
  out.reserve(prefixes.size());
  for (auto const& p : prefixes) {
    auto g = load_group(src, names, p, opt);
    if (!g.ok()) return g.status();
    out.push_back(std::move(g).value());
  }
  return out;
}

Result<Exl3QuantConfig> parse_exl3_quant_config(std::string_view config_json) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(config_json, ec);
  if (ec) return malformed("config.json: " + ec.message());
  if (!v.is_object()) return malformed("config.json: top level is not an object");
  auto const* qc = v.as_object().if_contains("quantization_config");
  if (!qc) return not_found("config.json has no quantization_config");
  if (!qc->is_object()) return malformed("config.json: quantization_config is not an object");
  auto const& o = qc->as_object();
  Exl3QuantConfig c;
  auto str = [&](char const* key, std::string& dst) -> Status {
    if (auto const* f = o.if_contains(key)) {
      if (!f->is_string()) return malformed(std::string("quantization_config.") + key + " is not a string");
      dst = std::string(f->as_string());
    }
    return {};
  };
  TESSERA_TRY(str("quant_method", c.quant_method));
  if (c.quant_method != "exl3") return malformed("quantization_config.quant_method is '" + c.quant_method + "', not 'exl3'");
  TESSERA_TRY(str("version", c.version));
  TESSERA_TRY(str("codebook", c.codebook));
  TESSERA_TRY(str("out_scales", c.out_scales));
  if (auto const* b = o.if_contains("bits")) {
    if (!b->is_number()) return malformed("quantization_config.bits is not a number");
    c.bits = b->to_number<double>();
  }
  if (auto const* h = o.if_contains("head_bits")) {
    if (!h->is_number()) return malformed("quantization_config.head_bits is not a number");
    c.head_bits = h->to_number<int>();
  }
  if (!c.codebook.empty() && c.codebook != "mul1" && c.codebook != "mcg" && c.codebook != "3inst")
    return malformed("quantization_config.codebook '" + c.codebook + "' is not mul1, mcg or 3inst");
  return c;
}

}  // namespace tessera::ops

// SPDX-License-Identifier: Apache-2.0
/// `tessera inspect <checkpoint dir or file> [--json]`: the parsed DeepSeek-V4.1 config (when config.json is
/// present), every tensor (name, dtype, shape, bytes, classification), the detected weight layout, each EXL3
/// group's K and bits per weight, and totals. Text by default; `--json` prints one JSON document.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "servers/cli/command.hpp"
#include "tessera/io/layout.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/config.hpp"

namespace tessera::cli {

namespace {

namespace json = boost::json;
namespace fs = std::filesystem;

std::string shape_str(std::vector<int64_t> const& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}
std::string dtype_str(DType t) {
  std::string s(io::safetensors_dtype_string(t));
  return t == DType::kF4E2m1x2 ? s + "(packed)" : s;
}
std::string human_bytes(double b) {
  char const* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}
/// A JSON value for reading: like serialize(), but numbers in their shortest round-trip decimal form.
std::string fmt_value(json::value const& v) {
  switch (v.kind()) {
    case json::kind::double_: {
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, v.get_double());
      return std::string(buf, r.ptr);
    }
    case json::kind::array: {
      std::string s = "[";
      for (auto const& e : v.get_array()) s += (s.size() > 1 ? ", " : "") + fmt_value(e);
      return s + "]";
    }
    case json::kind::object: {
      std::string s = "{";
      for (auto const& kv : v.get_object())
        s += (s.size() > 1 ? ", " : "") + std::string(kv.key()) + ": " + fmt_value(kv.value());
      return s + "}";
    }
    default: return json::serialize(v);
  }
}

/// The tensor's kind; for a trellis also its group's K and codebook (groups are sorted by prefix).
std::string kind_str(io::TensorKind k, std::string const& name, io::LayoutReport const& rep) {
  std::string s = io::to_string(k);
  if (k == io::TensorKind::kExl3Trellis) {
    std::string p = name.substr(0, name.size() - std::string_view(".trellis").size());
    auto it = std::lower_bound(rep.exl3_groups.begin(), rep.exl3_groups.end(), p,
                               [](io::Exl3Group const& g, std::string const& x) { return g.prefix < x; });
    if (it != rep.exl3_groups.end() && it->prefix == p) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " K=%g %s", it->bits, io::to_string(it->codebook));
      s += buf;
    }
  }
  return s;
}

/// The config folder's config.json: parsed, or why not ("" and no error when there is none).
struct ConfigInfo {
  std::string path;
  std::optional<model::dsv41::Config> config;
  std::string error;
};
ConfigInfo read_config(std::string const& dir) {
  ConfigInfo ci;
  fs::path p = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return ci;
  ci.path = p.string();
  auto r = model::dsv41::load_config(ci.path);
  if (r.ok())
    ci.config = std::move(*r);
  else
    ci.error = r.status().to_string();
  return ci;
}

json::object totals_json(io::LayoutReport const& rep) {
  json::object t;
  t["tensors"] = rep.num_tensors;
  t["bytes"] = rep.total_bytes;
  t["dense_params"] = rep.dense_params;
  t["dense_bytes"] = rep.dense_bytes;
  json::object dd;
  for (auto const& [k, v] : rep.dense_dtypes) dd[k] = v;
  t["dense_dtypes"] = std::move(dd);
  t["fp8_params"] = rep.fp8_params;
  t["fp8_bytes"] = rep.fp8_bytes;
  t["fp4_params"] = rep.fp4_params;
  t["fp4_bytes"] = rep.fp4_bytes;
  t["engram_fp8_params"] = rep.engram_fp8_params;
  t["engram_fp8_bytes"] = rep.engram_fp8_bytes;
  t["exl3_groups"] = rep.exl3_groups.size();
  t["exl3_params"] = rep.exl3_params;
  t["exl3_bytes"] = rep.exl3_bytes;
  t["exl3_avg_bits"] = rep.exl3_avg_bits;
  t["exl3_avg_bits_with_scales"] = rep.exl3_avg_bits_with_scales;
  return t;
}

int print_json(std::string const& path, io::Checkpoint const& ck, ConfigInfo const& ci,
               Result<io::LayoutReport> const& rep) {
  json::object doc;
  doc["checkpoint"] = path;
  doc["directory"] = ck.directory();
  json::array files;
  for (auto const& f : ck.files()) {
    json::object fo;
    fo["path"] = f.path();
    fo["bytes"] = f.file_size();
    fo["tensors"] = f.tensors().size();
    json::object md;
    for (auto const& [k, v] : f.metadata()) md[k] = v;
    fo["metadata"] = std::move(md);
    files.push_back(std::move(fo));
  }
  doc["files"] = std::move(files);
  if (ci.config)
    doc["config"] = json::parse(model::dsv41::to_json(*ci.config));
  else
    doc["config"] = nullptr;
  if (!ci.path.empty()) doc["config_path"] = ci.path;
  if (!ci.error.empty()) doc["config_error"] = ci.error;
  if (rep.ok()) {
    doc["layout"] = io::to_string(rep->layout);
  } else {
    doc["layout"] = nullptr;
    doc["layout_error"] = rep.status().to_string();
  }
  json::array tensors;
  for (size_t i = 0; i < ck.tensors().size(); ++i) {
    auto const& t = ck.tensors()[i];
    json::object to;
    to["name"] = t.name;
    to["dtype"] = io::safetensors_dtype_string(t.dtype);
    json::array sh;
    for (int64_t d : t.shape) sh.push_back(d);
    to["shape"] = std::move(sh);
    to["bytes"] = t.nbytes;
    to["kind"] = rep.ok() ? io::to_string(rep->kinds[i]) : "unknown";
    if (ck.files().size() > 1) to["file"] = fs::path(t.file).filename().string();
    tensors.push_back(std::move(to));
  }
  doc["tensors"] = std::move(tensors);
  if (rep.ok()) {
    json::array groups;
    for (auto const& g : rep->exl3_groups) {
      json::object go;
      go["prefix"] = g.prefix;
      go["in_features"] = g.in_features;
      go["out_features"] = g.out_features;
      go["K"] = g.bits;
      go["codebook"] = io::to_string(g.codebook);
      go["half_rate_unverified"] = g.half_rate_unverified;
      go["legacy_signs"] = g.legacy_signs;
      go["bias"] = g.has_bias;
      go["bits_with_scales"] = g.bits_with_scales;
      go["marker_value_ok"] = g.marker_value_ok;
      groups.push_back(std::move(go));
    }
    doc["exl3_groups"] = std::move(groups);
    doc["totals"] = totals_json(*rep);
  }
  std::printf("%s\n", json::serialize(doc).c_str());
  return rep.ok() && ci.error.empty() ? 0 : 1;
}

int print_text(std::string const& path, io::Checkpoint const& ck, ConfigInfo const& ci,
               Result<io::LayoutReport> const& rep) {
  std::printf("checkpoint: %s\n", path.c_str());
  for (auto const& f : ck.files()) {
    std::printf("file: %s (%s, %zu tensors)\n", f.path().c_str(), human_bytes(static_cast<double>(f.file_size())).c_str(),
                f.tensors().size());
    for (auto const& [k, v] : f.metadata())
      std::printf("  metadata %s = %s\n", k.c_str(), v.size() > 120 ? (v.substr(0, 117) + "...").c_str() : v.c_str());
  }
  if (ci.config) {
    std::printf("config: %s (model_type %s)\n", ci.path.c_str(), ci.config->model_type.c_str());
    auto cfg = json::parse(model::dsv41::to_json(*ci.config)).as_object();
    for (auto const& kv : cfg) {
      if (kv.key() == "model_type") continue;
      std::printf("  %-30s %s\n", std::string(kv.key()).c_str(), fmt_value(kv.value()).c_str());
    }
  } else if (!ci.error.empty()) {
    std::printf("config: %s: %s\n", ci.path.c_str(), ci.error.c_str());
  } else {
    std::printf("config: none (no config.json in %s)\n", ck.directory().c_str());
  }
  if (rep.ok())
    std::printf("layout: %s\n", io::to_string(rep->layout));
  else
    std::printf("layout: error: %s\n", rep.status().to_string().c_str());
  std::printf("tensors: %zu\n", ck.tensors().size());
  size_t w = 4;
  for (auto const& t : ck.tensors()) w = std::max(w, t.name.size());
  for (size_t i = 0; i < ck.tensors().size(); ++i) {
    auto const& t = ck.tensors()[i];
    std::string kind = rep.ok() ? kind_str(rep->kinds[i], t.name, *rep) : "unknown";
    std::printf("  %-*s %-12s %-20s %12zu  %s\n", static_cast<int>(w), t.name.c_str(), dtype_str(t.dtype).c_str(),
                shape_str(t.shape).c_str(), t.nbytes, kind.c_str());
  }
  if (!rep.ok()) return 1;
  if (!rep->exl3_groups.empty()) {
    std::printf("exl3 groups: %zu\n", rep->exl3_groups.size());
    for (auto const& g : rep->exl3_groups)
      std::printf("  %-*s k=%-6lld n=%-6lld K=%-4g %-6s bpw(with scales)=%.4f%s%s%s%s\n", static_cast<int>(w),
                  g.prefix.c_str(), static_cast<long long>(g.in_features), static_cast<long long>(g.out_features),
                  g.bits, io::to_string(g.codebook), g.bits_with_scales, g.has_bias ? " bias" : "",
                  g.legacy_signs ? " legacy-signs" : "", g.half_rate_unverified ? " half-rate-unverified" : "",
                  g.marker_value_ok ? "" : " unsupported-marker-value");
  }
  std::printf("totals: %zu tensors, %s\n", rep->num_tensors, human_bytes(static_cast<double>(rep->total_bytes)).c_str());
  std::string dd;
  for (auto const& [k, v] : rep->dense_dtypes) dd += (dd.empty() ? "" : ", ") + k + ": " + std::to_string(v);
  std::printf("  dense: %lld params, %s (%s)\n", static_cast<long long>(rep->dense_params),
              human_bytes(static_cast<double>(rep->dense_bytes)).c_str(), dd.c_str());
  if (rep->fp8_params)
    std::printf("  fp8: %lld params, %s\n", static_cast<long long>(rep->fp8_params), human_bytes(static_cast<double>(rep->fp8_bytes)).c_str());
  if (rep->fp4_params)
    std::printf("  fp4: %lld params, %s\n", static_cast<long long>(rep->fp4_params), human_bytes(static_cast<double>(rep->fp4_bytes)).c_str());
  if (rep->engram_fp8_params)
    std::printf("  engram fp8: %lld params, %s\n", static_cast<long long>(rep->engram_fp8_params),
                human_bytes(static_cast<double>(rep->engram_fp8_bytes)).c_str());
  if (!rep->exl3_groups.empty())
    std::printf("  exl3: %zu groups, %lld weights, %s, average K %.4f bpw (%.4f with scales)\n", rep->exl3_groups.size(),
                static_cast<long long>(rep->exl3_params), human_bytes(static_cast<double>(rep->exl3_bytes)).c_str(),
                rep->exl3_avg_bits, rep->exl3_avg_bits_with_scales);
  return ci.error.empty() ? 0 : 1;
}

}  // namespace

int cmd_inspect(std::vector<std::string> const& args) {
  ArgParser ap(args, {}, {"json"});
  if (!ap.error().empty() || ap.positionals().size() != 1) {
    std::fprintf(stderr, "%s\nusage: tessera inspect <checkpoint dir or file> [--json]\n", ap.error().c_str());
    return 2;
  }
  std::string const path = ap.positionals()[0];
  auto ck = io::Checkpoint::open(path);
  if (!ck) {
    std::fprintf(stderr, "tessera inspect: %s\n", ck.status().to_string().c_str());
    return 1;
  }
  ConfigInfo ci = read_config(ck->directory());
  auto rep = io::detect_layout(*ck);
  return ap.has("json") ? print_json(path, *ck, ci, rep) : print_text(path, *ck, ci, rep);
}

}  // namespace tessera::cli

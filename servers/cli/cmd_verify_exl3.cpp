// SPDX-License-Identifier: Apache-2.0
/// `tessera verify exl3 --fixtures DIR`: the EXL3 test ladder of spec/exl3.md §7.4 on the golden fixtures
/// (DIR/manifest.json and its safetensors files), against Tessera's CPU reference:
///   1. codebook tables for all 65536 states, the tile permutation, H128 and the worked examples;
///   2. trellis states of every tile (bitwise);  3. decoded W' (bitwise, and its sha256);
///   4. xh (bitwise);  5. the fp16/fp32 epilogues fed the golden acc (bitwise), + bias where present;
///   6. the full layer against y_ideal within the §7.4 bounds, and the dense weight against w_dense;
///   7. the loader on each file as a checkpoint: group found, codebook, K from shape, k, n; half-rate
///      groups refused by default (§2.6) and accepted on request; malformed variants rejected naming the
///      tensor.
/// Exits 0 only when every check passes; the last line is `exl3: <passed>/<total> fixtures bit-exact,
/// <checks> checks`.
#include <array>
#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "servers/cli/command.hpp"
#include "servers/openai/http/sha256.hpp"
#include "tessera/core/config.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/ops/exl3_loader.hpp"
#include "tessera/ref/exl3_ref.hpp"

namespace tessera::cli {

namespace {

/// SHA-256 (FIPS 180-4) of a byte buffer, lower-case hex; used for the manifest's w_inner_sha256.
std::string sha256_hex(void const* data, size_t len) {
  server::Sha256 h;
  h.update(data, len);
  return server::to_hex(h.final());
}

/// Counts checks and records the first failures with their context.
struct Ladder {
  int checks = 0, failed = 0;
  bool fixture_ok = true;
  std::vector<std::string> notes;
  void check(bool ok, std::string const& what) {
    ++checks;
    if (!ok) {
      ++failed;
      fixture_ok = false;
      std::printf("  FAIL %s\n", what.c_str());
    }
  }
};

/// Bytes of a tensor, or an empty span (and a failed check) when it is missing.
std::vector<char> bytes_of(io::SafetensorsFile const& f, std::string const& name, Ladder& L) {
  auto v = f.view(name);
  if (!v.ok()) {
    L.check(false, "missing tensor " + name + ": " + v.status().message());
    return {};
  }
  auto const* p = static_cast<char const*>(v->data);
  return std::vector<char>(p, p + v->nbytes());
}

template <class T>
std::vector<T> as_vec(std::vector<char> const& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

bool same_bytes(void const* a, std::vector<char> const& b, size_t n) {
  return b.size() == n && std::memcmp(a, b.data(), n) == 0;
}

void check_tables(io::SafetensorsFile const& f, Ladder& L) {
  using exl3::Codebook;
  std::pair<char const*, Codebook> const cbs[] = {
      {"codebook.3inst", Codebook::k3Inst}, {"codebook.mcg", Codebook::kMcg}, {"codebook.mul1", Codebook::kMul1}};
  for (auto const& [name, cb] : cbs) {
    auto t = ref::exl3_codebook_table(cb);
    L.check(same_bytes(t.data(), bytes_of(f, name, L), t.size() * 2), std::string(name) + ": all 65536 states");
  }
  std::vector<int32_t> perm(256);
  for (int p = 0; p < 256; ++p) perm[p] = exl3::tile_row(p) * 16 + exl3::tile_col(p);
  L.check(same_bytes(perm.data(), bytes_of(f, "tile.pos_to_rc", L), 1024), "tile.pos_to_rc");
  std::vector<int8_t> had(128 * 128);
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j) had[i * 128 + j] = (__builtin_popcount(i & j) & 1) ? -1 : 1;
  L.check(same_bytes(had.data(), bytes_of(f, "hadamard128", L), had.size()), "hadamard128");
  for (int k : {3, 4}) {
    std::string pre = "example.k" + std::to_string(k);
    uint16_t codes[256], words[64], st[256];
    for (int p = 0; p < 256; ++p) codes[p] = static_cast<uint16_t>(p & ((1 << k) - 1));
    exl3::pack_tile(codes, 2 * k, words);
    L.check(same_bytes(words, bytes_of(f, pre + ".trellis", L), size_t(32) * k), pre + ".trellis (pack)");
    ref::exl3_tile_states(reinterpret_cast<int16_t const*>(words), 2 * k, st);
    L.check(same_bytes(st, bytes_of(f, pre + ".states", L), 512), pre + ".states");
  }
}

/// A source restricted to the tensors of one group (for refusal/malformed checks).
ops::Exl3TensorSource group_source(ops::Exl3TensorSource const& all, std::string const& prefix, std::string const& drop) {
  ops::Exl3TensorSource s;
  s.view = all.view;
  for (auto const& n : all.names)
    if (n.rfind(prefix + ".", 0) == 0 && n != drop) s.names.push_back(n);
  return s;
}

void check_fixture(io::SafetensorsFile const& f, boost::json::object const& fx, ops::Exl3Group const* g,
                   ops::Exl3TensorSource const& src, Ladder& L) {
  std::string const P(fx.at("prefix").as_string());
  int64_t const k = fx.at("k").to_number<int64_t>(), n = fx.at("n").to_number<int64_t>();
  int64_t const m = fx.at("m").to_number<int64_t>();
  double const bits = fx.at("bits").to_number<double>();
  std::string const cbname(fx.at("codebook").as_string());
  bool const half = fx.at("half_rate_unverified").as_bool();
  std::string const tag = P + " " + std::to_string(k) + "x" + std::to_string(n) + ": ";
  // 7. loader detection.
  L.check(g != nullptr, tag + "loader finds the group");
  if (!g) return;
  auto const want_cb = cbname == "mul1" ? exl3::Codebook::kMul1 : cbname == "mcg" ? exl3::Codebook::kMcg : exl3::Codebook::k3Inst;
  L.check(g->desc.codebook == want_cb && g->desc.k2 == static_cast<int>(std::lround(2 * bits)) && g->desc.k == k &&
              g->desc.n == n,
          tag + "loader: codebook, K from shape, k, n");
  {
    auto r = ops::load_exl3_groups(group_source(src, P, ""));
    bool const refused = !r.ok() && r.status().code() == StatusCode::kNotSupported &&
                         r.status().message().find(P + ".trellis") != std::string::npos;
    L.check(half ? refused : r.ok(), tag + (half ? "loader refuses the unverified half rate by default" : "loader accepts by default"));
    ops::Exl3LoadOptions allow;
    allow.allow_half_rates = true;
    auto bad = ops::load_exl3_groups(group_source(src, P, P + ".svh"), allow);
    L.check(!bad.ok() && bad.status().message().find(P + ".svh") != std::string::npos, tag + "loader names a missing svh");
  }
  ref::Exl3HostLayer const layer = g->host();
  // 2. states.
  std::string const G = "golden." + P + ".";
  if (f.contains(G + "states")) {
    std::vector<uint16_t> st(static_cast<size_t>((k / 16) * (n / 16) * 256));
    for (int64_t t = 0; t < (k / 16) * (n / 16); ++t)
      ref::exl3_tile_states(layer.trellis + t * layer.words_per_tile(), layer.k2, st.data() + t * 256);
    L.check(same_bytes(st.data(), bytes_of(f, G + "states", L), st.size() * 2), tag + "states of every tile");
  }
  // 3. W'.
  std::vector<uint16_t> w = ref::exl3_decode_inner(layer);
  if (f.contains(G + "w_inner")) {
    L.check(same_bytes(w.data(), bytes_of(f, G + "w_inner", L), w.size() * 2), tag + "decoded W' bitwise");
  } else {
    auto idx = as_vec<int32_t>(bytes_of(f, G + "w_inner_row_idx", L));
    auto rows = bytes_of(f, G + "w_inner_rows", L);
    bool ok = rows.size() == idx.size() * static_cast<size_t>(n) * 2;
    for (size_t i = 0; ok && i < idx.size(); ++i)
      ok = std::memcmp(w.data() + idx[i] * n, rows.data() + i * n * 2, static_cast<size_t>(n) * 2) == 0;
    L.check(ok, tag + "decoded W' sampled rows bitwise");
  }
  L.check(sha256_hex(w.data(), w.size() * 2) == std::string(fx.at("w_inner_sha256").as_string()), tag + "W' sha256");
  // 4. xh.
  auto x = as_vec<uint16_t>(bytes_of(f, G + "x", L));
  if (x.size() != static_cast<size_t>(m * k)) { L.check(false, tag + "x has shape [m, k]"); return; }
  std::vector<uint16_t> xh(x.size());
  ref::exl3_input_transform(x.data(), m, k, layer.suh, xh.data());
  L.check(same_bytes(xh.data(), bytes_of(f, G + "xh", L), xh.size() * 2), tag + "xh bitwise");
  // 5. epilogues from the golden acc.
  auto acc = as_vec<float>(bytes_of(f, G + "acc", L));
  if (acc.size() != static_cast<size_t>(m * n)) { L.check(false, tag + "acc has shape [m, n]"); return; }
  std::vector<uint16_t> y16(acc.size());
  std::vector<float> y32(acc.size());
  ref::exl3_epilogue_f16(acc.data(), m, n, layer.svh, y16.data());
  ref::exl3_epilogue_f32(acc.data(), m, n, layer.svh, y32.data());
  L.check(same_bytes(y16.data(), bytes_of(f, G + "y_f16", L), y16.size() * 2), tag + "fp16 epilogue bitwise");
  L.check(same_bytes(y32.data(), bytes_of(f, G + "y_f32", L), y32.size() * 4), tag + "fp32 epilogue bitwise");
  if (layer.bias) {
    ref::exl3_add_bias_f16(y16.data(), m, n, layer.bias);
    L.check(same_bytes(y16.data(), bytes_of(f, G + "y_f16_bias", L), y16.size() * 2), tag + "fp16 + bias bitwise");
  }
  // 6. the whole layer against the float64 ideal (spec §7.4 bounds), and the dense weight.
  ref::Exl3HostLayer nb = layer;
  nb.bias = nullptr;
  std::vector<uint16_t> y(static_cast<size_t>(m * n));
  ref::exl3_forward_f16(nb, x.data(), m, y.data());
  auto ideal = as_vec<float>(bytes_of(f, G + "y_ideal", L));
  if (ideal.size() == y.size()) {
    double se = 0, sr = 0, mx = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      double e = float_from_f16_bits(y[i]) - static_cast<double>(ideal[i]);
      se += e * e;
      sr += static_cast<double>(ideal[i]) * ideal[i];
      mx = std::max(mx, std::abs(e));
    }
    double const rms = std::sqrt(sr / static_cast<double>(y.size()));
    double const rel = sr > 0 ? std::sqrt(se / sr) : 1;
    std::ostringstream os;
    os << tag << "layer vs y_ideal: rel RMS " << rel << " (<= 2e-3), max|err|/RMS " << mx / rms << " (<= 1e-2)";
    L.check(rms > 0 && rel <= 2e-3 && mx <= 1e-2 * rms, os.str());
  } else {
    L.check(false, tag + "y_ideal has shape [m, n]");
  }
  if (f.contains(G + "w_dense")) {
    auto wd = as_vec<float>(bytes_of(f, G + "w_dense", L));
    std::vector<double> ours = ref::exl3_dense_weight(layer, w.data());
    double se = 0, sr = 0;
    for (size_t i = 0; i < wd.size() && i < ours.size(); ++i) {
      se += (ours[i] - wd[i]) * (ours[i] - wd[i]);
      sr += static_cast<double>(wd[i]) * wd[i];
    }
    // w_dense is the float64 product rounded once to fp32: agreement to fp32 rounding (2^-24 relative).
    L.check(wd.size() == ours.size() && sr > 0 && std::sqrt(se / sr) < 1e-7, tag + "dense weight vs w_dense");
  }
}

}  // namespace

int cmd_verify_exl3(std::vector<std::string> const& args) {
  ArgParser p(args, {"fixtures"});
  if (!p.error().empty() || !p.positionals().empty()) {
    std::fprintf(stderr, "usage: tessera verify exl3 [--fixtures DIR]   (default: %s/golden/exl3)\n%s\n",
                 TESSERA_SHARED_DIR, p.error().c_str());
    return 2;
  }
  std::string const dir = p.get_or("fixtures", std::string(TESSERA_SHARED_DIR) + "/golden/exl3");
  std::ifstream in(dir + "/manifest.json");
  if (!in) {
    std::fprintf(stderr, "tessera verify exl3: cannot read %s/manifest.json\n", dir.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  boost::system::error_code ec;
  boost::json::value manifest = boost::json::parse(ss.str(), ec);
  if (ec || !manifest.is_object() || !manifest.as_object().contains("files")) {
    std::fprintf(stderr, "tessera verify exl3: %s/manifest.json is not a fixture manifest\n", dir.c_str());
    return 1;
  }
  Ladder L;
  int passed = 0, total = 0;
  for (auto const& [fname, entry] : manifest.at("files").as_object()) {
    std::string const path = dir + "/" + std::string(fname);
    auto file = io::SafetensorsFile::open(path);
    if (!file.ok()) {
      L.check(false, path + ": " + file.status().message());
      continue;
    }
    auto const& fixtures = entry.at("fixtures").as_array();
    L.check(file->file_size() == entry.at("bytes").to_number<size_t>(), std::string(fname) + ": size matches the manifest");
    if (fixtures.empty()) {
      check_tables(*file, L);
      std::printf("%s: tables checked\n", std::string(fname).c_str());
      continue;
    }
    ops::Exl3TensorSource src = ops::exl3_source(*file);
    ops::Exl3LoadOptions opt;
    opt.allow_half_rates = true;
    auto groups = ops::load_exl3_groups(src, opt);
    L.check(groups.ok(), std::string(fname) + ": loader reads every group" + (groups.ok() ? "" : ": " + groups.status().message()));
    std::map<std::string, ops::Exl3Group const*> by_prefix;
    if (groups.ok())
      for (auto const& g : *groups) by_prefix[g.prefix] = &g;
    L.check(groups.ok() && groups->size() == fixtures.size(), std::string(fname) + ": one group per fixture");
    for (auto const& fv : fixtures) {
      auto const& fx = fv.as_object();
      std::string const prefix(fx.at("prefix").as_string());
      L.fixture_ok = true;
      int const before = L.checks;
      auto it = by_prefix.find(prefix);
      check_fixture(*file, fx, it == by_prefix.end() ? nullptr : it->second, src, L);
      ++total;
      if (L.fixture_ok) ++passed;
      std::printf("%s %s: %s (%d checks)%s\n", std::string(fname).c_str(), prefix.c_str(), L.fixture_ok ? "ok" : "FAILED",
                  L.checks - before, fx.at("half_rate_unverified").as_bool() ? " [half rate: layout unverified]" : "");
    }
  }
  std::printf("exl3: %d/%d fixtures bit-exact, %d checks\n", passed, total, L.checks);
  return (L.failed == 0 && passed == total && total > 0) ? 0 : 1;
}

}  // namespace tessera::cli

// SPDX-License-Identifier: Apache-2.0
/// Teacher-forced retention of a pruned candidate against its base (pruning.hpp): per position
/// KL(p_base ‖ p_cand) = Σ_i p_i (log p_i − log q_i) over log-softmax in fp64, top-1 agreement with the
/// first-index argmax, per-layer routing overlap |ids_b ∩ ids_c| / k (dropped slots count as absent);
/// and the PNG line plot (zlib stored blocks, CRC32 per chunk, Adler32 of the raw scanlines).
#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include <boost/json.hpp>

#include "tessera/models/deepseek_v41/pruning.hpp"

namespace tessera::model::dsv41 {

namespace json = boost::json;

namespace {

struct Taps {
  std::vector<std::vector<float>> ids;  // [layer] rows·k of the current prompt
  explicit Taps(Dsv41Model& m) : m_(m) {
    ids.resize(m.spec().num_layers);
    m.set_debug_tap([this](std::string const& name, std::vector<int64_t> const&, std::span<float const> v) {
      static std::regex const re(R"(model\.layers\.(\d+)\.ffn\.gate\.out1)");
      std::smatch mt;
      if (std::regex_match(name, mt, re)) ids[std::stoul(mt[1])].insert(ids[std::stoul(mt[1])].end(), v.begin(), v.end());
    });
  }
  ~Taps() { m_.set_debug_tap({}); }
  void clear() { for (auto& v : ids) v.clear(); }
  Dsv41Model& m_;
};

Status run_prompt(Dsv41Model& m, std::vector<int32_t> const& p, bool stepwise, std::vector<float>& logits) {
  int64_t V = m.spec().vocab_size;
  logits.assign(p.size() * static_cast<size_t>(V), 0.f);
  auto seq = m.new_sequence();
  size_t c = stepwise ? 1 : p.size();
  for (size_t b = 0; b < p.size(); b += c) {
    size_t e = std::min(p.size(), b + c);
    SequenceStep step{seq.get(), std::span<int32_t const>(p.data() + b, e - b), static_cast<int64_t>(e - b),
                      logits.data() + b * static_cast<size_t>(V)};
    TESSERA_TRY(m.forward({&step, 1}));
  }
  return {};
}

bool decode_scoped(Dsv41Model const& m) {
  return m.pruning().top_p < 1.f && m.pruning().scope == ExpertPruning::Scope::kDecode;
}

}  // namespace

Result<RetentionReport> measure_retention(Dsv41Model& base, Dsv41Model& cand,
                                          std::vector<std::vector<int32_t>> const& prompts,
                                          std::vector<std::vector<int32_t>> const& cand_ids) {
  int64_t V = base.spec().vocab_size, L = base.spec().num_layers;
  if (cand.spec().vocab_size != V || cand.spec().num_layers != L)
    return invalid_argument("retention: base and candidate differ in vocabulary or layer count");
  if (!cand_ids.empty() && static_cast<int64_t>(cand_ids.size()) != L)
    return invalid_argument("retention: candidate expert map needs one row per layer");
  bool stepwise = decode_scoped(base) || decode_scoped(cand);
  RetentionReport r;
  std::vector<double> overlap_sum(L, 0.0);
  std::vector<float> lb, lc;
  std::vector<std::vector<float>> base_ids;
  try {
    for (auto const& p : prompts) {
      {
        Taps t(base);
        TESSERA_TRY(run_prompt(base, p, stepwise, lb));
        base_ids = t.ids;
      }
      Taps t(cand);
      TESSERA_TRY(run_prompt(cand, p, stepwise, lc));
      int64_t kb = base.spec().top_k, kc = cand.spec().top_k;
      for (size_t pos = 0; pos < p.size(); ++pos) {
        float const* a = &lb[pos * V];
        float const* b = &lc[pos * V];
        double ma = *std::max_element(a, a + V), mb = *std::max_element(b, b + V), za = 0, zb = 0;
        for (int64_t i = 0; i < V; ++i) { za += std::exp(a[i] - ma); zb += std::exp(b[i] - mb); }
        double lza = std::log(za), lzb = std::log(zb), kl = 0;
        for (int64_t i = 0; i < V; ++i) {
          double la = a[i] - ma - lza, lq = b[i] - mb - lzb;
          kl += std::exp(la) * (la - lq);
        }
        r.kl.push_back(std::max(0.0, kl));
        r.top1_agree += (std::max_element(a, a + V) - a) == (std::max_element(b, b + V) - b);
        ++r.positions;
        for (int64_t l = 0; l < L; ++l) {
          int64_t inter = 0;
          for (int64_t i = 0; i < kb; ++i) {
            float eb = base_ids[l][pos * kb + i];
            if (eb < 0) continue;
            for (int64_t j = 0; j < kc; ++j) {
              float ec = t.ids[l][pos * kc + j];
              if (ec < 0) continue;
              int32_t mapped = cand_ids.empty() ? static_cast<int32_t>(ec) : cand_ids[l][static_cast<size_t>(ec)];
              inter += mapped == static_cast<int32_t>(eb);
            }
          }
          overlap_sum[l] += static_cast<double>(inter) / static_cast<double>(kb);
        }
      }
    }
  } catch (std::exception const& e) {
    return invalid_argument(std::string("retention: ") + e.what());
  }
  for (int64_t l = 0; l < L; ++l) r.layer_overlap.push_back(r.positions ? overlap_sum[l] / r.positions : 0.0);
  return r;
}

double RetentionReport::kl_mean() const {
  double s = 0;
  for (double v : kl) s += v;
  return kl.empty() ? 0.0 : s / static_cast<double>(kl.size());
}
double RetentionReport::kl_quantile(double q) const {
  if (kl.empty()) return 0.0;
  std::vector<double> v = kl;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}
double RetentionReport::kl_max() const { return kl.empty() ? 0.0 : *std::max_element(kl.begin(), kl.end()); }

std::string RetentionReport::to_text() const {
  std::ostringstream o;
  o.precision(6);
  o << "positions " << positions << "\ntop1_agreement " << agreement() << "\nkl_mean " << kl_mean() << "\nkl_p50 "
    << kl_quantile(0.5) << "\nkl_p99 " << kl_quantile(0.99) << "\nkl_max " << kl_max() << "\nrouting_overlap";
  for (double v : layer_overlap) o << " " << v;
  o << "\n";
  return o.str();
}

std::string RetentionReport::to_json() const {
  json::object o;
  o["positions"] = positions; o["top1_agreement"] = agreement();
  o["kl"] = {{"mean", kl_mean()}, {"p50", kl_quantile(0.5)}, {"p99", kl_quantile(0.99)}, {"max", kl_max()}};
  json::array ov, per;
  for (double v : layer_overlap) ov.push_back(v);
  for (double v : kl) per.push_back(v);
  o["routing_overlap"] = ov; o["kl_per_position"] = per;
  return json::serialize(o) + "\n";
}

namespace {
uint32_t crc32(uint8_t const* p, size_t n, uint32_t c = 0) {
  static auto const table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t v = i;
      for (int k = 0; k < 8; ++k) v = (v & 1) ? 0xEDB88320u ^ (v >> 1) : v >> 1;
      t[i] = v;
    }
    return t;
  }();
  c = ~c;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}
void put32(std::vector<uint8_t>& b, uint32_t v) { for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s)); }
void chunk(std::vector<uint8_t>& out, char const* type, std::vector<uint8_t> const& data) {
  put32(out, static_cast<uint32_t>(data.size()));
  std::vector<uint8_t> td(type, type + 4);
  td.insert(td.end(), data.begin(), data.end());
  out.insert(out.end(), td.begin(), td.end());
  put32(out, crc32(td.data(), td.size()));
}
}  // namespace

Status write_plot_png(std::string const& path, std::vector<double> const& v, int width, int height) {
  if (width < 16 || height < 16) return invalid_argument("plot: image too small");
  std::vector<uint8_t> img(static_cast<size_t>(width) * height, 255);
  double hi = 0;
  for (double x : v) hi = std::max(hi, x);
  if (hi <= 0) hi = 1;
  int const pad = 4, w = width - 2 * pad, h = height - 2 * pad;
  for (int x = pad; x < pad + w; ++x) img[static_cast<size_t>(pad + h) * width + x] = 128;  // x axis
  for (int y = pad; y <= pad + h; ++y) img[static_cast<size_t>(y) * width + pad] = 128;     // y axis
  int py = -1;
  for (int x = 0; x < w && !v.empty(); ++x) {
    size_t i = v.size() == 1 ? 0 : static_cast<size_t>(static_cast<double>(x) * (v.size() - 1) / (w - 1));
    int y = pad + h - static_cast<int>(std::lround(v[i] / hi * h));
    int a = py < 0 ? y : std::min(py, y), b = py < 0 ? y : std::max(py, y);
    for (int yy = a; yy <= b; ++yy) img[static_cast<size_t>(yy) * width + pad + x] = 0;
    py = y;
  }
  std::vector<uint8_t> raw;  // filter byte 0 per scanline
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), img.begin() + static_cast<size_t>(y) * width, img.begin() + static_cast<size_t>(y + 1) * width);
  }
  std::vector<uint8_t> z{0x78, 0x01};
  for (size_t off = 0; off < raw.size() || off == 0; off += 65535) {
    size_t n = std::min<size_t>(65535, raw.size() - off);
    z.push_back(off + n >= raw.size() ? 1 : 0);  // BFINAL, BTYPE = 00 (stored)
    z.push_back(static_cast<uint8_t>(n)); z.push_back(static_cast<uint8_t>(n >> 8));
    z.push_back(static_cast<uint8_t>(~n)); z.push_back(static_cast<uint8_t>((~n) >> 8));
    z.insert(z.end(), raw.begin() + off, raw.begin() + off + n);
    if (off + n >= raw.size()) break;
  }
  uint32_t s1 = 1, s2 = 0;
  for (uint8_t c : raw) { s1 = (s1 + c) % 65521; s2 = (s2 + s1) % 65521; }
  put32(z, (s2 << 16) | s1);
  std::vector<uint8_t> png{0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A}, ihdr;
  put32(ihdr, static_cast<uint32_t>(width)); put32(ihdr, static_cast<uint32_t>(height));
  ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});  // 8-bit grayscale, deflate, filter 0, no interlace
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", {});
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<char const*>(png.data()), static_cast<std::streamsize>(png.size()));
  if (!f) return invalid_argument("plot: cannot write " + path);
  return {};
}

}  // namespace tessera::model::dsv41

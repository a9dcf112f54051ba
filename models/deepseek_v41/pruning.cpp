// SPDX-License-Identifier: Apache-2.0
/// Calibration statistics, static expert pruning of a checkpoint, and teacher-forced retention
/// (see pruning.hpp). KL(p ‖ q) = Σ p_i (log p_i − log q_i) with log-softmax in fp64.
#include "tessera/models/deepseek_v41/pruning.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <boost/json.hpp>

#include "tessera/io/safetensors.hpp"
#include "tessera/models/deepseek_v41/config.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"

namespace tessera::model::dsv41 {

namespace json = boost::json;
namespace fs = std::filesystem;

Result<std::vector<std::vector<int32_t>>> read_prompts(
    std::string const& path, std::function<Result<std::vector<int32_t>>(std::string const&)> const& tokenize) {
  std::ifstream in(path);
  if (!in) return not_found("prompts file " + path + " cannot be opened");
  std::vector<std::vector<int32_t>> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::string where = path + ":" + std::to_string(n);
    boost::system::error_code ec;
    json::value v = json::parse(line, ec);
    if (ec) return invalid_argument(where + ": not JSON (" + ec.message() + ")");
    json::array const* ids = v.if_array();
    if (json::object const* o = v.if_object()) {
      if (auto const* a = o->if_contains("ids")) ids = a->if_array();
      else if (auto const* t = o->if_contains("text"); t && t->is_string()) {
        if (!tokenize) return invalid_argument(where + ": a text prompt needs a tokenizer.json in the model folder");
        auto toks = tokenize(std::string(t->as_string()));
        if (!toks) return toks.status();
        out.push_back(std::move(*toks));
        continue;
      }
    }
    if (!ids) return invalid_argument(where + ": expected [ids...], {\"ids\": [...]} or {\"text\": \"...\"}");
    std::vector<int32_t> p;
    for (auto const& x : *ids) {
      if (!x.is_int64() || x.as_int64() < 0 || x.as_int64() > INT32_MAX)
        return invalid_argument(where + ": token ids must be non-negative integers");
      p.push_back(static_cast<int32_t>(x.as_int64()));
    }
    if (p.empty()) return invalid_argument(where + ": empty prompt");
    out.push_back(std::move(p));
  }
  if (out.empty()) return invalid_argument("prompts file " + path + " holds no prompts");
  return out;
}

std::string RoutingStats::to_json() const {
  json::object o;
  o["format"] = "tessera.routing_stats.v1";
  o["layers"] = layers; o["experts"] = experts; o["top_k"] = top_k; o["tokens"] = tokens;
  json::array c, w;
  for (int64_t l = 0; l < layers; ++l) {
    json::array cl, wl;
    for (int64_t e = 0; e < experts; ++e) { cl.push_back(count[l * experts + e]); wl.push_back(weight[l * experts + e]); }
    c.push_back(std::move(cl)); w.push_back(std::move(wl));
  }
  o["count"] = std::move(c); o["weight"] = std::move(w);
  return json::serialize(o) + "\n";
}

Result<RoutingStats> RoutingStats::from_json(std::string const& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return invalid_argument("routing stats: not a JSON object");
  auto const& o = v.as_object();
  RoutingStats s;
  try {
    s.layers = o.at("layers").to_number<int64_t>(); s.experts = o.at("experts").to_number<int64_t>();
    s.top_k = o.at("top_k").to_number<int64_t>(); s.tokens = o.at("tokens").to_number<int64_t>();
    auto const& c = o.at("count").as_array();
    auto const& w = o.at("weight").as_array();
    if (static_cast<int64_t>(c.size()) != s.layers || static_cast<int64_t>(w.size()) != s.layers)
      return invalid_argument("routing stats: count/weight need one row per layer");
    for (int64_t l = 0; l < s.layers; ++l) {
      auto const& cl = c[l].as_array();
      auto const& wl = w[l].as_array();
      if (static_cast<int64_t>(cl.size()) != s.experts || static_cast<int64_t>(wl.size()) != s.experts)
        return invalid_argument("routing stats: layer " + std::to_string(l) + " needs one entry per expert");
      for (int64_t e = 0; e < s.experts; ++e) {
        s.count.push_back(cl[e].to_number<int64_t>());
        s.weight.push_back(wl[e].to_number<double>());
      }
    }
  } catch (std::exception const& e) {
    return invalid_argument(std::string("routing stats: missing or mistyped field (") + e.what() + ")");
  }
  return s;
}

namespace {
/// Installs a tap collecting per-layer router ids/weights of each forward (ffn.gate.out0/out1).
struct RouteRecorder {
  std::vector<std::vector<float>> ids, weights;  // [layer] → rows·k, of the last forward
  explicit RouteRecorder(Dsv41Model& m) : m_(m) {
    int64_t L = m.spec().num_layers;
    ids.resize(L); weights.resize(L);
    m.set_debug_tap([this](std::string const& name, std::vector<int64_t> const&, std::span<float const> v) {
      static std::regex const re(R"(model\.layers\.(\d+)\.ffn\.gate\.out([01]))");
      std::smatch mt;
      if (!std::regex_match(name, mt, re)) return;
      size_t l = std::stoul(mt[1]);
      auto& dst = mt[2] == "0" ? weights[l] : ids[l];
      dst.insert(dst.end(), v.begin(), v.end());
    });
  }
  void clear() { for (auto& v : ids) v.clear(); for (auto& v : weights) v.clear(); }
  ~RouteRecorder() { m_.set_debug_tap({}); }
  Dsv41Model& m_;
};
}  // namespace

Result<RoutingStats> calibrate(Dsv41Model& m, std::vector<std::vector<int32_t>> const& prompts) {
  ModelSpec const& s = m.spec();
  RoutingStats st;
  st.layers = s.num_layers; st.experts = s.n_experts; st.top_k = s.top_k;
  st.count.assign(st.layers * st.experts, 0);
  st.weight.assign(st.layers * st.experts, 0.0);
  RouteRecorder rec(m);
  for (auto const& p : prompts) {
    rec.clear();
    auto seq = m.new_sequence();
    SequenceStep step{seq.get(), p, 0, nullptr};
    TESSERA_TRY(m.forward({&step, 1}));
    for (int64_t l = 0; l < st.layers; ++l)
      for (size_t i = 0; i < rec.ids[l].size(); ++i) {
        int64_t e = static_cast<int64_t>(rec.ids[l][i]);
        if (e < 0) continue;
        ++st.count[l * st.experts + e];
        st.weight[l * st.experts + e] += rec.weights[l][i];
      }
    st.tokens += static_cast<int64_t>(p.size());
  }
  return st;
}

Result<std::vector<std::vector<int32_t>>> choose_kept_experts(RoutingStats const& s, double keep) {
  if (!(keep > 0.0 && keep <= 1.0)) return invalid_argument("--keep must be in (0, 1]");
  int64_t n = std::llround(keep * static_cast<double>(s.experts));
  if (n < s.top_k)
    return invalid_argument("keeping " + std::to_string(n) + " of " + std::to_string(s.experts) +
                            " experts leaves fewer than num_experts_per_tok " + std::to_string(s.top_k));
  std::vector<std::vector<int32_t>> kept(s.layers);
  for (int64_t l = 0; l < s.layers; ++l) {
    std::vector<int32_t> order(s.experts);
    for (int64_t e = 0; e < s.experts; ++e) order[e] = static_cast<int32_t>(e);
    double const* w = &s.weight[l * s.experts];
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return w[a] > w[b]; });
    kept[l].assign(order.begin(), order.begin() + n);
    std::sort(kept[l].begin(), kept[l].end());
  }
  return kept;
}

std::vector<std::vector<uint8_t>> mask_from_kept(std::vector<std::vector<int32_t>> const& kept, int64_t experts) {
  std::vector<std::vector<uint8_t>> m(kept.size(), std::vector<uint8_t>(experts, 1));
  for (size_t l = 0; l < kept.size(); ++l)
    for (int32_t e : kept[l]) m[l][e] = 0;
  return m;
}

Status write_pruned_checkpoint(std::string const& src_dir, std::vector<std::vector<int32_t>> const& kept,
                               std::string const& out_dir) {
  auto cfg = load_config(src_dir);
  if (!cfg) return cfg.status();
  int64_t L = cfg->num_hidden_layers, E = cfg->n_routed_experts;
  if (static_cast<int64_t>(kept.size()) != L) return invalid_argument("prune: kept sets must cover every layer");
  int64_t n = static_cast<int64_t>(kept[0].size());
  std::vector<std::vector<int32_t>> new_id(L, std::vector<int32_t>(E, -1));
  for (int64_t l = 0; l < L; ++l) {
    if (static_cast<int64_t>(kept[l].size()) != n) return invalid_argument("prune: every layer must keep as many experts");
    for (size_t j = 0; j < kept[l].size(); ++j) {
      if (kept[l][j] < 0 || kept[l][j] >= E || (j && kept[l][j] <= kept[l][j - 1]))
        return invalid_argument("prune: kept ids of layer " + std::to_string(l) + " must ascend within [0, E)");
      new_id[l][kept[l][j]] = static_cast<int32_t>(j);
    }
  }
  fs::path src = fs::is_directory(src_dir) ? fs::path(src_dir) : fs::path(src_dir).parent_path();
  fs::path mf = src / "model.safetensors";
  auto ck = io::Checkpoint::open(fs::exists(mf) ? mf.string() : src.string());
  if (!ck) return ck.status();
  std::error_code fec;
  fs::create_directories(out_dir, fec);
  if (fec) return invalid_argument("prune: cannot create " + out_dir + ": " + fec.message());
  io::SafetensorsWriter w;
  static std::regex const expert_re(R"(model\.layers\.(\d+)\.(ffn|mlp)\.experts\.(\d+)\.(.+))");
  static std::regex const gate_re(
      R"(model\.layers\.(\d+)\.(ffn\.gate\.(bias|bias_vl)|mlp\.gate\.(weight|e_score_correction_bias)|ffn\.gate\.weight))");
  for (auto const& t : ck->tensors()) {
    std::smatch m;
    std::string const& name = t.name;
    if (name.find(".experts.gate_up_proj") != std::string::npos || name.find(".experts.down_proj") != std::string::npos)
      return not_supported("prune: fused expert tensor " + name + " (only per-expert tensors)");
    auto v = ck->view(name);
    if (!v) return v.status();
    if (std::regex_match(name, m, expert_re)) {
      int64_t l = std::stoll(m[1]), e = std::stoll(m[3]);
      if (l >= L || e >= E) return invalid_argument("prune: " + name + " is outside the config's layers/experts");
      if (new_id[l][e] < 0) continue;
      TESSERA_TRY(w.add("model.layers." + m[1].str() + "." + m[2].str() + ".experts." + std::to_string(new_id[l][e]) +
                            "." + m[4].str(), *v));
    } else if (std::regex_match(name, m, gate_re)) {
      int64_t l = std::stoll(m[1]);
      AnyTensorView g = *v;
      if (g.rank < 1 || g.shape[0] != E || g.dtype == DType::kF4E2m1x2)
        return invalid_argument("prune: " + name + " must have n_routed_experts rows");
      size_t row = g.nbytes() / static_cast<size_t>(E);
      std::vector<int64_t> shape = g.dims();
      shape[0] = n;
      unsigned char const* base = static_cast<unsigned char const*>(g.data);
      auto ids = kept[l];
      TESSERA_TRY(w.add(name, g.dtype, shape, [base, row, ids](void* dst, size_t) -> Status {
        for (size_t j = 0; j < ids.size(); ++j)
          std::memcpy(static_cast<unsigned char*>(dst) + j * row, base + static_cast<size_t>(ids[j]) * row, row);
        return {};
      }));
    } else {
      TESSERA_TRY(w.add(name, *v));
    }
  }
  // Engram hash data travels inside the pruned checkpoint when the source kept it beside the weights.
  std::optional<io::Checkpoint> extra;
  if (!ck->contains("engram_hash.multipliers"))
    for (char const* f : {"engram_hash.safetensors", "golden.safetensors"})
      if (fs::exists(src / f)) {
        auto e = io::Checkpoint::open((src / f).string());
        if (!e) return e.status();
        extra = std::move(*e);
        break;
      }
  if (extra)
    for (char const* k : {"multipliers", "token_map", "primes", "offsets"})
      for (std::string from : {std::string("engram_hash.") + k, std::string("static.engram.") + k})
        if (extra->contains(from)) {
          auto v = extra->view(from);
          if (!v) return v.status();
          TESSERA_TRY(w.add(std::string("engram_hash.") + k, *v));
          break;
        }
  for (auto const& [k, val] : ck->metadata()) w.set_metadata(k, val);
  w.set_metadata("tessera.pruned_from", src.string());
  TESSERA_TRY(w.write((fs::path(out_dir) / "model.safetensors").string()));
  Config c = *cfg;
  c.n_routed_experts = n;
  c.num_experts_per_tok = std::min(c.num_experts_per_tok, n);
  {
    std::ofstream o(fs::path(out_dir) / "config.json");
    o << to_json(c);
    if (!o) return invalid_argument("prune: cannot write " + out_dir + "/config.json");
  }
  json::array ka;
  for (auto const& k : kept) { json::array a; for (int32_t e : k) a.push_back(e); ka.push_back(std::move(a)); }
  json::object po{{"format", "tessera.pruned_experts.v1"}, {"source", src.string()}, {"kept_experts", ka}};
  std::ofstream(fs::path(out_dir) / "pruning.json") << json::serialize(po) << "\n";
  if (fs::exists(src / "tokenizer.json"))
  {
    fs::copy_file(src / "tokenizer.json", fs::path(out_dir) / "tokenizer.json", fs::copy_options::overwrite_existing, fec);
    fs::permissions(fs::path(out_dir) / "tokenizer.json", fs::perms::owner_write, fs::perm_options::add, fec);
  }
  return {};
}

}  // namespace tessera::model::dsv41

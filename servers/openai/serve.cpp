// SPDX-License-Identifier: Apache-2.0
/// Server start-up, signal handling and drain (see serve.hpp).
#include "servers/openai/serve.hpp"

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <boost/json.hpp>

#include "servers/openai/engine/stub_model.hpp"
#include "servers/openai/routes/deepseek_chat.hpp"
#include "servers/openai/routes/tokenizer_codec.hpp"
#include "tessera/models/deepseek_v41/dspark.hpp"
#include "tessera/models/deepseek_v41/gpu_model.hpp"
#include "tessera/models/deepseek_v41/loader.hpp"

namespace tessera::server {
namespace json = boost::json;

Result<std::vector<Sha256Digest>> load_api_keys(std::string const& path) {
  std::ifstream f(path);
  if (!f) return io_error("cannot read the API key file '" + path + "'");
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077))
    std::fprintf(stderr, "tessera serve: warning: API key file '%s' is readable by group/others (chmod 600)\n", path.c_str());
  std::vector<Sha256Digest> out;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    auto trim = [](std::string s) {
      size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
      return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
    };
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (auto c = line.find(": "); c != std::string::npos) line = trim(line.substr(c + 2));
    if (line.size() < 8) return malformed("API key file '" + path + "' line " + std::to_string(lineno) + ": a key must have at least 8 characters");
    out.push_back(sha256(line));
    std::fill(line.begin(), line.end(), '\0');
  }
  if (out.empty()) return malformed("API key file '" + path + "' holds no keys");
  return out;
}

Status configure_drafting(EngineOptions& engine, model::LanguageModel& lm, std::string const& draft, int64_t draft_k) {
  auto* dm = dynamic_cast<model::dsv41::Dsv41Model*>(&lm);
  bool const dspark = dm && dm->has_dspark();
  engine.make_drafter = nullptr;
  engine.drafter_name.clear();
  if (draft == "dspark" || (draft == "auto" && dspark)) {
    if (!dm)
      return invalid_argument("--draft dspark: DSpark drafting runs on the single-rank CPU model (--device cpu "
                              "without --tp/--ep); --draft lookup works on every model");
    if (!dspark) return invalid_argument("--draft dspark: the model has no DSpark weights (mtp.*)");
    engine.make_drafter = [dm](model::SequenceState& st) -> std::unique_ptr<model::Drafter> {
      auto* ds = dynamic_cast<model::dsv41::Dsv41State*>(&st);
      return ds ? model::dsv41::make_dspark_drafter(*dm, *ds) : nullptr;
    };
    engine.drafter_name = "dspark";
  } else if (draft == "lookup") {
    engine.make_drafter = [](model::SequenceState&) { return model::make_lookup_drafter(); };
    engine.drafter_name = "lookup";
  } else if (draft != "none" && draft != "auto") {
    return invalid_argument("--draft must be auto, dspark, lookup or none, got '" + draft + "'");
  }
  if (draft_k >= 0) {
    engine.draft_policy.fixed_k = draft_k;
    engine.draft_policy.max_k = std::max(engine.draft_policy.max_k, draft_k);
  }
  return {};
}

namespace {

// The stand-in served model: StubModel over the byte-level codec (vocabulary 264: bytes + specials) or
// over a real tokenizer (--tokenizer), whose printable-ASCII tokens get the random logits.
struct StubBundle {
  std::shared_ptr<models::Tokenizer const> tokenizer;  // null with the byte-level codec
  std::unique_ptr<TextCodec> codec;
  std::unique_ptr<ChatFormat> chat;
  std::unique_ptr<StubModel> model;
};

Result<std::unique_ptr<StubBundle>> make_stub(ServeConfig const& cfg) {
  auto b = std::make_unique<StubBundle>();
  if (cfg.tokenizer_file.empty()) {
    b->codec = make_byte_codec();
  } else {
    auto t = load_v41_tokenizer(cfg.tokenizer_file);
    if (!t.ok()) return t.status();
    b->tokenizer = std::move(t->tokenizer);
    b->codec = std::move(t->codec);
  }
  b->chat = make_deepseek_chat_format(b->tokenizer.get());
  for (char const* t : {"<｜end▁of▁sentence｜>", "<｜Assistant｜>"})
    if (!b->codec->special_id(t)) return malformed(std::string("the tokenizer has no special token ") + t);
  StubModelConfig sc;
  sc.name = cfg.served_name.empty() ? "tessera-stub-smoke-test" : cfg.served_name;
  sc.vocab_size = b->codec->vocab_size();
  sc.eos_token_ids = {*b->codec->special_id("<｜end▁of▁sentence｜>")};
  sc.assistant_token = *b->codec->special_id("<｜Assistant｜>");
  for (char const* t : {"<think>", "</think>"})
    if (auto id = b->codec->special_id(t)) sc.reply_prefix_tokens.push_back(*id);
  for (int64_t t = 0; t < sc.vocab_size; ++t) {
    if (b->codec->special_id(b->codec->token_bytes(static_cast<int32_t>(t)))) continue;
    std::string bytes = b->codec->token_bytes(static_cast<int32_t>(t));
    bool printable = !bytes.empty();
    for (unsigned char ch : bytes) printable = printable && ((ch >= 32 && ch < 127) || ch == '\n');
    if (printable) sc.allowed_tokens.push_back(static_cast<int32_t>(t));
  }
  // Logits are uniform in [-4, 4): with bias b ≥ 0 EOS is the greedy argmax with probability about
  // max(b / 8, 1 / allowed) per position; greedy replies average ~100 tokens either way.
  sc.eos_bias = sc.allowed_tokens.size() > 1000 ? 0.08f : 0.0f;
  sc.max_context = cfg.engine.max_context > 0 ? cfg.engine.max_context : 8192;
  sc.step_delay_us = cfg.stub_step_delay_us;
  sc.token_delay_us = cfg.stub_token_delay_us;
  if (!cfg.stub_scripts_file.empty()) {
    std::ifstream f(cfg.stub_scripts_file);
    if (!f) return io_error("cannot read --stub-scripts file '" + cfg.stub_scripts_file + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    boost::system::error_code ec;
    json::value v = json::parse(ss.str(), ec);
    if (ec || !v.is_array()) return malformed("--stub-scripts file '" + cfg.stub_scripts_file + "' must be a JSON array");
    for (auto const& e : v.get_array()) {
      if (!e.is_object() || !e.get_object().contains("trigger") || !e.get_object().at("trigger").is_string() ||
          !e.get_object().contains("reply") || !e.get_object().at("reply").is_string())
        return malformed("--stub-scripts entries must be {\"trigger\": string, \"reply\": string}");
      sc.scripts.push_back({b->codec->encode(e.at("trigger").get_string(), false), b->codec->encode(e.at("reply").get_string(), true)});
    }
  }
  b->model = std::make_unique<StubModel>(std::move(sc));
  return b;
}

}  // namespace

int serve_main(ServeConfig cfg) {
  // Signals are taken synchronously by the main thread; every thread started below inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  if (cfg.device != "cpu" && cfg.device != "cuda") {
    std::fprintf(stderr, "tessera serve: --device must be cpu or cuda, got '%s'\n", cfg.device.c_str());
    return 2;
  }
  if (cfg.device == "cuda" && (cfg.model_dir.empty() || cfg.model_dir == "stub")) {
    std::fprintf(stderr, "tessera serve: --device cuda needs --model DIR (the stub model runs on the host)\n");
    return 2;
  }
  if (!cfg.api_key_file.empty()) {
    auto keys = load_api_keys(cfg.api_key_file);
    if (!keys.ok()) { std::fprintf(stderr, "tessera serve: %s\n", keys.status().message().c_str()); return 2; }
    cfg.api.api_key_digests = std::move(*keys);
  }
  std::unique_ptr<StubBundle> stub;
  std::shared_ptr<model::LanguageModel> real;
  std::string description;
  if (cfg.model_dir.empty() || cfg.model_dir == "stub") {
    auto b = make_stub(cfg);
    if (!b.ok()) { std::fprintf(stderr, "tessera serve: %s\n", b.status().message().c_str()); return 2; }
    stub = std::move(*b);
    description = "smoke-test model: deterministic hash-based logits, no weights (replies are noise); tokenizer: " +
                  (cfg.tokenizer_file.empty() ? std::string("byte-level stand-in") : cfg.tokenizer_file);
  } else {
    // A DeepSeek-V4.1 folder (config.json + weights + Engram hash data) on the CPU reference model or
    // the GPU model (--device cuda).
    if (cfg.model) {
      real = cfg.model;
    } else {
      model::dsv41::ModelOptions mo;
      mo.numerics = cfg.numerics;
      mo.weights_as_stored = cfg.weights_as_stored;
      mo.prune = cfg.prune;
      auto m = model::dsv41::load_model_on(cfg.model_dir, std::move(mo), cfg.load_device.empty() ? cfg.device : cfg.load_device);
      if (!m.ok()) { std::fprintf(stderr, "tessera serve: --model %s: %s\n", cfg.model_dir.c_str(), m.status().message().c_str()); return 2; }
      real = std::move(*m);
    }
    stub = std::make_unique<StubBundle>();
    std::string tok_file = cfg.tokenizer_file;
    if (tok_file.empty()) {
      std::FILE* f = std::fopen((cfg.model_dir + "/tokenizer.json").c_str(), "rb");
      if (f) { std::fclose(f); tok_file = cfg.model_dir + "/tokenizer.json"; }
    }
    if (!tok_file.empty()) {
      auto t = load_v41_tokenizer(tok_file);
      if (t.ok()) { stub->tokenizer = std::move(t->tokenizer); stub->codec = std::move(t->codec); }
      else std::fprintf(stderr, "tessera serve: tokenizer %s not usable (%s); using the byte-level stand-in\n",
                        tok_file.c_str(), t.status().message().c_str());
    }
    if (!stub->codec) stub->codec = make_byte_codec();
    stub->chat = make_deepseek_chat_format(stub->tokenizer.get());
    std::string const kind = cfg.model ? " (" + real->info().device + ")" : cfg.device == "cuda" ? " (GPU model)" : " (CPU reference model)";
    description = "DeepSeek-V4.1 from " + cfg.model_dir + kind + "; tokenizer: " + stub->codec->name();
  }
  model::LanguageModel& lm = real ? *real : static_cast<model::LanguageModel&>(*stub->model);
  bool const decode_pruning = cfg.prune.active() && cfg.prune.scope == model::dsv41::ExpertPruning::Scope::kDecode;
  if (decode_pruning && cfg.draft != "auto" && cfg.draft != "none") {
    std::fprintf(stderr, "tessera serve: --draft %s with decode-scope expert pruning is not exact (a verify window is "
                         "not a one-token decode chunk, so it is not pruned); use --draft none or --prune-scope all\n",
                 cfg.draft.c_str());
    return 2;
  }
  // Drafting is configured on the model the engine runs (a wrapped model's states are its own, so a drafter
  // for the unwrapped model would find none of them).
  std::unique_ptr<model::LanguageModel> wrapped = cfg.wrap_model ? cfg.wrap_model(lm) : nullptr;
  model::LanguageModel& served_lm = wrapped ? *wrapped : lm;
  if (Status d = configure_drafting(cfg.engine, served_lm, decode_pruning ? "none" : cfg.draft, cfg.draft_k); !d.ok()) {
    std::fprintf(stderr, "tessera serve: %s\n", d.message().c_str());
    return 2;
  }
  if (cfg.prune.active()) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "; expert pruning (lossy): top_p %g, min_k %lld, %s weights, %s%s", cfg.prune.top_p,
                  static_cast<long long>(cfg.prune.min_k), cfg.prune.renorm ? "renormalised" : "original",
                  decode_pruning ? "decode only" : "every row", cfg.prune.expert_mask.empty() ? "" : ", static mask");
    description += buf;
  }
  if (!cfg.engine.drafter_name.empty()) description += "; drafting: " + cfg.engine.drafter_name;
  // Replies end at the tokenizer's end-of-sentence token even when config.json names no eos_token_id
  // (synthetic and golden tiny checkpoints): without it an unconstrained reply never stops early and a
  // constrained one would reach complete JSON with no token left to sample.
  cfg.engine.extra_eos_token_ids = tokenizer_eos_ids(*stub->codec);
  Engine engine(served_lm, cfg.engine);
  ServedModel served;
  served.id = !cfg.served_name.empty() ? cfg.served_name : real ? "deepseek-v4.1-" + std::string(real->info().name.empty() ? "local" : real->info().name) : lm.info().name;
  served.description = description;
  served.codec = stub->codec.get();
  served.chat = stub->chat.get();
  served.parser = &make_deepseek_output_parser;
  if (served.codec->vocab_size() > lm.info().vocab_size) {
    served.constraints_off_reason = "the tokenizer (" + std::to_string(served.codec->vocab_size()) +
                                    " ids) is larger than the model's vocabulary (" + std::to_string(lm.info().vocab_size) + ")";
  } else {
    auto f = ConstraintFactory::create(*served.codec, engine.info().eos_token_ids);
    if (f.ok()) served.constraints = std::move(*f);
    else served.constraints_off_reason = f.status().message();
  }
  if (!served.constraints)
    std::fprintf(stderr, "tessera serve: grammar-constrained decoding is off (%s): requests with response_format "
                         "json_object/json_schema or tool_choice required/named get a 400\n", served.constraints_off_reason.c_str());
  served.engine = &engine;
  Api api(served, cfg.api);
  HttpServer http(api, cfg.http);
  if (Status s = http.start(); !s.ok()) {
    std::fprintf(stderr, "tessera serve: %s\n", s.message().c_str());
    return 1;
  }
  uint16_t port = http.port();
  if (!cfg.port_file.empty()) {
    std::ofstream pf(cfg.port_file + ".tmp");
    pf << port << "\n";
    pf.close();
    std::rename((cfg.port_file + ".tmp").c_str(), cfg.port_file.c_str());
  }
  std::fprintf(stderr, "tessera serve: model '%s' (%s), %d slots, context %lld, listening on http://%s:%u/v1%s\n",
               served.id.c_str(), description.c_str(), engine.options().max_batch, static_cast<long long>(engine.max_context()),
               cfg.http.host.c_str(), port, cfg.api.api_key_digests.empty() ? " (no API keys)" : "");
  std::fflush(stderr);

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "tessera serve: %s received, draining (up to %.0f s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg.drain_timeout_s);
  api.set_draining();
  engine.begin_drain();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg.drain_timeout_s);
  // A second signal ends the drain early.
  timespec poll_ts{0, 50 * 1000 * 1000};
  while (std::chrono::steady_clock::now() < deadline && !(engine.idle() && api.in_flight() == 0)) {
    if (sigtimedwait(&sigs, nullptr, &poll_ts) > 0) break;
  }
  http.stop_accepting();
  engine.stop();
  http.shutdown();
  std::fprintf(stderr, "tessera serve: stopped\n");
  return 0;
}

}  // namespace tessera::server

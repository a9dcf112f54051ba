// SPDX-License-Identifier: Apache-2.0
/// Seeded mutation test of the safetensors reader, built with AddressSanitizer and UBSan (the parser
/// sources and Boost.JSON are compiled into this executable with the sanitizers). Valid seed files are
/// mutated (bit flips, truncations, header-length edits, JSON token edits, random data offsets, byte
/// insertions/deletions/duplications) and parsed; every case must return without a sanitizer report, and
/// every accepted file must describe tensors whose bytes lie inside the file's data section, are pairwise
/// disjoint and match numel × element size; all accepted bytes are read. A second, smaller loop mutates a
/// sharded checkpoint's `model.safetensors.index.json`.
///
/// usage: verify_io_mutation [cases=120000] [seed=20251202]; exit 0 on success.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tessera/io/safetensors.hpp"

#if !defined(__SANITIZE_ADDRESS__)
#error "verify_io_mutation must be built with -fsanitize=address,undefined (see verify/io/meson.build)"
#endif

// The core library's CUDA hooks, which this host-only executable does not link.
namespace tessera {
Status cuda_malloc(void**, size_t) { return not_supported("no CUDA in the mutation test"); }
void cuda_free(void*) {}
Status cuda_memcpy(void*, void const*, size_t, bool, bool) { return not_supported("no CUDA in the mutation test"); }
int cuda_device_count() { return 0; }
}  // namespace tessera

using namespace tessera;
using namespace tessera::io;
namespace fs = std::filesystem;

namespace {

int g_failures = 0;
void fail(char const* what, size_t case_id, std::string const& detail) {
  if (++g_failures <= 20) std::fprintf(stderr, "FAIL case %zu: %s: %s\n", case_id, what, detail.c_str());
}

std::vector<unsigned char> file_image(std::string header, size_t data_bytes, std::mt19937_64& g) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<unsigned char> b(8 + header.size() + data_bytes);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(n >> (8 * i));
  std::memcpy(b.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) b[8 + header.size() + i] = static_cast<unsigned char>(g());
  return b;
}

/// Valid files of assorted shapes: every dtype, 0-d and empty tensors, metadata, F4, gaps between spans.
std::vector<std::vector<unsigned char>> make_seeds(std::mt19937_64& g, std::string const& prefix = "model") {
  struct D { char const* name; size_t bits; };
  D const dts[] = {{"F64", 64}, {"F32", 32}, {"F16", 16}, {"BF16", 16}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
                   {"F4", 4},   {"I64", 64}, {"I32", 32}, {"I16", 16},  {"I8", 8},      {"U8", 8},
                   {"U16", 16}, {"U32", 32}, {"U64", 64}, {"BOOL", 8}};
  std::vector<std::vector<unsigned char>> seeds;
  for (int s = 0; s < 24; ++s) {
    int ntensors = 1 + static_cast<int>(g() % 12);
    std::string h = "{";
    if (s % 3 == 0) h += "\"__metadata__\":{\"format\":\"pt\",\"k" + std::to_string(s) + "\":\"v\"},";
    size_t off = 0;
    for (int t = 0; t < ntensors; ++t) {
      D const& d = dts[g() % std::size(dts)];
      int rank = static_cast<int>(g() % 4);
      std::vector<uint64_t> shape;
      uint64_t numel = 1;
      for (int r = 0; r < rank; ++r) {
        uint64_t v = g() % 6;
        if (g() % 8 != 0 && v == 0) v = 1;
        shape.push_back(v);
        numel *= v;
      }
      if (d.bits == 4) {  // F4 needs an even last dim
        if (shape.empty()) { shape.push_back(2); numel = 2; }
        if (shape.back() % 2) { numel = numel / shape.back() * (shape.back() + 1); shape.back() += 1; }
      }
      size_t nbytes = numel * d.bits / 8;
      if (g() % 4 == 0) off += g() % 5;  // gaps are allowed
      std::string sh = "[";
      for (size_t i = 0; i < shape.size(); ++i) sh += (i ? "," : "") + std::to_string(shape[i]);
      sh += "]";
      h += std::string(t ? "," : "") + "\"" + prefix + ".layers." + std::to_string(t) + ".w" + std::to_string(g() % 3) +
           ".weight\":{\"dtype\":\"" + d.name + "\",\"shape\":" + sh + ",\"data_offsets\":[" + std::to_string(off) +
           "," + std::to_string(off + nbytes) + "]}";
      off += nbytes;
    }
    h += "}";
    seeds.push_back(file_image(h, off + (g() % 3), g));
  }
  return seeds;
}

void put_u64(std::vector<unsigned char>& b, uint64_t n) {
  for (int i = 0; i < 8 && i < static_cast<int>(b.size()); ++i) b[i] = static_cast<unsigned char>(n >> (8 * i));
}
uint64_t get_u64(std::vector<unsigned char> const& b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | (i < static_cast<int>(b.size()) ? b[i] : 0);
  return n;
}

/// Header region [8, 8+N) clamped to the buffer.
std::pair<size_t, size_t> header_range(std::vector<unsigned char> const& b) {
  if (b.size() < 9) return {0, b.size()};
  uint64_t n = get_u64(b);
  size_t end = n > b.size() - 8 ? b.size() : static_cast<size_t>(8 + n);
  return {8, end};
}

char const* const kTokens[] = {
    "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u0000", "\\ud800", "null", "true", "-1", "0", "1e400", "1.5",
    "18446744073709551615", "18446744073709551616", "9223372036854775808", "4294967296", "\"dtype\"", "\"shape\"",
    "\"data_offsets\"", "\"__metadata__\"", "\"F4\"", "\"F8_E8M0\"", "\"BF16\"", "\"I8\"", "\"X\"", "[]", "{}",
    "[0,0]", "\xff", "\xc3\xa9", " ", "\n", "\"model.layers.0.w0.weight\"", "\"model.layers.1.w1.weight\""};

/// Applies one to three random mutations.
void mutate(std::vector<unsigned char>& b, std::mt19937_64& g) {
  int count = 1 + static_cast<int>(g() % 3);
  for (int m = 0; m < count; ++m) {
    auto [hb, he] = header_range(b);
    auto pick_in = [&](size_t lo, size_t hi) { return hi > lo ? lo + g() % (hi - lo) : lo; };
    switch (g() % 9) {
      case 0: {  // bit flips, mostly in the header
        int flips = 1 + static_cast<int>(g() % 8);
        for (int i = 0; i < flips && !b.empty(); ++i) {
          size_t at = g() % 4 ? pick_in(0, std::max(he, size_t{1})) : g() % b.size();
          if (at < b.size()) b[at] ^= static_cast<unsigned char>(1u << (g() % 8));
        }
        break;
      }
      case 1:  // truncation
        b.resize(b.empty() ? 0 : g() % (b.size() + 1));
        break;
      case 2: {  // header length edits
        uint64_t n = get_u64(b);
        switch (g() % 5) {
          case 0: n += 1 + g() % 16; break;
          case 1: n -= 1 + g() % 16; break;
          case 2: n = g(); break;
          case 3: n = kMaxHeaderBytes + g() % 3 - 1; break;
          default: n = b.size() >= 8 ? b.size() - 8 + (g() % 3) - 1 : 0; break;
        }
        put_u64(b, n);
        break;
      }
      case 3: {  // replace a number in the header with another (negative, huge, float, off by one)
        std::vector<size_t> starts;
        for (size_t i = hb; i < he; ++i)
          if (b[i] >= '0' && b[i] <= '9' && (i == hb || !(b[i - 1] >= '0' && b[i - 1] <= '9'))) starts.push_back(i);
        if (starts.empty()) break;
        size_t s = starts[g() % starts.size()], e = s;
        while (e < he && b[e] >= '0' && b[e] <= '9') ++e;
        std::string num(b.begin() + static_cast<long>(s), b.begin() + static_cast<long>(e));
        uint64_t v = std::strtoull(num.c_str(), nullptr, 10);
        std::string rep;
        switch (g() % 6) {
          case 0: rep = std::to_string(v + 1); break;
          case 1: rep = std::to_string(v ? v - 1 : 0); break;
          case 2: rep = std::to_string(g() % 4096); break;
          case 3: rep = std::to_string(g()); break;
          case 4: rep = "-" + num; break;
          default: rep = num + ".0"; break;
        }
        b.erase(b.begin() + static_cast<long>(s), b.begin() + static_cast<long>(e));
        b.insert(b.begin() + static_cast<long>(s), rep.begin(), rep.end());
        put_u64(b, get_u64(b) + rep.size() - (e - s));  // keep the length prefix consistent
        break;
      }
      case 4: {  // replace a quoted string token or insert a JSON token
        std::string tok = kTokens[g() % std::size(kTokens)];
        size_t at = pick_in(hb, he);
        size_t del = 0;
        if (g() % 2 && at < b.size() && b[at] == '"') {
          size_t e = at + 1;
          while (e < he && b[e] != '"') ++e;
          del = std::min(e + 1, b.size()) - at;
        } else if (g() % 2) {
          del = std::min<size_t>(g() % 4, b.size() - std::min(at, b.size()));
        }
        at = std::min(at, b.size());
        b.erase(b.begin() + static_cast<long>(at), b.begin() + static_cast<long>(at + del));
        b.insert(b.begin() + static_cast<long>(at), tok.begin(), tok.end());
        if (g() % 4) put_u64(b, get_u64(b) + tok.size() - del);
        break;
      }
      case 5: {  // rewrite one data_offsets pair with random values near the data size
        std::string_view hv(reinterpret_cast<char const*>(b.data()) + hb, he - hb);
        std::vector<size_t> hits;
        for (size_t p = hv.find("data_offsets\":["); p != std::string_view::npos; p = hv.find("data_offsets\":[", p + 1))
          hits.push_back(hb + p + 15);
        if (hits.empty()) break;
        size_t s = hits[g() % hits.size()], e = s;
        while (e < he && b[e] != ']') ++e;
        size_t data = b.size() > he ? b.size() - he : 0;
        uint64_t x = g() % (data + 8), y = g() % 3 ? x + g() % 64 : g() % (data + 8);
        std::string rep = std::to_string(x) + "," + std::to_string(y);
        b.erase(b.begin() + static_cast<long>(s), b.begin() + static_cast<long>(e));
        b.insert(b.begin() + static_cast<long>(s), rep.begin(), rep.end());
        put_u64(b, get_u64(b) + rep.size() - (e - s));
        break;
      }
      case 6: {  // delete a byte range
        if (b.empty()) break;
        size_t at = g() % b.size(), len = std::min<size_t>(1 + g() % 16, b.size() - at);
        b.erase(b.begin() + static_cast<long>(at), b.begin() + static_cast<long>(at + len));
        break;
      }
      case 7: {  // duplicate a header range (duplicate keys, repeated entries)
        if (he <= hb + 2) break;
        size_t at = pick_in(hb, he), len = std::min<size_t>(1 + g() % 96, he - at);
        std::vector<unsigned char> piece(b.begin() + static_cast<long>(at), b.begin() + static_cast<long>(at + len));
        size_t to = pick_in(hb, he);
        b.insert(b.begin() + static_cast<long>(to), piece.begin(), piece.end());
        put_u64(b, get_u64(b) + len);
        break;
      }
      default: {  // append or remove data bytes
        if (g() % 2)
          b.resize(b.size() + g() % 32, static_cast<unsigned char>(g()));
        else
          b.resize(b.size() - std::min<size_t>(b.size(), g() % 8));
        break;
      }
    }
  }
}

/// Invariants of an accepted file; reads every tensor byte so ASan sees any out-of-bounds span.
uint64_t check_accepted(SafetensorsFile const& f, size_t case_id) {
  uint64_t sum = 0;
  unsigned char const* lo = f.file_data() + f.data_start();
  unsigned char const* hi = f.file_data() + f.file_size();
  if (f.data_start() > f.file_size()) fail("data start past the end", case_id, f.path());
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    TensorInfo const& t = f.tensors()[i];
    if (i && !(f.tensors()[i - 1].name < t.name)) fail("tensors not sorted/unique", case_id, t.name);
    auto v = f.view(t.name);
    if (!v.ok()) { fail("view failed", case_id, t.name); continue; }
    auto const* p = static_cast<unsigned char const*>(v->data);
    if (p < lo || p > hi || t.nbytes > static_cast<size_t>(hi - p)) fail("view outside the data section", case_id, t.name);
    uint64_t numel = 1;
    for (int d = 0; d < v->rank; ++d) numel *= static_cast<uint64_t>(v->shape[d]);
    if (numel * dtype_size(t.dtype) != t.nbytes || v->nbytes() != t.nbytes) fail("byte count", case_id, t.name);
    for (size_t k = 0; k < t.nbytes; ++k) sum += p[k];
    if (t.nbytes) spans.emplace_back(t.offset, t.offset + t.nbytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) fail("overlapping spans accepted", case_id, f.path());
  return sum;
}

/// Mutations of a sharded checkpoint's index.json; accepted checkpoints must only expose in-file views.
size_t index_mutations(size_t cases, std::mt19937_64& g, size_t& accepted) {
  fs::path dir = fs::temp_directory_path() / ("tessera_io_mutation_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string wm = "{\"metadata\":{\"total_size\":1},\"weight_map\":{";
  int k = 0;
  for (int s = 0; s < 3; ++s) {
    std::string name = "model-0000" + std::to_string(s + 1) + "-of-00003.safetensors";
    auto shard = make_seeds(g, "shard" + std::to_string(s))[static_cast<size_t>(s)];
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<char const*>(shard.data()), static_cast<std::streamsize>(shard.size()));
    auto f = SafetensorsFile::open((dir / name).string());
    if (!f.ok()) { fail("seed shard rejected", 0, f.status().to_string()); continue; }
    for (auto const& t : f->tensors()) {
      wm += std::string(k++ ? "," : "") + "\"" + t.name + "\":\"" + name + "\"";
    }
  }
  wm += "}}";
  size_t done = 0;
  for (size_t c = 0; c < cases; ++c) {
    std::vector<unsigned char> b(wm.begin(), wm.end());
    b.insert(b.begin(), 8, 0);  // reuse mutate(): a fake length prefix, stripped below
    put_u64(b, wm.size());
    mutate(b, g);
    std::ofstream(dir / "model.safetensors.index.json", std::ios::binary)
        .write(reinterpret_cast<char const*>(b.data()) + std::min<size_t>(8, b.size()),
               static_cast<std::streamsize>(b.size() - std::min<size_t>(8, b.size())));
    auto ck = Checkpoint::open(dir.string());
    ++done;
    if (!ck.ok()) continue;
    ++accepted;
    for (auto const& t : ck->tensors()) {
      auto v = ck->view(t.name);
      if (!v.ok()) fail("checkpoint view failed", c, t.name);
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return done;
}

}  // namespace

int main(int argc, char** argv) {
  size_t cases = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 120000;
  uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 20251202;
  if (char const* env = std::getenv("TESSERA_TEST_SEED")) seed = std::strtoull(env, nullptr, 0);
  std::printf("[seed %llu] %zu cases\n", static_cast<unsigned long long>(seed), cases);
  auto t0 = std::chrono::steady_clock::now();
  std::mt19937_64 g(seed);
  auto seeds = make_seeds(g);
  for (size_t i = 0; i < seeds.size(); ++i) {
    auto r = SafetensorsFile::from_bytes(seeds[i], "seed" + std::to_string(i));
    if (!r.ok()) fail("seed rejected", i, r.status().to_string());
  }
  size_t accepted = 0, rejected = 0;
  uint64_t checksum = 0;
  for (size_t c = 0; c < cases; ++c) {
    std::vector<unsigned char> b = seeds[g() % seeds.size()];
    mutate(b, g);
    auto r = SafetensorsFile::from_bytes(std::move(b), "case" + std::to_string(c));
    if (r.ok()) {
      ++accepted;
      checksum += check_accepted(*r, c);
    } else {
      ++rejected;
      if (r.status().message().empty() || r.status().message().find("case" + std::to_string(c)) == std::string::npos)
        fail("error message does not name the file", c, r.status().to_string());
    }
  }
  size_t idx_accepted = 0;
  size_t idx_cases = index_mutations(cases / 40, g, idx_accepted);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("files: %zu accepted, %zu rejected; index.json: %zu cases, %zu accepted; checksum %llu; %.1f s\n",
              accepted, rejected, idx_cases, idx_accepted, static_cast<unsigned long long>(checksum), secs);
  // The mutations must exercise both outcomes, or the test proves little.
  if (accepted < cases / 100 || rejected < cases / 2) fail("mutation mix", 0, "too few accepted or rejected cases");
  if (idx_cases && (idx_accepted == 0 || idx_accepted == idx_cases)) fail("index mutation mix", 0, "one-sided");
  if (g_failures) std::fprintf(stderr, "%d failures\n", g_failures);
  return g_failures ? 1 : 0;
}

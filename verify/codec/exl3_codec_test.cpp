// SPDX-License-Identifier: Apache-2.0
/// Known-answer tests of the EXL3 codec primitives (include/tessera/codec/exl3.hpp) against the values
/// quoted in spec/exl3.md §2.5, §2.7, §3.4 and §4, and against the shared tables fixture
/// (golden/exl3/exl3_tables.safetensors: all 65536 codebook entries, the tile permutation, H128, the
/// worked-example tiles). Shared code cannot catch its own bugs, so every expectation here comes from
/// the spec text or the fixture, never from the code under test.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "tessera/codec/exl3.hpp"
#include "tessera/io/safetensors.hpp"
#include "tessera/ref/exl3_ref.hpp"
#include "verify/common/golden.hpp"

namespace x3 = tessera::exl3;
using tessera::float_from_f16_bits;



BOOST_AUTO_TEST_SUITE(exl3_codec)

BOOST_AUTO_TEST_CASE(codebook_known_values) {
  // spec §3.4: state → fp16 bits for 3INST, MCG, MUL1.
  struct Row { uint32_t s; uint16_t v3, vm, v1; };
  Row const rows[] = {{0x0000, 0x3A25, 0x3F60, 0xC2E8}, {0x0001, 0xBB5B, 0x304E, 0x3921},
                      {0x1234, 0xC066, 0x3E0F, 0xB89E}, {0xBEEF, 0x424B, 0xC293, 0x3124},
                      {0xFFFF, 0xB110, 0x3ACD, 0xB936}};
  for (auto const& r : rows) {
    BOOST_TEST(x3::decode_state<x3::Codebook::k3Inst>(r.s) == r.v3);
    BOOST_TEST(x3::decode_state<x3::Codebook::kMcg>(r.s) == r.vm);
    BOOST_TEST(x3::decode_state<x3::Codebook::kMul1>(r.s) == r.v1);
  }
  // Worked intermediate values for state 0x1234.
  BOOST_TEST(0x1234u * x3::kMul3Inst + x3::kAdd3Inst == 0xD321A5CCu);
  BOOST_TEST(0x1234u * x3::kMulMcg == 0x79352624u);
  BOOST_TEST(x3::mul1_byte_sum(0x1234) == 425u);
  static_assert(x3::decode_state<x3::Codebook::kMul1>(0x1234) == 0xB89E, "constexpr decode");
}

BOOST_AUTO_TEST_CASE(codebook_statistics) {
  struct S { x3::Codebook cb; double rms, mn, mx; };
  S const stats[] = {{x3::Codebook::k3Inst, 1.243711, -3.95703125, 3.97265625},
                     {x3::Codebook::kMcg, 1.244112, -3.94921875, 3.94921875},
                     {x3::Codebook::kMul1, 1.000312, -3.453125, 3.34765625}};
  for (auto const& s : stats) {
    auto t = tessera::ref::exl3_codebook_table(s.cb);
    double ss = 0, mn = 1e9, mx = -1e9;
    for (uint16_t b : t) {
      double v = float_from_f16_bits(b);
      ss += v * v; mn = std::min(mn, v); mx = std::max(mx, v);
    }
    BOOST_TEST(std::abs(std::sqrt(ss / 65536) - s.rms) < 1e-6);
    BOOST_TEST(mn == s.mn);
    BOOST_TEST(mx == s.mx);
  }
}

BOOST_AUTO_TEST_CASE(worked_example_k4) {
  // spec §2.7: K = 4, v_p = p & 15.
  uint16_t codes[256], words[64], st[256];
  for (int p = 0; p < 256; ++p) codes[p] = static_cast<uint16_t>(p & 15);
  x3::pack_tile(codes, 8, words);
  BOOST_TEST(words[0] == 0x4567); BOOST_TEST(words[1] == 0x0123);
  BOOST_TEST(words[2] == 0xCDEF); BOOST_TEST(words[3] == 0x89AB);
  BOOST_TEST(x3::tile_word32(words, 0) == 0x01234567u);
  BOOST_TEST(x3::tile_word32(words, 1) == 0x89ABCDEFu);
  tessera::ref::exl3_tile_states(reinterpret_cast<int16_t const*>(words), 8, st);
  uint16_t const expect[] = {0xDEF0, 0xEF01, 0xF012, 0x0123, 0x1234};
  for (int i = 0; i < 5; ++i) BOOST_TEST(st[i] == expect[i]);
  BOOST_TEST(st[255] == 0xCDEF);
}

BOOST_AUTO_TEST_CASE(worked_example_k3) {
  // spec §2.7: K = 3, v_p = p & 7 (24-bit period 0x053977).
  uint16_t codes[256], words[48], st[256];
  for (int p = 0; p < 256; ++p) codes[p] = static_cast<uint16_t>(p & 7);
  x3::pack_tile(codes, 6, words);
  BOOST_TEST(x3::tile_word32(words, 0) == 0x05397705u);
  BOOST_TEST(x3::tile_word32(words, 1) == 0x39770539u);
  BOOST_TEST(x3::tile_word32(words, 2) == 0x77053977u);
  uint16_t const w16[] = {0x7705, 0x0539, 0x0539, 0x3977, 0x3977, 0x7705};
  for (int i = 0; i < 6; ++i) BOOST_TEST(words[i] == w16[i]);
  tessera::ref::exl3_tile_states(reinterpret_cast<int16_t const*>(words), 6, st);
  uint16_t const expect[] = {0xCBB8, 0x5DC1, 0xEE0A, 0x7053, 0x829C};
  for (int i = 0; i < 5; ++i) BOOST_TEST(st[i] == expect[i]);
  BOOST_TEST(st[255] == 0x3977);
}

BOOST_AUTO_TEST_CASE(bitstream_roundtrip_and_recurrence) {
  // Every rate (K = 1..8 and the half rates): pack → states → low bits give the codes back, and
  // s_p = ((s_{p-1} << D(p)) | v_p) & 0xFFFF around the circle (spec §2.4).
  std::mt19937 g(7);
  for (int k2 = 2; k2 <= 17; ++k2) {
    if (k2 > 16) break;
    for (int rep = 0; rep < 4; ++rep) {
      uint16_t codes[256], words[128], st[256];
      for (int p = 0; p < 256; ++p) codes[p] = static_cast<uint16_t>(g() & ((1u << x3::position_bits(k2, p)) - 1));
      x3::pack_tile(codes, k2, words);
      tessera::ref::exl3_tile_states(reinterpret_cast<int16_t const*>(words), k2, st);
      bool ok = true;
      for (int p = 0; p < 256; ++p) {
        int d = x3::position_bits(k2, p);
        ok = ok && (st[p] & ((1u << d) - 1)) == codes[p];
        uint32_t prev = st[(p + 255) & 255];
        ok = ok && (((prev << d) | codes[p]) & 0xFFFFu) == st[p];
      }
      BOOST_TEST(ok, "k2 = " << k2);
    }
  }
  BOOST_TEST(x3::stream_end(5, 255) == 128 * 5);   // half rate 2.5: 640 bits per tile
}

BOOST_AUTO_TEST_CASE(tile_permutation) {
  // spec §2.5 table: rows 0, 1 and 15 quoted in full.
  int const r0[] = {0, 32, 64, 96, 128, 160, 192, 224, 4, 36, 68, 100, 132, 164, 196, 228};
  int const r1[] = {1, 33, 65, 97, 129, 161, 193, 225, 5, 37, 69, 101, 133, 165, 197, 229};
  int const r15[] = {27, 59, 91, 123, 155, 187, 219, 251, 31, 63, 95, 127, 159, 191, 223, 255};
  int pos[16][16];
  bool seen[256] = {};
  for (int p = 0; p < 256; ++p) {
    BOOST_TEST(x3::tile_pos(x3::tile_row(p), x3::tile_col(p)) == p);
    pos[x3::tile_row(p)][x3::tile_col(p)] = p;
    seen[x3::tile_row(p) * 16 + x3::tile_col(p)] = true;
  }
  for (int c = 0; c < 16; ++c) {
    BOOST_TEST(pos[0][c] == r0[c]);
    BOOST_TEST(pos[1][c] == r1[c]);
    BOOST_TEST(pos[15][c] == r15[c]);
  }
  bool all = true;
  for (bool s : seen) all = all && s;
  BOOST_TEST(all);
}

BOOST_AUTO_TEST_CASE(hadamard_matches_matrix_and_scale) {
  // fwht128 equals multiplication by H[i][j] = (−1)^popcount(i & j); the scale constant is fp32(1/√128).
  BOOST_TEST(std::bit_cast<uint32_t>(x3::kHadScale) == x3::kHadScaleBits);
  BOOST_TEST(x3::kHadScale == static_cast<float>(1.0 / std::sqrt(128.0)));
  std::mt19937 g(3);
  std::uniform_int_distribution<int> d(-64, 64);
  float v[128], ref[128];
  int iv[128];
  for (int i = 0; i < 128; ++i) { iv[i] = d(g); v[i] = static_cast<float>(iv[i]); }
  for (int i = 0; i < 128; ++i) {
    long s = 0;
    for (int j = 0; j < 128; ++j) s += (__builtin_popcount(i & j) & 1) ? -iv[j] : iv[j];
    ref[i] = static_cast<float>(s);
  }
  x3::fwht128(v);
  bool eq = true;
  for (int i = 0; i < 128; ++i) eq = eq && v[i] == ref[i];
  BOOST_TEST(eq);
  // Input transform of e_3 with suh = 1: every output is ±fp16(r) with the sign of H[i][3].
  uint16_t x[128] = {}, suh[128], xh[128];
  for (auto& s : suh) s = 0x3C00;
  x[3] = 0x3C00;
  x3::input_transform128(x, suh, xh);
  uint16_t const r16 = tessera::f16_bits_from_float(x3::kHadScale);
  bool sgn = true;
  for (int i = 0; i < 128; ++i)
    sgn = sgn && xh[i] == ((__builtin_popcount(i & 3) & 1) ? static_cast<uint16_t>(r16 | 0x8000) : r16);
  BOOST_TEST(sgn);
}

BOOST_AUTO_TEST_CASE(legacy_signs) {
  BOOST_TEST(x3::legacy_sign_f16(0x0005, 0) == 0xBC00);
  BOOST_TEST(x3::legacy_sign_f16(0x0005, 1) == 0x3C00);
  BOOST_TEST(x3::legacy_sign_f16(0x8000, 15) == 0xBC00);
}

BOOST_AUTO_TEST_CASE(tables_fixture) {
  std::string path = tessera::verify::golden_dir() + "/exl3/exl3_tables.safetensors";
  auto f = tessera::io::SafetensorsFile::open(path);
  BOOST_TEST_REQUIRE(f.ok(), f.status().to_string());
  auto view = [&](std::string const& nm) {
    auto v = f->view(nm);
    if (!v.ok()) throw tessera::Error(v.status());
    return std::span<char const>(static_cast<char const*>(v->data), v->nbytes());
  };
  char const* names[] = {"codebook.3inst", "codebook.mcg", "codebook.mul1"};
  x3::Codebook const cbs[] = {x3::Codebook::k3Inst, x3::Codebook::kMcg, x3::Codebook::kMul1};
  for (int c = 0; c < 3; ++c) {
    auto v = view(names[c]);
    BOOST_TEST_REQUIRE(v.size() == 2u * 65536u);
    auto const* gold = reinterpret_cast<uint16_t const*>(v.data());
    auto t = tessera::ref::exl3_codebook_table(cbs[c]);
    int bad = 0;
    for (int s = 0; s < 65536; ++s) bad += t[s] != gold[s];
    BOOST_TEST(bad == 0, names[c] << ": " << bad << " of 65536 states differ");
  }
  auto const* pr = reinterpret_cast<int32_t const*>(view("tile.pos_to_rc").data());
  int bad = 0;
  for (int p = 0; p < 256; ++p) bad += pr[p] != x3::tile_row(p) * 16 + x3::tile_col(p);
  BOOST_TEST(bad == 0);
  auto const* h = reinterpret_cast<int8_t const*>(view("hadamard128").data());
  bad = 0;
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j) bad += h[i * 128 + j] != ((__builtin_popcount(i & j) & 1) ? -1 : 1);
  BOOST_TEST(bad == 0);
  for (int k = 3; k <= 4; ++k) {
    std::string pre = "example.k" + std::to_string(k);
    auto tr = view(pre + ".trellis");
    auto gs = view(pre + ".states");
    uint16_t codes[256], words[64], st[256];
    for (int p = 0; p < 256; ++p) codes[p] = static_cast<uint16_t>(p & ((1 << k) - 1));
    x3::pack_tile(codes, 2 * k, words);
    BOOST_TEST(std::memcmp(words, tr.data(), 2 * 16 * k) == 0, pre << " trellis");
    tessera::ref::exl3_tile_states(reinterpret_cast<int16_t const*>(tr.data()), 2 * k, st);
    BOOST_TEST(std::memcmp(st, gs.data(), 512) == 0, pre << " states");
  }
}

BOOST_AUTO_TEST_SUITE_END()

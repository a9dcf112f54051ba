// SPDX-License-Identifier: Apache-2.0
/// Safetensors reader and writer: every header malformation yields kMalformedInput with a message naming
/// the file and tensor; writer → reader round trips are bit-exact for every dtype; the golden checkpoints
/// open and agree with each other (bf16 file = RNE(fp32 file) outside the fp32 islands).
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tessera/io/safetensors.hpp"
#include "verify/common/golden.hpp"
#include "verify/common/random.hpp"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::io;

namespace {

/// A file image: u64 length | header | `data_bytes` bytes of data (value i & 0xFF).
std::vector<unsigned char> image(std::string const& header, size_t data_bytes) {
  std::vector<unsigned char> b(8 + header.size() + data_bytes);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(n >> (8 * i));
  if (!header.empty()) std::memcpy(b.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) b[8 + header.size() + i] = static_cast<unsigned char>(i);
  return b;
}

/// Parses an image and expects a malformed-input error whose message contains `needle`.
void expect_malformed(std::vector<unsigned char> img, std::string const& needle) {
  auto r = SafetensorsFile::from_bytes(std::move(img), "t.safetensors");
  BOOST_TEST_INFO("expected an error containing: " << needle);
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST((r.status().code() == StatusCode::kMalformedInput));
  BOOST_TEST_INFO("message: " << r.status().message());
  BOOST_TEST(r.status().message().find(needle) != std::string::npos);
  BOOST_TEST(r.status().message().find("t.safetensors") != std::string::npos);
}

std::string entry(std::string const& name, std::string const& dtype, std::string const& shape, size_t b, size_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tessera_io_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_bytes(fs::path const& p, std::vector<unsigned char> const& b) {
  std::ofstream o(p, std::ios::binary);
  o.write(reinterpret_cast<char const*>(b.data()), static_cast<std::streamsize>(b.size()));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(io)

BOOST_AUTO_TEST_CASE(valid_minimal) {
  std::string h = "{" + entry("b", "F32", "[2,3]", 0, 24) + "," + entry("a", "U8", "[]", 24, 25) +
                  ",\"__metadata__\":{\"format\":\"pt\"}}   ";
  auto r = SafetensorsFile::from_bytes(image(h, 25), "t.safetensors");
  BOOST_REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  BOOST_TEST(r->tensors().size() == 2u);
  BOOST_TEST(r->tensors()[0].name == "a");  // sorted by name
  BOOST_TEST(r->metadata().at("format") == "pt");
  auto v = r->view("b");
  BOOST_REQUIRE(v.ok());
  BOOST_TEST(v->rank == 2);
  BOOST_TEST(v->shape[0] == 2);
  BOOST_TEST(v->stride[0] == 3);
  BOOST_TEST(static_cast<unsigned char const*>(v->data) == r->file_data() + r->data_start());
  auto a = r->view("a");
  BOOST_REQUIRE(a.ok());
  BOOST_TEST(a->rank == 0);
  BOOST_TEST(*static_cast<unsigned char const*>(a->data) == 24);
  BOOST_TEST(!r->contains("c"));
  BOOST_TEST((r->view("c").status().code() == StatusCode::kNotFound));
}

BOOST_AUTO_TEST_CASE(malformed_length_prefix) {
  expect_malformed({1, 2, 3}, "shorter than the 8-byte");
  auto img = image("{}", 0);
  img[0] = 200;  // header length 200 > 2 remaining bytes
  expect_malformed(img, "exceeds the 2 bytes");
  std::vector<unsigned char> big(16, 0);
  uint64_t n = 100'000'001;
  for (int i = 0; i < 8; ++i) big[i] = static_cast<unsigned char>(n >> (8 * i));
  expect_malformed(big, "exceeds the limit");
}

BOOST_AUTO_TEST_CASE(malformed_json) {
  expect_malformed(image("{\"a\":", 0), "not valid JSON");
  expect_malformed(image("[1,2]", 0), "not a JSON object");
  expect_malformed(image("{} x", 0), "not valid JSON");
  expect_malformed(image("{\"a\":1}", 0), "tensor 'a': entry is not an object");
  std::string bad_utf8 = "{\"\xff\":{}}";
  expect_malformed(image(bad_utf8, 0), "not valid JSON");
}

BOOST_AUTO_TEST_CASE(malformed_entries) {
  auto one = [](std::string e, size_t data = 8) { return image("{" + e + "}", data); };
  expect_malformed(one("\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}"), "tensor 'w': missing key 'dtype'");
  expect_malformed(one("\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}"), "tensor 'w': missing key 'shape'");
  expect_malformed(one("\"w\":{\"dtype\":\"F32\",\"shape\":[2]}"), "tensor 'w': missing key 'data_offsets'");
  expect_malformed(one("\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}"),
                   "tensor 'w': unexpected key 'x'");
  expect_malformed(one(entry("w", "F33", "[2]", 0, 8)), "tensor 'w': unknown dtype 'F33'");
  expect_malformed(one("\"w\":{\"dtype\":5,\"shape\":[2],\"data_offsets\":[0,8]}"), "dtype is not a string");
  expect_malformed(one(entry("w", "F32", "[-2]", 0, 8)), "shape is not a list of non-negative integers");
  expect_malformed(one(entry("w", "F32", "[2.0]", 0, 8)), "shape is not a list of non-negative integers");
  expect_malformed(one(entry("w", "F32", "2", 0, 8)), "shape is not a list");
  expect_malformed(one(entry("w", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4)), "rank 9 exceeds");
  expect_malformed(one(entry("w", "F32", "[4294967296,4294967296]", 0, 8)), "element count overflows");
  expect_malformed(one(entry("w", "F32", "[2305843009213693952,4]", 0, 8)), "element count overflows");
  expect_malformed(one(entry("w", "F32", "[1152921504606846976,4]", 0, 8)), "byte size overflows");
  // Empty, but a stride (suffix product) would overflow int64.
  expect_malformed(one(entry("w", "F32", "[0,4294967296,4294967296]", 0, 0)), "element count overflows");
  expect_malformed(one("\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}"), "not a list [begin, end]");
  expect_malformed(one("\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}"),
                   "data_offsets are not non-negative integers");
  expect_malformed(one("\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1,7]}"),
                   "data_offsets are not non-negative integers");
  expect_malformed(one(entry("w", "F32", "[2]", 8, 0)), "end 0 < begin 8");
  expect_malformed(one(entry("w", "F32", "[2]", 0, 4)), "span 4 bytes but F32 [2] needs 8");
  expect_malformed(one(entry("w", "F32", "[2]", 4, 12)), "run past the data section of 8 bytes");
  expect_malformed(one(entry("w", "F4", "[3]", 0, 2)), "even last dimension");
  expect_malformed(image("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[1]", 4, 8) + "}", 8),
                   "tensor 'b' overlaps tensor 'a'");
  expect_malformed(image("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("a", "F32", "[2]", 8, 16) + "}", 16),
                   "duplicate key 'a' in object '<root>'");
  expect_malformed(image("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
                   "duplicate key 'dtype' in object 'a'");
  expect_malformed(image("{\"__metadata__\":{\"k\":1}}", 0), "__metadata__ value of 'k' is not a string");
  expect_malformed(image("{\"__metadata__\":[1]}", 0), "__metadata__ is not an object");
}

BOOST_AUTO_TEST_CASE(edge_cases_accepted) {
  // Empty tensors occupy no bytes and may share offsets; huge dims times zero are fine.
  std::string h = "{" + entry("e", "F32", "[0,4294967296,2]", 4, 4) + "," + entry("f", "F32", "[1]", 0, 4) + "," +
                  entry("g", "BF16", "[0]", 4, 4) + "}";
  auto r = SafetensorsFile::from_bytes(image(h, 4), "t.safetensors");
  BOOST_REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  BOOST_TEST(r->tensors().size() == 3u);
  // F4 maps to packed kF4E2m1x2 (last dim halved).
  auto f4 = SafetensorsFile::from_bytes(image("{" + entry("q", "F4", "[2,6]", 0, 6) + "}", 6), "t.safetensors");
  BOOST_REQUIRE_MESSAGE(f4.ok(), f4.status().to_string());
  BOOST_TEST((f4->tensors()[0].dtype == DType::kF4E2m1x2));
  BOOST_TEST((f4->tensors()[0].shape == std::vector<int64_t>{2, 3}));
  // Every dtype string.
  for (char const* d : {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E8M0", "I64", "I32", "I16", "I8", "U8", "U16",
                        "U32", "U64", "BOOL"}) {
    auto dt = dtype_from_safetensors(d);
    BOOST_REQUIRE(dt.ok());
    BOOST_TEST(safetensors_dtype_string(*dt) == d);
  }
  BOOST_TEST((*dtype_from_safetensors("F8_E8M0") == DType::kE8m0));
}

BOOST_AUTO_TEST_CASE(open_errors) {
  TempDir td;
  auto r = SafetensorsFile::open((td.path / "missing.safetensors").string());
  BOOST_TEST((r.status().code() == StatusCode::kNotFound));
  write_bytes(td.path / "empty.safetensors", {});
  auto e = SafetensorsFile::open((td.path / "empty.safetensors").string());
  BOOST_TEST((e.status().code() == StatusCode::kMalformedInput));
  BOOST_TEST(e.status().message().find("empty.safetensors: file is 0 bytes") != std::string::npos);
  auto d = SafetensorsFile::open(td.path.string());
  BOOST_TEST(!d.ok());
}

BOOST_AUTO_TEST_CASE(writer_round_trip) {
  uint64_t seed = verify::test_seed(1234);
  std::mt19937_64 g(seed);
  TempDir td;
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("note", "quote \" and \\ backslash");
  std::vector<std::pair<std::string, Tensor>> ref;
  DType const kAll[] = {DType::kF64, DType::kF32, DType::kF16,  DType::kBf16, DType::kF8E4m3, DType::kE8m0,
                        DType::kF4E2m1x2, DType::kI64, DType::kI32, DType::kI16, DType::kI8, DType::kU8,
                        DType::kU16, DType::kU32, DType::kU64, DType::kBool};
  int k = 0;
  for (DType dt : kAll) {
    std::vector<int64_t> shape = {static_cast<int64_t>(1 + g() % 5), static_cast<int64_t>(1 + g() % 7)};
    Tensor t = Tensor::empty(dt, shape).value_or_throw();
    auto* p = static_cast<unsigned char*>(t.data());
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(g());
    std::string name = "t" + std::to_string(k++) + "." + std::string(dtype_name(dt));
    BOOST_REQUIRE(w.add(name, t).ok());
    ref.emplace_back(name, t);
  }
  // A strided (transposed) view is gathered row-major; a 0-d and an empty tensor survive.
  Tensor base = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  AnyTensorView tv = base.view();
  tv.shape[0] = 3; tv.shape[1] = 2; tv.stride[0] = 1; tv.stride[1] = 3;
  BOOST_REQUIRE(w.add("transposed", tv).ok());
  BOOST_REQUIRE(w.add("scalar", Tensor::from_floats({7.5f}, {})).ok());
  BOOST_REQUIRE(w.add("empty", Tensor::zeros(DType::kBf16, {0, 3})).ok());
  BOOST_TEST(!w.add("scalar", Tensor::from_floats({1.f}, {})).ok());      // duplicate
  BOOST_TEST(!w.add("__metadata__", Tensor::from_floats({1.f}, {})).ok());
  fs::path file = td.path / "rt.safetensors";
  BOOST_REQUIRE(w.write(file.string()).ok());
  BOOST_TEST(!fs::exists(file.string() + ".tmp." + std::to_string(::getpid())));

  auto r = SafetensorsFile::open(file.string());
  BOOST_REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  BOOST_TEST(r->data_start() % 8 == 0u);
  BOOST_TEST(r->metadata().at("note") == "quote \" and \\ backslash");
  for (auto const& [name, t] : ref) {
    auto v = r->view(name);
    BOOST_REQUIRE(v.ok());
    BOOST_TEST((v->dtype == t.dtype()));
    BOOST_TEST((v->dims() == t.shape()));
    BOOST_TEST(std::memcmp(v->data, t.data(), t.nbytes()) == 0);
    // Every tensor starts at a multiple of its element size.
    BOOST_TEST(reinterpret_cast<uintptr_t>(v->data) % dtype_size(t.dtype()) == 0u);
  }
  auto c = Checkpoint::open(file.string());
  BOOST_REQUIRE(c.ok());
  auto tr = c->load_f32("transposed");
  BOOST_REQUIRE(tr.ok());
  float const want[] = {1, 4, 2, 5, 3, 6};
  BOOST_TEST(std::memcmp(tr->data(), want, sizeof(want)) == 0);
  BOOST_TEST(c->load_f32("scalar")->data_as<float>()[0] == 7.5f);
  BOOST_TEST((c->load("empty")->shape() == std::vector<int64_t>{0, 3}));
  BOOST_TEST(c->directory() == td.path.string());
  // f4: load_f32 unpacks (low nibble first) and doubles the last dim.
  auto f4 = c->load_f32("t6.f4_e2m1x2");
  BOOST_REQUIRE(f4.ok());
  Tensor const& packed = ref[6].second;
  BOOST_TEST(f4->dim(-1) == 2 * packed.dim(-1));
  auto const* pb = packed.data_as<unsigned char>();
  for (size_t i = 0; i < packed.nbytes(); ++i) {
    BOOST_TEST(f4->data_as<float>()[2 * i] == float_from_fp4_e2m1(pb[i] & 0xF));
    BOOST_TEST(f4->data_as<float>()[2 * i + 1] == float_from_fp4_e2m1(pb[i] >> 4));
  }
}

BOOST_AUTO_TEST_CASE(lazy_producer_error_leaves_no_file) {
  TempDir td;
  SafetensorsWriter w;
  BOOST_REQUIRE(w.add("x", DType::kF32, {4}, [](void*, size_t) { return malformed("producer failed"); }).ok());
  fs::path file = td.path / "x.safetensors";
  Status s = w.write(file.string());
  BOOST_TEST(!s.ok());
  BOOST_TEST(s.message().find("tensor 'x': producer failed") != std::string::npos);
  BOOST_TEST(fs::is_empty(td.path));
}

BOOST_AUTO_TEST_SUITE_END()

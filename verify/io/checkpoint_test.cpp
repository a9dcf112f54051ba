// SPDX-License-Identifier: Apache-2.0
/// Checkpoint resolution and sharding: index.json validated against its shards, duplicate tensors across
/// files refused, plain folders of *.safetensors merged; the golden checkpoints (v41-tiny fp32/bf16, EXL3)
/// open, and the bf16 golden equals RNE(fp32 golden) except for the fp32 islands it keeps.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <type_traits>

#include "tessera/io/safetensors.hpp"
#include "verify/common/golden.hpp"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::io;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tessera_ckpt_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_text(fs::path const& p, std::string const& s) { std::ofstream(p, std::ios::binary) << s; }

void write_shard(fs::path const& p, std::vector<std::string> const& names, float base) {
  SafetensorsWriter w;
  float v = base;
  for (auto const& n : names) {
    BOOST_REQUIRE(w.add(n, Tensor::from_floats({v, v + 1}, {2})).ok());
    v += 10;
  }
  BOOST_REQUIRE(w.write(p.string()).ok());
}

void expect_error(std::string const& path, StatusCode code, std::string const& needle) {
  auto r = Checkpoint::open(path);
  BOOST_TEST_INFO("expected: " << needle);
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST_INFO("message: " << r.status().message());
  BOOST_TEST((r.status().code() == code));
  BOOST_TEST(r.status().message().find(needle) != std::string::npos);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(io_checkpoint)

BOOST_AUTO_TEST_CASE(sharded_index) {
  TempDir td;
  write_shard(td.path / "model-00001-of-00002.safetensors", {"a", "b"}, 0);
  write_shard(td.path / "model-00002-of-00002.safetensors", {"c"}, 100);
  write_text(td.path / "model.safetensors.index.json",
             R"({"metadata":{"total_size":24},"weight_map":{"a":"model-00001-of-00002.safetensors",
                 "b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  auto c = Checkpoint::open(td.path.string());
  BOOST_REQUIRE_MESSAGE(c.ok(), c.status().to_string());
  BOOST_TEST(c->tensors().size() == 3u);
  BOOST_TEST(c->files().size() == 2u);
  BOOST_TEST(c->load_f32("c")->data_as<float>()[1] == 101.f);
  BOOST_TEST(c->tensors()[2].file.find("00002") != std::string::npos);
  BOOST_TEST(c->total_bytes() == 24u);
  // The index path itself also opens.
  auto ci = Checkpoint::open((td.path / "model.safetensors.index.json").string());
  BOOST_REQUIRE(ci.ok());
  BOOST_TEST(ci->directory() == td.path.string());
}

BOOST_AUTO_TEST_CASE(sharded_index_errors) {
  TempDir td;
  write_shard(td.path / "s1.safetensors", {"a", "b"}, 0);
  write_shard(td.path / "s2.safetensors", {"b2", "a"}, 0);
  fs::path idx = td.path / "model.safetensors.index.json";
  auto check = [&](std::string json, StatusCode code, std::string needle) {
    write_text(idx, json);
    expect_error(td.path.string(), code, needle);
  };
  check("{\"weight_map\":", StatusCode::kMalformedInput, "not valid JSON");
  check("[]", StatusCode::kMalformedInput, "not a JSON object");
  check("{}", StatusCode::kMalformedInput, "missing 'weight_map'");
  check(R"({"weight_map":[]})", StatusCode::kMalformedInput, "'weight_map' is not an object");
  check(R"({"weight_map":{}})", StatusCode::kMalformedInput, "'weight_map' is empty");
  check(R"({"weight_map":{"a":1}})", StatusCode::kMalformedInput, "entry 'a' is not a file name string");
  check(R"({"weight_map":{"a":"../s1.safetensors"}})", StatusCode::kMalformedInput, "not a file inside");
  check(R"({"weight_map":{"a":"/etc/passwd"}})", StatusCode::kMalformedInput, "not a file inside");
  check(R"({"weight_map":{"a":"s3.safetensors"}})", StatusCode::kNotFound, "s3.safetensors', which does not exist");
  check(R"({"weight_map":{"zz":"s1.safetensors"}})", StatusCode::kMalformedInput,
        "puts tensor 'zz' in '" + (td.path / "s1.safetensors").string() + "', which has no such tensor");
  check(R"({"weight_map":{"b2":"s1.safetensors"}})", StatusCode::kMalformedInput, "tensor 'b2'");
  check(R"({"weight_map":{"a":"s1.safetensors","b2":"s2.safetensors"}})", StatusCode::kMalformedInput,
        "tensor 'a' is in both");
  check(R"({"weight_map":{"a":"s1.safetensors","a":"s1.safetensors"}})", StatusCode::kMalformedInput,
        "duplicate key 'a' in object 'weight_map'");
  check(R"({"metadata":3,"weight_map":{"a":"s1.safetensors"}})", StatusCode::kMalformedInput,
        "'metadata' is not an object");
  // A malformed shard is reported with its own path.
  std::ofstream(td.path / "bad.safetensors", std::ios::binary) << "1234";
  check(R"({"weight_map":{"x":"bad.safetensors"}})", StatusCode::kMalformedInput, "bad.safetensors: file is 4 bytes");
}

BOOST_AUTO_TEST_CASE(folder_without_index) {
  TempDir td;
  write_shard(td.path / "x.safetensors", {"p"}, 0);
  write_shard(td.path / "y.safetensors", {"q"}, 0);
  auto c = Checkpoint::open(td.path.string());
  BOOST_REQUIRE_MESSAGE(c.ok(), c.status().to_string());
  BOOST_TEST(c->tensors().size() == 2u);
  write_shard(td.path / "z.safetensors", {"p"}, 0);
  expect_error(td.path.string(), StatusCode::kMalformedInput, "tensor 'p' is in both");
  // model.safetensors takes precedence over other files in the folder.
  write_shard(td.path / "model.safetensors", {"m"}, 0);
  auto m = Checkpoint::open(td.path.string());
  BOOST_REQUIRE(m.ok());
  BOOST_TEST(m->tensors().size() == 1u);
  TempDir empty;
  expect_error(empty.path.string(), StatusCode::kNotFound, "no model.safetensors.index.json");
  expect_error((empty.path / "nope").string(), StatusCode::kNotFound, "no such file");
}

BOOST_AUTO_TEST_CASE(golden_v41_tiny) {
  std::string const dir = verify::golden_dir() + "/v41-tiny";
  auto f32 = Checkpoint::open(dir + "/fp32");
  BOOST_REQUIRE_MESSAGE(f32.ok(), f32.status().to_string());
  auto b16 = Checkpoint::open(dir + "/bf16/model.safetensors");
  BOOST_REQUIRE_MESSAGE(b16.ok(), b16.status().to_string());
  BOOST_TEST(f32->tensors().size() == 352u);
  BOOST_TEST(b16->tensors().size() == 352u);
  BOOST_TEST(f32->metadata().at("variant") == "fp32");
  auto emb = f32->view("model.embed.weight");
  BOOST_REQUIRE(emb.ok());
  BOOST_TEST((emb->dims() == std::vector<int64_t>{512, 64}));
  int kept = 0;
  for (size_t i = 0; i < f32->tensors().size(); ++i) {
    TensorInfo const& a = f32->tensors()[i];
    TensorInfo const& b = b16->tensors()[i];
    BOOST_REQUIRE(a.name == b.name);
    BOOST_TEST((a.shape == b.shape));
    auto x = f32->load_f32(a.name).value_or_throw();
    auto y = b16->load_f32(b.name).value_or_throw();
    bool island = b.dtype == DType::kF32;
    kept += island;
    size_t bad = 0;
    for (int64_t j = 0; j < x.numel(); ++j) {
      float want = island ? x.data_as<float>()[j] : round_to_bf16(x.data_as<float>()[j]);
      bad += std::memcmp(&want, y.data_as<float>() + j, 4) != 0;
    }
    BOOST_TEST(bad == 0u, a.name << ": " << bad << " elements differ");
  }
  BOOST_TEST(kept == 63);  // hc_* ×6, attn_sink, gate.bias, gate.bias_vl on 7 layers
}

static_assert(std::is_nothrow_move_constructible_v<SafetensorsFile> && std::is_copy_constructible_v<SafetensorsFile>);
static_assert(std::is_nothrow_move_constructible_v<Checkpoint> && std::is_copy_constructible_v<Checkpoint>);

BOOST_AUTO_TEST_CASE(shared_across_threads_and_moved) {
  auto opened = Checkpoint::open(verify::golden_dir() + "/v41-tiny/bf16").value_or_throw();
  Checkpoint c = std::move(opened);  // views stay valid: the mapping is shared, not owned by the object
  auto sum_all = [&c] {
    double s = 0;
    for (auto const& t : c.tensors()) {
      auto x = c.load_f32(t.name).value_or_throw();
      for (int64_t i = 0; i < x.numel(); ++i) s += x.data_as<float>()[i] * static_cast<double>(i % 7 + 1);
    }
    return s;
  };
  double const want = sum_all();
  std::vector<double> got(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) threads.emplace_back([&, k] { got[static_cast<size_t>(k)] = sum_all(); });
  for (auto& t : threads) t.join();
  for (double g : got) BOOST_TEST(g == want);
  Checkpoint copy = c;  // copies share the mapping too
  BOOST_TEST(copy.view("model.embed.weight")->data == c.view("model.embed.weight")->data);
}

BOOST_AUTO_TEST_CASE(golden_exl3_files) {
  std::string const dir = verify::golden_dir() + "/exl3/";
  for (auto const* f : {"exl3_tables.safetensors", "exl3_golden_128x128.safetensors",
                        "exl3_golden_256x512.safetensors", "exl3_golden_quantized.safetensors"}) {
    auto c = SafetensorsFile::open(dir + f);
    BOOST_REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    BOOST_TEST(c->metadata().at("generator") == "golden_exl3.py v1");
  }
  auto t = Checkpoint::open(dir + "exl3_golden_128x128.safetensors").value_or_throw();
  auto tr = t.view("mul1_K4.trellis");
  BOOST_REQUIRE(tr.ok());
  BOOST_TEST((tr->dtype == DType::kI16));
  BOOST_TEST((tr->dims() == std::vector<int64_t>{8, 8, 64}));
  auto mk = t.load("mul1_K4.mul1").value_or_throw();
  BOOST_TEST(mk.rank() == 0);
  BOOST_TEST(mk.data_as<int32_t>()[0] == -2082680531);
  auto tables = Checkpoint::open(dir + "exl3_tables.safetensors").value_or_throw();
  BOOST_TEST(tables.metadata().at("r_scale_f32_bits") == "0x3db504f3");
  BOOST_TEST((tables.view("hadamard128")->dtype == DType::kI8));
}

BOOST_AUTO_TEST_SUITE_END()

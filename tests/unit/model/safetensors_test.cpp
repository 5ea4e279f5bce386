#include "model/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace moeserve {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moeserve_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A raw file: 8-byte LE length + header text + data bytes.
  fs::path raw_file(const std::string& name, const std::string& header, size_t data_bytes,
                    uint64_t header_len_override = 0) {
    const fs::path p = dir_ / name;
    std::ofstream out(p, std::ios::binary);
    const uint64_t len = header_len_override ? header_len_override : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(len >> (8 * i)));
    out << header;
    out << std::string(data_bytes, '\x11');
    return p;
  }

  std::string open_error(const fs::path& p) {
    auto f = SafetensorsFile::open(p);
    EXPECT_FALSE(f) << p;
    return f ? std::string() : f.error().message;
  }

  fs::path dir_;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  const std::vector<std::pair<DType, Shape>> cases = {
      {DType::kBF16, Shape{3, 5}},   {DType::kF16, Shape{7}},       {DType::kF32, Shape{2, 3, 4}},
      {DType::kF8E4M3, Shape{4, 9}}, {DType::kF8E8M0, Shape{1, 3}}, {DType::kI8, Shape{5, 3}},
      {DType::kU8, Shape{11}},       {DType::kI32, Shape{3}},       {DType::kI64, Shape{2, 2}},
      {DType::kF8E5M2, Shape{6}},    {DType::kF32, Shape{}},        {DType::kBF16, Shape{0, 4}},
  };
  std::vector<std::vector<uint8_t>> data;
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < cases.size(); ++i) {
    data.push_back(
        pattern(dtype_bytes(cases[i].first, cases[i].second.numel()), static_cast<uint8_t>(i)));
  }
  for (size_t i = 0; i < cases.size(); ++i)
    tensors.push_back({"t" + std::to_string(i), cases[i].first, cases[i].second, data[i]});
  const fs::path p = dir_ / "a.safetensors";
  ASSERT_TRUE(write_safetensors(p, tensors, {{"format", "pt"}}));
  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->data_offset() % 8, 0u);
  ASSERT_EQ(f->entries().size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const SafetensorsEntry* e = f->find("t" + std::to_string(i));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, cases[i].first);
    EXPECT_EQ(e->shape, cases[i].second);
    auto bytes = f->bytes(*e);
    EXPECT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.end()), data[i]) << i;
    TensorView v = f->view(*e);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % (dtype_bits(e->dtype) / 8), 0u) << i;
  }
  // Deterministic bytes.
  const fs::path q = dir_ / "b.safetensors";
  ASSERT_TRUE(write_safetensors(q, tensors, {{"format", "pt"}}));
  std::ifstream a(p, std::ios::binary), b(q, std::ios::binary);
  std::string sa((std::istreambuf_iterator<char>(a)), {}),
      sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(sa, sb);
}

TEST_F(SafetensorsTest, WriterRefusesBadInput) {
  std::vector<uint8_t> d(3);
  TensorToWrite t{"x", DType::kF32, Shape{1}, d};
  EXPECT_FALSE(write_safetensors(dir_ / "x.safetensors", std::span(&t, 1)));
  TensorToWrite fp4{"y", DType::kFp4E2m1, Shape{6}, d};
  EXPECT_FALSE(write_safetensors(dir_ / "y.safetensors", std::span(&fp4, 1)));
}

TEST_F(SafetensorsTest, CorruptFilesGiveClearErrors) {
  {
    const fs::path p = dir_ / "short.safetensors";
    std::ofstream(p, std::ios::binary) << "abc";
    EXPECT_THAT(open_error(p), HasSubstr("short.safetensors: truncated header"));
  }
  EXPECT_THAT(open_error(raw_file("past.safetensors", "{}", 0, 1000)),
              HasSubstr("past.safetensors: header length 1000 runs past the end of the file"));
  EXPECT_THAT(open_error(raw_file("notjson.safetensors", "{\"a\": [1, 2", 0)),
              HasSubstr("notjson.safetensors: the 11-byte header is not valid JSON"));
  EXPECT_THAT(
      open_error(raw_file("dtype.safetensors",
                          R"({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", 1)),
      HasSubstr("dtype.safetensors: tensor 'w': unknown dtype \"F4\""));
  EXPECT_THAT(
      open_error(raw_file("range.safetensors",
                          R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", 4)),
      HasSubstr("range.safetensors: tensor 'w': data_offsets [0, 8] out of range (data section "
                "has 4 bytes)"));
  EXPECT_THAT(open_error(raw_file("overlap.safetensors",
                                  R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                      "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})",
                                  8)),
              HasSubstr("overlap.safetensors: tensors 'a' and 'b' overlap"));
  EXPECT_THAT(
      open_error(raw_file("size.safetensors",
                          R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}})", 4)),
      HasSubstr("size.safetensors: tensor 'w': shape [3] × BF16 needs 6 bytes but data_offsets "
                "[0, 4] hold 4"));
  EXPECT_THAT(open_error(raw_file("dup.safetensors",
                                  R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                      "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                                  2)),
              HasSubstr("dup.safetensors: tensor 'w': duplicate name"));
  EXPECT_THAT(open_error(dir_ / "absent.safetensors"),
              HasSubstr("absent.safetensors: cannot open"));
}

TEST_F(SafetensorsTest, ShardedIndex) {
  auto a = pattern(8, 1), b = pattern(6, 2), c = pattern(4, 3);
  std::vector<TensorToWrite> s1 = {{"x", DType::kF32, Shape{2}, a},
                                   {"y", DType::kBF16, Shape{3}, b}};
  std::vector<TensorToWrite> s2 = {{"z", DType::kI8, Shape{4}, c}};
  ASSERT_TRUE(write_safetensors(dir_ / "model-00001-of-00002.safetensors", s1));
  ASSERT_TRUE(write_safetensors(dir_ / "model-00002-of-00002.safetensors", s2));
  auto write_index = [&](const std::string& text) {
    std::ofstream(dir_ / "model.safetensors.index.json") << text;
  };
  write_index(R"({"metadata": {"total_size": 18}, "weight_map": {
      "x": "model-00001-of-00002.safetensors", "y": "model-00001-of-00002.safetensors",
      "z": "model-00002-of-00002.safetensors"}})");
  std::vector<LoadProgress> reports;
  CheckpointLoadOptions opts;
  opts.num_threads = 2;
  opts.progress = [&](const LoadProgress& p) { reports.push_back(p); };
  auto ck = CheckpointLoader(opts).load(dir_);
  ASSERT_TRUE(ck) << ck.error().to_string();
  ASSERT_EQ(ck->tensors().size(), 3u);
  EXPECT_EQ(ck->find("z")->shard, 1);
  EXPECT_EQ(ck->find("y")->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(ck->find("z")->view.data(), c.data(), 4), 0);
  EXPECT_EQ(ck->total_bytes(), 18u);
  EXPECT_EQ(ck->metadata().at("total_size"), "18");
  ASSERT_FALSE(reports.empty());
  EXPECT_TRUE(reports.back().finished);
  EXPECT_EQ(reports.back().files_done, 2);
  EXPECT_EQ(reports.back().bytes_done, reports.back().bytes_total);

  // A missing shard is named.
  write_index(R"({"weight_map": {"x": "model-00001-of-00002.safetensors",
                                 "w": "model-00003-of-00003.safetensors"}})");
  auto bad = CheckpointLoader().load(dir_);
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message,
              HasSubstr("missing shard: 'model-00003-of-00003.safetensors' (holds 'w')"));

  // A tensor the index puts in the wrong shard.
  write_index(R"({"weight_map": {"x": "model-00002-of-00002.safetensors",
                                 "y": "model-00001-of-00002.safetensors",
                                 "z": "model-00002-of-00002.safetensors"}})");
  bad = CheckpointLoader().load(dir_ / "model.safetensors.index.json");
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("tensor 'x' is mapped to"));

  // A corrupt shard's error names the shard file.
  { std::ofstream(dir_ / "model-00002-of-00002.safetensors", std::ios::binary) << "xx"; }
  write_index(R"({"weight_map": {"x": "model-00001-of-00002.safetensors",
                                 "z": "model-00002-of-00002.safetensors"}})");
  bad = CheckpointLoader().load(dir_);
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("model-00002-of-00002.safetensors: truncated header"));
}

TEST_F(SafetensorsTest, DirectoryWithoutIndexAndDuplicateAcrossShards) {
  auto a = pattern(4, 1);
  std::vector<TensorToWrite> s = {{"x", DType::kU8, Shape{4}, a}};
  ASSERT_TRUE(write_safetensors(dir_ / "a.safetensors", s));
  ASSERT_TRUE(write_safetensors(dir_ / "b.safetensors", s));
  auto bad = CheckpointLoader().load(dir_);
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("tensor 'x' appears in two shards"));
  fs::remove(dir_ / "b.safetensors");
  auto ok = CheckpointLoader().load(dir_);
  ASSERT_TRUE(ok) << ok.error().to_string();
  EXPECT_EQ(ok->tensors().size(), 1u);
}

}  // namespace
}  // namespace moeserve

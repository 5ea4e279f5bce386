// A bad checkpoint fails to load with an error naming the offending tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "integration/model/oracle_util.h"
#include "model/arch/deepseek_v41.h"

namespace moeserve::test {
namespace {

namespace fs = std::filesystem;

// Copies the tiny checkpoint with its safetensors header edited by `edit`.
fs::path edited_checkpoint(const std::string& tag,
                           const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = make_temp_dir(tag);
  fs::copy_file(tiny_model_dir() / "config.json", dir / "config.json");
  std::ifstream in(tiny_model_dir() / "model.safetensors", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(std::string(bytes.data() + 8, header_len));
  edit(header);
  const std::string text = header.dump();
  const uint64_t new_len = text.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&new_len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(bytes.data() + 8 + header_len,
            static_cast<std::streamsize>(bytes.size() - 8 - header_len));
  return dir;
}

std::string load_error(const fs::path& dir) {
  auto backend = make_cpu_backend();
  auto model = arch::DeepseekV41Model::load(dir, *backend);
  return model ? std::string() : model.error().message;
}

TEST(CheckpointErrors, MissingExpertTensorIsNamed) {
  const std::string name = "layers.3.ffn.experts.5.w2.weight";
  const fs::path dir = edited_checkpoint("missing", [&](nlohmann::json& h) { h.erase(name); });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find(name), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(CheckpointErrors, WrongShapeIsNamed) {
  const std::string name = "layers.2.attn.wq_b.weight";
  const fs::path dir = edited_checkpoint("shape", [&](nlohmann::json& h) {
    auto shape = h[name]["shape"].get<std::vector<int64_t>>();
    std::swap(shape[0], shape[1]);  // same bytes, transposed shape
    h[name]["shape"] = shape;
  });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find(name), std::string::npos) << err;
  EXPECT_NE(err.find("shape"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(CheckpointErrors, MissingDraftHeadIsNamed) {
  const std::string name = "mtp.2.markov_head.head.weight";
  const fs::path dir = edited_checkpoint("draft", [&](nlohmann::json& h) { h.erase(name); });
  const std::string err = load_error(dir);
  EXPECT_NE(err.find(name), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(CheckpointErrors, GoodCheckpointLoads) { EXPECT_EQ(load_error(tiny_model_dir()), ""); }

}  // namespace
}  // namespace moeserve::test

// The compressor's partial group (model.md §2.3) carried across forward calls: after N tokens a
// ratio-2 KV source holds N/2 entries and N%2 buffered rows, a ratio-1 source N entries and none;
// an entry whose group straddles a call boundary has the same bytes as in a one-shot prefill.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/arch/deepseek_v41.h"
#include "model/tiny_model.h"

namespace moeserve::arch {
namespace {

namespace fs = std::filesystem;

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV41Model> model;
};

Loaded load_tiny() {
  const fs::path dir =
      fs::temp_directory_path() / ("moeserve_arch_unit_" + std::to_string(::getpid())) / "tiny";
  std::ifstream in(std::string(MOESERVE_SOURCE_DIR) + "/configs/tiny/config.json");
  std::stringstream json;
  json << in.rdbuf();
  fs::create_directories(dir);
  if (auto st = write_generated_model(dir, json.str(), /*seed=*/0); !st)
    throw std::runtime_error(st.error().to_string());
  Loaded l;
  l.backend = make_cpu_backend();
  auto m = DeepseekV41Model::load(dir, *l.backend);
  if (!m) throw std::runtime_error(m.error().to_string());
  l.model = std::move(*m);
  fs::remove_all(dir.parent_path());
  return l;
}

std::vector<int32_t> prompt(int32_t n) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; ++i) ids.push_back(3 + (i * 37) % 250);
  return ids;
}

void run(DeepseekV41Model& m, SequenceState& s, std::span<const int32_t> tokens) {
  SequenceInput in;
  in.state = &s;
  in.tokens = tokens;
  in.logits = LogitsRows::kNone;
  auto out = m.forward({&in, 1}, ForwardMode::kOracle);
  ASSERT_TRUE(out.has_value()) << out.error().to_string();
}

TEST(CompressorCarry, PartialGroupsCrossCallBoundaries) {
  Loaded l = load_tiny();
  const ModelConfig& c = l.model->config();
  const std::vector<int32_t> ids = prompt(12);
  auto one_shot = l.model->new_state();
  run(*l.model, *one_shot, ids);

  auto s = l.model->new_state();
  int32_t done = 0;
  for (int32_t len : {3, 1, 1, 4, 3}) {
    run(*l.model, *s,
        std::span<const int32_t>(ids).subspan(static_cast<size_t>(done), static_cast<size_t>(len)));
    done += len;
    for (int32_t layer : c.kv_source_layer_ids) {
      const int32_t ratio = c.layer(layer).ratio;
      const CompressorPartial& part = s->compressor_partial(layer);
      EXPECT_EQ(s->num_global_entries(layer), done / ratio) << "layer " << layer << " @" << done;
      EXPECT_EQ(part.rows, done % ratio) << "layer " << layer << " @" << done;
      EXPECT_EQ(part.kv.size(), static_cast<size_t>(part.rows * c.head_dim));
      EXPECT_EQ(part.gate.size(), ratio > 1 ? static_cast<size_t>(part.rows * c.head_dim) : 0u);
    }
  }
  ASSERT_EQ(done, 12);
  // Groups 1 (positions 2,3: chunk 3 | 1) and 4 (8,9: chunk 4 | 3) straddled a call boundary.
  for (int32_t layer : c.kv_source_layer_ids) {
    ASSERT_EQ(s->num_global_entries(layer), one_shot->num_global_entries(layer));
    for (int64_t j = 0; j < s->num_global_entries(layer); ++j) {
      const auto a = s->main_entry(layer, j), b = one_shot->main_entry(layer, j);
      EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()))
          << "main entry " << j << " of layer " << layer;
      const auto ka = s->index_key(layer, j), kb = one_shot->index_key(layer, j);
      EXPECT_TRUE(std::equal(ka.begin(), ka.end(), kb.begin(), kb.end()))
          << "index key " << j << " of layer " << layer;
    }
  }
  EXPECT_GT(l.model->stats().compressor_partial_carries, 0);
}

}  // namespace
}  // namespace moeserve::arch

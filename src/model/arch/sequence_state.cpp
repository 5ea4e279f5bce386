#include "model/arch/sequence_state.h"

#include <algorithm>

#include "common/check.h"

namespace moeserve::arch {

CacheGeometry CacheGeometry::from_config(const ModelConfig& config) {
  CacheGeometry g;
  g.head_dim = config.head_dim;
  g.index_head_dim = config.index_head_dim;
  g.window = config.sliding_window;
  g.swa_row_bytes = static_cast<size_t>(config.head_dim + config.head_dim / 32);
  g.main_entry_bytes = static_cast<size_t>(config.head_dim / 2 + config.head_dim / 16);
  g.index_key_bytes = static_cast<size_t>(config.index_head_dim / 2 + config.index_head_dim / 32);
  return g;
}

ContiguousSequenceState::ContiguousSequenceState(const ModelConfig& config)
    : geometry_(CacheGeometry::from_config(config)), num_layers_(config.num_hidden_layers) {
  const size_t ring = static_cast<size_t>(geometry_.window) * geometry_.swa_row_bytes;
  swa_.assign(static_cast<size_t>(num_layers_), std::vector<uint8_t>(ring, 0));
  global_slot_.assign(static_cast<size_t>(num_layers_), -1);
  for (int32_t l : config.kv_source_layer_ids) {
    global_slot_[static_cast<size_t>(l)] = static_cast<int32_t>(globals_.size());
    globals_.emplace_back();
    partials_.emplace_back();
  }
  engram_history_.last_ids.assign(static_cast<size_t>(config.engram_max_ngram_size - 1), -1);
  dspark_.assign(static_cast<size_t>(config.num_nextn_predict_layers),
                 std::vector<uint8_t>(ring, 0));
}

std::span<uint8_t> ContiguousSequenceState::swa_row(int32_t layer, int32_t pos) {
  MS_CHECK(layer >= 0 && layer < num_layers_ && pos >= 0);
  const size_t slot = static_cast<size_t>(pos % geometry_.window);
  return std::span<uint8_t>(swa_[static_cast<size_t>(layer)])
      .subspan(slot * geometry_.swa_row_bytes, geometry_.swa_row_bytes);
}

ContiguousSequenceState::GlobalCache& ContiguousSequenceState::global(int32_t layer) {
  MS_CHECK(layer >= 0 && layer < num_layers_);
  const int32_t slot = global_slot_[static_cast<size_t>(layer)];
  MS_CHECK_MSG(slot >= 0, "layer {} is not a KV source", layer);
  return globals_[static_cast<size_t>(slot)];
}

const ContiguousSequenceState::GlobalCache& ContiguousSequenceState::global(int32_t layer) const {
  return const_cast<ContiguousSequenceState*>(this)->global(layer);
}

int64_t ContiguousSequenceState::num_global_entries(int32_t layer) const {
  return global(layer).entries;
}

void ContiguousSequenceState::append_global_entry(int32_t layer, std::span<const uint8_t> main,
                                                  std::span<const uint8_t> index_key) {
  MS_CHECK_EQ(main.size(), geometry_.main_entry_bytes);
  MS_CHECK_EQ(index_key.size(), geometry_.index_key_bytes);
  GlobalCache& g = global(layer);
  g.main.insert(g.main.end(), main.begin(), main.end());
  g.index.insert(g.index.end(), index_key.begin(), index_key.end());
  ++g.entries;
}

std::span<const uint8_t> ContiguousSequenceState::main_entry(int32_t layer, int64_t j) const {
  const GlobalCache& g = global(layer);
  MS_CHECK(j >= 0 && j < g.entries);
  return std::span<const uint8_t>(g.main).subspan(
      static_cast<size_t>(j) * geometry_.main_entry_bytes, geometry_.main_entry_bytes);
}

std::span<const uint8_t> ContiguousSequenceState::index_key(int32_t layer, int64_t j) const {
  const GlobalCache& g = global(layer);
  MS_CHECK(j >= 0 && j < g.entries);
  return std::span<const uint8_t>(g.index).subspan(
      static_cast<size_t>(j) * geometry_.index_key_bytes, geometry_.index_key_bytes);
}

CompressorPartial& ContiguousSequenceState::compressor_partial(int32_t layer) {
  MS_CHECK(layer >= 0 && layer < num_layers_);
  const int32_t slot = global_slot_[static_cast<size_t>(layer)];
  MS_CHECK_MSG(slot >= 0, "layer {} is not a KV source", layer);
  return partials_[static_cast<size_t>(slot)];
}

std::span<uint8_t> ContiguousSequenceState::dspark_row(int32_t stage, int32_t pos) {
  MS_CHECK(stage >= 0 && static_cast<size_t>(stage) < dspark_.size() && pos >= 0);
  const size_t slot = static_cast<size_t>(pos % geometry_.window);
  return std::span<uint8_t>(dspark_[static_cast<size_t>(stage)])
      .subspan(slot * geometry_.swa_row_bytes, geometry_.swa_row_bytes);
}

size_t ContiguousSequenceState::cache_bytes() const {
  size_t total = 0;
  for (const auto& r : swa_) total += r.size();
  for (const auto& g : globals_) total += g.main.size() + g.index.size();
  for (const auto& r : dspark_) total += r.size();
  return total;
}

}  // namespace moeserve::arch

#include "kv/paged_sequence_state.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"

namespace moeserve::kv {

PagedSequenceState::PagedSequenceState(KvStorage& storage, const ModelConfig& config,
                                       int32_t state_slot, const std::vector<int32_t>* block_table)
    : storage_(storage),
      block_table_(block_table),
      state_slot_(state_slot),
      window_(config.sliding_window),
      swa_row_bytes_(config.swa_row_bytes()),
      swa_kind_(storage.find_kind(CacheKind::kSwaRing)),
      num_swa_layers_(config.num_total_layers()),
      dspark_kind_(storage.find_kind(CacheKind::kDsparkRing)),
      num_dspark_stages_(config.num_nextn_predict_layers) {
  MS_CHECK_MSG(swa_kind_ >= 0, "KV layout has no SWA ring kind");
  MS_CHECK(state_slot_ >= 0 && state_slot_ < storage_.num_state_slots());
  global_index_.assign(static_cast<size_t>(config.num_hidden_layers), -1);
  for (int32_t l : config.kv_source_layer_ids) {
    Global g;
    g.layer = l;
    g.ratio = config.compress_ratios[static_cast<size_t>(l)];
    g.main_kind = storage_.find_kind(CacheKind::kGlobalMain, l);
    g.index_kind = storage_.find_kind(CacheKind::kGlobalIndex, l);
    MS_CHECK_MSG(g.main_kind >= 0 && g.index_kind >= 0, "KV layout lacks layer {}", l);
    const CacheKindSpec& spec = storage_.layout().kinds[static_cast<size_t>(g.main_kind)];
    g.entries_per_block = spec.entries_per_block;
    MS_CHECK_EQ(g.entries_per_block * g.ratio, storage_.block_tokens());
    g.main_bytes = spec.entry_bytes;
    g.index_bytes = storage_.layout().kinds[static_cast<size_t>(g.index_kind)].entry_bytes;
    global_index_[static_cast<size_t>(l)] = static_cast<int32_t>(globals_.size());
    globals_.push_back(g);
    partials_.emplace_back();
  }
  engram_history_.last_ids.assign(
      static_cast<size_t>(std::max(0, config.engram_max_ngram_size - 1)), -1);
}

Status PagedSequenceState::adopt_prefix(int32_t cached_tokens, int32_t resume_at) {
  if (num_tokens_ != 0) {
    return make_error(ErrorCode::kInternal, "adopt_prefix on a state at {} tokens",
                      num_tokens_);
  }
  const int32_t bt = storage_.block_tokens();
  if (cached_tokens < 0 || cached_tokens % bt != 0 || resume_at < 0 || resume_at > cached_tokens) {
    return make_error(ErrorCode::kInvalidArgument,
                      "adopt_prefix: cached {} (block {}) resume at {} is not a block prefix",
                      cached_tokens, bt, resume_at);
  }
  const size_t blocks = static_cast<size_t>(cached_tokens / bt);
  if (block_table_ == nullptr || block_table_->size() < blocks) {
    return make_error(ErrorCode::kInternal, "adopt_prefix: {} cached blocks, table holds {}",
                      blocks, block_table_ == nullptr ? 0 : block_table_->size());
  }
  for (Global& g : globals_) {
    if (resume_at % g.ratio != 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "adopt_prefix: resume position {} splits a ratio-{} group of layer {}",
                        resume_at, g.ratio, g.layer);
    }
    g.entries = cached_tokens / g.ratio;
  }
  num_tokens_ = resume_at;
  swa_floor_ = resume_at;
  return ok_status();
}

const PagedSequenceState::Global& PagedSequenceState::global(int32_t layer) const {
  MS_CHECK(layer >= 0 && layer < static_cast<int32_t>(global_index_.size()));
  const int32_t i = global_index_[static_cast<size_t>(layer)];
  MS_CHECK_MSG(i >= 0, "layer {} holds no global cache", layer);
  return globals_[static_cast<size_t>(i)];
}

std::span<uint8_t> PagedSequenceState::entry(const Global& g, int32_t kind, size_t bytes,
                                             int64_t j) const {
  MS_CHECK(block_table_ != nullptr && j >= 0);
  const size_t block = static_cast<size_t>(j / g.entries_per_block);
  MS_CHECK_MSG(block < block_table_->size(), "layer {} entry {} needs block {}, table holds {}",
               g.layer, j, block, block_table_->size());
  const std::span<uint8_t> page = storage_.page(kind, (*block_table_)[block]);
  return page.subspan(static_cast<size_t>(j % g.entries_per_block) * bytes, bytes);
}

std::span<uint8_t> PagedSequenceState::swa_row(int32_t layer, int32_t pos) {
  MS_CHECK(layer >= 0 && layer < num_swa_layers_ && pos >= 0);
  const size_t row = static_cast<size_t>(layer) * static_cast<size_t>(window_) +
                     static_cast<size_t>(pos % window_);
  return storage_.page(swa_kind_, state_slot_).subspan(row * swa_row_bytes_, swa_row_bytes_);
}

int64_t PagedSequenceState::num_global_entries(int32_t layer) const {
  return global(layer).entries;
}

void PagedSequenceState::append_global_entry(int32_t layer, std::span<const uint8_t> main,
                                             std::span<const uint8_t> index_key) {
  Global& g = globals_[static_cast<size_t>(global_index_.at(static_cast<size_t>(layer)))];
  MS_CHECK_EQ(main.size(), g.main_bytes);
  MS_CHECK_EQ(index_key.size(), g.index_bytes);
  std::memcpy(entry(g, g.main_kind, g.main_bytes, g.entries).data(), main.data(), main.size());
  std::memcpy(entry(g, g.index_kind, g.index_bytes, g.entries).data(), index_key.data(),
              index_key.size());
  ++g.entries;
}

std::span<const uint8_t> PagedSequenceState::main_entry(int32_t layer, int64_t j) const {
  const Global& g = global(layer);
  MS_CHECK_LT(j, g.entries);
  return entry(g, g.main_kind, g.main_bytes, j);
}

std::span<const uint8_t> PagedSequenceState::index_key(int32_t layer, int64_t j) const {
  const Global& g = global(layer);
  MS_CHECK_LT(j, g.entries);
  return entry(g, g.index_kind, g.index_bytes, j);
}

arch::CompressorPartial& PagedSequenceState::compressor_partial(int32_t layer) {
  MS_CHECK(layer >= 0 && layer < static_cast<int32_t>(global_index_.size()));
  const int32_t i = global_index_[static_cast<size_t>(layer)];
  MS_CHECK_MSG(i >= 0, "layer {} has no compressor", layer);
  return partials_[static_cast<size_t>(i)];
}

std::span<uint8_t> PagedSequenceState::dspark_row(int32_t stage, int32_t pos) {
  MS_CHECK_MSG(dspark_kind_ >= 0, "KV layout has no DSpark ring");
  MS_CHECK(stage >= 0 && stage < num_dspark_stages_ && pos >= 0);
  const size_t row = static_cast<size_t>(stage) * static_cast<size_t>(window_) +
                     static_cast<size_t>(pos % window_);
  return storage_.page(dspark_kind_, state_slot_).subspan(row * swa_row_bytes_, swa_row_bytes_);
}

}  // namespace moeserve::kv

// PagedSequenceState: the forward's SequenceState (model/arch/sequence_state.h) as views of the KV
// pools (KvStorage). Global main entries and index keys of KV-source layer l live in the request's
// blocks: entry j (= compressor group j, tokens [j*r, (j+1)*r)) is row j % (B/r) of block
// table[j / (B/r)], B = block_tokens, r = the layer's ratio. SWA rings and DSpark rings live in the
// request's state slot (row for position p at p % window). The compressor's partial group and the
// Engram history are a few hundred bytes and stay in this object.
//
// A prefix hit (adopt_prefix) makes the leading cached blocks' entries visible without computing
// them; the SWA rings are then rebuilt by replaying tokens from `swa_floor` (model.md §2.6): the
// forward floors every SWA read at swa_floor() and leaves existing global entries untouched.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/result.h"
#include "kv/kv_storage.h"
#include "model/arch/sequence_state.h"
#include "model/config.h"

namespace moeserve::kv {

class PagedSequenceState final : public arch::SequenceState {
 public:
  // `block_table` must outlive this object or be replaced with set_block_table() before use.
  PagedSequenceState(KvStorage& storage, const ModelConfig& config, int32_t state_slot,
                     const std::vector<int32_t>* block_table);

  void set_block_table(const std::vector<int32_t>* block_table) { block_table_ = block_table; }

  // The first `cached_tokens` tokens (whole blocks) have global entries in the leading blocks of
  // the table; computation resumes at `resume_at` <= cached_tokens (SWA rows exist from there
  // on). Fails if the table is too short or resume_at splits a compressor group.
  [[nodiscard]] Status adopt_prefix(int32_t cached_tokens, int32_t resume_at);

  [[nodiscard]] int32_t num_tokens() const override { return num_tokens_; }
  void set_num_tokens(int32_t n) override { num_tokens_ = n; }
  [[nodiscard]] int32_t replay_start() const override { return replay_start_; }
  void set_replay_start(int32_t pos) override { replay_start_ = pos; }
  [[nodiscard]] int32_t swa_floor() const override { return swa_floor_; }
  [[nodiscard]] std::span<uint8_t> swa_row(int32_t layer, int32_t pos) override;
  [[nodiscard]] int64_t num_global_entries(int32_t layer) const override;
  void append_global_entry(int32_t layer, std::span<const uint8_t> main,
                           std::span<const uint8_t> index_key) override;
  [[nodiscard]] std::span<const uint8_t> main_entry(int32_t layer, int64_t j) const override;
  [[nodiscard]] std::span<const uint8_t> index_key(int32_t layer, int64_t j) const override;
  [[nodiscard]] arch::CompressorPartial& compressor_partial(int32_t layer) override;
  [[nodiscard]] EngramHistory& engram_history() override { return engram_history_; }
  [[nodiscard]] std::span<uint8_t> dspark_row(int32_t stage, int32_t pos) override;
  [[nodiscard]] int32_t dspark_begin() const override { return dspark_begin_; }
  [[nodiscard]] int32_t dspark_end() const override { return dspark_end_; }
  void set_dspark_range(int32_t begin, int32_t end) override {
    dspark_begin_ = begin;
    dspark_end_ = end;
  }

 private:
  struct Global {
    int32_t layer = -1;
    int32_t ratio = 1;
    int32_t main_kind = -1;
    int32_t index_kind = -1;
    int32_t entries_per_block = 0;
    size_t main_bytes = 0;
    size_t index_bytes = 0;
    int64_t entries = 0;
  };
  [[nodiscard]] const Global& global(int32_t layer) const;
  [[nodiscard]] std::span<uint8_t> entry(const Global& g, int32_t kind, size_t bytes,
                                         int64_t j) const;

  KvStorage& storage_;
  const std::vector<int32_t>* block_table_ = nullptr;
  int32_t state_slot_ = -1;
  int32_t window_ = 0;
  size_t swa_row_bytes_ = 0;
  int32_t swa_kind_ = -1;
  int32_t num_swa_layers_ = 0;
  int32_t dspark_kind_ = -1;
  int32_t num_dspark_stages_ = 0;
  int32_t num_tokens_ = 0;
  int32_t replay_start_ = 0;
  int32_t swa_floor_ = 0;
  std::vector<int32_t> global_index_;  // layer -> index into globals_ (-1: not a KV source)
  std::vector<Global> globals_;
  std::vector<arch::CompressorPartial> partials_;  // parallel to globals_
  EngramHistory engram_history_;
  int32_t dspark_begin_ = 0;
  int32_t dspark_end_ = 0;
};

}  // namespace moeserve::kv

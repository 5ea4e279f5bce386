// SequenceState: everything one request carries between forward calls (model.md §2.2–§2.3, §4,
// §6.1) behind one interface, so the paged KV manager can implement it later:
//   - per backbone layer an SWA ring of `window` rows, each hd e4m3 + hd/32 ue8m0 (528 B at hd
//   512),
//     slot = position % window;
//   - per KV-source layer the global cache: main entries (hd/2 B e2m1 + hd/16 e4m3 scales = 288 B)
//     and index keys (ID/2 B e2m1 + ID/32 ue8m0 = 68 B), append-only, entry j = group j;
//   - per ratio-2 KV source the compressor's partial group (fp32 kv/gate rows not yet pooled);
//   - the Engram n-gram history;
//   - per DSpark stage a context ring (same row format as SWA) of committed positions.
// The caches hold the real quantised bytes (not fake-quant float copies); dequantising them gives
// exactly the fake-quant values (fake_quant.h invariant).
// Invariant: positions [0, num_tokens()) are written in every cache kind that covers them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/engram_table.h"

namespace moeserve::arch {

// Byte geometry of the cache rows (derived from the config).
struct CacheGeometry {
  int32_t head_dim = 0;         // hd
  int32_t index_head_dim = 0;   // ID
  int32_t window = 0;           // sliding_window
  size_t swa_row_bytes = 0;     // hd + hd/32
  size_t main_entry_bytes = 0;  // hd/2 + hd/16
  size_t index_key_bytes = 0;   // ID/2 + ID/32

  [[nodiscard]] static CacheGeometry from_config(const ModelConfig& config);
};

// Buffered rows of a compressor group that has not completed yet (ratio r > 1: at most r-1 rows).
struct CompressorPartial {
  int32_t rows = 0;         // buffered rows (positions r*j .. r*j + rows - 1)
  std::vector<float> kv;    // [rows, hd] compressor.wkv outputs
  std::vector<float> gate;  // [rows, hd] compressor.wgate outputs
};

class SequenceState {
 public:
  virtual ~SequenceState() = default;

  // Positions already consumed by the backbone (the next token's position).
  [[nodiscard]] virtual int32_t num_tokens() const = 0;
  virtual void set_num_tokens(int32_t n) = 0;
  // First position decoder layers ran on (production bounded replay: max(0, P - window));
  // decoder SWA reads are floored here. 0 in oracle mode.
  [[nodiscard]] virtual int32_t replay_start() const = 0;
  virtual void set_replay_start(int32_t pos) = 0;
  // First position with SWA rows in this state: after a prefix-cache hit the rings are rebuilt by
  // replaying from here (encoder bounded replay, §2.6) and every SWA read is floored here. Global
  // entries that already exist when the forward reaches their group are left as they are.
  [[nodiscard]] virtual int32_t swa_floor() const { return 0; }

  // SWA ring row of backbone layer `layer` for absolute position `pos`.
  [[nodiscard]] virtual std::span<uint8_t> swa_row(int32_t layer, int32_t pos) = 0;

  // Global cache of KV-source layer `layer`.
  [[nodiscard]] virtual int64_t num_global_entries(int32_t layer) const = 0;
  virtual void append_global_entry(int32_t layer, std::span<const uint8_t> main,
                                   std::span<const uint8_t> index_key) = 0;
  [[nodiscard]] virtual std::span<const uint8_t> main_entry(int32_t layer, int64_t j) const = 0;
  [[nodiscard]] virtual std::span<const uint8_t> index_key(int32_t layer, int64_t j) const = 0;

  [[nodiscard]] virtual CompressorPartial& compressor_partial(int32_t layer) = 0;
  [[nodiscard]] virtual EngramHistory& engram_history() = 0;

  // DSpark context ring of draft stage `stage` (row for absolute position `pos`) and the range of
  // committed positions pushed so far ([dspark_begin, dspark_end); only the last `window` of them
  // are still held).
  [[nodiscard]] virtual std::span<uint8_t> dspark_row(int32_t stage, int32_t pos) = 0;
  [[nodiscard]] virtual int32_t dspark_begin() const = 0;
  [[nodiscard]] virtual int32_t dspark_end() const = 0;
  virtual void set_dspark_range(int32_t begin, int32_t end) = 0;
};

// The simple implementation: contiguous vectors per cache kind, global caches grow by push_back.
class ContiguousSequenceState final : public SequenceState {
 public:
  explicit ContiguousSequenceState(const ModelConfig& config);

  [[nodiscard]] int32_t num_tokens() const override { return num_tokens_; }
  void set_num_tokens(int32_t n) override { num_tokens_ = n; }
  [[nodiscard]] int32_t replay_start() const override { return replay_start_; }
  void set_replay_start(int32_t pos) override { replay_start_ = pos; }
  [[nodiscard]] std::span<uint8_t> swa_row(int32_t layer, int32_t pos) override;
  [[nodiscard]] int64_t num_global_entries(int32_t layer) const override;
  void append_global_entry(int32_t layer, std::span<const uint8_t> main,
                           std::span<const uint8_t> index_key) override;
  [[nodiscard]] std::span<const uint8_t> main_entry(int32_t layer, int64_t j) const override;
  [[nodiscard]] std::span<const uint8_t> index_key(int32_t layer, int64_t j) const override;
  [[nodiscard]] CompressorPartial& compressor_partial(int32_t layer) override;
  [[nodiscard]] EngramHistory& engram_history() override { return engram_history_; }
  [[nodiscard]] std::span<uint8_t> dspark_row(int32_t stage, int32_t pos) override;
  [[nodiscard]] int32_t dspark_begin() const override { return dspark_begin_; }
  [[nodiscard]] int32_t dspark_end() const override { return dspark_end_; }
  void set_dspark_range(int32_t begin, int32_t end) override {
    dspark_begin_ = begin;
    dspark_end_ = end;
  }

  // Bytes held by the caches (for reports).
  [[nodiscard]] size_t cache_bytes() const;

 private:
  struct GlobalCache {
    std::vector<uint8_t> main;
    std::vector<uint8_t> index;
    int64_t entries = 0;
  };
  [[nodiscard]] GlobalCache& global(int32_t layer);
  [[nodiscard]] const GlobalCache& global(int32_t layer) const;

  CacheGeometry geometry_;
  int32_t num_layers_ = 0;
  int32_t num_tokens_ = 0;
  int32_t replay_start_ = 0;
  std::vector<std::vector<uint8_t>> swa_;  // [layer][window * row]
  std::vector<int32_t> global_slot_;       // layer -> index into globals_ (-1 none)
  std::vector<GlobalCache> globals_;
  std::vector<CompressorPartial> partials_;  // parallel to globals_
  EngramHistory engram_history_;
  std::vector<std::vector<uint8_t>> dspark_;  // [stage][window * row]
  int32_t dspark_begin_ = 0;
  int32_t dspark_end_ = 0;
};

}  // namespace moeserve::arch

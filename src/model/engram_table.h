// Engram (model.md §4) host side: the per-layer FP8 tables (e4m3 rows + one ue8m0 scale per 32
// channels), kept in host memory as the checkpoint stores them (a view into the mmapped file, or
// owned bytes), and the n-gram hashing that turns token ids into table rows ahead of a step.
// Invariant: a table view stays valid while the EngramTable (which holds its owner) is alive.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/result.h"
#include "model/config.h"

namespace moeserve {

class EngramTable {
 public:
  EngramTable() = default;
  // View over existing bytes; `owner` keeps them alive (e.g. the checkpoint mapping).
  EngramTable(std::span<const uint8_t> codes, std::span<const uint8_t> scales, int64_t rows,
              int32_t dim, std::shared_ptr<const void> owner);

  [[nodiscard]] int64_t rows() const { return rows_; }
  [[nodiscard]] int32_t dim() const { return dim_; }
  [[nodiscard]] size_t bytes() const { return codes_.size() + scales_.size(); }
  // Dequantises row `row` into out[dim] (e4m3 * 2^(scale-127) per 32 channels).
  void dequantize_row(int64_t row, std::span<float> out) const;
  // out[ids.size() * dim]: the rows of `ids`, concatenated.
  void gather(std::span<const int64_t> ids, std::span<float> out) const;

 private:
  std::span<const uint8_t> codes_;
  std::span<const uint8_t> scales_;
  int64_t rows_ = 0;
  int32_t dim_ = 0;
  int32_t scales_per_row_ = 0;
  std::shared_ptr<const void> owner_;
};

// Compressed token map (§4 step 1): token id -> compressed id, -1 = DEAD. Identity when the
// config's compressed vocab equals the vocab (the tiny model); the real map comes from the
// tokenizer (engine issue).
class EngramTokenMap {
 public:
  [[nodiscard]] static Result<EngramTokenMap> identity(const ModelConfig& config);
  [[nodiscard]] static Result<EngramTokenMap> from_table(const ModelConfig& config,
                                                         std::vector<int32_t> map);
  [[nodiscard]] int32_t compressed(int32_t token_id) const;
  [[nodiscard]] int32_t pad() const { return pad_; }

 private:
  std::vector<int32_t> map_;
  int32_t pad_ = 0;
};

// The n-gram history a request carries between steps: compressed ids of the last
// max_ngram-1 positions (oldest first, -1 = DEAD) and how many tokens were seen.
struct EngramHistory {
  std::vector<int32_t> last_ids;
  int64_t num_tokens = 0;
};

// Hash row ids for `tokens` following `history` (§4 steps 2–4): out[t * hashes + (n-2)*heads + k]
// for order n and head k, already offset into the layer's table. `is_image[t]` marks image tokens
// (DEAD). Does not modify the history; advance_engram_history() does.
void compute_engram_ids(const ModelConfig& config, const EngramLayer& layer,
                        const EngramTokenMap& map, const EngramHistory& history,
                        std::span<const int32_t> tokens, std::span<const uint8_t> is_image,
                        std::span<int64_t> out);
void advance_engram_history(const ModelConfig& config, const EngramTokenMap& map,
                            std::span<const int32_t> tokens, std::span<const uint8_t> is_image,
                            EngramHistory& history);

}  // namespace moeserve

#include "model/engram_table.h"

#include <algorithm>

#include "common/check.h"
#include "common/numeric.h"

namespace moeserve {

EngramTable::EngramTable(std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                         int64_t rows, int32_t dim, std::shared_ptr<const void> owner)
    : codes_(codes),
      scales_(scales),
      rows_(rows),
      dim_(dim),
      scales_per_row_((dim + 31) / 32),
      owner_(std::move(owner)) {
  MS_CHECK_EQ(codes_.size(), static_cast<size_t>(rows * dim));
  MS_CHECK_EQ(scales_.size(), static_cast<size_t>(rows * scales_per_row_));
}

void EngramTable::dequantize_row(int64_t row, std::span<float> out) const {
  MS_CHECK_MSG(row >= 0 && row < rows_, "engram row {} of {}", row, rows_);
  MS_CHECK_EQ(out.size(), static_cast<size_t>(dim_));
  const uint8_t* codes = codes_.data() + row * dim_;
  const uint8_t* scales = scales_.data() + row * scales_per_row_;
  for (int32_t c = 0; c < dim_; ++c)
    out[static_cast<size_t>(c)] = e4m3_to_float(codes[c]) * ue8m0_to_float(scales[c / 32]);
}

void EngramTable::gather(std::span<const int64_t> ids, std::span<float> out) const {
  MS_CHECK_EQ(out.size(), ids.size() * static_cast<size_t>(dim_));
  for (size_t i = 0; i < ids.size(); ++i)
    dequantize_row(ids[i], out.subspan(i * static_cast<size_t>(dim_), static_cast<size_t>(dim_)));
}

Result<EngramTokenMap> EngramTokenMap::identity(const ModelConfig& config) {
  if (config.engram_compressed_vocab_size != config.vocab_size)
    return make_error(ErrorCode::kInvalidArgument,
                      "engram: compressed vocab {} != vocab {}: an identity token map does not "
                      "apply; pass the tokenizer's compressed map",
                      config.engram_compressed_vocab_size, config.vocab_size);
  std::vector<int32_t> map(static_cast<size_t>(config.vocab_size));
  for (int32_t i = 0; i < config.vocab_size; ++i) map[static_cast<size_t>(i)] = i;
  return from_table(config, std::move(map));
}

Result<EngramTokenMap> EngramTokenMap::from_table(const ModelConfig& config,
                                                  std::vector<int32_t> map) {
  if (map.size() != static_cast<size_t>(config.vocab_size))
    return make_error(ErrorCode::kInvalidArgument, "engram token map has {} entries, vocab is {}",
                      map.size(), config.vocab_size);
  EngramTokenMap m;
  m.map_ = std::move(map);
  const int32_t pad_id = config.engram_pad_id;
  if (pad_id < 0 || pad_id >= config.vocab_size || m.map_[static_cast<size_t>(pad_id)] < 0)
    return make_error(ErrorCode::kInvalidArgument, "engram pad id {} has no compressed id", pad_id);
  m.pad_ = m.map_[static_cast<size_t>(pad_id)];
  return m;
}

int32_t EngramTokenMap::compressed(int32_t token_id) const {
  MS_CHECK_MSG(token_id >= 0 && static_cast<size_t>(token_id) < map_.size(), "token id {}",
               token_id);
  return map_[static_cast<size_t>(token_id)];
}

namespace {

// Compressed id of `token` (-1 = DEAD).
int32_t compressed_of(const EngramTokenMap& map, int32_t token, bool is_image) {
  // NOTE: image-span tokens are DEAD (§4 step 1); so is a token the map leaves unmapped.
  return is_image ? -1 : map.compressed(token);
}

}  // namespace

void compute_engram_ids(const ModelConfig& config, const EngramLayer& layer,
                        const EngramTokenMap& map, const EngramHistory& history,
                        std::span<const int32_t> tokens, std::span<const uint8_t> is_image,
                        std::span<int64_t> out) {
  const int32_t max_ngram = config.engram_max_ngram_size;
  const int32_t heads = config.engram_n_heads;
  const int32_t hashes = config.engram_num_hashes();
  const size_t hist = static_cast<size_t>(max_ngram - 1);
  MS_CHECK_EQ(out.size(), tokens.size() * static_cast<size_t>(hashes));
  MS_CHECK(history.last_ids.size() == hist);
  // window[i] = compressed id of position (start - hist + i), oldest first.
  std::vector<int32_t> window(history.last_ids);
  for (size_t t = 0; t < tokens.size(); ++t)
    window.push_back(compressed_of(map, tokens[t], !is_image.empty() && is_image[t] != 0));
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int64_t pos = history.num_tokens + static_cast<int64_t>(t);
    bool blocked = false;
    int64_t h = 0;
    for (int32_t s = 0; s < max_ngram; ++s) {
      // Sticky blocking: once a shift reaches before position 0 or meets a DEAD token, it and all
      // larger shifts use pad'.
      int32_t tok = map.pad();
      if (!blocked) {
        if (pos - s < 0) {
          blocked = true;
        } else {
          const int32_t c = window[t + hist - static_cast<size_t>(s)];
          if (c < 0)
            blocked = true;
          else
            tok = c;
        }
      }
      const int64_t term = static_cast<int64_t>(tok) * layer.multipliers[static_cast<size_t>(s)];
      h = s == 0 ? term : (h ^ term);
      if (s == 0) continue;
      for (int32_t k = 0; k < heads; ++k) {
        const size_t idx = static_cast<size_t>((s - 1) * heads + k);
        const int64_t prime = layer.primes[static_cast<size_t>(s - 1)][static_cast<size_t>(k)];
        out[t * static_cast<size_t>(hashes) + idx] = h % prime + layer.offsets[idx];
      }
    }
  }
}

void advance_engram_history(const ModelConfig& config, const EngramTokenMap& map,
                            std::span<const int32_t> tokens, std::span<const uint8_t> is_image,
                            EngramHistory& history) {
  const size_t hist = static_cast<size_t>(config.engram_max_ngram_size - 1);
  for (size_t t = 0; t < tokens.size(); ++t) {
    history.last_ids.push_back(
        compressed_of(map, tokens[t], !is_image.empty() && is_image[t] != 0));
    history.last_ids.erase(history.last_ids.begin());
  }
  MS_CHECK_EQ(history.last_ids.size(), hist);
  history.num_tokens += static_cast<int64_t>(tokens.size());
}

}  // namespace moeserve

// FakeForwardModel: a deterministic stand-in for the forward pass that nevertheless uses the KV
// layout the way the real model does, so engine tests catch block-table, prefix-cache, replay and
// preemption bugs. Each position p writes a global entry g[p] = mix(g[p-1], token, p) into its
// block slot (a chain over the whole prefix, like attention) and an SWA ring row (p, token); the
// logits of position p depend on g[p] and on the ring rows (p-W, p]. Replay rows must find their
// global entry already present and equal to the recomputed one; a sample whose window is missing
// from the ring is an error (that is what bounded replay must rebuild).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "runtime/batch_metadata.h"

namespace moeserve::testing {

class FakeForwardModel final : public runtime::ForwardModel {
 public:
  FakeForwardModel(int32_t vocab_size, int32_t num_blocks, int32_t num_slots, int32_t window)
      : vocab_size_(vocab_size),
        window_(window),
        global_(static_cast<size_t>(num_blocks) * kv::kBlockTokens, 0),
        ring_pos_(static_cast<size_t>(num_slots) * static_cast<size_t>(window), -1),
        ring_val_(static_cast<size_t>(num_slots) * static_cast<size_t>(window), 0) {}

  [[nodiscard]] int32_t vocab_size() const override { return vocab_size_; }

  [[nodiscard]] Status forward(const runtime::BatchMetadata& b, std::span<float> logits) override {
    ++num_forward_calls;
    for (const runtime::BatchRequest& r : b.requests) {
      const size_t ring0 = static_cast<size_t>(r.state_slot) * static_cast<size_t>(window_);
      if (r.state_slot < 0) return make_error(ErrorCode::kInternal, "request {} has no slot", r.id);
      if (r.is_new) {
        for (int32_t i = 0; i < window_; ++i) ring_pos_[ring0 + static_cast<size_t>(i)] = -1;
      }
      for (int32_t k = 0; k < r.query_len; ++k) {
        const size_t row = static_cast<size_t>(r.query_start + k);
        const int32_t pos = b.positions[row];
        const int32_t tok = b.token_ids[row];
        if (pos != r.context_len + k) return make_error(ErrorCode::kInternal, "bad position");
        uint64_t prev = 0x5eed;
        if (pos > 0) {
          prev = global_[slot_of(r, pos - 1, b.block_tokens)];
          if (prev == 0) {
            return make_error(ErrorCode::kInternal, "request {} reads unwritten KV at {}", r.id,
                              pos - 1);
          }
        }
        const uint64_t val = mix(prev, static_cast<uint64_t>(tok), static_cast<uint64_t>(pos)) | 1;
        const size_t slot = static_cast<size_t>(b.slot_mapping[row]);
        if (slot != slot_of(r, pos, b.block_tokens)) {
          return make_error(ErrorCode::kInternal, "slot mapping disagrees with block table");
        }
        if (k < r.num_replay) {
          ++num_replayed_rows;
          if (global_[slot] != val) {
            return make_error(ErrorCode::kInternal,
                              "request {}: cached global KV at {} differs from recomputation", r.id,
                              pos);
          }
        } else {
          ++num_computed_rows;
          global_[slot] = val;
        }
        const size_t ri = ring0 + static_cast<size_t>(pos % window_);
        ring_pos_[ri] = pos;
        ring_val_[ri] = mix(static_cast<uint64_t>(tok), static_cast<uint64_t>(pos), 77);
      }
      if (r.logits_row < 0) continue;
      const int32_t p = r.context_len + r.query_len - 1;
      uint64_t acc = global_[slot_of(r, p, b.block_tokens)];
      for (int32_t q = std::max(0, p - window_ + 1); q <= p; ++q) {
        const size_t ri = ring0 + static_cast<size_t>(q % window_);
        if (ring_pos_[ri] != q) {
          return make_error(ErrorCode::kInternal, "request {}: SWA ring lacks position {} at {}",
                            r.id, q, p);
        }
        acc = mix(acc, ring_val_[ri], 3);
      }
      float* out = logits.data() + static_cast<size_t>(r.logits_row) * vocab_size_;
      for (int32_t v = 0; v < vocab_size_; ++v) {
        out[v] = static_cast<float>(mix(acc, static_cast<uint64_t>(v), 11) >> 44) / 65536.0f;
      }
    }
    return ok_status();
  }

  int64_t num_forward_calls = 0;
  int64_t num_replayed_rows = 0;
  int64_t num_computed_rows = 0;

 private:
  static uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL) * 0xbf58476d1ce4e5b9ULL ^
                 (c + 1) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ULL;
    return x ^ (x >> 32);
  }
  static size_t slot_of(const runtime::BatchRequest& r, int32_t pos, int32_t bt) {
    return static_cast<size_t>((*r.block_table)[static_cast<size_t>(pos / bt)]) *
               static_cast<size_t>(bt) +
           static_cast<size_t>(pos % bt);
  }

  int32_t vocab_size_;
  int32_t window_;
  std::vector<uint64_t> global_;
  std::vector<int32_t> ring_pos_;
  std::vector<uint64_t> ring_val_;
};

}  // namespace moeserve::testing

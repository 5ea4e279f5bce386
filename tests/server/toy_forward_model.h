// ToyForwardModel: a runtime::ForwardModel whose logits are a hash of (last token, position), so
// the real EngineCore (scheduler, KV manager, sampler) and the real tokenizer can run behind the
// HTTP server in tests before the DeepSeek-V4.1 forward is wrapped as a ForwardModel.
// Printable-ASCII token ids are favoured so the streamed text is readable.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/batch_metadata.h"

namespace moeserve::server::testing {

class ToyForwardModel final : public runtime::ForwardModel {
 public:
  explicit ToyForwardModel(int32_t vocab_size) : vocab_size_(vocab_size) {}
  [[nodiscard]] int32_t vocab_size() const override { return vocab_size_; }

  [[nodiscard]] Status forward(const runtime::BatchMetadata& b, std::span<float> logits) override {
    for (const runtime::BatchRequest& r : b.requests) {
      if (r.logits_row < 0) continue;
      const size_t last = static_cast<size_t>(r.query_start + r.query_len - 1);
      const auto tok = static_cast<uint64_t>(b.token_ids[last]);
      const auto pos = static_cast<uint64_t>(b.positions[last]);
      float* out = logits.data() + static_cast<size_t>(r.logits_row) * vocab_size_;
      for (int32_t v = 0; v < vocab_size_; ++v) {
        uint64_t x = (tok * 0x9e3779b97f4a7c15ULL) ^ (pos * 0xbf58476d1ce4e5b9ULL) ^
                     (static_cast<uint64_t>(v) * 0x94d049bb133111ebULL);
        x ^= x >> 31;
        x *= 0xd6e8feb86659fd93ULL;
        x ^= x >> 32;
        out[v] = static_cast<float>(x >> 44) / 65536.0f - (v < 300 ? 0.0f : 8.0f);
      }
    }
    return ok_status();
  }

 private:
  int32_t vocab_size_;
};

}  // namespace moeserve::server::testing

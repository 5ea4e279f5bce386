// FakeGenerationService: a GenerationService for server tests while (or where) the real engine is
// not wanted. Byte-level "tokenizer" (ids 0..255 are bytes, 256 <bos>, 257 <eos>), a toy chat
// template, a toy reasoning/tool-call parser (<think>...</think>, <tool_call>{json}</tool_call>)
// and an engine thread that emits one token per request per step. What it generates is scripted by
// the prompt: the text after the last "say:" (to the end of that line) and then <eos>; without
// "say:", a filler sentence repeated until max_tokens. temperature > 0 without a seed varies it.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "server/generation_service.h"

namespace moeserve::server::testing {

class FakeGenerationService final : public GenerationService {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kVocab = 258;

  FakeGenerationService(std::string model_name, int32_t max_model_len, double step_ms,
                        int64_t kv_blocks);
  ~FakeGenerationService() override;

  ModelInfo model_info() const override;
  std::vector<int32_t> tokenize(std::string_view text, bool add_special_tokens) const override;
  std::string detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return kVocab; }
  std::unique_ptr<IncrementalDetokenizer> make_detokenizer(bool skip_special) const override;
  Result<ChatPrompt> render_chat(const ChatPromptInput& input) const override;
  std::unique_ptr<OutputParser> make_output_parser(
      const OutputParserOptions& options) const override;
  Status submit(GenerationRequest request, OutputCallback on_output) override;
  void abort(const std::string& request_id) override;
  EngineStats stats() const override;

 private:
  struct Running {
    GenerationRequest request;
    OutputCallback callback;
    std::vector<int32_t> script;  // tokens to emit (then filler unless it ends with <eos>)
    size_t next = 0;
    int32_t generated = 0;
    uint64_t rng = 0;
    int64_t blocks = 0;
  };
  void loop();
  std::vector<int32_t> make_script(const GenerationRequest& request) const;
  int64_t blocks_for(int64_t tokens) const { return (tokens + 15) / 16; }

  std::string model_name_;
  int32_t max_model_len_;
  double step_ms_;
  int64_t kv_blocks_total_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Running>> incoming_;
  std::unordered_set<std::string> aborts_;
  std::map<std::string, std::unique_ptr<Running>> running_;
  int64_t kv_blocks_used_ = 0;
  int32_t num_running_ = 0;
  int32_t num_waiting_ = 0;
  int64_t prefix_queries_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moeserve::server::testing

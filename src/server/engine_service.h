// EngineGenerationService: the real GenerationService. It owns an engine::EngineCore and drives its
// step loop on one thread (the core's owner), the tokenizer, the DeepSeek-V4 chat encoding and the
// reasoning/DSML tool-call output parser (src/tokenizer). Requests and aborts reach the loop
// through a locked queue; outputs go back through each request's callback, on the loop thread.
// NOTE: engine::EngineClient only offers blocking per-request streams (a thread per open request
// to read them); the server needs callbacks, so this runs the same loop with callbacks. When
// EngineClient grows a callback-based add_request this class should use it instead.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>

#include "backend/backend.h"
#include "common/result.h"
#include "engine/engine_core.h"
#include "model/arch/causal_lm.h"
#include "server/generation_service.h"
#include "server/serve.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

class EngineGenerationService final : public GenerationService {
 public:
  struct Config {
    std::string model_name;
    std::string root;
    int32_t max_model_len = 0;
  };
  EngineGenerationService(Config config, std::unique_ptr<engine::EngineCore> core,
                          std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                          std::unique_ptr<Backend> backend = nullptr);
  ~EngineGenerationService() override;

  ModelInfo model_info() const override;
  std::vector<int32_t> tokenize(std::string_view text, bool add_special_tokens) const override;
  std::string detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return tokenizer_->vocab_size(); }
  std::unique_ptr<IncrementalDetokenizer> make_detokenizer(bool skip_special) const override;
  Result<ChatPrompt> render_chat(const ChatPromptInput& input) const override;
  std::unique_ptr<OutputParser> make_output_parser(
      const OutputParserOptions& options) const override;
  Status submit(GenerationRequest request, OutputCallback on_output) override;
  void abort(const std::string& request_id) override;
  EngineStats stats() const override;
  std::string engine_metrics_text(const std::string& model_name) const override;
  bool healthy() const override;

 private:
  struct AddCmd {
    engine::EngineRequest request;
    std::string key;
    OutputCallback callback;
  };
  struct AbortCmd {
    std::string key;
  };
  void loop();
  void fail_all(const std::string& message);

  Config config_;
  std::unique_ptr<Backend> backend_;  // the model's backend (outlives the core)
  std::unique_ptr<engine::EngineCore> core_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::variant<AddCmd, AbortCmd>> inbox_;
  bool stop_ = false;
  bool failed_ = false;
  engine::RequestId next_id_ = 0;
  // Loop thread only.
  struct Live {
    std::string key;
    OutputCallback callback;
  };
  std::unordered_map<engine::RequestId, Live> live_;
  std::unordered_map<std::string, engine::RequestId> ids_;
  std::thread thread_;
};

// Installs the tokenizer-derived Engram compressed-token map (model.md §4 step 1) into a V4.1
// model; a no-op for models without Engram. Errors if the tokenizer and config disagree.
[[nodiscard]] Status install_engram_token_map(arch::CausalLm& lm, const tokenizer::Tokenizer& tok);

// Loads the model in `dir` with the tokenizer-derived Engram map built in from the start (no
// pad-only placeholder map, so no false "no Engram token map" warning); other architectures
// load as arch::load_causal_lm does.
[[nodiscard]] Result<std::unique_ptr<arch::CausalLm>> load_causal_lm_with_tokenizer(
    const std::string& dir, Backend& backend, const tokenizer::Tokenizer& tok);

// Loads the model named by options.model (or generates the embedded tiny model into the cache on
// first use) with its tokenizer and starts its engine.
[[nodiscard]] Result<std::unique_ptr<GenerationService>> make_engine_service(
    const ServeOptions& options);

}  // namespace moeserve::server

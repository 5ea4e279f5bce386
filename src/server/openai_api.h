// OpenAiApi: routes HTTP requests to the OpenAI-compatible handlers (/v1/models,
// /v1/completions, /v1/chat/completions, /tokenize, /detokenize, /health, /metrics), checks the
// API key, turns bodies into typed requests (protocol.h), submits them to a GenerationService and
// turns outputs into JSON responses or SSE streams. It knows nothing of sockets: the HTTP layer
// hands it a ResponseChannel per request. Each request's state lives on that channel's serial
// executor; engine callbacks are posted there, so no request state is shared between threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "server/generation_service.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace moeserve::server {

struct HttpRequest {
  std::string method;
  std::string target;         // path and query
  std::string authorization;  // the Authorization header ("" if absent)
  std::string body;
};

// The answer side of one HTTP request. Every method except post() must be called on the channel's
// executor (inside a function given to post(), or in the handler that received the channel).
class ResponseChannel {
 public:
  virtual ~ResponseChannel() = default;
  // Runs `fn` on the channel's serial executor; callable from any thread. Dropped silently once
  // the server has stopped.
  virtual void post(std::function<void()> fn) = 0;
  // A complete response (ends the request).
  virtual void respond(int status, std::string_view content_type, std::string body) = 0;
  // Starts a 200 text/event-stream response; then write() any number of times, then end_stream().
  virtual void start_stream() = 0;
  virtual void write(std::string_view data) = 0;
  virtual void end_stream() = 0;
  // Called (on the executor) if the client goes away before the response ends.
  virtual void set_on_close(std::function<void()> on_close) = 0;
  [[nodiscard]] virtual bool closed() const = 0;
  // Bytes queued but not yet written to the socket (slow clients).
  [[nodiscard]] virtual size_t pending_bytes() const = 0;
};

struct ApiOptions {
  std::string served_model_name;
  std::string api_key;        // "" → no authentication
  int32_t max_model_len = 0;  // 0 → the service's
  ProtocolLimits limits;
  size_t max_pending_stream_bytes = 8u << 20;  // a stream whose client lags more is aborted
};

class GenerationJob;

class OpenAiApi final {
 public:
  OpenAiApi(GenerationService& service, ApiOptions options, ServerMetrics& metrics);
  ~OpenAiApi();
  OpenAiApi(const OpenAiApi&) = delete;
  OpenAiApi& operator=(const OpenAiApi&) = delete;

  // Handles one request; called on `channel`'s executor.
  void handle(HttpRequest request, const std::shared_ptr<ResponseChannel>& channel);

  // Generation requests not yet finished (all their choices done).
  [[nodiscard]] int64_t active_requests() const { return active_.load(std::memory_order_acquire); }
  // While draining, new generation requests get 503 and /health reports 503.
  void set_draining(bool draining) { draining_.store(draining, std::memory_order_release); }
  // Aborts every in-flight generation request (shutdown after the drain timeout).
  void abort_all();

  [[nodiscard]] const ApiOptions& options() const { return options_; }
  [[nodiscard]] GenerationService& service() { return service_; }
  [[nodiscard]] ServerMetrics& metrics() { return metrics_; }

  // Called by GenerationJob.
  void job_started(uint64_t key, const std::shared_ptr<GenerationJob>& job);
  void job_finished(uint64_t key);

 private:
  void handle_models(const std::string& path, ResponseChannel& ch);
  void handle_completions(const HttpRequest& req, const std::shared_ptr<ResponseChannel>& ch);
  void handle_chat(const HttpRequest& req, const std::shared_ptr<ResponseChannel>& ch);
  void handle_tokenize(const HttpRequest& req, ResponseChannel& ch);
  void handle_detokenize(const HttpRequest& req, ResponseChannel& ch);
  void handle_metrics(ResponseChannel& ch);
  void send_error(ResponseChannel& ch, const ApiError& error);
  void send_json(ResponseChannel& ch, int status, std::string body);
  // 404 unless `model` is absent or the served name.
  [[nodiscard]] bool check_model(const std::optional<std::string>& model, ResponseChannel& ch);

  GenerationService& service_;
  ApiOptions options_;
  ServerMetrics& metrics_;
  ModelInfo model_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};
  std::atomic<uint64_t> next_id_{1};
  std::mutex jobs_mu_;
  std::unordered_map<uint64_t, std::weak_ptr<GenerationJob>> jobs_;
};

}  // namespace moeserve::server

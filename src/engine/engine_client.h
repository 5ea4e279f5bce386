// EngineClient: the in-process front of one EngineCore. A dedicated thread owns the core and runs
// its step loop; other threads (HTTP handlers) talk to it through a typed command queue and read
// per-request RequestStreams. (The multi-process ZeroMQ client comes with data parallelism.)
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>

#include "engine/engine_core.h"

namespace moeserve::engine {

// One request's outputs, in order; the last one has finished == true.
class RequestStream {
 public:
  explicit RequestStream(RequestId id) : id_(id) {}
  [[nodiscard]] RequestId id() const { return id_; }
  // Blocks for the next output; nullopt once the finished output has been returned.
  [[nodiscard]] std::optional<RequestOutput> next();
  void push(RequestOutput output);

 private:
  RequestId id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool closed_ = false;  // the finished output was pushed
  bool drained_ = false;
};

class EngineClient {
 public:
  explicit EngineClient(std::unique_ptr<EngineCore> core);
  ~EngineClient();
  EngineClient(const EngineClient&) = delete;
  EngineClient& operator=(const EngineClient&) = delete;

  // Queues a request; validation errors arrive as a finished output with FinishReason::kError.
  [[nodiscard]] std::shared_ptr<RequestStream> add_request(EngineRequest request);
  // Non-blocking variant for async servers: `on_output` runs on the engine thread for every
  // output (the last has finished == true); it must return quickly and must not call back in.
  using OutputCallback = std::function<void(RequestOutput)>;
  RequestId add_request(EngineRequest request, OutputCallback on_output);
  void abort(RequestId id);
  [[nodiscard]] std::string render_metrics(const std::string& model_name) const;
  void shutdown();

 private:
  struct Sink {
    std::shared_ptr<RequestStream> stream;
    OutputCallback callback;
    void push(RequestOutput o) const {
      if (callback) {
        callback(std::move(o));
      } else {
        stream->push(std::move(o));
      }
    }
  };
  struct AddCmd {
    EngineRequest request;
    Sink sink;
  };
  struct AbortCmd {
    RequestId id;
  };
  using Command = std::variant<AddCmd, AbortCmd>;
  void loop();

  std::unique_ptr<EngineCore> core_;
  std::atomic<RequestId> next_id_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> inbox_;
  bool stop_ = false;
  std::unordered_map<RequestId, Sink> streams_;  // core thread only
  std::thread thread_;
};

}  // namespace moeserve::engine

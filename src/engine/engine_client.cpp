#include "engine/engine_client.h"

#include "common/logging.h"

namespace moeserve::engine {

std::optional<RequestOutput> RequestStream::next() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || drained_ || closed_; });
  if (queue_.empty()) {
    drained_ = true;
    return std::nullopt;
  }
  RequestOutput o = std::move(queue_.front());
  queue_.pop_front();
  return o;
}

void RequestStream::push(RequestOutput output) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = output.finished;
    queue_.push_back(std::move(output));
  }
  cv_.notify_all();
}

EngineClient::EngineClient(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {
  thread_ = std::thread([this] { loop(); });
}

EngineClient::~EngineClient() { shutdown(); }

void EngineClient::shutdown() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestStream> EngineClient::add_request(EngineRequest request) {
  if (request.id < 0) request.id = next_id_.fetch_add(1);
  auto stream = std::make_shared<RequestStream>(request.id);
  {
    std::lock_guard lock(mu_);
    inbox_.push_back(AddCmd{std::move(request), Sink{stream, {}}});
  }
  cv_.notify_all();
  return stream;
}

RequestId EngineClient::add_request(EngineRequest request, OutputCallback on_output) {
  if (request.id < 0) request.id = next_id_.fetch_add(1);
  const RequestId id = request.id;
  {
    std::lock_guard lock(mu_);
    inbox_.push_back(AddCmd{std::move(request), Sink{nullptr, std::move(on_output)}});
  }
  cv_.notify_all();
  return id;
}

void EngineClient::abort(RequestId id) {
  {
    std::lock_guard lock(mu_);
    inbox_.push_back(AbortCmd{id});
  }
  cv_.notify_all();
}

std::string EngineClient::render_metrics(const std::string& model_name) const {
  return core_->metrics().render_prometheus(model_name);
}

void EngineClient::loop() {
  for (;;) {
    std::deque<Command> commands;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || core_->has_unfinished_requests(); });
      if (stop_) break;
      commands.swap(inbox_);
    }
    for (Command& cmd : commands) {
      if (auto* add = std::get_if<AddCmd>(&cmd)) {
        const RequestId id = add->request.id;
        Result<RequestId> r = core_->add_request(std::move(add->request));
        if (!r) {
          RequestOutput o;
          o.id = id;
          o.finished = true;
          o.finish_reason = FinishReason::kError;
          o.error = r.error().message;
          add->sink.push(std::move(o));
          continue;
        }
        streams_[*r] = std::move(add->sink);
      } else {
        core_->abort_request(std::get<AbortCmd>(cmd).id);
      }
    }
    if (!core_->has_unfinished_requests()) continue;
    Result<std::vector<RequestOutput>> outs = core_->step();
    if (!outs) {
      MS_LOG_ERROR("engine step failed: {}", outs.error().message);
      for (auto& [id, sink] : streams_) {
        RequestOutput o;
        o.id = id;
        o.finished = true;
        o.finish_reason = FinishReason::kError;
        o.error = outs.error().message;
        sink.push(std::move(o));
        core_->abort_request(id);
      }
      streams_.clear();
      continue;
    }
    for (RequestOutput& o : *outs) {
      auto it = streams_.find(o.id);
      if (it == streams_.end()) continue;
      const bool finished = o.finished;
      it->second.push(std::move(o));
      if (finished) streams_.erase(it);
    }
  }
}

}  // namespace moeserve::engine

#include "engine/step_worker.h"

#include "common/check.h"

namespace moeserve::engine {

StepWorker::StepWorker(runtime::ModelExecutor* executor, bool use_thread) : executor_(executor) {
  MS_CHECK(executor_ != nullptr);
  if (use_thread) thread_ = std::thread([this] { loop(); });
}

StepWorker::~StepWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::future<StepResult> StepWorker::submit(std::shared_ptr<const sched::SchedulerOutput> step) {
  if (!thread_.joinable()) {
    std::promise<StepResult> p;
    p.set_value(executor_->execute(*step));
    return p.get_future();
  }
  Job job{std::move(step), {}};
  std::future<StepResult> f = job.promise.get_future();
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return f;
}

void StepWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job.promise.set_value(executor_->execute(*job.step));
  }
}

}  // namespace moeserve::engine

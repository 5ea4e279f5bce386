// StepWorker: runs ModelExecutor::execute for submitted steps, in submission order. With a thread
// (async scheduling) the EngineCore schedules step N+1 while step N runs; without one, submit()
// runs the step inline and returns a ready future, so both modes share one code path.
#pragma once

#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/model_executor.h"

namespace moeserve::engine {

using StepResult = Result<sched::ModelRunnerOutput>;

class StepWorker {
 public:
  StepWorker(runtime::ModelExecutor* executor, bool use_thread);
  ~StepWorker();
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  [[nodiscard]] std::future<StepResult> submit(std::shared_ptr<const sched::SchedulerOutput> step);

 private:
  struct Job {
    std::shared_ptr<const sched::SchedulerOutput> step;
    std::promise<StepResult> promise;
  };
  void loop();

  runtime::ModelExecutor* executor_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moeserve::engine

#include "engine/offline.h"

#include <unordered_map>

namespace moeserve::engine {

Result<std::vector<Completion>> generate(EngineCore& core, std::vector<EngineRequest> requests,
                                         std::span<const int32_t> arrival_steps) {
  if (!arrival_steps.empty() && arrival_steps.size() != requests.size()) {
    return make_error(ErrorCode::kInvalidArgument, "{} arrival steps for {} requests",
                      arrival_steps.size(), requests.size());
  }
  std::vector<Completion> done(requests.size());
  std::unordered_map<RequestId, size_t> index;
  std::vector<bool> added(requests.size(), false);
  size_t num_added = 0, num_finished = 0;
  for (int64_t step = 0; num_finished < requests.size(); ++step) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (added[i] || (!arrival_steps.empty() && arrival_steps[i] > step)) continue;
      MS_ASSIGN_OR_RETURN(RequestId id, core.add_request(std::move(requests[i])));
      index[id] = i;
      done[i].id = id;
      added[i] = true;
      ++num_added;
    }
    if (!core.has_unfinished_requests()) {
      if (num_added == requests.size()) {
        return make_error(ErrorCode::kInternal, "engine idle with {} requests unfinished",
                          requests.size() - num_finished);
      }
      continue;
    }
    MS_ASSIGN_OR_RETURN(std::vector<RequestOutput> outs, core.step());
    for (RequestOutput& o : outs) {
      auto it = index.find(o.id);
      if (it == index.end()) continue;
      Completion& c = done[it->second];
      c.token_ids.insert(c.token_ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      c.text += o.new_text;
      c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      c.usage = o.usage;
      if (o.finished) {
        c.finish_reason = o.finish_reason;
        c.stop_reason = o.stop_reason;
        ++num_finished;
      }
    }
  }
  return done;
}

}  // namespace moeserve::engine

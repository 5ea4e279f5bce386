#include "parallel/eplb/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "common/check.h"

namespace moeserve::parallel {

SkewedRouting::SkewedRouting(const RoutingShape& shape, const PopularityConfig& popularity,
                             uint64_t seed)
    : shape_(shape), popularity_(popularity), rng_(seed) {
  MS_CHECK(shape.num_experts > 0 && shape.top_k > 0 && shape.top_k <= shape.num_experts);
  MS_CHECK(shape.num_layers > 0 && shape.tokens_per_step >= 0);
  layers_.resize(static_cast<size_t>(shape.num_layers));
  for (Layer& layer : layers_) {
    const double u = 2.0 * rng_.uniform() - 1.0;
    const double exponent =
        std::max(0.0, popularity.zipf_exponent * (1.0 + popularity.layer_jitter * u));
    layer.expert_at_rank.resize(static_cast<size_t>(shape.num_experts));
    std::iota(layer.expert_at_rank.begin(), layer.expert_at_rank.end(), 0);
    // Fisher-Yates: which expert ids are hot differs per layer.
    for (int32_t i = shape.num_experts - 1; i > 0; --i) {
      std::swap(layer.expert_at_rank[i], layer.expert_at_rank[rng_.below(i + 1)]);
    }
    layer.rank_weight.resize(static_cast<size_t>(shape.num_experts));
    double total = 0.0;
    for (int32_t i = 0; i < shape.num_experts; ++i) {
      layer.rank_weight[i] = std::pow(static_cast<double>(i + 1), -exponent);
      total += layer.rank_weight[i];
    }
    for (double& w : layer.rank_weight) w /= total;
    build_alias(layer);
  }
}

std::vector<double> SkewedRouting::popularity(int32_t layer) const {
  const Layer& l = layers_[layer];
  std::vector<double> out(static_cast<size_t>(shape_.num_experts));
  for (int32_t i = 0; i < shape_.num_experts; ++i) out[l.expert_at_rank[i]] = l.rank_weight[i];
  return out;
}

void SkewedRouting::build_alias(Layer& layer) {
  const int32_t n = shape_.num_experts;
  std::vector<double> scaled = popularity(static_cast<int32_t>(&layer - layers_.data()));
  for (double& p : scaled) p *= n;
  layer.alias_prob.assign(static_cast<size_t>(n), 1.0);
  layer.alias.resize(static_cast<size_t>(n));
  std::iota(layer.alias.begin(), layer.alias.end(), 0);
  std::vector<int32_t> small, large;
  for (int32_t i = 0; i < n; ++i) (scaled[i] < 1.0 ? small : large).push_back(i);
  while (!small.empty() && !large.empty()) {
    const int32_t s = small.back(), g = large.back();
    small.pop_back();
    layer.alias_prob[s] = scaled[s];
    layer.alias[s] = g;
    scaled[g] -= 1.0 - scaled[s];
    if (scaled[g] < 1.0) {
      large.pop_back();
      small.push_back(g);
    }
  }
}

int32_t SkewedRouting::sample(const Layer& layer) {
  const uint64_t r = rng_.next();
  const auto i =
      static_cast<int32_t>(((r >> 32) * static_cast<uint64_t>(shape_.num_experts)) >> 32);
  const double coin = static_cast<double>(r & 0xFFFFFFFFull) * 0x1.0p-32;
  return coin < layer.alias_prob[i] ? i : layer.alias[i];
}

Result<bool> SkewedRouting::next_step(std::span<int32_t> out) {
  if (static_cast<int64_t>(out.size()) != shape_.step_size()) {
    return make_error(ErrorCode::kInvalidArgument, "routing: step buffer {} != {}", out.size(),
                      shape_.step_size());
  }
  if (popularity_.drift_every > 0 && step_ > 0 && step_ % popularity_.drift_every == 0) {
    const int32_t hot = std::clamp(popularity_.hot_set, 1, shape_.num_experts);
    for (Layer& layer : layers_) {
      for (int32_t i = 0; i < popularity_.drift_swaps; ++i) {
        std::swap(layer.expert_at_rank[rng_.below(static_cast<uint32_t>(hot))],
                  layer.expert_at_rank[rng_.below(static_cast<uint32_t>(shape_.num_experts))]);
      }
      build_alias(layer);
    }
  }
  const int32_t k = shape_.top_k;
  int32_t* dst = out.data();
  for (const Layer& layer : layers_) {
    for (int32_t t = 0; t < shape_.tokens_per_step; ++t, dst += k) {
      // k distinct experts: rejecting repeats samples each next pick from the popularity
      // restricted to the experts not yet chosen (sampling without replacement).
      for (int32_t j = 0; j < k; ++j) {
        int32_t e = 0;
        for (int32_t attempt = 0;; ++attempt) {
          e = sample(layer);
          if (std::find(dst, dst + j, e) == dst + j) break;
          if (attempt > 256) {  // pathological skew: take the first unchosen expert
            for (e = 0; std::find(dst, dst + j, e) != dst + j; ++e) {
            }
            break;
          }
        }
        dst[j] = e;
      }
    }
  }
  ++step_;
  return true;
}

Result<std::unique_ptr<RoutingTraceWriter>> RoutingTraceWriter::open(const std::string& path,
                                                                     const RoutingShape& shape) {
  auto w = std::unique_ptr<RoutingTraceWriter>(new RoutingTraceWriter());
  w->shape_ = shape;
  w->path_ = path;
  w->out_.open(path);
  if (!w->out_) return make_error(ErrorCode::kIo, "cannot write routing trace {}", path);
  nlohmann::json header = {
      {"format", "moeserve-routing"},     {"version", 1},
      {"num_experts", shape.num_experts}, {"top_k", shape.top_k},
      {"num_layers", shape.num_layers},   {"tokens_per_step", shape.tokens_per_step}};
  w->out_ << header.dump() << "\n";
  return w;
}

Status RoutingTraceWriter::write_step(std::span<const int32_t> step) {
  if (static_cast<int64_t>(step.size()) != shape_.step_size()) {
    return make_error(ErrorCode::kInvalidArgument, "routing trace: step of {} ids, expected {}",
                      step.size(), shape_.step_size());
  }
  const int64_t per_layer = static_cast<int64_t>(shape_.tokens_per_step) * shape_.top_k;
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    out_ << "{\"step\":" << step_ << ",\"layer\":" << l << ",\"experts\":[";
    const int32_t* ids = step.data() + l * per_layer;
    for (int64_t i = 0; i < per_layer; ++i) out_ << (i ? "," : "") << ids[i];
    out_ << "]}\n";
  }
  ++step_;
  if (!out_) return make_error(ErrorCode::kIo, "short write to routing trace {}", path_);
  return ok_status();
}

Status RoutingTraceWriter::close() {
  out_.close();
  if (out_.fail()) return make_error(ErrorCode::kIo, "closing routing trace {}", path_);
  return ok_status();
}

Result<std::unique_ptr<RoutingTraceReader>> RoutingTraceReader::open(const std::string& path) {
  auto r = std::unique_ptr<RoutingTraceReader>(new RoutingTraceReader());
  r->path_ = path;
  r->in_.open(path);
  if (!r->in_) return make_error(ErrorCode::kIo, "cannot open routing trace {}", path);
  std::string line;
  if (!std::getline(r->in_, line)) {
    return make_error(ErrorCode::kInvalidArgument, "routing trace {} is empty", path);
  }
  const auto header = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object() || header.value("format", "") != "moeserve-routing" ||
      header.value("version", 0) != 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: first line must be a moeserve-routing v1 header", path);
  }
  RoutingShape& s = r->shape_;
  s.num_experts = header.value("num_experts", 0);
  s.top_k = header.value("top_k", 0);
  s.num_layers = header.value("num_layers", 0);
  s.tokens_per_step = header.value("tokens_per_step", 0);
  if (s.num_experts <= 0 || s.top_k <= 0 || s.top_k > s.num_experts || s.num_layers <= 0 ||
      s.tokens_per_step <= 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: header needs positive num_experts, top_k <= num_experts, num_layers, "
                      "tokens_per_step",
                      path);
  }
  return r;
}

Result<bool> RoutingTraceReader::next_step(std::span<int32_t> out) {
  if (static_cast<int64_t>(out.size()) != shape_.step_size()) {
    return make_error(ErrorCode::kInvalidArgument, "routing: step buffer {} != {}", out.size(),
                      shape_.step_size());
  }
  const int64_t per_layer = static_cast<int64_t>(shape_.tokens_per_step) * shape_.top_k;
  std::string line;
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    if (!std::getline(in_, line) || line.empty()) {
      if (l == 0) return false;
      return make_error(ErrorCode::kInvalidArgument, "{}: step {} ends after {} of {} layers",
                        path_, step_, l, shape_.num_layers);
    }
    ++line_;
    const auto rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!rec.is_object() || rec.value("step", int64_t{-1}) != step_ ||
        rec.value("layer", -1) != l || !rec.contains("experts") || !rec["experts"].is_array() ||
        static_cast<int64_t>(rec["experts"].size()) != per_layer) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}:{}: expected {{\"step\":{},\"layer\":{},\"experts\":[{} ids]}}", path_,
                        line_, step_, l, per_layer);
    }
    int32_t* dst = out.data() + l * per_layer;
    for (int64_t i = 0; i < per_layer; ++i) {
      const auto& v = rec["experts"][static_cast<size_t>(i)];
      const int64_t e = v.is_number_integer() ? v.get<int64_t>() : -1;
      if (e < 0 || e >= shape_.num_experts) {
        return make_error(ErrorCode::kOutOfRange, "{}:{}: expert id {} outside [0, {})", path_,
                          line_, v.dump(), shape_.num_experts);
      }
      dst[i] = static_cast<int32_t>(e);
    }
  }
  ++step_;
  return true;
}

}  // namespace moeserve::parallel

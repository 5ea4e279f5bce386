// BenchResult: what every `moeserve bench ...` writes: the benchmark name, its config, the git
// commit, the device, a UTC timestamp, the measured numbers and the roofline fraction where one
// applies. JSON stays here and in the server; benches fill typed fields.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace moeserve::bench {

struct BenchResult {
  std::string benchmark;  // e.g. "eplb", "forward", "tokenizer"
  nlohmann::json config = nlohmann::json::object();
  nlohmann::json results = nlohmann::json::object();
  // Roofline: ideal time (bytes / bandwidth or flops / rate) over measured time; absent if not
  // meaningful for this benchmark (set `roofline_note` to say why).
  nlohmann::json roofline = nlohmann::json::object();
  std::string roofline_note;
  // What ran the benchmark; empty: host_device_description() (the CPU). GPU benches name the GPU.
  std::string device;

  [[nodiscard]] nlohmann::json to_json() const;
  // Writes pretty JSON; creates parent folders.
  [[nodiscard]] Status write(const std::string& path) const;
};

// A short description of the host CPU (model name, cores) for the "device" field.
[[nodiscard]] std::string host_device_description();
[[nodiscard]] std::string utc_timestamp();
[[nodiscard]] std::string_view git_commit();

}  // namespace moeserve::bench

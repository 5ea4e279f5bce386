#include "bench/bench_result.h"

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/build_info.h"

namespace moeserve::bench {

nlohmann::json BenchResult::to_json() const {
  nlohmann::json j;
  j["benchmark"] = benchmark;
  j["commit"] = std::string(git_commit());
  j["device"] = device.empty() ? host_device_description() : device;
  j["timestamp"] = utc_timestamp();
  j["config"] = config;
  j["results"] = results;
  j["roofline"] = roofline;
  if (!roofline_note.empty()) j["roofline_note"] = roofline_note;
  return j;
}

Status BenchResult::write(const std::string& path) const {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path);
  if (!out) return make_error(ErrorCode::kIo, "cannot write benchmark result to {}", path);
  out << to_json().dump(2) << "\n";
  if (!out) return make_error(ErrorCode::kIo, "short write to {}", path);
  return ok_status();
}

std::string host_device_description() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(colon + 2);
      break;
    }
  }
  return fmt::format("cpu: {} ({} hardware threads)", model, std::thread::hardware_concurrency());
}

std::string utc_timestamp() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string_view git_commit() { return build_git_commit(); }

}  // namespace moeserve::bench

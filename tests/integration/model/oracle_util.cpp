#include "integration/model/oracle_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"

namespace moeserve::test {

namespace fs = std::filesystem;

fs::path make_temp_dir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  fs::path base = tmp != nullptr ? fs::path(tmp) : fs::temp_directory_path();
  std::string templ = (base / ("moeserve_" + tag + "_XXXXXX")).string();
  char* made = mkdtemp(templ.data());
  if (made == nullptr) throw std::runtime_error("mkdtemp failed");
  return fs::path(made);
}

namespace {

int run(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return rc;
}

}  // namespace

const fs::path& tiny_model_dir() {
  static const fs::path dir = [] {
    const fs::path out = make_temp_dir("tiny") / "model";
    const fs::path bin = fs::path(MOESERVE_BINARY_DIR) / "bin" / "moeserve";
    bool made = false;
    if (fs::exists(bin) &&
        run(fmt::format("'{}' model gen-tiny --help > /dev/null 2>&1", bin.string())) == 0) {
      made = run(fmt::format("'{}' model gen-tiny '{}' > /dev/null 2>&1", bin.string(),
                             out.string())) == 0 &&
             fs::exists(out / "config.json");
    }
    if (!made) {
      // NOTE: fallback until the C++ generator is built: the oracle's own generator writes the
      // same checkpoint format (docs/checkpoint_format.md).
      const int rc = run(fmt::format("cd '{}' && '{}' -m tools.reference gen-tiny '{}' > /dev/null",
                                     MOESERVE_SOURCE_DIR, MOESERVE_PYTHON, out.string()));
      if (rc != 0) throw std::runtime_error("tiny model generation failed");
    }
    return out;
  }();
  return dir;
}

TinyModel load_tiny_model() {
  TinyModel t;
  t.backend = make_cpu_backend();
  auto loaded = arch::DeepseekV41Model::load(tiny_model_dir(), *t.backend);
  if (!loaded) throw std::runtime_error(loaded.error().to_string());
  t.model = std::move(*loaded);
  return t;
}

TinyModel& shared_tiny_model() {
  static TinyModel t = load_tiny_model();
  return t;
}

std::vector<int64_t> OracleDump::shape(const std::string& name) const {
  const auto* t = reader.find(name);
  if (t == nullptr) throw std::runtime_error("oracle dump has no " + name);
  return {t->shape.dims().begin(), t->shape.dims().end()};
}

std::vector<double> OracleDump::f64(const std::string& name) const {
  const auto* t = reader.find(name);
  if (t == nullptr) throw std::runtime_error("oracle dump has no " + name);
  if (t->dtype != DType::kF32)
    throw std::runtime_error(fmt::format("oracle dump {} is {}", name, dtype_name(t->dtype)));
  std::vector<float> f(t->nbytes / 4);
  std::memcpy(f.data(), t->view.data(), t->nbytes);
  return {f.begin(), f.end()};
}

std::vector<int64_t> OracleDump::i64(const std::string& name) const {
  const auto* t = reader.find(name);
  if (t == nullptr) throw std::runtime_error("oracle dump has no " + name);
  const auto bytes = arch::WeightLoader::bytes(*t);
  std::vector<int64_t> out;
  if (t->dtype == DType::kI64) {
    out.resize(t->nbytes / 8);
    std::memcpy(out.data(), bytes.data(), t->nbytes);
  } else if (t->dtype == DType::kU8) {
    out.assign(bytes.begin(), bytes.end());
  } else {
    throw std::runtime_error(fmt::format("oracle dump {} is {}", name, dtype_name(t->dtype)));
  }
  return out;
}

OracleDump run_oracle(const fs::path& model, const std::vector<int32_t>& ids,
                      const std::vector<std::string>& args) {
  static int counter = 0;
  static const fs::path dir = make_temp_dir("oracle");
  const fs::path out = dir / fmt::format("dump{}.safetensors", counter++);
  const std::string cmd = fmt::format(
      "cd '{}' && '{}' -m tools.reference dump --model '{}' --ids {} --out '{}' --float32 {} > "
      "/dev/null",
      MOESERVE_SOURCE_DIR, MOESERVE_PYTHON, model.string(), fmt::join(ids, ","), out.string(),
      fmt::join(args, " "));
  if (run(cmd) != 0) throw std::runtime_error("oracle failed: " + cmd);
  auto opened = arch::WeightLoader::open(out);
  if (!opened) throw std::runtime_error(opened.error().to_string());
  return OracleDump{std::move(*opened)};
}

std::vector<int32_t> test_prompt(int32_t n, uint32_t seed, int32_t vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = dist(rng);
  return ids;
}

LogitCompare compare_logits(const std::vector<float>& got, const std::vector<double>& ref,
                            int64_t rows, int64_t vocab, double tie_tol) {
  LogitCompare c;
  c.rows = rows;
  if (got.size() != static_cast<size_t>(rows * vocab) || ref.size() != got.size()) {
    c.rel = INFINITY;
    c.argmax_mismatches = rows;
    return c;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    c.max_abs_diff = std::max(c.max_abs_diff, std::abs(got[i] - ref[i]));
    c.max_abs_ref = std::max(c.max_abs_ref, std::abs(ref[i]));
    if (!std::isfinite(got[i])) c.max_abs_diff = INFINITY;
  }
  c.rel = c.max_abs_diff / std::max(c.max_abs_ref, 1e-30);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got.data() + r * vocab;
    const double* f = ref.data() + r * vocab;
    const int64_t ag = std::max_element(g, g + vocab) - g;
    const int64_t af = std::max_element(f, f + vocab) - f;
    if (ag == af) continue;
    if (std::abs(f[ag] - f[af]) > tie_tol * c.max_abs_ref) ++c.argmax_mismatches;
  }
  return c;
}

}  // namespace moeserve::test

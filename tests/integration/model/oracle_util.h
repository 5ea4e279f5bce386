// Helpers for the forward-vs-oracle tests: the tiny checkpoint (generated once per process), the
// numpy oracle (`python3 -m tools.reference dump`) run into a temp dir, its safetensors output read
// with the C++ reader, and the logit comparison (max|diff|/max|ref|, argmax with a tie rule).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/arch/deepseek_v41.h"
#include "model/arch/weight_loader.h"

namespace moeserve::test {

// A fresh temp directory under $TMPDIR (removed by the caller if wanted).
std::filesystem::path make_temp_dir(const std::string& tag);

// The §9 tiny checkpoint: `moeserve model gen-tiny` when the built binary has it, else the oracle's
// generator. Generated once per process.
const std::filesystem::path& tiny_model_dir();

// A freshly loaded tiny model on the CPU backend (load_tiny_model) or one shared per process.
struct TinyModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<arch::DeepseekV41Model> model;
};
TinyModel load_tiny_model();
TinyModel& shared_tiny_model();

// The oracle's output file (written with --float32: the reader has no F64; the oracle still
// computes in float64, only the stored values are rounded, ~6e-8 relative).
struct OracleDump {
  arch::WeightLoader reader;
  [[nodiscard]] bool has(const std::string& name) const { return reader.find(name) != nullptr; }
  [[nodiscard]] std::vector<int64_t> shape(const std::string& name) const;
  [[nodiscard]] std::vector<double> f64(const std::string& name) const;
  [[nodiscard]] std::vector<int64_t> i64(const std::string& name) const;
};

// Runs the oracle on `ids` (extra CLI flags in `args`, e.g. {"--mode", "production"}).
OracleDump run_oracle(const std::filesystem::path& model, const std::vector<int32_t>& ids,
                      const std::vector<std::string>& args);

// Deterministic prompt of n token ids in [3, vocab).
std::vector<int32_t> test_prompt(int32_t n, uint32_t seed, int32_t vocab = 256);

struct LogitCompare {
  double max_abs_diff = 0.0;
  double max_abs_ref = 0.0;
  double rel = 0.0;  // max_abs_diff / max_abs_ref
  int64_t argmax_mismatches = 0;
  int64_t rows = 0;
};
// got [rows, V] fp32 vs ref [rows, V]. An argmax mismatch counts only when the reference's best
// two values differ by more than `tie_tol` * max|ref| (argmax ties -> lowest index on both sides).
LogitCompare compare_logits(const std::vector<float>& got, const std::vector<double>& ref,
                            int64_t rows, int64_t vocab, double tie_tol = 1e-6);

}  // namespace moeserve::test

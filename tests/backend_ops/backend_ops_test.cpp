// The op-test harness: every op runs on every available backend and is compared with the CPU
// backend on random (never zero) inputs, with a stated tolerance. The CPU ops themselves are
// checked against straightforward double-precision references written here.
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace moeserve {
namespace {

std::vector<float> random_values(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    do {
      x = dist(rng);
    } while (x == 0.0f);
  }
  return v;
}

// Relative error: max|a-b| / max(max|ref|, tiny).
double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(got[i]) - ref[i]));
    den = std::max(den, std::abs(static_cast<double>(ref[i])));
  }
  return num / den;
}

// Holds a tensor on a backend, filled from host values.
struct DeviceTensor {
  std::unique_ptr<DeviceBuffer> buffer;
  TensorView view() const { return buffer->view(); }
};

DeviceTensor upload(Backend& be, const std::vector<float>& host, Shape shape) {
  DeviceTensor t{be.allocate(DType::kF32, shape)};
  std::vector<float> copy = host;
  be.copy_from_host(t.view(), TensorView(copy.data(), DType::kF32, shape));
  return t;
}

std::vector<float> download(Backend& be, const DeviceTensor& t) {
  std::vector<float> host(static_cast<size_t>(t.view().numel()));
  be.copy_to_host(TensorView(host.data(), DType::kF32, t.view().shape()), t.view());
  be.synchronize();
  return host;
}

// One op case: builds inputs from a seed, runs on a backend, returns the output on the host.
struct OpCase {
  std::string name;
  double tolerance;  // relative to max|ref|
  std::function<std::vector<float>(Backend&, uint32_t seed)> run;
  // Independent reference of the CPU op (double precision), same seed.
  std::function<std::vector<float>(uint32_t seed)> reference;
};

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  for (auto [m, n, k, trans] : std::vector<std::tuple<int, int, int, bool>>{
           {1, 64, 64, true}, {7, 33, 65, true}, {64, 128, 96, true}, {5, 17, 31, false}}) {
    auto make_inputs = [=](uint32_t seed) {
      return std::make_pair(random_values(int64_t{m} * k, seed), random_values(int64_t{n} * k, seed + 1));
    };
    Shape b_shape = trans ? Shape{n, k} : Shape{k, n};
    cases.push_back(OpCase{
        "gemm_" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + (trans ? "_nt" : "_nn"),
        1e-5,
        [=](Backend& be, uint32_t seed) {
          auto [a, b] = make_inputs(seed);
          auto da = upload(be, a, {m, k});
          auto db = upload(be, b, b_shape);
          auto dc = upload(be, random_values(int64_t{m} * n, seed + 2), {m, n});
          be.gemm({da.view(), db.view(), dc.view(), trans, 0.5f, 0.25f});
          return download(be, dc);
        },
        [=](uint32_t seed) {
          auto [a, b] = make_inputs(seed);
          std::vector<float> c = random_values(int64_t{m} * n, seed + 2);
          std::vector<float> c_in = c;
          GemmParams p{TensorView(a.data(), DType::kF32, {m, k}), TensorView(b.data(), DType::kF32, b_shape),
                       TensorView(c.data(), DType::kF32, {m, n}), trans, 0.5f, 0.25f};
          cpu::gemm_reference(p);
          return c;
        }});
  }
  for (auto [rows, cols] : std::vector<std::pair<int, int>>{{1, 64}, {9, 5120 / 16}, {33, 512}}) {
    cases.push_back(OpCase{
        "rms_norm_" + std::to_string(rows) + "x" + std::to_string(cols), 1e-6,
        [=](Backend& be, uint32_t seed) {
          auto x = upload(be, random_values(int64_t{rows} * cols, seed, -3, 3), {rows, cols});
          auto w = upload(be, random_values(cols, seed + 1, 0.5, 1.5), {cols});
          auto o = upload(be, random_values(int64_t{rows} * cols, seed + 2), {rows, cols});
          be.rms_norm(x.view(), w.view(), 1e-20f, o.view());
          return download(be, o);
        },
        [=](uint32_t seed) {
          auto x = random_values(int64_t{rows} * cols, seed, -3, 3);
          auto w = random_values(cols, seed + 1, 0.5, 1.5);
          std::vector<float> o(x.size());
          for (int r = 0; r < rows; ++r) {
            long double ss = 0;
            for (int c = 0; c < cols; ++c) ss += static_cast<long double>(x[r * cols + c]) * x[r * cols + c];
            const long double inv = 1.0L / std::sqrt(ss / cols + 1e-20L);
            for (int c = 0; c < cols; ++c) o[r * cols + c] = static_cast<float>(x[r * cols + c] * inv * w[c]);
          }
          return o;
        }});
    cases.push_back(OpCase{
        "softmax_" + std::to_string(rows) + "x" + std::to_string(cols), 1e-6,
        [=](Backend& be, uint32_t seed) {
          auto x = upload(be, random_values(int64_t{rows} * cols, seed, -20, 20), {rows, cols});
          auto o = upload(be, random_values(int64_t{rows} * cols, seed + 2), {rows, cols});
          be.softmax(x.view(), o.view());
          return download(be, o);
        },
        [=](uint32_t seed) {
          auto x = random_values(int64_t{rows} * cols, seed, -20, 20);
          std::vector<float> o(x.size());
          for (int r = 0; r < rows; ++r) {
            double m = -INFINITY, s = 0;
            for (int c = 0; c < cols; ++c) m = std::max(m, static_cast<double>(x[r * cols + c]));
            for (int c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
            for (int c = 0; c < cols; ++c) o[r * cols + c] = static_cast<float>(std::exp(x[r * cols + c] - m) / s);
          }
          return o;
        }});
  }
  for (auto [op, opname] : std::vector<std::pair<UnaryOp, std::string>>{
           {UnaryOp::kSilu, "silu"}, {UnaryOp::kSigmoid, "sigmoid"}, {UnaryOp::kExp, "exp"}}) {
    cases.push_back(OpCase{
        opname + "_1000", 1e-6,
        [=](Backend& be, uint32_t seed) {
          auto x = upload(be, random_values(1000, seed, -8, 8), {10, 100});
          auto o = upload(be, random_values(1000, seed + 2), {10, 100});
          be.unary(op, x.view(), o.view());
          return download(be, o);
        },
        [=](uint32_t seed) {
          auto x = random_values(1000, seed, -8, 8);
          std::vector<float> o(x.size());
          for (size_t i = 0; i < x.size(); ++i) {
            const double v = x[i];
            const double r = op == UnaryOp::kSilu ? v / (1 + std::exp(-v))
                             : op == UnaryOp::kSigmoid ? 1 / (1 + std::exp(-v)) : std::exp(v);
            o[i] = static_cast<float>(r);
          }
          return o;
        }});
  }
  for (auto [op, opname] : std::vector<std::pair<BinaryOp, std::string>>{{BinaryOp::kAdd, "add"}, {BinaryOp::kMul, "mul"}}) {
    for (bool broadcast : {false, true}) {
      cases.push_back(OpCase{
          opname + (broadcast ? "_broadcast" : "_same"), 1e-7,
          [=](Backend& be, uint32_t seed) {
            auto a = upload(be, random_values(12 * 40, seed), {12, 40});
            auto b = broadcast ? upload(be, random_values(40, seed + 1), {40})
                               : upload(be, random_values(12 * 40, seed + 1), {12, 40});
            auto o = upload(be, random_values(12 * 40, seed + 2), {12, 40});
            be.binary(op, a.view(), b.view(), o.view());
            return download(be, o);
          },
          [=](uint32_t seed) {
            auto a = random_values(12 * 40, seed);
            auto b = random_values(broadcast ? 40 : 12 * 40, seed + 1);
            std::vector<float> o(a.size());
            for (size_t i = 0; i < a.size(); ++i) {
              const float bv = b[broadcast ? i % 40 : i];
              o[i] = op == BinaryOp::kAdd ? a[i] + bv : a[i] * bv;
            }
            return o;
          }});
    }
  }
  return cases;
}

class BackendOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(BackendOps, CpuMatchesIndependentReference) {
  const OpCase& c = GetParam();
  auto cpu = make_cpu_backend();
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<float> got = c.run(*cpu, seed);
    const std::vector<float> ref = c.reference(seed);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LE(rel_err(got, ref), c.tolerance) << c.name << " seed " << seed;
  }
}

TEST_P(BackendOps, EveryBackendMatchesCpu) {
  const OpCase& c = GetParam();
  auto cpu = make_cpu_backend();
  int compared = 0;
  for (BackendKind kind : available_backends()) {
    if (kind == BackendKind::kCpu) continue;
    auto be = create_backend(kind);
    ASSERT_TRUE(be.has_value()) << be.error().to_string();
    for (uint32_t seed : {11u, 12u}) {
      // Device ops may reorder sums: allow 10x the CPU tolerance, at least 1e-5.
      EXPECT_LE(rel_err(c.run(**be, seed), c.run(*cpu, seed)), std::max(1e-5, 10 * c.tolerance))
          << c.name << " on " << backend_kind_name(kind);
    }
    ++compared;
  }
  if (compared == 0) GTEST_SKIP() << "only the CPU backend is available in this build/machine (no CUDA device)";
}

INSTANTIATE_TEST_SUITE_P(AllOps, BackendOps, ::testing::ValuesIn(op_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(BackendRegistry, CpuAlwaysAvailableAndUnknownNameIsAnError) {
  auto kinds = available_backends();
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds[0], BackendKind::kCpu);
  auto bad = create_backend("tpu");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("unknown backend"), std::string::npos);
}

}  // namespace
}  // namespace moeserve

// The V4.1 attention-side CUDA ops (round 2, backend/cuda/kernels.h) against their CPU references
// (backend/cpu/v41_ops.h) on random inputs, never zeros; outputs poisoned (NaN / 0xAA bytes) first.
// Tolerances: max|got - ref| / max|ref| unless stated; cache records and selections are exact.
// GPU cases skip without a device; the CPU-only cases check properties of the references.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend/cpu/quant_ops.h"
#include "backend/cpu/v41_ops.h"
#include "common/fake_quant.h"
#include "common/numeric.h"

#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_bench.h"
#include "backend/cuda/device_runtime.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/model_glue.h"
#endif

namespace moeserve {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> rnd(int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) do
      x = d(rng);
    while (x == 0.0f);
  return v;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) && got[i] == ref[i]) continue;
    if (!std::isfinite(got[i])) return kInf;
    num = std::max(num, std::abs(static_cast<double>(got[i]) - ref[i]));
    den = std::max(den, std::abs(static_cast<double>(ref[i])));
  }
  return num / den;
}

cpu::YarnParams yarn() { return {}; }
std::vector<double> main_freqs() { return cpu::rope_frequencies(1e4, 64, nullptr); }
std::vector<double> compress_freqs() {
  const cpu::YarnParams y = yarn();
  return cpu::rope_frequencies(1.6e5, 64, &y);
}

// FP8 SWA records / FP4 main entries / index keys of random latents.
[[maybe_unused]] std::vector<uint8_t> swa_records(int64_t n, std::mt19937& rng) {
  auto x = rnd(n * 512, rng, -3, 3);
  std::vector<uint8_t> out(static_cast<size_t>(n * cpu::swa_row_bytes(512)));
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  cpu::swa_write_fp8(x.data(), 512, n, 512, pos.data(), out.data(), static_cast<int>(n));
  return out;
}
// Each 32-value block of x times 2^k, k uniform in [-spread, spread]: per-block scales that differ
// within a vector (uniform random values give every block of a vector nearly the same scale).
[[maybe_unused]] void scale_blocks32(std::vector<float>& x, std::mt19937& rng, int spread) {
  std::uniform_int_distribution<int> e(-spread, spread);
  for (size_t b = 0; b < x.size(); b += 32) {
    const float s = std::ldexp(1.0f, e(rng));
    for (size_t i = b; i < std::min(x.size(), b + 32); ++i) x[i] *= s;
  }
}
[[maybe_unused]] std::vector<uint8_t> fp4_records(int64_t n, int dim, cpu::Fp4Record f,
                                                  std::mt19937& rng, int block_exp_spread = 0) {
  auto x = rnd(n * dim, rng, -2, 2);
  if (block_exp_spread > 0) scale_blocks32(x, rng, block_exp_spread);
  std::vector<uint8_t> out(static_cast<size_t>(n * cpu::fp4_record_bytes(f, dim)));
  cpu::fp4_cache_write(x.data(), dim, n, dim, f, out.data(), 0);
  return out;
}

// The k-permuted activation layout (GroupedMxfp4GemmParams::a_kperm, the quantisers' kperm64),
// written out here from its definition rather than taken from the kernels: within every 64-wide
// tile, column 16 s + 8 h + 2 t + v holds k = 16 t + 4 s + 2 h + v. Returns the k of column c.
int64_t kperm_source(int64_t c) {
  const int64_t j = c & 63, s = j >> 4, h = (j >> 3) & 1, t = (j >> 1) & 3, v = j & 1;
  return (c - j) + 16 * t + 4 * s + 2 * h + v;
}

// `rows` rows of pitch ld with their first `cols` columns k-permuted: out[c] = in[kperm_source(c)].
template <typename T>
[[maybe_unused]] std::vector<T> kperm_rows(const std::vector<T>& in, int64_t rows, int64_t cols,
                                           int64_t ld) {
  std::vector<T> out = in;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[static_cast<size_t>(r * ld + c)] = in[static_cast<size_t>(r * ld + kperm_source(c))];
  return out;
}

// ---- CPU reference properties -------------------------------------------------------------------

// The algebra the swapped-operand kernel's k-permuted decode rests on: the layout permutes each
// tile, and the wgmma A-fragment columns of thread t (lane % 4) in k16 step s, 16 s + 2 t + v
// (low register, h = 0) and 16 s + 8 + 2 t + v (high, h = 1), then hold k whose packed e2m1 nibble
// is nibble v of byte 8 t + 2 s + h (word s / 2 of the thread's 8 bytes, byte 2 (s % 2) + h: the
// order e2m1x8_to_bf16 yields the pairs of steps 2 q, 2 q + 1), all in 32-wide block t / 2.
TEST(V41OpsCpu, KpermLayoutGivesEachThreadEightBytesUnderOneScale) {
  std::vector<int> seen(128, 0);
  for (int64_t c = 0; c < 128; ++c) {
    const int64_t k = kperm_source(c);
    ASSERT_EQ(k / 64, c / 64) << c;  // stays in its tile
    ++seen[static_cast<size_t>(k)];
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  for (int t = 0; t < 4; ++t)
    for (int s = 0; s < 4; ++s)
      for (int h = 0; h < 2; ++h)
        for (int v = 0; v < 2; ++v) {
          const int64_t k = kperm_source(64 + 16 * s + 8 * h + 2 * t + v) - 64;
          EXPECT_EQ(k / 2, 8 * t + 2 * s + h) << t << s << h << v;
          EXPECT_EQ(k % 2, v);
          EXPECT_EQ(k / 32, t / 2);
        }
}

TEST(V41OpsCpu, YarnFrequencies) {
  const auto f = compress_freqs();
  const auto m = main_freqs();
  ASSERT_EQ(f.size(), 32u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);                                  // i <= low (15): unchanged
  EXPECT_DOUBLE_EQ(f[31], std::pow(1.6e5, -62.0 / 64) / 16.0);  // i >= high (25): / 16
  EXPECT_DOUBLE_EQ(m[31], std::pow(1e4, -62.0 / 64));
}

TEST(V41OpsCpu, RopeInverseUndoesForward) {
  std::mt19937 rng(1);
  auto x = rnd(3 * 4 * 128, rng, -1, 1);
  auto y = x;
  std::vector<int32_t> pos = {0, 77, 1048575};
  const auto f = compress_freqs();
  cpu::rope(y.data(), 3, 512, 4, 128, 128, 64, pos.data(), f.data(), false);
  cpu::rope(y.data(), 3, 512, 4, 128, 128, 64, pos.data(), f.data(), true);
  EXPECT_LE(rel_err(y, x), 1e-6);
}

TEST(V41OpsCpu, SinkhornIsDoublyStochastic) {
  std::mt19937 rng(2);
  const int64_t t = 2, dim = 64;
  auto x = rnd(t * 4 * dim, rng, -1, 1), fn = rnd(24 * 4 * dim, rng, -0.1f, 0.1f);
  auto base = rnd(24, rng, -1, 1), scale = rnd(3, rng, 0.5f, 1.5f);
  std::vector<float> pre(8), post(8), comb(32);
  cpu::hc_mixes(x.data(), 4 * dim, t, 4, dim, fn.data(), base.data(), scale.data(), 1e-20f, 1e-6f,
                20, pre.data(), post.data(), comb.data());
  for (int r = 0; r < t; ++r)
    for (int k = 0; k < 4; ++k) {
      double row = 0, col = 0;
      for (int j = 0; j < 4; ++j) row += comb[r * 16 + k * 4 + j], col += comb[r * 16 + j * 4 + k];
      EXPECT_NEAR(col, 1.0, 1e-5);
      EXPECT_NEAR(row, 1.0, 1e-3);
      EXPECT_GT(pre[r * 4 + k], 0.0f);
      EXPECT_LT(post[r * 4 + k], 2.0f);
    }
}

TEST(V41OpsCpu, CompressorChunkedEqualsOneShot) {
  std::mt19937 rng(3);
  const int dim = 64;
  const int64_t n = 11;
  auto kv = rnd(n * dim, rng, -2, 2), g = rnd(n * dim, rng, -2, 2), w = rnd(dim, rng, 0.5f, 1.5f);
  std::vector<float> skv(dim), sg(dim);
  std::vector<float> one(static_cast<size_t>(cpu::compressor_groups(0, n, 2) * dim));
  cpu::compressor(kv.data(), g.data(), dim, n, dim, 2, 0, skv.data(), sg.data(), w.data(), 1e-20f,
                  one.data());
  std::vector<float> chunked;
  std::vector<float> skv2(dim), sg2(dim);
  int64_t s = 0;
  for (int64_t len : {3, 1, 1, 4, 2}) {
    std::vector<float> o(static_cast<size_t>(cpu::compressor_groups(s, len, 2) * dim));
    cpu::compressor(kv.data() + s * dim, g.data() + s * dim, dim, len, dim, 2, s, skv2.data(),
                    sg2.data(), w.data(), 1e-20f, o.data());
    chunked.insert(chunked.end(), o.begin(), o.end());
    s += len;
  }
  EXPECT_EQ(chunked, one);
  EXPECT_EQ(one.size(), 5u * dim);
}

TEST(V41OpsCpu, SwaRecordRoundTripsFakeQuant) {
  std::mt19937 rng(4);
  auto x = rnd(512, rng, -5, 5);
  std::vector<uint8_t> ring(528);
  const int32_t pos = 0;
  cpu::swa_write_fp8(x.data(), 512, 1, 512, &pos, ring.data(), 1);
  std::vector<float> back(512), fq(512);
  cpu::swa_record_to_float(ring.data(), 512, back.data());
  fq_fp8_block32_pow2(x, fq);
  EXPECT_EQ(back, fq);
}

TEST(V41OpsCpu, TopkTiesGoToTheLowerIndex) {
  std::vector<float> s = {1, 3, 3, -kInf, 0, 3, 0};
  std::vector<int32_t> idx(4), cnt(1);
  std::vector<float> val(4);
  cpu::topk_rows(s.data(), 1, 7, 7, 4, idx.data(), val.data(), cnt.data());
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 2, 5, 0}));
  std::vector<int32_t> idx8(8);
  cpu::topk_rows(s.data(), 1, 7, 7, 8, idx8.data(), nullptr, cnt.data());
  EXPECT_EQ(cnt[0], 6);
  EXPECT_EQ(idx8[6], -1);
}

TEST(V41OpsCpu, GreedySamplingIsArgmax) {
  std::mt19937 rng(5);
  auto l = rnd(1000, rng, -5, 5);
  const uint64_t seed = 9;
  int32_t out = -1;
  cpu::sample_rows(l.data(), 1, 1000, 1000, 0.0f, 50, 0.9f, &seed, &out);
  EXPECT_EQ(out, std::max_element(l.begin(), l.end()) - l.begin());
}

#ifdef MOESERVE_HAVE_CUDA

// max |got - want| over the mHC mixes' three outputs; a NaN (e.g. an output the kernel never
// wrote: the tests fill them with NaN first) counts as infinity. NOTE: std::max(worst, NaN) keeps
// worst, so the plain max would let unwritten outputs pass.
double mixes_worst(const std::vector<float>& gpre, const std::vector<float>& pre,
                   const std::vector<float>& gpost, const std::vector<float>& post,
                   const std::vector<float>& gcomb, const std::vector<float>& comb) {
  double worst = 0.0;
  for (const auto& [g, r] : {std::pair{&gpre, &pre}, {&gpost, &post}, {&gcomb, &comb}})
    for (size_t i = 0; i < r->size(); ++i) {
      const double d = std::abs(double{(*g)[i]} - (*r)[i]);
      worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
    }
  return worst;
}

class CudaV41 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
    backend_ = make_cuda_backend(0);
    stream_ = cuda_backend_stream(*backend_);
  }
  template <typename T>
  T* up(const std::vector<T>& host) {
    const int64_t bytes = static_cast<int64_t>(std::max<size_t>(host.size(), 1) * sizeof(T));
    bufs_.push_back(backend_->allocate(DType::kU8, {bytes}));
    if (!host.empty()) {
      std::vector<T> copy = host;
      backend_->copy_from_host(bufs_.back()->view(), TensorView(copy.data(), DType::kU8, {bytes}));
    }
    return static_cast<T*>(bufs_.back()->view().data());
  }
  template <typename T>
  std::vector<T> down(const T* dev, size_t n) {
    std::vector<T> host(n);
    for (auto& b : bufs_)
      if (b->view().data() == dev) {
        backend_->copy_to_host(
            TensorView(host.data(), DType::kU8, {static_cast<int64_t>(n * sizeof(T))}),
            TensorView(const_cast<T*>(dev), DType::kU8, {static_cast<int64_t>(n * sizeof(T))},
                       b->view().device()));
      }
    backend_->synchronize();
    return host;
  }
  float* nans(size_t n) { return up(std::vector<float>(n, kNaN)); }
  // launch_moe_group's parameters for ids / weights ([tokens, topk]) with outputs poisoned (-7,
  // NaN) and sized for `reps` copies of every hit.
  cuda::MoeGroupParams group_params(const std::vector<int32_t>& ids, const std::vector<float>& wts,
                                    int64_t tokens, int topk, int local, int reps) {
    const int64_t hits = tokens * topk;
    cuda::MoeGroupParams gp;
    gp.ids = up(ids);
    gp.weights = up(wts);
    gp.rows = tokens;
    gp.k = topk;
    gp.local = local;
    gp.replicas = reps;
    gp.offsets = up(std::vector<int32_t>(static_cast<size_t>(local) + 1, -7));
    gp.perm_row = up(std::vector<int32_t>(static_cast<size_t>(hits * reps), -7));
    gp.perm_weight = nans(static_cast<size_t>(hits * reps));
    gp.inv = up(std::vector<int32_t>(static_cast<size_t>(hits), -7));
    gp.scratch = up(std::vector<int32_t>(static_cast<size_t>(cuda::moe_group_scratch_ints(local)), -7));
    return gp;
  }

  // The inputs of a sparse attention launch as device copies of the host arrays: q [rows, heads,
  // 512], the SWA ring records and (empty: the implicit window) its per-row indices, the global
  // records with gk indices per row, the sinks, the positions and (empty: no inverse RoPE) the
  // RoPE frequencies. The outputs and kernel choices are the caller's.
  struct AttentionInputs {
    const std::vector<float>& q;
    int64_t rows;
    int heads;
    const std::vector<uint8_t>& ring;
    const std::vector<int32_t>& sidx;
    const std::vector<uint8_t>& glob;
    const std::vector<int32_t>& gidx;
    int gk;
    const std::vector<float>& sink;
    const std::vector<int32_t>& pos;
    const std::vector<double>& freqs;
  };
  cuda::SparseAttentionParams attention_params(const AttentionInputs& in) {
    cuda::SparseAttentionParams p;
    p.q = up(in.q);
    p.rows = in.rows;
    p.heads = in.heads;
    p.swa = up(in.ring);
    p.swa_idx = in.sidx.empty() ? nullptr : up(in.sidx);
    p.glob = up(in.glob);
    p.glob_idx = up(in.gidx);
    p.glob_k = in.gk;
    p.sink = up(in.sink);
    p.pos = up(in.pos);
    p.freqs = in.freqs.empty() ? nullptr : up(in.freqs);
    return p;
  }

  // The CPU (double) reference on rows 0..3 and every stride-th row of a launch on `in` (explicit
  // SWA indices, sidx.size() / rows per row; RoPE freqs set), one row at a time against the rows of
  // `got` (the launch's fp32 output): each row's relative error must be at most tol. Returns the
  // worst.
  static double sampled_rows_vs_cpu(const AttentionInputs& in, const std::vector<float>& got,
                                    int64_t stride, double tol) {
    const int hd = 512;
    const int sk = static_cast<int>(in.sidx.size() / static_cast<size_t>(in.rows));
    const size_t rsz = static_cast<size_t>(in.heads) * hd;
    std::vector<float> ref(rsz), row(rsz);
    double worst = 0;
    for (int64_t r = 0; r < in.rows; ++r) {
      if (r % stride != 0 && r > 3) continue;
      const auto ru = static_cast<size_t>(r);
      cpu::sparse_attention(in.q.data() + ru * rsz, 1, in.heads, hd, in.ring.data(),
                            in.sidx.data() + ru * sk, sk, in.glob.data(),
                            in.gidx.data() + ru * in.gk, in.gk, in.sink.data(),
                            0.04419417382415922f, in.pos.data() + ru, in.freqs.data(), 64,
                            ref.data());
      std::copy(got.begin() + static_cast<std::ptrdiff_t>(ru * rsz),
                got.begin() + static_cast<std::ptrdiff_t>((ru + 1) * rsz), row.begin());
      const double e = rel_err(row, ref);
      worst = std::max(worst, e);
      EXPECT_LE(e, tol) << "row " << r;
    }
    return worst;
  }

  // The epilogue tests' wgmma attention launch (fp32 output, no RoPE): t rows at positions
  // 50 + 13 r, each with its SWA window of sk ring entries and gk global picks in [-1, nglob),
  // random q and sinks.
  cuda::SparseAttentionParams epilogue_case(int64_t t, int heads, const std::vector<uint8_t>& ring,
                                            const std::vector<uint8_t>& glob, int64_t nglob, int sk,
                                            int gk, std::mt19937& rng) {
    std::vector<int32_t> pos(static_cast<size_t>(t));
    for (int64_t r = 0; r < t; ++r) pos[static_cast<size_t>(r)] = static_cast<int32_t>(50 + 13 * r);
    std::vector<int32_t> sidx(static_cast<size_t>(t * sk));
    cpu::swa_window_indices(pos.data(), t, sk, sk, 0, sidx.data());
    std::vector<int32_t> gidx(static_cast<size_t>(t * gk));
    std::uniform_int_distribution<int> pick(-1, static_cast<int>(nglob) - 1);
    for (auto& g : gidx) g = pick(rng);
    const auto q = rnd(t * static_cast<int64_t>(heads) * 512, rng, -1, 1);
    const auto sink = rnd(heads, rng, -2, 2);
    cuda::SparseAttentionParams p = attention_params(
        {q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, std::vector<double>{}});
    p.use_wgmma = true;
    return p;
  }

  // The references of the attention's quantising epilogues: launch_act_quant_mxfp8 (kBF16) of an
  // fp32 output [t, cols] (what out_mxfp8_bf16 must equal), and launch_act_quant_fp8_rows (kBF16)
  // of those bf16 values (the codes and row scales out_fp8_rows / out_row_scale must equal).
  uint16_t* mxfp8_bf16_of(const float* x, int64_t t, int64_t cols) {
    const size_t n = static_cast<size_t>(t * cols);
    uint16_t* out = up(std::vector<uint16_t>(n, 0x7FC1));
    cuda::ActQuantParams ap;
    ap.x = x;
    ap.ldx = cols;
    ap.rows = t;
    ap.cols = cols;
    ap.out = out;
    ap.out_type = cuda::ActivationType::kBF16;
    ap.ldo = cols;
    cuda::launch_act_quant_mxfp8(ap, stream_);
    return out;
  }
  std::pair<uint8_t*, float*> fp8_rows_of(const uint16_t* x, int64_t t, int64_t cols) {
    uint8_t* out = up(std::vector<uint8_t>(static_cast<size_t>(t * cols), 0x7F));
    float* rs = nans(static_cast<size_t>(t));
    cuda::ActQuantFp8RowsParams ap;
    ap.x = x;
    ap.x_type = cuda::ActivationType::kBF16;
    ap.ldx = cols;
    ap.rows = t;
    ap.cols = cols;
    ap.out = out;
    ap.ldo = cols;
    ap.row_scale = rs;
    cuda::launch_act_quant_fp8_rows(ap, stream_);
    return {out, rs};
  }

  // Key selections of the persistent wgmma tests: t rows at positions 1000 + r, row r with
  // (37 r) % (sk + 1) SWA keys and (53 r) % (gk + 1) FP4 keys drawn from nglob entries (none
  // where r % 11 == 0, one SWA key where it is 1, one FP4 key where it is 2); with gaps, every
  // third FP4 slot stays -1 (the list compacts).
  struct PersistentRows {
    std::vector<int32_t> sidx, gidx, pos;
  };
  static PersistentRows persistent_rows(int64_t t, int sk, int gk, int64_t nglob, bool gaps,
                                        std::mt19937& rng) {
    PersistentRows k{std::vector<int32_t>(static_cast<size_t>(t * sk), -1),
                     std::vector<int32_t>(static_cast<size_t>(t * gk), -1),
                     std::vector<int32_t>(static_cast<size_t>(t))};
    for (int64_t r = 0; r < t; ++r) {
      k.pos[static_cast<size_t>(r)] = 1000 + static_cast<int32_t>(r);
      int nswa = static_cast<int>((r * 37) % (sk + 1));
      int nfp4 = static_cast<int>((r * 53) % (gk + 1));
      if (r % 11 == 0) nswa = nfp4 = 0;
      if (r % 11 == 1) nswa = 1, nfp4 = 0;
      if (r % 11 == 2) nswa = 0, nfp4 = 1;
      for (int i = 0; i < nswa; ++i)
        k.sidx[static_cast<size_t>(r * sk + i)] = static_cast<int32_t>((7 * i + r) % sk);
      for (int j = 0, n = 0; j < gk && n < nfp4; ++j) {
        if (gaps && j % 3 == 2) continue;
        k.gidx[static_cast<size_t>(r * gk + j)] = static_cast<int32_t>(rng() % nglob);
        ++n;
      }
    }
    return k;
  }

  // The grouped GEMM's A: random rows after the MXFP8 fake-quant, as fp32 (the CPU reference's
  // input) and as their exact bf16 bits (the device's).
  struct Mxfp8Rows {
    std::vector<float> a;
    std::vector<uint16_t> a16;
  };
  static Mxfp8Rows mxfp8_rows(int64_t rows, int64_t k, std::mt19937& rng) {
    const auto x = rnd(rows * k, rng, -2, 2);
    Mxfp8Rows m{std::vector<float>(x.size(), 0.0f), std::vector<uint16_t>(x.size(), 0)};
    for (int64_t r = 0; r < rows; ++r)
      fq_fp8_block32_pow2(std::span<const float>(x).subspan(static_cast<size_t>(r * k), k),
                          std::span<float>(m.a).subspan(static_cast<size_t>(r * k), k));
    for (size_t i = 0; i < m.a.size(); ++i) m.a16[i] = float_to_bf16(m.a[i]);
    return m;
  }
  // One set of random MXFP4 expert weights [n, k] (host bytes, device pointers) and the grouped
  // CPU reference: rows off[e] .. off[e + 1] of a through expert e.
  struct Mxfp4Experts {
    std::vector<std::vector<uint8_t>> w, s;
    std::vector<const uint8_t*> wp, sp;
    std::vector<float> ref;
  };
  Mxfp4Experts mxfp4_experts(const std::vector<int32_t>& off, int64_t n, int64_t k,
                             const std::vector<float>& a, std::mt19937& rng) {
    const size_t local = off.size() - 1;
    Mxfp4Experts x;
    x.ref.assign(static_cast<size_t>(off.back() * n), 0.0f);
    for (size_t e = 0; e < local; ++e) {
      x.w.emplace_back(static_cast<size_t>(n * k / 2));
      x.s.emplace_back(static_cast<size_t>(n * k / 32));
      for (auto& b : x.w.back()) b = static_cast<uint8_t>(rng());
      for (auto& b : x.s.back()) b = static_cast<uint8_t>(118 + rng() % 16);
      x.wp.push_back(up(x.w.back()));
      x.sp.push_back(up(x.s.back()));
      const int64_t m = off[e + 1] - off[e];
      if (m == 0) continue;
      std::vector<float> ae(a.begin() + off[e] * k, a.begin() + off[e + 1] * k);
      cpu::mxfp4_gemm(TensorView(ae.data(), DType::kF32, {m, k}),
                      TensorView(x.w.back().data(), DType::kFp4E2m1, {n, k}),
                      TensorView(x.s.back().data(), DType::kF8E8M0, {n, k / 32}),
                      TensorView(x.ref.data() + off[e] * n, DType::kF32, {m, n}));
    }
    return x;
  }

  // A grouped GEMM's output y (rows past off.back() included) against its CPU reference over the
  // grouped rows: within 2e-5 of max |ref| (the grouped table kernel's tolerance: exact products,
  // fp32 sums), also per expert (a wrong expert's rows would stand out), and the rows past the
  // grouped count untouched (NaN).
  static void expect_grouped_output(const std::vector<float>& got, const std::vector<float>& ref,
                                    const std::vector<int32_t>& off, int64_t n) {
    const int64_t total = off.back();
    const std::vector<float> head(got.begin(), got.begin() + total * n);
    EXPECT_LE(rel_err(head, ref), 2e-5);
    for (size_t e = 0; e + 1 < off.size(); ++e) {
      const int64_t m = off[e + 1] - off[e];
      if (m == 0) continue;
      const std::vector<float> ge(got.begin() + off[e] * n, got.begin() + off[e + 1] * n);
      const std::vector<float> re(ref.begin() + off[e] * n, ref.begin() + off[e + 1] * n);
      EXPECT_LE(rel_err(ge, re), 2e-5) << "expert " << e << " rows " << m;
    }
    for (size_t i = static_cast<size_t>(total * n); i < got.size(); ++i)
      ASSERT_TRUE(std::isnan(got[i])) << "row past the grouped count written: " << i;
  }

  // The fields every grouped launch sets: A (bf16 rows, pitch k), the counts `off`, the experts'
  // weight set `ex`, the output shape (ldy = n) and max_rows; the kernel choice, a_rows and the
  // outputs are left to the test.
  cuda::GroupedMxfp4GemmParams grouped_launch(const std::vector<uint16_t>& a16,
                                              const std::vector<int32_t>& off,
                                              const Mxfp4Experts& ex, int64_t n, int64_t k,
                                              int64_t max_rows) {
    cuda::GroupedMxfp4GemmParams g;
    g.a = up(a16);
    g.lda = k;
    g.offsets = up(off);
    g.num_experts = static_cast<int>(off.size()) - 1;
    g.max_rows = max_rows;
    g.w = up(ex.wp);
    g.w_scale = up(ex.sp);
    g.ldy = n;
    g.n = n;
    g.k = k;
    return g;
  }

  // The grouped launch of the refusal tests: every expert holds one random MXFP4 weight set
  // [n, k], A is all 1.0 (bf16) over off.back() rows, the counts are `off`; the kernel choice
  // (rows_hint, wgmma flags) and outputs are left to the test.
  cuda::GroupedMxfp4GemmParams one_weight_launch(uint32_t seed, int64_t n, int64_t k,
                                                 const std::vector<int32_t>& off,
                                                 int64_t max_rows) {
    std::mt19937 rng(seed);
    const int local = static_cast<int>(off.size()) - 1;
    std::vector<uint8_t> w(static_cast<size_t>(n * k / 2)), s(static_cast<size_t>(n * k / 32));
    for (auto& b : w) b = static_cast<uint8_t>(rng());
    for (auto& b : s) b = static_cast<uint8_t>(118 + rng() % 16);
    const uint8_t* dw = up(w);
    const uint8_t* ds = up(s);
    cuda::GroupedMxfp4GemmParams g;
    g.a = up(std::vector<uint16_t>(static_cast<size_t>(off.back() * k), 0x3F80));
    g.lda = k;
    g.offsets = up(off);
    g.num_experts = local;
    g.max_rows = max_rows;
    g.w = up(std::vector<const uint8_t*>(local, dw));
    g.w_scale = up(std::vector<const uint8_t*>(local, ds));
    g.ldy = n;
    g.n = n;
    g.k = k;
    return g;
  }

  // The indexer's wgmma path against the CPU over decode-like batches (defined with its tests).
  void check_indexer_wgmma_row_slots(bool fp8, int key_spread, double tol);

  // A small launch_hc_expand_mixes that is accepted (the refusal tests change one field of it):
  // hc 4, dim 64, 3 rows of random inputs, NaN outputs; with_norm adds the collapse and its
  // RMSNorm (collapse_pre, collapse_out, collapse_norm_weight, eps 1e-6).
  cuda::HcExpandMixesParams small_expand_mixes(uint32_t seed, bool with_norm) {
    std::mt19937 rng(seed);
    const int hc = 4;
    const int64_t dim = 64, t = 3, width = hc * dim;
    cuda::HcExpandMixesParams p;
    p.x = up(rnd(t * width, rng, -2, 2));
    p.y = up(rnd(t * dim, rng, -1, 1));
    p.rows = t;
    p.hc = hc;
    p.dim = dim;
    p.post = up(rnd(t * hc, rng, 0.2f, 2));
    p.comb = up(rnd(t * hc * hc, rng, 0.01f, 0.6f));
    if (with_norm) {
      p.collapse_pre = up(rnd(t * hc, rng, 0.1f, 1.1f));
      p.collapse_out = nans(t * dim);
    }
    p.fn = up(rnd(24 * width, rng, -0.02f, 0.02f));
    p.base = up(rnd(24, rng, -1, 1));
    p.scale = up(rnd(3, rng, 0.5f, 1.5f));
    p.mix_pre = nans(t * hc);
    p.mix_post = nans(t * hc);
    p.mix_comb = nans(t * hc * hc);
    if (with_norm) {
      p.collapse_norm_weight = up(rnd(dim, rng, 0.5f, 1.5f));
      p.collapse_norm_eps = 1e-6f;
    }
    return p;
  }

  std::unique_ptr<Backend> backend_;
  void* stream_ = nullptr;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs_;
};

// Angles in double on both sides: 1e-5. Head counts 64 (q), 13 and 1 (kv), rows pitched past
// their heads (untouched there), at 1, 3 and 8 heads per thread (RopeParams::heads_per_thread:
// partial last groups at 13 heads): the same bits at every setting. 0 and 9 are refused.
TEST_F(CudaV41, RopeForwardAndInverse) {
  std::mt19937 rng(10);
  const int64_t t = 5;
  const int hd = 512;
  std::vector<int32_t> pos = {0, 1, 127, 65537, 1048575};
  for (int heads : {64, 13, 1}) {
    const int64_t row_stride = heads * hd + 16;
    const auto x = rnd(t * row_stride, rng, -2, 2);
    for (bool compress : {false, true})
      for (bool inverse : {false, true}) {
        const auto f = compress ? compress_freqs() : main_freqs();
        auto ref = x;
        cpu::rope(ref.data(), t, row_stride, heads, hd, hd, 64, pos.data(), f.data(), inverse);
        std::vector<float> one_per_thread;
        for (int hpt : {1, 3, 8}) {
          float* dx = up(x);
          cuda::RopeParams rp{dx, t, row_stride, heads, hd, hd, 64, up(pos), up(f), inverse};
          rp.heads_per_thread = hpt;
          cuda::launch_rope(rp, stream_);
          const auto got = down(dx, x.size());
          const std::string what = "heads " + std::to_string(heads) + " hpt " +
                                   std::to_string(hpt) + " compress " + std::to_string(compress) +
                                   " inverse " + std::to_string(inverse);
          EXPECT_LE(rel_err(got, ref), 1e-5) << what;
          for (int64_t r = 0; r < t; ++r)  // the pitch's padding is not written
            for (int64_t c = heads * hd; c < row_stride; ++c)
              ASSERT_EQ(got[static_cast<size_t>(r * row_stride + c)],
                        x[static_cast<size_t>(r * row_stride + c)])
                  << what;
          if (hpt == 1) {
            one_per_thread = got;
          } else {
            EXPECT_EQ(std::memcmp(got.data(), one_per_thread.data(), got.size() * sizeof(float)), 0)
                << what;
          }
        }
      }
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  cuda::RopeParams bad{nans(64), 1, 64, 1, 64, 64, 64, up(pos), up(main_freqs()), false};
  for (int hpt : {0, 9}) {
    bad.heads_per_thread = hpt;
    EXPECT_DEATH(cuda::launch_rope(bad, stream_), "bad arguments") << hpt;
  }
}

TEST_F(CudaV41, SwigluClamped) {
  std::mt19937 rng(11);
  const int64_t t = 7, c = 2304;
  auto g = rnd(t * c, rng, -15, 15), u = rnd(t * c, rng, -15, 15), w = rnd(t, rng, 0.1f, 2);
  for (bool weighted : {false, true}) {
    std::vector<float> ref(static_cast<size_t>(t * c));
    cpu::swiglu_clamped(g.data(), c, u.data(), c, ref.data(), c, t, c, 10.0f,
                        weighted ? w.data() : nullptr);
    float* o = nans(ref.size());
    cuda::launch_swiglu_clamped({up(g), c, up(u), c, o, c, t, c, 10.0f, weighted ? up(w) : nullptr},
                                stream_);
    EXPECT_LE(rel_err(down(o, ref.size()), ref), 1e-5);
  }
}

// fp32 split-K dots vs double, then sigmoid/softmax/Sinkhorn in fp32: 1e-4 absolute.
TEST_F(CudaV41, HcMixesCollapseExpand) {
  std::mt19937 rng(12);
  for (int64_t dim : {64, 5120})
    for (int64_t t : {1, 3, 17}) {
      const int hc = 4;
      auto x = rnd(t * hc * dim, rng, -2, 2), fn = rnd(24 * hc * dim, rng, -0.02f, 0.02f);
      auto base = rnd(24, rng, -1, 1), scale = rnd(3, rng, 0.5f, 1.5f);
      std::vector<float> pre(t * hc), post(t * hc), comb(t * hc * hc);
      cpu::hc_mixes(x.data(), hc * dim, t, hc, dim, fn.data(), base.data(), scale.data(), 1e-20f,
                    1e-6f, 20, pre.data(), post.data(), comb.data());
      float *dpre = nans(pre.size()), *dpost = nans(post.size()), *dcomb = nans(comb.size());
      float* dx = up(x);
      cuda::launch_hc_mixes({dx, hc * dim, t, hc, dim, up(fn), up(base), up(scale), 1e-20f, 1e-6f,
                             20, dpre, dpost, dcomb},
                            stream_);
      const auto gpre = down(dpre, pre.size()), gpost = down(dpost, post.size()),
                 gcomb = down(dcomb, comb.size());
      for (size_t i = 0; i < pre.size(); ++i) EXPECT_NEAR(gpre[i], pre[i], 1e-4);
      for (size_t i = 0; i < post.size(); ++i) EXPECT_NEAR(gpost[i], post[i], 1e-4);
      for (size_t i = 0; i < comb.size(); ++i) EXPECT_NEAR(gcomb[i], comb[i], 1e-4);
      // collapse / expand with the CPU coefficients.
      std::vector<float> col(static_cast<size_t>(t * dim));
      cpu::hc_collapse(x.data(), t, hc, dim, pre.data(), col.data());
      float* dcol = nans(col.size());
      cuda::launch_hc_collapse({dx, t, hc, dim, up(pre), dcol}, stream_);
      EXPECT_LE(rel_err(down(dcol, col.size()), col), 1e-5);
      auto y = rnd(t * dim, rng, -1, 1);
      auto ex = x;
      cpu::hc_expand(ex.data(), y.data(), t, hc, dim, post.data(), comb.data());
      cuda::launch_hc_expand({dx, up(y), t, hc, dim, up(post), up(comb)}, stream_);
      EXPECT_LE(rel_err(down(dx, ex.size()), ex), 1e-5);
    }
}

// The one-launch mixes at the decode (1, 7, 384 rows: 2 rows per thread, 1-2 warps per row group)
// and prefill (4096: 4 rows per thread, 8 warps per row group) tile shapes, V4.1 width 4 x 5120;
// then collapse, expand, and expand with the fused collapse on the same rows. fp32 dots vs
// double: 1e-4 absolute on pre/post/comb; 1e-5 relative on collapse/expand; the fused collapse
// equals launch_hc_collapse of the expanded x bit for bit.
TEST_F(CudaV41, HcMixesAtDecodeAndPrefillRows) {
  std::mt19937 rng(40);
  const int hc = 4;
  const int64_t dim = 5120;
  auto fn = rnd(24 * hc * dim, rng, -0.02f, 0.02f);
  auto base = rnd(24, rng, -1, 1), scale = rnd(3, rng, 0.5f, 1.5f);
  const float *dfn = up(fn), *dbase = up(base), *dscale = up(scale);
  for (int64_t t : {1, 7, 384, 4096}) {
    auto x = rnd(t * hc * dim, rng, -2, 2);
    std::vector<float> pre(t * hc), post(t * hc), comb(t * hc * hc);
    cpu::hc_mixes(x.data(), hc * dim, t, hc, dim, fn.data(), base.data(), scale.data(), 1e-20f,
                  1e-6f, 20, pre.data(), post.data(), comb.data());
    float *dpre = nans(pre.size()), *dpost = nans(post.size()), *dcomb = nans(comb.size());
    float* dx = up(x);
    cuda::launch_hc_mixes(
        {dx, hc * dim, t, hc, dim, dfn, dbase, dscale, 1e-20f, 1e-6f, 20, dpre, dpost, dcomb},
        stream_);
    const auto gpre = down(dpre, pre.size()), gpost = down(dpost, post.size()),
               gcomb = down(dcomb, comb.size());
    const double worst = mixes_worst(gpre, pre, gpost, post, gcomb, comb);
    EXPECT_LE(worst, 1e-4) << t << " rows";  // NaN fails too (mixes_worst)
    // Collapse, expand, then expand + fused collapse (with a second set of coefficients).
    std::vector<float> col(static_cast<size_t>(t * dim));
    cpu::hc_collapse(x.data(), t, hc, dim, pre.data(), col.data());
    float* dcol = nans(col.size());
    cuda::launch_hc_collapse({dx, t, hc, dim, up(pre), dcol}, stream_);
    EXPECT_LE(rel_err(down(dcol, col.size()), col), 1e-5) << t;
    auto y = rnd(t * dim, rng, -1, 1);
    auto ex = x;
    cpu::hc_expand(ex.data(), y.data(), t, hc, dim, post.data(), comb.data());
    cuda::launch_hc_expand({dx, up(y), t, hc, dim, up(post), up(comb)}, stream_);
    EXPECT_LE(rel_err(down(dx, ex.size()), ex), 1e-5) << t;
    auto y2 = rnd(t * dim, rng, -1, 1), pre2 = rnd(t * hc, rng, 0.1f, 1.1f);
    auto ex2 = down(dx, ex.size());
    cpu::hc_expand(ex2.data(), y2.data(), t, hc, dim, post.data(), comb.data());
    std::vector<float> col2(static_cast<size_t>(t * dim));
    cpu::hc_collapse(ex2.data(), t, hc, dim, pre2.data(), col2.data());
    float* dpre2 = up(pre2);
    float* dfused = nans(col2.size());
    cuda::launch_hc_expand({dx, up(y2), t, hc, dim, up(post), up(comb), dpre2, dfused}, stream_);
    const auto fused = down(dfused, col2.size());
    EXPECT_LE(rel_err(down(dx, ex2.size()), ex2), 1e-5) << t;
    EXPECT_LE(rel_err(fused, col2), 1e-5) << t;
    float* dcol2 = nans(col2.size());
    cuda::launch_hc_collapse({dx, t, hc, dim, dpre2, dcol2}, stream_);
    const auto col2_gpu = down(dcol2, col2.size());
    EXPECT_EQ(std::memcmp(fused.data(), col2_gpu.data(), fused.size() * sizeof(float)), 0) << t;
  }
}

// hc 1..4 on widths that are not multiples of 32 (tail units), a row pitch wider than the row
// and not a multiple of 4 (the scalar-load path), and row counts that leave partial tiles.
TEST_F(CudaV41, HcMixesOddShapes) {
  std::mt19937 rng(41);
  for (int hc : {1, 2, 3, 4})
    for (int64_t dim : {33, 72})
      for (int64_t pad : {0, 3})
        for (int64_t t : {5, 300}) {
          const int m = (2 + hc) * hc;
          const int64_t width = hc * dim, ldx = width + pad;
          auto x = rnd(t * ldx, rng, -2, 2), fn = rnd(m * width, rng, -0.05f, 0.05f);
          auto base = rnd(m, rng, -1, 1), scale = rnd(3, rng, 0.5f, 1.5f);
          std::vector<float> pre(t * hc), post(t * hc), comb(t * hc * hc);
          cpu::hc_mixes(x.data(), ldx, t, hc, dim, fn.data(), base.data(), scale.data(), 1e-20f,
                        1e-6f, 20, pre.data(), post.data(), comb.data());
          float *dpre = nans(pre.size()), *dpost = nans(post.size()), *dcomb = nans(comb.size());
          cuda::launch_hc_mixes({up(x), ldx, t, hc, dim, up(fn), up(base), up(scale), 1e-20f, 1e-6f,
                                 20, dpre, dpost, dcomb},
                                stream_);
          const auto gpre = down(dpre, pre.size()), gpost = down(dpost, post.size()),
                     gcomb = down(dcomb, comb.size());
          const double worst = mixes_worst(gpre, pre, gpost, post, gcomb, comb);
          EXPECT_LE(worst, 1e-4) << "hc " << hc << " dim " << dim << " pad " << pad << " rows "
                                 << t;
        }
}

// The staged (16-byte) mixes at every tile height (rows_per_thread 1..4 and the automatic pick)
// for hc 1..4: V4.1-Flash width 4 x 4096 at the decode step's 384 rows, a width whose chunks do
// not fill the cluster (4 x 72: 3 chunks of 128 columns for 8 blocks) and partial row tiles.
// fp32 dots vs double: 1e-4 absolute on pre/post/comb; a second launch gives the same bits.
TEST_F(CudaV41, HcMixesStagedTilesMatchCpu) {
  std::mt19937 rng(42);
  struct Shape {
    int hc;
    int64_t dim, rows;
  };
  for (const Shape& sh : {Shape{4, 4096, 384}, Shape{4, 72, 45}, Shape{3, 72, 301}, Shape{2, 72, 9},
                          Shape{1, 132, 70}}) {
    const int hc = sh.hc, m = (2 + hc) * hc;
    const int64_t dim = sh.dim, t = sh.rows, width = hc * dim;
    auto x = rnd(t * width, rng, -2, 2), fn = rnd(m * width, rng, -0.02f, 0.02f);
    auto base = rnd(m, rng, -1, 1), scale = rnd(3, rng, 0.5f, 1.5f);
    std::vector<float> pre(t * hc), post(t * hc), comb(t * hc * hc);
    cpu::hc_mixes(x.data(), width, t, hc, dim, fn.data(), base.data(), scale.data(), 1e-20f, 1e-6f,
                  20, pre.data(), post.data(), comb.data());
    const float *dx = up(x), *dfn = up(fn), *dbase = up(base), *dscale = up(scale);
    for (int rpt : {0, 1, 2, 3, 4}) {
      float *dpre = nans(pre.size()), *dpost = nans(post.size()), *dcomb = nans(comb.size());
      cuda::HcMixesParams p{dx,     width,  t,     hc, dim,  dfn,   dbase,
                            dscale, 1e-20f, 1e-6f, 20, dpre, dpost, dcomb};
      p.rows_per_thread = rpt;
      cuda::launch_hc_mixes(p, stream_);
      const auto gpre = down(dpre, pre.size()), gpost = down(dpost, post.size()),
                 gcomb = down(dcomb, comb.size());
      EXPECT_LE(mixes_worst(gpre, pre, gpost, post, gcomb, comb), 1e-4)
          << "hc " << hc << " dim " << dim << " rows " << t << " rpt " << rpt;
      cuda::launch_hc_mixes(p, stream_);
      EXPECT_EQ(down(dcomb, comb.size()), gcomb) << "rerun differs, rpt " << rpt;
      EXPECT_EQ(down(dpre, pre.size()), gpre) << "rerun differs, rpt " << rpt;
    }
  }
}

// The launch forms the fused expand + mixes tests run at: cluster widths 0 (= 8), 4 and 16
// (HcExpandMixesParams::cluster_width), and the split path without clusters
// (HcExpandMixesParams::split_blocks) at 3 blocks per tile (dim 256: 3 / 3 / 2 chunks) and 20
// (dim 5120: 8 chunks each; dim 256 and 96: blocks without any chunk), each with the FFMA dots
// and with the tensor-core ones (HcExpandMixesParams::tensor_cores).
struct ExpandMixesMode {
  int cw = 0, split = 0;
  bool tc = false;
  [[nodiscard]] std::string name() const {
    return (split > 0 ? " split " + std::to_string(split) : " width " + std::to_string(cw)) +
           (tc ? " tc" : "");
  }
  // The width hc_expand_mixes_cluster_width reports for a one-kernel shape.
  [[nodiscard]] int reported_width() const { return split > 0 ? 0 : cw == 0 ? 8 : cw; }
};
constexpr ExpandMixesMode kExpandMixesModes[] = {{0, 0},  {4, 0},        {16, 0},       {0, 3},
                                                  {0, 20}, {0, 3, true}, {0, 20, true}};

// Random inputs of launch_hc_expand_mixes, drawn in this order: x, y, post, comb, the collapse
// weights, fn (values in +-fn_range), base, scale; and their CPU results: ex = x' (cpu::hc_expand),
// col = its collapse, pre / mpost / mcomb = the mixes of x'.
struct ExpandMixesCase {
  std::vector<float> x, y, post, comb, cpre, fn, base, scale, ex, col, pre, mpost, mcomb;
};
ExpandMixesCase expand_mixes_case(std::mt19937& rng, int hc, int64_t dim, int64_t t,
                                  float fn_range) {
  const int m = (2 + hc) * hc;
  const int64_t width = hc * dim;
  ExpandMixesCase k;
  k.x = rnd(t * width, rng, -2, 2);
  k.y = rnd(t * dim, rng, -1, 1);
  k.post = rnd(t * hc, rng, 0.2f, 2);
  k.comb = rnd(t * hc * hc, rng, 0.01f, 0.6f);
  k.cpre = rnd(t * hc, rng, 0.1f, 1.1f);
  k.fn = rnd(m * width, rng, -fn_range, fn_range);
  k.base = rnd(m, rng, -1, 1);
  k.scale = rnd(3, rng, 0.5f, 1.5f);
  k.ex = k.x;
  cpu::hc_expand(k.ex.data(), k.y.data(), t, hc, dim, k.post.data(), k.comb.data());
  k.col.resize(static_cast<size_t>(t * dim));
  cpu::hc_collapse(k.ex.data(), t, hc, dim, k.cpre.data(), k.col.data());
  k.pre.resize(static_cast<size_t>(t * hc));
  k.mpost.resize(static_cast<size_t>(t * hc));
  k.mcomb.resize(static_cast<size_t>(t * hc * hc));
  cpu::hc_mixes(k.ex.data(), width, t, hc, dim, k.fn.data(), k.base.data(), k.scale.data(),
                1e-20f, 1e-6f, 20, k.pre.data(), k.mpost.data(), k.mcomb.data());
  return k;
}

// launch_hc_expand_mixes (the expand and the next site's mixes in one launch) against
// cpu::hc_expand, cpu::hc_collapse and cpu::hc_mixes of the expanded x, at decode and prefill row
// counts (1, 7: one partial tile; 384; 1000: several tiles and a partial one) and widths 4 x 256
// (8 chunks: one per block of the cluster) and 4 x 5120, with and without the fused collapse; at
// each tile height (rows_per_thread 1..4) on one shape; and at width 4 x 96 (3 chunks for the 8
// blocks of a cluster). Every case at cluster widths 0 (= 8), 4 and 16 (cluster_width; the width
// hc_expand_mixes_cluster_width reports is the one asked for: the H200 holds clusters of 16), and
// on the split path at 3 and 20 blocks per tile (kExpandMixesModes; the width reported: 0). At
// dim 256 (8 chunks) width 4 gives each block 2 chunks and width 16 leaves 8 blocks without any;
// at dim 5120 the blocks take 40 / 20 / 10 chunks. The mixes' fp32 sums run in another order at
// each width (a block's chunks, then the blocks in rank order); the tolerances are the same.
// Tolerances: x' and collapse_out 1e-5 relative to the double CPU expand (fp32 rounding) and bit
// for bit the values of launch_hc_expand (the same fp32 operations in the same order, at every
// width); pre/post/comb 1e-4 absolute against the CPU (fp32 dots vs double, as the mixes tests)
// and against launch_hc_mixes of the expanded x (another fp32 summation order); a second launch on
// the same input gives the same bits.
TEST_F(CudaV41, HcExpandMixesMatchesExpandThenMixes) {
  std::mt19937 rng(43);
  const int hc = 4;
  struct Shape {
    int64_t dim, rows;
    int rpt;
  };
  std::vector<Shape> shapes;
  for (int64_t dim : {256, 5120})
    for (int64_t t : {1, 7, 384, 1000}) shapes.push_back({dim, t, 0});
  for (int rpt : {1, 2, 3, 4}) shapes.push_back({256, 1000, rpt});
  shapes.push_back({96, 45, 0});  // 3 chunks: 5 blocks of each cluster without one
  shapes.push_back({96, 45, 4});
  for (const Shape& sh : shapes) {
    const int64_t dim = sh.dim, t = sh.rows, width = hc * dim;
    const ExpandMixesCase k = expand_mixes_case(rng, hc, dim, t, 0.02f);
    const auto &x = k.x, &y = k.y, &post = k.post, &comb = k.comb, &cpre = k.cpre, &fn = k.fn,
               &base = k.base, &scale = k.scale, &ex = k.ex, &col = k.col, &pre = k.pre,
               &mpost = k.mpost, &mcomb = k.mcomb;
    const float *dy = up(y), *dpost = up(post), *dcomb = up(comb), *dcpre = up(cpre);
    const float *dfn = up(fn), *dbase = up(base), *dscale = up(scale);
    // The unfused launches on the GPU: x' and collapse_out to compare bit for bit.
    float* dx_ref = up(x);
    float* dcol_ref = nans(col.size());
    cuda::launch_hc_expand({dx_ref, dy, t, hc, dim, dpost, dcomb, dcpre, dcol_ref}, stream_);
    float *upre = nans(pre.size()), *upost = nans(mpost.size()), *ucomb = nans(mcomb.size());
    cuda::launch_hc_mixes(
        {dx_ref, width, t, hc, dim, dfn, dbase, dscale, 1e-20f, 1e-6f, 20, upre, upost, ucomb},
        stream_);
    const auto gx_ref = down(dx_ref, x.size()), gcol_ref = down(dcol_ref, col.size());
    const auto gupre = down(upre, pre.size()), gupost = down(upost, mpost.size()),
               gucomb = down(ucomb, mcomb.size());
    for (bool collapse : {false, true})
      for (const ExpandMixesMode& mode : kExpandMixesModes) {
        const std::string what = "dim " + std::to_string(dim) + " rows " + std::to_string(t) +
                                 " rpt " + std::to_string(sh.rpt) + " collapse " +
                                 std::to_string(collapse) + mode.name();
        std::vector<std::vector<float>> runs;
        for (int rerun = 0; rerun < 2; ++rerun) {
          cuda::HcExpandMixesParams p;
          p.x = up(x);
          p.y = dy;
          p.rows = t;
          p.hc = hc;
          p.dim = dim;
          p.post = dpost;
          p.comb = dcomb;
          p.collapse_pre = collapse ? dcpre : nullptr;
          p.collapse_out = collapse ? nans(col.size()) : nullptr;
          p.fn = dfn;
          p.base = dbase;
          p.scale = dscale;
          p.mix_pre = nans(pre.size());
          p.mix_post = nans(mpost.size());
          p.mix_comb = nans(mcomb.size());
          p.rows_per_thread = sh.rpt;
          p.cluster_width = mode.cw;
          p.split_blocks = mode.split;
          p.tensor_cores = mode.tc;
          if (mode.split > 0)
            p.partials = nans(static_cast<size_t>(
                cuda::hc_expand_mixes_partials_floats(t, hc, mode.split)));
          EXPECT_EQ(cuda::hc_expand_mixes_cluster_width(p), mode.reported_width()) << what;
          cuda::launch_hc_expand_mixes(p, stream_);
          const auto gx = down(p.x, x.size());
          const auto gpre = down(p.mix_pre, pre.size()), gpost = down(p.mix_post, mpost.size()),
                     gcomb = down(p.mix_comb, mcomb.size());
          if (rerun == 0) {
            EXPECT_LE(rel_err(gx, ex), 1e-5) << what;
            EXPECT_EQ(std::memcmp(gx.data(), gx_ref.data(), gx.size() * sizeof(float)), 0) << what;
            if (collapse) {
              const auto gcol = down(p.collapse_out, col.size());
              EXPECT_LE(rel_err(gcol, col), 1e-5) << what;
              EXPECT_EQ(std::memcmp(gcol.data(), gcol_ref.data(), gcol.size() * sizeof(float)), 0)
                  << what;
            }
            EXPECT_LE(mixes_worst(gpre, pre, gpost, mpost, gcomb, mcomb), 1e-4) << what;
            EXPECT_LE(mixes_worst(gpre, gupre, gpost, gupost, gcomb, gucomb), 1e-4) << what;
            if (mode.tc) {
              // 3xTF32: within fp32-level error of the CPU's double sums (a form that dropped
              // the small terms, 1xTF32, lands near 1e-3 here); and not the FFMA sums' bits
              // (the tensor-core path ran), checked where the 24 x rows mixes cannot agree by
              // chance.
              const double worst = mixes_worst(gpre, pre, gpost, mpost, gcomb, mcomb);
              std::printf("tensor-core mixes, %s: worst %.3g against the CPU\n", what.c_str(),
                          worst);
              EXPECT_LE(worst, 1e-5) << what;
              if (dim == 5120 && t >= 384) {
                cuda::HcExpandMixesParams f = p;
                f.x = up(x);
                f.tensor_cores = false;
                f.mix_pre = nans(pre.size());
                cuda::launch_hc_expand_mixes(f, stream_);
                EXPECT_NE(down(f.mix_pre, pre.size()), gpre) << "FFMA bits, " << what;
              }
            }
          }
          std::vector<float> all = gpre;
          all.insert(all.end(), gpost.begin(), gpost.end());
          all.insert(all.end(), gcomb.begin(), gcomb.end());
          runs.push_back(std::move(all));
        }
        EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0)
            << "rerun differs, " << what;
      }
  }
}

// The shapes the one-kernel path does not take run as launch_hc_expand + launch_hc_mixes: hc 1..3,
// and hc 4 with dim % 32 != 0 (72) or 4 (a width of 16). Same tolerances as above against the CPU.
// The cluster width is the one-kernel path's alone (hc_expand_mixes_cluster_width: 0 here).
TEST_F(CudaV41, HcExpandMixesOtherShapesAsTwoLaunches) {
  std::mt19937 rng(44);
  struct Shape {
    int hc;
    int64_t dim, rows;
  };
  for (const Shape& sh :
       {Shape{4, 72, 45}, Shape{4, 4, 9}, Shape{3, 64, 33}, Shape{2, 96, 300}, Shape{1, 128, 5}}) {
    const int hc = sh.hc;
    const int64_t dim = sh.dim, t = sh.rows;
    const ExpandMixesCase k = expand_mixes_case(rng, hc, dim, t, 0.05f);
    const auto &x = k.x, &y = k.y, &post = k.post, &comb = k.comb, &cpre = k.cpre, &fn = k.fn,
               &base = k.base, &scale = k.scale, &ex = k.ex, &col = k.col, &pre = k.pre,
               &mpost = k.mpost, &mcomb = k.mcomb;
    cuda::HcExpandMixesParams p;
    p.x = up(x);
    p.y = up(y);
    p.rows = t;
    p.hc = hc;
    p.dim = dim;
    p.post = up(post);
    p.comb = up(comb);
    p.collapse_pre = up(cpre);
    p.collapse_out = nans(col.size());
    p.fn = up(fn);
    p.base = up(base);
    p.scale = up(scale);
    p.mix_pre = nans(pre.size());
    p.mix_post = nans(mpost.size());
    p.mix_comb = nans(mcomb.size());
    p.cluster_width = 16;  // no effect on the two launches
    EXPECT_EQ(cuda::hc_expand_mixes_cluster_width(p), 0);
    cuda::launch_hc_expand_mixes(p, stream_);
    const std::string what = "hc " + std::to_string(hc) + " dim " + std::to_string(dim);
    EXPECT_LE(rel_err(down(p.x, x.size()), ex), 1e-5) << what;
    EXPECT_LE(rel_err(down(p.collapse_out, col.size()), col), 1e-5) << what;
    EXPECT_LE(mixes_worst(down(p.mix_pre, pre.size()), pre, down(p.mix_post, mpost.size()), mpost,
                          down(p.mix_comb, mcomb.size()), mcomb),
              1e-4)
        << what;
  }
}

// hc_expand_mixes_auto_split, the model's automatic split_blocks (kernels.h): 16 up to 128 rows,
// one wave of blocks at two per SM over 16-row tiles up to 1024 rows (at least 2), clusters (0)
// past that; on the H200 (132 SMs) 11 at 384 rows.
TEST_F(CudaV41, HcExpandMixesAutoSplitRule) {
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  EXPECT_EQ(cuda::hc_expand_mixes_auto_split(1), 16);
  EXPECT_EQ(cuda::hc_expand_mixes_auto_split(128), 16);
  EXPECT_EQ(cuda::hc_expand_mixes_auto_split(129), std::max(2, 2 * sms / 9));
  EXPECT_EQ(cuda::hc_expand_mixes_auto_split(384), std::max(2, 2 * sms / 24));
  if (sms == 132) {
    EXPECT_EQ(cuda::hc_expand_mixes_auto_split(384), 11);
  }
  EXPECT_EQ(cuda::hc_expand_mixes_auto_split(1024), std::max(2, 2 * sms / 64));
  EXPECT_EQ(cuda::hc_expand_mixes_auto_split(1025), 0);
  EXPECT_EQ(cuda::hc_expand_mixes_auto_split(8192), 0);
}

// Bad arguments are refused before anything is launched, by the launch and by
// hc_expand_mixes_cluster_width alike (a cluster width other than 0, 4, 8 and 16 among them).
TEST_F(CudaV41, HcExpandMixesRefusesBadArguments) {
  const cuda::HcExpandMixesParams good = small_expand_mixes(45, false);
  cuda::launch_hc_expand_mixes(good, stream_);  // accepted
  EXPECT_TRUE(
      std::isfinite(down(good.mix_comb, static_cast<size_t>(good.rows * good.hc * good.hc))[0]));
  EXPECT_EQ(cuda::hc_expand_mixes_cluster_width(good), 8);
  const std::vector<std::pair<const char*, std::function<void(cuda::HcExpandMixesParams&)>>> bad = {
      {"hc 5", [](auto& p) { p.hc = 5; }},
      {"hc 0", [](auto& p) { p.hc = 0; }},
      {"dim 0", [](auto& p) { p.dim = 0; }},
      {"rows -1", [](auto& p) { p.rows = -1; }},
      {"no y", [](auto& p) { p.y = nullptr; }},
      {"no fn", [](auto& p) { p.fn = nullptr; }},
      {"no mix_comb", [](auto& p) { p.mix_comb = nullptr; }},
      {"collapse_out without collapse_pre", [&](auto& p) { p.collapse_out = good.mix_pre; }},
      {"collapse_pre without collapse_out", [&](auto& p) { p.collapse_pre = good.post; }},
      {"rows_per_thread 5", [](auto& p) { p.rows_per_thread = 5; }},
      {"cluster_width 5", [](auto& p) { p.cluster_width = 5; }},
      {"cluster_width 2", [](auto& p) { p.cluster_width = 2; }},
      {"cluster_width -8", [](auto& p) { p.cluster_width = -8; }},
      {"cluster_width 32", [](auto& p) { p.cluster_width = 32; }},
      {"split_blocks -1", [](auto& p) { p.split_blocks = -1; }},
      {"split_blocks 257", [&](auto& p) {
         p.split_blocks = 257;
         p.partials = good.mix_pre;
       }},
      {"split_blocks without partials", [](auto& p) { p.split_blocks = 4; }},
  };
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const auto& [name, change] : bad) {
    cuda::HcExpandMixesParams p = good;
    change(p);
    EXPECT_DEATH(cuda::launch_hc_expand_mixes(p, stream_), "bad arguments") << name;
    EXPECT_DEATH((void)cuda::hc_expand_mixes_cluster_width(p), "bad arguments") << name;
  }
}

// Per row of [rows, cols]: max|got - ref| / max|ref| of the row; the worst row (NaN: inf).
double worst_row_rel_err(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows,
                         int64_t cols) {
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0.0, den = 1e-30;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const double d = std::abs(static_cast<double>(got[i]) - ref[i]);
      if (std::isnan(d)) return kInf;
      num = std::max(num, d);
      den = std::max(den, std::abs(static_cast<double>(ref[i])));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}

// HcExpandMixesParams::collapse_norm_weight: the launch with the norm against the same launch
// without it followed by launch_rms_norm on collapse_out (in place, the same weight and eps), on
// random inputs: x' and pre/post/comb bit for bit the same (the norm changes nothing else);
// collapse_out within 2e-6 of the row's largest value in every row (only the order of the sum of
// squares differs: per block, then the cluster's blocks in rank order, against rms_norm_kernel's
// block sum), 1e-5 relative to a double RMSNorm of the CPU collapse, and the same bits on a second
// launch. One-kernel shapes at dim 5120 (the model's) and 256 and 96 (3 chunks: blocks of the
// cluster without any) at 1, 2, 3 and 4 rows per thread (pinned, and the default rule, 2 at 389
// rows), row counts leaving a partial last tile; then shapes that run as two launches (hc 3,
// dim % 32 != 0), where the norm is launch_rms_norm itself: bit for bit. Every case at cluster
// widths 0 (= 8), 4 and 16 and on the split path at 3 and 20 blocks (kExpandMixesModes), both
// launches in the same form: the sum of squares adds a block's chunks, then the blocks in order,
// and the tolerances are the same in each form.
// At width 4 and dim 5120 the norm's shared memory does not fit a block from 3 rows per thread
// on (the collapse is then normalised by launch_rms_norm: bit for bit too, within the bounds).
TEST_F(CudaV41, HcExpandMixesNormMatchesExpandMixesThenRmsNorm) {
  std::mt19937 rng(46);
  struct Shape {
    int hc;
    int64_t dim, rows;
    int rpt;
  };
  const std::vector<Shape> shapes = {
      {4, 5120, 7, 0},   {4, 5120, 389, 0}, {4, 5120, 45, 1},  {4, 5120, 100, 2}, {4, 5120, 77, 3},
      {4, 5120, 100, 4}, {4, 256, 1000, 1}, {4, 256, 1000, 2}, {4, 256, 1000, 4}, {4, 96, 45, 0},
      {4, 96, 45, 4},    {4, 72, 45, 0},    {3, 64, 33, 0},
  };
  const float eps = 1e-6f;
  for (const Shape& sh : shapes) {
    const int hc = sh.hc;
    const int64_t dim = sh.dim, t = sh.rows;
    const bool two_launches = hc != 4 || dim % 32 != 0;
    const std::string what = "hc " + std::to_string(hc) + " dim " + std::to_string(dim) + " rows " +
                             std::to_string(t) + " rpt " + std::to_string(sh.rpt);
    const ExpandMixesCase k = expand_mixes_case(rng, hc, dim, t, 0.02f);
    const auto w = rnd(dim, rng, 0.5f, 1.5f);
    // The double RMSNorm of the CPU collapse.
    std::vector<float> norm_ref(k.col.size());
    for (int64_t r = 0; r < t; ++r) {
      double ss = 0.0;
      for (int64_t c = 0; c < dim; ++c) ss += double{k.col[r * dim + c]} * k.col[r * dim + c];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
      for (int64_t c = 0; c < dim; ++c)
        norm_ref[r * dim + c] = static_cast<float>(k.col[r * dim + c] * inv * w[c]);
    }
    const float *dy = up(k.y), *dpost = up(k.post), *dcomb = up(k.comb), *dcpre = up(k.cpre);
    const float *dfn = up(k.fn), *dbase = up(k.base), *dscale = up(k.scale), *dw = up(w);
    const auto launch = [&](bool norm, const ExpandMixesMode& mode) {
      cuda::HcExpandMixesParams p;
      p.x = up(k.x);
      p.y = dy;
      p.rows = t;
      p.hc = hc;
      p.dim = dim;
      p.post = dpost;
      p.comb = dcomb;
      p.collapse_pre = dcpre;
      p.collapse_out = nans(k.col.size());
      p.fn = dfn;
      p.base = dbase;
      p.scale = dscale;
      p.mix_pre = nans(k.pre.size());
      p.mix_post = nans(k.mpost.size());
      p.mix_comb = nans(k.mcomb.size());
      p.rows_per_thread = sh.rpt;
      p.cluster_width = mode.cw;
      p.split_blocks = mode.split;
      p.tensor_cores = mode.tc;
      if (mode.split > 0)
        p.partials =
            nans(static_cast<size_t>(cuda::hc_expand_mixes_partials_floats(t, hc, mode.split)));
      if (norm) {
        p.collapse_norm_weight = dw;
        p.collapse_norm_eps = eps;
      }
      cuda::launch_hc_expand_mixes(p, stream_);
      return p;
    };
    for (const ExpandMixesMode& mode : kExpandMixesModes) {
      const std::string what_w = what + mode.name();
      // Without the norm, then launch_rms_norm in place.
      const cuda::HcExpandMixesParams u = launch(false, mode);
      cuda::RmsNormParams rp;
      rp.x = u.collapse_out;
      rp.weight = dw;
      rp.out = u.collapse_out;
      rp.rows = t;
      rp.cols = dim;
      rp.x_stride = dim;
      rp.out_stride = dim;
      rp.eps = eps;
      cuda::launch_rms_norm(rp, stream_);
      const auto ux = down(u.x, k.x.size()), ucol = down(u.collapse_out, k.col.size());
      const auto upre = down(u.mix_pre, k.pre.size()), upost = down(u.mix_post, k.mpost.size()),
                 ucomb = down(u.mix_comb, k.mcomb.size());
      ASSERT_LE(rel_err(ucol, norm_ref), 1e-5) << "unfused reference, " << what_w;
      std::vector<float> first;
      for (int rerun = 0; rerun < 2; ++rerun) {
        const cuda::HcExpandMixesParams p = launch(true, mode);
        const auto gcol = down(p.collapse_out, k.col.size());
        if (rerun == 1) {
          EXPECT_EQ(std::memcmp(gcol.data(), first.data(), gcol.size() * sizeof(float)), 0)
              << "rerun differs, " << what_w;
          continue;
        }
        first = gcol;
        const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
          return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same_bits(down(p.x, k.x.size()), ux)) << "x', " << what_w;
        EXPECT_TRUE(same_bits(down(p.mix_pre, k.pre.size()), upre)) << "pre, " << what_w;
        EXPECT_TRUE(same_bits(down(p.mix_post, k.mpost.size()), upost)) << "post, " << what_w;
        EXPECT_TRUE(same_bits(down(p.mix_comb, k.mcomb.size()), ucomb)) << "comb, " << what_w;
        EXPECT_LE(worst_row_rel_err(gcol, ucol, t, dim), 2e-6) << what_w;
        EXPECT_LE(rel_err(gcol, norm_ref), 1e-5) << what_w;
        if (two_launches) {
          EXPECT_TRUE(same_bits(gcol, ucol)) << "two launches, " << what_w;
        }
      }
    }
  }
}

// The norm's arguments are refused before anything is launched: a weight without collapse_out
// (and so without collapse_pre), a negative or NaN eps.
TEST_F(CudaV41, HcExpandMixesNormRefusesBadArguments) {
  const cuda::HcExpandMixesParams good = small_expand_mixes(47, true);
  cuda::launch_hc_expand_mixes(good, stream_);  // accepted
  EXPECT_TRUE(std::isfinite(down(good.collapse_out, static_cast<size_t>(good.rows * good.dim))[0]));
  const std::vector<std::pair<const char*, std::function<void(cuda::HcExpandMixesParams&)>>> bad = {
      {"norm weight without the collapse",
       [](auto& p) {
         p.collapse_out = nullptr;
         p.collapse_pre = nullptr;
       }},
      {"eps -1e-6", [](auto& p) { p.collapse_norm_eps = -1e-6f; }},
      {"eps NaN", [](auto& p) { p.collapse_norm_eps = kNaN; }},
  };
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const auto& [name, change] : bad) {
    cuda::HcExpandMixesParams p = good;
    change(p);
    EXPECT_DEATH(cuda::launch_hc_expand_mixes(p, stream_), "bad arguments") << name;
  }
}

// HcExpandMixesParams::collapse_fp8 (the split path's finish also writes the normalised
// collapse's row-scaled FP8 operand): codes and row scales bit for bit those of
// launch_act_quant_fp8_rows on the launch's own collapse_out, and x', collapse_out and the mixes
// bit for bit the same launch's without it; codes poisoned (0x7F) and scales NaN before the
// launch, so an unwritten one shows. At dim 5120 (640 chunks: 3 rounds of the 256 threads, the
// last partial) and 256 and 96 (fewer chunks than threads), rows 1, 45, 384, split 3 / 11 / 20,
// FFMA and tensor-core mixes (the operand does not depend on them). Refused: codes without
// scales and the reverse, without the split path, without the norm.
TEST_F(CudaV41, HcExpandMixesFp8CollapseMatchesRowQuantiser) {
  std::mt19937 rng(48);
  const int hc = 4;
  struct Shape {
    int64_t dim, rows;
    int split;
    bool tc;
  };
  for (const Shape& sh : {Shape{5120, 384, 11, true}, Shape{5120, 45, 20, false},
                          Shape{5120, 1, 3, true}, Shape{256, 45, 3, false},
                          Shape{96, 384, 20, true}}) {
    const int64_t dim = sh.dim, t = sh.rows;
    const std::string what = "dim " + std::to_string(dim) + " rows " + std::to_string(t) +
                             " split " + std::to_string(sh.split) + (sh.tc ? " tc" : "");
    const ExpandMixesCase k = expand_mixes_case(rng, hc, dim, t, 0.02f);
    const auto w = rnd(dim, rng, 0.5f, 1.5f);
    const float *dy = up(k.y), *dpost = up(k.post), *dcomb = up(k.comb), *dcpre = up(k.cpre);
    const float *dfn = up(k.fn), *dbase = up(k.base), *dscale = up(k.scale), *dw = up(w);
    const auto launch = [&](bool fp8) {
      cuda::HcExpandMixesParams p;
      p.x = up(k.x);
      p.y = dy;
      p.rows = t;
      p.hc = hc;
      p.dim = dim;
      p.post = dpost;
      p.comb = dcomb;
      p.collapse_pre = dcpre;
      p.collapse_out = nans(k.col.size());
      p.fn = dfn;
      p.base = dbase;
      p.scale = dscale;
      p.mix_pre = nans(k.pre.size());
      p.mix_post = nans(k.mpost.size());
      p.mix_comb = nans(k.mcomb.size());
      p.split_blocks = sh.split;
      p.tensor_cores = sh.tc;
      p.partials =
          nans(static_cast<size_t>(cuda::hc_expand_mixes_partials_floats(t, hc, sh.split)));
      p.collapse_norm_weight = dw;
      p.collapse_norm_eps = 1e-6f;
      if (fp8) {
        p.collapse_fp8 = up(std::vector<uint8_t>(static_cast<size_t>(t * dim), 0x7F));
        p.collapse_fp8_scale = nans(static_cast<size_t>(t));
      }
      cuda::launch_hc_expand_mixes(p, stream_);
      return p;
    };
    const cuda::HcExpandMixesParams u = launch(false);
    const cuda::HcExpandMixesParams f = launch(true);
    const auto bits = [&](const float* a, const float* b, size_t n) {
      const auto x = down(a, n), y = down(b, n);
      return std::memcmp(x.data(), y.data(), n * sizeof(float)) == 0;
    };
    EXPECT_TRUE(bits(u.x, f.x, k.x.size())) << "x', " << what;
    EXPECT_TRUE(bits(u.collapse_out, f.collapse_out, k.col.size())) << "collapse, " << what;
    EXPECT_TRUE(bits(u.mix_pre, f.mix_pre, k.pre.size())) << "pre, " << what;
    EXPECT_TRUE(bits(u.mix_comb, f.mix_comb, k.mcomb.size())) << "comb, " << what;
    // The row quantiser on the launch's own normalised collapse.
    cuda::ActQuantFp8RowsParams q;
    q.x = f.collapse_out;
    q.x_type = cuda::ActivationType::kF32;
    q.ldx = dim;
    q.rows = t;
    q.cols = dim;
    q.out = up(std::vector<uint8_t>(static_cast<size_t>(t * dim), 0x7F));
    q.ldo = dim;
    q.row_scale = nans(static_cast<size_t>(t));
    cuda::launch_act_quant_fp8_rows(q, stream_);
    const auto want = down(q.out, static_cast<size_t>(t * dim));
    const auto got = down(f.collapse_fp8, static_cast<size_t>(t * dim));
    EXPECT_EQ(got, want) << "codes, " << what;
    EXPECT_TRUE(bits(q.row_scale, f.collapse_fp8_scale, static_cast<size_t>(t))) << "scales, "
                                                                                << what;
    size_t nonzero = 0;
    for (const uint8_t c : got) nonzero += (c & 0x7F) != 0 ? 1 : 0;
    EXPECT_GT(nonzero, got.size() / 2) << "codes mostly zero, " << what;
  }
  cuda::HcExpandMixesParams good = small_expand_mixes(49, true);
  good.split_blocks = 2;
  good.partials = nans(static_cast<size_t>(cuda::hc_expand_mixes_partials_floats(3, 4, 2)));
  good.collapse_fp8 = up(std::vector<uint8_t>(3 * 64, 0));
  good.collapse_fp8_scale = nans(3);
  cuda::launch_hc_expand_mixes(good, stream_);  // accepted
  EXPECT_TRUE(std::isfinite(down(good.collapse_fp8_scale, 3)[0]));
  const std::vector<std::pair<const char*, std::function<void(cuda::HcExpandMixesParams&)>>> bad = {
      {"codes without scales", [](auto& p) { p.collapse_fp8_scale = nullptr; }},
      {"scales without codes", [](auto& p) { p.collapse_fp8 = nullptr; }},
      {"clusters", [](auto& p) { p.split_blocks = 0; }},
      {"no norm", [](auto& p) { p.collapse_norm_weight = nullptr; }},
  };
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const auto& [name, change] : bad) {
    cuda::HcExpandMixesParams p = good;
    change(p);
    EXPECT_DEATH(cuda::launch_hc_expand_mixes(p, stream_), "bad arguments") << name;
  }
}

// The SWA source lists against the rule of kernels.h, stated here per key: chunks of 1..300 rows
// at random positions (some starting at 0, some past a window), replay floors below, inside and
// above the window, several sequence slots.
TEST_F(CudaV41, SwaIndexFollowsTheWindowRule) {
  std::mt19937 rng(29);
  const int window = 128;
  const int64_t chunk_base = 7 * window;
  std::vector<int32_t> pos, first, floor;
  std::vector<int64_t> slot;
  for (int seq = 0; seq < 7; ++seq) {
    const int rows = seq == 0 ? 1 : static_cast<int>(1 + rng() % 300);
    const int start = seq % 3 == 0 ? 0 : static_cast<int>(rng() % 5000);
    const int fl = seq % 2 == 0 ? 0 : start + static_cast<int>(rng() % (rows + window)) - window / 2;
    for (int r = 0; r < rows; ++r) {
      pos.push_back(start + r);
      first.push_back(start);
      floor.push_back(std::max(fl, 0) == 0 && seq % 4 == 1 ? -3 : std::max(fl, 0));
      slot.push_back(seq);
    }
  }
  const int64_t n = static_cast<int64_t>(pos.size());
  cuda::SwaIndexParams p;
  p.pos = up(pos);
  p.slot = up(slot);
  p.first_pos = up(first);
  p.floor = up(floor);
  p.rows = n;
  p.window = window;
  p.chunk_base = chunk_base;
  p.out = up(std::vector<int32_t>(static_cast<size_t>(n * window), 12345));
  cuda::launch_swa_index(p, stream_);
  const auto got = down(p.out, static_cast<size_t>(n * window));
  int64_t ring = 0, chunk = 0, none = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int k = 0; k < window; ++k) {
      const int64_t kp = int64_t{pos[r]} - k;
      int64_t want;
      if (kp < 0 || kp < floor[r]) {
        want = -1;
        ++none;
      } else if (kp >= first[r]) {
        want = chunk_base + r - k;  // this chunk's row kp - first[r], staged at its row index
        ++chunk;
      } else {
        want = slot[r] * window + kp % window;
        ++ring;
      }
      ASSERT_EQ(got[static_cast<size_t>(r * window + k)], want) << "row " << r << " k " << k;
    }
  EXPECT_GT(ring, 0);
  EXPECT_GT(chunk, 0);
  EXPECT_GT(none, 0);
}

// The MoE combine y[t] += sum of the token's grouped rows in j order (misses -1), bit for bit
// against the same float sums on the host: the 4-column kernel (cols % 4 == 0) and the scalar
// one (odd cols).
TEST_F(CudaV41, MoeCombineIsOrderedAndExact) {
  std::mt19937 rng(41);
  for (const int64_t cols : {int64_t{5120}, int64_t{37}}) {
    const int64_t tokens = 19, k = 6, grouped = 40;
    const auto src = rnd(grouped * cols, rng, -3, 3);
    auto y = rnd(tokens * cols, rng, -3, 3);
    std::vector<int32_t> inv(static_cast<size_t>(tokens * k));
    for (auto& r : inv) r = rng() % 3 == 0 ? static_cast<int32_t>(rng() % grouped) : -1;
    inv[0] = -1;  // a token with no hit at all
    for (int64_t j = 1; j < k; ++j) inv[static_cast<size_t>(j)] = -1;
    float* dy = up(y);
    cuda::launch_moe_combine(up(src), up(inv), tokens, static_cast<int>(k), cols, dy, stream_);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < cols; ++c) {
        float acc = y[static_cast<size_t>(t * cols + c)];
        for (int64_t j = 0; j < k; ++j) {
          const int32_t r = inv[static_cast<size_t>(t * k + j)];
          if (r >= 0) acc += src[static_cast<size_t>(r * cols + c)];
        }
        y[static_cast<size_t>(t * cols + c)] = acc;
      }
    const auto got = down(dy, y.size());
    EXPECT_EQ(0, std::memcmp(got.data(), y.data(), y.size() * sizeof(float))) << "cols " << cols;
  }
}

// Records byte-exact, including the skipped (overwritten-later) rows of a long chunk.
TEST_F(CudaV41, SwaRingWriteFp8IsByteExact) {
  std::mt19937 rng(13);
  for (int64_t t : {1, 5, 200}) {
    auto kv = rnd(t * 512, rng, -4, 4);
    for (size_t i = 0; i < kv.size(); i += 97) kv[i] *= 1e-6f;  // tiny blocks hit the 1e-4 floor
    std::vector<int32_t> pos(static_cast<size_t>(t));
    std::iota(pos.begin(), pos.end(), 1000);
    std::vector<uint8_t> ring(128 * 528, 0xAA);
    uint8_t* dring = up(ring);
    cpu::swa_write_fp8(kv.data(), 512, t, 512, pos.data(), ring.data(), 128);
    cuda::launch_swa_write_fp8({up(kv), 512, t, 512, up(pos), dring, 128}, stream_);
    EXPECT_EQ(down(dring, ring.size()), ring) << t;
  }
}

TEST_F(CudaV41, Fp4CacheRecordsAreByteExact) {
  std::mt19937 rng(14);
  for (auto f : {cpu::Fp4Record::kMainBlock16E4m3, cpu::Fp4Record::kIndexBlock32Ue8m0}) {
    const int dim = f == cpu::Fp4Record::kMainBlock16E4m3 ? 512 : 128;
    const int64_t t = 37, first = 5;
    auto x = rnd(t * dim, rng, -3, 3);
    for (size_t i = 0; i < x.size(); i += 61) x[i] *= 1e-4f;
    for (size_t i = 7; i < x.size(); i += 113) x[i] *= 1e3f;  // saturating e4m3 scales
    std::vector<uint8_t> cache(static_cast<size_t>((first + t + 2) * cpu::fp4_record_bytes(f, dim)),
                               0xAA);
    uint8_t* dc = up(cache);
    cpu::fp4_cache_write(x.data(), dim, t, dim, f, cache.data(), first);
    cuda::launch_fp4_cache_write(
        {up(x), dim, t, dim,
         f == cpu::Fp4Record::kMainBlock16E4m3 ? cuda::Fp4Record::kMainBlock16E4m3
                                               : cuda::Fp4Record::kIndexBlock32Ue8m0,
         dc, first},
        stream_);
    EXPECT_EQ(down(dc, cache.size()), cache);
  }
}

// Chunked calls with partial groups carried; bf16 cast before the norm may round differently
// after fp32-vs-double pooling: 4e-3 (one bf16 ulp is 2^-8 of the element).
TEST_F(CudaV41, CompressorChunksWithCarry) {
  std::mt19937 rng(15);
  const int dim = 512;
  for (int ratio : {1, 2}) {
    const int64_t n = 14;
    auto kv = rnd(n * dim, rng, -2, 2), g = rnd(n * dim, rng, -3, 3), w = rnd(dim, rng, 0.5f, 1.5f);
    std::vector<float> skv(dim, 0.0f), sg(dim, 0.0f);
    float *dskv = up(skv), *dsg = up(sg);
    const float *dkv = up(kv), *dg = up(g), *dw = up(w);
    int64_t s = 0;
    for (int64_t len : {5, 1, 1, 6, 1}) {
      const int64_t groups = cpu::compressor_groups(s, len, ratio);
      std::vector<float> ref(static_cast<size_t>(std::max<int64_t>(groups, 1) * dim), kNaN);
      cpu::compressor(kv.data() + s * dim, g.data() + s * dim, dim, len, dim, ratio, s, skv.data(),
                      sg.data(), w.data(), 1e-20f, ref.data());
      float* o = nans(ref.size());
      cuda::launch_compressor(
          {dkv + s * dim, dg + s * dim, dim, len, dim, ratio, s, dskv, dsg, dw, 1e-20f, o},
          stream_);
      auto got = down(o, ref.size());
      if (groups > 0) {
        got.resize(static_cast<size_t>(groups * dim));
        ref.resize(got.size());
        EXPECT_LE(rel_err(got, ref), 4e-3) << ratio << " at " << s;
      }
      if (ratio == 2) {
        EXPECT_EQ(down(dskv, skv.size()), skv);
      }
      s += len;
    }
  }
}

// The batched compressor and the scattered FP4 writes against one launch per sequence (bytes) and
// the CPU (latents 4e-3 as above, records of the GPU latents byte-exact). Six sequences in two
// consecutive calls (partial groups carried from before the first call and between the calls,
// sequences with 0 rows, distinct state slots in a different order), ratio 1 and 2.
TEST_F(CudaV41, CompressorBatchAndFp4ScatterMatchPerSequence) {
  std::mt19937 rng(42);
  const int dim = 512, kdim = 128;
  const int nseq = 6;
  const int64_t cap = 32;  // cache entries per sequence
  const std::vector<int64_t> slot = {3, 0, 5, 1, 4, 2};
  const std::vector<int64_t> start0 = {0, 7, 10, 3, 4, 1};
  const std::vector<std::vector<int64_t>> calls = {{0, 1, 5, 6, 3, 2}, {1, 0, 6, 1, 1, 3}};
  const auto main_f = cpu::Fp4Record::kMainBlock16E4m3;
  const auto idx_f = cpu::Fp4Record::kIndexBlock32Ue8m0;
  const int64_t main_bytes = cpu::fp4_record_bytes(main_f, dim);
  const int64_t idx_bytes = cpu::fp4_record_bytes(idx_f, kdim);
  const auto f32_bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (int ratio : {1, 2}) {
    // State [slot][dim] (ratio - 1 <= 1 rows per slot): batched GPU, per-sequence GPU, CPU.
    auto state_kv = rnd(nseq * dim, rng, -2, 2), state_g = rnd(nseq * dim, rng, -3, 3);
    float *bskv = up(state_kv), *bsg = up(state_g), *pskv = up(state_kv), *psg = up(state_g);
    auto cskv = state_kv, csg = state_g;
    std::vector<uint8_t> main_pool(static_cast<size_t>(nseq * cap * main_bytes), 0xAA),
        idx_pool(static_cast<size_t>(nseq * cap * idx_bytes), 0xAA);
    uint8_t *dmain = up(main_pool), *didx = up(idx_pool);
    uint8_t *pmain = up(main_pool), *pidx = up(idx_pool);
    auto start = start0;
    const auto norm_w = rnd(dim, rng, 0.5f, 1.5f);
    const float* dw = up(norm_w);
    for (const auto& rows : calls) {
      int64_t total = 0;
      for (int64_t r : rows) total += r;
      auto kv = rnd(total * dim, rng, -2, 2), g = rnd(total * dim, rng, -3, 3);
      const float *dkv = up(kv), *dg = up(g);
      std::vector<cuda::CompressorSeq> cs(nseq);
      std::vector<int64_t> gcount(nseq), entry;
      int64_t row = 0, groups = 0, items = 0;
      for (int i = 0; i < nseq; ++i) {
        gcount[i] = cpu::compressor_groups(start[i], rows[i], ratio);
        cs[i] = {row, rows[i], start[i], slot[i], groups, items};
        items += cuda::compressor_items(start[i], rows[i], ratio);
        for (int64_t j = 0; j < gcount[i]; ++j)
          entry.push_back(slot[i] * cap + start[i] / ratio + j);
        row += rows[i];
        groups += gcount[i];
      }
      ASSERT_GT(groups, 0);
      float* bout = nans(static_cast<size_t>(groups * dim));
      cuda::launch_compressor_batch({dkv, ratio > 1 ? dg : nullptr, dim, dim, ratio, up(cs), nseq,
                                     items, bskv, bsg, dim, dw, 1e-20f, bout},
                                    stream_);
      float* pout = nans(static_cast<size_t>(groups * dim));
      std::vector<float> cout(static_cast<size_t>(groups * dim), kNaN);
      for (int i = 0; i < nseq; ++i) {
        const int64_t r0 = cs[i].row_begin, o = cs[i].out_group;
        cuda::launch_compressor(
            {dkv + r0 * dim, ratio > 1 ? dg + r0 * dim : nullptr, dim, rows[i], dim, ratio,
             start[i], pskv + slot[i] * dim, psg + slot[i] * dim, dw, 1e-20f, pout + o * dim},
            stream_);
        cpu::compressor(kv.data() + r0 * dim, ratio > 1 ? g.data() + r0 * dim : nullptr, dim,
                        rows[i], dim, ratio, start[i], cskv.data() + slot[i] * dim,
                        csg.data() + slot[i] * dim, norm_w.data(), 1e-20f, cout.data() + o * dim);
      }
      const auto blat = down(bout, cout.size()), plat = down(pout, cout.size());
      EXPECT_TRUE(f32_bits_equal(blat, plat)) << "ratio " << ratio;
      EXPECT_LE(rel_err(blat, cout), 4e-3) << "ratio " << ratio;
      EXPECT_TRUE(f32_bits_equal(down(bskv, state_kv.size()), down(pskv, state_kv.size())));
      EXPECT_TRUE(f32_bits_equal(down(bsg, state_g.size()), down(psg, state_g.size())));
      if (ratio == 2) {
        EXPECT_TRUE(f32_bits_equal(down(bskv, state_kv.size()), cskv));
      }
      // Index keys: any rows; then main entries + keys in one scattered launch.
      auto keys = rnd(groups * kdim, rng, -3, 3);
      const float* dkeys = up(keys);
      cuda::Fp4ScatterWriteParams w;
      w.count = 2;
      w.entries = up(entry);
      w.write[0] = {bout, dim, groups, dim, cuda::Fp4Record::kMainBlock16E4m3, dmain, 0};
      w.write[1] = {dkeys, kdim, groups, kdim, cuda::Fp4Record::kIndexBlock32Ue8m0, didx, 0};
      cuda::launch_fp4_cache_scatter_write(w, stream_);
      for (int i = 0; i < nseq; ++i) {
        if (gcount[i] == 0) continue;
        const int64_t o = cs[i].out_group, first = start[i] / ratio;
        cpu::fp4_cache_write(blat.data() + o * dim, dim, gcount[i], dim, main_f,
                             main_pool.data() + slot[i] * cap * main_bytes, first);
        cpu::fp4_cache_write(keys.data() + o * kdim, kdim, gcount[i], kdim, idx_f,
                             idx_pool.data() + slot[i] * cap * idx_bytes, first);
        cuda::launch_fp4_cache_write(
            {pout + o * dim, dim, gcount[i], dim, cuda::Fp4Record::kMainBlock16E4m3,
             pmain + slot[i] * cap * main_bytes, first},
            stream_);
        cuda::launch_fp4_cache_write(
            {dkeys + o * kdim, kdim, gcount[i], kdim, cuda::Fp4Record::kIndexBlock32Ue8m0,
             pidx + slot[i] * cap * idx_bytes, first},
            stream_);
      }
      {
        // Slots with entry -1 (the forward pads its group slots per sequence) write nothing.
        cuda::Fp4ScatterWriteParams wj = w;
        wj.entries = up(std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(groups, 1)), -1));
        wj.write[1].x = up(rnd(std::max<int64_t>(groups, 1) * kdim, rng, -3, 3));
        cuda::launch_fp4_cache_scatter_write(wj, stream_);
      }
      const auto gmain = down(dmain, main_pool.size()), gidx = down(didx, idx_pool.size());
      EXPECT_EQ(gmain, main_pool) << "ratio " << ratio;
      EXPECT_EQ(gidx, idx_pool) << "ratio " << ratio;
      EXPECT_EQ(gmain, down(pmain, main_pool.size()));
      EXPECT_EQ(gidx, down(pidx, idx_pool.size()));
      for (int i = 0; i < nseq; ++i) start[i] += rows[i];
    }
  }
}

// Heads 32 (V4.1), 2 (tiny) and 64 (two MMA passes); 4 rows and 19 rows (more than one row group
// sharing a key tile); FP4 queries as the model passes them, and plain fp32 ones (hi/lo split).
TEST_F(CudaV41, IndexerScores) {
  std::mt19937 rng(16);
  const int id = 128;
  const int64_t n = 1000;
  auto keys = fp4_records(n, id, cpu::Fp4Record::kIndexBlock32Ue8m0, rng);
  for (const auto& [heads, t, fp4_q] : {std::tuple{32, int64_t{4}, true}, std::tuple{2, int64_t{19}, true},
                                       std::tuple{64, int64_t{19}, false}})
  for (int ratio : {1, 2})
    for (bool cand : {false, true}) {
      SCOPED_TRACE("heads " + std::to_string(heads) + " rows " + std::to_string(t));
      auto q = rnd(t * heads * id, rng, -1, 1);
      if (fp4_q) fq_fp4_block32_ue8m0(q, q);
      auto w = rnd(t * heads, rng, -0.3f, 0.3f);
      std::vector<int32_t> pos(static_cast<size_t>(t));
      for (int64_t r = 0; r < t; ++r) pos[static_cast<size_t>(r)] = static_cast<int32_t>((r * 997 + 37 * (r % 3)) % 2000);
      pos[0] = 0;
      pos.back() = 1999;
      const int64_t nc = 300;
      std::vector<int32_t> cids(static_cast<size_t>(t * nc));
      std::uniform_int_distribution<int> pick(-1, static_cast<int>(n) - 1);
      for (auto& c : cids) c = pick(rng);
      const int64_t cols = cand ? nc : n;
      std::vector<float> ref(static_cast<size_t>(t * cols));
      cpu::indexer_scores(q.data(), w.data(), t, heads, id, keys.data(), n, pos.data(), ratio,
                          cand ? cids.data() : nullptr, nc, 0.08838834764831845f, ref.data(), cols);
      float* o = nans(ref.size());
      cuda::launch_indexer_scores({up(q), up(w), t, heads, id, up(keys), n, up(pos), ratio,
                                   cand ? up(cids) : nullptr, nc, 0.08838834764831845f, o, cols},
                                  stream_);
      EXPECT_LE(rel_err(down(o, ref.size()), ref), 1e-5) << ratio << cand;
    }
}

// The batched launch (one launch for every sequence of a layer) against cpu::indexer_scores run
// per sequence: sequences with 0 keys, 0 rows, key counts not a multiple of the 64-key tile, more
// rows than one 8-row block, more columns than one 2048-column chunk; causal masks at ratio 1 and
// 2; candidate (Reindex) rows with -1, out-of-range and invisible ids; fp32 queries (hi/lo split)
// and FP4 queries with q_exact_bf16. Keys and queries have per-32-dim block scales 2^-3..2^3 apart
// within a vector, so a key block converted with the wrong scale, or dims paired with the wrong
// query dims, shows. 1e-5 of max|ref| (fp32 accumulation).
// A batch of indexer sequences over one key pool, cap records per sequence (sequence i's keys
// from record i * cap): row positions first_pos + r (97 apart past 6 rows), the device descriptor
// rows [first row, rows, first record, keys], and cpu::indexer_scores per sequence into ref
// [rows, width] (cids: per-row candidate lists of nc ids, or null).
struct IdxBatchSeq {
  int64_t rows, keys, first_pos;
};
struct IdxBatch {
  std::vector<int32_t> pos;
  std::vector<int64_t> desc;
  int64_t rows = 0, max_rows = 0, max_keys = 0;
};
IdxBatch idx_batch(const std::vector<IdxBatchSeq>& seqs, int64_t cap) {
  IdxBatch b;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const IdxBatchSeq& s = seqs[i];
    for (int64_t r = 0; r < s.rows; ++r)
      b.pos.push_back(static_cast<int32_t>(s.first_pos + r * (s.rows > 6 ? 97 : 1)));
    b.desc.insert(b.desc.end(), {b.rows, s.rows, static_cast<int64_t>(i) * cap, s.keys});
    b.rows += s.rows;
    b.max_rows = std::max(b.max_rows, s.rows);
    b.max_keys = std::max(b.max_keys, s.keys);
  }
  return b;
}
std::vector<float> idx_batch_ref(const std::vector<IdxBatchSeq>& seqs, const IdxBatch& b,
                                 int64_t cap, const std::vector<float>& q,
                                 const std::vector<float>& w, int heads, int id,
                                 const std::vector<uint8_t>& pool, int ratio, const int32_t* cids,
                                 int64_t nc, int64_t width) {
  std::vector<float> ref(static_cast<size_t>(b.rows * width), -kInf);
  int64_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const IdxBatchSeq& s = seqs[i];
    if (s.rows > 0)
      cpu::indexer_scores(q.data() + row * heads * id, w.data() + row * heads, s.rows, heads, id,
                          pool.data() + static_cast<int64_t>(i) * cap * 68, s.keys,
                          b.pos.data() + row, ratio, cids != nullptr ? cids + row * nc : nullptr,
                          nc, 0.08838834764831845f, ref.data() + row * width, width);
    row += s.rows;
  }
  return ref;
}

TEST_F(CudaV41, IndexerScoresBatched) {
  std::mt19937 rng(21);
  const int id = 128;
  const std::vector<IdxBatchSeq> seqs = {{3, 1000, 990}, {5, 0, 0},        {0, 500, 400},
                                         {6, 77, 150},   {19, 4200, 3000}, {1, 2049, 2047}};
  const int64_t cap = 4300;  // pool records per sequence
  auto pool = fp4_records(static_cast<int64_t>(seqs.size()) * cap, id,
                          cpu::Fp4Record::kIndexBlock32Ue8m0, rng, 3);
  const IdxBatch batch = idx_batch(seqs, cap);
  const int64_t rows = batch.rows, max_rows = batch.max_rows, max_keys = batch.max_keys;
  const int64_t nc = 2100;
  for (const int heads : {32, 64})
    for (const bool exact : {true, false})
      for (const int ratio : {1, 2})
        for (const bool cand : {false, true}) {
          if (heads == 64 && ratio == 2) continue;
          SCOPED_TRACE("heads " + std::to_string(heads) + " exact " + std::to_string(exact) +
                       " ratio " + std::to_string(ratio) + " cand " + std::to_string(cand));
          auto q = rnd(rows * heads * id, rng, -1, 1);
          scale_blocks32(q, rng, 3);
          if (exact) fq_fp4_block32_ue8m0(q, q);
          auto w = rnd(rows * heads, rng, -0.3f, 0.3f);
          std::vector<int32_t> cids(static_cast<size_t>(rows * nc));
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < nc; ++c)
              cids[static_cast<size_t>(r * nc + c)] =
                  c % 5 == 0 ? static_cast<int32_t>(c % 97) - 2  // -2, -1 and small ids
                             : std::uniform_int_distribution<int>(-1, 4400)(rng);
          const int64_t width = cand ? nc : max_keys;
          const std::vector<float> ref =
              idx_batch_ref(seqs, batch, cap, q, w, heads, id, pool, ratio,
                            cand ? cids.data() : nullptr, nc, width);
          cuda::IndexerScoreParams p;
          p.q = up(q);
          p.w = up(w);
          p.rows = rows;
          p.heads = heads;
          p.keys = up(pool);
          p.pos = up(batch.pos);
          p.ratio = ratio;
          p.candidates = cand ? up(cids) : nullptr;
          p.n_cand = cand ? nc : 0;
          p.ld = width;
          p.n_seqs = static_cast<int>(seqs.size());
          p.seqs = up(batch.desc);
          p.max_seq_rows = max_rows;
          p.max_seq_keys = max_keys;
          p.q_exact_bf16 = exact;
          // use_wgmma: the warpgroup-MMA kernel where it applies (exact, no candidates, 32 heads;
          // 8 row slots here), the mma.sync kernels for the other cases.
          for (const bool wg : {false, true}) {
            SCOPED_TRACE(wg ? "wgmma" : "mma.sync");
            float* o = nans(ref.size());
            p.scores = o;
            p.use_wgmma = wg;
            cuda::launch_indexer_scores(p, stream_);
            const auto got = down(o, ref.size());
            EXPECT_LE(rel_err(got, ref), 1e-5);
            size_t inf_mismatch = 0;
            for (size_t i = 0; i < ref.size(); ++i)
              inf_mismatch += std::isinf(ref[i]) != std::isinf(got[i]) ? 1 : 0;
            EXPECT_EQ(inf_mismatch, 0u);
          }
        }
}

// The wgmma path at each of its row-slot widths (N = 32 x 2, 4, 6, 8 query columns): decode-like
// batches whose longest sequence has 1-2, 3-4, 5-6 and 7-8 rows (partial slot blocks of 1, 3 and
// 5 rows), sequences with no keys, a few visible keys (rows at position 0..5), key counts that end
// inside a 64-key tile and inside the second 4096-column chunk, causal ratio 1 and 2. Against
// cpu::indexer_scores with the -inf pattern exactly and no NaN; bf16 operands (use_fp8 off) within
// 1e-5 of max|ref| (fp32 sums).
// use_fp8 (e4m3 operands, each vector's block scales folded in): with per-32-dim scales 2^-3..2^3
// apart within every key and query (the folding's fast path; a wrong shift or weight scale moves
// scores by factors of 2), and with keys 2^-8..2^8 apart (blocks more than 2^11 below their key's
// largest take the rounding path). Within 2e-3 of max|ref|: Hopper's k32 sums keep ~14 bits
// (2^-13 of the largest term of each of the 4 steps); the measured error is printed.
void CudaV41::check_indexer_wgmma_row_slots(bool fp8, int key_spread, double tol) {
  std::mt19937 rng(23 + key_spread);
  const int id = 128, heads = 32;
  struct Seq {
    int64_t rows, keys, first_pos;
  };
  const std::vector<std::vector<Seq>> batches = {
      {{1, 300, 299}, {2, 4500, 4498}, {1, 0, 0}, {2, 70, 3}},
      {{4, 1000, 996}, {3, 65, 1}, {1, 4097, 4096}, {0, 10, 10}},
      {{6, 8300, 8294}, {3, 77, 0}, {5, 130, 125}, {6, 1000, 2000}, {6, 0, 0}},
      {{8, 2000, 1992}, {7, 640, 639}, {1, 64, 63}}};
  double worst = 0.0;
  for (const auto& seqs : batches)
    for (const int ratio : {1, 2}) {
      int64_t rows = 0, max_rows = 0, max_keys = 0, cap = 0;
      for (const Seq& s : seqs) {
        rows += s.rows;
        max_rows = std::max(max_rows, s.rows);
        max_keys = std::max(max_keys, s.keys);
        cap = std::max(cap, s.keys);
      }
      SCOPED_TRACE("max rows " + std::to_string(max_rows) + " ratio " + std::to_string(ratio) +
                   (fp8 ? " fp8, key spread " + std::to_string(key_spread) : " bf16"));
      auto pool = fp4_records(static_cast<int64_t>(seqs.size()) * cap, id,
                              cpu::Fp4Record::kIndexBlock32Ue8m0, rng, key_spread);
      auto q = rnd(rows * heads * id, rng, -1, 1);
      scale_blocks32(q, rng, 3);
      fq_fp4_block32_ue8m0(q, q);
      auto w = rnd(rows * heads, rng, -0.3f, 0.3f);
      std::vector<int32_t> pos;
      std::vector<int64_t> desc;
      int64_t row = 0;
      for (size_t i = 0; i < seqs.size(); ++i) {
        const Seq& s = seqs[i];
        for (int64_t r = 0; r < s.rows; ++r) pos.push_back(static_cast<int32_t>(s.first_pos + r));
        desc.insert(desc.end(), {row, s.rows, static_cast<int64_t>(i) * cap, s.keys});
        row += s.rows;
      }
      std::vector<float> ref(static_cast<size_t>(rows * max_keys), -kInf);
      row = 0;
      for (size_t i = 0; i < seqs.size(); ++i) {
        const Seq& s = seqs[i];
        if (s.rows > 0)
          cpu::indexer_scores(q.data() + row * heads * id, w.data() + row * heads, s.rows, heads,
                              id, pool.data() + static_cast<int64_t>(i) * cap * 68, s.keys,
                              pos.data() + row, ratio, nullptr, 0, 0.08838834764831845f,
                              ref.data() + row * max_keys, max_keys);
        row += s.rows;
      }
      float* o = nans(ref.size());
      cuda::IndexerScoreParams p;
      p.q = up(q);
      p.w = up(w);
      p.rows = rows;
      p.heads = heads;
      p.keys = up(pool);
      p.pos = up(pos);
      p.ratio = ratio;
      p.scores = o;
      p.ld = max_keys;
      p.n_seqs = static_cast<int>(seqs.size());
      p.seqs = up(desc);
      p.max_seq_rows = max_rows;
      p.max_seq_keys = max_keys;
      p.q_exact_bf16 = true;
      p.use_wgmma = true;
      p.use_fp8 = fp8;
      cuda::launch_indexer_scores(p, stream_);
      const auto got = down(o, ref.size());
      const double err = rel_err(got, ref);
      worst = std::max(worst, err);
      EXPECT_LE(err, tol);
      size_t inf_mismatch = 0, nan_count = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        inf_mismatch += std::isinf(ref[i]) != std::isinf(got[i]) ? 1 : 0;
        nan_count += std::isnan(got[i]) ? 1 : 0;
      }
      EXPECT_EQ(inf_mismatch, 0u);
      EXPECT_EQ(nan_count, 0u);
    }
  std::printf("indexer wgmma %s, key block spread 2^%d: worst max|err| / max|ref| %.3g\n",
              fp8 ? "fp8" : "bf16", key_spread, worst);
}

TEST_F(CudaV41, IndexerScoresWgmmaRowSlots) { check_indexer_wgmma_row_slots(false, 3, 1e-5); }

TEST_F(CudaV41, IndexerScoresFp8RowSlots) {
  check_indexer_wgmma_row_slots(true, 3, 2e-3);
  check_indexer_wgmma_row_slots(true, 8, 2e-3);
}

// IndexerScoreParams::cand_wgmma (the candidates' scores on e4m3 wgmma, one row per CTA, the
// records through a cp.async ring) against cpu::indexer_scores: batched sequences of 0-19 rows,
// sequences without keys, candidate lists with ids that are negative, past the pool, past the
// row's visible keys (causal ratio 1 and 2) and repeated; and lists made of candidate blocks (8
// aligned consecutive ids, as launch_blocks_to_candidates writes: the kernel copies those whole),
// some past the visible keys, with unaligned runs and loose ids between them; 2100 candidates (a
// second 2048-column chunk ending inside a 64-key tile) and 100 (fewer tiles than the ring has
// stages); per-32-dim
// key scales 2^-3..2^3 apart (the folding's fast path) and 2^-8..2^8 (the rounding path). The
// -inf pattern exactly, no NaN, and within 2e-3 of max|ref| (Hopper's ~14-bit k32 sums, as
// IndexerScoresFp8RowSlots); the same launch without cand_wgmma (the mma.sync kernel) within
// 1e-5, as a check of the data.
TEST_F(CudaV41, IndexerScoresCandidatesWgmma) {
  std::mt19937 rng(29);
  const int id = 128, heads = 32;
  const std::vector<IdxBatchSeq> seqs = {{3, 1000, 990}, {5, 0, 0},        {0, 500, 400},
                                         {6, 77, 150},   {19, 4200, 3000}, {1, 2049, 2047}};
  const int64_t cap = 4300;
  const IdxBatch batch = idx_batch(seqs, cap);
  const int64_t rows = batch.rows, max_rows = batch.max_rows;
  double worst = 0.0;
  for (const int spread : {3, 8})
    for (const bool blocks : {false, true})
      for (const int64_t nc : {int64_t{2100}, int64_t{100}})
        for (const int ratio : {1, 2}) {
          if (blocks && spread == 8) continue;
          SCOPED_TRACE("key spread " + std::to_string(spread) + " candidates " +
                       std::to_string(nc) + " ratio " + std::to_string(ratio) +
                       (blocks ? " blocks" : " loose ids"));
          auto pool = fp4_records(static_cast<int64_t>(seqs.size()) * cap, id,
                                  cpu::Fp4Record::kIndexBlock32Ue8m0, rng, spread);
          auto q = rnd(rows * heads * id, rng, -1, 1);
          scale_blocks32(q, rng, 3);
          fq_fp4_block32_ue8m0(q, q);
          auto w = rnd(rows * heads, rng, -0.3f, 0.3f);
          std::vector<int32_t> cids(static_cast<size_t>(rows * nc));
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < nc; ++c)
              cids[static_cast<size_t>(r * nc + c)] =
                  c % 5 == 0 ? static_cast<int32_t>(c % 97) - 2  // -2, -1, small and repeated ids
                             : std::uniform_int_distribution<int>(-1, 4400)(rng);
          if (blocks)
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c0 = 0; c0 < nc; c0 += 8) {
                const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
                const int b = std::uniform_int_distribution<int>(0, 4400 / 8)(rng);
                for (int64_t j = 0; j < 8 && c0 + j < nc; ++j) {
                  int32_t& cid = cids[static_cast<size_t>(r * nc + c0 + j)];
                  if (kind < 8)
                    cid = static_cast<int32_t>(8 * b + j);  // a block
                  else if (kind == 8)
                    cid = static_cast<int32_t>(8 * b + 3 + j);  // unaligned run
                }
              }
          const std::vector<float> ref =
              idx_batch_ref(seqs, batch, cap, q, w, heads, id, pool, ratio, cids.data(), nc, nc);
          cuda::IndexerScoreParams p;
          p.q = up(q);
          p.w = up(w);
          p.rows = rows;
          p.heads = heads;
          p.keys = up(pool);
          p.pos = up(batch.pos);
          p.ratio = ratio;
          p.candidates = up(cids);
          p.n_cand = nc;
          p.ld = nc;
          p.n_seqs = static_cast<int>(seqs.size());
          p.seqs = up(batch.desc);
          p.max_seq_rows = max_rows;
          p.max_seq_keys = 4200;
          p.q_exact_bf16 = true;
          p.use_wgmma = true;
          p.use_fp8 = true;
          for (const bool cw : {false, true}) {
            SCOPED_TRACE(cw ? "cand_wgmma" : "mma.sync");
            float* o = nans(ref.size());
            p.scores = o;
            p.cand_wgmma = cw;
            cuda::launch_indexer_scores(p, stream_);
            const auto got = down(o, ref.size());
            const double err = rel_err(got, ref);
            if (cw) worst = std::max(worst, err);
            EXPECT_LE(err, cw ? 2e-3 : 1e-5);
            size_t inf_mismatch = 0, nan_count = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
              inf_mismatch += std::isinf(ref[i]) != std::isinf(got[i]) ? 1 : 0;
              nan_count += std::isnan(got[i]) ? 1 : 0;
            }
            EXPECT_EQ(inf_mismatch, 0u);
            EXPECT_EQ(nan_count, 0u);
          }
        }
  std::printf("indexer candidates, e4m3 wgmma: worst max|err| / max|ref| %.3g\n", worst);
}

// The single-sequence form with q_exact_bf16 (FP4 queries, one MMA per tile) equals the hi/lo
// path to fp32 rounding and the CPU to 1e-5; prefill-like causal rows spanning several row blocks;
// with and without use_wgmma.
TEST_F(CudaV41, IndexerScoresExactBf16Queries) {
  std::mt19937 rng(22);
  const int id = 128, heads = 32;
  const int64_t t = 37, n = 3000;
  auto keys = fp4_records(n, id, cpu::Fp4Record::kIndexBlock32Ue8m0, rng);
  auto q = rnd(t * heads * id, rng, -1, 1);
  fq_fp4_block32_ue8m0(q, q);
  auto w = rnd(t * heads, rng, -0.3f, 0.3f);
  std::vector<int32_t> pos(static_cast<size_t>(t));
  for (int64_t r = 0; r < t; ++r)
    pos[static_cast<size_t>(r)] = static_cast<int32_t>(n - 60 * (t - r));
  for (const int ratio : {1, 2}) {
    std::vector<float> ref(static_cast<size_t>(t * n));
    cpu::indexer_scores(q.data(), w.data(), t, heads, id, keys.data(), n, pos.data(), ratio,
                        nullptr, 0, 0.08838834764831845f, ref.data(), n);
    for (const bool exact : {true, false})
      for (const bool wg : {false, true}) {
        float* o = nans(ref.size());
        cuda::IndexerScoreParams p{up(q), up(w),   t,     heads,   id, up(keys),
                                   n,     up(pos), ratio, nullptr, 0,  0.08838834764831845f,
                                   o,     n};
        p.q_exact_bf16 = exact;
        p.use_wgmma = wg;  // taken with exact only: 5 blocks of 8 row slots
        cuda::launch_indexer_scores(p, stream_);
        EXPECT_LE(rel_err(down(o, ref.size()), ref), 1e-5) << ratio << exact << wg;
      }
  }
}

// Exact: the same indices and values in the same order, ties included.
TEST_F(CudaV41, TopkIsExactWithTies) {
  std::mt19937 rng(17);
  struct Case {
    int64_t rows, n;
    int k;
  };
  for (Case c : {Case{3, 5000, 512}, Case{2, 200, 512}, Case{1, 300000, 512}, Case{4, 20000, 2048},
                 Case{2, 70000, 1}}) {
    std::vector<float> s(static_cast<size_t>(c.rows * c.n));
    std::uniform_int_distribution<int> coarse(-40, 40);
    std::uniform_real_distribution<float> u(0, 1);
    for (auto& v : s) {
      const float r = u(rng);
      v = r < 0.3f ? 0.0f : r < 0.4f ? -kInf : r < 0.7f ? coarse(rng) * 0.25f : u(rng) * 10 - 5;
    }
    if (c.rows > 1) std::fill(s.begin() + c.n, s.begin() + 2 * c.n, -kInf);  // an all -inf row
    std::vector<int32_t> idx(static_cast<size_t>(c.rows * c.k)), cnt(static_cast<size_t>(c.rows));
    std::vector<float> val(idx.size());
    cpu::topk_rows(s.data(), c.rows, c.n, c.n, c.k, idx.data(), val.data(), cnt.data());
    int32_t* di = up(std::vector<int32_t>(idx.size(), -7));
    float* dv = nans(val.size());
    int32_t* dc = up(std::vector<int32_t>(cnt.size(), -7));
    void* scratch = up(std::vector<uint8_t>(cuda::topk_scratch_bytes(c.rows, c.n)));
    cuda::launch_topk({up(s), c.rows, c.n, c.n, c.k, di, dv, dc, scratch}, stream_);
    EXPECT_EQ(down(di, idx.size()), idx) << c.n;
    EXPECT_EQ(down(dc, cnt.size()), cnt) << c.n;
    const auto gv = down(dv, val.size());
    for (size_t i = 0; i < val.size(); ++i)
      ASSERT_TRUE(gv[i] == val[i]) << i << " " << gv[i] << " " << val[i];
  }
}

// The radix top-k on the bench shapes (rows cached in shared memory and rows streamed from HBM):
// continuous scores with -inf entries; ReLU-like rows that are mostly exact zeros (fewer positives
// than k: the cut falls inside a huge tie and is resolved by index order); coarse integer scores
// (ties everywhere); rows with n < k. Indices, values and counts exactly equal the CPU top-k.
TEST_F(CudaV41, TopkBenchShapesExact) {
  std::mt19937 rng(23);
  struct Case {
    int64_t rows, n;
    int k;
    int kind;  // 0 continuous, 1 97% zeros, 2 integers in [-3, 3], 3 99.5% zeros
  };
  for (Case c : {Case{384, 131072, 512, 0}, Case{384, 65536, 512, 1}, Case{64, 16384, 512, 0},
                 Case{4096, 4096, 512, 1}, Case{384, 16384, 2048, 0}, Case{384, 65536, 2048, 3},
                 Case{16, 40000, 2048, 2}, Case{32, 20000, 512, 2}, Case{8, 300, 512, 0}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.n) + " k " + std::to_string(c.k) +
                 " kind " + std::to_string(c.kind));
    std::vector<float> s(static_cast<size_t>(c.rows * c.n));
    std::uniform_real_distribution<float> u(0, 1);
    std::uniform_int_distribution<int> coarse(-3, 3);
    for (auto& v : s) {
      const float r = u(rng);
      switch (c.kind) {
        case 0:
          v = r < 0.05f ? -kInf : u(rng) * 10 - 5;
          break;
        case 1:
          v = r < 0.02f ? -kInf : r < 0.97f ? 0.0f : u(rng);
          break;
        case 2:
          v = r < 0.1f ? -kInf : static_cast<float>(coarse(rng));
          break;
        default:
          v = r < 0.995f ? 0.0f : u(rng);
          break;
      }
    }
    if (c.rows > 2) std::fill(s.begin() + c.n, s.begin() + 2 * c.n, -kInf);  // an all -inf row
    std::vector<int32_t> idx(static_cast<size_t>(c.rows * c.k)), cnt(static_cast<size_t>(c.rows));
    std::vector<float> val(idx.size());
    cpu::topk_rows(s.data(), c.rows, c.n, c.n, c.k, idx.data(), val.data(), cnt.data());
    int32_t* di = up(std::vector<int32_t>(idx.size(), -7));
    float* dv = nans(val.size());
    int32_t* dc = up(std::vector<int32_t>(cnt.size(), -7));
    void* scratch = up(std::vector<uint8_t>(cuda::topk_scratch_bytes(c.rows, c.n)));
    cuda::launch_topk({up(s), c.rows, c.n, c.n, c.k, di, dv, dc, scratch}, stream_);
    EXPECT_TRUE(down(di, idx.size()) == idx);
    EXPECT_TRUE(down(dc, cnt.size()) == cnt);
    const auto gv = down(dv, val.size());
    size_t bad = 0;
    for (size_t i = 0; i < val.size(); ++i) bad += gv[i] == val[i] ? 0 : 1;
    EXPECT_EQ(bad, 0u);
  }
}

// A row pitch that is not a multiple of 4 floats (scalar loads) and k > n.
TEST_F(CudaV41, TopkUnalignedPitch) {
  std::mt19937 rng(24);
  const int64_t rows = 5, n = 30001, ld = 30003;
  auto s = rnd(rows * ld, rng, -1, 1);
  for (int64_t r = 0; r < rows; ++r) s[static_cast<size_t>(r * ld + 7)] = -kInf;
  for (const int k : {1, 512, 2048}) {
    std::vector<int32_t> ref(static_cast<size_t>(rows * k));
    cpu::topk_rows(s.data() + 1, rows, n, ld, k, ref.data(), nullptr, nullptr);
    int32_t* di = up(std::vector<int32_t>(ref.size(), -7));
    void* scratch = up(std::vector<uint8_t>(cuda::topk_scratch_bytes(rows, n)));
    cuda::launch_topk({up(s) + 1, rows, n, ld, k, di, nullptr, nullptr, scratch}, stream_);
    EXPECT_EQ(down(di, ref.size()), ref) << k;
  }
  const int64_t small = 100;
  std::vector<int32_t> idx(static_cast<size_t>(rows * 512));
  cpu::topk_rows(s.data(), rows, small, ld, 512, idx.data(), nullptr, nullptr);
  int32_t* di = up(std::vector<int32_t>(idx.size(), -7));
  cuda::launch_topk({up(s), rows, small, ld, 512, di, nullptr, nullptr, nullptr}, stream_);
  EXPECT_EQ(down(di, idx.size()), idx);
}

TEST_F(CudaV41, CandidateBlocks) {
  std::mt19937 rng(18);
  const int64_t t = 3, n = 20001;
  auto s = rnd(t * n, rng, -1, 1);
  std::vector<int32_t> pos = {5, 9000, 20000};
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = std::min<int64_t>(n, pos[r] + 1); j < n; ++j) s[r * n + j] = -kInf;
  const int64_t nb = (n + 7) / 8;
  std::vector<float> bm(static_cast<size_t>(t * nb));
  cpu::block_max_scores(s.data(), t, n, n, 8, pos.data(), 1, bm.data());
  float* dbm = nans(bm.size());
  cuda::launch_block_max_scores({up(s), t, n, n, 8, up(pos), 1, dbm}, stream_);
  EXPECT_EQ(down(dbm, bm.size()), bm);
  const int kb = 2048;
  std::vector<int32_t> ids(static_cast<size_t>(t * kb));
  cpu::topk_rows(bm.data(), t, nb, nb, kb, ids.data(), nullptr, nullptr);
  std::vector<int32_t> cand(static_cast<size_t>(t * kb * 8));
  cpu::blocks_to_candidates(ids.data(), t, kb, 8, n, cand.data());
  int32_t* dids = up(std::vector<int32_t>(ids.size(), -7));
  void* scratch = up(std::vector<uint8_t>(cuda::topk_scratch_bytes(t, nb)));
  cuda::launch_topk({dbm, t, nb, nb, kb, dids, nullptr, nullptr, scratch}, stream_);
  EXPECT_EQ(down(dids, ids.size()), ids);
  int32_t* dcand = up(std::vector<int32_t>(cand.size(), -7));
  cuda::launch_blocks_to_candidates({dids, t, kb, 8, n, dcand}, stream_);
  EXPECT_EQ(down(dcand, cand.size()), cand);
}

// Against the CPU (double): split precision (fp16 hi + lo q and P, about fp32) 1e-5 (measured
// 8.7e-7 on the H200); single fp16 operands 1e-3 (2^-11 relative per operand; measured 2.5e-4); the double-precision test mode 1e-6. 64 heads (two
// blocks of 32 per row) and 16 heads (one m-tile per block); rows with few valid keys (position 3,
// most selections -1) and with a key count that is not a multiple of the 32-key tile.
TEST_F(CudaV41, SparseAttention) {
  std::mt19937 rng(19);
  const int hd = 512;
  const int64_t t = 6, nglob = 700;
  auto ring = swa_records(128, rng);
  auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng);
  // Rows 4 and 5: 1 and 65 keys in all (one tile; three tiles, the last with one key).
  std::vector<int32_t> pos = {3, 127, 5000, 77, 0, 64};
  const int gk = 512;
  std::vector<int32_t> gidx(static_cast<size_t>(t * gk));
  std::uniform_int_distribution<int> pick(-1, static_cast<int>(nglob) - 1);
  for (auto& g : gidx) g = pick(rng);
  for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(3 * gk + i)] = i < 37 ? i * 3 : -1;
  for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(4 * gk + i)] = -1;
  for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(5 * gk + i)] = -1;
  std::vector<int32_t> sidx(static_cast<size_t>(t * 128));
  cpu::swa_window_indices(pos.data(), t, 128, 128, 0, sidx.data());
  const auto f = compress_freqs();
  for (int heads : {64, 16}) {
    auto q = rnd(t * heads * hd, rng, -1, 1);
    auto sink = rnd(heads, rng, -2, 2);
    std::vector<float> ref(q.size());
    cpu::sparse_attention(q.data(), t, heads, hd, ring.data(), sidx.data(), 128, glob.data(),
                          gidx.data(), gk, sink.data(), 0.04419417382415922f, pos.data(),
                          f.data(), 64, ref.data());
    for (bool explicit_swa : {false, true}) {
      cuda::SparseAttentionParams p =
          attention_params({q, t, heads, ring, explicit_swa ? sidx : std::vector<int32_t>{}, glob,
                            gidx, gk, sink, pos, f});
      for (bool split : {true, false}) {
        float* o = nans(ref.size());
        p.out = o;
        p.split_precision = split;
        cuda::launch_sparse_attention(p, stream_);
        const double err = rel_err(down(o, ref.size()), ref);
        EXPECT_LE(err, split ? 1e-5 : 1e-3) << heads << " heads, split " << split;
        std::printf("sparse attention %d heads, split %d, explicit swa %d: rel err %.3g\n", heads,
                    split, explicit_swa, err);
      }
      // The double-precision test mode: the reference's arithmetic, so fp32 output rounding only.
      float* o64 = nans(ref.size());
      p.out = o64;
      cuda::launch_sparse_attention_f64(p, stream_);
      EXPECT_LE(rel_err(down(o64, ref.size()), ref), 1e-6) << explicit_swa;
    }
  }
}

// use_wgmma (the warpgroup-MMA kernel, sm_90a): every case of SparseAttention (1, 65 and few
// valid keys, implicit and explicit SWA windows) with the same tolerances against the CPU: split
// precision 1e-5, single fp16 1e-3; 128 heads (two CTAs of 64 per row), 16 heads (not a
// multiple of 64: the mma.sync fallback), main entries with per-block exponents spread over
// 2^-6..2^6. And against the mma.sync kernel on the same inputs: split 5e-6 (both about fp32),
// fp16 5e-4 (the same fp16 roundings of q and the keys; P's differ through the logits' order).
TEST_F(CudaV41, SparseAttentionWgmma) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernel needs sm_90a (Hopper); device is sm_"
                 << cuda::device_info(0).compute_major << cuda::device_info(0).compute_minor;
  std::mt19937 rng(29);
  const int hd = 512;
  const int64_t t = 6, nglob = 700;
  auto ring = swa_records(128, rng);
  const std::vector<int32_t> pos = {3, 127, 5000, 77, 0, 64};
  const int gk = 512;
  std::vector<int32_t> gidx(static_cast<size_t>(t * gk));
  std::uniform_int_distribution<int> pick(-1, static_cast<int>(nglob) - 1);
  for (auto& g : gidx) g = pick(rng);
  for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(3 * gk + i)] = i < 37 ? i * 3 : -1;
  for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(4 * gk + i)] = -1;
  for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(5 * gk + i)] = -1;
  std::vector<int32_t> sidx(static_cast<size_t>(t * 128));
  cpu::swa_window_indices(pos.data(), t, 128, 128, 0, sidx.data());
  const auto f = compress_freqs();
  for (int spread : {0, 6}) {
    auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, spread);
    for (int heads : {64, 128, 16}) {
      if (spread > 0 && heads != 64) continue;
      auto q = rnd(t * heads * hd, rng, -1, 1);
      auto sink = rnd(heads, rng, -2, 2);
      std::vector<float> ref(q.size());
      cpu::sparse_attention(q.data(), t, heads, hd, ring.data(), sidx.data(), 128, glob.data(),
                            gidx.data(), gk, sink.data(), 0.04419417382415922f, pos.data(),
                            f.data(), 64, ref.data());
      for (bool explicit_swa : {false, true}) {
        cuda::SparseAttentionParams p =
            attention_params({q, t, heads, ring, explicit_swa ? sidx : std::vector<int32_t>{}, glob,
                              gidx, gk, sink, pos, f});
        for (bool split : {true, false}) {
          SCOPED_TRACE(testing::Message() << heads << " heads, split " << split << ", explicit swa "
                                          << explicit_swa << ", block spread " << spread);
          p.split_precision = split;
          float* o_wg = nans(ref.size());
          p.out = o_wg;
          p.use_wgmma = true;
          cuda::launch_sparse_attention(p, stream_);
          float* o_old = nans(ref.size());
          p.out = o_old;
          p.use_wgmma = false;
          cuda::launch_sparse_attention(p, stream_);
          const auto wg = down(o_wg, ref.size()), old = down(o_old, ref.size());
          const double err = rel_err(wg, ref), vs_old = rel_err(wg, old);
          const double err_old = rel_err(old, ref);
          // Spread block exponents (keys up to 6 * 2^6) make the logits about 10x larger, so the
          // fp16 rounding of q * scale moves them (and the softmax) about 10x more; both kernels
          // share that error (measured on the H200: 9.9e-6 hi+lo, 2.9e-3 fp16, for both).
          const double tol = spread == 0 ? (split ? 1e-5 : 1e-3) : (split ? 3e-5 : 6e-3);
          EXPECT_LE(err, tol);
          EXPECT_LE(err_old, tol);
          EXPECT_LE(vs_old, split ? 2e-5 : 5e-4);
          std::printf(
              "sparse attention wgmma %d heads, split %d, explicit swa %d, spread %d: rel err "
              "%.3g (mma.sync %.3g), vs mma.sync %.3g\n",
              heads, split, explicit_swa, spread, err, err_old, vs_old);
        }
      }
    }
  }
}

// Short key lists through the wgmma kernel: 0 to 4 tiles of 32 keys (the fp16 instantiation keeps
// two tiles dequantised ahead and issues S one tile ahead, so the first and last tiles take
// separate paths), SWA and FP4 keys mixed inside one tile.
TEST_F(CudaV41, SparseAttentionWgmmaShortLists) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernel needs sm_90a (Hopper)";
  std::mt19937 rng(31);
  const int hd = 512, heads = 64, sk = 128, gk = 64;
  const int64_t nglob = 300;
  const std::vector<int> nswa = {0, 1, 31, 32, 33, 64, 65, 96, 97, 20};
  const std::vector<int> nfp4 = {0, 0, 0, 0, 0, 0, 0, 0, 0, 45};  // last row: 65 keys, mixed
  const int64_t t = static_cast<int64_t>(nswa.size());
  auto ring = swa_records(sk, rng);
  auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 0);
  std::vector<int32_t> sidx(static_cast<size_t>(t * sk), -1), gidx(static_cast<size_t>(t * gk), -1);
  std::vector<int32_t> pos(static_cast<size_t>(t));
  for (int64_t r = 0; r < t; ++r) {
    pos[static_cast<size_t>(r)] = 1000 + static_cast<int32_t>(r);
    for (int i = 0; i < nswa[static_cast<size_t>(r)]; ++i)
      sidx[static_cast<size_t>(r * sk + i)] = static_cast<int32_t>((7 * i + r) % sk);
    for (int i = 0; i < nfp4[static_cast<size_t>(r)]; ++i)
      gidx[static_cast<size_t>(r * gk + i)] = static_cast<int32_t>(rng() % nglob);
  }
  const auto f = compress_freqs();
  auto q = rnd(t * heads * hd, rng, -1, 1);
  auto sink = rnd(heads, rng, -2, 2);
  std::vector<float> ref(q.size());
  cpu::sparse_attention(q.data(), t, heads, hd, ring.data(), sidx.data(), sk, glob.data(),
                        gidx.data(), gk, sink.data(), 0.04419417382415922f, pos.data(), f.data(),
                        64, ref.data());
  cuda::SparseAttentionParams p =
      attention_params({q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f});
  for (bool split : {true, false}) {
    SCOPED_TRACE(testing::Message() << "split " << split);
    p.split_precision = split;
    float* o_wg = nans(ref.size());
    p.out = o_wg;
    p.use_wgmma = true;
    cuda::launch_sparse_attention(p, stream_);
    float* o_old = nans(ref.size());
    p.out = o_old;
    p.use_wgmma = false;
    cuda::launch_sparse_attention(p, stream_);
    const auto wg = down(o_wg, ref.size()), old = down(o_old, ref.size());
    EXPECT_LE(rel_err(wg, ref), split ? 1e-5 : 1e-3);
    EXPECT_LE(rel_err(wg, old), split ? 2e-5 : 5e-4);
    std::printf("sparse attention wgmma short lists, split %d: rel err %.3g, vs mma.sync %.3g\n",
                split, rel_err(wg, ref), rel_err(wg, old));
  }
}

// The persistent wgmma grid (one CTA per SM, each looping over work items (row, 64 heads)): more
// rows than SMs, 64 and 128 heads, rows with 0 keys, 1 SWA key, 1 FP4 key and many keys of both
// kinds interleaved, so a CTA's item follows items of other lengths (list, O, m, l, the RoPE
// table and the staged tiles reset per item). Against the mma.sync kernel on every row and the
// CPU on every 16th row and the first rows of each kind.
TEST_F(CudaV41, SparseAttentionWgmmaPersistent) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernel needs sm_90a (Hopper)";
  std::mt19937 rng(37);
  const int hd = 512, sk = 128, gk = 256;
  const int64_t nglob = 1000;
  const int64_t t = 2 * cuda::device_info(0).sm_count + 5;
  auto ring = swa_records(sk, rng);
  auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 0);
  const auto [sidx, gidx, pos] = persistent_rows(t, sk, gk, nglob, true, rng);
  const auto f = compress_freqs();
  for (int heads : {64, 128}) {
    auto q = rnd(t * heads * hd, rng, -1, 1);
    auto sink = rnd(heads, rng, -2, 2);
    cuda::SparseAttentionParams p =
        attention_params({q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f});
    for (bool split : {true, false}) {
      SCOPED_TRACE(testing::Message() << heads << " heads, split " << split);
      p.split_precision = split;
      float* o_wg = nans(q.size());
      p.out = o_wg;
      p.use_wgmma = true;
      cuda::launch_sparse_attention(p, stream_);
      float* o_old = nans(q.size());
      p.out = o_old;
      p.use_wgmma = false;
      cuda::launch_sparse_attention(p, stream_);
      const auto wg = down(o_wg, q.size()), old = down(o_old, q.size());
      EXPECT_LE(rel_err(wg, old), split ? 2e-5 : 5e-4);
      // The CPU on a subset of rows (one row at a time).
      const double worst = sampled_rows_vs_cpu(
          {q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f}, wg, 16, split ? 1e-5 : 1e-3);
      std::printf(
          "sparse attention wgmma persistent, %lld rows, %d heads, split %d: vs mma.sync "
          "%.3g, worst sampled row vs CPU %.3g\n",
          static_cast<long long>(t), heads, split, rel_err(wg, old), worst);
    }
  }
}

// SparseAttentionParams::swa_f16_scale (SWA keys dequantised by an fp16 multiply by their
// power-of-two scale where it is an fp16 value; single fp16 precision) gives the wgmma kernel's
// output bit for bit, with the fp32 output and with the MXFP8 one (out_mxfp8_bf16), at 64 and 128
// heads; split precision ignores it (the same bits too). The rows are the persistent test's kind
// (more than two per SM, 0 to 384 keys, 1-key rows, SWA and FP4 keys in one tile). The SWA
// records' block scales spread over 2^-30 .. 2^6 and 2^16 .. 2^19 (the latter blocks' codes small
// enough that their keys stay finite in fp16): the fp16 multiply where 2^k is an fp16 value,
// normal or subnormal, and the fp32 path below 2^-24 and above 2^15 inside one key. Written in
// r17; the same test with the option behind a runtime flag passed on the H200 (branch
// wip/attn-stage-f16s); this template form has not run on a GPU yet.
TEST_F(CudaV41, SparseAttentionWgmmaSwaF16ScaleIsBitIdentical) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernel needs sm_90a (Hopper)";
  std::mt19937 rng(43);
  const int hd = 512, sk = 128, gk = 256;
  const int64_t nglob = 1000;
  const int64_t t = 2 * cuda::device_info(0).sm_count + 5;
  auto ring = swa_records(sk, rng);
  const int64_t rec = cpu::swa_row_bytes(hd);
  ASSERT_EQ(rec, hd + hd / 32);
  std::uniform_int_distribution<int> low(-30, 6), high(16, 19);
  int fp32_blocks = 0, f16_blocks = 0;
  for (int64_t r = 0; r < sk; ++r) {
    uint8_t* row = ring.data() + r * rec;
    for (int b = 0; b < hd / 32; ++b) {
      const bool big = rng() % 8 == 0;
      const int k = big ? high(rng) : low(rng);
      row[hd + b] = static_cast<uint8_t>(127 + k);
      if (big)  // |code| <= 0.1171875, so |key| <= 61440 at 2^19: finite in fp16
        for (int c = 32 * b; c < 32 * b + 32; ++c)
          row[c] = static_cast<uint8_t>((row[c] & 0x80) | (row[c] & 0x1F));
      (k >= -24 && k <= 15 ? f16_blocks : fp32_blocks) += 1;
    }
  }
  ASSERT_GT(fp32_blocks, 100);
  ASSERT_GT(f16_blocks, 1000);
  auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 0);
  const auto [sidx, gidx, pos] = persistent_rows(t, sk, gk, nglob, false, rng);
  const auto f = compress_freqs();
  for (int heads : {64, 128}) {
    auto q = rnd(t * heads * hd, rng, -1, 1);
    auto sink = rnd(heads, rng, -2, 2);
    cuda::SparseAttentionParams p =
        attention_params({q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f});
    p.use_wgmma = true;
    ASSERT_TRUE(cuda::sparse_attention_wgmma_applies(p));
    for (bool split : {true, false}) {
      p.split_precision = split;
      const auto run = [&](bool f16s) {
        p.swa_f16_scale = f16s;
        float* o = nans(q.size());
        p.out = o;
        cuda::launch_sparse_attention(p, stream_);
        return down(o, q.size());
      };
      const auto base = run(false);
      int finite = 0;
      for (const float x : base) finite += std::isfinite(x) ? 1 : 0;
      ASSERT_EQ(finite, static_cast<int>(base.size())) << heads << " heads, split " << split;
      const auto got = run(true);
      EXPECT_EQ(0, std::memcmp(got.data(), base.data(), base.size() * 4))
          << heads << " heads, split " << split;
      // The MXFP8 output (the kQuantOut instantiations).
      const auto run16 = [&](bool f16s) {
        p.swa_f16_scale = f16s;
        p.out = nullptr;
        uint16_t* o16 = up(std::vector<uint16_t>(q.size(), 0xFFFF));
        p.out_mxfp8_bf16 = o16;
        cuda::launch_sparse_attention(p, stream_);
        p.out_mxfp8_bf16 = nullptr;
        return down(o16, q.size());
      };
      EXPECT_EQ(run16(false), run16(true)) << heads << " heads, split " << split << ", MXFP8";
    }
  }
}

// SparseAttentionParams::out_mxfp8_bf16 (the wgmma kernel's epilogue writes the MXFP8 fake-quant
// of its output as bf16 bits) against the two launches it replaces: launch_sparse_attention with
// the fp32 output, then launch_act_quant_mxfp8 (kBF16, 32-channel blocks along heads * 512) on
// it. Bit-identical at 1, 6 and 384 rows (384: more items than SMs, so CTAs loop), 64 heads and
// (6 rows) 128 heads, split and single fp16 precision, with the inverse RoPE (freqs) and without;
// main entries with per-block exponents spread over 2^-6..2^6, so the 32-channel blocks of a row
// take different scales. The fp32 out is not written (stays NaN).
TEST_F(CudaV41, SparseAttentionWgmmaQuantEpilogueIsBitIdentical) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernel needs sm_90a (Hopper)";
  std::mt19937 rng(41);
  const int hd = 512, sk = 128, gk = 256;
  const int64_t nglob = 1000;
  auto ring = swa_records(sk, rng);
  auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 6);
  const auto f = compress_freqs();
  struct Case {
    int64_t rows;
    int heads;
  };
  for (const Case cs : {Case{1, 64}, Case{6, 64}, Case{6, 128}, Case{384, 64}}) {
    const int64_t t = cs.rows;
    const int heads = cs.heads;
    const int64_t cols = static_cast<int64_t>(heads) * hd;
    cuda::SparseAttentionParams p = epilogue_case(t, heads, ring, glob, nglob, sk, gk, rng);
    const size_t n = static_cast<size_t>(t * cols);
    for (const bool rope : {true, false}) {
      p.freqs = rope ? up(f) : nullptr;
      for (const bool split : {true, false}) {
        SCOPED_TRACE(testing::Message() << t << " rows, " << heads << " heads, split " << split
                                        << ", inverse RoPE " << rope);
        p.split_precision = split;
        // The two launches.
        float* o32 = nans(n);
        p.out = o32;
        p.out_mxfp8_bf16 = nullptr;
        cuda::launch_sparse_attention(p, stream_);
        uint16_t* ref16 = mxfp8_bf16_of(o32, t, cols);
        // The fused epilogue.
        float* unused = nans(n);
        uint16_t* got16 = up(std::vector<uint16_t>(n, 0x7FC1));
        p.out = unused;
        p.out_mxfp8_bf16 = got16;
        ASSERT_TRUE(cuda::sparse_attention_wgmma_applies(p));
        cuda::launch_sparse_attention(p, stream_);
        const auto ref = down(ref16, n), got = down(got16, n);
        const auto out = down(unused, n);
        size_t diff = 0, poison = 0, nonzero = 0;
        for (size_t i = 0; i < n; ++i) {
          diff += got[i] != ref[i];
          poison += ref[i] == 0x7FC1;
          nonzero += (ref[i] & 0x7FFF) != 0;
        }
        EXPECT_EQ(diff, 0u) << "of " << n;
        EXPECT_EQ(poison, 0u) << "reference incomplete";
        EXPECT_GT(nonzero, n / 2) << "mostly zero outputs: a weak test";
        EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return std::isnan(x); }))
            << "fp32 out written";
        p.out_mxfp8_bf16 = nullptr;
      }
    }
  }
}

// SparseAttentionParams::out_fp8_rows (the wgmma kernel's epilogue writes wo_a's row-scaled FP8
// operand) against the two launches it replaces: the out_mxfp8_bf16 epilogue (itself checked
// against the fp32 output above), then launch_act_quant_fp8_rows (kBF16) on those bf16 values.
// Codes and row scales bit-identical at 1, 6 and 384 rows (384: CTAs loop over items), 64 heads,
// split and single fp16 precision, with the inverse RoPE; main entries with per-block exponents
// spread over 2^-6..2^6, so the 32-channel blocks of a row take different scales and most codes
// are refolded. The fp32 and bf16 outputs are not written.
TEST_F(CudaV41, SparseAttentionWgmmaFp8RowsEpilogueIsBitIdentical) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernel needs sm_90a (Hopper)";
  std::mt19937 rng(47);
  const int hd = 512, sk = 128, gk = 256, heads = 64;
  const int64_t nglob = 1000, cols = static_cast<int64_t>(heads) * hd;
  auto ring = swa_records(sk, rng);
  auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 6);
  const auto f = compress_freqs();
  for (const int64_t t : {int64_t{1}, int64_t{6}, int64_t{384}}) {
    cuda::SparseAttentionParams p = epilogue_case(t, heads, ring, glob, nglob, sk, gk, rng);
    p.freqs = up(f);
    const size_t n = static_cast<size_t>(t * cols);
    for (const bool split : {true, false}) {
      SCOPED_TRACE(testing::Message() << t << " rows, split " << split);
      p.split_precision = split;
      // The two launches.
      uint16_t* o16 = up(std::vector<uint16_t>(n, 0x7FC1));
      p.out = nullptr;
      p.out_mxfp8_bf16 = o16;
      cuda::launch_sparse_attention(p, stream_);
      const auto [ref8, ref_rs] = fp8_rows_of(o16, t, cols);
      // The fused epilogue.
      uint8_t* got8 = up(std::vector<uint8_t>(n, 0x7F));
      float* got_rs = nans(static_cast<size_t>(t));
      uint16_t* unused16 = up(std::vector<uint16_t>(n, 0x7FC1));
      p.out_mxfp8_bf16 = nullptr;
      p.out_fp8_rows = got8;
      p.out_row_scale = got_rs;
      ASSERT_TRUE(cuda::sparse_attention_wgmma_applies(p));
      cuda::launch_sparse_attention(p, stream_);
      p.out_fp8_rows = nullptr;
      p.out_row_scale = nullptr;
      const auto ref = down(ref8, n), got = down(got8, n);
      const auto rs_ref = down(ref_rs, static_cast<size_t>(t));
      const auto rs_got = down(got_rs, static_cast<size_t>(t));
      const auto b16 = down(o16, n);
      size_t diff = 0, nonzero = 0, refolded = 0;
      for (size_t i = 0; i < n; ++i) {
        diff += got[i] != ref[i];
        nonzero += (ref[i] & 0x7F) != 0;
      }
      // Values the refold onto the row's scale moved (code x row scale != the MXFP8 value): the
      // data exercises the refold, not only the block codes.
      for (size_t i = 0; i < n; ++i)
        refolded +=
            bf16_to_float(b16[i]) != e4m3_to_float(ref[i]) * rs_ref[i / static_cast<size_t>(cols)];
      EXPECT_EQ(diff, 0u) << "of " << n;
      EXPECT_GT(nonzero, n / 2) << "mostly zero codes: a weak test";
      EXPECT_GT(refolded, 0u) << "no value moved by the refold: the refold is untested";
      for (int64_t r = 0; r < t; ++r) {
        ASSERT_TRUE(std::isfinite(rs_ref[static_cast<size_t>(r)]));
        EXPECT_EQ(rs_got[static_cast<size_t>(r)], rs_ref[static_cast<size_t>(r)]) << "row " << r;
      }
      const auto u16 = down(unused16, n);
      EXPECT_TRUE(std::all_of(u16.begin(), u16.end(), [](uint16_t x) { return x == 0x7FC1; }));
    }
  }
}

// SparseAttentionParams::warp_specialized (the wgmma kernel's three-warpgroup form, single fp16):
//  - against the CPU (double) with the fp16 tolerances of SparseAttentionWgmma (1e-3; 6e-3 with
//    block exponents spread over 2^-6..2^6) and against the two-warpgroup kernel (5e-4: the same
//    fp16 operands, S summed in another order), 64 and 128 heads, implicit and explicit SWA;
//  - short lists (0 to 97 keys: 0 to 2 tiles of 64, SWA and FP4 keys in one tile) and 640-key
//    rows (128 SWA + 512 FP4: 10 tiles);
//  - more rows than SMs with 0, 1 and many keys (persistent_rows), so the producer runs ahead
//    into the next item while the consumers finish one (list, q, RoPE table slots, tile parity);
//  - split precision and rd > 64 take the two-warpgroup kernel (the same bits);
//  - the epilogues: out_mxfp8_bf16 equals launch_act_quant_mxfp8 on this kernel's own fp32
//    output, out_fp8_rows equals launch_act_quant_fp8_rows on its own out_mxfp8_bf16, bit for bit
//    (1, 6 and 384 rows).
TEST_F(CudaV41, SparseAttentionWarpSpecialized) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernel needs sm_90a (Hopper)";
  std::mt19937 rng(53);
  const int hd = 512;
  const auto f = compress_freqs();
  // Runs p with and without warp_specialized (fp32 output): {ws, two-warpgroup}.
  const auto both = [&](cuda::SparseAttentionParams p, size_t n) {
    float* o_ws = nans(n);
    p.out = o_ws;
    p.warp_specialized = true;
    cuda::launch_sparse_attention(p, stream_);
    float* o_wg = nans(n);
    p.out = o_wg;
    p.warp_specialized = false;
    cuda::launch_sparse_attention(p, stream_);
    return std::make_pair(down(o_ws, n), down(o_wg, n));
  };
  {
    SCOPED_TRACE("SparseAttentionWgmma's rows");
    const int64_t t = 6, nglob = 700;
    const int gk = 512;
    auto ring = swa_records(128, rng);
    const std::vector<int32_t> pos = {3, 127, 5000, 77, 0, 64};
    std::vector<int32_t> gidx(static_cast<size_t>(t * gk));
    std::uniform_int_distribution<int> pick(-1, static_cast<int>(nglob) - 1);
    for (auto& g : gidx) g = pick(rng);
    for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(3 * gk + i)] = i < 37 ? i * 3 : -1;
    for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(4 * gk + i)] = -1;
    for (int i = 0; i < gk; ++i) gidx[static_cast<size_t>(2 * gk + i)] = i;  // 640 keys
    std::vector<int32_t> sidx(static_cast<size_t>(t * 128));
    cpu::swa_window_indices(pos.data(), t, 128, 128, 0, sidx.data());
    for (int spread : {0, 6}) {
      auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, spread);
      for (int heads : {64, 128}) {
        auto q = rnd(t * heads * hd, rng, -1, 1);
        auto sink = rnd(heads, rng, -2, 2);
        std::vector<float> ref(q.size());
        cpu::sparse_attention(q.data(), t, heads, hd, ring.data(), sidx.data(), 128, glob.data(),
                              gidx.data(), gk, sink.data(), 0.04419417382415922f, pos.data(),
                              f.data(), 64, ref.data());
        for (bool explicit_swa : {false, true}) {
          SCOPED_TRACE(testing::Message() << heads << " heads, explicit swa " << explicit_swa
                                          << ", block spread " << spread);
          cuda::SparseAttentionParams p =
              attention_params({q, t, heads, ring, explicit_swa ? sidx : std::vector<int32_t>{},
                                glob, gidx, gk, sink, pos, f});
          p.use_wgmma = true;
          p.split_precision = false;
          const auto [ws, wg] = both(p, ref.size());
          const double err = rel_err(ws, ref), vs_wg = rel_err(ws, wg);
          EXPECT_LE(err, spread == 0 ? 1e-3 : 6e-3);
          EXPECT_LE(vs_wg, 5e-4);
          std::printf(
              "sparse attention ws %d heads, explicit swa %d, spread %d: rel err %.3g, vs "
              "two-warpgroup %.3g\n",
              heads, explicit_swa, spread, err, vs_wg);
        }
      }
    }
  }
  {
    SCOPED_TRACE("short lists");
    const int heads = 64, sk = 128, gk = 64;
    const int64_t nglob = 300;
    const std::vector<int> nswa = {0, 1, 63, 64, 65, 97, 20, 128};
    const std::vector<int> nfp4 = {0, 0, 0, 0, 0, 0, 45, 64};
    const int64_t t = static_cast<int64_t>(nswa.size());
    auto ring = swa_records(sk, rng);
    auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 0);
    std::vector<int32_t> sidx(static_cast<size_t>(t * sk), -1),
        gidx(static_cast<size_t>(t * gk), -1);
    std::vector<int32_t> pos(static_cast<size_t>(t));
    for (int64_t r = 0; r < t; ++r) {
      pos[static_cast<size_t>(r)] = 1000 + static_cast<int32_t>(r);
      for (int i = 0; i < nswa[static_cast<size_t>(r)]; ++i)
        sidx[static_cast<size_t>(r * sk + i)] = static_cast<int32_t>((7 * i + r) % sk);
      for (int i = 0; i < nfp4[static_cast<size_t>(r)]; ++i)
        gidx[static_cast<size_t>(r * gk + i)] = static_cast<int32_t>(rng() % nglob);
    }
    auto q = rnd(t * heads * hd, rng, -1, 1);
    auto sink = rnd(heads, rng, -2, 2);
    std::vector<float> ref(q.size());
    cpu::sparse_attention(q.data(), t, heads, hd, ring.data(), sidx.data(), sk, glob.data(),
                          gidx.data(), gk, sink.data(), 0.04419417382415922f, pos.data(), f.data(),
                          64, ref.data());
    cuda::SparseAttentionParams p =
        attention_params({q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f});
    p.use_wgmma = true;
    p.split_precision = false;
    const auto [ws, wg] = both(p, ref.size());
    EXPECT_LE(rel_err(ws, ref), 1e-3);
    EXPECT_LE(rel_err(ws, wg), 5e-4);
    std::printf("sparse attention ws short lists: rel err %.3g, vs two-warpgroup %.3g\n",
                rel_err(ws, ref), rel_err(ws, wg));
    // Split precision ignores warp_specialized.
    p.split_precision = true;
    const auto [ws_split, wg_split] = both(p, ref.size());
    EXPECT_EQ(ws_split, wg_split);
    // So does a RoPE wider than its table (rd > 64): the two-warpgroup kernel, the same bits.
    std::vector<double> f128(64);
    for (int i = 0; i < 64; ++i) f128[static_cast<size_t>(i)] = std::pow(10000.0, -i / 64.0);
    p.split_precision = false;
    p.freqs = up(f128);
    p.rd = 128;
    const auto [ws_rd, wg_rd] = both(p, ref.size());
    EXPECT_EQ(ws_rd, wg_rd);
  }
  {
    SCOPED_TRACE("persistent rows");
    const int sk = 128, gk = 512;
    const int64_t nglob = 1000;
    const int64_t t = 2 * cuda::device_info(0).sm_count + 5;
    auto ring = swa_records(sk, rng);
    auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 0);
    const auto [sidx, gidx, pos] = persistent_rows(t, sk, gk, nglob, true, rng);
    for (int heads : {64, 128}) {
      SCOPED_TRACE(testing::Message() << heads << " heads");
      auto q = rnd(t * heads * hd, rng, -1, 1);
      auto sink = rnd(heads, rng, -2, 2);
      cuda::SparseAttentionParams p =
          attention_params({q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f});
      p.use_wgmma = true;
      p.split_precision = false;
      const auto [ws, wg] = both(p, q.size());
      EXPECT_LE(rel_err(ws, wg), 5e-4);
      const double worst = sampled_rows_vs_cpu(
          {q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f}, ws, 16, 1e-3);
      std::printf(
          "sparse attention ws persistent, %lld rows, %d heads: vs two-warpgroup %.3g, "
          "worst sampled row vs CPU %.3g\n",
          static_cast<long long>(t), heads, rel_err(ws, wg), worst);
    }
  }
  {
    SCOPED_TRACE("epilogues");
    const int sk = 128, gk = 512, heads = 64;
    const int64_t nglob = 1000, cols = static_cast<int64_t>(heads) * hd;
    auto ring = swa_records(sk, rng);
    auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 6);
    for (const int64_t t : {int64_t{1}, int64_t{6}, int64_t{384}}) {
      SCOPED_TRACE(testing::Message() << t << " rows");
      cuda::SparseAttentionParams p = epilogue_case(t, heads, ring, glob, nglob, sk, gk, rng);
      p.freqs = up(f);
      p.split_precision = false;
      p.warp_specialized = true;
      const size_t n = static_cast<size_t>(t * cols);
      float* o32 = nans(n);
      p.out = o32;
      cuda::launch_sparse_attention(p, stream_);
      uint16_t* ref16 = mxfp8_bf16_of(o32, t, cols);
      uint16_t* got16 = up(std::vector<uint16_t>(n, 0x7FC1));
      p.out = nullptr;
      p.out_mxfp8_bf16 = got16;
      cuda::launch_sparse_attention(p, stream_);
      const auto r16 = down(ref16, n), g16 = down(got16, n);
      size_t diff16 = 0;
      for (size_t i = 0; i < n; ++i) diff16 += r16[i] != g16[i];
      EXPECT_EQ(diff16, 0u) << "out_mxfp8_bf16, of " << n;
      const auto [ref8, ref_rs] = fp8_rows_of(got16, t, cols);
      uint8_t* got8 = up(std::vector<uint8_t>(n, 0x7F));
      float* got_rs = nans(static_cast<size_t>(t));
      p.out_mxfp8_bf16 = nullptr;
      p.out_fp8_rows = got8;
      p.out_row_scale = got_rs;
      ASSERT_TRUE(cuda::sparse_attention_wgmma_applies(p));
      cuda::launch_sparse_attention(p, stream_);
      const auto r8 = down(ref8, n), g8 = down(got8, n);
      size_t diff8 = 0, nonzero = 0;
      for (size_t i = 0; i < n; ++i) {
        diff8 += r8[i] != g8[i];
        nonzero += (r8[i] & 0x7F) != 0;
      }
      EXPECT_EQ(diff8, 0u) << "out_fp8_rows, of " << n;
      EXPECT_GT(nonzero, n / 2) << "mostly zero codes: a weak test";
      EXPECT_EQ(down(got_rs, static_cast<size_t>(t)), down(ref_rs, static_cast<size_t>(t)));
      std::printf(
          "sparse attention ws epilogues, %lld rows: %zu / %zu bf16 and %zu FP8 codes "
          "differ\n",
          static_cast<long long>(t), diff16, n, diff8);
    }
  }
}

// SparseAttentionParams::ws_q_in_b (consumer B converts q, each item's after its epilogue of the
// item before; the producers no longer do): the same conversion of the same values, so every
// output is bit for bit the plain ws kernel's (fp32, out_mxfp8_bf16, out_fp8_rows + row scales),
// and the fp32 output is within the fp16 tolerance of the CPU (double) reference. Rows of 0 to
// 640 keys (0 to 10 tiles), more rows than SMs (each CTA runs several items, so B converts q of
// item k + 1 while the producers already fill its first tiles), 64 and 128 heads (two 64-head
// items per row), 1 / 6 / 384 rows.
TEST_F(CudaV41, SparseAttentionWsQInBIsBitIdentical) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernel needs sm_90a (Hopper)";
  std::mt19937 rng(71);
  const int hd = 512, sk = 128, gk = 512;
  const auto f = compress_freqs();
  const int64_t nglob = 1000;
  auto ring = swa_records(sk, rng);
  auto glob = fp4_records(nglob, hd, cpu::Fp4Record::kMainBlock16E4m3, rng, 6);
  {
    SCOPED_TRACE("persistent rows, fp32 output");
    const int64_t t = 2 * cuda::device_info(0).sm_count + 5;
    const auto [sidx, gidx, pos] = persistent_rows(t, sk, gk, nglob, true, rng);
    for (int heads : {64, 128}) {
      SCOPED_TRACE(testing::Message() << heads << " heads");
      auto q = rnd(t * heads * hd, rng, -1, 1);
      auto sink = rnd(heads, rng, -2, 2);
      cuda::SparseAttentionParams p =
          attention_params({q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f});
      p.use_wgmma = true;
      p.split_precision = false;
      p.warp_specialized = true;
      float* o_plain = nans(q.size());
      p.out = o_plain;
      cuda::launch_sparse_attention(p, stream_);
      float* o_qb = nans(q.size());
      p.out = o_qb;
      p.ws_q_in_b = true;
      cuda::launch_sparse_attention(p, stream_);
      const auto plain = down(o_plain, q.size()), qb = down(o_qb, q.size());
      size_t diff = 0, nan = 0;
      for (size_t i = 0; i < plain.size(); ++i) {
        diff += std::memcmp(&plain[i], &qb[i], sizeof(float)) != 0;
        nan += std::isnan(qb[i]);
      }
      EXPECT_EQ(diff, 0u) << "ws_q_in_b output differs from the plain ws kernel's";
      EXPECT_EQ(nan, 0u);
      const double worst = sampled_rows_vs_cpu(
          {q, t, heads, ring, sidx, glob, gidx, gk, sink, pos, f}, qb, 13, 6e-3);
      std::printf("sparse attention ws q in B, %lld rows, %d heads: %zu values differ from the "
                  "plain ws kernel; worst sampled row vs CPU %.3g\n",
                  static_cast<long long>(t), heads, diff, worst);
    }
  }
  {
    SCOPED_TRACE("epilogues");
    const int heads = 64;
    const int64_t cols = static_cast<int64_t>(heads) * hd;
    for (const int64_t t : {int64_t{1}, int64_t{6}, int64_t{384}}) {
      SCOPED_TRACE(testing::Message() << t << " rows");
      cuda::SparseAttentionParams p = epilogue_case(t, heads, ring, glob, nglob, sk, gk, rng);
      p.freqs = up(f);
      p.split_precision = false;
      p.warp_specialized = true;
      const size_t n = static_cast<size_t>(t * cols);
      uint16_t* b_plain = up(std::vector<uint16_t>(n, 0x7FC1));
      uint16_t* b_qb = up(std::vector<uint16_t>(n, 0x7FC1));
      p.out = nullptr;
      p.out_mxfp8_bf16 = b_plain;
      cuda::launch_sparse_attention(p, stream_);
      p.ws_q_in_b = true;
      p.out_mxfp8_bf16 = b_qb;
      cuda::launch_sparse_attention(p, stream_);
      EXPECT_EQ(down(b_plain, n), down(b_qb, n)) << "out_mxfp8_bf16";
      uint8_t* c_plain = up(std::vector<uint8_t>(n, 0x7F));
      uint8_t* c_qb = up(std::vector<uint8_t>(n, 0x7F));
      float* s_plain = nans(static_cast<size_t>(t));
      float* s_qb = nans(static_cast<size_t>(t));
      p.out_mxfp8_bf16 = nullptr;
      p.ws_q_in_b = false;
      p.out_fp8_rows = c_plain;
      p.out_row_scale = s_plain;
      cuda::launch_sparse_attention(p, stream_);
      p.ws_q_in_b = true;
      p.out_fp8_rows = c_qb;
      p.out_row_scale = s_qb;
      cuda::launch_sparse_attention(p, stream_);
      const auto cp = down(c_plain, n), cq = down(c_qb, n);
      EXPECT_EQ(cp, cq) << "out_fp8_rows";
      EXPECT_EQ(down(s_plain, static_cast<size_t>(t)), down(s_qb, static_cast<size_t>(t)));
      size_t nonzero = 0;
      for (uint8_t c : cq) nonzero += (c & 0x7F) != 0;
      EXPECT_GT(nonzero, n / 2) << "mostly zero codes: a weak test";
    }
  }
}

// out_mxfp8_bf16 where the wgmma kernel does not take the launch is refused as bad arguments
// (only its epilogue has the output), and sparse_attention_wgmma_applies says so beforehand: 16
// heads (the mma.sync kernel's shape), use_wgmma off, the output not 8-byte aligned; and
// launch_sparse_attention_f64 with it set. Likewise out_fp8_rows without out_row_scale, with 128
// heads, not 4-byte aligned, or together with out_mxfp8_bf16. On Hopper the launch they are
// variations of runs.
TEST_F(CudaV41, SparseAttentionQuantEpilogueRefusedOffTheWgmmaKernel) {
  std::mt19937 rng(43);
  const int hd = 512, sk = 128;
  const int64_t t = 2;
  const std::vector<int32_t> pos = {200, 201};
  std::vector<int32_t> sidx(static_cast<size_t>(t * sk));
  cpu::swa_window_indices(pos.data(), t, sk, sk, 0, sidx.data());
  cuda::SparseAttentionParams ok;
  ok.q = up(rnd(t * 64 * hd, rng, -1, 1));
  ok.rows = t;
  ok.heads = 64;
  ok.swa = up(swa_records(sk, rng));
  ok.swa_idx = up(sidx);
  ok.sink = up(rnd(64, rng, -2, 2));
  ok.pos = up(pos);
  ok.freqs = up(compress_freqs());
  ok.use_wgmma = true;
  auto* out16 = up(std::vector<uint16_t>(static_cast<size_t>(t * 64 * hd + 8), 0));
  ok.out_mxfp8_bf16 = out16;
  auto* out8 = up(std::vector<uint8_t>(static_cast<size_t>(t * 64 * hd + 8), 0));
  float* out_rs = nans(static_cast<size_t>(t));
  if (cuda::device_info(0).compute_major == 9) {
    EXPECT_TRUE(cuda::sparse_attention_wgmma_applies(ok));
    cuda::launch_sparse_attention(ok, stream_);
    cuda::SparseAttentionParams rows = ok;  // the row-scaled FP8 output, accepted
    rows.out_mxfp8_bf16 = nullptr;
    rows.out_fp8_rows = out8;
    rows.out_row_scale = out_rs;
    EXPECT_TRUE(cuda::sparse_attention_wgmma_applies(rows));
    cuda::launch_sparse_attention(rows, stream_);
    backend_->synchronize();
  }
  using Spoil = std::function<void(cuda::SparseAttentionParams&)>;
  const std::vector<std::pair<const char*, Spoil>> bad = {
      {"16 heads", [](auto& p) { p.heads = 16; }},
      {"use_wgmma off", [](auto& p) { p.use_wgmma = false; }},
      {"out alignment", [&](auto& p) { p.out_mxfp8_bf16 = out16 + 2; }},
      // out_fp8_rows: without its row scales, with 128 heads (an item is not a row), misaligned,
      // together with out_mxfp8_bf16.
      {"fp8 rows without row scales",
       [&](auto& p) {
         p.out_mxfp8_bf16 = nullptr;
         p.out_fp8_rows = out8;
       }},
      {"fp8 rows, 128 heads",
       [&](auto& p) {
         p.heads = 128;
         p.rows = 1;
         p.out_mxfp8_bf16 = nullptr;
         p.out_fp8_rows = out8;
         p.out_row_scale = out_rs;
       }},
      {"fp8 rows alignment",
       [&](auto& p) {
         p.out_mxfp8_bf16 = nullptr;
         p.out_fp8_rows = out8 + 2;
         p.out_row_scale = out_rs;
       }},
      {"fp8 rows and bf16",
       [&](auto& p) {
         p.out_fp8_rows = out8;
         p.out_row_scale = out_rs;
       }},
  };
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const auto& [name, spoil] : bad) {
    SCOPED_TRACE(name);
    cuda::SparseAttentionParams p = ok;
    spoil(p);
    EXPECT_FALSE(cuda::sparse_attention_wgmma_applies(p));
    EXPECT_DEATH(cuda::launch_sparse_attention(p, stream_), "bad arguments");
  }
  EXPECT_DEATH(cuda::launch_sparse_attention_f64(ok, stream_), "bad arguments");
}

TEST_F(CudaV41, EngramGatherFromPinnedHostAndGate) {
  std::mt19937 rng(20);
  const int64_t rows = 10000, dim = 256, n = 48;
  for (bool cumem : {true, false}) {
    cuda::PinnedHostBuffer codes = cuda::allocate_pinned_host(rows * dim, cumem);
    cuda::PinnedHostBuffer scales = cuda::allocate_pinned_host(rows * dim / 32, cumem);
    std::printf("engram table: %s (granule %zu B)\n", codes.cumem ? "cuMem HOST" : "cudaHostAlloc",
                codes.granule);
    auto* c = static_cast<uint8_t*>(codes.host);
    auto* s = static_cast<uint8_t*>(scales.host);
    std::uniform_int_distribution<int> byte(1, 0x7E), sc(118, 134);
    for (int64_t i = 0; i < rows * dim; ++i)
      c[i] = static_cast<uint8_t>(byte(rng) | (i & 1 ? 0x80 : 0));
    for (int64_t i = 0; i < rows * dim / 32; ++i) s[i] = static_cast<uint8_t>(sc(rng));
    std::vector<int64_t> ids(static_cast<size_t>(n));
    std::uniform_int_distribution<int64_t> pick(0, rows - 1);
    for (auto& i : ids) i = pick(rng);
    std::vector<float> ref(static_cast<size_t>(n * dim));
    cpu::engram_gather(c, s, dim, ids.data(), n, ref.data());
    uint8_t* oc = up(std::vector<uint8_t>(static_cast<size_t>(n * dim)));
    uint8_t* os = up(std::vector<uint8_t>(static_cast<size_t>(n * dim / 32)));
    cuda::launch_engram_gather(
        {static_cast<const uint8_t*>(codes.device), static_cast<const uint8_t*>(scales.device), dim,
         up(ids), n, oc, os},
        stream_);
    float* e = nans(ref.size());
    cuda::launch_engram_dequant({oc, os, dim, n, e}, stream_);
    EXPECT_EQ(down(e, ref.size()), ref);
    cuda::free_pinned_host(codes);
    cuda::free_pinned_host(scales);
  }
  // Gate: x [t, 4, 5120], kv [t, 25600] (keys first), one image row.
  const int64_t t = 3, d = 5120;
  auto x = rnd(t * 4 * d, rng, -2, 2), kv = rnd(t * 5 * d, rng, -2, 2), wp = rnd(4 * d, rng, -1, 1);
  kv[5] = 0.0f;
  const std::vector<uint8_t> img = {0, 1, 0};
  auto ref = x;
  std::vector<float> g(static_cast<size_t>(t * 4));
  cpu::engram_gate(ref.data(), kv.data(), 5 * d, kv.data() + 4 * d, 5 * d, wp.data(), img.data(), t,
                   4, d, 1e-20f, g.data());
  float* dx = up(x);
  const float* dkv = up(kv);
  float* dg = nans(g.size());
  cuda::launch_engram_gate(
      {dx, dkv, 5 * d, dkv + 4 * d, 5 * d, up(wp), up(img), t, 4, d, 1e-20f, dg}, stream_);
  EXPECT_LE(rel_err(down(dx, ref.size()), ref), 1e-5);
  EXPECT_LE(rel_err(down(dg, g.size()), g), 1e-5);
}

// Deterministic per seed (two runs equal); vs the CPU (double sums) the draw may differ only when
// u lands within float rounding of a cumulative boundary: >= 62 of 64 rows agree; greedy exact.
TEST_F(CudaV41, SamplingTopKTopP) {
  std::mt19937 rng(21);
  const int64_t rows = 64, v = 129280;
  auto l = rnd(rows * v, rng, -8, 8);
  std::vector<uint64_t> seeds(static_cast<size_t>(rows));
  for (size_t i = 0; i < seeds.size(); ++i) seeds[i] = 1000 + i * 7919;
  const float* dl = up(l);
  const uint64_t* ds = up(seeds);
  void* scratch = up(std::vector<uint8_t>(cuda::sample_scratch_bytes(rows, v, 1024)));
  for (auto [temp, k, p] : {std::tuple{0.0f, 50, 1.0f}, std::tuple{1.0f, 50, 0.9f},
                            std::tuple{0.7f, 1024, 0.95f}, std::tuple{1.5f, 8, 1.0f}}) {
    std::vector<int32_t> ref(static_cast<size_t>(rows));
    cpu::sample_rows(l.data(), rows, v, v, temp, k, p, seeds.data(), ref.data());
    int32_t* o1 = up(std::vector<int32_t>(ref.size(), -7));
    int32_t* o2 = up(std::vector<int32_t>(ref.size(), -7));
    cuda::launch_sample({dl, rows, v, v, temp, k, p, ds, o1, scratch}, stream_);
    cuda::launch_sample({dl, rows, v, v, temp, k, p, ds, o2, scratch}, stream_);
    const auto g1 = down(o1, ref.size()), g2 = down(o2, ref.size());
    EXPECT_EQ(g1, g2);
    int agree = 0;
    for (size_t i = 0; i < ref.size(); ++i) agree += g1[i] == ref[i];
    if (temp == 0.0f) {
      EXPECT_EQ(agree, rows);
    } else {
      EXPECT_GE(agree, rows - 2) << temp << " " << k << " " << p;
    }
  }
}

// ---- quantised-activation GEMM path and the device-side MoE ------------------------------------

std::vector<float> bf16_bits_to_float(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_float(b[i]);
  return f;
}

// The strided-batched cuBLASLt call of the GPU model's grouped wo_a (bf16 in, fp32 out): group
// g reads A's columns [g k, +k), B's rows [g n, +n) and writes C's columns [g n, +n). Against
// a double-precision host product of the same bf16 values; fp32 accumulation over k = 96: 1e-5.
TEST_F(CudaV41, LtGemmStridedBatchMatchesCpu) {
  std::mt19937 rng(24);
  const int64_t m = 37, k = 96, n = 40, groups = 3;
  const auto to_bf16 = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return static_cast<uint16_t>(b >> 16);  // truncation: an exact bf16 value
  };
  auto af = rnd(m * groups * k, rng, -2, 2), bf = rnd(groups * n * k, rng, -2, 2);
  std::vector<uint16_t> a(af.size()), b(bf.size());
  for (size_t i = 0; i < af.size(); ++i) a[i] = to_bf16(af[i]);
  for (size_t i = 0; i < bf.size(); ++i) b[i] = to_bf16(bf[i]);
  const auto av = bf16_bits_to_float(a), bv = bf16_bits_to_float(b);
  std::vector<float> ref(static_cast<size_t>(m * groups * n));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0.0;
        for (int64_t i = 0; i < k; ++i)
          acc += static_cast<double>(av[static_cast<size_t>(r * groups * k + g * k + i)]) *
                 bv[static_cast<size_t>((g * n + c) * k + i)];
        ref[static_cast<size_t>(r * groups * n + g * n + c)] = static_cast<float>(acc);
      }
  cuda::CublasLtGemm lt(stream_);
  float* c = nans(ref.size());
  cuda::LtGemmParams p;
  p.precision = cuda::GemmPrecision::kBf16F32;
  p.a = up(a);
  p.lda = groups * k;
  p.b = up(b);
  p.ldb = k;
  p.b_transposed = true;
  p.c = c;
  p.ldc = groups * n;
  p.m = m;
  p.n = n;
  p.k = k;
  p.batch = groups;
  p.stride_a = k;
  p.stride_b = n * k;
  p.stride_c = n;
  lt.run(p);
  EXPECT_LE(rel_err(down(c, ref.size()), ref), 1e-5);
}

// ---- split-TF32 GEMM (launch_split_tf32 operands, one cuBLASLt TF32 GEMM) --------------------

// x = hi + lo as SplitTf32Params defines it, written out from the definition rather than taken
// from the kernel: hi keeps the upper 19 bits, plus one unit of bit 13 when the 13 dropped bits
// are above half, or exactly half with bit 13 odd (nearest even); where that reaches the
// exponent's all-ones (inf) hi is the truncation; non-finite x: {x, 0}.
std::pair<float, float> split_tf32_ref(float x) {
  if (!std::isfinite(x)) return {x, 0.0f};
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t dropped = u & 0x1FFFu, kept = u - dropped;
  uint32_t h = kept;
  if (dropped > 0x1000u || (dropped == 0x1000u && (u & 0x2000u) != 0)) h += 0x2000u;
  if ((h & 0x7F800000u) == 0x7F800000u) h = kept;
  float hi;
  std::memcpy(&hi, &h, 4);
  return {hi, x - hi};
}

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// launch_split_tf32 on random values over many binades (N(0,1) times 2^[-40, 40], never zero)
// plus the edge cases in row 0: ties to even both ways (dropped bits 0x1000 with bit 13 even /
// odd, either sign), one below and above a tie, the largest finite value and 0x7F7FF000 (would
// round to inf: truncated), subnormals (one a tie), +-inf and a quiet NaN. For each lo_part, every
// output third equals the host split bit for bit (lo in the lo_part third, hi in the others), hi
// has its low 13 bits zero and hi + lo == x exactly (finite x), and the pitch padding of x's rows
// is never read into the output nor the output's padding written (NaN poison stays).
TEST_F(CudaV41, SplitTf32IsTheExactHiLoSplit) {
  std::mt19937 rng(31);
  const int64_t rows = 7, cols = 1000, ldx = 1003, ldo = 3 * cols + 5;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-40, 40);
  std::vector<float> x(static_cast<size_t>(rows * ldx), kNaN);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float v = 0.0f;
      while (v == 0.0f) v = normal(rng);
      x[static_cast<size_t>(r * ldx + c)] = std::ldexp(v, binade(rng));
    }
  const std::vector<uint32_t> edge = {
      0x3F801000u, 0x3F803000u, 0xBF801000u, 0xBF803000u,  // ties: down (even), up (odd)
      0x3F800FFFu, 0x3F801001u, 0x3FFFF000u,               // below / above a tie; carry to 2.0
      0x7F7FFFFFu, 0x7F7FF000u, 0xFF7FFFFFu,               // would round to +-inf: truncated
      0x00001234u, 0x00003000u, 0x80001001u,               // subnormals (0x3000: tie up)
      0x7F800000u, 0xFF800000u, 0x7FC00001u};              // +-inf, quiet NaN
  for (size_t i = 0; i < edge.size(); ++i) x[i] = bits_float(edge[i]);
  const float* dx = up(x);
  for (int lo_part = 0; lo_part < 3; ++lo_part) {
    SCOPED_TRACE("lo_part " + std::to_string(lo_part));
    float* out = nans(static_cast<size_t>(rows * ldo));
    cuda::SplitTf32Params p;
    p.x = dx;
    p.ldx = ldx;
    p.rows = rows;
    p.cols = cols;
    p.out = out;
    p.ldo = ldo;
    p.lo_part = lo_part;
    cuda::launch_split_tf32(p, stream_);
    const auto got = down(out, static_cast<size_t>(rows * ldo));
    size_t wrong = 0, not_tf32 = 0, not_exact = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = x[static_cast<size_t>(r * ldx + c)];
        const auto [hi, lo] = split_tf32_ref(v);
        for (int part = 0; part < 3; ++part) {
          const float g = got[static_cast<size_t>(r * ldo + part * cols + c)];
          const bool ok = float_bits(g) == float_bits(part == lo_part ? lo : hi);
          wrong += !ok;
          if (!ok && wrong <= 5)
            ADD_FAILURE() << "row " << r << " col " << c << " x 0x" << std::hex << float_bits(v)
                          << " part " << part << ": got 0x" << float_bits(g) << ", want 0x"
                          << float_bits(part == lo_part ? lo : hi);
        }
        if (!std::isfinite(v)) continue;
        const float ghi = got[static_cast<size_t>(r * ldo + (lo_part == 0 ? 1 : 0) * cols + c)];
        const float glo = got[static_cast<size_t>(r * ldo + lo_part * cols + c)];
        not_tf32 += (float_bits(ghi) & 0x1FFFu) != 0;
        not_exact += ghi + glo != v;
      }
      for (int64_t c = 3 * cols; c < ldo; ++c)
        ASSERT_TRUE(std::isnan(got[static_cast<size_t>(r * ldo + c)])) << r << " " << c;
    }
    EXPECT_EQ(wrong, 0u);
    EXPECT_EQ(not_tf32, 0u);
    EXPECT_EQ(not_exact, 0u);
  }
}

// The split-TF32 product a · w^T as the GPU model's router runs it: A' = [a_lo | a_hi | a_hi]
// (lo_part 0) times W' = [w_hi | w_lo | w_hi]^T (lo_part 1), one cuBLASLt kTf32 GEMM of K = 3 d,
// at the router's shapes (n = 64..384 rows, e = 384 experts, d = 5120) and value ranges (a ~
// N(0,1) as after the RMSNorm, w uniform in +-0.05, never zero), against a double product of the
// same fp32 values. The split's own terms are small: lo·lo dropped (2^-22 |a||w| per product)
// and lo rounded to TF32 by the GEMM (2^-21), random in sign, ~1e-7 of max|ref| over 5120
// products; the rest is the fp32 accumulation over K = 15360. A host model of this GEMM with
// round-to-nearest sums gives ~7e-7 of max|ref|; with a truncating accumulation over one chain of
// all 1920 k8 steps, ~1.3e-5. Measured on the H200 (2026-11-30): 8.2e-7, 1.8e-6 and 6.2e-6 of
// max|ref| at n = 64, 200, 384 (cuBLASLt picks another kernel per n), with a mean error toward
// zero of +9e-7 at 384: the tensor cores' fp32 accumulation truncates. The exact kF32 GEMM:
// 3e-7..6e-7. So the split is near-fp32, ~10x the fp32 GEMM's error, not fp32-class, which is why
// router_split_tf32 is off by default. Bound: 1.5e-5 of max|ref| (the truncating model, 2.4x the
// largest measured). The plain one-pass kTf32 GEMM on a and w (a and w rounded to TF32: 2^-11
// per operand; measured 2.8e-4..3.2e-4) must be at least 10x worse, so the split is what makes
// the difference.
TEST_F(CudaV41, SplitTf32GemmIsNearFp32) {
  const int64_t e = 384, d = 5120;
  std::mt19937 rng(32);
  const auto w = rnd(e * d, rng, -0.05f, 0.05f);
  cuda::CublasLtGemm lt(stream_);
  const float* dw = up(w);
  float* w_split = nans(static_cast<size_t>(e * 3 * d));
  cuda::SplitTf32Params sw;
  sw.x = dw;
  sw.ldx = d;
  sw.rows = e;
  sw.cols = d;
  sw.out = w_split;
  sw.ldo = 3 * d;
  sw.lo_part = 1;
  cuda::launch_split_tf32(sw, stream_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t n : {64, 200, 384}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> a(static_cast<size_t>(n * d));
    for (auto& v : a) do
        v = normal(rng);
      while (v == 0.0f);
    std::vector<double> ref(static_cast<size_t>(n * e));
    double max_ref = 0.0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < e; ++j) {
        const float* ai = a.data() + i * d;
        const float* wj = w.data() + j * d;
        double acc = 0.0;
        for (int64_t q = 0; q < d; ++q) acc += static_cast<double>(ai[q]) * wj[q];
        ref[static_cast<size_t>(i * e + j)] = acc;
        max_ref = std::max(max_ref, std::abs(acc));
      }
    const float* da = up(a);
    float* a_split = nans(static_cast<size_t>(n * 3 * d));
    cuda::SplitTf32Params sa = sw;
    sa.x = da;
    sa.rows = n;
    sa.out = a_split;
    sa.lo_part = 0;
    cuda::launch_split_tf32(sa, stream_);
    // c[n, e] = x[n, k] · y[e, k]^T on cuBLASLt.
    const auto gemm = [&](cuda::GemmPrecision prec, const float* x, const float* y, int64_t k) {
      float* c = nans(static_cast<size_t>(n * e));
      cuda::LtGemmParams g;
      g.precision = prec;
      g.a = x;
      g.lda = k;
      g.b = y;
      g.ldb = k;
      g.b_transposed = true;
      g.c = c;
      g.ldc = e;
      g.m = n;
      g.n = e;
      g.k = k;
      lt.run(g);
      return down(c, static_cast<size_t>(n * e));
    };
    // max |got - ref| (inf where got is not finite) and the mean error toward zero.
    struct Err {
      double max = 0.0, toward_zero = 0.0;
    };
    const auto error = [&](const std::vector<float>& got) {
      Err r;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double diff = static_cast<double>(got[i]) - ref[i];
        r.max = std::isfinite(got[i]) ? std::max(r.max, std::abs(diff)) : kInf;
        r.toward_zero += ref[i] < 0 ? diff : -diff;
      }
      r.toward_zero /= static_cast<double>(ref.size());
      return r;
    };
    const Err split = error(gemm(cuda::GemmPrecision::kTf32, a_split, w_split, 3 * d));
    const Err plain = error(gemm(cuda::GemmPrecision::kTf32, da, dw, d));
    const Err exact = error(gemm(cuda::GemmPrecision::kF32, da, dw, d));
    std::printf(
        "split tf32 n %lld: max|ref| %.3f; max err / max|ref|: split %.2e, plain tf32 %.2e, "
        "fp32 %.2e; mean error toward zero / max|ref|: split %.1e, fp32 %.1e\n",
        static_cast<long long>(n), max_ref, split.max / max_ref, plain.max / max_ref,
        exact.max / max_ref, split.toward_zero / max_ref, exact.toward_zero / max_ref);
    EXPECT_LE(split.max, 1.5e-5 * max_ref);
    EXPECT_GE(plain.max, 10.0 * split.max);
  }
}

// The candidate-block sort of the GPU model (ascending, -1 entries last) against std::sort:
// k = 2048 (the model's), 7 and 1000 (padded networks), with -1 padding and repeated ids.
TEST_F(CudaV41, SortRowsAscending) {
  std::mt19937 rng(23);
  for (int k : {2048, 7, 1000}) {
    const int64_t rows = 5;
    std::vector<int32_t> x(static_cast<size_t>(rows * k));
    std::uniform_int_distribution<int32_t> id(-1, 1 << 20);
    for (auto& v : x) v = rng() % 5 == 0 ? -1 : id(rng);
    for (int i = 0; i < k; ++i) x[static_cast<size_t>(4 * k + i)] = -1;  // an all-padding row
    std::vector<int32_t> ref = x;
    for (int64_t r = 0; r < rows; ++r) {
      auto b = ref.begin() + r * k;
      std::sort(b, b + k, [](int32_t a, int32_t c) {
        return static_cast<uint32_t>(a) < static_cast<uint32_t>(c);  // -1 last
      });
    }
    int32_t* d = up(x);
    cuda::launch_sort_rows_ascending(d, rows, k, stream_);
    EXPECT_EQ(down(d, x.size()), ref) << "k " << k;
  }
}

// The MXFP8 activation fake-quant is the host rule bit for bit (bf16 and fp32 outputs), with a
// row gather and a row count read on the device; rows past the count stay untouched. Shapes: the
// vector kernel (5120 columns; 96 columns, pitch 100) and the scalar fallback (pitch 98 is not
// float4-aligned).
TEST_F(CudaV41, ActQuantMxfp8IsBitExact) {
  struct Shape {
    int64_t cols, ldx, ldo;
  };
  for (const Shape sh : {Shape{5120, 5120, 5120}, Shape{96, 100, 96}, Shape{96, 98, 104}}) {
    SCOPED_TRACE("cols " + std::to_string(sh.cols) + " ldx " + std::to_string(sh.ldx));
    std::mt19937 rng(21);
    const int64_t rows = 9, cols = sh.cols, ldx = sh.ldx, ldo = sh.ldo;
    auto x = rnd(rows * ldx, rng, -3, 3);
    for (int64_t c = 0; c < cols; ++c) {
      x[static_cast<size_t>(2 * ldx + c)] *= 1e-6f;  // amax clamp (1e-4)
      x[static_cast<size_t>(5 * ldx + c)] *= 300.0f;
    }
    const std::vector<int32_t> index = {8, 2, 5, 0, 2, 7, 1};
    const std::vector<int32_t> count = {6};
    std::vector<float> ref(static_cast<size_t>(6 * cols));
    for (int64_t r = 0; r < 6; ++r)
      fq_fp8_block32_pow2(
          std::span<const float>(x).subspan(static_cast<size_t>(index[r] * ldx), cols),
          std::span<float>(ref).subspan(static_cast<size_t>(r * cols), cols));
    const float* dx = up(x);
    const int32_t* di = up(index);
    const int32_t* dc = up(count);
    float* o32 = nans(static_cast<size_t>(7 * ldo));
    auto* o16 = up(std::vector<uint16_t>(static_cast<size_t>(7 * ldo), 0x7FC0));
    for (bool bf16 : {false, true}) {
      cuda::ActQuantParams p;
      p.x = dx;
      p.ldx = ldx;
      p.row_index = di;
      p.rows = 7;
      p.device_rows = dc;
      p.cols = cols;
      p.out = bf16 ? static_cast<void*>(o16) : static_cast<void*>(o32);
      p.out_type = bf16 ? cuda::ActivationType::kBF16 : cuda::ActivationType::kF32;
      p.ldo = ldo;
      cuda::launch_act_quant_mxfp8(p, stream_);
      const std::vector<float> got =
          bf16 ? bf16_bits_to_float(down(o16, static_cast<size_t>(7 * ldo)))
               : down(o32, static_cast<size_t>(7 * ldo));
      size_t diff = 0;
      for (int64_t r = 0; r < 6; ++r)
        for (int64_t c = 0; c < cols; ++c)
          diff += got[static_cast<size_t>(r * ldo + c)] != ref[static_cast<size_t>(r * cols + c)];
      EXPECT_EQ(diff, 0u) << (bf16 ? "bf16" : "fp32");
      for (int64_t r = 0; r < 7; ++r)
        for (int64_t c = r < 6 ? cols : 0; c < ldo; ++c)
          ASSERT_TRUE(std::isnan(got[static_cast<size_t>(r * ldo + c)])) << r << " " << c;
    }
  }
}

// The vector quantisers' grid-stride loop at a DEP32 decode's size (MoE::act_quant over 2304 of
// a 3000-row bound, 5120 columns: 1.47M 8-column items, so every thread takes several loop steps,
// with both items of a step live, one live and none), k-permuted bf16 as the forward runs it:
// act_quant bit for bit the host rule on its gathered rows, the SwiGLU quantiser's bf16 output
// the bf16 of its fp32 output (the same kernel's two output types; SwigluQuantMatchesCpu compares
// that one with the host) at 2304 columns; rows past the device count untouched.
TEST_F(CudaV41, QuantisersGridStrideAtDecodeSize) {
  std::mt19937 rng(32);
  const int64_t bound = 3000, live = 2304, src_rows = 384;
  for (const int64_t cols : {int64_t{5120}, int64_t{2304}}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    auto x = rnd(src_rows * cols, rng, -3, 3);
    scale_blocks32(x, rng, 6);
    std::vector<int32_t> index(static_cast<size_t>(bound));
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(src_rows) - 1);
    for (auto& i : index) i = pick(rng);
    const std::vector<int32_t> count = {static_cast<int32_t>(live)};
    const size_t n = static_cast<size_t>(bound * cols);
    const std::vector<uint16_t> poison(n, 0x7FC1);
    // act_quant, k-permuted bf16, against the host rule and the permutation of kperm64_col.
    auto* o = up(poison);
    cuda::ActQuantParams p;
    p.x = up(x);
    p.ldx = cols;
    p.row_index = up(index);
    p.rows = bound;
    p.device_rows = up(count);
    p.cols = cols;
    p.out = o;
    p.out_type = cuda::ActivationType::kBF16;
    p.ldo = cols;
    p.kperm64 = true;
    cuda::launch_act_quant_mxfp8(p, stream_);
    const auto got = down(o, n);
    std::vector<float> ref(static_cast<size_t>(cols));
    size_t diff = 0, touched = 0;
    for (int64_t r = 0; r < bound; ++r) {
      if (r < live)
        fq_fp8_block32_pow2(std::span<const float>(x).subspan(
                                static_cast<size_t>(index[static_cast<size_t>(r)] * cols), cols),
                            ref);
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t k = c & 63;
        const int64_t pc = (c - k) + 16 * ((k >> 2) & 3) + 8 * ((k >> 1) & 1) + 2 * (k >> 4) + (k & 1);
        const uint16_t g = got[static_cast<size_t>(r * cols + pc)];
        if (r < live) {
          diff += g != float_to_bf16(ref[static_cast<size_t>(c)]);
        } else {
          touched += g != 0x7FC1;
        }
      }
    }
    EXPECT_EQ(diff, 0u) << "act_quant";
    EXPECT_EQ(touched, 0u) << "act_quant wrote past the device count";
    // swiglu_quant at these rows (gate and up: rows of x and of a second draw).
    if (cols != 2304) continue;
    auto g = rnd(bound * cols, rng, -15, 15), u = rnd(bound * cols, rng, -15, 15);
    auto w = rnd(bound, rng, 0.1f, 2);
    cuda::SwigluQuantParams q;
    q.gate = up(g);
    q.up = up(u);
    q.ld = cols;
    q.row_weight = up(w);
    q.rows = bound;
    q.device_rows = up(count);
    q.cols = cols;
    q.limit = 10.0f;
    float* o32 = nans(n);
    q.out = o32;
    q.out_type = cuda::ActivationType::kF32;
    q.ldo = cols;
    cuda::launch_swiglu_quant_mxfp8(q, stream_);
    auto* o16 = up(poison);
    q.out = o16;
    q.out_type = cuda::ActivationType::kBF16;
    cuda::launch_swiglu_quant_mxfp8(q, stream_);
    const auto f32 = down(o32, n);
    const auto b16 = down(o16, n);
    size_t sdiff = 0, stouched = 0, nonzero = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i < static_cast<size_t>(live * cols)) {
        sdiff += b16[i] != float_to_bf16(f32[i]);
        nonzero += f32[i] != 0.0f;
      } else {
        stouched += b16[i] != 0x7FC1 || !std::isnan(f32[i]);
      }
    }
    EXPECT_EQ(sdiff, 0u) << "swiglu_quant bf16 vs fp32";
    EXPECT_EQ(stouched, 0u) << "swiglu_quant wrote past the device count";
    EXPECT_GT(nonzero, static_cast<size_t>(live * cols) / 2);
  }
}

// The kMxfp8 output (launch_fp8_wgmma_gemm's A operand): e4m3 codes and ue8m0 scale codes equal
// the host's quantize_fp8_block32_pow2 byte for byte, on the vector kernel (5120 and 96 columns)
// and the scalar fallback (pitch 98), with the row gather and device row count; bytes past the
// count and the pitches stay untouched (0xAA).
TEST_F(CudaV41, ActQuantMxfp8CodesAreBitExact) {
  struct Shape {
    int64_t cols, ldx, ldo, lds;
  };
  for (const Shape sh :
       {Shape{5120, 5120, 5120, 160}, Shape{96, 100, 96, 3}, Shape{96, 98, 104, 5}}) {
    SCOPED_TRACE("cols " + std::to_string(sh.cols) + " ldx " + std::to_string(sh.ldx));
    std::mt19937 rng(23);
    const int64_t rows = 9, cols = sh.cols, ldx = sh.ldx, ldo = sh.ldo, lds = sh.lds;
    auto x = rnd(rows * ldx, rng, -3, 3);
    for (int64_t c = 0; c < cols; ++c) {
      x[static_cast<size_t>(2 * ldx + c)] *= 1e-6f;  // amax clamp (1e-4)
      x[static_cast<size_t>(5 * ldx + c)] *= 300.0f;
    }
    const std::vector<int32_t> index = {8, 2, 5, 0, 2, 7, 1};
    const std::vector<int32_t> count = {6};
    std::vector<uint8_t> ref_codes(static_cast<size_t>(6 * cols));
    std::vector<uint8_t> ref_scales(static_cast<size_t>(6 * cols / 32));
    for (int64_t r = 0; r < 6; ++r)
      quantize_fp8_block32_pow2(
          std::span<const float>(x).subspan(static_cast<size_t>(index[r] * ldx), cols),
          std::span<uint8_t>(ref_codes).subspan(static_cast<size_t>(r * cols), cols),
          std::span<uint8_t>(ref_scales).subspan(static_cast<size_t>(r * cols / 32), cols / 32));
    auto* codes = up(std::vector<uint8_t>(static_cast<size_t>(7 * ldo), 0xAA));
    auto* scales = up(std::vector<uint8_t>(static_cast<size_t>(7 * lds), 0xAA));
    cuda::ActQuantParams p;
    p.x = up(x);
    p.ldx = ldx;
    p.row_index = up(index);
    p.rows = 7;
    p.device_rows = up(count);
    p.cols = cols;
    p.out = codes;
    p.out_type = cuda::ActivationType::kMxfp8;
    p.ldo = ldo;
    p.out_scale = scales;
    p.ldo_scale = lds;
    cuda::launch_act_quant_mxfp8(p, stream_);
    const auto got = down(codes, static_cast<size_t>(7 * ldo));
    const auto got_s = down(scales, static_cast<size_t>(7 * lds));
    size_t diff = 0, diff_s = 0;
    for (int64_t r = 0; r < 7; ++r) {
      for (int64_t c = 0; c < ldo; ++c) {
        const uint8_t want =
            r < 6 && c < cols ? ref_codes[static_cast<size_t>(r * cols + c)] : uint8_t{0xAA};
        diff += got[static_cast<size_t>(r * ldo + c)] != want;
      }
      for (int64_t c = 0; c < lds; ++c) {
        const uint8_t want = r < 6 && c < cols / 32
                                 ? ref_scales[static_cast<size_t>(r * cols / 32 + c)]
                                 : uint8_t{0xAA};
        diff_s += got_s[static_cast<size_t>(r * lds + c)] != want;
      }
    }
    EXPECT_EQ(diff, 0u) << "codes";
    EXPECT_EQ(diff_s, 0u) << "scales";
  }
}

// The MXFP8 block rule at its edges (v41::mxfp8_scale's integer form of ceil(log2(amax / 448))
// and mxfp8_round2's hardware e4m3 decode): blocks whose amax sits on, just below and just above
// the mantissa 1.75 where the scale steps, at exponents from below the 1e-4 clamp to FLT_MAX,
// and blocks with an infinite element, NaN elements, only zeros, only float subnormals; the other
// elements random fractions of the amax down to 2^-24 of it (e4m3 subnormals and underflow). All
// three outputs of launch_act_quant_mxfp8 against the host's fq_fp8_block32_pow2 /
// quantize_fp8_block32_pow2: fp32 and bf16 bit for bit (NaN where the host has NaN), codes and
// scale codes byte for byte.
TEST_F(CudaV41, Mxfp8ScaleRuleOnEdgeBlocks) {
  std::mt19937 rng(31);
  std::vector<uint32_t> amax_bits;
  for (uint32_t ea : {1u, 90u, 112u, 113u, 114u, 120u, 127u, 135u, 136u, 143u, 200u, 246u, 253u, 254u})
    for (uint32_t m : {0u, 1u, 0x5FFFFFu, 0x600000u, 0x600001u, 0x7FFFFFu, 0x2AAAAAu})
      amax_bits.push_back(ea << 23 | m);
  for (uint32_t b : {0x38D1B717u /* 1e-4f */, 0x38D1B716u, 0x38D1B718u, 0x00000001u, 0x007FFFFFu})
    amax_bits.push_back(b);
  const int64_t nblocks = static_cast<int64_t>(amax_bits.size()) + 4;  // + inf, NaN, zeros, mix
  const int64_t cols = 32 * 16, rows = (nblocks + 15) / 16;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  std::uniform_real_distribution<float> frac(-1.0f, 1.0f);
  std::uniform_int_distribution<int> shift(0, 24);
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    float* blk = x.data() + 32 * b;
    const size_t i = static_cast<size_t>(b);
    if (i < amax_bits.size()) {
      float amax;
      std::memcpy(&amax, &amax_bits[i], 4);
      for (int e = 0; e < 32; ++e) blk[e] = amax * frac(rng) * std::ldexp(1.0f, -shift(rng));
      blk[b % 32] = (b & 1) ? -amax : amax;  // the amax itself, at varying positions and signs
    } else {
      for (int e = 0; e < 32; ++e) blk[e] = frac(rng) * 3.0f;
      switch (i - amax_bits.size()) {
        case 0: blk[7] = -kInf; break;
        case 1: blk[3] = kNaN, blk[20] = kNaN; break;  // ignored by the amax, NaN out
        case 2: std::fill(blk, blk + 32, 0.0f), blk[9] = -0.0f; break;
        default: break;  // a plain random block
      }
    }
  }
  std::vector<float> ref(x.size());
  std::vector<uint8_t> ref_codes(x.size()), ref_scales(x.size() / 32);
  fq_fp8_block32_pow2(x, ref);
  quantize_fp8_block32_pow2(x, ref_codes, ref_scales);
  const float* dx = up(x);
  float* o32 = nans(x.size());
  auto* o16 = up(std::vector<uint16_t>(x.size(), 0x7FC1));
  auto* codes = up(std::vector<uint8_t>(x.size(), 0xAA));
  auto* scales = up(std::vector<uint8_t>(x.size() / 32, 0xAA));
  for (auto type : {cuda::ActivationType::kF32, cuda::ActivationType::kBF16,
                    cuda::ActivationType::kMxfp8}) {
    cuda::ActQuantParams p;
    p.x = dx;
    p.ldx = cols;
    p.rows = rows;
    p.cols = cols;
    p.out_type = type;
    p.ldo = cols;
    p.out = type == cuda::ActivationType::kF32    ? static_cast<void*>(o32)
            : type == cuda::ActivationType::kBF16 ? static_cast<void*>(o16)
                                                   : static_cast<void*>(codes);
    if (type == cuda::ActivationType::kMxfp8) {
      p.out_scale = scales;
      p.ldo_scale = cols / 32;
    }
    cuda::launch_act_quant_mxfp8(p, stream_);
  }
  const auto got32 = down(o32, x.size());
  const auto got16 = down(o16, x.size());
  const auto got_codes = down(codes, x.size());
  const auto got_scales = down(scales, x.size() / 32);
  size_t d32 = 0, d16 = 0, dc = 0, ds = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const bool nan = std::isnan(ref[i]);
    const bool same32 = nan ? std::isnan(got32[i]) : std::memcmp(&got32[i], &ref[i], 4) == 0;
    const uint16_t want16 = float_to_bf16(ref[i]);
    const bool same16 = nan ? std::isnan(bf16_to_float(got16[i])) : got16[i] == want16;
    d32 += !same32;
    d16 += !same16;
    dc += got_codes[i] != ref_codes[i];
    if (!same32 && d32 <= 3)
      ADD_FAILURE() << "fp32 at " << i << " (block " << i / 32 << "): x " << x[i] << " got "
                    << got32[i] << " want " << ref[i];
  }
  for (size_t b = 0; b < ref_scales.size(); ++b) {
    ds += got_scales[b] != ref_scales[b];
    if (got_scales[b] != ref_scales[b] && ds <= 3)
      ADD_FAILURE() << "scale of block " << b << ": got " << int{got_scales[b]} << " want "
                    << int{ref_scales[b]};
  }
  EXPECT_EQ(d32, 0u);
  EXPECT_EQ(d16, 0u);
  EXPECT_EQ(dc, 0u);
  EXPECT_EQ(ds, 0u);
  // The rule spans the scale range: the smallest (clamped) and largest (infinite amax) codes.
  EXPECT_EQ(*std::min_element(ref_scales.begin(), ref_scales.end()), 105);
  EXPECT_EQ(*std::max_element(ref_scales.begin(), ref_scales.end()), 254);
}

// The fused SwiGLU quantiser's kMxfp8 output decodes to its fp32 output bit for bit (the same
// kernel and inputs; the host comparison of that output is SwigluQuantMatchesCpu below).
TEST_F(CudaV41, SwigluQuantMxfp8CodesMatchFp32Output) {
  std::mt19937 rng(24);
  const int64_t t = 11, c = 2304;
  auto g = rnd(t * c, rng, -15, 15), u = rnd(t * c, rng, -15, 15), w = rnd(t, rng, 0.1f, 2);
  float* o = nans(static_cast<size_t>(t * c));
  auto* codes = up(std::vector<uint8_t>(static_cast<size_t>(t * c), 0xAA));
  auto* scales = up(std::vector<uint8_t>(static_cast<size_t>(t * c / 32), 0xAA));
  cuda::SwigluQuantParams p;
  p.gate = up(g);
  p.up = up(u);
  p.ld = c;
  p.row_weight = up(w);
  p.rows = t;
  p.cols = c;
  p.limit = 10.0f;
  p.out = o;
  p.out_type = cuda::ActivationType::kF32;
  p.ldo = c;
  cuda::launch_swiglu_quant_mxfp8(p, stream_);
  p.out = codes;
  p.out_type = cuda::ActivationType::kMxfp8;
  p.out_scale = scales;
  p.ldo_scale = c / 32;
  cuda::launch_swiglu_quant_mxfp8(p, stream_);
  const auto f = down(o, static_cast<size_t>(t * c));
  const auto got = down(codes, static_cast<size_t>(t * c));
  const auto got_s = down(scales, static_cast<size_t>(t * c / 32));
  size_t diff = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const float v = e4m3_to_float(got[i]) * ue8m0_to_float(got_s[i / 32]);
    diff += std::memcmp(&v, &f[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(diff, 0u);
}

// SwiGLU * routing weight, then the fake-quant: expf may differ from the host's by an ulp, so a
// value next to an e4m3 rounding point can land one step away; all others are exact.
TEST_F(CudaV41, SwigluQuantMatchesCpu) {
  std::mt19937 rng(22);
  const int64_t t = 11, c = 2304;
  auto g = rnd(t * c, rng, -15, 15), u = rnd(t * c, rng, -15, 15), w = rnd(t, rng, 0.1f, 2);
  std::vector<float> h(static_cast<size_t>(t * c)), ref(h.size());
  cpu::swiglu_clamped(g.data(), c, u.data(), c, h.data(), c, t, c, 10.0f, w.data());
  fq_fp8_block32_pow2(h, ref);
  const std::vector<int32_t> count = {9};
  float* o = nans(h.size());
  cuda::SwigluQuantParams p;
  p.gate = up(g);
  p.up = up(u);
  p.ld = c;
  p.row_weight = up(w);
  p.rows = t;
  p.device_rows = up(count);
  p.cols = c;
  p.limit = 10.0f;
  p.out = o;
  p.out_type = cuda::ActivationType::kF32;
  p.ldo = c;
  cuda::launch_swiglu_quant_mxfp8(p, stream_);
  const auto got = down(o, h.size());
  size_t off = 0;
  for (size_t i = 0; i < static_cast<size_t>(9 * c); ++i) {
    if (got[i] == ref[i]) continue;
    ++off;
    EXPECT_LE(std::abs(got[i] - ref[i]), 0.126 * std::abs(ref[i]) + 1e-30) << i;
  }
  EXPECT_LE(off, static_cast<size_t>(9 * c) / 1000) << "elements one e4m3 step away";
  for (size_t i = static_cast<size_t>(9 * c); i < got.size(); ++i) ASSERT_TRUE(std::isnan(got[i]));
}

// kperm64 (the swapped-operand GEMM's k-permuted A): the bf16 output of either quantiser is its
// natural output with each row's columns permuted, bit for bit, on the vector kernels (pitches
// equal and padded) and the scalar ones (a pitch not a multiple of 4), with the row gather and the
// device row count; pitch padding and rows past the count stay untouched. kperm64 with another
// output type, or cols % 64 != 0, is refused.
TEST_F(CudaV41, QuantKperm64PermutesTheNaturalOutput) {
  struct Shape {
    int64_t cols, ldx, ldo;
  };
  for (const Shape sh : {Shape{5120, 5120, 5120}, Shape{192, 196, 200}, Shape{128, 130, 136}}) {
    SCOPED_TRACE("cols " + std::to_string(sh.cols) + " ldx " + std::to_string(sh.ldx) + " ldo " +
                 std::to_string(sh.ldo));
    std::mt19937 rng(25);
    const int64_t rows = 9, cols = sh.cols, ldx = sh.ldx, ldo = sh.ldo;
    auto x = rnd(rows * ldx, rng, -3, 3), u = rnd(rows * ldx, rng, -15, 15);
    scale_blocks32(x, rng, 6);  // per-block scales that differ along the row
    const std::vector<int32_t> index = {8, 2, 5, 0, 2, 7, 1};
    const std::vector<int32_t> count = {6};
    const float* dx = up(x);
    const float* du = up(u);
    const float* dw = up(rnd(rows, rng, 0.1f, 2));
    const int32_t* di = up(index);
    const int32_t* dc = up(count);
    const std::vector<uint16_t> poison(static_cast<size_t>(7 * ldo), 0x7FC1);
    // 0: act_quant, 1: swiglu_quant; natural then k-permuted.
    for (int op = 0; op < 2; ++op) {
      SCOPED_TRACE(op == 0 ? "act_quant" : "swiglu_quant");
      std::vector<uint16_t> got[2];
      for (int perm = 0; perm < 2; ++perm) {
        auto* o = up(poison);
        if (op == 0) {
          cuda::ActQuantParams p;
          p.x = dx;
          p.ldx = ldx;
          p.row_index = di;
          p.rows = 7;
          p.device_rows = dc;
          p.cols = cols;
          p.out = o;
          p.out_type = cuda::ActivationType::kBF16;
          p.ldo = ldo;
          p.kperm64 = perm == 1;
          cuda::launch_act_quant_mxfp8(p, stream_);
        } else {
          cuda::SwigluQuantParams p;
          p.gate = dx;
          p.up = du;
          p.ld = ldx;
          p.row_weight = dw;
          p.rows = 7;
          p.device_rows = dc;
          p.cols = cols;
          p.limit = 10.0f;
          p.out = o;
          p.out_type = cuda::ActivationType::kBF16;
          p.ldo = ldo;
          p.kperm64 = perm == 1;
          cuda::launch_swiglu_quant_mxfp8(p, stream_);
        }
        got[perm] = down(o, poison.size());
      }
      size_t diff = 0, written = 0;
      for (int64_t r = 0; r < 7; ++r)
        for (int64_t c = 0; c < ldo; ++c) {
          const size_t i = static_cast<size_t>(r * ldo + c);
          const uint16_t want =
              r < 6 && c < cols ? got[0][static_cast<size_t>(r * ldo + kperm_source(c))] : 0x7FC1;
          diff += got[1][i] != want;
          written += r < 6 && c < cols && got[0][i] != 0x7FC1;
        }
      EXPECT_EQ(diff, 0u);
      EXPECT_EQ(written, static_cast<size_t>(6 * cols)) << "natural output incomplete";
    }
  }
  std::mt19937 rng(26);
  cuda::ActQuantParams p;
  p.x = up(rnd(2 * 96, rng, -1, 1));
  p.ldx = 96;
  p.rows = 2;
  p.cols = 96;  // not a multiple of 64
  p.out = up(std::vector<uint16_t>(2 * 96));
  p.out_type = cuda::ActivationType::kBF16;
  p.ldo = 96;
  p.kperm64 = true;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(cuda::launch_act_quant_mxfp8(p, stream_), "bad arguments");
  p.cols = 64;
  p.out = nans(2 * 96);
  p.out_type = cuda::ActivationType::kF32;  // bf16 only
  EXPECT_DEATH(cuda::launch_act_quant_mxfp8(p, stream_), "bad arguments");
}

struct GroupedCase {
  int64_t tokens, n, k;
  int64_t rows_hint;
  int experts = 24, local = 7;
  int64_t hot = 0;     // the first `hot` tokens all route to local expert 0
  bool empty = false;  // no token routes to local expert 1
};

// Device grouping of random top-k hits (with bias_vl rows) against the host's bookkeeping, then
// the grouped MXFP4 GEMM of every grouped row against cpu::mxfp4_gemm with that row's expert.
// Products are exact (bf16 x e2m1 * 2^k); fp32 vs double accumulation: 2e-5.
// Replicas (one DEP rank's bench): every local hit is grouped `replicas` times with the same
// token and weight, its copies consecutive inside its expert; inv names the first copy; hits on
// other experts stay -1. Checked against the hits counted on the host.
// tokens x topk distinct expert ids in [0, experts) per token.
std::vector<int32_t> distinct_topk_ids(int64_t tokens, int topk, int experts, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens * topk));
  for (int64_t r = 0; r < tokens; ++r) {
    std::vector<int32_t> perm(static_cast<size_t>(experts));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy_n(perm.begin(), topk, ids.begin() + r * topk);
  }
  return ids;
}

TEST_F(CudaV41, MoeGroupReplicas) {
  const int topk = 6, experts = 24, local = 5, tokens = 37, reps = 3;
  std::mt19937 rng(77);
  const int64_t hits = tokens * topk;
  const std::vector<int32_t> ids = distinct_topk_ids(tokens, topk, experts, rng);
  const auto wts = rnd(hits, rng, 0.05f, 1.5f);
  cuda::MoeGroupParams gp = group_params(ids, wts, tokens, topk, local, reps);
  cuda::launch_moe_group(gp, stream_);
  const auto off = down(gp.offsets, local + 1);
  const auto perm = down(gp.perm_row, static_cast<size_t>(hits * reps));
  const auto pw = down(gp.perm_weight, static_cast<size_t>(hits * reps));
  const auto inv = down(gp.inv, static_cast<size_t>(hits));
  std::vector<int32_t> counts(local, 0);
  for (const int32_t id : ids)
    if (id < local) ++counts[static_cast<size_t>(id)];
  ASSERT_EQ(off[0], 0);
  for (int e = 0; e < local; ++e) ASSERT_EQ(off[e + 1] - off[e], reps * counts[e]) << e;
  std::vector<int32_t> seen(static_cast<size_t>(off[local]), 0);
  for (int64_t i = 0; i < hits; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)];
    if (id >= local) {
      EXPECT_EQ(inv[i], -1);
      continue;
    }
    ASSERT_GE(inv[i], off[id]);
    ASSERT_LE(inv[i] + reps, off[id + 1]);
    for (int c = 0; c < reps; ++c) {
      EXPECT_EQ(perm[inv[i] + c], i / topk);
      EXPECT_EQ(pw[inv[i] + c], wts[static_cast<size_t>(i)]);
      ++seen[static_cast<size_t>(inv[i] + c)];
    }
  }
  for (const int32_t v : seen) EXPECT_EQ(v, 1);
}

// Rank-block replicas (experts_total > local, kernels.h MoeGroupParams): copy r of a hit on
// expert id goes to local expert (id - r * local) mod experts_total when that is < local, with the
// hit's token and weight; inv names copy 0 (the hit itself, -1 off the local block). Checked
// against the host's (token, weight) entries per expert: as a multiset in the atomic order, entry
// by entry in hit order with `ordered`: with a wrap past experts_total (local 5 x reps 6 > 24
// experts: the kernels' loop over the replicas), and with blocks that tile the experts (local 4 x
// reps 6 = 24, and x reps 5 < 24: the kernels' one-copy form, rank_blocks_clean).
struct RankBlockCase {
  int local, reps;
};
class CudaV41RankBlocks : public CudaV41, public ::testing::WithParamInterface<RankBlockCase> {};
INSTANTIATE_TEST_SUITE_P(Shapes, CudaV41RankBlocks,
                         ::testing::Values(RankBlockCase{5, 6}, RankBlockCase{4, 6},
                                           RankBlockCase{4, 5}));
TEST_P(CudaV41RankBlocks, MoeGroupRankBlockReplicas) {
  const int topk = 6, experts = 24, tokens = 37;
  const int local = GetParam().local, reps = GetParam().reps;
  std::mt19937 rng(78 + local * 10 + reps);
  const int64_t hits = tokens * topk;
  const std::vector<int32_t> ids = distinct_topk_ids(tokens, topk, experts, rng);
  const auto wts = rnd(hits, rng, 0.05f, 1.5f);
  // The host's (token, weight) sequence per expert in hit order, copies in replica order.
  std::vector<std::vector<std::pair<int32_t, float>>> want(local);
  for (int64_t i = 0; i < hits; ++i)
    for (int r = 0; r < reps; ++r) {
      const int m = ((ids[static_cast<size_t>(i)] - r * local) % experts + experts) % experts;
      if (m < local)
        want[static_cast<size_t>(m)].push_back({static_cast<int32_t>(i / topk), wts[static_cast<size_t>(i)]});
    }
  for (const int mode : {0, 1, 2}) {  // atomic order, ordered, ordered and staged
    const bool ordered = mode > 0;
    SCOPED_TRACE(mode == 0 ? "atomic order" : mode == 1 ? "ordered" : "ordered, staged");
    cuda::MoeGroupParams gp = group_params(ids, wts, tokens, topk, local, reps);
    gp.experts_total = experts;
    gp.ordered = ordered;
    gp.staged = mode == 2;
    cuda::launch_moe_group(gp, stream_);
    const auto off = down(gp.offsets, local + 1);
    const auto perm = down(gp.perm_row, static_cast<size_t>(hits * reps));
    const auto pw = down(gp.perm_weight, static_cast<size_t>(hits * reps));
    const auto inv = down(gp.inv, static_cast<size_t>(hits));
    ASSERT_EQ(off[0], 0);
    int64_t total = 0;
    for (int e = 0; e < local; ++e) {
      auto w = want[static_cast<size_t>(e)];
      ASSERT_EQ(off[e + 1] - off[e], static_cast<int32_t>(w.size())) << e;
      std::vector<std::pair<int32_t, float>> got;
      for (int32_t q = off[e]; q < off[e + 1]; ++q) got.push_back({perm[q], pw[q]});
      if (!ordered) {  // the same entries in some order
        std::sort(got.begin(), got.end());
        std::sort(w.begin(), w.end());
      }
      EXPECT_EQ(got, w) << e;
      total += static_cast<int64_t>(w.size());
    }
    EXPECT_GT(total, hits * local / experts * 2);  // more than the copy-0 hits: the blocks count
    for (int64_t i = 0; i < hits; ++i) {
      const int32_t id = ids[static_cast<size_t>(i)];
      if (id >= local) {
        EXPECT_EQ(inv[i], -1) << i;
        continue;
      }
      ASSERT_GE(inv[i], off[id]);
      ASSERT_LT(inv[i], off[id + 1]);
      EXPECT_EQ(perm[inv[i]], i / topk);
      EXPECT_EQ(pw[inv[i]], wts[static_cast<size_t>(i)]);
    }
  }
}

// MoeGroupParams::ordered with copies (experts_total 0), with and without `staged`: each
// expert's rows are its hits in hit order, each hit's `replicas` copies consecutive, inv naming
// the first; checked entry by entry (the layout is deterministic). 300 tokens x 6 over 7 local
// experts: 1800 hits, 450 range threads of 4 hits (staged: counts in shared memory); 1100 tokens
// over 40 local experts: 6600 hits, 1024 range threads of 7 hits (staged: the last batch of each
// thread partial, and 40 x 1024 counts too many for shared memory, so through the scratch).
struct OrderedGroupCase {
  int experts, local, tokens, reps;
  bool smem;
};
class CudaV41OrderedGroup : public CudaV41,
                            public ::testing::WithParamInterface<OrderedGroupCase> {};
INSTANTIATE_TEST_SUITE_P(Shapes, CudaV41OrderedGroup,
                         ::testing::Values(OrderedGroupCase{24, 7, 300, 3, true},
                                           OrderedGroupCase{80, 40, 1100, 2, false}));
TEST_P(CudaV41OrderedGroup, MoeGroupOrderedCopies) {
  const int topk = 6, experts = GetParam().experts, local = GetParam().local,
            tokens = GetParam().tokens, reps = GetParam().reps;
  ASSERT_EQ(cuda::moe_group_ordered_smem_bytes(local, int64_t{tokens} * topk) > 0, GetParam().smem);
  std::mt19937 rng(79 + local);
  const int64_t hits = tokens * topk;
  const std::vector<int32_t> ids = distinct_topk_ids(tokens, topk, experts, rng);
  const auto wts = rnd(hits, rng, 0.05f, 1.5f);
  for (const bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged" : "one-CTA scratch");
    cuda::MoeGroupParams gp = group_params(ids, wts, tokens, topk, local, reps);
    gp.ordered = true;
    gp.staged = staged;
    cuda::launch_moe_group(gp, stream_);
    const auto off = down(gp.offsets, local + 1);
    const auto perm = down(gp.perm_row, static_cast<size_t>(hits * reps));
    const auto pw = down(gp.perm_weight, static_cast<size_t>(hits * reps));
    const auto inv = down(gp.inv, static_cast<size_t>(hits));
    std::vector<int32_t> want_off(local + 1, 0), cursor(local, 0);
    for (const int32_t id : ids)
      if (id < local) want_off[static_cast<size_t>(id) + 1] += reps;
    for (int e = 0; e < local; ++e) want_off[e + 1] += want_off[e];
    ASSERT_EQ(off, want_off);
    for (int64_t i = 0; i < hits; ++i) {
      const int32_t id = ids[static_cast<size_t>(i)];
      if (id >= local) {
        EXPECT_EQ(inv[i], -1) << i;
        continue;
      }
      const int32_t pos = want_off[id] + cursor[id];
      cursor[id] += reps;
      ASSERT_EQ(inv[i], pos) << i;
      for (int c = 0; c < reps; ++c) {
        EXPECT_EQ(perm[pos + c], i / topk);
        EXPECT_EQ(pw[pos + c], wts[static_cast<size_t>(i)]);
      }
    }
    if (staged) {
      GTEST_FLAG_SET(death_test_style, "threadsafe");
      gp.scratch = nullptr;
      EXPECT_DEATH(cuda::launch_moe_group(gp, stream_), "bad arguments");
    }
  }
}

TEST_F(CudaV41, MoeGroupAndGroupedMxfp4Gemm) {
  const int topk = 6;
  // Hints <= 24 with K % 128 == 0 take the skinny kernel (split-K over a cluster; 16 tokens per
  // chunk at hints <= 8, else 32):
  //   {37, 200, 256, 1}: 2 K steps over 2 ranks; {29, 300, 1280, 1}: 10 steps over 8 ranks;
  //   the decode shapes (w1 and w3: N 2304 K 5120, 4 ranks of 10 steps; w2: N 5120 K 2304, 2
  //   ranks of 9), 12 local experts of 36, ~5 rows each, one expert without rows;
  //   {48, 200, 1152, 6, .., hot 40}: an expert with > 32 rows loops over three 16-token chunks,
  //   9 steps over 8 ranks as 2 + 2 + 2 + 2 + 1 + 0 + 0 + 0;
  //   {48, 300, 1152, 20, .., hot 40}: 32-token chunks over two chunk CTAs.
  // {5, 130, 64, 1}: K % 128 != 0, the 16-row table kernel; {9, 130, 12288, 1}: the skinny
  // staging does not fit, the table kernel's 4-CTA split; hint 100: the 64-row table kernel.
  for (const GroupedCase gc :
       {GroupedCase{37, 200, 256, 1}, GroupedCase{37, 200, 256, 100}, GroupedCase{150, 64, 32, 100},
        GroupedCase{5, 130, 64, 1}, GroupedCase{29, 300, 1280, 1},
        GroupedCase{32, 2304, 5120, 6, 36, 12, 0, true},
        GroupedCase{32, 5120, 2304, 6, 36, 12, 0, true},
        GroupedCase{48, 200, 1152, 6, 24, 7, 40, true},
        GroupedCase{48, 300, 1152, 20, 24, 7, 40, false}, GroupedCase{9, 130, 12288, 1}}) {
    const int experts = gc.experts, local = gc.local;
    SCOPED_TRACE("tokens " + std::to_string(gc.tokens) + " n " + std::to_string(gc.n) + " k " +
                 std::to_string(gc.k) + " hint " + std::to_string(gc.rows_hint) + " local " +
                 std::to_string(local) + "/" + std::to_string(experts) + " hot " +
                 std::to_string(gc.hot));
    std::mt19937 rng(static_cast<uint32_t>(31 + gc.tokens + gc.n));
    const int64_t hits = gc.tokens * topk;
    std::vector<int32_t> ids(static_cast<size_t>(hits)), ids_vl(ids.size());
    for (int64_t r = 0; r < gc.tokens; ++r)
      for (auto* v : {&ids, &ids_vl}) {
        std::vector<int32_t> perm(experts);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        const auto at = [&](int32_t id) {
          return std::find(perm.begin(), perm.end(), id) - perm.begin();
        };
        if (r < gc.hot && at(0) >= topk) std::swap(perm[0], perm[at(0)]);
        if (gc.empty && at(1) < topk) std::swap(perm[at(1)], perm[topk]);
        std::copy_n(perm.begin(), topk, v->begin() + r * topk);
      }
    auto wts = rnd(hits, rng, 0.05f, 1.5f), wts_vl = rnd(hits, rng, 0.05f, 1.5f);
    std::vector<uint8_t> image(static_cast<size_t>(gc.tokens));
    for (auto& b : image) b = rng() % 4 == 0;
    const auto chosen = [&](int64_t i, bool want_id) -> float {
      const bool vl = image[static_cast<size_t>(i / topk)] != 0;
      return want_id ? static_cast<float>(vl ? ids_vl[i] : ids[i]) : (vl ? wts_vl[i] : wts[i]);
    };
    std::vector<int32_t> counts(local, 0);
    for (int64_t i = 0; i < hits; ++i) {
      const int id = static_cast<int>(chosen(i, true));
      if (id < local) ++counts[static_cast<size_t>(id)];
    }
    cuda::MoeGroupParams gp;
    gp.ids = up(ids);
    gp.weights = up(wts);
    gp.ids_vl = up(ids_vl);
    gp.weights_vl = up(wts_vl);
    gp.image = up(image);
    gp.rows = gc.tokens;
    gp.k = topk;
    gp.local = local;
    gp.offsets = up(std::vector<int32_t>(local + 1, -7));
    gp.perm_row = up(std::vector<int32_t>(static_cast<size_t>(hits), -7));
    gp.perm_weight = nans(static_cast<size_t>(hits));
    gp.inv = up(std::vector<int32_t>(static_cast<size_t>(hits), -7));
    gp.scratch = up(std::vector<int32_t>(static_cast<size_t>(cuda::moe_group_scratch_ints(local)), -7));
    cuda::launch_moe_group(gp, stream_);
    const auto off = down(gp.offsets, local + 1);
    const auto perm = down(gp.perm_row, static_cast<size_t>(hits));
    const auto pw = down(gp.perm_weight, static_cast<size_t>(hits));
    const auto inv = down(gp.inv, static_cast<size_t>(hits));
    ASSERT_EQ(off[0], 0);
    for (int e = 0; e < local; ++e) ASSERT_EQ(off[e + 1] - off[e], counts[e]) << "expert " << e;
    const int32_t total = off[local];
    std::vector<int32_t> expert_of(static_cast<size_t>(total), -1), seen(expert_of.size(), 0);
    for (int e = 0; e < local; ++e)
      for (int32_t q = off[e]; q < off[e + 1]; ++q) expert_of[static_cast<size_t>(q)] = e;
    for (int64_t i = 0; i < hits; ++i) {
      const int id = static_cast<int>(chosen(i, true));
      if (id >= local) {
        EXPECT_EQ(inv[i], -1);
        continue;
      }
      ASSERT_GE(inv[i], 0);
      ASSERT_LT(inv[i], total);
      ++seen[static_cast<size_t>(inv[i])];
      EXPECT_EQ(perm[inv[i]], i / topk);
      EXPECT_EQ(pw[inv[i]], chosen(i, false));
      EXPECT_EQ(expert_of[static_cast<size_t>(inv[i])], id);
    }
    for (int32_t q = 0; q < total; ++q) EXPECT_EQ(seen[static_cast<size_t>(q)], 1) << q;

    // Grouped GEMM on bf16 rows (MXFP8 values) of random activations.
    auto x = rnd(gc.tokens * gc.k, rng, -2, 2);
    std::vector<float> a(static_cast<size_t>(hits * gc.k), 0.0f);
    std::vector<uint16_t> a16(a.size(), 0);
    for (int32_t q = 0; q < total; ++q) {
      fq_fp8_block32_pow2(
          std::span<const float>(x).subspan(static_cast<size_t>(perm[q] * gc.k), gc.k),
          std::span<float>(a).subspan(static_cast<size_t>(q * gc.k), gc.k));
      for (int64_t j = 0; j < gc.k; ++j)
        a16[static_cast<size_t>(q * gc.k + j)] = float_to_bf16(a[static_cast<size_t>(q * gc.k + j)]);
    }
    const Mxfp4Experts ex = mxfp4_experts(off, gc.n, gc.k, a, rng);
    float* y = nans(static_cast<size_t>(hits * gc.n));
    cuda::GroupedMxfp4GemmParams gg;
    gg.a = up(a16);
    gg.lda = gc.k;
    gg.offsets = gp.offsets;
    gg.num_experts = local;
    gg.max_rows = gc.tokens;
    gg.w = up(ex.wp);
    gg.w_scale = up(ex.sp);
    gg.y = y;
    gg.ldy = gc.n;
    gg.n = gc.n;
    gg.k = gc.k;
    gg.rows_hint = gc.rows_hint;
    cuda::launch_grouped_mxfp4_gemm(gg, stream_);
    const auto got = down(y, static_cast<size_t>(hits * gc.n));
    const std::vector<float> head(got.begin(), got.begin() + total * gc.n);
    EXPECT_LE(rel_err(head, ex.ref), 2e-5);
    for (size_t i = static_cast<size_t>(total * gc.n); i < got.size(); ++i)
      ASSERT_TRUE(std::isnan(got[i])) << "row past the grouped count written: " << i;
  }
}

// use_wgmma (the sm_90a wgmma kernel, rows_hint > 24, K % 128 == 0): ragged device-side counts
// 0, 1, 63, 64, 65, 191, 192, 300 rows per expert (empty experts, 64-row warpgroup halves past
// the count, tiles looping past the grid's M tiles), N not a multiple of the 256-column tile
// (clamped weight rows, unstored columns), the w1 / w3 decode shape N 2304 K 5120 on two experts
// and the w2 shape's K 2304 (N reduced for the CPU reference). Against cpu::mxfp4_gemm with the
// grouped table kernel's tolerance (exact products, fp32 sums: 2e-5 of max |ref|), rows past the
// grouped count untouched (NaN), and a rerun bit-identical. The swapped-operand kernel also runs
// on a k-permuted copy of A (a_kperm: its other decode) against the same references, and with
// passes of up to 224 rows (rs_max_pass; its own kernel, 32-row TMA boxes): the `wide` counts
// take every pass shape of it (64 / 128 / 192 / 224) and the splits past 224 (225 = 224 + 1,
// 257 = 224 + 33, 448 = 2 x 224, 520 = 2 x 224 + 72: past the grid's two pass CTAs).
TEST_F(CudaV41, GroupedMxfp4GemmWgmma) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernels need sm_90a (Hopper); device is sm_"
                 << cuda::device_info(0).compute_major << cuda::device_info(0).compute_minor;
  struct Case {
    int64_t n, k, hint;
    std::vector<int32_t> counts;
  };
  // Ragged counts cover every pass shape of the swapped kernel (64 / 128 / 192 rows, a second
  // pass past 192) and the v1 kernel's tails; n not a multiple of 128 leaves weight rows past n
  // in the last tile.
  const std::vector<int32_t> ragged = {0, 1, 63, 64, 65, 191, 192, 300};
  const std::vector<int32_t> passes = {129, 256, 257, 520, 7};
  const std::vector<int32_t> wide = {7, 64, 129, 192, 193, 224, 225, 256, 257, 448, 520};
  for (const Case& c :
       {Case{520, 5120, 192, ragged}, Case{776, 2304, 192, ragged}, Case{2304, 5120, 192, {192, 5}},
        Case{256, 1152, 64, ragged}, Case{5120, 2304, 128, {130, 0, 64}},
        Case{392, 1024, 200, passes}, Case{264, 1024, 192, wide}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " hint " +
                 std::to_string(c.hint) + " experts " + std::to_string(c.counts.size()));
    std::mt19937 rng(static_cast<uint32_t>(91 + c.n + c.k));
    const int local = static_cast<int>(c.counts.size());
    std::vector<int32_t> off(static_cast<size_t>(local + 1), 0);
    for (int e = 0; e < local; ++e) off[e + 1] = off[e] + c.counts[static_cast<size_t>(e)];
    const int64_t total = off[local];
    const int64_t max_rows = *std::max_element(c.counts.begin(), c.counts.end());
    const int64_t alloc_rows = total + 7;  // rows past the grouped count must stay untouched
    const auto [a, a16] = mxfp8_rows(alloc_rows, c.k, rng);
    const std::vector<uint16_t> a16p = kperm_rows(a16, alloc_rows, c.k, c.k);
    // Two weight sets (W and W_b), each with its CPU reference.
    const Mxfp4Experts set[2] = {mxfp4_experts(off, c.n, c.k, a, rng),
                                 mxfp4_experts(off, c.n, c.k, a, rng)};
    const auto check = [&](const std::vector<float>& got, const std::vector<float>& r) {
      expect_grouped_output(got, r, off, c.n);
    };
    // v1 (bf16 weight tiles in shared memory), the swapped-operand kernel, and the swapped kernel
    // with both weight sets in one launch, on natural and k-permuted A, with passes of 192 and
    // of 224 rows. Whether 224-row passes give the 192-row ones' bits (each row is summed whole
    // over K in one pass either way, but wgmma's order within a k16 step is not documented) is
    // printed, not asserted: rs192 is the natural-A single-set run.
    std::vector<float> rs192;
    struct Variant {
      const char* name;
      bool rs, kperm, two;
      int max_pass;
    };
    for (const Variant v :
         {Variant{"v1", false, false, false, 0}, Variant{"rs", true, false, false, 0},
          Variant{"rs, two weight sets", true, false, true, 0},
          Variant{"rs, a_kperm", true, true, false, 0},
          Variant{"rs, a_kperm, two weight sets", true, true, true, 0},
          Variant{"rs 224", true, false, false, 224},
          Variant{"rs 224, two weight sets", true, false, true, 224},
          Variant{"rs 224, a_kperm, two weight sets", true, true, true, 224}}) {
      SCOPED_TRACE(v.name);
      const bool kperm = v.kperm, two = v.two;
      cuda::GroupedMxfp4GemmParams gg;
      gg.a = up(kperm ? a16p : a16);
      gg.lda = c.k;
      gg.offsets = up(off);
      gg.num_experts = local;
      gg.max_rows = std::max<int64_t>(max_rows, 1);
      gg.w = up(set[0].wp);
      gg.w_scale = up(set[0].sp);
      gg.ldy = c.n;
      gg.n = c.n;
      gg.k = c.k;
      gg.rows_hint = c.hint;
      gg.use_wgmma = true;
      gg.wgmma_rs = v.rs;
      gg.rs_max_pass = v.max_pass;
      gg.a_rows = alloc_rows;
      gg.a_kperm = kperm;
      if (two) {
        gg.w_b = up(set[1].wp);
        gg.w_scale_b = up(set[1].sp);
      }
      std::vector<std::vector<float>> runs, runs_b;
      for (int rep = 0; rep < 2; ++rep) {
        gg.y = nans(static_cast<size_t>(alloc_rows * c.n));
        if (two) gg.y_b = nans(static_cast<size_t>(alloc_rows * c.n));
        EXPECT_EQ(cuda::grouped_mxfp4_rs_applies(gg), v.rs);
        ASSERT_EQ(cuda::launch_grouped_mxfp4_gemm(gg, stream_),
                  v.rs ? cuda::GroupedMxfp4Kernel::kWgmmaRs : cuda::GroupedMxfp4Kernel::kWgmma);
        runs.push_back(down(gg.y, static_cast<size_t>(alloc_rows * c.n)));
        if (two) runs_b.push_back(down(gg.y_b, static_cast<size_t>(alloc_rows * c.n)));
      }
      check(runs[0], set[0].ref);
      ASSERT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0)
          << "rerun not bit-identical";
      if (v.rs && !kperm && !two) {
        if (v.max_pass == 0) {
          rs192 = runs[0];
        } else {
          size_t diff = 0;
          for (size_t i = 0; i < static_cast<size_t>(total * c.n); ++i)
            diff += std::memcmp(&runs[0][i], &rs192[i], sizeof(float)) != 0;
          std::printf("grouped rs n %ld k %ld: max pass 224 vs 192: %zu of %ld outputs differ\n",
                      static_cast<long>(c.n), static_cast<long>(c.k), diff,
                      static_cast<long>(total * c.n));
        }
      }
      if (two) {
        check(runs_b[0], set[1].ref);
        ASSERT_EQ(std::memcmp(runs_b[0].data(), runs_b[1].data(), runs_b[0].size() * sizeof(float)),
                  0)
            << "rerun not bit-identical (W_b)";
      }
    }
  }
}

// A second weight set on a launch that no wgmma kernel takes (small rows_hint) runs as two
// launches: both outputs match the CPU; a half-set second weight set is refused.
TEST_F(CudaV41, GroupedMxfp4GemmTwoWeightSetsOnTheTableKernels) {
  std::mt19937 rng(5);
  const int64_t n = 72, k = 256;
  const std::vector<int32_t> off = {0, 3, 3, 10};
  const int local = 3;
  const int64_t total = off[local];
  const auto [a, a16] = mxfp8_rows(total, k, rng);
  const Mxfp4Experts set[2] = {mxfp4_experts(off, n, k, a, rng), mxfp4_experts(off, n, k, a, rng)};
  cuda::GroupedMxfp4GemmParams gg = grouped_launch(a16, off, set[0], n, k, 7);
  gg.w_b = up(set[1].wp);
  gg.w_scale_b = up(set[1].sp);
  gg.rows_hint = 3;
  gg.use_wgmma = true;
  gg.wgmma_rs = true;  // not taken: rows_hint <= 24
  gg.a_rows = total;
  gg.y = nans(static_cast<size_t>(total * n));
  gg.y_b = nans(static_cast<size_t>(total * n));
  EXPECT_NE(cuda::launch_grouped_mxfp4_gemm(gg, stream_), cuda::GroupedMxfp4Kernel::kWgmmaRs);
  EXPECT_LE(rel_err(down(gg.y, static_cast<size_t>(total * n)), set[0].ref), 2e-5);
  EXPECT_LE(rel_err(down(gg.y_b, static_cast<size_t>(total * n)), set[1].ref), 2e-5);
  gg.y_b = nullptr;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(cuda::launch_grouped_mxfp4_gemm(gg, stream_), "bad arguments");
}

// rs_max_pass other than 0, 192 or 224 (the pass widths the swapped-operand kernel has) is
// refused as bad arguments before any kernel is chosen, on any device; the supported ones run.
TEST_F(CudaV41, GroupedMxfp4GemmRefusesUnsupportedMaxPass) {
  std::mt19937 rng(9);
  const int64_t n = 128, k = 256, rows = 40;
  const std::vector<int32_t> off = {0, static_cast<int32_t>(rows)};
  const auto [a, a16] = mxfp8_rows(rows, k, rng);
  const Mxfp4Experts ex = mxfp4_experts(off, n, k, a, rng);
  cuda::GroupedMxfp4GemmParams gg = grouped_launch(a16, off, ex, n, k, rows);
  gg.rows_hint = rows;
  gg.use_wgmma = true;
  gg.wgmma_rs = true;
  gg.a_rows = rows;
  for (const int ok : {0, 192, 224}) {
    gg.rs_max_pass = ok;
    gg.y = nans(static_cast<size_t>(rows * n));
    EXPECT_NE(cuda::launch_grouped_mxfp4_gemm(gg, stream_), cuda::GroupedMxfp4Kernel::kNone) << ok;
    EXPECT_LE(rel_err(down(gg.y, static_cast<size_t>(rows * n)), ex.ref), 2e-5) << ok;
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const int bad : {-1, 64, 193, 256}) {
    gg.rs_max_pass = bad;
    EXPECT_DEATH(cuda::launch_grouped_mxfp4_gemm(gg, stream_), "bad arguments") << bad;
  }
}

// a_kperm on a launch the swapped-operand kernel does not take (rows_hint 3; wgmma_rs off) is
// refused (the other kernels read A in natural k order), and grouped_mxfp4_rs_applies says so
// beforehand.
TEST_F(CudaV41, GroupedMxfp4GemmRefusesKpermOffTheSwappedKernel) {
  const int64_t n = 72, k = 256;
  const std::vector<int32_t> off = {0, 3, 3, 10};
  const int local = 3;
  cuda::GroupedMxfp4GemmParams gg = one_weight_launch(6, n, k, off, 7);
  gg.rows_hint = 3;  // the skinny / table kernels
  gg.use_wgmma = true;
  gg.wgmma_rs = true;
  gg.a_rows = off[local];
  gg.y = nans(static_cast<size_t>(off[local] * n));
  gg.a_kperm = true;
  EXPECT_FALSE(cuda::grouped_mxfp4_rs_applies(gg));
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(cuda::launch_grouped_mxfp4_gemm(gg, stream_), "bad arguments");
  gg.rows_hint = 192;
  gg.wgmma_rs = false;  // the v1 wgmma kernel (or, off Hopper, the table kernel)
  EXPECT_FALSE(cuda::grouped_mxfp4_rs_applies(gg));
  EXPECT_DEATH(cuda::launch_grouped_mxfp4_gemm(gg, stream_), "bad arguments");
}

// GroupedMxfp4GemmParams::swiglu (the SwiGLU + MXFP8 epilogue of the swapped-operand kernel's
// w1 + w3 launch) against the unfused sequence on the same inputs: that kernel into fp32 y and
// y_b, then launch_swiglu_quant_mxfp8 (gate y, up y_b, the device row count). The accumulators
// are the same kernel's K loop, so the bf16 outputs must agree bit for bit, every grouped row's
// n columns written, the pitch padding and the rows past the grouped count untouched. Uneven
// counts per expert: empty experts, 7 and 1 rows (64-row passes), 129 and 192 (192-row passes),
// 257 (192 + 65), 520 (passes looping past the grid's two pass CTAs); n 2304 k 5120 (the w1 / w3
// shape), a multiple of 64 and one of 32 only (the last CTA's second 32-wide block past n).
// Natural and k-permuted A (a_kperm) and output (kperm64), with and without row weights; limit 40
// clamps some g and u but not most. Also with passes of up to 224 rows (rs_max_pass: 257 = 224 +
// 33, 520 = 2 x 224 + 72; the epilogue's staging of 224 rows).
TEST_F(CudaV41, GroupedMxfp4GemmSwigluEpilogueMatchesUnfused) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the swapped-operand kernel needs sm_90a (Hopper); device is sm_"
                 << cuda::device_info(0).compute_major << cuda::device_info(0).compute_minor;
  struct Case {
    int64_t n, k;
    std::vector<int32_t> counts;
  };
  const std::vector<int32_t> uneven = {7, 0, 129, 192, 1, 257, 64, 520};
  for (const Case& c : {Case{2304, 5120, {192, 7, 0, 129}}, Case{320, 1024, uneven},
                        Case{352, 512, {257, 7, 129, 192}}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " experts " +
                 std::to_string(c.counts.size()));
    std::mt19937 rng(static_cast<uint32_t>(57 + c.n + c.k));
    const int local = static_cast<int>(c.counts.size());
    std::vector<int32_t> off(static_cast<size_t>(local + 1), 0);
    for (int e = 0; e < local; ++e) off[e + 1] = off[e] + c.counts[static_cast<size_t>(e)];
    const int64_t total = off[local];
    const int64_t alloc_rows = total + 7;  // rows past the grouped count must stay untouched
    const int64_t ldo = c.n + 8;           // and so must the pitch padding
    const auto [a, a16] = mxfp8_rows(alloc_rows, c.k, rng);
    const std::vector<uint16_t> a16p = kperm_rows(a16, alloc_rows, c.k, c.k);
    // The weights only: the CPU references of these products are GroupedMxfp4GemmWgmma's.
    const std::vector<int32_t> no_rows(static_cast<size_t>(local + 1), 0);
    const Mxfp4Experts w1 = mxfp4_experts(no_rows, c.n, c.k, a, rng);
    const Mxfp4Experts w3 = mxfp4_experts(no_rows, c.n, c.k, a, rng);
    const int32_t* doff = up(off);
    const float* weights = up(rnd(alloc_rows, rng, 0.05f, 1.5f));
    const std::vector<uint16_t> poison(static_cast<size_t>(alloc_rows * ldo), 0x7FC1);
    struct Variant {
      bool a_kperm, kperm64, row_weight;
      int max_pass;
    };
    for (const Variant v : {Variant{false, false, true, 0}, Variant{true, true, true, 0},
                            Variant{false, true, false, 0}, Variant{false, false, true, 224},
                            Variant{true, true, true, 224}}) {
      if (v.kperm64 && c.n % 64 != 0) continue;  // kperm64 permutes whole 64-wide tiles
      SCOPED_TRACE(std::string(v.a_kperm ? "a_kperm" : "natural A") +
                   (v.kperm64 ? ", kperm64 out" : ", natural out") +
                   (v.row_weight ? ", row weights" : ", no row weights") +
                   (v.max_pass != 0 ? ", max pass 224" : ""));
      cuda::GroupedMxfp4GemmParams gg;
      gg.a = up(v.a_kperm ? a16p : a16);
      gg.lda = c.k;
      gg.offsets = doff;
      gg.num_experts = local;
      gg.max_rows = *std::max_element(c.counts.begin(), c.counts.end());
      gg.w = up(w1.wp);
      gg.w_scale = up(w1.sp);
      gg.w_b = up(w3.wp);
      gg.w_scale_b = up(w3.sp);
      gg.ldy = c.n;
      gg.n = c.n;
      gg.k = c.k;
      gg.rows_hint = 192;
      gg.use_wgmma = true;
      gg.wgmma_rs = true;
      gg.rs_max_pass = v.max_pass;
      gg.a_rows = alloc_rows;
      gg.a_kperm = v.a_kperm;
      // Unfused: fp32 g and u, then the SwiGLU quantiser.
      gg.y = nans(static_cast<size_t>(alloc_rows * c.n));
      gg.y_b = nans(static_cast<size_t>(alloc_rows * c.n));
      ASSERT_EQ(cuda::launch_grouped_mxfp4_gemm(gg, stream_), cuda::GroupedMxfp4Kernel::kWgmmaRs);
      auto* unfused = up(poison);
      cuda::SwigluQuantParams sq;
      sq.gate = gg.y;
      sq.up = gg.y_b;
      sq.ld = c.n;
      sq.row_weight = v.row_weight ? weights : nullptr;
      sq.rows = alloc_rows;
      sq.device_rows = doff + local;
      sq.cols = c.n;
      sq.limit = 40.0f;
      sq.out = unfused;
      sq.out_type = cuda::ActivationType::kBF16;
      sq.ldo = ldo;
      sq.kperm64 = v.kperm64;
      cuda::launch_swiglu_quant_mxfp8(sq, stream_);
      // Fused, twice (a rerun is bit-identical too).
      gg.y = nullptr;
      gg.y_b = nullptr;
      gg.swiglu.ldo = ldo;
      gg.swiglu.row_weight = sq.row_weight;
      gg.swiglu.limit = sq.limit;
      gg.swiglu.kperm64 = v.kperm64;
      const auto want = down(unfused, poison.size());
      for (int rep = 0; rep < 2; ++rep) {
        auto* fused = up(poison);
        gg.swiglu.out = fused;
        EXPECT_TRUE(cuda::grouped_mxfp4_rs_applies(gg));
        ASSERT_EQ(cuda::launch_grouped_mxfp4_gemm(gg, stream_), cuda::GroupedMxfp4Kernel::kWgmmaRs);
        const auto got = down(fused, poison.size());
        size_t diff = 0, unwritten = 0, stray = 0;
        for (int64_t r = 0; r < alloc_rows; ++r)
          for (int64_t col = 0; col < ldo; ++col) {
            const size_t i = static_cast<size_t>(r * ldo + col);
            diff += got[i] != want[i];
            if (r < total && col < c.n) {
              unwritten += want[i] == 0x7FC1;
            } else {
              stray += got[i] != 0x7FC1;
            }
          }
        EXPECT_EQ(diff, 0u) << "run " << rep;
        EXPECT_EQ(unwritten, 0u) << "the unfused output left elements unwritten";
        EXPECT_EQ(stray, 0u) << "padding or rows past the grouped count written, run " << rep;
      }
    }
  }
}

// A fused SwiGLU epilogue the swapped-operand kernel cannot take is refused as bad arguments
// (only that kernel has it), and grouped_mxfp4_rs_applies says so beforehand: rows_hint 3 (the
// skinny / table kernels), wgmma_rs off, no second weight set, y or y_b set, n % 32 != 0, kperm64
// with n % 64 != 0, ldo < n, ldo % 8 != 0, out not 16-byte aligned. On Hopper the launch they are
// variations of is taken.
TEST_F(CudaV41, GroupedMxfp4GemmRefusesSwigluOffTheSwappedKernel) {
  const int64_t n = 128, k = 256;
  const std::vector<int32_t> off = {0, 30, 30, 70};
  const int local = 3;
  cuda::GroupedMxfp4GemmParams ok = one_weight_launch(8, n, k, off, 40);
  ok.w_b = ok.w;
  ok.w_scale_b = ok.w_scale;
  ok.rows_hint = 192;
  ok.use_wgmma = true;
  ok.wgmma_rs = true;
  ok.a_rows = off[local];
  auto* out = up(std::vector<uint16_t>(static_cast<size_t>(off[local] * (n + 8)), 0));
  ok.swiglu.out = out;
  ok.swiglu.ldo = n;
  if (cuda::device_info(0).compute_major == 9) {
    EXPECT_TRUE(cuda::grouped_mxfp4_rs_applies(ok));
  }
  float* y = nans(static_cast<size_t>(off[local] * n));
  const std::vector<std::pair<const char*, std::function<void(cuda::GroupedMxfp4GemmParams&)>>>
      bad = {
          {"rows_hint 3", [](auto& p) { p.rows_hint = 3; }},
          {"wgmma_rs off", [](auto& p) { p.wgmma_rs = false; }},
          {"no w_b",
           [](auto& p) {
             p.w_b = nullptr;
             p.w_scale_b = nullptr;
           }},
          {"y set", [&](auto& p) { p.y = y; }},
          {"y_b set", [&](auto& p) { p.y_b = y; }},
          {"n % 32", [](auto& p) { p.n = 72; }},
          {"kperm64, n % 64", [](auto& p) {
             p.n = 96;
             p.swiglu.kperm64 = true;
           }},
          {"ldo < n", [](auto& p) { p.swiglu.ldo = n - 8; }},
          {"ldo % 8", [](auto& p) { p.swiglu.ldo = n + 4; }},
          {"out alignment", [&](auto& p) { p.swiglu.out = out + 4; }},
      };
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const auto& [name, spoil] : bad) {
    SCOPED_TRACE(name);
    cuda::GroupedMxfp4GemmParams gg = ok;
    spoil(gg);
    EXPECT_FALSE(cuda::grouped_mxfp4_rs_applies(gg));
    EXPECT_DEATH(cuda::launch_grouped_mxfp4_gemm(gg, stream_), "bad arguments");
  }
}

// GroupedMxfp4GemmParams::stream_k (the swapped-operand kernel's stream-K form: persistent CTAs
// over the concatenated K tiles of all units, cut units summed by their first CTA) against the
// CPU on random inputs with GroupedMxfp4GemmWgmma's tolerance (expect_grouped_output: 2e-5 of
// max |ref|, per expert too, rows past the grouped count untouched), on natural and k-permuted A
// (a_kperm), with one and two weight sets, for several grids (sk_ctas):
// - 1: a single CTA walks every unit whole (no cut): the per-unit kernel's bits exactly (the same
//   passes, K order and epilogue), which checks the schedule's unit order and pass shapes;
// - 7 with 3 experts (one without rows): units cut between CTAs, a head owning one or two
//   partials; 0 (the SM count) on the small shapes: more CTAs than units, so units spread over
//   several CTAs, some CTAs with no tiles at all; 0 on the decode shape (w1 + w3 N 2304 K 5120).
// Counts: every pass shape (64 / 128 / 192 rows), experts without rows, two passes (193 = 192 + 1,
// 300 = 192 + 108). Each grid runs three launches into NaN outputs: W, then the sets swapped (W_b
// as W), then W again; each matches its CPU reference, the first and third are bit-identical, and
// every flag is 0 after every launch (each launch resets what it raised; the workspace starts NaN,
// so a head reading a slot no partial wrote would show). The second launch of each grid sets
// sk_exit_empty (no effect with rows); a case without rows at all (max_rows a bound of 1, as the
// padded experts' overflow launches) leaves every output row untouched with and without it.
TEST_F(CudaV41, GroupedMxfp4GemmStreamK) {
  if (cuda::device_info(0).compute_major != 9)
    GTEST_SKIP() << "the wgmma kernels need sm_90a (Hopper); device is sm_"
                 << cuda::device_info(0).compute_major << cuda::device_info(0).compute_minor;
  struct Case {
    int64_t n, k;
    std::vector<int32_t> counts;
    std::vector<int> ctas;
  };
  for (const Case& c :
       {Case{264, 1024, {7, 0, 129, 193, 64, 300}, {1, 7, 13, 0}},
        Case{520, 2304, {150, 0, 200}, {1, 7, 0}}, Case{2304, 5120, {192, 5, 0, 70}, {0}},
        Case{264, 1024, {0, 0, 0}, {1, 0}}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " experts " +
                 std::to_string(c.counts.size()));
    std::mt19937 rng(static_cast<uint32_t>(17 + c.n + c.k));
    const int local = static_cast<int>(c.counts.size());
    std::vector<int32_t> off(static_cast<size_t>(local + 1), 0);
    for (int e = 0; e < local; ++e) off[e + 1] = off[e] + c.counts[static_cast<size_t>(e)];
    const int64_t total = off[local];
    const int64_t alloc_rows = total + 7;  // rows past the grouped count must stay untouched
    const auto [a, a16] = mxfp8_rows(alloc_rows, c.k, rng);
    const std::vector<uint16_t> a16p = kperm_rows(a16, alloc_rows, c.k, c.k);
    const Mxfp4Experts set[2] = {mxfp4_experts(off, c.n, c.k, a, rng),
                                 mxfp4_experts(off, c.n, c.k, a, rng)};
    const cuda::GroupedStreamKWorkspace most = cuda::grouped_mxfp4_stream_k_workspace(0);
    float* const ws = nans(static_cast<size_t>(most.floats));
    int32_t* const flags = up(std::vector<int32_t>(static_cast<size_t>(most.flags), 0));
    const size_t out = static_cast<size_t>(alloc_rows * c.n);
    for (const bool kperm : {false, true})
      for (const bool two : {false, true}) {
        SCOPED_TRACE(std::string(kperm ? "a_kperm" : "natural A") +
                     (two ? ", two weight sets" : ", one weight set"));
        cuda::GroupedMxfp4GemmParams gg;
        gg.a = up(kperm ? a16p : a16);
        gg.lda = c.k;
        gg.offsets = up(off);
        gg.num_experts = local;
        gg.max_rows = std::max(*std::max_element(c.counts.begin(), c.counts.end()), 1);
        gg.ldy = c.n;
        gg.n = c.n;
        gg.k = c.k;
        gg.rows_hint = 192;
        gg.use_wgmma = true;
        gg.wgmma_rs = true;
        gg.a_rows = alloc_rows;
        gg.a_kperm = kperm;
        const auto* const w_dev = up(set[0].wp);
        const auto* const s_dev = up(set[0].sp);
        const auto* const wb_dev = up(set[1].wp);
        const auto* const sb_dev = up(set[1].sp);
        // Launch with W = set `first` (and W_b = the other set with `two`): y, y_b.
        const auto launch = [&](int first, cuda::GroupedMxfp4Kernel want) {
          gg.w = first == 0 ? w_dev : wb_dev;
          gg.w_scale = first == 0 ? s_dev : sb_dev;
          gg.y = nans(out);
          if (two) {
            gg.w_b = first == 0 ? wb_dev : w_dev;
            gg.w_scale_b = first == 0 ? sb_dev : s_dev;
            gg.y_b = nans(out);
          }
          EXPECT_EQ(cuda::launch_grouped_mxfp4_gemm(gg, stream_), want);
          return std::pair{down(gg.y, out), two ? down(gg.y_b, out) : std::vector<float>{}};
        };
        const auto per_unit = launch(0, cuda::GroupedMxfp4Kernel::kWgmmaRs);
        gg.stream_k = true;
        gg.sk_workspace = ws;
        gg.sk_workspace_floats = most.floats;
        gg.sk_flags = flags;
        gg.sk_flag_count = most.flags;
        for (const int ctas : c.ctas) {
          SCOPED_TRACE("sk_ctas " + std::to_string(ctas));
          gg.sk_ctas = ctas;
          std::vector<std::pair<std::vector<float>, std::vector<float>>> runs;
          for (const int first : {0, 1, 0}) {
            gg.sk_exit_empty = runs.size() == 1;
            runs.push_back(launch(first, cuda::GroupedMxfp4Kernel::kWgmmaRsStreamK));
            const auto f = down(flags, static_cast<size_t>(most.flags));
            ASSERT_TRUE(std::all_of(f.begin(), f.end(), [](int32_t v) { return v == 0; }))
                << "flags left raised after a launch";
            const auto& [y, y_b] = runs.back();
            expect_grouped_output(y, set[first].ref, off, c.n);
            if (two) expect_grouped_output(y_b, set[1 - first].ref, off, c.n);
          }
          const auto same = [&](const std::vector<float>& x, const std::vector<float>& z) {
            return std::memcmp(x.data(), z.data(), out * sizeof(float)) == 0;
          };
          ASSERT_TRUE(same(runs[0].first, runs[2].first)) << "relaunch not bit-identical";
          ASSERT_TRUE(!two || same(runs[0].second, runs[2].second))
              << "relaunch not bit-identical (W_b)";
          if (ctas == 1) {
            EXPECT_TRUE(same(runs[0].first, per_unit.first))
                << "one CTA: not the per-unit kernel's bits";
            EXPECT_TRUE(!two || same(runs[0].second, per_unit.second))
                << "one CTA: not the per-unit kernel's bits (W_b)";
          }
        }
      }
  }
}

// stream_k is refused as bad arguments before any kernel is chosen (on any device) with the fused
// SwiGLU epilogue, with 224-row passes, without its workspace or flags or with either short of
// grouped_mxfp4_stream_k_workspace(sk_ctas), and with sk_ctas < 0 or past the SM count; the
// launch these spoil runs (on Hopper: the stream-K form) and matches the CPU.
TEST_F(CudaV41, GroupedMxfp4GemmStreamKRefusesBadArguments) {
  std::mt19937 rng(29);
  const int64_t n = 128, k = 256;
  const std::vector<int32_t> off = {0, 30, 30, 70};
  const int local = 3;
  const auto [a, a16] = mxfp8_rows(off[local], k, rng);
  const Mxfp4Experts ex = mxfp4_experts(off, n, k, a, rng);
  cuda::GroupedMxfp4GemmParams ok = grouped_launch(a16, off, ex, n, k, 40);
  ok.rows_hint = 192;
  ok.use_wgmma = true;
  ok.wgmma_rs = true;
  ok.a_rows = off[local];
  ok.stream_k = true;
  ok.sk_ctas = 5;
  const cuda::GroupedStreamKWorkspace need = cuda::grouped_mxfp4_stream_k_workspace(5);
  EXPECT_EQ(need.ctas, 5);
  ok.sk_workspace = nans(static_cast<size_t>(need.floats));
  ok.sk_workspace_floats = need.floats;
  ok.sk_flags = up(std::vector<int32_t>(static_cast<size_t>(need.flags), 0));
  ok.sk_flag_count = need.flags;
  ok.y = nans(static_cast<size_t>(off[local] * n));
  EXPECT_EQ(cuda::launch_grouped_mxfp4_gemm(ok, stream_),
            cuda::device_info(0).compute_major == 9 ? cuda::GroupedMxfp4Kernel::kWgmmaRsStreamK
                                                    : cuda::GroupedMxfp4Kernel::kTable);
  expect_grouped_output(down(ok.y, static_cast<size_t>(off[local] * n)), ex.ref, off, n);
  auto* swiglu_out = up(std::vector<uint16_t>(static_cast<size_t>(off[local] * n), 0));
  const int sms = cuda::grouped_mxfp4_stream_k_workspace(0).ctas;
  const std::vector<std::pair<const char*, std::function<void(cuda::GroupedMxfp4GemmParams&)>>>
      bad = {
          {"swiglu",
           [&](auto& p) {
             p.w_b = p.w;
             p.w_scale_b = p.w_scale;
             p.y = nullptr;
             p.swiglu.out = swiglu_out;
             p.swiglu.ldo = n;
           }},
          {"rs_max_pass 224", [](auto& p) { p.rs_max_pass = 224; }},
          {"no workspace", [](auto& p) { p.sk_workspace = nullptr; }},
          {"short workspace", [](auto& p) { --p.sk_workspace_floats; }},
          {"no flags", [](auto& p) { p.sk_flags = nullptr; }},
          {"short flags", [](auto& p) { --p.sk_flag_count; }},
          {"sk_ctas -1", [](auto& p) { p.sk_ctas = -1; }},
          {"sk_ctas past the SM count", [&](auto& p) { p.sk_ctas = sms + 1; }},
      };
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const auto& [name, spoil] : bad) {
    SCOPED_TRACE(name);
    cuda::GroupedMxfp4GemmParams gg = ok;
    spoil(gg);
    EXPECT_DEATH(cuda::launch_grouped_mxfp4_gemm(gg, stream_), "bad arguments");
  }
}

TEST_F(CudaV41, DequantFp8ToBf16IsExact) {
  std::mt19937 rng(23);
  const int64_t n = 70, k = 96;
  std::vector<uint8_t> w(static_cast<size_t>(n * k)), s(static_cast<size_t>(3 * 3));
  for (auto& b : w) {
    do b = static_cast<uint8_t>(rng());
    while ((b & 0x7F) == 0x7F);
  }
  for (auto& b : s) b = static_cast<uint8_t>(110 + rng() % 20);
  auto* o = up(std::vector<uint16_t>(static_cast<size_t>(n * k), 0x7FC0));
  cuda::launch_dequant_fp8_block_to_bf16(up(w), up(s), n, k, o, stream_);
  const auto got = bf16_bits_to_float(down(o, static_cast<size_t>(n * k)));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      ASSERT_EQ(got[static_cast<size_t>(r * k + c)],
                e4m3_to_float(w[static_cast<size_t>(r * k + c)]) *
                    ue8m0_to_float(s[static_cast<size_t>((r / 32) * 3 + c / 32)]))
          << r << "," << c;
}

// Programmatic dependent launch (cuda::set_programmatic_launch): a chain of small dependent
// kernels - RMSNorm, RoPE in place, the MXFP8 codes, the FP8 wgmma GEMM split over a 2-CTA runtime
// cluster (PDL and the cluster attribute in one launch), the clamped SwiGLU of the GEMM's output
// and the RoPE output back into the RMSNorm's input - iterated with no host sync, so every kernel
// reads what its predecessor wrote and overwrites what an earlier kernel read. With the switch on,
// eager and captured in a CUDA graph (programmatic edges), the final state equals the plain
// launches' bit for bit. A kernel that touches memory before its pdl_wait() races its predecessor
// (a race need not show on every run) and the difference carries through the chain.
TEST_F(CudaV41, ProgrammaticLaunchChainIsBitIdentical) {
  std::mt19937 rng(31);
  constexpr int64_t kRows = 6, kD = 256;  // 2 heads of 128 for the RoPE
  constexpr int kIters = 200, kGraphIters = 50;
  const auto x0 = rnd(kRows * kD, rng, -2, 2);
  const float* norm_w = up(rnd(kD, rng, 0.5f, 1.5f));
  const int32_t* pos = up(std::vector<int32_t>{3, 17, 100, 101, 4095, 65537});
  const double* freqs = up(main_freqs());
  std::vector<uint8_t> w(static_cast<size_t>(kD * kD));
  for (auto& b : w) b = float_to_e4m3(std::uniform_real_distribution<float>(-1, 1)(rng));
  const uint8_t* dw = up(w);
  const uint8_t* dws = up(std::vector<uint8_t>(static_cast<size_t>(kD / 32 * (kD / 32)), 123));
  // `iters` iterations of the chain from x0 with the switch as given, then the switch off (no
  // assertion in between: nothing returns early with the switch left on); graph: captured as one
  // graph of kGraphIters iterations, replayed. Returns x.
  const auto run = [&](bool pdl, bool graph) {
    float* x = up(x0);
    float* n = nans(static_cast<size_t>(kRows * kD));
    auto* codes = up(std::vector<uint8_t>(static_cast<size_t>(kRows * kD), 0));
    auto* scales = up(std::vector<uint8_t>(static_cast<size_t>(kRows * kD / 32), 0));
    float* y = nans(static_cast<size_t>(kRows * kD));
    const auto iteration = [&] {
      cuda::launch_rms_norm({x, norm_w, n, kRows, kD, kD, kD, 1e-6f}, stream_);
      cuda::launch_rope({n, kRows, kD, 2, kD / 2, kD / 2, 64, pos, freqs, false}, stream_);
      cuda::ActQuantParams q;
      q.x = n;
      q.ldx = kD;
      q.rows = kRows;
      q.cols = kD;
      q.out = codes;
      q.out_type = cuda::ActivationType::kMxfp8;
      q.ldo = kD;
      q.out_scale = scales;
      q.ldo_scale = kD / 32;
      cuda::launch_act_quant_mxfp8(q, stream_);
      cuda::Fp8WgmmaGemmParams g;
      g.a = codes;
      g.lda = kD;
      g.a_scale = scales;
      g.lda_scale = kD / 32;
      g.w = dw;
      g.w_scale = dws;
      g.y = y;
      g.ldy = kD;
      g.m = kRows;
      g.n = kD;
      g.k = kD;
      g.split_k = 2;
      cuda::launch_fp8_wgmma_gemm(g, stream_);
      cuda::launch_swiglu_clamped({y, kD, n, kD, x, kD, kRows, kD, 10.0f, nullptr}, stream_);
    };
    cuda::set_programmatic_launch(pdl);
    if (graph) {
      cuda::graph_capture_begin(stream_);
      for (int i = 0; i < kGraphIters; ++i) iteration();
      void* exec = cuda::graph_capture_end(stream_);
      for (int i = 0; i < kIters / kGraphIters; ++i) cuda::graph_launch(exec, stream_);
      backend_->synchronize();
      cuda::graph_destroy(exec);
    } else {
      for (int i = 0; i < kIters; ++i) iteration();
    }
    cuda::set_programmatic_launch(false);
    return down(x, static_cast<size_t>(kRows * kD));
  };
  const std::vector<float> plain = run(false, false);
  ASSERT_TRUE(std::all_of(plain.begin(), plain.end(), [](float v) { return std::isfinite(v); }));
  ASSERT_TRUE(std::any_of(plain.begin(), plain.end(), [](float v) { return v != 0.0f; }));
  for (bool graph : {false, true}) {
    const std::vector<float> pdl = run(true, graph);
    EXPECT_EQ(0, std::memcmp(plain.data(), pdl.data(), plain.size() * sizeof(float)))
        << (graph ? "graph" : "eager");
  }
  EXPECT_FALSE(cuda::programmatic_launch());
}

#endif  // MOESERVE_HAVE_CUDA

}  // namespace
}  // namespace moeserve

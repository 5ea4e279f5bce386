// cuda_ops_bench <out_dir>: times every CUDA op on V4.1 shapes with CUDA events (median of 20
// after 3 warm-ups, weights rotated over several copies so repeated runs do not live in L2) and
// sets each against its floor: max(bytes / HBM bandwidth, FLOPs / matrix rate), both ceilings
// measured in the same run (a 2 GiB device-to-device copy; cuBLASLt 8192^3 products on random
// data). Writes <out_dir>/cuda_ops_bench.{md,json} and prints the table. Not a test: a device tool.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_bench.h"
#include "backend/cuda/kernels.h"

namespace moeserve {
namespace {

enum class Rate { kNone, kF32, kBf16 };

struct Result {
  std::string op;
  std::string shape;
  double bytes = 0;
  double flops = 0;
  Rate rate = Rate::kNone;
  cuda::Timing timing;
};

class Bench {
 public:
  Bench() : backend_(make_cuda_backend(0)), stream_(cuda_backend_stream(*backend_)) {}

  // Device buffer filled with random data (never zeros).
  TensorView buffer(DType dtype, Shape shape, float lo = -1.0f, float hi = 1.0f) {
    buffers_.push_back(backend_->allocate(dtype, shape));
    const TensorView v = buffers_.back()->view();
    cuda::launch_fill_random({v.data(), dtype, v.numel(), ++seed_, lo, hi}, stream_);
    return v;
  }
  // Copies of a weight so that together they are >= 3x the L2 (at most 8).
  std::vector<TensorView> weights(DType dtype, Shape shape, float lo = -1.0f, float hi = 1.0f) {
    const double bytes = static_cast<double>(dtype_bytes(dtype, shape.numel()));
    const int copies = std::clamp(static_cast<int>(3.0 * 60e6 / bytes) + 1, 1, 8);
    std::vector<TensorView> out;
    for (int i = 0; i < copies; ++i) out.push_back(buffer(dtype, shape, lo, hi));
    return out;
  }
  void release() {
    backend_->synchronize();
    buffers_.clear();
  }

  Result run(std::string op, std::string shape, double bytes, double flops, Rate rate,
             const std::function<void(int)>& fn) {
    backend_->synchronize();
    Result r{std::move(op), std::move(shape),
             bytes,         flops,
             rate,          cuda::time_on_stream(fn, stream_, 3, 20)};
    std::printf("  %-28s %-24s %10.1f us\n", r.op.c_str(), r.shape.c_str(),
                r.timing.median_ms * 1e3);
    std::fflush(stdout);
    return r;
  }

  Backend& backend() { return *backend_; }
  void* stream() { return stream_; }

 private:
  std::unique_ptr<Backend> backend_;
  void* stream_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  uint64_t seed_ = 100;
};

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t v : d) {
    if (!s.empty()) s.push_back('x');
    s.append(std::to_string(v));
  }
  return s;
}

// Round 2: the V4.1 attention-side ops (kernels.h), decode (1-64 rows) and prefill (4096) shapes.
void run_v41_ops(Bench& b, std::vector<Result>& results) {
  auto* stream = b.stream();
  const auto positions = [&](int64_t n, int32_t first) {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = first + static_cast<int32_t>(i);
    auto v = b.buffer(DType::kI32, {n}, 0, 0);
    b.backend().copy_from_host(v, TensorView(pos.data(), DType::kI32, {n}));
    return v;
  };
  std::vector<double> fr(32);
  for (int i = 0; i < 32; ++i) fr[static_cast<size_t>(i)] = std::pow(1.6e5, -2.0 * i / 64);
  auto freqs = b.buffer(DType::kI64, {32}, 0, 0);
  b.backend().copy_from_host(freqs, TensorView(fr.data(), DType::kI64, {32}));
  const double* f = static_cast<const double*>(freqs.data());
  for (int64_t t : {64, 4096}) {
    auto q = b.buffer(DType::kF32, {t, 64, 512});
    auto pos = positions(t, 100000);
    results.push_back(b.run("rope (q, 64 heads, rd 64)", dims({t, 64, 64}), 2.0 * 4 * t * 64 * 64,
                            0, Rate::kNone, [&](int) {
                              cuda::launch_rope({q.data_as<float>(), t, 64 * 512, 64, 512, 512, 64,
                                                 pos.data_as<int32_t>(), f, false},
                                                stream);
                            }));
    auto g = b.buffer(DType::kF32, {t, 2304}, -12, 12);
    auto u = b.buffer(DType::kF32, {t, 2304}, -12, 12);
    auto o = b.buffer(DType::kF32, {t, 2304});
    results.push_back(
        b.run("swiglu clamped", dims({t, 2304}), 12.0 * t * 2304, 0, Rate::kNone, [&](int) {
          cuda::launch_swiglu_clamped({g.data_as<float>(), 2304, u.data_as<float>(), 2304,
                                       o.data_as<float>(), 2304, t, 2304, 10.0f, nullptr},
                                      stream);
        }));
    b.release();
  }
  // mHC: 384 rows = the decode bench step (64 sequences x 6 rows).
  for (int64_t t : {1, 64, 384, 4096}) {
    const int64_t d = 5120;
    // x and fn rotated over copies (>= 3x the L2 together) so that repeats read HBM.
    auto xs = b.weights(DType::kF32, {t, 4 * d});
    auto fns = b.weights(DType::kF32, {24, 4 * d}, -0.01f, 0.01f);
    const TensorView x = xs[0];
    auto base = b.buffer(DType::kF32, {24});
    auto scale = b.buffer(DType::kF32, {3});
    auto pre = b.buffer(DType::kF32, {t, 4});
    auto post = b.buffer(DType::kF32, {t, 4});
    auto comb = b.buffer(DType::kF32, {t, 16});
    auto y = b.buffer(DType::kF32, {t, d});
    auto a = b.buffer(DType::kF32, {t, d});
    results.push_back(
        b.run("hc mixes (+sinkhorn)", dims({t, 24, 4 * d}), 4.0 * (t * 4 * d + 24 * 4 * d),
              2.0 * t * 24 * 4 * d, Rate::kF32, [&](int i) {
                cuda::launch_hc_mixes(
                    {xs[static_cast<size_t>(i) % xs.size()].data_as<float>(), 4 * d, t, 4, d,
                     fns[static_cast<size_t>(i) % fns.size()].data_as<float>(),
                     base.data_as<float>(), scale.data_as<float>(), 1e-20f, 1e-6f, 20,
                     pre.data_as<float>(), post.data_as<float>(), comb.data_as<float>()},
                    stream);
              }));
    // The staged kernel's other tile heights at the decode step (the row above is the automatic
    // pick: 4 rows per thread at 384 rows).
    for (int rpt : {1, 2, 3}) {
      if (t != 384) break;
      results.push_back(b.run(
          "hc mixes (+sinkhorn), rows_per_thread " + std::to_string(rpt), dims({t, 24, 4 * d}),
          4.0 * (t * 4 * d + 24 * 4 * d), 2.0 * t * 24 * 4 * d, Rate::kF32, [&](int i) {
            cuda::HcMixesParams p{xs[static_cast<size_t>(i) % xs.size()].data_as<float>(),
                                  4 * d,
                                  t,
                                  4,
                                  d,
                                  fns[static_cast<size_t>(i) % fns.size()].data_as<float>(),
                                  base.data_as<float>(),
                                  scale.data_as<float>(),
                                  1e-20f,
                                  1e-6f,
                                  20,
                                  pre.data_as<float>(),
                                  post.data_as<float>(),
                                  comb.data_as<float>()};
            p.rows_per_thread = rpt;
            cuda::launch_hc_mixes(p, stream);
          }));
    }
    results.push_back(
        b.run("hc collapse", dims({t, 4, d}), 4.0 * 5 * t * d, 0, Rate::kNone, [&](int) {
          cuda::launch_hc_collapse(
              {x.data_as<float>(), t, 4, d, pre.data_as<float>(), y.data_as<float>()}, stream);
        }));
    results.push_back(
        b.run("hc expand (in place)", dims({t, 4, d}), 4.0 * 9 * t * d, 0, Rate::kNone, [&](int) {
          cuda::launch_hc_expand({x.data_as<float>(), y.data_as<float>(), t, 4, d,
                                  post.data_as<float>(), comb.data_as<float>()},
                                 stream);
        }));
    results.push_back(b.run("hc expand + collapse (fused)", dims({t, 4, d}), 4.0 * 10 * t * d, 0,
                            Rate::kNone, [&](int) {
                              cuda::launch_hc_expand(
                                  {x.data_as<float>(), y.data_as<float>(), t, 4, d,
                                   post.data_as<float>(), comb.data_as<float>(),
                                   pre.data_as<float>(), a.data_as<float>()},
                                  stream);
                            }));
    b.release();
  }
  // The compressor + FP4 cache appends of a decode step: 64 sequences x 6 rows (ratio 2, odd and
  // even start positions: 3 groups each), one launch each, against the per-sequence loop.
  {
    const int nseq = 64, per = 6, dim = 512, kdim = 128;
    const int64_t t = int64_t{nseq} * per, cap = 4096;
    auto kv = b.buffer(DType::kF32, {t, dim});
    auto gate = b.buffer(DType::kF32, {t, dim});
    auto skv = b.buffer(DType::kF32, {nseq, dim});
    auto sg = b.buffer(DType::kF32, {nseq, dim});
    auto nw = b.buffer(DType::kF32, {dim});
    std::vector<cuda::CompressorSeq> cs(nseq);
    std::vector<int64_t> entry;
    int64_t groups = 0, items = 0;
    for (int i = 0; i < nseq; ++i) {
      const int64_t start = 1000 + i;
      const int64_t g = (start + per) / 2 - start / 2;
      cs[static_cast<size_t>(i)] = {int64_t{i} * per, per, start, i, groups, items};
      items += cuda::compressor_items(start, per, 2);
      for (int64_t j = 0; j < g; ++j) entry.push_back(int64_t{i} * cap + start / 2 + j);
      groups += g;
    }
    auto dcs = b.buffer(DType::kI64, {nseq * 6}, 0, 0);
    b.backend().copy_from_host(dcs, TensorView(cs.data(), DType::kI64, {nseq * 6}));
    const auto ng = static_cast<int64_t>(entry.size());
    auto dentry = b.buffer(DType::kI64, {ng}, 0, 0);
    b.backend().copy_from_host(dentry, TensorView(entry.data(), DType::kI64, {ng}));
    auto lat = b.buffer(DType::kF32, {groups, dim});
    auto keys = b.buffer(DType::kF32, {groups, kdim});
    auto main_pool = b.buffer(DType::kU8, {nseq * cap * 288}, 0, 0);
    auto idx_pool = b.buffer(DType::kU8, {nseq * cap * 68}, 0, 0);
    const double comp_bytes = 4.0 * dim * (2.0 * t + groups + 2.0 * nseq);
    results.push_back(b.run(
        "compressor batch (ratio 2)", dims({nseq, per, dim}), comp_bytes, 0, Rate::kNone, [&](int) {
          cuda::launch_compressor_batch({kv.data_as<float>(), gate.data_as<float>(), dim, dim, 2,
                                         static_cast<const cuda::CompressorSeq*>(dcs.data()), nseq,
                                         items, skv.data_as<float>(), sg.data_as<float>(), dim,
                                         nw.data_as<float>(), 1e-20f, lat.data_as<float>()},
                                        stream);
        }));
    results.push_back(b.run("compressor per-sequence loop", dims({nseq, per, dim}), comp_bytes, 0,
                            Rate::kNone, [&](int) {
                              for (int i = 0; i < nseq; ++i) {
                                const cuda::CompressorSeq& q = cs[static_cast<size_t>(i)];
                                cuda::launch_compressor(
                                    {kv.data_as<float>() + q.row_begin * dim,
                                     gate.data_as<float>() + q.row_begin * dim, dim, per, dim, 2,
                                     q.start_pos, skv.data_as<float>() + int64_t{i} * dim,
                                     sg.data_as<float>() + int64_t{i} * dim, nw.data_as<float>(),
                                     1e-20f, lat.data_as<float>() + q.out_group * dim},
                                    stream);
                              }
                            }));
    cuda::Fp4ScatterWriteParams w;
    w.count = 2;
    w.entries = dentry.data_as<int64_t>();
    w.write[0] = {lat.data_as<float>(),         dim, groups, dim, cuda::Fp4Record::kMainBlock16E4m3,
                  main_pool.data_as<uint8_t>(), 0};
    w.write[1] = {
        keys.data_as<float>(),       kdim, groups, kdim, cuda::Fp4Record::kIndexBlock32Ue8m0,
        idx_pool.data_as<uint8_t>(), 0};
    results.push_back(b.run("fp4 scatter write (main+index)", dims({groups, dim + kdim}),
                            groups * (4.0 * (dim + kdim) + 288 + 68 + 8), 0, Rate::kNone,
                            [&](int) { cuda::launch_fp4_cache_scatter_write(w, stream); }));
    b.release();
  }
  for (int64_t t : {1, 4096}) {
    auto kv = b.buffer(DType::kF32, {t, 512});
    auto pos = positions(t, 7);
    auto ring = b.buffer(DType::kU8, {128 * 528}, 0, 0);
    auto cache = b.buffer(DType::kU8, {t * 288}, 0, 0);
    auto idx = b.buffer(DType::kU8, {t * 68}, 0, 0);
    auto kvi = b.buffer(DType::kF32, {t, 128});
    const int64_t written = std::min<int64_t>(t, 128);
    results.push_back(b.run("swa ring write fp8", dims({t, 512}), 2048.0 * t + 528.0 * written, 0,
                            Rate::kNone, [&](int) {
                              cuda::launch_swa_write_fp8(
                                  {kv.data_as<float>(), 512, t, 512, pos.data_as<int32_t>(),
                                   ring.data_as<uint8_t>(), 128},
                                  stream);
                            }));
    results.push_back(
        b.run("fp4 main entry write", dims({t, 512}), (2048.0 + 288) * t, 0, Rate::kNone, [&](int) {
          cuda::launch_fp4_cache_write(
              {kv.data_as<float>(), 512, t, 512, cuda::Fp4Record::kMainBlock16E4m3,
               cache.data_as<uint8_t>(), 0},
              stream);
        }));
    results.push_back(
        b.run("fp4 index key write", dims({t, 128}), (512.0 + 68) * t, 0, Rate::kNone, [&](int) {
          cuda::launch_fp4_cache_write(
              {kvi.data_as<float>(), 128, t, 128, cuda::Fp4Record::kIndexBlock32Ue8m0,
               idx.data_as<uint8_t>(), 0},
              stream);
        }));
    auto gate = b.buffer(DType::kF32, {t, 512});
    auto skv = b.buffer(DType::kF32, {512});
    auto sg = b.buffer(DType::kF32, {512});
    auto nw = b.buffer(DType::kF32, {512});
    auto lat = b.buffer(DType::kF32, {t, 512});
    results.push_back(b.run(
        "compressor ratio 2", dims({t, 512}), 4.0 * 512 * (2.5 * t + 1), 0, Rate::kNone, [&](int) {
          cuda::launch_compressor(
              {kv.data_as<float>(), gate.data_as<float>(), 512, t, 512, 2, 0, skv.data_as<float>(),
               sg.data_as<float>(), nw.data_as<float>(), 1e-20f, lat.data_as<float>()},
              stream);
        }));
    b.release();
  }
  // Indexer: decode over 64K / 512K keys (ratio 1), 64 rows over 16K keys.
  struct IdxCase {
    int64_t t, n;
  };
  for (IdxCase c : {IdxCase{1, 65536}, IdxCase{1, 524288}, IdxCase{64, 16384}}) {
    auto q = b.buffer(DType::kF32, {c.t, 32, 128});
    auto w = b.buffer(DType::kF32, {c.t, 32});
    auto keys = b.buffer(DType::kU8, {c.n * 68}, 100, 140);
    auto pos = positions(c.t, static_cast<int32_t>(c.n));
    auto s = b.buffer(DType::kF32, {c.t, c.n});
    results.push_back(b.run(
        "indexer scores (fp4 keys)", dims({c.t, c.n, 32, 128}), 68.0 * c.n + 4.0 * c.t * c.n,
        2.0 * c.t * c.n * 32 * 128, Rate::kBf16, [&](int) {
          cuda::launch_indexer_scores(
              {q.data_as<float>(), w.data_as<float>(), c.t, 32, 128, keys.data_as<uint8_t>(), c.n,
               pos.data_as<int32_t>(), 1, nullptr, 0, 0.0883883f, s.data_as<float>(), c.n},
              stream);
        }));
    b.release();
  }
  // Batched indexer (one launch per layer, FP4 queries: q_exact_bf16) on the decode shapes of the
  // forward bench: 64 sequences x 6 rows over 64K keys (ratio-2 layers) and 128K keys (layer 20),
  // Reindex rows over 16K candidates each; and a prefill chunk, 4096 rows x 16K keys.
  struct BatchCase {
    int64_t seqs, rows, keys;
    bool cand;
  };
  for (BatchCase c : {BatchCase{64, 6, 65536, false}, BatchCase{64, 6, 131072, false},
                      BatchCase{64, 6, 16384, true}, BatchCase{1, 4096, 16384, false}}) {
    const int64_t t = c.seqs * c.rows, pool = c.cand ? 131072 : c.keys;
    auto q = b.buffer(DType::kF32, {t, 32, 128});
    auto w = b.buffer(DType::kF32, {t, 32});
    auto keys = b.buffer(DType::kU8, {c.seqs * pool * 68}, 100, 140);
    auto pos = positions(t, 400000);
    std::vector<int64_t> desc;
    for (int64_t i = 0; i < c.seqs; ++i)
      desc.insert(desc.end(), {i * c.rows, c.rows, i * pool, pool});
    auto dseq = b.buffer(DType::kI64, {static_cast<int64_t>(desc.size())}, 0, 0);
    b.backend().copy_from_host(dseq, TensorView(desc.data(), DType::kI64, {dseq.numel()}));
    TensorView cand;
    if (c.cand) {
      // 2048 blocks of 8 consecutive entries per row.
      std::vector<int32_t> ids(static_cast<size_t>(t * c.keys));
      for (int64_t r = 0; r < t; ++r)
        for (int64_t i = 0; i < c.keys; ++i)
          ids[static_cast<size_t>(r * c.keys + i)] =
              static_cast<int32_t>(((i / 8) * 61 + r * 8) % (pool / 8) * 8 + i % 8);
      cand = b.buffer(DType::kI32, {t * c.keys}, 0, 0);
      b.backend().copy_from_host(cand, TensorView(ids.data(), DType::kI32, {cand.numel()}));
    }
    auto s = b.buffer(DType::kF32, {t, c.keys});
    const double key_bytes = 68.0 * (c.cand ? t : c.seqs) * c.keys;
    // Without candidates also the sm_90a warpgroup-MMA kernel (use_wgmma) on the same buffers,
    // on bf16 and on e4m3 operands (use_fp8; the random q rounds to e4m3, same work; the floor
    // stays the bf16 rate's, so e4m3 can pass 100%). With candidates the mma.sync kernel and the
    // e4m3 wgmma one (cand_wgmma; whole blocks: the pool's slots start on 16 bytes).
    for (const int variant : {0, 1, 2}) {
      const bool wg = variant >= 1, fp8 = variant == 2;
      if (c.cand && variant == 1) continue;
      const char* name = c.cand ? (fp8 ? "indexer batched, candidates (wgmma e4m3)"
                                       : "indexer batched, candidates")
                         : fp8  ? "indexer batched (fp4 q, wgmma e4m3)"
                         : wg   ? "indexer batched (fp4 q, wgmma)"
                                : "indexer batched (fp4 q)";
      results.push_back(b.run(name, dims({c.seqs, c.rows, c.keys, 32, 128}),
                              key_bytes + 4.0 * t * c.keys, 2.0 * t * c.keys * 32 * 128,
                              Rate::kBf16, [&](int) {
                                cuda::IndexerScoreParams p;
                                p.q = q.data_as<float>();
                                p.w = w.data_as<float>();
                                p.rows = t;
                                p.keys = keys.data_as<uint8_t>();
                                p.pos = pos.data_as<int32_t>();
                                p.ratio = 1;
                                p.candidates = c.cand ? cand.data_as<int32_t>() : nullptr;
                                p.n_cand = c.cand ? c.keys : 0;
                                p.scores = s.data_as<float>();
                                p.ld = c.keys;
                                p.n_seqs = static_cast<int>(c.seqs);
                                p.seqs = dseq.data_as<int64_t>();
                                p.max_seq_rows = c.rows;
                                p.max_seq_keys = pool;
                                p.q_exact_bf16 = true;
                                p.use_wgmma = wg;
                                p.use_fp8 = fp8;
                                p.cand_wgmma = c.cand && fp8;
                                cuda::launch_indexer_scores(p, stream);
                              }));
    }
    b.release();
  }
  // Top-k (same shapes as tools/device/topk_torch.py).
  struct TopkCase {
    int64_t rows, n;
    int k;
  };
  // 384 x 128K / 64K: the decode bench's 64 x 6 rows on layer 20 / the ratio-2 layers; 384 x 16K
  // k=2048: the candidate blocks (128K / 8) of layer 20.
  for (TopkCase c :
       {TopkCase{1, 65536, 512}, TopkCase{1, 1048576, 512}, TopkCase{64, 16384, 512},
        TopkCase{4096, 4096, 512}, TopkCase{1, 131072, 2048}, TopkCase{384, 131072, 512},
        TopkCase{384, 65536, 512}, TopkCase{384, 16384, 2048}}) {
    auto s = b.buffer(DType::kF32, {c.rows, c.n}, -10, 10);
    auto idx = b.buffer(DType::kI32, {c.rows, c.k}, 0, 0);
    auto val = b.buffer(DType::kF32, {c.rows, c.k});
    auto scratch = b.buffer(
        DType::kU8,
        {std::max<int64_t>(1, static_cast<int64_t>(cuda::topk_scratch_bytes(c.rows, c.n)))}, 0, 0);
    results.push_back(b.run("topk k=" + std::to_string(c.k), dims({c.rows, c.n}),
                            4.0 * c.rows * c.n, 0, Rate::kNone, [&](int) {
                              cuda::launch_topk({s.data_as<float>(), c.rows, c.n, c.n, c.k,
                                                 idx.data_as<int32_t>(), val.data_as<float>(),
                                                 nullptr, scratch.data()},
                                                stream);
                            }));
    b.release();
  }
  // Sparse attention: 128 SWA + 512 global keys per query.
  for (int64_t t : {1, 64, 512}) {
    auto q = b.buffer(DType::kF32, {t, 64, 512});
    auto ring = b.buffer(DType::kU8, {128 * 528}, 100, 140);
    auto glob = b.buffer(DType::kU8, {65536 * 288}, 100, 140);
    std::vector<int32_t> gi(static_cast<size_t>(t * 512));
    for (size_t i = 0; i < gi.size(); ++i) gi[i] = static_cast<int32_t>((i * 2654435761u) % 65536);
    auto gidx = b.buffer(DType::kI32, {t, 512}, 0, 0);
    b.backend().copy_from_host(gidx, TensorView(gi.data(), DType::kI32, {t, 512}));
    auto sink = b.buffer(DType::kF32, {64});
    auto pos = positions(t, 100000);
    auto o = b.buffer(DType::kF32, {t, 64, 512});
    cuda::SparseAttentionParams p;
    p.q = q.data_as<float>();
    p.rows = t;
    p.swa = ring.data_as<uint8_t>();
    p.glob = glob.data_as<uint8_t>();
    p.glob_idx = gidx.data_as<int32_t>();
    p.glob_k = 512;
    p.sink = sink.data_as<float>();
    p.pos = pos.data_as<int32_t>();
    p.freqs = f;
    p.out = o.data_as<float>();
    // use_wgmma: the warpgroup-MMA kernel (sm_90a only), next to the mma.sync rows.
    const bool hopper = cuda::device_info(0).compute_major == 9;
    for (bool wg : {false, true}) {
      if (wg && !hopper) continue;
      p.use_wgmma = wg;
      for (bool split : {true, false}) {
        p.split_precision = split;
        const std::string name = std::string("sparse attention 128+512 (") +
                                 (split ? "hi+lo" : "fp16") + (wg ? ", wgmma)" : ")");
        results.push_back(b.run(name, dims({t, 64, 640, 512}),
                                t * (128.0 * 528 + 512.0 * 288 + 2.0 * 4 * 64 * 512),
                                4.0 * t * 64 * 640 * 512, Rate::kBf16,
                                [&](int) { cuda::launch_sparse_attention(p, stream); }));
      }
    }
    b.release();
  }
  // Engram: 48 rows per token from pinned host memory (PCIe-bound: the HBM floor does not apply).
  {
    const int64_t rows = 1 << 22, t = 512, n = t * 48;
    cuda::PinnedHostBuffer codes = cuda::allocate_pinned_host(rows * 256, true);
    cuda::PinnedHostBuffer scales = cuda::allocate_pinned_host(rows * 8, true);
    std::memset(codes.host, 0x35, rows * 256);
    std::memset(scales.host, 127, rows * 8);
    std::printf("engram table memory: %s, granule %zu B\n",
                codes.cumem ? "cuMem HOST" : "cudaHostAlloc", codes.granule);
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int64_t>((i * 2654435761ull) % rows);
    auto dids = b.buffer(DType::kI64, {n}, 0, 0);
    b.backend().copy_from_host(dids, TensorView(ids.data(), DType::kI64, {n}));
    auto oc = b.buffer(DType::kU8, {n * 256}, 0, 0);
    auto os = b.buffer(DType::kU8, {n * 8}, 0, 0);
    auto e = b.buffer(DType::kF32, {n, 256});
    results.push_back(
        b.run(std::string("engram gather (host, ") + (codes.cumem ? "cuMem)" : "pinned)"),
              dims({t, 48, 264}), 264.0 * n, 0, Rate::kNone, [&](int) {
                cuda::launch_engram_gather(
                    {static_cast<const uint8_t*>(codes.device),
                     static_cast<const uint8_t*>(scales.device), 256, dids.data_as<int64_t>(), n,
                     oc.data_as<uint8_t>(), os.data_as<uint8_t>()},
                    stream);
              }));
    results.push_back(
        b.run("engram dequant", dims({n, 256}), (264.0 + 1024) * n, 0, Rate::kNone, [&](int) {
          cuda::launch_engram_dequant(
              {oc.data_as<uint8_t>(), os.data_as<uint8_t>(), 256, n, e.data_as<float>()}, stream);
        }));
    b.release();
    cuda::free_pinned_host(codes);
    cuda::free_pinned_host(scales);
    const int64_t d = 5120, tg = 64;
    auto x = b.buffer(DType::kF32, {tg, 4, d});
    auto kv = b.buffer(DType::kF32, {tg, 5 * d});
    auto wp = b.buffer(DType::kF32, {4, d});
    results.push_back(b.run("engram gate", dims({tg, 4, d}), 4.0 * tg * (4 * d * 3 + d) + 16.0 * d,
                            0, Rate::kNone, [&](int) {
                              cuda::launch_engram_gate(
                                  {x.data_as<float>(), kv.data_as<float>(), 5 * d,
                                   kv.data_as<float>() + 4 * d, 5 * d, wp.data_as<float>(), nullptr,
                                   tg, 4, d, 1e-20f, nullptr},
                                  stream);
                            }));
    b.release();
  }
  // Sampling (top-k 50, top-p 0.9) over the vocabulary.
  for (int64_t rows : {1, 64}) {
    const int64_t v = 129280;
    auto l = b.buffer(DType::kF32, {rows, v}, -10, 10);
    std::vector<uint64_t> sd(static_cast<size_t>(rows), 42);
    auto seeds = b.buffer(DType::kI64, {rows}, 0, 0);
    b.backend().copy_from_host(seeds, TensorView(sd.data(), DType::kI64, {rows}));
    auto out = b.buffer(DType::kI32, {rows}, 0, 0);
    auto scratch =
        b.buffer(DType::kU8, {static_cast<int64_t>(cuda::sample_scratch_bytes(rows, v, 50))}, 0, 0);
    results.push_back(b.run(
        "sample top-k 50 top-p 0.9", dims({rows, v}), 4.0 * rows * v, 0, Rate::kNone, [&](int) {
          cuda::launch_sample(
              {l.data_as<float>(), rows, v, v, 1.0f, 50, 0.9f,
               static_cast<const uint64_t*>(seeds.data()), out.data_as<int32_t>(), scratch.data()},
              stream);
        }));
    b.release();
  }
}

int run_bench(const std::string& out_dir) {
  const cuda::DeviceInfo info = cuda::device_info(0);
  std::printf("device: %s (sm_%d%d, %d SMs, L2 %lld MB, %lld GiB), driver %d, runtime %d\n",
              info.name.c_str(), info.compute_major, info.compute_minor, info.sm_count,
              static_cast<long long>(info.l2_bytes >> 20),
              static_cast<long long>(info.memory_bytes >> 30), info.driver_version,
              info.runtime_version);
  Bench b;
  const double hbm_gbs = cuda::measure_copy_bandwidth_gbs(size_t{2} << 30, b.stream());
  const double f32_tflops = cuda::measure_gemm_tflops(cuda::GemmPrecision::kF32, 8192, b.stream());
  const double tf32_tflops =
      cuda::measure_gemm_tflops(cuda::GemmPrecision::kTf32, 8192, b.stream());
  const double bf16_tflops =
      cuda::measure_gemm_tflops(cuda::GemmPrecision::kBf16, 8192, b.stream());
  std::printf(
      "ceilings: HBM copy %.0f GB/s (read+write); cuBLASLt 8192^3 fp32 %.1f, tf32 %.1f, bf16 %.1f "
      "TFLOP/s\n",
      hbm_gbs, f32_tflops, tf32_tflops, bf16_tflops);

  std::vector<Result> results;
  auto* stream = b.stream();

  // Backend GEMM (cuBLASLt fp32).
  for (int64_t m : {64, 4096}) {
    const int64_t n = 5120, k = 5120;
    auto a = b.buffer(DType::kF32, {m, k});
    auto ws = b.weights(DType::kF32, {n, k});
    auto c = b.buffer(DType::kF32, {m, n});
    results.push_back(
        b.run("gemm fp32 (cuBLASLt)", dims({m, n, k}), 4.0 * (m * k + n * k + m * n),
              2.0 * m * n * k, Rate::kF32, [&](int i) {
                b.backend().gemm({a, ws[static_cast<size_t>(i) % ws.size()], c, true});
              }));
    b.release();
  }
  {
    const int64_t rows = 4096, cols = 5120;
    auto x = b.buffer(DType::kF32, {rows, cols});
    auto w = b.buffer(DType::kF32, {cols});
    auto o = b.buffer(DType::kF32, {rows, cols});
    const double bytes = 8.0 * rows * cols;
    results.push_back(b.run("rms_norm", dims({rows, cols}), bytes, 0, Rate::kNone,
                            [&](int) { b.backend().rms_norm(x, w, 1e-6f, o); }));
    results.push_back(b.run("silu", dims({rows, cols}), bytes, 0, Rate::kNone,
                            [&](int) { b.backend().unary(UnaryOp::kSilu, x, o); }));
    results.push_back(b.run("add (row broadcast)", dims({rows, cols}), bytes, 0, Rate::kNone,
                            [&](int) { b.backend().binary(BinaryOp::kAdd, x, w, o); }));
    b.release();
  }
  {
    const int64_t rows = 64, cols = 129280;
    auto x = b.buffer(DType::kF32, {rows, cols}, -10, 10);
    auto o = b.buffer(DType::kF32, {rows, cols});
    results.push_back(b.run("softmax", dims({rows, cols}), 8.0 * rows * cols, 0, Rate::kNone,
                            [&](int) { b.backend().softmax(x, o); }));
    b.release();
  }

  // FP8 block-scaled GEMM (wq_b, wo_b at decode; a prefill-sized square).
  struct QCase {
    int64_t m, n, k;
    bool bf16;
  };
  for (QCase q : {QCase{64, 32768, 1280, true}, QCase{64, 5120, 8192, true},
                  QCase{4096, 5120, 5120, true}, QCase{4096, 5120, 5120, false}}) {
    auto x = b.buffer(q.bf16 ? DType::kBF16 : DType::kF32, {q.m, q.k});
    auto ws = b.weights(DType::kF8E4M3, {q.n, q.k});
    auto ss = b.weights(DType::kF8E8M0, {(q.n + 31) / 32, q.k / 32}, 120, 130);
    auto y = b.buffer(DType::kF32, {q.m, q.n});
    const double bytes =
        (q.bf16 ? 2.0 : 4.0) * q.m * q.k + 1.0 * q.n * q.k + q.n * q.k / 1024.0 + 4.0 * q.m * q.n;
    results.push_back(
        b.run(std::string("fp8 block gemm x") + (q.bf16 ? "bf16" : "f32"), dims({q.m, q.n, q.k}),
              bytes, 2.0 * q.m * q.n * q.k, Rate::kBf16, [&](int i) {
                const size_t r = static_cast<size_t>(i) % ws.size();
                cuda::launch_fp8_block_gemm(
                    {x.data(), q.bf16 ? cuda::ActivationType::kBF16 : cuda::ActivationType::kF32,
                     q.k, ws[r].data_as<uint8_t>(), ss[r % ss.size()].data_as<uint8_t>(),
                     y.data_as<float>(), q.n, q.m, q.n, q.k},
                    stream);
              }));
    b.release();
  }
  // MXFP4 expert GEMM (w1 of one expert: N=2304, K=5120).
  for (int64_t m : {32, 512, 4096}) {
    const int64_t n = 2304, k = 5120;
    auto x = b.buffer(DType::kBF16, {m, k});
    auto ws = b.weights(DType::kFp4E2m1, {n, k});
    auto ss = b.weights(DType::kF8E8M0, {n, k / 32}, 120, 130);
    auto y = b.buffer(DType::kF32, {m, n});
    const double bytes = 2.0 * m * k + n * k / 2.0 + n * k / 32.0 + 4.0 * m * n;
    results.push_back(
        b.run("mxfp4 gemm xbf16", dims({m, n, k}), bytes, 2.0 * m * n * k, Rate::kBf16, [&](int i) {
          const size_t r = static_cast<size_t>(i) % ws.size();
          cuda::launch_mxfp4_gemm(
              {x.data(), cuda::ActivationType::kBF16, k, ws[r].data_as<uint8_t>(),
               ss[r % ss.size()].data_as<uint8_t>(), y.data_as<float>(), n, m, n, k},
              stream);
        }));
    b.release();
  }
  // Grouped GEMM inputs: offsets of `local` experts with `per` rows each, and three copies of
  // random MXFP4 expert weights [n, k] as device pointer arrays ([w... , scale...]; copies rotate
  // so L2 does not hold the weights).
  const auto expert_offsets = [&](int64_t local, int64_t per) {
    std::vector<int32_t> off(static_cast<size_t>(local + 1));
    for (int64_t e = 0; e <= local; ++e) off[static_cast<size_t>(e)] = static_cast<int32_t>(e * per);
    auto doff = b.buffer(DType::kI32, {local + 1}, 0, 0);
    b.backend().copy_from_host(doff, TensorView(off.data(), DType::kI32, {local + 1}));
    return doff;
  };
  const auto expert_weight_copies = [&](int64_t local, int64_t n, int64_t k) {
    std::vector<TensorView> ptr_bufs;
    for (int cpy = 0; cpy < 3; ++cpy) {
      std::vector<const uint8_t*> w(static_cast<size_t>(local)), sc(static_cast<size_t>(local));
      for (int64_t e = 0; e < local; ++e) {
        w[static_cast<size_t>(e)] = b.buffer(DType::kFp4E2m1, {n, k}).data_as<uint8_t>();
        sc[static_cast<size_t>(e)] = b.buffer(DType::kF8E8M0, {n, k / 32}, 120, 130).data_as<uint8_t>();
      }
      w.insert(w.end(), sc.begin(), sc.end());
      auto pb = b.buffer(DType::kI64, {2 * local}, 0, 0);
      b.backend().copy_from_host(pb, TensorView(w.data(), DType::kI64, {2 * local}));
      ptr_bufs.push_back(pb);
    }
    return ptr_bufs;
  };
  // The forward's MoE path: MXFP8 activation quant, then the grouped MXFP4 GEMM over 12 local
  // experts with device-side row counts: 6 rows per expert (DEP32 decode share; the skinny
  // kernel) for w1 / w3 (N=2304, K=5120) and w2 (N=5120, K=2304), and 128 (prefill) for w1.
  // Decode is pure weight streaming (70.8 MB for w1): the table's GB/s and floor / measured
  // columns are its fraction of the measured HBM ceiling.
  for (const auto& [per, n, k] : {std::tuple{int64_t{6}, int64_t{2304}, int64_t{5120}},
                                  std::tuple{int64_t{6}, int64_t{5120}, int64_t{2304}},
                                  std::tuple{int64_t{128}, int64_t{2304}, int64_t{5120}}}) {
    const int64_t local = 12, m = per * local;
    auto xf = b.buffer(DType::kF32, {m, k});
    auto x = b.buffer(DType::kBF16, {m, k});
    results.push_back(b.run("act quant mxfp8 -> bf16", dims({m, k}), 6.0 * m * k, 0, Rate::kNone,
                            [&](int) {
                              cuda::ActQuantParams q;
                              q.x = xf.data_as<float>();
                              q.ldx = k;
                              q.rows = m;
                              q.cols = k;
                              q.out = x.data();
                              q.ldo = k;
                              cuda::launch_act_quant_mxfp8(q, stream);
                            }));
    const TensorView doff = expert_offsets(local, per);
    const std::vector<TensorView> ptr_bufs = expert_weight_copies(local, n, k);
    auto y = b.buffer(DType::kF32, {m, n});
    const double bytes = local * (n * k / 2.0 + n * k / 32.0) + 2.0 * m * k + 4.0 * m * n;
    results.push_back(b.run("grouped mxfp4 gemm (12 experts)", dims({m, n, k}), bytes,
                            2.0 * m * n * k, Rate::kBf16, [&](int i) {
                              const auto* ptr = static_cast<const uint8_t* const*>(
                                  ptr_bufs[static_cast<size_t>(i) % ptr_bufs.size()].data());
                              cuda::GroupedMxfp4GemmParams g;
                              g.a = x.data();
                              g.lda = k;
                              g.offsets = doff.data_as<int32_t>();
                              g.num_experts = static_cast<int>(local);
                              g.max_rows = per;
                              g.w = ptr;
                              g.w_scale = ptr + local;
                              g.y = y.data_as<float>();
                              g.ldy = n;
                              g.n = n;
                              g.k = k;
                              g.rows_hint = per;
                              cuda::launch_grouped_mxfp4_gemm(g, stream);
                            }));
    b.release();
  }
  // The same grouped GEMM at the DEP decode share of a 64 x 6 step over 32 ranks (~192 rows per
  // local expert; w1 / w3 and w2) and 128 rows, on the sm_90a wgmma kernel (use_wgmma; the row
  // is skipped off Hopper, where the flag falls back to the table kernel). Compare with the
  // table kernel's rows "grouped mxfp4 gemm (12 experts)" at the same dims.
  for (const auto& [per, n, k] : {std::tuple{int64_t{192}, int64_t{2304}, int64_t{5120}},
                                  std::tuple{int64_t{192}, int64_t{5120}, int64_t{2304}},
                                  std::tuple{int64_t{128}, int64_t{2304}, int64_t{5120}}}) {
    const int64_t local = 12, m = per * local;
    auto x = b.buffer(DType::kBF16, {m, k});
    const TensorView doff = expert_offsets(local, per);
    const std::vector<TensorView> ptr_bufs = expert_weight_copies(local, n, k);
    auto y = b.buffer(DType::kF32, {m, n});
    auto y2 = b.buffer(DType::kF32, {m, n});
    const double bytes = local * (n * k / 2.0 + n * k / 32.0) + 2.0 * m * k + 4.0 * m * n;
    // 0: table kernel, 1: wgmma (v1), 2: the swapped-operand wgmma kernel (wgmma_rs), 3: the same
    // with two weight sets in one launch (the forward's w1 + w3; twice the bytes of W and y and
    // twice the FLOPs), 4: the swapped-operand kernel reading A as k-permuted (a_kperm; A is
    // random, so only the decode differs; skipped where that kernel does not take the launch,
    // which would refuse a_kperm).
    for (const int variant : {0, 1, 2, 3, 4}) {
      static constexpr const char* kNames[] = {"grouped mxfp4 gemm (12 experts)",
                                               "grouped mxfp4 gemm wgmma (12 experts)",
                                               "grouped mxfp4 gemm wgmma rs (12 experts)",
                                               "grouped mxfp4 gemm wgmma rs w1+w3 (12 experts)",
                                               "grouped mxfp4 gemm wgmma rs kperm (12 experts)"};
      if (variant == 4) {
        cuda::GroupedMxfp4GemmParams probe;
        probe.a = x.data();
        probe.lda = k;
        probe.num_experts = static_cast<int>(local);
        probe.max_rows = per;
        probe.y = y.data_as<float>();
        probe.ldy = n;
        probe.n = n;
        probe.k = k;
        probe.rows_hint = per;
        probe.use_wgmma = probe.wgmma_rs = true;
        probe.a_rows = m;
        if (!cuda::grouped_mxfp4_rs_applies(probe)) continue;
      }
      const double f = variant == 3 ? 2.0 : 1.0;
      const double vbytes = bytes + (f - 1.0) * (local * (n * k / 2.0 + n * k / 32.0) + 4.0 * m * n);
      results.push_back(b.run(kNames[variant], dims({m, n, k}), vbytes, f * 2.0 * m * n * k,
                              Rate::kBf16, [&](int i) {
                                const auto pick = [&](int j) {
                                  return static_cast<const uint8_t* const*>(
                                      ptr_bufs[static_cast<size_t>(j) % ptr_bufs.size()].data());
                                };
                                const auto* ptr = pick(i);
                                cuda::GroupedMxfp4GemmParams g;
                                g.a = x.data();
                                g.lda = k;
                                g.offsets = doff.data_as<int32_t>();
                                g.num_experts = static_cast<int>(local);
                                g.max_rows = per;
                                g.w = ptr;
                                g.w_scale = ptr + local;
                                g.y = y.data_as<float>();
                                g.ldy = n;
                                g.n = n;
                                g.k = k;
                                g.rows_hint = per;
                                g.use_wgmma = variant > 0;
                                g.wgmma_rs = variant > 1;
                                g.a_rows = m;
                                g.a_kperm = variant == 4;
                                if (variant == 3) {
                                  g.w_b = pick(i + 1);
                                  g.w_scale_b = pick(i + 1) + local;
                                  g.y_b = y2.data_as<float>();
                                }
                                cuda::launch_grouped_mxfp4_gemm(g, stream);
                              }));
    }
    b.release();
  }
  // The dense FP8 linears as the forward runs them: the weight dequantised to bf16 at load,
  // cuBLASLt bf16 x bf16 -> fp32 (wq_b and wo_b at a 64 x 6 decode step; 1280x5120, 512x5120 and
  // the shared expert's 2304x5120 alongside, the fp8 wgmma GEMM's comparison points).
  const std::tuple<int64_t, int64_t> dense_shapes[] = {
      {32768, 1280}, {5120, 8192}, {1280, 5120}, {512, 5120}, {2304, 5120}};
  for (const auto& [n, k] : dense_shapes) {
    const int64_t m = 384;
    auto x = b.buffer(DType::kBF16, {m, k});
    auto ws = b.weights(DType::kBF16, {n, k});
    auto y = b.buffer(DType::kF32, {m, n});
    cuda::CublasLtGemm lt(stream);
    results.push_back(b.run("dense linear bf16 (cuBLASLt)", dims({m, n, k}),
                            2.0 * m * k + 2.0 * n * k + 4.0 * m * n, 2.0 * m * n * k, Rate::kBf16,
                            [&](int i) {
                              cuda::LtGemmParams g;
                              g.precision = cuda::GemmPrecision::kBf16F32;
                              g.a = x.data();
                              g.lda = k;
                              g.b = ws[static_cast<size_t>(i) % ws.size()].data();
                              g.ldb = k;
                              g.c = y.data();
                              g.ldc = n;
                              g.m = m;
                              g.n = n;
                              g.k = k;
                              lt.run(g);
                            }));
    b.release();
  }
  // The same linears as an FP8 x FP8 wgmma GEMM on MXFP8 activation codes (launch_fp8_wgmma_gemm):
  // half the operand bytes of bf16 and FP8 tensor cores; the TFLOP/s and floor columns are
  // against the measured bf16 ceiling (above 100% = faster than bf16 can be). Rows 64 (one
  // warpgroup per CTA), 384 and 1000.
  for (const int64_t m : {64, 384, 1000}) {
    for (const auto& [n, k] : dense_shapes) {
      auto a = b.buffer(DType::kF8E4M3, {m, k});
      auto as = b.buffer(DType::kF8E8M0, {m, k / 32}, 120, 130);
      auto ws = b.weights(DType::kF8E4M3, {n, k});
      auto ss = b.weights(DType::kF8E8M0, {n / 32, k / 32}, 120, 130);
      auto y = b.buffer(DType::kF32, {m, n});
      const double bytes = 1.0 * m * k + m * k / 32.0 + 1.0 * n * k + n * k / 1024.0 + 4.0 * m * n;
      results.push_back(b.run("dense linear fp8 wgmma", dims({m, n, k}), bytes, 2.0 * m * n * k,
                              Rate::kBf16, [&](int i) {
                                const size_t r = static_cast<size_t>(i) % ws.size();
                                cuda::Fp8WgmmaGemmParams g;
                                g.a = a.data_as<uint8_t>();
                                g.lda = k;
                                g.a_scale = as.data_as<uint8_t>();
                                g.lda_scale = k / 32;
                                g.w = ws[r].data_as<uint8_t>();
                                g.w_scale = ss[r % ss.size()].data_as<uint8_t>();
                                g.y = y.data_as<float>();
                                g.ldy = n;
                                g.m = m;
                                g.n = n;
                                g.k = k;
                                cuda::launch_fp8_wgmma_gemm(g, stream);
                              }));
      b.release();
    }
  }
  // Its A operand: fp32 activations -> e4m3 codes + ue8m0 scales.
  {
    const int64_t m = 384, k = 5120;
    auto xf = b.buffer(DType::kF32, {m, k});
    auto codes = b.buffer(DType::kF8E4M3, {m, k});
    auto scales = b.buffer(DType::kF8E8M0, {m, k / 32});
    results.push_back(b.run("act quant mxfp8 -> e4m3", dims({m, k}), 5.0 * m * k + m * k / 32.0, 0,
                            Rate::kNone, [&](int) {
                              cuda::ActQuantParams q;
                              q.x = xf.data_as<float>();
                              q.ldx = k;
                              q.rows = m;
                              q.cols = k;
                              q.out = codes.data();
                              q.out_type = cuda::ActivationType::kMxfp8;
                              q.ldo = k;
                              q.out_scale = scales.data_as<uint8_t>();
                              q.ldo_scale = k / 32;
                              cuda::launch_act_quant_mxfp8(q, stream);
                            }));
    b.release();
  }
  // Router (fused scores + top-6).
  for (int64_t t : {64, 512}) {
    const int64_t h = 5120, e = 384;
    auto x = b.buffer(DType::kF32, {t, h});
    auto w = b.buffer(DType::kF32, {e, h}, -0.05f, 0.05f);
    auto bias = b.buffer(DType::kF32, {e}, -0.1f, 0.1f);
    auto ids = b.buffer(DType::kI32, {t, 6}, 0, 0);
    auto wts = b.buffer(DType::kF32, {t, 6});
    results.push_back(b.run("moe router top6", dims({t, e, h}), 4.0 * (t * h + e * h + e + 12 * t),
                            2.0 * t * e * h, Rate::kF32, [&](int) {
                              cuda::launch_moe_router(
                                  {x.data_as<float>(), h, w.data_as<float>(), bias.data_as<float>(),
                                   t, h, e, 6, 1.0f, 1.5f, ids.data_as<int32_t>(),
                                   wts.data_as<float>()},
                                  stream);
                            }));
    b.release();
  }
  // Greedy sampling.
  for (int64_t rows : {64, 384}) {
    const int64_t v = 129280;
    auto logits = b.buffer(DType::kF32, {rows, v}, -10, 10);
    auto out = b.buffer(DType::kI32, {rows}, 0, 0);
    auto scratch = b.buffer(DType::kI64, {rows}, 0, 0);
    results.push_back(
        b.run("argmax (greedy)", dims({rows, v}), 4.0 * rows * v, 0, Rate::kNone, [&](int) {
          cuda::launch_argmax_rows({logits.data_as<float>(), rows, v, v, out.data_as<int32_t>(),
                                    static_cast<uint64_t*>(scratch.data())},
                                   stream);
        }));
    b.release();
  }

  run_v41_ops(b, results);

  // Table.
  std::string md = fmt::format(
      "device: {} (sm_{}{}, {} SMs, L2 {} MB), driver {}, runtime {}\n\n"
      "ceilings (measured in this run): HBM {:.0f} GB/s (2 GiB device-to-device copy, read+write); "
      "cuBLASLt 8192^3 on random data: fp32 {:.1f}, tf32 {:.1f}, bf16 {:.1f} TFLOP/s\n\n"
      "| op | shape | median us | GB/s | TFLOP/s | floor us | bound by | floor / measured |\n"
      "|---|---|---:|---:|---:|---:|---|---:|\n",
      info.name, info.compute_major, info.compute_minor, info.sm_count, info.l2_bytes >> 20,
      info.driver_version, info.runtime_version, hbm_gbs, f32_tflops, tf32_tflops, bf16_tflops);
  std::string json = fmt::format(
      "{{\n  \"device\": \"{}\", \"sm_count\": {}, \"driver\": {}, \"runtime\": {},\n"
      "  \"ceilings\": {{\"hbm_gbs\": {:.1f}, \"fp32_tflops\": {:.2f}, \"tf32_tflops\": {:.2f}, "
      "\"bf16_tflops\": {:.2f}}},\n"
      "  \"ops\": [\n",
      info.name, info.sm_count, info.driver_version, info.runtime_version, hbm_gbs, f32_tflops,
      tf32_tflops, bf16_tflops);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double s = r.timing.median_ms * 1e-3;
    const double mem_floor = r.bytes / (hbm_gbs * 1e9);
    const double rate = r.rate == Rate::kBf16 ? bf16_tflops : f32_tflops;
    const double flop_floor = r.rate == Rate::kNone ? 0.0 : r.flops / (rate * 1e12);
    const double floor = std::max(mem_floor, flop_floor);
    const char* bound =
        flop_floor > mem_floor ? (r.rate == Rate::kBf16 ? "bf16 MMA" : "fp32") : "HBM";
    md += fmt::format("| {} | {} | {:.1f} | {:.0f} | {:.2f} | {:.1f} | {} | {:.0f}% |\n", r.op,
                      r.shape, s * 1e6, r.bytes / s / 1e9, r.flops / s / 1e12, floor * 1e6, bound,
                      100.0 * floor / s);
    json += fmt::format(
        "    {{\"op\": \"{}\", \"shape\": \"{}\", \"median_us\": {:.2f}, \"min_us\": {:.2f}, "
        "\"bytes\": {:.0f}, "
        "\"flops\": {:.0f}, \"floor_us\": {:.2f}, \"bound\": \"{}\", \"fraction_of_floor\": "
        "{:.3f}}}{}\n",
        r.op, r.shape, s * 1e6, r.timing.min_ms * 1e3, r.bytes, r.flops, floor * 1e6, bound,
        floor / s, i + 1 < results.size() ? "," : "");
  }
  json += "  ]\n}\n";
  std::printf("\n%s", md.c_str());
  for (auto [name, text] :
       {std::pair{"cuda_ops_bench.md", &md}, std::pair{"cuda_ops_bench.json", &json}}) {
    const std::string path = out_dir + "/" + name;
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fputs(text->c_str(), f);
      std::fclose(f);
    } else {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  if (moeserve::cuda_device_count() == 0) {
    std::fprintf(stderr, "cuda_ops_bench: no CUDA device visible\n");
    return 2;
  }
  return moeserve::run_bench(argc > 1 ? argv[1] : ".");
}

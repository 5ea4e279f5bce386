#include "model/arch/deepseek_v41_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "backend/cpu/v41_ops.h"
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/device_runtime.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/model_glue.h"
#include "common/check.h"
#include "model/arch/weight_loader.h"
#include "model/engram_table.h"

namespace moeserve::arch {

namespace cu = moeserve::cuda;
using cu::DeviceMemory;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A linear [out, in] on the device in its checkpoint format.
struct Linear {
  enum class Kind : uint8_t { kNone, kFp8, kMxfp4, kF32 };
  Kind kind = Kind::kNone;
  DeviceMemory w, scale;
  // kFp8: the weight dequantised to bf16 [out, in] at load (exact), for the cuBLASLt bf16 GEMM.
  DeviceMemory wbf16;
  // kFp8 with GpuModelOptions::fp8_row_scaled (instead of wbf16): the weight refolded onto one
  // scale per row (launch_fold_fp8_block_rows): e4m3 [out, in] and fp32 [out].
  DeviceMemory w8r, w8r_scale;
  int64_t out = 0, in = 0;
  // The checkpoint weight is FP8 or MXFP4: the input rows get the MXFP8 fake-quant first
  // (model.md §5 [UNCERTAIN]: MXFP8, block 32), also when the weight is held as fp32.
  bool act_quant = false;

  // Bytes the roofline counts: the checkpoint format (FP8 / MXFP4 + scales), not the bf16 copy.
  [[nodiscard]] double bytes() const { return static_cast<double>(w.bytes() + scale.bytes()); }
};

struct Ffn {
  Linear w1, w3, w2;
};

struct Layer {
  int32_t id = 0;
  DeviceMemory hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  DeviceMemory attn_norm, ffn_norm, q_norm, kv_norm, sink;
  Linear wq_a, wq_b, wkv, wo_a, wo_b;
  Linear comp_wkv, comp_wgate, idx_wk, idx_wq_b, idx_wproj;
  DeviceMemory comp_norm, idx_knorm;
  DeviceMemory gate, bias, bias_vl;  // fp32 router
  // GpuModelOptions::router_split_tf32: the gate's split-TF32 operand [w_hi | w_lo | w_hi]
  // ([experts, 3 hidden]); empty: the router runs the exact fp32 GEMM on gate.
  DeviceMemory gate_split;
  std::vector<Ffn> experts;          // local experts
  Ffn shared;
  // GpuModelOptions::fuse_shared_w13: [shared.w1; shared.w3] as one linear (out 2 * inter, w1's
  // rows then w3's). Set: shared.w1 / w3 keep their shapes and kinds but no device memory.
  Linear shared_w13;
  // GpuModelOptions::fuse_qkv_a: [wq_a; wkv] (out q_lora_rank + head_dim), as shared_w13.
  Linear wqkv_a;
  // Device arrays of the local experts' MXFP4 pointers: w1, w1 scale, w3, w3 scale, w2, w2 scale
  // ([6][local]); the last forward's grouped offsets [local + 1] (read back for the cost).
  DeviceMemory expert_ptrs, moe_offsets;
  // GpuModelOptions::moe_fp8: each local expert's w1, w3, w2 row references
  // (launch_mxfp4_row_ref) and the device array of pointers to them [w1 x local, w3, w2].
  DeviceMemory expert_refs, expert_ref_ptrs;
  // GpuModelOptions::moe_padded_fp8: the local experts' refolded e4m3 weights (launch_fold_mxfp4_
  // rows) and their row scales: w13 [local][2 inter][hidden] (w1's rows, then w3's), w2
  // [local][hidden][inter]; built at the first forward that takes the path.
  DeviceMemory pf8_w13, pf8_s13, pf8_w2, pf8_s2;
  // The last forward's overflow offsets [local + 1] and slot rows C (0: the path not taken).
  DeviceMemory moe_ov_offsets;
  int64_t moe_slot_rows = 0;
  // Engram
  Linear engram_wkv;
  DeviceMemory engram_qk;
  cu::PinnedHostBuffer engram_codes, engram_scales;
  int64_t engram_rows = 0;
  // caches
  DeviceMemory swa_pool;  // [max_seqs * window + max_rows records]
  DeviceMemory main_pool, index_pool;
  int64_t cap = 0;  // global entries per slot
  DeviceMemory part_kv, part_gate;
};

struct Sequence {
  bool live = false;
  int32_t num_tokens = 0;
  int32_t replay_start = 0;
  EngramHistory history;
  std::vector<int64_t> entries;  // per backbone layer (KV sources only)
  // DSpark context rings: the committed positions [max(ds_begin, ds_end - window), ds_end) are in
  // every draft stage's ring (slot seq * window + p % window of the stage's swa_pool).
  int32_t ds_begin = 0, ds_end = 0;
};

// A piece of the forward's metadata blob (Impl::meta_dev + off once uploaded): `base` points
// at the blob's device address, which is known only after the plan is complete.
struct MetaPtr {
  uint8_t* const* base = nullptr;
  size_t off = 0;
  template <typename T = void>
  [[nodiscard]] T* as() const {
    return reinterpret_cast<T*>(*base + off);
  }
};

// The rows being computed and their per-row device metadata.
struct RowSet {
  std::vector<int32_t> begin, rows, first_pos;  // per input
  std::vector<int32_t> src_row;                 // per row: row in the full chunk list
  int64_t n = 0;
  MetaPtr pos, ring_dst, row_slot, image;
  MetaPtr row_first, row_floor;  // per row: its chunk's first position, its SWA replay floor
  int32_t* swa_idx = nullptr;    // [n, window] SWA sources (launch_swa_index, at launch time)
  bool any_image = false;
};

// One compressor layer's share of a forward, planned on the host: per input ceil(rows / ratio)
// group slots (the most a chunk of `rows` can complete; slots past the completed groups have
// entry -1 and are not written) and max(that, 1) compressor items, so the launch shapes depend
// on the row counts only, never on the positions (a decode graph stays valid step to step).
struct CompressPlan {
  int64_t items = 0, groups = 0;
  MetaPtr blob;  // [CompressorSeq per input | cache entry per group slot | positions (int32)]
};

// One index-source layer's selection, planned on the host: width = score columns (the longest
// sequence's entries rounded up to kWidthBucket; -inf past each row's visible keys).
struct SelectPlan {
  int64_t width = 0;
  int n_seqs = 0;
  int64_t max_rows = 0;
  MetaPtr seqs;  // [n_seqs, 4]: first row, rows, first pool record, keys
};
constexpr int64_t kWidthBucket = 512;
// int64 words of one CompressorSeq in a compressor plan's blob.
constexpr size_t kSeqWords = sizeof(cu::CompressorSeq) / sizeof(int64_t);
// Decode-shaped forwards (every input at most this many rows) run as CUDA graphs.
constexpr int64_t kGraphMaxRowsPerInput = 16;

}  // namespace

const char* gpu_component_name(GpuComponent c) {
  switch (c) {
    case GpuComponent::kMoe:
      return "moe";
    case GpuComponent::kDense:
      return "dense_proj";
    case GpuComponent::kAttention:
      return "attention";
    case GpuComponent::kIndexer:
      return "indexer_topk";
    case GpuComponent::kMhc:
      return "mhc";
    case GpuComponent::kEngram:
      return "engram";
    case GpuComponent::kSampling:
      return "sampling";
    case GpuComponent::kOther:
      return "other";
    case GpuComponent::kCount:
      break;
  }
  return "?";
}

std::vector<int32_t> subsample_layers(const ModelConfig& c, int32_t count) {
  const int32_t total = c.num_hidden_layers;
  std::vector<uint8_t> keep(static_cast<size_t>(total), 0);
  if (count <= 0 || count >= total) {
    std::fill(keep.begin(), keep.end(), 1);
  } else {
    for (int32_t i = 0; i < count; ++i)
      keep[static_cast<size_t>(static_cast<int64_t>(i) * total / count)] = 1;
  }
  // Owners: KV owner, index owner and (for Reindex) the candidate source; to a fixed point.
  bool changed = true;
  while (changed) {
    changed = false;
    for (int32_t l = 0; l < total; ++l) {
      if (!keep[static_cast<size_t>(l)]) continue;
      const LayerInfo& info = c.layer(l);
      for (int32_t o : {info.kv_owner, info.index_owner,
                        info.mode == LayerMode::kReindex ? c.candidate_source_layer_id : -1})
        if (o >= 0 && !keep[static_cast<size_t>(o)]) {
          keep[static_cast<size_t>(o)] = 1;
          changed = true;
        }
    }
  }
  std::vector<int32_t> out;
  for (int32_t l = 0; l < total; ++l)
    if (keep[static_cast<size_t>(l)]) out.push_back(l);
  return out;
}

struct DeepseekV41Gpu::Impl {
  ModelConfig c;
  GpuModelOptions opt;
  std::vector<int32_t> layer_ids;
  std::vector<std::unique_ptr<Layer>> layers;  // by layer id (null: not kept); draft stages last
  DeviceMemory embed, head, norm;
  // DSpark (opt.dspark): stage layer ids num_hidden_layers + s, and the draft's own tensors.
  std::vector<int32_t> draft_ids;
  Linear ds_main_proj;
  DeviceMemory ds_main_norm, ds_norm, ds_markov_embed, ds_markov_head, ds_conf;
  DeviceMemory tap_pre;  // [max_rows, HC] of 1 / HC: collapse() with it is the streams' mean
  DeviceMemory freqs_main, freqs_compress;
  DeviceMemory iota;
  void* stream = nullptr;
  std::unique_ptr<cu::CublasLtGemm> lt;
  // The second stream of moe_shared_overlap, its cuBLASLt, and the fork / join events.
  void* side_stream = nullptr;
  // moe_overflow_graph_if: the stream the IF node's body is captured from.
  void* if_stream = nullptr;
  std::unique_ptr<cu::CublasLtGemm> side_lt;
  void* ev_fork = nullptr;
  void* ev_join = nullptr;
  // moe_overflow_side_stream: the slot plan is done (main stream) / the overflow is done (side).
  void* ev_plan = nullptr;
  void* ev_ov = nullptr;
  // moe_quant_once with the side stream: f's FP8 codes are ready (side stream).
  void* ev_quant = nullptr;
  EngramTokenMap token_map;
  bool random_weights = false;
  std::mt19937_64 rng{1234};
  std::vector<Sequence> seqs;
  // Per input of the last forward: where its taps rows are in the "taps" buffer (rows 0: none).
  struct TapRows {
    int32_t seq = -1, begin = 0, first_pos = 0, rows = 0;
  };
  std::vector<TapRows> last_taps;
  size_t weight_bytes = 0, cache_bytes = 0;
  GpuForwardCost cost;
  GpuForwardTrace trace;
  std::vector<int32_t> moe_layers_run;  // layers whose grouped MoE ran in this forward
  // moe_stream_k's workspace (GroupedMxfp4GemmParams::sk_workspace, sk_flags), shared by every
  // grouped launch (stream-ordered on `stream`): allocated at the first, the flags zeroed once
  // (every launch leaves them 0).
  DeviceMemory moe_sk_workspace, moe_sk_flags;
  void use_stream_k(cu::GroupedMxfp4GemmParams& g) {
    if (moe_sk_flags.bytes() == 0) {
      const cu::GroupedStreamKWorkspace need = cu::grouped_mxfp4_stream_k_workspace(0);
      moe_sk_workspace = DeviceMemory(static_cast<size_t>(need.floats) * sizeof(float));
      moe_sk_flags = DeviceMemory(static_cast<size_t>(need.flags) * sizeof(int32_t));
      cu::memset_async(moe_sk_flags.as(), 0, moe_sk_flags.bytes(), stream);
    }
    g.stream_k = true;
    g.sk_workspace = moe_sk_workspace.as<float>();
    g.sk_workspace_floats = static_cast<int64_t>(moe_sk_workspace.bytes() / sizeof(float));
    g.sk_flags = moe_sk_flags.as<int32_t>();
    g.sk_flag_count = static_cast<int64_t>(moe_sk_flags.bytes() / sizeof(int32_t));
  }

  // The grouped MoE's share of the cost, from the offsets it left on the device (after the
  // forward's final sync): the weights of every local expert with hits, and their FLOPs.
  void add_grouped_moe_cost() {
    const double d = static_cast<double>(c.hidden_size);
    const double inter = static_cast<double>(c.moe_intermediate_size);
    for (int32_t l : moe_layers_run) {
      const Layer& L = *layers[static_cast<size_t>(l)];
      if (L.experts.empty() || L.experts.front().w1.kind == Linear::Kind::kF32) continue;
      std::vector<int32_t> off(L.experts.size() + 1);
      int32_t ov = 0;
      cu::copy_d2h(off.data(), L.moe_offsets.as<int32_t>(), off.size() * 4, stream);
      if (L.moe_slot_rows > 0)
        cu::copy_d2h(&ov, L.moe_ov_offsets.as<int32_t>() + L.experts.size(), 4, stream);
      cu::stream_synchronize(stream);
      cost.moe_rows += off.back();
      if (L.moe_slot_rows > 0) {
        cost.moe_overflow_rows += ov;
        cost.moe_slot_rows += static_cast<double>(L.moe_slot_rows) * static_cast<double>(L.experts.size());
      }
      for (size_t ex = 0; ex < L.experts.size(); ++ex) {
        const int32_t cnt = off[ex + 1] - off[ex];
        if (cnt == 0) continue;
        const Ffn& w = L.experts[ex];
        cost.weight_bytes += w.w1.bytes() + w.w3.bytes() + w.w2.bytes();
        cost.flops += 2.0 * cnt * 3.0 * d * inter;
        cost.fp8_flops += 2.0 * cnt * 3.0 * d * inter;
      }
    }
    moe_layers_run.clear();
  }
  void trace_rows(std::map<int32_t, std::vector<float>>& m, int32_t l, const float* p,
                  int64_t count) {
    std::vector<float>& v = m[l];
    v.resize(static_cast<size_t>(count));
    cu::copy_d2h(v.data(), p, v.size() * 4, stream);
    cu::stream_synchronize(stream);
  }

  // Grow-only scratch buffers, by name. ws_gen counts reallocations: a captured graph holds the
  // addresses of its time and is dropped once it changes.
  std::map<std::string, DeviceMemory> ws;
  uint64_t ws_gen = 0;
  template <typename T>
  T* buf(const std::string& name, int64_t count) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    DeviceMemory& m = ws[name];
    if (m.bytes() < bytes) {
      m = DeviceMemory(bytes);
      ++ws_gen;
    }
    return m.as<T>();
  }

  // The forward's metadata (row positions, SWA slots, compressor and indexer descriptors, Engram
  // ids, ...): planned on the host into meta_host, uploaded in one copy (through a pinned
  // staging buffer) before any kernel runs, read by the kernels at fixed offsets. A graph replay
  // needs only this upload.
  std::vector<uint8_t> meta_host;
  uint8_t* meta_dev = nullptr;
  cu::PinnedHostBuffer meta_pinned;
  template <typename T>
  MetaPtr meta_put(const T* data, size_t count) {
    const size_t off = (meta_host.size() + 255) / 256 * 256;
    meta_host.resize(off + std::max<size_t>(count * sizeof(T), 1), 0);
    if (count > 0) std::memcpy(meta_host.data() + off, data, count * sizeof(T));
    return MetaPtr{&meta_dev, off};
  }
  template <typename T>
  MetaPtr meta_put(const std::vector<T>& v) {
    return meta_put(v.data(), v.size());
  }
  void meta_upload() {
    const size_t bytes = std::max<size_t>(meta_host.size(), 1);
    if (meta_pinned.bytes < bytes) {
      if (meta_pinned.bytes > 0) cu::free_pinned_host(meta_pinned);
      meta_pinned = cu::allocate_pinned_host(std::max(bytes, meta_pinned.bytes * 2), false);
    }
    std::memcpy(meta_pinned.host, meta_host.data(), meta_host.size());
    meta_dev = buf<uint8_t>("meta", static_cast<int64_t>(bytes));
    cu::copy_h2d(meta_dev, meta_pinned.host, meta_host.size(), stream);
  }

  // Captured decode graphs by launch shape (GraphKey). A shape seen for the first time runs
  // eagerly (it grows the scratch buffers, builds the cuBLASLt plans and sets kernel
  // attributes); the second time it is captured and launched, afterwards replayed.
  struct GraphEntry {
    void* exec = nullptr;
    uint64_t gen = 0;
    GpuForwardCost static_cost;       // the cost the launches add (the plan adds the rest)
    std::vector<int32_t> moe_layers;  // for add_grouped_moe_cost
    uint64_t last_use = 0;            // graph_clock at the last replay (LRU eviction)
  };
  std::map<std::vector<int64_t>, GraphEntry> graphs;
  std::map<std::vector<int64_t>, int> graph_seen;
  int64_t graph_replays = 0, graph_captures = 0;
  // The DSpark draft cycle's graphs (dspark_draft) share `graphs` (keys led by kDraftGraphTag)
  // and the LRU bound; counted apart.
  int64_t draft_graph_replays = 0, draft_graph_captures = 0;
  static constexpr int64_t kDraftGraphTag = -2;
  // The draft's host arrays, packed (ds_put) and uploaded in one copy through a pinned staging
  // buffer to the fixed device buffer "ds_meta" before its launches (eager, capture or replay).
  std::vector<uint8_t> ds_host;
  cu::PinnedHostBuffer ds_pinned;
  template <typename T>
  size_t ds_put(const std::vector<T>& v) {
    const size_t off = (ds_host.size() + 255) / 256 * 256;
    ds_host.resize(off + std::max<size_t>(v.size() * sizeof(T), 1), 0);
    if (!v.empty()) std::memcpy(ds_host.data() + off, v.data(), v.size() * sizeof(T));
    return off;
  }
  uint8_t* ds_upload() {
    const size_t bytes = std::max<size_t>(ds_host.size(), 1);
    if (ds_pinned.bytes < bytes) {
      if (ds_pinned.bytes > 0) cu::free_pinned_host(ds_pinned);
      ds_pinned = cu::allocate_pinned_host(std::max(bytes, ds_pinned.bytes * 2), false);
    }
    std::memcpy(ds_pinned.host, ds_host.data(), ds_host.size());
    uint8_t* dev = buf<uint8_t>("ds_meta", static_cast<int64_t>(bytes));
    cu::copy_h2d(dev, ds_pinned.host, ds_host.size(), stream);
    return dev;
  }
  uint64_t graph_clock = 0;
  // Keeps at most opt.max_cuda_graphs graphs: the least recently replayed one goes first. The
  // shapes seen once are forgotten past a bound too (a long-running server sees many shapes).
  void make_room_for_graph() {
    while (!graphs.empty() && static_cast<int64_t>(graphs.size()) >= std::max(opt.max_cuda_graphs, 1)) {
      auto lru = graphs.begin();
      for (auto it = graphs.begin(); it != graphs.end(); ++it)
        if (it->second.last_use < lru->second.last_use) lru = it;
      cu::graph_destroy(lru->second.exec);
      graphs.erase(lru);
    }
    if (graph_seen.size() > 4096) graph_seen.clear();
  }
  void drop_graphs() {
    for (auto& [k, g] : graphs) cu::graph_destroy(g.exec);
    graphs.clear();
  }
  // Runs `launch` through the graph cache under `key` (forward() and dspark_draft()): replays the
  // key's graph (restoring the cost and MoE layers its capture recorded), or on the key's second
  // sight captures and launches it; kEager: nothing ran, the caller launches eagerly (first
  // sight, or a scratch buffer moved during the capture so the graph may hold a freed address:
  // it is dropped, and the next sight captures again). Graphs from before a buffer move are
  // dropped first (ws_gen).
  enum class GraphRun { kEager, kReplayed, kCaptured };
  template <typename Launch>
  GraphRun run_graph(const std::vector<int64_t>& key, Launch&& launch) {
    auto it = graphs.find(key);
    if (it != graphs.end() && it->second.gen != ws_gen) {
      drop_graphs();
      it = graphs.end();
    }
    if (it != graphs.end()) {
      it->second.last_use = ++graph_clock;
      cu::graph_launch(it->second.exec, stream);
      cost = it->second.static_cost;
      moe_layers_run = it->second.moe_layers;
      return GraphRun::kReplayed;
    }
    if (graph_seen[key]++ == 0) return GraphRun::kEager;
    const uint64_t gen = ws_gen;
    cu::graph_capture_begin(stream);
    launch();
    void* exec = cu::graph_capture_end(stream);
    if (gen != ws_gen) {
      cu::graph_destroy(exec);
      cost = GpuForwardCost{};
      moe_layers_run.clear();
      return GraphRun::kEager;
    }
    make_room_for_graph();
    GraphEntry g;
    g.exec = exec;
    g.gen = ws_gen;
    g.last_use = ++graph_clock;
    g.static_cost = cost;
    g.moe_layers = moe_layers_run;
    graphs[key] = std::move(g);
    cu::graph_launch(exec, stream);
    return GraphRun::kCaptured;
  }

  // Profiling: an event at every component switch, and at every switch between the named parts
  // of a component (mark's `part`: "w13" of the MoE is part "moe.w13"; none: "moe.other").
  // Each interval counts for the component and the part its opening mark names.
  struct Mark {
    GpuComponent comp;
    const char* part;  // a string literal or nullptr
    void* event;
  };
  std::vector<Mark> marks;
  std::vector<void*> event_pool;
  size_t events_used = 0;
  std::array<double, kNumGpuComponents> comp_ms{};
  std::map<std::string, double> part_ms;
  void mark(GpuComponent comp, const char* part = nullptr) {
    if (!opt.profile) return;
    if (events_used == event_pool.size()) event_pool.push_back(cu::event_create());
    void* e = event_pool[events_used++];
    cu::event_record(e, stream);
    marks.push_back({comp, part, e});
  }
  void flush_profile() {
    if (!opt.profile || marks.empty()) return;
    cu::event_synchronize(marks.back().event);
    for (size_t i = 0; i + 1 < marks.size(); ++i) {
      const Mark& m = marks[i];
      const double ms = cu::event_elapsed_ms(m.event, marks[i + 1].event);
      comp_ms[static_cast<size_t>(m.comp)] += ms;
      part_ms[fmt::format("{}.{}", gpu_component_name(m.comp), m.part ? m.part : "other")] += ms;
    }
    marks.clear();
    events_used = 0;
  }

  ~Impl() {
    for (auto& l : layers) {
      if (!l) continue;
      if (l->engram_codes.bytes > 0) cu::free_pinned_host(l->engram_codes);
      if (l->engram_scales.bytes > 0) cu::free_pinned_host(l->engram_scales);
    }
    for (void* e : event_pool) cu::event_destroy(e);
    drop_graphs();
    if (meta_pinned.bytes > 0) cu::free_pinned_host(meta_pinned);
    if (ds_pinned.bytes > 0) cu::free_pinned_host(ds_pinned);
    ws.clear();
    lt.reset();
    side_lt.reset();
    for (void* e : {ev_fork, ev_join, ev_plan, ev_ov, ev_quant})
      if (e != nullptr) cu::event_destroy(e);
    if (side_stream != nullptr) cu::stream_destroy(side_stream);
    if (if_stream != nullptr) cu::stream_destroy(if_stream);
    if (stream != nullptr) cu::stream_destroy(stream);
  }

  // ---- building -------------------------------------------------------------------------------

  DeviceMemory upload_bytes(const void* data, size_t bytes) {
    DeviceMemory m(bytes);
    cu::copy_h2d(m.as(), data, bytes, stream);
    cu::stream_synchronize(stream);
    weight_bytes += bytes;
    return m;
  }
  DeviceMemory upload_f32(const HostTensor& t) {
    return upload_bytes(t.data<float>(), static_cast<size_t>(t.numel()) * 4);
  }
  DeviceMemory random_f32(int64_t n, float lo, float hi) {
    DeviceMemory m(static_cast<size_t>(n) * 4);
    cu::FillParams p;
    p.data = m.as();
    p.dtype = DType::kF32;
    p.numel = n;
    p.seed = rng();
    p.lo = lo;
    p.hi = hi;
    cu::launch_fill_random(p, stream);
    weight_bytes += m.bytes();
    return m;
  }

  Result<Linear> load_linear(const WeightLoader& r, const std::string& name, int64_t out,
                             int64_t in) {
    Linear lin;
    lin.out = out;
    lin.in = in;
    MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* t, r.get(name));
    lin.act_quant = t->dtype == DType::kF8E4M3 ||
                    ((t->dtype == DType::kI8 || t->dtype == DType::kU8) &&
                     t->shape == Shape{out, in / 2});
    const bool fp8 = !opt.exact_linears && t->dtype == DType::kF8E4M3;
    const bool fp4 = !opt.exact_linears && (t->dtype == DType::kI8 || t->dtype == DType::kU8) &&
                     t->shape == Shape{out, in / 2};
    if (fp8 || fp4) {
      MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* s,
                          r.get(name.substr(0, name.rfind(".weight")) + ".scale"));
      const Shape want_w = fp8 ? Shape{out, in} : Shape{out, in / 2};
      const Shape want_s =
          fp8 ? Shape{(out + 31) / 32, (in + 31) / 32} : Shape{out, (in + 31) / 32};
      if (!(t->shape == want_w) || !(s->shape == want_s) || s->dtype != DType::kF8E8M0)
        return make_error(ErrorCode::kInvalidArgument, "gpu model: tensor '{}' is {}, expected {}",
                          name, t->shape.to_string(), want_w.to_string());
      lin.kind = fp8 ? Linear::Kind::kFp8 : Linear::Kind::kMxfp4;
      lin.w = upload_bytes(t->view.data(), t->nbytes);
      lin.scale = upload_bytes(s->view.data(), s->nbytes);
      if (fp8) make_gemm_copy(lin);
      return lin;
    }
    MS_ASSIGN_OR_RETURN(HostTensor h, r.load_linear(name, out, in));
    lin.kind = Linear::Kind::kF32;
    lin.w = upload_f32(h);
    return lin;
  }
  Result<DeviceMemory> load_dense(const WeightLoader& r, const std::string& name,
                                  const std::vector<int64_t>& shape) {
    MS_ASSIGN_OR_RETURN(HostTensor h, r.load_dense(name, shape));
    return upload_f32(h);
  }

  // The FP8 weight's GEMM operand: the row-scaled refold (fp8_row_scaled) or the bf16 copy.
  void make_gemm_copy(Linear& lin) {
    if (opt.fp8_row_scaled && !opt.fp8_wgmma && !opt.exact_linears) {
      lin.w8r = DeviceMemory(static_cast<size_t>(lin.out * lin.in));
      lin.w8r_scale = DeviceMemory(static_cast<size_t>(lin.out) * 4);
      cu::launch_fold_fp8_block_rows(lin.w.as<uint8_t>(), lin.scale.as<uint8_t>(), lin.out, lin.in,
                                     lin.w8r.as<uint8_t>(), lin.w8r_scale.as<float>(), stream);
      weight_bytes += lin.w8r.bytes() + lin.w8r_scale.bytes();
      return;
    }
    make_bf16_copy(lin);
  }

  void make_bf16_copy(Linear& lin) {
    lin.wbf16 = DeviceMemory(static_cast<size_t>(lin.out * lin.in) * 2);
    cu::launch_dequant_fp8_block_to_bf16(lin.w.as<uint8_t>(), lin.scale.as<uint8_t>(), lin.out,
                                         lin.in, lin.wbf16.as(), stream);
    weight_bytes += lin.wbf16.bytes();
  }

  // GpuModelOptions::router_split_tf32 (not with exact_linears, the test's exact path):
  // L.gate_split from L.gate on the device (after the gate's upload or random fill on the same
  // stream). L.gate stays (the roofline counts its bytes, the checkpoint's).
  void build_gate_split(Layer& L, int64_t experts) {
    if (!opt.router_split_tf32 || opt.exact_linears) return;
    const int64_t d = c.hidden_size;
    L.gate_split = DeviceMemory(static_cast<size_t>(experts * 3 * d) * 4);
    cu::SplitTf32Params p;
    p.x = L.gate.as<float>();
    p.ldx = d;
    p.rows = experts;
    p.cols = d;
    p.out = L.gate_split.as<float>();
    p.ldo = 3 * d;
    p.lo_part = 1;
    cu::launch_split_tf32(p, stream);
    weight_bytes += L.gate_split.bytes();
  }

  // [a; b] as one linear by device copies, when a and b have one format, input width and input
  // quantisation (FP8: a's rows a multiple of the 32-row scale blocks, so each block stays whole;
  // fp32: any; MXFP4 weights are not concatenated), then a's and b's own copies are freed (they
  // keep their shapes and kinds). Every buffer is row-major with rows outermost (codes, block
  // scales, bf16 copy, fp32), so [a; b] is each buffer's bytes, a's then b's: the device bytes and
  // the bytes the roofline counts (bytes() = a's + b's) stay as unfused. Kind kNone: not fused.
  Linear concat_rows(Linear& a, Linear& b) {
    if (a.kind != b.kind || a.act_quant != b.act_quant || a.in != b.in) return {};
    if (!(a.kind == Linear::Kind::kF32 || (a.kind == Linear::Kind::kFp8 && a.out % 32 == 0)))
      return {};
    Linear f;
    f.kind = a.kind;
    f.out = a.out + b.out;
    f.in = a.in;
    f.act_quant = a.act_quant;
    const auto cat = [&](DeviceMemory& x, DeviceMemory& y) {
      DeviceMemory m(x.bytes() + y.bytes());
      cu::copy_d2d(m.as(), x.as(), x.bytes(), stream);
      cu::copy_d2d(m.as<uint8_t>() + x.bytes(), y.as(), y.bytes(), stream);
      return m;
    };
    f.w = cat(a.w, b.w);
    f.scale = cat(a.scale, b.scale);
    if (a.wbf16.bytes() > 0) f.wbf16 = cat(a.wbf16, b.wbf16);
    if (a.w8r.bytes() > 0) {
      f.w8r = cat(a.w8r, b.w8r);
      f.w8r_scale = cat(a.w8r_scale, b.w8r_scale);
    }
    // The copies read a / b (and random fills still queued on the stream) before the frees.
    cu::stream_synchronize(stream);
    for (Linear* lin : {&a, &b}) {
      lin->w.reset();
      lin->scale.reset();
      lin->wbf16.reset();
      lin->w8r.reset();
      lin->w8r_scale.reset();
    }
    return f;
  }

  // GpuModelOptions::fuse_shared_w13: L.shared_w13 = [w1; w3] (concat_rows) where w1 and w3 also
  // have one shape; only moe() reads them, and it reads shared_w13 instead.
  void fuse_shared_w13(Layer& L) {
    if (opt.fuse_shared_w13 && L.shared.w1.out == L.shared.w3.out)
      L.shared_w13 = concat_rows(L.shared.w1, L.shared.w3);
  }

  // GpuModelOptions::fuse_qkv_a: L.wqkv_a = [wq_a; wkv] (concat_rows) in main-model layers, whose
  // wq_a and wkv only attention() reads (the DSpark draft stages read theirs in their own code).
  void fuse_qkv_a(Layer& L, const LayerInfo& info) {
    if (opt.fuse_qkv_a && !info.is_draft) L.wqkv_a = concat_rows(L.wq_a, L.wkv);
  }

  Linear random_linear(Linear::Kind kind, int64_t out, int64_t in) {
    Linear lin;
    lin.kind = kind;
    lin.out = out;
    lin.in = in;
    lin.act_quant = kind != Linear::Kind::kF32;
    cu::FillParams p;
    if (kind == Linear::Kind::kF32) {
      lin.w = random_f32(out * in, -0.02f, 0.02f);
      return lin;
    }
    const bool fp8 = kind == Linear::Kind::kFp8;
    const size_t wbytes = static_cast<size_t>(fp8 ? out * in : out * in / 2);
    const int64_t scales = fp8 ? ((out + 31) / 32) * ((in + 31) / 32) : out * ((in + 31) / 32);
    lin.w = DeviceMemory(wbytes);
    lin.scale = DeviceMemory(static_cast<size_t>(scales));
    p.data = lin.w.as();
    p.dtype = fp8 ? DType::kF8E4M3 : DType::kFp4E2m1;
    p.numel = fp8 ? out * in : out * in;
    p.seed = rng();
    cu::launch_fill_random(p, stream);
    p.data = lin.scale.as();
    p.dtype = DType::kF8E8M0;
    p.numel = scales;
    p.seed = rng();
    // e4m3 codes up to 448; 2^-14..2^-12 keeps |w| ~ 1/sqrt(in) for in ~ 5120.
    p.lo = 113;
    p.hi = 115;
    cu::launch_fill_random(p, stream);
    weight_bytes += lin.w.bytes() + lin.scale.bytes();
    if (fp8) make_gemm_copy(lin);
    return lin;
  }

  Status build_layer_caches(Layer& L) {
    const LayerInfo& info = c.layer(L.id);
    const int64_t window = c.sliding_window;
    L.swa_pool =
        DeviceMemory(static_cast<size_t>(opt.max_seqs * window + opt.max_rows) * c.swa_row_bytes());
    cache_bytes += L.swa_pool.bytes();
    if (info.is_kv_source) {
      // Rounded up to 8 entries: every slot's first 68-byte index record then starts on a 16-byte
      // boundary, so the Reindex scores copy whole candidate blocks (8 records) 16 bytes at a time
      // (indexer_cand_wgmma_kernel; a slot of 131,073 entries put 3 of 4 slots off it).
      L.cap = (opt.max_context / info.ratio + 1 + 7) / 8 * 8;
      L.main_pool = DeviceMemory(static_cast<size_t>(opt.max_seqs * L.cap) * c.main_entry_bytes());
      L.index_pool =
          DeviceMemory(static_cast<size_t>(opt.max_seqs * L.cap) * c.index_entry_bytes());
      const int64_t part =
          static_cast<int64_t>(opt.max_seqs) * std::max(info.ratio - 1, 1) * c.head_dim * 4;
      L.part_kv = DeviceMemory(static_cast<size_t>(part));
      L.part_gate = DeviceMemory(static_cast<size_t>(part));
      cache_bytes += L.main_pool.bytes() + L.index_pool.bytes() + 2 * static_cast<size_t>(part);
    }
    return Status{};
  }

  Status init_common() {
    cu::set_programmatic_launch(opt.programmatic_launch);  // process-wide (see the option)
    stream = cu::stream_create();
    lt = std::make_unique<cu::CublasLtGemm>(stream);
    lt->set_autotune(opt.gemm_autotune);
    if (opt.moe_shared_overlap) {
      side_stream = cu::stream_create();
      side_lt = std::make_unique<cu::CublasLtGemm>(side_stream);
      side_lt->set_autotune(opt.gemm_autotune);
      ev_fork = cu::event_create_ordering();
      ev_join = cu::event_create_ordering();
      ev_plan = cu::event_create_ordering();
      ev_ov = cu::event_create_ordering();
      ev_quant = cu::event_create_ordering();
    }
    if (opt.moe_overflow_graph_if) if_stream = cu::stream_create();
    if (opt.layers.empty())
      for (int32_t l = 0; l < c.num_hidden_layers; ++l) opt.layers.push_back(l);
    layer_ids = opt.layers;
    if (opt.dspark)
      for (int32_t s = 0; s < c.num_nextn_predict_layers; ++s)
        draft_ids.push_back(c.num_hidden_layers + s);
    layers.resize(static_cast<size_t>(c.num_hidden_layers) + draft_ids.size());
    for (int32_t l : layer_ids) {
      const LayerInfo& info = c.layer(l);
      for (int32_t o : {info.kv_owner, info.index_owner,
                        info.mode == LayerMode::kReindex ? c.candidate_source_layer_id : -1})
        if (o >= 0 && std::find(layer_ids.begin(), layer_ids.end(), o) == layer_ids.end())
          return make_error(ErrorCode::kInvalidArgument,
                            "gpu model: layer {} needs layer {} (owner) in the kept layers", l, o);
    }
    if (opt.max_rows > opt.max_context * opt.max_seqs)
      opt.max_rows = opt.max_context * opt.max_seqs;
    const int rd = c.qk_rope_head_dim;
    const std::vector<double> fm = cpu::rope_frequencies(c.rope_theta, rd, nullptr);
    cpu::YarnParams yp;
    yp.factor = c.rope_scaling.factor;
    yp.original_max_position = c.rope_scaling.original_max_position_embeddings;
    yp.beta_fast = c.rope_scaling.beta_fast;
    yp.beta_slow = c.rope_scaling.beta_slow;
    const std::vector<double> fc =
        cpu::rope_frequencies(c.compress_rope_theta, rd, c.rope_scaling.enabled ? &yp : nullptr);
    freqs_main = DeviceMemory(fm.size() * 8);
    freqs_compress = DeviceMemory(fc.size() * 8);
    cu::copy_h2d(freqs_main.as(), fm.data(), fm.size() * 8, stream);
    cu::copy_h2d(freqs_compress.as(), fc.data(), fc.size() * 8, stream);
    std::vector<int32_t> io(static_cast<size_t>(opt.max_rows) + 1);
    for (size_t i = 0; i < io.size(); ++i) io[i] = static_cast<int32_t>(i);
    iota = DeviceMemory(io.size() * 4);
    cu::copy_h2d(iota.as(), io.data(), io.size() * 4, stream);
    seqs.resize(static_cast<size_t>(opt.max_seqs));
    if (!c.dspark_target_layer_ids.empty()) {
      const std::vector<float> tp(static_cast<size_t>(opt.max_rows) * c.hc_mult,
                                  1.0f / static_cast<float>(c.hc_mult));
      tap_pre = DeviceMemory(tp.size() * 4);
      cu::copy_h2d(tap_pre.as(), tp.data(), tp.size() * 4, stream);
    }
    cu::stream_synchronize(stream);
    return Status{};
  }

  int32_t local_expert_count(int32_t l) const {
    const int32_t e = c.routed_experts_of(l);
    return opt.local_experts < 0 ? e : std::min(e, opt.local_experts);
  }

  Status load_weights(const WeightLoader& r) {
    const int64_t d = c.hidden_size, hd = c.head_dim, h = c.num_attention_heads;
    const int64_t q = c.q_lora_rank, g = c.o_groups, o = c.o_lora_rank;
    const int64_t m = c.hc_mix_count(), hc = c.hc_mult, inter = c.moe_intermediate_size;
    MS_ASSIGN_OR_RETURN(embed, load_dense(r, "embed.weight", {c.vocab_size, d}));
    MS_ASSIGN_OR_RETURN(Linear head_lin, load_linear(r, "head.weight", c.vocab_size, d));
    if (head_lin.kind != Linear::Kind::kF32)
      return make_error(ErrorCode::kInvalidArgument, "gpu model: head must be BF16/F32");
    head = std::move(head_lin.w);
    MS_ASSIGN_OR_RETURN(norm, load_dense(r, "norm.weight", {d}));
    std::vector<int32_t> ids = layer_ids;
    ids.insert(ids.end(), draft_ids.begin(), draft_ids.end());
    for (int32_t l : ids) {
      auto L = std::make_unique<Layer>();
      L->id = l;
      const LayerInfo& info = c.layer(l);
      const std::string p = info.is_draft ? fmt::format("mtp.{}.", l - c.num_hidden_layers)
                                          : fmt::format("layers.{}.", l);
      MS_ASSIGN_OR_RETURN(L->hc_attn_fn, load_dense(r, p + "hc_attn_fn", {m, hc * d}));
      MS_ASSIGN_OR_RETURN(L->hc_attn_base, load_dense(r, p + "hc_attn_base", {m}));
      MS_ASSIGN_OR_RETURN(L->hc_attn_scale, load_dense(r, p + "hc_attn_scale", {3}));
      MS_ASSIGN_OR_RETURN(L->hc_ffn_fn, load_dense(r, p + "hc_ffn_fn", {m, hc * d}));
      MS_ASSIGN_OR_RETURN(L->hc_ffn_base, load_dense(r, p + "hc_ffn_base", {m}));
      MS_ASSIGN_OR_RETURN(L->hc_ffn_scale, load_dense(r, p + "hc_ffn_scale", {3}));
      MS_ASSIGN_OR_RETURN(L->attn_norm, load_dense(r, p + "attn_norm.weight", {d}));
      MS_ASSIGN_OR_RETURN(L->ffn_norm, load_dense(r, p + "ffn_norm.weight", {d}));
      const std::string ap = p + "attn.";
      MS_ASSIGN_OR_RETURN(L->wq_a, load_linear(r, ap + "wq_a.weight", q, d));
      MS_ASSIGN_OR_RETURN(L->q_norm, load_dense(r, ap + "q_norm.weight", {q}));
      MS_ASSIGN_OR_RETURN(L->wq_b, load_linear(r, ap + "wq_b.weight", h * hd, q));
      MS_ASSIGN_OR_RETURN(L->wkv, load_linear(r, ap + "wkv.weight", hd, d));
      MS_ASSIGN_OR_RETURN(L->kv_norm, load_dense(r, ap + "kv_norm.weight", {hd}));
      MS_ASSIGN_OR_RETURN(L->wo_a, load_linear(r, ap + "wo_a.weight", g * o, h * hd / g));
      MS_ASSIGN_OR_RETURN(L->wo_b, load_linear(r, ap + "wo_b.weight", d, g * o));
      MS_ASSIGN_OR_RETURN(L->sink, load_dense(r, ap + "attn_sink", {h}));
      if (info.is_kv_source) {
        MS_ASSIGN_OR_RETURN(L->comp_wkv, load_linear(r, ap + "compressor.wkv.weight", hd, d));
        if (info.ratio > 1) {
          MS_ASSIGN_OR_RETURN(L->comp_wgate, load_linear(r, ap + "compressor.wgate.weight", hd, d));
        }
        MS_ASSIGN_OR_RETURN(L->comp_norm, load_dense(r, ap + "compressor.norm.weight", {hd}));
        MS_ASSIGN_OR_RETURN(L->idx_wk,
                            load_linear(r, ap + "indexer.wk.weight", c.index_head_dim, hd));
        MS_ASSIGN_OR_RETURN(L->idx_knorm,
                            load_dense(r, ap + "indexer.k_norm.weight", {c.index_head_dim}));
      }
      if (info.is_index_source) {
        MS_ASSIGN_OR_RETURN(
            L->idx_wq_b, load_linear(r, ap + "indexer.wq_b.weight",
                                     static_cast<int64_t>(c.index_n_heads) * c.index_head_dim, q));
        MS_ASSIGN_OR_RETURN(L->idx_wproj,
                            load_linear(r, ap + "indexer.weights_proj.weight", c.index_n_heads, d));
      }
      const int64_t e = c.routed_experts_of(l);
      const std::string fp = p + "ffn.";
      MS_ASSIGN_OR_RETURN(Linear gate, load_linear(r, fp + "gate.weight", e, d));
      if (gate.kind != Linear::Kind::kF32) {
        MS_ASSIGN_OR_RETURN(HostTensor gh, r.load_linear(fp + "gate.weight", e, d));
        gate.w = upload_f32(gh);
      }
      L->gate = std::move(gate.w);
      build_gate_split(*L, e);
      MS_ASSIGN_OR_RETURN(L->bias, load_dense(r, fp + "gate.bias", {e}));
      if (!info.is_draft) {
        MS_ASSIGN_OR_RETURN(L->bias_vl, load_dense(r, fp + "gate.bias_vl", {e}));
      }
      for (int32_t i = 0; i < local_expert_count(l); ++i) {
        const std::string ep = fmt::format("{}experts.{}.", fp, i);
        Ffn f;
        MS_ASSIGN_OR_RETURN(f.w1, load_linear(r, ep + "w1.weight", inter, d));
        MS_ASSIGN_OR_RETURN(f.w3, load_linear(r, ep + "w3.weight", inter, d));
        MS_ASSIGN_OR_RETURN(f.w2, load_linear(r, ep + "w2.weight", d, inter));
        L->experts.push_back(std::move(f));
      }
      const std::string sp = fp + "shared_experts.";
      MS_ASSIGN_OR_RETURN(L->shared.w1, load_linear(r, sp + "w1.weight", inter, d));
      MS_ASSIGN_OR_RETURN(L->shared.w3, load_linear(r, sp + "w3.weight", inter, d));
      MS_ASSIGN_OR_RETURN(L->shared.w2, load_linear(r, sp + "w2.weight", d, inter));
      fuse_shared_w13(*L);
      fuse_qkv_a(*L, info);
      if (info.engram_index >= 0) {
        const EngramLayer& el = c.engram_layers[static_cast<size_t>(info.engram_index)];
        const std::string ep = p + "engram.";
        MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* tw, r.get(ep + "table.weight"));
        MS_ASSIGN_OR_RETURN(const Checkpoint::Tensor* ts, r.get(ep + "table.scale"));
        if (tw->dtype != DType::kF8E4M3 || ts->dtype != DType::kF8E8M0 ||
            !(tw->shape == Shape{el.num_embeddings, c.engram_head_dim}))
          return make_error(ErrorCode::kInvalidArgument, "gpu model: {}table is not FP8", ep);
        L->engram_rows = el.num_embeddings;
        L->engram_codes = cu::allocate_pinned_host(tw->nbytes, true);
        L->engram_scales = cu::allocate_pinned_host(ts->nbytes, true);
        std::copy_n(static_cast<const uint8_t*>(tw->view.data()), tw->nbytes,
                    static_cast<uint8_t*>(L->engram_codes.host));
        std::copy_n(static_cast<const uint8_t*>(ts->view.data()), ts->nbytes,
                    static_cast<uint8_t*>(L->engram_scales.host));
        MS_ASSIGN_OR_RETURN(L->engram_wkv,
                            load_linear(r, ep + "wkv.weight", d * (hc + 1), c.engram_embed_dim()));
        MS_ASSIGN_OR_RETURN(HostTensor qw, r.load_dense(ep + "q_weight", {hc, d}));
        MS_ASSIGN_OR_RETURN(HostTensor kw, r.load_dense(ep + "k_weight", {hc, d}));
        for (int64_t i = 0; i < hc * d; ++i) qw.data<float>()[i] *= kw.data<float>()[i];
        L->engram_qk = upload_f32(qw);
      }
      MS_RETURN_IF_ERROR(build_layer_caches(*L));
      layers[static_cast<size_t>(l)] = std::move(L);
    }
    if (!draft_ids.empty()) {
      const int64_t taps = static_cast<int64_t>(c.dspark_target_layer_ids.size());
      const int64_t v = c.vocab_size, rank = c.dspark_markov_rank;
      const std::string last = fmt::format("mtp.{}.", draft_ids.size() - 1);
      MS_ASSIGN_OR_RETURN(ds_main_proj, load_linear(r, "mtp.0.main_proj.weight", d, taps * d));
      MS_ASSIGN_OR_RETURN(ds_main_norm, load_dense(r, "mtp.0.main_norm.weight", {d}));
      MS_ASSIGN_OR_RETURN(ds_norm, load_dense(r, last + "norm.weight", {d}));
      MS_ASSIGN_OR_RETURN(ds_markov_embed,
                          load_dense(r, last + "markov_head.embed.weight", {v, rank}));
      MS_ASSIGN_OR_RETURN(ds_markov_head,
                          load_dense(r, last + "markov_head.head.weight", {v, rank}));
      MS_ASSIGN_OR_RETURN(ds_conf,
                          load_dense(r, last + "confidence_head.proj.weight", {1, d + rank}));
    }
    return Status{};
  }

  void random_weights_fill() {
    using K = Linear::Kind;
    const int64_t d = c.hidden_size, hd = c.head_dim, h = c.num_attention_heads;
    const int64_t q = c.q_lora_rank, g = c.o_groups, o = c.o_lora_rank;
    const int64_t m = c.hc_mix_count(), hc = c.hc_mult, inter = c.moe_intermediate_size;
    embed = random_f32(static_cast<int64_t>(c.vocab_size) * d, -1.0f, 1.0f);
    head = random_f32(static_cast<int64_t>(c.vocab_size) * d, -0.02f, 0.02f);
    norm = random_f32(d, 0.9f, 1.1f);
    std::vector<int32_t> ids = layer_ids;
    ids.insert(ids.end(), draft_ids.begin(), draft_ids.end());
    for (int32_t l : ids) {
      auto L = std::make_unique<Layer>();
      L->id = l;
      const LayerInfo& info = c.layer(l);
      L->hc_attn_fn = random_f32(m * hc * d, -0.01f, 0.01f);
      L->hc_attn_base = random_f32(m, -0.5f, 0.5f);
      L->hc_attn_scale = random_f32(3, 0.5f, 1.0f);
      L->hc_ffn_fn = random_f32(m * hc * d, -0.01f, 0.01f);
      L->hc_ffn_base = random_f32(m, -0.5f, 0.5f);
      L->hc_ffn_scale = random_f32(3, 0.5f, 1.0f);
      L->attn_norm = random_f32(d, 0.9f, 1.1f);
      L->ffn_norm = random_f32(d, 0.9f, 1.1f);
      L->wq_a = random_linear(K::kFp8, q, d);
      L->q_norm = random_f32(q, 0.9f, 1.1f);
      L->wq_b = random_linear(K::kFp8, h * hd, q);
      L->wkv = random_linear(K::kFp8, hd, d);
      L->kv_norm = random_f32(hd, 0.9f, 1.1f);
      L->wo_a = random_linear(K::kFp8, g * o, h * hd / g);
      L->wo_b = random_linear(K::kFp8, d, g * o);
      L->sink = random_f32(h, -1.0f, 1.0f);
      if (info.is_kv_source) {
        L->comp_wkv = random_linear(K::kF32, hd, d);
        if (info.ratio > 1) L->comp_wgate = random_linear(K::kF32, hd, d);
        L->comp_norm = random_f32(hd, 0.9f, 1.1f);
        L->idx_wk = random_linear(K::kF32, c.index_head_dim, hd);
        L->idx_knorm = random_f32(c.index_head_dim, 0.9f, 1.1f);
      }
      if (info.is_index_source) {
        L->idx_wq_b =
            random_linear(K::kFp8, static_cast<int64_t>(c.index_n_heads) * c.index_head_dim, q);
        L->idx_wproj = random_linear(K::kF32, c.index_n_heads, d);
      }
      const int64_t e = c.routed_experts_of(l);
      L->gate = random_f32(e * d, -0.05f, 0.05f);
      build_gate_split(*L, e);
      L->bias = random_f32(e, -0.01f, 0.01f);
      L->bias_vl = random_f32(e, -0.01f, 0.01f);
      for (int32_t i = 0; i < local_expert_count(l); ++i) {
        Ffn f;
        f.w1 = random_linear(K::kMxfp4, inter, d);
        f.w3 = random_linear(K::kMxfp4, inter, d);
        f.w2 = random_linear(K::kMxfp4, d, inter);
        L->experts.push_back(std::move(f));
      }
      L->shared.w1 = random_linear(K::kFp8, inter, d);
      L->shared.w3 = random_linear(K::kFp8, inter, d);
      L->shared.w2 = random_linear(K::kFp8, d, inter);
      fuse_shared_w13(*L);
      fuse_qkv_a(*L, info);
      if (info.engram_index >= 0) {
        const int64_t rows = opt.random_engram_rows;
        const int64_t dim = c.engram_head_dim;
        L->engram_rows = rows;
        L->engram_codes = cu::allocate_pinned_host(static_cast<size_t>(rows * dim), true);
        L->engram_scales = cu::allocate_pinned_host(static_cast<size_t>(rows * (dim / 32)), true);
        auto* codes = static_cast<uint8_t*>(L->engram_codes.host);
        auto* scales = static_cast<uint8_t*>(L->engram_scales.host);
        for (int64_t i = 0; i < rows * dim; ++i) codes[i] = static_cast<uint8_t>(rng() % 0x7E);
        for (int64_t i = 0; i < rows * (dim / 32); ++i)
          scales[i] = static_cast<uint8_t>(120 + rng() % 8);
        L->engram_wkv = random_linear(K::kFp8, d * (hc + 1), c.engram_embed_dim());
        L->engram_qk = random_f32(hc * d, -1.0f, 1.0f);
      }
      (void)build_layer_caches(*L);
      layers[static_cast<size_t>(l)] = std::move(L);
    }
    if (!draft_ids.empty()) {
      const int64_t taps = static_cast<int64_t>(c.dspark_target_layer_ids.size());
      const int64_t v = c.vocab_size, rank = c.dspark_markov_rank;
      ds_main_proj = random_linear(K::kFp8, d, taps * d);
      ds_main_norm = random_f32(d, 0.9f, 1.1f);
      ds_norm = random_f32(d, 0.9f, 1.1f);
      ds_markov_embed = random_f32(v * rank, -1.0f, 1.0f);
      ds_markov_head = random_f32(v * rank, -0.05f, 0.05f);
      ds_conf = random_f32(d + rank, -0.02f, 0.02f);
    }
    cu::stream_synchronize(stream);
  }

  // ---- ops ------------------------------------------------------------------------------------

  // y[rows, lin.out] (pitch ldy) = x[rows, lin.in] (pitch ldx) · W^T, the input first MXFP8
  // fake-quantised when the checkpoint weight is FP8/MXFP4 (as the CPU forward's linear()).
  void linear(const float* x, int64_t ldx, int64_t rows, const Linear& lin, float* y, int64_t ldy,
              int64_t out_row0 = 0, int64_t out_rows = -1) {
    if (rows == 0) return;
    if (!lin.act_quant) {
      gemm_raw(x, cu::ActivationType::kF32, ldx, rows, lin, y, ldy, out_row0, out_rows);
      return;
    }
    const int64_t n = out_rows < 0 ? lin.out : out_rows;
    const bool codes = fp8_wgmma_fits(lin) && n % 128 == 0 && out_row0 % 32 == 0;
    const QuantRows q = quant_rows(x, ldx, rows, lin.in, lin.kind, "aq", codes, fp8_rows_fits(lin));
    gemm_q(q, lin.in, rows, lin, y, ldy, out_row0, out_rows);
  }

  // FP8-weight linears that run on launch_fp8_wgmma_gemm (GpuModelOptions::fp8_wgmma) when their
  // input comes as e4m3 codes: the kernel's limits (out % 128, in % 128).
  [[nodiscard]] bool fp8_wgmma_fits(const Linear& lin) const {
    return opt.fp8_wgmma && !opt.exact_linears && lin.kind == Linear::Kind::kFp8 &&
           lin.act_quant && lin.out % 128 == 0 && lin.in % 128 == 0;
  }
  // FP8-weight linears that run as row-scaled FP8 GEMMs (GpuModelOptions::fp8_row_scaled): those
  // holding the refolded weight, whose input width meets cuBLASLt's FP8 pitch (in % 16).
  [[nodiscard]] static bool fp8_rows_fits(const Linear& lin) {
    return lin.kind == Linear::Kind::kFp8 && lin.act_quant && lin.w8r.bytes() > 0 &&
           lin.in % 16 == 0;
  }

  // The MXFP8 fake-quant of x [rows, in] as a GEMM on weights of `kind` takes it: bf16 (exact)
  // for the bf16 kernels, fp32 for the exact fp32 GEMM; in buffer `name` (16/32 appended). One
  // quantisation can feed several linears with the same input and kind (gemm_raw).
  // codes: the e4m3 codes and ue8m0 scales themselves (kMxfp8, [rows, in] and [rows, in / 32]),
  // the A operand of launch_fp8_wgmma_gemm; every consumer must be an fp8_wgmma_fits linear.
  // rows_scaled: the row-scaled FP8 operand instead (launch_act_quant_fp8_rows: e4m3 codes
  // [rows, in] and row_scale [rows]), which only fp8_rows_fits linears take (gemm_q).
  struct QuantRows {
    const void* data;
    cu::ActivationType type;
    const uint8_t* scale = nullptr;  // kMxfp8: [rows, in / 32]
    int64_t ld_scale = 0;
    const float* row_scale = nullptr;  // row-scaled FP8: [rows]
  };
  QuantRows quant_rows(const float* x, int64_t ldx, int64_t rows, int64_t in, Linear::Kind kind,
                       const std::string& name, bool codes = false, bool rows_scaled = false) {
    if (rows_scaled) return quant_rows_fp8(x, cu::ActivationType::kF32, ldx, rows, in, name);
    const cu::ActivationType t = kind == Linear::Kind::kF32 ? cu::ActivationType::kF32
                                 : codes                    ? cu::ActivationType::kMxfp8
                                                            : cu::ActivationType::kBF16;
    void* q = t == cu::ActivationType::kF32     ? static_cast<void*>(buf<float>(name + "32", rows * in))
              : t == cu::ActivationType::kMxfp8 ? static_cast<void*>(buf<uint8_t>(name + "8", rows * in))
                                                : static_cast<void*>(buf<uint16_t>(name + "16", rows * in));
    cu::ActQuantParams ap;
    ap.x = x;
    ap.ldx = ldx;
    ap.rows = rows;
    ap.cols = in;
    ap.out = q;
    ap.out_type = t;
    ap.ldo = in;
    QuantRows r{q, t};
    if (t == cu::ActivationType::kMxfp8) {
      uint8_t* sc = buf<uint8_t>(name + "s", rows * (in / 32));
      ap.out_scale = sc;
      ap.ldo_scale = in / 32;
      r.scale = sc;
      r.ld_scale = in / 32;
    }
    cu::launch_act_quant_mxfp8(ap, stream);
    return r;
  }

  // The row-scaled FP8 operand of x [rows, in] (fp32 or bf16 bits): codes in buffer name + "8r",
  // row scales in name + "rs". in_row_scale / in_col_scale: x is an unscaled row-scaled GEMM's
  // output, scaled on load (ActQuantFp8RowsParams).
  QuantRows quant_rows_fp8(const void* x, cu::ActivationType x_type, int64_t ldx, int64_t rows,
                           int64_t in, const std::string& name,
                           const float* in_row_scale = nullptr,
                           const float* in_col_scale = nullptr) {
    uint8_t* q = buf<uint8_t>(name + "8r", rows * in);
    float* rs = buf<float>(name + "rs", rows);
    cu::ActQuantFp8RowsParams p;
    p.x = x;
    p.x_type = x_type;
    p.ldx = ldx;
    p.rows = rows;
    p.cols = in;
    p.out = q;
    p.ldo = in;
    p.row_scale = rs;
    p.in_row_scale = in_row_scale;
    p.in_col_scale = in_col_scale;
    cu::launch_act_quant_fp8_rows(p, stream);
    QuantRows r{q, cu::ActivationType::kMxfp8};
    r.row_scale = rs;
    return r;
  }

  // y[rows, n] (pitch ldy) = q[rows, k] (codes from column a_col0, pitch lda bytes) ·
  // W[w_row0 : w_row0 + n, :k]^T (weight row pitch w_ld) as a row-scaled FP8 cuBLASLt GEMM.
  void fp8_rows_gemm(const QuantRows& q, int64_t lda, int64_t a_col0, int64_t rows,
                     const Linear& lin, int64_t w_row0, int64_t n, int64_t k, int64_t w_ld,
                     float* y, int64_t ldy) {
    MS_CHECK(q.row_scale != nullptr && fp8_rows_fits(lin));
    cu::LtGemmParams p;
    p.precision = cu::GemmPrecision::kFp8RowScaled;
    p.a = static_cast<const uint8_t*>(q.data) + a_col0;
    p.lda = lda;
    p.b = lin.w8r.as<uint8_t>() + w_row0 * w_ld;
    p.ldb = w_ld;
    p.b_transposed = true;
    p.c = y;
    p.ldc = ldy;
    p.m = rows;
    p.n = n;
    p.k = k;
    p.a_scale = q.row_scale;
    p.b_scale = lin.w8r_scale.as<float>() + w_row0;
    lt->run(p);
  }

  // y[rows, n] (pitch ldy) = q[rows, K] · W[w_row0 : w_row0 + n, :]^T on the FP8 wgmma GEMM: q the
  // e4m3 codes (pitch lda bytes, starting at column a_col0) with their ue8m0 scales.
  void fp8_wgmma(const QuantRows& q, int64_t lda, int64_t a_col0, int64_t rows, const Linear& lin,
                 int64_t w_row0, int64_t n, int64_t k, int64_t w_ld, float* y, int64_t ldy) {
    cu::Fp8WgmmaGemmParams p;
    p.a = static_cast<const uint8_t*>(q.data) + a_col0;
    p.lda = lda;
    p.a_scale = q.scale + a_col0 / 32;
    p.lda_scale = q.ld_scale;
    p.w = lin.w.as<uint8_t>() + w_row0 * w_ld;
    p.w_scale = lin.scale.as<uint8_t>() + (w_row0 / 32) * ((w_ld + 31) / 32);
    p.y = y;
    p.ldy = ldy;
    p.m = rows;
    p.n = n;
    p.k = k;
    cu::launch_fp8_wgmma_gemm(p, stream);
  }

  // The roofline's share of rows x n outputs of `lin` (weights as held, FLOPs; FP8-representable
  // when the input is MXFP8-quantised).
  void add_linear_cost(const Linear& lin, int64_t rows, int64_t n) {
    const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(n) * lin.in;
    cost.weight_bytes += lin.bytes() * static_cast<double>(n) / static_cast<double>(lin.out);
    cost.flops += flops;
    if (lin.act_quant) cost.fp8_flops += flops;
  }

  // gemm_raw on a quant_rows() result (the FP8 wgmma GEMM when it holds codes).
  void gemm_q(const QuantRows& q, int64_t ldx, int64_t rows, const Linear& lin, float* y,
              int64_t ldy, int64_t out_row0 = 0, int64_t out_rows = -1) {
    if (q.type != cu::ActivationType::kMxfp8) {
      gemm_raw(q.data, q.type, ldx, rows, lin, y, ldy, out_row0, out_rows);
      return;
    }
    if (rows == 0) return;
    const int64_t n = out_rows < 0 ? lin.out : out_rows;
    if (q.row_scale != nullptr) {
      add_linear_cost(lin, rows, n);
      fp8_rows_gemm(q, ldx, 0, rows, lin, out_row0, n, lin.in, lin.in, y, ldy);
      return;
    }
    MS_CHECK(lin.kind == Linear::Kind::kFp8 && n % 128 == 0 && out_row0 % 32 == 0);
    add_linear_cost(lin, rows, n);
    fp8_wgmma(q, ldx, 0, rows, lin, out_row0, n, lin.in, lin.in, y, ldy);
  }

  // c[m, n] (fp32, ldc) = a[m, k] (lda) · b[n, k]^T (ldb) on cuBLASLt.
  void lt_gemm(cu::GemmPrecision precision, const void* a, int64_t lda, const void* b,
               int64_t ldb, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k) {
    cu::LtGemmParams p;
    p.precision = precision;
    p.a = a;
    p.lda = lda;
    p.b = b;
    p.ldb = ldb;
    p.b_transposed = true;
    p.c = c;
    p.ldc = ldc;
    p.m = m;
    p.n = n;
    p.k = k;
    lt->run(p);
  }

  // The GEMM of linear() on inputs as given (fp32, or bf16 bits for FP8/MXFP4 weights).
  void gemm_raw(const void* x, cu::ActivationType x_type, int64_t ldx, int64_t rows,
                const Linear& lin, float* y, int64_t ldy, int64_t out_row0 = 0,
                int64_t out_rows = -1) {
    if (rows == 0) return;
    const int64_t n = out_rows < 0 ? lin.out : out_rows;
    add_linear_cost(lin, rows, n);
    const bool bf16_x = x_type == cu::ActivationType::kBF16;
    switch (lin.kind) {
      case Linear::Kind::kFp8: {
        MS_CHECK(bf16_x);
        MS_CHECK_MSG(lin.wbf16.bytes() > 0,
                     "gpu model: FP8 linear without its bf16 copy (fp8_row_scaled holds the "
                     "row-scaled one; quant_rows(rows_scaled) feeds it)");
        lt_gemm(cu::GemmPrecision::kBf16F32, x, ldx, lin.wbf16.as<uint16_t>() + out_row0 * lin.in,
                lin.in, y, ldy, rows, n, lin.in);
        break;
      }
      case Linear::Kind::kMxfp4: {
        cu::Mxfp4GemmParams p;
        p.x = x;
        p.x_type = x_type;
        p.ldx = ldx;
        p.w = lin.w.as<uint8_t>() + out_row0 * lin.in / 2;
        p.w_scale = lin.scale.as<uint8_t>() + out_row0 * ((lin.in + 31) / 32);
        p.y = y;
        p.ldy = ldy;
        p.m = rows;
        p.n = n;
        p.k = lin.in;
        cu::launch_mxfp4_gemm(p, stream);
        break;
      }
      case Linear::Kind::kF32: {
        MS_CHECK(!bf16_x);
        lt_gemm(opt.tf32_dense ? cu::GemmPrecision::kTf32 : cu::GemmPrecision::kF32, x, ldx,
                lin.w.as<float>() + out_row0 * lin.in, lin.in, y, ldy, rows, n, lin.in);
        break;
      }
      case Linear::Kind::kNone:
        MS_CHECK_MSG(false, "gpu model: linear not loaded");
    }
  }

  void rms(float* x, int64_t rows, int64_t dim, const DeviceMemory& w) {
    rms_to(x, dim, rows, dim, w, x, dim);
  }
  // out [rows, dim] (pitch ldo) = RMSNorm of x [rows, dim] (pitch ldx).
  void rms_to(const float* x, int64_t ldx, int64_t rows, int64_t dim, const DeviceMemory& w,
              float* out, int64_t ldo) {
    if (rows == 0) return;
    cu::RmsNormParams p;
    p.x = x;
    p.weight = w.as<float>();
    p.out = out;
    p.rows = rows;
    p.cols = dim;
    p.x_stride = ldx;
    p.out_stride = ldo;
    p.eps = static_cast<float>(c.rms_norm_eps);
    cu::launch_rms_norm(p, stream);
  }

  void rope(float* x, int64_t rows, int heads, int64_t head_dim, const int32_t* pos, RopeKind kind,
            bool inverse = false) {
    if (rows == 0) return;
    cu::RopeParams p;
    p.x = x;
    p.rows = rows;
    p.row_stride = heads * head_dim;
    p.heads = heads;
    p.head_stride = head_dim;
    p.head_dim = static_cast<int>(head_dim);
    p.rd = c.qk_rope_head_dim;
    p.pos = pos;
    p.freqs = (kind == RopeKind::kMain ? freqs_main : freqs_compress).as<double>();
    p.inverse = inverse;
    p.heads_per_thread = std::min(opt.rope_heads_per_thread, 8);
    cu::launch_rope(p, stream);
  }

  // The fields HcMixesParams and HcExpandMixesParams share (the mixes' weights and constants),
  // and the cost both launches count for the mixes of n rows.
  template <typename Params>
  void set_mix_weights(Params& p, const DeviceMemory& fn, const DeviceMemory& base,
                       const DeviceMemory& scale) const {
    p.hc = c.hc_mult;
    p.dim = c.hidden_size;
    p.fn = fn.as<float>();
    p.base = base.as<float>();
    p.scale = scale.as<float>();
    p.rms_eps = static_cast<float>(c.rms_norm_eps);
    p.hc_eps = static_cast<float>(c.hc_eps);
    p.sinkhorn_iters = c.hc_sinkhorn_iters;
  }
  void count_mixes(int64_t n, const DeviceMemory& fn) {
    cost.flops += 2.0 * static_cast<double>(n) * c.hc_mix_count() * c.hc_mult * c.hidden_size;
    cost.weight_bytes += static_cast<double>(fn.bytes());
  }
  void mixes(const float* x, int64_t n, const DeviceMemory& fn, const DeviceMemory& base,
             const DeviceMemory& scale, float* pre, float* post, float* comb) {
    cu::HcMixesParams p;
    set_mix_weights(p, fn, base, scale);
    p.x = x;
    p.ldx = c.hc_mult * c.hidden_size;
    p.rows = n;
    p.pre = pre;
    p.post = post;
    p.comb = comb;
    cu::launch_hc_mixes(p, stream);
    count_mixes(n, fn);
  }
  // expand(x, y, n, post, comb, collapse_pre, collapse_out) then mixes(x', n, fn, ...) in one
  // launch (mhc_fuse_expand_mixes); the cost counted as mixes() counts it (expand counts none).
  // collapse_norm set: collapse_out is rms(collapse, collapse_norm) instead (mhc_fuse_norm).
  // Returns the launch's cluster width when tracing (cuda::hc_expand_mixes_cluster_width), else 0.
  // quant_collapse (with collapse_norm): where the launch takes its split path, it also writes
  // the normalised collapse's row-scaled FP8 operand into the buffers attention() reads for the
  // fused qkv_a GEMM (attn_quant_buffers); *quantised says whether it did.
  int expand_mixes(float* x, const float* y, int64_t n, const float* post, const float* comb,
                    const float* collapse_pre, float* collapse_out, const DeviceMemory& fn,
                    const DeviceMemory& base, const DeviceMemory& scale, float* pre,
                    float* mix_post, float* mix_comb, const DeviceMemory* collapse_norm = nullptr,
                    bool quant_collapse = false, bool* quantised = nullptr) {
    if (quantised != nullptr) *quantised = false;
    cu::HcExpandMixesParams p;
    set_mix_weights(p, fn, base, scale);
    p.x = x;
    p.y = y;
    p.rows = n;
    p.post = post;
    p.comb = comb;
    p.collapse_pre = collapse_pre;
    p.collapse_out = collapse_out;
    p.mix_pre = pre;
    p.mix_post = mix_post;
    p.mix_comb = mix_comb;
    p.rows_per_thread = opt.mhc_fused_rows_per_thread;
    p.cluster_width = opt.mhc_fused_cluster_width != 0       ? opt.mhc_fused_cluster_width
                      : n <= opt.mhc_wide_cluster_max_rows ? 16
                                                           : 8;
    if (collapse_norm != nullptr) {
      p.collapse_norm_weight = collapse_norm->as<float>();
      p.collapse_norm_eps = static_cast<float>(c.rms_norm_eps);  // as rms()
    }
    const int split =
        opt.mhc_split_blocks < 0 ? cu::hc_expand_mixes_auto_split(n) : opt.mhc_split_blocks;
    if (split > 0) {
      p.split_blocks = split;
      p.tensor_cores = opt.mhc_tensor_cores;
      if (quant_collapse && collapse_norm != nullptr) {
        const QuantRows qa = attn_quant_buffers(n);
        p.collapse_fp8 = const_cast<uint8_t*>(static_cast<const uint8_t*>(qa.data));
        p.collapse_fp8_scale = const_cast<float*>(qa.row_scale);
        if (quantised != nullptr) *quantised = true;
      }
      p.partials =
          buf<float>("mhc_partials", cu::hc_expand_mixes_partials_floats(n, c.hc_mult, split));
    }
    cu::launch_hc_expand_mixes(p, stream);
    count_mixes(n, fn);
    return opt.trace ? cu::hc_expand_mixes_cluster_width(p) : 0;
  }
  void collapse(const float* x, int64_t n, const float* pre, float* out) {
    cu::HcCollapseParams p;
    p.x = x;
    p.rows = n;
    p.hc = c.hc_mult;
    p.dim = c.hidden_size;
    p.pre = pre;
    p.out = out;
    cu::launch_hc_collapse(p, stream);
  }
  // x = expand(y, x); with collapse_out set, also collapse_out = collapse(x', collapse_pre)
  // (fused).
  void expand(float* x, const float* y, int64_t n, const float* post, const float* comb,
              const float* collapse_pre = nullptr, float* collapse_out = nullptr) {
    cu::HcExpandParams p;
    p.x = x;
    p.y = y;
    p.rows = n;
    p.hc = c.hc_mult;
    p.dim = c.hidden_size;
    p.post = post;
    p.comb = comb;
    p.collapse_pre = collapse_pre;
    p.collapse_out = collapse_out;
    cu::launch_hc_expand(p, stream);
  }

  // ---- the forward ----------------------------------------------------------------------------

  struct Batch {
    std::span<const GpuSequenceInput> in;
    std::vector<int32_t> start;                    // first position per input
    std::vector<int32_t> chunk_begin;              // first row of each input in the full chunk list
    std::vector<std::vector<int64_t>> engram_ids;  // [engram layer][rows * hashes] (chunk rows)
    std::vector<uint8_t> image;                    // per chunk row
    int64_t total = 0;
    RowSet enc, dec;
    std::map<int32_t, int32_t*> sel;  // index-source layer -> [rows, topk] pool entries
    int32_t* cand = nullptr;          // [rows, kb * block] candidate entries (seq-local)
    // The plan (plan()): metadata pieces and per-layer shapes.
    MetaPtr tok, pre0, keep, last_rows;
    std::map<int32_t, MetaPtr> engram;  // Engram layer -> [rows, hashes] ids
    std::map<int32_t, CompressPlan> comp;
    std::map<int32_t, SelectPlan> selp;
    bool narrow = false;  // bounded replay drops rows at the boundary
    bool taps = false;      // some input wants main_hidden: the tap layers write "taps"
    bool taps_dec = false;  // the tap layers see the decoder row set (after the boundary)
    std::vector<int32_t> logit_inputs;
    int64_t m = 0;              // logits rows
    GpuForwardCost plan_cost;   // the indexer's share (depends on the entries, not the shapes)
    std::vector<int64_t> key;   // the launch shape (graph key)
  };

  // Builds a row set: rows [row0_s, T_s) of each input; SWA reads floored at floor_s. The SWA
  // source lists themselves are built on the device from the per-row values (launch()).
  void build_set(Batch& b, RowSet& s, const std::vector<int32_t>& row0,
                 const std::vector<int32_t>& floor, const std::string& tag) {
    const int64_t window = c.sliding_window;
    const size_t ni = b.in.size();
    s.begin.assign(ni, 0);
    s.rows.assign(ni, 0);
    s.first_pos.assign(ni, 0);
    s.src_row.clear();
    std::vector<int32_t> pos, row_first, row_floor;
    std::vector<int64_t> slot, ring_dst;
    std::vector<uint8_t> img;
    s.any_image = false;
    for (size_t i = 0; i < ni; ++i) {
      const int32_t t = static_cast<int32_t>(b.in[i].tokens.size());
      s.begin[i] = static_cast<int32_t>(s.src_row.size());
      s.rows[i] = t - row0[i];
      s.first_pos[i] = b.start[i] + row0[i];
      const int32_t last = b.start[i] + t - 1;
      for (int32_t r = row0[i]; r < t; ++r) {
        const int32_t p = b.start[i] + r;
        s.src_row.push_back(b.chunk_begin[i] + r);
        pos.push_back(p);
        slot.push_back(b.in[i].seq);
        ring_dst.push_back(
            last - p >= window ? -1 : static_cast<int64_t>(b.in[i].seq) * window + p % window);
        const uint8_t im = b.image[static_cast<size_t>(b.chunk_begin[i] + r)];
        img.push_back(im);
        s.any_image = s.any_image || im != 0;
        row_first.push_back(s.first_pos[i]);
        row_floor.push_back(floor[i]);
      }
    }
    s.n = static_cast<int64_t>(s.src_row.size());
    s.pos = meta_put(pos);
    s.row_first = meta_put(row_first);
    s.row_floor = meta_put(row_floor);
    s.ring_dst = meta_put(ring_dst);
    s.row_slot = meta_put(slot);
    s.image = meta_put(img);
    b.key.push_back(s.n);
    (void)tag;
  }

  // The Engram hash ids of the rows of s at layer l (random over the held rows for random
  // weights).
  void plan_engram(Batch& b, const RowSet& s, int32_t l) {
    const Layer& L = *layers[static_cast<size_t>(l)];
    const LayerInfo& info = c.layer(l);
    const int32_t hashes = c.engram_num_hashes();
    const int64_t n = s.n;
    std::vector<int64_t> ids(static_cast<size_t>(n * hashes));
    const auto& all = b.engram_ids[static_cast<size_t>(info.engram_index)];
    for (int64_t r = 0; r < n; ++r)
      for (int32_t h = 0; h < hashes; ++h)
        ids[static_cast<size_t>(r * hashes + h)] =
            random_weights
                ? static_cast<int64_t>(rng() % static_cast<uint64_t>(L.engram_rows))
                : all[static_cast<size_t>(s.src_row[static_cast<size_t>(r)] * hashes + h)];
    b.engram[l] = meta_put(ids);
  }

  void engram(Batch& b, const RowSet& s, int32_t l, float* x) {
    const Layer& L = *layers[static_cast<size_t>(l)];
    const int32_t hashes = c.engram_num_hashes();
    const int64_t n = s.n, d = c.hidden_size, hc = c.hc_mult;
    const int dim = c.engram_head_dim;
    const int64_t* dids = b.engram.at(l).as<int64_t>();
    const int64_t nid = n * hashes;
    cu::EngramGatherParams gp;
    gp.codes = static_cast<const uint8_t*>(L.engram_codes.device);
    gp.scales = static_cast<const uint8_t*>(L.engram_scales.device);
    gp.dim = dim;
    gp.ids = dids;
    gp.n = nid;
    gp.out_codes = buf<uint8_t>("engram_codes", nid * dim);
    gp.out_scales = buf<uint8_t>("engram_scales", nid * (dim / 32));
    cu::launch_engram_gather(gp, stream);
    cu::EngramDequantParams dp;
    dp.codes = gp.out_codes;
    dp.scales = gp.out_scales;
    dp.dim = dim;
    dp.n = nid;
    dp.out = buf<float>("engram_e", nid * dim);
    cu::launch_engram_dequant(dp, stream);
    cost.kv_bytes += static_cast<double>(nid) * (dim + dim / 32);
    float* kv = buf<float>("engram_kv", n * (hc + 1) * d);
    linear(dp.out, c.engram_embed_dim(), n, L.engram_wkv, kv, (hc + 1) * d);
    cu::EngramGateParams p;
    p.x = x;
    p.key = kv;
    p.ld_key = (hc + 1) * d;
    p.val = kv + hc * d;
    p.ld_val = (hc + 1) * d;
    p.wprod = L.engram_qk.as<float>();
    p.is_image = s.any_image ? s.image.as<uint8_t>() : nullptr;
    p.rows = n;
    p.hc = static_cast<int>(hc);
    p.dim = d;
    p.eps = static_cast<float>(c.rms_norm_eps);
    cu::launch_engram_gate(p, stream);
  }

  // The compressor's share of the plan for layer l and the rows of s (CompressPlan); advances
  // each sequence's entry count by the groups this forward completes.
  void plan_compress(Batch& b, const RowSet& s, int32_t l) {
    Layer& L = *layers[static_cast<size_t>(l)];
    const int ratio = c.layer(l).ratio;
    const size_t nin = b.in.size();
    std::vector<cu::CompressorSeq> cs(nin);
    std::vector<int64_t> entry;
    std::vector<int32_t> gpos;
    int64_t groups = 0, items = 0;
    for (size_t i = 0; i < nin; ++i) {
      const int32_t slot = b.in[i].seq;
      const int64_t rows = s.rows[i];
      const int64_t done = cpu::compressor_groups(s.first_pos[i], rows, ratio);
      const int64_t gslots = (rows + ratio - 1) / ratio;
      const int64_t islots = rows > 0 ? std::max<int64_t>(gslots, 1) : 0;
      MS_CHECK_LE(done, gslots);
      MS_CHECK_LE(cu::compressor_items(s.first_pos[i], rows, ratio), islots);
      cs[i].row_begin = s.begin[i];
      cs[i].rows = rows;
      cs[i].start_pos = s.first_pos[i];
      cs[i].state_slot = slot;
      cs[i].out_group = groups;
      cs[i].item_begin = items;
      int64_t& j0 = seqs[static_cast<size_t>(slot)].entries[static_cast<size_t>(l)];
      MS_CHECK_LE(j0 + done, L.cap);
      for (int64_t g = 0; g < gslots; ++g) {
        entry.push_back(g < done ? static_cast<int64_t>(slot) * L.cap + j0 + g : -1);
        gpos.push_back(g < done ? static_cast<int32_t>((j0 + g) * ratio) : 0);
      }
      j0 += done;
      groups += gslots;
      items += islots;
    }
    std::vector<int64_t> blob(nin * kSeqWords + entry.size() + (gpos.size() + 1) / 2, 0);
    std::memcpy(blob.data(), cs.data(), nin * sizeof(cu::CompressorSeq));
    std::copy(entry.begin(), entry.end(), blob.begin() + static_cast<ptrdiff_t>(nin * kSeqWords));
    if (!gpos.empty())
      std::memcpy(blob.data() + nin * kSeqWords + entry.size(), gpos.data(),
                  gpos.size() * sizeof(int32_t));
    CompressPlan& cp = b.comp[l];
    cp.items = items;
    cp.groups = groups;
    cp.blob = meta_put(blob);
    b.key.insert(b.key.end(), {l, items, groups});
  }

  // Compressor + index keys + FP4 cache appends for the rows of s (model.md §2.3): one compressor
  // launch and one FP4 write launch (main entries and index keys) for all sequences, their
  // parameters from the plan.
  void compress(const Batch& b, const RowSet& s, int32_t l, const float* a) {
    Layer& L = *layers[static_cast<size_t>(l)];
    const LayerInfo& info = c.layer(l);
    const int64_t n = s.n, d = c.hidden_size, hd = c.head_dim, id = c.index_head_dim;
    const int ratio = info.ratio;
    const CompressPlan& cp = b.comp.at(l);
    float* kvc = buf<float>("comp_kv", n * hd);
    float* gate = ratio > 1 ? buf<float>("comp_gate", n * hd) : nullptr;
    linear(a, d, n, L.comp_wkv, kvc, hd);
    if (ratio > 1) linear(a, d, n, L.comp_wgate, gate, hd);
    const size_t nin = b.in.size();
    const int64_t items = cp.items, groups_total = cp.groups;
    if (items == 0) return;
    const int64_t* dblob = cp.blob.as<int64_t>();
    const int64_t* dentry = dblob + nin * kSeqWords;
    const int32_t* dpos = reinterpret_cast<const int32_t*>(dentry + groups_total);
    float* lat = buf<float>("comp_lat", groups_total * hd);
    {
      cu::CompressorBatchParams p;
      p.kv = kvc;
      p.gate = gate;
      p.ld = hd;
      p.dim = static_cast<int>(hd);
      p.ratio = ratio;
      p.seqs = reinterpret_cast<const cu::CompressorSeq*>(dblob);
      p.num_seqs = static_cast<int>(nin);
      p.num_items = items;
      p.state_kv = L.part_kv.as<float>();
      p.state_gate = L.part_gate.as<float>();
      p.state_stride = static_cast<int64_t>(std::max(ratio - 1, 1)) * hd;
      p.norm_weight = L.comp_norm.as<float>();
      p.eps = static_cast<float>(c.rms_norm_eps);
      p.out = lat;
      cu::launch_compressor_batch(p, stream);
    }
    if (groups_total == 0) return;
    float* keys = buf<float>("comp_keys", groups_total * id);
    linear(lat, hd, groups_total, L.idx_wk, keys, id);
    rms(keys, groups_total, id, L.idx_knorm);
    rope(lat, groups_total, 1, hd, dpos, RopeKind::kCompress);
    rope(keys, groups_total, 1, id, dpos, RopeKind::kCompress);
    cu::Fp4ScatterWriteParams w;
    w.count = 2;
    w.entries = dentry;
    w.write[0].x = lat;
    w.write[0].ldx = hd;
    w.write[0].rows = groups_total;
    w.write[0].dim = static_cast<int>(hd);
    w.write[0].format = cu::Fp4Record::kMainBlock16E4m3;
    w.write[0].cache = L.main_pool.as<uint8_t>();
    w.write[1].x = keys;
    w.write[1].ldx = id;
    w.write[1].rows = groups_total;
    w.write[1].dim = static_cast<int>(id);
    w.write[1].format = cu::Fp4Record::kIndexBlock32Ue8m0;
    w.write[1].cache = L.index_pool.as<uint8_t>();
    cu::launch_fp4_cache_scatter_write(w, stream);
  }

  void topk(const float* scores, int64_t rows, int64_t n, int64_t ld, int k, int32_t* out) {
    cu::TopkParams p;
    p.scores = scores;
    p.rows = rows;
    p.n = n;
    p.ld = ld;
    p.k = k;
    p.out_idx = out;
    p.scratch = buf<uint8_t>("topk_scratch", static_cast<int64_t>(cu::topk_scratch_bytes(rows, n)));
    cu::launch_topk(p, stream);
  }

  // Candidate entries per row of a Reindex layer (the candidate source's top blocks, expanded).
  [[nodiscard]] int64_t candidate_count() const {
    return static_cast<int64_t>(c.candidate_topk_blocks) * c.candidate_block_size;
  }

  // The selection's share of the plan for index-source layer l (SelectPlan) and its cost (the
  // keys each sequence scores).
  void plan_select(Batch& b, const RowSet& s, int32_t l) {
    const LayerInfo& info = c.layer(l);
    const Layer& owner = *layers[static_cast<size_t>(info.kv_owner)];
    const bool reindex = info.mode == LayerMode::kReindex;
    const int64_t ncand = candidate_count();
    SelectPlan& sp = b.selp[l];
    int64_t width = 0;
    for (size_t i = 0; i < b.in.size(); ++i)
      width = std::max(
          width,
          seqs[static_cast<size_t>(b.in[i].seq)].entries[static_cast<size_t>(info.kv_owner)]);
    // NOTE: rounded up so that the launch shapes change once per kWidthBucket entries, not every
    // step; the extra columns score -inf (past every row's visible keys) and top-k drops them.
    sp.width = reindex ? ncand : (width + kWidthBucket - 1) / kWidthBucket * kWidthBucket;
    std::vector<int64_t> seq_desc;
    seq_desc.reserve(b.in.size() * 4);
    for (size_t i = 0; i < b.in.size(); ++i) {
      if (s.rows[i] == 0) continue;
      const int32_t slot = b.in[i].seq;
      const int64_t entries =
          seqs[static_cast<size_t>(slot)].entries[static_cast<size_t>(info.kv_owner)];
      seq_desc.insert(seq_desc.end(), {static_cast<int64_t>(s.begin[i]),
                                       static_cast<int64_t>(s.rows[i]),
                                       static_cast<int64_t>(slot) * owner.cap, entries});
      sp.max_rows = std::max<int64_t>(sp.max_rows, s.rows[i]);
      if (width == 0) continue;
      const double cols = reindex ? static_cast<double>(ncand) : static_cast<double>(entries);
      b.plan_cost.kv_bytes += cols * static_cast<double>(c.index_entry_bytes());
      b.plan_cost.flops += 2.0 * s.rows[i] * cols * c.index_n_heads * c.index_head_dim;
    }
    if (width == 0) sp.width = 0;
    sp.n_seqs = static_cast<int>(seq_desc.size() / 4);
    sp.seqs = meta_put(seq_desc);
    b.key.insert(b.key.end(), {l, sp.width, sp.n_seqs, sp.max_rows});
  }

  // Index selection of an index-source layer (model.md §2.4) into b.sel[l].
  void select(Batch& b, const RowSet& s, int32_t l, const float* qr, const float* a) {
    const Layer& L = *layers[static_cast<size_t>(l)];
    const LayerInfo& info = c.layer(l);
    const Layer& owner = *layers[static_cast<size_t>(info.kv_owner)];
    const int64_t n = s.n, d = c.hidden_size, q = c.q_lora_rank;
    const int ih = c.index_n_heads;
    const int64_t id = c.index_head_dim;
    const int k = c.index_topk;
    float* qi = buf<float>("idx_q", n * ih * id);
    linear(qr, q, n, L.idx_wq_b, qi, ih * id);
    rope(qi, n, ih, id, s.pos.as<int32_t>(), RopeKind::kCompress);
    // FP4 fake-quant of the queries (§2.4): quantise to index-key records and back.
    {
      cu::Fp4CacheWriteParams w;
      w.x = qi;
      w.ldx = id;
      w.rows = n * ih;
      w.dim = static_cast<int>(id);
      w.format = cu::Fp4Record::kIndexBlock32Ue8m0;
      w.cache = buf<uint8_t>("idx_qrec", n * ih * static_cast<int64_t>(c.index_entry_bytes()));
      // NOTE: the writer's grid has one y-block per row (<= 65535 per launch).
      for (int64_t r0 = 0; r0 < n * ih; r0 += 65535) {
        w.x = qi + r0 * id;
        w.rows = std::min<int64_t>(65535, n * ih - r0);
        w.first_entry = r0;
        cu::launch_fp4_cache_write(w, stream);
      }
      cu::launch_fp4_index_records_to_float(w.cache, n * ih, static_cast<int>(id), qi, stream);
    }
    float* hw = buf<float>("idx_w", n * ih);
    linear(a, d, n, L.idx_wproj, hw, ih);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ih)) /
                                           std::sqrt(static_cast<double>(id)));
    int32_t* sel = buf<int32_t>(fmt::format("sel_{}", l), n * k);
    b.sel[l] = sel;
    int32_t* idx = buf<int32_t>("idx_topk", n * k);
    const bool reindex = info.mode == LayerMode::kReindex;
    const int64_t ncand = candidate_count();
    const SelectPlan& sp = b.selp.at(l);
    const int64_t width = sp.width;
    if (width == 0) {
      launch_fill_i32_neg(sel, n * k);
      return;
    }
    // One launch for every sequence of the batch ([first row, rows, first pool record, keys] per
    // sequence from the plan); the kernel writes every column of every row (-inf past a row's
    // visible keys), so the score matrix needs no fill.
    float* scores = buf<float>("idx_scores", n * width);
    mark(GpuComponent::kIndexer, "scores");
    {
      cu::IndexerScoreParams p;
      p.q = qi;
      p.w = hw;
      p.rows = n;
      p.heads = ih;
      p.head_dim = static_cast<int>(id);
      p.keys = owner.index_pool.as<uint8_t>();
      p.pos = s.pos.as<int32_t>();
      p.ratio = info.ratio;
      p.candidates = reindex ? b.cand : nullptr;
      p.n_cand = reindex ? ncand : 0;
      p.scale = scale;
      p.scores = scores;
      p.ld = width;
      p.n_seqs = sp.n_seqs;
      p.seqs = sp.seqs.as<int64_t>();
      p.max_seq_rows = sp.max_rows;
      p.max_seq_keys = width;
      // The queries went through the FP4 round trip above: every value is a bf16.
      p.q_exact_bf16 = true;
      p.use_wgmma = opt.indexer_wgmma;
      p.use_fp8 = opt.indexer_fp8;
      p.cand_wgmma = opt.indexer_cand_wgmma;
      if (opt.trace && reindex) trace.indexer_cand_wgmma[l] = cu::indexer_cand_wgmma_applies(p);
      if (p.n_seqs > 0) cu::launch_indexer_scores(p, stream);
    }
    if (info.is_candidate_source) {
      mark(GpuComponent::kIndexer, "candidates");
      const int bs = c.candidate_block_size;
      const int64_t nb = (width + bs - 1) / bs;
      cu::BlockMaxParams bp;
      bp.scores = scores;
      bp.rows = n;
      bp.n = width;
      bp.ld = width;
      bp.block = bs;
      bp.pos = s.pos.as<int32_t>();
      bp.ratio = info.ratio;
      bp.out = buf<float>("blk_scores", n * nb);
      cu::launch_block_max_scores(bp, stream);
      const int kb = c.candidate_topk_blocks;
      int32_t* blk = buf<int32_t>("blk_ids", n * kb);
      topk(bp.out, n, nb, nb, kb, blk);
      // NOTE: candidates in entry order, so Reindex top-k ties pick the lowest entry id (the
      // CPU's tie rule over its candidate mask).
      cu::launch_sort_rows_ascending(blk, n, kb, stream);
      b.cand = buf<int32_t>("cand", n * ncand);
      cu::BlocksToCandidatesParams cp;
      cp.block_ids = blk;
      cp.rows = n;
      cp.kb = kb;
      cp.block = bs;
      cp.n_keys = width;
      cp.cand = b.cand;
      cu::launch_blocks_to_candidates(cp, stream);
    }
    mark(GpuComponent::kIndexer, "topk");
    topk(scores, n, width, width, k, idx);
    cu::launch_resolve_selection(idx, reindex ? b.cand : nullptr, ncand, s.row_slot.as<int64_t>(),
                                 owner.cap, n, k, sel, stream);
    if (opt.trace) {
      std::vector<float>& sv = trace.scores[l];
      sv.resize(static_cast<size_t>(n * width));
      cu::copy_d2h(sv.data(), scores, sv.size() * 4, stream);
      trace.score_width[l] = width;
      if (info.is_candidate_source) {
        trace.candidates.resize(static_cast<size_t>(n * ncand));
        cu::copy_d2h(trace.candidates.data(), b.cand, trace.candidates.size() * 4, stream);
      }
      std::vector<int32_t>& v = trace.selected[l];
      v.resize(static_cast<size_t>(n * k));
      cu::copy_d2h(v.data(), sel, v.size() * 4, stream);
      cu::stream_synchronize(stream);
    }
  }

  void launch_fill_i32_neg(int32_t* p, int64_t n) {
    cu::memset_async(p, 0xFF, static_cast<size_t>(n) * 4, stream);
  }

  // The row-scaled FP8 operand of the attention input a [n, D] in quant_rows_fp8's buffers for
  // "aq_attn" (mhc_fuse_attn_quant writes it from the expand + mixes launch).
  QuantRows attn_quant_buffers(int64_t n) {
    QuantRows r{buf<uint8_t>("aq_attn8r", n * c.hidden_size), cu::ActivationType::kMxfp8};
    r.row_scale = buf<float>("aq_attnrs", n);
    return r;
  }
  // Whether layer L's attention quantises a for a fused qkv_a GEMM on row-scaled FP8 (the input
  // mhc_fuse_attn_quant can write in advance).
  [[nodiscard]] bool attn_quant_fusable(const Layer& L) const {
    return L.wqkv_a.kind != Linear::Kind::kNone && L.wqkv_a.act_quant && fp8_rows_fits(L.wqkv_a);
  }

  // y [n, D] = attention site output of layer l for rows s (a = attn_norm output). a_fp8_ready:
  // a's row-scaled FP8 operand is already in attn_quant_buffers (mhc_fuse_attn_quant).
  void attention(Batch& b, const RowSet& s, int32_t l, const float* a, float* y,
                 bool a_fp8_ready = false) {
    Layer& L = *layers[static_cast<size_t>(l)];
    const LayerInfo& info = c.layer(l);
    const int64_t n = s.n, d = c.hidden_size, hd = c.head_dim, q = c.q_lora_rank;
    const int h = c.num_attention_heads;
    const int64_t window = c.sliding_window;
    const size_t rec = c.swa_row_bytes();
    mark(GpuComponent::kDense, "qkv_a");
    float* qr = buf<float>("qr", n * q);
    float* kv = buf<float>("kv", n * hd);
    // kv_norm's input: kv, or (fuse_qkv_a) kv's columns of the fused GEMM's output.
    const float* kv_raw = kv;
    int64_t ld_kv_raw = hd;
    const bool fused_qkv = L.wqkv_a.kind != Linear::Kind::kNone;
    if (opt.trace) trace.qkv_a[l] = fused_qkv;
    const bool quant_ready = a_fp8_ready && fused_qkv && attn_quant_fusable(L);
    if (opt.trace) trace.attn_quant_fused[l] = quant_ready;
    if (fused_qkv) {
      // One GEMM into [n, q + hd]; q_norm writes qr from its first q columns (below), kv_norm
      // reads the rest later. The same input and GEMM path as the two GEMMs (FP8 codes only where
      // wq_a and wkv each take them; they keep their shapes and kinds).
      float* qkv = buf<float>("qkv_a", n * (q + hd));
      if (quant_ready) {
        gemm_q(attn_quant_buffers(n), d, n, L.wqkv_a, qkv, q + hd);
      } else if (L.wqkv_a.act_quant) {
        const QuantRows qa = quant_rows(a, d, n, d, L.wqkv_a.kind, "aq_attn",
                                        fp8_wgmma_fits(L.wq_a) && fp8_wgmma_fits(L.wkv),
                                        fp8_rows_fits(L.wqkv_a));
        gemm_q(qa, d, n, L.wqkv_a, qkv, q + hd);
      } else {
        linear(a, d, n, L.wqkv_a, qkv, q + hd);
      }
      rms_to(qkv, q + hd, n, q, L.q_norm, qr, q);
      kv_raw = qkv + q;
      ld_kv_raw = q + hd;
    } else if (L.wq_a.act_quant && L.wkv.act_quant && L.wq_a.kind == L.wkv.kind) {
      // One quantisation of a for both projections.
      const QuantRows qa = quant_rows(a, d, n, d, L.wq_a.kind, "aq_attn",
                                      fp8_wgmma_fits(L.wq_a) && fp8_wgmma_fits(L.wkv),
                                      fp8_rows_fits(L.wq_a) && fp8_rows_fits(L.wkv));
      gemm_q(qa, d, n, L.wq_a, qr, q);
      gemm_q(qa, d, n, L.wkv, kv, hd);
    } else {
      linear(a, d, n, L.wq_a, qr, q);
      linear(a, d, n, L.wkv, kv, hd);
    }
    if (!fused_qkv) rms(qr, n, q, L.q_norm);
    float* qh = buf<float>("q", n * h * hd);
    mark(GpuComponent::kDense, "q_b");
    linear(qr, q, n, L.wq_b, qh, h * hd);
    mark(GpuComponent::kAttention, "rope_swa");
    rope(qh, n, h, hd, s.pos.as<int32_t>(), info.rope);
    rms_to(kv_raw, ld_kv_raw, n, hd, L.kv_norm, kv, hd);
    rope(kv, n, 1, hd, s.pos.as<int32_t>(), info.rope);
    uint8_t* chunk = L.swa_pool.as<uint8_t>() + static_cast<int64_t>(opt.max_seqs) * window * rec;
    {
      cu::SwaWriteParams w;
      w.kv = kv;
      w.ld_kv = hd;
      w.rows = n;
      w.dim = static_cast<int>(hd);
      w.pos = iota.as<int32_t>();
      w.ring = chunk;
      w.ring_size = static_cast<int>(std::max<int64_t>(n, 1));
      cu::launch_swa_write_fp8(w, stream);
    }
    if (info.is_index_source) {
      mark(GpuComponent::kIndexer, "query");
      select(b, s, l, qr, a);
    }
    mark(GpuComponent::kAttention, "sparse");
    cu::SparseAttentionParams p;
    p.q = qh;
    p.rows = n;
    p.heads = h;
    p.head_dim = static_cast<int>(hd);
    p.swa = L.swa_pool.as<uint8_t>();
    p.swa_idx = s.swa_idx;
    p.swa_k = static_cast<int>(window);
    p.ring_size = static_cast<int>(window);
    if (info.ratio > 0) {
      p.glob = layers[static_cast<size_t>(info.kv_owner)]->main_pool.as<uint8_t>();
      p.glob_idx = b.sel.at(info.index_owner);
      p.glob_k = c.index_topk;
    }
    p.sink = L.sink.as<float>();
    p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    p.pos = s.pos.as<int32_t>();
    p.freqs = (info.rope == RopeKind::kMain ? freqs_main : freqs_compress).as<double>();
    p.rd = c.qk_rope_head_dim;
    // attn_quant_epilogue: the attention's epilogue writes wo_a's input, o's MXFP8 fake-quant as
    // bf16 bits, into the buffer quant_rows would fill ("aq_o16"), so the fp32 o is neither
    // written nor read back (nor allocated). Only where the wgmma kernel runs (attend() sets
    // use_wgmma the same way) and out_proj takes a cuBLASLt path (bf16, or row-scaled FP8,
    // which requantises the bf16 MXFP8 values to the same row-scaled codes).
    p.use_wgmma = opt.attention_wgmma;
    const bool quant_epilogue = opt.attn_quant_epilogue && !opt.f64_attention &&
                                !opt.exact_linears && (wo_a_on_lt_bf16(L) || wo_a_on_lt_fp8(L)) &&
                                cu::sparse_attention_wgmma_applies(p);
    // attn_fp8_rows_epilogue: wo_a's row-scaled FP8 operand itself, into the buffers
    // quant_rows_fp8 would fill ("aq_o8r", "aq_ors"), where an item is a whole row (64 heads).
    const bool rows_epilogue =
        quant_epilogue && opt.attn_fp8_rows_epilogue && wo_a_on_lt_fp8(L) && h == 64;
    if (opt.trace) {
      trace.attn_quant_epilogue[l] = quant_epilogue;
      trace.attn_fp8_rows_epilogue[l] = rows_epilogue;
    }
    float* o = quant_epilogue ? nullptr : buf<float>("attn_o", n * h * hd);
    uint16_t* o16 =
        quant_epilogue && !rows_epilogue ? buf<uint16_t>("aq_o16", n * h * hd) : nullptr;
    QuantRows o8{nullptr, cu::ActivationType::kMxfp8};
    if (rows_epilogue) {
      p.out_fp8_rows = buf<uint8_t>("aq_o8r", n * h * hd);
      p.out_row_scale = buf<float>("aq_ors", n);
      o8.data = p.out_fp8_rows;
      o8.row_scale = p.out_row_scale;
    }
    p.out = o;
    p.out_mxfp8_bf16 = o16;
    attend(p);
    const double keys = static_cast<double>(window + p.glob_k);
    cost.kv_bytes += static_cast<double>(n) *
                     (static_cast<double>(window * rec) + p.glob_k * c.main_entry_bytes());
    cost.flops += 4.0 * static_cast<double>(n) * h * hd * keys;
    mark(GpuComponent::kAttention, "swa_records");
    cu::launch_copy_records(chunk, n, static_cast<int64_t>(rec), s.ring_dst.as<int64_t>(),
                            L.swa_pool.as<uint8_t>(), stream);
    out_proj(L, o, n, y, o16, rows_epilogue ? &o8 : nullptr);
  }

  // out_proj's wo_a paths: the G group GEMMs on the FP8 wgmma kernel (o's e4m3 codes), or as one
  // strided-batched cuBLASLt bf16 GEMM (o's MXFP8 fake-quant as bf16), else per-group linears.
  [[nodiscard]] bool wo_a_on_fp8_wgmma(const Layer& L) const {
    const int64_t hd = c.head_dim;
    const int h = c.num_attention_heads;
    const int64_t g = c.o_groups, og = c.o_lora_rank, gin = h * hd / g;
    return fp8_wgmma_fits(L.wo_a) && og % 128 == 0 && gin % 128 == 0;
  }
  [[nodiscard]] bool wo_a_on_lt_fp8(const Layer& L) const {
    const int64_t gin = c.num_attention_heads * c.head_dim / c.o_groups;
    return fp8_rows_fits(L.wo_a) && gin % 16 == 0 && c.num_attention_heads * c.head_dim <= 65536;
  }
  [[nodiscard]] bool wo_a_on_lt_bf16(const Layer& L) const {
    return !wo_a_on_fp8_wgmma(L) && !wo_a_on_lt_fp8(L) && L.wo_a.act_quant &&
           L.wo_a.kind == Linear::Kind::kFp8 && L.wo_a.wbf16.bytes() > 0;
  }

  // wo_a's G group GEMMs as one strided-batched cuBLASLt call on n rows: group gi reads the
  // input's columns [gi gin, +gin) (pitch H*hd), wo_a's rows [gi og, +og) (pitch gin), and writes
  // mid's columns [gi og, +og) (pitch G*og).
  [[nodiscard]] cu::LtGemmParams wo_a_batched(cu::GemmPrecision precision, const void* a,
                                              const void* w, float* mid, int64_t n) const {
    const int64_t g = c.o_groups, og = c.o_lora_rank;
    const int64_t gin = c.num_attention_heads * c.head_dim / g;
    cu::LtGemmParams p;
    p.precision = precision;
    p.a = a;
    p.lda = c.num_attention_heads * c.head_dim;
    p.b = w;
    p.ldb = gin;
    p.b_transposed = true;
    p.c = mid;
    p.ldc = g * og;
    p.m = n;
    p.n = og;
    p.k = gin;
    p.batch = g;
    p.stride_a = gin;
    p.stride_b = og * gin;
    p.stride_c = og;
    return p;
  }
  // The roofline's share of wo_a's G group GEMMs on n rows (FP8 weights, MXFP8 inputs).
  void add_wo_a_cost(const Layer& L, int64_t n) {
    const double flops = 2.0 * static_cast<double>(n) * c.o_lora_rank *
                         (c.num_attention_heads * c.head_dim / c.o_groups) * c.o_groups;
    cost.flops += flops;
    cost.fp8_flops += flops;
    cost.weight_bytes += static_cast<double>(L.wo_a.bytes());
  }

  // Grouped low-rank output projection (§2.5): [n, H*hd] -> [n, G*O] -> [n, D]. o16 (optional):
  // wo_a's input already quantised, o's MXFP8 fake-quant as bf16 bits [n, H*hd] from the
  // attention's epilogue (attn_quant_epilogue; o is then null), for the cuBLASLt paths only. o8
  // (optional): wo_a's row-scaled FP8 operand itself from that epilogue (attn_fp8_rows_epilogue;
  // o and o16 null), for the row-scaled FP8 path only.
  void out_proj(Layer& L, const float* o, int64_t n, float* y, const uint16_t* o16 = nullptr,
                const QuantRows* o8 = nullptr) {
    const int64_t d = c.hidden_size, hd = c.head_dim;
    const int h = c.num_attention_heads;
    mark(GpuComponent::kDense, "o");
    const int64_t g = c.o_groups, og = c.o_lora_rank, gin = h * hd / g;
    float* mid = buf<float>("attn_mid", n * g * og);
    MS_CHECK(o16 == nullptr || wo_a_on_lt_bf16(L) || wo_a_on_lt_fp8(L));
    MS_CHECK(o8 == nullptr || (wo_a_on_lt_fp8(L) && o16 == nullptr && o == nullptr));
    if (wo_a_on_lt_fp8(L)) {
      // The G group GEMMs as one strided-batched row-scaled FP8 cuBLASLt GEMM over one
      // quantisation of o (or of the epilogue's o16, whose MXFP8 values requantise to
      // themselves), refolded per row over all H*hd channels: group gi reads the codes' columns
      // [gi gin, +gin) with the row's one scale and wo_a's rows [gi og, +og) with theirs, and
      // writes mid's columns [gi og, +og), unscaled: wo_b's quantiser applies the row scales and
      // wo_a's row scales (mid's columns) on load, as a scaling pass would (bit for bit).
      const QuantRows qo =
          o8 != nullptr ? *o8
          : o16 != nullptr
              ? quant_rows_fp8(o16, cu::ActivationType::kBF16, h * hd, n, h * hd, "aq_o")
              : quant_rows_fp8(o, cu::ActivationType::kF32, h * hd, n, h * hd, "aq_o");
      cu::LtGemmParams p = wo_a_batched(cu::GemmPrecision::kFp8RowScaled, qo.data,
                                        L.wo_a.w8r.as<uint8_t>(), mid, n);
      p.a_scale = qo.row_scale;
      p.b_scale = L.wo_a.w8r_scale.as<float>();
      p.unscaled = fp8_rows_fits(L.wo_b) && g * og <= 65536;
      lt->run(p);
      add_wo_a_cost(L, n);
      if (p.unscaled) {
        const QuantRows qm = quant_rows_fp8(mid, cu::ActivationType::kF32, g * og, n, g * og,
                                            "aq_mid", qo.row_scale, L.wo_a.w8r_scale.as<float>());
        gemm_q(qm, g * og, n, L.wo_b, y, d);
        return;
      }
    } else if (wo_a_on_fp8_wgmma(L)) {
      // The G group GEMMs on the FP8 wgmma kernel: group gi reads the codes' columns
      // [gi gin, +gin) (and their scales) and wo_a's rows [gi og, +og) (whose row pitch is gin).
      const QuantRows qo = quant_rows(o, h * hd, n, h * hd, L.wo_a.kind, "aq_o", true);
      for (int64_t gi = 0; gi < g; ++gi)
        fp8_wgmma(qo, h * hd, gi * gin, n, L.wo_a, gi * og, og, gin, gin, mid + gi * og, g * og);
      add_wo_a_cost(L, n);
    } else if (wo_a_on_lt_bf16(L)) {
      // The G group GEMMs as one strided-batched cuBLASLt call: group gi reads o's channels
      // [gi gin, +gin) and wo_a's rows [gi og, +og), and writes mid's columns [gi og, +og).
      lt->run(wo_a_batched(
          cu::GemmPrecision::kBf16F32,
          o16 != nullptr ? o16 : quant_rows(o, h * hd, n, h * hd, L.wo_a.kind, "aq_o").data,
          L.wo_a.wbf16.as<uint16_t>(), mid, n));
      add_wo_a_cost(L, n);
    } else {
      for (int64_t gi = 0; gi < g; ++gi)
        linear(o + gi * gin, h * hd, n, L.wo_a, mid + gi * og, g * og, gi * og, og);
    }
    linear(mid, g * og, n, L.wo_b, y, d);
  }

  // The sparse attention core with the options' precision and kernel (the wgmma kernel, one
  // persistent block per SM over (row, 64 heads) items, is faster at every row count measured:
  // H200, hi + lo, 1 row 83 vs 103 us, 512 rows 322 vs 871 us; docs/perf/forward-gpu-2026-11-30-r6.md).
  void attend(cu::SparseAttentionParams& p) {
    p.split_precision = !opt.fast_attention;
    p.use_wgmma = opt.attention_wgmma;
    p.swa_f16_scale = opt.attention_swa_f16_scale;
    p.warp_specialized = opt.attention_ws;
    p.ws_q_in_b = opt.attention_ws_q_in_b;
    if (opt.f64_attention) {
      cu::launch_sparse_attention_f64(p, stream);
    } else {
      cu::launch_sparse_attention(p, stream);
    }
  }

  // y [n, D] = MoE of f [n, D] (model.md §5): routed over every expert, the hits on local experts
  // grouped on the device and computed by the grouped MXFP4 GEMM, shared expert added.
  // The routed experts' SwiGLU quantiser (gate and up left to the caller, pitch intermediate) on
  // up to cap grouped rows, the count at total: routing weights pw, output out of type t.
  [[nodiscard]] cu::SwigluQuantParams routed_swiglu(const float* pw, int64_t cap,
                                                    const int32_t* total, void* out,
                                                    cu::ActivationType t) const {
    const int64_t inter = c.moe_intermediate_size;
    cu::SwigluQuantParams sq;
    sq.ld = inter;
    sq.row_weight = pw;
    sq.rows = cap;
    sq.device_rows = total;
    sq.cols = inter;
    sq.limit = static_cast<float>(c.swiglu_limit);
    sq.out = out;
    sq.out_type = t;
    sq.ldo = inter;
    return sq;
  }

  // GpuModelOptions::moe_fp8: the routed experts of layer L on the FP8 grouped GEMM, into ye
  // [grouped rows, d]: the gathered rows (perm, up to cap of them, the count at offsets[local])
  // row-scaled and K-permuted, w1 and w3 into fp32 gate / up, the SwiGLU (routing weight pw) to
  // its MXFP8 values in fp32, those row-scaled and K-permuted again, w2. max_rows: grouped rows
  // per expert, upper bound.
  void moe_fp8_experts(Layer& L, int32_t local, int64_t max_rows, int64_t cap, const float* f,
                       const int32_t* perm, const float* pw, const int32_t* offsets, float* ye) {
    const int64_t d = c.hidden_size, inter = c.moe_intermediate_size;
    if (L.expert_ref_ptrs.bytes() == 0) {
      // w1, w3 (inter rows each), w2 (d rows) of every local expert, one buffer.
      const int64_t per = 2 * inter + d;
      L.expert_refs = DeviceMemory(static_cast<size_t>(local * per));
      std::vector<const uint8_t*> ptrs(static_cast<size_t>(3 * local));
      for (int32_t ex = 0; ex < local; ++ex) {
        const Ffn& w = L.experts[static_cast<size_t>(ex)];
        uint8_t* base = L.expert_refs.as<uint8_t>() + ex * per;
        const Linear* lins[3] = {&w.w1, &w.w3, &w.w2};
        const int64_t off[3] = {0, inter, 2 * inter};
        for (int i = 0; i < 3; ++i) {
          cu::launch_mxfp4_row_ref(lins[i]->scale.as<uint8_t>(), lins[i]->out, lins[i]->in,
                                   base + off[i], stream);
          ptrs[static_cast<size_t>(i * local + ex)] = base + off[i];
        }
      }
      L.expert_ref_ptrs = DeviceMemory(ptrs.size() * sizeof(void*));
      cu::copy_h2d(L.expert_ref_ptrs.as(), ptrs.data(), ptrs.size() * sizeof(void*), stream);
      cu::stream_synchronize(stream);
    }
    const auto* const* ptr = L.expert_ptrs.as<const uint8_t*>();
    const auto* const* ref = L.expert_ref_ptrs.as<const uint8_t*>();
    const int32_t* total = offsets + local;
    uint8_t* x8 = buf<uint8_t>("moe_x8", cap * d);
    float* xs = buf<float>("moe_xs", cap);
    uint8_t* h8 = buf<uint8_t>("moe_h8", cap * inter);
    float* hs = buf<float>("moe_hs", cap);
    float* h32 = buf<float>("moe_h32", cap * inter);
    float* ge = buf<float>("moe_ge", cap * inter);
    float* ue = buf<float>("moe_ue", cap * inter);
    const auto quant = [&](const float* x, const int32_t* rows_of, int64_t cols, uint8_t* out,
                           float* rs) {
      cu::ActQuantFp8RowsParams q;
      q.x = x;
      q.ldx = cols;
      q.rows = cap;
      q.device_rows = total;
      q.row_index = rows_of;
      q.cols = cols;
      q.out = out;
      q.ldo = cols;
      q.row_scale = rs;
      q.kperm_fp8 = true;
      cu::launch_act_quant_fp8_rows(q, stream);
    };
    cu::GroupedFp8GemmParams g;
    g.offsets = offsets;
    g.num_experts = local;
    g.max_rows = max_rows;
    const auto gemm = [&](const uint8_t* a, const float* as, int64_t kdim, int set, float* out,
                          int64_t ndim) {
      g.a = a;
      g.lda = kdim;
      g.a_scale = as;
      g.w = ptr + 2 * set * local;
      g.w_scale = ptr + (2 * set + 1) * local;
      g.w_ref = ref + set * local;
      g.y = out;
      g.ldy = ndim;
      g.n = ndim;
      g.k = kdim;
      cu::launch_grouped_fp8_gemm(g, stream);
    };
    mark(GpuComponent::kMoe, "act_quant");
    quant(f, perm, d, x8, xs);
    mark(GpuComponent::kMoe, "w13");
    gemm(x8, xs, d, 0, ge, inter);
    gemm(x8, xs, d, 1, ue, inter);
    mark(GpuComponent::kMoe, "swiglu_quant");
    cu::SwigluQuantParams sq = routed_swiglu(pw, cap, total, h32, cu::ActivationType::kF32);
    sq.gate = ge;
    sq.up = ue;
    cu::launch_swiglu_quant_mxfp8(sq, stream);
    quant(h32, nullptr, inter, h8, hs);
    mark(GpuComponent::kMoe, "w2");
    gemm(h8, hs, inter, 2, ye, d);
  }

  // The slot rows C of the padded FP8 experts for rows_hint expected hits per local expert
  // (GpuModelOptions::moe_padded_fp8), or 0 where the path does not apply.
  [[nodiscard]] int64_t padded_group_rows(int64_t rows_hint) const {
    const int64_t d = c.hidden_size, inter = c.moe_intermediate_size;
    if (!opt.moe_padded_fp8 || opt.moe_fp8 || rows_hint < std::max<int64_t>(opt.moe_padded_min_rows, 1) ||
        d % 32 != 0 || inter % 32 != 0)
      return 0;
    if (opt.moe_padded_group_rows > 0) return opt.moe_padded_group_rows;
    const int64_t want = rows_hint + std::max<int64_t>(rows_hint / 4, 32);
    return (want + 63) / 64 * 64;
  }

  // The routed experts of layer L as padded strided-batched FP8 GEMMs (moe_padded_fp8, C slot
  // rows per expert): the slot plan from the grouped hits, the e4m3 inputs, w1 + w3 unscaled into
  // gu [local][C][2 inter], the SwiGLU (with the GEMM's outer scales and the routing weight) to its
  // MXFP8 values, those row-scaled again, w2 unscaled into "moe_ye_pad" [local][C][hidden]. The
  // overflow hits' grouped lists (ov_row, ov_weight, ov_offsets) for the grouped path, and the
  // combine's parameters, come back in the result.
  struct PaddedMoe {
    int32_t* ov_row = nullptr;
    float* ov_weight = nullptr;
    int32_t* ov_offsets = nullptr;
    cu::MoeCombinePaddedParams combine;
  };
  PaddedMoe moe_padded_experts(Layer& L, int32_t local, int64_t C, int64_t cap, int64_t n, int k,
                               const float* f, const int32_t* perm, const float* pw,
                               const int32_t* offsets, const int32_t* inv, bool fork_overflow,
                               const QuantRows* fq) {
    const int64_t d = c.hidden_size, inter = c.moe_intermediate_size;
    if (L.pf8_w13.bytes() == 0) {
      L.pf8_w13 = DeviceMemory(static_cast<size_t>(local * 2 * inter * d));
      L.pf8_s13 = DeviceMemory(static_cast<size_t>(local * 2 * inter) * sizeof(float));
      L.pf8_w2 = DeviceMemory(static_cast<size_t>(local * d * inter));
      L.pf8_s2 = DeviceMemory(static_cast<size_t>(local * d) * sizeof(float));
      for (int32_t ex = 0; ex < local; ++ex) {
        const Ffn& w = L.experts[static_cast<size_t>(ex)];
        const auto fold = [&](const Linear& lin, uint8_t* out, float* scale) {
          MS_CHECK(lin.kind == Linear::Kind::kMxfp4);
          cu::launch_fold_mxfp4_rows(lin.w.as<uint8_t>(), lin.scale.as<uint8_t>(), lin.out, lin.in,
                                     out, scale, stream);
        };
        uint8_t* w13 = L.pf8_w13.as<uint8_t>() + ex * 2 * inter * d;
        float* s13 = L.pf8_s13.as<float>() + ex * 2 * inter;
        fold(w.w1, w13, s13);
        fold(w.w3, w13 + inter * d, s13 + inter);
        fold(w.w2, L.pf8_w2.as<uint8_t>() + ex * d * inter, L.pf8_s2.as<float>() + ex * d);
      }
      cu::stream_synchronize(stream);
    }
    const int64_t slots = local * C;
    PaddedMoe r;
    mark(GpuComponent::kMoe, "group");
    cu::MoePadPlanParams pp;
    pp.offsets = offsets;
    pp.perm_row = perm;
    pp.perm_weight = pw;
    pp.inv = inv;
    pp.hits = n * k;
    pp.local = local;
    pp.group_rows = C;
    pp.grouped_bound = cap;
    pp.pad_row = buf<int32_t>("moe_pad_row", slots);
    pp.pad_weight = buf<float>("moe_pad_w", slots);
    pp.pad_inv = buf<int32_t>("moe_pad_inv", n * k);
    if (L.moe_ov_offsets.bytes() == 0)
      L.moe_ov_offsets = DeviceMemory(static_cast<size_t>(local + 1) * sizeof(int32_t));
    pp.ov_offsets = r.ov_offsets = L.moe_ov_offsets.as<int32_t>();
    pp.ov_row = r.ov_row = buf<int32_t>("moe_ov_row", cap);
    pp.ov_weight = r.ov_weight = buf<float>("moe_ov_w", cap);
    cu::launch_moe_pad_plan(pp, stream);
    // moe_overflow_side_stream: the overflow's inputs are ready here; the side stream starts it.
    if (fork_overflow) cu::event_record(ev_plan, stream);
    uint8_t* x8 = buf<uint8_t>("moe_pad_x8", slots * d);
    float* xs = buf<float>("moe_pad_xs", slots);
    // moe_padded_bf16: the GEMMs' unscaled sums stored as bf16 (not with the two-pass SwiGLU
    // test form, whose launch reads fp32).
    const bool bf16 = opt.moe_padded_bf16 && !opt.moe_padded_two_pass_swiglu;
    const size_t osize = bf16 ? 2 : 4;
    void* gu = buf<uint8_t>("moe_pad_gu", slots * 2 * inter * static_cast<int64_t>(osize));
    uint8_t* h8 = buf<uint8_t>("moe_pad_h8", slots * inter);
    float* hs = buf<float>("moe_pad_hs", slots);
    void* ye = buf<uint8_t>("moe_ye_pad", slots * d * static_cast<int64_t>(osize));
    // `rows` rows of x (row r reads x's row rows_of[r] when set) row-scaled into out / rs.
    const auto quant = [&](const float* x, int64_t rows, const int32_t* rows_of, int64_t cols,
                           uint8_t* out, float* rs) {
      cu::ActQuantFp8RowsParams q;
      q.x = x;
      q.ldx = cols;
      q.rows = rows;
      q.row_index = rows_of;
      q.cols = cols;
      q.out = out;
      q.ldo = cols;
      q.row_scale = rs;
      q.min_chunks_per_thread = opt.moe_padded_quant_cpt;
      cu::launch_act_quant_fp8_rows(q, stream);
    };
    const auto gemm = [&](const uint8_t* a, int64_t kdim, const uint8_t* w, void* out,
                          int64_t ndim) {
      cu::LtGemmParams g;
      g.precision = cu::GemmPrecision::kFp8RowScaled;
      g.unscaled = true;
      g.c_bf16 = bf16;
      g.a = a;
      g.lda = kdim;
      g.b = w;
      g.ldb = kdim;
      g.c = out;
      g.ldc = ndim;
      g.m = C;
      g.n = ndim;
      g.k = kdim;
      g.batch = local;
      g.stride_a = C * kdim;
      g.stride_b = ndim * kdim;
      g.stride_c = C * ndim;
      lt->run(g);
    };
    mark(GpuComponent::kMoe, "act_quant");
    if (opt.moe_padded_gather_quant) {
      // Each token row quantised once, then its codes and scale copied to its slot rows (the
      // same bits as quantising per slot row: launch_gather_fp8_rows). moe_quant_once: the
      // codes the shared expert read (fq, the same launch on the same f).
      const uint8_t* xt = nullptr;
      const float* xts = nullptr;
      if (fq != nullptr) {
        if (side_stream != nullptr && !opt.profile) cu::stream_wait_event(stream, ev_quant);
        xt = static_cast<const uint8_t*>(fq->data);
        xts = fq->row_scale;
      } else {
        uint8_t* x8t = buf<uint8_t>("moe_pad_xt8", n * d);
        float* xs8t = buf<float>("moe_pad_xts", n);
        quant(f, n, nullptr, d, x8t, xs8t);
        xt = x8t;
        xts = xs8t;
      }
      cu::GatherFp8RowsParams g;
      g.src = xt;
      g.ld_src = d;
      g.src_scale = xts;
      g.row_index = pp.pad_row;
      g.rows = slots;
      g.cols = d;
      g.out = x8;
      g.ldo = d;
      g.out_scale = xs;
      cu::launch_gather_fp8_rows(g, stream);
    } else {
      quant(f, slots, pp.pad_row, d, x8, xs);
    }
    mark(GpuComponent::kMoe, "w13");
    gemm(x8, d, L.pf8_w13.as<uint8_t>(), gu, 2 * inter);
    mark(GpuComponent::kMoe, "swiglu_quant");
    if (opt.moe_padded_two_pass_swiglu) {
      // The same codes in two launches (the test of the one-pass form).
      float* h32 = buf<float>("moe_pad_h32", slots * inter);
      cu::SwigluQuantParams sq =
          routed_swiglu(pp.pad_weight, slots, nullptr, h32, cu::ActivationType::kF32);
      sq.gate = static_cast<const float*>(gu);
      sq.up = static_cast<const float*>(gu) + inter;
      sq.ld = 2 * inter;
      sq.in_row_scale = xs;
      sq.gate_col_scale = L.pf8_s13.as<float>();
      sq.up_col_scale = L.pf8_s13.as<float>() + inter;
      sq.ld_col_scale = 2 * inter;
      sq.group_rows = C;
      cu::launch_swiglu_quant_mxfp8(sq, stream);
      quant(h32, slots, nullptr, inter, h8, hs);
    } else {
      // The SwiGLU (outer scales, clamp, routing weight) as the quantiser's input: one pass.
      cu::ActQuantFp8RowsParams q;
      q.x = gu;
      q.x_type = bf16 ? cu::ActivationType::kBF16 : cu::ActivationType::kF32;
      q.ldx = 2 * inter;
      q.rows = slots;
      q.cols = inter;
      q.out = h8;
      q.ldo = inter;
      q.row_scale = hs;
      q.swiglu.up = static_cast<const uint8_t*>(gu) + inter * static_cast<int64_t>(osize);
      q.swiglu.row_weight = pp.pad_weight;
      q.swiglu.limit = static_cast<float>(c.swiglu_limit);
      q.swiglu.row_scale = xs;
      q.swiglu.gate_col_scale = L.pf8_s13.as<float>();
      q.swiglu.up_col_scale = L.pf8_s13.as<float>() + inter;
      q.swiglu.ld_col_scale = 2 * inter;
      q.swiglu.group_rows = C;
      q.swiglu.skip_zero_weight = opt.moe_padded_skip_empty;
      q.warp_per_row = opt.moe_padded_warp_quant;
      q.min_chunks_per_thread = opt.moe_padded_quant_cpt;
      cu::launch_act_quant_fp8_rows(q, stream);
    }
    mark(GpuComponent::kMoe, "w2");
    gemm(h8, inter, L.pf8_w2.as<uint8_t>(), ye, d);
    r.combine.src = ye;
    r.combine.src_bf16 = bf16;
    r.combine.row_scale = hs;
    r.combine.col_scale = L.pf8_s2.as<float>();
    r.combine.slot_rows = slots;
    r.combine.group_rows = C;
    r.combine.inv = pp.pad_inv;
    r.combine.rows = n;
    r.combine.k = k;
    r.combine.cols = d;
    return r;
  }

  // The padded FP8 experts' slot rows C of layer L's MoE at n rows (0: the grouped path; always
  // with the fp32 test experts).
  [[nodiscard]] int64_t moe_slot_rows(const Layer& L, int64_t n, int k) const {
    if (L.experts.empty() || L.experts.front().w1.kind == Linear::Kind::kF32) return 0;
    const int64_t reps = std::max(opt.moe_ep_ranks, 1);
    const int64_t e = c.routed_experts_of(L.id);
    return padded_group_rows((n * k * reps + e - 1) / e);
  }

  // moe_quant_once: whether layer L's MoE at n rows takes both the shared expert's row-scaled
  // FP8 w1 + w3 and the padded experts' gathered FP8 rows (the same quantiser on the same f).
  [[nodiscard]] bool quant_once_applies(const Layer& L, int64_t n, int k) const {
    if (!opt.moe_quant_once || !opt.moe_padded_gather_quant) return false;
    const Linear& w13 = L.shared_w13;
    if (w13.kind == Linear::Kind::kNone || !w13.act_quant || !fp8_rows_fits(w13)) return false;
    return moe_slot_rows(L, n, k) > 0;
  }

  void moe(const RowSet& s, int32_t l, const float* f, float* y) {
    Layer& L = *layers[static_cast<size_t>(l)];
    const int64_t n = s.n, d = c.hidden_size, inter = c.moe_intermediate_size;
    const int k = c.experts_per_tok_of(l);
    const int64_t e = c.routed_experts_of(l);
    int32_t* ids = buf<int32_t>("moe_ids", n * k);
    float* wts = buf<float>("moe_w", n * k);
    // moe_shared_overlap: the side stream's shared expert starts from here (f is ready), not
    // after the router.
    const int32_t local = static_cast<int32_t>(L.experts.size());
    const bool overlap = side_stream != nullptr && !opt.profile && local > 0;
    // moe_quant_once: f's row-scaled FP8 codes, for the shared expert's fused w1 + w3 and the
    // padded experts' gather, from one launch. With the side stream the launch is its first (off
    // the main stream's chain: the router's GEMM runs meanwhile), and the padded experts' gather
    // waits for it (ev_quant).
    std::optional<QuantRows> fq;
    const bool quant_once = quant_once_applies(L, n, k);
    if (opt.trace) trace.moe_quant_once[l] = quant_once;
    if (overlap) cu::event_record(ev_fork, stream);
    if (quant_once) {
      if (overlap) {
        cu::stream_wait_event(side_stream, ev_fork);
        std::swap(stream, side_stream);
      }
      mark(GpuComponent::kMoe, "act_quant");
      fq = quant_rows_fp8(f, cu::ActivationType::kF32, d, n, d, "aq_ffn");
      mark(GpuComponent::kMoe, "router");
      if (overlap) {
        std::swap(stream, side_stream);
        cu::event_record(ev_quant, side_stream);
      }
    }
    cu::MoeRouterParams rp;
    rp.x = f;
    rp.ldx = d;
    rp.gate_weight = L.gate.as<float>();
    rp.bias = L.bias.as<float>();
    rp.num_tokens = n;
    rp.hidden = d;
    rp.num_experts = e;
    rp.top_k = k;
    rp.temperature = static_cast<float>(c.gate_temp);
    rp.route_scale = static_cast<float>(c.routed_scaling_factor);
    rp.topk_ids = ids;
    rp.topk_weights = wts;
    // z = f · Wg^T for the whole batch in fp32 (no plain TF32: routing needs fp32). With
    // router_split_tf32, one TF32 GEMM of K = 3 d: [f_lo | f_hi | f_hi] · [w_hi | w_lo | w_hi]^T.
    // NOTE: fp32-class, not bit-identical to the fp32 GEMM (the terms' roundings, the summation
    // order). The lo terms come first in K in case the tensor cores' fp32 accumulation truncates
    // (published for V100/A100): they then build on a small running sum instead of each losing up
    // to an ulp of the full one (a host model of one K = 15360 chain: 4.6e-5 -> 1.3e-5 of max|z|;
    // with round-to-nearest sums the order hardly matters).
    float* z = buf<float>("moe_logits", n * e);
    if (L.gate_split.bytes() > 0) {
      float* fs = buf<float>("moe_f_split", n * 3 * d);
      cu::SplitTf32Params sp;
      sp.x = f;
      sp.ldx = d;
      sp.rows = n;
      sp.cols = d;
      sp.out = fs;
      sp.ldo = 3 * d;
      sp.lo_part = 0;
      cu::launch_split_tf32(sp, stream);
      lt_gemm(cu::GemmPrecision::kTf32, fs, 3 * d, L.gate_split.as<float>(), 3 * d, z, e, n, e,
              3 * d);
    } else if (const int64_t rs = opt.router_f32_slices < 0
                                      ? cu::router_logits_auto_slices(n, e, d)
                                      : std::min<int64_t>(opt.router_f32_slices, d / 16);
               rs > 0 && d % 16 == 0 && !opt.exact_linears && !opt.trace) {
      // router_f32_slices: our split-K FFMA GEMM (cuda::launch_router_logits_f32), the router
      // kernel sums the slices in order; < 0: the slices that fill the SMs once.
      z = buf<float>("moe_logit_slices", rs * n * e);
      cu::RouterLogitsParams p;
      p.x = f;
      p.ldx = d;
      p.w = L.gate.as<float>();
      p.rows = n;
      p.experts = e;
      p.hidden = d;
      p.slices = static_cast<int>(rs);
      p.out = z;
      cu::launch_router_logits_f32(p, stream);
      rp.logit_slices = static_cast<int>(rs);
      rp.slice_stride = n * e;
    } else if (const int64_t sk = opt.router_split_k;
               sk > 1 && d % sk == 0 && !opt.exact_linears && !opt.trace) {
      // router_split_k: slice s = f[:, s ks, +ks) · Wg[:, s ks, +ks)^T, the router sums them.
      const int64_t ks = d / sk;
      z = buf<float>("moe_logit_slices", sk * n * e);
      cu::LtGemmParams p;
      p.precision = cu::GemmPrecision::kF32;
      p.a = f;
      p.lda = d;
      p.b = L.gate.as<float>();
      p.ldb = d;
      p.b_transposed = true;
      p.c = z;
      p.ldc = e;
      p.m = n;
      p.n = e;
      p.k = ks;
      p.batch = sk;
      p.stride_a = ks;
      p.stride_b = ks;
      p.stride_c = n * e;
      lt->run(p);
      rp.logit_slices = static_cast<int>(sk);
      rp.slice_stride = n * e;
    } else {
      lt_gemm(cu::GemmPrecision::kF32, f, d, L.gate.as<float>(), d, z, e, n, e, d);
    }
    rp.logits = z;
    cu::launch_moe_router(rp, stream);
    cost.flops += 2.0 * n * e * d;  // the logical product, split or not
    cost.weight_bytes += static_cast<double>(L.gate.bytes());
    cu::MoeGroupParams gp;
    gp.ids = ids;
    gp.weights = wts;
    if (s.any_image) {
      // NOTE: bias_vl replaces bias for image rows (§5): a second routing pass, picked per row.
      rp.bias = L.bias_vl.as<float>();
      rp.topk_ids = buf<int32_t>("moe_ids_vl", n * k);
      rp.topk_weights = buf<float>("moe_w_vl", n * k);
      cu::launch_moe_router(rp, stream);
      gp.ids_vl = rp.topk_ids;
      gp.weights_vl = rp.topk_weights;
      gp.image = s.image.as<uint8_t>();
    }
    // Shared expert (clamped SwiGLU too, oracle choice 6) straight into y; with
    // moe_shared_overlap on the side stream, joined before the combine adds the routed hits.
    mark(GpuComponent::kMoe, "shared");  // (profile: no overlap, one stream)
    if (overlap) {
      cu::stream_wait_event(side_stream, ev_fork);
      std::swap(stream, side_stream);  // every launch and cuBLASLt call below goes to the side
      std::swap(lt, side_lt);
    }
    float* g1 = buf<float>("moe_g", n * inter);
    const bool fused = L.shared_w13.kind != Linear::Kind::kNone;
    if (opt.trace) trace.shared_w13[l] = fused;
    if (fused) {
      // fuse_shared_w13: one GEMM into [n, 2 inter], gate = columns [0, inter), up = the rest.
      // The same input and GEMM path as the two below (FP8 codes only where w1 and w3 each take
      // them), the same cost (w13 is w1's and w3's bytes and rows).
      const Linear& w13 = L.shared_w13;
      float* gu = buf<float>("moe_gu", n * 2 * inter);
      if (w13.act_quant) {
        const QuantRows qf =
            fq ? *fq
               : quant_rows(f, d, n, d, w13.kind, "aq_ffn",
                            fp8_wgmma_fits(L.shared.w1) && fp8_wgmma_fits(L.shared.w3),
                            fp8_rows_fits(w13));
        gemm_q(qf, d, n, w13, gu, 2 * inter);
      } else {
        linear(f, d, n, w13, gu, 2 * inter);
      }
      swiglu(gu, gu + inter, g1, n, inter, nullptr, 2 * inter);
    } else {
      float* u1 = buf<float>("moe_u", n * inter);
      if (L.shared.w1.act_quant && L.shared.w3.act_quant && L.shared.w1.kind == L.shared.w3.kind) {
        const QuantRows qf =  // for w1 and w3
            quant_rows(f, d, n, d, L.shared.w1.kind, "aq_ffn",
                       fp8_wgmma_fits(L.shared.w1) && fp8_wgmma_fits(L.shared.w3),
                       fp8_rows_fits(L.shared.w1) && fp8_rows_fits(L.shared.w3));
        gemm_q(qf, d, n, L.shared.w1, g1, inter);
        gemm_q(qf, d, n, L.shared.w3, u1, inter);
      } else {
        linear(f, d, n, L.shared.w1, g1, inter);
        linear(f, d, n, L.shared.w3, u1, inter);
      }
      swiglu(g1, u1, g1, n, inter, nullptr);
    }
    linear(g1, inter, n, L.shared.w2, y, d);
    if (overlap) {
      std::swap(stream, side_stream);
      std::swap(lt, side_lt);
      cu::event_record(ev_join, side_stream);
    }
    if (local == 0) return;
    mark(GpuComponent::kMoe, "group");
    // Group the local hits by expert on the device (no host sync).
    if (L.moe_offsets.bytes() == 0) L.moe_offsets = DeviceMemory(static_cast<size_t>(local + 1) * 4);
    int32_t* offsets = L.moe_offsets.as<int32_t>();
    // moe_ep_ranks R > 1: the local experts also compute R - 1 copies of every local hit, the
    // tokens the other ranks of an expert-parallel group would send (bench of one DEP rank).
    const int64_t reps = std::max(opt.moe_ep_ranks, 1);
    int32_t* perm = buf<int32_t>("moe_perm", n * k * reps);
    float* pw = buf<float>("moe_pw", n * k * reps);
    int32_t* inv = buf<int32_t>("moe_inv", n * k);
    gp.rows = n;
    gp.k = k;
    gp.local = local;
    gp.replicas = static_cast<int>(reps);
    gp.experts_total = opt.moe_rank_block_replicas ? static_cast<int>(e) : 0;
    gp.ordered = opt.moe_group_ordered;
    gp.staged = opt.moe_group_staged;
    if (gp.ordered) gp.scratch = buf<int32_t>("moe_group_scratch", cu::moe_group_scratch_ints(local));
    gp.offsets = offsets;
    gp.perm_row = perm;
    gp.perm_weight = pw;
    gp.inv = inv;
    cu::launch_moe_group(gp, stream);
    moe_layers_run.push_back(l);
    const int64_t cap = n * k * reps;  // grouped rows, upper bound
    const bool exact = L.experts.front().w1.kind == Linear::Kind::kF32;
    // moe_padded_fp8: the padded FP8 GEMMs take each expert's first C hits; the grouped path
    // below then runs on the overflow hits only (usually none), as stream-K launches where it
    // can (a grid of one CTA per SM, not one per possible pass).
    const int64_t slot_rows = moe_slot_rows(L, n, k);
    if (opt.trace) trace.moe_padded[l] = slot_rows;
    L.moe_slot_rows = slot_rows;
    std::optional<PaddedMoe> padded;
    // moe_overflow_side_stream: the overflow's launches go to the side stream (after its shared
    // expert), from the slot plan on, under the padded GEMMs; the combine waits for them.
    const bool ov_side = overlap && slot_rows > 0 && opt.moe_overflow_side_stream && !opt.moe_fp8;
    if (slot_rows > 0) {
      padded = moe_padded_experts(L, local, slot_rows, cap, n, k, f, perm, pw, offsets, inv,
                                  ov_side, fq ? &*fq : nullptr);
      perm = padded->ov_row;
      pw = padded->ov_weight;
      offsets = padded->ov_offsets;
      mark(GpuComponent::kMoe, "overflow");
    }
    const cu::ActivationType qt = exact ? cu::ActivationType::kF32 : cu::ActivationType::kBF16;
    const size_t qsize = exact ? 4 : 2;
    void* xe = buf<uint8_t>("moe_xe", cap * d * static_cast<int64_t>(qsize));
    void* he = buf<uint8_t>("moe_he", cap * inter * static_cast<int64_t>(qsize));
    float* ye = buf<float>("moe_ye", cap * d);
    const int32_t* total = offsets + local;
    cu::ActQuantParams aq;
    aq.x = f;
    aq.ldx = d;
    aq.row_index = perm;
    aq.rows = cap;
    aq.device_rows = total;
    aq.cols = d;
    aq.out = xe;
    aq.out_type = qt;
    aq.ldo = d;
    cu::SwigluQuantParams sq = routed_swiglu(pw, cap, total, he, qt);  // gate and up: gate_up()
    // The fp32 w1 and w3 outputs (gate, up) of the unfused path; not allocated when the SwiGLU
    // runs in the w1 + w3 epilogue (moe_fuse_swiglu).
    const auto gate_up = [&] {
      float* ge = buf<float>("moe_ge", cap * inter);
      float* ue = buf<float>("moe_ue", cap * inter);
      sq.gate = ge;
      sq.up = ue;
      return std::pair{ge, ue};
    };
    if (exact) {
      mark(GpuComponent::kMoe, "experts_fp32");
      const auto [ge, ue] = gate_up();
      // Test mode (fp32 expert weights): the counts come to the host, one fp32 GEMM per expert.
      cu::launch_act_quant_mxfp8(aq, stream);
      std::vector<int32_t> off(static_cast<size_t>(local) + 1);
      cu::copy_d2h(off.data(), offsets, off.size() * 4, stream);
      cu::stream_synchronize(stream);
      const auto each = [&](auto&& fn) {
        for (int32_t ex = 0; ex < local; ++ex) {
          const int64_t o0 = off[static_cast<size_t>(ex)];
          const int64_t cnt = off[static_cast<size_t>(ex) + 1] - o0;
          if (cnt > 0) fn(L.experts[static_cast<size_t>(ex)], o0, cnt);
        }
      };
      const auto* xq = static_cast<const float*>(xe);
      const auto* hq = static_cast<const float*>(he);
      each([&](const Ffn& w, int64_t o0, int64_t cnt) {
        gemm_raw(xq + o0 * d, qt, d, cnt, w.w1, ge + o0 * inter, inter);
        gemm_raw(xq + o0 * d, qt, d, cnt, w.w3, ue + o0 * inter, inter);
      });
      cu::launch_swiglu_quant_mxfp8(sq, stream);
      each([&](const Ffn& w, int64_t o0, int64_t cnt) {
        gemm_raw(hq + o0 * inter, qt, inter, cnt, w.w2, ye + o0 * d, d);
      });
    } else {
      // moe_overflow_side_stream: from here to the w2 launch everything goes to the side stream,
      // the stream-K flags' first clearing (use_stream_k) included, so that it precedes the
      // launches that read them.
      if (ov_side) {
        cu::stream_wait_event(side_stream, ev_plan);
        std::swap(stream, side_stream);
      }
      if (L.expert_ptrs.bytes() == 0) {
        std::vector<const uint8_t*> ptrs(static_cast<size_t>(6 * local));
        for (int32_t ex = 0; ex < local; ++ex) {
          const Ffn& w = L.experts[static_cast<size_t>(ex)];
          const Linear* lins[3] = {&w.w1, &w.w3, &w.w2};
          for (int i = 0; i < 3; ++i) {
            MS_CHECK(lins[i]->kind == Linear::Kind::kMxfp4);
            ptrs[static_cast<size_t>((2 * i) * local + ex)] = lins[i]->w.as<uint8_t>();
            ptrs[static_cast<size_t>((2 * i + 1) * local + ex)] = lins[i]->scale.as<uint8_t>();
          }
        }
        L.expert_ptrs = DeviceMemory(ptrs.size() * sizeof(void*));
        cu::copy_h2d(L.expert_ptrs.as(), ptrs.data(), ptrs.size() * sizeof(void*), stream);
        cu::stream_synchronize(stream);
      }
      const auto* const* ptr = L.expert_ptrs.as<const uint8_t*>();
      const bool fp8 = opt.moe_fp8 && d % 128 == 0 && inter % 128 == 0;
      if (opt.trace) trace.moe_fp8[l] = fp8;
      if (fp8) {
        moe_fp8_experts(L, local, n * reps, cap, f, perm, pw, offsets, ye);
        mark(GpuComponent::kMoe, "combine");
        if (overlap) cu::stream_wait_event(stream, ev_join);  // y holds the shared expert
        cu::launch_moe_combine(ye, inv, n, k, d, y, stream);
        return;
      }
      cu::GroupedMxfp4GemmParams gg;
      gg.offsets = offsets;
      gg.num_experts = local;
      gg.max_rows = n * reps;  // a token hits one expert at most once (per replica)
      // Expected hits per expert: n * k (times the replicas) spread over every routed expert.
      gg.rows_hint = (n * k * reps + e - 1) / e;
      gg.use_wgmma = opt.moe_grouped_wgmma;
      gg.wgmma_rs = opt.moe_grouped_wgmma_rs;
      gg.rs_max_pass = opt.moe_rs_max_pass;
      gg.a_rows = cap;  // moe_xe and moe_he hold cap rows
      gg.a = xe;
      gg.lda = d;
      gg.n = inter;
      gg.k = d;
      gg.ldy = inter;
      gg.w = ptr;
      gg.w_scale = ptr + local;
      // w1 and w3 read the same rows: one launch (kernels that take one set run it twice); y and
      // y_b (gate_up) once the epilogue is decided.
      gg.w_b = ptr + 2 * local;
      gg.w_scale_b = ptr + 3 * local;
      cu::GroupedMxfp4GemmParams g2 = gg;  // w2 over he
      g2.w_b = nullptr;
      g2.w_scale_b = nullptr;
      g2.y_b = nullptr;
      g2.a = he;
      g2.lda = inter;
      g2.n = d;
      g2.k = inter;
      g2.ldy = d;
      g2.w = ptr + 4 * local;
      g2.w_scale = ptr + 5 * local;
      g2.y = ye;
      // moe_kperm: only when the swapped-operand kernel reads both inputs (the other kernels
      // need the natural k order; the launch would refuse a_kperm).
      if (opt.moe_kperm && cu::grouped_mxfp4_rs_applies(gg) && cu::grouped_mxfp4_rs_applies(g2)) {
        aq.kperm64 = sq.kperm64 = true;
        gg.a_kperm = g2.a_kperm = true;
      }
      if (opt.trace) trace.moe_kperm[l] = gg.a_kperm;
      // moe_fuse_swiglu: sq's work (the same output bits) in the w1 + w3 launch's epilogue, where
      // the swapped-operand kernel takes the launch with it.
      cu::GroupedMxfp4GemmParams gf = gg;
      gf.swiglu.out = he;
      gf.swiglu.ldo = inter;
      gf.swiglu.row_weight = pw;
      gf.swiglu.limit = sq.limit;
      gf.swiglu.kperm64 = sq.kperm64;
      const bool fuse = opt.moe_fuse_swiglu && cu::grouped_mxfp4_rs_applies(gf) && !padded;
      if (opt.trace) trace.moe_fuse_swiglu[l] = fuse;
      // moe_stream_k (and the padded path's overflow): the unfused launches (192-row passes only;
      // the launch refuses others).
      if ((opt.moe_stream_k || (padded && cu::grouped_mxfp4_rs_applies(gg) &&
                                cu::grouped_mxfp4_rs_applies(g2))) &&
          (opt.moe_rs_max_pass == 0 || opt.moe_rs_max_pass == 192)) {
        use_stream_k(gg);
        use_stream_k(g2);
        // moe_overflow_exit_empty: the overflow launches return at once when no hit overflowed.
        gg.sk_exit_empty = g2.sk_exit_empty = padded && opt.moe_overflow_exit_empty;
      }
      int stream_k_launches = 0;
      const auto grouped = [&](const cu::GroupedMxfp4GemmParams& g) {
        stream_k_launches +=
            cu::launch_grouped_mxfp4_gemm(g, stream) == cu::GroupedMxfp4Kernel::kWgmmaRsStreamK;
      };
      // moe_overflow_graph_if: under capture, the overflow's launches below (everything up to
      // the w2 launch) go into an IF node's body, run where the overflow has hits (total: the
      // overflow offsets' last entry). Eager: no node, the launches as they are.
      const bool in_if = padded && if_stream != nullptr && !ov_side &&
                         cu::graph_if_begin(stream, total, if_stream);
      if (in_if) std::swap(stream, if_stream);
      mark(GpuComponent::kMoe, padded ? "overflow" : "act_quant");
      cu::launch_act_quant_mxfp8(aq, stream);
      if (fuse) {
        mark(GpuComponent::kMoe, padded ? "overflow" : "w13_swiglu");
        grouped(gf);
      } else {
        std::tie(gg.y, gg.y_b) = gate_up();
        mark(GpuComponent::kMoe, padded ? "overflow" : "w13");
        grouped(gg);
        mark(GpuComponent::kMoe, padded ? "overflow" : "swiglu_quant");
        cu::launch_swiglu_quant_mxfp8(sq, stream);
      }
      mark(GpuComponent::kMoe, padded ? "overflow" : "w2");
      grouped(g2);
      if (in_if) {
        std::swap(stream, if_stream);
        cu::graph_if_end(if_stream);
      }
      if (ov_side) {
        std::swap(stream, side_stream);
        cu::event_record(ev_ov, side_stream);
      }
      if (opt.trace) trace.moe_stream_k[l] = stream_k_launches;
    }
    mark(GpuComponent::kMoe, "combine");
    if (overlap) cu::stream_wait_event(stream, ev_join);  // y holds the shared expert
    if (ov_side) cu::stream_wait_event(stream, ev_ov);    // ye holds the overflow's rows
    if (padded) {
      padded->combine.overflow = ye;
      padded->combine.y = y;
      cu::launch_moe_combine_padded(padded->combine, stream);
      return;
    }
    cu::launch_moe_combine(ye, inv, n, k, d, y, stream);
  }

  // Whether the mHC expands of a forward of n rows take the fused expand + mixes launch.
  bool fuse_mixes(int64_t n) const {
    return opt.mhc_fuse_expand_mixes && n >= opt.mhc_fuse_min_rows;
  }

  // out [rows, cols] = clamped SwiGLU of g and u (pitch ld_in; 0: cols).
  void swiglu(const float* g, const float* u, float* out, int64_t rows, int64_t cols,
              const float* row_weight, int64_t ld_in = 0) {
    if (rows == 0) return;
    cu::SwigluParams p;
    p.gate = g;
    p.ld_gate = ld_in > 0 ? ld_in : cols;
    p.up = u;
    p.ld_up = ld_in > 0 ? ld_in : cols;
    p.out = out;
    p.ld_out = cols;
    p.rows = rows;
    p.cols = cols;
    p.limit = static_cast<float>(c.swiglu_limit);
    p.row_weight = row_weight;
    cu::launch_swiglu_clamped(p, stream);
  }

  Result<GpuForwardOutput> forward(std::span<const GpuSequenceInput> inputs, ForwardMode mode) {
    cost = GpuForwardCost{};
    trace = GpuForwardTrace{};
    moe_layers_run.clear();
    Batch b;
    b.in = inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const GpuSequenceInput& in = inputs[i];
      if (in.seq < 0 || in.seq >= opt.max_seqs || !seqs[static_cast<size_t>(in.seq)].live)
        return make_error(ErrorCode::kInvalidArgument, "gpu forward: input {}: bad sequence {}", i,
                          in.seq);
      for (size_t j = 0; j < i; ++j)
        if (inputs[j].seq == in.seq)
          return make_error(ErrorCode::kInvalidArgument, "gpu forward: sequence {} twice", in.seq);
      if (in.tokens.empty())
        return make_error(ErrorCode::kInvalidArgument, "gpu forward: input {}: no tokens", i);
      if (!in.is_image.empty() && in.is_image.size() != in.tokens.size())
        return make_error(ErrorCode::kInvalidArgument, "gpu forward: image mask size");
      for (int32_t t : in.tokens)
        if (t < 0 || t >= c.vocab_size)
          return make_error(ErrorCode::kOutOfRange, "gpu forward: token id {} outside vocab", t);
      if (in.want_main_hidden) {
        if (c.dspark_target_layer_ids.empty())
          return make_error(ErrorCode::kInvalidArgument,
                            "gpu forward: want_main_hidden without DSpark tap layers");
        for (int32_t l : c.dspark_target_layer_ids)
          if (std::find(layer_ids.begin(), layer_ids.end(), l) == layer_ids.end())
            return make_error(ErrorCode::kInvalidArgument,
                              "gpu forward: want_main_hidden needs tap layer {} (not kept)", l);
      }
      const Sequence& sq = seqs[static_cast<size_t>(in.seq)];
      if (sq.num_tokens + static_cast<int64_t>(in.tokens.size()) > opt.max_context)
        return make_error(ErrorCode::kOutOfRange, "gpu forward: sequence {} beyond {} positions",
                          in.seq, opt.max_context);
      b.total += static_cast<int64_t>(in.tokens.size());
    }
    if (b.total > opt.max_rows)
      return make_error(ErrorCode::kOutOfRange, "gpu forward: {} rows > max_rows {}", b.total,
                        opt.max_rows);
    b.total = 0;
    // Everything the launches need from the host, then one upload.
    plan(b, mode);
    meta_upload();
    // Decode-shaped forwards run as CUDA graphs (opt.cuda_graphs): the first forward of a launch
    // shape runs eagerly, the second is captured, later ones replay it.
    bool graphable = opt.cuda_graphs && !opt.trace && !opt.profile && !opt.exact_linears &&
                     !b.narrow && !b.enc.any_image;
    for (const auto& in : inputs)
      graphable = graphable && static_cast<int64_t>(in.tokens.size()) <= kGraphMaxRowsPerInput;
    const auto add_plan_cost = [&] {
      cost.weight_bytes += b.plan_cost.weight_bytes;
      cost.kv_bytes += b.plan_cost.kv_bytes;
      cost.flops += b.plan_cost.flops;
      cost.fp8_flops += b.plan_cost.fp8_flops;
    };
    // A shape's eager forward followed by one that swapped the bounded-replay buffers makes its
    // capture unusable (run_graph then returns kEager): eager below, capture next time.
    const GraphRun run = graphable ? run_graph(b.key, [&] { launch(b); }) : GraphRun::kEager;
    if (run == GraphRun::kReplayed) ++graph_replays;
    if (run == GraphRun::kCaptured) ++graph_captures;
    if (run == GraphRun::kEager) launch(b);
    add_plan_cost();
    GpuForwardOutput out;
    out.logit_inputs = b.logit_inputs;
    if (b.m > 0) {
      if (opt.host_logits) {
        out.logits.resize(static_cast<size_t>(b.m * c.vocab_size));
        cu::copy_d2h(out.logits.data(), buf<float>("logits", b.m * c.vocab_size),
                     out.logits.size() * 4, stream);
      }
      out.greedy.resize(static_cast<size_t>(b.m));
      cu::copy_d2h(out.greedy.data(), buf<int32_t>("greedy", b.m), out.greedy.size() * 4, stream);
    }
    last_taps.assign(inputs.size(), TapRows{});
    if (b.taps) {
      const RowSet& ts = b.taps_dec ? b.dec : b.enc;
      for (size_t i = 0; i < inputs.size(); ++i)
        if (inputs[i].want_main_hidden)
          last_taps[i] = {inputs[i].seq, ts.begin[i], ts.first_pos[i], ts.rows[i]};
      const int64_t width = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * c.hidden_size;
      const float* taps = buf<float>("taps", opt.max_rows * width);
      out.main_hidden.resize(inputs.size());
      out.main_hidden_positions.resize(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (!inputs[i].want_main_hidden) continue;
        const int64_t rows = ts.rows[i];
        if (inputs[i].main_hidden_to_host && rows > 0) {
          out.main_hidden[i].resize(static_cast<size_t>(rows * width));
          cu::copy_d2h(out.main_hidden[i].data(), taps + ts.begin[i] * width,
                       static_cast<size_t>(rows * width) * 4, stream);
        }
        for (int64_t r = 0; r < rows; ++r)
          out.main_hidden_positions[i].push_back(ts.first_pos[i] + static_cast<int32_t>(r));
      }
    }
    mark(GpuComponent::kOther);
    cu::stream_synchronize(stream);
    flush_profile();
    add_grouped_moe_cost();
    for (size_t i = 0; i < inputs.size(); ++i) {
      Sequence& sq = seqs[static_cast<size_t>(inputs[i].seq)];
      if (!random_weights && !c.engram_layers.empty())
        advance_engram_history(c, token_map, inputs[i].tokens, inputs[i].is_image, sq.history);
      sq.num_tokens += static_cast<int32_t>(inputs[i].tokens.size());
    }
    return out;
  }

  // The host half of a forward: positions, row sets, Engram ids, per-layer compressor and
  // selection shapes (advancing each sequence's entry counts), logits rows; everything the
  // kernels read goes into meta_host, every shape into b.key.
  void plan(Batch& b, ForwardMode mode) {
    const std::span<const GpuSequenceInput> inputs = b.in;
    const int64_t hc = c.hc_mult;
    const int32_t hashes = c.engram_num_hashes();
    meta_host.clear();
    b.key = {static_cast<int64_t>(mode), static_cast<int64_t>(inputs.size())};
    for (size_t i = 0; i < inputs.size(); ++i) {
      const GpuSequenceInput& in = inputs[i];
      Sequence& sq = seqs[static_cast<size_t>(in.seq)];
      b.start.push_back(sq.num_tokens);
      b.chunk_begin.push_back(static_cast<int32_t>(b.total));
      b.total += static_cast<int64_t>(in.tokens.size());
      if (sq.num_tokens == 0) {
        const int32_t prompt =
            in.prompt_len >= 0 ? in.prompt_len : static_cast<int32_t>(in.tokens.size());
        sq.replay_start =
            mode == ForwardMode::kProduction ? std::max(0, prompt - c.sliding_window) : 0;
      }
      for (size_t t = 0; t < in.tokens.size(); ++t)
        b.image.push_back(in.is_image.empty() ? 0 : in.is_image[t]);
    }
    // Engram hash ids of every chunk row (§4), on the host from the token ids.
    b.engram_ids.resize(c.engram_layers.size());
    if (!random_weights) {
      for (size_t e = 0; e < c.engram_layers.size(); ++e) {
        auto& ids = b.engram_ids[e];
        ids.resize(static_cast<size_t>(b.total * hashes));
        for (size_t i = 0; i < inputs.size(); ++i) {
          const auto& in = inputs[i];
          compute_engram_ids(
              c, c.engram_layers[e], token_map, seqs[static_cast<size_t>(in.seq)].history,
              in.tokens, in.is_image,
              std::span<int64_t>(ids).subspan(static_cast<size_t>(b.chunk_begin[i] * hashes),
                                              in.tokens.size() * static_cast<size_t>(hashes)));
        }
      }
    }
    // Row sets: encoder rows (all) and decoder rows (narrowed by bounded replay).
    std::vector<int32_t> zero(inputs.size(), 0), row0(inputs.size(), 0), floor(inputs.size(), 0);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Sequence& sq = seqs[static_cast<size_t>(inputs[i].seq)];
      floor[i] = sq.replay_start;
      if (mode == ForwardMode::kProduction && sq.replay_start > b.start[i])
        row0[i] =
            std::min(sq.replay_start - b.start[i], static_cast<int32_t>(inputs[i].tokens.size()));
    }
    build_set(b, b.enc, zero, zero, "enc");
    build_set(b, b.dec, row0, floor, "dec");
    for (size_t i = 0; i < inputs.size(); ++i)
      b.key.insert(b.key.end(), {b.enc.rows[i], b.dec.rows[i]});
    b.key.push_back(b.enc.any_image ? 1 : 0);
    for (const GpuSequenceInput& in : inputs) b.taps = b.taps || in.want_main_hidden;
    // NOTE: a tap layer at or before the boundary reads the encoder rows (the CPU takes the taps
    // before narrowing there too); the configs have them after it.
    b.taps_dec = !c.dspark_target_layer_ids.empty() &&
                 c.dspark_target_layer_ids.front() > c.decoder_start_layer();
    b.key.push_back(b.taps ? 1 : 0);
    {
      std::vector<int32_t> tok;
      for (const auto& in : inputs)
        for (int32_t t : in.tokens)
          for (int64_t k = 0; k < hc; ++k) tok.push_back(t);
      b.tok = meta_put(tok);
      std::vector<float> pre(static_cast<size_t>(b.enc.n * hc), 0.0f);
      for (int64_t r = 0; r < b.enc.n; ++r) pre[static_cast<size_t>(r * hc)] = 1.0f;
      b.pre0 = meta_put(pre);
    }
    // The layers in the launch order (launch()).
    const RowSet* s = &b.enc;
    const int32_t boundary = c.decoder_start_layer();
    for (const int32_t l : layer_ids) {
      const LayerInfo& info = c.layer(l);
      if (info.engram_index >= 0 && s->n > 0) plan_engram(b, *s, l);
      if (info.is_kv_source) plan_compress(b, *s, l);
      if (l >= boundary && s == &b.enc) {
        if (b.dec.n != b.enc.n) {
          b.narrow = true;
          std::vector<int32_t> keep;
          for (size_t i = 0; i < inputs.size(); ++i)
            for (int32_t r = 0; r < b.dec.rows[i]; ++r)
              keep.push_back(b.enc.begin[i] + (b.enc.rows[i] - b.dec.rows[i]) + r);
          b.keep = meta_put(keep);
        }
        s = &b.dec;
      }
      if (s->n == 0) continue;
      if (info.is_index_source) plan_select(b, *s, l);
    }
    if (s == &b.enc && b.dec.n != b.enc.n) s = &b.dec;  // only when no layer reached the boundary
    // Logits of the last current row of each input that wants them.
    std::vector<int32_t> last_rows;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].want_logits && s->rows[i] > 0) {
        b.logit_inputs.push_back(static_cast<int32_t>(i));
        last_rows.push_back(s->begin[i] + s->rows[i] - 1);
      }
    b.m = static_cast<int64_t>(last_rows.size());
    b.last_rows = meta_put(last_rows);
    b.key.insert(b.key.end(), {b.m, b.narrow ? 1 : 0});
  }

  // The device half of a forward: every launch, no host synchronisation and no host copies
  // (capturable), reading the metadata the plan uploaded. Leaves the logits in buffer
  // "logits" and the greedy tokens in "greedy".
  void launch(Batch& b) {
    const int64_t d = c.hidden_size, hc = c.hc_mult;
    mark(GpuComponent::kOther);
    // X = embed(ids) in every stream  [T, HC, D]; pre = stream 0.
    int64_t n = b.enc.n;
    cu::launch_gather_rows(embed.as<float>(), d, b.tok.as<int32_t>(), n * hc, d,
                           buf<float>("x", n * hc * d), d, stream);
    cu::copy_d2d(buf<float>("pre", n * hc), b.pre0.as<float>(), static_cast<size_t>(n * hc) * 4,
                 stream);
    float* x = buf<float>("x", n * hc * d);
    float* pre = buf<float>("pre", n * hc);
    // The SWA source lists of both row sets (launch_swa_index: the rows' window of positions
    // resolved to ring slots, this chunk's staged rows or -1).
    for (RowSet* set : {&b.enc, &b.dec}) {
      cu::SwaIndexParams sp;
      sp.pos = set->pos.as<int32_t>();
      sp.slot = set->row_slot.as<int64_t>();
      sp.first_pos = set->row_first.as<int32_t>();
      sp.floor = set->row_floor.as<int32_t>();
      sp.rows = set->n;
      sp.window = c.sliding_window;
      sp.chunk_base = static_cast<int64_t>(opt.max_seqs) * c.sliding_window;
      sp.out = set->swa_idx =
          buf<int32_t>(set == &b.enc ? "swa_idx_enc" : "swa_idx_dec", set->n * c.sliding_window);
      cu::launch_swa_index(sp, stream);
    }
    const RowSet* s = &b.enc;
    const int32_t boundary = c.decoder_start_layer();
    // true: the previous layer's last expand already wrote collapse(x, pre) into "a".
    bool a_ready = false;
    // true: the previous layer's last expand (mhc_fuse_expand_mixes) already wrote this layer's
    // attention-site mixes of x into "pre_a", "post_a", "comb_a".
    bool attn_mixes_ready = false;
    // true (with a_ready): that expand also applied this layer's attn_norm to "a" (mhc_fuse_norm).
    bool a_normed = false;
    // true (with a_normed): that expand also wrote a's row-scaled FP8 operand (mhc_fuse_attn_quant).
    bool a_quantised = false;
    for (size_t li = 0; li < layer_ids.size(); ++li) {
      const int32_t l = layer_ids[li];
      Layer& L = *layers[static_cast<size_t>(l)];
      const LayerInfo& info = c.layer(l);
      const bool mixes_ready = attn_mixes_ready;
      attn_mixes_ready = false;
      if (info.engram_index >= 0 && s->n > 0) {
        mark(GpuComponent::kEngram);
        engram(b, *s, l, x);
      }
      if (b.taps && info.is_dspark_target && n > 0) {
        // Tap (model.md §6.1): the mean over the streams entering the layer, into its column
        // block of taps [rows, taps * D].
        mark(GpuComponent::kOther);
        const auto it =
            std::find(c.dspark_target_layer_ids.begin(), c.dspark_target_layer_ids.end(), l);
        const int64_t slot = it - c.dspark_target_layer_ids.begin();
        const int64_t width = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * d;
        float* tmp = buf<float>("tap_tmp", n * d);
        collapse(x, n, tap_pre.as<float>(), tmp);
        cu::launch_gather_rows(tmp, d, iota.as<int32_t>(), n, d,
                               buf<float>("taps", opt.max_rows * width) + slot * d, width, stream);
      }
      float* a = buf<float>("a", n * d);
      if (!a_normed) {
        mark(GpuComponent::kMhc, "attn_norm");
        if (!a_ready) collapse(x, n, pre, a);
        rms(a, n, d, L.attn_norm);
      }
      const bool a_fp8_ready = a_normed && a_quantised;
      a_ready = false;
      a_normed = false;
      a_quantised = false;
      if (info.is_kv_source) {
        mark(GpuComponent::kAttention);
        compress(b, *s, l, a);
      }
      if (l >= boundary && s == &b.enc) {
        // Bounded replay (§2.6): from the candidate-source layer on, only the decoder rows.
        if (b.dec.n != b.enc.n) {
          mark(GpuComponent::kOther);
          const int32_t* dk = b.keep.as<int32_t>();
          const int64_t m = b.dec.n;
          float* x2 = buf<float>("x2", std::max<int64_t>(m, 1) * hc * d);
          float* pre2 = buf<float>("pre2", std::max<int64_t>(m, 1) * hc);
          float* a2 = buf<float>("a2", std::max<int64_t>(m, 1) * d);
          cu::launch_gather_rows(x, hc * d, dk, m, hc * d, x2, hc * d, stream);
          cu::launch_gather_rows(pre, hc, dk, m, hc, pre2, hc, stream);
          cu::launch_gather_rows(a, d, dk, m, d, a2, d, stream);
          std::swap(ws["x"], ws["x2"]);
          std::swap(ws["pre"], ws["pre2"]);
          std::swap(ws["a"], ws["a2"]);
          x = x2;
          pre = pre2;
          a = a2;
          n = m;
        }
        s = &b.dec;
      }
      if (opt.trace) trace_rows(trace.attn_in, l, a, n * d);
      if (n == 0) continue;
      if (!mixes_ready) mark(GpuComponent::kMhc, "mixes");
      float* pre_a = buf<float>("pre_a", n * hc);
      float* post_a = buf<float>("post_a", n * hc);
      float* comb_a = buf<float>("comb_a", n * hc * hc);
      if (!mixes_ready)
        mixes(x, n, L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, pre_a, post_a, comb_a);
      float* y = buf<float>("y", n * d);
      attention(b, *s, l, a, y, a_fp8_ready);
      if (opt.trace) trace_rows(trace.attn_out, l, y, n * d);
      mark(GpuComponent::kMhc, "expand");
      // The ffn site's input collapse(x', pre_a) fused into the expand (mixes does not write x).
      float* fbuf = buf<float>("f", n * d);
      float *pre_f, *post_f, *comb_f;
      // mhc_fuse_norm: the fused launch writes ffn_norm(collapse) into f (no rms launch below).
      const bool f_normed = fuse_mixes(n) && opt.mhc_fuse_norm;
      if (fuse_mixes(n)) {
        // The ffn site's mixes of x' in the same launch.
        pre_f = buf<float>("pre_f", n * hc);
        post_f = buf<float>("post_f", n * hc);
        comb_f = buf<float>("comb_f", n * hc * hc);
        const int width =
            expand_mixes(x, y, n, post_a, comb_a, pre_a, fbuf, L.hc_ffn_fn, L.hc_ffn_base,
                         L.hc_ffn_scale, pre_f, post_f, comb_f, f_normed ? &L.ffn_norm : nullptr);
        if (opt.trace) trace.mhc_cluster_width[l] = width;
      } else {
        if (opt.trace) trace.mhc_cluster_width[l] = 0;
        expand(x, y, n, post_a, comb_a, pre_a, fbuf);
        mark(GpuComponent::kMhc, "mixes");
        pre_f = buf<float>("pre_f", n * hc);
        post_f = buf<float>("post_f", n * hc);
        comb_f = buf<float>("comb_f", n * hc * hc);
        mixes(x, n, L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, pre_f, post_f, comb_f);
      }
      if (!f_normed) {
        mark(GpuComponent::kMhc, "ffn_norm");
        rms(fbuf, n, d, L.ffn_norm);
      }
      if (opt.trace) trace_rows(trace.ffn_in, l, fbuf, n * d);
      mark(GpuComponent::kMoe, "router");
      moe(*s, l, fbuf, y);
      if (opt.trace) {
        trace_rows(trace.ffn_out, l, y, n * d);
        const int64_t logits = n * c.routed_experts_of(l);
        trace_rows(trace.router_logits, l, buf<float>("moe_logits", logits), logits);
        std::vector<int32_t>& ex = trace.experts[l];
        ex.resize(static_cast<size_t>(n * c.experts_per_tok_of(l)));
        cu::copy_d2h(ex.data(), buf<int32_t>("moe_ids", n * c.experts_per_tok_of(l)),
                     ex.size() * 4, stream);
        cu::stream_synchronize(stream);
      }
      mark(GpuComponent::kMhc, "expand");
      // The next layer's attention-input collapse(x', pre_f) fused into this expand, unless Engram
      // changes x in between.
      const bool fuse_next =
          li + 1 < layer_ids.size() && c.layer(layer_ids[li + 1]).engram_index < 0;
      // mhc_fuse_expand_mixes: the next layer's attention-site mixes of x' in the same launch too,
      // unless bounded replay narrows the rows at that layer's start (x is gathered there); with
      // mhc_fuse_norm also the next layer's attn_norm of its input "a".
      const int32_t next_l = fuse_next ? layer_ids[li + 1] : -1;
      const bool next_narrows = next_l >= boundary && s == &b.enc && b.dec.n != b.enc.n;
      if (fuse_mixes(n) && fuse_next && !next_narrows) {
        const Layer& N = *layers[static_cast<size_t>(next_l)];
        expand_mixes(x, y, n, post_f, comb_f, pre_f, buf<float>("a", n * d), N.hc_attn_fn,
                     N.hc_attn_base, N.hc_attn_scale, buf<float>("pre_a", n * hc),
                     buf<float>("post_a", n * hc), buf<float>("comb_a", n * hc * hc),
                     opt.mhc_fuse_norm ? &N.attn_norm : nullptr,
                     opt.mhc_fuse_attn_quant && attn_quant_fusable(N), &a_quantised);
        attn_mixes_ready = true;
        a_normed = opt.mhc_fuse_norm;
      } else {
        expand(x, y, n, post_f, comb_f, fuse_next ? pre_f : nullptr,
               fuse_next ? buf<float>("a", n * d) : nullptr);
      }
      a_ready = fuse_next;
      cu::copy_d2d(pre, pre_f, static_cast<size_t>(n * hc) * 4, stream);
      if (opt.trace) trace_rows(trace.layer_out, l, x, n * hc * d);
    }
    // Logits of the last current row of each input that wants them.
    mark(GpuComponent::kSampling);
    const int64_t m = b.m;
    if (m > 0) {
      const int64_t v = c.vocab_size;
      const int32_t* dl = b.last_rows.as<int32_t>();
      float* xl = buf<float>("xl", m * hc * d);
      float* pl = buf<float>("pl", m * hc);
      cu::launch_gather_rows(x, hc * d, dl, m, hc * d, xl, hc * d, stream);
      cu::launch_gather_rows(pre, hc, dl, m, hc, pl, hc, stream);
      float* hfin = buf<float>("hfin", m * d);
      collapse(xl, m, pl, hfin);
      rms(hfin, m, d, norm);
      float* logits = buf<float>("logits", m * v);
      lt_gemm(opt.tf32_dense ? cu::GemmPrecision::kTf32 : cu::GemmPrecision::kF32, hfin, d,
              head.as<float>(), d, logits, v, m, v, d);
      cost.weight_bytes += static_cast<double>(head.bytes());
      cost.flops += 2.0 * m * v * d;
      int32_t* g = buf<int32_t>("greedy", m);
      cu::ArgmaxParams ap;
      ap.logits = logits;
      ap.rows = m;
      ap.cols = v;
      ap.ld = v;
      ap.out = g;
      ap.scratch = buf<uint64_t>("argmax_scratch", m);
      cu::launch_argmax_rows(ap, stream);
    }
  }

  // ---- DSpark draft (model.md §6) ----------------------------------------------------------

  Status dspark_ready(int32_t seq) const {
    if (draft_ids.empty())
      return make_error(ErrorCode::kUnimplemented,
                        "gpu model: no DSpark draft (GpuModelOptions::dspark off or the config has "
                        "no draft stages)");
    if (seq < 0 || static_cast<size_t>(seq) >= seqs.size() || !seqs[static_cast<size_t>(seq)].live)
      return make_error(ErrorCode::kInvalidArgument, "gpu model: sequence {} is not live", seq);
    return Status{};
  }

  // As DSparkDraft::commit: main_x = main_norm(main_proj(main_hidden)); per stage
  // ring[p] = fq_fp8(rope(kv_norm(wkv_s(main_x)), p)). Rows that a later row of the same commit
  // would overwrite in the ring (more than `window` rows) are not written.
  Status dspark_commit(int32_t seq, int32_t first, std::span<const float> mh) {
    MS_RETURN_IF_ERROR(dspark_ready(seq));
    const int64_t width = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * c.hidden_size;
    if (mh.size() % static_cast<size_t>(width) != 0)
      return make_error(ErrorCode::kInvalidArgument,
                        "dspark commit: {} values are not whole rows of {}", mh.size(), width);
    const int64_t total = static_cast<int64_t>(mh.size()) / width;
    if (total == 0) return Status{};
    MS_RETURN_IF_ERROR(check_commit(seq, first, total));
    const int64_t skip = std::max<int64_t>(total - c.sliding_window, 0);
    const int64_t n = total - skip;
    std::vector<int32_t> meta(static_cast<size_t>(2 * n));
    for (int64_t r = 0; r < n; ++r) {
      const int32_t p = first + static_cast<int32_t>(skip + r);
      meta[static_cast<size_t>(r)] = p;
      meta[static_cast<size_t>(n + r)] = ring_slot(seq, p);
    }
    float* dmh = buf<float>("ds_mh", n * width);
    int32_t* dmeta = buf<int32_t>("ds_cpos", 2 * n);
    cu::copy_h2d(dmh, mh.data() + skip * width, static_cast<size_t>(n * width) * 4, stream);
    cu::copy_h2d(dmeta, meta.data(), meta.size() * 4, stream);
    commit_rows(dmh, n, dmeta, dmeta + n);
    cu::stream_synchronize(stream);
    Sequence& S = seqs[static_cast<size_t>(seq)];
    if (S.ds_begin == S.ds_end) S.ds_begin = first;
    S.ds_end = first + static_cast<int32_t>(total);
    return Status{};
  }

  // dspark_commit with the taps the last forward left on the device (no host copy): every commit
  // takes positions [first, first + count) of one input of that forward, all in one batch.
  Status dspark_commit_taps(std::span<const GpuTapCommit> commits) {
    const int64_t width = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * c.hidden_size;
    std::vector<char> seen(seqs.size(), 0);
    std::vector<int32_t> src, pos, slot;
    for (const GpuTapCommit& cm : commits) {
      if (cm.input < 0 || static_cast<size_t>(cm.input) >= last_taps.size() ||
          last_taps[static_cast<size_t>(cm.input)].rows == 0)
        return make_error(ErrorCode::kInvalidArgument,
                          "dspark commit: input {} of the last forward has no taps on the device "
                          "(want_main_hidden off, no tap rows, or another forward ran since)",
                          cm.input);
      const TapRows& t = last_taps[static_cast<size_t>(cm.input)];
      MS_RETURN_IF_ERROR(dspark_ready(t.seq));
      if (seen[static_cast<size_t>(t.seq)]++)
        return make_error(ErrorCode::kInvalidArgument, "dspark commit: sequence {} twice", t.seq);
      if (cm.count <= 0 || cm.first < t.first_pos ||
          static_cast<int64_t>(cm.first) + cm.count > static_cast<int64_t>(t.first_pos) + t.rows)
        return make_error(ErrorCode::kOutOfRange,
                          "dspark commit: positions [{}, {}) outside the tapped rows [{}, {}) of "
                          "input {}",
                          cm.first, static_cast<int64_t>(cm.first) + cm.count, t.first_pos,
                          t.first_pos + t.rows, cm.input);
      MS_RETURN_IF_ERROR(check_commit(t.seq, cm.first, cm.count));
      const int32_t skip = std::max(cm.count - c.sliding_window, 0);
      for (int32_t r = skip; r < cm.count; ++r) {
        src.push_back(t.begin + (cm.first - t.first_pos) + r);
        pos.push_back(cm.first + r);
        slot.push_back(ring_slot(t.seq, cm.first + r));
      }
    }
    const auto n = static_cast<int64_t>(src.size());
    if (n > opt.max_rows)
      return make_error(ErrorCode::kOutOfRange, "dspark commit: {} rows > max_rows {}", n,
                        opt.max_rows);
    if (n == 0) return Status{};
    std::vector<int32_t> meta = src;
    meta.insert(meta.end(), pos.begin(), pos.end());
    meta.insert(meta.end(), slot.begin(), slot.end());
    int32_t* dmeta = buf<int32_t>("ds_cpos", 3 * n);
    cu::copy_h2d(dmeta, meta.data(), meta.size() * 4, stream);
    float* dmh = buf<float>("ds_mh", n * width);
    cu::launch_gather_rows(buf<float>("taps", opt.max_rows * width), width, dmeta, n, width, dmh,
                           width, stream);
    commit_rows(dmh, n, dmeta + n, dmeta + 2 * n);
    cu::stream_synchronize(stream);
    for (const GpuTapCommit& cm : commits) {
      Sequence& S = seqs[static_cast<size_t>(last_taps[static_cast<size_t>(cm.input)].seq)];
      if (S.ds_begin == S.ds_end) S.ds_begin = cm.first;
      S.ds_end = cm.first + cm.count;
    }
    return Status{};
  }

  // A commit of `count` rows at `first` fits the sequence's ring and continues it.
  Status check_commit(int32_t seq, int32_t first, int64_t count) const {
    const Sequence& S = seqs[static_cast<size_t>(seq)];
    if (first < 0 || static_cast<int64_t>(first) + count > opt.max_context)
      return make_error(ErrorCode::kOutOfRange, "dspark commit: positions [{}, {}) outside [0, {})",
                        first, first + count, opt.max_context);
    if (S.ds_begin != S.ds_end && first != S.ds_end)
      return make_error(ErrorCode::kInvalidArgument,
                        "dspark commit: position {} does not continue the ring (end {})", first,
                        S.ds_end);
    if (std::min<int64_t>(count, c.sliding_window) > opt.max_rows)
      return make_error(ErrorCode::kOutOfRange, "dspark commit: {} rows > max_rows {}",
                        std::min<int64_t>(count, c.sliding_window), opt.max_rows);
    return Status{};
  }
  // Record slot of position p of sequence seq in a draft stage's swa_pool.
  [[nodiscard]] int32_t ring_slot(int32_t seq, int32_t p) const {
    return seq * c.sliding_window + p % c.sliding_window;
  }

  // The rings' writes of n committed rows: taps dmh [n, taps * D] (device), positions pos (for
  // RoPE) and pool slots slot (device, n each).
  void commit_rows(const float* dmh, int64_t n, const int32_t* pos, const int32_t* slot) {
    const int64_t d = c.hidden_size, hd = c.head_dim;
    const int64_t width = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * d;
    float* mx = buf<float>("ds_mx", n * d);
    linear(dmh, width, n, ds_main_proj, mx, d);
    rms(mx, n, d, ds_main_norm);
    float* kv = buf<float>("ds_ckv", n * hd);
    for (int32_t l : draft_ids) {
      Layer& L = *layers[static_cast<size_t>(l)];
      linear(mx, d, n, L.wkv, kv, hd);
      rms(kv, n, hd, L.kv_norm);
      rope(kv, n, 1, hd, pos, RopeKind::kMain);
      cu::SwaWriteParams w;
      w.kv = kv;
      w.ld_kv = hd;
      w.rows = n;
      w.dim = static_cast<int>(hd);
      w.pos = slot;
      // The slots index the whole pool (every sequence's ring), so one launch serves a batch.
      w.ring = L.swa_pool.as<uint8_t>();
      w.ring_size = static_cast<int>(seqs.size()) * c.sliding_window;
      cu::launch_swa_write_fp8(w, stream);
    }
  }

  // One draft cycle for every input (DSparkDraft::draft), rows ordered block position major
  // (row j k + i: input i, block position j), so each Markov step reads one contiguous block.
  Result<GpuDraftOutput> dspark_draft(std::span<const GpuDraftInput> inputs) {
    const int64_t k = static_cast<int64_t>(inputs.size());
    if (k == 0) return GpuDraftOutput{};
    const int64_t d = c.hidden_size, hd = c.head_dim, hc = c.hc_mult, v = c.vocab_size;
    const int64_t q = c.q_lora_rank, window = c.sliding_window, rank = c.dspark_markov_rank;
    const int h = c.num_attention_heads;
    const int64_t bsz = c.dspark_block_size, n = k * bsz, nkeys = window + bsz;
    std::vector<char> seen(seqs.size(), 0);
    for (const GpuDraftInput& in : inputs) {
      MS_RETURN_IF_ERROR(dspark_ready(in.seq));
      if (seen[static_cast<size_t>(in.seq)]++)
        return make_error(ErrorCode::kInvalidArgument, "dspark draft: sequence {} twice", in.seq);
      const Sequence& S = seqs[static_cast<size_t>(in.seq)];
      if (S.ds_end == S.ds_begin)
        return make_error(ErrorCode::kInvalidArgument,
                          "dspark draft: sequence {} has no committed context", in.seq);
      if (in.anchor < 0 || in.anchor >= c.vocab_size)
        return make_error(ErrorCode::kOutOfRange, "dspark draft: anchor {} outside vocab",
                          in.anchor);
      if (static_cast<int64_t>(S.ds_end) + bsz > opt.max_context)
        return make_error(ErrorCode::kOutOfRange, "dspark draft: block past max_context {}",
                          opt.max_context);
    }
    if (n > opt.max_rows)
      return make_error(ErrorCode::kOutOfRange, "dspark draft: {} rows > max_rows {}", n,
                        opt.max_rows);
    cost = GpuForwardCost{};
    moe_layers_run.clear();
    // Host plan: tokens (each repeated in every stream), positions, the one-hot pre, and each
    // row's key list: the ring's context positions in order, then all B rows of its block
    // (staged at chunk_base + row; no causal mask inside the block).
    const int64_t chunk_base = static_cast<int64_t>(opt.max_seqs) * window;
    std::vector<int32_t> tok(static_cast<size_t>(n * hc)), pos(static_cast<size_t>(n)),
        anchors(static_cast<size_t>(k)), lists(static_cast<size_t>(n * nkeys), -1);
    std::vector<float> pre0(static_cast<size_t>(n * hc), 0.0f);
    for (int64_t i = 0; i < k; ++i) {
      const GpuDraftInput& in = inputs[static_cast<size_t>(i)];
      const Sequence& S = seqs[static_cast<size_t>(in.seq)];
      anchors[static_cast<size_t>(i)] = in.anchor;
      const int32_t c0 = std::max<int32_t>(S.ds_begin, S.ds_end - static_cast<int32_t>(window));
      for (int64_t j = 0; j < bsz; ++j) {
        const int64_t r = j * k + i;
        const int32_t t = j == 0 ? in.anchor : c.dspark_noise_token_id;
        for (int64_t st = 0; st < hc; ++st) tok[static_cast<size_t>(r * hc + st)] = t;
        pre0[static_cast<size_t>(r * hc)] = 1.0f;
        pos[static_cast<size_t>(r)] = S.ds_end + static_cast<int32_t>(j);
        int32_t* li = lists.data() + r * nkeys;
        int64_t m = 0;
        for (int32_t p = c0; p < S.ds_end; ++p)
          li[m++] = static_cast<int32_t>(in.seq * window + p % window);
        for (int64_t jj = 0; jj < bsz; ++jj) li[m++] = static_cast<int32_t>(chunk_base + jj * k + i);
      }
    }
    // One upload of the host arrays to fixed offsets of "ds_meta" (a graph replays on them).
    ds_host.clear();
    const size_t o_tok = ds_put(tok), o_pos = ds_put(pos), o_list = ds_put(lists),
                 o_anchor = ds_put(anchors), o_pre = ds_put(pre0);
    uint8_t* dmeta = ds_upload();
    int32_t* dtok = reinterpret_cast<int32_t*>(dmeta + o_tok);
    int32_t* dpos = reinterpret_cast<int32_t*>(dmeta + o_pos);
    int32_t* dlist = reinterpret_cast<int32_t*>(dmeta + o_list);
    int32_t* dprev = reinterpret_cast<int32_t*>(dmeta + o_anchor);
    float* pre = reinterpret_cast<float*>(dmeta + o_pre);  // overwritten by the stages (re-uploaded)
    // What comes back to the host (read after the launches).
    float* base = buf<float>("ds_base", n * v);
    float* lg = buf<float>("ds_logits", n * v);  // every row written by its Markov step
    int32_t* dtokens = buf<int32_t>("ds_tokens", n);
    float* z = buf<float>("ds_z", 2 * n);
    // Every launch of the cycle: no host copy or sync inside (a CUDA graph captures it). The cost
    // it adds is static (the same every cycle of this shape).
    const auto launch_draft = [&] {
      float* x = buf<float>("ds_x", n * hc * d);
      cu::launch_gather_rows(embed.as<float>(), d, dtok, n * hc, d, x, d, stream);
      RowSet rs;
      rs.n = n;
      const size_t rec = c.swa_row_bytes();
      for (int32_t l : draft_ids) {
        Layer& L = *layers[static_cast<size_t>(l)];
        // ---- attention site (window only: ring context + the whole block)
        mark(GpuComponent::kMhc);
        float* a = buf<float>("ds_a", n * d);
        collapse(x, n, pre, a);
        rms(a, n, d, L.attn_norm);
        float* pre_a = buf<float>("ds_pre_a", n * hc);
        float* post_a = buf<float>("ds_post_a", n * hc);
        float* comb_a = buf<float>("ds_comb_a", n * hc * hc);
        mixes(x, n, L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, pre_a, post_a, comb_a);
        mark(GpuComponent::kDense);
        float* qr = buf<float>("ds_qr", n * q);
        float* kv = buf<float>("ds_kv", n * hd);
        linear(a, d, n, L.wq_a, qr, q);
        linear(a, d, n, L.wkv, kv, hd);
        rms(qr, n, q, L.q_norm);
        float* qh = buf<float>("ds_q", n * h * hd);
        linear(qr, q, n, L.wq_b, qh, h * hd);
        mark(GpuComponent::kAttention);
        rope(qh, n, h, hd, dpos, RopeKind::kMain);
        rms(kv, n, hd, L.kv_norm);
        rope(kv, n, 1, hd, dpos, RopeKind::kMain);
        {
          cu::SwaWriteParams w;  // the block's rows, staged after the rings (row r at chunk_base + r)
          w.kv = kv;
          w.ld_kv = hd;
          w.rows = n;
          w.dim = static_cast<int>(hd);
          w.pos = iota.as<int32_t>();
          w.ring = L.swa_pool.as<uint8_t>() + chunk_base * static_cast<int64_t>(rec);
          w.ring_size = static_cast<int>(n);
          cu::launch_swa_write_fp8(w, stream);
        }
        float* o = buf<float>("ds_o", n * h * hd);
        cu::SparseAttentionParams p;
        p.q = qh;
        p.rows = n;
        p.heads = h;
        p.head_dim = static_cast<int>(hd);
        p.swa = L.swa_pool.as<uint8_t>();
        p.swa_idx = dlist;
        p.swa_k = static_cast<int>(nkeys);
        p.ring_size = static_cast<int>(window);
        p.sink = L.sink.as<float>();
        p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
        p.pos = dpos;
        p.freqs = freqs_main.as<double>();
        p.rd = c.qk_rope_head_dim;
        p.out = o;
        attend(p);
        cost.kv_bytes += static_cast<double>(n * nkeys) * static_cast<double>(rec);
        cost.flops += 4.0 * static_cast<double>(n) * h * hd * static_cast<double>(nkeys);
        float* y = buf<float>("ds_y", n * d);
        out_proj(L, o, n, y);
        // ---- FFN site
        mark(GpuComponent::kMhc);
        float* f = buf<float>("ds_f", n * d);
        expand(x, y, n, post_a, comb_a, pre_a, f);
        float* pre_f = buf<float>("ds_pre_f", n * hc);
        float* post_f = buf<float>("ds_post_f", n * hc);
        float* comb_f = buf<float>("ds_comb_f", n * hc * hc);
        mixes(x, n, L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, pre_f, post_f, comb_f);
        rms(f, n, d, L.ffn_norm);
        mark(GpuComponent::kMoe);
        moe(rs, l, f, y);
        mark(GpuComponent::kMhc);
        expand(x, y, n, post_f, comb_f, nullptr, nullptr);
        cu::copy_d2d(pre, pre_f, static_cast<size_t>(n * hc) * 4, stream);
      }
      // hb = collapse(X, pre); U = head(norm(hb))  [n, V]
      mark(GpuComponent::kSampling);
      float* hb = buf<float>("ds_hb", n * d);
      collapse(x, n, pre, hb);
      float* hn = buf<float>("ds_hn", n * d);
      cu::copy_d2d(hn, hb, static_cast<size_t>(n * d) * 4, stream);
      rms(hn, n, d, ds_norm);
      lt_gemm(opt.tf32_dense ? cu::GemmPrecision::kTf32 : cu::GemmPrecision::kF32, hn, d,
              head.as<float>(), d, base, v, n, v, d);
      cost.weight_bytes += static_cast<double>(head.bytes());
      cost.flops += 2.0 * static_cast<double>(n) * v * d;
      // Markov steps: l_j = U_j + markov_head · markov_embed[prev]; d_j = argmax; z_j = conf ·
      // [hb_j; m_j] (the two dot products come back, the sigmoid is taken on the host).
      float* m = buf<float>("ds_m", k * rank);
      float* bias = buf<float>("ds_bias", k * v);
      const int32_t* prev = dprev;
      for (int64_t j = 0; j < bsz; ++j) {
        cu::launch_gather_rows(ds_markov_embed.as<float>(), rank, prev, k, rank, m, rank, stream);
        // The Markov head is a BF16-checkpoint fp32 linear like the head: TF32 with tf32_dense.
        lt_gemm(opt.tf32_dense ? cu::GemmPrecision::kTf32 : cu::GemmPrecision::kF32, m, rank,
                ds_markov_head.as<float>(), rank, bias, v, k, v, rank);
        cu::BinaryParams bp;
        bp.op = cu::BinaryFn::kAdd;
        bp.a = base + j * k * v;
        bp.b = bias;
        bp.out = lg + j * k * v;
        bp.n = k * v;
        bp.b_n = k * v;
        cu::launch_binary(bp, stream);
        cu::ArgmaxParams ap;
        ap.logits = lg + j * k * v;
        ap.rows = k;
        ap.cols = v;
        ap.ld = v;
        ap.out = dtokens + j * k;
        ap.scratch = buf<uint64_t>("ds_argmax_scratch", k);
        cu::launch_argmax_rows(ap, stream);
        lt_gemm(cu::GemmPrecision::kF32, hb + j * k * d, d, ds_conf.as<float>(), d + rank,
                z + j * k, 1, k, 1, d);
        lt_gemm(cu::GemmPrecision::kF32, m, rank, ds_conf.as<float>() + d, d + rank, z + n + j * k,
                1, k, 1, rank);
        prev = dtokens + j * k;
      }
      cost.flops += 2.0 * static_cast<double>(n) * (v * rank + d + rank);
      cost.weight_bytes += static_cast<double>(bsz) * static_cast<double>(ds_markov_head.bytes());
    };
    // The draft as a CUDA graph per shape (opt.cuda_graphs), as forward(): the first cycle of a
    // shape runs eagerly (grows the buffers, builds the cuBLASLt plans), the second is captured,
    // later ones replay it; dropped when a scratch buffer moves (ws_gen).
    const bool graphable = opt.cuda_graphs && !opt.trace && !opt.profile && !opt.exact_linears &&
                           !opt.f64_attention;
    const std::vector<int64_t> gkey = {kDraftGraphTag, k, opt.host_logits ? 1 : 0};
    const GraphRun run = graphable ? run_graph(gkey, launch_draft) : GraphRun::kEager;
    if (run == GraphRun::kReplayed) ++draft_graph_replays;
    if (run == GraphRun::kCaptured) ++draft_graph_captures;
    if (run == GraphRun::kEager) launch_draft();
    mark(GpuComponent::kOther);
    flush_profile();
    std::vector<int32_t> t(static_cast<size_t>(n));
    std::vector<float> zh(static_cast<size_t>(2 * n));
    cu::copy_d2h(t.data(), dtokens, t.size() * 4, stream);
    cu::copy_d2h(zh.data(), z, zh.size() * 4, stream);
    GpuDraftOutput out;
    if (opt.host_logits) {
      std::vector<float> lh(static_cast<size_t>(n * v)), bh(static_cast<size_t>(n * v));
      cu::copy_d2h(lh.data(), lg, lh.size() * 4, stream);
      cu::copy_d2h(bh.data(), base, bh.size() * 4, stream);
      cu::stream_synchronize(stream);
      out.logits.resize(lh.size());
      out.base_logits.resize(bh.size());
      // Back to input-major order: output row i * B + j is plan row j * k + i.
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < bsz; ++j) {
          std::copy_n(lh.data() + (j * k + i) * v, v, out.logits.data() + (i * bsz + j) * v);
          std::copy_n(bh.data() + (j * k + i) * v, v, out.base_logits.data() + (i * bsz + j) * v);
        }
    }
    cu::stream_synchronize(stream);
    add_grouped_moe_cost();
    out.tokens.resize(static_cast<size_t>(n));
    out.confidences.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < bsz; ++j) {
        const size_t r = static_cast<size_t>(j * k + i), o2 = static_cast<size_t>(i * bsz + j);
        out.tokens[o2] = t[r];
        const double zz = static_cast<double>(zh[r]) + static_cast<double>(zh[static_cast<size_t>(n) + r]);
        out.confidences[o2] = static_cast<float>(1.0 / (1.0 + std::exp(-zz)));
      }
    return out;
  }
};

DeepseekV41Gpu::DeepseekV41Gpu(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepseekV41Gpu::~DeepseekV41Gpu() = default;

Result<std::unique_ptr<DeepseekV41Gpu>> DeepseekV41Gpu::load(const std::filesystem::path& dir,
                                                             const GpuModelOptions& options) {
  if (cu::device_count() == 0)
    return make_error(ErrorCode::kUnimplemented, "gpu model: {}", cu::no_device_reason());
  MS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  if (config.model_type != "deepseek_v41")
    return make_error(ErrorCode::kInvalidArgument, "{}: not deepseek_v41", dir.string());
  MS_ASSIGN_OR_RETURN(WeightLoader reader, WeightLoader::open(dir));
  auto impl = std::make_unique<Impl>();
  impl->c = std::move(config);
  impl->opt = options;
  MS_RETURN_IF_ERROR(impl->init_common());
  if (!impl->c.engram_layers.empty()) {
    auto identity = EngramTokenMap::identity(impl->c);
    if (identity) {
      impl->token_map = std::move(*identity);
    } else {
      std::vector<int32_t> pad_only(static_cast<size_t>(impl->c.vocab_size), 0);
      MS_ASSIGN_OR_RETURN(impl->token_map,
                          EngramTokenMap::from_table(impl->c, std::move(pad_only)));
    }
  }
  MS_RETURN_IF_ERROR(impl->load_weights(reader));
  return std::unique_ptr<DeepseekV41Gpu>(new DeepseekV41Gpu(std::move(impl)));
}

Result<std::unique_ptr<DeepseekV41Gpu>> DeepseekV41Gpu::random(const ModelConfig& config,
                                                               const GpuModelOptions& options,
                                                               uint64_t seed) {
  if (cu::device_count() == 0)
    return make_error(ErrorCode::kUnimplemented, "gpu model: {}", cu::no_device_reason());
  auto impl = std::make_unique<Impl>();
  impl->c = config;
  impl->opt = options;
  impl->random_weights = true;
  impl->rng.seed(seed);
  MS_RETURN_IF_ERROR(impl->init_common());
  impl->random_weights_fill();
  return std::unique_ptr<DeepseekV41Gpu>(new DeepseekV41Gpu(std::move(impl)));
}

const ModelConfig& DeepseekV41Gpu::config() const { return impl_->c; }
const std::vector<int32_t>& DeepseekV41Gpu::layers() const { return impl_->layer_ids; }
void* DeepseekV41Gpu::stream() const { return impl_->stream; }
size_t DeepseekV41Gpu::weight_bytes() const { return impl_->weight_bytes; }
size_t DeepseekV41Gpu::cache_bytes() const { return impl_->cache_bytes; }

Result<int32_t> DeepseekV41Gpu::new_sequence() {
  for (size_t i = 0; i < impl_->seqs.size(); ++i) {
    Sequence& s = impl_->seqs[i];
    if (s.live) continue;
    s = Sequence{};
    s.live = true;
    s.history.last_ids.assign(static_cast<size_t>(std::max(impl_->c.engram_max_ngram_size - 1, 0)),
                              -1);
    s.entries.assign(static_cast<size_t>(impl_->c.num_hidden_layers), 0);
    return static_cast<int32_t>(i);
  }
  return make_error(ErrorCode::kResourceExhausted, "gpu model: all {} sequence slots in use",
                    impl_->seqs.size());
}

void DeepseekV41Gpu::release_sequence(int32_t seq) {
  MS_CHECK(seq >= 0 && static_cast<size_t>(seq) < impl_->seqs.size());
  impl_->seqs[static_cast<size_t>(seq)].live = false;
}

Status DeepseekV41Gpu::dspark_commit_taps(std::span<const GpuTapCommit> commits) {
  return impl_->dspark_commit_taps(commits);
}
Status DeepseekV41Gpu::dspark_commit(int32_t seq, int32_t first,
                                     std::span<const float> main_hidden) {
  return impl_->dspark_commit(seq, first, main_hidden);
}

Result<GpuDraftOutput> DeepseekV41Gpu::dspark_draft(std::span<const GpuDraftInput> inputs) {
  return impl_->dspark_draft(inputs);
}

int32_t DeepseekV41Gpu::num_tokens(int32_t seq) const {
  return impl_->seqs.at(static_cast<size_t>(seq)).num_tokens;
}

void DeepseekV41Gpu::synthetic_fill(int32_t seq, int32_t context, uint64_t seed,
                                    int32_t replay_start) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  Sequence& s = m.seqs.at(static_cast<size_t>(seq));
  MS_CHECK(s.live && context <= m.opt.max_context);
  const int64_t window = c.sliding_window, hd = c.head_dim, id = c.index_head_dim;
  for (int32_t l : m.layer_ids) {
    Layer& L = *m.layers[static_cast<size_t>(l)];
    const LayerInfo& info = c.layer(l);
    // SWA ring: e4m3 codes, ue8m0 scales around 2^-4.
    cu::launch_fill_records(L.swa_pool.as<uint8_t>() + seq * window * c.swa_row_bytes(), window, hd,
                            hd / 32, true, 121, 125, seed * 131 + l, m.stream);
    if (info.is_kv_source) {
      const int64_t entries = context / info.ratio;
      cu::launch_fill_records(L.main_pool.as<uint8_t>() + seq * L.cap * c.main_entry_bytes(),
                              entries, hd / 2, hd / 16, false, 0x28, 0x38, seed * 137 + l,
                              m.stream);
      cu::launch_fill_records(L.index_pool.as<uint8_t>() + seq * L.cap * c.index_entry_bytes(),
                              entries, id / 2, id / 32, false, 122, 126, seed * 139 + l, m.stream);
      const int64_t part = static_cast<int64_t>(std::max(info.ratio - 1, 1)) * hd;
      cu::memset_async(L.part_kv.as<float>() + seq * part, 0, static_cast<size_t>(part) * 4,
                       m.stream);
      s.entries[static_cast<size_t>(l)] = entries;
    }
  }
  s.num_tokens = context;
  s.replay_start = replay_start;
  s.history = EngramHistory{};
  s.history.last_ids.assign(static_cast<size_t>(std::max(c.engram_max_ngram_size - 1, 0)), -1);
}

Result<GpuForwardOutput> DeepseekV41Gpu::forward(std::span<const GpuSequenceInput> inputs,
                                                 ForwardMode mode) {
  return impl_->forward(inputs, mode);
}

std::array<double, kNumGpuComponents> DeepseekV41Gpu::component_ms() const {
  return impl_->comp_ms;
}
std::map<std::string, double> DeepseekV41Gpu::part_ms() const { return impl_->part_ms; }
void DeepseekV41Gpu::reset_profile() {
  impl_->comp_ms.fill(0.0);
  impl_->part_ms.clear();
}
void DeepseekV41Gpu::set_profile(bool on) { impl_->opt.profile = on; }
const GpuForwardCost& DeepseekV41Gpu::last_cost() const { return impl_->cost; }
int64_t DeepseekV41Gpu::graph_replays() const { return impl_->graph_replays; }
int64_t DeepseekV41Gpu::graph_captures() const { return impl_->graph_captures; }
int64_t DeepseekV41Gpu::gemm_tuned_shapes() const {
  return impl_->lt->tuned_shapes() + (impl_->side_lt ? impl_->side_lt->tuned_shapes() : 0);
}
int64_t DeepseekV41Gpu::draft_graph_replays() const { return impl_->draft_graph_replays; }
int64_t DeepseekV41Gpu::draft_graph_captures() const { return impl_->draft_graph_captures; }
int64_t DeepseekV41Gpu::graphs_held() const { return static_cast<int64_t>(impl_->graphs.size()); }
const GpuForwardTrace& DeepseekV41Gpu::trace() const { return impl_->trace; }

}  // namespace moeserve::arch

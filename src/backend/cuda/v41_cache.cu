// V4.1 cache writers and the compressor: the SWA ring row (FP8 e4m3, block-32 power-of-two ue8m0
// scales), the FP4 main entry (block 16, e4m3 scales) and index key (block 32, ue8m0 scales), each
// one warp per 32 channels with the block amax reduced by shuffles (also scattered: one launch for
// the main entries and index keys of a batch); the compressor (gated pooling over groups of `ratio`
// absolute positions with the partial group carried in fp32 state, bf16 cast, RMSNorm), one block
// per completed group, per sequence or for a whole batch in one launch.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

// Grid: (dim/32, rows); one warp per 32-channel block.
__global__ void swa_write_kernel(SwaWriteParams p) {
  pdl_wait();
  const int64_t r = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int blk = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (blk >= p.dim / 32) return;
  if (static_cast<int64_t>(p.pos[p.rows - 1]) - p.pos[r] >= p.ring_size) return;
  const int c = blk * 32 + lane;
  const float x = p.kv[r * p.ld_kv + c];
  const float amax = warp_max(fabsf(x));
  const uint32_t scale = v41::fp8_block_scale_code(amax);
  const float inv_s = 1.0f / v41::ue8m0_decode(scale);  // exact: a power of two
  uint8_t* rec = p.ring + static_cast<int64_t>(p.pos[r] % p.ring_size) * (p.dim + p.dim / 32);
  rec[c] = static_cast<uint8_t>(v41::e4m3_encode(fminf(fmaxf(x * inv_s, -448.0f), 448.0f)));
  if (lane == 0) rec[p.dim + blk] = static_cast<uint8_t>(scale);
}

__global__ void swa_index_kernel(SwaIndexParams p) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * p.window) return;
  const int64_t r = i / p.window;
  const int k = static_cast<int>(i % p.window);
  const int64_t kp = static_cast<int64_t>(p.pos[r]) - k;
  int64_t v;
  if (kp < max(0, p.floor[r])) {
    v = -1;
  } else if (kp >= p.first_pos[r]) {
    v = p.chunk_base + r - k;
  } else {
    v = p.slot[r] * p.window + kp % p.window;
  }
  p.out[i] = static_cast<int32_t>(v);
}

// FP4 record of x[0, dim) at rec; one warp per 32 channels (two blocks of 16 for the main format).
__device__ __forceinline__ void fp4_write_chunk(const float* x, int dim, Fp4Record format,
                                                int chunk, int lane, uint8_t* rec) {
  const int c = chunk * 32 + lane;
  const float v = x[c];
  const bool main = format == Fp4Record::kMainBlock16E4m3;
  float amax = fabsf(v);
  for (int o = main ? 8 : 16; o > 0; o >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  uint32_t code;
  uint32_t scale;
  if (main) {
    scale = v41::fp4_e4m3_scale_code(amax);
    code = v41::e2m1_encode(__fdiv_rn(v, v41::e4m3_decode(scale)));
  } else {
    scale = v41::fp4_ue8m0_scale_code(amax);
    code = v41::e2m1_encode(v * (1.0f / v41::ue8m0_decode(scale)));
  }
  const uint32_t hi = __shfl_down_sync(0xffffffffu, code, 1);
  if ((lane & 1) == 0) rec[c / 2] = static_cast<uint8_t>((code & 0xFu) | ((hi & 0xFu) << 4));
  if (main && (lane & 15) == 0) rec[dim / 2 + c / 16] = static_cast<uint8_t>(scale);
  if (!main && lane == 0) rec[dim / 2 + chunk] = static_cast<uint8_t>(scale);
}

__device__ __forceinline__ int64_t fp4_bytes(Fp4Record format, int dim) {
  return dim / 2 + dim / (format == Fp4Record::kMainBlock16E4m3 ? 16 : 32);
}

// Grid: (dim/32 / 8, rows, grid-stride); one warp per 32 channels.
__global__ void fp4_write_kernel(Fp4CacheWriteParams p) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int chunk = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (chunk >= p.dim / 32) return;
  const int64_t bytes = fp4_bytes(p.format, p.dim);
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y)
    fp4_write_chunk(p.x + r * p.ldx, p.dim, p.format, chunk, lane,
                    p.cache + (p.first_entry + r) * bytes);
}

// Grid: (max dim/32 / 8, max rows, count); row r of write z to record entries[r].
__global__ void fp4_scatter_kernel(Fp4ScatterWriteParams p) {
  pdl_wait();
  const Fp4CacheWriteParams w = blockIdx.z == 0 ? p.write[0] : p.write[1];
  const int lane = threadIdx.x & 31;
  const int chunk = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (chunk >= w.dim / 32) return;
  const int64_t bytes = fp4_bytes(w.format, w.dim);
  for (int64_t r = blockIdx.y; r < w.rows; r += gridDim.y) {
    const int64_t e = p.entries[r];
    if (e < 0) continue;  // an unused slot (the forward pads the group slots per sequence)
    fp4_write_chunk(w.x + r * w.ldx, w.dim, w.format, chunk, lane, w.cache + e * bytes);
  }
}

// Group `first / ratio` (its first position `first`) into out[0, dim): thread c owns channel c;
// blockDim.x = dim rounded up to 32. kv/gate row 0 is position start_pos; earlier positions come
// from the state.
__device__ __forceinline__ void compress_group(const float* kv, const float* gate, int64_t ld,
                                               int dim, int ratio, int64_t start_pos,
                                               const float* state_kv, const float* state_gate,
                                               const float* norm_weight, float eps, int64_t first,
                                               float* out, float* scratch) {
  float v = 0.0f;
  const int c = threadIdx.x;
  if (c < dim) {
    const auto kv_at = [&](int64_t pos) {
      return pos < start_pos ? state_kv[(pos % ratio) * dim + c] : kv[(pos - start_pos) * ld + c];
    };
    if (ratio == 1) {
      v = kv_at(first);
    } else {
      const auto g_at = [&](int64_t pos) {
        return pos < start_pos ? state_gate[(pos % ratio) * dim + c]
                               : gate[(pos - start_pos) * ld + c];
      };
      float mx = -INFINITY;
      for (int t = 0; t < ratio; ++t) mx = fmaxf(mx, g_at(first + t));
      float num = 0.0f, den = 0.0f;
      for (int t = 0; t < ratio; ++t) {
        const float e = expf(g_at(first + t) - mx);
        den += e;
        num = fmaf(e, kv_at(first + t), num);
      }
      v = num / den;
    }
    v = __bfloat162float(__float2bfloat16_rn(v));
  }
  const float ss = block_sum(v * v, scratch);
  if (c < dim) {
    const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
    out[c] = v * inv * (norm_weight ? norm_weight[c] : 1.0f);
  }
}

// Rows at positions [first_pos, end) (a trailing partial group) into the state.
__device__ __forceinline__ void store_partial(const float* kv, const float* gate, int64_t ld,
                                              int dim, int ratio, int64_t start_pos,
                                              int64_t first_pos, int64_t end, float* state_kv,
                                              float* state_gate) {
  for (int64_t pos = first_pos; pos < end; ++pos)
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
      state_kv[(pos % ratio) * dim + c] = kv[(pos - start_pos) * ld + c];
      if (gate != nullptr) state_gate[(pos % ratio) * dim + c] = gate[(pos - start_pos) * ld + c];
    }
}

// One block per completed group.
__global__ void compressor_kernel(CompressorParams p) {
  pdl_wait();
  __shared__ float scratch[32];
  const int64_t first = (p.start_pos / p.ratio + blockIdx.x) * p.ratio;
  compress_group(p.kv, p.gate, p.ld, p.dim, p.ratio, p.start_pos, p.state_kv, p.state_gate,
                 p.norm_weight, p.eps, first, p.out + static_cast<int64_t>(blockIdx.x) * p.dim,
                 scratch);
}

// The trailing partial group's rows into the state (after compressor_kernel read it).
__global__ void compressor_state_kernel(CompressorParams p, int64_t first_pos) {
  pdl_wait();
  const int64_t pos = first_pos + blockIdx.x;
  store_partial(p.kv, p.gate, p.ld, p.dim, p.ratio, p.start_pos, pos, pos + 1, p.state_kv,
                p.state_gate);
}

__host__ __device__ inline int64_t groups_of(int64_t start_pos, int64_t rows, int ratio) {
  return (start_pos + rows) / ratio - start_pos / ratio;
}
// First position of the trailing partial group stored in the state (== end: none).
__host__ __device__ inline int64_t partial_begin(int64_t start_pos, int64_t rows, int ratio) {
  const int64_t end = start_pos + rows;
  if (ratio == 1) return end;
  return end / ratio * ratio > start_pos ? end / ratio * ratio : start_pos;
}

// One block per item: item g < groups compresses the sequence's group g; item 0 then stores the
// trailing partial group. Only group 0 reads the state, and the same threads write it after
// reading (thread c: channel c), so one launch keeps the per-sequence order.
__global__ void compressor_batch_kernel(CompressorBatchParams p) {
  pdl_wait();
  __shared__ float scratch[32];
  const int64_t item = blockIdx.x;
  int lo = 0, hi = p.num_seqs - 1;  // the last sequence with item_begin <= item
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.seqs[mid].item_begin <= item)
      lo = mid;
    else
      hi = mid - 1;
  }
  const CompressorSeq sq = p.seqs[lo];
  const int64_t g = item - sq.item_begin;
  const float* kv = p.kv + sq.row_begin * p.ld;
  const float* gate = p.gate != nullptr ? p.gate + sq.row_begin * p.ld : nullptr;
  float* state_kv = p.state_kv + sq.state_slot * p.state_stride;
  float* state_gate =
      p.state_gate != nullptr ? p.state_gate + sq.state_slot * p.state_stride : nullptr;
  if (g < groups_of(sq.start_pos, sq.rows, p.ratio)) {
    const int64_t first = (sq.start_pos / p.ratio + g) * p.ratio;
    compress_group(kv, gate, p.ld, p.dim, p.ratio, sq.start_pos, state_kv, state_gate,
                   p.norm_weight, p.eps, first, p.out + (sq.out_group + g) * p.dim, scratch);
  }
  if (g == 0) {
    const int64_t end = sq.start_pos + sq.rows;
    const int64_t first = partial_begin(sq.start_pos, sq.rows, p.ratio);
    if (first < end) {
      __syncthreads();
      store_partial(kv, gate, p.ld, p.dim, p.ratio, sq.start_pos, first, end, state_kv, state_gate);
    }
  }
}

}  // namespace

void launch_swa_write_fp8(const SwaWriteParams& p, Stream stream) {
  if (p.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.dim / 32, 8)), static_cast<unsigned>(p.rows));
  MS_CUDA_CHECK(launch_kernel(swa_write_kernel, grid, 256, 0, as_cuda_stream(stream), p));
}

void launch_swa_index(const SwaIndexParams& p, Stream stream) {
  const int64_t total = p.rows * p.window;
  if (total == 0) return;
  MS_CUDA_CHECK(launch_kernel(swa_index_kernel, static_cast<unsigned>(ceil_div(total, 256)), 256, 0,
                              as_cuda_stream(stream), p));
}

void launch_fp4_cache_write(const Fp4CacheWriteParams& p, Stream stream) {
  if (p.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.dim / 32, 8)),
                  static_cast<unsigned>(std::min<int64_t>(p.rows, 65535)));
  MS_CUDA_CHECK(launch_kernel(fp4_write_kernel, grid, 256, 0, as_cuda_stream(stream), p));
}

void launch_fp4_cache_scatter_write(const Fp4ScatterWriteParams& p, Stream stream) {
  if (p.count < 1 || p.count > 2)
    detail::cuda_call_failed(__FILE__, __LINE__, "fp4 scatter count", "1 or 2 writes", "");
  int64_t rows = 0;
  int dim = 0;
  for (int i = 0; i < p.count; ++i) {
    rows = std::max(rows, p.write[i].rows);
    dim = std::max(dim, p.write[i].dim);
  }
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(dim / 32, 8)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)),
                  static_cast<unsigned>(p.count));
  MS_CUDA_CHECK(launch_kernel(fp4_scatter_kernel, grid, 256, 0, as_cuda_stream(stream), p));
}

void launch_compressor(const CompressorParams& p, Stream stream) {
  if (p.rows == 0) return;
  const int64_t groups = groups_of(p.start_pos, p.rows, p.ratio);
  const int threads = static_cast<int>(ceil_div(p.dim, 32) * 32);
  if (groups > 0) {
    MS_CUDA_CHECK(launch_kernel(compressor_kernel, static_cast<unsigned>(groups), threads, 0,
                                as_cuda_stream(stream), p));
  }
  const int64_t end = p.start_pos + p.rows;
  const int64_t first = partial_begin(p.start_pos, p.rows, p.ratio);
  if (end > first) {
    MS_CUDA_CHECK(launch_kernel(compressor_state_kernel, static_cast<unsigned>(end - first), 256, 0,
                                as_cuda_stream(stream), p, first));
  }
}

int64_t compressor_items(int64_t start_pos, int64_t rows, int ratio) {
  const int64_t groups = groups_of(start_pos, rows, ratio);
  if (groups > 0) return groups;
  return partial_begin(start_pos, rows, ratio) < start_pos + rows ? 1 : 0;
}

void launch_compressor_batch(const CompressorBatchParams& p, Stream stream) {
  if (p.num_items == 0 || p.num_seqs == 0) return;
  const int threads = static_cast<int>(ceil_div(p.dim, 32) * 32);
  MS_CUDA_CHECK(launch_kernel(compressor_batch_kernel, static_cast<unsigned>(p.num_items), threads,
                              0, as_cuda_stream(stream), p));
}

}  // namespace moeserve::cuda

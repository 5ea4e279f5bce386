// V4.1 cache writers and the compressor: the SWA ring row (FP8 e4m3, block-32 power-of-two ue8m0
// scales), the FP4 main entry (block 16, e4m3 scales) and index key (block 32, ue8m0 scales), each
// one warp per 32 channels with the block amax reduced by shuffles; the compressor (gated pooling
// over groups of `ratio` absolute positions with the partial group carried in fp32 state, bf16
// cast, RMSNorm), one block per completed group.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/v41_device.cuh"

namespace moeserve::cuda {
namespace {

// Grid: (dim/32, rows); one warp per 32-channel block.
__global__ void swa_write_kernel(SwaWriteParams p) {
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

// Grid: (dim/32, rows); one warp per 32 channels (two blocks of 16 for the main format).
__global__ void fp4_write_kernel(Fp4CacheWriteParams p) {
  const int64_t r = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int chunk = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (chunk >= p.dim / 32) return;
  const int c = chunk * 32 + lane;
  const float x = p.x[r * p.ldx + c];
  const bool main = p.format == Fp4Record::kMainBlock16E4m3;
  float amax = fabsf(x);
  for (int o = main ? 8 : 16; o > 0; o >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  uint32_t code;
  uint32_t scale;
  if (main) {
    scale = v41::fp4_e4m3_scale_code(amax);
    code = v41::e2m1_encode(__fdiv_rn(x, v41::e4m3_decode(scale)));
  } else {
    scale = v41::fp4_ue8m0_scale_code(amax);
    code = v41::e2m1_encode(x * (1.0f / v41::ue8m0_decode(scale)));
  }
  const uint32_t hi = __shfl_down_sync(0xffffffffu, code, 1);
  const int64_t bytes = p.dim / 2 + p.dim / (main ? 16 : 32);
  uint8_t* rec = p.cache + (p.first_entry + r) * bytes;
  if ((lane & 1) == 0) rec[c / 2] = static_cast<uint8_t>((code & 0xFu) | ((hi & 0xFu) << 4));
  if (main && (lane & 15) == 0) rec[p.dim / 2 + c / 16] = static_cast<uint8_t>(scale);
  if (!main && lane == 0) rec[p.dim / 2 + chunk] = static_cast<uint8_t>(scale);
}

// One block per completed group, one thread per channel.
__global__ void compressor_kernel(CompressorParams p) {
  __shared__ float scratch[32];
  const int64_t first = (p.start_pos / p.ratio + blockIdx.x) * p.ratio;
  float v = 0.0f;
  const int c = threadIdx.x;
  if (c < p.dim) {
    const auto kv_at = [&](int64_t pos) {
      return pos < p.start_pos ? p.state_kv[(pos % p.ratio) * p.dim + c]
                               : p.kv[(pos - p.start_pos) * p.ld + c];
    };
    if (p.ratio == 1) {
      v = kv_at(first);
    } else {
      const auto g_at = [&](int64_t pos) {
        return pos < p.start_pos ? p.state_gate[(pos % p.ratio) * p.dim + c]
                                 : p.gate[(pos - p.start_pos) * p.ld + c];
      };
      float mx = -INFINITY;
      for (int t = 0; t < p.ratio; ++t) mx = fmaxf(mx, g_at(first + t));
      float num = 0.0f, den = 0.0f;
      for (int t = 0; t < p.ratio; ++t) {
        const float e = expf(g_at(first + t) - mx);
        den += e;
        num = fmaf(e, kv_at(first + t), num);
      }
      v = num / den;
    }
    v = __bfloat162float(__float2bfloat16_rn(v));
  }
  const float ss = block_sum(v * v, scratch);
  if (c < p.dim) {
    const float inv = rsqrtf(ss / static_cast<float>(p.dim) + p.eps);
    p.out[static_cast<int64_t>(blockIdx.x) * p.dim + c] =
        v * inv * (p.norm_weight ? p.norm_weight[c] : 1.0f);
  }
}

// The trailing partial group's rows into the state (after compressor_kernel read it).
__global__ void compressor_state_kernel(CompressorParams p, int64_t first_pos) {
  const int64_t pos = first_pos + blockIdx.x;
  for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {
    p.state_kv[(pos % p.ratio) * p.dim + c] = p.kv[(pos - p.start_pos) * p.ld + c];
    if (p.gate != nullptr)
      p.state_gate[(pos % p.ratio) * p.dim + c] = p.gate[(pos - p.start_pos) * p.ld + c];
  }
}

}  // namespace

void launch_swa_write_fp8(const SwaWriteParams& p, Stream stream) {
  if (p.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.dim / 32, 8)), static_cast<unsigned>(p.rows));
  swa_write_kernel<<<grid, 256, 0, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_fp4_cache_write(const Fp4CacheWriteParams& p, Stream stream) {
  if (p.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.dim / 32, 8)), static_cast<unsigned>(p.rows));
  fp4_write_kernel<<<grid, 256, 0, as_cuda_stream(stream)>>>(p);
  MS_CUDA_CHECK_LAUNCH();
}

void launch_compressor(const CompressorParams& p, Stream stream) {
  if (p.rows == 0) return;
  const int64_t groups = (p.start_pos + p.rows) / p.ratio - p.start_pos / p.ratio;
  const int threads = static_cast<int>(ceil_div(p.dim, 32) * 32);
  if (groups > 0) {
    compressor_kernel<<<static_cast<unsigned>(groups), threads, 0, as_cuda_stream(stream)>>>(p);
    MS_CUDA_CHECK_LAUNCH();
  }
  const int64_t end = p.start_pos + p.rows;
  const int64_t first = std::max(p.start_pos, end / p.ratio * p.ratio);
  if (p.ratio > 1 && end > first) {
    compressor_state_kernel<<<static_cast<unsigned>(end - first), 256, 0, as_cuda_stream(stream)>>>(
        p, first);
    MS_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace moeserve::cuda

// The slot layout of the padded FP8 experts (kernels.h launch_moe_pad_plan): each CTA rebuilds the
// experts' offsets and overflow prefix in shared memory, then the grid strides over the slot rows,
// the grouped hits (their overflow rows) and inv's hits. A hit's expert is found by binary search
// over the offsets (the largest e with offsets[e] <= position: empty experts share their offset
// with the next one).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/kernels.h"

namespace moeserve::cuda {
namespace {

constexpr int kPlanThreads = 512;

__global__ void __launch_bounds__(kPlanThreads) moe_pad_plan_kernel(MoePadPlanParams p) {
  pdl_wait();
  extern __shared__ int32_t plan_smem[];
  const int local = p.local;
  int32_t* off = plan_smem;             // [local + 1]
  int32_t* ovp = plan_smem + local + 1;  // [local + 1]
  for (int e = threadIdx.x; e <= local; e += blockDim.x) off[e] = p.offsets[e];
  __syncthreads();
  const int64_t C = p.group_rows;
  if (threadIdx.x == 0) {
    int32_t acc = 0;
    for (int e = 0; e < local; ++e) {
      ovp[e] = acc;
      acc += static_cast<int32_t>(max(static_cast<int64_t>(off[e + 1] - off[e]) - C, int64_t{0}));
    }
    ovp[local] = acc;
  }
  __syncthreads();
  if (blockIdx.x == 0)
    for (int e = threadIdx.x; e <= local; e += blockDim.x) p.ov_offsets[e] = ovp[e];
  const auto expert_of = [&](int64_t g) {
    int lo = 0, hi = local;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (off[mid] <= g) lo = mid;
      else hi = mid;
    }
    return lo;
  };
  const int64_t slots = static_cast<int64_t>(local) * C;
  const int64_t total = min(static_cast<int64_t>(off[local]), p.grouped_bound);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t q = i0; q < slots; q += stride) {
    const int64_t e = q / C, i = q % C;
    if (i < off[e + 1] - off[e]) {
      const int64_t g = off[e] + i;
      p.pad_row[q] = p.perm_row[g];
      p.pad_weight[q] = p.perm_weight[g];
    } else {
      p.pad_row[q] = -1;
      p.pad_weight[q] = 0.0f;
    }
  }
  for (int64_t g = i0; g < total; g += stride) {
    const int e = expert_of(g);
    const int64_t i = g - off[e];
    if (i >= C) {
      const int64_t j = ovp[e] + i - C;
      p.ov_row[j] = p.perm_row[g];
      p.ov_weight[j] = p.perm_weight[g];
    }
  }
  for (int64_t h = i0; h < p.hits; h += stride) {
    const int32_t g = p.inv[h];
    if (g < 0) {
      p.pad_inv[h] = -1;
      continue;
    }
    const int e = expert_of(g);
    const int64_t i = g - off[e];
    p.pad_inv[h] = static_cast<int32_t>(i < C ? e * C + i : slots + ovp[e] + i - C);
  }
}

}  // namespace

void launch_moe_pad_plan(const MoePadPlanParams& p, Stream stream) {
  if (p.local <= 0 || p.local > 4096 || p.group_rows < 1 || p.hits < 0 || p.grouped_bound < 0 ||
      static_cast<int64_t>(p.local) * p.group_rows + p.grouped_bound > (int64_t{1} << 31) - 1 ||
      p.offsets == nullptr || p.perm_row == nullptr || p.perm_weight == nullptr ||
      (p.hits > 0 && (p.inv == nullptr || p.pad_inv == nullptr)) || p.pad_row == nullptr ||
      p.pad_weight == nullptr || p.ov_offsets == nullptr || p.ov_row == nullptr ||
      p.ov_weight == nullptr)
    detail::cuda_call_failed(__FILE__, __LINE__, "launch_moe_pad_plan", "bad arguments",
                             "0 < local <= 4096, group_rows >= 1, hits >= 0, grouped_bound >= 0, "
                             "local * group_rows + grouped_bound < 2^31; every pointer set");
  const int64_t work = std::max({static_cast<int64_t>(p.local) * p.group_rows, p.grouped_bound,
                                 p.hits, int64_t{1}});
  const int64_t blocks =
      std::min<int64_t>(ceil_div(work, kPlanThreads), int64_t{2} * device_sm_count());
  const size_t smem = sizeof(int32_t) * 2 * (static_cast<size_t>(p.local) + 1);
  MS_CUDA_CHECK(launch_kernel(moe_pad_plan_kernel, static_cast<unsigned>(blocks), kPlanThreads,
                              smem, as_cuda_stream(stream), p));
}

}  // namespace moeserve::cuda

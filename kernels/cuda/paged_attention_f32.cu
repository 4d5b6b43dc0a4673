#include "kernels/cuda/common.cuh"
#include "kernels/cuda/paged_attention_f32.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kWarps = kPagedAttentionF32Warps;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxHeadDim = static_cast<int>(PagedAttentionF32Params::kMaxHeadDim);
constexpr int kDimsPerLane = kMaxHeadDim / 32;  // lane l holds dimensions l, l + 32, ...

struct Args {
  const float* query;
  const float* key_cache;
  const float* value_cache;
  const int32_t* query_start;
  const int32_t* context_lens;
  const int32_t* block_table_start;
  const int32_t* block_table_ids;
  float* output;
  int num_seqs, num_heads, num_kv_heads, group_size, head_dim, block_size;
  int window;  // 0: none
  int64_t query_stride;
  float scale;
  float softcap;  // 0: none
};

// The sequence that owns `token`: the last s with query_start[s] <= token.
// REQUIRES: query_start[0] <= token < query_start[num_seqs].
__device__ __forceinline__ int SequenceOf(const int32_t* query_start, int num_seqs, int token) {
  int lo = 0, hi = num_seqs;  // query_start[lo] <= token < query_start[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (query_start[mid] <= token) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// grid (num_tokens, num_heads), kThreads threads: one (query token, query head) per block.
__global__ void __launch_bounds__(kThreads) PagedAttentionF32Kernel(Args a) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  BeginDependentKernel();
  const int token = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;

  const int seq = SequenceOf(a.query_start, a.num_seqs, token);
  const int first_token = a.query_start[seq];
  const int query_len = a.query_start[seq + 1] - first_token;
  // Causal: the token at position p sees keys [0, p], or [p - window + 1, p] with a window; none
  // if the context is shorter than the query (a padding sequence of a decode graph has context 0).
  const int position = a.context_lens[seq] - query_len + (token - first_token);
  const int first_key = a.window > 0 && position >= a.window ? position - a.window + 1 : 0;
  const int num_keys = position + 1 - first_key;
  const int kv_head = head / a.group_size;
  const int32_t* table = a.block_table_ids + a.block_table_start[seq];
  const int64_t kv_slot_stride = int64_t{a.num_kv_heads} * a.head_dim;
  const int64_t kv_head_offset = int64_t{kv_head} * a.head_dim;

  const float* q = a.query + token * a.query_stride + int64_t{head} * a.head_dim;
  float q_lane[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    q_lane[i] = d < a.head_dim ? q[d] : 0.0f;
  }

  // This warp's online softmax over its keys: running maximum score, sum of exp(score - maximum),
  // and the values weighted by the same exponentials.
  float running_max = -INFINITY, running_sum = 0.0f;
  float acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.0f;
  for (int j = first_key + warp; j <= position; j += kWarps) {
    const int64_t slot = int64_t{table[j / a.block_size]} * a.block_size + j % a.block_size;
    const float* k = a.key_cache + slot * kv_slot_stride + kv_head_offset;
    const float* v = a.value_cache + slot * kv_slot_stride + kv_head_offset;
    float partial = 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < a.head_dim) partial += q_lane[i] * k[d];
    }
    float score = WarpSum(partial) * a.scale;
    if (a.softcap > 0.0f) score = a.softcap * tanhf(score / a.softcap);  // as the CPU twin
    const float new_max = fmaxf(running_max, score);
    const float rescale = expf(running_max - new_max);  // 0 at the first key
    const float weight = expf(score - new_max);
    running_sum = running_sum * rescale + weight;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < a.head_dim) acc[i] = acc[i] * rescale + weight * v[d];
    }
    running_max = new_max;
  }

  // Merge the warps: rescale each to the block's maximum (a warp without keys weighs nothing).
  if (lane == 0) {
    warp_max[warp] = running_max;
    warp_sum[warp] = running_sum;
  }
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < a.head_dim) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float block_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, warp_max[w]);
  float warp_scale[kWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    warp_scale[w] = warp_max[w] == -INFINITY ? 0.0f : expf(warp_max[w] - block_max);
    total += warp_sum[w] * warp_scale[w];
  }
  float* out = a.output + (int64_t{token} * a.num_heads + head) * a.head_dim;
  for (int d = static_cast<int>(threadIdx.x); d < a.head_dim; d += kThreads) {
    float value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) value += warp_acc[w][d] * warp_scale[w];
    out[d] = num_keys > 0 ? value / total : 0.0f;
  }
}

}  // namespace

cudaError_t Launch(const PagedAttentionF32Params& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  Args a{};
  a.query = static_cast<const float*>(p.query);
  a.key_cache = static_cast<const float*>(p.key_cache);
  a.value_cache = static_cast<const float*>(p.value_cache);
  a.query_start = p.query_start;
  a.context_lens = p.context_lens;
  a.block_table_start = p.block_table_start;
  a.block_table_ids = p.block_table_ids;
  a.output = static_cast<float*>(p.output);
  a.num_seqs = static_cast<int>(p.num_seqs);
  a.num_heads = static_cast<int>(p.num_heads);
  a.num_kv_heads = static_cast<int>(p.num_kv_heads);
  a.group_size = static_cast<int>(p.num_heads / p.num_kv_heads);
  a.head_dim = static_cast<int>(p.head_dim);
  a.block_size = static_cast<int>(p.block_size);
  a.query_stride = p.query_stride != 0 ? p.query_stride : p.num_heads * p.head_dim;
  a.scale = p.scale;
  a.window = p.window;
  a.softcap = p.softcap;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.num_heads));
  return LaunchKernel(PagedAttentionF32Kernel, grid, kThreads, 0, stream, a);
}

}  // namespace lmserve::kernels::cuda

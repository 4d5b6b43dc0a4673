// Paged decode and prefill attention on the GPU against the CPU twin (kernels/cpu/paged_attention.h)
// over the same bf16/fp16-rounded inputs, at awkward lengths, every head dim and GQA ratios 1, 4, 8.

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/prefill_attention.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::HalfToFloat;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::RoundToHalf;
using testing::Tolerance;

constexpr int64_t kBlockSize = 16;

// A ragged batch over a paged cache: host copies (fp32, already rounded to the 16-bit type) and
// device copies.
struct PagedBatch {
  PagedBatch(DType dtype_in, int64_t heads, int64_t kv_heads, int64_t dim)
      : dtype(dtype_in), num_heads(heads), num_kv_heads(kv_heads), head_dim(dim) {}
  DType dtype;
  int64_t num_heads, num_kv_heads, head_dim, num_blocks = 0;
  std::vector<int32_t> query_start{0}, context_lens, table_start{0}, table_ids;
  std::vector<float> query, key_cache, value_cache;
  DeviceBuffer<uint16_t> d_query, d_key, d_value;
  DeviceBuffer<int32_t> d_query_start, d_context_lens, d_table_start, d_table_ids;

  int64_t num_seqs() const { return static_cast<int64_t>(context_lens.size()); }
  int64_t num_tokens() const { return query_start.back(); }
};

// Builds a batch of (query_len, context_len) sequences with shuffled, distinct cache blocks.
void BuildBatch(PagedBatch& b, const std::vector<std::pair<int32_t, int32_t>>& seqs,
                std::mt19937& rng) {
  int64_t blocks_needed = 0;
  for (const auto& [q, ctx] : seqs) blocks_needed += (ctx + kBlockSize - 1) / kBlockSize;
  b.num_blocks = blocks_needed + 5;
  std::vector<int32_t> pool(b.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  for (const auto& [q, ctx] : seqs) {
    b.query_start.push_back(b.query_start.back() + q);
    b.context_lens.push_back(ctx);
    for (int64_t j = 0; j < (ctx + kBlockSize - 1) / kBlockSize; ++j) b.table_ids.push_back(pool[next++]);
    b.table_start.push_back(static_cast<int32_t>(b.table_ids.size()));
  }
  const int64_t kv_elements = b.num_blocks * kBlockSize * b.num_kv_heads * b.head_dim;
  b.query = RandomFloats(b.num_tokens() * b.num_heads * b.head_dim, rng);
  b.key_cache = RandomFloats(kv_elements, rng);
  b.value_cache = RandomFloats(kv_elements, rng);
  b.d_query = DeviceBuffer<uint16_t>(RoundToHalf(b.query, b.dtype));
  b.d_key = DeviceBuffer<uint16_t>(RoundToHalf(b.key_cache, b.dtype));
  b.d_value = DeviceBuffer<uint16_t>(RoundToHalf(b.value_cache, b.dtype));
  b.d_query_start = DeviceBuffer<int32_t>(b.query_start);
  b.d_context_lens = DeviceBuffer<int32_t>(b.context_lens);
  b.d_table_start = DeviceBuffer<int32_t>(b.table_start);
  b.d_table_ids = DeviceBuffer<int32_t>(b.table_ids);
}

std::vector<float> CpuAttention(const PagedBatch& b) {
  std::vector<float> out(b.num_tokens() * b.num_heads * b.head_dim);
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  const int64_t max_context = *std::max_element(b.context_lens.begin(), b.context_lens.end());
  std::vector<float> workspace(kernels::PagedAttentionParams::WorkspaceFloats(
      max_context, b.num_heads, b.num_kv_heads, threads));
  kernels::PagedAttentionParams p;
  p.query = b.query.data();
  p.key_cache = b.key_cache.data();
  p.value_cache = b.value_cache.data();
  p.query_start = b.query_start.data();
  p.context_lens = b.context_lens.data();
  p.block_table_start = b.table_start.data();
  p.block_table_ids = b.table_ids.data();
  p.output = out.data();
  p.workspace = workspace.data();
  p.num_seqs = b.num_seqs();
  p.num_tokens = b.num_tokens();
  p.num_heads = b.num_heads;
  p.num_kv_heads = b.num_kv_heads;
  p.head_dim = b.head_dim;
  p.block_size = kBlockSize;
  p.num_blocks = b.num_blocks;
  p.max_context_len = max_context;
  p.scale = 1.0f / std::sqrt(static_cast<float>(b.head_dim));
  p.num_threads = threads;
  kernels::PagedAttention(p);
  return out;
}

DecodeAttentionParams DecodeParams(const PagedBatch& b, void* output, void* workspace,
                                   int max_splits) {
  DecodeAttentionParams p;
  p.query = b.d_query.get();
  p.key_cache = b.d_key.get();
  p.value_cache = b.d_value.get();
  p.context_lens = b.d_context_lens.get();
  p.block_table_start = b.d_table_start.get();
  p.block_table_ids = b.d_table_ids.get();
  p.output = output;
  p.workspace = workspace;
  p.num_seqs = b.num_seqs();
  p.num_heads = b.num_heads;
  p.num_kv_heads = b.num_kv_heads;
  p.head_dim = b.head_dim;
  p.block_size = kBlockSize;
  p.num_blocks = b.num_blocks;
  p.max_splits = max_splits;
  p.scale = 1.0f / std::sqrt(static_cast<float>(b.head_dim));
  p.dtype = b.dtype;
  return p;
}

constexpr int32_t kLengths[] = {1, 15, 16, 17, 97, 4099};

void RunDecodeCase(DType dtype, int64_t batch, int64_t num_kv_heads, int64_t group,
                   int64_t head_dim) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " batch " << batch << " kv heads "
                                    << num_kv_heads << " group " << group << " head_dim "
                                    << head_dim << " seed " << seed);
  std::mt19937 rng(seed);
  PagedBatch b{dtype, num_kv_heads * group, num_kv_heads, head_dim};
  std::vector<std::pair<int32_t, int32_t>> seqs;
  for (int64_t i = 0; i < batch; ++i) seqs.push_back({1, kLengths[(i + 5) % 6]});
  BuildBatch(b, seqs, rng);
  const std::vector<float> ref = CpuAttention(b);

  const int chosen =
      DecodeAttentionParams::ChooseMaxSplits(batch, b.num_heads, num_kv_heads, head_dim, dtype);
  for (int max_splits : {1, 7, chosen}) {
    SCOPED_TRACE(::testing::Message() << "max_splits " << max_splits);
    DeviceBuffer<uint16_t> d_out(ref.size());
    DeviceBuffer<uint8_t> d_ws(std::max<int64_t>(
        16, DecodeAttentionParams::WorkspaceBytes(batch, b.num_heads, head_dim, max_splits)));
    d_out.Poison();
    d_ws.Poison();
    const DecodeAttentionParams p = DecodeParams(b, d_out.get(), d_ws.get(), max_splits);
    ASSERT_TRUE(p.Validate().ok()) << p.Validate();
    CUDA_ASSERT(Launch(p, nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_LE(RelativeL2(HalfToFloat(d_out.Download(), dtype), ref), Tolerance(dtype));
  }
}

TEST(DecodeAttentionGpuTest, MatchesCpuEveryHeadDimAndGqaRatio) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t head_dim : {32, 64, 80, 96, 128, 256}) {
    for (int64_t group : {1, 4, 8}) {
      for (int64_t batch : {1, 17, 64}) RunDecodeCase(DType::kBF16, batch, 2, group, head_dim);
    }
  }
}

TEST(DecodeAttentionGpuTest, SmallFp16MqaAndOddGroups) {
  LMSERVE_REQUIRE_GPU();
  RunDecodeCase(DType::kF16, 17, 2, 4, 128);
  RunDecodeCase(DType::kBF16, 17, 1, 16, 128);  // MQA, 16 heads: one block's rows
  RunDecodeCase(DType::kBF16, 3, 1, 20, 64);     // 16 + 4: two blocks per KV head
  RunDecodeCase(DType::kBF16, 17, 2, 3, 64);    // group 3 in a tile of 4
  RunDecodeCase(DType::kBF16, 5, 1, 12, 80);    // 12 of 16 rows
}

// One captured launch serves any lengths: replay the graph after changing the lengths on the
// device, split counts included.
TEST(DecodeAttentionGpuTest, GraphReplayFollowsDeviceLengths) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  const DType dtype = DType::kBF16;
  PagedBatch b{dtype, 32, 8, 128};
  std::vector<std::pair<int32_t, int32_t>> seqs;
  for (int i = 0; i < 17; ++i) seqs.push_back({1, 4099});
  BuildBatch(b, seqs, rng);
  const int max_splits = DecodeAttentionParams::ChooseMaxSplits(17, 32, 8, 128, dtype);
  DeviceBuffer<uint16_t> d_out(b.num_tokens() * b.num_heads * b.head_dim);
  DeviceBuffer<uint8_t> d_ws(DecodeAttentionParams::WorkspaceBytes(17, 32, 128, max_splits) + 16);
  const DecodeAttentionParams p = DecodeParams(b, d_out.get(), d_ws.get(), max_splits);
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_ASSERT(Launch(p, stream));
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 17; ++i) b.context_lens[i] = kLengths[(i + round) % 6];
    if (round == 2) b.context_lens.assign(17, 4099);
    b.d_context_lens.Upload(b.context_lens);
    d_out.Poison();
    CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    EXPECT_LE(RelativeL2(HalfToFloat(d_out.Download(), dtype), CpuAttention(b)), Tolerance(dtype))
        << "round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

void RunPrefillCase(DType dtype, int64_t num_kv_heads, int64_t group, int64_t head_dim,
                    const std::vector<std::pair<int32_t, int32_t>>& seqs) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " kv heads " << num_kv_heads
                                    << " group " << group << " head_dim " << head_dim
                                    << " seqs " << seqs.size() << " seed " << seed);
  std::mt19937 rng(seed);
  PagedBatch b{dtype, num_kv_heads * group, num_kv_heads, head_dim};
  BuildBatch(b, seqs, rng);
  const std::vector<float> ref = CpuAttention(b);
  DeviceBuffer<uint16_t> d_out(ref.size());
  DeviceBuffer<uint8_t> d_ws(PrefillAttentionParams::WorkspaceBytes(b.num_seqs()));
  d_out.Poison();
  d_ws.Poison();
  PrefillAttentionParams p;
  p.query = b.d_query.get();
  p.key_cache = b.d_key.get();
  p.value_cache = b.d_value.get();
  p.query_start = b.d_query_start.get();
  p.context_lens = b.d_context_lens.get();
  p.block_table_start = b.d_table_start.get();
  p.block_table_ids = b.d_table_ids.get();
  p.output = d_out.get();
  p.workspace = d_ws.get();
  p.num_seqs = b.num_seqs();
  p.num_tokens = b.num_tokens();
  p.num_heads = b.num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  p.block_size = kBlockSize;
  p.num_blocks = b.num_blocks;
  p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  p.dtype = dtype;
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(HalfToFloat(d_out.Download(), dtype), ref), Tolerance(dtype));
  // The plan computed once serves a second launch.
  d_out.Poison();
  p.plan_ready = true;
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_LE(RelativeL2(HalfToFloat(d_out.Download(), dtype), ref), Tolerance(dtype));
}

// Fresh prefills at awkward lengths, prefix-cache hits and chunked prefill (queries starting
// mid-sequence), and decode tokens, in one ragged batch.
const std::vector<std::pair<int32_t, int32_t>> kMixedBatch = {
    {1, 1}, {15, 15}, {16, 16}, {17, 17}, {97, 97}, {17, 97}, {1, 4099},
    {64, 4099}, {97, 200}, {1, 16}, {33, 81}, {65, 65}};

TEST(PrefillAttentionGpuTest, MixedBatchEveryHeadDimAndGqaRatio) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t head_dim : {32, 64, 80, 96, 128, 256}) {
    for (int64_t group : {1, 4, 8}) RunPrefillCase(DType::kBF16, 2, group, head_dim, kMixedBatch);
  }
}

TEST(PrefillAttentionGpuTest, SmallFp16) {
  LMSERVE_REQUIRE_GPU();
  RunPrefillCase(DType::kF16, 2, 4, 128, kMixedBatch);
  RunPrefillCase(DType::kF16, 1, 8, 96, {{17, 17}, {1, 33}});
}

TEST(PrefillAttentionGpuTest, LongPrefill) {
  LMSERVE_REQUIRE_GPU();
  RunPrefillCase(DType::kBF16, 2, 4, 128, {{4099, 4099}, {15, 15}, {1, 97}});
}

}  // namespace
}  // namespace lmserve::kernels::cuda

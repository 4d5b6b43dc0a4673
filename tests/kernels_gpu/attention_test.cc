// Paged decode and prefill attention on the GPU against the CPU twin
// (kernels/cpu/paged_attention.h) over the same bf16/fp16-rounded inputs, at awkward lengths, every
// head dim and GQA ratios 1, 4, 8; and the fp32 attention of the runner's float32 mode
// (PagedAttentionF32) over fp32 inputs. Each with sliding windows (the blocks that left every
// query's window freed: -1 in the table, NaN in the cache, and a NaN block just before the cache
// where block -1 would be) and score soft-caps.

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/paged_attention_f32.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::HalfToFloat;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::ScopedKernelPath;
using testing::Tolerance;

constexpr int64_t kBlockSize = 16;

// A ragged batch over a paged cache: host copies (fp32, already rounded to the element type) and
// device copies in the element type.
struct PagedBatch {
  PagedBatch(DType dtype_in, int64_t heads, int64_t kv_heads, int64_t dim)
      : dtype(dtype_in), num_heads(heads), num_kv_heads(kv_heads), head_dim(dim) {}
  DType dtype;
  int64_t num_heads, num_kv_heads, head_dim, num_blocks = 0;
  int64_t block_size = kBlockSize;  // tokens per cache block
  int32_t window = 0;               // the attention's sliding window; 0: none
  float softcap = 0;                // the attention's score soft-cap; 0: none
  float scale = 0;                  // the score multiplier; 0: 1 / sqrt(head_dim)
  std::vector<int32_t> query_start{0}, context_lens, table_start{0}, table_ids;
  // A guard block of NaN, then the cache ([num_blocks, block_size, kv heads, head_dim]).
  std::vector<float> query, key_cache, value_cache;
  // An FP8 E4M3 cache (kernels/cuda/fp8_cache.cuh) with these scales: the host caches hold the
  // values the device's bytes stand for.
  bool fp8_cache = false;
  float k_scale = 1.0f, v_scale = 1.0f;
  DeviceBuffer<uint8_t> d_query, d_key, d_value;
  DeviceBuffer<int32_t> d_query_start, d_context_lens, d_table_start, d_table_ids;

  int64_t num_seqs() const { return static_cast<int64_t>(context_lens.size()); }
  int64_t num_tokens() const { return query_start.back(); }
  int64_t guard() const { return block_size * num_kv_heads * head_dim; }  // elements
  int64_t cache_element_bytes() const { return fp8_cache ? 1 : testing::ElementBytes(dtype); }
  float score_scale() const {
    return scale != 0 ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  // The caches past their guard block, on the device.
  const void* device_key() const { return d_key.get() + guard() * cache_element_bytes(); }
  const void* device_value() const { return d_value.get() + guard() * cache_element_bytes(); }
};

// A device copy of `values` as FP8 E4M3 bytes of value / scale (an FP8 KV cache's layout,
// kernels/cuda/fp8_cache.cuh); `values` becomes what the device holds: scale times each byte's
// value (NaN stays NaN).
DeviceBuffer<uint8_t> UploadF8(std::vector<float>& values, float scale) {
  std::vector<uint8_t> bytes(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bytes[i] = F32ToF8E4M3(values[i] / scale);
    if (!std::isnan(values[i])) values[i] = scale * F8E4M3ToF32(bytes[i]);
  }
  return DeviceBuffer<uint8_t>(bytes);
}

// Uploads b's caches (rounding the host copies to what the device holds).
void UploadCaches(PagedBatch& b) {
  if (b.fp8_cache) {
    b.d_key = UploadF8(b.key_cache, b.k_scale);
    b.d_value = UploadF8(b.value_cache, b.v_scale);
  } else {
    b.d_key = testing::Upload(b.key_cache, b.dtype);
    b.d_value = testing::Upload(b.value_cache, b.dtype);
  }
}

// Builds a batch of (query_len, context_len) sequences with shuffled, distinct cache blocks.
void BuildBatch(PagedBatch& b, const std::vector<std::pair<int32_t, int32_t>>& seqs,
                std::mt19937& rng) {
  int64_t blocks_needed = 0;
  const int64_t bs = b.block_size;
  for (const auto& [q, ctx] : seqs) blocks_needed += (ctx + bs - 1) / bs;
  b.num_blocks = blocks_needed + 5;
  std::vector<int32_t> pool(b.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  for (const auto& [q, ctx] : seqs) {
    b.query_start.push_back(b.query_start.back() + q);
    b.context_lens.push_back(ctx);
    for (int64_t j = 0; j < (ctx + bs - 1) / bs; ++j) b.table_ids.push_back(pool[next++]);
    b.table_start.push_back(static_cast<int32_t>(b.table_ids.size()));
  }
  const int64_t kv_elements = b.num_blocks * bs * b.num_kv_heads * b.head_dim;
  b.query = RandomFloats(b.num_tokens() * b.num_heads * b.head_dim, rng);
  b.key_cache = RandomFloats(b.guard() + kv_elements, rng);
  b.value_cache = RandomFloats(b.guard() + kv_elements, rng);
  std::fill_n(b.key_cache.begin(), b.guard(), NAN);
  std::fill_n(b.value_cache.begin(), b.guard(), NAN);
  b.d_query = testing::Upload(b.query, b.dtype);
  UploadCaches(b);
  b.d_query_start = DeviceBuffer<int32_t>(b.query_start);
  b.d_context_lens = DeviceBuffer<int32_t>(b.context_lens);
  b.d_table_start = DeviceBuffer<int32_t>(b.table_start);
  b.d_table_ids = DeviceBuffer<int32_t>(b.table_ids);
}

// Frees the blocks that lie wholly before the window of every query token of their sequence, as
// the engine does: table entry -1, contents NaN (a block the pool gave to another sequence).
// Returns how many were freed.
int64_t FreeBlocksBeforeWindow(PagedBatch& b) {
  if (b.window <= 0) return 0;
  const int64_t row = b.num_kv_heads * b.head_dim;
  int64_t freed = 0;
  for (int64_t i = 0; i < b.num_seqs(); ++i) {
    const int64_t first_query = b.context_lens[i] - (b.query_start[i + 1] - b.query_start[i]);
    const int64_t first_visible = std::max<int64_t>(0, first_query - b.window + 1);
    for (int64_t j = 0; (j + 1) * b.block_size <= first_visible; ++j) {
      int32_t& id = b.table_ids[b.table_start[i] + j];
      const int64_t begin = b.guard() + id * b.block_size * row;
      std::fill_n(b.key_cache.begin() + begin, b.block_size * row, NAN);
      std::fill_n(b.value_cache.begin() + begin, b.block_size * row, NAN);
      id = -1;
      ++freed;
    }
  }
  UploadCaches(b);
  b.d_table_ids = DeviceBuffer<int32_t>(b.table_ids);
  return freed;
}

std::vector<float> CpuAttention(const PagedBatch& b) {
  std::vector<float> out(b.num_tokens() * b.num_heads * b.head_dim);
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  const int64_t max_context = *std::max_element(b.context_lens.begin(), b.context_lens.end());
  std::vector<float> workspace(kernels::PagedAttentionParams::WorkspaceFloats(
      max_context, b.num_heads, b.num_kv_heads, threads));
  kernels::PagedAttentionParams p;
  p.query = b.query.data();
  p.key_cache = b.key_cache.data() + b.guard();
  p.value_cache = b.value_cache.data() + b.guard();
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
  p.block_size = b.block_size;
  p.num_blocks = b.num_blocks;
  p.max_context_len = max_context;
  p.scale = b.score_scale();
  p.window = b.window;
  p.softcap = b.softcap;
  p.num_threads = threads;
  kernels::PagedAttention(p);
  return out;
}

// The fields every paged attention kernel's parameters share, for batch `b` writing `output`.
template <typename Params>
Params PagedParams(const PagedBatch& b, void* output) {
  Params p;
  p.query = b.d_query.get();
  p.key_cache = b.device_key();
  p.value_cache = b.device_value();
  p.context_lens = b.d_context_lens.get();
  p.block_table_start = b.d_table_start.get();
  p.block_table_ids = b.d_table_ids.get();
  p.output = output;
  p.num_seqs = b.num_seqs();
  p.num_heads = b.num_heads;
  p.num_kv_heads = b.num_kv_heads;
  p.head_dim = b.head_dim;
  p.block_size = b.block_size;
  p.num_blocks = b.num_blocks;
  p.scale = b.score_scale();
  p.window = b.window;
  p.softcap = b.softcap;
  p.dtype = b.dtype;
  return p;
}

DecodeAttentionParams DecodeParams(const PagedBatch& b, void* output, void* workspace,
                                   int max_splits) {
  auto p = PagedParams<DecodeAttentionParams>(b, output);
  p.workspace = workspace;
  p.max_splits = max_splits;
  p.cache_fp8 = b.fp8_cache;
  p.k_scale = b.k_scale;
  p.v_scale = b.v_scale;
  return p;
}

// An FP8 cache for a case, and its scales.
struct KvF8 {
  bool on = false;
  float k_scale = 1.0f, v_scale = 1.0f;
};

std::ostream& operator<<(std::ostream& os, const KvF8& f8) {
  if (!f8.on) return os << "16-bit cache";
  return os << "FP8 cache (k_scale " << f8.k_scale << ", v_scale " << f8.v_scale << ")";
}

constexpr int32_t kLengths[] = {1, 15, 16, 17, 97, 4099};

// A sliding window and a score soft-cap for a case (0: none), and whether the blocks that left
// every query's window are freed.
struct Masking {
  int32_t window = 0;
  float softcap = 0;
  bool free_blocks = false;
};

std::ostream& operator<<(std::ostream& os, const Masking& m) {
  return os << "window " << m.window << " softcap " << m.softcap
            << (m.free_blocks ? " (blocks before the window freed)" : "");
}

// Sets b's window and soft-cap, then frees the blocks before the window if asked.
void ApplyMasking(PagedBatch& b, const Masking& masking) {
  b.window = masking.window;
  b.softcap = masking.softcap;
  if (masking.free_blocks) FreeBlocksBeforeWindow(b);
}

// Multiplies the key at position p of each sequence of context c by 1 + growth p / c, so that its
// scores' magnitudes keep rising along the context.
void GrowKeysAlongTheContext(PagedBatch& b, float growth) {
  const int64_t row = b.num_kv_heads * b.head_dim;  // a slot's elements
  for (int64_t s = 0; s < b.num_seqs(); ++s) {
    const int32_t context = b.context_lens[s];
    for (int32_t pos = 0; pos < context; ++pos) {
      const int64_t block = b.table_ids[b.table_start[s] + pos / b.block_size];
      const int64_t slot = block * b.block_size + pos % b.block_size;
      const float factor = 1.0f + growth * static_cast<float>(pos) / static_cast<float>(context);
      float* key = b.key_cache.data() + b.guard() + slot * row;
      for (int64_t i = 0; i < row; ++i) key[i] *= factor;
    }
  }
  UploadCaches(b);
}

// query_factor: the queries are multiplied by it (a power of two) and the score scale divided by
// it: the same scores from queries of another magnitude. score_factor > 0: the score scale is
// multiplied by it and the keys grow along the context (GrowKeysAlongTheContext, growth 3): a
// sequence's largest scores keep rising, by more than the kernel's rescaling slack and by less.
void RunDecodeCase(DType dtype, int64_t batch, int64_t num_kv_heads, int64_t group,
                   int64_t head_dim, int64_t block_size = kBlockSize, const Masking& masking = {},
                   const KvF8& f8 = {}, float query_factor = 1.0f, float score_factor = 0.0f) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << testing::Name(dtype) << " batch " << batch << " kv heads " << num_kv_heads
               << " group " << group << " head_dim " << head_dim << " block size " << block_size
               << " " << masking << " " << f8 << " query factor " << query_factor
               << " score factor " << score_factor << " seed " << seed);
  std::mt19937 rng(seed);
  PagedBatch b{dtype, num_kv_heads * group, num_kv_heads, head_dim};
  b.block_size = block_size;
  b.fp8_cache = f8.on;
  b.k_scale = f8.k_scale;
  b.v_scale = f8.v_scale;
  std::vector<std::pair<int32_t, int32_t>> seqs;
  for (int64_t i = 0; i < batch; ++i) seqs.push_back({1, kLengths[(i + 5) % 6]});
  BuildBatch(b, seqs, rng);
  if (query_factor != 1.0f) {
    for (float& q : b.query) q *= query_factor;
    b.d_query = testing::Upload(b.query, dtype);
    b.scale = 1.0f / std::sqrt(static_cast<float>(head_dim)) / query_factor;
  }
  if (score_factor > 0.0f) {
    GrowKeysAlongTheContext(b, 3.0f);
    b.scale = b.score_scale() * score_factor;
  }
  ApplyMasking(b, masking);
  const std::vector<float> ref = CpuAttention(b);

  const int chosen = DecodeAttentionParams::ChooseMaxSplits(batch, b.num_heads, num_kv_heads,
                                                            head_dim, dtype, 1.0, f8.on);
  for (int max_splits : {1, 7, chosen, kDecodeMaxSplits}) {
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

// Cache blocks of 16 keys (a tile of keys) and other sizes, multiples and not: tiles that lie in
// one block, that span two, that hold a block's end.
TEST(DecodeAttentionGpuTest, BlockSizesOnAndOffTheTile) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t block_size : {5, 16, 24, 32, 48}) {
    RunDecodeCase(DType::kBF16, 17, 2, 4, 128, block_size);
    RunDecodeCase(DType::kBF16, 3, 1, 8, 64, block_size);
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

// Sliding windows from 1 key to longer than every context, smaller and larger than a cache block
// and a split, with the blocks before them freed; soft-caps alone and with a window; splits from 1
// to kDecodeMaxSplits (the splits divide the window's keys); every head dim.
TEST(DecodeAttentionGpuTest, SlidingWindowAndSoftcap) {
  LMSERVE_REQUIRE_GPU();
  for (int32_t window : {1, 5, 16, 17, 64, 100, 1000, 5000}) {
    const Masking masking{window, 0.0f, window < 4099};
    RunDecodeCase(DType::kBF16, 17, 2, 4, 128, kBlockSize, masking);
    RunDecodeCase(DType::kBF16, 6, 1, 8, 64, 5, masking);
  }
  for (int64_t head_dim : {32, 64, 80, 96, 128, 256}) {
    RunDecodeCase(DType::kBF16, 17, 2, 4, head_dim, kBlockSize, {100, 0.0f, true});
    RunDecodeCase(DType::kBF16, 17, 2, 4, head_dim, kBlockSize, {0, 50.0f, false});
    RunDecodeCase(DType::kBF16, 17, 2, 4, head_dim, kBlockSize, {37, 5.0f, true});
  }
  RunDecodeCase(DType::kF16, 17, 2, 4, 128, 24, {1000, 30.0f, true});
  RunDecodeCase(DType::kBF16, 64, 8, 1, 128, kBlockSize, {4096, 0.0f, true});  // many blocks
}

// The portable path (cp.async) against Hopper's (bulk copies and mbarriers) on the same inputs:
// only the loads into shared memory differ, the math is the same code, so the outputs (and the
// splits' partial results) must be equal bit for bit. Needs a GPU and build that run Hopper's.
// An FP8 E4M3 cache (QkvPostProcess writes it; fp8_cache.cuh): the kernel against the CPU twin
// over the values its bytes stand for (scale times E4M3 value), at the 16-bit tolerance: the
// widening is exact, so the only rounding left is the 16-bit kernel's own. Scales of 1 (vLLM's
// default) and others (values up to ~5 stored as up to ~100, and as ~0.3: E4M3's subnormals);
// both kernel paths, every head dim, windows and soft-caps.
TEST(DecodeAttentionGpuTest, Fp8CacheMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (KernelPath path : {KernelPath::kAuto, KernelPath::kPortable}) {
    ScopedKernelPath scoped(path);
    SCOPED_TRACE(path == KernelPath::kAuto ? "auto path" : "portable path");
    for (int64_t head_dim : {32, 64, 80, 96, 128, 256}) {
      RunDecodeCase(DType::kBF16, 17, 2, 4, head_dim, kBlockSize, {}, {true, 1.0f, 1.0f});
    }
    RunDecodeCase(DType::kBF16, 64, 8, 4, 128, kBlockSize, {}, {true, 0.05f, 0.05f});
    RunDecodeCase(DType::kBF16, 17, 2, 8, 128, 24, {}, {true, 16.0f, 2.0f});
    RunDecodeCase(DType::kF16, 17, 2, 4, 128, kBlockSize, {}, {true, 1.0f, 1.0f});
    RunDecodeCase(DType::kBF16, 5, 1, 12, 80, kBlockSize, {37, 5.0f, true}, {true, 0.5f, 0.25f});
    RunDecodeCase(DType::kBF16, 17, 2, 4, 64, 5, {100, 0.0f, true}, {true, 1.0f, 1.0f});
  }
  // The tiles by bulk copies on Hopper (SetDecodeF8BulkCopies; a no-op elsewhere).
  SetDecodeF8BulkCopies(true);
  for (int64_t head_dim : {64, 80, 128, 256}) {
    RunDecodeCase(DType::kBF16, 17, 2, 4, head_dim, kBlockSize, {}, {true, 16.0f, 2.0f});
  }
  RunDecodeCase(DType::kF16, 64, 8, 4, 128, 24, {37, 5.0f, true}, {true, 0.5f, 0.25f});
  SetDecodeF8BulkCopies(false);
}

// A few small FP8 cases over both loads (cp.async, and bulk copies on Hopper) at head dims whose
// E4M3 rows are 8 and 5 16-byte pieces (the warp's pieces cover the tile's rows whole or not):
// short enough for compute-sanitizer.
TEST(DecodeAttentionGpuTest, Fp8CacheSmallBothLoads) {
  LMSERVE_REQUIRE_GPU();
  for (bool bulk : {false, true}) {
    SetDecodeF8BulkCopies(bulk);
    RunDecodeCase(DType::kBF16, 3, 1, 4, 128, kBlockSize, {}, {true, 1.0f, 1.0f});
    RunDecodeCase(DType::kBF16, 3, 2, 8, 80, 5, {37, 5.0f, true}, {true, 0.5f, 0.25f});
  }
  SetDecodeF8BulkCopies(false);
}

// Over an FP8 cache the products run in fp16 (decode_attention.cu): a bf16 query is scaled into
// fp16's range by a power of two a row and its scores scaled back. Queries far beyond fp16's
// largest value (2^20 times the usual, ~1e6) and far below its smallest normal one (2^-30, ~1e-9)
// give the same attention as usual ones, at bf16's tolerance; on both kernel paths, with a
// soft-cap, and with the integer widenings (SetDecodeF8Widening) as well as the default.
TEST(DecodeAttentionGpuTest, Fp8CacheQueriesOfAnyMagnitude) {
  LMSERVE_REQUIRE_GPU();
  for (KernelPath path : {KernelPath::kAuto, KernelPath::kPortable}) {
    ScopedKernelPath scoped(path);
    SCOPED_TRACE(path == KernelPath::kAuto ? "auto path" : "portable path");
    for (float factor : {0x1p20f, 0x1p-30f}) {
      RunDecodeCase(DType::kBF16, 17, 2, 4, 128, kBlockSize, {}, {true, 1.0f, 1.0f}, factor);
      RunDecodeCase(DType::kBF16, 17, 2, 8, 64, kBlockSize, {0, 50.0f, false}, {true, 0.5f, 0.25f},
                    factor);
      for (DecodeF8Widening widening :
           {DecodeF8Widening::kInteger, DecodeF8Widening::kConvertKeys}) {
        SetDecodeF8Widening(widening);
        RunDecodeCase(DType::kBF16, 17, 2, 4, 128, kBlockSize, {}, {true, 1.0f, 1.0f}, factor);
      }
      SetDecodeF8Widening(DecodeF8Widening::kConvert);
    }
  }
  // The integer widenings on the usual cases, both activation types.
  for (DecodeF8Widening widening : {DecodeF8Widening::kInteger, DecodeF8Widening::kConvertKeys}) {
    SetDecodeF8Widening(widening);
    RunDecodeCase(DType::kBF16, 64, 8, 4, 128, kBlockSize, {}, {true, 0.05f, 0.05f});
    RunDecodeCase(DType::kF16, 17, 2, 8, 128, 24, {37, 5.0f, true}, {true, 16.0f, 2.0f});
  }
  SetDecodeF8Widening(DecodeF8Widening::kConvert);
}

// The kernel moves its running maxima only where a tile's scores pass them by more than a slack
// (decode_attention.cu's kDecodeRescaleSlack, 8 in log2 units), rescaling its accumulators then
// and not otherwise. Scores up to ~16 times the usual (std ~1.4 in log2 units at the context's
// start, up to 4 times that at its end, times the factor), on keys that grow along the context:
// both cases, in every split, with 16-bit and FP8 caches.
TEST(DecodeAttentionGpuTest, ScoresRisingAlongTheContext) {
  LMSERVE_REQUIRE_GPU();
  for (float score_factor : {1.0f, 4.0f}) {
    RunDecodeCase(DType::kBF16, 17, 2, 4, 128, kBlockSize, {}, {}, 1.0f, score_factor);
    RunDecodeCase(DType::kF16, 17, 1, 8, 64, kBlockSize, {100, 0.0f, true}, {}, 1.0f, score_factor);
    RunDecodeCase(DType::kBF16, 17, 2, 4, 128, kBlockSize, {}, {true, 1.0f, 1.0f}, 1.0f,
                  score_factor);
    RunDecodeCase(DType::kBF16, 6, 2, 4, 80, 24, {0, 50.0f, false}, {true, 0.5f, 0.25f}, 1.0f,
                  score_factor);
  }
}

// Blocks of one warp (each warp a whole split, no merge of warps), forced: 16-bit and FP8 caches,
// both kernel paths, windows and soft-caps, splits.
TEST(DecodeAttentionGpuTest, OneWarpBlocks) {
  LMSERVE_REQUIRE_GPU();
  SetDecodeWarps(1);
  for (KernelPath path : {KernelPath::kAuto, KernelPath::kPortable}) {
    ScopedKernelPath scoped(path);
    SCOPED_TRACE(path == KernelPath::kAuto ? "auto path" : "portable path");
    for (int64_t head_dim : {64, 128, 256}) {
      RunDecodeCase(DType::kBF16, 17, 2, 4, head_dim);
      RunDecodeCase(DType::kBF16, 17, 2, 4, head_dim, kBlockSize, {}, {true, 1.0f, 1.0f});
    }
    RunDecodeCase(DType::kF16, 17, 2, 8, 128, 24, {37, 5.0f, true}, {true, 0.5f, 0.25f});
    RunDecodeCase(DType::kBF16, 6, 1, 20, 80, 5, {100, 0.0f, true});
    RunDecodeCase(DType::kBF16, 17, 2, 4, 128, kBlockSize, {}, {true, 1.0f, 1.0f}, 1.0f, 4.0f);
  }
  SetDecodeWarps(0);
}

TEST(DecodeAttentionGpuTest, PortablePathEqualsHopperPathBitForBit) {
  LMSERVE_REQUIRE_GPU();
  {
    ScopedKernelPath hopper(KernelPath::kAuto);
    if (!UseHopperKernels()) {
      GTEST_SKIP() << "no Hopper path here (GPU below 9.0 or code below sm_90): nothing to compare";
    }
  }
  const uint32_t seed = FreshSeed();
  std::mt19937 rng(seed);
  for (int64_t head_dim : {64, 128, 256}) {
    for (int64_t group : {1, 8}) {
      for (const Masking& masking : {Masking{}, Masking{40, 30.0f, true}}) {
        SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim << " group " << group << " "
                                          << masking << " seed " << seed);
        PagedBatch b{DType::kBF16, 2 * group, 2, head_dim};
        std::vector<std::pair<int32_t, int32_t>> seqs;
        for (int i = 0; i < 17; ++i) seqs.push_back({1, kLengths[(i + 5) % 6]});
        BuildBatch(b, seqs, rng);
        ApplyMasking(b, masking);
        for (int max_splits : {1, 7}) {
          std::vector<uint16_t> outputs[2];
          for (int path = 0; path < 2; ++path) {
            ScopedKernelPath scoped(path == 0 ? KernelPath::kAuto : KernelPath::kPortable);
            ASSERT_EQ(UseHopperKernels(), path == 0);
            DeviceBuffer<uint16_t> d_out(b.num_seqs() * b.num_heads * head_dim);
            DeviceBuffer<uint8_t> d_ws(
                std::max<int64_t>(16, DecodeAttentionParams::WorkspaceBytes(
                                          b.num_seqs(), b.num_heads, head_dim, max_splits)));
            d_out.Poison();
            d_ws.Poison();
            CUDA_ASSERT(Launch(DecodeParams(b, d_out.get(), d_ws.get(), max_splits), nullptr));
            CUDA_ASSERT(cudaDeviceSynchronize());
            outputs[path] = d_out.Download();
          }
          EXPECT_EQ(outputs[0], outputs[1]) << "max_splits " << max_splits;
        }
      }
    }
  }
}

// One captured launch serves any lengths: captures `launch`, then replays the graph after changing
// the sequences' lengths on the device (the decode attention's split counts included); each
// replay's `output` (in b.dtype, poisoned first) must be within `tolerance` of the CPU twin.
void CheckGraphReplayFollowsDeviceLengths(PagedBatch& b, DeviceBuffer<uint8_t>& output,
                                          double tolerance,
                                          const std::function<cudaError_t(cudaStream_t)>& launch) {
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_ASSERT(launch(stream));
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  const int64_t num_seqs = b.num_seqs();
  for (int round = 0; round < 3; ++round) {
    for (int64_t i = 0; i < num_seqs; ++i) b.context_lens[i] = kLengths[(i + round) % 6];
    if (round == 2) b.context_lens.assign(num_seqs, 4099);
    b.d_context_lens.Upload(b.context_lens);
    output.Poison();
    CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    EXPECT_LE(RelativeL2(testing::Download(output, b.dtype), CpuAttention(b)), tolerance)
        << "round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// 17 sequences of 4099 keys (the lengths the replays change).
void BuildReplayBatch(PagedBatch& b, std::mt19937& rng) {
  BuildBatch(b, std::vector<std::pair<int32_t, int32_t>>(17, {1, 4099}), rng);
}

TEST(DecodeAttentionGpuTest, GraphReplayFollowsDeviceLengths) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  const DType dtype = DType::kBF16;
  PagedBatch b{dtype, 32, 8, 128};
  BuildReplayBatch(b, rng);
  const int max_splits = DecodeAttentionParams::ChooseMaxSplits(17, 32, 8, 128, dtype);
  DeviceBuffer<uint8_t> d_out = testing::Poisoned(b.num_tokens() * b.num_heads * b.head_dim, dtype);
  DeviceBuffer<uint8_t> d_ws(DecodeAttentionParams::WorkspaceBytes(17, 32, 128, max_splits) + 16);
  const DecodeAttentionParams p = DecodeParams(b, d_out.get(), d_ws.get(), max_splits);
  CheckGraphReplayFollowsDeviceLengths(b, d_out, Tolerance(dtype),
                                       [&](cudaStream_t stream) { return Launch(p, stream); });
}

// PagedParams and the ragged batch's query starts and token count, which PrefillAttentionParams
// and PagedAttentionF32Params take (`b`: a batch of prefill and decode tokens).
template <typename Params>
Params RaggedParams(const PagedBatch& b, void* output) {
  auto p = PagedParams<Params>(b, output);
  p.query_start = b.d_query_start.get();
  p.num_tokens = b.num_tokens();
  return p;
}

// Writes NaN into every cache slot past its sequence's context length (the tail of each
// sequence's last block): a slot the pool gave out but no token has written. Nothing may read it
// into an output (a masked score times a NaN value is still NaN).
void PoisonSlotsPastContext(PagedBatch& b) {
  const int64_t row = b.num_kv_heads * b.head_dim;
  for (int64_t i = 0; i < b.num_seqs(); ++i) {
    const int64_t ctx = b.context_lens[i];
    const int64_t blocks = b.table_start[i + 1] - b.table_start[i];
    for (int64_t pos = ctx; pos < blocks * b.block_size; ++pos) {
      const int32_t id = b.table_ids[b.table_start[i] + pos / b.block_size];
      const int64_t begin = b.guard() + (id * b.block_size + pos % b.block_size) * row;
      std::fill_n(b.key_cache.begin() + begin, row, NAN);
      std::fill_n(b.value_cache.begin() + begin, row, NAN);
    }
  }
  UploadCaches(b);
}

struct PrefillLayout {
  int64_t block_size = kBlockSize;
  bool nan_past_context = false;  // PoisonSlotsPastContext
};

void RunPrefillCase(DType dtype, int64_t num_kv_heads, int64_t group, int64_t head_dim,
                    const std::vector<std::pair<int32_t, int32_t>>& seqs,
                    const Masking& masking = {}, const PrefillLayout& layout = {},
                    const KvF8& f8 = {}) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " kv heads " << num_kv_heads
                                    << " group " << group << " head_dim " << head_dim
                                    << " seqs " << seqs.size() << " " << masking
                                    << " block size " << layout.block_size
                                    << (layout.nan_past_context ? " NaN past the context" : "")
                                    << " " << f8 << " seed " << seed);
  std::mt19937 rng(seed);
  PagedBatch b{dtype, num_kv_heads * group, num_kv_heads, head_dim};
  b.block_size = layout.block_size;
  b.fp8_cache = f8.on;
  b.k_scale = f8.k_scale;
  b.v_scale = f8.v_scale;
  BuildBatch(b, seqs, rng);
  ApplyMasking(b, masking);
  if (layout.nan_past_context) PoisonSlotsPastContext(b);
  const std::vector<float> ref = CpuAttention(b);
  DeviceBuffer<uint16_t> d_out(ref.size());
  DeviceBuffer<uint8_t> d_ws(PrefillAttentionParams::WorkspaceBytes(b.num_seqs()));
  d_out.Poison();
  d_ws.Poison();
  auto p = RaggedParams<PrefillAttentionParams>(b, d_out.get());
  p.workspace = d_ws.get();
  p.cache_fp8 = b.fp8_cache;
  p.k_scale = b.k_scale;
  p.v_scale = b.v_scale;
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

// Sliding windows (shorter and longer than a key tile, a query tile and a cache block) over
// ragged batches with cached prefixes and chunks, the blocks before every query's window freed;
// soft-caps alone and with a window; every head dim, and GQA.
TEST(PrefillAttentionGpuTest, SlidingWindowAndSoftcap) {
  LMSERVE_REQUIRE_GPU();
  for (int32_t window : {1, 7, 16, 33, 64, 100, 129, 4096}) {
    RunPrefillCase(DType::kBF16, 2, 4, 128, kMixedBatch, {window, 0.0f, true});
    RunPrefillCase(DType::kBF16, 2, 1, 64, kMixedBatch, {window, 0.0f, false});
  }
  for (int64_t head_dim : {32, 64, 80, 96, 128, 256}) {
    RunPrefillCase(DType::kBF16, 2, 4, head_dim, kMixedBatch, {50, 0.0f, true});
    RunPrefillCase(DType::kBF16, 2, 4, head_dim, kMixedBatch, {0, 50.0f, false});
    RunPrefillCase(DType::kBF16, 2, 4, head_dim, kMixedBatch, {19, 5.0f, true});
  }
  RunPrefillCase(DType::kF16, 2, 4, 128, kMixedBatch, {300, 30.0f, true});
  RunPrefillCase(DType::kBF16, 2, 4, 128, {{4099, 4099}, {15, 15}, {1, 97}, {512, 4000}},
                 {1024, 0.0f, true});
}

// Small cases of the sm_90a kernel's windows, soft-caps, FP8 staging and head dim 256 for
// compute-sanitizer (memcheck, racecheck); the mma.sync kernel elsewhere.
TEST(PrefillAttentionGpuTest, SmallWindowSoftcapFp8) {
  LMSERVE_REQUIRE_GPU();
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{17, 17}, {1, 33}, {130, 200}};
  RunPrefillCase(DType::kBF16, 1, 4, 128, seqs, {50, 30.0f, true}, {16, true});
  RunPrefillCase(DType::kBF16, 1, 4, 128, seqs, {}, {16, true}, {true, 0.5f, 2.0f});
  RunPrefillCase(DType::kF16, 1, 4, 64, seqs, {40, 0.0f, true}, {32, true}, {true, 1.0f, 1.0f});
  RunPrefillCase(DType::kBF16, 1, 4, 256, seqs, {20, 30.0f, true}, {16, true});
}

TEST(PrefillAttentionGpuTest, LongPrefill) {
  LMSERVE_REQUIRE_GPU();
  RunPrefillCase(DType::kBF16, 2, 4, 128, {{4099, 4099}, {15, 15}, {1, 97}});
}

// An FP8 E4M3 cache against the CPU twin over the values the bytes stand for; fresh prefills,
// prefix-cache hits and chunked prefill (queries from mid-sequence against a cached prefix) and
// decode tokens in one batch. On Hopper head dims 64 to 128 run the sm_90a kernel (more of its
// shapes in HopperKernelShapes), 32 and 256 and the portable path the mma.sync kernel.
TEST(PrefillAttentionGpuTest, Fp8CacheMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t head_dim : {32, 64, 80, 96, 128, 256}) {
    RunPrefillCase(DType::kBF16, 2, 4, head_dim, kMixedBatch, {}, {}, {true, 1.0f, 1.0f});
  }
  RunPrefillCase(DType::kBF16, 2, 8, 128, kMixedBatch, {}, {}, {true, 0.05f, 0.05f});
  RunPrefillCase(DType::kF16, 2, 4, 128, kMixedBatch, {}, {}, {true, 16.0f, 2.0f});
  RunPrefillCase(DType::kBF16, 2, 4, 128, kMixedBatch, {50, 30.0f, true}, {}, {true, 1.0f, 1.0f});
  RunPrefillCase(DType::kBF16, 1, 8, 64, kMixedBatch, {}, {24, false}, {true, 1.0f, 1.0f});
  {
    ScopedKernelPath portable(KernelPath::kPortable);
    RunPrefillCase(DType::kBF16, 2, 4, 128, kMixedBatch, {}, {}, {true, 1.0f, 1.0f});
  }
}

// Which kernel Launch picks: on a Hopper GPU on the Hopper path, the sm_90a kernel for head dims
// 64, 80, 96, 128 and 256 at the block sizes its TMA boxes fit, with or without a window, a
// soft-cap or an FP8 cache (not at 256); the mma.sync kernel otherwise, and always on the portable
// path.
TEST(PrefillAttentionGpuTest, HopperKernelTakesTheCommonShapes) {
  LMSERVE_REQUIRE_GPU();
  PrefillAttentionParams p;
  p.num_seqs = 0;
  p.num_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.block_size = 16;
  p.num_blocks = 1024;
  p.scale = 0.088f;
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  {
    ScopedKernelPath portable(KernelPath::kPortable);
    EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kMmaSync);
  }
  ScopedKernelPath hopper(KernelPath::kAuto);
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (!UseHopperKernels() || major != 9 || minor != 0) {
    EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kMmaSync);
    GTEST_SKIP() << "not a compute capability 9.0 GPU on the Hopper path: the sm_90a kernel "
                    "never runs here";
  }
  EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kWgmmaSm90);
  // GQA packing: an item takes the 4 query heads of a KV head, tiles of 32 tokens; up to 8 heads,
  // the largest power of two that divides the group; none when switched off.
  EXPECT_EQ(PrefillSm90Pack(p), 4);
  EXPECT_EQ(PrefillSm90TileTokens(p), 32);
  for (auto [heads, pack] : {std::pair{8, 1}, {16, 2}, {48, 2}, {64, 8}, {128, 8}}) {
    p.num_heads = heads;
    EXPECT_EQ(PrefillSm90Pack(p), pack) << heads << " heads";
  }
  p.num_heads = 32;
  SetPrefillSm90Options({.pack_gqa = false});
  EXPECT_EQ(PrefillSm90Pack(p), 1);
  EXPECT_EQ(PrefillSm90TileTokens(p), 128);
  SetPrefillSm90Options({});
  p.head_dim = 64;
  EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kWgmmaSm90);
  for (int64_t block_size : {8, 32, 64, 128, 256}) {
    p.block_size = block_size;
    EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kWgmmaSm90) << block_size;
  }
  p.block_size = 24;
  EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kMmaSync);
  p.block_size = 16;
  for (int64_t head_dim : {80, 96}) {
    p.head_dim = head_dim;
    EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kWgmmaSm90) << head_dim;
  }
  p.head_dim = 256;  // key tiles of 64
  for (int64_t block_size : {8, 16, 64, 128, 256}) {
    p.block_size = block_size;
    EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kWgmmaSm90) << block_size;
  }
  p.block_size = 16;
  p.head_dim = 32;
  EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kMmaSync);
  p.head_dim = 128;
  p.window = 64;
  EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kWgmmaSm90);
  p.softcap = 30.0f;
  EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kWgmmaSm90);
  p.cache_fp8 = true;
  EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kWgmmaSm90);
  p.head_dim = 256;  // no room for the FP8 staging ring
  EXPECT_EQ(ChoosePrefillKernel(p), PrefillKernelKind::kMmaSync);
}

void RunHopperKernelShapes();

// The shapes the Hopper kernel takes, at the edges of its tiles: cache block sizes from 8 (16
// TMA boxes a key tile) to 256 (a box of 128 slots inside a block), queries starting at every
// offset against a cached prefix (chunked prefill: the diagonal crosses two key tiles), lengths
// one past a query or key tile, GQA 1/4/8, fp16, and NaN in every slot past a context (only the
// tile that reaches past the context's end may hold them; none may reach an output). On other
// GPUs (or the portable path) these run the mma.sync kernel.
// Every consumer loop of the Hopper kernel (SetPrefillSm90Loop) runs every case; ping-pong (the
// default, which the other prefill tests run too) in a test of its own. Each loop also runs with
// persistent blocks on 3 blocks (many items a block: the K/V ring, Q's reloads and the ping-pong
// turns carried from item to item), and ping-pong with each of PrefillSm90Options' other
// settings. (By default, batches of short queries take persistent blocks: persistent_short.)
TEST(PrefillAttentionGpuTest, HopperKernelShapes) {
  LMSERVE_REQUIRE_GPU();
  for (PrefillSm90Loop loop : {PrefillSm90Loop::kSerial, PrefillSm90Loop::kPipelined}) {
    SCOPED_TRACE(loop == PrefillSm90Loop::kSerial ? "serial consumer loop"
                                                  : "pipelined consumer loop");
    SetPrefillSm90Loop(loop);
    RunHopperKernelShapes();
    SCOPED_TRACE("persistent, on 3 blocks");
    SetPrefillSm90Options({.persistent = true, .max_blocks = 3});
    RunHopperKernelShapes();
    SetPrefillSm90Options({});
  }
  SetPrefillSm90Loop(PrefillSm90Loop::kPingpong);  // the default
}

TEST(PrefillAttentionGpuTest, HopperKernelShapesPingpong) {
  LMSERVE_REQUIRE_GPU();
  SetPrefillSm90Loop(PrefillSm90Loop::kPingpong);
  RunHopperKernelShapes();
  RunPrefillCase(DType::kBF16, 2, 4, 128, kMixedBatch);
  struct Variant {
    PrefillSm90Options options;
    const char* name;
  };
  for (const Variant& v :
       {Variant{{.persistent = true, .max_blocks = 3}, "persistent, on 3 blocks"},
        Variant{{.persistent = true}, "persistent"},
        Variant{{.persistent = true, .max_blocks = 3, .paired = false},
                "persistent, on 3 blocks, a box per column"},
        Variant{{.heads_first = false, .paired = false}, "tiles first, a box per column"},
        Variant{{.persistent_short = false}, "a block an item, short queries too"},
        Variant{{.pack_gqa = false}, "a head an item (no GQA packing)"},
        Variant{{.persistent = true, .max_blocks = 3, .pack_gqa = false},
                "persistent, on 3 blocks, no GQA packing"}}) {
    SCOPED_TRACE(v.name);
    SetPrefillSm90Options(v.options);
    RunHopperKernelShapes();
    RunPrefillCase(DType::kBF16, 2, 4, 128, kMixedBatch);
  }
  SetPrefillSm90Options({});
}

void RunHopperKernelShapes() {
  // Chunks of every offset against a cached prefix (the diagonal crosses two key tiles, and a
  // query tile's last key tile reaches past the context while its keys end before it: 280 of
  // 301), lengths one past a query or key tile.
  const std::vector<std::pair<int32_t, int32_t>> chunked = {
      {129, 129}, {128, 128}, {127, 300}, {256, 1000}, {1, 129}, {200, 455}, {64, 64},
      {65, 193}, {300, 301}, {2, 2}, {152, 301}, {139, 290}};
  for (int64_t head_dim : {64, 128}) {
    for (int64_t block_size : {8, 16, 32, 64, 128, 256}) {
      RunPrefillCase(DType::kBF16, 2, 4, head_dim, chunked, {}, {block_size, true});
    }
    for (int64_t group : {1, 8}) {
      RunPrefillCase(DType::kBF16, 1, group, head_dim, kMixedBatch, {}, {16, true});
    }
    RunPrefillCase(DType::kF16, 2, 4, head_dim, chunked, {}, {16, true});
    // GQA packing's other widths: 2 heads an item (groups of 2 and 6), 8 of a group of 16.
    RunPrefillCase(DType::kBF16, 2, 2, head_dim, chunked, {}, {16, true});
    RunPrefillCase(DType::kBF16, 1, 6, head_dim, kMixedBatch, {}, {32, true});
    RunPrefillCase(DType::kBF16, 1, 16, head_dim, chunked, {33, 0.0f, true}, {16, true});
  }
  // Head dims 80 and 96: the head-dim-128 kernel over boxes whose columns past the head dim read
  // as zeros.
  for (int64_t head_dim : {80, 96}) {
    for (int64_t block_size : {8, 16, 256}) {
      RunPrefillCase(DType::kBF16, 2, 4, head_dim, chunked, {}, {block_size, true});
    }
    RunPrefillCase(DType::kBF16, 1, 8, head_dim, kMixedBatch, {}, {16, true});
    RunPrefillCase(DType::kF16, 2, 4, head_dim, chunked, {}, {16, true});
  }
  // Head dim 256: key tiles of 64 (blocks of 128 and 256 hold two or four), GQA, fp16, a window
  // and a soft-cap (Gemma 2's); the serial loop whatever the loop chosen.
  for (int64_t block_size : {8, 16, 64, 256}) {
    RunPrefillCase(DType::kBF16, 2, 4, 256, chunked, {}, {block_size, true});
  }
  RunPrefillCase(DType::kBF16, 1, 8, 256, kMixedBatch, {}, {16, true});
  RunPrefillCase(DType::kF16, 2, 4, 256, chunked, {}, {16, true});
  RunPrefillCase(DType::kBF16, 2, 2, 256, chunked, {65, 50.0f, true}, {16, true});
  RunPrefillCase(DType::kBF16, 2, 2, 256, {{1024, 1024}, {700, 700}}, {}, {16, false});
  // Sliding windows (from one key to longer than a key tile, starting mid-tile at every offset
  // of the chunks, the blocks before every query's window freed) and soft-caps, alone and
  // together.
  for (int64_t head_dim : {64, 128}) {
    for (int32_t window : {1, 33, 128, 129, 200}) {
      RunPrefillCase(DType::kBF16, 2, 4, head_dim, chunked, {window, 0.0f, true}, {16, true});
    }
    RunPrefillCase(DType::kBF16, 2, 4, head_dim, chunked, {0, 30.0f, false}, {64, true});
    RunPrefillCase(DType::kF16, 2, 4, head_dim, chunked, {100, 5.0f, true}, {8, true});
  }
  RunPrefillCase(DType::kBF16, 2, 4, 96, chunked, {77, 50.0f, true}, {256, true});
  RunPrefillCase(DType::kBF16, 2, 4, 128, {{1024, 1024}, {1024, 1024}}, {300, 50.0f, true},
                 {16, false});
  // FP8 E4M3 caches (staged, then widened): the block sizes, NaN bytes past every context, GQA,
  // fp16, the padded head dims, scales other than 1, with a window and a soft-cap.
  for (int64_t head_dim : {64, 128}) {
    for (int64_t block_size : {8, 16, 128, 256}) {
      RunPrefillCase(DType::kBF16, 2, 4, head_dim, chunked, {}, {block_size, true},
                     {true, 0.5f, 2.0f});
    }
    RunPrefillCase(DType::kBF16, 1, 8, head_dim, kMixedBatch, {}, {16, true}, {true, 1.0f, 1.0f});
    RunPrefillCase(DType::kF16, 2, 4, head_dim, chunked, {}, {16, true}, {true, 16.0f, 2.0f});
  }
  for (int64_t head_dim : {80, 96}) {
    RunPrefillCase(DType::kBF16, 2, 4, head_dim, chunked, {}, {16, true}, {true, 1.0f, 1.0f});
  }
  RunPrefillCase(DType::kBF16, 2, 4, 128, chunked, {50, 30.0f, true}, {32, true},
                 {true, 1.0f, 1.0f});
  RunPrefillCase(DType::kBF16, 2, 4, 128, {{2048, 2048}}, {}, {16, false}, {true, 0.05f, 0.05f});
  // The benchmark's shapes, smaller: one long prompt, four equal ones.
  RunPrefillCase(DType::kBF16, 2, 4, 128, {{2048, 2048}}, {}, {16, false});
  RunPrefillCase(DType::kBF16, 2, 4, 64, {{1024, 1024}, {1024, 1024}, {1024, 1024}}, {},
                 {16, false});
}

// ---- PagedAttentionF32: the float32 mode's attention, decode and prefill in one kernel ----------

// Both sides compute in fp32 from the same fp32 inputs and differ only in the order of their sums
// and in the exponentials (the CPU normalizes the weights after a max pass, the GPU keeps an online
// softmax over four interleaved key streams and merges them; expf and std::exp differ by an ulp
// or two). Each side's output carries a relative rounding error that grows like sqrt(context) *
// 2^-24 from its long weighted sum of values. An emulation of the kernel's arithmetic on the CPU
// (same lane split, butterfly sums, fused multiply-adds, merge) against the CPU twin, over these
// normal(0, 1) inputs, gave relative L2 differences of 1.3e-7 to 1.6e-7 at 17 keys, 6e-7 to 7e-7 at
// 1000 and 1.2e-6 to 1.4e-6 at 4099, for head dims 64 to 256 (each side alone is about as far from
// a float64 answer). 1e-5 leaves a factor of 7 at the longest context and still fails for any
// real bug (a wrong key or a missed rescale: 1e-2 and more) or bf16-rounded data (about 3e-3).
constexpr double kF32AttentionTolerance = 1e-5;

void RunF32Case(int64_t num_kv_heads, int64_t group, int64_t head_dim,
                const std::vector<std::pair<int32_t, int32_t>>& seqs,
                const Masking& masking = {}) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "f32 kv heads " << num_kv_heads << " group " << group << " head_dim " << head_dim
               << " seqs " << seqs.size() << " " << masking << " seed " << seed);
  std::mt19937 rng(seed);
  PagedBatch b{DType::kF32, num_kv_heads * group, num_kv_heads, head_dim};
  BuildBatch(b, seqs, rng);
  ApplyMasking(b, masking);
  const std::vector<float> ref = CpuAttention(b);
  DeviceBuffer<float> d_out(ref.size());
  d_out.Poison();
  const PagedAttentionF32Params p = RaggedParams<PagedAttentionF32Params>(b, d_out.get());
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const double error = RelativeL2(d_out.Download(), ref);
  EXPECT_LE(error, kF32AttentionTolerance);
  std::printf("[ f32 attn ] head_dim %3lld group %2lld kv heads %lld, %zu seqs: relative L2 %.3g\n",
              static_cast<long long>(head_dim), static_cast<long long>(group),
              static_cast<long long>(num_kv_heads), seqs.size(), error);
}

// Prefills at awkward lengths, queries starting mid-sequence (prefix hits, chunked prefill) and
// decode tokens in one ragged batch; MHA, GQA and MQA groups; head dims the runner takes and two
// it never sees (the kernel takes any up to 256).
TEST(PagedAttentionF32GpuTest, MixedBatchEveryHeadDimAndGroup) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t head_dim : {32, 64, 80, 96, 128, 256, 72, 200}) {
    for (int64_t group : {1, 3, 8}) RunF32Case(2, group, head_dim, kMixedBatch);
  }
  RunF32Case(1, 9, 64, kMixedBatch);  // MQA: every head on one KV head
  RunF32Case(3, 3, 64, kMixedBatch);  // the demo model's 9 heads on 3 KV heads
  RunF32Case(8, 4, 128, {{4099, 4099}, {15, 15}, {1, 97}});  // a long prefill
}

// Decode steps: one token per sequence, contexts crossing pages (15, 16, 17) and long ones.
TEST(PagedAttentionF32GpuTest, DecodeBatches) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t batch : {1, 17, 64}) {
    std::vector<std::pair<int32_t, int32_t>> seqs;
    for (int64_t i = 0; i < batch; ++i) seqs.push_back({1, kLengths[(i + 5) % 6]});
    RunF32Case(2, 4, 128, seqs);
    RunF32Case(1, 16, 64, seqs);
  }
}

// Sliding windows and soft-caps in fp32, prefill and decode tokens in one batch, the blocks before
// every window freed.
TEST(PagedAttentionF32GpuTest, SlidingWindowAndSoftcap) {
  LMSERVE_REQUIRE_GPU();
  for (int32_t window : {1, 7, 16, 100, 4096}) {
    RunF32Case(2, 4, 128, kMixedBatch, {window, 0.0f, true});
  }
  for (int64_t head_dim : {32, 64, 80, 128, 256}) {
    RunF32Case(2, 3, head_dim, kMixedBatch, {0, 50.0f, false});
    RunF32Case(2, 3, head_dim, kMixedBatch, {19, 5.0f, true});
  }
  std::vector<std::pair<int32_t, int32_t>> decode;
  for (int64_t i = 0; i < 17; ++i) decode.push_back({1, kLengths[(i + 5) % 6]});
  RunF32Case(1, 16, 64, decode, {64, 30.0f, true});
}

// A decode graph's padding: sequences of context 0 with one query token get zeros, and the real
// sequences around them are unaffected.
TEST(PagedAttentionF32GpuTest, PaddingSequencesGetZeros) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  PagedBatch b{DType::kF32, 8, 2, 64};
  BuildBatch(b, {{1, 33}, {1, 16}, {5, 40}}, rng);
  const std::vector<float> ref = CpuAttention(b);
  // Three padding sequences after the real ones: one token each, context 0, an empty table.
  const int64_t row = b.num_heads * b.head_dim;
  std::vector<float> query = b.query;
  std::vector<float> extra = RandomFloats(3 * row, rng);
  query.insert(query.end(), extra.begin(), extra.end());
  std::vector<int32_t> query_start = b.query_start, context_lens = b.context_lens,
                       table_start = b.table_start;
  for (int i = 0; i < 3; ++i) {
    query_start.push_back(query_start.back() + 1);
    context_lens.push_back(0);
    table_start.push_back(table_start.back());
  }
  DeviceBuffer<float> d_query(query), d_out(query.size());
  DeviceBuffer<int32_t> d_query_start(query_start), d_context_lens(context_lens),
      d_table_start(table_start);
  d_out.Poison();
  PagedAttentionF32Params p = RaggedParams<PagedAttentionF32Params>(b, d_out.get());
  p.query = d_query.get();
  p.query_start = d_query_start.get();
  p.context_lens = d_context_lens.get();
  p.block_table_start = d_table_start.get();
  p.num_seqs += 3;
  p.num_tokens += 3;
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> out = d_out.Download();
  const std::vector<float> real(out.begin(), out.begin() + static_cast<int64_t>(ref.size()));
  EXPECT_LE(RelativeL2(real, ref), kF32AttentionTolerance);
  for (size_t i = ref.size(); i < out.size(); ++i) ASSERT_EQ(out[i], 0.0f) << "element " << i;
}

// One captured launch serves any lengths (the float32 mode's decode graphs).
TEST(PagedAttentionF32GpuTest, GraphReplayFollowsDeviceLengths) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  PagedBatch b{DType::kF32, 32, 8, 128};
  BuildReplayBatch(b, rng);
  DeviceBuffer<uint8_t> d_out =
      testing::Poisoned(b.num_tokens() * b.num_heads * b.head_dim, DType::kF32);
  const PagedAttentionF32Params p = RaggedParams<PagedAttentionF32Params>(b, d_out.get());
  CheckGraphReplayFollowsDeviceLengths(b, d_out, kF32AttentionTolerance,
                                       [&](cudaStream_t stream) { return Launch(p, stream); });
}

// Attention parameters of a valid shape (8/2 heads, d64, one block of 16) in `dtype`, no pointers.
template <typename Params>
Params ShapeOnly(DType dtype) {
  Params p;
  p.num_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.block_size = 16;
  p.num_blocks = 1;
  p.scale = 0.125f;
  p.dtype = dtype;
  return p;
}

// Each attention kernel names the one to use for a dtype it does not take.
TEST(PagedAttentionF32GpuTest, ValidateExplainsDtypes) {
  PagedAttentionF32Params f32 = ShapeOnly<PagedAttentionF32Params>(DType::kF32);
  EXPECT_TRUE(f32.Validate().ok()) << f32.Validate();
  f32.dtype = DType::kBF16;
  EXPECT_THAT(std::string(f32.Validate().message()), ::testing::HasSubstr("DecodeAttention"));
  EXPECT_EQ(Launch(f32, nullptr), cudaErrorInvalidValue);
  f32.dtype = DType::kF32;
  f32.head_dim = 320;
  EXPECT_THAT(std::string(f32.Validate().message()), ::testing::HasSubstr("head_dim 320"));

  EXPECT_THAT(std::string(ShapeOnly<DecodeAttentionParams>(DType::kF32).Validate().message()),
              ::testing::HasSubstr("PagedAttentionF32"));

  // A negative window or soft-cap is rejected by every attention kernel.
  auto decode = ShapeOnly<DecodeAttentionParams>(DType::kBF16);
  auto prefill = ShapeOnly<PrefillAttentionParams>(DType::kBF16);
  auto fp32 = ShapeOnly<PagedAttentionF32Params>(DType::kF32);
  decode.window = prefill.window = fp32.window = 4096;
  decode.softcap = prefill.softcap = fp32.softcap = 50.0f;
  EXPECT_TRUE(decode.Validate().ok()) << decode.Validate();
  EXPECT_TRUE(prefill.Validate().ok()) << prefill.Validate();
  EXPECT_TRUE(fp32.Validate().ok()) << fp32.Validate();
  decode.window = prefill.window = fp32.window = -1;
  EXPECT_THAT(std::string(decode.Validate().message()), ::testing::HasSubstr("window -1"));
  EXPECT_THAT(std::string(prefill.Validate().message()), ::testing::HasSubstr("window -1"));
  EXPECT_THAT(std::string(fp32.Validate().message()), ::testing::HasSubstr("window -1"));
  decode.window = prefill.window = fp32.window = 0;
  decode.softcap = prefill.softcap = fp32.softcap = -1.0f;
  EXPECT_THAT(std::string(decode.Validate().message()), ::testing::HasSubstr("softcap"));
  EXPECT_THAT(std::string(prefill.Validate().message()), ::testing::HasSubstr("softcap"));
  EXPECT_THAT(std::string(fp32.Validate().message()), ::testing::HasSubstr("softcap"));
  EXPECT_THAT(std::string(ShapeOnly<PrefillAttentionParams>(DType::kF32).Validate().message()),
              ::testing::HasSubstr("PagedAttentionF32"));
}

// Decode attention indexes the cache's slots (block id x block size + offset) in int32: a cache
// with more slots is refused, one with as many as int32 holds is not.
TEST(DecodeAttentionGpuTest, ValidateRefusesMoreSlotsThanInt32Indexes) {
  auto p = ShapeOnly<DecodeAttentionParams>(DType::kBF16);
  p.block_size = 16;
  p.num_blocks = int64_t{1} << 27;  // 2^31 slots
  EXPECT_THAT(std::string(p.Validate().message()), ::testing::HasSubstr("int32"));
  p.num_blocks = (int64_t{1} << 27) - 1;
  EXPECT_TRUE(p.Validate().ok()) << p.Validate();
}

}  // namespace
}  // namespace lmserve::kernels::cuda

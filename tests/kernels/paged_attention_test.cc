// Paged attention against a dense causal softmax in double over the same keys and values gathered
// contiguously; batches mix prefills, chunks and decodes, block tables are shuffled, unused cache
// blocks hold NaN (so any stray read shows), and the output buffer starts poisoned. Sliding windows
// and score soft-caps likewise; with a window, blocks that left it are freed (their table entries
// -1, their contents NaN) and a NaN block sits just before the cache, where block -1 would be.

#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::kernels {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct SeqSpec {
  int32_t context_len;
  int32_t query_len;
};

// A batch with its cache and the dense K/V of every sequence.
struct AttentionCase {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0, num_blocks = 0;
  int32_t window = 0;
  float softcap = 0;
  std::vector<SeqSpec> seqs;
  std::vector<float> query;                 // [num_tokens, num_heads, head_dim]
  std::vector<std::vector<float>> dense_k;  // per sequence [context, num_kv_heads, head_dim]
  std::vector<std::vector<float>> dense_v;
  std::vector<float> key_cache, value_cache;  // a NaN guard block, then the cache: NaN except
                                              // where written
  std::vector<int32_t> query_start, context_lens, block_table_start, block_table_ids;

  int64_t num_tokens() const { return query_start.back(); }
  int64_t guard() const { return block_size * num_kv_heads * head_dim; }
  const float* k_cache() const { return key_cache.data() + guard(); }
  const float* v_cache() const { return value_cache.data() + guard(); }

  PagedAttentionParams Params(float* output, std::vector<float>* workspace, int threads) const {
    const int64_t max_context = std::max_element(seqs.begin(), seqs.end(), [](auto a, auto b) {
                                  return a.context_len < b.context_len;
                                })->context_len;
    workspace->assign(static_cast<size_t>(PagedAttentionParams::WorkspaceFloats(
                          max_context, num_heads, num_kv_heads, threads)),
                      kNaN);
    return {.query = query.data(),
            .key_cache = k_cache(),
            .value_cache = v_cache(),
            .query_start = query_start.data(),
            .context_lens = context_lens.data(),
            .block_table_start = block_table_start.data(),
            .block_table_ids = block_table_ids.data(),
            .output = output,
            .workspace = workspace->data(),
            .num_seqs = static_cast<int64_t>(seqs.size()),
            .num_tokens = num_tokens(),
            .num_heads = num_heads,
            .num_kv_heads = num_kv_heads,
            .head_dim = head_dim,
            .block_size = block_size,
            .num_blocks = num_blocks,
            .max_context_len = max_context,
            .scale = static_cast<float>(1 / std::sqrt(head_dim)),
            .window = window,
            .softcap = softcap,
            .num_threads = threads};
  }
};

AttentionCase MakeCase(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                       int64_t block_size, std::vector<SeqSpec> seqs, uint32_t seed,
                       int32_t window = 0, float softcap = 0) {
  AttentionCase c;
  c.window = window;
  c.softcap = softcap;
  c.num_heads = num_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.block_size = block_size;
  c.seqs = std::move(seqs);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int64_t total_blocks = 0;
  for (const SeqSpec& s : c.seqs) total_blocks += (s.context_len + block_size - 1) / block_size;
  c.num_blocks = total_blocks + 3;  // a few never used
  std::vector<int32_t> ids(static_cast<size_t>(c.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t row = num_kv_heads * head_dim;
  c.key_cache.assign(static_cast<size_t>((c.num_blocks + 1) * block_size * row), kNaN);
  c.value_cache = c.key_cache;
  c.query_start = {0};
  c.block_table_start = {0};
  size_t next_block = 0;
  for (const SeqSpec& s : c.seqs) {
    std::vector<float> k(static_cast<size_t>(s.context_len * row)), v(k.size());
    for (float& x : k) x = 2.0f * normal(rng);  // spread scores: a peaked softmax
    for (float& x : v) x = normal(rng);
    const int64_t blocks = (s.context_len + block_size - 1) / block_size;
    for (int64_t b = 0; b < blocks; ++b) c.block_table_ids.push_back(ids[next_block++]);
    const int32_t* table = c.block_table_ids.data() + c.block_table_start.back();
    // Write through WriteKvCache, one token at a time from a strided source, to test it as well.
    for (int64_t pos = 0; pos < s.context_len; ++pos) {
      const int64_t slot = int64_t{table[pos / block_size]} * block_size + pos % block_size;
      WriteKvCacheParams w{.key = k.data() + pos * row,
                           .value = v.data() + pos * row,
                           .slot_mapping = &slot,
                           .key_cache = c.key_cache.data() + c.guard(),
                           .value_cache = c.value_cache.data() + c.guard(),
                           .num_tokens = 1,
                           .num_kv_heads = num_kv_heads,
                           .head_dim = head_dim,
                           .block_size = block_size,
                           .num_blocks = c.num_blocks};
      EXPECT_TRUE(w.Validate().ok()) << w.Validate();
      WriteKvCache(w);
    }
    c.block_table_start.push_back(static_cast<int32_t>(c.block_table_ids.size()));
    c.dense_k.push_back(std::move(k));
    c.dense_v.push_back(std::move(v));
    c.query_start.push_back(c.query_start.back() + s.query_len);
    c.context_lens.push_back(s.context_len);
  }
  c.query.resize(static_cast<size_t>(c.num_tokens() * num_heads * head_dim));
  for (float& x : c.query) x = normal(rng);
  return c;
}

// The first position a query at `position` sees.
int64_t FirstVisible(int64_t position, int32_t window) {
  return window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
}

// Frees the blocks that lie wholly before every query token's window, as the engine does: their
// table entries become -1 and their contents NaN (a block the pool gave to someone else).
void FreeBlocksBeforeWindow(AttentionCase* c) {
  const int64_t row = c->num_kv_heads * c->head_dim;
  int64_t freed = 0;
  for (size_t i = 0; i < c->seqs.size(); ++i) {
    const int64_t first = FirstVisible(c->seqs[i].context_len - c->seqs[i].query_len, c->window);
    for (int64_t b = 0; (b + 1) * c->block_size <= first; ++b) {
      int32_t& id = c->block_table_ids[c->block_table_start[i] + b];
      const auto begin = static_cast<size_t>(c->guard() + id * c->block_size * row);
      std::fill_n(c->key_cache.begin() + begin, c->block_size * row, kNaN);
      std::fill_n(c->value_cache.begin() + begin, c->block_size * row, kNaN);
      id = -1;
      ++freed;
    }
  }
  EXPECT_GT(freed, 0) << "the case frees no block";
}

// Dense causal attention in double, with the case's window and soft-cap.
std::vector<double> Reference(const AttentionCase& c) {
  const int64_t hd = c.head_dim, group = c.num_heads / c.num_kv_heads;
  const int64_t row = c.num_kv_heads * hd;
  std::vector<double> out(static_cast<size_t>(c.num_tokens() * c.num_heads * hd));
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    const SeqSpec& s = c.seqs[i];
    for (int64_t r = 0; r < s.query_len; ++r) {
      const int64_t token = c.query_start[i] + r;
      const int64_t position = s.context_len - s.query_len + r;
      const int64_t first = FirstVisible(position, c.window);
      for (int64_t h = 0; h < c.num_heads; ++h) {
        const int64_t g = h / group;
        const float* q = c.query.data() + (token * c.num_heads + h) * hd;
        std::vector<double> scores(static_cast<size_t>(position + 1 - first));
        double max_score = -INFINITY;
        for (int64_t j = first; j <= position; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += double{q[d]} * c.dense_k[i][j * row + g * hd + d];
          double score = dot / std::sqrt(double(hd));
          if (c.softcap > 0) score = c.softcap * std::tanh(score / c.softcap);
          scores[j - first] = score;
          max_score = std::max(max_score, score);
        }
        double sum = 0;
        for (double& s_j : scores) sum += (s_j = std::exp(s_j - max_score));
        double* o = out.data() + (token * c.num_heads + h) * hd;
        for (int64_t j = first; j <= position; ++j) {
          for (int64_t d = 0; d < hd; ++d)
            o[d] += scores[j - first] / sum * c.dense_v[i][j * row + g * hd + d];
        }
      }
    }
  }
  return out;
}

void CheckCase(const AttentionCase& c, int threads, const std::string& what) {
  std::vector<float> output(c.query.size(), kNaN), workspace;
  const PagedAttentionParams p = c.Params(output.data(), &workspace, threads);
  ASSERT_TRUE(p.Validate().ok()) << what << ": " << p.Validate();
  PagedAttention(p);
  const std::vector<double> expected = Reference(c);
  double max_error = 0;
  for (size_t i = 0; i < output.size(); ++i) {
    ASSERT_FALSE(std::isnan(output[i])) << what << ": element " << i;
    max_error = std::max(max_error, std::abs(output[i] - expected[i]));
  }
  EXPECT_LT(max_error, 2e-6) << what;
}

TEST(PagedAttentionTest, MatchesDenseCausalSoftmax) {
  // Full prefills, a decode, chunks ending mid-block, contexts of 1, 15, 16, 17 and 97.
  const std::vector<SeqSpec> batch = {{1, 1},   {15, 15}, {16, 1},  {17, 17},
                                      {97, 33}, {97, 1},  {16, 16}, {17, 2}};
  struct Heads {
    int64_t heads, kv_heads;
  };
  for (Heads h : {Heads{4, 4}, Heads{8, 2}, Heads{8, 1}}) {  // group sizes 1, 4, 8
    for (int64_t head_dim : {32, 64, 80, 128}) {
      for (int64_t block_size : {16, 5}) {
        const std::string what = "heads " + std::to_string(h.heads) + "/" +
                                 std::to_string(h.kv_heads) + " head_dim " +
                                 std::to_string(head_dim) + " block " + std::to_string(block_size);
        const AttentionCase c =
            MakeCase(h.heads, h.kv_heads, head_dim, block_size, batch,
                     static_cast<uint32_t>(head_dim * 31 + h.kv_heads + block_size));
        CheckCase(c, 1, what);
      }
    }
  }
}

TEST(PagedAttentionTest, ThreadsGiveIdenticalResults) {
  // Enough work to pass the threading threshold: a long prefill and several decodes.
  const AttentionCase c = MakeCase(8, 2, 64, 16, {{300, 300}, {97, 1}, {200, 1}, {33, 17}}, 42);
  std::vector<float> one(c.query.size(), kNaN), four(c.query.size(), kNaN), ws1, ws4;
  PagedAttention(c.Params(one.data(), &ws1, 1));
  PagedAttention(c.Params(four.data(), &ws4, 4));
  EXPECT_EQ(one, four);
  CheckCase(c, 3, "three threads");
}

std::string WindowWhat(int64_t head_dim, int64_t block_size, int32_t window, float softcap,
                       bool freed) {
  return "head_dim " + std::to_string(head_dim) + " block " + std::to_string(block_size) +
         " window " + std::to_string(window) + " softcap " + std::to_string(softcap) +
         (freed ? " (blocks before the window freed)" : "");
}

// Sliding windows smaller than a block, of a block, across blocks and longer than every context;
// prefills, chunks (several query tokens mid-sequence) and decodes; with the blocks that left every
// query's window freed or still there.
TEST(PagedAttentionTest, SlidingWindowMatchesDenseWindowedSoftmax) {
  const std::vector<SeqSpec> batch = {{1, 1},   {15, 15}, {16, 1},  {40, 40}, {97, 33},
                                      {97, 1},  {120, 7}, {17, 2},  {64, 1},  {200, 100}};
  for (int64_t block_size : {16, 5}) {
    for (int32_t window : {1, 3, 7, 16, 17, 40, 1000}) {
      for (bool freed : {false, true}) {
        if (freed && window >= 200) continue;  // nothing leaves a window that long
        const int64_t head_dim = 64;
        const std::string what = WindowWhat(head_dim, block_size, window, 0, freed);
        AttentionCase c = MakeCase(8, 2, head_dim, block_size, batch,
                                   static_cast<uint32_t>(window * 7 + block_size), window);
        if (freed) FreeBlocksBeforeWindow(&c);
        CheckCase(c, 1, what);
      }
    }
  }
}

// Gemma 2's attn_logit_softcapping, alone and with a window (Gemma 2's local layers); group sizes
// 1 and 4, a cap that bites (keys spread wide: scores beyond the cap) and one that barely does.
TEST(PagedAttentionTest, SoftcapMatchesDenseCappedSoftmax) {
  const std::vector<SeqSpec> batch = {{1, 1}, {17, 17}, {97, 33}, {97, 1}, {50, 3}};
  for (float softcap : {2.0f, 50.0f}) {
    for (int32_t window : {0, 4, 20}) {
      for (int64_t kv_heads : {4, 1}) {
        const int64_t head_dim = 32, block_size = 16;
        const std::string what = WindowWhat(head_dim, block_size, window, softcap, window > 0);
        AttentionCase c = MakeCase(4, kv_heads, head_dim, block_size, batch,
                                   static_cast<uint32_t>(window + kv_heads), window, softcap);
        if (window > 0) FreeBlocksBeforeWindow(&c);
        CheckCase(c, 1, what);
      }
    }
  }
}

TEST(PagedAttentionTest, WindowedThreadsGiveIdenticalResults) {
  AttentionCase c =
      MakeCase(8, 2, 64, 16, {{700, 300}, {97, 1}, {900, 1}, {333, 17}}, 43, /*window=*/100, 30.0f);
  FreeBlocksBeforeWindow(&c);
  std::vector<float> one(c.query.size(), kNaN), four(c.query.size(), kNaN), ws1, ws4;
  PagedAttention(c.Params(one.data(), &ws1, 1));
  PagedAttention(c.Params(four.data(), &ws4, 4));
  EXPECT_EQ(one, four);
  CheckCase(c, 3, "three threads, window 100");
}

// -1 is a block id only before every query token's window: inside it, or without a window, it is
// rejected, as is any other negative id.
TEST(PagedAttentionTest, ValidateAcceptsFreedBlocksOnlyBeforeTheWindow) {
  // Sequence 0: context 50, 10 query tokens at positions [40, 50), window 8: the first visible
  // key is 33, so blocks 0 and 1 (positions [0, 32)) may be -1, block 2 ([32, 48)) may not.
  AttentionCase c = MakeCase(4, 2, 32, 16, {{50, 10}, {5, 1}}, 9, /*window=*/8);
  std::vector<float> output(c.query.size()), workspace;
  c.block_table_ids[0] = -1;
  c.block_table_ids[1] = -1;
  EXPECT_TRUE(c.Params(output.data(), &workspace, 1).Validate().ok());
  {
    AttentionCase bad = c;
    bad.block_table_ids[2] = -1;
    EXPECT_THAT(bad.Params(output.data(), &workspace, 1).Validate().message(),
                HasSubstr("block id -1"));
  }
  {
    AttentionCase bad = c;
    bad.block_table_ids[1] = -2;
    EXPECT_THAT(bad.Params(output.data(), &workspace, 1).Validate().message(),
                HasSubstr("block id -2"));
  }
  {
    AttentionCase bad = c;
    bad.window = 0;
    EXPECT_THAT(bad.Params(output.data(), &workspace, 1).Validate().message(),
                HasSubstr("block id -1"));
  }
  {
    AttentionCase bad = c;
    bad.window = -1;
    EXPECT_THAT(bad.Params(output.data(), &workspace, 1).Validate().message(),
                HasSubstr("window -1"));
    bad.window = 8;
    bad.softcap = -1.0f;
    EXPECT_THAT(bad.Params(output.data(), &workspace, 1).Validate().message(),
                HasSubstr("softcap"));
  }
}

TEST(PagedAttentionTest, ValidateRejectsMalformedBatches) {
  AttentionCase c = MakeCase(4, 2, 32, 16, {{17, 17}, {5, 1}}, 7);
  std::vector<float> output(c.query.size()), workspace;
  {
    AttentionCase bad = c;
    bad.block_table_ids[0] = static_cast<int32_t>(bad.num_blocks);
    EXPECT_THAT(bad.Params(output.data(), &workspace, 1).Validate().message(),
                HasSubstr("block id"));
  }
  {
    AttentionCase bad = c;
    bad.context_lens[0] = 33;  // two blocks do not cover 33 tokens
    bad.seqs[0].context_len = 33;
    EXPECT_THAT(bad.Params(output.data(), &workspace, 1).Validate().message(),
                HasSubstr("do not cover"));
  }
  {
    AttentionCase bad = c;
    bad.context_lens[1] = 0;  // query longer than the context
    EXPECT_THAT(bad.Params(output.data(), &workspace, 1).Validate().message(),
                HasSubstr("query length"));
  }
  {
    PagedAttentionParams p = c.Params(output.data(), &workspace, 1);
    p.num_heads = 3;
    EXPECT_THAT(p.Validate().message(), HasSubstr("multiple of num_kv_heads"));
    p.num_heads = 4;
    p.head_dim = 33;
    EXPECT_THAT(p.Validate().message(), HasSubstr("head_dim 33"));
  }
}

TEST(WriteKvCacheTest, WritesOnlyTheGivenSlots) {
  const int64_t kv_heads = 2, head_dim = 32, block_size = 16, num_blocks = 4;
  const int64_t row = kv_heads * head_dim, stride = 3 * row;  // rows of a fused qkv buffer
  std::vector<float> qkv(static_cast<size_t>(3 * stride));
  std::iota(qkv.begin(), qkv.end(), 1.0f);
  std::vector<float> k_cache(static_cast<size_t>(num_blocks * block_size * row), -1.0f);
  std::vector<float> v_cache = k_cache;
  const std::vector<int64_t> slots = {63, 0, 17};
  WriteKvCacheParams p{.key = qkv.data() + row,
                       .value = qkv.data() + 2 * row,
                       .slot_mapping = slots.data(),
                       .key_cache = k_cache.data(),
                       .value_cache = v_cache.data(),
                       .num_tokens = 3,
                       .num_kv_heads = kv_heads,
                       .head_dim = head_dim,
                       .block_size = block_size,
                       .num_blocks = num_blocks,
                       .key_stride = stride,
                       .value_stride = stride};
  ASSERT_TRUE(p.Validate().ok());
  WriteKvCache(p);
  for (int64_t slot = 0; slot < num_blocks * block_size; ++slot) {
    const auto it = std::find(slots.begin(), slots.end(), slot);
    for (int64_t i = 0; i < row; ++i) {
      if (it == slots.end()) {
        ASSERT_EQ(k_cache[slot * row + i], -1.0f);
        ASSERT_EQ(v_cache[slot * row + i], -1.0f);
      } else {
        const int64_t t = it - slots.begin();
        ASSERT_EQ(k_cache[slot * row + i], qkv[t * stride + row + i]);
        ASSERT_EQ(v_cache[slot * row + i], qkv[t * stride + 2 * row + i]);
      }
    }
  }
  const std::vector<int64_t> bad = {64};
  p.slot_mapping = bad.data();
  p.num_tokens = 1;
  EXPECT_THAT(p.Validate().message(), HasSubstr("slot 64"));
}

}  // namespace
}  // namespace lmserve::kernels

#include "engine/core/block_manager.h"

#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

std::vector<int32_t> Table(const BlockManager& manager, BlockManager::SeqId seq) {
  const std::span<const int32_t> table = manager.BlockTable(seq);
  return {table.begin(), table.end()};
}

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> values(static_cast<size_t>(end - begin));
  std::iota(values.begin(), values.end(), begin);
  return values;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Tokens 0, 1, 2, ... offset by `base`: distinct content per base.
std::vector<int32_t> Tokens(int32_t count, int32_t base) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), base);
  return tokens;
}

// Allocates `tokens` for `seq` with its prefix-cache hits, then marks all of it computed.
// Returns the number of hit blocks.
int32_t AdmitAndCompute(BlockManager& manager, BlockManager::SeqId seq,
                        const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> hashes;
  manager.ExtendBlockHashes(tokens, &hashes);
  const int32_t max_blocks =
      (static_cast<int32_t>(tokens.size()) - 1) / manager.block_size_tokens();
  const std::vector<int32_t> hits = manager.FindCachedBlocks(hashes, max_blocks);
  EXPECT_TRUE(manager.Allocate(seq, static_cast<int64_t>(tokens.size()), hits).has_value());
  manager.CacheComputedBlocks(seq, hashes, static_cast<int64_t>(tokens.size()));
  manager.CheckInvariants();
  return static_cast<int32_t>(hits.size());
}

TEST(BlockManagerTest, FreshPoolHandsOutBlocksInIdOrderAndTablesAreAppendOnly) {
  BlockManager manager(/*num_blocks=*/8, /*block_size_tokens=*/4, /*enable_prefix_caching=*/true);
  EXPECT_EQ(manager.num_free_blocks(), 8);
  ASSERT_EQ(manager.Allocate(/*seq=*/1, 9), 3);  // 9 tokens: 3 blocks
  ASSERT_EQ(manager.Allocate(/*seq=*/2, 4), 1);
  EXPECT_THAT(Table(manager, 1), ElementsAre(0, 1, 2));
  EXPECT_THAT(Table(manager, 2), ElementsAre(3));
  ASSERT_EQ(manager.Allocate(1, 12), 0);  // still 3 blocks
  ASSERT_EQ(manager.Allocate(1, 13), 1);  // a 4th, appended
  EXPECT_THAT(Table(manager, 1), ElementsAre(0, 1, 2, 4));
  EXPECT_EQ(manager.num_free_blocks(), 3);
  EXPECT_DOUBLE_EQ(manager.usage(), 5.0 / 8.0);
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(5, 6, 7));
  manager.CheckInvariants();
}

TEST(BlockManagerTest, AllocateReturnsNulloptAndChangesNothingWhenBlocksDoNotFit) {
  BlockManager manager(4, 4, true);
  ASSERT_EQ(manager.Allocate(1, 8), 2);
  EXPECT_EQ(manager.Allocate(2, 12), std::nullopt);  // needs 3, 2 free
  EXPECT_THAT(Table(manager, 2), IsEmpty());
  EXPECT_EQ(manager.num_free_blocks(), 2);
  EXPECT_EQ(manager.Allocate(1, 17), std::nullopt);  // needs 3 more, 2 free: never partial
  EXPECT_THAT(Table(manager, 1), ElementsAre(0, 1));
  EXPECT_EQ(manager.Allocate(1, 16), 2);
  EXPECT_THAT(Table(manager, 1), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(manager.num_free_blocks(), 0);
  manager.CheckInvariants();
}

TEST(BlockManagerTest, UncachedBlocksAreReusedFirstLastBlockOfASequenceFirst) {
  BlockManager manager(8, 4, /*enable_prefix_caching=*/false);
  ASSERT_EQ(manager.Allocate(1, 12), 3);  // 0 1 2
  ASSERT_EQ(manager.Allocate(2, 4), 1);   // 3
  manager.Free(1);
  // Released last to first, each to the front: the sequence's first block ends up first.
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(0, 1, 2, 4, 5, 6, 7));
  ASSERT_EQ(manager.Allocate(3, 8), 2);
  EXPECT_THAT(Table(manager, 3), ElementsAre(0, 1));
  EXPECT_EQ(manager.num_evictions(), 0);
  manager.CheckInvariants();
}

TEST(BlockManagerTest, PrefixHitsMissesAndChainedHashes) {
  BlockManager manager(16, 4, true);
  const std::vector<int32_t> a = Tokens(14, 100);  // 3 full blocks + 2 tokens
  EXPECT_EQ(AdmitAndCompute(manager, /*seq=*/1, a), 0);
  EXPECT_THAT(Table(manager, 1), ElementsAre(0, 1, 2, 3));
  // Full blocks 0 1 2 are cached; the partial block 3 is not.
  EXPECT_TRUE(manager.IsCached(0) && manager.IsCached(1) && manager.IsCached(2));
  EXPECT_FALSE(manager.IsCached(3));

  // Same first 8 tokens, different third block: hits 2 blocks, misses the third.
  std::vector<int32_t> b = Tokens(8, 100);
  b.insert(b.end(), {7, 7, 7, 7, 7});
  EXPECT_EQ(AdmitAndCompute(manager, 2, b), 2);
  EXPECT_THAT(Table(manager, 2), ElementsAre(0, 1, 4, 5));
  EXPECT_EQ(manager.RefCount(0), 2);
  EXPECT_EQ(manager.RefCount(1), 2);
  EXPECT_EQ(manager.RefCount(4), 1);

  // Chained: the third block of `a` under a different first block is a different hash.
  std::vector<int32_t> c = a;
  c[0] = 999;
  std::vector<uint64_t> hashes_a, hashes_c;
  manager.ExtendBlockHashes(a, &hashes_a);
  manager.ExtendBlockHashes(c, &hashes_c);
  ASSERT_EQ(hashes_a.size(), 3u);
  EXPECT_NE(hashes_a[2], hashes_c[2]);
  EXPECT_THAT(manager.FindCachedBlocks(hashes_c, 3), IsEmpty());
  EXPECT_THAT(manager.FindCachedBlocks(hashes_a, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(manager.FindCachedBlocks(hashes_a, 2), ElementsAre(0, 1));  // capped

  // Extending hashes incrementally gives the same chain.
  std::vector<uint64_t> incremental;
  manager.ExtendBlockHashes(std::span<const int32_t>(a).first(5), &incremental);
  ASSERT_EQ(incremental.size(), 1u);
  manager.ExtendBlockHashes(a, &incremental);
  EXPECT_EQ(incremental, hashes_a);
}

TEST(BlockManagerTest, FreedCachedBlocksAreEvictedLeastRecentlyReleasedFirstTailFirst) {
  BlockManager manager(6, 2, true);
  const std::vector<int32_t> a = Tokens(4, 10);  // 2 full blocks
  const std::vector<int32_t> b = Tokens(4, 20);
  ASSERT_EQ(AdmitAndCompute(manager, 1, a), 0);     // 0 1
  ASSERT_EQ(AdmitAndCompute(manager, 2, b), 0);     // 2 3
  ASSERT_TRUE(manager.Allocate(3, 2).has_value());  // 4: uncached, still held
  manager.Free(1);
  manager.Free(2);
  manager.Free(3);
  // Uncached first (4, then the never-used 5 after it), then a's chain tail-first, then b's.
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(4, 5, 1, 0, 3, 2));
  manager.CheckInvariants();

  // A hit takes a block out of the middle of the list; it goes back to the end when released.
  ASSERT_EQ(AdmitAndCompute(manager, 4, Concat(Tokens(2, 10), {0})), 1);  // a's first block, 0
  EXPECT_THAT(Table(manager, 4), ElementsAre(0, 4));
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(5, 1, 3, 2));
  manager.Free(4);
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(4, 5, 1, 3, 2, 0));

  // New content takes 4, 5, then evicts 1 (a's tail), then 3 (b's tail).
  EXPECT_EQ(manager.num_evictions(), 0);
  ASSERT_EQ(manager.Allocate(5, 8), 4);
  EXPECT_THAT(Table(manager, 5), ElementsAre(4, 5, 1, 3));
  EXPECT_EQ(manager.num_evictions(), 2);
  EXPECT_FALSE(manager.IsCached(1));
  EXPECT_FALSE(manager.IsCached(3));
  std::vector<uint64_t> hashes_a, hashes_b;
  manager.ExtendBlockHashes(a, &hashes_a);
  manager.ExtendBlockHashes(b, &hashes_b);
  EXPECT_THAT(manager.FindCachedBlocks(hashes_a, 2), ElementsAre(0));  // the head survives
  EXPECT_THAT(manager.FindCachedBlocks(hashes_b, 2), ElementsAre(2));
  manager.CheckInvariants();
}

TEST(BlockManagerTest, DuplicateContentIsCachedOnceTheDuplicateBlockIsPlainlyFreed) {
  BlockManager manager(6, 2, true);
  const std::vector<int32_t> tokens = Tokens(4, 10);
  std::vector<uint64_t> hashes;
  manager.ExtendBlockHashes(tokens, &hashes);
  // Two sequences compute the same content side by side (neither could hit the other).
  ASSERT_EQ(manager.Allocate(1, 4), 2);  // 0 1
  ASSERT_EQ(manager.Allocate(2, 4), 2);  // 2 3
  manager.CacheComputedBlocks(1, hashes, 4);
  manager.CacheComputedBlocks(2, hashes, 4);
  EXPECT_TRUE(manager.IsCached(0) && manager.IsCached(1));
  EXPECT_FALSE(manager.IsCached(2) || manager.IsCached(3));
  manager.Free(2);
  manager.Free(1);
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(2, 3, 4, 5, 1, 0));
  manager.CheckInvariants();
}

TEST(BlockManagerTest, SharedPrefixBlocksAreReferenceCounted) {
  BlockManager manager(8, 4, /*enable_prefix_caching=*/false);
  ASSERT_EQ(manager.Allocate(1, 10), 3);  // sample 0 of a 10-token prompt: 0 1 2
  // Samples 1 and 2 share the two full prompt blocks and get their own partial block.
  const std::vector<int32_t> shared = {0, 1};
  ASSERT_EQ(manager.Allocate(2, 10, shared), 1);
  ASSERT_EQ(manager.Allocate(3, 10, shared), 1);
  EXPECT_THAT(Table(manager, 2), ElementsAre(0, 1, 3));
  EXPECT_THAT(Table(manager, 3), ElementsAre(0, 1, 4));
  EXPECT_EQ(manager.RefCount(0), 3);
  EXPECT_EQ(manager.RefCount(2), 1);
  EXPECT_EQ(manager.num_free_blocks(), 3);
  manager.Free(1);
  EXPECT_EQ(manager.RefCount(0), 2);
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(2, 5, 6, 7));
  manager.Free(2);
  manager.Free(3);
  EXPECT_EQ(manager.num_free_blocks(), 8);
  EXPECT_EQ(manager.num_sequences(), 0);
  manager.CheckInvariants();
}

TEST(BlockManagerTest, PrefixBlocksThatAreFreeCountAgainstTheFreePool) {
  BlockManager manager(3, 2, true);
  const std::vector<int32_t> a = Tokens(4, 10);
  ASSERT_EQ(AdmitAndCompute(manager, 1, a), 0);  // 0 1 cached
  manager.Free(1);
  ASSERT_TRUE(manager.Allocate(2, 2).has_value());  // takes 2 (uncached, front)
  std::vector<uint64_t> hashes;
  manager.ExtendBlockHashes(a, &hashes);
  const std::vector<int32_t> hits = manager.FindCachedBlocks(hashes, 2);
  ASSERT_THAT(hits, ElementsAre(0, 1));
  // Reusing both free cached blocks plus one new one needs 3 free blocks; there are 2.
  EXPECT_EQ(manager.Allocate(3, 6, hits), std::nullopt);
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(1, 0));
  EXPECT_EQ(manager.Allocate(3, 4, hits), 0);
  EXPECT_THAT(Table(manager, 3), ElementsAre(0, 1));
  EXPECT_EQ(manager.num_free_blocks(), 0);
  manager.CheckInvariants();
}

TEST(BlockManagerTest, NothingIsCachedWhenPrefixCachingIsOff) {
  BlockManager manager(8, 4, false);
  const std::vector<int32_t> a = Tokens(12, 10);
  EXPECT_EQ(AdmitAndCompute(manager, 1, a), 0);
  manager.Free(1);
  EXPECT_EQ(AdmitAndCompute(manager, 2, a), 0);
  for (int32_t block = 0; block < 8; ++block) EXPECT_FALSE(manager.IsCached(block));
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAreArray(Range(3, 8)));
}

}  // namespace
}  // namespace lmserve::engine

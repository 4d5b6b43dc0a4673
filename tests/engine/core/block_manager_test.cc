#include "engine/core/block_manager.h"

#include <limits>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

std::vector<int32_t> Table(const BlockManager& manager, BlockManager::SeqId seq,
                           int32_t group = 0) {
  const std::span<const int32_t> table = manager.BlockTable(seq, group);
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

// Group 0's blocks of the cached prefix of `hashes` (at most max_blocks).
std::vector<int32_t> CachedBlocks(const BlockManager& manager, const std::vector<uint64_t>& hashes,
                                  int32_t max_blocks) {
  const ComputedPrefix prefix = manager.FindCachedPrefix(hashes, max_blocks);
  return prefix.num_blocks == 0 ? std::vector<int32_t>() : prefix.blocks[0];
}

// A prefix of one full-attention group.
ComputedPrefix OneGroupPrefix(const std::vector<int32_t>& blocks) {
  return {.num_blocks = static_cast<int32_t>(blocks.size()), .blocks = {blocks}};
}

// Allocates `tokens` for `seq` with its prefix-cache hits, then marks all of it computed.
// Returns the number of hit blocks.
int32_t AdmitAndCompute(BlockManager& manager, BlockManager::SeqId seq,
                        const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> hashes;
  manager.ExtendBlockHashes(tokens, &hashes);
  const int32_t max_blocks =
      (static_cast<int32_t>(tokens.size()) - 1) / manager.block_size_tokens();
  const ComputedPrefix hits = manager.FindCachedPrefix(hashes, max_blocks);
  EXPECT_TRUE(manager
                  .Allocate(seq, static_cast<int64_t>(tokens.size()), hits,
                            int64_t{hits.num_blocks} * manager.block_size_tokens())
                  .has_value());
  manager.CacheComputedBlocks(seq, hashes, static_cast<int64_t>(tokens.size()));
  manager.CheckInvariants();
  return hits.num_blocks;
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
  EXPECT_THAT(CachedBlocks(manager, hashes_c, 3), IsEmpty());
  EXPECT_THAT(CachedBlocks(manager, hashes_a, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(CachedBlocks(manager, hashes_a, 2), ElementsAre(0, 1));  // capped

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
  EXPECT_THAT(CachedBlocks(manager, hashes_a, 2), ElementsAre(0));  // the head survives
  EXPECT_THAT(CachedBlocks(manager, hashes_b, 2), ElementsAre(2));
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
  ASSERT_EQ(manager.Allocate(2, 10, OneGroupPrefix(shared), 8), 1);
  ASSERT_EQ(manager.Allocate(3, 10, OneGroupPrefix(shared), 8), 1);
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
  const std::vector<int32_t> hits = CachedBlocks(manager, hashes, 2);
  ASSERT_THAT(hits, ElementsAre(0, 1));
  // Reusing both free cached blocks plus one new one needs 3 free blocks; there are 2.
  EXPECT_EQ(manager.Allocate(3, 6, OneGroupPrefix(hits), 4), std::nullopt);
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(1, 0));
  EXPECT_EQ(manager.Allocate(3, 4, OneGroupPrefix(hits), 4), 0);
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

// Windowed KV cache groups (block_manager.h, "Windows").

constexpr int32_t kNo = BlockManager::kNoBlock;

TEST(BlockManagerWindowTest, BlocksThatLeftTheWindowAreDroppedAndReused) {
  // Window 8, blocks of 4: the query at position c reads (c - 8, c].
  BlockManager manager(8, 4, /*enable_prefix_caching=*/false, /*group_windows=*/{8});
  ASSERT_EQ(manager.Allocate(1, 12, {}, 0), 3);  // a 12-token prompt: 0 1 2
  EXPECT_THAT(Table(manager, 1), ElementsAre(0, 1, 2));
  // The next query is at 12; it reads from 5: block 0 (positions 0-3) is dropped, to the free
  // list's front, and taken again for positions 12-15.
  ASSERT_EQ(manager.Allocate(1, 13, {}, 12), 1);
  EXPECT_THAT(Table(manager, 1), ElementsAre(kNo, 1, 2, 0));
  EXPECT_EQ(manager.num_used_blocks(0), 3);
  ASSERT_EQ(manager.Allocate(1, 15, {}, 14), 0);  // the query at 14 reads from 7: block 1 stays
  EXPECT_THAT(Table(manager, 1), ElementsAre(kNo, 1, 2, 0));
  ASSERT_EQ(manager.Allocate(1, 16, {}, 15), 0);  // the query at 15 reads from 8: block 1 goes
  EXPECT_THAT(Table(manager, 1), ElementsAre(kNo, kNo, 2, 0));
  ASSERT_EQ(manager.Allocate(1, 17, {}, 16), 1);  // and is taken for positions 16-19
  EXPECT_THAT(Table(manager, 1), ElementsAre(kNo, kNo, 2, 0, 1));
  manager.CheckInvariants();
  // Decoding on: never more than ceil((8 - 1 + 1) / 4) + 1 = 3 blocks, whatever the context.
  for (int32_t computed = 17; computed < 400; ++computed) {
    ASSERT_TRUE(manager.Allocate(1, computed + 1, {}, computed).has_value());
    ASSERT_LE(manager.num_used_blocks(0), 3) << computed;
    const std::vector<int32_t> table = Table(manager, 1);
    ASSERT_EQ(table.size(), static_cast<size_t>(computed / 4 + 1));
    // The entries before the first key read, (computed - 7) / 4, are dropped; the rest held.
    for (size_t j = 0; j < table.size(); ++j) {
      ASSERT_EQ(table[j] == kNo, static_cast<int32_t>(j) < (computed - 7) / 4) << computed;
    }
  }
  EXPECT_EQ(manager.num_free_blocks(), 8 - manager.num_used_blocks(0));
  manager.CheckInvariants();
  manager.Free(1);
  EXPECT_EQ(manager.num_free_blocks(), 8);
  EXPECT_EQ(manager.num_used_blocks(0), 0);
  manager.CheckInvariants();
}

TEST(BlockManagerWindowTest, DroppedBlocksCountAsFreeAndAFailedAllocationDropsNothing) {
  BlockManager manager(3, 4, false, {8});
  ASSERT_EQ(manager.Allocate(1, 12, {}, 0), 3);
  EXPECT_EQ(manager.num_free_blocks(), 0);
  // 8 more tokens from position 12 need 2 new blocks; the drop frees only block 0.
  EXPECT_EQ(manager.Allocate(1, 20, {}, 12), std::nullopt);
  EXPECT_THAT(Table(manager, 1), ElementsAre(0, 1, 2));
  // One more token needs one: the dropped block 0 itself.
  EXPECT_EQ(manager.Allocate(1, 13, {}, 12), 1);
  EXPECT_THAT(Table(manager, 1), ElementsAre(kNo, 1, 2, 0));
  manager.CheckInvariants();
}

TEST(BlockManagerWindowTest, AWindowedAndAFullGroupShareOnePool) {
  // Group 0 has window 8, group 1 full attention: each has its own table, from one pool.
  BlockManager manager(16, 4, false, {8, 0});
  ASSERT_EQ(manager.Allocate(1, 12, {}, 0), 6);
  EXPECT_THAT(Table(manager, 1, 0), ElementsAre(0, 1, 2));
  EXPECT_THAT(Table(manager, 1, 1), ElementsAre(3, 4, 5));
  ASSERT_EQ(manager.Allocate(2, 4, {}, 0), 2);
  EXPECT_THAT(Table(manager, 2, 0), ElementsAre(6));
  EXPECT_THAT(Table(manager, 2, 1), ElementsAre(7));
  // Seq 1 decodes on to 24 tokens: its windowed group drops each block as the window leaves it
  // and takes it again for new positions (0 at 12, 1 at 16, 2 at 20; 0 is dropped again at 23);
  // the full group keeps all six and takes 8, 9, 10.
  for (int32_t computed = 12; computed < 24; ++computed) {
    ASSERT_TRUE(manager.Allocate(1, computed + 1, {}, computed).has_value());
  }
  EXPECT_THAT(Table(manager, 1, 0), ElementsAre(kNo, kNo, kNo, kNo, 1, 2));
  EXPECT_THAT(Table(manager, 1, 1), ElementsAre(3, 4, 5, 8, 9, 10));
  EXPECT_EQ(manager.num_used_blocks(0), 3);  // 1 2, and seq 2's 6
  EXPECT_EQ(manager.num_used_blocks(1), 7);  // 3 4 5 8 9 10, and seq 2's 7
  EXPECT_EQ(manager.num_free_blocks(), 16 - 10);
  manager.CheckInvariants();
  manager.Free(1);
  EXPECT_EQ(manager.num_used_blocks(0), 1);
  EXPECT_EQ(manager.num_used_blocks(1), 1);
  manager.CheckInvariants();
}

TEST(BlockManagerWindowTest, MaxTokensPerSequenceCountsEveryGroup) {
  // One full group: the whole pool.
  EXPECT_EQ(MaxTokensPerSequence(10, 4, std::vector<int32_t>{0}, 8), 40);
  // A windowed group holds at most ceil((8 - 1 + 4) / 4) + 1 = 4 blocks: unbounded with 4 blocks.
  EXPECT_EQ(MaxTokensPerSequence(4, 4, std::vector<int32_t>{8}, 4),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(MaxTokensPerSequence(3, 4, std::vector<int32_t>{8}, 4), 12);
  // Mixed: k full blocks + min(k, 4) windowed ones <= 20: k = 16.
  EXPECT_EQ(MaxTokensPerSequence(20, 4, std::vector<int32_t>{8, 0}, 4), 64);
}

// Computes `tokens` for `seq` one token a step after a chunk of `prompt_len`, caching full blocks
// as the engine does (OnStepComputed after each step).
void ComputeStepByStep(BlockManager& manager, BlockManager::SeqId seq,
                       const std::vector<int32_t>& tokens, int32_t prompt_len) {
  std::vector<uint64_t> hashes;
  manager.ExtendBlockHashes(tokens, &hashes);
  ASSERT_TRUE(manager.Allocate(seq, prompt_len, {}, 0).has_value());
  manager.CacheComputedBlocks(seq, hashes, prompt_len);
  for (int32_t computed = prompt_len; computed < static_cast<int32_t>(tokens.size()); ++computed) {
    ASSERT_TRUE(manager.Allocate(seq, computed + 1, {}, computed).has_value());
    manager.CacheComputedBlocks(seq, hashes, computed + 1);
  }
  manager.CheckInvariants();
}

TEST(BlockManagerWindowTest, AWindowedPrefixHitNeedsOnlyTheBlocksItsFirstQueryReads) {
  BlockManager manager(8, 4, /*enable_prefix_caching=*/true, {8});
  const std::vector<int32_t> a = Tokens(20, 100);
  ComputeStepByStep(manager, 1, a, 4);
  // Blocks 0 1 2 were dropped (cached) as the window slid; 3 4 are held.
  EXPECT_THAT(Table(manager, 1), ElementsAre(kNo, kNo, kNo, 3, 4));
  manager.Free(1);
  // Dropped oldest first, then the rest first-to-last: heads are evicted first.
  EXPECT_THAT(manager.FreeBlocksInEvictionOrder(), ElementsAre(5, 6, 7, 0, 1, 2, 3, 4));

  // The same 20 tokens and one more: 5 blocks computed; the query at 20 reads from 13, blocks 3
  // and 4, which are cached: a 5-block hit holding only them.
  std::vector<int32_t> b = Concat(a, {7});
  std::vector<uint64_t> hashes;
  manager.ExtendBlockHashes(b, &hashes);
  const ComputedPrefix hit = manager.FindCachedPrefix(hashes, 5);
  EXPECT_EQ(hit.num_blocks, 5);
  EXPECT_THAT(hit.blocks[0], ElementsAre(kNo, kNo, kNo, 3, 4));
  ASSERT_EQ(manager.Allocate(2, 21, hit, 20), 1);
  EXPECT_THAT(Table(manager, 2), ElementsAre(kNo, kNo, kNo, 3, 4, 5));
  EXPECT_EQ(manager.RefCount(3), 1);
  EXPECT_TRUE(manager.IsCached(0));  // blocks 0 1 2 stay cached, unreferenced
  manager.CheckInvariants();
  manager.Free(2);

  // Evict block 3 (new content takes 5 6 7, then 0 1 2 3): the longest prefix whose query reads
  // only cached blocks is then... none: block 4 alone is not a window's worth.
  ASSERT_EQ(manager.Allocate(3, 28, {}, 0), 7);
  EXPECT_THAT(Table(manager, 3), ElementsAre(5, 6, 7, 0, 1, 2, 3));
  EXPECT_EQ(manager.FindCachedPrefix(hashes, 5).num_blocks, 0);
  manager.Free(3);
  manager.CheckInvariants();
}

TEST(BlockManagerWindowTest, AMixedPrefixHitIsBoundedByEveryGroup) {
  BlockManager manager(32, 4, true, {8, 0});
  const std::vector<int32_t> a = Tokens(20, 100);
  ComputeStepByStep(manager, 1, a, 4);
  std::vector<uint64_t> hashes;
  manager.ExtendBlockHashes(Concat(a, {7}), &hashes);
  // Both groups hold or cache all 5 blocks: the windowed group's share is its last two.
  ComputedPrefix hit = manager.FindCachedPrefix(hashes, 5);
  ASSERT_EQ(hit.num_blocks, 5);
  EXPECT_THAT(hit.blocks[0],
              ElementsAre(kNo, kNo, kNo, Table(manager, 1, 0)[3], Table(manager, 1, 0)[4]));
  EXPECT_EQ(hit.blocks[1], Table(manager, 1, 1));
  // Capped by max_blocks, the windowed group's share moves with the prefix's end.
  hit = manager.FindCachedPrefix(hashes, 3);
  ASSERT_EQ(hit.num_blocks, 3);
  EXPECT_EQ(hit.blocks[0][0], kNo);
  EXPECT_NE(hit.blocks[0][1], kNo);  // the query at 12 reads from 5: blocks 1 and 2
  EXPECT_NE(hit.blocks[0][2], kNo);
  ASSERT_TRUE(manager.Allocate(2, 13, hit, 12).has_value());
  manager.CheckInvariants();
}

TEST(BlockManagerWindowTest, ASharedPrefixIsEmptyOnceTheSourceSlidPastIt) {
  BlockManager manager(16, 4, false, {8});
  const std::vector<int32_t> prompt = Tokens(12, 100);
  ASSERT_EQ(manager.Allocate(1, 12, {}, 0), 3);
  // Sample 1 shares the 3 prompt blocks: the query at 12 reads blocks 1 and 2.
  ComputedPrefix shared = manager.SharedPrefix(1, 3);
  ASSERT_EQ(shared.num_blocks, 3);
  EXPECT_THAT(shared.blocks[0], ElementsAre(kNo, 1, 2));
  // Once sample 0 has gone on to position 20, block 1 is gone: nothing to share.
  for (int32_t computed = 12; computed < 20; ++computed) {
    ASSERT_TRUE(manager.Allocate(1, computed + 1, {}, computed).has_value());
  }
  EXPECT_EQ(manager.SharedPrefix(1, 3).num_blocks, 0);
  // A shorter shared prefix needs blocks that are gone too.
  EXPECT_EQ(manager.SharedPrefix(1, 2).num_blocks, 0);
  manager.CheckInvariants();
}

}  // namespace
}  // namespace lmserve::engine

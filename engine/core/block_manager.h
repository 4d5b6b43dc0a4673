// The block manager: the KV cache's fixed pool of block ids, and who holds which.
//
// Theory. The runner owns `num_blocks` KV blocks of `block_size_tokens` slots each; a block is only
// an integer id here. Each sequence owns an append-only block table: its block j holds positions
// [j*B, (j+1)*B). Blocks are shared by reference count: a full block is immutable once its tokens
// are computed, so two sequences whose first k*B tokens are equal can point at the same k blocks
// (prefix caching across requests, and the n samples of one prompt).
//
// Prefix cache. A full block is named by a hash chained from its parent's: hash(j) =
// H(hash(j-1), tokens of block j), so equal hashes mean equal whole prefixes (up to a 64-bit hash
// collision, which is not guarded against). Once a sequence has computed a full block, the block is
// entered in the cache under its hash. At admission, a sequence looks its block hashes up in order
// and takes references on the leading blocks found. A block stays cached after its last reference
// is dropped, until it is reused for something else (evicted).
//
// Free list = eviction order. Blocks with no references sit in one doubly linked list: blocks that
// hold no cached content first (they are worth nothing), then cached blocks, least recently
// released first. A sequence releases its blocks last-to-first, so a chain's tail is evicted before
// its head (a tail is useless without its head). Allocation takes blocks from the front, evicting
// any cached content they hold; a cache hit on a free block takes it out of the middle of the list.
//
// Invariants (CheckInvariants() verifies all of them):
//  - every block is either referenced (ref_count > 0, not in the free list) or free
//    (ref_count == 0, in the free list exactly once);
//  - a block's ref_count is the number of block tables that hold it;
//  - block b has hash h if and only if the cache maps h to b;
//  - in the free list, every uncached block precedes every cached block.
//
// "Does not fit" is not an error: Allocate returns nullopt and changes nothing; the scheduler then
// preempts someone. Thread safety: none; the engine thread owns the block manager.

#ifndef LMSERVE_ENGINE_CORE_BLOCK_MANAGER_H_
#define LMSERVE_ENGINE_CORE_BLOCK_MANAGER_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace lmserve::engine {

class BlockManager {
 public:
  using SeqId = int64_t;

  // REQUIRES: num_blocks > 0, block_size_tokens > 0.
  BlockManager(int32_t num_blocks, int32_t block_size_tokens, bool enable_prefix_caching);

  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size_tokens() const { return block_size_tokens_; }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }
  // Blocks with no reference (cached or not): what Allocate can hand out.
  int32_t num_free_blocks() const { return num_free_blocks_; }
  // The fraction of blocks referenced by some sequence, in [0, 1].
  double usage() const;
  // Blocks needed to hold `num_tokens` positions.
  int32_t BlocksForTokens(int64_t num_tokens) const;

  // Appends to `hashes` the chained hashes of the full blocks of `tokens` that it does not hold
  // yet (hashes->size() of them are taken as already computed from the same tokens).
  void ExtendBlockHashes(std::span<const int32_t> tokens, std::vector<uint64_t>* hashes) const;

  // The cached blocks holding the leading blocks of `hashes`, stopping at the first miss or after
  // `max_blocks`. Takes no references. Empty when prefix caching is off.
  std::vector<int32_t> FindCachedBlocks(std::span<const uint64_t> hashes, int32_t max_blocks) const;

  // Extends sequence `seq`'s block table to cover `num_tokens` positions. If the sequence holds no
  // table yet, `prefix_blocks` (cache hits, or blocks shared with another sequence) become its
  // first blocks, referenced rather than allocated. Returns the number of blocks newly taken from
  // the free list, or nullopt (changing nothing) when they do not fit. Blocks are never allocated
  // partially. REQUIRES: prefix_blocks is empty unless seq holds no table.
  std::optional<int32_t> Allocate(SeqId seq, int64_t num_tokens,
                                  std::span<const int32_t> prefix_blocks = {});

  // Enters seq's full blocks among its first `num_computed_tokens` positions into the prefix cache
  // under `block_hashes` (the sequence's chained hashes). A hash already cached for another block
  // is left alone (that block keeps it). No-op when prefix caching is off.
  void CacheComputedBlocks(SeqId seq, std::span<const uint64_t> block_hashes,
                           int64_t num_computed_tokens);

  // Drops seq's references, last block first, and forgets its table. No-op for an unknown seq.
  void Free(SeqId seq);

  // Seq's block table; empty when it holds none.
  std::span<const int32_t> BlockTable(SeqId seq) const;

  // Introspection, for tests and statistics.
  int32_t RefCount(int32_t block) const;
  bool IsCached(int32_t block) const;
  std::vector<int32_t> FreeBlocksInEvictionOrder() const;
  int64_t num_evictions() const { return num_evictions_; }
  int64_t num_sequences() const { return static_cast<int64_t>(tables_.size()); }
  // CHECK-fails with a message if an invariant of the header comment is broken.
  void CheckInvariants() const;

 private:
  static constexpr int32_t kNil = -1;

  struct BlockInfo {
    int32_t ref_count = 0;
    int32_t prev = kNil;  // free list links; meaningful only when ref_count == 0
    int32_t next = kNil;
    bool cached = false;
    uint64_t hash = 0;  // meaningful only when cached
  };

  struct Table {
    std::vector<int32_t> block_ids;
    int32_t num_cached_blocks = 0;  // leading blocks already offered to the cache
  };

  void Unlink(int32_t block);
  void PushFront(int32_t block);
  void PushBack(int32_t block);
  int32_t PopFront();  // evicts the block's cached content, if any
  void Release(int32_t block);

  const int32_t num_blocks_;
  const int32_t block_size_tokens_;
  const bool enable_prefix_caching_;

  std::vector<BlockInfo> blocks_;
  int32_t free_head_ = kNil;
  int32_t free_tail_ = kNil;
  int32_t num_free_blocks_ = 0;
  int64_t num_evictions_ = 0;

  absl::flat_hash_map<uint64_t, int32_t> cache_;  // block hash -> block id
  absl::flat_hash_map<SeqId, Table> tables_;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_BLOCK_MANAGER_H_

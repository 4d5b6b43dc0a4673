// The block manager: the KV cache's fixed pool of block ids, and who holds which.
//
// Theory. The runner owns `num_blocks` KV blocks of `block_size_tokens` slots each; a block is only
// an integer id here. The model's KV cache layers come in groups (engine/model/kv_cache_groups.h),
// each with its window: 0 for full attention, W for a sliding window over the last W positions.
// Every group draws blocks from the one pool; a block belongs to one group at a time. Each
// sequence owns, per group, an append-only block table: its entry j holds positions [j*B, (j+1)*B)
// of the group's layers. Blocks are shared by reference count: a full block is immutable once its
// tokens are computed, so two sequences whose first k*B tokens are equal can point at the same k
// blocks (prefix caching across requests, and the n samples of one prompt).
//
// Windows. In a group of window W, the query at position p reads the keys at (p - W, p]. Once a
// sequence's next query is at position c (c positions computed), its entries j with
// (j+1)*B <= c - W + 1 hold only positions no query will read again: Allocate drops them (the entry
// becomes kNoBlock, the reference is released), so a windowed group holds about W/B blocks per
// sequence plus the blocks of the step's new tokens, whatever the context. Entries keep their
// logical index; the dropped ones are always a table's leading entries.
//
// Prefix cache. A full block is named by a hash chained from its parent's: hash(j) =
// H(hash(j-1), tokens of block j), so equal hashes mean equal whole prefixes (up to a 64-bit hash
// collision, which is not guarded against). Once a sequence has computed a full block, the block is
// entered in its group's cache under its hash. At admission, a sequence starts from the longest
// prefix of k blocks that every group can serve: a full-attention group its first k blocks, a
// windowed group the blocks holding positions [k*B - W + 1, k*B), which the first new query reads
// (its earlier entries are kNoBlock). A block stays cached after its last reference is dropped,
// until it is reused for something else (evicted).
//
// Free list = eviction order. Blocks with no references sit in one doubly linked list: blocks that
// hold no cached content first (they are worth nothing), then cached blocks, least recently
// released first. A sequence releases a full group's blocks last-to-first, so a chain's tail is
// evicted before its head (a tail is useless without its head), and a windowed group's blocks
// first-to-last, as its window slides (a windowed hit needs the blocks just before it, not the
// head). Allocation takes blocks from the front, evicting any cached content they hold; a cache
// hit on a free block takes it out of the middle of the list.
//
// Invariants (CheckInvariants() verifies all of them):
//  - every block is either referenced (ref_count > 0, not in the free list) or free
//    (ref_count == 0, in the free list exactly once);
//  - a block's ref_count is the number of block tables that hold it, all of them of its group;
//  - block b has hash h if and only if its group's cache maps h to b;
//  - in the free list, every uncached block precedes every cached block;
//  - a table's kNoBlock entries are its first num_dropped ones, and only windowed groups have any;
//  - a group's used-block count is the number of referenced blocks it owns.
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

// A computed prefix a sequence can start from: its first `num_blocks` blocks, as each KV cache
// group holds them (BlockManager::kNoBlock where a windowed group needs no block).
struct ComputedPrefix {
  int32_t num_blocks = 0;
  std::vector<std::vector<int32_t>> blocks;  // [num_groups][num_blocks]; empty when num_blocks 0
};

class BlockManager {
 public:
  using SeqId = int64_t;
  // A dropped table entry: a windowed group's block that no query will read again.
  static constexpr int32_t kNoBlock = -1;

  // `group_windows`: each KV cache group's window (0 = full attention), in the runner's order.
  // REQUIRES: num_blocks > 0, block_size_tokens > 0, at least one group, windows >= 0.
  BlockManager(int32_t num_blocks, int32_t block_size_tokens, bool enable_prefix_caching,
               std::vector<int32_t> group_windows = {0});

  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size_tokens() const { return block_size_tokens_; }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }
  int32_t num_groups() const { return static_cast<int32_t>(group_windows_.size()); }
  const std::vector<int32_t>& group_windows() const { return group_windows_; }
  // Blocks with no reference (cached or not): what Allocate can hand out.
  int32_t num_free_blocks() const { return num_free_blocks_; }
  // Referenced blocks owned by `group`; they sum to num_blocks() - num_free_blocks().
  int32_t num_used_blocks(int32_t group) const { return num_used_blocks_.at(group); }
  // The fraction of blocks referenced by some sequence, in [0, 1].
  double usage() const;
  // Blocks needed to hold `num_tokens` positions.
  int32_t BlocksForTokens(int64_t num_tokens) const;

  // Appends to `hashes` the chained hashes of the full blocks of `tokens` that it does not hold
  // yet (hashes->size() of them are taken as already computed from the same tokens).
  void ExtendBlockHashes(std::span<const int32_t> tokens, std::vector<uint64_t>* hashes) const;

  // The longest prefix of at most `max_blocks` blocks named by the leading `hashes` that every
  // group holds cached (see the header comment). Takes no references. Empty when prefix caching
  // is off.
  ComputedPrefix FindCachedPrefix(std::span<const uint64_t> hashes, int32_t max_blocks) const;

  // The first `num_blocks` blocks of sequence `source`'s tables, for a sequence with the same
  // first num_blocks * B tokens (samples of one prompt); empty when a windowed group of `source`
  // has dropped blocks that prefix needs. REQUIRES: source holds at least num_blocks blocks.
  ComputedPrefix SharedPrefix(SeqId source, int32_t num_blocks) const;

  // Extends each of sequence `seq`'s block tables to cover `num_tokens` positions, after dropping
  // the windowed groups' blocks that no query at or after position `num_computed_tokens` reads. If
  // the sequence holds no table yet, `prefix` (cache hits, or blocks shared with another sequence)
  // becomes its first blocks, referenced rather than allocated, and num_computed_tokens must be
  // prefix.num_blocks * B. Returns the number of blocks newly taken from the free list (prefix
  // blocks not counted), or nullopt (changing nothing) when they do not fit, blocks that the drop
  // would free counted as free. Blocks are never allocated partially.
  // REQUIRES: prefix.num_blocks == 0 unless seq holds no table.
  std::optional<int32_t> Allocate(SeqId seq, int64_t num_tokens, const ComputedPrefix& prefix = {},
                                  int64_t num_computed_tokens = 0);

  // Enters seq's full blocks among its first `num_computed_tokens` positions into their groups'
  // prefix caches under `block_hashes` (the sequence's chained hashes). A hash already cached for
  // another block of the group is left alone (that block keeps it). No-op when prefix caching is
  // off.
  void CacheComputedBlocks(SeqId seq, std::span<const uint64_t> block_hashes,
                           int64_t num_computed_tokens);

  // Drops seq's references (see the header comment for the order) and forgets its tables. No-op
  // for an unknown seq.
  void Free(SeqId seq);

  // Seq's block table in `group`; empty when it holds none. Dropped entries are kNoBlock.
  std::span<const int32_t> BlockTable(SeqId seq, int32_t group = 0) const;

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
    int32_t group = -1;  // the owner while referenced or cached
    bool cached = false;
    uint64_t hash = 0;  // meaningful only when cached
  };

  struct GroupTable {
    std::vector<int32_t> block_ids;
    int32_t num_cached_blocks = 0;  // leading blocks already offered to the cache
    int32_t num_dropped = 0;        // leading entries that are kNoBlock
  };

  struct Table {
    std::vector<GroupTable> groups;  // [num_groups]
  };

  // The first entry of a `group` table that a query at position `first_query_position` or later
  // may read (0 for full attention).
  int32_t FirstNeededBlock(int32_t group, int64_t first_query_position) const;
  void TakeReference(int32_t block, int32_t group);
  void Unlink(int32_t block);
  void PushFront(int32_t block);
  void PushBack(int32_t block);
  int32_t PopFront();  // evicts the block's cached content, if any
  void Release(int32_t block);

  const int32_t num_blocks_;
  const int32_t block_size_tokens_;
  const bool enable_prefix_caching_;
  const std::vector<int32_t> group_windows_;

  std::vector<BlockInfo> blocks_;
  int32_t free_head_ = kNil;
  int32_t free_tail_ = kNil;
  int32_t num_free_blocks_ = 0;
  int64_t num_evictions_ = 0;
  std::vector<int32_t> num_used_blocks_;  // [num_groups]

  std::vector<absl::flat_hash_map<uint64_t, int32_t>> cache_;  // [num_groups]: hash -> block id
  absl::flat_hash_map<SeqId, Table> tables_;
};

// The most tokens one sequence can hold with the whole pool to itself, when a step computes at
// most `max_step_tokens` of its tokens: a full-attention group holds every block of its context,
// a windowed group at most ceil((W - 1 + max_step_tokens) / B) + 1. INT64_MAX when no group has
// full attention and the windowed groups' most fits.
int64_t MaxTokensPerSequence(int32_t num_blocks, int32_t block_size_tokens,
                             std::span<const int32_t> group_windows, int32_t max_step_tokens);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_BLOCK_MANAGER_H_

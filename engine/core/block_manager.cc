#include "engine/core/block_manager.h"

#include <algorithm>

#include "common/hash.h"
#include "engine/core/check.h"

namespace lmserve::engine {
namespace {

constexpr uint64_t kRootHash = 0x6c6d7365727665ULL;  // the "parent" of a sequence's first block

}  // namespace

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size_tokens,
                           bool enable_prefix_caching)
    : num_blocks_(num_blocks),
      block_size_tokens_(block_size_tokens),
      enable_prefix_caching_(enable_prefix_caching),
      blocks_(static_cast<size_t>(num_blocks)) {
  LMSERVE_CORE_CHECK(num_blocks > 0, "num_blocks ", num_blocks);
  LMSERVE_CORE_CHECK(block_size_tokens > 0, "block_size_tokens ", block_size_tokens);
  for (int32_t block = 0; block < num_blocks; ++block) PushBack(block);
}

double BlockManager::usage() const {
  return static_cast<double>(num_blocks_ - num_free_blocks_) / static_cast<double>(num_blocks_);
}

int32_t BlockManager::BlocksForTokens(int64_t num_tokens) const {
  return static_cast<int32_t>((num_tokens + block_size_tokens_ - 1) / block_size_tokens_);
}

void BlockManager::ExtendBlockHashes(std::span<const int32_t> tokens,
                                     std::vector<uint64_t>* hashes) const {
  const size_t num_full_blocks = tokens.size() / static_cast<size_t>(block_size_tokens_);
  while (hashes->size() < num_full_blocks) {
    const size_t block = hashes->size();
    // The parent's hash, then each token folded in (bit for bit the hashes of before common/).
    uint64_t hash = Mix64((block == 0 ? kRootHash : hashes->back()) + kGoldenGamma);
    const int32_t* begin = tokens.data() + block * static_cast<size_t>(block_size_tokens_);
    for (int32_t i = 0; i < block_size_tokens_; ++i) {
      hash = HashCombine(hash, static_cast<uint64_t>(static_cast<uint32_t>(begin[i])));
    }
    hashes->push_back(hash);
  }
}

std::vector<int32_t> BlockManager::FindCachedBlocks(std::span<const uint64_t> hashes,
                                                    int32_t max_blocks) const {
  std::vector<int32_t> found;
  if (!enable_prefix_caching_) return found;
  for (size_t i = 0; i < hashes.size() && static_cast<int32_t>(i) < max_blocks; ++i) {
    auto it = cache_.find(hashes[i]);
    if (it == cache_.end()) break;
    found.push_back(it->second);
  }
  return found;
}

std::optional<int32_t> BlockManager::Allocate(SeqId seq, int64_t num_tokens,
                                              std::span<const int32_t> prefix_blocks) {
  auto it = tables_.find(seq);
  const int32_t num_held =
      it == tables_.end() ? 0 : static_cast<int32_t>(it->second.block_ids.size());
  LMSERVE_CORE_CHECK(prefix_blocks.empty() || num_held == 0, "seq ", seq,
                     " already holds blocks; prefix blocks come only with the first allocation");
  const int32_t num_needed = BlocksForTokens(num_tokens);
  const int32_t num_new =
      std::max(0, num_needed - num_held - static_cast<int32_t>(prefix_blocks.size()));
  int32_t num_prefix_free = 0;
  for (int32_t block : prefix_blocks) {
    LMSERVE_CORE_CHECK(block >= 0 && block < num_blocks_, "prefix block ", block);
    if (blocks_[block].ref_count == 0) ++num_prefix_free;
  }
  if (num_new + num_prefix_free > num_free_blocks_) return std::nullopt;

  Table& table = it == tables_.end() ? tables_[seq] : it->second;
  for (int32_t block : prefix_blocks) {
    BlockInfo& info = blocks_[block];
    if (info.ref_count == 0) Unlink(block);
    ++info.ref_count;
    table.block_ids.push_back(block);
  }
  table.num_cached_blocks =
      std::max(table.num_cached_blocks, static_cast<int32_t>(prefix_blocks.size()));
  for (int32_t i = 0; i < num_new; ++i) {
    const int32_t block = PopFront();
    blocks_[block].ref_count = 1;
    table.block_ids.push_back(block);
  }
  return num_new;
}

void BlockManager::CacheComputedBlocks(SeqId seq, std::span<const uint64_t> block_hashes,
                                       int64_t num_computed_tokens) {
  if (!enable_prefix_caching_) return;
  auto it = tables_.find(seq);
  LMSERVE_CORE_CHECK(it != tables_.end(), "seq ", seq, " holds no blocks");
  Table& table = it->second;
  const int64_t limit =
      std::min({static_cast<int64_t>(block_hashes.size()), num_computed_tokens / block_size_tokens_,
                static_cast<int64_t>(table.block_ids.size())});
  for (int64_t i = table.num_cached_blocks; i < limit; ++i) {
    const int32_t block = table.block_ids[static_cast<size_t>(i)];
    const uint64_t hash = block_hashes[static_cast<size_t>(i)];
    BlockInfo& info = blocks_[block];
    if (info.cached) {
      LMSERVE_CORE_CHECK(info.hash == hash, "block ", block, " is cached under another hash");
      continue;
    }
    if (!cache_.try_emplace(hash, block).second) continue;  // another block holds this content
    info.cached = true;
    info.hash = hash;
  }
  table.num_cached_blocks = std::max(table.num_cached_blocks, static_cast<int32_t>(limit));
}

void BlockManager::Free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const std::vector<int32_t>& ids = it->second.block_ids;
  for (auto block = ids.rbegin(); block != ids.rend(); ++block) Release(*block);
  tables_.erase(it);
}

std::span<const int32_t> BlockManager::BlockTable(SeqId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second.block_ids;
}

int32_t BlockManager::RefCount(int32_t block) const { return blocks_.at(block).ref_count; }

bool BlockManager::IsCached(int32_t block) const { return blocks_.at(block).cached; }

std::vector<int32_t> BlockManager::FreeBlocksInEvictionOrder() const {
  std::vector<int32_t> order;
  for (int32_t block = free_head_; block != kNil; block = blocks_[block].next) {
    order.push_back(block);
  }
  return order;
}

void BlockManager::Release(int32_t block) {
  BlockInfo& info = blocks_[block];
  LMSERVE_CORE_CHECK(info.ref_count > 0, "releasing free block ", block);
  if (--info.ref_count > 0) return;
  // Content worth keeping goes to the back (evicted last); the rest to the front (reused first).
  if (info.cached) {
    PushBack(block);
  } else {
    PushFront(block);
  }
}

void BlockManager::Unlink(int32_t block) {
  BlockInfo& info = blocks_[block];
  if (info.prev == kNil) {
    free_head_ = info.next;
  } else {
    blocks_[info.prev].next = info.next;
  }
  if (info.next == kNil) {
    free_tail_ = info.prev;
  } else {
    blocks_[info.next].prev = info.prev;
  }
  info.prev = info.next = kNil;
  --num_free_blocks_;
}

void BlockManager::PushFront(int32_t block) {
  BlockInfo& info = blocks_[block];
  info.prev = kNil;
  info.next = free_head_;
  if (free_head_ == kNil) {
    free_tail_ = block;
  } else {
    blocks_[free_head_].prev = block;
  }
  free_head_ = block;
  ++num_free_blocks_;
}

void BlockManager::PushBack(int32_t block) {
  BlockInfo& info = blocks_[block];
  info.next = kNil;
  info.prev = free_tail_;
  if (free_tail_ == kNil) {
    free_head_ = block;
  } else {
    blocks_[free_tail_].next = block;
  }
  free_tail_ = block;
  ++num_free_blocks_;
}

int32_t BlockManager::PopFront() {
  const int32_t block = free_head_;
  LMSERVE_CORE_CHECK(block != kNil, "free list empty");
  Unlink(block);
  BlockInfo& info = blocks_[block];
  if (info.cached) {
    cache_.erase(info.hash);
    info.cached = false;
    ++num_evictions_;
  }
  return block;
}

void BlockManager::CheckInvariants() const {
  std::vector<int32_t> table_refs(static_cast<size_t>(num_blocks_), 0);
  for (const auto& [seq, table] : tables_) {
    for (int32_t block : table.block_ids) {
      LMSERVE_CORE_CHECK(block >= 0 && block < num_blocks_, "seq ", seq, " holds block ", block);
      ++table_refs[static_cast<size_t>(block)];
    }
  }
  std::vector<int32_t> in_free_list(static_cast<size_t>(num_blocks_), 0);
  int32_t count = 0;
  int32_t prev = kNil;
  bool seen_cached = false;
  for (int32_t block = free_head_; block != kNil; block = blocks_[block].next) {
    LMSERVE_CORE_CHECK(count < num_blocks_, "free list has a cycle");
    LMSERVE_CORE_CHECK(blocks_[block].prev == prev, "free list link broken at block ", block);
    LMSERVE_CORE_CHECK(in_free_list[static_cast<size_t>(block)] == 0, "block ", block,
                       " twice in the free list");
    LMSERVE_CORE_CHECK(!seen_cached || blocks_[block].cached, "uncached block ", block,
                       " after a cached one in the free list");
    seen_cached = seen_cached || blocks_[block].cached;
    in_free_list[static_cast<size_t>(block)] = 1;
    prev = block;
    ++count;
  }
  LMSERVE_CORE_CHECK(prev == free_tail_, "free list tail");
  LMSERVE_CORE_CHECK(count == num_free_blocks_, "free list holds ", count, " blocks, counted ",
                     num_free_blocks_);
  int64_t num_cached = 0;
  for (int32_t block = 0; block < num_blocks_; ++block) {
    const BlockInfo& info = blocks_[block];
    LMSERVE_CORE_CHECK(info.ref_count == table_refs[static_cast<size_t>(block)], "block ", block,
                       " ref_count ", info.ref_count, " but held by ",
                       table_refs[static_cast<size_t>(block)], " tables");
    LMSERVE_CORE_CHECK((info.ref_count == 0) == (in_free_list[static_cast<size_t>(block)] == 1),
                       "block ", block, " free-list membership disagrees with ref_count");
    if (info.cached) {
      ++num_cached;
      auto it = cache_.find(info.hash);
      LMSERVE_CORE_CHECK(it != cache_.end() && it->second == block, "cached block ", block,
                         " missing from the cache map");
    }
  }
  LMSERVE_CORE_CHECK(num_cached == static_cast<int64_t>(cache_.size()), "cache map has ",
                     cache_.size(), " entries for ", num_cached, " cached blocks");
}

}  // namespace lmserve::engine

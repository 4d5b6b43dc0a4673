#include "engine/core/block_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/hash.h"
#include "engine/core/check.h"

namespace lmserve::engine {
namespace {

constexpr uint64_t kRootHash = 0x6c6d7365727665ULL;  // the "parent" of a sequence's first block

}  // namespace

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size_tokens,
                           bool enable_prefix_caching, std::vector<int32_t> group_windows)
    : num_blocks_(num_blocks),
      block_size_tokens_(block_size_tokens),
      enable_prefix_caching_(enable_prefix_caching),
      group_windows_(std::move(group_windows)),
      blocks_(static_cast<size_t>(num_blocks)),
      num_used_blocks_(group_windows_.size(), 0),
      cache_(group_windows_.size()) {
  LMSERVE_CORE_CHECK(num_blocks > 0, "num_blocks ", num_blocks);
  LMSERVE_CORE_CHECK(block_size_tokens > 0, "block_size_tokens ", block_size_tokens);
  LMSERVE_CORE_CHECK(!group_windows_.empty(), "no KV cache groups");
  for (int32_t window : group_windows_) LMSERVE_CORE_CHECK(window >= 0, "window ", window);
  for (int32_t block = 0; block < num_blocks; ++block) PushBack(block);
}

double BlockManager::usage() const {
  return static_cast<double>(num_blocks_ - num_free_blocks_) / static_cast<double>(num_blocks_);
}

int32_t BlockManager::BlocksForTokens(int64_t num_tokens) const {
  return static_cast<int32_t>((num_tokens + block_size_tokens_ - 1) / block_size_tokens_);
}

int32_t BlockManager::FirstNeededBlock(int32_t group, int64_t first_query_position) const {
  const int32_t window = group_windows_[static_cast<size_t>(group)];
  if (window == 0) return 0;
  // Entry j is needed unless (j + 1) * B <= first_query_position - window + 1.
  const int64_t first_key = std::max<int64_t>(0, first_query_position - window + 1);
  return static_cast<int32_t>(first_key / block_size_tokens_);
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

ComputedPrefix BlockManager::FindCachedPrefix(std::span<const uint64_t> hashes,
                                              int32_t max_blocks) const {
  ComputedPrefix prefix;
  if (!enable_prefix_caching_) return prefix;
  const int32_t limit = std::max(0, std::min(max_blocks, static_cast<int32_t>(hashes.size())));
  const int32_t groups = num_groups();
  // Each group's cached block for each of the first `limit` hashes (kNoBlock on a miss); a full
  // group bounds the prefix by its leading run of hits.
  std::vector<std::vector<int32_t>> found(static_cast<size_t>(groups));
  int32_t num_blocks = limit;
  for (int32_t g = 0; g < groups; ++g) {
    const bool full = group_windows_[static_cast<size_t>(g)] == 0;
    std::vector<int32_t>& hits = found[static_cast<size_t>(g)];
    hits.assign(static_cast<size_t>(limit), kNoBlock);
    for (int32_t j = 0; j < (full ? num_blocks : limit); ++j) {
      auto it = cache_[static_cast<size_t>(g)].find(hashes[static_cast<size_t>(j)]);
      if (it != cache_[static_cast<size_t>(g)].end()) {
        hits[static_cast<size_t>(j)] = it->second;
      } else if (full) {
        num_blocks = j;
        break;
      }
    }
  }
  // The longest prefix whose every windowed group holds the blocks its first new query reads.
  auto served = [&](int32_t k) {
    for (int32_t g = 0; g < groups; ++g) {
      if (group_windows_[static_cast<size_t>(g)] == 0) continue;
      const std::vector<int32_t>& hits = found[static_cast<size_t>(g)];
      for (int32_t j = FirstNeededBlock(g, int64_t{k} * block_size_tokens_); j < k; ++j) {
        if (hits[static_cast<size_t>(j)] == kNoBlock) return false;
      }
    }
    return true;
  };
  while (num_blocks > 0 && !served(num_blocks)) --num_blocks;
  if (num_blocks == 0) return prefix;
  prefix.num_blocks = num_blocks;
  prefix.blocks.resize(static_cast<size_t>(groups));
  for (int32_t g = 0; g < groups; ++g) {
    const int32_t first = FirstNeededBlock(g, int64_t{num_blocks} * block_size_tokens_);
    std::vector<int32_t>& blocks = prefix.blocks[static_cast<size_t>(g)];
    blocks.assign(static_cast<size_t>(num_blocks), kNoBlock);
    for (int32_t j = first; j < num_blocks; ++j) {
      blocks[static_cast<size_t>(j)] = found[static_cast<size_t>(g)][static_cast<size_t>(j)];
    }
  }
  return prefix;
}

ComputedPrefix BlockManager::SharedPrefix(SeqId source, int32_t num_blocks) const {
  ComputedPrefix prefix;
  auto it = tables_.find(source);
  if (it == tables_.end() || num_blocks <= 0) return prefix;
  prefix.blocks.resize(static_cast<size_t>(num_groups()));
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::vector<int32_t>& table = it->second.groups[static_cast<size_t>(g)].block_ids;
    LMSERVE_CORE_CHECK(static_cast<int32_t>(table.size()) >= num_blocks, "seq ", source, " holds ",
                       table.size(), " blocks of group ", g, ", not ", num_blocks);
    const int32_t first = FirstNeededBlock(g, int64_t{num_blocks} * block_size_tokens_);
    std::vector<int32_t>& blocks = prefix.blocks[static_cast<size_t>(g)];
    blocks.assign(static_cast<size_t>(num_blocks), kNoBlock);
    for (int32_t j = first; j < num_blocks; ++j) {
      if (table[static_cast<size_t>(j)] == kNoBlock) return ComputedPrefix{};  // slid past
      blocks[static_cast<size_t>(j)] = table[static_cast<size_t>(j)];
    }
  }
  prefix.num_blocks = num_blocks;
  return prefix;
}

std::optional<int32_t> BlockManager::Allocate(SeqId seq, int64_t num_tokens,
                                              const ComputedPrefix& prefix,
                                              int64_t num_computed_tokens) {
  auto it = tables_.find(seq);
  const bool fresh = it == tables_.end();
  LMSERVE_CORE_CHECK(prefix.num_blocks == 0 || fresh, "seq ", seq,
                     " already holds blocks; prefix blocks come only with the first allocation");
  LMSERVE_CORE_CHECK(prefix.num_blocks == 0 ||
                         (static_cast<int32_t>(prefix.blocks.size()) == num_groups() &&
                          num_computed_tokens == int64_t{prefix.num_blocks} * block_size_tokens_),
                     "seq ", seq, ": a prefix of ", prefix.num_blocks, " blocks in ",
                     prefix.blocks.size(), " groups for ", num_computed_tokens, " computed tokens");
  const int32_t num_needed = BlocksForTokens(num_tokens);
  // What this takes from the free list, and what dropping frees for it.
  int32_t num_new = 0, num_prefix_free = 0, num_dropped_free = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int32_t first_needed = FirstNeededBlock(g, num_computed_tokens);
    int32_t num_held = 0;
    if (fresh) {
      num_held = prefix.num_blocks;
      for (int32_t j = first_needed; j < prefix.num_blocks; ++j) {
        const int32_t block = prefix.blocks[static_cast<size_t>(g)][static_cast<size_t>(j)];
        LMSERVE_CORE_CHECK(block >= 0 && block < num_blocks_, "prefix block ", block, " of group ",
                           g);
        if (blocks_[block].ref_count == 0) ++num_prefix_free;
      }
    } else {
      const GroupTable& table = it->second.groups[static_cast<size_t>(g)];
      num_held = static_cast<int32_t>(table.block_ids.size());
      for (int32_t j = table.num_dropped; j < std::min(first_needed, num_held); ++j) {
        if (blocks_[table.block_ids[static_cast<size_t>(j)]].ref_count == 1) ++num_dropped_free;
      }
    }
    num_new += std::max(0, num_needed - num_held);
  }
  if (num_new + num_prefix_free > num_free_blocks_ + num_dropped_free) return std::nullopt;

  Table& table = fresh ? tables_[seq] : it->second;
  if (fresh) table.groups.resize(static_cast<size_t>(num_groups()));
  for (int32_t g = 0; g < num_groups(); ++g) {
    GroupTable& group = table.groups[static_cast<size_t>(g)];
    const int32_t first_needed = FirstNeededBlock(g, num_computed_tokens);
    if (fresh) {
      for (int32_t j = 0; j < prefix.num_blocks; ++j) {
        const int32_t block = prefix.blocks[static_cast<size_t>(g)][static_cast<size_t>(j)];
        if (j < first_needed) {
          group.block_ids.push_back(kNoBlock);
          continue;
        }
        TakeReference(block, g);
        group.block_ids.push_back(block);
      }
      group.num_dropped = std::min(first_needed, prefix.num_blocks);
      group.num_cached_blocks = prefix.num_blocks;
    } else {
      // Oldest first: released cached blocks reach the free list's back in window order.
      const int32_t end = std::min(first_needed, static_cast<int32_t>(group.block_ids.size()));
      for (int32_t j = group.num_dropped; j < end; ++j) {
        Release(group.block_ids[static_cast<size_t>(j)]);
        group.block_ids[static_cast<size_t>(j)] = kNoBlock;
      }
      group.num_dropped = std::max(group.num_dropped, end);
    }
  }
  // New blocks only once every group has dropped and referenced its prefix: a new block of one
  // group must not evict another group's prefix block, nor take a block before a drop frees it.
  for (int32_t g = 0; g < num_groups(); ++g) {
    GroupTable& group = table.groups[static_cast<size_t>(g)];
    while (static_cast<int32_t>(group.block_ids.size()) < num_needed) {
      const int32_t block = PopFront();
      blocks_[block].ref_count = 1;
      blocks_[block].group = g;
      ++num_used_blocks_[static_cast<size_t>(g)];
      group.block_ids.push_back(block);
    }
  }
  return num_new;
}

void BlockManager::TakeReference(int32_t block, int32_t group) {
  BlockInfo& info = blocks_[block];
  LMSERVE_CORE_CHECK(info.group == group, "block ", block, " of group ", info.group,
                     " taken for group ", group);
  if (info.ref_count == 0) {
    Unlink(block);
    ++num_used_blocks_[static_cast<size_t>(group)];
  }
  ++info.ref_count;
}

void BlockManager::CacheComputedBlocks(SeqId seq, std::span<const uint64_t> block_hashes,
                                       int64_t num_computed_tokens) {
  if (!enable_prefix_caching_) return;
  auto it = tables_.find(seq);
  LMSERVE_CORE_CHECK(it != tables_.end(), "seq ", seq, " holds no blocks");
  for (int32_t g = 0; g < num_groups(); ++g) {
    GroupTable& table = it->second.groups[static_cast<size_t>(g)];
    const int64_t limit = std::min({static_cast<int64_t>(block_hashes.size()),
                                    num_computed_tokens / block_size_tokens_,
                                    static_cast<int64_t>(table.block_ids.size())});
    for (int64_t i = table.num_cached_blocks; i < limit; ++i) {
      const int32_t block = table.block_ids[static_cast<size_t>(i)];
      if (block == kNoBlock) continue;
      const uint64_t hash = block_hashes[static_cast<size_t>(i)];
      BlockInfo& info = blocks_[block];
      if (info.cached) {
        LMSERVE_CORE_CHECK(info.hash == hash, "block ", block, " is cached under another hash");
        continue;
      }
      if (!cache_[static_cast<size_t>(g)].try_emplace(hash, block).second) continue;  // a twin
      info.cached = true;
      info.hash = hash;
    }
    table.num_cached_blocks = std::max(table.num_cached_blocks, static_cast<int32_t>(limit));
  }
}

void BlockManager::Free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::vector<int32_t>& ids = it->second.groups[static_cast<size_t>(g)].block_ids;
    if (group_windows_[static_cast<size_t>(g)] == 0) {
      for (auto block = ids.rbegin(); block != ids.rend(); ++block) Release(*block);
    } else {
      for (int32_t block : ids) {
        if (block != kNoBlock) Release(block);
      }
    }
  }
  tables_.erase(it);
}

std::span<const int32_t> BlockManager::BlockTable(SeqId seq, int32_t group) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second.groups.at(static_cast<size_t>(group)).block_ids;
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
  --num_used_blocks_[static_cast<size_t>(info.group)];
  // Content worth keeping goes to the back (evicted last); the rest to the front (reused first).
  if (info.cached) {
    PushBack(block);
  } else {
    info.group = -1;
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
    cache_[static_cast<size_t>(info.group)].erase(info.hash);
    info.cached = false;
    ++num_evictions_;
  }
  info.group = -1;
  return block;
}

void BlockManager::CheckInvariants() const {
  std::vector<int32_t> table_refs(static_cast<size_t>(num_blocks_), 0);
  for (const auto& [seq, table] : tables_) {
    LMSERVE_CORE_CHECK(static_cast<int32_t>(table.groups.size()) == num_groups(), "seq ", seq,
                       " has ", table.groups.size(), " group tables");
    for (int32_t g = 0; g < num_groups(); ++g) {
      const GroupTable& group = table.groups[static_cast<size_t>(g)];
      LMSERVE_CORE_CHECK(group.num_dropped == 0 || group_windows_[static_cast<size_t>(g)] > 0,
                         "seq ", seq, " dropped blocks of full-attention group ", g);
      for (size_t j = 0; j < group.block_ids.size(); ++j) {
        const int32_t block = group.block_ids[j];
        if (static_cast<int32_t>(j) < group.num_dropped) {
          LMSERVE_CORE_CHECK(block == kNoBlock, "seq ", seq, " group ", g, " entry ", j,
                             " is dropped but holds block ", block);
          continue;
        }
        LMSERVE_CORE_CHECK(block >= 0 && block < num_blocks_, "seq ", seq, " group ", g,
                           " holds block ", block);
        LMSERVE_CORE_CHECK(blocks_[block].group == g, "seq ", seq, " group ", g, " holds block ",
                           block, " of group ", blocks_[block].group);
        ++table_refs[static_cast<size_t>(block)];
      }
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
  std::vector<int64_t> num_cached(static_cast<size_t>(num_groups()), 0);
  std::vector<int32_t> num_used(static_cast<size_t>(num_groups()), 0);
  for (int32_t block = 0; block < num_blocks_; ++block) {
    const BlockInfo& info = blocks_[block];
    LMSERVE_CORE_CHECK(info.ref_count == table_refs[static_cast<size_t>(block)], "block ", block,
                       " ref_count ", info.ref_count, " but held by ",
                       table_refs[static_cast<size_t>(block)], " tables");
    LMSERVE_CORE_CHECK((info.ref_count == 0) == (in_free_list[static_cast<size_t>(block)] == 1),
                       "block ", block, " free-list membership disagrees with ref_count");
    LMSERVE_CORE_CHECK(
        (info.ref_count > 0 || info.cached) == (info.group >= 0 && info.group < num_groups()),
        "block ", block, " has group ", info.group);
    if (info.ref_count > 0) ++num_used[static_cast<size_t>(info.group)];
    if (info.cached) {
      ++num_cached[static_cast<size_t>(info.group)];
      const auto& cache = cache_[static_cast<size_t>(info.group)];
      auto it = cache.find(info.hash);
      LMSERVE_CORE_CHECK(it != cache.end() && it->second == block, "cached block ", block,
                         " missing from the cache map of group ", info.group);
    }
  }
  for (int32_t g = 0; g < num_groups(); ++g) {
    LMSERVE_CORE_CHECK(num_cached[static_cast<size_t>(g)] ==
                           static_cast<int64_t>(cache_[static_cast<size_t>(g)].size()),
                       "group ", g, "'s cache map has ", cache_[static_cast<size_t>(g)].size(),
                       " entries for ", num_cached[static_cast<size_t>(g)], " cached blocks");
    LMSERVE_CORE_CHECK(num_used[static_cast<size_t>(g)] == num_used_blocks_[static_cast<size_t>(g)],
                       "group ", g, " uses ", num_used[static_cast<size_t>(g)], " blocks, counted ",
                       num_used_blocks_[static_cast<size_t>(g)]);
  }
}

int64_t MaxTokensPerSequence(int32_t num_blocks, int32_t block_size_tokens,
                             std::span<const int32_t> group_windows, int32_t max_step_tokens) {
  // The blocks one sequence of k blocks' context holds at most, over every group.
  auto blocks_held = [&](int64_t k) {
    int64_t total = 0;
    for (int32_t window : group_windows) {
      if (window == 0) {
        total += k;
      } else {
        const int64_t most =
            (int64_t{window} - 1 + max_step_tokens + block_size_tokens - 1) / block_size_tokens + 1;
        total += std::min(k, most);
      }
    }
    return total;
  };
  const bool any_full =
      std::find(group_windows.begin(), group_windows.end(), 0) != group_windows.end();
  if (!any_full) {
    // Bounded whatever the context: either the most fits, or contexts up to where it stops.
    if (blocks_held(std::numeric_limits<int32_t>::max()) <= num_blocks) {
      return std::numeric_limits<int64_t>::max();
    }
  }
  // The largest k with blocks_held(k) <= num_blocks (blocks_held is non-decreasing).
  int64_t low = 0, high = num_blocks;
  while (low < high) {
    const int64_t mid = (low + high + 1) / 2;
    if (blocks_held(mid) <= num_blocks) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low * block_size_tokens;
}

}  // namespace lmserve::engine

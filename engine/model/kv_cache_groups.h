// KV cache groups: which KV cache layers share a block table, and where each layer's keys and
// values live in a KV block.
//
// Theory (vLLM's hybrid KV cache manager). A layer with full attention keeps every position of a
// sequence; a layer with a sliding window W reads only the last W positions, so the blocks before
// them can be freed. Layers of different windows therefore need block tables of their own. The KV
// cache layers are split into groups, each of one window, and every group holds the same number of
// layers, `layers_per_block` (the last group of a window may hold fewer; its other slots are
// padding). One pool of KV blocks serves every group: a block id names one block of
// `layers_per_block` layer slots, owned by one group at a time, and layer s of group g keeps its
// keys and values in slot s of the blocks in g's table. Blocks move between groups as demand
// shifts, and no split of the memory between full and windowed layers is fixed in advance: a
// windowed group holds about a window of blocks per sequence, a full group its whole context.
//
// A model whose layers all have one window (full attention, or Mistral's window on every layer) is
// one group of every layer: a block holds every layer, as before groups existed.

#ifndef LMSERVE_ENGINE_MODEL_KV_CACHE_GROUPS_H_
#define LMSERVE_ENGINE_MODEL_KV_CACHE_GROUPS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace lmserve::engine {

struct KvCacheGroups {
  std::vector<int32_t> windows;      // [num_groups]: each group's window; 0 = full attention
  std::vector<int32_t> layer_group;  // [num_kv_layers]: the group of each KV cache layer
  std::vector<int32_t> layer_slot;   // [num_kv_layers]: its slot in a block, < layers_per_block
  int32_t layers_per_block = 0;      // layer slots per KV block

  int32_t num_groups() const { return static_cast<int32_t>(windows.size()); }
  // "1 group of 32 layers, window 4096" / "2 groups of 2 layers: windows 16, full": for logs.
  std::string Describe() const;
};

// The groups of a model whose KV cache layer l has window kv_windows[l] (0: full attention).
// Layers of one window are grouped in layer order; groups are ordered by their first layer. The
// group size is the smallest window's layer count, or the largest's when that is within 1.25
// times the smallest (vLLM's rule: fewer groups for a little padding). No layers (a model of
// state-space layers only): one full group of 0 layers per block. REQUIRES: kv_windows holds no
// negative window.
KvCacheGroups PlanKvCacheGroups(std::span<const int32_t> kv_windows);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_KV_CACHE_GROUPS_H_

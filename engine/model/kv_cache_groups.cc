#include "engine/model/kv_cache_groups.h"

#include <algorithm>
#include <map>

#include "common/strings.h"
#include "engine/core/check.h"

namespace lmserve::engine {

std::string KvCacheGroups::Describe() const {
  std::vector<std::string> windows_text;
  for (int32_t window : windows) windows_text.push_back(window == 0 ? "full" : StrCat(window));
  if (num_groups() == 1) {
    return StrCat("1 group of ", layers_per_block, " layers, window ", windows_text[0]);
  }
  return StrCat(num_groups(), " groups of ", layers_per_block, " layers: windows ",
                StrJoin(windows_text, ", "));
}

KvCacheGroups PlanKvCacheGroups(std::span<const int32_t> kv_windows) {
  if (kv_windows.empty()) {
    // No KV cache layers (a model of state-space layers only): one full group whose blocks hold
    // no layer, so that block tables keep their meaning and cost no memory.
    KvCacheGroups groups;
    groups.windows = {0};
    groups.layers_per_block = 0;
    return groups;
  }
  // The layers of each window, windows in order of their first layer.
  std::vector<int32_t> order;                      // distinct windows
  std::map<int32_t, std::vector<int32_t>> layers;  // window -> its layers, in order
  for (size_t l = 0; l < kv_windows.size(); ++l) {
    const int32_t window = kv_windows[l];
    LMSERVE_CORE_CHECK(window >= 0, "layer ", l, " has window ", window);
    if (!layers.contains(window)) order.push_back(window);
    layers[window].push_back(static_cast<int32_t>(l));
  }
  size_t min_layers = kv_windows.size(), max_layers = 0;
  for (const auto& [window, members] : layers) {
    min_layers = std::min(min_layers, members.size());
    max_layers = std::max(max_layers, members.size());
  }
  const size_t group_size = 4 * max_layers < 5 * min_layers ? max_layers : min_layers;

  KvCacheGroups groups;
  groups.layers_per_block = static_cast<int32_t>(group_size);
  groups.layer_group.assign(kv_windows.size(), -1);
  groups.layer_slot.assign(kv_windows.size(), -1);
  // Each window's groups; then all groups sorted by their first layer.
  struct Group {
    int32_t window;
    std::vector<int32_t> layers;
  };
  std::vector<Group> all;
  for (int32_t window : order) {
    const std::vector<int32_t>& members = layers[window];
    for (size_t begin = 0; begin < members.size(); begin += group_size) {
      const size_t end = std::min(members.size(), begin + group_size);
      all.push_back({window, std::vector<int32_t>(members.begin() + static_cast<int64_t>(begin),
                                                  members.begin() + static_cast<int64_t>(end))});
    }
  }
  std::sort(all.begin(), all.end(),
            [](const Group& a, const Group& b) { return a.layers[0] < b.layers[0]; });
  for (size_t g = 0; g < all.size(); ++g) {
    groups.windows.push_back(all[g].window);
    for (size_t s = 0; s < all[g].layers.size(); ++s) {
      groups.layer_group[static_cast<size_t>(all[g].layers[s])] = static_cast<int32_t>(g);
      groups.layer_slot[static_cast<size_t>(all[g].layers[s])] = static_cast<int32_t>(s);
    }
  }
  return groups;
}

}  // namespace lmserve::engine

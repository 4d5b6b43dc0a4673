// PlanKvCacheGroups: one group for one window; vLLM's equal-size groups for mixed windows.

#include "engine/model/kv_cache_groups.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::engine {
namespace {

using ::testing::ElementsAre;

TEST(KvCacheGroupsTest, OneWindowIsOneGroupOfEveryLayer) {
  const KvCacheGroups full = PlanKvCacheGroups(std::vector<int32_t>(4, 0));
  EXPECT_THAT(full.windows, ElementsAre(0));
  EXPECT_EQ(full.layers_per_block, 4);
  EXPECT_THAT(full.layer_group, ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(full.layer_slot, ElementsAre(0, 1, 2, 3));
  const KvCacheGroups mistral = PlanKvCacheGroups(std::vector<int32_t>(32, 4096));
  EXPECT_THAT(mistral.windows, ElementsAre(4096));
  EXPECT_EQ(mistral.layers_per_block, 32);
  EXPECT_EQ(mistral.Describe(), "1 group of 32 layers, window 4096");
}

TEST(KvCacheGroupsTest, AlternatingWindowsAreTwoGroupsOfHalfTheLayers) {
  // Gemma 2: local, global, local, global.
  const KvCacheGroups groups = PlanKvCacheGroups(std::vector<int32_t>{16, 0, 16, 0});
  EXPECT_THAT(groups.windows, ElementsAre(16, 0));
  EXPECT_EQ(groups.layers_per_block, 2);
  EXPECT_THAT(groups.layer_group, ElementsAre(0, 1, 0, 1));
  EXPECT_THAT(groups.layer_slot, ElementsAre(0, 0, 1, 1));
  EXPECT_EQ(groups.Describe(), "2 groups of 2 layers: windows 16, full");
}

TEST(KvCacheGroupsTest, FiveLocalsPerGlobalAreGroupsOfTheGlobalsCount) {
  // Gemma 3's 5:1 over 12 layers: 10 local, 2 global: groups of 2 layers, 5 local and 1 global.
  std::vector<int32_t> windows;
  for (int l = 0; l < 12; ++l) windows.push_back(l % 6 == 5 ? 0 : 512);
  const KvCacheGroups groups = PlanKvCacheGroups(windows);
  EXPECT_EQ(groups.layers_per_block, 2);
  EXPECT_THAT(groups.windows, ElementsAre(512, 512, 512, 0, 512, 512));
  // Local layers 0-4, 6-10 in order, two a group; globals 5 and 11 together.
  EXPECT_THAT(groups.layer_group, ElementsAre(0, 0, 1, 1, 2, 3, 2, 4, 4, 5, 5, 3));
  EXPECT_THAT(groups.layer_slot, ElementsAre(0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1, 1));
  // Within 1.25x: the larger count, one group each (the smaller one padded).
  const KvCacheGroups close =
      PlanKvCacheGroups(std::vector<int32_t>{8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0});
  EXPECT_EQ(close.layers_per_block, 6);
  EXPECT_THAT(close.windows, ElementsAre(8, 0));
  EXPECT_THAT(close.layer_slot, ElementsAre(0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4));
}

}  // namespace
}  // namespace lmserve::engine

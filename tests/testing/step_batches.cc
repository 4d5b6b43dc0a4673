#include "tests/testing/step_batches.h"

#include <vector>

#include "gtest/gtest.h"

namespace lmserve::testing {

void AddSequenceToEveryGroup(engine::StepBatch* batch, const engine::ModelRunner& runner,
                             std::span<const int32_t> new_tokens, int32_t num_computed_tokens,
                             std::span<const int32_t> block_ids, engine::LogitsMode logits_mode) {
  const int32_t num_groups = static_cast<int32_t>(runner.kv_group_windows().size());
  const int32_t stride = runner.num_kv_blocks() / num_groups;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(num_groups));
  std::vector<std::span<const int32_t>> spans;
  for (int32_t g = 0; g < num_groups; ++g) {
    for (int32_t block : block_ids) {
      EXPECT_LT(block, stride) << "block " << block << " of " << num_groups << " groups";
      tables[static_cast<size_t>(g)].push_back(block + g * stride);
    }
    spans.push_back(tables[static_cast<size_t>(g)]);
  }
  batch->AddSequence(new_tokens, num_computed_tokens, spans, logits_mode);
}

}  // namespace lmserve::testing

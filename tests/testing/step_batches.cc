#include "tests/testing/step_batches.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace lmserve::testing {

void AddSequenceToEveryGroup(engine::StepBatch* batch, const engine::ModelRunner& runner,
                             std::span<const int32_t> new_tokens, int32_t num_computed_tokens,
                             std::span<const int32_t> block_ids, engine::LogitsMode logits_mode,
                             int32_t state_slot) {
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
  batch->AddSequence(new_tokens, num_computed_tokens, spans, logits_mode, state_slot);
}

void AllowOnly(engine::StepBatch* batch, std::span<const int32_t> rows,
               std::span<const int32_t> tokens) {
  const size_t words = batch->token_bitmask.size() / static_cast<size_t>(batch->num_seqs());
  for (int32_t r : rows) {
    uint32_t* row = batch->token_bitmask.data() + static_cast<size_t>(r) * words;
    std::fill(row, row + words, 0u);
    for (int32_t t : tokens) row[t >> 5] |= uint32_t{1} << (t & 31);
  }
}

std::vector<int32_t> ConsecutiveBlocks(const engine::ModelRunner& runner, int64_t tokens,
                                       int32_t first_block) {
  const int64_t block_size = runner.block_size_tokens();
  std::vector<int32_t> blocks(static_cast<size_t>((tokens + block_size - 1) / block_size));
  std::iota(blocks.begin(), blocks.end(), first_block);
  return blocks;
}

std::vector<float> PromptLogits(engine::ModelRunner& runner, std::span<const int32_t> prompt,
                                size_t chunk, int32_t state_slot, int32_t first_block) {
  std::vector<float> all;
  const std::vector<int32_t> blocks =
      ConsecutiveBlocks(runner, static_cast<int64_t>(prompt.size()), first_block);
  if (chunk == 0) chunk = prompt.size();
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    const size_t count = std::min(chunk, prompt.size() - start);
    engine::StepBatch batch;
    AddSequenceToEveryGroup(&batch, runner, prompt.subspan(start, count),
                            static_cast<int32_t>(start), blocks, engine::LogitsMode::kAll,
                            state_slot);
    engine::StepOutput output;
    const absl::Status status = runner.Execute(batch, &output);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) return {};
    all.insert(all.end(), output.logits.begin(), output.logits.end());
  }
  return all;
}

}  // namespace lmserve::testing

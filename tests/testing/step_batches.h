// Step batches for tests that drive a runner directly, without the engine's block manager.

#ifndef LMSERVE_TESTS_TESTING_STEP_BATCHES_H_
#define LMSERVE_TESTS_TESTING_STEP_BATCHES_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/runner/model_runner.h"

namespace lmserve::testing {

// Appends a sequence to `batch` with `block_ids` as its block table in every KV cache group of
// `runner` (ModelRunner::kv_group_windows), shifted by g * (num_kv_blocks / num_groups) in group
// g: the groups share one pool of block ids, and must not share blocks. REQUIRES: every id below
// num_kv_blocks / num_groups.
void AddSequenceToEveryGroup(engine::StepBatch* batch, const engine::ModelRunner& runner,
                             std::span<const int32_t> new_tokens, int32_t num_computed_tokens,
                             std::span<const int32_t> block_ids, engine::LogitsMode logits_mode,
                             int32_t state_slot = -1);

// Rows `rows` of batch->token_bitmask (ceil(vocabulary / 32) words a row, already sized) allow
// exactly `tokens`.
void AllowOnly(engine::StepBatch* batch, std::span<const int32_t> rows,
               std::span<const int32_t> tokens);

// Block ids first_block, first_block + 1, ... enough for `tokens` tokens of `runner`'s blocks.
std::vector<int32_t> ConsecutiveBlocks(const engine::ModelRunner& runner, int64_t tokens,
                                       int32_t first_block = 0);

// Teacher-forced logits of every position of `prompt`, fed to `runner` in steps of `chunk` tokens
// (0: one step), over ConsecutiveBlocks(runner, prompt size, first_block) in every KV cache group
// and state slot `state_slot` (-1: none). Empty, after a test failure, if a step fails.
std::vector<float> PromptLogits(engine::ModelRunner& runner, std::span<const int32_t> prompt,
                                size_t chunk = 0, int32_t state_slot = -1,
                                int32_t first_block = 0);

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_TESTING_STEP_BATCHES_H_

// Step batches for tests that drive a runner directly, without the engine's block manager.

#ifndef LMSERVE_TESTS_TESTING_STEP_BATCHES_H_
#define LMSERVE_TESTS_TESTING_STEP_BATCHES_H_

#include <cstdint>
#include <span>

#include "engine/runner/model_runner.h"

namespace lmserve::testing {

// Appends a sequence to `batch` with `block_ids` as its block table in every KV cache group of
// `runner` (ModelRunner::kv_group_windows), shifted by g * (num_kv_blocks / num_groups) in group
// g: the groups share one pool of block ids, and must not share blocks. REQUIRES: every id below
// num_kv_blocks / num_groups.
void AddSequenceToEveryGroup(engine::StepBatch* batch, const engine::ModelRunner& runner,
                             std::span<const int32_t> new_tokens, int32_t num_computed_tokens,
                             std::span<const int32_t> block_ids, engine::LogitsMode logits_mode);

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_TESTING_STEP_BATCHES_H_

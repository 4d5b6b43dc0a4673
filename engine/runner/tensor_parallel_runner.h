// Tensor parallelism: one model over N ranks (the GPUs of one host, or CPU shards standing for
// them), driven by the one engine.
//
// Each rank is an ordinary runner (CPU or CUDA) built from its share of the model: its
// ModelConfig from ShardModelConfig (its query and KV heads, its slice of every MLP and expert,
// its slice of the vocabulary), so its family's description declares the rank's shapes, and each
// tensor's Split says which slice of the checkpoint's tensor it loads (weight_plan.h). A rank
// runner gets a Communicator (communicator.h): after a projection whose weight is split by
// columns (row-parallel: the attention's output projection, the MLP's down projection, the
// experts' down projections) it all-reduces the partial sums; the embedding gathers the rank's
// vocabulary rows (zeros elsewhere) and all-reduces; the LM head all-gathers the vocabulary
// slices, so every rank ends the step with the same logits and draws the same tokens.
//
// This runner runs each step on every rank at once: rank 0 on the calling thread, the others on a
// thread each, and returns rank 0's output. The ranks hold the same KV block ids (each its own KV
// heads of them): the pool is the smallest rank's.

#ifndef LMSERVE_ENGINE_RUNNER_TENSOR_PARALLEL_RUNNER_H_
#define LMSERVE_ENGINE_RUNNER_TENSOR_PARALLEL_RUNNER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model_config.h"
#include "engine/runner/model_runner.h"

namespace lmserve::engine {

// The runner of `model` (the whole model's config) over config.tensor_parallel_size ranks of
// config.backend: CUDA devices config.device, config.device + 1, ...; CPU shards splitting
// config.kv_cache_bytes and config.num_threads among them. Errors: a size that does not divide the
// model's heads or MLP widths (naming them), too few devices, any rank's own error.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateTensorParallelRunner(
    const ModelConfig& model, const Checkpoint& checkpoint, const RunnerConfig& config);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_TENSOR_PARALLEL_RUNNER_H_

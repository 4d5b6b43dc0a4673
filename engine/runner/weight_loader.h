// Loading a model's declared tensors (engine/model/weight_plan.h) into a runner's storage: the walk
// every runner shares. The runner says where a part's elements go and how they are converted; this
// finds each part in the checkpoint (checking shape and byte count) or, for dummy weights, hands
// the part over to be filled with its dummy values (dummy_weights.h).

#ifndef LMSERVE_ENGINE_RUNNER_WEIGHT_LOADER_H_
#define LMSERVE_ENGINE_RUNNER_WEIGHT_LOADER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/checkpoint.h"
#include "engine/model/weight_plan.h"
#include "engine/runner/model_runner.h"

namespace lmserve::engine {

class WeightSink {
 public:
  virtual ~WeightSink() = default;
  // Rows [first_row, first_row + part.rows) of `spec` are `tensor`'s elements (any file type).
  virtual absl::Status Store(const WeightSpec& spec, int64_t first_row,
                             const TensorView& tensor) = 0;
  // Rows [first_row, first_row + part.rows) of `spec` take `part`'s dummy values.
  virtual absl::Status StoreDummy(const WeightSpec& spec, int64_t first_row,
                                  const WeightPart& part) = 0;
};

// Hands every part of every tensor of `plan` that has storage of its own (tied ones have none) to
// `sink`, in declaration order. With LoadFormat::kDummy the checkpoint's tensors are not read.
absl::Status LoadWeights(const WeightPlan& plan, const Checkpoint& checkpoint, LoadFormat format,
                         WeightSink& sink);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_WEIGHT_LOADER_H_

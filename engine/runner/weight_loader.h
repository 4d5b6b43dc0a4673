// Loading a model's declared tensors (engine/model/weight_plan.h) into a runner's storage: the walk
// every runner shares. The runner says where a part's elements go and how they are converted; this
// finds each part in the checkpoint (checking shape and byte count) or, for dummy weights, hands
// the part over to be filled with its dummy values (dummy_weights.h).

#ifndef LMSERVE_ENGINE_RUNNER_WEIGHT_LOADER_H_
#define LMSERVE_ENGINE_RUNNER_WEIGHT_LOADER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/checkpoint.h"
#include "engine/model/weight_plan.h"
#include "engine/runner/model_runner.h"
#include "kernels/cpu/fp8.h"

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
  // Whether `spec` is held in FP8 E4M3 with a scale per row, so that an FP8 checkpoint's tensor
  // scaled per tensor or per channel may go to StoreF8 as it is. Other FP8 tensors (block-wise
  // scales, tensor-parallel slices, tensors of sinks that hold no FP8) reach Store dequantized
  // to fp32.
  virtual bool HoldsF8(const WeightSpec& /*spec*/) const { return false; }
  // Rows [first_row, first_row + part.rows) of `spec` are `tensor`'s E4M3 bytes, row r's scale
  // row_scales[r]. Called only where HoldsF8(spec).
  virtual absl::Status StoreF8(const WeightSpec& spec, int64_t first_row, const TensorView& tensor,
                               const std::vector<float>& row_scales);
};

// Hands every part of every tensor of `plan` that has storage of its own (tied ones have none) to
// `sink`, in declaration order. With LoadFormat::kDummy the checkpoint's tensors are not read.
// FP8 checkpoint tensors (ModelConfig::fp8) are read with their scales (F8Scales).
absl::Status LoadWeights(const WeightPlan& plan, const Checkpoint& checkpoint, LoadFormat format,
                         WeightSink& sink);

// The scales of the FP8 tensor `tensor` of `checkpoint` (its `weight_scale` or
// `weight_scale_inv`, as the config's Fp8CheckpointConfig names it) in fp32, and their layout,
// told apart by their count: one (per tensor), one a row (per channel) or one a block.
struct F8Scales {
  std::vector<float> values;
  kernels::F8ScaleLayout layout;
  bool per_row = false;  // per tensor or per channel: values broadcast to one a row
};
absl::StatusOr<F8Scales> ReadF8Scales(const Checkpoint& checkpoint, const TensorView& tensor);

// An FP8 KV cache's scales of each decoder layer (--kv-cache-dtype fp8): a stored key is
// E4M3(key / k_scale), a value E4M3(value / v_scale). Read from a checkpoint's one-element
// tensors where it has them, under the names vLLM reads: `model.layers.N.self_attn.k_scale`
// (compressed-tensors' kv_cache_scheme), `....self_attn.k_proj.output_scale` (older
// llm-compressor) or `....self_attn.k_proj.k_scale` (ModelOpt), and the same for v; 1.0 where a
// layer has none (vLLM's default). InvalidArgument for a scale that is not one positive, finite
// F32/BF16/F16 value.
struct KvCacheScales {
  std::vector<float> k, v;  // [num_layers]
  int64_t layers_from_checkpoint = 0;  // layers whose scales the checkpoint held
};
absl::StatusOr<KvCacheScales> ReadKvCacheScales(const Checkpoint& checkpoint, int64_t num_layers);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_WEIGHT_LOADER_H_

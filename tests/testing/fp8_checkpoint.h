// FP8 copies of the Hugging Face fixture checkpoints, in the layouts FP8 checkpoints on the Hub use,
// for the loader tests (tests/engine/runner/fp8_checkpoint_test.cc and the GPU ones).

#ifndef LMSERVE_TESTS_TESTING_FP8_CHECKPOINT_H_
#define LMSERVE_TESTS_TESTING_FP8_CHECKPOINT_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace lmserve::testing {

enum class Fp8CheckpointLayout {
  // compressed-tensors (llm-compressor's FP8_DYNAMIC, the `*-FP8-dynamic` models): weight_scale
  // bf16 [rows, 1].
  kCompressedTensorsChannel,
  // compressed-tensors per tensor (the static `*-FP8` models): weight_scale fp32 of shape [] (the
  // input_scale they also carry is written too, and must be ignored).
  kCompressedTensorsTensor,
  // quant_method "fp8" with weight_block_size (Qwen3-*-FP8, DeepSeek-V3): weight_scale_inv fp32
  // [ceil(rows / block_rows), ceil(cols / block_cols)].
  kBlockWise,
};

// Writes, into a fresh directory under TempDir(), the checkpoint of `fixture_dir` (config.json,
// one model.safetensors) with the linear layers' weights (every `*_proj.weight` of the decoder
// layers, the experts' too unless !quantize_experts) in F8_E4M3 and their scales as `layout` stores them, every other
// tensor as it is, and config.json's quantization_config to match. Returns the directory.
// With kv_scale > 0 (compressed-tensors layouts), also an FP8 KV cache's scales as
// llm-compressor's kv_cache_scheme writes them: `model.layers.N.self_attn.k_scale` = kv_scale *
// (N + 1) and `v_scale` = kv_scale * (N + 2) / 2, fp32 of shape [] (KvCacheScaleForTest).
absl::StatusOr<std::string> WriteFp8Checkpoint(const std::string& fixture_dir,
                                               Fp8CheckpointLayout layout,
                                               int64_t block_rows = 32, int64_t block_cols = 64,
                                               bool quantize_experts = true, float kv_scale = 0);
// The scale WriteFp8Checkpoint writes for layer `layer`'s keys (!value) or values.
inline float KvCacheScaleForTest(float kv_scale, int64_t layer, bool value) {
  return value ? kv_scale * static_cast<float>(layer + 2) / 2
               : kv_scale * static_cast<float>(layer + 1);
}

// Quantized logits against the float64 reference, as issue 23 bounds them: the relative L2 error
// over every logit, and top-1 agreement counted at the rows whose reference top-2 margin exceeds
// 0.1 x that row's logit standard deviation (rows closer to a tie are not held to it).
struct QuantizedAccuracy {
  double squared_error = 0, squared_reference = 0;
  int64_t rows = 0, decisive_rows = 0, decisive_agree = 0;

  // Adds `num_rows` rows of `vocab` logits.
  void Add(std::span<const float> got, std::span<const float> want, int64_t vocab);
  double relative_l2() const;
  double top1_agreement() const;  // of the decisive rows; 1 when there are none
};

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_TESTING_FP8_CHECKPOINT_H_

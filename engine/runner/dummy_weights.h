// Dummy weights (RunnerConfig::load_format = LoadFormat::kDummy): deterministic uniform values of
// a checkpoint's shapes, to measure a model's speed without its checkpoint (as vLLM's
// `--load-format dummy`). Both runners use the same values: element i of a tensor is
//   low + (high - low) * DummyUnit(DummyTensorSeed(name), i)
// which kernels/cuda/random_fill.cu computes identically on the GPU (the CPU runner keeps it in
// fp32, the CUDA runner rounds it to bf16).

#ifndef LMSERVE_ENGINE_RUNNER_DUMMY_WEIGHTS_H_
#define LMSERVE_ENGINE_RUNNER_DUMMY_WEIGHTS_H_

#include <cstdint>
#include <string_view>

#include "common/hash.h"

namespace lmserve::engine {

struct DummyRange {
  float low = 0.0f;
  float high = 0.0f;
};

// Norm weights are 1, biases small, embeddings ±0.05, a linear layer's weights ±1/sqrt(fan-in):
// activations stay in range through any depth, so timings see ordinary numbers, not NaNs.
DummyRange DummyWeightRange(std::string_view name, int64_t fan_in);

// A seed from the tensor's name (FNV-1a).
uint64_t DummyTensorSeed(std::string_view name);

// The unit draw of element i: [0, 1), 24 random bits.
inline float DummyUnit(uint64_t seed, int64_t i) {
  return static_cast<float>(SplitMix64At(seed, static_cast<uint64_t>(i)) >> 40) * 0x1.0p-24f;
}

// Fills dst[0 .. n) with tensor `name`'s dummy values.
void FillDummyF32(std::string_view name, int64_t fan_in, float* dst, int64_t n);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_DUMMY_WEIGHTS_H_

// Qwen2 (Qwen2ForCausalLM): the Llama description with q/k/v projection biases.

#include <algorithm>

#include "common/status.h"
#include "engine/model/families/llama.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

absl::Status ReadQwenSlidingWindow(const nlohmann::json& config, ModelConfig* out) {
  LMSERVE_RETURN_IF_ERROR(ReadSlidingWindow(config, /*enabled_by_default=*/false, out));
  if (out->sliding_window == 0) return absl::OkStatus();
  // Hugging Face: the window applies from layer max_window_layers on.
  int64_t first = 0;
  if (auto it = config.find("max_window_layers"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError("config.json: 'max_window_layers' is not an integer");
    }
    first = it->get<int64_t>();
  }
  out->sliding_layers.assign(static_cast<size_t>(std::max<int64_t>(out->num_layers, 0)), false);
  for (int64_t l = std::max<int64_t>(first, 0); l < out->num_layers; ++l) {
    out->sliding_layers[l] = true;
  }
  return absl::OkStatus();
}

ModelFamily Qwen2Family() {
  // Qwen2 is Llama with biases on the q/k/v projections. llama.cpp keeps its Q/K rows as the hub
  // has them (half-split rotary).
  ModelFamily family;
  family.name = "qwen2";
  family.hf_architectures = {"Qwen2ForCausalLM"};
  family.hf_model_types = {"qwen2"};
  family.gguf_architecture = "qwen2";
  family.gguf_rope_layout = RopeLayout::kHalfSplit;
  family.read_hf_config = [](const nlohmann::json& config, ModelConfig* out) {
    LMSERVE_RETURN_IF_ERROR(RequireSiluActivation(config));
    out->attention_bias = true;
    return ReadQwenSlidingWindow(config, out);
  };
  family.read_gguf_config = [](const GgufFile&, ModelConfig* out) {
    out->attention_bias = true;
    return absl::OkStatus();
  };
  family.describe = DescribeLlama;
  return family;
}

}  // namespace lmserve::engine

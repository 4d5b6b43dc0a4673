// Qwen2 (Qwen2ForCausalLM): the Llama description with q/k/v projection biases.

#include "common/status.h"
#include "engine/model/families/llama.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

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
    return CapContextAtSlidingWindow(config, /*enabled_by_default=*/false, out);
  };
  family.read_gguf_config = [](const GgufFile&, ModelConfig* out) {
    out->attention_bias = true;
    return absl::OkStatus();
  };
  family.describe = DescribeLlama;
  return family;
}

}  // namespace lmserve::engine

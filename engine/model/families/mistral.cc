// Mistral (MistralForCausalLM): the Llama description with a sliding window.

#include "common/status.h"
#include "engine/model/families/llama.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

ModelFamily MistralFamily() {
  // Mistral is Llama with a sliding window (on by default). llama.cpp converts Mistral models to
  // its llama architecture: a Mistral is exported as llama, and llama GGUF files open as Llama
  // (registered first).
  ModelFamily family;
  family.name = "mistral";
  family.hf_architectures = {"MistralForCausalLM"};
  family.hf_model_types = {"mistral"};
  family.gguf_architecture = "llama";
  family.gguf_rope_layout = RopeLayout::kInterleaved;
  family.read_hf_config = [](const nlohmann::json& config, ModelConfig* out) {
    LMSERVE_RETURN_IF_ERROR(RequireSiluActivation(config));
    LMSERVE_RETURN_IF_ERROR(RejectBiases(config));
    return ReadSlidingWindow(config, /*enabled_by_default=*/true, out);
  };
  family.describe = DescribeLlama;
  return family;
}

}  // namespace lmserve::engine

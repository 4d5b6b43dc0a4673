// Phi-3, Phi-3.5 and Phi-4-mini (Phi3ForCausalLM): the Llama description over checkpoints that
// hold q/k/v fused as `qkv_proj` and gate/up as `gate_up_proj`, with partial rotary embedding
// (Phi-4-mini) and longrope scaling (the 128k models), both read by the shared config reader.

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/families/llama.h"
#include "engine/model/gguf.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

ModelFamily Phi3Family() {
  ModelFamily family;
  family.name = "phi3";
  family.hf_architectures = {"Phi3ForCausalLM"};
  family.hf_model_types = {"phi3"};
  // llama.cpp keeps the fused tensors: attn_qkv, and ffn_up holding gate and up.
  family.gguf_architecture = "phi3";
  family.gguf_rope_layout = RopeLayout::kHalfSplit;
  family.gguf_layer_names = {{"attn_qkv.weight", "self_attn.qkv_proj.weight"},
                             {"ffn_up.weight", "mlp.gate_up_proj.weight"}};
  family.read_hf_config = [](const nlohmann::json& config, ModelConfig* out) {
    LMSERVE_RETURN_IF_ERROR(RequireSiluActivation(config));
    LMSERVE_RETURN_IF_ERROR(RejectBiases(config));
    // Hugging Face applies Phi-3's sliding_window whenever the config sets it.
    return ReadSlidingWindow(config, /*enabled_by_default=*/true, out);
  };
  family.describe = [](const ModelConfig& config) -> std::unique_ptr<ModelDescription> {
    return std::make_unique<LlamaDescription>(
        config, LlamaOptions{.fused_qkv = true, .fused_gate_up = true});
  };
  return family;
}

}  // namespace lmserve::engine

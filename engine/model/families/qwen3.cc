// Qwen3 (Qwen3ForCausalLM): the Llama description with per-head q/k RMSNorm and an explicit
// head_dim (which the shared config reader takes). Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3 whose
// sparse layers (decoder_sparse_step, mlp_only_layers) are mixtures of experts.

#include "common/status.h"
#include "engine/model/families/llama.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

ModelFamily Qwen3Family() {
  ModelFamily family;
  family.name = "qwen3";
  family.hf_architectures = {"Qwen3ForCausalLM"};
  family.hf_model_types = {"qwen3"};
  family.gguf_architecture = "qwen3";
  family.gguf_rope_layout = RopeLayout::kHalfSplit;
  family.gguf_layer_names = {{"attn_q_norm.weight", "self_attn.q_norm.weight"},
                             {"attn_k_norm.weight", "self_attn.k_norm.weight"}};
  family.read_hf_config = [](const nlohmann::json& config, ModelConfig* out) {
    LMSERVE_RETURN_IF_ERROR(RequireSiluActivation(config));
    LMSERVE_RETURN_IF_ERROR(RejectBiases(config));
    return ReadQwenSlidingWindow(config, out);
  };
  family.describe = [](const ModelConfig& config) -> std::unique_ptr<ModelDescription> {
    return std::make_unique<LlamaDescription>(config, LlamaOptions{.qk_norm = true});
  };
  return family;
}

ModelFamily Qwen3MoeFamily() {
  ModelFamily family;
  family.name = "qwen3_moe";
  family.hf_architectures = {"Qwen3MoeForCausalLM"};
  family.hf_model_types = {"qwen3_moe"};
  family.gguf_architecture = "qwen3moe";
  family.gguf_rope_layout = RopeLayout::kHalfSplit;
  family.gguf_experts = true;
  family.moe_names = Qwen3MoeNames();
  family.gguf_layer_names = Qwen3Family().gguf_layer_names;
  family.read_hf_config = [](const nlohmann::json& config, ModelConfig* out) {
    LMSERVE_RETURN_IF_ERROR(RequireSiluActivation(config));
    LMSERVE_RETURN_IF_ERROR(RejectBiases(config));
    // transformers' default for norm_topk_prob is false.
    LMSERVE_RETURN_IF_ERROR(
        ReadHfMoeConfig(config, "num_experts", /*default_norm_topk_prob=*/false, out));
    return ReadQwenSlidingWindow(config, out);
  };
  family.describe = [](const ModelConfig& config) -> std::unique_ptr<ModelDescription> {
    return std::make_unique<LlamaDescription>(
        config, LlamaOptions{.qk_norm = true, .moe_names = Qwen3MoeNames()});
  };
  return family;
}

}  // namespace lmserve::engine

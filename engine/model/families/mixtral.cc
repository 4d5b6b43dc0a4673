// Mixtral (MixtralForCausalLM): the Llama description whose MLPs are mixtures of experts.

#include "common/status.h"
#include "engine/model/families/llama.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

// transformers' MixtralSparseMoeBlock: the router `gate`, experts' w1 (gate), w3 (up), w2 (down).
MoeTensorNames MixtralMoeNames() {
  return {.router = "block_sparse_moe.gate.weight",
          .experts = "block_sparse_moe.experts.",
          .gate = "w1.weight",
          .up = "w3.weight",
          .down = "w2.weight"};
}

// transformers' Qwen3MoeSparseMoeBlock (the Qwen3-MoE family is in qwen3.cc).
MoeTensorNames Qwen3MoeNames() {
  return {.router = "mlp.gate.weight",
          .experts = "mlp.experts.",
          .gate = "gate_proj.weight",
          .up = "up_proj.weight",
          .down = "down_proj.weight"};
}

ModelFamily MixtralFamily() {
  // Every layer is sparse; the routing weights are always renormalized; intermediate_size is
  // an expert's width. llama.cpp converts Mixtral to its llama architecture with
  // llama.expert_count and 3-D expert tensors: llama GGUF files with experts open as Mixtral
  // (gguf_experts), and a Mixtral is exported as llama.
  ModelFamily family;
  family.name = "mixtral";
  family.hf_architectures = {"MixtralForCausalLM"};
  family.hf_model_types = {"mixtral"};
  family.gguf_architecture = "llama";
  family.gguf_rope_layout = RopeLayout::kInterleaved;
  family.gguf_experts = true;
  family.moe_names = MixtralMoeNames();
  family.read_hf_config = [](const nlohmann::json& config, ModelConfig* out) {
    LMSERVE_RETURN_IF_ERROR(RequireSiluActivation(config));
    LMSERVE_RETURN_IF_ERROR(RejectBiases(config));
    LMSERVE_RETURN_IF_ERROR(
        ReadHfMoeConfig(config, "num_local_experts", /*default_norm_topk_prob=*/true, out));
    // Mixtral has no such keys: every layer sparse, weights renormalized.
    out->norm_topk_prob = true;
    out->decoder_sparse_step = 1;
    out->mlp_only_layers.clear();
    return ReadSlidingWindow(config, /*enabled_by_default=*/true, out);
  };
  family.describe = [](const ModelConfig& config) -> std::unique_ptr<ModelDescription> {
    return std::make_unique<LlamaDescription>(config, LlamaOptions{.moe_names = MixtralMoeNames()});
  };
  return family;
}

}  // namespace lmserve::engine

// Llama (LlamaForCausalLM) and the families built the same way: a pre-norm decoder of RMSNorm,
// rotary attention with grouped K/V heads and a SiLU-gated MLP. Mistral (mistral.cc) and Qwen2
// (qwen2.cc) are Llama with their own names and config keys, and q/k/v biases for Qwen2.

#ifndef LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_
#define LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_

#include <memory>
#include <vector>

#include "engine/model/family.h"

namespace lmserve::engine {

class LlamaDescription final : public ModelDescription {
 public:
  // REQUIRES: ValidateModelConfig(config).ok().
  explicit LlamaDescription(const ModelConfig& config);

  absl::Status Forward(ForwardOps& ops) const override;

 private:
  struct Layer {
    Weight input_norm;  // [hidden]
    Weight qkv;         // [q_dim + 2 kv_dim, hidden]: q_proj, k_proj, v_proj stacked
    Weight o_proj;      // [hidden, q_dim]
    Weight post_norm;   // [hidden]
    Weight gate_up;     // [2 intermediate, hidden]: gate_proj, up_proj stacked
    Weight down;        // [hidden, intermediate]
    AttentionLayer attention;
  };
  Weight embed_;       // [vocab, hidden]
  Weight final_norm_;  // [hidden]
  Weight lm_head_;     // [vocab, hidden]: its own, or the embeddings when tied
  std::vector<Layer> layers_;
};

// The families whose model is a LlamaDescription (llama.cc, mistral.cc, qwen2.cc).
ModelFamily LlamaFamily();
ModelFamily MistralFamily();
ModelFamily Qwen2Family();

// ModelFamily::describe of those families.
std::unique_ptr<ModelDescription> DescribeLlama(const ModelConfig& config);

// config.json checks those families share: hidden_act must be silu; attention_bias and mlp_bias
// must not be true.
absl::Status RequireSiluActivation(const nlohmann::json& config);
absl::Status RejectBiases(const nlohmann::json& config);

// Caps the context at `sliding_window` when the config enables it (`use_sliding_window`, default
// `enabled_by_default`): until sliding-window attention exists, a model is served only within its
// window, so that its answers stay exact.
absl::Status CapContextAtSlidingWindow(const nlohmann::json& config, bool enabled_by_default,
                                       ModelConfig* out);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_
